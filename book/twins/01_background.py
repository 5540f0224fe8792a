# %% [markdown]
# # Background: from recurrence to attention
#
# Before 2017, a neural translation system read a sentence one word at a time. This chapter
# follows sections 1 and 2 of {cite:t}`vaswani2017attention`: what that cost, what convolutional
# models did about it, and the idea the Transformer kept.

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
# Translation is *transduction*: a German sentence goes in, an English one of another length
# comes out. The leading models of 2017 had an
# **encoder** that turned the source into vectors and a **decoder** that wrote the target one
# symbol at a time {cite}`sutskever2014sequence`, both recurrent: an LSTM
# {cite}`hochreiter1997long` updates a hidden state, $h_t = f(h_{t-1}, x_t)$, which summarises
# everything up to position $t$. That has two costs.
#
# * **No parallelism within a sequence.** $h_t$ waits for $h_{t-1}$: $n$ words are $n$ steps in
#   order, and only the batch, which long sentences shrink, is left for parallel work.
#   Factorized LSTMs {cite}`kuchaiev2017factorization` and conditional computation
#   {cite}`shazeer2017outrageously` made each step cheaper, not fewer.
# * **Long paths between words.** For word $t$ to depend on word $t-d$, the information, and the
#   gradient that teaches it, must pass through $d$ applications of $f$.
#
# **Attention** {cite}`bahdanau2015neural,luong2015effective` gave the decoder a shortcut: at
# every output step, a weighted average of *all* the encoder's states, weighted by how relevant
# each source word is now. But the recurrent networks around it still marched through their
# sequences one position at a time.
#
# ## Convolution: parallel, but distance still costs
#
# A convolution computes every position from a window of $k$ neighbours, all positions at once,
# as ByteNet {cite}`kalchbrenner2016neural` and ConvS2S {cite}`gehring2017convolutional` did.
# Now distance costs layers: an ordinary layer widens the window by $k-1$ positions, so relating
# two words $d$ apart takes about $d/(k-1)$ layers in ConvS2S, **linear** in $d$; ByteNet's
# *dilated* convolutions double their gaps from layer to layer and need about $\log_2 d$,
# **logarithmic** in $d$. The cell counts these steps for $k = 3$, until one window first covers
# both positions (chapter 6 asks a stricter question).

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
# On log-log axes the recurrent line has slope one, ConvS2S runs parallel to it at half the
# height, the dilated stack gains a layer each time the distance doubles, and self-attention stays
# flat. Short paths make distant dependencies easier to learn (the paper's §4; chapter 6).
#
# ## Self-attention
#
# *Self-attention* applies attention inside one sequence: each position's new representation is a
# weighted average over all positions of the same sequence. It had served next to recurrent
# networks {cite}`cheng2016long,parikh2016decomposable,lin2017structured`, and memory networks
# {cite}`sukhbaatar2015end` had repeated attention without recurrence. A self-attention layer
# relates every pair of positions in one step, with matrix products that run in parallel, and
# pays twice: all pairs of $n$ positions of width $d$ cost $O(n^2 \cdot d)$ per layer, against
# $O(n \cdot d^2)$ for a recurrent layer, cheaper only while sentences are shorter than the representation is wide
# (chapter 6); and an average blurs what it averages, a loss of resolution that the paper counters
# with multi-head attention (§2; chapter 3).
#
# {cite:t}`vaswani2017attention` built encoder and decoder from self-attention alone, with
# positional encodings for order (chapter 4), and translated better than the models before it at
# a fraction of their training cost (the paper's Table 2). The next chapter builds its skeleton.

# %% [markdown]
# ## Exercises
#
# 1. **The reach of a dilated stack.** Write `dilated_reach(layers, k)`, the largest distance
#    that `layers` layers of width `k` with dilations 1, 2, 4, ... span, as a closed formula. The
#    check asks that a stack spanning your distance needs exactly `layers` layers of
#    `dilated_convolution_layers`, and one position further one more. Our solution is in the
#    hidden cell; replace its body with yours.
# 2. **Parallel in training, serial at inference.** Which part of the Transformer is still
#    sequential when it *translates*, and why does that part not slow down training?
#
# ```{dropdown} Answer to 2
# The decoder at inference time: each output token is fed back in to choose the next one, so $m$
# output tokens take $m$ calls. In training the whole target is known (teacher forcing, chapter
# 7), and one masked call computes all $m$ positions at once.
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
