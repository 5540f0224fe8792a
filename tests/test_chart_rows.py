"""How nbval compares the rows of a chapter's charts (tools/chart_rows.py, used by conftest.py)."""

import json

import altair as alt
import nbformat
from chart_rows import VARY_TAG, VEGA_LITE_MIME, chart_rows, charts_difference, rows_difference
from sync import chapters


def spec(values: list[dict]) -> dict:
    chart = alt.Chart(alt.Data(values=values)).mark_line().encode(x="x:Q", y="y:Q")
    return chart.to_dict()


def output(values: list[dict]) -> dict:
    return {"output_type": "display_data", "data": {VEGA_LITE_MIME: spec(values)}}


ROWS = [{"x": 1, "y": 0.25, "kind": "a"}, {"x": 2, "y": 1.5e-3, "kind": "b"}]


def test_rows_are_found_inline_in_named_data_sets_and_in_csv_text():
    layered = {"layer": [{"data": {"values": ROWS}}, {"data": {"values": "x,y\n1,0.5\n"}}],
               "datasets": {"data-abc": [{"x": 3}]}}
    assert chart_rows(layered) == [ROWS, [{"x": "1", "y": "0.5"}], [{"x": 3}]]
    by_name = {"layer": [{"data": {"name": "data-b"}}, {"data": {"name": "data-a"}}],
               "datasets": {"data-a": [{"x": 1}], "data-b": [{"x": 2}]}}
    assert chart_rows(by_name) == [[{"x": 2}], [{"x": 1}]]  # where they are used


def test_float_noise_and_a_rounding_that_went_the_other_way_are_the_same_rows():
    noisy = [{"x": 1, "y": 0.25 * (1 + 1e-6), "kind": "a"}, {"x": 2, "y": 1.5e-3, "kind": "b"}]
    assert rows_difference(spec(ROWS), spec(noisy)) is None
    rounded = [{"v": 0.123}]
    assert rows_difference(spec(rounded), spec([{"v": 0.124}])) is None  # one unit of 0.001
    assert rows_difference(spec(rounded), spec([{"v": 0.126}])) is not None


def test_other_numbers_labels_or_row_counts_are_reported_in_one_line():
    other = [{"x": 1, "y": 0.27, "kind": "a"}, {"x": 2, "y": 1.5e-3, "kind": "b"}]
    assert rows_difference(spec(ROWS), spec(other)) == (
        "data set 0, row 0, 'y': 0.25 stored, 0.27 drawn now")
    relabelled = [dict(ROWS[0], kind="c"), ROWS[1]]
    assert "'kind': 'a' stored, 'c' drawn now" in rows_difference(spec(ROWS), spec(relabelled))
    assert rows_difference(spec(ROWS), spec(ROWS[:1])) == (
        "data set 0: 2 rows stored, 1 drawn now")


def test_a_cells_charts_are_compared_in_order_and_stored_json_text_is_read():
    stored = [output(ROWS), {"output_type": "stream", "text": "hi"}]
    stored_as_text = [{"data": {VEGA_LITE_MIME: json.dumps(spec(ROWS))}}]
    assert charts_difference(stored, [output(ROWS)]) is None
    assert charts_difference(stored_as_text, [output(ROWS)]) is None
    assert charts_difference(stored, [output([{"x": 1, "y": 9.0, "kind": "a"}, ROWS[1]])])


def test_only_cells_that_draw_a_chart_say_that_its_rows_vary():
    tagged = [(path.stem, index) for path in chapters()
              for index, cell in enumerate(nbformat.read(path, as_version=4).cells)
              if VARY_TAG in cell.get("metadata", {}).get("tags", [])]
    charts = {(path.stem, index) for path in chapters()
              for index, cell in enumerate(nbformat.read(path, as_version=4).cells)
              if any(VEGA_LITE_MIME in out.get("data", {}) for out in cell.get("outputs", []))}
    assert tagged and set(tagged) <= charts, sorted(set(tagged) - charts)
