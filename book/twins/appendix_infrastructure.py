# %% [markdown]
# # Appendix: charts, downloads and checksums
#
# The chapters call a few functions that have nothing to do with the Transformer: the renderer
# that stores every chart so that it draws wherever a chapter is opened, the chart helpers that
# several chapters share, and the code that downloads a file and checks it against its
# published checksum. They are collected here, out of the way of the model, and like every
# other definition they go into `the_annotated_transformer.py`, which the chapters import by
# name.

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

from the_annotated_transformer import BOOK_REPOSITORY, BOOK_REPOSITORY_REF, subsequent_mask

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
            options["scale"] = chart_scale({"domain": list(value_domain)} if value_domain else None)
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
# ## Downloads and checksums
#
# Data that arrives over the network can arrive broken, and a broken download that is read
# anyway fails much later and far from the cause. So every file the book downloads (Multi30k
# in chapter 9, the shipped model in chapter 14) goes through `download_file`: it writes to a
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
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.loads(response.read())


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
    """Every run as a point (colour: the kernels it ran with), and each variant's mean as a tick."""
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
    ticks = ticks.encode(x="mean:Q", y=y, tooltip=["variant:N", alt.Tooltip("mean:Q", format=".4")])
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
