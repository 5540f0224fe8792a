# %% [markdown]
# # Why self-attention
#
# Section 4 of {cite:t}`vaswani2017attention` argues for its central choice by comparing a
# self-attention layer with the recurrent and convolutional layers it replaces, on three
# measures: the computation a layer costs, how much of that computation must happen one step
# after another, and how far apart in the network two positions of the sequence are. This
# chapter lays out that comparison, checks the path lengths with autograd, and times the three
# kinds of layer on the CPU this book was built on.

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
# Each layer maps a sequence of $n$ vectors of width $d$ to another such sequence. The paper's
# Table 1 compares them as follows ($k$ is a convolution's kernel width, $r$ the size of the
# neighbourhood that a *restricted* self-attention looks at):
#
# | Layer type | Complexity per layer | Sequential operations | Maximum path length |
# |:--|:--|:--|:--|
# | Self-attention | $O(n^2 \cdot d)$ | $O(1)$ | $O(1)$ |
# | Recurrent | $O(n \cdot d^2)$ | $O(n)$ | $O(n)$ |
# | Convolutional | $O(k \cdot n \cdot d^2)$ | $O(1)$ | $O(\log_k n)$ |
# | Self-attention (restricted) | $O(r \cdot n \cdot d)$ | $O(1)$ | $O(n / r)$ |
#
# **Complexity per layer.** Self-attention compares every position with every other, $n^2$
# dot products of length $d$. A recurrent layer multiplies a $d$-vector by a $d \times d$ matrix
# at each of $n$ positions; a convolution does that $k$ times per position. So self-attention
# is the cheaper layer when $n < d$, which is the usual case for sentences: a sentence of
# word pieces is a few dozen tokens long, and $d = 512$ in the base model.
#
# **Sequential operations.** A recurrent layer cannot compute position $t$ before position
# $t - 1$: $n$ steps in a row. Self-attention and convolution compute all positions at once,
# as a few large matrix products, which is what parallel hardware does best.
#
# **Maximum path length.** The number of layers, or steps, that a signal passes through
# between any two positions. Learning a dependency between two words means sending gradients
# along that path, and the shorter it is the easier {cite}`hochreiter2001gradient`.
# Self-attention connects every pair directly. A recurrent layer connects positions $j$ apart
# through $j$ steps. A convolution of width $k < n$ needs $n / k$ stacked layers with contiguous kernels,
# or $\log_k n$ with dilated ones, as in ByteNet {cite}`kalchbrenner2016neural`.
#
# Restricting self-attention to the $r$ positions around each query (for very long sequences)
# would trade path length for cost: linear in $n$ again, but $n / r$ layers between distant
# positions. The paper proposes it and leaves it for future work.
#
# Two remarks the table leaves out. First, the complexity column counts the attention itself;
# a multi-head attention layer also applies four $d \times d$ projections to every position,
# which cost $O(n \cdot d^2)$ like a recurrent layer. Second, the paper notes a side benefit:
# attention weights can be inspected, and individual heads seem to learn distinct, often
# syntactic, jobs.
#
# ## Counting the operations
#
# To make the complexity column concrete, here are the floating-point operations (a multiply
# and an add count as two) of one layer of each kind with $d = 512$, per sequence, as $n$
# grows. The self-attention columns count its four projections separately from the attention
# proper; the LSTM {cite}`hochreiter1997long` has four gates, each with an input and a
# recurrent $d \times d$ product.

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
# The attention proper costs less than its own projections until $n = 2d = 1024$, and less
# than an LSTM layer until $n = 4d$. In operation counts alone the three layers are within a
# factor of three of each other for sentence-length inputs; what separates them is how those operations can be scheduled, which
# is what the timings below show.
#
# ## Path lengths, checked with autograd
#
# Whether output position $n - 1$ depends on input position $0$ is a question autograd can
# answer. Forward-mode autograd carries, next to every value, its derivative with respect to a
# chosen input: here, input position 0. We push that derivative through a stack of layers, one
# layer at a time, and stop at the first layer where it reaches position $n - 1$ (a non-zero
# derivative means a path exists; with random weights, an exact zero means none does). We
# compute in double precision, because the derivative along a path through a few hundred random
# layers is tiny, around $10^{-120}$, but not zero.

# %%
import torch
import torch.autograd.forward_ad as fwAD
from torch import nn

width = 4  # channels; the answer depends only on how positions are wired together


class Conv(nn.Module):
    """A width-preserving Conv1d of kernel 3 on (batch, n, channels) tensors."""

    def __init__(self, dilation: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv1d(width, width, kernel_size=3, padding=dilation, dilation=dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # (batch, n, width)


class SelfAttention(nn.Module):
    """One head of self-attention, unmasked, as in the encoder."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = MultiHeadedAttention(h=1, d_model=width, dropout=0.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, x, x)


class LSTM(nn.Module):
    """One unidirectional LSTM layer, returning its outputs at every position."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(width, width, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def layers_to_connect(make_layer, n: int, max_layers: int = 1000) -> int:
    """Layers stacked until output position n-1 depends on input position 0 (forward-mode AD)."""
    x = torch.randn(1, n, width, dtype=torch.float64)  # (batch, n, width)
    tangent = torch.zeros_like(x)
    tangent[0, 0] = 1.0  # differentiate with respect to input position 0
    with torch.no_grad(), fwAD.dual_level():
        h = fwAD.make_dual(x, tangent)
        for depth in range(1, max_layers + 1):
            h = make_layer(depth).double()(h)
            if fwAD.unpack_dual(h).tangent[0, -1].abs().sum() > 0:
                return depth
    raise RuntimeError(f"position {n - 1} not reached after max_layers={max_layers}")


torch.manual_seed(0)
threads = torch.get_num_threads()
torch.set_num_threads(1)  # hundreds of tiny layers: one thread avoids waiting on the other
kinds = {
    "convolution, k=3": lambda depth: Conv(),
    "dilated convolution, k=3": lambda depth: Conv(dilation=2 ** (depth - 1)),
    "self-attention": lambda depth: SelfAttention(),
    "LSTM": lambda depth: LSTM(),
}
print("layers until position n-1 depends on position 0")
print(f"{'n':>4s} " + " ".join(f"{kind:>25s}" for kind in kinds))
for n in (16, 64, 256):
    print(f"{n:4d} " + " ".join(f"{layers_to_connect(f, n):25d}" for f in kinds.values()))
torch.set_num_threads(threads)

# %% [markdown]
# A stack of ordinary width-3 convolutions, each reaching one position to either side, needs
# $n - 1$ layers. (Chapter 1 counted about half as many, $d/(k-1)$: it asked when one window
# first covers two positions $d$ apart, which happens at the output halfway between them. Here
# the output at position $n - 1$ itself must see position 0, so the whole distance has to be
# crossed from one side; both counts grow linearly, as the paper's $O(n/k)$ for contiguous
# kernels (§4) says.) With dilations $1, 2, 4, \dots$ the reach doubles with each layer and
# $\lceil \log_2 n \rceil$ layers do; one self-attention layer suffices at any length. One LSTM
# layer connects the two positions as well, but its path runs through $n - 1$ applications of
# the recurrent cell, one after another: autograd counts layers, and the LSTM's length is hidden
# inside one.
#
# ## Timing the three layers
#
# Operation counts and path lengths are properties of the layers; speed also depends on the
# hardware. We time one forward pass of each kind of layer with $d = 256$ (4 heads for
# attention), a batch of 4 sequences, for lengths from 16 to 1024: our `MultiHeadedAttention`
# (chapter 3), PyTorch's `nn.LSTM`, and `nn.Conv1d` with kernel 3. Each measurement is the
# median of 7 repetitions, after one warm-up call; the three layers take turns, so that a
# moment of load on the machine does not fall on one layer only. The machine is a 2-core CPU
# shared with other work, so we time on one thread, which gives steadier numbers; a second
# thread would speed up the large matrix products of attention and convolution more than the
# small sequential ones of the LSTM.

# %%
# NBVAL_IGNORE_OUTPUT
# (wall-clock timings: they vary from run to run and from machine to machine)
import statistics
import time

torch.manual_seed(0)
d_model, batch, repeats = 256, 4, 7
threads = torch.get_num_threads()
torch.set_num_threads(1)
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
        seconds = {name: [] for name in layers}
        for layer in layers.values():
            layer(x)  # warm-up
        for _ in range(repeats):
            for name, layer in layers.items():
                start = time.perf_counter()
                layer(x)
                seconds[name].append(time.perf_counter() - start)
        for name in layers:
            timings.append({"n": n, "layer": name, "ms": statistics.median(seconds[name]) * 1e3})
torch.set_num_threads(threads)

print(f"torch {torch.__version__}, 1 thread; median milliseconds per forward pass")
print(f"{'n':>5s} " + " ".join(f"{name:>18s}" for name in layers))
for n in sorted({t["n"] for t in timings}):
    row = {t["layer"]: t["ms"] for t in timings if t["n"] == n}
    print(f"{n:5d} " + " ".join(f"{row[name]:18.2f}" for name in layers))
ms = {(t["n"], t["layer"]): t["ms"] for t in timings}
for n in (16, 256, 1024):
    lstm_vs_attention = ms[n, "recurrent (LSTM)"] / ms[n, "self-attention"]
    attention_vs_conv = ms[n, "self-attention"] / ms[n, "convolution (k=3)"]
    print(f"n = {n}: LSTM / self-attention {lstm_vs_attention:.1f}, "
          f"self-attention / convolution {attention_vs_conv:.1f}")

line_chart(timings, x="n:Q", y="ms:Q", color="layer:N", x_scale={"type": "log", "base": 2},
           y_scale={"type": "log"}, formats={"ms": ".2f"}, x_title="sequence length n",
           y_title="milliseconds per forward pass", height=280,
           title="One layer, forward pass, one CPU thread")


# %% [markdown]
# Timings vary from run to run: two runs on this book's machine, in different sessions, disagreed by up
# to a factor of two at some lengths, and the table above is just the last of them. So we
# describe only what held in every run, in round numbers; the shape of the curves, not their
# digits, is the point. The convolution, one large matrix product per call, was the fastest
# layer at every length, and its time grew more slowly than $n$: roughly 20 to 40 times for 64
# times the length. The LSTM's time about doubled with every doubling of $n$ from 128 on, from a
# higher start: its $n$ small steps run one after another. At the shortest lengths,
# $n \le 64$, self-attention was about one and a half to three times faster than the LSTM.
# Beyond that the $n \times n$ score matrices took over: from $n = 512$ to 1024
# self-attention's time rose more than fourfold, as a quadratic term does, and at 1024 it took
# two to four times as long as the LSTM. The two crossed somewhere between $n = 128$ and 512;
# the operation counts put the crossover at $n = 2d = 512$, since with $d = 256$,
# self-attention's $8nd^2 + 4n^2d$ equals the LSTM's $16nd^2$ there; counting operations
# leaves out memory traffic and kernel overheads, which moved it earlier in some of our runs.
#
# These are CPU timings on one thread. A GPU speeds up the parallel work of attention and
# convolution far more than the LSTM's steps, which stay sequential, so on the hardware the paper
# used we would expect the advantage of self-attention at sentence lengths to be larger than here.
#
# ## What this means for the Transformer
#
# For the sentences of a translation task, a self-attention layer costs about as much
# computation as the recurrent layer it replaces, does all of it in parallel, and puts every
# pair of words one step apart. Its cost grows with $n^2$, which is the price for very long
# inputs; the paper's answer, restricted attention, is one of many that later work explored.
#
# You now have the paper's case for self-attention, in formulas and in milliseconds. This ends
# Part I: the model is complete. Part II trains it, starting with how batches and masks are
# prepared.

# %% [markdown]
# ## Exercises
#
# 1. **Where attention becomes the dearer layer.** With this chapter's `self_attention_flops`
#    (both parts) and `lstm_flops`, find by algebra the shortest length $n$ at which a
#    self-attention layer costs more FLOPs than an LSTM layer of the same width $d$. Write it
#    as `crossover_length(d)`; the check counts it out for three widths.
# 2. **Restricted self-attention.** The paper's Table 1 lists a self-attention that looks only
#    at the $r$ nearest positions on each side, with a path of length $O(n/r)$. Write the
#    layer, `Restricted(r)` (one `MultiHeadedAttention` head with a band mask, $|i - j| \le r$),
#    and `restricted_path(n, r)`, the number of layers after which position $n - 1$ depends
#    on position 0. The check lets `layers_to_connect` count them.
#
# The hidden cell holds our solutions.

# %% tags=["hide-cell"]
# Exercises 1 and 2: our solutions (hidden in the book). Replace them with yours.
def crossover_length(d: int) -> int:
    """8 n d^2 + 4 n^2 d > 16 n d^2 exactly when n > 2 d."""
    return 2 * d + 1


class Restricted(nn.Module):
    """One head of self-attention that sees only positions at most r away."""

    def __init__(self, r: int) -> None:
        super().__init__()
        self.attn = MultiHeadedAttention(h=1, d_model=width, dropout=0.0)
        self.r = r

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = torch.arange(x.size(1))
        band = (i[:, None] - i[None, :]).abs() <= self.r  # (n, n)
        return self.attn(x, x, x, mask=band.unsqueeze(0))


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
    assert layers_to_connect(lambda depth, r=r: Restricted(r), n) == restricted_path(n, r)
print("exercise 2: correct")
