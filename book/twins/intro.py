# %% [markdown]
# # The Annotated Transformer, as a book
#
# In 2017 a short paper, *Attention Is All You Need* {cite}`vaswani2017attention`, replaced the
# recurrent networks that machine translation had been built on with a model made almost
# entirely of attention. That model, the Transformer, is now the shape of nearly every large
# language, speech and vision model. This book rebuilds it from an empty file, in PyTorch
# {cite}`paszke2019pytorch`, one section of the paper at a time, and checks every piece as it
# goes.
#
# The book follows the tradition of *The Annotated Transformer* {cite}`rush2018annotated`,
# later revised by {cite:t}`huang2022annotated`: the paper's argument and a working
# implementation side by side. Its code keeps the classic version's API on purpose: the public
# names and the structure of the model (`make_model`, `EncoderDecoder`, `MultiHeadedAttention`,
# `Batch`, `run_epoch` and the rest) follow the Harvard NLP code (MIT licence), so that readers
# who know it find their way. The text and the code inside that structure are written anew: the
# code runs on today's PyTorch, the numbers in the text were measured by the cells that print
# them, and a test suite checks both the code and the chapters.

# %% tags=["setup", "hide-cell"]
# Setup (hidden in the book). In Google Colab, install the book's package: it brings the
# module the chapters import from and the libraries they use, and leaves Colab's torch alone.
# Everywhere else, `make book` has already built an environment with all of it.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPO = "https://github.com/annotated-transformer/annotated-transformer-book"
    REF = "v0.2.0"  # the tag or commit this notebook comes from
    package = f"the-annotated-transformer[book] @ git+{REPO}@{REF}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

from the_annotated_transformer import enable_book_charts

enable_book_charts()

# %% [markdown]
# ## What the book covers
#
# The chapters follow the paper.
#
# * **Part I, the model** (the paper's sections 1 to 4): the encoder and decoder stacks,
#   scaled dot-product and multi-head attention, the feed-forward layers, embeddings and
#   positional encodings, the assembled model, and why self-attention beats recurrence and
#   convolution on the measures that matter for long sequences.
# * **Part II, training** (section 5): batches and masks, the training loop, batching by token
#   count, the learning-rate schedule and optimizer, dropout and label smoothing, and two small
#   tasks (copying and sorting) that a CPU learns in minutes, each checked over ten runs (five
#   seeds, two kernel sets).
# * **Part III, a real-world example**: German-to-English translation on Multi30k
#   {cite}`elliott2016multi30k`, trained on a CPU or on one or many GPUs, with checkpoints that
#   survive interruptions, and scored with sacreBLEU {cite}`post2018call`; then the three things
#   the paper did to get more out of a trained model: beam search with a length penalty,
#   averaging the last checkpoints, and subword vocabularies; all of them together in the
#   paper's own recipe, with a table of results (section 6.1) whose differences are tested for
#   significance, with tying and averaging measured apart, and whose failures are counted; a miniature of the paper's table of model
#   variations; English constituency parsing with the same model (section 6.3), against two
#   baselines; and
#   how to make the model fast, measured: a key/value cache for decoding, fused attention and
#   layer norm, packed projections, bfloat16 on CPUs that have it, a benchmark run on a CPU
#   and on one GPU, a roofline that bounds what float32 decoding can gain on a CPU, then what
#   half an hour of training on two CPU cores reaches (on the faster of two CPUs, the level of
#   the 80-minute model, over two seeds; one of them is what `make translate` uses); and the
#   training program itself, on one process or many devices (the gradients averaged
#   over all devices' tokens, each process its own share of the batches), with
#   checkpoints inside an epoch and what to do when a machine dies.
# * **Part IV, beyond the paper**: the Transformer seen as a graph, run whole on packed
#   sentences and with a sparse attention pattern; what the trained translation model attends
#   to, layer by layer and head by head; what came after (encoder-only and decoder-only
#   models, with a small language model trained with today's recipe, sampled with a cache and
#   top-p, and rotary positions measured over seeds); and the
#   Universal Transformer, whose depth adapts to each position.
# * **Conclusion** (section 7): what the book built, what it measured next to the paper, and
#   what a CPU could not reproduce.
#
# The whole model fits in one equation per idea. The one the paper is named after is
# scaled dot-product attention: queries $Q$ are compared with keys $K$, and the scores weigh
# the values $V$,
#
# $$
# \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V .
# $$
#
# Chapter 3 takes it apart term by term.

# %% [markdown]
# ## How to read it
#
# Each chapter is a Jupyter notebook. Read it here, with its outputs as they came out when we
# ran it, or run it yourself:
#
# * **In Colab.** The rocket button at the top of each page opens the chapter in Google Colab.
#   Its first cell (hidden here, under "Show code cell source") installs this book's package and
#   imports what earlier chapters built, so any chapter runs on its own.
# * **On your machine.** Clone the repository and type `make book` to build this book into
#   `_build/html`, or `make test` to run every chapter and every test. Both set up a Python
#   environment in `.venv` first. A CPU is enough for Parts I and II.
#
# Every definition the book makes is written once, in the chapter that explains it, in a cell
# tagged `export`. `make sync` collects those cells, in reading order, into a single module,
# `the_annotated_transformer.py`, which later chapters and the tests import by name:
#
# ```python
# from the_annotated_transformer import make_model, subsequent_mask
# ```
#
# A test fails when the module no longer matches the chapters, so the code you read is the
# code that runs.
#
# What is not about the Transformer (how the charts are stored so that they draw in the built
# book, in JupyterLab, VS Code and Colab, the chart helpers that several chapters share, and
# the code that downloads files and checks their checksums) is kept out of the chapters' way,
# in the appendix {doc}`appendix_infrastructure`.

# %% [markdown]
# Here is a first chart: the BLEU scores that the paper reports for English-to-German
# translation on newstest2014 (its Table 2), the Transformer next to the best models of the
# time, and what each cost to train, in the floating-point operations that the paper estimates
# (it gives none for ByteNet). Like every chart in the book, it is one call to a helper; the
# helper's code is in the hidden cell above the chart.

# %% tags=["export", "hide-cell"]
from collections.abc import Sequence
from typing import Any


def paper_results_chart(results: Sequence[dict[str, Any]]) -> Any:
    """Two bar panels with a row per model: the BLEU score, and the training cost in FLOPs."""
    import altair as alt

    if not results:
        raise ValueError("results is empty: there are no models to draw")
    bars = alt.Chart(alt.Data(values=list(results))).mark_bar().encode(
        y=alt.Y("model:N", sort=None, title=None),
        color=alt.Color("kind:N", title=None),
        tooltip=["model:N", "BLEU:Q", alt.Tooltip("cost:Q", title="FLOPs (10^18)")],
    )
    bleu = bars.encode(
        x=alt.X("BLEU:Q", scale=alt.Scale(domain=[20, 30], clamp=True), title="BLEU (EN-DE)")
    ).properties(width=300, height=180, title="English-to-German BLEU, newstest2014")
    cost = bars.encode(
        x=alt.X("cost:Q", title="training cost (10¹⁸ FLOPs)"),
        y=alt.Y("model:N", sort=None, title=None, axis=None),
    ).properties(width=200, height=180, title="Training cost (none given for ByteNet)")
    return alt.hconcat(bleu, cost).resolve_scale(y="shared")  # one row per model in both


# %%
# Single models, English-to-German, newstest2014 (Vaswani et al., 2017, Table 2); the training
# cost in units of 10^18 floating-point operations.
table_2 = [
    {"model": "ByteNet", "BLEU": 23.75, "cost": None, "kind": "earlier models"},
    {"model": "GNMT + RL", "BLEU": 24.6, "cost": 23, "kind": "earlier models"},
    {"model": "ConvS2S", "BLEU": 25.16, "cost": 9.6, "kind": "earlier models"},
    {"model": "MoE", "BLEU": 26.03, "cost": 20, "kind": "earlier models"},
    {"model": "Transformer (base)", "BLEU": 27.3, "cost": 3.3, "kind": "Transformer"},
    {"model": "Transformer (big)", "BLEU": 28.4, "cost": 23, "kind": "Transformer"},
]
paper_results_chart(table_2)

# %% [markdown]
# The models behind the other bars are ByteNet {cite}`kalchbrenner2016neural`, Google's neural
# translation system {cite}`wu2016google`, convolutional sequence-to-sequence learning
# {cite}`gehring2017convolutional` and a mixture of experts {cite}`shazeer2017outrageously`.
# The base Transformer beat them all after twelve hours on eight GPUs, at about a third of the
# training cost of the cheapest of them (ConvS2S) and a seventh of the dearest (GNMT + RL); the
# big one scored higher still at the cost of GNMT + RL. In Part III we train a smaller one on a
# smaller task and measure what it reaches.
#
# ## Credits
#
# The model and every idea in Parts I and II are from {cite:t}`vaswani2017attention`. The idea
# of annotating the paper with running code is Alexander Rush's {cite}`rush2018annotated`; the
# 2022 revision {cite}`huang2022annotated` brought it up to date with the PyTorch of its day. The
# copy and sort tasks and the picture of the Transformer as a graph come from the Deep Graph
# Library's tutorial {cite}`wang2019dgl`. Where this book departs from the classic version, to
# fix a bug or to follow current practice, a note says so and why.
#
# The next chapter starts where the paper starts: with the problem the Transformer was built to
# solve.
