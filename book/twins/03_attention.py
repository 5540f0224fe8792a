# %% [markdown]
# # Attention
#
# **The paper, §3.2.** Attention maps a **query** and a set of **key**-**value** pairs to an
# average of the values, each weighted by how well its key matches the query, however far apart
# the positions are. The Transformer scores the match with a scaled dot product, and runs several
# attentions side by side.

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
    _check_mask,
    clones,
    enable_book_charts,
    scaling_chart,
    subsequent_mask,
    weights_heatmap,
)

enable_book_charts()

# %% [markdown]
# ## Scaled dot-product attention
#
# With the queries as rows of a matrix $Q$, the keys of $K$ and the values of $V$, all the matches
# are one matrix product $QK^\top$; a softmax over each row gives the weights, and a second
# product averages the values:
#
# $$
# \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{QK^\top}{\sqrt{d_k}}\right) V .
# $$
#
# ```{figure} figures/scaled_dot_product_attention.svg
# :name: fig-scaled-dot-product-attention
# :width: 340px
#
# Scaled dot-product attention, after the paper's Figure 2.
# ```
#
# The paper prefers dot products to additive attention {cite}`bahdanau2015neural`, a small
# network, because matrix products run fast; unscaled, they lose to it for large $d_k$
# {cite}`britz2017massive`. A mask gives the pairs that may not attend (padding, the decoder's
# future) the dtype's lowest score, so their weight underflows to zero.
#
# ```{note}
# The classic version filled masked scores with $-10^9$, which float16 cannot hold; the dtype's
# minimum suits any dtype and, unlike $-\infty$, keeps a fully masked row finite (exercise 1).
# ```

# %% tags=["export"]
import math

import torch
from torch import nn


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              mask: torch.Tensor | None = None,
              dropout: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention: (output (..., n_q, d_v), weights (..., n_q, n_k))."""
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (batch, h, n_q, n_k)
    if mask is not None:
        _check_mask(mask, scores)  # a one-line error for a mask of the wrong shape (appendix)
        # True (or 1) = may attend; the rest get the lowest finite score, so softmax gives ~0.
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (batch, h, n_q, n_k), each row sums to 1
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # (batch, h, n_q, d_v)


# %% [markdown]
# ### A worked example: three tokens, $d_k = 2$
#
# Query 0, $(1, 0)$, matches key 0, $(2, 0)$, best and key 1, $(0, 2)$, not at all; query 2,
# $(1, 1)$, scores every key the same and averages the values equally. The cell checks the first
# weight against the pencil's $e^{\sqrt 2} / (e^{\sqrt 2} + e^{0} + e^{1/\sqrt 2})$:

# %%
import torch.nn.functional as F

Q = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # (3, d_k = 2)
K = torch.tensor([[2.0, 0.0], [0.0, 2.0], [1.0, 1.0]], dtype=torch.float64)  # (3, d_k)
V = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)  # (3, d_v = 2)
scores = Q @ K.T / math.sqrt(2)  # (3, 3): row i compares query i with every key
weights_by_hand = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)  # the softmax
out, weights = attention(Q, K, V)
print("Q K^T =", Q @ K.T, "weights =", weights, "output =", out, sep="\n")
assert torch.allclose(weights, weights_by_hand) and torch.allclose(out, weights_by_hand @ V)
assert torch.allclose(out, F.scaled_dot_product_attention(Q, K, V))  # PyTorch's fused kernel
pencil = math.exp(math.sqrt(2)) / (math.exp(math.sqrt(2)) + 1 + math.exp(1 / math.sqrt(2)))
assert math.isclose(weights[0, 0].item(), pencil)
assert torch.allclose(out[2], torch.tensor([2 / 3, 2 / 3], dtype=torch.float64))

# %% [markdown]
# ### Self-attention, before any parameters
#
# In *self*-attention queries, keys and values come from one sequence.
# $\mathrm{Attention}(X, X, X)$ replaces each token vector by a weighted average of all of them;
# as the dot product of vectors of one length is largest when they point the same way, the weights
# favour similar tokens:

# %%
X = 2 * torch.tensor([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0]], dtype=torch.float64)  # (3, 2)
out, weights = attention(X, X, X)
print("weights (row i: how token i averages the three) =", weights, sep="\n")
assert torch.allclose(weights.sum(dim=-1), torch.ones(3, dtype=torch.float64))
assert torch.allclose(out, weights @ X)  # each output is a weighted average of the inputs
assert torch.equal(weights.argmax(dim=-1), torch.arange(3))  # most weight on itself,
assert weights[0, 1] > weights[0, 2] and weights[2, 1] > weights[2, 0]  # then on its neighbour

# %% [markdown]
# Learned projections (below) choose what counts as similar and what each token hands over. With
# chapter 2's causal mask and equal scores, each output is the mean of the values so far:

# %%
values = torch.arange(8.0, dtype=torch.float64).view(4, 2)  # (n = 4, d_v = 2)
zeros = torch.zeros(4, 2, dtype=torch.float64)  # queries and keys: every score is 0
out, weights = attention(zeros, zeros, values, mask=subsequent_mask(4)[0])
tril = torch.tril(torch.ones(4, 4, dtype=torch.float64))
assert torch.allclose(weights, tril / tril.sum(dim=-1, keepdim=True))  # rows 1/1, 1/2, ...
assert torch.allclose(out, values.cumsum(dim=0) / tril.sum(dim=-1, keepdim=True))  # means
assert torch.allclose(out, F.scaled_dot_product_attention(zeros, zeros, values, is_causal=True))
print("causal weights with equal scores =", weights, sep="\n")

# %% [markdown]
# ## Why divide by $\sqrt{d_k}$
#
# The paper suspects that large dot products push the softmax into regions where its gradients are
# tiny (§3.2.1): if the components of $q$ and $k$ are independent with mean 0 and variance 1,
# $q \cdot k$ has variance $d_k$ (its footnote). The cell scores random queries against 10 random
# keys at growing $d_k$, with and without the scaling (the weights' entropy is at most
# $\ln 10 \approx 2.30$ nats).

# %%
import pandas as pd
from torch.func import jacrev, vmap

torch.manual_seed(0)
n_queries, n_keys = 2000, 10
rows = []
for d_k in [1, 4, 16, 64, 256, 1024]:
    q, k = torch.randn(n_queries, 1, d_k), torch.randn(n_queries, n_keys, d_k)
    dots = (q @ k.transpose(-2, -1)).squeeze(1)
    for scaled in (False, True):
        scores = dots / math.sqrt(d_k) if scaled else dots  # (n_queries, n_keys)
        p = scores.softmax(dim=-1)
        entropy = -(p * p.clamp_min(1e-30).log()).sum(-1)
        jacobian = vmap(jacrev(lambda s: s.softmax(-1)))(scores)  # (n_queries, n_keys, n_keys)
        rows.append({"d_k": d_k, "scores": "q·k / √d_k" if scaled else "q·k",
                     "std of scores": round(scores.std().item(), 3),
                     "mean max weight": round(p.max(-1).values.mean().item(), 3),
                     "mean entropy (nats)": round(entropy.mean().item(), 3),
                     "mean Jacobian norm": round(jacobian.norm(dim=(-2, -1)).mean().item(), 3)})
scaling = pd.DataFrame(rows)
print(scaling.to_string(index=False))
scaling_chart(scaling, n_keys=n_keys)


# %% [markdown]
# Unscaled, the spread grows like $\sqrt{d_k}$; look at the largest weight climbing towards 1 and the
# entropy collapsing, for random vectors that give no reason to prefer any key. The softmax's
# Jacobian, $\partial p_i / \partial s_j = p_i(\delta_{ij} - p_j)$, vanishes as one $p_i$ nears 1:
# the scores get almost no gradient (last column: its norm). Scaled, the three curves stay nearly
# flat.
#
# ## Multi-head attention
#
# The paper runs $h$ attentions in parallel, each on its own learned projection of queries, keys
# and values to width $d_k = d_v = d_\text{model}/h$, and concatenates the results:
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
# Multi-head attention, after the paper's Figure 2: $h$ heads side by side, concatenated and
# projected back to $d_\text{model}$.
# ```
#
# One head blends what it attends to into one average; several heads can each look for something
# else, in a subspace of their own (§3.2.2). The base model's $h = 8$ heads of width $d_k = 64$ cost,
# the paper notes, about as much as one head of full width. In code, one
# $d_\text{model} \times d_\text{model}$ layer holds the $W_i^Q$ of all heads, and its output is cut
# into $h$ pieces (likewise for $K$ and $V$). Unlike the paper's matrices, these layers and $W^O$'s
# have biases ({doc}`departures`).

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

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (batch, n_q, d_model), key/value (batch, n_k, d_model) -> (batch, n_q, d_model)"""
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (batch, 1, n_q or 1, n_k): the same mask for every head
        # 1) project with W^Q, W^K, W^V, and split d_model into h heads of width d_k
        query, key, value = [
            self.split_heads(linear(x))  # (batch, h, n, d_k)
            for linear, x in zip(self.linears[:3], (query, key, value), strict=True)
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
# PyTorch's `nn.MultiheadAttention` keeps $W^Q$, $W^K$, $W^V$ in one `in_proj_weight`, and its
# `key_padding_mask` is True at *padding*. With our weights copied in, it gives our output:

# %%
torch.manual_seed(0)
ours = MultiHeadedAttention(h=4, d_model=32, dropout=0.0).eval()
theirs = nn.MultiheadAttention(32, 4, dropout=0.0, batch_first=True).eval()
with torch.no_grad():
    theirs.in_proj_weight.copy_(torch.cat([lin.weight for lin in ours.linears[:3]]))
    theirs.in_proj_bias.copy_(torch.cat([lin.bias for lin in ours.linears[:3]]))
    theirs.out_proj.load_state_dict(ours.linears[3].state_dict())
    x = torch.randn(2, 5, 32)
    keep = torch.tensor([[True] * 5, [True] * 3 + [False] * 2])  # sentence 2: 2 pad tokens
    out = ours(x, x, x, mask=keep.unsqueeze(1))  # mask (batch, 1, n_k)
    expected, _ = theirs(x, x, x, key_padding_mask=~keep)
print("matches torch.nn.MultiheadAttention:", torch.allclose(out, expected, atol=1e-5))
try:
    MultiHeadedAttention(h=7, d_model=512)  # 512 does not split into 7 equal heads
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ```{note}
# The classic version stored `self.attn` with its graph; we store it detached. The dropout on the
# weights is not the paper's ({doc}`departures`).
# ```
#
# ## Three kinds of attention in the model
#
# One module serves the model's three attentions (§3.2.3), which differ in where $Q$, $K$, $V$ come
# from and in the mask: **encoder self-attention**, all three from the previous encoder layer, its
# mask (batch, 1, n_src) hiding padding; **decoder self-attention**, likewise in the decoder, its
# mask (batch, n_tgt, n_tgt) hiding padding *and* the future; and **cross-attention** (chapter 2), as
# in {cite}`bahdanau2015neural`, with the source's mask. Below, a decoder self-attention head on a
# target with two padding tokens: the causal triangle, its padded columns at zero. Padded rows still
# attend; the loss skips them (chapter 7).

# %%
torch.manual_seed(0)
self_attn = MultiHeadedAttention(h=4, d_model=32, dropout=0.0).eval()
tgt = torch.randn(2, 6, 32)
tgt_pad = torch.tensor([[True] * 6, [True] * 4 + [False] * 2]).unsqueeze(1)  # (2, 1, 6)
tgt_mask = tgt_pad & subsequent_mask(6)  # (2, 6, 6)
with torch.no_grad():
    self_attn(tgt, tgt, tgt, mask=tgt_mask)
weights_heatmap(self_attn.attn[1, 0], title="decoder self-attention, padded sentence, head 0")

# %% [markdown]
# ### Self-attention does not see order
#
# Without a mask, self-attention treats its input as a set: projections act on each position
# alone and averages ignore where a key sits, so permuting the inputs permutes the outputs. "Dog
# bites man" and "man bites dog" get the same vectors, reordered: hence chapter 4's positions.

# %%
torch.manual_seed(0)
x = torch.randn(1, 6, 32)  # (batch, n, d_model): six positions, no positional encoding
perm = torch.tensor([3, 0, 5, 1, 4, 2])
with torch.no_grad():
    out, out_of_permuted = self_attn(x, x, x), self_attn(*[x[:, perm]] * 3)
assert torch.allclose(out_of_permuted, out[:, perm], atol=1e-6)
print("self-attention of the permuted inputs = the permuted outputs, for", perm.tolist())

# %% [markdown]
# ## What we have, and what comes next
#
# `attention` and `MultiHeadedAttention` match PyTorch's; chapter 4 gives them order.
#
# ## Exercises
#
# 1. **A query that may see nothing.** A mask hides all four keys of a query. Before running
#    anything, what weights does `attention` give it (`answer_1`)? Why not NaN?
# 2. **A temperature.** Write `attention_with_temperature(query, key, value, temperature)`, which
#    divides the scores by $T\sqrt{d_k}$. At $T = 1$ it is `attention`; as $T \to 0$ each query
#    takes its best key's value; as $T \to \infty$, the mean of the values.
# 3. **More heads, same size.** Write `mha_parameters(d_model)`, the number of parameters of
#    `MultiHeadedAttention(h, d_model)`. Does it depend on $h$? The check tries 1, 2, 4, 8 and 16
#    heads.
#
# Our solutions are in the hidden cell; replace them with yours.

# %% tags=["hide-cell"]
# Exercises 1 to 3: our solutions (hidden in the book). Replace them with yours.
answer_1 = torch.full((4,), 0.25)  # every score is the same lowest number: a uniform softmax


def attention_with_temperature(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                               temperature: float) -> torch.Tensor:
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
