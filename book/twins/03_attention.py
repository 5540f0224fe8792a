# %% [markdown]
# # Attention
#
# Attention is the one operation the Transformer is built from (paper §3.2). A position that
# needs information asks a question, its **query**; every position it may look at offers a
# **key**, saying what it contains, and a **value**, the content it hands over. The query is
# compared with every key, the comparisons become weights that sum to one, and the answer is
# the weighted average of the values. Nothing about this depends on how far apart the two
# positions are: the first word of a sentence reaches the last one in a single step.
#
# This chapter builds scaled dot-product attention, shows why it is *scaled*, extends it to
# several heads, and lists the three places the model uses it.

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

from the_annotated_transformer import clones, enable_book_charts, subsequent_mask

enable_book_charts()

# %% [markdown]
# ## Scaled dot-product attention
#
# Stack the queries into a matrix $Q$ (one row per query position), the keys into $K$ and the
# values into $V$. Queries and keys have width $d_k$, so each comparison can be a dot product,
# and all of them at once are one matrix product, $QK^\top$. A softmax over each row turns the
# scores into weights, and a second matrix product mixes the values:
#
# $$
# \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V .
# $$
#
# ```{figure} figures/scaled_dot_product_attention.svg
# :name: fig-scaled-dot-product-attention
# :width: 340px
#
# Scaled dot-product attention: compare queries with keys, scale by $1/\sqrt{d_k}$, mask what
# may not be seen, normalize each row with a softmax, and average the values with those weights.
# ```
#
# Two matrix products make attention fast on hardware built for them. Dot products are not the
# only way to score a query against a key: additive attention {cite}`bahdanau2015neural` feeds
# both through a small network with one hidden layer, which cannot be written as one matrix
# product. The paper (§3.2.1) reports that the two do about as well for small $d_k$, but that
# for larger $d_k$ additive attention beats dot products *without* scaling
# {cite}`britz2017massive`. The paper suspects why: large dot products push the softmax into
# regions where its gradients are tiny. The factor $1/\sqrt{d_k}$ is the cure, and the
# experiment below shows the problem it cures.
#
# A mask removes the pairs that may not attend (padding, or the future in the decoder): their
# scores are set to the most negative number the dtype can hold, so the softmax gives them a
# weight of zero.

# %% tags=["export"]
import math

import torch
from torch import nn


def _check_mask(mask: torch.Tensor, scores: torch.Tensor) -> None:
    """Raise ValueError unless `mask` broadcasts to the scores without enlarging them."""
    try:
        fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} does not broadcast to the attention scores "
            f"of shape {tuple(scores.shape)} (batch, h, n_q, n_k)"
        )


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention: (output (..., n_q, d_v), weights (..., n_q, n_k))."""
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (batch, h, n_q, n_k)
    if mask is not None:
        _check_mask(mask, scores)
        # True (or 1) = may attend; the rest get the lowest finite score, so softmax gives ~0.
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (batch, h, n_q, n_k), each row sums to 1
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # (batch, h, n_q, d_v)


# %% [markdown]
# `_check_mask` turns the `RuntimeError` that `torch.broadcast_shapes` raises for shapes that
# do not broadcast into a `ValueError` that shows both shapes. It also refuses a mask that
# broadcasts but would *enlarge* the scores (a mask of shape (2, 1, 4, 4) against scores of
# shape (1, 1, 4, 4)): silently turning one sentence's attention into two is always a bug.
#
# ```{note}
# The classic version filled masked scores with $-10^9$. That number does not exist in float16,
# whose most negative value is $-65504$, so under mixed-precision training PyTorch refuses the
# fill ("value cannot be converted to type c10::Half without overflow").
# `torch.finfo(scores.dtype).min` is the most negative finite number of whatever dtype the
# scores have. Either fill keeps a fully masked row finite: all its scores are the same number,
# so the softmax gives it uniform weights; only a fill of $-\infty$ would give NaN there.
# ```
#
# Our implementation should agree with PyTorch's fused
# `torch.nn.functional.scaled_dot_product_attention`, which computes the same formula:

# %%
import torch.nn.functional as F

torch.manual_seed(0)
q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
causal = subsequent_mask(6)  # (1, 6, 6) broadcasts over batch and heads
out, weights = attention(q, k, v, mask=causal)
reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
print("matches F.scaled_dot_product_attention:", torch.allclose(out, reference, atol=1e-6))
print("weights of query 2:", [round(w, 3) for w in weights[0, 0, 2].tolist()])

# %% [markdown]
# Query 2 may look at keys 0, 1 and 2 only; its weights on the other three are exactly zero.

# %% [markdown]
# ### A worked example: three tokens, $d_k = 2$
#
# The formula is easier to trust once every number in it has been seen. Take three tokens whose
# queries, keys and values have only two components, chosen by hand so that the arithmetic is
# short. Each row of $Q$, $K$ and $V$ belongs to one token; we use float64 so that the printed
# digits are the same on every machine.

# %%
Q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # (3, d_k = 2)
K = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)  # (3, d_k)
V = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # (3, d_v = 2)


def show(name: str, matrix: torch.Tensor) -> None:
    """Print a small matrix, one row per line, with four decimals."""
    print(name)
    for row in matrix.tolist():
        print("   ", "  ".join(f"{x:7.4f}" for x in row))


dots = Q @ K.T  # (3, 3): row i compares query i with every key
show("1) Q K^T", dots)
scores = dots / math.sqrt(2)
show("2) divided by sqrt(d_k) = 1.4142", scores)
exps = scores.exp()
show("3) exp of each score", exps)
print("   row sums:", "  ".join(f"{x:.4f}" for x in exps.sum(dim=-1).tolist()))
weights_by_hand = exps / exps.sum(dim=-1, keepdim=True)
show("4) softmax = exp / row sum: the attention weights", weights_by_hand)
out_by_hand = weights_by_hand @ V
show("5) weights @ V: the output, one row per token", out_by_hand)

# %% [markdown]
# Query 0, $(1, 0)$, agrees most with key 0, $(2, 0)$, so token 0 takes the largest share of
# its output, 0.5760, from value 0; it gets 0.2840 from token 2 and 0.1400 from token 1, whose
# key $(0, 2)$ is orthogonal to it. Query 2, $(1, 1)$, scores every key the same, 2, and so
# averages the three values equally: $(2/3, 2/3)$. The numbers are those that `attention`
# computes, and the first weight is the one a pencil gives,
# $e^{\sqrt 2} / (e^{\sqrt 2} + e^{0} + e^{1/\sqrt 2})$:

# %%
out, weights = attention(Q, K, V)
assert torch.equal(dots, torch.tensor([[2.0, 0.0, 1.0], [0.0, 2.0, 1.0], [2.0, 2.0, 2.0]],
                                      dtype=torch.float64))
assert torch.allclose(weights, weights_by_hand) and torch.allclose(out, out_by_hand)
pencil = math.exp(math.sqrt(2)) / (math.exp(math.sqrt(2)) + 1 + math.exp(1 / math.sqrt(2)))
assert math.isclose(weights[0, 0].item(), pencil)
assert torch.allclose(out[2], torch.tensor([2 / 3, 2 / 3], dtype=torch.float64))
print(f"attention() agrees with every step; weight of key 0 for query 0: {pencil:.4f}")

# %% [markdown]
# With the causal mask of chapter 2, token 0 may see only itself: its single weight is 1, and
# its output is exactly its own value, $(1, 0)$.

# %%
out, weights = attention(Q, K, V, mask=subsequent_mask(3)[0])
show("weights with the causal mask", weights)
assert torch.equal(out[0], V[0])

# %% [markdown]
# ## Why divide by $\sqrt{d_k}$
#
# Suppose the components of a query $q$ and a key $k$ are independent, with mean 0 and
# variance 1. Their dot product $q \cdot k = \sum_{i=1}^{d_k} q_i k_i$ is a sum of $d_k$ terms
# of variance 1, so it has variance $d_k$ and standard deviation $\sqrt{d_k}$. With
# $d_k = 64$, as in the base model, typical scores are eight times larger than with $d_k = 1$.
# A softmax of large numbers is nearly one-hot: almost all weight goes to the largest score,
# and the gradient with respect to every other score nearly vanishes, so the model learns
# slowly. Dividing by $\sqrt{d_k}$ brings the scores back to unit variance whatever the width.
#
# We measure it: for each $d_k$, draw 2,000 random queries and 10 keys per query, and record
# the spread of the scores, the largest softmax weight and the entropy of the weights (at most
# $\ln 10 \approx 2.30$ nats, for uniform weights over 10 keys), with and without the scaling.

# %%
import pandas as pd

torch.manual_seed(0)
n_queries, n_keys = 2000, 10
rows = []
for d_k in [1, 4, 16, 64, 256, 1024]:
    q = torch.randn(n_queries, 1, d_k)
    k = torch.randn(n_queries, n_keys, d_k)
    dots = (q @ k.transpose(-2, -1)).squeeze(1)  # (n_queries, n_keys)
    for scaled in (False, True):
        scores = dots / math.sqrt(d_k) if scaled else dots
        p = scores.softmax(dim=-1)
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
        rows.append(
            {
                "d_k": d_k,
                "scores": "q·k / √d_k" if scaled else "q·k",
                "std of scores": round(scores.std().item(), 3),
                "mean max weight": round(p.max(-1).values.mean().item(), 3),
                "mean entropy (nats)": round(entropy.mean().item(), 3),
            }
        )
scaling = pd.DataFrame(rows)
print(scaling.to_string(index=False))

# %% tags=["export", "hide-input"]
from typing import Any


def scaling_chart(scaling: Any, *, n_keys: int) -> Any:
    """Spread of the scores, largest weight and entropy against d_k, with and without scaling.

    `scaling` is a pandas DataFrame with the columns that the cell above computes.
    """
    import altair as alt

    common = alt.Chart(scaling).encode(
        x=alt.X(
            "d_k:Q", scale=alt.Scale(type="log", base=2), axis=alt.Axis(values=[1, 8, 64, 512])
        ),
        color=alt.Color("scores:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=["d_k", "scores", "std of scores", "mean max weight", "mean entropy (nats)"],
    )
    lines = common.mark_line(point=True).properties(width=150, height=160)
    spread = lines.encode(y=alt.Y("std of scores:Q", scale=alt.Scale(type="log")))
    peak = lines.encode(y=alt.Y("mean max weight:Q", scale=alt.Scale(domain=[0, 1])))
    entropy = lines.encode(
        y=alt.Y("mean entropy (nats):Q", scale=alt.Scale(domain=[0, math.log(n_keys)]))
    )
    return (
        spread.properties(title="spread of the scores")
        | peak.properties(title="largest softmax weight")
        | entropy.properties(title="entropy of the weights")
    )


# %%
scaling_chart(scaling, n_keys=n_keys)

# %% [markdown]
# Unscaled, the spread of the scores doubles each time $d_k$ quadruples, from 1.0 at
# $d_k = 1$ to 8.0 at $d_k = 64$ and 32 at $d_k = 1024$: it grows like $\sqrt{d_k}$. The
# softmax saturates with it. At $d_k = 64$ the largest of the ten weights averages 0.87 and the
# entropy has fallen from 2.0 to 0.34 nats; at $d_k = 1024$ the weights are all but one-hot.
# That would happen with random, untrained weights, before the model has any reason to prefer
# one key. A saturated softmax also learns slowly: its Jacobian,
# $\partial p_i / \partial s_j = p_i(\delta_{ij} - p_j)$, vanishes when one $p_i$ is close to 1
# and the others close to 0, so the scores get almost no gradient. Scaled, the spread stays at 1
# and the weights keep the same soft distribution (largest weight about 0.32, entropy about 1.9
# nats) at every width.

# %% [markdown]
# ## Multi-head attention
#
# One attention computes one weighted average per query, one way of relating positions. The
# paper runs $h$ of them in parallel, each on its own learned projection of the queries, keys
# and values into a smaller space of width $d_k = d_v = d_\text{model}/h$, and concatenates the
# results:
#
# $$
# \mathrm{MultiHead}(Q, K, V) = \mathrm{Concat}(\mathrm{head}_1, \dots, \mathrm{head}_h)\,W^O,
# \qquad \mathrm{head}_i = \mathrm{Attention}(QW_i^Q, KW_i^K, VW_i^V).
# $$
#
# ```{figure} figures/multi_head_attention.svg
# :name: fig-multi-head-attention
# :width: 470px
#
# Multi-head attention: $h$ heads, each with its own linear projections of $Q$, $K$ and $V$,
# run scaled dot-product attention side by side; their outputs are concatenated and projected
# back to $d_\text{model}$.
# ```
#
# One head has to average everything it finds into one vector; several heads can look at
# different things at once (one at the previous word, one at the verb's subject, ...). Because
# each head is $h$ times narrower, the whole costs about as much as one full-width head. The
# base model uses $h = 8$ heads of width $d_k = 512 / 8 = 64$.
#
# In code, the $h$ projections $W_i^Q$ are one $d_\text{model} \times d_\text{model}$ linear
# layer whose output we cut into $h$ pieces; the same for keys and values. The heads become a
# tensor dimension, so one call of `attention` computes all of them.

# %% tags=["export"]
class MultiHeadedAttention(nn.Module):
    """h attention heads in parallel on learned projections; keeps the last weights in .attn."""

    def __init__(self, h: int, d_model: int, dropout: float = 0.1) -> None:
        super().__init__()
        if d_model % h != 0:
            raise ValueError(f"d_model={d_model} is not divisible by h={h} heads")
        self.d_k = d_model // h  # we assume d_v = d_k
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)  # W^Q, W^K, W^V, W^O
        self.attn: torch.Tensor | None = None  # (batch, h, n_q, n_k), for visualization
        self.dropout = nn.Dropout(p=dropout)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query (batch, n_q, d_model), key/value (batch, n_k, d_model) -> (batch, n_q, d_model)."""
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (batch, 1, n_q or 1, n_k): the same mask for every head
        # 1) project, and split d_model into h heads of width d_k
        query, key, value = [
            self.split_heads(linear(x))  # (batch, h, n, d_k)
            for linear, x in zip(self.linears, (query, key, value), strict=False)
        ]
        # 2) attend, in all heads at once
        x, weights = attention(query, key, value, mask=mask, dropout=self.dropout)
        self.attn = weights.detach()
        # 3) merge the heads back, 4) the output projection W^O
        return self.linears[-1](self.merge_heads(x))

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, n, h * width) -> (batch, h, n, width): head i gets the i-th slice."""
        return x.view(*x.shape[:2], self.h, -1).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, h, n, width) -> (batch, n, h * width), the inverse of split_heads."""
        return x.transpose(1, 2).reshape(x.size(0), x.size(2), -1)


# %% [markdown]
# PyTorch has its own `torch.nn.MultiheadAttention`. It stores the three input projections as
# one matrix, `in_proj_weight`, the concatenation of $W^Q$, $W^K$ and $W^V$, and takes a
# `key_padding_mask` that is True where a key is *padding* (the opposite of our convention).
# Copy our weights into it and both give the same output:

# %%
torch.manual_seed(0)
d_model, h = 32, 4
ours = MultiHeadedAttention(h, d_model, dropout=0.0).eval()
theirs = nn.MultiheadAttention(d_model, h, dropout=0.0, batch_first=True).eval()
with torch.no_grad():
    theirs.in_proj_weight.copy_(torch.cat([lin.weight for lin in ours.linears[:3]]))
    theirs.in_proj_bias.copy_(torch.cat([lin.bias for lin in ours.linears[:3]]))
    theirs.out_proj.weight.copy_(ours.linears[3].weight)
    theirs.out_proj.bias.copy_(ours.linears[3].bias)

x = torch.randn(2, 5, d_model)
keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # sentence 2 has 2 pad tokens
with torch.no_grad():
    out = ours(x, x, x, mask=keep.unsqueeze(1))  # mask (batch, 1, n_k)
    expected, _ = theirs(x, x, x, key_padding_mask=~keep)
print("output:", tuple(out.shape), " attention weights:", tuple(ours.attn.shape))
print("matches torch.nn.MultiheadAttention:", torch.allclose(out, expected, atol=1e-5))

# %% [markdown]
# ```{note}
# The classic version stored the attention weights in `self.attn` without detaching them. In
# training that costs little, since `backward()` frees the tensors the graph saved. After a
# forward pass with neither a backward pass nor `torch.no_grad()`, which is how the classic
# evaluated, the stored weights keep that pass's graph, and the activations it saved, alive
# until the next call replaces them. We keep a detached copy: it is only ever looked at, never
# differentiated.
#
# In training mode `.attn` holds the weights *after* dropout, some entries zeroed and the rest
# scaled by $1/(1-p)$, so its rows do not sum to 1; call `.eval()` before reading them. Dropout
# on the attention weights comes from the classic code, not from the paper's text, which
# applies dropout to each sublayer's output and to the sums of embeddings and positional
# encodings (§5.4).
# ```
#
# A width that does not split into equal heads is refused with a message that says why:

# %%
try:
    MultiHeadedAttention(h=7, d_model=512)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## Three kinds of attention in the model
#
# The same module serves three purposes, which differ only in where the queries, keys and
# values come from and in the mask:
#
# 1. **Encoder self-attention.** Queries, keys and values are all the output of the previous
#    encoder layer. Every source position may attend to every other; the mask only hides
#    padding. Shape of the mask: (batch, 1, n_src).
# 2. **Decoder self-attention.** Queries, keys and values come from the previous decoder
#    layer, and the mask is padding *and* the `subsequent_mask`, so position $i$ sees only
#    positions up to $i$ and generation stays auto-regressive. Shape: (batch, n_tgt, n_tgt).
# 3. **Encoder-decoder (cross-) attention.** Queries come from the decoder, keys and values are
#    the encoder's memory. Every target position may look at every real source position, as in
#    the attention of earlier translation models {cite}`bahdanau2015neural,luong2015effective`.
#    The mask is the source padding mask, (batch, 1, n_src).
#
# All three masks are True where attention is allowed; `MultiHeadedAttention` adds the head
# dimension. Below, the decoder self-attention of a batch of two target sentences, the second
# one padded by two tokens: the weights of head 0 for the second sentence show the causal
# triangle, with the padded key columns also at zero.

# %% tags=["export", "hide-input"]
def weights_heatmap(weights: torch.Tensor, *, title: str) -> Any:
    """One map of attention weights (n_q, n_k): a cell per query and key, darker for more."""
    import altair as alt

    if weights.dim() != 2:
        raise ValueError(f"weights must be (n_q, n_k), got shape {tuple(weights.shape)}")
    cells = [
        {"query": i, "key": j, "weight": round(w, 3)}
        for i, row in enumerate(weights.tolist())
        for j, w in enumerate(row)
    ]
    return (
        alt.Chart(alt.Data(values=cells))
        .mark_rect()
        .encode(
            x="key:O",
            y="query:O",
            color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues")),
            tooltip=["query:O", "key:O", "weight:Q"],
        )
        .properties(width=220, height=220, title=title)
    )


# %%
torch.manual_seed(0)
self_attn = MultiHeadedAttention(h=4, d_model=32, dropout=0.0).eval()
tgt = torch.randn(2, 6, 32)
tgt_pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2]).unsqueeze(1)  # (2, 1, 6)
tgt_mask = tgt_pad & subsequent_mask(6)  # (2, 6, 6)
with torch.no_grad():
    self_attn(tgt, tgt, tgt, mask=tgt_mask)
weights = self_attn.attn[1, 0]  # sentence 2, head 0: (n_q, n_k)
weights_heatmap(weights, title="decoder self-attention, padded sentence, head 0")

# %% [markdown]
# The two last rows belong to padding queries. They may look at the same keys as position 3;
# what they compute is never used (their loss is masked out in training), so nothing needs to
# stop them.
#
# ## What we have, and what comes next
#
# We have `attention`, scaled dot-product attention with masks that broadcast over batches and
# heads and a clear error when they do not, and `MultiHeadedAttention`, checked against
# PyTorch's own, which remembers its last weights for the visualizations of later chapters. We
# also know why the scores are divided by $\sqrt{d_k}$. The next chapter builds what sits
# around attention in every layer: the position-wise feed-forward network, the embeddings, and
# the positional encodings that tell the model where each token is.

# %% [markdown]
# ## Exercises
#
# 1. **A query that may see nothing.** Suppose a mask hides all four keys of a query. Before
#    running anything, what weights does `attention` give that query? Write them as the tensor
#    `answer_1`; the check computes them. (Why are they not NaN?)
# 2. **A temperature.** Write `attention_with_temperature(query, key, value, temperature)`,
#    which divides the scores by $T\sqrt{d_k}$ instead of $\sqrt{d_k}$. With $T = 1$ it must
#    equal `attention`; as $T \to 0$ each query should take the value of its best key alone; as
#    $T \to \infty$ it should average all values equally. The check tries all three.
# 3. **More heads, same size.** Write `mha_parameters(d_model)`, the number of parameters of
#    `MultiHeadedAttention(h, d_model)`. The check tries it for 1, 2, 4, 8 and 16 heads: does
#    your answer depend on $h$?
#
# The hidden cell holds our solutions; replace them with yours and run the check after it.

# %% tags=["hide-cell"]
# Exercises 1 to 3: our solutions (hidden in the book). Replace them with yours.
answer_1 = torch.full((4,), 0.25)  # every score is the same lowest number: a uniform softmax


def attention_with_temperature(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Scaled dot-product attention with scores divided by temperature * sqrt(d_k)."""
    scores = query @ key.transpose(-2, -1) / (temperature * math.sqrt(query.size(-1)))
    return scores.softmax(dim=-1) @ value


def mha_parameters(d_model: int) -> int:
    """Four d_model x d_model projections with their biases, whatever the number of heads."""
    return 4 * (d_model * d_model + d_model)


# %%
# Check exercises 1 to 3
torch.manual_seed(0)
q, k, v = torch.randn(1, 4, 8), torch.randn(1, 4, 8), torch.randn(1, 4, 8)
_, weights = attention(q, k, v, mask=torch.zeros(1, 1, 4, dtype=torch.bool))
torch.testing.assert_close(weights[0, 0], answer_1)
print("exercise 1: correct")
torch.testing.assert_close(attention_with_temperature(q, k, v, 1.0), attention(q, k, v)[0])
best = (q @ k.transpose(-2, -1)).argmax(dim=-1)  # (1, 4): each query's best key
torch.testing.assert_close(attention_with_temperature(q, k, v, 1e-4), v[0, best[0]][None])
torch.testing.assert_close(attention_with_temperature(q, k, v, 1e6),
                           v.mean(dim=1, keepdim=True).expand(1, 4, 8))
print("exercise 2: correct")
for h in (1, 2, 4, 8, 16):
    module = MultiHeadedAttention(h, 64)
    assert mha_parameters(64) == sum(p.numel() for p in module.parameters()), h
print("exercise 3: correct")
