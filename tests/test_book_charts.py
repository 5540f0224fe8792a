"""The chart renderer: what a chart is stored as, and the HTML the built book makes of it."""

import json
import sys
from pathlib import Path

import altair as alt
import pytest
from docutils import nodes

from the_annotated_transformer import (
    VEGA_LITE_MIME,
    book_chart_bundle,
    book_chart_html,
    enable_book_charts,
)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from book_charts import VegaLiteRenderer  # noqa: E402


class Data:
    """The two attributes of myst-nb's MimeData that the renderer reads."""

    def __init__(self, mime_type: str, content):
        self.mime_type, self.content = mime_type, content

    @property
    def string(self) -> str:
        return self.content


def small_chart() -> alt.Chart:
    values = [{"x": 1, "y": 2}, {"x": 2, "y": 3}]
    return alt.Chart(alt.Data(values=values)).mark_line().encode(x="x:Q", y="y:Q").properties(
        title="a small chart"
    )


def test_enabled_charts_display_as_a_vega_lite_v5_bundle_without_html():
    enable_book_charts()
    bundle = small_chart()._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle
    assert set(bundle) == {VEGA_LITE_MIME, "text/plain"}
    spec = bundle[VEGA_LITE_MIME]
    assert spec["$schema"] == "https://vega.github.io/schema/vega-lite/v5.json"
    assert spec["mark"] in ("line", {"type": "line"})
    assert bundle["text/plain"] == "<altair chart: a small chart>"


def test_bundle_keeps_the_spec_and_only_relabels_its_schema():
    spec = small_chart().to_dict()
    stored = book_chart_bundle(spec)[VEGA_LITE_MIME]
    assert {k: v for k, v in stored.items() if k != "$schema"} == {
        k: v for k, v in spec.items() if k != "$schema"
    }
    assert "/vega-lite/v6" in spec["$schema"], "altair's own spec is left as it was"


def test_book_html_embeds_the_spec_and_cannot_close_its_script_early():
    spec = {"mark": "bar", "title": "</script><b>x</b>", "data": {"values": []}}
    html = book_chart_html(spec)
    script = html.split("<script>\n", 1)[1].rsplit("\n</script>", 1)[0]
    assert "</" not in script
    embedded = script.split(", ", 1)[1].rsplit(", {", 1)[0]
    assert json.loads(embedded) == spec
    assert html.startswith('<div id="vega-chart-') and 'class="book-chart"' in html


@pytest.mark.parametrize("as_text", [False, True])
def test_book_extension_renders_vega_lite_outputs_as_the_book_html(as_text):
    spec = small_chart().to_dict()
    content = json.dumps(spec) if as_text else spec
    (node,) = VegaLiteRenderer.handle_mime(None, Data(VEGA_LITE_MIME, content), False)
    assert isinstance(node, nodes.raw) and node["format"] == "html"
    assert 'class="book-chart"' in node.astext() and "vegaEmbed(" in node.astext()


def test_book_extension_leaves_other_outputs_to_myst_nb():
    assert VegaLiteRenderer.handle_mime(None, Data("text/html", "<p>hi</p>"), False) is None


def test_weights_heatmap_has_one_rounded_cell_per_query_and_key():
    import torch

    from the_annotated_transformer import weights_heatmap

    weights = torch.tensor([[1.0, 0.0, 0.0], [0.12345, 0.5, 0.37655]])
    spec = weights_heatmap(weights, title="t").to_dict()
    cells = spec["data"]["values"] if "values" in spec.get("data", {}) else next(
        iter(spec["datasets"].values())
    )
    assert len(cells) == 6
    assert {"query": 1, "key": 0, "weight": 0.123} in cells
    with pytest.raises(ValueError, match=r"weights must be \(n_q, n_k\), got shape \(1, 2, 3\)"):
        weights_heatmap(weights.unsqueeze(0), title="t")
