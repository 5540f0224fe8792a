# %% [markdown]
# # Regularization: dropout and label smoothing
#
# Section 5.4 of {cite:t}`vaswani2017attention` regularizes training three ways: dropout on each
# sub-layer's output, dropout on the sums of embeddings and positional encodings ($P_{drop} = 0.1$ in
# the base model), and label smoothing of $\epsilon_{ls} = 0.1$, which it says hurts perplexity,
# the model being less sure, but improves accuracy and BLEU. The dropout is in the model already
# (chapters 2 to 4); this chapter shows what it does and builds the smoothed loss.

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
    SublayerConnection,
    check_log_probs,
    check_smoothing,
    enable_book_charts,
    line_chart,
)

enable_book_charts()

# %% [markdown]
# ## Dropout
#
# Dropout {cite}`srivastava2014dropout` zeroes each element with probability $P_{drop}$ during
# training and scales the survivors by $1/(1 - P_{drop})$, keeping the expected value; at
# evaluation it does nothing. The book's model drops where the paper does (`SublayerConnection`,
# chapter 2; the embeddings, chapter 4) and, like the classic version, also in the attention
# weights and the feed-forward hidden layer ({doc}`departures`). Residual dropout on a sub-layer
# that returns its input unchanged:

# %%
import torch

torch.manual_seed(0)
d_model = 512
connection = SublayerConnection(d_model, dropout=0.1)
x = torch.randn(4, 10, d_model)  # (batch, n, d_model)
normed = connection.norm(x)  # what the sub-layer sees, and here returns
connection.train()
residual = connection(x, torch.nn.Identity()) - x  # what the connection adds to x
dropped = residual.abs() < 1e-6
scale = (residual[~dropped] / normed[~dropped]).mean()
print(f"training: {dropped.float().mean():.1%} of the sub-layer's output zeroed; "
      f"survivors scaled by {scale:.4f} (1/0.9 = {1 / 0.9:.4f})")
connection.eval()
print("evaluation: the connection adds exactly the sub-layer's output:",
      torch.allclose(connection(x, torch.nn.Identity()) - x, normed, atol=1e-6))

# %% [markdown]
# Without dropout, the base model's development BLEU drops from 25.8 to 24.6 (the paper's
# Table 3).
#
# ## Label smoothing
#
# Training pushes the softmax towards the reference's *one-hot* distribution, which only infinite
# logits reach. Label smoothing {cite}`szegedy2016rethinking` trains towards a softer target: in its
# original form every one of $K$ classes gets $\epsilon / K$, and the reference $1 - \epsilon$ more.
# The paper gives $\epsilon_{ls}$ and cites that work, but no formula; we use the classic Annotated
# Transformer's variant: the reference gets $1 - \epsilon_{ls}$, and each of the $V - 2$ other tokens
# except padding (never a right answer) gets $\epsilon_{ls} / (V - 2)$. A position whose reference is
# padding gets an all-zero target and contributes nothing.
#
# The loss is the Kullback-Leibler divergence from the target $q$ to the prediction $p$, summed
# over positions and tokens:
#
# $$
# \mathrm{KL}(q \,\|\, p) = \sum_{i} q_i \left(\log q_i - \log p_i\right).
# $$
#
# It differs from the cross-entropy $-\sum_i q_i \log p_i$ by the entropy of $q$, a constant, so
# it has the same gradients, and it is zero for a perfect prediction. Terms whose target is zero
# are masked first, since $0 \cdot (-\infty)$ is `nan`; `LabelSmoothing` keeps its targets in
# `self.true_dist`.

# %% tags=["export"]
import torch
from torch import nn


class LabelSmoothing(nn.Module):
    """KL divergence to a smoothed one-hot target (label smoothing, paper section 5.4)."""

    def __init__(self, size: int, padding_idx: int, smoothing: float = 0.0) -> None:
        super().__init__()
        check_smoothing(size, padding_idx, smoothing)  # one-line errors (appendix)
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
        check_log_probs(x, target, self.size)  # one-line errors for wrong shapes (appendix)
        true_dist = self.smoothed_targets(target, dtype=x.dtype)  # (rows, size)
        self.true_dist = true_dist
        # Where the target is 0 the term is 0; mask x there so that log 0 = -inf gives no nan.
        x = x.masked_fill(true_dist == 0, 0.0)
        return self.criterion(x, true_dist)


# %% [markdown]
# ```{note}
# The classic version passed $x$ to `KLDivLoss` unmasked; in current PyTorch a zero probability
# where the target is also zero gives `nan`, and so do the classic demonstrations, which feed
# `log(0)`. Masking changes no finite loss or gradient.
# ```
#
# The targets of five positions, with 6 tokens and a large smoothing of 0.4: look for the empty row
# where the reference is padding, 0.6 on the reference in every other row, 0.1 on each remaining
# token, and nothing in the padding column. The prediction gives padding probability 0, and the loss
# stays finite.

# %% tags=["export", "hide-cell"]
from typing import Any


def smoothed_targets_chart(true_dist: torch.Tensor, target: torch.Tensor, *, title: str) -> Any:
    """Each position's target distribution (positions, vocabulary) as a grid with its numbers."""
    import altair as alt

    if true_dist.dim() != 2 or true_dist.size(0) != target.numel():
        raise ValueError(f"true_dist must be (positions={target.numel()}, vocabulary), "
                         f"got shape {tuple(true_dist.shape)}")
    cells = [{"position": f"{row} (target {target[row].item()})", "token": col,
              "probability": round(true_dist[row, col].item(), 4)}
             for row in range(true_dist.size(0)) for col in range(true_dist.size(1))]
    base = alt.Chart(alt.Data(values=cells)).encode(
        x=alt.X("token:O", title="token id"), y=alt.Y("position:O", title="target position"))
    heatmap = base.mark_rect().encode(
        color=alt.Color("probability:Q", scale=alt.Scale(scheme="blues", domain=[0, 1])),
        tooltip=["position:O", "token:O", "probability:Q"])
    labels = base.mark_text(fontSize=11).encode(text=alt.Text("probability:Q", format=".2f"))
    return (heatmap + labels).properties(width=300, height=200, title=title)


# %%
crit = LabelSmoothing(size=6, padding_idx=PAD_ID, smoothing=0.4)
target = torch.tensor([4, 1, PAD_ID, 3, 5])
predict = torch.tensor([[0.2, 0.1, 0.0, 0.5, 0.1, 0.1]]).repeat(5, 1)  # zero mass on padding
loss = crit(predict.log(), target)
row_sums = [round(v, 4) for v in crit.true_dist.sum(dim=1).tolist()]
print(f"loss {loss.item():.4f}; row sums of the target: {row_sums}")
smoothed_targets_chart(crit.true_dist, target, title=f"Smoothed targets (padding: {PAD_ID})")

# %% [markdown]
# ## What smoothing does to the loss
#
# The chart varies the predicted probability $p$ of the correct token for one position in a
# vocabulary of 10, spreading $1 - p$ evenly over the 8 other non-padding tokens.

# %%
vocab, correct = 10, 3
curves = []
for smoothing in (0.0, 0.1, 0.3):
    crit = LabelSmoothing(size=vocab, padding_idx=PAD_ID, smoothing=smoothing)
    for i in range(1, 200):
        p = i / 200
        predict = torch.full((1, vocab), (1 - p) / (vocab - 2))
        predict[0, PAD_ID] = 0.0
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
# Without smoothing the loss falls all the way to $p = 1$. With smoothing it bottoms out where
# the prediction equals the target, at $p = 1 - \epsilon_{ls}$, and climbs beyond: the model is
# penalised for being surer than the target. That is the trade §5.4 names; in the paper's Table 3,
# training without smoothing improves the base model's development perplexity from 4.92 to 4.67
# but lowers its BLEU from 25.8 to 25.3.
#
# ## The same loss in PyTorch's terms
#
# `F.cross_entropy(logits, target, label_smoothing=eps)` trains towards
# $(1 - \epsilon) \cdot \text{one-hot} + \epsilon / C$ over all $C$ classes, padding included.
# Without the padding column ($C = V - 1$) and with $\epsilon = \epsilon_{ls} (V-1)/(V-2)$ its
# target is ours, so the two losses differ by the target's entropy, computed here by hand:

# %%
import math

import torch.nn.functional as F

torch.manual_seed(0)
vocab, smoothing = 8, 0.1
logits = torch.randn(6, vocab)
logits[:, PAD_ID] = float("-inf")  # the model never predicts padding
log_probs = logits.log_softmax(dim=-1)  # (rows, vocab)
target = torch.tensor([3, 1, PAD_ID, 7, 0, PAD_ID])  # two padding positions
ours = LabelSmoothing(size=vocab, padding_idx=PAD_ID, smoothing=smoothing)(log_probs, target)

keep = [i for i in range(vocab) if i != PAD_ID]  # the padding column taken out
reduced = torch.where(target == PAD_ID, -100, target - (target > PAD_ID).long())  # -100: ignored
theirs = F.cross_entropy(log_probs[:, keep], reduced, reduction="sum",
                         label_smoothing=smoothing * (vocab - 1) / (vocab - 2))
entropy = -(1 - smoothing) * math.log(1 - smoothing)
entropy -= smoothing * math.log(smoothing / (vocab - 2))
rows = (target != PAD_ID).sum().item()
print(f"LabelSmoothing {ours.item():.5f}; cross_entropy {theirs.item():.5f} "
      f"- {rows} x entropy {entropy:.5f} = {theirs.item() - rows * entropy:.5f}")
assert torch.isclose(ours, theirs - rows * entropy, atol=1e-5)

# %% [markdown]
# The toy tasks of the next two chapters train without dropout or smoothing; chapter 14 uses both.
#
# ## Exercises
#
# 1. **What dropout does not keep.** Dropout keeps each element's expected value. By what factor
#    does it change the *mean square* of what `connection` adds to the residual stream, training
#    against evaluation, at $P_{drop} = 0.1$? Write it in `answer_1`; the check measures it. What
#    does that mean for the layers after it?
# 2. **A smoothed target by hand.** For 6 tokens, `padding_idx=PAD_ID` and smoothing 0.2, write
#    the target distributions that `LabelSmoothing` makes for the targets `[4, PAD_ID]`, as a
#    nested list in `answer_2`; the check compares them with `smoothed_targets`.
# 3. **Worse perplexity, better BLEU.** Why can a model trained with label smoothing be less
#    certain of the right word (higher perplexity) and still translate better?
#
# ```{dropdown} Answer to 3
# Perplexity rewards putting almost all probability on the reference word; BLEU needs only the
# right word on top. Smoothing keeps the scores of *other* candidates informative, and beam search
# compares whole sentences by those scores.
# ```

# %% tags=["hide-cell"]
# Exercises 1 and 2: our answers (hidden in the book). Replace them with yours.
answer_1 = 1 / 0.9  # a kept value's square grows by 1/(1-p)^2 and is kept with probability 1-p:
# the layers after it see larger values in training than in evaluation
answer_2 = [
    [0.05, 0.05, 0.0, 0.05, 0.8, 0.05],  # 0.2 spread over the 4 tokens that are neither
    [0.0, 0.0, 0.0, 0.0, 0.0, 0.0],  # a padding target gets no distribution at all
]

# %%
# Check exercises 1 and 2
connection.train()
torch.manual_seed(1)
with torch.no_grad():
    added = connection(x, torch.nn.Identity()) - x  # (batch, n, d_model)
ratio = float(added.pow(2).mean() / normed.detach().pow(2).mean())  # training over evaluation
assert abs(ratio - answer_1) < 0.02, ratio
print("exercise 1: correct")
targets = LabelSmoothing(6, padding_idx=PAD_ID, smoothing=0.2).smoothed_targets
torch.testing.assert_close(targets(torch.tensor([4, PAD_ID])), torch.tensor(answer_2))
print("exercise 2: correct")
