# %% [markdown]
# # The Annotated Transformer, as a book
#
# In 2017 a short paper, *Attention Is All You Need* {cite}`vaswani2017attention`, replaced the
# recurrent networks that machine translation had been built on with a model made almost entirely
# of attention. That model, the Transformer, became the shape of the large language, speech and
# vision models that followed. This book rebuilds it in PyTorch {cite}`paszke2019pytorch`, one
# section of the paper at a time, checking each piece.
#
# Like *The Annotated Transformer* {cite}`rush2018annotated,huang2022annotated`, it sets the paper's
# argument beside working code and keeps that code's public names (`make_model`,
# `MultiHeadedAttention`, `run_epoch`...); the text and the code are written anew. Where the code
# departs from the paper's base model, {doc}`departures` gives the change and its reason. A number in
# the text is the paper's, cited, or printed by a cell of its chapter, which may read it from the
# training runs the book stores.

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
# * **Part I, the model** (§1–4): attention, the encoder and decoder, embeddings and positions,
#   and why self-attention.
# * **Part II, training** (§5): batches and masks, the training loop, the schedule,
#   regularization, and two toy tasks for a CPU.
# * **Part III, a real-world example**: German-to-English translation on Multi30k
#   {cite}`elliott2016multi30k`, scored with sacreBLEU {cite}`post2018call`; the paper's model
#   variations and parser in miniature; speed, and many devices.
# * **Part IV, beyond the paper**: the Transformer as a graph, what a trained model attends to,
#   the language models that followed, the Universal Transformer.
# * **Conclusion** (§7): what we measured beside the paper.
#
# **The short path**: chapters {doc}`1 <01_background>` to {doc}`5 <05_full_model>` build the
# model, {doc}`7 <07_batches_and_masking>`, {doc}`8 <08_training_loop>` and
# {doc}`10 <10_schedule_and_optimizer>` train it, {doc}`12 <12_copy_task>` watches it learn, and
# {doc}`14 <14_multi30k_training>` translates with the model the book ships.

# %% [markdown]
# ## How to read it
#
# Each chapter is a Jupyter notebook, shown with its outputs; the rocket button opens it in Google
# Colab. On your machine, `make book` builds the book and `make test` runs the chapters and the
# tests. A CPU is enough: the models the book ships were trained on CPUs. The code also runs on
# CUDA GPUs and across processes (chapter 22).
#
# Each definition is written once, in the chapter that explains it; `make sync` collects them into
# the module `the_annotated_transformer`, which later chapters and the tests import, and a test fails
# when the two differ, so the code you read is the code that runs ({doc}`appendix_infrastructure`).

# %% [markdown]
# A first chart: the paper's English-to-German BLEU scores on newstest2014 (its Table 2), and its
# estimate of what each model cost to train, in floating-point operations.

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
# The other bars are ByteNet {cite}`kalchbrenner2016neural`, Google's neural translation system
# {cite}`wu2016google`, convolutional sequence-to-sequence learning {cite}`gehring2017convolutional`
# and a mixture of experts {cite}`shazeer2017outrageously`. The base Transformer beat them all at
# about a third of the cost of ConvS2S, the cheapest with an estimate.
#
# ## Credits
#
# The model is {cite:t}`vaswani2017attention`'s. Annotating the paper with running code, and the copy
# task, are Alexander Rush's {cite}`rush2018annotated`; the Deep Graph Library's tutorial
# {cite}`wang2019dgl` reused that task and added the sort task and the Transformer drawn as a graph,
# which this book takes from it. Notes mark where this book departs from the classic version, and
# why.
