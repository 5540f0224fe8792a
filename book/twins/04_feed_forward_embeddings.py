# %% [markdown]
# # Feed-forward layers, embeddings and positions
#
# Attention mixes information *between* positions. Three simpler parts complete a layer and the
# model's input (paper §3.3 to §3.5): a small network applied to each position on its own, the
# embeddings that turn token ids into vectors (and vectors back into token scores), and the
# positional encodings that tell an otherwise order-blind model where each token stands.

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

from the_annotated_transformer import MultiHeadedAttention, enable_book_charts, line_chart

enable_book_charts()

# %% [markdown]
# ## The position-wise feed-forward network
#
# After attention has gathered information from other positions, each layer processes every
# position separately with the same two-layer network, a linear map up to a wider space, a
# ReLU, and a linear map back down:
#
# $$ \mathrm{FFN}(x) = \max(0,\, x W_1 + b_1)\, W_2 + b_2 . $$
#
# "Position-wise" means that the same weights are applied at every position, like a
# convolution with a kernel of width 1, and that positions do not interact here. In the base
# model $d_\text{model} = 512$ and the inner width is $d_\text{ff} = 2048$. Two thirds of the
# parameters of an encoder layer sit in this network, and later analyses of trained language
# models suggest that much of what they memorise is stored there {cite}`geva2021transformer`.
# The dropout between the two layers is the classic implementation's choice;
# the paper only mentions dropout on sublayer outputs.

# %% tags=["export"]
import torch
from torch import nn


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two-layer MLP at every position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, n, d_model) -> (batch, n, d_ff) -> (batch, n, d_model)."""
        return self.w_2(self.dropout(self.w_1(x).relu()))


# %% [markdown]
# Since positions do not interact, running the network on a whole sequence must give the same
# result as running it on each position alone:

# %%
torch.manual_seed(0)
ffn = PositionwiseFeedForward(d_model=16, d_ff=64, dropout=0.0)
x = torch.randn(2, 5, 16)
one_at_a_time = torch.stack([ffn(x[:, i]) for i in range(5)], dim=1)
print("output:", tuple(ffn(x).shape))
print("same as one position at a time:", torch.allclose(ffn(x), one_at_a_time, atol=1e-6))

# %% [markdown]
# In the base model the feed-forward network holds twice the parameters of the attention
# sublayer next to it:

# %%
n_ffn = sum(p.numel() for p in PositionwiseFeedForward(512, 2048).parameters())
n_attn = sum(p.numel() for p in MultiHeadedAttention(8, 512).parameters())
print(f"feed-forward: {n_ffn:,}  self-attention: {n_attn:,}  ratio: {n_ffn / n_attn:.2f}")

# %% [markdown]
# ## Embeddings, scaled by $\sqrt{d_\text{model}}$
#
# Token ids are indices into a vocabulary. An embedding is a learned table with one row of
# width $d_\text{model}$ per token; looking up a token is reading its row. The paper multiplies
# the rows by $\sqrt{d_\text{model}}$ and does not say why. Nor does it say how the table is
# initialized, and any reason for the factor depends on that. The positional encodings added
# next have entries between $-1$ and $1$ (root mean square $1/\sqrt{2} \approx 0.71$). The
# authors' tensor2tensor code {cite}`vaswani2018tensor2tensor` draws the table's entries from a
# normal distribution with standard deviation $d_\text{model}^{-1/2}$, so each row has a norm
# of about 1. That suits the output layer, when the same table serves as one (next section): a
# decoder output with entries of variance 1 then gives first logits of order 1, not
# overconfident ones. On the input side the factor turns the same rows into entries of variance
# about 1, on the scale of the positional encodings, so that neither the token nor its
# position drowns the other. Chapter 5 follows the classic Annotated Transformer instead and
# uses Xavier initialization, whose entries have a standard deviation of
# $\sqrt{2/(\text{vocab} + d_\text{model})}$, under 0.01 for the paper's vocabulary; there the
# factor narrows the gap to the positional encodings without closing it.

# %% tags=["export"]
class Embeddings(nn.Module):
    """A learned vector per token id, scaled by sqrt(d_model)."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model
        self.vocab = vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, n) -> vectors (batch, n, d_model)."""
        if x.is_floating_point() or x.is_complex():
            raise TypeError(f"token ids must be an integer tensor, got dtype {x.dtype}")
        if x.numel() and (x.min() < 0 or x.max() >= self.vocab):
            bad = x[(x < 0) | (x >= self.vocab)][0].item()
            raise ValueError(f"token id {bad} is outside the vocabulary [0, {self.vocab})")
        return self.lut(x) * self.d_model**0.5  # (batch, n, d_model)


# %%
torch.manual_seed(0)
embed = Embeddings(d_model=512, vocab=37_000)
nn.init.xavier_uniform_(embed.lut.weight)  # the initialization of chapter 5
vectors = embed(torch.arange(100).unsqueeze(0))  # (1, 100, 512)
rms = embed.lut.weight[:100].pow(2).mean().sqrt().item()
print(f"root mean square of an entry: table {rms:.4f}, scaled {vectors.pow(2).mean().sqrt():.3f}")
try:
    embed(torch.tensor([[1, 2, 37_000]]))
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# The factor turns Xavier's entries of about 0.007 into about 0.17: still below the 0.71 of the
# positional signal, but within a factor of four rather than a hundred. Entries drawn as
# tensor2tensor draws them would come out at about 1. Token ids outside the table are refused
# with a `ValueError` that names the id, rather than the bare `IndexError` (on a GPU, a
# device-side assertion) that `nn.Embedding` would raise.

# %% [markdown]
# ## Sharing the embedding with the output layer
#
# The model has three matrices of shape (vocab, $d_\text{model}$): the source embedding, the
# target embedding, and the weight of the generator's linear layer, which scores every
# vocabulary entry against the decoder's output. The paper (§3.4) uses one matrix for all
# three, following {cite:t}`press2017using`. The output layer and the target embedding both
# describe what a token "means" in the same $d_\text{model}$-dimensional space, one for
# reading it and one for predicting it, so tying them is natural; {cite:t}`press2017using`
# found that it improves perplexity and removes a large block of parameters. Sharing the
# *source* embedding as well needs one vocabulary for both languages, which the paper had: a
# shared byte-pair vocabulary {cite}`sennrich2016neural` of about 37,000 tokens for English
# and German. With that vocabulary the table holds $37{,}000 \times 512 \approx 19$ million
# parameters, close to a third of the base model; tying three copies into one saves about 38
# million. Chapter 5's `make_model(..., share_embeddings=True)` does the tying.

# %% [markdown]
# ## Positional encoding
#
# Attention treats its keys as a set: permute the source tokens and every encoder output is
# permuted the same way, but otherwise unchanged. Word order must therefore be put into the
# input. The paper adds to each embedding a vector that depends only on the position $pos$,
# made of sines and cosines of geometrically spaced frequencies:
#
# $$
# PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right), \qquad
# PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right).
# $$
#
# Dimension pair $i$ is a clock turning at angular speed $\omega_i = 10000^{-2i/d_\text{model}}$
# radians per position: the first pair turns once every $2\pi \approx 6.3$ positions, the last
# one almost once every $2\pi \cdot 10000 \approx 63{,}000$ positions, and the periods in
# between form a geometric progression. Together they tell positions apart at every scale, the
# way the hands of a clock do: the fast pairs distinguish neighbours, the slow ones say roughly
# where in a long sentence a token is. We compute the table once, up to `max_len`
# positions, and store it as a buffer (a tensor that moves with the module between devices but
# is not trained). Dropout on the sum is the paper's dropout on the embeddings (§5.4).

# %% tags=["export"]
class PositionalEncoding(nn.Module):
    """Add the sinusoidal position signal of §3.5 to embeddings, then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.max_len = max_len
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
        two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # 2i = 0, 2, 4, ...
        omega = 1.0 / 10000.0 ** (two_i / d_model)  # (ceil(d_model / 2),) radians per position
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * omega)
        pe[:, 1::2] = torch.cos(position * omega[: d_model // 2])
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)  # (1, max_len, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embeddings (batch, n, d_model) -> the same plus PE[:n], with dropout."""
        n = x.size(1)
        if n > self.max_len:
            raise ValueError(
                f"sequence length {n} is longer than the positional table (max_len={self.max_len})"
            )
        return self.dropout(x + self.pe[:, :n])


# %% [markdown]
# The table is not saved in checkpoints (`persistent=False`): it is a function of `d_model`
# and `max_len`, rebuilt whenever the module is built.
#
# The chart shows four of the 64 dimensions over the first 100 positions. Dimensions 4 and 5
# are the sine and the cosine of one pair ($i = 2$, a period of about 11 positions): a quarter
# period apart, they are never both zero, so together they pin down the phase. Dimensions 10
# and 20 belong to slower pairs, with periods of about 27 and 112 positions.

# %%
pe = PositionalEncoding(d_model=64, dropout=0.0).pe[0]  # (max_len, d_model)
curves = [
    {"position": pos, "dimension": f"dim {dim}", "value": round(pe[pos, dim].item(), 4)}
    for dim in (4, 5, 10, 20)
    for pos in range(100)
]
line_chart(curves, x="position:Q", y="value:Q", color="dimension:N", color_title="dimension",
           y_title="PE(position, dimension)", points=False, height=220,
           title="Sinusoidal positional encoding, d_model = 64")

# %% [markdown]
# ### Relative positions are linear maps
#
# The paper chose sinusoids because, it suggests, they make it easy to attend by *relative*
# position: for a fixed offset $k$, $PE_{pos+k}$ is a linear function of $PE_{pos}$. Each
# dimension pair is a point on a circle at angle $\omega_i \, pos$, and moving $k$ positions
# rotates it by the angle $\omega_i k$, whatever $pos$ is:
#
# $$
# \begin{pmatrix} \sin \omega_i (pos + k) \\ \cos \omega_i (pos + k) \end{pmatrix}
# = \begin{pmatrix} \cos \omega_i k & \sin \omega_i k \\ -\sin \omega_i k & \cos \omega_i k \end{pmatrix}
#   \begin{pmatrix} \sin \omega_i\, pos \\ \cos \omega_i\, pos \end{pmatrix}.
# $$
#
# So $PE_{pos+k} = M_k \, PE_{pos}$ where $M_k$ is block-diagonal, one $2\times 2$ rotation per
# pair, and does not depend on $pos$. We build $M_k$ and check it at every position of the
# table (in float64, to see the identity rather than float32 rounding):

# %%
import math

d_model, k = 64, 7
table = PositionalEncoding(d_model, dropout=0.0, max_len=200).pe[0].double()  # (200, d_model)
omega = 1.0 / 10000.0 ** (torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
M_k = torch.zeros(d_model, d_model, dtype=torch.float64)
for i, w in enumerate(omega.tolist()):
    c, s = math.cos(w * k), math.sin(w * k)
    M_k[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor([[c, s], [-s, c]])
predicted = table[:-k] @ M_k.T  # row pos: M_k PE(pos)
error = (predicted - table[k:]).abs().max().item()
print(f"max |M_k PE(pos) - PE(pos + {k})| over positions 0..{200 - k - 1}: {error:.1e}")

# %% [markdown]
# The error is float32 rounding of the stored table: one matrix maps every position to the
# position seven steps later. A consequence is that $PE_{pos} \cdot PE_{pos+k}$, the part of an
# attention score that comes from positions alone, depends only on the offset $k$ (it equals
# $\sum_i \cos \omega_i k$). It is largest, $d_\text{model}/2 = 32$, at offset 0, and smaller
# at every other offset, with ripples:

# %%
dots = table @ table.T  # (200, 200)
offsets = [
    {"offset k": k, "from position": pos, "dot": round(dots[pos, pos + k].item(), 3)}
    for pos in (0, 50, 120)
    for k in range(0, 80)
]
line_chart(offsets, x="offset k:Q", y="dot:Q", color="from position:N",
           color_title="from position", dash=True, points=False, height=200,
           y_title="PE(pos) · PE(pos + k)",
           title="PE(pos) · PE(pos + k) depends on the offset k only")

# %% [markdown]
# The three curves lie on top of each other.
#
# ### Learned position embeddings instead
#
# The alternative is to learn a vector per position, exactly like a token embedding. The
# paper tried it (Table 3, row E) and found it made no difference: on the development set,
# 4.92 perplexity and 25.7 BLEU with learned positions against 4.92 and 25.8 with sinusoids.
# They kept the sinusoids because they may let the model work on sentences longer than any it
# was trained on. A learned table has no row for position `max_len` and untrained rows for
# positions it never saw, while the sinusoid formula has a value at every position and, by the
# rotation property above, the same relations between positions everywhere. Later models made
# both choices (BERT and GPT-2 learn their positions). For comparison, here is the learned
# version, a drop-in replacement for `PositionalEncoding`:

# %% tags=["export"]
class LearnedPositionalEmbedding(nn.Module):
    """Add a trained vector per position (the alternative of Table 3, row E), then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.max_len = max_len
        self.position = nn.Embedding(max_len, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embeddings (batch, n, d_model) -> the same plus a learned vector per position."""
        n = x.size(1)
        if n > self.max_len:
            raise ValueError(
                f"sequence length {n} is longer than the learned table (max_len={self.max_len})"
            )
        positions = torch.arange(n, device=x.device)  # (n,)
        return self.dropout(x + self.position(positions))


# %% [markdown]
# Both add a (1, n, d_model) signal to the embeddings, and both refuse a sequence that does not
# fit their table. The difference is that the sinusoidal table could be rebuilt longer without
# training; the learned one would need new, trained rows.

# %%
torch.manual_seed(0)
x = torch.zeros(1, 12, 32)
for module in (PositionalEncoding(32, dropout=0.0, max_len=10),
               LearnedPositionalEmbedding(32, dropout=0.0, max_len=10)):
    print(type(module).__name__, "on 10 positions:", tuple(module(x[:, :10]).shape),
          "| parameters:", sum(p.numel() for p in module.parameters()))
    try:
        module(x)
    except ValueError as error:
        print("  ValueError:", error)
short, long = PositionalEncoding(32, 0.0, max_len=10), PositionalEncoding(32, 0.0, max_len=5000)
same_start = torch.equal(short.pe, long.pe[:, :10])
print("a longer sinusoidal table begins with the shorter one:", same_start)

# %% [markdown]
# ## What we have, and what comes next
#
# We have every part of the model: the `PositionwiseFeedForward` network, `Embeddings` scaled by
# $\sqrt{d_\text{model}}$ (ready to be tied with the output layer), and `PositionalEncoding`,
# whose sinusoids turn a shift in position into a fixed rotation, with
# `LearnedPositionalEmbedding` as the learned alternative. Together with `MultiHeadedAttention`
# from the last chapter, they fill the skeleton of chapter 2. The next chapter assembles the
# full model, counts its parameters against the paper's, and runs it.

# %% [markdown]
# ## Exercises
#
# 1. **The formula, one entry at a time.** Write `sinusoid(pos, i, d_model)`, the entry of the
#    positional encoding at position `pos` and dimension `i`, straight from the paper's two
#    formulas (even $i$ a sine, odd $i$ a cosine) with plain `math`. The check compares it
#    with the table `PositionalEncoding` builds.
# 2. **Where the parameters are.** Write `ffn_parameters(d_model, d_ff)`, the number of
#    parameters of a `PositionwiseFeedForward`. For the base model, how many is that per layer,
#    and what multiple of one `MultiHeadedAttention` (4 $d_\text{model}^2$ + 4 $d_\text{model}$)?
# 3. **A shift is a rotation.** For one pair of dimensions $(2i, 2i+1)$, the encoding of
#    position $p + k$ is that of position $p$ rotated by the angle $k\,\omega_i$. Why does that
#    let attention, which compares vectors by dot products, pick out "the token $k$ back"
#    whatever $p$ is?
#
# ```{dropdown} Answers to 2 and 3
# 2. $2\,d_\text{model} d_\text{ff} + d_\text{ff} + d_\text{model}$: 2,099,712 for the base
#    model, about twice the 1,050,624 of one multi-head attention.
# 3. In each pair the encoding is a unit vector at the angle $\omega_i p$. Let $R$ rotate each
#    pair $(2i, 2i+1)$ by an angle $\theta_i$ of its own, a block rotation like $M_k$. Then the
#    pair's share of $PE_{p+k} \cdot R\,PE_p$, the part of the score that the positions
#    contribute, is $\cos(\omega_i k - \theta_i)$, whatever $p$ is; with $\theta_i = \omega_i k$
#    every pair gives its largest value, 1. Query and key projections that together apply such
#    an $R$ learn it once, and it works at every position. This holds only for rotations within
#    the same pairs: a rotation that mixes pairs of different frequencies leaves a score that
#    still depends on $p$.
# ```

# %% tags=["hide-cell"]
# Exercises 1 and 2: our solutions (hidden in the book). Replace the bodies with yours.
import math


def sinusoid(pos: int, i: int, d_model: int) -> float:
    """PE(pos, 2j) = sin(pos / 10000^(2j / d_model)); PE(pos, 2j + 1) = cos(the same angle)."""
    angle = pos / 10000 ** ((i - i % 2) / d_model)
    return math.sin(angle) if i % 2 == 0 else math.cos(angle)


def ffn_parameters(d_model: int, d_ff: int) -> int:
    """W1 (d_model x d_ff) and b1, then W2 (d_ff x d_model) and b2."""
    return 2 * d_model * d_ff + d_ff + d_model


# %%
# Check exercises 1 and 2
table = PositionalEncoding(d_model=16, dropout=0.0, max_len=50).pe[0]  # (50, 16)
mine = torch.tensor([[sinusoid(pos, i, 16) for i in range(16)] for pos in range(50)])
torch.testing.assert_close(mine, table, atol=1e-5, rtol=0)
print("exercise 1: correct")
for d_model, d_ff in ((512, 2048), (64, 128), (10, 7)):
    module = PositionwiseFeedForward(d_model, d_ff)
    assert ffn_parameters(d_model, d_ff) == sum(p.numel() for p in module.parameters())
print(f"exercise 2: correct; base model: {ffn_parameters(512, 2048):,} per layer")
