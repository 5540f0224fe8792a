# %% [markdown]
# # Background: from recurrence to attention
#
# **The paper, §1–2.** Recurrent networks, the state of the art in translation, compute one
# position after another, so a sentence cannot be processed in parallel; convolutional models work
# in parallel, but the operations needed to relate two positions grow with their distance. The
# Transformer relates any two positions in a constant number of operations, with attention alone.

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

from the_annotated_transformer import enable_book_charts, line_chart

enable_book_charts()

# %% [markdown]
# ## Recurrence: one position after another
#
# Translation is *transduction*: a German sentence goes in, an English one of another length comes
# out. The leading models before 2017 had an **encoder** that turned the source into vectors and a
# **decoder** that wrote the target one symbol at a time {cite}`sutskever2014sequence`, mostly
# recurrent: an LSTM {cite}`hochreiter1997long` updates a hidden state, $h_t = f(h_{t-1}, x_t)$,
# which summarises everything up to position $t$. That has two costs.
#
# * **No parallelism within a sequence.** $h_t$ waits for $h_{t-1}$: $n$ words are $n$ steps in
#   order, and only the batch, which memory limits for long sentences, is left for parallel work;
#   factorized LSTMs {cite}`kuchaiev2017factorization` and conditional computation
#   {cite}`shazeer2017outrageously` made steps cheaper, not fewer.
# * **Long paths between words.** For word $t$ to depend on word $t-d$, the information, and the
#   gradient that teaches it, must pass through $d$ applications of $f$.
#
# **Attention** {cite}`bahdanau2015neural,luong2015effective` gave the decoder a shortcut: at each
# output step, an average of *all* the encoder's states, weighted by how relevant each source word
# is now. The recurrent networks around it still marched in order.
#
# ## Convolution: parallel, but distance still costs
#
# ByteNet {cite}`kalchbrenner2016neural` and ConvS2S {cite}`gehring2017convolutional` compute
# every position from a window of $k$ neighbours, all positions at once. Distance now costs
# layers: an ordinary layer widens the window by $k-1$ positions, so relating two words $d$ apart
# takes about $d/(k-1)$ layers, **linear** in $d$ (ConvS2S); *dilated* convolutions double their
# gaps from layer to layer and need about $\log_2 d$, **logarithmic** (ByteNet). The cell counts
# these steps for $k = 3$, until one window first covers both positions (chapter 6 asks a stricter
# question).

# %%
import math


def convolution_layers(d: int, k: int = 3) -> int:
    """Stacked layers of width k until a window spans distance d (ConvS2S-like)."""
    return math.ceil(d / (k - 1))


def dilated_convolution_layers(d: int, k: int = 3) -> int:
    """Layers of width k, dilations 1, 2, 4, ..., until the window spans d (ByteNet-like)."""
    layers, reach = 0, 0
    while reach < d:
        reach += (k - 1) * 2**layers
        layers += 1
    return layers


models = {
    "recurrent (LSTM)": lambda d: d,  # one update per position
    "convolution, k=3 (ConvS2S)": convolution_layers,
    "dilated convolution, k=3 (ByteNet)": dilated_convolution_layers,
    "self-attention (Transformer)": lambda d: 1,
}
rows = [{"distance": 2**i, "model": model, "steps": steps(2**i)}
        for i in range(11) for model, steps in models.items()]
for d in (16, 1024):
    print(f"distance {d:4d}: " + ", ".join(f"{m} {steps(d)}" for m, steps in models.items()))

# %%
line_chart(rows, x="distance:Q", y="steps:Q", color="model:N",
           x_title="distance d (positions)", y_title="steps to relate the two positions",
           x_scale={"type": "log", "base": 2}, y_scale={"type": "log", "base": 2}, height=280,
           title="How far apart can two words be?")


# %% [markdown]
# On log-log axes, look at the slopes: recurrence and ConvS2S grow linearly with the distance, the
# dilated stack by one layer per doubling, self-attention not at all.
#
# ## Self-attention
#
# *Self-attention* applies attention inside one sequence: each position's new representation is a
# weighted average over all positions of the same sequence. It had served, mostly beside recurrent
# networks {cite}`cheng2016long,parikh2016decomposable,lin2017structured` (Parikh et al.'s used none,
# §1), and in memory networks {cite}`sukhbaatar2015end`. A self-attention layer relates every pair of
# positions in one step, with matrix products that run in parallel, and pays twice: comparing all
# pairs costs work that grows with the square of the length (chapter 6), and an average blurs what it
# averages, a loss of resolution that the paper counters with multi-head attention (§2; chapter 3).
#
# The Transformer builds encoder and decoder from attention and feed-forward layers alone, with
# positional encodings for order (chapter 4). The next chapter builds its skeleton.

# %% [markdown]
# ## Exercises
#
# 1. **The reach of a dilated stack.** Write `dilated_reach(layers, k)`, the largest distance that
#    `layers` layers of width `k` with dilations 1, 2, 4, ... span, as a closed formula. The check
#    asks `dilated_convolution_layers` for exactly `layers` layers at your distance, and one more
#    a position further. Our solution is in the hidden cell; replace its body with yours.
# 2. **Parallel in training, serial at inference.** Which part of the Transformer is still
#    sequential when it *translates*, and why does that part not slow down training?
#
# ```{dropdown} Answer to 2
# The decoder at inference: each output token is fed back in to choose the next, so $m$ tokens
# take $m$ calls. In training the whole target is known (teacher forcing, chapter 7), and one
# masked call computes all $m$ positions at once.
# ```

# %% tags=["hide-cell"]
# Exercise 1: our solution (hidden in the book). Replace the body with yours.
def dilated_reach(layers: int, k: int = 3) -> int:
    """Distance spanned by `layers` layers of width k with dilations 1, 2, 4, ..."""
    return (k - 1) * (2**layers - 1)


# %%
# Check exercise 1
for k in (2, 3, 5):
    for layers in range(1, 12):
        reach = dilated_reach(layers, k)
        assert dilated_convolution_layers(reach, k) == layers, (layers, k)
        assert dilated_convolution_layers(reach + 1, k) == layers + 1, (layers, k)
print("exercise 1: correct")
