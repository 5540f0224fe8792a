# %% [markdown]
# # Checkpoint averaging
#
# Section 6.1 of the paper {cite}`vaswani2017attention` mentions, in one sentence, a step taken
# after training: the base models were not the weights at the end of the run but the average of
# the last 5 checkpoints, written every 10 minutes, and the big models averaged the last 20. The
# paper gives no ablation, but the step became a common one in machine translation
# {cite}`popel2018training`. It is cheap: training is unchanged apart from keeping a few files,
# and the result is one model of the usual size, where an ensemble of the same checkpoints would
# run every model on every sentence.
#
# This chapter explains why averaging the weights of one run's late checkpoints works and why
# averaging two separate runs does not, writes the averaging function, tries it on chapter 13's
# sort task, and reports what it did for Multi30k models.

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
    current_command,
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
# Late in training the weights no longer move steadily downhill. Each optimizer step follows the
# gradient of one batch, which is the gradient of the whole training loss plus noise. Far from a
# minimum the true gradient is large and the noise is a detail; near a minimum the true gradient
# is small, and the noise is most of what is left. The learning rate is still well above zero
# (chapter 10's schedule decays only as one over the square root of the step), so the steps stay
# large enough to carry the weights past the bottom of the valley. The weights wander around the
# minimum, like a marble in a bowl that is being shaken.
#
# A checkpoint is a snapshot of that wandering, a point on the wall of the bowl. Snapshots taken a
# while apart sit on different sides, and in their average the offsets in opposite directions
# cancel, leaving a point closer to the bottom. A quadratic bowl makes this precise. Write the
# loss near its minimum $\theta^*$ as
#
# $$L(\theta) \approx L(\theta^*) + \tfrac{1}{2}(\theta - \theta^*)^\top H (\theta -
# \theta^*),$$
#
# and the $k$ checkpoints as $\theta_i = \theta^* + \varepsilon_i$. The average
# $\bar\theta = \tfrac{1}{k}\sum_i \theta_i$ is off by the average offset $\bar\varepsilon$. If
# the offsets were independent with the same spread, $\bar\varepsilon$ would have $1/k$ of their
# variance, and the excess loss $\tfrac{1}{2}\bar\varepsilon^\top H \bar\varepsilon$ of the
# average would be, in expectation, $k$ times smaller than a single checkpoint's. Real checkpoints
# are not independent: neighbours, a few hundred small steps apart, sit on the same side of the
# bowl, so the gain is smaller, which is one reason to space them apart, as the paper's ten
# minutes do. Going too far back costs too: a checkpoint from before the weights reached the
# valley is still on the way down, and pulls the average back up the slope.
#
# The idea is older than neural networks. {cite:t}`polyak1992acceleration` and, independently,
# {cite:t}`ruppert1988efficient` showed that for stochastic gradient descent on a smooth, strongly
# convex problem the running average of the iterates reaches the best possible asymptotic
# accuracy, even where the last iterate alone converges more slowly: the large steps make fast
# progress, and the averaging removes their noise. Stochastic weight averaging
# {cite}`izmailov2018averaging` brought the idea to deep networks, averaging the weights visited
# under a constant or cyclic learning rate, and found that the average lands in a wider, flatter
# region of the loss and generalizes better. The paper's checkpoint averaging is the same idea
# done after the fact, with files that training wrote anyway.
#
# The bowl is a picture, not a guarantee. A deep network's loss is not quadratic, and the average
# of two good points is good only if the loss stays low on the straight line between them; we
# measure that line below.
#
# ## Why only within one run
#
# Averaging weights is not averaging what models compute. Take a feed-forward layer with $d_{ff}$
# hidden units (chapter 4) and swap two of them: exchange two rows of $W_1$, the same two entries
# of $b_1$ and the same two columns of $W_2$. Every unit still computes what it did, in another
# slot, and the layer's output is unchanged; so it is for any of the $d_{ff}!$ orders, and for any
# order of the heads of an attention layer. The weights, though, are different vectors, and
# averaging unit 7 of one order with unit 7 of another blends two unrelated features into one that
# neither network computes.
#
# Two runs from different random initializations are in exactly this position: nothing makes them
# learn similar features in the same slots, and the average of their weights is in general much
# worse than either {cite}`entezari2022role` (matching the units before averaging is a research
# topic of its own {cite}`ainsworth2023git`). Within one run the problem does not arise: late
# checkpoints are a few hundred small steps apart, so every unit keeps its slot. What matters is a
# shared history: copies of one network that share the first part of their training usually end
# up where their average is as good as they are {cite}`frankle2020linear`, and models fine-tuned
# from one pretrained model can often be averaged too {cite}`wortsman2022model`.
#
# ## The function
#
# `average_checkpoints` takes a list of checkpoint files or state dicts and returns the state dict
# of their mean. It reads files with chapter 14's `load_checkpoint` (`weights_only=True`, so that a
# downloaded checkpoint cannot run code), one at a time, into a running sum kept in float64 and
# cast back to each tensor's own dtype at the end. Only floating-point tensors are averaged;
# integer ones, such as a step counter, must be equal everywhere, and checkpoints with different
# keys, shapes or dtypes are refused with a message that names what differs
# (`tests/test_checkpoint_averaging.py` checks each refusal). The optimizer's state is not
# averaged: the result is for translating, not for training on.

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
# Two tiny state dicts and their average, and a float16 one that stays float16:

# %%
import torch

a = {"w": torch.tensor([1.0, 2.0, 3.0]), "steps": torch.tensor(5)}
b = {"w": torch.tensor([3.0, 2.0, 0.0]), "steps": torch.tensor(5)}
print(average_checkpoints([a, b]))
print(average_checkpoints([{k: v.half() if v.is_floating_point() else v for k, v in a.items()}]))

# %% [markdown]
# ## Averaging on the sort task
#
# We train chapter 13's sort model again (same model, schedule and seed; the batches differ a
# little from chapter 13's) for 500 optimizer steps, keep a copy of the weights every 20 steps,
# and compare, on 1,000 held-out test sequences, the last checkpoint with averages of the last
# $k$. The learning rate at the end, printed below, is still high for Adam. Two measures: the
# loss per token with the right answer fed in (teacher forcing, as in training), and the
# exact-match accuracy of greedy decoding (chapter 13's `exact_matches`: a sequence counts only
# if every digit and the final `</s>` are right).

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

# %% nbval_reason="held-out losses of a training run: their digits differ with another CPU's float kernels" tags=["nbval-ignore-output"]
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
# The table is one run, a demonstration; the cell asserts only that the average of the last five
# beats the last checkpoint in held-out loss. `tools/seeds.py checkpoint_averaging` asks the same
# of ten runs: seeds 0 to 4, each under this CPU's own kernels and under the set one level below.

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
# In every run every average beats the last checkpoint alone in held-out loss, and the averages of
# five and ten sort almost every held-out sequence, while the last checkpoint alone varies widely
# from run to run. Twenty checkpoints are too many in every run: that window reaches back to step
# 120, when the model was still learning to sort, and those early weights pull the average back up
# the slope (its loss is above the ten's in all ten runs).
#
# A table compares one moment of training. The chart below follows the whole stored run: at every
# checkpoint from step 100 on, the held-out loss of that checkpoint alone and of the average of it
# and the four before it (the paper's recipe of five).

# %% nbval_reason="held-out losses of a training run: their digits differ with another CPU's float kernels" tags=["nbval-ignore-output"]
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
# Over the last ten checkpoints the single checkpoints' loss jumps up and down from one checkpoint
# to the next, while the average of five stays below it, and smoother. Another machine prints
# other values; the cell asserts that the average is lower at no fewer than 8 of those 10
# checkpoints. The jumps are the shaken marble of the first section, and the average is roughly
# what the run would look like without them. A learning rate that decayed to zero would calm the
# single checkpoints too, but it has to be planned before training, for a known end; averaging
# needs no plan, and works after the run with any window.

# %% [markdown]
# `tools/seeds.py running_average` asks the same question of ten runs (seeds 0 to 4, each under
# two kernel sets): at each of the last ten checkpoints, is the average of five lower in held-out
# loss than the checkpoint alone?

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
# In every run it was lower at each of the last ten checkpoints: a single late checkpoint of this
# schedule is a noisy sample, and averaging five of them removes much of the noise.

# %% [markdown]
# ## The straight line between two weights
#
# The average of two checkpoints is the midpoint of the straight line between them, so the loss
# along that line shows what averaging can gain or lose. We walk the line
# $\theta(\alpha) = (1 - \alpha)\,\theta_a + \alpha\,\theta_b$ from $\alpha = -0.5$ to $1.5$
# {cite}`goodfellow2015qualitatively`: $\alpha = 0$ is the first weights, $\alpha = 1$ the
# second. Two pairs:
#
# * two checkpoints of our run, at steps 400 and 500;
# * the final weights and a permuted twin: the same weights with the hidden units of every
#   feed-forward layer shuffled, as described above. The twin computes the same function, so it
#   is as good a model; it stands in for a second run that happened to learn the same features
#   in other slots, the most favourable case for averaging two runs.

# %% nbval_reason="held-out losses of a training run: their digits differ with another CPU's float kernels" tags=["nbval-ignore-output"]
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


# %% nbval_reason="held-out losses of a training run: their digits differ with another CPU's float kernels" tags=["nbval-ignore-output"]
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
# In the stored run the loss dips along the line between steps 400 and 500: the midpoint, the
# average of the two checkpoints, is lower than either end, and beyond either end the loss climbs.
# The two checkpoints sit on opposite walls of one valley, as in the picture of the bowl. (The cell
# asserts only that the midpoint is lower than the worse end, which holds on other machines too.)
#
# Between the final weights and their permuted twin the line does the opposite. Both ends have the
# same loss, because they are the same function; their average has a loss several times larger
# and sorts barely half the sequences. The cells assert this ridge (more than twice the ends'
# loss) on every machine. Averaging is done slot by slot, and in the two networks the slots hold
# different units. The damage is limited only because we shuffled the feed-forward layers alone,
# so that attention and embeddings still agree; two independent runs would disagree everywhere.
#
# ## Multi30k
#
# The shipped model of chapter 14 is the last checkpoint of a 12-epoch run. To have checkpoints to
# average, that run was continued for five more epochs, keeping each epoch's weights
# (`annotated-transformer train --keep-epochs`); each epoch and the averages of the last 2, 3 and 5 were then
# translated greedily and scored with sacreBLEU by the book's averaging script, with `<unk>`
# allowed (`annotated-transformer average --bleu` bans it, so its scores differ). That takes far longer than a chapter may, so the cells
# print what was measured, stored with the commands in `book/models/multi30k_cpu/averaging.json`
# (the averaged weights are not shipped; `--output` makes them in a few seconds).

# %%
import json

path = fetch_shipped_model() / "averaging.json"  # in Colab, downloaded and checked
measured = json.loads(path.read_text())
training = measured["training"]
print("training: ", current_command(training["command"]))
print("          ", training["started_from"])
print("hardware: ", training["hardware"])
for row in training["epochs"]:
    print(f"epoch {row['epoch']} | train loss {row['train_loss']:.4f} | "
          f"val loss {row['val_loss']:.4f} | {row['seconds'] / 60:.1f} min")

# %%
import re

results = pd.DataFrame([
    {"weights": entry["name"],
     "val BLEU": entry["scores"]["val"]["bleu"],
     "test BLEU": entry["scores"]["test_2016_flickr"]["bleu"]}
    for entry in measured["results"]
]).set_index("weights")
# the command as it runs now, which bans <unk> (these scores allowed it), with a results file
# of its own: the shipped averaging.json is checksummed
again = re.sub(r"--results \S+", "--results my_averaging.json",
               current_command(measured["results"][-1]["command"]))
print("to measure again (this command bans <unk>, so its scores differ):", again)
print("measured on:", measured["results"][-1]["hardware"], "|", measured["results"][-1]["date"])
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
# These scores come from greedy decoding that may write `<unk>`, before chapter 18 banned it (with
# the ban, chapter 14 prints higher scores for the shipped model); rows are compared only with
# rows measured the same way. This is one run, a demonstration, and three things show in it.
# Continuing the run helped a little on its own: three of the five new epochs score above the
# shipped model on the validation set, and all five on the test set, although the validation loss
# rose (with label smoothing the loss also punishes confidence, which can grow while the greedy
# choices get better). Single epochs jump around: from epoch 15 to 16 the validation BLEU moved by
# about a point, with nothing changed but one more epoch, the noise that any comparison in this
# table has to beat. And every average scores above every single epoch on both sets; against
# epoch 17, the model one would keep without averaging, the averages gain under half a point on
# the validation set and over a point on the test set. The two sets disagree on which window is
# best, but all the differences point the same way, as on the sort task.
#
# ### The same measurement with chapter 18's decoders
#
# The word-level run's checkpoints were not kept, so its rows cannot be scored with the decoders
# as chapter 18 leaves them (`<unk>` banned, and beam search beside greedy decoding). Chapter 18
# trains a subword model (chapter 17 builds its vocabulary) with untied embeddings that kept its
# last five epochs. Here are those epochs and the averages of the last 2, 3 and 5, scored both
# ways in half precision on both sets (`book/data/results_multi30k_more.json`, by
# `annotated-transformer evaluate`):

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
# word-level table. On the test set not every one does: the average of the last two is still the
# best row, but the averages of three and five fall below epoch 12. What holds in every column is
# that the averages lie closer together: the single epochs spread over two points or more, the
# averages over well under one. Averaging takes out much of a single epoch's noise; whether the
# result beats the run's last epoch is another question, which chapter 18 asks of its subword runs, and
# finds no reliable gain at this scale.
#
# ```{note}
# The classic Annotated Transformer sketched model averaging in four lines that were never called
# and could not have run: they asked each model for `m.params()`, which PyTorch modules do not
# have, and summed with `torch.sum(*ps[1:])`, which reduces a single tensor. Here the function is
# tested, reads files without running code from them, and checks that the checkpoints belong to
# one model.
# ```
#
# ## What we have
#
# A function, and a script around it, that turns the last checkpoints of a run into one model at
# no cost beyond keeping a few files; a reason it works (late iterates scatter around a minimum,
# and their mean sits nearer its bottom); a reason it must stay within one run (independently
# trained networks keep their units in unrelated slots); a finding on the sort task, over ten
# runs, and demonstrations on Multi30k. The models so far use a vocabulary of whole words, which
# turns every rare word into `<unk>`; the next chapter replaces it with subwords.
