# %% [markdown]
# # The full model
#
# Every part now exists: the stacks and sublayer connections of chapter 2, attention from
# chapter 3, feed-forward layers, embeddings and positional encodings from chapter 4. This
# chapter puts them together in one function, `make_model`, counts the parameters of the
# paper's two configurations against its Table 3, and runs the untrained model forwards,
# including a first, meaningless, translation.

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
    Decoder,
    DecoderLayer,
    Embeddings,
    Encoder,
    EncoderDecoder,
    EncoderLayer,
    Generator,
    MultiHeadedAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    enable_book_charts,
    line_chart,
    subsequent_mask,
)

enable_book_charts()

# %% [markdown]
# ## `make_model`
#
# The function takes the hyperparameters of the paper's Table 3, with the base model's values
# as defaults: $N = 6$ layers per stack, $d_\text{model} = 512$, $d_\text{ff} = 2048$, $h = 8$
# heads and dropout $P_\text{drop} = 0.1$. It builds one attention module, one feed-forward
# network and one positional encoding, and deep-copies them wherever the figure of chapter 2
# has a box, so that no two boxes share weights. Two keyword options go beyond the classic
# version:
#
# * `norm_first=True` (the default) builds the pre-norm model that the classic code built and
#   that trains more easily; `norm_first=False` builds the paper's post-norm model (chapter 2).
# * `share_embeddings=True` ties the source embedding, the target embedding and the generator's
#   weight into one matrix, as in the paper (§3.4, chapter 4). It requires one vocabulary for
#   both sides.
#
# Matrices are then initialized with Xavier's uniform distribution, which keeps the variance
# of activations roughly constant from layer to layer; biases and the layer norms keep their
# zeros and ones.

# %% tags=["export"]
from copy import deepcopy

import torch
from torch import nn


def make_model(
    src_vocab: int,
    tgt_vocab: int,
    N: int = 6,
    d_model: int = 512,
    d_ff: int = 2048,
    h: int = 8,
    dropout: float = 0.1,
    *,
    norm_first: bool = True,
    share_embeddings: bool = False,
) -> EncoderDecoder:
    """Build a Transformer from hyperparameters; defaults are the paper's base model."""
    if share_embeddings and src_vocab != tgt_vocab:
        raise ValueError(
            f"share_embeddings=True needs one vocabulary: src_vocab={src_vocab} "
            f"!= tgt_vocab={tgt_vocab}"
        )
    c = deepcopy
    attn = MultiHeadedAttention(h, d_model, dropout=dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout, norm_first=norm_first), N),
        Decoder(
            DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout, norm_first=norm_first), N
        ),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for p in model.parameters():
        if p.dim() > 1:  # matrices: Xavier/Glorot; biases and norms keep 0 and 1
            nn.init.xavier_uniform_(p)
    if share_embeddings:  # one (vocab, d_model) matrix, three uses (§3.4)
        shared = model.src_embed[0].lut.weight
        model.tgt_embed[0].lut.weight = shared
        model.generator.proj.weight = shared
    return model


# %% [markdown]
# ```{note}
# The classic Annotated Transformer showed weight sharing as a snippet that could not have
# worked. Its first line, `model.src_embed[0].lut.weight = model.tgt_embeddings[0].lut.weight`,
# names a `tgt_embeddings` attribute the model does not have (it is `tgt_embed`); its second,
# `model.generator.lut.weight = model.tgt_embed[0].lut.weight`, meant to tie the generator,
# names a `lut` the generator does not have (its layer is `proj`). Here sharing is an option of
# `make_model`, and a test checks that the three modules hold one `Parameter` and that gradients
# from all three uses add up in it.
# ```
#
# Sharing works because `nn.Embedding(vocab, d_model).weight` and
# `nn.Linear(d_model, vocab).weight` have the same shape, (vocab, $d_\text{model}$): the
# embedding reads a row per token, the generator takes a dot product of the decoder output
# with every row.

# %%
model = make_model(11, 11, N=2, share_embeddings=True)
print("one matrix for all three:",
      model.src_embed[0].lut.weight is model.tgt_embed[0].lut.weight is model.generator.proj.weight)
try:
    make_model(11, 12, share_embeddings=True)
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## Counting parameters
#
# Table 3 of the paper gives 65 million parameters for the base model and 213 million for the
# big one ($d_\text{model} = 1024$, $d_\text{ff} = 4096$, $h = 16$), both with the shared
# English-German vocabulary of about 37,000 tokens and tied embeddings. We count ours.
#
# The big model would take about a gigabyte of memory and several seconds of random
# initialization to build for real. We do not need its numbers, only its shapes, so we build it
# on PyTorch's `meta` device, where tensors have a shape and a dtype but no storage. The base
# model we build for real, to check that the meta count is the same as the real one.
# `model.parameters()` lists a shared parameter once, so tied weights are counted once.

# %%
import pandas as pd

vocab = 37_000
configs = {
    "base": {"N": 6, "d_model": 512, "d_ff": 2048, "h": 8},
    "big": {"N": 6, "d_model": 1024, "d_ff": 4096, "h": 16},
}
paper = {"base": 65e6, "big": 213e6}


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


torch.manual_seed(0)
real_base = count_parameters(make_model(vocab, vocab, **configs["base"], share_embeddings=True))
rows = []
for name, config in configs.items():
    with torch.device("meta"):
        tied = count_parameters(make_model(vocab, vocab, **config, share_embeddings=True))
        untied = count_parameters(make_model(vocab, vocab, **config))
    rows.append(
        {
            "model": name,
            **config,
            "parameters (tied)": f"{tied / 1e6:.1f}M",
            "paper, Table 3": f"{paper[name] / 1e6:.0f}M",
            "without tying": f"{untied / 1e6:.1f}M",
        }
    )
    if name == "base":
        assert tied == real_base, (tied, real_base)
print(f"base model built for real: {real_base:,} parameters (same as on the meta device)")
pd.DataFrame(rows).set_index("model")

# %% [markdown]
# Our counts come within a few percent of the paper's (63.1M against 65M, 214.3M against
# 213M), but the two gaps point in opposite directions: ours is smaller for the base model and
# larger for the big one. So the vocabulary, which the paper gives only as "about 37,000", cannot
# explain both. Each vocabulary entry costs $d_\text{model} + 1$ parameters (its row of the shared
# table and its bias in the generator), so we can ask what vocabulary each of the paper's counts
# would need, allowing for its rounding to the nearest million:

# %%
for name, config in configs.items():
    with torch.device("meta"):
        one_token = count_parameters(make_model(1, 1, **config, share_embeddings=True))
    per_token = config["d_model"] + 1
    low, high = (1 + (paper[name] + delta - one_token) / per_token for delta in (-0.5e6, 0.5e6))
    print(f"{name}: {paper[name] / 1e6:.0f}M needs a vocabulary of {low:,.0f} to {high:,.0f}")

# %% [markdown]
# The two ranges do not overlap, so no single vocabulary reproduces both of the paper's numbers
# with this architecture. The paper does not say what else went into its counts; what we know is
# that ours follow the architecture it describes and differ from its figures by about 3% (base)
# and 0.6% (big), in opposite directions. Tying matters: without it the base model would carry
# 38 million parameters more, 60% more in all, almost all of them in three copies of the same
# kind of table.
#
# Where do the base model's parameters sit? Per layer, attention has $4\,d_\text{model}^2$
# weights, the feed-forward network $2\,d_\text{model}\,d_\text{ff} = 8\,d_\text{model}^2$.

# %%
torch.manual_seed(0)
with torch.device("meta"):
    base = make_model(vocab, vocab, **configs["base"], share_embeddings=True)
groups = {"embedding (shared)": 0, "attention": 0, "feed-forward": 0, "layer norms": 0,
          "generator bias": 0}
for name, p in base.named_parameters():
    if "lut" in name:
        groups["embedding (shared)"] += p.numel()
    elif "attn" in name:
        groups["attention"] += p.numel()
    elif "feed_forward" in name:
        groups["feed-forward"] += p.numel()
    elif "norm" in name:
        groups["layer norms"] += p.numel()
    else:
        groups["generator bias"] += p.numel()
total = sum(groups.values())
for group, n in groups.items():
    print(f"{group:>20}: {n:>11,}  {100 * n / total:5.1f}%")

# %% [markdown]
# ## A forward pass
#
# A small model on a toy vocabulary of 11 tokens runs in a blink. The source is a batch of two
# sentences; the second one is shorter and padded with token 0, which the source mask hides.
# The target mask combines the target's own padding with the `subsequent_mask`. In chapter 7
# we wrap all of this in a `Batch` class.

# %%
torch.manual_seed(0)
model = make_model(src_vocab=11, tgt_vocab=11, N=2).eval()
pad = 0
src = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8], [1, 5, 7, 9, 2, pad, pad, pad]])  # (batch, n_src)
tgt = torch.tensor([[1, 2, 3, 4, 5], [1, 5, 7, pad, pad]])  # (batch, n_tgt)
src_mask = (src != pad).unsqueeze(-2)  # (batch, 1, n_src)
tgt_mask = (tgt != pad).unsqueeze(-2) & subsequent_mask(tgt.size(1))  # (batch, n_tgt, n_tgt)
with torch.no_grad():
    memory = model.encode(src, src_mask)
    out = model.decode(memory, src_mask, tgt, tgt_mask)
    log_probs = model.generator(out)
assert memory.shape == (2, 8, 512)
assert out.shape == (2, 5, 512) and torch.equal(out, model(src, tgt, src_mask, tgt_mask))
assert log_probs.shape == (2, 5, 11)
assert torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 5))
print("memory", tuple(memory.shape), "| decoder output", tuple(out.shape),
      "| log-probabilities", tuple(log_probs.shape))

# %% [markdown]
# The mask is what makes training in parallel honest: the decoder's output at position $i$
# must not change when the target tokens after $i$ change. We change the last two target
# tokens and compare:

# %%
tgt_changed = tgt.clone()
tgt_changed[0, 3:] = torch.tensor([9, 10])
with torch.no_grad():
    out_changed = model(src, tgt_changed, src_mask, tgt_mask)
print("positions 0-2 unchanged:", torch.allclose(out[0, :3], out_changed[0, :3], atol=1e-6))
print("position 3 changed:", not torch.allclose(out[0, 3], out_changed[0, 3]))

# %% [markdown]
# Position 3's output changes because token 3 itself changed; positions 0 to 2 do not see it.

# %% [markdown]
# ## One sentence through the model, shape by shape
#
# Every tensor in the model has one of a handful of shapes, and following a single sentence
# through the whole stack shows which. We take the first source sentence above, cut to 6
# tokens, and its target of 5, so that no two sizes coincide: $n_{src} = 6$, $n_{tgt} = 5$,
# $h = 8$ heads of $d_k = 64$, $d_\text{model} = 512$, $d_\text{ff} = 2048$ and a vocabulary of
# 11. A forward hook on each module we name records the shape of what it returns, in the order
# the modules run; the attention modules also report the shape of their weights.

# %%
one_src, one_tgt = src[:1, :6], tgt[:1]  # (1, n_src = 6) and (1, n_tgt = 5)
one_src_mask = torch.ones(1, 1, 6, dtype=torch.bool)  # (1, 1, n_src): no padding
one_tgt_mask = subsequent_mask(5)  # (1, n_tgt, n_tgt)
enc, dec = model.encoder.layers[0], model.decoder.layers[0]
watched = {
    "source embedding (x sqrt(d_model))": model.src_embed[0],
    "+ positional encoding": model.src_embed[1],
    "encoder 1: self-attention W^Q": enc.self_attn.linears[0],
    "encoder 1: self-attention": enc.self_attn,
    "encoder 1: feed-forward, inner": enc.feed_forward.w_1,
    "encoder 1: feed-forward": enc.feed_forward,
    "memory (2 layers, final norm)": model.encoder,
    "target embedding + positions": model.tgt_embed,
    "decoder 1: self-attention": dec.self_attn,
    "decoder 1: attention to memory": dec.src_attn,
    "decoder 1: feed-forward": dec.feed_forward,
    "decoder output": model.decoder,
    "generator: log-probabilities": model.generator,
}
shapes = []


def record(label: str):
    """A forward hook that notes the shape of a module's output (and of attention weights)."""
    def hook(module: nn.Module, inputs, output: torch.Tensor) -> None:
        shapes.append((label, tuple(output.shape)))
        if isinstance(module, MultiHeadedAttention):
            shapes.append((f"{label}: weights", tuple(module.attn.shape)))
    return hook


handles = [module.register_forward_hook(record(label)) for label, module in watched.items()]
with torch.no_grad():
    model.generator(model(one_src, one_tgt, one_src_mask, one_tgt_mask))
for handle in handles:
    handle.remove()
for label, shape in shapes:  # in the order the modules ran; layer 2 repeats layer 1
    print(f"{label:>42}  {shape}")
assert dict(shapes) == {
    "source embedding (x sqrt(d_model))": (1, 6, 512),
    "+ positional encoding": (1, 6, 512),
    "encoder 1: self-attention W^Q": (1, 6, 512),
    "encoder 1: self-attention: weights": (1, 8, 6, 6),
    "encoder 1: self-attention": (1, 6, 512),
    "encoder 1: feed-forward, inner": (1, 6, 2048),
    "encoder 1: feed-forward": (1, 6, 512),
    "memory (2 layers, final norm)": (1, 6, 512),
    "target embedding + positions": (1, 5, 512),
    "decoder 1: self-attention: weights": (1, 8, 5, 5),
    "decoder 1: self-attention": (1, 5, 512),
    "decoder 1: attention to memory: weights": (1, 8, 5, 6),
    "decoder 1: attention to memory": (1, 5, 512),
    "decoder 1: feed-forward": (1, 5, 512),
    "decoder output": (1, 5, 512),
    "generator: log-probabilities": (1, 5, 11),
}

# %% [markdown]
# Between the projection $W^Q$ and the weights sits the one reshaping that multi-head attention
# needs: the (1, 6, 512) queries are viewed as (1, 6, 8, 64) and transposed to (1, 8, 6, 64),
# one (6, 64) matrix per head, and after attention the heads are put back side by side into
# (1, 6, 512) for $W^O$. Everything else keeps the shape (batch, positions, $d_\text{model}$):
# that is what lets the layers stack and the residual connections add. Only two shapes depend
# on both sequences: the decoder's attention to the memory is $n_{tgt} \times n_{src}$ per
# head, (5, 6), and the generator's output has one row of 11 log-probabilities per target
# position.

# %% [markdown]
# ## Pre-norm and post-norm, at initialization
#
# Chapter 2 said that where the layer norm sits changes how the untrained model's gradients
# are spread over its layers. We can look. We build the pre-norm and the post-norm model from
# the same seed (8 layers per stack, $d_\text{model} = 128$, no dropout), compute the loss on
# one batch of random tokens, and measure the gradient of each layer's weight matrices.

# %%
import torch.nn.functional as F

V, n, batch, N = 500, 20, 8, 8
g = torch.Generator().manual_seed(0)
random_src, random_tgt, random_gold = (torch.randint(1, V, (batch, n), generator=g) for _ in "abc")
rows = []
for norm_first in (True, False):
    torch.manual_seed(0)
    deep = make_model(V, V, N=N, d_model=128, d_ff=512, h=4, dropout=0.0, norm_first=norm_first)
    out = deep(random_src, random_tgt, torch.ones(batch, 1, n, dtype=torch.bool),
               subsequent_mask(n))
    loss = F.nll_loss(deep.generator(out).reshape(-1, V), random_gold.reshape(-1))
    loss.backward()
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(deep, stack).layers, start=1):
            squares = sum(p.grad.pow(2).sum() for p in layer.parameters() if p.dim() > 1)
            rows.append({
                "stack": stack, "layer": i, "gradient norm": round(squares.sqrt().item(), 3),
                "model": "pre-norm" if norm_first else "post-norm (paper)",
            })
line_chart(rows, x="layer:O", y="gradient norm:Q", color="model:N", column="stack:N",
           x_title="layer (1 = nearest the input)",
           y_title="gradient norm of the layer's matrices", width=220, height=180,
           title="Gradients at initialization")

# %% [markdown]
# In the post-norm decoder, the stack whose top feeds the output layer, the gradient grows
# sixteenfold from the first layer (0.06) to the last (1.01). {cite:t}`xiong2020layer` derive
# this effect and argue that it is why post-norm Transformers need a learning-rate warm-up
# (chapter 10): at full learning rate, the large gradients near the output would make steps
# too big for the top layers. In the pre-norm model the gradients stay within a factor of
# about 2.5 of each other, decreasing slowly with depth, and {cite:t}`xiong2020layer` train
# such models without warm-up. Gradients at initialization are only a prediction; chapter 19
# trains both models on the sort task, with and without warm-up, and the post-norm model
# without warm-up is the one that fails to learn.
#
# ## Greedy decoding
#
# To translate, the model generates one token at a time. It starts from the start symbol,
# runs the decoder over the tokens so far, takes the most likely next token from the
# generator's output at the last position, appends it, and repeats. The source is encoded only
# once. This is *greedy* decoding: it keeps one hypothesis and never reconsiders a choice. (The
# paper used beam search, which keeps several; greedy decoding is simpler and close enough for
# this book's purposes.)
#
# Our `greedy_decode` decodes a whole batch at once. Sentences finish at different steps; once
# a sentence has produced `end_symbol`, it is padded with `end_symbol` while the others go on,
# and the loop stops when all of them have finished, or after `max_len` tokens.
#
# Decoding recomputes the decoder over the whole prefix at every step, so it costs
# $O(n^2)$ decoder positions for $n$ tokens. Production implementations cache each layer's keys
# and values to avoid that; chapter 21 does so (`greedy_decode(..., use_cache=True)`), and
# the simple version here is the one to read.

# %% tags=["export"]
import math
from collections.abc import Sequence


def greedy_decode(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol: int | None = None,
    *,
    use_cache: bool = False,
    banned: Sequence[int] = (),
) -> torch.Tensor:
    """Most likely token at each step for a batch; (batch, <= max_len) ids from start_symbol.

    A sequence that has produced `end_symbol` is padded with `end_symbol` until all have ended.
    Ids in banned are never chosen (chapter 14 bans <s>, padding and <unk>). use_cache=True
    gives the same ids with chapter 21's key/value cache, one step per token.
    """
    if src.dim() != 2:
        raise ValueError(f"src must have shape (batch, n_src), got {tuple(src.shape)}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1 (the start symbol), got {max_len}")
    if use_cache:  # defined in chapter 21, which builds on this chapter
        return cached_greedy_decode(  # noqa: F821
            model, src, src_mask, max_len, start_symbol, end_symbol, banned=banned
        )
    batch = src.size(0)
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (batch, n_src, d_model), computed once
        ys = torch.full((batch, 1), start_symbol, dtype=torch.long, device=src.device)
        done = torch.zeros(batch, dtype=torch.bool, device=src.device)
        for _ in range(max_len - 1):
            tgt_mask = subsequent_mask(ys.size(1)).to(src.device)  # (1, n, n)
            out = model.decode(memory, src_mask, ys, tgt_mask)  # (batch, n, d_model)
            log_probs = model.generator(out[:, -1])  # (batch, vocab)
            log_probs[:, list(banned)] = -math.inf
            next_word = log_probs.argmax(dim=-1)  # (batch,)
            if end_symbol is not None:
                next_word = next_word.masked_fill(done, end_symbol)
                done = done | (next_word == end_symbol)
            ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)  # (batch, n + 1)
            if end_symbol is not None and bool(done.all()):
                break
    return ys


# %% [markdown]
# Decoding does not set the model to evaluation mode; the caller does (`model.eval()`), so that
# dropout is off. Here the untrained model "translates" the two source sentences:

# %%
torch.manual_seed(0)
model = make_model(src_vocab=11, tgt_vocab=11, N=2).eval()
print(greedy_decode(model, src, src_mask, max_len=10, start_symbol=1))


# %% [markdown]
# The output is noise: the model has not been trained, so it tends to repeat whichever
# tokens its random weights happen to favour. Part II trains it; chapter 12 teaches the same
# small model to copy its input, and greedy decoding then returns the source.
#
# ## What we have, and what comes next
#
# `make_model` builds the whole Transformer, pre-norm or post-norm, with or without tied
# embeddings, in the sizes of the paper, whose parameter counts we match within a few percent.
# `greedy_decode` turns a trained model into a translator for a whole batch. What we do not
# have yet is a reason to believe in the design; the next chapter compares self-attention with
# recurrent and convolutional layers, as the paper's section 4 does, before Part II trains the
# model.

# %% [markdown]
# ## Exercises
#
# 1. **The count, by formula.** Write `tied_parameters(vocab, N, d_model, d_ff)`, the number of
#    parameters of `make_model(vocab, vocab, N, d_model, d_ff, share_embeddings=True)` (the
#    default pre-norm model), from the parts: one shared table, $N$ encoder layers (attention,
#    feed-forward, two layer norms), $N$ decoder layers (two attentions, feed-forward, three
#    norms), the final norm of each stack, and the generator's bias. The check builds models on
#    the meta device and compares.
# 2. **Where greedy goes wrong.** Greedy decoding keeps only the most probable next token.
#    Construct two steps of next-token probabilities for which the most probable two-token
#    output is not the one greedy decoding returns. What does chapter 15 do about it?
#
# ```{dropdown} Answer to 2
# Let the first step give "a" 0.6 and "b" 0.4; after "a" the best next token has probability
# 0.5, after "b" 0.9. Greedy takes "a" and ends with $0.6 \times 0.5 = 0.30$; "b" then its best
# token has $0.4 \times 0.9 = 0.36$. Beam search (chapter 15) keeps the $k$ best prefixes at
# each step instead of one, and finds the second output with $k \ge 2$.
# ```

# %% tags=["hide-cell"]
# Exercise 1: our solution (hidden in the book). Replace the body with yours.
def tied_parameters(vocab: int, N: int, d_model: int, d_ff: int) -> int:
    """Parameters of the pre-norm model with one shared embedding table."""
    attention = 4 * (d_model * d_model + d_model)  # W^Q, W^K, W^V, W^O with biases
    feed_forward = 2 * d_model * d_ff + d_ff + d_model
    norm = 2 * d_model  # gain and bias
    encoder = N * (attention + feed_forward + 2 * norm) + norm
    decoder = N * (2 * attention + feed_forward + 3 * norm) + norm
    return vocab * d_model + encoder + decoder + vocab  # table, stacks, generator bias


# %%
# Check exercise 1
for vocab, N, d_model, d_ff, h in ((37_000, 6, 512, 2048, 8), (11, 2, 32, 64, 4)):
    with torch.device("meta"):
        built = make_model(vocab, vocab, N, d_model, d_ff, h, share_embeddings=True)
    assert tied_parameters(vocab, N, d_model, d_ff) == count_parameters(built), (vocab, N)
print("exercise 1: correct")
