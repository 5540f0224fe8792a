"""The chart helpers of the appendix and the chapters: the spec each one writes, and bad input."""

import sys
import types

import altair as alt
import pandas as pd
import pytest
import torch

from the_annotated_transformer import (
    bar_chart,
    bleu_points_chart,
    enable_book_charts,
    graph_chart,
    length_histogram,
    line_chart,
    mask_chart,
    paper_results_chart,
    smoothed_targets_chart,
    subsequent_mask,
)


def values(spec: dict) -> list[dict]:
    """The rows a spec embeds, inline or in its datasets."""
    if "values" in spec.get("data", {}):
        return spec["data"]["values"]
    return next(iter(spec["datasets"].values()))


def mark_type(spec: dict) -> str:
    mark = spec["mark"]
    return mark if isinstance(mark, str) else mark["type"]


ROWS = [
    {"n": 16, "layer": "attention", "ms": 0.5},
    {"n": 32, "layer": "attention", "ms": 1.25},
    {"n": 16, "layer": "lstm", "ms": 2.0},
]


def test_line_chart_draws_a_line_per_colour_with_the_given_scales_and_formats():
    spec = line_chart(ROWS, x="n:Q", y="ms:Q", color="layer:N", title="timings",
                      x_scale={"type": "log", "base": 2}, y_title="milliseconds",
                      formats={"ms": ".2f"}).to_dict()
    assert mark_type(spec) == "line" and spec["mark"]["point"] is True
    encoding = spec["encoding"]
    assert (encoding["x"]["field"], encoding["x"]["type"]) == ("n", "quantitative")
    assert encoding["x"]["scale"] == {"type": "log", "base": 2}
    assert "scale" not in encoding["y"] and encoding["y"]["title"] == "milliseconds"
    assert "title" not in encoding["x"]  # None keeps the field's name
    assert encoding["color"]["field"] == "layer" and encoding["color"]["title"] is None
    assert {"field": "ms", "type": "quantitative", "format": ".2f"} in encoding["tooltip"]
    assert values(spec) == ROWS and spec["title"] == "timings"


def test_line_chart_options_add_dashes_panels_and_hide_titles():
    spec = line_chart(ROWS, x="n:Q", y="ms:Q", color="layer:N", column="layer:N", dash=True,
                      points=False, x_title="", title="t").to_dict()
    assert spec["mark"] in ("line", {"type": "line"})
    assert spec["encoding"]["strokeDash"]["field"] == "layer"
    assert spec["encoding"]["column"]["field"] == "layer"
    assert spec["encoding"]["x"]["title"] is None


def test_line_chart_takes_a_data_frame_and_names_a_missing_field():
    spec = line_chart(pd.DataFrame(ROWS), x="n:Q", y="ms:Q", title="t").to_dict()
    assert values(spec) == ROWS
    with pytest.raises(ValueError, match=r"fields \['msec'\] are not in the rows"):
        line_chart(ROWS, x="n:Q", y="msec:Q", title="t")
    with pytest.raises(ValueError, match="rows is empty"):
        line_chart([], x="n:Q", y="ms:Q", title="t")


def test_bar_chart_formats_and_bounds_the_value_axis_and_keeps_the_category_order():
    rows = [{"batching": "random", "padding": 0.4}, {"batching": "budget", "padding": 0.1}]
    spec = bar_chart(rows, x="padding:Q", y="batching:N", value_format="%", value_domain=[0, 1],
                     y_title="", title="padding").to_dict()
    assert mark_type(spec) == "bar"
    x, y = spec["encoding"]["x"], spec["encoding"]["y"]
    assert x["axis"] == {"format": "%"} and x["scale"] == {"domain": [0, 1]}
    assert y["sort"] is None and y["title"] is None
    with pytest.raises(ValueError, match="exactly one of x='batching:N' and y='batching:N'"):
        bar_chart(rows, x="batching:N", y="batching:N", title="t")


def test_mask_chart_has_one_cell_per_query_and_key_saying_whether_it_may_attend():
    spec = mask_chart(subsequent_mask(3), title="m").to_dict()
    cells = values(spec)
    assert len(cells) == 9
    assert {"query": "0", "key": "1", "may attend": False} in cells
    assert {"query": "2", "key": "1", "may attend": True} in cells
    assert spec["encoding"]["x"]["sort"] == ["0", "1", "2"]
    words = ["<s>", "a", "b"]
    spec = mask_chart(subsequent_mask(3)[0], labels=words, title="m").to_dict()
    assert {"query": "b", "key": "<s>", "may attend": True} in values(spec)


def test_mask_chart_rejects_a_batch_and_labels_of_the_wrong_length():
    shape = r"mask must be \(n_q, n_k\) or \(1, n_q, n_k\), got \(2, 3, 3\)"
    with pytest.raises(ValueError, match=shape):
        mask_chart(subsequent_mask(3).expand(2, 3, 3), title="m")
    with pytest.raises(ValueError, match="labels has 2 names for a mask of shape"):
        mask_chart(subsequent_mask(3), labels=["a", "b"], title="m")


def test_one_chapter_helpers_check_their_input():
    with pytest.raises(ValueError, match="pairs is empty"):
        length_histogram([], title="t")
    with pytest.raises(ValueError, match=r"true_dist must be \(positions=2, vocabulary\)"):
        smoothed_targets_chart(torch.zeros(3, 4), torch.tensor([1, 2]), title="t")
    with pytest.raises(ValueError, match=r"results lacks the columns \['test BLEU'\]"):
        bleu_points_chart(pd.DataFrame({"val BLEU": [1.0]}), title="t")
    with pytest.raises(ValueError, match="mask must be one sentence's"):
        graph_chart(subsequent_mask(3)[0], title="t")
    with pytest.raises(ValueError, match="results is empty"):
        paper_results_chart([])


def test_one_chapter_helpers_embed_their_rows():
    spec = length_histogram([(["a", "b"], ["c"]), (["a"], ["c"])], title="t").to_dict()
    assert {"language": "German", "tokens": 2, "sentences": 1} in values(spec)
    assert {"language": "English", "tokens": 1, "sentences": 2} in values(spec)
    true_dist = torch.tensor([[0.0, 0.75, 0.25]])
    spec = smoothed_targets_chart(true_dist, torch.tensor([1]), title="t").to_dict()
    assert {"position": "0 (target 1)", "token": 2, "probability": 0.25} in values(spec)
    spec = graph_chart(subsequent_mask(2), title="t").to_dict()
    edges = values(spec["layer"][0])
    assert sorted((e["x"], e["x2"]) for e in edges) == [(0, 0), (0, 1), (1, 1)]  # key, query


def test_enable_book_charts_picks_altairs_html_renderer_in_colab(monkeypatch):
    """Colab draws HTML outputs with their scripts, not the Vega-Lite mime type."""
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    try:
        enable_book_charts()
        assert alt.renderers.active == "colab"
    finally:
        monkeypatch.delitem(sys.modules, "google.colab")
        enable_book_charts()
    assert alt.renderers.active == "book"
