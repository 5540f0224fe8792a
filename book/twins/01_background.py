# %% [markdown]
# # Background: from recurrence to attention
#
# Before 2017, a neural translation system read a sentence one word at a time. This chapter
# follows the first two sections of {cite:t}`vaswani2017attention`: what that way of reading
# cost, what convolutional models did about it, and the idea the Transformer kept when it
# threw the rest away.

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
# ## Sequence transduction
#
# Translation is a *transduction* problem: a sequence of symbols goes in (a German sentence)
# and another comes out (its English translation), and the two need not have the same length.
# The models that led the field in 2017 split the work in two. An **encoder** reads the source
# sentence $(x_1, \dots, x_n)$ and turns it into a sequence of vectors; a **decoder** writes the
# target $(y_1, \dots, y_m)$ one symbol at a time, each step looking at the encoder's vectors
# and at what it has written so far {cite}`sutskever2014sequence`. The Transformer keeps this
# split; what it changes is what happens inside the encoder and the decoder.
#
# ## Recurrence: one position after another
#
# A recurrent network, such as the long short-term memory (LSTM) of
# {cite:t}`hochreiter1997long`, reads a sequence by updating a hidden state,
#
# $$
# h_t = f(h_{t-1}, x_t),
# $$
#
# so the state at position $t$ summarises everything up to $t$. That makes recurrence a natural
# fit for language, and it is what made sequence-to-sequence translation work
# {cite}`sutskever2014sequence`. It also has two costs.
#
# * **No parallelism within a sequence.** $h_t$ cannot be computed before $h_{t-1}$. A GPU can
#   run many sentences side by side, but inside one sentence of $n$ words there are $n$ steps
#   that must happen in order. Long sentences also mean fewer of them fit in memory at once, so
#   the batch, the only place left to find parallel work, shrinks exactly when it is needed.
# * **Long paths between words.** For the representation of word $t$ to depend on word $t-d$,
#   the information has to survive $d$ applications of $f$. The gating of the LSTM helps, but
#   every step is a chance to blur or lose it, and the gradient that teaches the dependency has
#   to travel the same $d$ steps back.
#
# Factorization tricks for LSTM layers {cite}`kuchaiev2017factorization` and conditional
# computation {cite}`shazeer2017outrageously` had made each step cheaper, but the sequence of
# steps remained.
#
# ## Attention: a shortcut for the decoder
#
# {cite:t}`bahdanau2015neural` gave the decoder a way around the second cost. Instead of
# squeezing the whole source sentence into one final state, the decoder computes, at every
# output step, a weighted average of *all* the encoder's states, with weights that say how
# relevant each source word is right now. The decoder is then one step away from every source
# word, whatever its position. {cite:t}`luong2015effective` simplified the scoring. But in these
# systems attention sat *on top of* recurrent networks: the encoder and the decoder still
# marched through their sequences one position at a time.
#
# ## Convolution: parallel, but with distance still costing
#
# Convolutional models attacked the first cost. A convolution computes the representation of
# every position from a small window of neighbours, for all positions at once, so a layer has no
# sequential steps at all. ByteNet {cite}`kalchbrenner2016neural` and ConvS2S
# {cite}`gehring2017convolutional` built translation systems this way.
#
# The price moves to the second cost. A layer of kernel width $k$ only sees $k$ neighbours, so
# two words $d$ positions apart are related only after enough layers have been stacked for their
# windows to overlap. ConvS2S stacks ordinary convolutions: each layer widens the view by $k-1$
# positions, and the number of layers needed grows **linearly** with $d$, as about
# $d/(k-1)$. ByteNet uses *dilated* convolutions, whose gaps double from layer to layer, so the
# view doubles too and the number of layers grows **logarithmically**, as about $\log_2 d$.
#
# The cell below counts, for each kind of model, how many steps (recurrent updates or stacked
# layers) connect two positions $d$ apart, with kernel width $k = 3$ for both convolutional
# models. These are idealised counts, not measurements, and they ask when a single window first
# covers both positions: each layer of width $k$ widens a window by $k-1$ positions. Chapter 6
# asks a stricter question with the same kernel, whether the output at one position depends on
# the input at the other. A centred window widens by only $(k-1)/2$ positions on each side per
# layer, so it takes twice as many layers, $n - 1$ for $k = 3$ across a sequence of $n$; either
# way the count grows linearly with the distance.

# %%
import math


def recurrent_steps(d: int) -> int:
    """Recurrent updates between positions d apart: one per position."""
    return d


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


distances = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
rows = []
for d in distances:
    rows += [
        {"distance": d, "model": "recurrent (LSTM)", "steps": recurrent_steps(d)},
        {"distance": d, "model": "convolution, k=3 (ConvS2S)", "steps": convolution_layers(d)},
        {"distance": d, "model": "dilated convolution, k=3 (ByteNet)",
         "steps": dilated_convolution_layers(d)},
        {"distance": d, "model": "self-attention (Transformer)", "steps": 1},
    ]

for d in (16, 1024):
    counts = {r["model"]: r["steps"] for r in rows if r["distance"] == d}
    print(f"distance {d:4d}: " + ", ".join(f"{m} {s}" for m, s in counts.items()))

# %%
line_chart(rows, x="distance:Q", y="steps:Q", color="model:N",
           x_title="distance d (positions)", y_title="steps to relate the two positions",
           x_scale={"type": "log", "base": 2}, y_scale={"type": "log", "base": 2}, height=280,
           title="How far apart can two words be?")


# %% [markdown]
# On these log-log axes the recurrent line climbs with slope one, the ConvS2S-like stack runs
# parallel to it at half the height, the dilated stack grows by one layer each time the distance
# doubles, and self-attention stays flat at one step. The shorter the path between two words,
# the easier it is for a network to learn a dependency between them; the paper uses exactly this
# argument in its section 4, which we return to in chapter 6.
#
# ## Self-attention
#
# *Self-attention* (or intra-attention) applies attention inside a single sequence: every
# position builds its new representation as a weighted average over all positions of the same
# sequence, the weights again computed from the content. Before the Transformer it had been used
# as a component, next to recurrent networks, in reading comprehension
# {cite}`cheng2016long`, natural language inference {cite}`parikh2016decomposable` and sentence
# embeddings {cite}`lin2017structured`. End-to-end memory networks
# {cite}`sukhbaatar2015end` had also shown that attention repeated over several "hops", without
# a recurrence over the sequence, could answer simple questions.
#
# A self-attention layer relates every pair of positions in one step, and it does so for all
# positions at once, with matrix products that a GPU runs in parallel. It has two drawbacks.
# The first is its cost: comparing every pair of $n$ positions of width $d$ takes
# $O(n^2 \cdot d)$ operations per layer, against $O(n \cdot d^2)$ for a recurrent layer, so
# self-attention is the cheaper of the two only while sentences are shorter than the
# representation is wide. They usually are; the paper weighs this in its section 4
# {cite}`vaswani2017attention`, and chapter 6 counts and times it. The second is the averaging:
# a weighted average of many positions is blurrier than any one of them. The Transformer
# answers this with *multi-head* attention, several attentions side by side, each free to look
# at different positions (chapter 3).
#
# ## The Transformer
#
# {cite:t}`vaswani2017attention` took the step nobody had taken: a transduction model whose
# encoder and decoder compute their representations with self-attention alone, and no recurrence
# or convolution at all. Order, which recurrence gave for free, comes back through positional
# encodings added to the inputs (chapter 4). The result translated better than the models before
# it, and the base model did so at a fraction of their training cost (the paper's Table 2,
# charted in the introduction).
#
# You now have the problem the Transformer solves and the shape of its answer: keep the
# encoder-decoder split, replace recurrence by attention everywhere. The next chapter builds the
# skeleton that holds it, the encoder and decoder stacks.

# %% [markdown]
# ## Exercises
#
# 1. **The reach of a dilated stack.** The dilated stack above doubles its dilation at every
#    layer: 1, 2, 4, .... Write `dilated_reach(layers, k)`, the largest distance that `layers`
#    such layers of width `k` span, as a closed formula rather than a loop. The check below
#    compares it with `dilated_convolution_layers`: the stack that spans your distance must need
#    exactly `layers` layers, and one position further must need one more. Our solution is in
#    the hidden cell; replace its body with yours and run the check.
# 2. **Parallel in training, serial at inference.** A recurrent encoder must process a sentence
#    one position after another, even during training. Which part of the Transformer is still
#    sequential when it *translates*, and why does that part not slow down training?
# 3. **Where the shortcut came from.** Attention in the RNN encoder-decoder already gave the
#    decoder a path of length one to every source word. What did it not shorten?
#
# ```{dropdown} Answers to 2 and 3
# 2. The decoder at inference time: each output token is fed back in to choose the next one,
#    so $m$ output tokens take $m$ calls. In training the whole target is known (teacher
#    forcing, chapter 7), and one masked call computes all $m$ positions at once.
# 3. The paths *within* the source and *within* the target: the encoder and the decoder were
#    still recurrent, so two source words $d$ apart were still $d$ steps apart.
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
