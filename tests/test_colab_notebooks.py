"""The Colab editions (colab/*.ipynb): what Colab shows before anything runs is plain Markdown,
every stored chart draws from HTML, and the code is the chapters' own."""

import copy
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import yaml
from pybtex.database import parse_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from colab_notebooks import (  # noqa: E402
    BIBLIOGRAPHY,
    COLAB,
    VEGA_LITE_MIME,
    Book,
    citation,
    colab_path,
    markdown,
    plain,
)
from sync import chapters, repository  # noqa: E402
from vendor_js import PACKAGES  # noqa: E402

PAGES = chapters()
MYST = ["{cite", "```{", ":::", "{ref}", "{doc}", "{numref}", "{eq}", "{figure}"]
CITE = re.compile(r"\{cite(?::[pt])?\}`([^`]+)`")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)|<img [^>]*src=\"([^\"]+)\"")
CHART_SPEC = re.compile(r"\}\)\((?P<spec>\{.*\})\);\n</script>$", re.DOTALL)
BIB = parse_file(str(BIBLIOGRAPHY))
# Vega, Vega-Lite and vega-embed at the versions the offline book vendors, in loading order.
VERSIONS = {name: version for name, version, _, _ in PACKAGES if name.startswith("vega")}


def read(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


def markdown_cells(nb: nbformat.NotebookNode) -> list[nbformat.NotebookNode]:
    return [cell for cell in nb.cells if cell.cell_type == "markdown"]


@pytest.fixture(scope="module")
def editions() -> dict[Path, tuple[nbformat.NotebookNode, nbformat.NotebookNode]]:
    """Each chapter next to its Colab edition."""
    return {path: (read(path), read(colab_path(path))) for path in PAGES}


def test_colab_holds_one_edition_per_notebook_page_and_nothing_else():
    assert sorted(COLAB.glob("*.ipynb")) == sorted(colab_path(path) for path in PAGES)


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_no_myst_is_left_in_the_markdown(path, editions):
    _, colab = editions[path]
    for cell in markdown_cells(colab):
        left = [syntax for syntax in MYST if syntax in cell.source]
        assert not left, f"cell {cell.id} still has {left}"
        assert not re.search(r"^\([\w.:-]+\)=", cell.source, re.MULTILINE), cell.id


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_code_cells_and_their_outputs_are_the_chapters_own(path, editions):
    """Byte for byte, but for the HTML that each Vega-Lite output gains."""
    book, colab = editions[path]
    book_code = [c for c in book.cells if c.cell_type == "code"]
    colab_code = [copy.deepcopy(c) for c in colab.cells if c.cell_type == "code"]
    for cell in colab_code:
        for output in cell.outputs:
            if VEGA_LITE_MIME in output.get("data", {}):
                del output.data["text/html"]
    assert colab_code == book_code
    assert [c.id for c in book.cells] == [c.id for c in colab.cells if c.id in
                                          {b.id for b in book.cells}]


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_every_stored_chart_has_html_that_draws_the_same_spec(path, editions):
    _, colab = editions[path]
    scripts = json.dumps([f"https://cdn.jsdelivr.net/npm/{name}@{version}/build/{name}.min.js"
                          for name, version in VERSIONS.items()])
    charts = [output.data for cell in colab.cells if cell.cell_type == "code"
              for output in cell.outputs if VEGA_LITE_MIME in output.get("data", {})]
    for data in charts:
        html = data["text/html"]
        assert json.loads(CHART_SPEC.search(html).group("spec")) == data[VEGA_LITE_MIME]
        assert scripts in html, "the vendored files, from the CDN, in order"


def test_the_chart_mime_type_is_the_one_the_book_stores(editions):
    """The tool writes the module's constant out (importing the module would load torch): both
    name the one Vega-Lite type that the chapters' stored charts carry."""
    from the_annotated_transformer import VEGA_LITE_MIME as module_mime

    stored = [mime for book, _ in editions.values() for cell in book.cells
              if cell.cell_type == "code" for output in cell.outputs
              for mime in output.get("data", {}) if "vegalite" in mime]
    assert stored, "no chapter stores a chart"
    assert set(stored) == {VEGA_LITE_MIME} == {module_mime}


def test_the_chart_scripts_are_the_versions_the_offline_book_serves():
    assert list(VERSIONS) == ["vega", "vega-lite", "vega-embed"]
    for name, version in VERSIONS.items():  # each minified build names its own version
        assert f'"{version}"' in (ROOT / "_vendor" / f"{name}.min.js").read_text(), name


def test_figures_are_images_of_files_in_book_figures_at_the_tag(editions):
    url, ref = repository()
    owner_repo = url.removeprefix("https://github.com/")
    prefix = f"https://cdn.jsdelivr.net/gh/{owner_repo}@{ref}/"
    figures = 0
    for path, (book, colab) in editions.items():
        figures += sum(c.source.count("```{figure}") for c in markdown_cells(book))
        for cell in markdown_cells(colab):
            for found in IMAGE.finditer(cell.source):
                image = found.group(1) or found.group(2)
                assert image.startswith(prefix), f"{path.stem}: {image} is not at the tag"
                repo_path = image.removeprefix(prefix)
                assert repo_path.startswith("book/figures/") and (ROOT / repo_path).is_file()
    images = sum(len(IMAGE.findall(c.source)) for _, colab in editions.values()
                 for c in markdown_cells(colab))
    assert figures > 0 and images == figures


def plain_title(key: str) -> str:
    """An entry's title as text, lowercased: BibTeX's plain style changes its case."""
    return plain(BIB.entries[key].fields["title"]).lower()


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.stem)
def test_every_citation_is_text_and_listed_in_the_references(path, editions):
    book, colab = editions[path]
    keys = {key.strip() for cell in markdown_cells(book)
            for role in CITE.findall(cell.source) for key in role.split(",")}
    references = [c for c in colab.cells if c.id == "colab-references"]
    if not keys:
        assert not references
        return
    listed = references[0].source.replace("\\", "").lower()
    assert listed.startswith("## references")
    assert listed.count("\n- ") == len(keys), "one item per cited work"
    for key in keys:
        assert plain_title(key) in listed, f"{key} is not in the References"
    text = "\n".join(c.source for c in markdown_cells(colab))
    for key in keys:
        assert f"{BIB.entries[key].fields['year']}" in text


def test_citations_read_as_author_year_by_kind():
    assert citation(["vaswani2017attention"], textual=True, bib=BIB) == "Vaswani et al. (2017)"
    assert citation(["vaswani2017attention"], textual=False, bib=BIB) == "(Vaswani et al., 2017)"
    assert citation(["rush2018annotated", "huang2022annotated"], textual=False, bib=BIB) == (
        "(Rush, 2018; Huang et al., 2022)")
    assert citation(["kudo2018sentencepiece"], textual=False, bib=BIB) == (
        "(Kudo and Richardson, 2018)")


def small_book() -> Book:
    url, ref = repository()
    return Book(url=url, ref=ref, bibliography=BIB,
                titles={"book/02_encoder_decoder": "The encoder and decoder stacks"},
                labels={"checking-inputs": ("book/appendix_infrastructure", "Checking inputs")})


def test_myst_becomes_markdown_that_colab_renders():
    book, cited = small_book(), []
    source = "\n".join([
        "(a-label)=", "## A section", "",
        "As {cite:t}`vaswani2017attention` showed",
        "({ref}`checking-inputs`; {doc}`02_encoder_decoder`).",
        "", "```{note}", "Mind the *gap*.", "```", "",
        ":::{admonition} Why pre-norm", "It trains.", ":::", "",
        "```{dropdown} Answer to 1", "Two.", "```", "",
        "```{figure} figures/transformer.svg", ":name: fig-x", ":width: 560px", "",
        "The Transformer: two stacks.", "```",
    ])
    text = markdown(source, "book/03_attention", book, cited)
    assert cited == ["vaswani2017attention"]
    assert text.startswith("## A section\n\nAs Vaswani et al. (2017) showed\n([Checking inputs](")
    assert "appendix_infrastructure.html#checking-inputs)" in text
    assert "[The encoder and decoder stacks](https://" in text
    assert "> **Note**\n>\n> Mind the *gap*." in text
    assert "> **Why pre-norm**\n>\n> It trains." in text
    assert "<details>\n<summary>Answer to 1</summary>\n\nTwo.\n\n</details>" in text
    repo = book.url.removeprefix("https://github.com/")
    figure = f"@{book.ref}/book/figures/transformer.svg)\n\n*The Transformer: two stacks.*"
    assert f"](https://cdn.jsdelivr.net/gh/{repo}{figure}" in text


@pytest.mark.parametrize("source, problem", [
    ("```{tab-set}\nx\n```", "tab-set"),
    ("{cite}`nobody2099`", "nobody2099"),
    ("{ref}`no-such-label`", "no-such-label"),
    ("{doc}`99_missing`", "99_missing"),
    ("```{figure} figures/missing.svg\nA caption.\n```", "missing.svg"),
    ("{abbr}`MT (machine translation)`", "abbr"),
])
def test_what_cannot_be_converted_stops_generation_with_its_name(source, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        markdown(source, "book/03_attention", small_book(), [])


def test_the_book_colab_button_opens_the_colab_edition():
    """sphinx-book-theme builds the button as the built book does; the book's hook redirects it."""
    from book_charts import open_colab_edition
    from sphinx_book_theme.header_buttons.launch import add_launch_buttons

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url, ref = repository()
    owner, name = url.removeprefix("https://github.com/").split("/")
    page = "book/03_attention"
    app = SimpleNamespace(
        config={"html_theme_options": {"launch_buttons": config["launch_buttons"],
                                       "repository_url": url, "repository_branch": ref}},
        env=SimpleNamespace(doc2path=lambda docname: str(ROOT / f"{docname}.ipynb"),
                            metadata={page: {"kernelspec": {"name": "python3"}}}),
    )
    context = {"pagename": page, "header_buttons": [], "sourcename": f"{page}.ipynb",
               "github_url": "https://github.com", "github_user": owner, "github_repo": name}
    add_launch_buttons(app, page, "page.html", context, None)
    open_colab_edition(app, page, "page.html", context, None)
    buttons = [b for group in context["header_buttons"] for b in group["buttons"]]
    colab = [b["url"] for b in buttons if b["text"] == "Colab"]
    assert colab == [f"{config['launch_buttons']['colab_url']}/github/{owner}/{name}/blob/{ref}/"
                     "colab/03_attention.ipynb"]
    assert (ROOT / "colab" / "03_attention.ipynb").is_file()
