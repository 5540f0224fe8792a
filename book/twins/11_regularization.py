# %% [markdown]
# # Regularization: dropout and label smoothing
#
# A model as large as the Transformer can memorise its training data instead of learning to
# translate. Section 5.4 of {cite:t}`vaswani2017attention` names the two defences it used:
# dropout, which chapters 2 to 4 have already built into the model, and label smoothing, which
# this chapter builds as the loss function that training will minimise.

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

from the_annotated_transformer import SublayerConnection, enable_book_charts, line_chart

enable_book_charts()

# %% [markdown]
# ## Dropout
#
# Dropout {cite}`srivastava2014dropout` sets each element of a tensor to zero with probability
# $P_{drop}$ during training and scales the survivors by $1/(1 - P_{drop})$, so that the
# expected value is unchanged; at evaluation time it does nothing. A network trained this way
# cannot rely on any single unit being present, which keeps it from fitting its training data
# too closely.
#
# The paper applies dropout in two places, with $P_{drop} = 0.1$ for the base model:
#
# * **Residual dropout**: on the output of every sub-layer, before it is added to the
#   sub-layer's input. That is the `self.dropout` in `SublayerConnection` (chapter 2), which
#   computes $x + \mathrm{Dropout}(\mathrm{Sublayer}(\mathrm{LayerNorm}(x)))$; every attention
#   and feed-forward sub-layer of the encoder and the decoder goes through one.
# * **Embedding dropout**: on the sums of the token embeddings and the positional encodings, at
#   the bottom of both the encoder and the decoder. That is the dropout at the end of
#   `PositionalEncoding` (chapter 4).
#
# The implementation also follows the classic version in two places the paper's text does not
# mention: on the attention weights (chapter 3) and between the two layers of the feed-forward
# network (chapter 4). All of them share the one `dropout` argument of the model.
#
# Here is residual dropout at work on a sub-layer that returns its input unchanged: in training
# mode about a tenth of the sub-layer's output is zeroed and the rest is scaled by $1/0.9$; in
# evaluation mode the connection is deterministic.

# %%
import torch

torch.manual_seed(0)
d_model = 512
connection = SublayerConnection(d_model, dropout=0.1)
x = torch.randn(4, 10, d_model)  # (batch, n, d_model)
identity = torch.nn.Identity()
normed = connection.norm(x)  # what the sub-layer sees, and here returns


def added(module: SublayerConnection) -> torch.Tensor:
    """What the connection adds to the residual stream x."""
    return module(x, identity) - x


connection.train()
residual = added(connection)
dropped = residual.abs() < 1e-6
scale = (residual[~dropped] / normed[~dropped]).mean()
print(f"training: {dropped.float().mean():.1%} of the sub-layer's output zeroed; "
      f"survivors scaled by {scale:.4f} (1/0.9 = {1 / 0.9:.4f})")
connection.eval()
print("evaluation: the connection adds exactly the sub-layer's output:",
      torch.allclose(added(connection), normed, atol=1e-6))

# %% [markdown]
# The big model used $P_{drop} = 0.3$ for English-German, and Table 3 of the paper shows why
# dropout matters: without it, the base model's development BLEU drops from 25.8 to 24.6.
#
# ## Label smoothing
#
# The decoder ends in a softmax over the vocabulary, and training usually pushes it towards
# the *one-hot* distribution of the reference: probability 1 on the correct next token, 0
# everywhere else. Reaching that target would need infinitely large logits, so a model trained
# on it never stops growing them and becomes over-confident.
#
# Label smoothing {cite}`szegedy2016rethinking` trains towards a softer target instead. In its
# original form it mixes the one-hot target with the uniform distribution over all $K$
# classes: with smoothing $\epsilon$ every class gets $\epsilon / K$, the correct one included,
# which ends with $1 - \epsilon + \epsilon / K$. The paper sets $\epsilon_{ls} = 0.1$ and
# gives no formula. We use the classic Annotated Transformer's variant: the correct token gets
# probability $1 - \epsilon_{ls}$ and the remaining $\epsilon_{ls}$ is spread evenly over the
# other tokens. In our vocabularies one token is padding, which is never a right answer, so it
# gets nothing: each of the other $V - 2$ wrong tokens gets $\epsilon_{ls} / (V - 2)$.
# Positions whose reference token is itself padding (the filler at the end of short sentences)
# get an all-zero target and contribute nothing to the loss.
#
# The loss is the Kullback-Leibler divergence from that target $q$ to the model's prediction
# $p$, summed over positions and tokens:
#
# $$
# \mathrm{KL}(q \,\|\, p) = \sum_{i} q_i \left(\log q_i - \log p_i\right).
# $$
#
# It differs from the cross-entropy $-\sum_i q_i \log p_i$ only by the entropy of $q$, a
# constant, so it has the same gradients; its advantage is that it is zero when the prediction
# matches the target exactly.
#
# `LabelSmoothing` takes the model's log-probabilities, one row per target position, builds the
# smoothed targets and keeps them in `self.true_dist` for inspection. Terms whose target is
# zero are dropped before the divergence is taken: their contribution is zero whatever the
# prediction, but a prediction of probability 0 there gives $\log p = -\infty$, and
# $0 \cdot (-\infty)$ is `nan` in floating point.

# %% tags=["export"]
import torch
from torch import nn


class LabelSmoothing(nn.Module):
    """KL divergence to a smoothed one-hot target (label smoothing, paper section 5.4)."""

    def __init__(self, size: int, padding_idx: int, smoothing: float = 0.0) -> None:
        super().__init__()
        if size < 3:
            raise ValueError(f"size={size} must be >= 3: the true token, padding and another")
        if not 0 <= padding_idx < size:
            raise ValueError(f"padding_idx={padding_idx} must be in [0, size={size})")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"smoothing={smoothing} must be in [0, 1)")
        self.criterion = nn.KLDivLoss(reduction="sum")
        self.size = size
        self.padding_idx = padding_idx
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing
        self.true_dist: torch.Tensor | None = None

    def smoothed_targets(
        self, target: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Target distributions (rows, size) for token ids (rows,); padding gets no mass."""
        fill = self.smoothing / (self.size - 2)
        true_dist = torch.full((target.size(0), self.size), fill, dtype=dtype, device=target.device)
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        true_dist[:, self.padding_idx] = 0.0
        true_dist.masked_fill_((target == self.padding_idx).unsqueeze(1), 0.0)
        return true_dist

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Summed KL(true_dist || exp(x)) for log-probabilities x (rows, size), targets (rows,)."""
        if x.dim() != 2 or x.size(1) != self.size:
            raise ValueError(f"x must be log-probabilities of shape (rows, {self.size}), "
                             f"got {tuple(x.shape)}")
        if target.shape != x.shape[:1]:
            raise ValueError(f"target must have shape ({x.size(0)},), got {tuple(target.shape)}")
        true_dist = self.smoothed_targets(target, dtype=x.dtype)  # (rows, size)
        self.true_dist = true_dist
        # Where the target is 0 the term is 0; mask x there so that log 0 = -inf gives no nan.
        x = x.masked_fill(true_dist == 0, 0.0)
        return self.criterion(x, true_dist)


# %% [markdown]
# ```{note}
# The classic version passed $x$ to `KLDivLoss` unmasked. Current PyTorch computes each term as
# $q \log q - q x$, so a probability of 0 where the target is also 0 (the padding column, say)
# gives $0 \cdot \infty$ = `nan`, and the classic demonstrations, which feed `log(0)`, come out
# `nan`. Masking the zero-target terms fixes this without changing any finite loss or gradient.
# ```
#
# With a vocabulary of 6 tokens, padding at index 0 and a large smoothing of 0.4 so that the
# picture is clear, here are the targets for five positions. The third position's reference is
# padding, so its row is empty; every other row puts 0.6 on the reference token, 0.1 on each of
# the other four tokens, and nothing on padding.

# %% tags=["export", "hide-cell"]
from typing import Any


def smoothed_targets_chart(true_dist: torch.Tensor, target: torch.Tensor, *, title: str) -> Any:
    """Each position's target distribution (positions, vocabulary) as a grid with its numbers."""
    import altair as alt

    if true_dist.dim() != 2 or true_dist.size(0) != target.numel():
        raise ValueError(f"true_dist must be (positions={target.numel()}, vocabulary), "
                         f"got shape {tuple(true_dist.shape)}")
    cells = [
        {"position": f"{row} (target {target[row].item()})", "token": col,
         "probability": round(true_dist[row, col].item(), 4)}
        for row in range(true_dist.size(0))
        for col in range(true_dist.size(1))
    ]
    base = alt.Chart(alt.Data(values=cells)).encode(
        x=alt.X("token:O", title="token id (0 = padding)"),
        y=alt.Y("position:O", title="target position"),
    )
    heatmap = base.mark_rect().encode(
        color=alt.Color("probability:Q", scale=alt.Scale(scheme="blues", domain=[0, 1])),
        tooltip=["position:O", "token:O", "probability:Q"],
    )
    labels = base.mark_text(fontSize=11).encode(text=alt.Text("probability:Q", format=".2f"))
    return (heatmap + labels).properties(width=300, height=200, title=title)


# %%
crit = LabelSmoothing(size=6, padding_idx=0, smoothing=0.4)
target = torch.tensor([2, 1, 0, 3, 5])
predict = torch.tensor([[0.0, 0.2, 0.5, 0.1, 0.1, 0.1]]).repeat(5, 1)  # zero mass on padding
loss = crit(predict.log(), target)
row_sums = [round(v, 4) for v in crit.true_dist.sum(dim=1).tolist()]
print(f"loss {loss.item():.4f}; row sums of the target: {row_sums}")
smoothed_targets_chart(crit.true_dist, target, title="Smoothed targets, smoothing 0.4")

# %% [markdown]
# The loss above is finite even though the prediction puts probability exactly 0 on padding.
# Where the target does put mass on a token that the prediction rules out, the divergence is
# genuinely infinite, and the loss says so with `inf` rather than `nan`; a model's
# `log_softmax` never produces $\log 0$, so training does not meet that case.
#
# ## What smoothing does to the loss
#
# Without smoothing, the loss keeps falling as the predicted probability $p$ of the correct
# token approaches 1. With smoothing, it is smallest at $p = 1 - \epsilon_{ls}$ and rises again
# beyond: the model is penalised for being more sure than the target. The chart varies $p$ for
# one position in a vocabulary of 10 tokens, spreading $1 - p$ evenly over the 8 other
# non-padding tokens.

# %%
vocab, padding_idx, correct = 10, 0, 3
curves = []
for smoothing in (0.0, 0.1, 0.3):
    crit = LabelSmoothing(size=vocab, padding_idx=padding_idx, smoothing=smoothing)
    for i in range(1, 200):
        p = i / 200
        predict = torch.full((1, vocab), (1 - p) / (vocab - 2))
        predict[0, padding_idx] = 0.0
        predict[0, correct] = p
        value = crit(predict.log(), torch.tensor([correct])).item()
        curves.append({"p": p, "loss": value, "smoothing": f"{smoothing:g}"})

best = {s: min((c for c in curves if c["smoothing"] == s), key=lambda c: c["loss"])
        for s in ("0", "0.1", "0.3")}
print("smallest loss at p =", {s: c["p"] for s, c in best.items()})
line_chart(curves, x="p:Q", y="loss:Q", color="smoothing:N", color_title="smoothing",
           points=False, formats={"p": ".3f", "loss": ".4f"},
           x_title="predicted probability of the correct token", y_title="loss (KL divergence)",
           title="Label smoothing penalises over-confidence")

# %% [markdown]
# With smoothing 0 the curve falls all the way to 0 at $p = 1$. With smoothing 0.1 it bottoms
# out at $p = 0.9$, where the prediction equals the target and the divergence is 0, and climbs
# as $p$ goes on towards 1, without bound: the other tokens' probabilities go to zero while the
# target still gives each of them $\epsilon_{ls}/(V-2)$.
#
# The paper notes the trade: label smoothing hurts perplexity, since the model learns to be
# less sure, but improves accuracy and BLEU. In its Table 3, training without it
# ($\epsilon_{ls} = 0$) improves the base model's development perplexity from 4.92 to 4.67 but
# lowers its BLEU from 25.8 to 25.3.
#
# ## The same loss in PyTorch's terms
#
# PyTorch's cross-entropy has label smoothing built in:
# `F.cross_entropy(logits, target, label_smoothing=eps)` trains towards
# $(1 - \epsilon) \cdot \text{one-hot} + \epsilon / C$ over all $C$ classes, the correct one
# included, and has no notion of a padding *column*. The two agree exactly when we take the
# padding column out ($C = V - 1$) and choose $\epsilon = \epsilon_{ls} (V-1)/(V-2)$: then the
# correct token gets $1 - \epsilon_{ls}$ and each other token $\epsilon_{ls}/(V-2)$. Since
# cross-entropy is KL divergence plus the target's entropy, the two losses differ by that
# entropy, a number we can compute by hand:

# %%
import math

import torch.nn.functional as F

torch.manual_seed(0)
vocab, padding_idx, smoothing = 8, 0, 0.1
logits = torch.randn(6, vocab)
logits[:, padding_idx] = float("-inf")  # the model never predicts padding
log_probs = logits.log_softmax(dim=-1)  # (rows, vocab)
target = torch.tensor([3, 1, 0, 7, 2, 0])  # two padding positions
crit = LabelSmoothing(size=vocab, padding_idx=padding_idx, smoothing=smoothing)
ours = crit(log_probs, target)

keep = [i for i in range(vocab) if i != padding_idx]
theirs = F.cross_entropy(
    log_probs[:, keep], target - 1, ignore_index=padding_idx - 1, reduction="sum",
    label_smoothing=smoothing * (vocab - 1) / (vocab - 2),
)
entropy = -(1 - smoothing) * math.log(1 - smoothing) - smoothing * math.log(smoothing / (vocab - 2))
rows = (target != padding_idx).sum().item()
print(f"LabelSmoothing {ours.item():.5f}; cross_entropy {theirs.item():.5f} "
      f"- {rows} x entropy {entropy:.5f} = {theirs.item() - rows * entropy:.5f}")
assert torch.isclose(ours, theirs - rows * entropy, atol=1e-5)

# %% [markdown]
# Why not simply use `F.cross_entropy`? We could, and for training it would do the same job.
# `LabelSmoothing` keeps the target distribution visible (`true_dist`), reads as the paper
# describes the method, and reports 0 when the prediction is perfect, which makes its value
# easier to read than a cross-entropy that never falls below the target's entropy.
#
# The loss sums over positions; the training loop of chapter 8 divides it by the number of
# target tokens, so that the size of a step does not depend on how many tokens a batch holds.
#
# You now have the paper's regularisers: dropout in the model, and label smoothing in the loss.
# Everything the training recipe of section 5 needs is in place; the next chapter puts it to
# work on a first task small enough for a CPU, copying a sequence.

# %% [markdown]
# ## Exercises
#
# 1. **What dropout leaves.** In training mode, what values does `nn.Dropout(p=0.25)` turn a
#    tensor of ones into, and what is their mean, in expectation? Write the set of values in
#    `answer_1` and the expected mean in `mean_1`.
# 2. **A smoothed target by hand.** For a vocabulary of 6 tokens, `padding_idx=0` and
#    smoothing 0.2, write the two rows of target distributions that `LabelSmoothing` makes for
#    the targets `[2, 0]`, as a nested list in `answer_2`. The check compares them with
#    `smoothed_targets`.
# 3. **Worse perplexity, better BLEU.** Why can a model trained with label smoothing be less
#    certain of the right word (higher perplexity) and still translate better?
#
# ```{dropdown} Answer to 3
# Perplexity rewards putting almost all probability on the reference word; BLEU only needs the
# right word to come out on top when decoding. Smoothing keeps the model from pushing
# probabilities to the extremes, which keeps its scores of *other* candidates informative: beam
# search compares whole sentences by those scores, and an over-confident model ranks the
# alternatives poorly.
# ```

# %% tags=["hide-cell"]
# Exercises 1 and 2: our answers (hidden in the book). Replace them with yours.
answer_1 = {0.0, 4 / 3}  # dropped, or kept and scaled by 1 / (1 - p)
mean_1 = 1.0  # the scaling keeps the expected value unchanged
answer_2 = [
    [0.0, 0.05, 0.8, 0.05, 0.05, 0.05],  # 0.2 spread over the 4 tokens that are neither
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # a padding target gets no distribution at all
]

# %%
# Check exercises 1 and 2
torch.manual_seed(0)
dropped = nn.Dropout(p=0.25).train()(torch.ones(100_000))
assert {round(x, 6) for x in dropped.unique().tolist()} == {round(x, 6) for x in answer_1}
assert abs(dropped.mean().item() - mean_1) < 0.01
print("exercise 1: correct")
targets = LabelSmoothing(6, padding_idx=0, smoothing=0.2).smoothed_targets(torch.tensor([2, 0]))
torch.testing.assert_close(targets, torch.tensor(answer_2))
print("exercise 2: correct")
