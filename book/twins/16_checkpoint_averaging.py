# %% [markdown]
# # Checkpoint averaging
#
# Section 6.1 of the paper {cite}`vaswani2017attention` mentions, in one sentence, a step taken
# after training: the base models were not the weights at the end of the run but the average of
# the last 5 checkpoints, which had been written every 10 minutes, and the big models averaged
# the last 20. The paper gives no ablation, but the step became a common one in machine
# translation {cite}`popel2018training`. It is cheap in every way that matters: training is
# unchanged apart from keeping a few files, and the result is one model of the usual size, so
# translating with it costs no more than with a single checkpoint. An ensemble of the same
# checkpoints would run every model on every sentence.
#
# This chapter explains why averaging the weights of one run's late checkpoints works, and why
# averaging the weights of two separate runs does not. It writes the averaging function, tries
# it live on the sort task of chapter 13, and reports what it did for the Multi30k model of
# chapter 14.

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
    LabelSmoothing,
    SimpleLossCompute,
    TrainState,
    book_data,
    enable_book_charts,
    exact_matches,
    fetch_shipped_model,
    line_chart,
    load_checkpoint,
    make_model,
    random_sequences,
    rate,
    run_epoch,
    seed_summary,
    seeds_chart,
    seq2seq_batch,
    sequence_set,
    sort_batches,
    sorted_symbols,
)

enable_book_charts()

# %% [markdown]
# ## Why an average of late checkpoints beats each of them
#
# Late in training the weights no longer move steadily downhill. Each optimizer step follows
# the gradient of one batch, which is the gradient of the whole training loss plus noise: the
# batch is a small sample, and its sentences pull in their own directions. Far from a minimum
# the true gradient is large and the noise is a detail. Near a minimum the true gradient is
# small, and the noise is most of what is left. The learning rate is still well above zero (the
# schedule of chapter 10 decays only as one over the square root of the step and never reaches
# zero), so the steps stay large enough to carry the weights past the bottom of the valley. The
# weights do not settle at the minimum; they wander around it, like a marble in a bowl that is
# being shaken.
#
# A checkpoint is a snapshot of that wandering: a point somewhere on the wall of the bowl, off
# to one side. Snapshots taken a while apart sit on different sides, and in their average the
# offsets in opposite directions cancel, leaving a point closer to the bottom than a typical
# snapshot. A quadratic bowl makes this precise. Write the loss near its minimum $\theta^*$ as
#
# $$L(\theta) \approx L(\theta^*) + \tfrac{1}{2}(\theta - \theta^*)^\top H (\theta -
# \theta^*),$$
#
# and the $k$ checkpoints as $\theta_i = \theta^* + \varepsilon_i$. The average
# $\bar\theta = \tfrac{1}{k}\sum_i \theta_i$ is off by the average offset
# $\bar\varepsilon$. If the offsets were independent with the same spread, the average offset
# would have $1/k$ of their variance, and the excess loss
# $\tfrac{1}{2}\bar\varepsilon^\top H \bar\varepsilon$ of the average would be, in
# expectation, $k$ times smaller than that of a single checkpoint. Real checkpoints are not
# independent: a checkpoint is the previous one plus a few hundred small steps, so neighbours
# sit on the same side of the bowl, and the gain is smaller. That is one reason to space
# checkpoints apart, as the paper's ten minutes do. Going too far back has the opposite cost: a
# checkpoint from before the weights reached the valley is not scattered around its bottom but
# still on the way down, and pulls the average back up the slope.
#
# The idea is older than neural networks. {cite:t}`polyak1992acceleration` and, independently,
# {cite:t}`ruppert1988efficient` showed that for stochastic approximation (in today's words,
# stochastic gradient descent on a smooth, strongly convex problem) the running average of the
# iterates reaches the best possible asymptotic accuracy, even when the steps shrink more slowly
# than $1/t$ and the last iterate alone converges more slowly: the large steps make fast
# progress, and the averaging removes the noise that they bring. Stochastic weight averaging {cite}`izmailov2018averaging` brought
# it to deep networks: keep the learning rate constant (or cycle it) for the last part of
# training and average the weights visited along the way. Izmailov and colleagues found that the
# average lands in a wider, flatter region of the loss than the individual iterates, and
# generalizes better. The paper's checkpoint averaging is the same idea done after the fact,
# with files that the training run wrote anyway.
#
# The bowl is a picture, not a guarantee. A deep network's loss is not quadratic, and the
# average of two good points is only good if the loss stays low on the straight line between
# them. Whether it does can be measured; we will look at that line below.
#
# ## Why only within one run
#
# Averaging weights is not the same as averaging what models compute. Take a feed-forward layer with $d_{ff}$ hidden
# units (chapter 4) and swap two of them: exchange two rows of $W_1$, the same two entries of
# $b_1$, and the same two columns of $W_2$. Every unit still computes what it did, it is only
# stored in another slot, and the layer's output is unchanged. Any of the $d_{ff}!$ orders of the
# units gives the same function, and so does any order of the heads of an attention layer. The
# weights, though, are different vectors, and averaging unit 7 of one order with unit 7 of
# another blends two unrelated features into one that neither network computes.
#
# Two runs from different random initializations are in exactly this position: even where they
# learn similar features, nothing makes them learn them in the same slots, and the average of
# their weights is in general a much worse network than either {cite}`entezari2022role`.
# (Matching up the units of two networks before averaging them is possible, and is a research
# topic of its own {cite}`ainsworth2023git`.) Within one run the problem does not arise: late
# checkpoints are a few hundred small steps apart, so every unit keeps its role from one
# checkpoint to the next and the weights of corresponding slots can be averaged meaningfully.
# What matters is a shared history: copies of one network that share the first part of their
# training and only then go separate ways (with different batches) usually end up where their
# average is as good as they are {cite}`frankle2020linear`, and models fine-tuned from one
# pretrained model can often be averaged too {cite}`wortsman2022model`.
#
# ## The function
#
# `average_checkpoints` takes a list of checkpoint files or state dicts and returns the state
# dict of their mean. A few details matter in practice:
#
# * Files are read with chapter 14's `load_checkpoint`, so with `weights_only=True`: averaging
#   checkpoints downloaded from somewhere else must not run code hidden in them. They are read
#   one at a time into a running sum, so twenty checkpoints need the memory of one plus the sum.
# * The sum is kept in float64 and divided once, then cast back to each tensor's own dtype: the
#   average of float16 weights is float16. Summing twenty float16 checkpoints in float16 would
#   round after every addition.
# * Only floating-point tensors are averaged. Integer tensors, such as a step counter or the
#   `num_batches_tracked` of a batch-norm layer, have no meaningful average; they must be equal
#   in every checkpoint, or the function refuses. (Our model's state dict has none: its
#   positional table is a buffer that is not saved.)
# * Checkpoints with different keys, shapes or dtypes are different models, and are refused with
#   a message that names what differs.
#
# The optimizer's state is not averaged: the result is for translating, not for training on.

# %% tags=["export"]
import os
from collections.abc import Mapping, Sequence

import torch


def average_checkpoints(
    checkpoints: Sequence[str | os.PathLike | Mapping[str, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """The elementwise mean of one model's weights at several points of one training run.

    Each item is a checkpoint file (its "model" weights, read by load_checkpoint with
    weights_only=True) or a state dict. Floating-point tensors are summed in float64 and cast
    back to their own dtype; other tensors (integer counters, masks) must be equal everywhere.
    """
    if isinstance(checkpoints, str | os.PathLike | Mapping):
        raise TypeError("checkpoints must be a list of paths or state dicts, not a single one")
    if len(checkpoints) == 0:
        raise ValueError("checkpoints is empty: give at least one path or state dict to average")
    names = [str(c) if isinstance(c, str | os.PathLike) else f"checkpoints[{i}]"
             for i, c in enumerate(checkpoints)]
    first = _weights_to_average(checkpoints[0], names[0])
    total = {k: v.double() if v.is_floating_point() else v for k, v in first.items()}
    for item, name in zip(checkpoints[1:], names[1:], strict=True):
        state = _weights_to_average(item, name)
        _check_same_layout(first, state, names[0], name)
        for key, tensor in state.items():
            if tensor.is_floating_point():
                total[key] += tensor.double()  # float64: no rounding drift over many checkpoints
            elif not torch.equal(tensor, first[key]):
                raise ValueError(
                    f"{name}: {key!r} holds {tensor.dtype} values that differ from {names[0]}; "
                    "only floating-point tensors are averaged, the others must be equal"
                )
    n = len(checkpoints)
    return {k: (v / n).to(first[k].dtype) if v.is_floating_point() else v.clone()
            for k, v in total.items()}


def _weights_to_average(
    item: str | os.PathLike | Mapping[str, torch.Tensor], name: str
) -> Mapping[str, torch.Tensor]:
    """A state dict: the "model" entry of a checkpoint file, or the mapping itself."""
    if isinstance(item, str | os.PathLike):
        item = load_checkpoint(item)["model"]
    if not isinstance(item, Mapping):
        raise TypeError(f"{name} must be a checkpoint path or a state dict, got {type(item)}")
    for key, value in item.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: {key!r} is a {type(value).__name__}, not a tensor; "
                            "pass a state dict such as checkpoint['model']")
    return item


def _check_same_layout(
    first: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor], first_name: str,
    name: str,
) -> None:
    """Raise unless `other` has the keys, shapes and dtypes of `first`: the same model."""
    missing, extra = sorted(first.keys() - other.keys()), sorted(other.keys() - first.keys())
    if missing or extra:
        raise ValueError(f"{name} does not have the keys of {first_name}: missing "
                         f"{missing[:3] or 'none'}, unexpected {extra[:3] or 'none'}")
    for key, tensor in other.items():
        if tensor.shape != first[key].shape or tensor.dtype != first[key].dtype:
            raise ValueError(
                f"{name}: {key!r} is {tuple(tensor.shape)} {tensor.dtype}, but "
                f"{tuple(first[key].shape)} {first[key].dtype} in {first_name}; checkpoints "
                "of different models (or precisions) cannot be averaged"
            )

# %% [markdown]
# Two tiny state dicts and their average, then what the checks say about inputs that cannot be
# averaged:

# %%
import torch

a = {"w": torch.tensor([1.0, 2.0, 3.0]), "steps": torch.tensor(5)}
b = {"w": torch.tensor([3.0, 2.0, 0.0]), "steps": torch.tensor(5)}
print(average_checkpoints([a, b]))
print(average_checkpoints([{k: v.half() if v.is_floating_point() else v for k, v in a.items()}]))
for bad in ([], [a, {"w": torch.zeros(4), "steps": torch.tensor(5)}],
            [a, {"w": b["w"], "steps": torch.tensor(6)}], [a, {"w": b["w"]}]):
    try:
        average_checkpoints(bad)
    except ValueError as err:
        print("ValueError:", err)

# %% [markdown]
# ## Averaging on the sort task
#
# A small experiment shows the effect within a minute. We train chapter 13's sort model again
# (the same model, schedule and seeds; chapter 13 also held out a validation set, which this run
# does not need, so the batches differ a little) for 500 optimizer steps, and keep a copy of the
# weights every 20 steps: 25 checkpoints. Then we compare, on the 1,000 held-out test sequences,
# the last checkpoint alone with averages of the last $k$. Two measures: the loss per token
# with the right answer fed in (teacher forcing, as in training), and the exact-match accuracy
# of greedy decoding (chapter 13's `exact_matches`: a sequence counts only if every digit and
# the final `</s>` are right). As in chapter 13, the model is too small to profit from a
# second CPU thread.

# %% tags=["export"]
import functools

import torch
from torch import nn

SORT_V = 13  # <s>, </s>, padding and the digits 0-9 (chapter 12)


@functools.cache
def averaging_test_set() -> tuple[Batch, frozenset]:
    """1,000 held-out sort sequences of 4 to 10 digits (seed 1), and their set, which training
    excludes."""
    src = random_sequences(1000, SORT_V, min_len=4, max_len=10,
                           generator=torch.Generator().manual_seed(1))
    return seq2seq_batch(src, sorted_symbols(src)), frozenset(sequence_set(src))


def sort_model_with_checkpoints(
    seed: int = 0, *, steps: int = 500, every: int = 20
) -> tuple[nn.Module, list[tuple[int, dict[str, torch.Tensor]]]]:
    """Chapter 13's sort model trained for `steps` optimizer steps from `seed`, and a copy of
    its weights every `every` steps: (optimizer step, weights) pairs."""
    torch.manual_seed(seed)
    model = make_model(SORT_V, SORT_V, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)
    criterion = LabelSmoothing(SORT_V, padding_idx=PAD_ID, smoothing=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: rate(step, model_size=64, factor=0.5, warmup=100)
    )
    data = torch.Generator().manual_seed(seed)
    _, held_out = averaging_test_set()
    state, checkpoints = TrainState(), []
    while state.accum_step < steps:
        batches = sort_batches(SORT_V, 64, every, generator=data, exclude=held_out)
        run_epoch(batches, model, SimpleLossCompute(model.generator, criterion), optimizer,
                  scheduler, train_state=state, log_every=None)
        checkpoints.append((state.accum_step, {k: v.clone() for k, v in
                                               model.state_dict().items()}))
    return model, checkpoints


def held_out_loss(model: nn.Module, weights: dict[str, torch.Tensor]) -> float:
    """Loss per target token of `weights` on the held-out sequences, with teacher forcing."""
    test_batch, _ = averaging_test_set()
    model.load_state_dict(weights)
    criterion = LabelSmoothing(SORT_V, padding_idx=PAD_ID, smoothing=0.0)
    loss, _ = run_epoch([test_batch], model, SimpleLossCompute(model.generator, criterion),
                        mode="eval", log_every=None)
    return loss


def held_out_accuracy(model: nn.Module, weights: dict[str, torch.Tensor]) -> float:
    """Share of held-out sequences that greedy decoding with `weights` sorts exactly."""
    test_batch, _ = averaging_test_set()
    model.load_state_dict(weights)
    return exact_matches(model, test_batch) / test_batch.src.size(0)


# %%
import time

import torch

torch.set_num_threads(1)  # tiny matrices: a second thread costs more than it saves
start = time.perf_counter()
model, checkpoints = sort_model_with_checkpoints(seed=0)
print(f"{len(checkpoints)} checkpoints, steps {checkpoints[0][0]} to {checkpoints[-1][0]}; "
      f"training took {time.perf_counter() - start:.1f} s")
print(f"learning rate at the end: {rate(500, model_size=64, factor=0.5, warmup=100):.2g}")

# %%
# NBVAL_IGNORE_OUTPUT
# (held-out losses of a training run: their digits differ with another CPU's float kernels)
import pandas as pd

probe = make_model(SORT_V, SORT_V, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)  # loads weights


rows = []
for k in (1, 2, 5, 10, 20):
    averaged = average_checkpoints([weights for _, weights in checkpoints[-k:]])
    rows.append({
        "checkpoints averaged": k,
        "steps": f"{checkpoints[-k][0]}-{checkpoints[-1][0]}",
        "held-out loss": round(held_out_loss(probe, averaged), 4),
        "exact matches": f"{held_out_accuracy(probe, averaged):.1%}",
    })
assert rows[2]["held-out loss"] < rows[0]["held-out loss"], rows  # the average of 5 beats the last
pd.DataFrame(rows).set_index("checkpoints averaged")

# %% [markdown]
# The table is one run, a demonstration; the cell asserts only that the average of the last
# five has a lower held-out loss than the last checkpoint alone. Whether that is a finding is a
# question for more runs: `tools/seeds.py checkpoint_averaging` trains the same model from seeds
# 0 to 4, under this CPU's own kernels and under the set one level below, and scores the same
# averages of each run.

# %%
averaging = book_data("seeds_checkpoint_averaging.json")["runs"]
for by_loss, by_exact in zip(seed_summary(averaging, "loss"), seed_summary(averaging, "exact"),
                             strict=True):
    print(f"{by_loss['variant']:24s} {by_loss['runs']} runs: loss {by_loss['min']:.4f} to "
          f"{by_loss['max']:.4f}, exact {by_exact['min']:.1%} to {by_exact['max']:.1%}")
runs = {}  # (seed, kernels) -> {variant: held-out loss}
for run in averaging:
    runs.setdefault((run["seed"], run["kernels"]), {})[run["variant"]] = run["loss"]
assert all(loss[k] < loss["last checkpoint"] for loss in runs.values() for k in loss
           if k != "last checkpoint")  # every average beats the last checkpoint, in every run
assert all(loss["average of the last 20"] > loss["average of the last 10"]
           for loss in runs.values())

# %%
seeds_chart(averaging, metric="exact",
            title="Held-out sequences sorted exactly: five seeds x two kernel sets")

# %% [markdown]
# In all ten runs every average beats the last checkpoint alone in held-out loss, and the
# average of the last ten sorts 99.4% to 99.9% of the held-out sequences, where the last
# checkpoint alone sorts 79.7% to 96.8%. Twenty checkpoints are too many in every run: that
# window reaches back to step 120, when the model was still learning to sort, and those early
# weights pull the average back up the slope (its loss is higher than the ten's in all ten
# runs).
#
# To be fair to the last checkpoint, in the run stored here step 500 happens to be a poor one: the
# learning rate there is still 0.0028, high for Adam, and the single checkpoints around it are
# better or worse by chance, so how much the averages gain over the last checkpoint depends on
# where it happens to land. The running picture below shows how much they vary.
#
# A table compares one moment of training. The chart below follows the whole run: at every
# checkpoint from step 100 on, the held-out loss of that checkpoint alone and of the average of
# it and the four before it (the paper's recipe of five).

# %%
# NBVAL_IGNORE_OUTPUT
# (held-out losses of a training run: their digits differ with another CPU's float kernels)
window = 5
curve = []
for i in range(window - 1, len(checkpoints)):
    step, weights = checkpoints[i]
    recent = average_checkpoints([w for _, w in checkpoints[i - window + 1 : i + 1]])
    curve.append({"step": step, "weights": "this checkpoint",
                  "loss": round(held_out_loss(probe, weights), 6)})
    curve.append({"step": step, "weights": f"average of the last {window}",
                  "loss": round(held_out_loss(probe, recent), 6)})
single = [row["loss"] for row in curve if row["weights"] == "this checkpoint"]
averaged = [row["loss"] for row in curve if row["weights"] != "this checkpoint"]
ratios = [s / a for a, s in zip(averaged[-10:], single[-10:], strict=True)]
print(f"last 10 checkpoints: single losses {min(single[-10:]):.4f} to {max(single[-10:]):.4f}, "
      f"averages of {window} {min(averaged[-10:]):.4f} to {max(averaged[-10:]):.4f}")
print(f"the average's loss was lower at {sum(r > 1 for r in ratios)} of those 10 checkpoints, "
      f"by a factor of {min(ratios):.1f} to {max(ratios):.1f}")
assert sum(r > 1 for r in ratios) >= 8, ratios
line_chart(curve, x="step:Q", y="loss:Q", color="weights:N", y_scale={"type": "log"},
           formats={"loss": ".4f"}, x_title="optimizer step", y_title="held-out loss per token",
           width=420, height=240, title="One checkpoint against the average of the last five")

# %% [markdown]
# In the run stored with this page, over the last ten checkpoints (steps 320 to 500) the single
# checkpoints' held-out loss jumps up and down between 0.0232 and 0.0802 from one checkpoint to
# the next, while the average of five stays between 0.0056 and 0.0182 and is lower every time,
# by a factor of 1.8 to 9.5. Another machine prints other values; the cell asserts that the
# average is lower at no fewer than 8 of those 10 checkpoints, a bound with room to spare, as
# the sweep below shows. The jumps are the shaken marble of the first section, and the average's
# smooth descent is roughly what the run would look like without them. A learning rate that
# decayed to zero would calm the single checkpoints too, but it has to be planned before
# training, for a known end; averaging needs no plan, and can be done after the run with any
# window.

# %% [markdown]
# `tools/seeds.py running_average` asked the same question of ten runs (seeds 0 to 4, each
# under this CPU's own kernels and under the set one level below): at each of the last ten
# checkpoints, is the average of five lower in held-out loss than the checkpoint alone?

# %%
running = book_data("seeds_running_average.json")["runs"]
lower = [round(run["share"] * 10) for run in running]
print(f"the average of 5 was lower at {min(lower)} to {max(lower)} of the last 10 checkpoints, "
      f"in each of {len(running)} runs")
print(f"by a factor of {min(r['min_ratio'] for r in running):.1f} "
      f"to {max(r['max_ratio'] for r in running):.1f}")
assert min(lower) >= 8  # the bound the cell above asserts, met by every run
seeds_chart(running, metric="share", width=360,
            title="Share of the last ten checkpoints where the average of five is lower")


# %% [markdown]
# In every run the average of five was lower at each of the last ten checkpoints, never by
# less than the smallest factor printed above. The run stored with this page is no lucky
# draw: a single late checkpoint of this schedule is a noisy sample, and averaging five
# of them removes most of the noise in every run we made.

# %% [markdown]
# ## The straight line between two weights
#
# The average of two checkpoints is the midpoint of the straight line between them, so the loss
# along that line shows what averaging can gain or lose. We walk the line
# $\theta(\alpha) = (1 - \alpha)\,\theta_a + \alpha\,\theta_b$ from $\alpha = -0.5$ to $1.5$: $\alpha = 0$ is
# the first weights, $\alpha = 1$ the second, and values outside $[0, 1]$ continue the line
# beyond them {cite}`goodfellow2015qualitatively`. Two pairs:
#
# * two checkpoints of our run, at steps 400 and 500;
# * the final weights and a permuted twin: the same weights with the hidden units of every
#   feed-forward layer shuffled, as described above. The twin computes the same function (its
#   loss and its translations are those of the original, up to the rounding of a sum taken in
#   another order), so it is as good a model as the original. It stands in for a second run
#   that happened to learn the same features in other slots, the most favourable case for
#   averaging two runs.

# %%
# NBVAL_IGNORE_OUTPUT
# (held-out losses of a training run: their digits differ with another CPU's float kernels)
def permute_feed_forward(weights: dict[str, torch.Tensor], generator: torch.Generator):
    """The same network with the hidden units of every feed-forward layer in a new order."""
    permuted = dict(weights)
    for key in weights:
        if key.endswith("feed_forward.w_1.weight"):
            layer = key.removesuffix("w_1.weight")
            order = torch.randperm(weights[key].size(0), generator=generator)  # (d_ff,)
            permuted[layer + "w_1.weight"] = weights[layer + "w_1.weight"][order]  # rows are units
            permuted[layer + "w_1.bias"] = weights[layer + "w_1.bias"][order]
            permuted[layer + "w_2.weight"] = weights[layer + "w_2.weight"][:, order]  # columns
    return permuted


final = checkpoints[-1][1]
twin = permute_feed_forward(final, torch.Generator().manual_seed(0))
blend = average_checkpoints([final, twin])
for name, weights in [("final weights", final), ("permuted twin", twin), ("their average", blend)]:
    print(f"{name:>14}: held-out loss {held_out_loss(probe, weights):.4f}, "
          f"exact matches {held_out_accuracy(probe, weights):.1%}")
assert abs(held_out_loss(probe, twin) - held_out_loss(probe, final)) < 1e-4  # the same function
assert held_out_loss(probe, blend) > 2 * held_out_loss(probe, final)  # but not a point between them


# %%
# NBVAL_IGNORE_OUTPUT
# (held-out losses of a training run: their digits differ with another CPU's float kernels)
import altair as alt


def interpolate(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], alpha: float):
    """The weights (1 - alpha) * a + alpha * b: a point on the straight line through a and b."""
    return {key: (1 - alpha) * a[key] + alpha * b[key] for key in a}


pairs = {"steps 400 and 500 of one run": (checkpoints[-6][1], checkpoints[-1][1]),
         "final weights and permuted twin": (final, twin)}
line = []
for pair, (a, b) in pairs.items():
    for i in range(17):
        alpha = -0.5 + 0.125 * i
        loss = held_out_loss(probe, interpolate(a, b, alpha))
        line.append({"pair": pair, "alpha": alpha, "loss": round(loss, 6)})
for pair in pairs:
    at = {row["alpha"]: row["loss"] for row in line if row["pair"] == pair}
    print(f"{pair}: loss {at[0.0]:.4f} at alpha 0, {at[0.5]:.4f} at 0.5 (the average), "
          f"{at[1.0]:.4f} at 1")
one_run, twins = ({r["alpha"]: r["loss"] for r in line if r["pair"] == pair} for pair in pairs)
assert one_run[0.5] < max(one_run[0.0], one_run[1.0])  # one run: the middle is no worse
assert twins[0.5] > 2 * twins[0.0]  # twins: a ridge between them
alt.hconcat(*(
    line_chart([row for row in line if row["pair"] == pair], x="alpha:Q", y="loss:Q",
               y_scale={"type": "log"}, formats={"alpha": ".3f", "loss": ".4f"},
               x_title="alpha (0 and 1 are the two weights)", y_title="held-out loss per token",
               width=260, height=220, title=pair)
    for pair in pairs
))

# %% [markdown]
# In the run stored with this page the loss dips along the line between steps 400 and 500: the
# midpoint, which is the average of the two checkpoints, has loss 0.0121, lower than either
# end (0.0273 and 0.0254), and beyond either end the loss climbs. The two checkpoints sit on
# opposite walls of one valley, as in the picture of the bowl. Another machine's run prints
# other losses; the cell asserts only that the midpoint is lower than the worse of the two
# ends.
#
# Between the final weights and their permuted twin the line does the opposite. Both ends have
# the same loss up to rounding, which the cells above assert, because they are the same
# function (loss 0.0254, and 93.8 % sorted, in the stored run); their average has loss 0.2329
# and sorts 51.3 %. This ridge is asserted too, so every machine that passes the tests shows
# it: the average's loss is more than twice that of the ends. Averaging is done slot by slot,
# and in the two networks the slots hold different units. The damage is limited here only
# because we shuffled the feed-forward layers alone, so that attention and embeddings still
# agree; two independent runs would disagree everywhere.
#
# ## Multi30k
#
# The shipped model of chapter 14 is the last checkpoint of a 12-epoch run; nothing was averaged.
# To have checkpoints to average, we continued that run for five more epochs, keeping the
# weights of each one: chapter 14's training script can keep the last $K$ epochs' weights as
# `epoch_NNN.pt` files (`--keep-epochs`), beside the full checkpoint `last.pt` that it resumes
# from. The run continued from a copy of the shipped run's folder, so the original stayed as it
# was; the learning-rate schedule simply went on where it had stopped. Then each single epoch,
# and averages of the last 2, 3 and 5 epochs, were translated greedily on the validation set and
# the 2016 Flickr test set and scored with sacreBLEU, exactly as chapter 14 scores the shipped
# model:
#
# ```bash
# python tools/train.py --config cpu --resume --epochs 17 --keep-epochs 5 --threads 1 \
#     --checkpoint-dir checkpoints/multi30k_cpu_avg
# python tools/average_checkpoints.py checkpoints/multi30k_cpu_avg/epoch_01{5,6,7}.pt \
#     --bleu --threads 1 --results book/models/multi30k_cpu/averaging.json \
#     --name "average of epochs 15-17"
# ```
#
# `--output FILE` writes the averaged model to a file that `load_trained_model` and
# `tools/translate.py` read. Training five epochs and translating nine models took about an hour
# on this book's 2-core CPU, far too long for a chapter, so the notebook does not repeat it: it
# prints what those commands measured, stored in `book/models/multi30k_cpu/averaging.json`
# beside the shipped model (only the scores; the averaged weights are not shipped). The
# averaging code itself ran live above, on the sort task, and is covered by the tests.

# %%
import json

path = fetch_shipped_model() / "averaging.json"  # in Colab, downloaded and checked
measured = json.loads(path.read_text())
training = measured["training"]
print("training: ", training["command"])
print("          ", training["started_from"])
print("hardware: ", training["hardware"])
for row in training["epochs"]:
    print(f"epoch {row['epoch']} | train loss {row['train_loss']:.4f} | "
          f"val loss {row['val_loss']:.4f} | {row['seconds'] / 60:.1f} min")

# %%
results = pd.DataFrame([
    {"weights": entry["name"],
     "val BLEU": entry["scores"]["val"]["bleu"],
     "test BLEU": entry["scores"]["test_2016_flickr"]["bleu"]}
    for entry in measured["results"]
]).set_index("weights")
print("measured by, for example:", measured["results"][-1]["command"])
print("on:", measured["results"][-1]["hardware"], "|", measured["results"][-1]["date"])
print("sacreBLEU:", measured["results"][-1]["scores"]["val"]["signature"])
results

# %% tags=["export", "hide-cell"]
from typing import Any


def bleu_points_chart(results: Any, *, title: str) -> Any:
    """A row per set of weights, a dot per split: the "val BLEU" and "test BLEU" of `results`.

    `results` is a DataFrame indexed by the name of the weights, in the order to show them.
    """
    import altair as alt

    missing = {"val BLEU", "test BLEU"} - set(results.columns)
    if missing:
        raise ValueError(f"results lacks the columns {sorted(missing)}")
    points = [
        {"weights": name, "split": split, "BLEU": row[f"{split} BLEU"]}
        for name, row in results.iterrows()
        for split in ("val", "test")
    ]
    return (
        alt.Chart(alt.Data(values=points))
        .mark_point(filled=True, size=70)
        .encode(
            x=alt.X("BLEU:Q", title="greedy sacreBLEU", scale=alt.Scale(zero=False)),
            y=alt.Y("weights:N", title=None, sort=list(results.index)),
            color=alt.Color("split:N", title=None),
            tooltip=["weights:N", "split:N", alt.Tooltip("BLEU:Q", format=".2f")],
        )
        .properties(width=380, height=230, title=title)
    )


# %%
bleu_points_chart(results, title="Multi30k: single epochs and averages")

# %% [markdown]
# All the scores in this table were measured with greedy decoding that may write `<unk>`,
# before chapter 18 banned it; with the ban, chapter 14 prints 37.82 and 37.62 for the shipped
# model. The comparisons below are between rows measured the same way.
#
# Three things stand out. First, continuing the run helped a little on its own: epochs 16 and
# 17 score 36.80 and 36.79 on the validation set against the shipped model's 36.06, and all
# five new epochs score between 37.13 and 37.95 on the test set against 36.66, even though the
# validation loss rose from 1.4519 to 1.5124. (The loss, with label smoothing, also measures
# how confident the model is; a model can grow more confident, and be punished for it by the
# loss, while its greedy choices get better.)
#
# Second, single epochs jump around. From epoch 15 to epoch 16 the validation BLEU moved from
# 35.73 to 36.80, with nothing changed but one more epoch of training. That is the size of the
# noise any single comparison in this table has to beat.
#
# Third, every average scores above every single epoch, on both sets: 36.90 to 37.20 on the
# validation set against at most 36.80, and 38.18 to 38.70 on the test set against at most
# 37.95. Against epoch 17, the model one would keep without averaging, the averages gain 0.1 to
# 0.4 BLEU on the validation set and 1.0 to 1.5 on the test set. We would not trust any one of
# these differences to a few tenths of a point (the two sets do not even agree on their size),
# but they all point the same way, as on the sort task. Which window is best these numbers do
# not settle: two epochs did best on the validation set, five on the test set. The averaged
# weights are not shipped with the book; `--output` makes them in a few seconds.
#
# ### The same measurement with chapter 18's decoders
#
# The word-level run's checkpoints were not kept, so its rows cannot be scored again with the
# decoders as chapter 18 leaves them: `<unk>` banned, and beam search with the paper's settings
# beside greedy decoding. Chapter 18 trains a second subword model (chapter 17 introduces subword
# vocabularies), with untied embeddings, that kept its last five epochs. Here are its single
# epochs and the averages of its last 2, 3 and 5, scored both ways in half precision on both
# sets (`book/data/results_multi30k_more.json`, made by `tools/evaluate.py`):

# %%
more = book_data("results_multi30k_more.json")["results"]
bleu_of = {(e["model"], e["decoding"], e["split"]): e["bleu"] for e in more}
weights = {"untied-epoch-8": "epoch 8", "untied-epoch-9": "epoch 9",
           "untied-epoch-10": "epoch 10", "untied-epoch-11": "epoch 11",
           "subwords-untied": "epoch 12", "untied-average-11-12": "average of epochs 11-12",
           "untied-average-10-12": "average of epochs 10-12",
           "subwords-untied-average": "average of epochs 8-12"}
columns = {("val", "greedy"): "val greedy", ("val", "beam4"): "val beam 4",
           ("test_2016_flickr", "greedy"): "test greedy",
           ("test_2016_flickr", "beam4"): "test beam 4"}
untied = pd.DataFrame([
    {"weights": label, **{column: bleu_of[name, decoding, split]
                          for (split, decoding), column in columns.items()}}
    for name, label in weights.items()
]).set_index("weights")
singles, averages = untied.iloc[:5], untied.iloc[5:]
for column in untied.columns:
    print(f"{column:>11}: single epochs {singles[column].min():.2f} to "
          f"{singles[column].max():.2f}, averages {averages[column].min():.2f} to "
          f"{averages[column].max():.2f}")
assert (averages.max() - averages.min() < singles.max() - singles.min()).all()  # steadier
val, test = ["val greedy", "val beam 4"], ["test greedy", "test beam 4"]
assert (averages[val].min() > singles[val].max()).all()  # on val every average wins
assert (averages[test].min() < singles[test].max()).all()  # on test not every one
untied

# %% [markdown]
# On the validation set every average beats every single epoch, with both decoders, as in the
# word-level table. On the test set they do not: the average of the last two epochs is still
# the best row with both decoders, but the averages of three and five score below epoch 12. What
# holds on every column is that the averages lie closer together than the single epochs: from
# epoch 9 to epoch 10 greedy test BLEU fell from 39.19 to 37.43 and came back at epoch 11, a
# swing no average shows. Averaging takes out much of the noise of a single epoch; whether the
# result is also better than the run's last epoch varied from run to run on Multi30k, which
# chapter 18 measures over three runs.
#
# ```{note}
# The classic Annotated Transformer sketched model averaging in four lines, `average(model,
# models)`, that were never called. They could not have run: they asked each model for
# `m.params()`, which PyTorch modules do not have, and summed with `torch.sum(*ps[1:])`, but
# `torch.sum` reduces a single tensor and takes its second argument for a dimension, not for a
# tensor to add. Here the function is
# tested, reads files without running code from them, checks that the checkpoints belong to
# one model, and has been run on a real training run.
# ```
#
# ## What we have
#
# A function, and a script around it, that turns the last checkpoints of a run into one model
# at no cost beyond keeping a few files; a reason it works (late iterates scatter around a
# minimum, and their mean sits nearer its bottom); a reason it must stay within one run (the
# units of independently trained networks sit in unrelated slots); and measurements of what it
# gave on two tasks. The models of this book still use a vocabulary of whole words, which turns
# every rare word into `<unk>`; the next chapter replaces it with subwords.
