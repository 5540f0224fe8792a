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
# Like *The Annotated Transformer* {cite}`rush2018annotated,huang2022annotated`, it sets the
# paper's argument beside a working implementation, and it keeps that code's public names
# (`make_model`, `EncoderDecoder`, `MultiHeadedAttention`, `Batch`, `run_epoch`...) for readers
# who know it. The text and the code are written anew, for today's
# PyTorch, and every number in the text was measured by the cell that prints it.

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
# * **Part I, the model** (§1–4): attention, the encoder and decoder
#   stacks, embeddings and positions, and why self-attention beats recurrence.
# * **Part II, training** (§5): batches, masks, the training loop, the schedule and
#   regularization, and two small tasks, copying and sorting, that a CPU learns in minutes.
# * **Part III, a real-world example**: German-to-English translation on Multi30k
#   {cite}`elliott2016multi30k`, scored with sacreBLEU {cite}`post2018call` and improved as the
#   paper did it; the paper's model variations and parser in miniature; speed, and training on
#   many devices.
# * **Part IV, beyond the paper**: the Transformer as a graph, what a trained model attends to,
#   the language models that came after, and the Universal Transformer.
# * **Conclusion** (§7): what we measured beside the paper.
#
# **In one sitting**, about two hours: chapters {doc}`1 <01_background>` to
# {doc}`5 <05_full_model>` build the model, {doc}`7 <07_batches_and_masking>`,
# {doc}`8 <08_training_loop>` and {doc}`10 <10_schedule_and_optimizer>` train it,
# {doc}`12 <12_copy_task>` watches it learn, and {doc}`14 <14_multi30k_training>` translates
# with the model the book ships. Every other chapter deepens one step of that path.
#
# The equation the paper is named after is scaled dot-product attention: queries $Q$ are
# compared with keys $K$, and the scores weigh the values $V$,
#
# $$
# \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\left(\frac{Q K^\top}{\sqrt{d_k}}\right) V .
# $$
#
# Chapter 3 takes it apart term by term.

# %% [markdown]
# ## How to read it
#
# Each chapter is a Jupyter notebook, shown with its outputs; the rocket button at the top of a
# page opens it in Google Colab, where it runs on its own. On your machine, `make book` builds
# this book and `make test` runs every chapter and test. A CPU is enough: every model in the
# book was trained on CPUs. The code also runs on CUDA GPUs and across several processes
# (chapter 22).
#
# Every definition is written once, in the chapter that explains it, in a cell tagged `export`;
# `make sync` collects those cells into one module, `the_annotated_transformer.py`, which later
# chapters and the tests import by name:
#
# ```python
# from the_annotated_transformer import make_model, subsequent_mask
# ```
#
# A test fails when the module no longer matches the chapters, so the code you read is the
# code that runs. What is not about the Transformer lives in the appendix
# {doc}`appendix_infrastructure`.

# %% [markdown]
# A first chart: the paper's English-to-German BLEU scores on newstest2014 (its Table 2), and
# what each model cost to train, in floating-point operations.
# Like every chart in the book, it is one call to a helper (in the hidden cell above).

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
# The other bars are ByteNet {cite}`kalchbrenner2016neural`, Google's neural translation
# system {cite}`wu2016google`, convolutional sequence-to-sequence learning
# {cite}`gehring2017convolutional` and a mixture of experts {cite}`shazeer2017outrageously`.
# The base Transformer beat them all at about a third of the training cost of the cheapest.
#
# ## Credits
#
# The model and every idea in Parts I and II are from {cite:t}`vaswani2017attention`; the idea
# of annotating the paper with running code is Alexander Rush's {cite}`rush2018annotated`; the
# copy and sort tasks and the Transformer drawn as a graph come from the Deep Graph Library's
# tutorial {cite}`wang2019dgl`. Where this book departs from the classic version, a note says
# so and why.
