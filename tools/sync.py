"""Assemble the_annotated_transformer.py from the chapters and refresh their jupytext twins.

The chapters are the source. `make sync` reads the notebooks in `_toc.yml` order, copies every
cell tagged `export` into the module (a jupytext py:percent file, one block per chapter), writes
each setup cell's Colab block (and the module's BOOK_REPOSITORY and BOOK_REPOSITORY_REF) with
the repository URL and the tag or commit (`repository.branch`) from `_config.yml`, so that
Colab installs the package from the same commit as the notebook it opened, and rewrites each
chapter's text twin in `book/twins/`, and writes each chapter's Colab edition in `colab/`
(tools/colab_notebooks.py: the same code cells, its MyST as Markdown that Colab renders), and
in `colab/<language>/` for each chapter whose translation is complete (tools/locales.py).
`python tools/sync.py --check` changes nothing and fails when any of those files is out of
date; the tests run it.
"""

import argparse
import ast
import re
import sys
from pathlib import Path

import jupytext
import nbformat
import yaml
from colab_notebooks import colab_files, translated_colab_files

ROOT = Path(__file__).resolve().parents[1]
MODULE = ROOT / "the_annotated_transformer.py"
TWINS = "twins"
TWIN_FORMAT = "py:percent"
PAIRING = f"ipynb,{TWINS}//{TWIN_FORMAT}"
# The Colab part of every setup cell, with the repository from _config.yml. It ends at the
# first line that is not indented (the imports from the module that every environment runs).
COLAB_BLOCK = re.compile(
    r'^if "google\.colab" in sys\.modules:\n(?:    .*\n|\n)*(?:    .*$)?', re.MULTILINE
)
COLAB_TEMPLATE = """\
if "google.colab" in sys.modules:
    import subprocess

    REPO = "{url}"
    REF = "{ref}"  # the tag or commit this notebook comes from
    package = f"the-annotated-transformer[book] @ git+{{REPO}}@{{REF}}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

"""

# The module's copy of the same URL and ref, for downloading the shipped model (chapter 14).
REPOSITORY_LINE = re.compile(r'^BOOK_REPOSITORY = ".*"$', re.MULTILINE)
REF_LINE = re.compile(r'^BOOK_REPOSITORY_REF = ".*"$', re.MULTILINE)

HEADER = '''\
# %% [markdown]
# # the_annotated_transformer
#
# GENERATED FILE: do not edit. `make sync` writes it from the cells tagged `export` in the
# book's chapters, in the order of `_toc.yml`; each block below names its chapter. To change a
# definition, edit the chapter that explains it, then run `make sync`.

# %%
"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as built in the book."""

# A grown class stands where its last chapter defines it, after earlier code that names it in
# annotations: those annotations stay unevaluated strings (PEP 563).
from __future__ import annotations
'''


def toc_files() -> list[str]:
    """Every page of the book in reading order, as `_toc.yml` lists them (without suffix)."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [entry["file"] for entry in part["chapters"]]
    return files


def chapters() -> list[Path]:
    """The chapter notebooks in reading order (pages written in Markdown are not chapters)."""
    return [ROOT / f"{name}.ipynb" for name in toc_files() if not (ROOT / f"{name}.md").exists()]


def repository() -> tuple[str, str]:
    """The repository's URL and the tag or commit of the book (`_config.yml`'s `repository`),
    used by the setup cells, the launch buttons and the shipped model's download."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]
    return config["url"], str(config["branch"])


def tags(cell: nbformat.NotebookNode) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def definitions(source: str) -> dict[str, tuple[int, int]]:
    """The functions and classes a cell defines at top level: name -> (first, last) line,
    1-based, decorators included."""
    spans = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            spans[node.name] = (first, node.end_lineno)
    return spans


def without(source: str, names: set[str]) -> str:
    """The cell's source without its top-level definitions of `names` (grown later)."""
    lines = source.splitlines()
    for first, last in sorted((span for name, span in definitions(source).items()
                               if name in names), reverse=True):
        del lines[first - 1:last]
    return re.sub(r"\n{3,}", "\n\n\n", "\n".join(lines)).strip()


def module_text(notebooks: dict[Path, nbformat.NotebookNode]) -> str:
    """The module: the header, then each chapter's export cells under the chapter's name; a
    definition that a later `extends` cell grows is left out, the grown one stands for it."""
    cells = [
        (path, c.source.strip()) for path, nb in notebooks.items() for c in nb.cells
        if "export" in tags(c)
    ]
    last = {name: i for i, (_, source) in enumerate(cells) for name in definitions(source)}
    blocks = [HEADER]
    for path in notebooks:
        sources = [
            without(source, {name for name in definitions(source) if last[name] > i})
            for i, (cell_path, source) in enumerate(cells) if cell_path == path
        ]
        sources = [s for s in sources if s]
        if not sources:
            continue
        title = path.relative_to(ROOT).as_posix()
        blocks.append(f"# %% [markdown]\n# ## From {title}\n")
        blocks += [f"# %%\n{source}\n" for source in sources]
    return "\n\n".join(blocks)


def refreshed(nb: nbformat.NotebookNode, url: str, ref: str) -> nbformat.NotebookNode:
    """The notebook with its setup cell's Colab block installing from `url` at `ref`, the
    module's BOOK_REPOSITORY and BOOK_REPOSITORY_REF set to them, its jupytext pairing set, and
    no execution timestamps (they change on every run and say nothing)."""
    for cell in nb.cells:
        cell.get("metadata", {}).pop("execution", None)
        if "export" in tags(cell):
            line = f'BOOK_REPOSITORY = "{url}"'
            cell.source = REPOSITORY_LINE.sub(lambda _, b=line: b, cell.source)
            line = f'BOOK_REPOSITORY_REF = "{ref}"'
            cell.source = REF_LINE.sub(lambda _, b=line: b, cell.source)
        if "setup" in tags(cell):
            block = COLAB_TEMPLATE.format(url=url, ref=ref)
            cell.source = COLAB_BLOCK.sub(lambda _, b=block: b, cell.source, count=1).rstrip()
    nb.metadata.setdefault("jupytext", {})["formats"] = PAIRING
    # the twin shows why a cell's output is not compared (the `nbval_reason` of an nbval tag)
    nb.metadata["jupytext"]["cell_metadata_filter"] = "nbval_reason"
    return nb


def twin_path(path: Path) -> Path:
    return path.parent / TWINS / f"{path.stem}.py"


def twin_text(nb: nbformat.NotebookNode) -> str:
    return jupytext.writes(nb, fmt=TWIN_FORMAT)


def expected_files(read: dict[Path, str] | None = None) -> dict[Path, str]:
    """Every file that sync owns, with the text it should have. `read` receives each notebook's
    text as it was read, so that a notebook saved again meanwhile is not overwritten."""
    url, ref = repository()
    missing = [p.name for p in chapters() if not p.exists()]
    if missing:  # a chapter being written; tests/test_structure.py fails on it
        print("skipping chapters that do not exist yet: " + ", ".join(missing), file=sys.stderr)
    read = {} if read is None else read
    for p in chapters():
        if p.exists():
            read[p] = p.read_text()
    notebooks = {p: refreshed(nbformat.reads(text, as_version=4), url, ref)
                 for p, text in read.items()}
    files = {MODULE: module_text(notebooks)}
    for path, nb in notebooks.items():
        files[path] = nbformat.writes(nb) + "\n"
        files[twin_path(path)] = twin_text(nb)
    files.update(colab_files(notebooks, url, ref, pages=toc_files()))
    files.update(translated_colab_files(notebooks, url, ref, pages=toc_files()))
    return files


def stale_files(read: dict[Path, str] | None = None) -> dict[Path, str]:
    """The files sync owns that differ from what they should be, with that text."""
    return {path: text for path, text in expected_files(read).items()
            if not path.exists() or path.read_text() != text}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if any file is out of date")
    args = parser.parse_args()
    read: dict[Path, str] = {}
    outdated = stale_files(read)
    stale = [path.relative_to(ROOT).as_posix() for path in outdated]
    for path, text in ({} if args.check else outdated).items():
        if path in read and path.read_text() != read[path]:
            sys.exit(f"{path.name} was saved while sync ran: run `make sync` again")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if args.check and stale:
        sys.exit("out of date (run `make sync`): " + ", ".join(stale))
    print("updated: " + ", ".join(stale) if stale else "everything in sync")


if __name__ == "__main__":
    main()
