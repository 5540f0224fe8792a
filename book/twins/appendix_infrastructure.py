# %% [markdown]
# # Appendix: charts, downloads and checksums
#
# The chapters call a few functions that have nothing to do with the Transformer: the renderer
# that stores every chart so that it draws wherever a chapter is opened, the chart helpers that
# several chapters share, the capture and drawing of attention maps, and the code that downloads a
# file and checks it against its published checksum. They are collected here, out of the way of
# the model, and like every other definition they go into `the_annotated_transformer.py`, which
# the chapters import by name. The first section tells how that module is assembled.

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

from the_annotated_transformer import (
    BOOK_REPOSITORY,
    BOOK_REPOSITORY_REF,
    Batch,
    Embeddings,
    LabelSmoothing,
    TokenBudgetSampler,
    TrainConfig,
    attention,
    beam_search,
    evaluate,
    greedy_decode,
    make_model,
    multi30k_loader,
    rate,
    read_vocabularies,
    run_groups,
    subsequent_mask,
    train_epoch,
)

# %% [markdown]
# ## One module, grown chapter by chapter
#
# Every cell tagged `export` goes into `the_annotated_transformer.py` (`make sync` writes it; the
# chapters are the source). Most names are defined once, in the chapter that explains them. A few
# are *grown*: the chapter that teaches an idea shows its smallest version, and a later chapter
# that needs more defines the same name again, in a cell tagged `export` and `extends`. The grown
# definition keeps every earlier parameter as it was and adds keyword-only options whose defaults
# give the earlier behaviour, so a call written in an earlier chapter means the same thing after
# the name has grown. Running the chapters in order, the name means the grown definition from
# that cell on; the module keeps only the last one.
#
# Chapter 5's `greedy_decode` is the plain decoding loop; chapter 14 adds `banned`, the ids a
# translation must never contain, and chapter 21 adds `use_cache`, which reuses the keys and
# values of earlier steps; chapter 15's `beam_search` grows the same `use_cache` there. Chapter
# 8's `run_groups` accumulates gradients over a group of batches, and chapter 14's `train_epoch`
# and `evaluate` run it on one device; chapter 22 grows all three with the hooks that
# DistributedDataParallel and autocast need, and it grows chapter 9's `TokenBudgetSampler` and
# chapter 14's `multi30k_loader`, which give one process all the batches, with `num_replicas`
# and `rank`, which deal each process its share. Chapter 14's `TrainConfig`, its presets and its
# data functions know two word vocabularies; chapter 17 grows them for one joint subword
# vocabulary: two fields and the `cpu_subword` preset, a `subwords` option of
# `read_vocabularies`, and a sentencepiece branch inside `multi30k_vocabularies`,
# `encode_examples`, `encode_text` and `decode_text`, whose signatures do not change; chapter 21's
# recipe grows `TrainConfig` and the presets again ({doc}`appendix_performance` defines it), by
# `fast`, `decay`, `cpu_bf16`, `paper_dropout`, `batch_tokens` and the `cpu_fast` and
# `cpu_fast_dropout` presets; that class also holds three fields for {doc}`appendix_data`'s
# subword vocabularies of large corpora, and the data appendix grows `multi30k_vocabularies`
# with them. The
# module's signatures, each parameter (or field) with the chapter that brought it:

# %%
import inspect

first_in = {"greedy_decode": 5, "run_groups": 8, "TokenBudgetSampler": 9, "train_epoch": 14,
            "evaluate": 14, "multi30k_loader": 14, "beam_search": 15, "TrainConfig": 14,
            "read_vocabularies": 14}
grown_in = {  # the parameters a later chapter added, with that chapter
    "greedy_decode": {"banned": 14, "use_cache": 21},
    "run_groups": {"group_norm": 22, "sync_context": 22, "forward_context": 22, "after_group": 22},
    "train_epoch": {"autocast_dtype": 22, "bar": 22},
    "evaluate": {"autocast_dtype": 22},
    "TokenBudgetSampler": {"num_replicas": 22, "rank": 22},
    "multi30k_loader": {"num_replicas": 22, "rank": 22},
    "beam_search": {"use_cache": 21},
    "TrainConfig": {"subwords": 17, "share_embeddings": 17, "fast": 21, "decay": 21,
                    "cpu_bf16": 21, "paper_dropout": 21, "batch_tokens": 21,
                    **dict.fromkeys(["subword_sentences", "character_coverage", "share_vocab"],
                                    "appendix_performance (for appendix_data)")},
    "read_vocabularies": {"subwords": 17},
}
for function in [greedy_decode, run_groups, TokenBudgetSampler, train_epoch, evaluate,
                 multi30k_loader, beam_search, TrainConfig, read_vocabularies]:
    name, names = function.__name__, list(inspect.signature(function).parameters)
    chapter_of = {p: grown_in[name].get(p, first_in[name]) for p in names}
    first = [p for p in names if p not in grown_in[name]]
    assert names[:len(first)] == first  # the grown parameters come after the first ones
    print(f"{name}:")
    for chapter in sorted(set(chapter_of.values()), key=lambda c: (isinstance(c, str), c)):
        label = f"chapter {chapter}" if isinstance(chapter, int) else chapter  # or an appendix
        print(f"  {label}:", ", ".join(p for p in names if chapter_of[p] == chapter))

# %% [markdown]
# The tests hold the rule: a name defined in two chapters must be tagged `extends` in the later
# one, the grown signature must begin with the earlier one, a first definition may not carry a
# parameter that only a later chapter uses, and each grown definition, at its defaults, must
# compute what its first definition computes.

# %% [markdown]
# ## Charts that draw everywhere
#
# The book draws its charts with altair {cite}`vanderplas2018altair`, which describes a chart as
# a Vega-Lite specification and leaves the drawing to JavaScript. Each chart is stored in its
# chapter as the mime bundle that notebook front ends draw themselves: JupyterLab and VS Code
# draw `application/vnd.vegalite.v5+json` with no network and no trust needed. An HTML output
# with a script would stay blank in a notebook the reader has not trusted, and JupyterLab shows
# the HTML whenever a bundle holds both, so the bundle holds no HTML. Altair 6 writes Vega-Lite
# 6, which JupyterLab 4 does not know; the book's charts use only what version 5 reads, so the
# bundle names version 5 (a test opens a chapter in JupyterLab and waits for its charts). The
# built book turns the same bundle into a call to the Vega, Vega-Lite and vega-embed that it
# serves itself, so its pages draw offline too (`tools/book_charts.py`, when the book is
# built).
#
# Colab is the exception. Its output frame draws HTML and runs the scripts in it, and altair
# has kept a renderer for it since its early versions; whether Colab also draws the Vega-Lite
# mime type of a stored output is not documented, so a chapter opened in Colab may show a
# stored chart as its one line of text until the cell runs. Once the setup cell has run there,
# `enable_book_charts` picks altair's `colab` renderer, which writes HTML that loads Vega from
# a CDN (Colab is online anyway), and every chart the reader runs is drawn.

# %% tags=["export"]
import json
import sys
import uuid

VEGA_LITE_MIME = "application/vnd.vegalite.v5+json"
VEGA_LITE_V5_SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"


def book_chart_bundle(spec: dict, **metadata) -> dict[str, dict | str]:
    """The stored form of a chart: a Vega-Lite spec that notebook front ends draw themselves."""
    title = spec.get("title", "untitled")
    text = title.get("text", "untitled") if isinstance(title, dict) else title
    return {
        VEGA_LITE_MIME: {**spec, "$schema": VEGA_LITE_V5_SCHEMA},
        "text/plain": f"<altair chart: {text}>",
    }


def book_chart_html(spec: dict) -> str:
    """The built book's form of a chart: a container and a call to the page's own vegaEmbed."""
    chart_id = f"vega-chart-{uuid.uuid4().hex}"
    spec_json = json.dumps(spec, sort_keys=True).replace("</", "<\\/")  # never end the script
    options = '{"actions": false}'
    script = f'vegaEmbed(document.getElementById("{chart_id}"), {spec_json}, {options});'
    return f'<div id="{chart_id}" class="book-chart"></div>\n<script>\n{script}\n</script>'


def enable_book_charts() -> None:
    """Show altair charts as the bundle above; in Colab, as altair's HTML that Colab draws."""
    import altair as alt

    if "google.colab" in sys.modules:
        alt.renderers.enable("colab")
        return
    alt.renderers.register("book", book_chart_bundle)
    alt.renderers.enable("book")


# %% [markdown]
# ## Chart helpers that several chapters share
#
# Most of the book's charts are one of three kinds: curves of a measurement against a
# setting (a loss against the epoch, a time against the sequence length), bars of one number
# per case, and a mask drawn as a grid of allowed and forbidden cells. One helper draws each
# kind, so that a chapter shows one short call where the picture belongs. Fields are altair
# shorthands, `"name:Q"` for a quantity, `"name:O"` for an ordered and `"name:N"` for a
# named category.

# %% tags=["export"]
from collections.abc import Mapping, Sequence
from typing import Any


def chart_rows(rows: Any, fields: Sequence[str | None]) -> list[dict[str, Any]]:
    """Rows (a list of dicts or a DataFrame) as a list of dicts that hold every named field."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    if not records:
        raise ValueError("rows is empty: there is nothing to draw")
    names = [field.split(":")[0] for field in fields if field is not None]
    missing = [name for name in names if name not in records[0]]
    if missing:
        raise ValueError(f"fields {missing} are not in the rows, which have {list(records[0])}")
    return records


def axis_title(title: str | None) -> Any:
    """An axis title for altair: None keeps the field's name, "" hides the title."""
    import altair as alt

    if title == "":
        return None
    return alt.Undefined if title is None else title


def chart_scale(options: Mapping[str, Any] | None) -> Any:
    """An altair scale from its options, or altair's default scale for none."""
    import altair as alt

    return alt.Scale(**options) if options else alt.Undefined


def chart_tooltip(fields: Sequence[str | None], formats: Mapping[str, str] | None) -> list:
    """A tooltip entry per field, formatted where `formats` names a d3 format for it."""
    import altair as alt

    formats = formats or {}
    return [
        alt.Tooltip(field, format=formats[field.split(":")[0]])
        if field.split(":")[0] in formats else field
        for field in dict.fromkeys(f for f in fields if f is not None)
    ]


def line_chart(
    rows: Any,
    *,
    x: str,
    y: str,
    title: str,
    color: str | None = None,
    column: str | None = None,
    x_title: str | None = None,
    y_title: str | None = None,
    color_title: str | None = None,
    x_scale: Mapping[str, Any] | None = None,
    y_scale: Mapping[str, Any] | None = None,
    y_format: str | None = None,
    formats: Mapping[str, str] | None = None,
    extra_tooltip: Sequence[str] = (),
    points: bool = True,
    dash: bool = False,
    line_color: str | None = None,
    width: int = 480,
    height: int = 260,
) -> Any:
    """Curves of y against x, one per value of `color`, in one panel per value of `column`.

    An axis title of None keeps the field's name and "" hides it. `x_scale` and `y_scale` are
    altair scale options (`{"type": "log", "base": 2}`); `y_format` formats the y axis; `formats`
    maps fields to the d3 format their tooltip shows.
    """
    import altair as alt

    records = chart_rows(rows, [x, y, color, column, *extra_tooltip])
    encoding = {
        "x": alt.X(x, title=axis_title(x_title), scale=chart_scale(x_scale)),
        "y": alt.Y(y, title=axis_title(y_title), scale=chart_scale(y_scale),
                   axis=alt.Axis(format=y_format) if y_format else alt.Undefined),
        "tooltip": chart_tooltip([color, column, x, y, *extra_tooltip], formats),
    }
    if color is not None:
        encoding["color"] = alt.Color(color, title=color_title, sort=None)
        if dash:
            encoding["strokeDash"] = alt.StrokeDash(color, title=color_title, sort=None)
    if column is not None:
        encoding["column"] = alt.Column(column, title=None, sort=None)
    mark = {"point": True} if points else {}
    if line_color is not None:
        mark["color"] = line_color
    return (
        alt.Chart(alt.Data(values=records))
        .mark_line(**mark)
        .encode(**encoding)
        .properties(width=width, height=height, title=title)
    )


def bar_chart(
    rows: Any,
    *,
    x: str,
    y: str,
    title: str,
    x_title: str | None = None,
    y_title: str | None = None,
    value_format: str | None = None,
    value_domain: Sequence[float] | None = None,
    formats: Mapping[str, str] | None = None,
    extra_tooltip: Sequence[str] = (),
    width: int = 480,
    height: int = 200,
) -> Any:
    """One bar per category: the quantitative field (":Q") of x and y is the bar's length.

    Axis titles as in `line_chart`; `value_format` formats the value axis (`"%"`),
    `value_domain` fixes its range.
    """
    import altair as alt

    quantitative = [field for field in (x, y) if field.endswith(":Q")]
    if len(quantitative) != 1:
        raise ValueError(f"exactly one of x={x!r} and y={y!r} must be quantitative (':Q')")
    records = chart_rows(rows, [x, y, *extra_tooltip])
    channels = {}
    for name, field, title_text in (("x", x, x_title), ("y", y, y_title)):
        options = {"title": axis_title(title_text)}
        if field in quantitative:
            options["axis"] = alt.Axis(format=value_format) if value_format else alt.Undefined
            domain = {"domain": list(value_domain)} if value_domain else None
            options["scale"] = chart_scale(domain)
        else:
            options["sort"] = None
        channels[name] = (alt.X if name == "x" else alt.Y)(field, **options)
    category = y if x in quantitative else x
    return (
        alt.Chart(alt.Data(values=records))
        .mark_bar()
        .encode(**channels, tooltip=chart_tooltip([category, *extra_tooltip, *quantitative],
                                                  formats))
        .properties(width=width, height=height, title=title)
    )


def mask_chart(
    mask: Any,
    *,
    title: str,
    labels: Sequence[str] | None = None,
    x_title: str = "key position j",
    y_title: str = "query position i",
    size: int = 300,
) -> Any:
    """A boolean mask (n_q, n_k), or (1, n_q, n_k), as a grid: blue where a query may attend.

    `labels` names the positions (tokens, say) instead of numbering them.
    """
    import altair as alt

    if mask.dim() == 3 and mask.size(0) == 1:
        mask = mask[0]
    if mask.dim() != 2:
        raise ValueError(f"mask must be (n_q, n_k) or (1, n_q, n_k), got {tuple(mask.shape)}")
    n_q, n_k = mask.shape
    if labels is not None and len(labels) != max(n_q, n_k):
        raise ValueError(f"labels has {len(labels)} names for a mask of shape {(n_q, n_k)}")
    names = list(labels) if labels is not None else [str(i) for i in range(max(n_q, n_k))]
    cells = [
        {"query": names[i], "key": names[j], "may attend": bool(mask[i, j])}
        for i in range(n_q)
        for j in range(n_k)
    ]
    colors = alt.Scale(domain=[True, False], range=["#4c78a8", "#e8e8e8"])
    return (
        alt.Chart(alt.Data(values=cells))
        .mark_rect(stroke="white")
        .encode(
            x=alt.X("key:N", sort=names, title=x_title),
            y=alt.Y("query:N", sort=names, title=y_title),
            color=alt.Color("may attend:N", scale=colors),
            tooltip=["query:N", "key:N", "may attend:N"],
        )
        .properties(width=size, height=size, title=title)
    )


# %% [markdown]
# Each helper checks what it is given. A mask of the decoder, drawn by the helper that
# chapters 2 and 7 use, and what a mistyped field name says:

# %%
enable_book_charts()  # as every chapter's setup cell does
mask_chart(subsequent_mask(5), title="subsequent_mask(5)", size=160)

# %%
try:
    line_chart([{"epoch": 1, "loss": 2.0}], x="epoch:Q", y="los:Q", title="a typo")
except ValueError as err:
    print(err)

# %% [markdown]
# ## Part I's charts
#
# Chapter 3 draws how scaling keeps the softmax soft (`scaling_chart`) and one map of attention
# weights (`weights_heatmap`); chapter 4 draws the table of positional encodings
# (`encoding_heatmap`). Each chapter shows one call; the altair code is here.

# %% tags=["export"]
import math
from typing import Any

import torch


def scaling_chart(scaling: Any, *, n_keys: int) -> Any:
    """Spread of the scores, largest weight and entropy against d_k, scaled and unscaled."""
    import altair as alt

    log2 = alt.Scale(type="log", base=2)
    common = alt.Chart(scaling).encode(
        x=alt.X("d_k:Q", scale=log2, axis=alt.Axis(values=[1, 8, 64, 512])),
        color=alt.Color("scores:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=["d_k", "scores", "std of scores", "mean max weight", "mean entropy (nats)"],
    )
    lines = common.mark_line(point=True).properties(width=150, height=160)
    spread = lines.encode(y=alt.Y("std of scores:Q", scale=alt.Scale(type="log")))
    peak = lines.encode(y=alt.Y("mean max weight:Q", scale=alt.Scale(domain=[0, 1])))
    entropy = lines.encode(
        y=alt.Y("mean entropy (nats):Q", scale=alt.Scale(domain=[0, math.log(n_keys)]))
    )
    return (spread.properties(title="spread of the scores")
            | peak.properties(title="largest softmax weight")
            | entropy.properties(title="entropy of the weights"))


def weights_heatmap(weights: torch.Tensor, *, title: str) -> Any:
    """One map of attention weights (n_q, n_k): a cell per query and key, darker for more."""
    import altair as alt

    if weights.dim() != 2:
        raise ValueError(f"weights must be (n_q, n_k), got shape {tuple(weights.shape)}")
    cells = [{"query": i, "key": j, "weight": round(w, 3)}
             for i, row in enumerate(weights.tolist()) for j, w in enumerate(row)]
    return alt.Chart(alt.Data(values=cells)).mark_rect().encode(
        x="key:O", y="query:O", color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues")),
        tooltip=["query:O", "key:O", "weight:Q"],
    ).properties(width=220, height=220, title=title)


def encoding_heatmap(pe: torch.Tensor, *, title: str) -> Any:
    """A positional encoding table (positions, d_model) as a grid, red below 0, blue above."""
    import altair as alt

    cells = [{"position": pos, "dimension": dim, "value": round(value, 2)}
             for pos, row in enumerate(pe.tolist()) for dim, value in enumerate(row)]
    ticks = [alt.Axis(values=list(range(0, size, 8))) for size in pe.shape]  # every 8th label
    return alt.Chart(alt.Data(values=cells)).mark_rect().encode(
        x=alt.X("dimension:O", axis=ticks[1]), y=alt.Y("position:O", axis=ticks[0]),
        color=alt.Color("value:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1])),
        tooltip=["position:O", "dimension:O", "value:Q"],
    ).properties(width=384, height=240, title=title)


# %% [markdown]
# (checking-inputs)=
# ## Checking inputs
#
# A wrong argument fails far from its cause: a mask of the wrong shape broadcasts into scores it
# was not meant for, an id past the vocabulary raises a bare `IndexError` inside `nn.Embedding`.
# So the functions that a reader calls with tensors of their own check them first and raise a
# `TypeError` or `ValueError` of one line that names the argument and what it should be. The
# checks are plumbing, not the idea, so they live here and each function in the chapters makes
# one call: `subsequent_mask` (chapter 2) calls `check_positive_int`, `attention` (chapter 3)
# `_check_mask`, `Embeddings` (chapter 4) `check_token_ids`, `Batch` (chapter 7) `check_batch`,
# `rate` (chapter 10) `check_schedule`, and `LabelSmoothing` (chapter 11) `check_smoothing`
# when it is built and `check_log_probs` when it is called.

# %% tags=["export"]
from typing import Any

import torch


def check_positive_int(value: int, name: str, meaning: str) -> None:
    """Raise TypeError unless `value` is an int, ValueError unless it is at least 1."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int ({meaning}), got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1 ({meaning}), got {value}")


def _check_mask(mask: torch.Tensor, scores: torch.Tensor) -> None:
    """Raise ValueError unless `mask` broadcasts to the scores without enlarging them."""
    try:
        fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the "
                         f"attention scores of shape {tuple(scores.shape)} (batch, h, n_q, n_k)")


def check_token_ids(x: torch.Tensor, vocab: int) -> None:
    """Raise TypeError for ids that are not integers, ValueError for one outside [0, vocab)."""
    if x.is_floating_point() or x.is_complex():
        raise TypeError(f"token ids must be an integer tensor, got dtype {x.dtype}")
    if x.numel() and (x.min() < 0 or x.max() >= vocab):
        bad = x[(x < 0) | (x >= vocab)][0].item()
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")


def is_id_matrix(x: Any) -> bool:
    """Whether `x` is a (batch, n) tensor of integer token ids."""
    return isinstance(x, torch.Tensor) and x.dim() == 2 and not x.is_floating_point()


def check_batch(src: torch.Tensor, tgt: torch.Tensor | None) -> None:
    """Raise unless src is (batch, n_src) ids and tgt, if given, (batch, n_tgt >= 2) ids."""
    if not is_id_matrix(src):
        raise TypeError("src must be an integer tensor of shape (batch, n_src)")
    if tgt is None:
        return
    if not is_id_matrix(tgt):
        raise TypeError("tgt must be an integer tensor of shape (batch, n_tgt)")
    if tgt.size(0) != src.size(0) or tgt.size(1) < 2:
        raise ValueError(f"tgt must have shape ({src.size(0)}, n_tgt) with n_tgt >= 2, "
                         f"got {tuple(tgt.shape)}")


def check_schedule(step: int, model_size: int, warmup: int) -> None:
    """Raise ValueError for a negative step, or a model size or warm-up that is not positive."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    if model_size <= 0:
        raise ValueError(f"model_size={model_size} must be a positive d_model")
    if warmup <= 0:
        raise ValueError(f"warmup={warmup} must be a positive number of steps")


def check_smoothing(size: int, padding_idx: int, smoothing: float) -> None:
    """Raise ValueError unless the vocabulary, padding id and smoothing make a target."""
    if size < 3:
        raise ValueError(f"size={size} must be >= 3: the true token, padding and another")
    if not 0 <= padding_idx < size:
        raise ValueError(f"padding_idx={padding_idx} must be in [0, size={size})")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing} must be in [0, 1)")


def check_log_probs(x: torch.Tensor, target: torch.Tensor, size: int) -> None:
    """Raise ValueError unless x is (rows, size) and target (rows,)."""
    if x.dim() != 2 or x.size(1) != size:
        raise ValueError(f"x must be log-probabilities of shape (rows, {size}), "
                         f"got {tuple(x.shape)}")
    if target.shape != x.shape[:1]:
        raise ValueError(f"target must have shape ({x.size(0)},), got {tuple(target.shape)}")


# %% [markdown]
# What each check says, for one bad argument of each function:

# %%
ids = torch.tensor([[4, 5, 6]])  # (batch, n)
bad_calls = {
    "subsequent_mask(0)": lambda: subsequent_mask(0),
    "subsequent_mask(2.5)": lambda: subsequent_mask(2.5),
    "attention, mask for 4 keys of 3": lambda: attention(
        torch.zeros(1, 3, 2), torch.zeros(1, 3, 2), torch.zeros(1, 3, 2),
        mask=torch.ones(1, 1, 4, dtype=torch.bool)),
    "Embeddings(8, vocab=5)": lambda: Embeddings(d_model=8, vocab=5)(ids),
    "Batch(float src)": lambda: Batch(ids.float()),
    "Batch(tgt of one token)": lambda: Batch(ids, ids[:, :1]),
    "rate(step=-1)": lambda: rate(-1, model_size=512, factor=1.0, warmup=4000),
    "LabelSmoothing(smoothing=1)": lambda: LabelSmoothing(6, padding_idx=2, smoothing=1.0),
    "LabelSmoothing(x of 5 columns)": lambda: LabelSmoothing(6, padding_idx=2)(
        torch.zeros(3, 5), torch.zeros(3, dtype=torch.long)),
}
for call, bad in bad_calls.items():
    try:
        bad()
    except (TypeError, ValueError) as error:
        print(f"{call}: {type(error).__name__}: {error}")
    else:
        raise AssertionError(f"{call} was accepted")

# %% [markdown]
# ## Attention maps and their charts
#
# Chapters 12, 13 and 24 look at where trained models attend. Chapter 3's `MultiHeadedAttention`
# keeps the weights of its last call in `.attn`, a detached tensor of shape (batch, $h$, $n_q$,
# $n_k$), and each layer has its own modules for the three kinds of attention: the encoder's
# self-attention (source positions look at source positions), the decoder's self-attention
# (target positions look at earlier target positions) and the decoder-to-source attention
# (target positions look at the encoder's output). One forward pass fills all of them.
# `attention_maps` makes that pass, *teacher-forced* on a known decoder input and in evaluation
# mode, stacks the layers, and cuts each sequence of a padded batch back to its real length, so
# that no row or column belongs to padding. It returns one `AttentionMaps` per sequence.

# %% tags=["export"]
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

ATTENTION_KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "decoder-to-source attention",
}


@dataclass(frozen=True)
class AttentionMaps:
    """A sentence pair's attention weights, each (N layers, h heads, rows, columns), and tokens."""

    encoder: torch.Tensor  # (N, h, n_src, n_src)
    decoder: torch.Tensor  # (N, h, n_tgt, n_tgt)
    cross: torch.Tensor  # (N, h, n_tgt, n_src)
    src_tokens: list[str]  # the n_src source tokens
    tgt_tokens: list[str]  # the n_tgt decoder inputs: <s>, then the tokens produced so far

    def axes(self, kind: str) -> tuple[torch.Tensor, list[str], list[str]]:
        """The weights of one kind with the tokens of its rows (queries) and columns (keys)."""
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}")
        rows = self.src_tokens if kind == "encoder" else self.tgt_tokens
        cols = self.tgt_tokens if kind == "decoder" else self.src_tokens
        return getattr(self, kind), rows, cols


def real_length(ids: torch.Tensor, pad_id: int) -> int:
    """How many ids of a 1-D row come before its padding (padding only at the end)."""
    n = int((ids != pad_id).sum())
    if n == 0 or bool((ids[n:] != pad_id).any()):
        raise ValueError(
            f"each row must be at least one token followed only by padding (pad_id={pad_id}), "
            f"got {ids.tolist()}"
        )
    return n


def attention_maps(
    model: nn.Module,
    src: torch.Tensor,
    tgt: torch.Tensor,
    *,
    src_tokens: Sequence[Sequence[str]] | None = None,
    tgt_tokens: Sequence[Sequence[str]] | None = None,
    pad_id: int = 2,
) -> list[AttentionMaps]:
    """Every layer's and head's attention in one teacher-forced pass, one entry per sentence.

    src (batch, n_src) and tgt (batch, n_tgt) hold ids padded at the end with pad_id; tgt is
    the decoder input (starting with <s>). Padding is cut away; tokens default to the ids.
    """
    if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != tgt.size(0):
        raise ValueError(
            "src and tgt must have shapes (batch, n_src) and (batch, n_tgt), "
            f"got {tuple(src.shape)} and {tuple(tgt.shape)}"
        )
    src_mask = (src != pad_id).unsqueeze(-2)  # (batch, 1, n_src)
    tgt_mask = (tgt != pad_id).unsqueeze(-2) & subsequent_mask(tgt.size(1)).to(tgt.device)
    was_training = model.training
    model.eval()  # no dropout: the weights the model uses when it translates
    with torch.no_grad():
        model(src, tgt, src_mask, tgt_mask)
    model.train(was_training)
    encoder = torch.stack([layer.self_attn.attn for layer in model.encoder.layers], dim=1)
    decoder = torch.stack([layer.self_attn.attn for layer in model.decoder.layers], dim=1)
    cross = torch.stack([layer.src_attn.attn for layer in model.decoder.layers], dim=1)
    # each (batch, N, h, rows, columns)
    maps = []
    for b in range(src.size(0)):
        n_src, n_tgt = real_length(src[b], pad_id), real_length(tgt[b], pad_id)
        s_tok = src_tokens[b] if src_tokens else [str(i) for i in src[b, :n_src].tolist()]
        t_tok = tgt_tokens[b] if tgt_tokens else [str(i) for i in tgt[b, :n_tgt].tolist()]
        if len(s_tok) != n_src or len(t_tok) != n_tgt:
            raise ValueError(
                f"sentence {b} has {n_src} source and {n_tgt} target ids but "
                f"{len(s_tok)} src_tokens and {len(t_tok)} tgt_tokens"
            )
        maps.append(AttentionMaps(
            encoder=encoder[b, :, :, :n_src, :n_src].cpu(),  # (N, h, n_src, n_src)
            decoder=decoder[b, :, :, :n_tgt, :n_tgt].cpu(),  # (N, h, n_tgt, n_tgt)
            cross=cross[b, :, :, :n_tgt, :n_src].cpu(),  # (N, h, n_tgt, n_src)
            src_tokens=list(s_tok),
            tgt_tokens=list(t_tok),
        ))
    return maps


# %% [markdown]
# A check on a small untrained model: two sequences of different lengths in one padded batch.
# Each map has the shape layers × heads × rows × columns, every row sums to 1 over the real
# positions, the decoder's self-attention puts nothing above the diagonal, and the first
# sequence's maps are the same whether it comes alone or padded in a batch.

# %%
torch.manual_seed(0)
tiny = make_model(11, 11, N=2, d_model=32, d_ff=64, h=4)
src = torch.tensor([[0, 5, 6, 7, 1], [0, 8, 1, 2, 2]])  # (batch, n_src), 2 = padding
tgt = torch.tensor([[0, 4, 9, 3], [0, 10, 2, 2]])  # (batch, n_tgt)
batch_maps = attention_maps(tiny, src, tgt)
for b, m in enumerate(batch_maps):
    print(f"sentence {b}: encoder {tuple(m.encoder.shape)}, decoder {tuple(m.decoder.shape)}, "
          f"cross {tuple(m.cross.shape)}")
    for kind in ATTENTION_KINDS:
        weights, _, _ = m.axes(kind)
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert (m.decoder.triu(diagonal=1) == 0).all()
alone = attention_maps(tiny, src[:1], tgt[:1])[0]
for kind in ATTENTION_KINDS:
    torch.testing.assert_close(alone.axes(kind)[0], batch_maps[0].axes(kind)[0])
print("rows sum to 1; padding changes nothing")

# %% [markdown]
# A heatmap in altair wants long-form data, one row per cell: `attention_records` makes a row
# for each (kind, layer, head, query position, key position) with its weight, rounded to 3
# decimals. Positions, not tokens, place the cells, because tokens repeat (a sentence may hold
# the same word twice); tokens are only labels. Cells below `min_weight` can be left out to keep
# pages light, except in the first row and column, which keep every token on the axes.

# %% tags=["export"]
from collections.abc import Sequence
from typing import Any


def attention_records(
    maps: AttentionMaps,
    *,
    kinds: Sequence[str] = ("encoder", "decoder", "cross"),
    decimals: int = 3,
    min_weight: float = 0.0,
    **fields: Any,
) -> list[dict[str, Any]]:
    """Long-form rows for a heatmap: one per (kind, layer, head, row, column) with its weight.

    Rows and columns are positions (tokens may repeat), labelled by their tokens; layers and
    heads count from 1; `fields` (e.g. sentence=1) are added to every row. Rounded weights below
    min_weight are left out, except in the first row and column, which keep every position on
    a chart's axes.
    """
    records = []
    for kind in kinds:
        weights, row_tokens, col_tokens = maps.axes(kind)  # (N, h, rows, columns)
        for layer, per_layer in enumerate(weights.tolist(), start=1):
            for head, matrix in enumerate(per_layer, start=1):
                for row, weight_row in enumerate(matrix):
                    for col, weight in enumerate(weight_row):
                        weight = round(weight, decimals)
                        if weight < min_weight and row > 0 and col > 0:
                            continue
                        records.append({
                            **fields, "kind": kind, "layer": layer, "head": head,
                            "row": row, "row_token": row_tokens[row],
                            "col": col, "col_token": col_tokens[col], "weight": weight,
                        })
    return records


# %% [markdown]
# `attention_chart` draws all the rows as one heatmap and lets the reader choose which map to
# see: each control field becomes a Vega-Lite parameter bound to a widget (a menu for the kind,
# a slider for a run of three or more integers such as layers, buttons otherwise), and a filter
# keeps the cells of the chosen map. The data is embedded once, as CSV, which is smaller than
# the same rows as JSON objects.

# %% tags=["export"]
import csv
import io
from collections.abc import Sequence
from typing import Any


def attention_chart(
    records: Sequence[dict[str, Any]],
    *,
    controls: Sequence[str] = ("kind", "layer", "head"),
    width: int = 340,
    height: int = 340,
    title: str = "",
    initial: dict[str, Any] | None = None,
):
    """One heatmap of `attention_records` rows with a widget per control field to pick a map.

    The data is embedded once; the widgets (a menu for the kind, a slider for runs of three or
    more integers, buttons otherwise) drive a filter, so one chart shows every layer and head.
    The chart opens on the first value of each control, or on the values `initial` gives.
    """
    import altair as alt

    if not records:
        raise ValueError("records is empty: there is no attention to draw")
    missing = [field for field in controls if field not in records[0]]
    if missing:
        raise ValueError(f"controls {missing} are not fields of the records: {list(records[0])}")
    params = []
    for field in controls:
        values = list(dict.fromkeys(r[field] for r in records))  # in order of appearance
        name = f"{field} "
        if field == "kind":
            labels = [ATTENTION_KINDS.get(v, v) for v in values]
            bind = alt.binding_select(options=values, labels=labels, name=name)
        elif len(values) > 2 and values == list(range(values[0], values[0] + len(values))):
            bind = alt.binding_range(min=values[0], max=values[-1], step=1, name=name)
        else:
            bind = alt.binding_radio(options=values, name=name)
        value = (initial or {}).get(field, values[0])
        if value not in values:
            raise ValueError(f"initial {field}={value!r} is not among the values {values}")
        params.append(alt.param(name=f"pick_{field}", value=value, bind=bind))
    picked = " && ".join(f"datum['{field}'] == pick_{field}" for field in controls)
    fields = list(records[0])
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    parse = {f: "number" if isinstance(records[0][f], int | float) else "string" for f in fields}
    data = alt.Data(values=text.getvalue(), format=alt.CsvDataFormat(type="csv", parse=parse))
    # "position token" categories keep repeated tokens apart; the axes show only the token.
    axis = {"labelExpr": "substring(datum.value, indexof(datum.value, ' ') + 1)"}
    return (
        alt.Chart(data)
        .transform_filter(picked)
        .transform_calculate(
            query="datum.row + ' ' + datum.row_token", key="datum.col + ' ' + datum.col_token"
        )
        .mark_rect()
        .encode(
            x=alt.X("key:N", sort=alt.EncodingSortField("col", op="min"), title="key (looked at)",
                    axis=alt.Axis(labelAngle=-45, **axis)),
            y=alt.Y("query:N", sort=alt.EncodingSortField("row", op="min"),
                    title="query (looking)", axis=alt.Axis(**axis)),
            color=alt.Color("weight:Q", title="weight",
                            scale=alt.Scale(domain=[0, 1], range=["white", "#08306b"])),
            tooltip=[
                alt.Tooltip("row_token:N", title="query"),
                alt.Tooltip("col_token:N", title="key"),
                alt.Tooltip("weight:Q", format=".3f"),
                alt.Tooltip("row:O", title="query position"),
                alt.Tooltip("col:O", title="key position"),
            ],
        )
        .add_params(*params)
        .properties(width=width, height=height, title=title)
    )


# %% [markdown]
# ## Downloads and checksums
#
# Data that arrives over the network can arrive broken, and a broken download that is read
# anyway fails much later and far from the cause. So every file the book downloads (Multi30k,
# see {doc}`appendix_data`, and the shipped models) goes through `download_file`: it writes to a
# temporary file next to the target and renames it only once its SHA-256 checksum is the
# published one, so a half-finished download never looks like a finished one.
# `repository_root` finds the checkout a chapter runs in, where the book keeps its data and
# its trained model.

# %% tags=["export"]
import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path


def repository_root() -> Path | None:
    """The folder holding the_annotated_transformer.py (a notebook has no __file__: search up)."""
    module_file = globals().get("__file__")
    if module_file is not None and Path(module_file).name == "the_annotated_transformer.py":
        return Path(module_file).resolve().parent
    for folder in [Path.cwd(), *Path.cwd().parents]:
        if (folder / "the_annotated_transformer.py").is_file():
            return folder
    return None


def sha256_of(path: str | os.PathLike) -> str:
    """The SHA-256 checksum of a file, read in blocks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_file(url: str, path: Path, *, sha256: str) -> None:
    """Download url to path through a temporary file, renamed only once its checksum is right."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        tmp = Path(f.name)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    f.write(block)
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise
    if sha256_of(tmp) != sha256:
        tmp.unlink()
        raise ValueError(
            f"downloaded {url}, but its SHA-256 checksum is not the expected {sha256}: the "
            "download broke or the published file changed; try again, or put intact copies "
            f"in {path.parent} (or in a folder named by MULTI30K_DIR)"
        )
    os.replace(tmp, path)


# %% [markdown]
# A download needs no network to be checked: `urllib` reads `file://` addresses too. A copy
# with the right checksum arrives; one with a wrong checksum raises and leaves nothing behind.

# %%
with tempfile.TemporaryDirectory() as folder:
    source = Path(folder) / "source.txt"
    source.write_text("Attention Is All You Need\n")
    checksum = sha256_of(source)
    download_file(source.as_uri(), Path(folder) / "copy" / "a.txt", sha256=checksum)
    try:
        download_file(source.as_uri(), Path(folder) / "copy" / "b.txt", sha256="0" * 64)
    except ValueError as err:
        print("wrong checksum:", str(err).split(":")[0])
    print(sorted(p.name for p in (Path(folder) / "copy").iterdir()))

# %% [markdown]
# ## Findings over seeds
#
# A training run is one draw: another seed, or another CPU whose float kernels round
# differently, sends it down another path. A chapter that compares runs ("the window loses
# accuracy", "one shared layer sorts as well as two") therefore rests its claim on a sweep that
# `tools/seeds.py` makes: every variant trained from several seeds, each with this CPU's own
# kernels and with the set one level below, stored in `book/data/seeds_<experiment>.json` with
# the command and the machine. `book_data` reads such a file (from the checkout, or from the
# book's repository at the tag a Colab notebook came from), `seed_summary` gives each variant's
# mean and range, and `seeds_chart` draws every run as a point, so the spread is in the picture
# beside the mean.

# %% tags=["export"]
import json


def book_data(name: str) -> Any:
    """A JSON file from book/data: from the checkout, else from the book's repository."""
    root = repository_root()
    if root is not None and (root / "book" / "data" / name).is_file():
        return json.loads((root / "book" / "data" / name).read_text())
    url = f"{BOOK_REPOSITORY}/raw/{BOOK_REPOSITORY_REF}/book/data/{name}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.loads(response.read())
    except OSError as err:  # no such file, or no network
        raise FileNotFoundError(f"book/data/{name} is not in this checkout, and downloading "
                                f"{url} failed ({err})") from None


def seed_summary(runs: Sequence[Mapping[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Per variant, in the order the runs name them: how many runs, and the metric's mean,
    lowest and highest value over them."""
    if not runs:
        raise ValueError("runs is empty: there is nothing to summarize")
    if any(metric not in run for run in runs):
        raise ValueError(f"metric {metric!r} is not in every run; a run has {list(runs[0])}")
    values: dict[str, list[float]] = {}
    for run in runs:
        values.setdefault(run["variant"], []).append(float(run[metric]))
    return [{"variant": variant, "runs": len(v), "mean": sum(v) / len(v), "min": min(v),
             "max": max(v)} for variant, v in values.items()]


def seeds_chart(
    runs: Sequence[Mapping[str, Any]], *, metric: str, title: str, value_format: str = "%",
    width: int = 420,
) -> Any:
    """Every run as a point (colour: the kernels it ran with), each variant's mean as a tick."""
    import altair as alt

    records = chart_rows([{k: run[k] for k in ("variant", "seed", "kernels", metric)}
                          for run in runs], ["variant", "seed", "kernels", metric])
    order = list(dict.fromkeys(r["variant"] for r in records))
    y = alt.Y("variant:N", sort=order, title=None)
    points = alt.Chart(alt.Data(values=records)).mark_point(filled=True, size=60).encode(
        x=alt.X(f"{metric}:Q", title=metric, axis=alt.Axis(format=value_format),
                scale=alt.Scale(zero=False)),
        y=y, color=alt.Color("kernels:N", title="kernels"),
        tooltip=["variant:N", "seed:O", "kernels:N", alt.Tooltip(f"{metric}:Q", format=".4")],
    )
    means = [{"variant": s["variant"], "mean": s["mean"]} for s in seed_summary(records, metric)]
    ticks = alt.Chart(alt.Data(values=means)).mark_tick(color="black", thickness=2, size=18)
    tooltip = ["variant:N", alt.Tooltip("mean:Q", format=".4")]
    ticks = ticks.encode(x="mean:Q", y=y, tooltip=tooltip)
    return (points + ticks).properties(title=title, width=width)


# %% [markdown]
# Three runs of two variants, and what they give:

# %%
example = [{"variant": "A", "seed": s, "kernels": "AVX2", "accuracy": a}
           for s, a in enumerate([0.90, 0.94, 0.92])]
example += [{"variant": "B", "seed": s, "kernels": "AVX2", "accuracy": a}
            for s, a in enumerate([0.91, 0.85, 0.88])]
for row in seed_summary(example, "accuracy"):
    print(f"{row['variant']}: {row['runs']} runs, mean {row['mean']:.3f}, "
          f"range {row['min']:.2f} to {row['max']:.2f}")
seeds_chart(example, metric="accuracy", title="two variants, three seeds each")

# %% [markdown]
# ### The copy and sort tasks over seeds
#
# Chapters 12 and 13 each show one run. `tools/seeds.py copy_task` and `tools/seeds.py sort_task`
# reran their cells from five seeds, each with the CPU's own kernels and with the set one level
# below, and stored each run's best validation accuracy and its test accuracy (and, for sorting,
# the test accuracy at each length), its attention shares, and which of the chapter's assertions
# failed. Look for every copy run within chapter 12's asserted bounds, none with a failed
# assertion, at an epoch that varies with the seed:

# %%
copy_sweep = book_data("seeds_copy_task.json")
print("machine:", copy_sweep["machine"])
copy_runs = copy_sweep["runs"]  # chapter 12's cells, rerun
for row in seed_summary(copy_runs, "exact"):
    print(f"copy, {row['variant']}: {row['runs']} runs, exact {row['min']:.2f} to {row['max']:.2f}")
bounds = {"best validation": 0.98, "test": 0.95}  # chapter 12's assertions, as shares
assert all(run["exact"] >= bounds[run["variant"]] for run in copy_runs)
assert not any(run["failed_asserts"] for run in copy_runs)  # chapter 12's attention bounds too
for key, what in [("share_max", "best head"), ("share_layer1", "first layer's mean")]:
    shares = [run[key] for run in copy_runs]
    print(f"attention share, {what}: {min(shares):.2f} to {max(shares):.2f}")
epochs = [run["epoch"] for run in copy_runs]
print(f"epoch of the best validation count: {min(epochs)} to {max(epochs)}")
seeds_chart(copy_runs, metric="exact", title="Sequences copied exactly, every run")

# %% [markdown]
# Every sort run stays above chapter 13's bounds too, its best head's share included. Where its errors
# fall does not hold across runs: look for the length sorted worst changing from run to run.

# %%
sort_runs = book_data("seeds_sort_task.json")["runs"]  # chapter 13's cells, rerun
for row in seed_summary(sort_runs, "exact"):
    print(f"sort, {row['variant']}: {row['runs']} runs, exact {row['min']:.3f} to {row['max']:.3f}")
assert all(run["exact"] >= 0.9 for run in sort_runs)  # chapter 13's bound
assert not any(run["failed_asserts"] for run in sort_runs)  # its attention bound too
shares = [run["share_max"] for run in sort_runs]
print(f"attention share, best head: {min(shares):.2f} to {max(shares):.2f}")
worst = [min(run["by_length"], key=run["by_length"].get) for run in sort_runs if "by_length" in run]
print("the length sorted worst, run by run:", ", ".join(worst))
seeds_chart(sort_runs, metric="exact", title="Sequences sorted exactly, every run")
