# %% [markdown]
# # The training loop
#
# With batches and masks in hand (chapter 7), training is a loop: run a batch through the
# model, score its predictions against the labels, backpropagate, and let the optimizer move
# the parameters. This chapter writes that loop once, with the bookkeeping every later chapter
# relies on: a loss averaged per target token, gradient accumulation that gives exactly the
# gradient of a larger batch, a learning-rate scheduler stepped at the right moments, and
# counters that survive from one epoch to the next.

# %% tags=["setup", "hide-cell"]
# Setup (hidden in the book): in Colab, install the book's package; everywhere, import what
# earlier chapters built.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPO = "https://github.com/annotated-transformer/annotated-transformer-book"
    REF = "v0.2.0"  # the tag or commit this notebook comes from
    package = f"the-annotated-transformer[book] @ git+{REPO}@{REF}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

from the_annotated_transformer import Batch, enable_book_charts, line_chart, make_model

enable_book_charts()

# %% [markdown]
# ## What the loop keeps count of
#
# A long training run is many calls of one epoch function. Some numbers must carry over from
# call to call: how many batches the model has seen, how many optimizer steps it has taken
# (the learning-rate schedule of chapter 10 is a function of that number), and how many
# sentences and tokens went by. They live in a small dataclass that the caller owns and passes
# back in.

# %% tags=["export"]
from dataclasses import dataclass


@dataclass
class TrainState:
    """Counters that outlive one epoch: micro-batches, optimizer steps, sentences and tokens."""

    step: int = 0  # micro-batches seen (forward and backward passes)
    accum_step: int = 0  # optimizer steps taken
    samples: int = 0  # sentences seen
    tokens: int = 0  # target tokens seen (without padding)


# %% [markdown]
# ## The loss, per token
#
# The model's decoder returns one vector of size `d_model` per target position; the generator
# of chapter 2 turns each into log-probabilities over the target vocabulary. A criterion then
# compares them with the labels `tgt_y`. We ask the criterion for the **sum** of the loss over
# all real tokens (padding excluded), and divide by a token count ourselves. That division is
# the one place where the batch size enters the gradient, so the loop, not the criterion,
# should decide what to divide by.
#
# `SimpleLossCompute` keeps the classic name. It returns two things: the summed loss as a plain
# number, for reporting, and the loss divided by `norm`, as a tensor to call `backward()` on.

# %% tags=["export"]
import torch
from torch import nn


class SimpleLossCompute:
    """Generator, then criterion; return the summed loss and the loss divided by `norm`."""

    def __init__(self, generator: nn.Module, criterion: nn.Module):
        self.generator = generator
        self.criterion = criterion  # must return the loss summed over the real tokens

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, norm: float
    ) -> tuple[float, torch.Tensor]:
        x = self.generator(x)  # (batch, n_tgt, tgt_vocab), log-probabilities
        loss_sum = self.criterion(x.reshape(-1, x.size(-1)), y.reshape(-1))  # over all tokens
        return float(loss_sum.detach()), loss_sum / norm


# %% [markdown]
# ## Gradient accumulation, done exactly
#
# The paper's batches held about 25,000 source and 25,000 target tokens
# {cite}`vaswani2017attention`. When such a batch does not fit in memory, we split it into $k$
# *micro-batches*, run forward and backward on each, let the gradients add up in the
# parameters' `.grad`, and take one optimizer step at the end. The result should be the
# gradient of the large batch. The large batch's loss is its summed token loss divided by its
# number of tokens $T = T_1 + \dots + T_k$,
#
# $$
# \mathcal{L} = \frac{1}{T} \sum_{i=1}^{k} S_i ,
# $$
#
# where $S_i$ is the summed loss of micro-batch $i$. Its gradient is the sum of the gradients
# of $S_i / T$. So each micro-batch must be divided by the token count of the **whole group**,
# not by its own $T_i$: dividing by $T_i$ would weigh a micro-batch of short sentences as much
# as one of long sentences, and summing $k$ per-micro-batch means gives a gradient $k$ times
# too large.
#
# To know $T$ before the first backward pass, the loop reads the next $k$ batches from the
# iterator first (they are small: token indices and masks), adds up their `ntokens`, and then
# runs them. Dividing the accumulated gradients by $T$ after the last backward pass would give
# the same numbers; reading ahead keeps the loss that we backpropagate equal to the loss that
# we report.
#
# After each group, the optimizer steps once and so does the learning-rate scheduler: the
# schedule counts optimizer steps, not micro-batches. A last group with fewer than $k$ batches
# (when the epoch's batch count is not a multiple of $k$) gets its own step, over its own
# tokens, so that no gradient is left lying in `.grad` to leak into the next epoch.
#
# The loop over groups is written once, as `run_groups`, and `run_epoch` adds to it only the
# checks of its arguments, the log lines and the progress bar. Chapter 14 trains on several
# devices with the same core: it passes a `group_norm` that turns a group's token count into
# the divisor of the global batch, and contexts for each micro-batch (gradient
# synchronization, mixed precision), so that the rule above is implemented in one place only.

# %% tags=["export"]
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, nullcontext


def accumulation_groups(batches: Iterable, accum_iter: int) -> Iterator[list]:
    """Consecutive groups of `accum_iter` batches; the last group may be shorter."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == accum_iter:
            yield group
            group = []
    if group:
        yield group


def run_groups(
    batches: Iterable,
    model: nn.Module,
    loss_compute,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    *,
    accum_iter: int = 1,
    train_state: TrainState | None = None,
    group_norm: Callable[[int], float] | None = None,
    sync_context: Callable[[bool], AbstractContextManager] | None = None,
    forward_context: Callable[[], AbstractContextManager] | None = None,
    after_group: Callable[[float, int, int], None] | None = None,
) -> tuple[float, int]:
    """The accumulation core of every loop in the book; the summed loss and target tokens.

    With an optimizer it trains: each micro-batch's summed loss is divided by
    group_norm(T), T the group's tokens (by default T itself), and the optimizer and scheduler
    step once per group. Without one it only evaluates, computing no gradients.
    sync_context(is_last) wraps a micro-batch's forward and backward, forward_context() its
    forward (chapter 14 uses them for DistributedDataParallel and autocast); after_group gets
    each group's summed loss, tokens and batch count.
    """
    train = optimizer is not None
    total_loss, total_tokens = 0.0, 0
    with torch.set_grad_enabled(train):
        for group in accumulation_groups(batches, accum_iter):
            tokens = sum(batch.ntokens for batch in group)  # T = T_1 + ... + T_k
            norm = group_norm(tokens) if group_norm is not None else max(tokens, 1)
            group_loss = 0.0
            for i, batch in enumerate(group):
                is_last = i == len(group) - 1
                with sync_context(is_last) if sync_context is not None else nullcontext():
                    with forward_context() if forward_context is not None else nullcontext():
                        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                        loss_sum, loss = loss_compute(out, batch.tgt_y, norm)  # S_i, S_i / T
                    if train:
                        loss.backward()  # .grad accumulates the sum over the group
                group_loss += loss_sum
                if train and train_state is not None:
                    train_state.step += 1
                    train_state.samples += batch.src.size(0)
                    train_state.tokens += batch.ntokens
            if train:
                optimizer.step()  # once per group of accum_iter micro-batches
                optimizer.zero_grad(set_to_none=True)
                if train_state is not None:
                    train_state.accum_step += 1
                if scheduler is not None:
                    scheduler.step()  # the schedule counts optimizer steps
            total_loss += group_loss
            total_tokens += tokens
            if after_group is not None:
                after_group(group_loss, tokens, len(group))
    return total_loss, total_tokens


def run_epoch(
    data_iter: Iterable,
    model: nn.Module,
    loss_compute,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    *,
    mode: str = "train",
    accum_iter: int = 1,
    train_state: TrainState | None = None,
    log_every: int | None = 40,
    progress: bool = False,
) -> tuple[float, TrainState]:
    """Run one pass over `data_iter`; return the mean loss per target token and the counters."""
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    if not isinstance(accum_iter, int) or accum_iter < 1:
        raise ValueError(f"accum_iter must be a positive integer, got {accum_iter!r}")
    train = mode == "train"
    if train and optimizer is None:
        raise ValueError("optimizer is required when mode='train'")
    state = TrainState() if train_state is None else train_state  # never shared between calls
    model.train(train)  # dropout on for training, off for evaluation
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(desc=mode, unit="batch", leave=False)
    log = {"loss": 0.0, "tokens": 0, "start": time.perf_counter()}  # since the last log line

    def after_group(loss_sum: float, tokens: int, n_batches: int) -> None:
        log["loss"] += loss_sum
        log["tokens"] += tokens
        if bar is not None:
            bar.update(n_batches)
        if train and log_every and state.accum_step % log_every == 0:
            lr = optimizer.param_groups[0]["lr"]
            speed = log["tokens"] / max(time.perf_counter() - log["start"], 1e-9)
            print(
                f"step {state.accum_step:6d} | loss {log['loss'] / max(log['tokens'], 1):.4f}"
                f" | lr {lr:.3g} | {speed:,.0f} tokens/s"
            )
            log.update(loss=0.0, tokens=0, start=time.perf_counter())

    total_loss, total_tokens = run_groups(
        data_iter, model, loss_compute, optimizer if train else None, scheduler,
        accum_iter=accum_iter, train_state=state, after_group=after_group,
    )
    if bar is not None:
        bar.close()
    return total_loss / max(total_tokens, 1), state


# %% [markdown]
# `run_epoch` sets the model's mode itself (`model.train()` for training, `model.eval()` for
# evaluation, which turns dropout off) and in evaluation computes no gradients at all. It does
# not move data between devices: give it batches already on the model's device, for example
# `(batch.to(device) for batch in batches)`. With `progress=True` it shows a tqdm bar; the book
# keeps it off so that the stored outputs stay the same from run to run.
#
# ```{note}
# The classic Annotated Transformer's `run_epoch` differed in four ways. Its default
# `train_state=TrainState()` was one object created once and shared by every call that omitted
# it, so counts leaked between runs. Each micro-batch's loss was divided by its own token count
# and never by the group's, so micro-batches weighed equally regardless of length, and the
# accumulated gradient was about $k$ times too large; under SGD that is a step $k$ times too
# large (measured below, after the check of our accumulation), but Adam divides each update by
# a running estimate of the gradient's own scale, so a constant factor mostly cancels there.
# Two defects do not cancel, and the cell below replays the classic loop's bookkeeping to show
# them. The scheduler stepped after every micro-batch, so with accumulation the learning rate
# ran $k$ times too fast through its warmup: ten scheduler steps for three optimizer steps
# below. And it stepped the optimizer when `i % accum_iter == 0`, so the first update came from
# the very first micro-batch alone, and a final partial group's gradients were left in `.grad`
# for the next epoch.
# ```

# %%
k, n = 4, 10  # accum_iter, micro-batches in an epoch
classic_steps, pending, classic_schedule = [], [], 0
for i in range(n):  # the classic loop's control flow, without the model
    pending.append(i)  # loss.backward(): micro-batch i's gradient joins .grad
    if i % k == 0:  # optimizer.step() and zero_grad()
        classic_steps.append(pending)
        pending = []
    classic_schedule += 1  # scheduler.step(), after every micro-batch
ours = list(accumulation_groups(range(n), k))  # run_epoch's groups; one scheduler step each
print(f"classic: optimizer steps on micro-batches {classic_steps}, left in .grad: {pending}, "
      f"{classic_schedule} scheduler steps")
print(f"ours:    optimizer steps on micro-batches {ours}, {len(ours)} scheduler steps")

# %% [markdown]
# ## Checking the accumulation
#
# Take four micro-batches of four sentences each, with different amounts of padding, so that
# their token counts differ. One SGD step on the 16 sentences at once, and one step after
# accumulating the four micro-batches, must move every parameter by the same amount. The model
# is a small Transformer from chapter 5 with dropout off, so that both runs compute the same
# function.

# %%
import copy

import torch
from torch import nn

torch.manual_seed(0)
V, pad = 12, 2
n_micro, micro_size, length = 4, 4, 9


def random_pairs(n: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random source and target rows of mixed length: tokens 3..V-1, padding at the end."""
    src = torch.randint(3, V, (n, length), generator=generator)
    tgt = torch.randint(3, V, (n, length + 1), generator=generator)
    tgt[:, 0] = 0  # <s>
    lengths = torch.randint(2, length + 1, (n,), generator=generator)
    positions = torch.arange(length + 1)
    src[positions[:length] >= lengths[:, None]] = pad
    tgt[positions >= lengths[:, None] + 1] = pad
    return src, tgt


src, tgt = random_pairs(n_micro * micro_size, torch.Generator().manual_seed(0))
micro_batches = [
    Batch(src[i : i + micro_size], tgt[i : i + micro_size], pad=pad)
    for i in range(0, len(src), micro_size)
]
big_batch = Batch(src, tgt, pad=pad)
print("tokens per micro-batch:", [b.ntokens for b in micro_batches], "| total:", big_batch.ntokens)

base = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=0.0)
criterion = nn.NLLLoss(reduction="sum", ignore_index=pad)


def one_step(batches: list, accum_iter: int) -> nn.Module:
    """A copy of `base` after one SGD step on `batches`, accumulated over `accum_iter`."""
    model = copy.deepcopy(base)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_compute = SimpleLossCompute(model.generator, criterion)
    run_epoch(batches, model, loss_compute, optimizer, accum_iter=accum_iter, log_every=None)
    return model


def largest_difference(a: nn.Module, b: nn.Module) -> float:
    """The largest absolute difference between corresponding parameters of `a` and `b`."""
    with torch.no_grad():
        pairs = zip(a.parameters(), b.parameters(), strict=True)
        return max(float((p - q).abs().max()) for p, q in pairs)


one_big = one_step([big_batch], accum_iter=1)
accumulated = one_step(micro_batches, accum_iter=4)
moved = largest_difference(one_big, base)
print(f"largest parameter change of the step: {moved:.4f}")
difference = largest_difference(one_big, accumulated)
print("big batch vs 4 accumulated micro-batches, largest difference below 1e-6:", difference < 1e-6)
assert difference < 1e-6

# %% [markdown]
# The two updates agree to float rounding: the cell asserts that no parameter differs by
# $10^{-6}$ or more, against a step that moves the parameters by a few hundredths. For contrast,
# here is the classic recipe, each micro-batch divided by its own token count, on the same data
# and with the same SGD: it takes a different step, and one about $k = 4$ times too large (with
# Adam the size would mostly cancel, as the note above says; the direction would still be off).

# %%
classic = copy.deepcopy(base)
optimizer = torch.optim.SGD(classic.parameters(), lr=0.1)
for batch in micro_batches:  # classic: backward on each micro-batch's own mean
    out = classic(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    SimpleLossCompute(classic.generator, criterion)(out, batch.tgt_y, batch.ntokens)[1].backward()
optimizer.step()
print(f"big batch vs classic accumulation: {largest_difference(one_big, classic):.4f}")
print(f"size of the classic step relative to the right one: "
      f"{largest_difference(classic, base) / moved:.2f}")

# %% [markdown]
# ## A first training run
#
# Does the loop train? A quick test that needs no data: let the small model memorise 64 fixed
# random sentence pairs, cut into 8 micro-batches and accumulated two at a time (4 optimizer
# steps per epoch), with Adam {cite}`kingma2015adam` at a constant learning rate. The
# optimizer-step counter carries over from epoch to epoch in one `TrainState`.

# %%
# NBVAL_IGNORE_OUTPUT
# (training losses: their digits differ with another CPU's float kernels; the asserts check)
torch.manual_seed(0)
src, tgt = random_pairs(64, torch.Generator().manual_seed(1))
batches = [Batch(src[i : i + 8], tgt[i : i + 8], pad=pad) for i in range(0, 64, 8)]
model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=0.0)
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
loss_compute = SimpleLossCompute(model.generator, nn.NLLLoss(reduction="sum", ignore_index=pad))
state = TrainState()
history = []
for epoch in range(60):
    loss, state = run_epoch(
        batches, model, loss_compute, optimizer, accum_iter=2, train_state=state, log_every=None
    )
    history.append({"epoch": epoch + 1, "loss": round(loss, 4)})
eval_loss, _ = run_epoch(batches, model, loss_compute, mode="eval")
print(state)
first, last = history[0]["loss"], history[-1]["loss"]
print(f"training loss per token: first epoch {first:.3f}, last {last:.3f}")
print(f"evaluation loss per token: {eval_loss:.3f}")
assert (state.step, state.accum_step, state.tokens) == (480, 240, 21120)
assert first > 1.5 and last < 0.2 and eval_loss < 0.2, (first, last, eval_loss)

# %%
line_chart(history, x="epoch:Q", y="loss:Q", x_title="epoch (4 optimizer steps each)",
           y_title="training loss per token (nats)", width=420, height=220,
           title="Memorising 64 random sentence pairs")


# %% [markdown]
# The counters add up: 60 epochs of 8 micro-batches are 480 backward passes and 240 optimizer
# steps. The loss falls from about $\ln 12 \approx 2.5$ nats, a uniform guess over the 12 token
# types, towards zero: the model has memorised its 64 pairs. Memorising says nothing about
# generalising, but it shows that the gradients flow through every part of the model and the
# loop applies them.
#
# ## What we have
#
# `run_epoch` trains and evaluates any encoder-decoder that takes `(src, tgt, src_mask,
# tgt_mask)`, with exact gradient accumulation, one scheduler step per optimizer step, and
# counters owned by the caller. Chapter 9 makes the batches themselves better, by filling them
# to a token budget instead of a sentence count; chapter 10 supplies the paper's learning-rate
# schedule and optimizer settings, and chapter 11 its regularization. Chapters 12 and 13 put all
# of it to work on two small tasks.

# %% [markdown]
# ## Exercises
#
# 1. **Optimizer steps in an epoch.** An epoch of `n_batches` micro-batches with
#    `accum_iter` of them per update: how many optimizer steps does `run_epoch` take? Write
#    `optimizer_steps(n_batches, accum_iter)`; the check compares it with the groups that
#    `accumulation_groups` forms.
# 2. **Dividing by tokens.** A batch of 10 sentences of 5 tokens and one of 10 sentences of
#    50 tokens go into one accumulated step. If each micro-batch's loss were averaged over its
#    own tokens and the two averages then added, how much weight would one token of the short
#    batch get, compared with one token of the long batch? What does `run_epoch` do instead?
#
# ```{dropdown} Answer to 2
# Ten times as much: the short batch's 50 tokens share the same weight as the long batch's
# 500. `run_epoch` sums the loss over every token of the accumulated group and divides once by
# the group's total token count, so each token counts the same, as if the group were one batch.
# ```

# %% tags=["hide-cell"]
# Exercise 1: our solution (hidden in the book). Replace the body with yours.
def optimizer_steps(n_batches: int, accum_iter: int) -> int:
    """One step per full group of accum_iter batches, and one for a shorter last group."""
    return -(-n_batches // accum_iter)


# %%
# Check exercise 1
for n_batches in range(0, 30):
    for accum_iter in (1, 2, 3, 7, 40):
        groups = list(accumulation_groups(range(n_batches), accum_iter))
        assert optimizer_steps(n_batches, accum_iter) == len(groups), (n_batches, accum_iter)
print("exercise 1: correct")
