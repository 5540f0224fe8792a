# %% [markdown]
# # the_annotated_transformer
#
# GENERATED FILE: do not edit. `make sync` writes it from the cells tagged `export` in the
# book's chapters, in the order of `_toc.yml`; each block below names its chapter. To change a
# definition, edit the chapter that explains it, then run `make sync`.

# %%
"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as built in the book."""


# %% [markdown]
# ## From book/intro.ipynb


# %%
import json
import sys
import uuid


def book_chart_html(spec: dict, **metadata) -> dict[str, str]:
    """HTML for one chart: a container and a call to the vegaEmbed that the book page loads."""
    chart_id = f"vega-chart-{uuid.uuid4().hex}"
    spec_json = json.dumps(spec, sort_keys=True).replace("</", "<\\/")  # never end the script
    script = (
        "(function () {\n"
        f'  var el = document.getElementById("{chart_id}");\n'
        '  if (typeof vegaEmbed === "undefined") {\n'
        '    el.textContent = "This chart is drawn by the built book; in Jupyter, run '
        "alt.renderers.enable('default') and re-run the cell.\";\n"
        "    return;\n"
        "  }\n"
        f'  vegaEmbed(el, {spec_json}, {{"actions": false}});\n'
        "})();"
    )
    return {"text/html": f'<div id="{chart_id}" class="book-chart"></div>\n<script>\n{script}\n</script>'}


def enable_book_charts() -> None:
    """Render altair charts with the book's local Vega files (Colab keeps altair's renderer)."""
    import altair as alt

    if "google.colab" in sys.modules:
        return
    alt.renderers.register("book", book_chart_html)
    alt.renderers.enable("book")
