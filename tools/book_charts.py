"""Sphinx extension: the built book draws the charts that the chapters store as Vega-Lite bundles.

A chart is stored as `application/vnd.vegalite.v5+json` (see `book_chart_bundle` in the appendix),
which notebook front ends draw but myst-nb does not know. This extension renders that mime type
as the book's HTML (`book_chart_html`: a container and a call to the vendored vegaEmbed), so the
built pages draw their charts offline. It also points the Colab launch button at the page's
Colab edition, colab/<stem>.ipynb (tools/colab_notebooks.py), which Colab renders, instead of
book/<stem>.ipynb. `_config.yml` loads it through `local_extensions`.
"""

import json

from colab_notebooks import colab_launch_url
from docutils import nodes
from myst_nb.core import render

from the_annotated_transformer import VEGA_LITE_MIME, book_chart_html


class VegaLiteRenderer:
    """A myst-nb mime renderer: Vega-Lite bundles become the book's chart HTML."""

    # myst-nb keeps one mime type per output, lowest number first; text/html is 30, text/plain 100.
    mime_priority_overrides = [("html", VEGA_LITE_MIME, 25)]

    @staticmethod
    def handle_mime(renderer, data, inline: bool) -> list[nodes.Element] | None:
        """The chart's HTML for a Vega-Lite output; None leaves other outputs to myst-nb."""
        if data.mime_type != VEGA_LITE_MIME:
            return None
        spec = data.content if isinstance(data.content, dict) else json.loads(data.string)
        return [nodes.raw(text=book_chart_html(spec), format="html", classes=["output"])]


def open_colab_edition(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """An html-page-context hook, run after sphinx-book-theme's (priority 501) built the launch
    buttons from the repository, the tag and the page's path: Colab opens colab/, not book/."""
    for group in context.get("header_buttons", []):
        if group.get("label") == "launch-buttons":
            for button in group["buttons"]:
                if button.get("text") == "Colab":
                    button["url"] = colab_launch_url(button["url"])


def setup(app) -> dict:
    """Add the renderer to those myst-nb loaded (it finds its own only through entry points)."""
    renderers = render.load_mime_renders()  # a cached list: myst-nb reads this same object
    if VegaLiteRenderer not in renderers:
        renderers.append(VegaLiteRenderer)
    app.connect("html-page-context", open_colab_edition, priority=600)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
