# %% [markdown]
# # Model variations
#
# Which parts of the Transformer matter, and how much? Section 6.2 of the paper answers with an
# ablation study, its Table 3 {cite}`vaswani2017attention`. Starting from the base model, it
# changes one thing at a time, trains each variant for the same 100,000 steps on
# English-German, and reports perplexity and BLEU on newstest2013. The rows come in five
# groups: (A) the number of heads $h$, with $d_k = d_v = d_{model}/h$ so that the computation
# stays the same; (B) a smaller key size $d_k$; (C) smaller and bigger models; (D) dropout and
# label smoothing; (E) learned positional embeddings instead of sinusoids.
#
# One such run took the authors 12 hours on eight GPUs. This chapter runs the same kind of
# experiment in miniature, on the sort task of chapter 13: twelve variants, each trained from
# five seeds under two sets of float kernels. It adds to `make_model` the two knobs that
# Table 3 turns and `make_model` lacks, and compares what the miniature finds with the paper,
# row by row.

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
    EncoderDecoder,
    LabelSmoothing,
    LearnedPositionalEmbedding,
    MultiHeadedAttention,
    SimpleLossCompute,
    attention,
    book_data,
    count_parameters,
    enable_book_charts,
    exact_matches,
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
# ## What the paper found
#
# Some rows of Table 3, with the paper's numbers: perplexity per word piece and BLEU on
# newstest2013 (beam search, no checkpoint averaging), and the parameter count in millions
# where the paper gives one. An empty cell means "as in the base model".

# %%
import pandas as pd

paper = pd.DataFrame(
    [
        ("base", "N=6, d_model=512, h=8, d_k=d_v=64, P_drop=0.1, ε_ls=0.1", 4.92, 25.8, "65"),
        ("A", "h=1, d_k=d_v=512", 5.29, 24.9, ""),
        ("A", "h=16, d_k=d_v=32", 4.91, 25.8, ""),
        ("A", "h=32, d_k=d_v=16", 5.01, 25.4, ""),
        ("B", "d_k=16 (d_v=64)", 5.16, 25.1, "58"),
        ("C", "N=2", 6.11, 23.7, "36"),
        ("C", "N=8", 4.88, 25.5, "80"),
        ("C", "d_model=256, d_k=d_v=32", 5.75, 24.5, "28"),
        ("C", "d_model=1024, d_k=d_v=128", 4.66, 26.0, "168"),
        ("C", "d_ff=4096", 4.75, 26.2, "90"),
        ("D", "P_drop=0", 5.77, 24.6, ""),
        ("D", "ε_ls=0", 4.67, 25.3, ""),
        ("E", "learned positional embedding", 4.92, 25.7, ""),
    ],
    columns=["row", "change", "PPL (dev)", "BLEU (dev)", "params (M)"],
)
paper

# %% [markdown]
# Read as findings:
#
# - (A) One head is worst, 0.9 BLEU below the best setting; many heads help, up to a point:
#   32 heads of width 16 are worse again than 16 of width 32.
# - (B) Shrinking only the key size $d_k$ hurts: deciding which positions match is not easy,
#   the paper suggests, and a richer compatibility function than the dot product might pay off.
# - (C) Bigger is better, by and large: a wider model or feed-forward layer lowers perplexity
#   and raises BLEU, and two layers instead of six cost the most (2.1 BLEU).
# - (D) Dropout matters a great deal (24.6 BLEU without it). Label smoothing trades: it costs
#   perplexity (4.67 without it, 4.92 with it) but gains BLEU (25.3 without it, 25.8 with it).
# - (E) Learned positions and sinusoids give nearly the same result.
#
# ## Two knobs that `make_model` lacks
#
# `make_model` takes $N$, $d_{model}$, $d_{ff}$, $h$ and the dropout rate, and label smoothing
# lives in the loss, so rows A, C and D need nothing new. Two rows do.
#
# Row B changes $d_k$ alone. Our `MultiHeadedAttention` (chapter 3), like the paper's base
# model, ties $d_k = d_v = d_{model}/h$. Row B keeps $d_v = 64$ and narrows only the queries
# and keys, which is why its parameter count drops (58 million for $d_k = 16$, against 65).
# `KeySizeAttention` is a `MultiHeadedAttention` whose $W^Q$ and $W^K$ map $d_{model}$ to
# $h \cdot d_k$, while $W^V$ and $W^O$ keep $h \cdot d_v = d_{model}$. Chapter 3's `attention`
# needs no change: it takes $d_k$ from the queries and lets the values have any width.

# %% tags=["export"]
import torch
from torch import nn


class KeySizeAttention(MultiHeadedAttention):
    """Multi-head attention with its own query/key width d_k; values keep d_v = d_model / h."""

    def __init__(self, h: int, d_model: int, d_k: int, dropout: float = 0.1) -> None:
        super().__init__(h, d_model, dropout=dropout)
        if not isinstance(d_k, int) or d_k < 1:
            raise ValueError(f"d_k={d_k!r} must be a positive integer")
        self.d_k = d_k  # queries and keys: h heads of width d_k
        self.d_v = d_model // h  # values: h heads of width d_v, as in MultiHeadedAttention
        self.linears[0] = nn.Linear(d_model, h * d_k)  # W^Q
        self.linears[1] = nn.Linear(d_model, h * d_k)  # W^K

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
        # 1) project: queries and keys to h heads of d_k, values to h heads of d_v
        query, key, value = [
            self.split_heads(linear(x))  # (batch, h, n, d_k or d_v)
            for linear, x in zip(self.linears[:3], (query, key, value), strict=True)
        ]
        # 2) attend: scores from d_k-wide dot products, outputs d_v wide
        x, weights = attention(query, key, value, mask=mask, dropout=self.dropout)
        self.attn = weights.detach()  # (batch, h, n_q, n_k)
        # 3) merge the heads: (batch, h, n_q, d_v) -> (batch, n_q, h * d_v), 4) W^O
        return self.linears[-1](self.merge_heads(x))


# %% [markdown]
# Two checks. With $d_k = d_{model}/h$ and the same weights it must compute exactly what
# `MultiHeadedAttention` computes; with a narrower $d_k$ the scores are still one
# $(n_q \times n_k)$ matrix per head, and the output keeps its width.

# %%
torch.manual_seed(0)
x = torch.randn(2, 5, 32)  # (batch, n, d_model)
mask = torch.ones(2, 1, 5, dtype=torch.bool)
mask[1, :, 3:] = False  # the second sequence has two padding positions
standard = MultiHeadedAttention(4, 32, dropout=0.0).eval()
same = KeySizeAttention(4, 32, d_k=8, dropout=0.0).eval()
same.load_state_dict(standard.state_dict())  # the same shapes, so the same weights fit
print("d_k = d_model / h gives MultiHeadedAttention's output:",
      torch.allclose(same(x, x, x, mask), standard(x, x, x, mask), atol=1e-6))
narrow = KeySizeAttention(4, 32, d_k=2, dropout=0.0).eval()
out = narrow(x, x, x, mask)
print(f"d_k = 2: output {tuple(out.shape)}, attention weights {tuple(narrow.attn.shape)}")
for module in (standard, narrow):
    print(f"  d_k = {module.d_k}: {sum(p.numel() for p in module.parameters()):,} parameters")

# %% [markdown]
# Row E swaps the position signal. `make_model` builds each embedding as
# `nn.Sequential(Embeddings, PositionalEncoding)`, so the second item can be replaced: by
# chapter 4's `LearnedPositionalEmbedding`, or, for a control row that Table 3 does not have,
# by a plain dropout, which leaves the model no position signal at all.
#
# `make_variant` builds a model with `make_model` and then turns these two knobs. New
# attention matrices get `make_model`'s Xavier initialization; a learned position table keeps
# PyTorch's $\mathcal{N}(0, 1)$ start, the scale of the sinusoids it replaces.

# %% tags=["export"]
import torch
from torch import nn

POSITIONS = ("sinusoidal", "learned", "none")


def make_variant(
    src_vocab: int,
    tgt_vocab: int,
    *,
    N: int = 6,
    d_model: int = 512,
    d_ff: int = 2048,
    h: int = 8,
    d_k: int | None = None,
    dropout: float = 0.1,
    positions: str = "sinusoidal",
    max_len: int = 5000,
    share_embeddings: bool = False,
) -> EncoderDecoder:
    """make_model plus Table 3's other knobs: a key size d_k of its own, and the position signal."""
    if positions not in POSITIONS:
        raise ValueError(f"positions={positions!r} must be one of {POSITIONS}")
    model = make_model(
        src_vocab, tgt_vocab, N, d_model, d_ff, h, dropout, share_embeddings=share_embeddings
    )
    if d_k is not None and d_k != d_model // h:  # row B: narrower (or wider) queries and keys
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            for name in ("self_attn", "src_attn"):
                if hasattr(layer, name):
                    setattr(layer, name, _xavier(KeySizeAttention(h, d_model, d_k, dropout)))
    if positions != "sinusoidal":  # row E: item 1 of each embedding is the position signal
        for embed in (model.src_embed, model.tgt_embed):
            if positions == "learned":
                embed[1] = LearnedPositionalEmbedding(d_model, dropout, max_len=max_len)
            else:
                embed[1] = nn.Dropout(dropout)  # no position signal, the same dropout
    return model


def _xavier(module: nn.Module) -> nn.Module:
    """Initialize a module's matrices as make_model does (Xavier/Glorot uniform)."""
    for p in module.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return module


# %% [markdown]
# A check against the paper: its row B counts 58 million parameters for $d_k = 16$ and 60
# million for $d_k = 32$, against 65 million for the base model. Counting on PyTorch's `meta`
# device (shapes without storage) with chapter 5's `count_parameters`, with the paper's shared
# vocabulary of about 37,000 tokens and tied embeddings:

# %%
with torch.device("meta"):
    counts = {
        d_k: count_parameters(make_variant(37_000, 37_000, d_k=d_k, share_embeddings=True))
        for d_k in (64, 32, 16)
    }
for d_k, paper_count in ((64, 65), (32, 60), (16, 58)):
    print(f"d_k = {d_k:2d}: {counts[d_k] / 1e6:.1f}M parameters, "
          f"{(counts[64] - counts[d_k]) / 1e6:.1f}M fewer than d_k = 64 "
          f"(paper: {paper_count}M, {65 - paper_count}M fewer)")

# %% [markdown]
# Our base model has 63.1 million parameters where the paper has 65 (chapter 5 explains the
# gap), but the parameters that row B removes agree with the paper's, which rounds them to
# millions.
#
# ## The miniature
#
# **Task.** The sort task of chapter 13: a source of 1 to 10 random digits, its target the same
# digits in increasing order. A small model is still far from perfect after a few hundred
# steps, so variants that learn at different speeds end up at different places. The test set
# is 500 sequences of 4 to 10 digits that training never sees.
#
# **Base model.** Chapter 13's model at half the width: $N = 2$, $d_{model} = 32$,
# $d_{ff} = 64$, $h = 4$ heads of $d_k = d_v = 8$, $P_{drop} = 0.1$ and $\epsilon_{ls} = 0.1$.
#
# **Variants.** One change each, mirroring the paper's groups: (A) $h$ = 1, 2 and 8 with
# $d_k = d_v = d_{model}/h$; (B) $d_k = 2$, a quarter of the base, as the paper's 16 is a
# quarter of 64; (C) $N = 1$, $d_{model}$ = 16 and 64 (with $d_{ff} = 2 d_{model}$); (D) no
# dropout, no label smoothing; (E) learned positions, and a control without positions.
#
# **Training.** Each run takes the same 250 optimizer steps of 32 sequences, with Adam and
# chapter 10's schedule (`factor=0.5`, 100 warm-up steps), on one CPU thread. The schedule
# scales the learning rate with $d_{model}^{-1/2}$, so wider models take smaller steps.
#
# **Measures.** The held-out loss is the cross-entropy per target token on the test set,
# without smoothing, so that rows with and without label smoothing are measured alike; its
# exponential is the perplexity. Our
# stand-in for BLEU is exact-match accuracy: the share of test sequences that greedy decoding
# sorts exactly (chapter 12's `exact_matches`).
#
# **Seeds.** Every row is trained from five seeds, 0 to 4, each under two sets of float
# kernels: ten runs per row. A seed fixes both the initialization and the stream of training
# batches, so under one seed and one kernel set every row sees the same data.

# %% tags=["export"]
import functools

import torch

MINIATURE_VOCAB = 13  # <s>, </s>, padding and the digits 0-9 (chapter 12)
MINIATURE = {"N": 2, "d_model": 32, "d_ff": 64, "h": 4, "dropout": 0.1, "smoothing": 0.1}
MINIATURE_STEPS, MINIATURE_BATCH = 250, 32
MINIATURE_VARIATIONS = [  # (row of Table 3, variant, the change to the base model)
    ("base", "N=2, d_model=32, h=4, d_k=d_v=8", {}),
    ("A", "h=1, d_k=d_v=32", {"h": 1}),
    ("A", "h=2, d_k=d_v=16", {"h": 2}),
    ("A", "h=8, d_k=d_v=4", {"h": 8}),
    ("B", "d_k=2 (d_v=8)", {"d_k": 2}),
    ("C", "N=1", {"N": 1}),
    ("C", "d_model=16, d_k=d_v=4", {"d_model": 16, "d_ff": 32}),
    ("C", "d_model=64, d_k=d_v=16", {"d_model": 64, "d_ff": 128}),
    ("D", "P_drop=0", {"dropout": 0.0}),
    ("D", "ε_ls=0", {"smoothing": 0.0}),
    ("E", "learned positions", {"positions": "learned"}),
    ("E", "no positions (control)", {"positions": "none"}),
]


@functools.cache
def miniature_test_set() -> tuple[Batch, frozenset]:
    """500 sequences of 4 to 10 digits from a seed no training run uses, and their set (which
    training batches exclude)."""
    data = torch.Generator().manual_seed(100)
    src = random_sequences(500, MINIATURE_VOCAB, min_len=4, max_len=10, generator=data)
    return seq2seq_batch(src, sorted_symbols(src)), frozenset(sequence_set(src))


def train_miniature(model: nn.Module, seed: int, *, smoothing: float, peak: float,
                    warmup: bool = True) -> dict:
    """Train `model` for the miniature's steps from `seed`; held-out loss and exact matches.

    The schedule is chapter 10's with 100 warm-up steps and `factor=peak`; warmup=False starts
    at the schedule's peak and decays from there as the warmed-up schedule does after step 100.
    """
    test_batch, held_out = miniature_test_set()
    V, d_model = MINIATURE_VOCAB, model.generator.proj.in_features
    loss_compute = SimpleLossCompute(
        model.generator, LabelSmoothing(V, padding_idx=PAD_ID, smoothing=smoothing)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)

    def schedule(step: int) -> float:
        return rate(step if warmup else max(step, 100), model_size=d_model, factor=peak,
                    warmup=100)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=schedule)
    data = torch.Generator().manual_seed(seed)
    batches = sort_batches(V, MINIATURE_BATCH, MINIATURE_STEPS, generator=data,
                           exclude=held_out)
    run_epoch(batches, model, loss_compute, optimizer, scheduler, log_every=None)
    cross_entropy = SimpleLossCompute(model.generator, LabelSmoothing(V, padding_idx=PAD_ID))
    loss, _ = run_epoch([test_batch], model, cross_entropy, mode="eval", log_every=None)
    return {"loss": loss, "exact": exact_matches(model, test_batch) / len(test_batch),
            "params": sum(p.numel() for p in model.parameters())}


def train_variation(change: dict, seed: int) -> dict:
    """The base miniature with `change` applied, trained from `seed` (chapter 10's schedule at
    factor 0.5)."""
    options = MINIATURE | change
    smoothing = options.pop("smoothing")
    torch.manual_seed(seed)
    V = MINIATURE_VOCAB
    model = make_variant(V, V, **options, max_len=12)  # sequences have at most 11 tokens
    return train_miniature(model, seed, smoothing=smoothing, peak=0.5)


def train_norm(norm_first: bool, warmup: bool, seed: int) -> float:
    """Held-out loss of the miniature without dropout or smoothing, post- or pre-norm, with or
    without warm-up, at four times the variations' peak learning rate (factor 2, not 0.5)."""
    torch.manual_seed(seed)
    V = MINIATURE_VOCAB
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=0.0, norm_first=norm_first)
    return train_miniature(model, seed, smoothing=0.0, peak=2.0, warmup=warmup)["loss"]


# %% [markdown]
# The twelve rows are `MINIATURE_VARIATIONS` above. One run of a row is a demonstration, not a
# finding: another seed, or another CPU's float kernels, sends it along a different path. So
# `tools/seeds.py model_variations` trains every row from the five seeds, under this CPU's own
# kernels and under the set one level below (what an older CPU gets), and stores the runs in
# `book/data/seeds_model_variations.json`. This page trains seed 0 once more, to show the
# machinery at work, and reads its table from the sweep.

# %%
torch.set_num_threads(1)  # tiny matrices: a second thread costs more than it saves

# %% nbval_reason="12 short training runs: their digits differ with another CPU's float kernels" tags=["nbval-ignore-output"]
import time

start = time.perf_counter()
seed_0 = {}
for row, name, change in MINIATURE_VARIATIONS:
    seed_0[name] = train_variation(change, seed=0)
    print(f"{row:4s} {name:24s} loss {seed_0[name]['loss']:.3f} | "
          f"exact match {seed_0[name]['exact']:6.1%}")
print(f"12 runs of {MINIATURE_STEPS} steps took {time.perf_counter() - start:.0f} s")
# Bounds that all 120 stored runs met, and the comparisons with the base model that held in
# all ten of its (seed, kernels) pairs by at least 0.028 nats.
base_loss = seed_0[MINIATURE_VARIATIONS[0][1]]["loss"]
assert all(0.15 < run["loss"] < 0.5 for run in seed_0.values())
for name in ("h=8, d_k=d_v=4", "P_drop=0", "ε_ls=0", "learned positions"):
    assert seed_0[name]["loss"] < base_loss, name
for name in ("h=1, d_k=d_v=32", "d_model=16, d_k=d_v=4"):
    assert seed_0[name]["loss"] > base_loss, name

# %% [markdown]
# ## The miniature Table 3
#
# For each row, over its ten stored runs: the mean, lowest and highest held-out loss and
# exact-match accuracy, and in how many of its runs it did better than the base model's run
# with the same seed and kernels. A pair shares the data and the arithmetic, so its difference
# is the row's effect plus the noise of one run. A row that beats the base model in all ten
# pairs, or loses in all ten, is a finding of this miniature; a split such as 6 of 10 is not.

# %%
import math
from statistics import mean

variations = book_data("seeds_model_variations.json")
runs = variations["runs"]
base_name = MINIATURE_VARIATIONS[0][1]
base_of = {(r["seed"], r["kernels"]): r for r in runs if r["variant"] == base_name}


def row_summary(row: str, name: str) -> dict:
    """Mean and range of a row's runs, and how many of its pairs beat the base model."""
    own = [r for r in runs if r["variant"] == name]
    base = [base_of[(r["seed"], r["kernels"])] for r in own]
    loss, exact = [r["loss"] for r in own], [r["exact"] for r in own]
    return {
        "row": row, "variant": name, "params": own[0]["params"], "runs": len(own),
        "loss": mean(loss), "lowest": min(loss), "highest": max(loss),
        "lower loss": sum(r["loss"] < b["loss"] for r, b in zip(own, base, strict=True)),
        "exact (%)": round(100 * mean(exact), 1), "min (%)": round(100 * min(exact), 1),
        "max (%)": round(100 * max(exact), 1),
        "more exact": sum(r["exact"] > b["exact"] for r, b in zip(own, base, strict=True)),
    }


table = pd.DataFrame([row_summary(row, name) for row, name, _ in MINIATURE_VARIATIONS])
table = table.set_index(["row", "variant"]).round(3)
lower = table["lower loss"].droplevel("row").drop(base_name)
better_everywhere = list(lower.index[lower == 10])
worse_everywhere = list(lower.index[lower == 0])
assert better_everywhere == ["h=8, d_k=d_v=4", "P_drop=0", "ε_ls=0", "learned positions"]
assert worse_everywhere == ["h=1, d_k=d_v=32", "d_model=16, d_k=d_v=4", "no positions (control)"]
print(f"{len(runs)} runs: {len(runs) // 12} per row, seeds 0-4 under the kernels "
      f"{sorted({r['kernels'] for r in runs})}")
table

# %% [markdown]
# The same runs as pictures: each run a point, coloured by its kernels, and each row's mean a
# black tick. Look for the rows whose points all lie on one side of the base model's: they are
# the findings; the others overlap it.

# %%
seeds_chart(runs, metric="loss", value_format=".2f",
            title="Held-out loss per token (nats) after 250 steps; lower is better")

# %%
seeds_chart(runs, metric="exact",
            title="Exact-match accuracy after 250 steps; higher is better")

# %% [markdown]
# ## What the miniature reproduces, and what it does not
#
# The rows with 10 or 0 under "lower loss" differ from the base model in every one of their
# pairs; the others split their pairs, which means no difference was found, not that there is none. Row by row against
# the paper:
#
# - **(A) Heads: reproduced in part.** One head is worse than four in every pair, in loss and
#   in exact matches, as in the paper; eight heads of width 4 are better in every pair, and two
#   heads split. That too many heads hurt does not appear: up to width 4, more heads did better.
# - **(B) Key size: not reproduced.** With $d_k = 2$ the loss is lower in 4 of 10 pairs: no
#   difference found.
# - **(C) Size: half.** The narrowest model, $d_{model} = 16$, is worse in every pair. One layer
#   splits its pairs, and so does $d_{model} = 64$ with nearly four times the parameters:
#   bigger was not reliably better at this budget.
# - **(D) Regularization: the opposite for dropout, half for label smoothing.** Without
#   dropout the model is far better in every pair, with about twice the base model's exact
#   matches. Without label smoothing the loss is lower in every pair, as the paper's perplexity
#   was; exact matches rise in only 8 of 10 pairs, no counterpart of the paper's BLEU gain.
# - **(E) Positions: not reproduced.** Learned positions beat sinusoids in every pair, where
#   the paper found them equal. Without any positions (the control) the loss is higher in
#   every pair: on this task they matter.
#
# One likely reason for row E, which this page does not test: over a sequence of at most 11
# positions, most of the sinusoids of $d_{model} = 32$ barely turn, so they tell neighbouring
# positions apart poorly, while a learned table gives each position a vector of its own:

# %%
omega = 10000.0 ** (-torch.arange(0, 32, 2) / 32)  # the 16 frequencies for d_model = 32
turns = 10 * omega  # radians turned between position 0 and position 10
quarter = int((turns > math.pi / 2).sum())
print(f"{quarter} of 16 frequencies turn by more than a quarter turn over 11 positions, "
      f"{16 - quarter} by less")

# %% [markdown]
# With $d_{model} = 512$ and sentences of dozens of tokens, the paper's sinusoids had many more
# frequencies to work with.
#
# **Noise.** A run this short is sensitive: look at each row's lowest and highest loss,
# furthest apart for $d_{model} = 64$. That is why a verdict rests on ten pairs.

# %% [markdown]
# ## Post-norm against pre-norm, with and without warm-up
#
# Chapters 2, 5 and 10 claimed, from gradients at initialization only, that the paper's
# post-norm model needs the learning-rate warm-up and that this book's pre-norm default
# depends on it less {cite}`xiong2020layer`. Here is the experiment, in the miniature's terms:
# the base model without dropout or label smoothing, five seeds under two kernel sets
# (`tools/seeds.py norm_warmup`; this page reruns seed 0). Four rows: post-norm or pre-norm
# (chapter 5's `make_model(..., norm_first=...)`), each with chapter 10's schedule and without
# warm-up, which starts at the schedule's peak and decays from there as the warmed-up schedule
# does after step 100. The peak is four times the variations' (`factor=2` against 0.5), a
# learning rate that the warm-up makes safe.

# %% nbval_reason="training losses; their digits vary with the CPU's float kernels." tags=["nbval-ignore-output"]
norm_seed_0 = {}
for norm_first in (False, True):
    for warmup in (True, False):
        name = f"{'pre' if norm_first else 'post'}-norm, {'warm-up' if warmup else 'no warm-up'}"
        norm_seed_0[name] = train_norm(norm_first, warmup, seed=0)
        print(f"{name:24s} held-out loss per token, seed 0: {norm_seed_0[name]:.2f}")
# bounds that all ten stored runs of each row met
assert norm_seed_0["post-norm, no warm-up"] > 1.8
assert max(norm_seed_0["post-norm, warm-up"], norm_seed_0["pre-norm, warm-up"]) < 1.0
assert norm_seed_0["pre-norm, warm-up"] < norm_seed_0["pre-norm, no warm-up"] < 1.8

# %%
import math

norm_runs = book_data("seeds_norm_warmup.json")["runs"]
for row in seed_summary(norm_runs, "loss"):
    print(f"{row['variant']:24s} {row['runs']} runs: mean {row['mean']:.2f}, "
          f"lowest {row['min']:.2f}, highest {row['max']:.2f}")
print(f"a uniform guess among the 10 digits and </s>: ln 11 = {math.log(11):.2f}")
by_row = {}  # variant -> {(seed, kernels): loss}
for run in norm_runs:
    by_row.setdefault(run["variant"], {})[run["seed"], run["kernels"]] = run["loss"]
with_warmup, without = by_row["pre-norm, warm-up"], by_row["pre-norm, no warm-up"]
assert all(with_warmup[pair] < without[pair] for pair in without)
broken = by_row.pop("post-norm, no warm-up").values()
assert min(broken) > 1.5 > max(max(row.values()) for row in by_row.values())

# %%
seeds_chart(norm_runs, metric="loss", value_format=".2f",
            title="Held-out loss per token after 250 steps, five seeds x two kernel sets")

# %% [markdown]
# What breaks is the post-norm model without warm-up, in every run: in eight of its ten the
# loss ends near $\ln 11$, the loss of a model that guesses uniformly among the ten digits and
# `</s>`; the other two (seed 4, under both kernel sets) end lower but far above every other
# row. Its first full-size steps throw it into a state it does not leave in 250 steps. With the
# warm-up, the same model learns. The pre-norm model learns in both cases: without warm-up it
# slows down rather than breaking, and with warm-up it does better in every pair. The cell
# asserts these verdicts on the stored runs, as the cell before it does on this machine's seed
# 0. Chapter 5's gradients at initialization predict this difference, and grow from the first
# post-norm layer to the last, which suggests a larger difference in a deeper model; this
# two-layer miniature does not test that.

# %% [markdown]
# ```{note}
# The classic Annotated Transformer did not try the variations of Table 3, and its
# `MultiHeadedAttention` ties $d_k = d_v = d_{model}/h$, so row B could not be built from it.
# ```
#
# ## What we have
#
# Two knobs on top of `make_model`: `KeySizeAttention`, which gives queries and keys their own
# width, and `make_variant`, which builds any row of Table 3 and can swap the position signal.
# With them, a miniature Table 3 of twelve variants, each trained from five seeds under two
# kernel sets. At 250 steps, in every pair of runs, it reproduces three of the paper's findings
# (one head is worse than four, a much narrower model is worse, label smoothing raises
# perplexity) and contradicts two on this task (dropout hurts on fresh data, learned positions
# beat sinusoids on short sequences); the other rows split their pairs. A miniature tests the
# machinery and shows what a short, cheap experiment can and cannot tell; the paper's
# conclusions come from a large corpus and long runs.
#
# One experiment of the paper is left, the one furthest from translation: the next chapter
# trains the same `make_model`, unchanged, to parse English sentences into trees (§6.3).
