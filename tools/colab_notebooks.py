"""The book's Colab edition: colab/<stem>.ipynb for every notebook page, from book/<stem>.ipynb.

Colab shows the chapters' MyST as raw text ({cite} roles, ```{note} fences, {figure} directives,
(label)= targets) and draws no Vega-Lite bundle, so a chapter opened there reads badly until it
is re-run. This module writes a copy that Colab renders before anything runs: citations become
author-year text with a References cell at the end, admonitions become blockquotes, answers
become <details>, figures become images served from the book's tag, cross-references become
links to the published book, and every stored chart also gets HTML that draws it. Code cells
and their other outputs are the chapter's own, byte for byte. `tools/sync.py` calls
`colab_files`, so `make sync` keeps colab/ current and `sync.py --check` fails when it is stale;
the book's Colab button opens these copies (`tools/book_charts.py`).
"""

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import nbformat
from pybtex.database import BibliographyData, Entry, parse_file
from pybtex.plugin import find_plugin
from pybtex.richtext import Text
from vendor_js import PACKAGES

ROOT = Path(__file__).resolve().parents[1]
COLAB = ROOT / "colab"
BIBLIOGRAPHY = ROOT / "book" / "references.bib"
# The module's VEGA_LITE_MIME, written out: importing the module would load torch.
VEGA_LITE_MIME = "application/vnd.vegalite.v5+json"
# Colab draws a stored chart from HTML only; the scripts come from npm through jsDelivr, at the
# versions the offline book vendors, so Colab and the book draw a chart with the same code.
CDN = "https://cdn.jsdelivr.net/npm"
CHART_LIBRARIES = ("vega", "vega-lite", "vega-embed")

# A MyST directive: ```{name} argument ... ``` or :::{name} ... ::: (an outer fence is longer).
DIRECTIVE = re.compile(
    r"^(?P<fence>`{3,}|:{3,})\{(?P<name>[\w:-]+)\}[ \t]*(?P<arg>.*)\n"
    r"(?P<body>(?:.*\n)*?)(?P=fence)[ \t]*$",
    re.MULTILINE,
)
OPTION = re.compile(r"^:(?P<key>[\w-]+):[ \t]*(?P<value>.*)$")
ROLE = re.compile(r"\{(?P<name>[a-z][\w:-]*)\}`(?P<content>[^`]+)`")
TARGET = re.compile(r"^\((?P<label>[\w.:-]+)\)=[ \t]*(?:\n|\Z)", re.MULTILINE)
EQUATION_LABEL = re.compile(r"^\$\$[ \t]*\((?P<label>[\w.:-]+)\)[ \t]*$", re.MULTILINE)
HEADING = re.compile(r"^#+[ \t]+(?P<title>.+)$", re.MULTILINE)
NEXT_HEADING = re.compile(r"\s*#+[ \t]+(?P<title>.+)")
# What must not survive in a Colab notebook's Markdown: any role, directive or target.
MYST_LEFT = re.compile(r"\{[a-z][\w:-]*\}`|^(?:`{3,}|:{3,})\{|^\([\w.:-]+\)=", re.MULTILINE)

ADMONITION_TITLES = {
    "note": "Note", "tip": "Tip", "hint": "Hint", "important": "Important",
    "warning": "Warning", "caution": "Caution", "attention": "Attention", "danger": "Danger",
    "error": "Error", "seealso": "See also",
}


@dataclass
class Book:
    """What converting a page needs: where the book is published and what its pages define."""

    url: str  # the repository, https://github.com/<owner>/<repo>
    ref: str  # the tag (or commit) the book is published from
    bibliography: BibliographyData
    titles: dict[str, str] = field(default_factory=dict)  # docname -> page title
    labels: dict[str, tuple[str, str]] = field(default_factory=dict)  # label -> (docname, text)
    edition: str = ""  # a translation's language (tools/locales.py); "" for the English book

    def owner_and_name(self) -> tuple[str, str]:
        found = re.fullmatch(r"https://github\.com/([^/]+)/([^/]+?)/?", self.url)
        if found is None:
            raise ValueError(f"repository.url {self.url!r} is not https://github.com/<owner>/<repo>")
        return found.group(1), found.group(2)

    def page_url(self, docname: str, anchor: str = "") -> str:
        """The page on the book's site (GitHub Pages of the repository, built from the root)."""
        owner, name = self.owner_and_name()
        edition = f"{self.edition}/" if self.edition else ""
        return f"https://{owner.lower()}.github.io/{name}/{edition}{docname}.html" + (
            f"#{anchor}" if anchor else "")

    def file_url(self, repo_path: str) -> str:
        """A file of the repository at the book's tag. jsDelivr, not raw.githubusercontent.com:
        GitHub serves SVG as text/plain, which browsers refuse to show in <img>; jsDelivr sends
        image/svg+xml."""
        owner, name = self.owner_and_name()
        return f"https://cdn.jsdelivr.net/gh/{owner}/{name}@{self.ref}/{repo_path}"


# -- charts ------------------------------------------------------------------------------------

def chart_scripts() -> list[str]:
    """The CDN URLs of the very files that tools/vendor_js.py copies into _vendor/."""
    return [f"{CDN}/{name}@{version}/{path}" for name, version, _, files in PACKAGES
            if name in CHART_LIBRARIES for path in files]


def chart_html(spec: dict) -> str:
    """HTML that draws a Vega-Lite spec in Colab (each output is a page of its own there): it
    loads the three libraries one after the other (each needs the one before), then calls
    vegaEmbed on its div. The id comes from the spec, so generating again gives the same text."""
    urls = json.dumps(chart_scripts())
    spec_json = json.dumps(spec, sort_keys=True).replace("</", "<\\/")  # never end the script
    chart_id = "colab-chart-" + hashlib.sha256(spec_json.encode()).hexdigest()[:16]
    return f"""<div id="{chart_id}"></div>
<script>
(function (spec) {{
  const target = document.getElementById("{chart_id}");
  const load = (url) => new Promise((resolve, reject) => {{
    const script = document.createElement("script");
    script.src = url;
    script.onload = resolve;
    script.onerror = () => reject(new Error("could not load " + url));
    document.head.appendChild(script);
  }});
  {urls}.reduce((loaded, url) => loaded.then(() => load(url)), Promise.resolve())
    .then(() => vegaEmbed(target, spec, {{"actions": false}}))
    .catch((error) => {{ target.textContent = "The chart could not be drawn: " + error; }});
}})({spec_json});
</script>"""


def with_chart_html(cell: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A code cell whose Vega-Lite outputs also carry their HTML (the cell itself unchanged)."""
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if VEGA_LITE_MIME in data:
            spec = data[VEGA_LITE_MIME]
            data["text/html"] = chart_html(spec if isinstance(spec, dict) else json.loads(spec))
    return cell


# -- citations ---------------------------------------------------------------------------------

@cache
def pybtex_plugin(group: str, name: str) -> object:
    """A pybtex style or backend, found once: each lookup reads every installed package's entry
    points, which made the citations of the whole book take half a minute."""
    return find_plugin(group, name)()


def plain(latex: str) -> str:
    """BibTeX's LaTeX ({\\"u}, {\\L}) as the text it stands for."""
    return Text.from_latex(latex).render(pybtex_plugin("pybtex.backends", "text"))


def authors(entry: Entry) -> str:
    """The author part of an author-year citation: Rush; Kudo and Richardson; Vaswani et al."""
    people = entry.persons.get("author") or entry.persons.get("editor")
    if not people:
        raise ValueError(f"{entry.key} in references.bib has no author or editor to cite by")
    names = [plain(" ".join(p.prelast_names + p.last_names)) for p in people]
    if len(names) == 1:
        return names[0]
    if len(names) == 2 and names[1] != "others":
        return f"{names[0]} and {names[1]}"
    return f"{names[0]} et al."


def citation(keys: list[str], textual: bool, bib: BibliographyData) -> str:
    """{cite:t} as 'Vaswani et al. (2017)', {cite} and {cite:p} as '(Vaswani et al., 2017)'."""
    entries = [bib.entries[key] for key in keys]
    if textual:
        return ", ".join(f"{authors(e)} ({e.fields['year']})" for e in entries)
    return "(" + "; ".join(f"{authors(e)}, {e.fields['year']}" for e in entries) + ")"


def references_markdown(keys: list[str], bib: BibliographyData) -> str:
    """The References cell: the cited works, formatted and sorted as BibTeX's plain style does."""
    style = pybtex_plugin("pybtex.style.formatting", "plain")
    markdown = pybtex_plugin("pybtex.backends", "markdown")
    entries = style.sort([bib.entries[key] for key in dict.fromkeys(keys)])
    items = [" ".join(e.text.render(markdown).split()) for e in style.format_entries(entries)]
    return "## References\n\n" + "\n".join(f"- {item}" for item in items)


# -- directives --------------------------------------------------------------------------------

def options_and_content(body: str) -> tuple[dict[str, str], str]:
    """A directive's `:key: value` lines and the content after them."""
    lines = body.splitlines()
    options = {}
    while lines and (found := OPTION.match(lines[0])):
        options[found.group("key")] = found.group("value").strip()
        lines.pop(0)
    return options, "\n".join(lines).strip()


def blockquote(title: str, content: str) -> str:
    lines = [f"**{title}**", ""] + content.splitlines()
    return "\n".join(f"> {line}".rstrip() for line in lines)


def details(title: str, content: str) -> str:
    """An answer the reader opens, as the book's dropdown does (blank lines keep it Markdown)."""
    return f"<details>\n<summary>{title}</summary>\n\n{content}\n\n</details>"


def figure(arg: str, content: str, docname: str, book: Book) -> str:
    """A figure as an image of the file at the book's tag, with its caption in italics."""
    repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(docname), arg.strip()))
    if not (ROOT / repo_path).is_file():
        raise ValueError(f"{docname}: figure {arg.strip()!r} is not a file ({repo_path})")
    alt = Path(repo_path).stem.replace("_", " ").replace("-", " ")
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", content) if p.strip()]
    return "\n\n".join([f"![{alt}]({book.file_url(repo_path)})"]
                       + [f"*{p}*" for p in paragraphs])


def directive(found: re.Match, docname: str, book: Book) -> str:
    """One MyST directive as Markdown that Colab renders; its content converted first."""
    name, arg = found.group("name"), found.group("arg").strip()
    options, content = options_and_content(found.group("body"))
    content = directives(content, docname, book)
    if name == "figure":
        return figure(arg, content, docname, book)
    if name == "dropdown" or "dropdown" in options.get("class", "").split():
        return details(arg or ADMONITION_TITLES.get(name, "Details"), content)
    if name == "admonition" and arg:
        return blockquote(arg, content)
    if name in ADMONITION_TITLES:
        return blockquote(arg or ADMONITION_TITLES[name], content)
    raise ValueError(f"{docname}: the {{{name}}} directive has no Colab form in "
                     "tools/colab_notebooks.py")


def directives(text: str, docname: str, book: Book) -> str:
    return DIRECTIVE.sub(lambda found: directive(found, docname, book), text)


# -- roles and targets -------------------------------------------------------------------------

def title_and_target(content: str) -> tuple[str | None, str]:
    """A role's `text <target>` or `target`."""
    found = re.fullmatch(r"(?s)(?P<text>.*?)\s*<(?P<target>[^<>]+)>", content.strip())
    return (found.group("text"), found.group("target")) if found else (None, content.strip())


def link(text: str, url: str) -> str:
    return f"[{text}]({url})"


def role(found: re.Match, docname: str, book: Book, cited: list[str]) -> str:
    """One MyST role as Markdown: a citation as text, a cross-reference as a link to the book."""
    name, content = found.group("name"), found.group("content")
    if name in ("cite", "cite:p", "cite:t"):
        keys = [key.strip() for key in content.split(",") if key.strip()]
        missing = [key for key in keys if key not in book.bibliography.entries]
        if missing:
            raise ValueError(f"{docname} cites {missing}, which book/references.bib lacks")
        cited += keys
        return citation(keys, textual=name == "cite:t", bib=book.bibliography)
    text, target = title_and_target(content)
    if name == "doc":
        page = (target.lstrip("/") if target.startswith("/") else
                posixpath.normpath(posixpath.join(posixpath.dirname(docname), target)))
        if page not in book.titles:
            raise ValueError(f"{docname}: {{doc}} names {target!r}, not a page of the book")
        return link(text or book.titles[page], book.page_url(page))
    if name in ("ref", "numref", "eq"):
        if target not in book.labels:
            raise ValueError(f"{docname}: {{{name}}} names {target!r}, which no page defines")
        page, label_text = book.labels[target]
        text = (text or "").replace("%s", label_text).replace("{number}", label_text)
        return link(text or label_text, book.page_url(page, target))
    raise ValueError(f"{docname}: the {{{name}}} role has no Colab form (tools/colab_notebooks.py)")


def markdown(source: str, docname: str, book: Book, cited: list[str]) -> str:
    """A Markdown cell's MyST as plain Markdown; `cited` collects the keys it cites."""
    text = TARGET.sub("", directives(source, docname, book))
    text = EQUATION_LABEL.sub("$$", text)
    text = ROLE.sub(lambda found: role(found, docname, book, cited), text)
    left = MYST_LEFT.search(text)
    if left:
        raise ValueError(f"{docname}: MyST left after conversion at {left.group(0)!r}")
    return text


# -- pages -------------------------------------------------------------------------------------

def page_title(text: str, docname: str) -> str:
    found = HEADING.search(text)
    if found is None:
        raise ValueError(f"{docname} has no heading to name it by")
    return found.group("title").strip()


def labels(docname: str, text: str) -> dict[str, tuple[str, str]]:
    """The labels a page's Markdown defines: section targets (named by their heading), figures
    (named by their caption up to its first colon) and labelled equations."""
    found = {}
    for target in TARGET.finditer(text):
        heading = NEXT_HEADING.match(text, target.end())
        found[target.group("label")] = (docname, heading.group("title") if heading else docname)
    for fig in DIRECTIVE.finditer(text):
        options, content = options_and_content(fig.group("body"))
        if "name" in options:
            found[options["name"]] = (docname, " ".join(content.split(":")[0].split()))
    for equation in EQUATION_LABEL.finditer(text):
        found[equation.group("label")] = (docname, "this equation")
    return found


def docname(path: Path) -> str:
    return path.relative_to(ROOT).with_suffix("").as_posix()


def colab_path(path: Path, edition: str = "") -> Path:
    """Where the Colab edition of a book notebook lives: colab/<stem>.ipynb, or for a
    translation colab/<language>/<stem>.ipynb."""
    return COLAB / edition / f"{path.stem}.ipynb"


# The line above a Colab edition, in each edition's language.
EDITION_LINE = {
    "": "*The Colab edition of [this page of the book]({page}), generated from `{name}.ipynb` "
        "by `make sync`.*",
    "zh_CN": "*本书[这一页]({page})的 Colab 版，由 `make sync` 从 `{name}.ipynb` 及其中文译文"
             "（`locales/zh_CN/`）生成。*",
}


def colab_notebook(nb: nbformat.NotebookNode, name: str, book: Book) -> nbformat.NotebookNode:
    """The Colab edition of one notebook: a line linking to the book's page, the Markdown
    converted, the code cells as they are (their charts with HTML), the References."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))  # a copy: the chapter stays as it is
    cited: list[str] = []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = markdown(cell.source, name, book, cited)
        elif cell.cell_type == "code":
            with_chart_html(cell)
    intro = EDITION_LINE[book.edition].format(page=book.page_url(name), name=name)
    cells = [nbformat.v4.new_markdown_cell(intro, id="colab-edition")] + nb.cells
    if cited:
        references = references_markdown(cited, book.bibliography)
        cells.append(nbformat.v4.new_markdown_cell(references, id="colab-references"))
    nb.cells = cells
    nb.metadata.pop("jupytext", None)  # no pairing: Jupyter would write twins into colab/
    return nb


def colab_files(notebooks: dict[Path, nbformat.NotebookNode], url: str, ref: str,
                pages: list[str], edition: str = "",
                only: set[Path] | None = None) -> dict[Path, str]:
    """colab/<stem>.ipynb for every notebook (or those in `only`), with its text. `pages` are
    all the book's docnames (Markdown pages included), which cross-references may name;
    `edition` a translation's language, whose book the links lead to."""
    book = Book(url=url, ref=ref, bibliography=parse_file(str(BIBLIOGRAPHY)), edition=edition)
    texts = {docname(path): "\n\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
             for path, nb in notebooks.items()}
    for page in pages:
        if page not in texts and (ROOT / f"{page}.md").exists():
            texts[page] = (ROOT / f"{page}.md").read_text()
    for page, text in texts.items():
        book.titles[page] = page_title(text, page)
        book.labels.update(labels(page, text))
    return {colab_path(path, edition):
            nbformat.writes(colab_notebook(nb, docname(path), book)) + "\n"
            for path, nb in notebooks.items() if only is None or path in only}


def translated_colab_files(notebooks: dict[Path, nbformat.NotebookNode], url: str, ref: str,
                           pages: list[str]) -> dict[Path, str]:
    """colab/<language>/<stem>.ipynb for every page whose translation is complete
    (tools/locales.py): its Markdown cells translated from the page's catalog, then made
    Colab's as the English edition's are; code cells and outputs the chapter's own."""
    from locales import LANGUAGES, is_complete, translate_markdown, translations

    files = {}
    for language in LANGUAGES:
        done = {path for path in notebooks if is_complete(language, docname(path))}
        if not done:
            continue
        edition = {}
        for path, nb in notebooks.items():
            if path in done:
                nb = nbformat.from_dict(json.loads(json.dumps(nb)))
                messages = translations(language, docname(path))
                for cell in nb.cells:
                    if cell.cell_type == "markdown":
                        cell.source = translate_markdown(cell.source, messages)
            edition[path] = nb
        files.update(colab_files(edition, url, ref, pages, edition=language, only=done))
    return files


def colab_launch_url(url: str) -> str:
    """A Colab launch URL for book/<stem>.ipynb, made to open colab/<stem>.ipynb instead;
    another URL unchanged."""
    return re.sub(r"(/blob/[^/]+/)book/([^/]+\.ipynb)$", rf"\g<1>{COLAB.name}/\g<2>", url)
