# %% [markdown]
# # Why self-attention
#
# **The paper, §4.** Unlike a recurrent layer, self-attention needs a constant number of sequential
# operations; unlike recurrent and convolutional layers, a constant path length between any two
# positions; and less computation than a recurrent layer while sentences are shorter than the
# representation is wide.

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
# ## The paper's comparison
#
# Each layer maps $n$ vectors of width $d$ to $n$ such vectors. The paper's Table 1 ($k$ is a
# convolution's kernel width, $r$ the neighbourhood of a *restricted* self-attention):
#
# | Layer type | Complexity per layer | Sequential operations | Maximum path length |
# |:--|:--|:--|:--|
# | Self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | Recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
# | Convolutional | $O(k \cdot n \cdot d^2)$ | $O(1)$ | $O(\log_k n)$ |
# | Self-attention (restricted) | $O(r \cdot n \cdot d)$ | $O(1)$ | $O(n / r)$ |
#
# **Complexity.** Self-attention takes $n^2$ dot products of length $d$; a recurrent layer
# multiplies a $d$-vector by a $d \times d$ matrix at each of $n$ positions, a convolution $k$
# times per position. So self-attention is the cheaper layer while $n < d$, which the paper calls
# the usual case for sentences cut into word pieces. Multi-head attention also projects every
# position with four $d \times d$ matrices, $O(n \cdot d^2)$ like a recurrent layer.
#
# **Sequential operations.** Only the recurrent layer must compute its positions in order (chapter
# 1).
#
# **Maximum path length**, the number of steps a signal takes between two positions: the shorter
# the path, the easier a dependency is to learn {cite}`hochreiter2001gradient`. Chapter 1 counted
# these steps; below, autograd checks them. Restricting self-attention to $r$ neighbours makes it
# linear in $n$ at the price of $n / r$ layers, which the paper leaves for future work.
#
# ## Counting the operations
#
# The floating-point operations of one layer of each kind, per sequence: self-attention's four
# projections apart from the attention proper, and an LSTM {cite}`hochreiter1997long` with four
# gates, each an input and a recurrent $d \times d$ product.

# %%
def self_attention_flops(n: int, d: int) -> tuple[int, int]:
    """(projections W^Q, W^K, W^V, W^O; scores Q K^T plus the weighted sum of values)."""
    return 4 * 2 * n * d * d, 2 * 2 * n * n * d


def lstm_flops(n: int, d: int) -> int:
    """Four gates, each an input and a recurrent (d x d) product, at each of n steps."""
    return 4 * 2 * 2 * n * d * d


def convolution_flops(n: int, d: int, k: int = 3) -> int:
    """A (d -> d) convolution of width k at each of n positions."""
    return 2 * k * n * d * d


d = 512
print(f"{'n':>5s} {'attention: projections':>23s} {'+ attention proper':>19s} "
      f"{'LSTM':>8s} {'conv k=3':>9s}   (MFLOPs per sequence, d = {d})")
for n in (16, 64, 256, 512, 1024, 4096):
    projections, attend = self_attention_flops(n, d)
    print(f"{n:5d} {projections / 1e6:23,.0f} {attend / 1e6:19,.0f} "
          f"{lstm_flops(n, d) / 1e6:8,.0f} {convolution_flops(n, d) / 1e6:9,.0f}")

# %% [markdown]
# The attention proper costs less than its own projections until $n = 2d$, and less than an LSTM
# layer until $n = 4d$.
#
# ## Path lengths, checked with autograd
#
# Does output position $n - 1$ depend on input position 0? Forward-mode autograd carries each
# value's derivative with respect to input position 0; we stack layers until it reaches position
# $n - 1$ (with random weights, non-zero means a path exists), in double precision so that tiny
# derivatives stay above zero.

# %%
import torch
import torch.autograd.forward_ad as fwAD
from torch import nn

width = 4  # channels; the answer depends only on how positions are wired together


def conv_layer(dilation: int = 1):  # kernel 3, on (batch, n, width) tensors
    conv = nn.Conv1d(width, width, 3, padding=dilation, dilation=dilation).double()
    return lambda x: conv(x.transpose(1, 2)).transpose(1, 2)


def attention_layer():  # one head of unmasked self-attention, as in the encoder
    attn = MultiHeadedAttention(h=1, d_model=width, dropout=0.0).double()
    return lambda x: attn(x, x, x)


def lstm_layer():  # one unidirectional LSTM layer, with its outputs at every position
    lstm = nn.LSTM(width, width, batch_first=True).double()
    return lambda x: lstm(x)[0]


def layers_to_connect(make_layer, n: int, max_layers: int = 1000) -> int:
    """Layers stacked until output position n-1 depends on input position 0 (forward-mode AD)."""
    x = torch.randn(1, n, width, dtype=torch.float64)  # (batch, n, width)
    tangent = torch.zeros_like(x)
    tangent[0, 0] = 1.0  # differentiate with respect to input position 0
    with torch.no_grad(), fwAD.dual_level():
        h = fwAD.make_dual(x, tangent)
        for depth in range(1, max_layers + 1):
            h = make_layer(depth)(h)
            if fwAD.unpack_dual(h).tangent[0, -1].abs().sum() > 0:
                return depth
    raise RuntimeError(f"position {n - 1} not reached after max_layers={max_layers}")


torch.manual_seed(0)
kinds = {
    "convolution, k=3": lambda depth: conv_layer(),
    "dilated convolution, k=3": lambda depth: conv_layer(dilation=2 ** (depth - 1)),
    "self-attention": lambda depth: attention_layer(),
    "LSTM": lambda depth: lstm_layer(),
}
print("layers until position n-1 depends on position 0")
print(f"{'n':>4s} " + " ".join(f"{kind:>25s}" for kind in kinds))
for n in (16, 64, 256):
    print(f"{n:4d} " + " ".join(f"{layers_to_connect(f, n):25d}" for f in kinds.values()))

# %% [markdown]
# Width-3 convolutions need $n - 1$ layers, about twice chapter 1's count, which stopped when one
# window first covered both positions; here position $n - 1$ itself must see position 0. Both grow
# linearly, as §4's $O(n/k)$ for contiguous kernels; Table 1's $O(\log_k n)$ is for dilated ones,
# whose reach doubles with each layer (dilations $1, 2, 4, \dots$): $\lceil \log_2 n \rceil$ layers
# do; one self-attention layer connects any two positions. So does one LSTM layer, through $n - 1$
# applications of its cell: autograd counts layers, and the LSTM hides its path inside one.
#
# ## Timing the three layers
#
# The next cell times a forward pass of each layer on one CPU thread.

# %% nbval_reason="wall-clock timings: they vary from run to run and from machine to machine" tags=["nbval-ignore-output"]
import timeit
from functools import partial

threads = torch.get_num_threads()
torch.set_num_threads(1)
d_model, batch = 256, 4
attention = MultiHeadedAttention(h=4, d_model=d_model, dropout=0.0).eval()
lstm = nn.LSTM(d_model, d_model, batch_first=True).eval()
conv = nn.Conv1d(d_model, d_model, kernel_size=3, padding=1).eval()
layers = {  # each maps (batch, n, d_model) to (batch, n, d_model)
    "self-attention": lambda x: attention(x, x, x),
    "recurrent (LSTM)": lambda x: lstm(x)[0],
    "convolution (k=3)": lambda x: conv(x.transpose(1, 2)).transpose(1, 2),
}
timings = []
with torch.no_grad():
    for n in (16, 32, 64, 128, 256, 512, 1024):
        x = torch.randn(batch, n, d_model)  # (batch, n, d_model)
        for name, layer in layers.items():
            seconds = min(timeit.repeat(partial(layer, x), number=1, repeat=7))
            timings.append({"n": n, "layer": name, "ms": seconds * 1e3})
torch.set_num_threads(threads)
line_chart(timings, x="n:Q", y="ms:Q", color="layer:N", x_scale={"type": "log", "base": 2},
           y_scale={"type": "log"}, formats={"ms": ".2f"}, x_title="sequence length n",
           y_title="milliseconds per forward pass", height=280,
           title=f"One layer, forward pass, one CPU thread (torch {torch.__version__})")


# %% [markdown]
# The digits vary from machine to machine; look at the shapes. In the stored run the convolution, one
# large matrix product, is the fastest at each length; self-attention beats the LSTM's $n$ sequential
# steps on short sequences and falls behind from about $n = d_\text{model}$, sooner than the operation
# count predicts (exercise 1). On parallel hardware (not measured here), attention's and the
# convolution's work can spread over many cores; the LSTM's steps cannot.
#
# So for sentences a self-attention layer costs no more operations than a recurrent one, runs them in
# parallel and puts every pair of words one step apart. Part II trains the model.

# %% [markdown]
# ## Exercises
#
# 1. **Where attention becomes the dearer layer.** With `self_attention_flops` (both parts) and
#    `lstm_flops`, find by algebra the shortest length $n$ at which a self-attention layer costs
#    more FLOPs than an LSTM layer of width $d$: `crossover_length(d)`. The check counts it out.
# 2. **Restricted self-attention.** Write `restricted_layer(r)`, like `attention_layer` but with a
#    band mask so that each position sees those at most $r$ away, and `restricted_path(n, r)`, the
#    layers it takes for position $n - 1$ to depend on position 0 (Table 1 says $O(n/r)$). The
#    check lets `layers_to_connect` count them.

# %% tags=["hide-cell"]
# Exercises 1 and 2: our solutions (hidden in the book). Replace them with yours.
def crossover_length(d: int) -> int:
    """8 n d^2 + 4 n^2 d > 16 n d^2 exactly when n > 2 d."""
    return 2 * d + 1


def restricted_layer(r: int):
    """One head of self-attention that sees only positions at most r away."""
    attn = MultiHeadedAttention(h=1, d_model=width, dropout=0.0).double()

    def layer(x: torch.Tensor) -> torch.Tensor:
        i = torch.arange(x.size(1))
        band = (i[:, None] - i[None, :]).abs() <= r  # (n, n)
        return attn(x, x, x, mask=band.unsqueeze(0))
    return layer


def restricted_path(n: int, r: int) -> int:
    """Each layer reaches r positions further: ceil((n - 1) / r) layers."""
    return -(-(n - 1) // r)


# %%
# Check exercises 1 and 2
for d in (8, 64, 512):
    costs_more = [sum(self_attention_flops(n, d)) > lstm_flops(n, d) for n in range(1, 4 * d)]
    assert costs_more.index(True) + 1 == crossover_length(d), d
print("exercise 1: correct")
torch.manual_seed(0)
for n, r in ((16, 1), (33, 4), (40, 8)):
    assert layers_to_connect(lambda depth, r=r: restricted_layer(r), n) == restricted_path(n, r)
print("exercise 2: correct")
