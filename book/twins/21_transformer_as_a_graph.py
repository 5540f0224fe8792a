# %% [markdown]
# # The Transformer as a graph
#
# Every attention layer in this book so far has been a dense matrix product: a score for every
# query and every key, then a mask that throws most of them away again. Padding, the causal
# mask of the decoder and the restricted attention of the paper's section 4 all say the same
# thing in different words: *which positions may talk to which*. That is a graph. Tokens are
# nodes, an allowed (query, key) pair is a directed edge from the key's node to the query's
# node, and attention is a rule for passing messages along the edges.
#
# The Deep Graph Library's tutorial on the Transformer {cite}`wang2019dgl` built the whole
# model this way. This chapter keeps the idea and drops the dependency: a few PyTorch scatter
# operations are enough to compute attention on any edge list, and we check that they give
# exactly what the dense `attention` of chapter 3 gives. The payoff is a different way to see
# cost. A dense layer pays for $n_q \times n_k$ scores whatever the mask says; a graph layer
# pays for its edges, so a sparser pattern is cheaper by construction.

# %% tags=["setup", "hide-cell"]
# Setup (hidden in the book): in Colab, install the book's package; everywhere, import what
# earlier chapters built.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPO = "https://github.com/annotated-transformer/annotated-transformer-book"
    REF = "v0.1.0"  # the tag or commit this notebook comes from
    package = f"the-annotated-transformer[book] @ git+{REPO}@{REF}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

from the_annotated_transformer import attention, enable_book_charts, line_chart, subsequent_mask

enable_book_charts()

# %% [markdown]
# ## From masks to edges
#
# Number the tokens of a batch one after the other, so that position $i$ of sentence $b$ is
# node $b \cdot n + i$. A mask of shape (batch, $n_q$, $n_k$) then turns into an edge list
# directly: every `True` entry $(b, i, j)$ is an edge from key node $b \cdot n_k + j$ to query
# node $b \cdot n_q + i$. Query and key nodes may be different sets (in the decoder's attention
# over the encoder output they are target and source tokens), so we keep two numberings and
# store each edge as a pair (source node, destination node).

# %% tags=["export"]
import math

import torch


def mask_to_edges(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges (key node, query node) of a (batch, n_q, n_k) mask: one per position allowed."""
    if mask.dim() != 3:
        raise ValueError(f"mask must have shape (batch, n_q, n_k), got {tuple(mask.shape)}")
    batch, n_q, n_k = mask.shape
    b, i, j = mask.bool().nonzero(as_tuple=True)  # each (E,)
    return b * n_k + j, b * n_q + i  # key nodes, query nodes


# %% [markdown]
# The three ways the model uses attention become three kinds of graph. The encoder's
# self-attention connects every real source token with every other (a complete graph on each
# sentence, with self-loops). The decoder's self-attention connects each target token with
# itself and with the tokens before it. The attention over the memory connects every source
# token of a sentence with every target token of the same sentence, in one direction. Here
# are the three for a batch of one sentence with four source tokens, the last of them padding,
# and three target tokens.

# %%
n_src, n_tgt = 4, 3
src_pad = torch.tensor([[True, True, True, False]])  # (batch, n_src): the last token is padding
graphs = {
    "encoder self-attention": src_pad.unsqueeze(1).expand(1, n_src, n_src),
    "decoder self-attention": subsequent_mask(n_tgt),
    "attention over the memory": src_pad.unsqueeze(1).expand(1, n_tgt, n_src),
}
for name, mask in graphs.items():
    key_nodes, query_nodes = mask_to_edges(mask)
    print(f"{name:>26}: {len(key_nodes):2d} edges of {mask.numel():2d} possible")

# %% tags=["export", "hide-cell"]
from typing import Any


def graph_chart(mask: torch.Tensor, *, title: str) -> Any:
    """A mask (1, n_q, n_k) as a graph: keys on the bottom row, queries on top, a line per edge."""
    import altair as alt

    if mask.dim() != 3 or mask.size(0) != 1:
        raise ValueError(f"mask must be one sentence's (1, n_q, n_k), got {tuple(mask.shape)}")
    key_nodes, query_nodes = mask_to_edges(mask)
    n_q, n_k = mask.shape[1:]
    pairs = zip(key_nodes.tolist(), query_nodes.tolist(), strict=True)
    edges = [{"x": k, "y": 0, "x2": q, "y2": 1} for k, q in pairs]
    nodes = [{"x": k, "y": 0, "role": "key"} for k in range(n_k)]
    nodes += [{"x": q, "y": 1, "role": "query"} for q in range(n_q)]
    scale_x = alt.Scale(domain=[-0.5, max(n_q, n_k) - 0.5])
    scale_y = alt.Scale(domain=[-0.3, 1.3])
    lines = alt.Chart(alt.Data(values=edges)).mark_rule(opacity=0.5).encode(
        x=alt.X("x:Q", scale=scale_x, axis=None), y=alt.Y("y:Q", scale=scale_y, axis=None),
        x2="x2:Q", y2="y2:Q",
    )
    points = alt.Chart(alt.Data(values=nodes)).mark_circle(size=220, opacity=1).encode(
        x=alt.X("x:Q", scale=scale_x), y=alt.Y("y:Q", scale=scale_y),
        color=alt.Color("role:N", title="node"),
        tooltip=["role:N", alt.Tooltip("x:Q", title="position")],
    )
    return (lines + points).properties(width=170, height=120, title=title)


# %%
import altair as alt

alt.hconcat(*(graph_chart(mask, title=name) for name, mask in graphs.items()))

# %% [markdown]
# The padded source token (position 3) is still a node, since every position of the padded
# batch keeps its node so that node ids stay simple arithmetic (`b * n + i`), but no edge
# leaves it, in either graph that reads the source: no query ever reads it, and no score is
# computed for it as a key. (As a query it still receives edges in the encoder, as its row does
# in the dense mask; its output is computed and never used.) In the dense version it gets a score like every other key, and is then
# given the lowest score the number type can hold so that softmax sends its weight to zero.
#
# ## Attention as message passing
#
# On a graph, one attention head does three things for every edge $(j \to i)$ and then one
# thing for every node $i$:
#
# 1. score the edge: $s_{ij} = q_i \cdot k_j / \sqrt{d_k}$;
# 2. normalise the scores of the edges that arrive at the same node with a softmax,
#    $a_{ij} = \exp(s_{ij}) / \sum_{j' \to i} \exp(s_{ij'})$;
# 3. send the message $a_{ij} v_j$ along the edge;
# 4. sum the messages that arrive at node $i$.
#
# Steps 2 and 4 are reductions over "the edges that arrive at node $i$". In PyTorch that is a
# scatter: `index_add_` sums values into the rows an index names, and `scatter_reduce` with
# `"amax"` takes a maximum the same way (we subtract each node's maximum score before
# exponentiating, for the same numerical reason that `softmax` does). Heads ride along as an
# extra dimension.

# %% tags=["export"]
def graph_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_nodes: torch.Tensor,
    query_nodes: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention along edges (key node -> query node): (output (n_q, h, d_v), weights (E, h)).

    `query` is (n_q, h, d_k), `key` (n_k, h, d_k), `value` (n_k, h, d_v): one row per node.
    Cost grows with the number of edges, not with n_q * n_k. A query node with no edge gets 0.
    """
    if key_nodes.shape != query_nodes.shape or key_nodes.dim() != 1:
        raise ValueError(
            f"key_nodes {tuple(key_nodes.shape)} and query_nodes {tuple(query_nodes.shape)} "
            "must be two 1-D tensors of the same length, one entry per edge"
        )
    n_q, h, d_k = query.shape
    # 1) one score per edge and head
    scores = (query[query_nodes] * key[key_nodes]).sum(-1) / math.sqrt(d_k)  # (E, h)
    # 2) softmax over the edges that arrive at the same query node
    top = torch.full((n_q, h), -math.inf, dtype=scores.dtype, device=scores.device)
    top = top.scatter_reduce(0, query_nodes[:, None].expand_as(scores), scores, "amax")
    weights = (scores - top[query_nodes]).exp()  # (E, h)
    total = torch.zeros((n_q, h), dtype=scores.dtype, device=scores.device)
    total = total.index_add(0, query_nodes, weights)  # (n_q, h)
    weights = weights / total[query_nodes]  # (E, h), sums to 1 at each query node
    # 3) a message per edge, 4) summed at its query node
    messages = weights[..., None] * value[key_nodes]  # (E, h, d_v)
    output = torch.zeros((n_q, h, value.size(-1)), dtype=value.dtype, device=value.device)
    return output.index_add(0, query_nodes, messages), weights


# %% [markdown]
# The check: project a random batch into heads, run the dense `attention` of chapter 3 with a
# mask, run `graph_attention` on the edges of the same mask, and compare. We try all three
# kinds of graph, with two sentences of different lengths and four heads.

# %%
torch.manual_seed(0)
batch, h, d_k, n_src, n_tgt = 2, 4, 8, 6, 5
src_lengths = torch.tensor([6, 4])  # the second sentence has two padding tokens
src_pad = torch.arange(n_src)[None, :] < src_lengths[:, None]  # (batch, n_src)
masks = {
    "encoder self-attention": (n_src, n_src, src_pad[:, None, :].expand(batch, n_src, n_src)),
    "decoder self-attention": (n_tgt, n_tgt, subsequent_mask(n_tgt).expand(batch, n_tgt, n_tgt)),
    "attention over the memory": (n_tgt, n_src, src_pad[:, None, :].expand(batch, n_tgt, n_src)),
}
for name, (n_q, n_k, mask) in masks.items():
    q = torch.randn(batch, h, n_q, d_k)  # (batch, h, n_q, d_k)
    k, v = torch.randn(batch, h, n_k, d_k), torch.randn(batch, h, n_k, d_k)
    dense, _ = attention(q, k, v, mask=mask.unsqueeze(1))  # (batch, h, n_q, d_k)

    def nodes(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(-1, h, d_k)  # (batch * n, h, d_k)

    key_nodes, query_nodes = mask_to_edges(mask)
    sparse, weights = graph_attention(nodes(q), nodes(k), nodes(v), key_nodes, query_nodes)
    sparse = sparse.reshape(batch, n_q, h, d_k).transpose(1, 2)  # (batch, h, n_q, d_k)
    gap = (dense - sparse).abs().max().item()
    print(f"{name:>26}: {len(key_nodes):3d} edges, equal to dense within 1e-6: {gap < 1e-6}")
    assert torch.allclose(dense, sparse, atol=1e-6)

# %% [markdown]
# The two agree to float rounding (the largest difference is about $10^{-7}$, the size of one
# float32 rounding step). (The dense version can disagree only where a query has no
# allowed key at all: it then spreads its weight evenly over the masked keys, while the graph
# version, with no edge arriving, returns zeros. Neither case occurs in the model, since every
# query may at least see itself or a real source token.)
#
# ## What the graph view buys
#
# Counting edges makes the cost of each kind of attention concrete. For one sentence of $n$
# tokens, full self-attention has $n^2$ edges and the causal decoder about half as many,
# $n(n+1)/2$. Section 4 of the paper proposes *restricted* self-attention, where each
# position sees only a neighbourhood of size $r$ around itself; that is a band of about
# $(2r+1)\,n$ edges, linear in $n$. The dense implementation would compute all $n^2$ scores
# and mask most of them; the graph implementation computes the band only.

# %%
def band_mask(n: int, r: int) -> torch.Tensor:
    """Restricted self-attention: position i sees positions i - r .. i + r."""
    positions = torch.arange(n)
    return ((positions[:, None] - positions[None, :]).abs() <= r).unsqueeze(0)  # (1, n, n)


edge_counts = []
for n in (16, 32, 64, 128, 256, 512):
    patterns = {
        "full": torch.ones(1, n, n, dtype=torch.bool),
        "causal": subsequent_mask(n),
        "restricted, r = 8": band_mask(n, 8),
    }
    for name, mask in patterns.items():
        edge_counts.append({"n": n, "pattern": name, "edges": len(mask_to_edges(mask)[0])})
print(*(f"n = {e['n']:3d}, {e['pattern']:>17}: {e['edges']:7,d} edges" for e in edge_counts[-3:]),
      sep="\n")

line_chart(edge_counts, x="n:Q", y="edges:Q", color="pattern:N", x_scale={"type": "log", "base": 2},
           y_scale={"type": "log"}, formats={"edges": ","}, x_title="sentence length n",
           y_title="edges (scores computed)", width=420, height=240,
           title="How many scores each attention pattern needs")

# %% [markdown]
# On a log-log chart the full and causal patterns rise with slope 2 and the restricted one
# with slope 1: at 512 tokens the band has 15 times fewer edges than the causal graph and 30 times fewer
# than the full one. The price
# is the one the paper names: a path between two distant positions now needs about $n/r$
# layers instead of one.
#
# A graph layer is not automatically faster on real hardware. Dense matrix products are what
# GPUs and CPU vector units are built for, and gathers and scatters move memory around
# irregularly, so for the short, fully connected sentences of machine translation the dense
# form wins. The graph form shines when the pattern is genuinely sparse, which is why the
# sparse and local attention variants that followed the paper are implemented with
# specialised kernels rather than masks.
#
# ## What we have
#
# `mask_to_edges` and `graph_attention` rebuild attention from edges and scatters, and the
# check above shows them equal to the dense `attention` for every kind of attention in the
# Transformer. The sort task of chapter 13 came from the same graph tutorial. The next chapter,
# the last, stays beyond the paper and looks at what trained attention heads attend to.
