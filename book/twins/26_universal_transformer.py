# %% [markdown]
# # The Universal Transformer: depth that adapts
#
# The paper's encoder is six different layers, each applied once, so every position gets the
# same computation, whether it is a comma or the word the sentence turns on. The Universal
# Transformer {cite}`dehghani2019universal` changes two things. It applies *one* layer again
# and again, with the same weights at every step, so that depth becomes a loop rather than a
# stack. And it lets each position decide when to stop, with the *adaptive computation time*
# (ACT) of {cite:t}`graves2016adaptive`: easy positions stop early, hard ones take more steps.
# The graph tutorial that chapter 23 follows trained this model on the sort task; we build it
# from the book's own layers and train it on chapter 13's task.

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

from the_annotated_transformer import (
    PAD_ID,
    Batch,
    DecoderLayer,
    Embeddings,
    EncoderLayer,
    Generator,
    LayerNorm,
    MultiHeadedAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    book_data,
    enable_book_charts,
    exact_matches,
    greedy_decode,
    line_chart,
    make_model,
    random_sequences,
    rate,
    seed_summary,
    seeds_chart,
    seq2seq_batch,
    sequence_set,
    sort_batches,
    sorted_symbols,
)

enable_book_charts()

# %% [markdown]
# ## Adaptive computation time
#
# At step $t$ every position that is still running adds the position signal of chapter 4 and
# a *timestep* signal (the same sinusoids, indexed by $t$), so that the shared layer can tell
# steps apart. A halting unit, a linear map and a sigmoid, then gives the position a
# probability $p_t$ of stopping now. The position keeps running while the sum of its
# probabilities stays below $1 - \epsilon$; at the step where the sum would pass it (or at the
# last allowed step) it halts, and that step's weight is the *remainder*
# $R = 1 - \sum_{t' < t} p_{t'}$ instead of $p_t$. The weights of a position's steps therefore
# sum to exactly 1, and its output is the weighted sum of its states after each step. A halted
# position's state is frozen: the other positions still attend to it, but it is not updated.
#
# To learn when to stop, the loop needs a price for thinking. The *ponder cost* of a position
# is $N + R$, its number of steps plus its remainder. $N$ is a count with no gradient, but $R$
# has one, and it pushes the halting unit toward stopping sooner. The loss adds the ponder
# cost, averaged over real positions, times a small weight $\tau$.

# %% tags=["export"]
from collections.abc import Callable

import torch
from torch import nn


class AdaptiveComputationTime(nn.Module):
    """Apply one shared layer up to max_steps times per position, halting adaptively (ACT).

    At each step a halting unit gives every position a probability of stopping now; a position
    stops once its probabilities add up to more than 1 - eps, and its last step gets the
    remainder instead. The output is the steps' states weighted by these numbers, which sum
    to 1 per position. A halted position is no longer updated.
    """

    def __init__(
        self, d_model: int, max_steps: int, *, eps: float = 0.01, halting_bias: float = -1.0
    ) -> None:
        super().__init__()
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.halt = nn.Linear(d_model, 1)
        # a negative bias starts every position with a small halting probability: it ponders
        nn.init.constant_(self.halt.bias, halting_bias)
        self.max_steps, self.threshold = max_steps, 1.0 - eps
        self.signal = PositionalEncoding(d_model, dropout=0.0, max_len=max(max_steps, 512))

    def forward(
        self, x: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor], real: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """x (batch, n, d_model); step(state) -> new state; real (batch, n) marks non-padding.

        Returns the weighted state (batch, n, d_model) and a record with the number of steps
        of each position, its halting weights (batch, n, max_steps) and its ponder cost.
        """
        batch, n, _ = x.shape
        halted = ~real  # padding never runs
        total = torch.zeros(batch, n, device=x.device)  # sum of halting probabilities so far
        remainder = torch.zeros(batch, n, device=x.device)
        steps = torch.zeros(batch, n, device=x.device)
        weights, output = [], torch.zeros_like(x)
        timestep = self.signal.pe[0, : self.max_steps]  # (max_steps, d_model)
        for t in range(self.max_steps):
            # 1) the position and timestep signal, then the halting probability
            state = self.signal(x) + timestep[t]  # (batch, n, d_model)
            p = torch.sigmoid(self.halt(state)).squeeze(-1)  # (batch, n)
            running = ~halted
            # 2) who stops now: their sum would pass the threshold, or this is the last step
            stops = running & ((total + p > self.threshold) | (t == self.max_steps - 1))
            goes_on = running & ~stops
            # 3) weights: p while going on, the remainder 1 - total at the halting step
            remainder = torch.where(stops, 1.0 - total, remainder)
            w = torch.where(goes_on, p, torch.where(stops, remainder, torch.zeros_like(p)))
            total = total + w
            steps = steps + running.float()
            # 4) one step of the shared layer; halted positions keep their state
            new = step(state)
            x = torch.where(running[..., None], new, x)
            output = output + w[..., None] * new
            weights.append(w)
            halted = halted | stops
            if bool(halted.all()):
                break
        unused = [torch.zeros_like(p)] * (self.max_steps - len(weights))  # steps never run
        weights = torch.stack(weights + unused, dim=-1)  # (batch, n, max_steps)
        ponder = ((steps + remainder) * real).sum() / real.sum()  # N(t) + R(t), Graves 2016
        return output, {"steps": steps, "weights": weights, "ponder": ponder}


# %% [markdown]
# A check on a random shared layer: no position runs more than `max_steps` steps, the halting
# weights of every real position sum to 1, padding never runs, and positions differ in how
# many steps they take.

# %%
torch.manual_seed(0)
act = AdaptiveComputationTime(16, max_steps=6)
layer = nn.Sequential(nn.Linear(16, 16), nn.Tanh())  # stands in for a Transformer layer
x = torch.randn(2, 5, 16)  # (batch, n, d_model)
real = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # the second sentence has padding
output, record = act(x, layer, real)
print("steps per position:", record["steps"].int().tolist())
print("halting weights sum to 1 at every real position:",
      bool(torch.allclose(record["weights"].sum(-1)[real], torch.ones(int(real.sum())))))
assert record["steps"].max() <= 6 and record["steps"][~real].eq(0).all()
assert torch.allclose(record["weights"].sum(-1)[real], torch.ones(int(real.sum())))

# %% [markdown]
# ## A Universal Transformer from the book's layers
#
# The model has one `EncoderLayer` and one `DecoderLayer` of chapter 2, each inside its own
# ACT loop, the embeddings and generator of chapter 4, and the interface of `EncoderDecoder`
# (`encode`, `decode`, `generator`), so that `greedy_decode` and chapter 13's `exact_matches`
# work on it unchanged. The decoder's loop runs over target positions under the causal mask:
# a position's halting depends only on the positions before it, so decoding one token at a
# time gives the same result as decoding the whole target at once.

# %% tags=["export"]
from copy import deepcopy


class UniversalTransformer(nn.Module):
    """One shared encoder layer and one shared decoder layer, each repeated with ACT.

    Same interface as EncoderDecoder (encode, decode, generator), so greedy_decode works;
    the last call's ACT records are kept in .act["encoder"] and .act["decoder"].
    """

    def __init__(
        self, V: int, d_model: int = 64, d_ff: int = 128, h: int = 4, *,
        max_steps: int = 4, dropout: float = 0.0, pad: int = PAD_ID,
    ) -> None:
        super().__init__()
        attn = MultiHeadedAttention(h, d_model, dropout=dropout)
        ff = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        c = deepcopy
        self.encoder_layer = EncoderLayer(d_model, c(attn), c(ff), dropout)
        self.decoder_layer = DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout)
        self.encoder_act = AdaptiveComputationTime(d_model, max_steps)
        self.decoder_act = AdaptiveComputationTime(d_model, max_steps)
        self.encoder_norm, self.decoder_norm = LayerNorm(d_model), LayerNorm(d_model)
        self.src_embed, self.tgt_embed = Embeddings(d_model, V), Embeddings(d_model, V)
        self.generator = Generator(d_model, V)
        self.pad, self.act = pad, {}
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Memory (batch, n_src, d_model): the shared encoder layer, as often as ACT says."""
        x, self.act["encoder"] = self.encoder_act(
            self.src_embed(src), lambda s: self.encoder_layer(s, src_mask), src != self.pad
        )
        return self.encoder_norm(x)

    def decode(
        self, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor,
        tgt_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model), the shared decoder layer repeated by ACT."""
        y, self.act["decoder"] = self.decoder_act(
            self.tgt_embed(tgt),
            lambda s: self.decoder_layer(s, memory, src_mask, tgt_mask),
            tgt != self.pad,
        )
        return self.decoder_norm(y)

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model), as EncoderDecoder.forward."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def ponder_cost(self) -> torch.Tensor:
        """The ponder costs of the last forward pass, encoder plus decoder."""
        return self.act["encoder"]["ponder"] + self.act["decoder"]["ponder"]


# %% [markdown]
# ## Training on the sort task
#
# The training loop is chapter 13's, written out here because the loss has a second term: the
# token loss (negative log-likelihood, no label smoothing) plus $\tau$ times the ponder cost of
# encoder and decoder. We measure *token accuracy* (the fraction of target tokens, `</s>`
# included, that greedy decoding gets right at their position) besides chapter 13's
# exact-sequence accuracy, on the same 1,000 held-out test sequences.

# %% tags=["export"]
import torch.nn.functional as F


def token_accuracy(model: nn.Module, batch: Batch) -> float:
    """The fraction of target tokens (with `</s>`) that greedy decoding gets right in place."""
    model.eval()
    with torch.no_grad():
        ys = greedy_decode(model, batch.src, batch.src_mask, batch.tgt_y.size(1) + 1, 0)
    real = batch.tgt_y != 2  # (batch, n_tgt)
    guess = ys[:, 1:]  # (batch, <= n_tgt)
    hits = (guess == batch.tgt_y[:, : guess.size(1)]) & real[:, : guess.size(1)]
    return hits.sum().item() / real.sum().item()


def train_sorter(
    model: nn.Module, *, V: int, epochs: int, ponder_weight: float = 0.0,
    exclude: set | None = None, record_every: int = 10, probe: Batch | None = None,
    seed: int = 0,
) -> list[dict]:
    """Chapter 13's schedule; adds ponder_weight * ponder cost when the model has one.

    Every record_every epochs, the mean steps per real position of encoder and decoder on the
    probe batch (teacher-forced), for models that ponder.
    """
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rate(step, model_size=64, factor=0.5, warmup=100)
    )
    data, history = torch.Generator().manual_seed(seed), []
    for epoch in range(1, epochs + 1):
        model.train()
        for batch in sort_batches(V, 64, 20, generator=data, exclude=exclude):
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
            loss = F.nll_loss(model.generator(out).flatten(0, 1), batch.tgt_y.flatten(),
                              ignore_index=2)
            if ponder_weight:
                loss = loss + ponder_weight * model.ponder_cost()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        if probe is not None and epoch % record_every == 0 and hasattr(model, "act"):
            model.eval()
            with torch.no_grad():
                model(probe.src, probe.tgt, probe.src_mask, probe.tgt_mask)
            for side, ids in (("encoder", probe.src), ("decoder", probe.tgt)):
                steps = model.act[side]["steps"][ids != 2]
                history.append({"epoch": epoch, "stack": side, "mean steps": steps.mean().item()})
    return history


# %% tags=["export"]
import time

UNIVERSAL_SORT_VARIANTS = {  # name -> (steps of the shared layers, ponder weight tau)
    "universal, tau = 1e-4": (4, 1e-4),
    "universal, tau = 1e-2": (4, 1e-2),
    "universal, 4 fixed steps": (4, None),  # halting switched off: every position takes 4
    "universal, 1 step": (1, 0.0),  # one shared layer per stack, applied once
    "chapter 13 Transformer": None,  # two different layers per stack
}


def universal_sort_run(
    variant: str, *, seed: int = 0, epochs: int = 60, probe: Batch | None = None
) -> dict:
    """Train one of UNIVERSAL_SORT_VARIANTS from `seed` on chapter 13's task: the model, its
    steps history on `probe`, and its size, accuracies, mean ACT steps and training time on
    the 1,000 held-out test sequences."""
    if variant not in UNIVERSAL_SORT_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of "
                         f"{', '.join(UNIVERSAL_SORT_VARIANTS)}")
    V = 13  # chapter 13's 10 digits and 3 special tokens
    test_src = random_sequences(1000, V, min_len=4, max_len=10,
                                generator=torch.Generator().manual_seed(1))
    test_batch = seq2seq_batch(test_src, sorted_symbols(test_src))
    torch.manual_seed(seed)
    setting, tau = UNIVERSAL_SORT_VARIANTS[variant], 0.0
    if setting is None:
        model = make_model(V, V, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)
    else:
        max_steps, tau = setting
        model = UniversalTransformer(V, d_model=64, d_ff=128, h=4, max_steps=max_steps)
        if tau is None:  # halting probabilities of about 1e-13, frozen: no position stops early
            for act in (model.encoder_act, model.decoder_act):
                nn.init.constant_(act.halt.bias, -30.0)
                act.halt.requires_grad_(False)
            tau = 0.0
    start = time.perf_counter()
    history = train_sorter(model, V=V, epochs=epochs, ponder_weight=tau,
                           exclude=sequence_set(test_src), probe=probe, seed=seed)
    result = {"model": model, "history": history, "seconds": time.perf_counter() - start,
              "parameters": sum(p.numel() for p in model.parameters()),
              "token accuracy": token_accuracy(model, test_batch),
              "exact": exact_matches(model, test_batch) / len(test_src)}
    if hasattr(model, "act"):  # mean steps per real position, read with teacher forcing
        with torch.no_grad():
            model(test_batch.src, test_batch.tgt, test_batch.src_mask, test_batch.tgt_mask)
        for side, ids in (("encoder", test_batch.src), ("decoder", test_batch.tgt)):
            result[f"{side} steps"] = model.act[side]["steps"][ids != 2].mean().item()
    return result


# %% [markdown]
# Three runs from seed 0, with the same data and budget (60 epochs of 20 batches of 64
# sequences): the Universal Transformer with at most 4 steps and $\tau = 10^{-4}$; the same
# with a hundred times the ponder weight; and chapter 13's Transformer, two different layers
# in each stack. With $d_{model} = 64$ in all three, the Universal Transformer has about half
# the Transformer's parameters (one layer per stack instead of two, plus two halting units);
# at up to 4 steps it may spend up to twice the Transformer's compute per position, less when
# its positions halt early. The mean steps are read with teacher forcing, over the real
# positions.

# %% nbval_reason="accuracies, steps and times differ between machines: training takes another path; bounds below" tags=["nbval-ignore-output"]
torch.set_num_threads(1)  # tiny matrices: one thread does as well as two
V = 13  # chapter 13's 10 digits and 3 special tokens
test_src = random_sequences(1000, V, min_len=4, max_len=10,
                            generator=torch.Generator().manual_seed(1))
test_batch = seq2seq_batch(test_src, sorted_symbols(test_src))
probe = seq2seq_batch(test_src[:200], sorted_symbols(test_src[:200]))
runs = {name: universal_sort_run(name, seed=0, probe=probe)
        for name in ("universal, tau = 1e-4", "universal, tau = 1e-2", "chapter 13 Transformer")}
for name, run in runs.items():
    steps = (f", steps {run['encoder steps']:.2f} (encoder) {run['decoder steps']:.2f} (decoder)"
             if "encoder steps" in run else "")
    print(f"{name:>23}: {run['parameters']:7,d} parameters, token accuracy "
          f"{run['token accuracy']:.2%}, exact {run['exact']:.1%}{steps}, {run['seconds']:.0f} s")

# %%
best = runs["universal, tau = 1e-4"]
assert best["token accuracy"] >= 0.90, best["token accuracy"]
assert runs["universal, tau = 1e-2"]["token accuracy"] >= 0.90, runs
assert runs["chapter 13 Transformer"]["token accuracy"] >= 0.95, runs
for side in ("encoder", "decoder"):  # a larger ponder weight buys fewer steps
    assert runs["universal, tau = 1e-2"][f"{side} steps"] < best[f"{side} steps"] <= 4, side
print("token accuracy: both Universal Transformers at least 90 %, the Transformer at least 95 %,"
      " as in every run of the sweep below; fewer steps with the larger ponder weight")

# %% [markdown]
# One run of each is a demonstration, and this comparison turns over from seed to seed and from
# CPU to CPU: the seed-0 Universal Transformer sorts 97% of tokens under the AMD EPYC's own
# kernels and 92% under the set one level below. So the comparison rests on a sweep
# (`make seeds`, stored in `book/data/seeds_universal_sort.json`): every variant from three
# seeds, each under the CPU's own kernels and the set one level below, with two more baselines
# that isolate what adaptive depth contributes: halting switched off, so that every position
# takes all 4 steps, and the shared layers applied once (no recurrence at all).

# %%
sweep = book_data("seeds_universal_sort.json")
print(f"{sweep['command']}  ({sweep['machine']['cpu']}, torch {sweep['machine']['torch']})")
steps = {(s["variant"], side): s for side in ("encoder", "decoder")
         for s in seed_summary([r for r in sweep["runs"] if f"{side} steps" in r],
                               f"{side} steps")}
ut_summary = {row["variant"]: row for row in seed_summary(sweep["runs"], "token accuracy")}
for name, row in ut_summary.items():
    ponder = "".join(f", {side} steps {steps[name, side]['mean']:.2f}"
                     for side in ("encoder", "decoder") if (name, side) in steps)
    print(f"{name:>24}: token accuracy mean {row['mean']:.2%}, from {row['min']:.2%} to "
          f"{row['max']:.2%} ({row['runs']} runs){ponder}")
seeds_chart(sweep["runs"], metric="token accuracy", title="Token accuracy, every run")

# %%
means = [row["mean"] for row in ut_summary.values()]
assert max(means) - min(means) < 0.02, ut_summary  # all five within 2 points
transformer = ut_summary["chapter 13 Transformer"]
assert all(row["min"] < transformer["max"] and transformer["min"] < row["max"]
           for row in ut_summary.values())  # every range overlaps the Transformer's
by_run = {}
for r in sweep["runs"]:
    by_run.setdefault((r["seed"], r["kernels"]), {})[r["variant"]] = r
for pair in by_run.values():
    small, large = pair["universal, tau = 1e-4"], pair["universal, tau = 1e-2"]
    assert large["encoder steps"] <= small["encoder steps"] < small["decoder steps"]
    assert large["decoder steps"] < small["decoder steps"]
print("the five means lie within 2 points and every range overlaps the Transformer's; in every "
      "run the larger ponder weight takes fewer steps, and the decoder more than the encoder")

# %% [markdown]
# The sweep finds no difference between one shared layer and two different ones, in either
# direction: the five means lie within two points, every variant's range overlaps the
# Transformer's, and paired with the Transformer run of the same seed and kernels each variant
# wins some pairs and loses others. The seed and the CPU's kernels move a run more than the
# choice of model does. The most telling row is the one-step baseline: one shared layer per
# stack, applied once, does no worse than anything here. Sorting ten digits needs no depth once
# attention has gathered the counts, so this task cannot show what adaptive depth buys; a task
# that needs many steps of reasoning could (the Universal Transformer's own paper used
# algorithmic tasks and bAbI). The 99.5 % token accuracy that the graph tutorial reported for
# this task lies within the range of our runs.
#
# What holds in every one of the six pairs of runs is how ACT spends its steps. The larger
# ponder weight takes fewer steps, in both stacks, and the decoder ponders more than the
# encoder: with $\tau = 10^{-4}$ the encoder's positions stop after one or two steps on
# average, the decoder's take about three of their four. The decoder's halting unit does
# learn, as the larger weight shows (it brings the decoder under two steps with no measurable
# loss of accuracy), but a price of $10^{-4}$ per step is small against the token loss, and a
# decoder position, which must predict the next digit, loses almost nothing by taking extra
# steps.
#
# ## How many steps each position takes
#
# The steps of the encoder's positions for a few test sequences, as the seed-0 model with the
# small ponder weight leaves them:

# %% tags=["export", "hide-cell"]
from typing import Any


def steps_chart(cells: list[dict], *, title: str = "ACT steps per source position") -> Any:
    """One row per sequence, one cell per position labelled with its digit, coloured by steps."""
    import altair as alt

    if not cells:
        raise ValueError("cells is empty: nothing to draw")
    base = alt.Chart(alt.Data(values=cells)).encode(
        x=alt.X("position:O", title="source position"),
        y=alt.Y("sequence:N", title="test sequence", sort=None),
    )
    squares = base.mark_rect().encode(
        color=alt.Color("steps:O", title="steps", scale=alt.Scale(scheme="blues")),
        tooltip=["sequence:N", "position:O", "digit:N", "steps:O"],
    )
    return (squares + base.mark_text().encode(text="digit:N")).properties(title=title)


# %% nbval_reason="which positions halt when depends on the training run" tags=["nbval-ignore-output"]
model = best["model"]
model.eval()
with torch.no_grad():
    model.encode(test_batch.src[:8], test_batch.src_mask[:8])
steps = model.act["encoder"]["steps"]  # (8, n_src)
cells = [{"sequence": f"{b + 1}", "position": i, "digit": str(int(d) - 3), "steps": int(s)}
         for b, (row, srow) in enumerate(zip(test_batch.src[:8], steps, strict=True))
         for i, (d, s) in enumerate(zip(row, srow, strict=True)) if d != 2]
print("encoder steps of the first test sequence:", [c["steps"] for c in cells if
                                                      c["sequence"] == "1"])
steps_chart(cells)

# %% [markdown]
# And how the mean number of steps moved during training, in each stack, on 200 test sequences
# read with teacher forcing:

# %% tags=["chart-rows-vary"]
rows = [dict(r, run=name) for name, run in runs.items() for r in run["history"]]
line_chart(rows, x="epoch:Q", y="mean steps:Q", color="run:N", column="stack:N",
           title="Mean ACT steps per position during training", width=260, height=200)

# %% [markdown]
# Look for the direction, which every run of the sweep shares: the larger ponder weight ends
# with fewer steps in both stacks. How fast and how far each curve falls differs from machine
# to machine.
#
# ## What we have
#
# `AdaptiveComputationTime` applies a shared layer to each position until its halting
# probabilities reach 1, with remainders, a weighted output, frozen halted positions and a
# ponder cost; `UniversalTransformer` puts one encoder and one decoder layer of chapter 2 in
# such loops behind the `EncoderDecoder` interface. On the sort task the sweep finds no
# difference in token accuracy between it, chapter 13's Transformer with about twice its
# parameters, and one shared layer applied once: the task is too shallow to show what adaptive
# depth buys, but it shows ACT's halting units answering their price in every run. The
# conclusion, next, looks back over the whole book.
