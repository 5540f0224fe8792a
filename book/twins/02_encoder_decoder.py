# %% [markdown]
# # The encoder and the decoder
#
# **The paper, §3, §3.1 and §3.4.** The Transformer has an **encoder**, which turns the source
# $(x_1, \dots, x_n)$ into vectors $\mathbf{z} = (z_1, \dots, z_n)$, and an *auto-regressive*
# **decoder**, which writes $(y_1, \dots, y_m)$ one token at a time from $\mathbf{z}$ and its own
# earlier tokens. Each is a stack of $N = 6$ identical layers, and each sublayer sits in a residual
# connection with a layer norm.

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

from the_annotated_transformer import check_positive_int, enable_book_charts

enable_book_charts()

# %% [markdown]
# ## The encoder-decoder
#
# ```{figure} figures/transformer.svg
# :name: fig-transformer
# :width: 560px
#
# The Transformer, after the paper's Figure 1: the encoder (left) and the decoder (right), each
# $N$ layers; the decoder's middle block attends to the encoder's output, the *memory*. "Add &
# Norm" is the paper's post-norm; the code defaults to pre-norm (below).
# ```
#
# `EncoderDecoder` encodes the source once into the memory, which the decoder reads at every
# target position. Masks are boolean and **True where attention is allowed**: `src_mask` hides
# source padding, `tgt_mask` also the future. The `Generator` returns log-probabilities
# (`log_softmax` avoids the underflow of `log(softmax(x))`).

# %% tags=["export"]
import copy

import torch
from torch import nn


class EncoderDecoder(nn.Module):
    """The Transformer's outer shape: encode the source once, decode the target against it."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, src_embed: nn.Module,
                 tgt_embed: nn.Module, generator: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model); `self.generator` turns it into log-probs."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Memory (batch, n_src, d_model) from source token ids (batch, n_src)."""
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor,
               tgt_mask: torch.Tensor) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model) for target ids (batch, n_tgt) given memory."""
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


class Generator(nn.Module):
    """The last step: a linear map to the vocabulary, then log-softmax over it."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (..., vocab) of the next token."""
        return torch.log_softmax(self.proj(x), dim=-1)


def clones(module: nn.Module, N: int) -> nn.ModuleList:
    """N independent deep copies of `module`: same shape, separate weights."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


# %%
torch.manual_seed(0)
log_probs = Generator(d_model=8, vocab=5)(torch.randn(2, 3, 8))
print("log-probabilities:", tuple(log_probs.shape))
print("probabilities sum to 1:", torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 3)))
layers = clones(nn.Linear(4, 4), 3)
print(len(layers), "layers; weights shared:", layers[0].weight is layers[1].weight)

# %% [markdown]
# ## Layer normalization
#
# Layer normalization {cite}`ba2016layer` subtracts the mean $\mu$ of each position's features,
# divides by their standard deviation $\sigma$, then applies a learned scale $\gamma$ (`weight`)
# and shift $\beta$ (`bias`):
# $\mathrm{LayerNorm}(x) = \gamma \odot (x - \mu) / \sqrt{\sigma^2 + \epsilon} + \beta$. Working
# on one position at a time, it behaves the same in training and inference, unlike batch
# normalization.
#
# ```{note}
# The classic Annotated Transformer divided by the unbiased $\mathrm{std}(x) + \epsilon$; ours
# divides as `torch.nn.LayerNorm` does, so the check can compare the two.
# ```

# %% tags=["export"]
class LayerNorm(nn.Module):
    """Normalize each position's features to mean 0, variance 1, then scale and shift."""

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))  # gamma
        self.bias = nn.Parameter(torch.zeros(features))  # beta
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # biased, as torch.nn.LayerNorm
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


# %%
torch.manual_seed(0)
x = torch.randn(2, 5, 16) * 3 + 1
ours, reference = LayerNorm(16), nn.LayerNorm(16, eps=1e-6)
y = ours(x)
print("matches torch.nn.LayerNorm:", torch.allclose(y, reference(x), atol=1e-6))
print("every position has mean 0:", torch.allclose(y.mean(-1), torch.zeros(2, 5), atol=1e-5))
print("and variance 1:", torch.allclose(y.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-4))

# %% [markdown]
# ## Residual connections, and where the norm goes
#
# Each sublayer sits in a residual connection {cite}`he2016deep`: it adds a change to its input,
# and the addition gives signal and gradient a path around it. The paper normalizes *after* the
# addition (**post-norm**, §3.1), with dropout on the sublayer's output (§5.4):
# $\mathrm{LayerNorm}(x + \mathrm{Dropout}(\mathrm{Sublayer}(x)))$. Later models such as GPT-2
# {cite}`radford2019language` normalize the sublayer's input instead (**pre-norm**),
# $x + \mathrm{Dropout}(\mathrm{Sublayer}(\mathrm{LayerNorm}(x)))$, so the residual path is never
# normalized, and the stack ends with one final layer norm. `SublayerConnection` builds both;
# pre-norm is the default, for reasons chapter 5 gives ({doc}`departures`).
#
# ```{note}
# The classic version built only pre-norm; `norm_first=False` gives the paper's post-norm, tested
# against `nn.TransformerEncoderLayer(norm_first=False)`.
# ```

# %% tags=["export"]
class SublayerConnection(nn.Module):
    """A residual connection around one sublayer, with layer norm before (pre) or after (post)."""

    def __init__(self, size: int, dropout: float, norm_first: bool = True) -> None:
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        """x + Dropout(Sublayer(LayerNorm(x))) in pre-norm; LayerNorm(x + ...) in post-norm."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


# %% [markdown]
# ## The encoder and the decoder stacks
#
# An encoder layer has two sublayers: self-attention, in which each source position gathers
# information from the others, then a position-wise feed-forward network (chapters 3 and 4). A
# decoder layer puts *cross-attention* (the paper's encoder-decoder attention) between the two:
# queries from the decoder, keys and values from the memory, the one place where the target side
# sees the source.

# %% tags=["export"]
class EncoderLayer(nn.Module):
    """One encoder layer: self-attention, then feed-forward, each in a sublayer connection."""

    def __init__(self, size: int, self_attn: nn.Module, feed_forward: nn.Module,
                 dropout: float, norm_first: bool = True) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first=norm_first), 2)
        self.size = size
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))  # (batch, n, d_model)
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    """N encoder layers; a final layer norm in pre-norm models, whose stream is unnormalized."""

    def __init__(self, layer: EncoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Memory (batch, n_src, d_model) from embedded source (batch, n_src, d_model)."""
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, attention over the memory, feed-forward."""

    def __init__(self, size: int, self_attn: nn.Module, src_attn: nn.Module,
                 feed_forward: nn.Module, dropout: float, norm_first: bool = True) -> None:
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first=norm_first), 3)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))  # (batch, n_tgt, d)
        x = self.sublayer[1](x, lambda x: self.src_attn(x, memory, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Decoder(nn.Module):
    """N decoder layers; a final layer norm in pre-norm models."""

    def __init__(self, layer: DecoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor | None) -> torch.Tensor:
        """Output (batch, n_tgt, d_model) from the embedded target and the memory."""
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


# %%
def mean_attention(query, key, value, mask=None):
    """A stand-in for attention (chapter 3): every query gets the plain mean of the values."""
    return value.mean(dim=1, keepdim=True).expand_as(query)


torch.manual_seed(0)
mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))  # stand-in feed-forward
encoder = Encoder(EncoderLayer(16, mean_attention, mlp, dropout=0.0), N=2)
decoder = Decoder(DecoderLayer(16, mean_attention, mean_attention, mlp, dropout=0.0), N=2)
memory = encoder(torch.randn(2, 7, 16), mask=None)  # (batch, n_src, d_model)
out = decoder(torch.randn(2, 5, 16), memory, src_mask=None, tgt_mask=None)
print("memory:", tuple(memory.shape), " decoder output:", tuple(out.shape))

# %% [markdown]
# ## Not reading ahead: the subsequent mask
#
# In training the decoder gets the whole target at once, shifted right by one (a start token in
# front), and each position predicts the next. Position $i$ could then read the answer at $i + 1$,
# so the decoder's self-attention lets $i$ attend only to $j \le i$; with the shift, the
# prediction at $i$ depends only on earlier tokens, as at inference. Below, the mask for 4 tokens
# (rows are queries, columns keys).

# %% tags=["export"]
def subsequent_mask(size: int) -> torch.Tensor:
    """Causal mask (1, size, size): True where query position i may attend key j, i.e. j <= i."""
    check_positive_int(size, "size", "the target length")  # one-line errors (appendix)
    return torch.tril(torch.ones(1, size, size, dtype=torch.bool))


# %%
print(subsequent_mask(4).int())


# %% [markdown]
# ## What we have, and what comes next
#
# The skeleton stands; the next chapter builds what its layers wait for: attention.
#
# ## Exercises
#
# 1. **A norm without the mean.** *RMS norm* {cite}`zhang2019root` does not subtract the mean:
#    $\mathrm{RMSNorm}(x) = g \odot x / \sqrt{\overline{x^2} + \epsilon}$. Write
#    `rms_norm(x, weight, eps)` over the last dimension; the check wants a unit root mean square,
#    invariance to the input's scale, and `LayerNorm`'s output on zero-mean inputs.
# 2. **Looking back only a little.** Write `window_mask(size, k)`: like `subsequent_mask`, but
#    query $i$ sees only the $k$ most recent positions, $i - k < j \le i$.
# 3. **Why pre-norm needs a final norm.** What does the scale of the residual stream do as
#    pre-norm layers are added, and what does the final `LayerNorm` fix?
#
# ```{dropdown} Answer to 3
# Each pre-norm layer *adds* to the stream and nothing rescales it, so the stream tends to grow
# with depth {cite}`xiong2020layer`. The final `LayerNorm` brings each position back to mean 0
# and variance 1 before its learned scale and shift, as the last norm of a post-norm stack does.
# ```

# %% tags=["hide-cell"]
# Exercises 1 and 2: our solutions (hidden in the book). Replace the bodies with yours.
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Scale each position's features to unit root mean square, then by weight."""
    return weight * x / torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)


def window_mask(size: int, k: int) -> torch.Tensor:
    """(1, size, size): True where query i may attend key j, i - k < j <= i."""
    i = torch.arange(size).unsqueeze(1)  # (size, 1)
    j = torch.arange(size).unsqueeze(0)  # (1, size)
    return ((j <= i) & (j > i - k)).unsqueeze(0)


# %%
# Check exercises 1 and 2
torch.manual_seed(0)
x, ones = torch.randn(3, 7, 16) * 2 + 1, torch.ones(16)
rms = rms_norm(x, ones).pow(2).mean(dim=-1).sqrt()  # (3, 7)
torch.testing.assert_close(rms, torch.ones(3, 7))
torch.testing.assert_close(rms_norm(5 * x, ones), rms_norm(x, ones))
centered = x - x.mean(dim=-1, keepdim=True)
torch.testing.assert_close(rms_norm(centered, ones), LayerNorm(16)(centered))
print("exercise 1: correct")
assert torch.equal(window_mask(6, 6), subsequent_mask(6))
assert window_mask(4, 2).int().tolist() == [[[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0],
                                             [0, 0, 1, 1]]]
print("exercise 2: correct")
