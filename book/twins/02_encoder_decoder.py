# %% [markdown]
# # The encoder and the decoder
#
# Section 3.1 of the paper describes the Transformer from the outside in. Like the translation
# models before it {cite}`sutskever2014sequence,bahdanau2015neural`, it has two halves. The
# **encoder** reads the whole source sentence $(x_1, \dots, x_n)$ and turns it into a sequence
# of vectors $\mathbf{z} = (z_1, \dots, z_n)$, one per source token, each of width
# $d_\text{model}$. The **decoder** writes the output sentence $(y_1, \dots, y_m)$ one token at
# a time; to choose $y_{i}$ it looks at $\mathbf{z}$ and at the tokens $y_1, \dots, y_{i-1}$ it
# has already written. A model that feeds its own outputs back in as inputs like this is
# called *auto-regressive*.
#
# This chapter builds that skeleton: the two stacks, the pieces they are made of, and the mask
# that keeps the decoder from reading ahead. The attention and feed-forward layers that fill
# the skeleton come in the next two chapters.

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

from the_annotated_transformer import enable_book_charts, mask_chart

enable_book_charts()

# %% [markdown]
# ## The whole model in one picture
#
# ```{figure} figures/transformer.svg
# :name: fig-transformer
# :width: 560px
#
# The Transformer. Left, the encoder: $N$ identical layers, each a self-attention block and a
# feed-forward block. Right, the decoder: $N$ layers that add a third block, attention over the
# encoder's output (the *memory*). Every block is wrapped in a residual connection and a layer
# normalization ("add & norm", drawn in the paper's post-norm order; see below). Token
# embeddings plus positional encodings go in at the bottom; a linear layer and a softmax turn
# the decoder's output into next-token probabilities at the top.
# ```
#
# The picture has four kinds of parts: embeddings (chapter 4), attention (chapter 3),
# feed-forward layers (chapter 4), and the plumbing that connects them, which is this chapter.
# We start with the outermost box.

# %% [markdown]
# ## The encoder-decoder
#
# `EncoderDecoder` holds five parts and knows the order to call them in. The source is embedded
# and encoded once; the result, the *memory*, is then read by the decoder for every target
# position. Keeping `encode` and `decode` as separate methods matters at inference time: when
# we generate a translation token by token we encode the source once and call `decode` again
# and again.
#
# The masks say which positions may be looked at. `src_mask` hides padding in the source;
# `tgt_mask` also hides the future (more on it at the end of this chapter). Throughout the book
# a mask is a boolean tensor that is **True where attention is allowed**.

# %% tags=["export"]
import copy

import torch
from torch import nn


class EncoderDecoder(nn.Module):
    """The Transformer's outer shape: encode the source once, decode the target against it."""

    def __init__(
        self,
        encoder: nn.Module,
        decoder: nn.Module,
        src_embed: nn.Module,
        tgt_embed: nn.Module,
        generator: nn.Module,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model); `self.generator` turns it into log-probs."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Memory (batch, n_src, d_model) from source token ids (batch, n_src)."""
        return self.encoder(self.src_embed(src), src_mask)

    def decode(
        self,
        memory: torch.Tensor,
        src_mask: torch.Tensor,
        tgt: torch.Tensor,
        tgt_mask: torch.Tensor,
    ) -> torch.Tensor:
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


# %% [markdown]
# The generator returns log-probabilities rather than probabilities: the training loss needs
# their logarithm anyway, and `log_softmax` computes it without the underflow that
# `log(softmax(x))` suffers when a probability is tiny.

# %%
torch.manual_seed(0)
generator = Generator(d_model=8, vocab=5)
log_probs = generator(torch.randn(2, 3, 8))
print("log-probabilities:", tuple(log_probs.shape))
print("probabilities sum to 1:", torch.allclose(log_probs.exp().sum(-1), torch.ones(2, 3)))

# %% [markdown]
# ## Stacks of identical layers
#
# Both stacks repeat one layer $N = 6$ times. The copies have the same shape but their own
# weights, so we build one layer and deep-copy it.

# %% tags=["export"]
def clones(module: nn.Module, N: int) -> nn.ModuleList:
    """N independent deep copies of `module`: same shape, separate weights."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


# %%
layers = clones(nn.Linear(4, 4), 3)
print(len(layers), "layers; weights shared:", layers[0].weight is layers[1].weight)

# %% [markdown]
# ## Layer normalization
#
# Every block's output passes through a layer normalization {cite}`ba2016layer`. For one
# position's vector $x \in \mathbb{R}^{d}$ it subtracts the mean $\mu$ of the $d$ features,
# divides by their standard deviation, then applies a learned scale $\gamma$ (`weight`) and
# shift $\beta$ (`bias`):
#
# $$
# \mathrm{LayerNorm}(x) = \gamma \odot \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}} + \beta,
# \qquad \mu = \frac{1}{d}\sum_{j} x_j,\quad \sigma^2 = \frac{1}{d}\sum_j (x_j - \mu)^2 .
# $$
#
# Unlike batch normalization it looks at one position at a time, so it behaves the same in
# training and at inference and does not care about the batch size or the sequence length.
# It keeps the scale of the activations steady from layer to layer, which is what lets a deep
# stack of residual blocks train.

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


# %% [markdown]
# ```{note}
# The classic Annotated Transformer divided by the *unbiased* standard deviation plus
# $\epsilon$, $(x-\mu)/(\mathrm{std}(x) + \epsilon)$. Ours puts $\epsilon$ inside the square
# root and uses the biased variance, as `torch.nn.LayerNorm` and the layer-norm paper do, so our
# layers can be checked against PyTorch's (and are, just below).
# ```

# %%
torch.manual_seed(0)
x = torch.randn(2, 5, 16) * 3 + 1
ours, reference = LayerNorm(16), nn.LayerNorm(16, eps=1e-6)
print("matches torch.nn.LayerNorm:", torch.allclose(ours(x), reference(x), atol=1e-6))
y = ours(x)
print("every position has mean 0:", torch.allclose(y.mean(-1), torch.zeros(2, 5), atol=1e-5))
print("and variance 1:", torch.allclose(y.var(-1, unbiased=False), torch.ones(2, 5), atol=1e-4))

# %% [markdown]
# ## Residual connections, and where the norm goes
#
# Each block (self-attention, cross-attention or feed-forward) is a *sublayer*, wrapped in a
# residual connection {cite}`he2016deep`: the block computes a change and adds it to its input,
# so the signal, and the gradient, always has a direct path through the stack. The paper puts
# the layer norm *after* the addition (**post-norm**):
#
# $$ \mathrm{LayerNorm}\big(x + \mathrm{Dropout}(\mathrm{Sublayer}(x))\big). $$
#
# The classic Annotated Transformer, and most models trained since, put it *before* the
# sublayer, on the sublayer's input only (**pre-norm**):
#
# $$ x + \mathrm{Dropout}\big(\mathrm{Sublayer}(\mathrm{LayerNorm}(x))\big). $$
#
# In pre-norm the residual path from the embeddings to the top of the stack is never
# normalized, just added to; {cite:t}`xiong2020layer` show that this keeps the gradients at the
# start of training well-scaled, so pre-norm models need less care with the learning-rate
# warm-up, whereas post-norm models can diverge without it (chapter 19 trains both, with and
# without warm-up, and shows it happen). Because nothing normalizes the
# residual stream in pre-norm, each stack then ends with one final layer norm; in post-norm the
# last block's output is already normalized and the extra norm would be redundant.
#
# Our `SublayerConnection` does both, pre-norm by default; `norm_first=False` gives the paper's
# model. Dropout on the sublayer's output is the paper's "residual dropout" (§5.4).
#
# ```{note}
# The classic Annotated Transformer put the norm first "for code simplicity" and could build
# only the pre-norm model. We keep pre-norm as the default, since it is the easier model to
# train, and add `norm_first=False` so that the paper's own arrangement can be built and
# compared, layer for layer, with PyTorch's `nn.TransformerEncoderLayer(norm_first=False)`.
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
# ## The encoder
#
# An encoder layer has two sublayers: self-attention, in which every source position gathers
# information from every other, then a position-wise feed-forward network that transforms each
# position on its own. The layer takes those two as modules (they are built in the next two
# chapters), so any module with the right call signature will do. `size` is $d_\text{model}$:
# every sublayer maps vectors of that width to vectors of that width, which is what makes the
# residual additions possible.

# %% tags=["export"]
class EncoderLayer(nn.Module):
    """One encoder layer: self-attention, then feed-forward, each in a sublayer connection."""

    def __init__(
        self,
        size: int,
        self_attn: nn.Module,
        feed_forward: nn.Module,
        dropout: float,
        norm_first: bool = True,
    ) -> None:
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
    """N encoder layers; a final layer norm in pre-norm models, where the stream is unnormalized."""

    def __init__(self, layer: EncoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Memory (batch, n_src, d_model) from embedded source (batch, n_src, d_model)."""
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


# %% [markdown]
# ## The decoder
#
# A decoder layer has a third sublayer between the two: *cross-attention* (the paper calls it
# encoder-decoder attention), whose queries come from the decoder and whose keys and values
# are the encoder's memory. That is the only place the target side sees the source. The
# self-attention of the decoder uses `tgt_mask`, the cross-attention uses `src_mask`.

# %% tags=["export"]
class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, attention over the memory, feed-forward."""

    def __init__(
        self,
        size: int,
        self_attn: nn.Module,
        src_attn: nn.Module,
        feed_forward: nn.Module,
        dropout: float,
        norm_first: bool = True,
    ) -> None:
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first=norm_first), 3)
        self.norm_first = norm_first

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None,
        tgt_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        m = memory  # (batch, n_src, d_model)
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))  # (batch, n_tgt, d)
        x = self.sublayer[1](x, lambda x: self.src_attn(x, m, m, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Decoder(nn.Module):
    """N decoder layers; a final layer norm in pre-norm models."""

    def __init__(self, layer: DecoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(
        self,
        x: torch.Tensor,
        memory: torch.Tensor,
        src_mask: torch.Tensor | None,
        tgt_mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Output (batch, n_tgt, d_model) from the embedded target and the memory."""
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


# %% [markdown]
# The stacks already run. Attention and feed-forward layers do not exist yet, so as a stand-in
# we give each layer a "self-attention" that averages the values and a small MLP; the real ones
# slot into the same places in chapter 5.

# %%
class MeanAttention(nn.Module):
    """A placeholder for attention: every query gets the plain mean of the values."""

    def forward(self, query, key, value, mask=None):
        return value.mean(dim=1, keepdim=True).expand_as(query)


torch.manual_seed(0)
d_model = 16
mlp = nn.Sequential(nn.Linear(d_model, 32), nn.ReLU(), nn.Linear(32, d_model))
encoder = Encoder(EncoderLayer(d_model, MeanAttention(), mlp, dropout=0.0), N=2)
decoder = Decoder(DecoderLayer(d_model, MeanAttention(), MeanAttention(), mlp, dropout=0.0), N=2)
memory = encoder(torch.randn(2, 7, d_model), mask=None)
out = decoder(torch.randn(2, 5, d_model), memory, src_mask=None, tgt_mask=None)
print("memory:", tuple(memory.shape), " decoder output:", tuple(out.shape))

# %% [markdown]
# ## Not reading ahead: the subsequent mask
#
# During training the decoder sees the whole target sentence at once: its input is the target
# shifted right by one (a start token in front), and at every position it must predict the
# next token. Processing all positions in parallel is what makes the Transformer fast to
# train, but it would let position $i$ simply look up the answer at position $i + 1$. The
# decoder's self-attention therefore gets a mask that lets position $i$ attend only to
# positions $j \le i$: a lower-triangular matrix of True. Together with the one-position shift,
# the prediction for position $i$ then depends only on the tokens before it, exactly as at
# inference time, when the later tokens do not exist yet.

# %% tags=["export"]
def subsequent_mask(size: int) -> torch.Tensor:
    """Causal mask (1, size, size): True where query position i may attend key j, i.e. j <= i."""
    if isinstance(size, bool) or not hasattr(size, "__index__"):
        raise TypeError(f"size must be an int (the target length), got {size!r}")
    if size < 1:
        raise ValueError(f"size must be at least 1 (the target length), got {size}")
    return torch.tril(torch.ones(1, size, size, dtype=torch.bool))


# %%
print(subsequent_mask(4).int())

# %% [markdown]
# The chart shows the mask for a 20-token target: each row is a query position (a token being
# predicted), each column a key position it might look at. Hover over a cell to read it.

# %%
mask_chart(subsequent_mask(20), title="subsequent_mask(20)", size=320)


# %% [markdown]
# ## What we have, and what comes next
#
# We have the skeleton of the Transformer: `EncoderDecoder` with its `encode` and `decode`
# steps, the `Generator`, encoder and decoder stacks built from `clones` of one layer, the
# residual `SublayerConnection` in pre-norm or post-norm form, our own `LayerNorm`, and the
# causal `subsequent_mask`. Each layer is still waiting for its two essential parts. The next
# chapter builds the first and most important: attention.

# %% [markdown]
# ## Exercises
#
# 1. **A norm without the mean.** Many models trained after the Transformer replace layer norm
#    by *RMS norm* {cite}`zhang2019root`, which does not subtract the mean:
#    $\mathrm{RMSNorm}(x) = g \odot x / \sqrt{\overline{x^2} + \epsilon}$. Write
#    `rms_norm(x, weight, eps)` over the last dimension. The check asks that, with unit weights,
#    each position comes out with a root mean square of 1, that scaling the input changes
#    nothing, and that on inputs whose mean is zero it agrees with our `LayerNorm`.
# 2. **Looking back only a little.** Write `window_mask(size, k)`: like `subsequent_mask`, but
#    query $i$ may attend only to the $k$ most recent positions, $i - k < j \le i$. With
#    $k$ = `size` it must equal `subsequent_mask(size)`.
# 3. **Why pre-norm needs a final norm.** In a post-norm stack every layer's output has been
#    through a layer norm; in a pre-norm stack it has not. What does the scale of the residual
#    stream do as pre-norm layers are added, and what does the final `LayerNorm` fix?
#
# ```{dropdown} Answer to 3
# Each pre-norm layer *adds* its sublayer's output to the stream and nothing rescales it, so
# the stream tends to grow with depth, and the last layer's output has no fixed scale. The
# final `LayerNorm` gives the decoder's output, and so the generator's input, mean 0 and
# variance 1 per position, as a post-norm stack gives by construction.
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
