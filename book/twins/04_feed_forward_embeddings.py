# %% [markdown]
# # Feed-forward layers, embeddings and positions
#
# **The paper, §3.3–3.5.** Each layer also has a feed-forward network, applied to each position
# alone. Learned embeddings, scaled by $\sqrt{d_\text{model}}$ and shared with the output layer,
# turn tokens into vectors; and as nothing else in the model sees order, sinusoidal positional
# encodings added to them say where each token stands.

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
    MultiHeadedAttention,
    check_token_ids,
    enable_book_charts,
    encoding_heatmap,
    line_chart,
)

enable_book_charts()

# %% [markdown]
# ## The position-wise feed-forward network
#
# Each position goes through the same two-layer network, two convolutions of kernel size 1, in
# the paper's words:
#
# $$ \mathrm{FFN}(x) = \max(0,\, x W_1 + b_1)\, W_2 + b_2 . $$
#
# With $d_\text{ff} = 4\, d_\text{model}$ it holds two thirds of an encoder layer's weights
# ($8\, d_\text{model}^2$ against attention's $4\, d_\text{model}^2$, chapter 5). The dropout
# between its two layers is the classic version's, not the paper's ({doc}`departures`).

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
# Positions do not interact, so a whole sequence gives what each position gives alone:

# %%
torch.manual_seed(0)
ffn = PositionwiseFeedForward(d_model=16, d_ff=64, dropout=0.0)
x = torch.randn(2, 5, 16)
one_at_a_time = torch.stack([ffn(x[:, i]) for i in range(5)], dim=1)
print("output:", tuple(ffn(x).shape))
print("same as one position at a time:", torch.allclose(ffn(x), one_at_a_time, atol=1e-6))


# %% [markdown]
# ## Embeddings, scaled by $\sqrt{d_\text{model}}$
#
# The paper multiplies the rows of each learned embedding table by $\sqrt{d_\text{model}}$ without
# saying why. In the authors' tensor2tensor code {cite}`vaswani2018tensor2tensor` the entries start
# with standard deviation $d_\text{model}^{-1/2}$, rows of norm about 1 that suit the tied output
# layer, and the factor lifts them to the scale of the positional encodings added next, perhaps so
# that neither drowns the other. With the Xavier initialization this book keeps (chapter 5) and a
# 37,000-token table, the factor narrows the gap without closing it:

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
        check_token_ids(x, self.vocab)  # one-line errors (appendix)
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
# Against the positional signal's root mean square, $1/\sqrt{2}$, the gap shrinks from about a
# hundredfold to about fourfold.
#
# ## Sharing the embedding with the output layer
#
# The source and target embeddings and the generator's weight are all tables of a row per token.
# The paper (§3.4) shares one matrix among the three: the target embedding and the output layer
# both say what a token means, and tying them improves perplexity {cite}`press2017using`. Tying
# the source embedding too needs one vocabulary for both languages, as the paper had (about 37,000
# byte-pair units {cite}`sennrich2016neural`). Chapter 5's
# `make_model(..., share_embeddings=True)` ties them; its default does not ({doc}`departures`).

# %% [markdown]
# ## Positional encoding
#
# The paper adds to each embedding a vector that depends only on the position $pos$, sines and
# cosines of geometrically spaced frequencies:
#
# $$
# PE_{(pos,\,2i)} = \sin\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right), \qquad
# PE_{(pos,\,2i+1)} = \cos\!\left(\frac{pos}{10000^{2i/d_\text{model}}}\right).
# $$
#
# Pair $i$ is a clock turning at $\omega_i = 10000^{-2i/d_\text{model}}$ radians per position,
# from one turn every $2\pi$ positions to almost one every $2\pi \cdot 10000$: fast pairs tell
# neighbours apart, slow ones say roughly where a token is. Dropout on the sum is the paper's
# dropout on embeddings (§5.4).

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
# Look at the stripes: they widen from left to right as the frequency falls, until the last
# dimensions barely move.

# %%
pe = PositionalEncoding(d_model=64, dropout=0.0, max_len=32).pe[0]  # (32, d_model)
encoding_heatmap(pe, title="Sinusoidal positional encoding, d_model = 64")

# %% [markdown]
# ### Relative positions are linear maps
#
# The paper chose sinusoids expecting them to make attending by *relative* position easy: for a
# fixed offset $k$, $PE_{pos+k}$ is a linear function of $PE_{pos}$. Pair $i$ is a point on a
# circle at angle $\omega_i \, pos$, and moving $k$ positions rotates it by $\omega_i k$:
#
# $$
# \begin{pmatrix} \sin \omega_i (pos + k) \\ \cos \omega_i (pos + k) \end{pmatrix}
# = \begin{pmatrix} \cos \omega_i k & \sin \omega_i k \\ -\sin \omega_i k & \cos \omega_i k \end{pmatrix}
#   \begin{pmatrix} \sin \omega_i\, pos \\ \cos \omega_i\, pos \end{pmatrix}.
# $$
#
# So $PE_{pos+k} = M_k \, PE_{pos}$ with a block-diagonal $M_k$, one $2\times 2$ rotation per
# pair, that does not depend on $pos$. The cell checks it in float64:

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
# The error is the table's float32 rounding: one matrix maps each position to the one seven later. It
# follows that $PE_{pos} \cdot PE_{pos+k} = \sum_i \cos \omega_i k$ depends on the offset $k$ alone:
# largest at 0, smaller with ripples elsewhere, the same curve from each starting position drawn. An
# attention score sees this dot product only through $W^Q$ and $W^K$, and keeps the property only if
# together they scale and rotate each pair alone (exercise 3).

# %%
dots = table @ table.T  # (200, 200): row pos, column pos + k holds PE(pos) . PE(pos + k)
offsets = [{"offset k": k, "from position": pos, "dot": round(dots[pos, pos + k].item(), 3)}
           for pos in (0, 50, 120) for k in range(80)]
line_chart(offsets, x="offset k:Q", y="dot:Q", color="from position:N", dash=True, points=False,
           height=200, y_title="PE(pos) · PE(pos + k)",
           title="PE(pos) · PE(pos + k) depends on the offset k only")

# %% [markdown]
# ### Learned position embeddings instead
#
# The paper also tried a learned vector per position (Table 3, row E), found nearly identical
# results, and kept the sinusoids because they may extend to sentences longer than those seen in
# training: a learned table has no row beyond `max_len`, and untrained rows where no training
# sentence reached. BERT {cite}`devlin2019bert` and GPT-2 {cite}`radford2019language` learn
# theirs. The module is a drop-in replacement:

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


# %%
learned = LearnedPositionalEmbedding(d_model=32, dropout=0.0, max_len=10)
print(sum(p.numel() for p in learned.parameters()), "trained parameters")
try:
    learned(torch.zeros(1, 12, 32))  # 12 positions for a table of 10
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## What we have, and what comes next
#
# Every part now exists; the next chapter assembles them.

# %% [markdown]
# ## Exercises
#
# 1. **The formula, one entry at a time.** Write `sinusoid(pos, i, d_model)`, the encoding's entry
#    at position `pos` and dimension `i`, with plain `math`. The check compares it with
#    `PositionalEncoding`'s table.
# 2. **Order-blind without positions.** Write `permutes_along(layer, x, perm)`: whether permuting
#    the positions of `x` (batch, n, d_model) by `perm` permutes `layer(x)` the same way. The
#    check tries self-attention, the feed-forward network, and self-attention after
#    `PositionalEncoding`. Why do the positions change the answer?
# 3. **A shift is a rotation.** Suppose the query and key projections together rotate each pair
#    $(2i, 2i+1)$ on its own, a block rotation like $M_k$. Why does that let attention pick out
#    "the token $k$ back" at every position $p$? Why must the rotation keep to the same pairs?
#
# ```{dropdown} Answers to 2 and 3
# 2. Permuting the input rows permutes the scores' rows and columns alike, so each output row
#    moves with its input row; the feed-forward network sees one row at a time. With the encodings
#    added, a moved token gets another encoding, so its output changes, not only its place.
# 3. Pair $i$ of $PE_p$ is a unit vector at the angle $\omega_i p$. If $R$ rotates pair $i$ by
#    $\theta_i$, the pair's share of $PE_{p+k} \cdot R\,PE_p$ is $\cos(\omega_i k - \theta_i)$
#    whatever $p$ is, largest when $\theta_i = \omega_i k$: learned once, it works everywhere. A
#    rotation that mixes pairs of different frequencies leaves a score that depends on $p$.
# ```

# %% tags=["hide-cell"]
# Exercises 1 and 2: our solutions (hidden in the book). Replace the bodies with yours.
import math
from collections.abc import Callable


def sinusoid(pos: int, i: int, d_model: int) -> float:
    """PE(pos, 2j) = sin(pos / 10000^(2j / d_model)); PE(pos, 2j + 1) = cos(the same angle)."""
    angle = pos / 10000 ** ((i - i % 2) / d_model)
    return math.sin(angle) if i % 2 == 0 else math.cos(angle)


def permutes_along(layer: Callable, x: torch.Tensor, perm: torch.Tensor) -> bool:
    """Whether layer(x with its positions permuted) is layer(x) with its positions permuted."""
    return torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-5)


# %%
# Check exercises 1 and 2
table = PositionalEncoding(d_model=16, dropout=0.0, max_len=50).pe[0]  # (50, 16)
mine = torch.tensor([[sinusoid(pos, i, 16) for i in range(16)] for pos in range(50)])
torch.testing.assert_close(mine, table, atol=1e-5, rtol=0)
print("exercise 1: correct")
torch.manual_seed(0)
attn, positions = MultiHeadedAttention(h=4, d_model=32, dropout=0.0), PositionalEncoding(32, 0.0)
x, perm = torch.randn(2, 10, 32), torch.randperm(10)  # (batch, n, d_model), a shuffle
assert permutes_along(lambda x: attn(x, x, x), x, perm)
assert permutes_along(PositionwiseFeedForward(32, 64, dropout=0.0), x, perm)
assert not permutes_along(lambda x: attn(positions(x), positions(x), positions(x)), x, perm)
print("exercise 2: correct")
