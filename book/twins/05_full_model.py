# %% [markdown]
# # The full model
#
# **The paper, §3 and Table 3.** The parts of §3 make up the model of the paper's Figure 1. Its
# base configuration has $N = 6$ layers per stack, $d_\text{model} = 512$, $d_\text{ff} = 2048$,
# $h = 8$ heads and dropout $P_\text{drop} = 0.1$: 65 million parameters.

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
# `make_model` takes the hyperparameters of Table 3, the base sizes as defaults. Each box of
# chapter 2's figure gets its own deep copy of a module, and the matrices start from Xavier's
# uniform distribution, as in the classic version (the paper does not give its initialization).
#
#
# ```{admonition} The defaults: pre-norm, untied
# The defaults build chapter 2's pre-norm layers (`norm_first=True`) with separate embeddings.
# `norm_first=False, share_embeddings=True` builds the paper's architecture; `paper_dropout_only`
# (chapter 21) then removes the dropout on attention weights and feed-forward hidden units, which
# the paper does not have. The training presets build pre-norm models, for the reason the gradient
# chart below illustrates, and the subword ones tie the embeddings ({doc}`departures`).
# ```

# %% tags=["export"]
from copy import deepcopy

import torch
from torch import nn


def make_model(src_vocab: int, tgt_vocab: int, N: int = 6, d_model: int = 512, d_ff: int = 2048,
               h: int = 8, dropout: float = 0.1, *, norm_first: bool = True,
               share_embeddings: bool = False) -> EncoderDecoder:
    """A Transformer. Defaults: the paper's base sizes (N=6, d_model=512, d_ff=2048, h=8,
    dropout=0.1), but pre-norm layers and separate embeddings, unlike the paper's model. Dropout
    also falls on the attention weights and feed-forward hidden units (the classic's sites, not
    the paper's; paper_dropout_only turns it off there)."""
    if share_embeddings and src_vocab != tgt_vocab:
        raise ValueError(f"share_embeddings=True needs one vocabulary: src_vocab={src_vocab} "
                         f"!= tgt_vocab={tgt_vocab}")
    c = deepcopy
    attn = MultiHeadedAttention(h, d_model, dropout=dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout, norm_first=norm_first), N),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout, norm_first=norm_first), N),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for p in model.parameters():  # biases keep nn.Linear's U(±1/sqrt(fan_in)), norms 1 and 0
        if p.dim() > 1:  # matrices: Xavier/Glorot
            nn.init.xavier_uniform_(p)
    if share_embeddings:  # one (vocab, d_model) matrix, three uses (§3.4)
        shared = model.src_embed[0].lut.weight
        model.tgt_embed[0].lut.weight = shared
        model.generator.proj.weight = shared
    return model


# %% [markdown]
# ```{note}
# The classic Annotated Transformer showed weight sharing as a snippet naming attributes its model
# lacks; here it is an option.
# ```

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
# Table 3 gives 65 million parameters for the base model and 213 million for the big one, with a
# shared vocabulary of about 37,000 tokens (§5.1). We count on PyTorch's `meta` device (shapes,
# no storage) and check the base count on a real model:

# %% tags=["export"]
def count_parameters(model: nn.Module) -> int:
    """The entries a model trains; `parameters()` lists a shared matrix once."""
    return sum(p.numel() for p in model.parameters())


# %%
import pandas as pd

vocab = 37_000
configs = {"base": {"N": 6, "d_model": 512, "d_ff": 2048, "h": 8},
           "big": {"N": 6, "d_model": 1024, "d_ff": 4096, "h": 16}}
paper = {"base": "65M", "big": "213M"}
torch.manual_seed(0)
real_base = count_parameters(make_model(vocab, vocab, **configs["base"], share_embeddings=True))
rows = {}
for name, config in configs.items():
    with torch.device("meta"):
        tied = count_parameters(make_model(vocab, vocab, **config, share_embeddings=True))
        untied = count_parameters(make_model(vocab, vocab, **config))
    rows[name] = {**config, "parameters (tied)": f"{tied / 1e6:.1f}M",
                  "paper, Table 3": paper[name], "without tying": f"{untied / 1e6:.1f}M"}
    assert name != "base" or tied == real_base, (tied, real_base)
print(f"base model built for real: {real_base:,} parameters (the meta count agrees)")
pd.DataFrame.from_dict(rows, orient="index").rename_axis("model")

# %% [markdown]
# Look at the two gaps: our count is below the paper's for the base model and above it for the big
# one. A different vocabulary would move both counts the same way, so it cannot explain both, and
# the paper does not say what else it counted.
# Per layer, attention has $4\,d_\text{model}^2$ weights and the feed-forward network
# $2\,d_\text{model}\,d_\text{ff} = 8\,d_\text{model}^2$ (plus biases); an encoder layer has one
# attention, a decoder layer two.

# %%
with torch.device("meta"):
    base = make_model(vocab, vocab, **configs["base"], share_embeddings=True)
groups = {"lut": "embedding (shared)", "attn": "attention", "feed_forward": "feed-forward",
          "norm": "layer norms", "generator": "generator bias"}  # a word of each name: its group
sizes = dict.fromkeys(groups.values(), 0)
for name, p in base.named_parameters():
    sizes[next(group for word, group in groups.items() if word in name)] += p.numel()
for group, n in sizes.items():
    print(f"{group:>20}: {n:>11,}  {100 * n / real_base:5.1f}%")

# %% [markdown]
# ## A forward pass
#
# A model of two layers per stack runs on a toy vocabulary of 11 tokens, with the special ids of
# the next cell. The second source sentence is padded with `PAD_ID`, which the source mask hides;
# each target starts with `BOS_ID`, and its mask combines its own padding with `subsequent_mask`.

# %% tags=["export"]
# The ids of <s>, </s>, <blank> (padding) and <unk> in the translation vocabularies (chapter 9's
# order); the toy tasks of chapters 12 and 13 have no <unk> and give id 3 to a symbol
BOS_ID, EOS_ID, PAD_ID, UNK_ID = 0, 1, 2, 3

# %%
torch.manual_seed(0)
model = make_model(src_vocab=11, tgt_vocab=11, N=2).eval()
src = torch.tensor([[4, 5, 6, 7, 8, 9, 10, 4], [5, 7, 9, 6, 8, PAD_ID, PAD_ID, PAD_ID]])
tgt = torch.tensor([[BOS_ID, 4, 5, 6, 7], [BOS_ID, 5, 7, PAD_ID, PAD_ID]])  # (batch, n_tgt)
src_mask = (src != PAD_ID).unsqueeze(-2)  # (batch, 1, n_src)
tgt_mask = (tgt != PAD_ID).unsqueeze(-2) & subsequent_mask(tgt.size(1))  # (batch, n_tgt, n_tgt)
with torch.no_grad():
    memory = model.encode(src, src_mask)
    out = model.decode(memory, src_mask, tgt, tgt_mask)
    log_probs = model.generator(out)
assert memory.shape == (2, 8, 512)
assert out.shape == (2, 5, 512) and torch.equal(out, model(src, tgt, src_mask, tgt_mask))
assert log_probs.shape == (2, 5, 11)
assert model.decoder.layers[0].src_attn.attn.shape == (2, 8, 5, 8)  # (batch, h, n_tgt, n_src)
assert torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 5))
print("memory", tuple(memory.shape), "| decoder output", tuple(out.shape),
      "| log-probabilities", tuple(log_probs.shape))

# %% [markdown]
# The mask is what makes training in parallel honest: the decoder's output at position $i$ must
# not change when later target tokens do. We change the last two:

# %%
tgt_changed = tgt.clone()
tgt_changed[0, 3:] = torch.tensor([9, 10])
with torch.no_grad():
    out_changed = model(src, tgt_changed, src_mask, tgt_mask)
print("positions 0-2 unchanged:", torch.allclose(out[0, :3], out_changed[0, :3], atol=1e-6))
print("position 3 changed:", not torch.allclose(out[0, 3], out_changed[0, 3]))

# %% [markdown]
# Position 3 changes because token 3 itself changed; positions 0 to 2 do not see it.

# %% [markdown]
# ## Pre-norm and post-norm, at initialization
#
# The cell builds a deeper, narrower model with each norm placement from one seed, and measures
# how its layers' gradients spread on one batch of random tokens.

# %%
import torch.nn.functional as F

V, n, batch, N = 500, 20, 8, 8
g = torch.Generator().manual_seed(0)
random_src, random_tgt, random_gold = (torch.randint(1, V, (batch, n), generator=g) for _ in "abc")
rows = []
for norm_first, name in ((True, "pre-norm"), (False, "post-norm (paper)")):
    torch.manual_seed(0)
    deep = make_model(V, V, N=N, d_model=128, d_ff=512, h=4, dropout=0.0, norm_first=norm_first)
    out = deep(random_src, random_tgt, torch.ones(batch, 1, n, dtype=torch.bool),
               subsequent_mask(n))
    loss = F.nll_loss(deep.generator(out).reshape(-1, V), random_gold.reshape(-1))
    loss.backward()
    for stack in ("encoder", "decoder"):
        for i, layer in enumerate(getattr(deep, stack).layers, start=1):
            squares = sum(p.grad.pow(2).sum() for p in layer.parameters() if p.dim() > 1)
            norm = round(squares.sqrt().item(), 3)
            rows.append({"stack": stack, "layer": i, "gradient norm": norm, "model": name})
line_chart(rows, x="layer:O", y="gradient norm:Q", color="model:N", column="stack:N",
           x_title="layer (1 = nearest the input)", width=220, height=180,
           y_title="gradient norm of the layer's matrices", title="Gradients at initialization")

# %% [markdown]
# Look at the post-norm decoder, whose top feeds the output layer: its gradients grow about
# sixteenfold from the first layer to the last, while the pre-norm model's fall by less than a
# factor of three. {cite:t}`xiong2020layer` derive this effect and argue that it is why post-norm
# Transformers need a learning-rate warm-up (chapter 10) and pre-norm ones can do without. One
# seed at initialization is a demonstration, not a finding about training; chapter 19 tests the
# consequence on several seeds.
#
# ## Greedy decoding
#
# To translate, the model encodes the source once, starts the target with the start symbol, and
# appends the decoder's most likely next token until the end. This *greedy* decoding never
# reconsiders a choice (the paper used beam search, chapter 15). `greedy_decode` works on a batch:
# a sentence that has ended is padded with `end_symbol` until all have ended or `max_len` tokens
# stand. Call `model.eval()` first, to turn dropout off.

# %% tags=["export"]
def greedy_decode(model: EncoderDecoder, src: torch.Tensor, src_mask: torch.Tensor, max_len: int,
                  start_symbol: int, end_symbol: int | None = None) -> torch.Tensor:
    """The most likely token at each step, for a batch: (batch, <= max_len) ids."""
    if src.dim() != 2:
        raise ValueError(f"src must have shape (batch, n_src), got {tuple(src.shape)}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1 (the start symbol), got {max_len}")
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (batch, n_src, d_model), computed once
        ys = torch.full((src.size(0), 1), start_symbol, dtype=torch.long, device=src.device)
        done = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)  # ended sentences
        for _ in range(max_len - 1):
            tgt_mask = subsequent_mask(ys.size(1)).to(src.device)  # (1, n, n)
            out = model.decode(memory, src_mask, ys, tgt_mask)  # (batch, n, d_model)
            next_word = model.generator(out[:, -1]).argmax(dim=-1)  # (batch,)
            if end_symbol is not None:  # an ended sentence is padded with end_symbol
                next_word = next_word.masked_fill(done, end_symbol)
                done = done | (next_word == end_symbol)
            ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)  # (batch, n + 1)
            if bool(done.all()):
                break
    return ys


# %%
torch.manual_seed(0)
model = make_model(src_vocab=11, tgt_vocab=11, N=2).eval()
print(greedy_decode(model, src, src_mask, max_len=10, start_symbol=BOS_ID, end_symbol=EOS_ID))


# %% [markdown]
# The untrained model's "translation" is noise, repeating whichever tokens its random weights
# favour. Chapter 12 trains a much smaller model of the same shape to copy its input.
#
# ## What we have, and what comes next
#
# The whole Transformer runs; the next chapter weighs self-attention against recurrence and
# convolution (§4).

# %% [markdown]
# ## Exercises
#
# 1. **The count, by formula.** Write `tied_parameters(vocab, N, d_model, d_ff)`, the parameters
#    of `make_model(vocab, vocab, N, d_model, d_ff, share_embeddings=True)` from its parts: one
#    shared table, $N$ encoder and $N$ decoder layers (with two and three layer norms), a final
#    norm per stack and the generator's bias. The check counts built models.
# 2. **Where greedy goes wrong.** Construct two steps of next-token probabilities for which the
#    most probable two-token output is not greedy decoding's. What does chapter 15 do about it?
#
# ```{dropdown} Answer to 2
# Let the first step give "a" 0.6 and "b" 0.4; after "a" the best next token has probability 0.5,
# after "b" 0.9. Greedy takes "a" and ends with $0.6 \times 0.5 = 0.30$; "b" then its best token
# has $0.4 \times 0.9 = 0.36$. Beam search (chapter 15) keeps the $k$ best prefixes at each step,
# and finds the second with $k \ge 2$.
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
