"""The book's structure: the table of contents, the chapters' setup cells, the generated module."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from sync import chapters, toc_files  # noqa: E402

from the_annotated_transformer import VEGA_LITE_MIME, VEGA_LITE_V5_SCHEMA  # noqa: E402

# Columns of code that fit a code cell of the built page without scrolling (book/static/book.css;
# tests/test_browser.py checks that no code cell of the built book scrolls).
CODE_WIDTH = 100
HEAVY = ["altair", "pandas", "spacy", "sacrebleu", "sentencepiece", "pynvml", "matplotlib"]


def tags(cell) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def exported_names(nb) -> set[str]:
    """Top-level names that a chapter's export cells define."""
    names = set()
    for cell in nb.cells:
        if "export" not in tags(cell):
            continue
        for node in ast.parse(cell.source).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign):  # also `BOS_ID, EOS_ID = 0, 1`
                names |= {
                    n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)
                }
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def imported_from_module(cell) -> list[str]:
    tree = ast.parse(cell.source)
    return [
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "the_annotated_transformer"
        for alias in node.names
    ]


def test_every_file_in_the_table_of_contents_exists():
    missing = [
        name for name in toc_files()
        if not (ROOT / f"{name}.ipynb").exists() and not (ROOT / f"{name}.md").exists()
    ]
    assert missing == []


def appendices() -> list[Path]:
    """The appendix chapters: plumbing that every chapter may import (the chart renderer, say),
    although the module defines it last. Nothing at import time may use it."""
    return [path for path in chapters() if path.stem.startswith("appendix_")]


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_chapter_starts_with_a_hidden_setup_cell_that_imports_only_earlier_exports(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    setup = code[0]
    assert "setup" in tags(setup) and "hide-cell" in tags(setup), "first code cell is not setup"
    assert [c for c in code[1:] if "setup" in tags(c)] == [], "more than one setup cell"
    assert 'REPO = "' in setup.source and "google.colab" in setup.source

    earlier = set().union(*(exported_names(nbformat.read(a, as_version=4)) for a in appendices()))
    for other in chapters():
        if other == path:
            break
        earlier |= exported_names(nbformat.read(other, as_version=4))
    not_earlier = sorted(set(imported_from_module(setup)) - earlier)
    assert not_earlier == [], f"imports names no earlier chapter exports: {not_earlier}"
    later = [c for c in code[1:] if imported_from_module(c)]
    assert later == [], "only the setup cell imports from the_annotated_transformer"


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_chapter_is_executed_with_outputs_stored(path):
    nb = nbformat.read(path, as_version=4)
    runnable = [c for c in nb.cells if c.cell_type == "code" and "export" not in tags(c)]
    if runnable[1:]:  # beyond the setup cell
        assert any(c.outputs for c in runnable), "no outputs stored: run tools/run_chapter.py"
    errors = [o for c in runnable for o in c.outputs if o.output_type == "error"]
    assert errors == []


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_every_chart_is_stored_as_a_vega_lite_bundle_that_notebooks_draw(path):
    """JupyterLab and VS Code draw this bundle (Colab: see the appendix). A scripted HTML output
    stays blank in a notebook the reader has not trusted, and JupyterLab shows HTML first when a
    bundle has both."""
    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells for o in c.get("outputs", []) if "data" in o]
    scripted = [o for o in outputs if "<script" in o["data"].get("text/html", "")]
    assert scripted == [], "an output stores HTML with a script: re-run the chapter"
    for bundle in (o["data"] for o in outputs if VEGA_LITE_MIME in o["data"]):
        assert set(bundle) == {VEGA_LITE_MIME, "text/plain"}
        assert bundle[VEGA_LITE_MIME]["$schema"] == VEGA_LITE_V5_SCHEMA


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_nbval_is_steered_by_cell_tags_each_with_its_reason(path):
    """A cell whose output nbval must not compare carries nbval's tag (`nbval-ignore-output`),
    not a `# NBVAL_...` comment in code the reader studies; its `nbval_reason` metadata says why
    (the twin shows it)."""
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        assert "NBVAL_" not in cell.source, f"cell {i}: use the nbval tag, not a comment marker"
        marked = [t for t in tags(cell) if t.startswith("nbval-")]
        assert set(marked) <= {"nbval-ignore-output", "nbval-raises-exception", "nbval-skip"}, (
            f"cell {i}: {marked} is not a tag nbval obeys")
        if marked:
            assert cell.metadata.get("nbval_reason", "").strip(), f"cell {i}: say why {marked}"


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_no_code_line_is_wider_than_a_code_cell_of_the_page(path):
    nb = nbformat.read(path, as_version=4)
    wide = [
        f"cell {i}: {line[:50]}..."
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if len(line) > CODE_WIDTH
    ]
    assert wide == [], f"lines over {CODE_WIDTH} columns"


# A chart is one short call in a chapter; longer altair code belongs in an exported helper.
MAX_ALTAIR_LINES = 4
ALTAIR_LINE = re.compile(r"\balt\.")


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_chart_code_lives_in_exported_helpers_not_in_the_chapters_cells(path):
    nb = nbformat.read(path, as_version=4)
    long_cells = [
        f"cell {i}: {count} lines of altair code"
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and "export" not in tags(cell)
        for count in [sum(bool(ALTAIR_LINE.search(line)) for line in cell.source.splitlines())]
        if count > MAX_ALTAIR_LINES
    ]
    assert long_cells == [], f"move the chart code into an export cell's helper: {long_cells}"


def export_definitions() -> list[tuple[str, bool, ast.stmt]]:
    """Every top-level statement of every export cell, in book order: (chapter file, whether
    the cell is tagged `extends`, the statement)."""
    found = []
    for path in chapters():
        for cell in nbformat.read(path, as_version=4).cells:
            if "export" in tags(cell):
                extends = "extends" in tags(cell)
                found += [(path.name, extends, node) for node in ast.parse(cell.source).body]
    return found


def definitions_by_name() -> dict[str, list[tuple[str, bool, ast.stmt]]]:
    """Each function or class name with its definitions in book order."""
    by_name: dict[str, list] = {}
    for chapter, extends, node in export_definitions():
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            by_name.setdefault(node.name, []).append((chapter, extends, node))
    return by_name


def extended() -> dict[str, list[tuple[str, bool, ast.stmt]]]:
    return {name: defs for name, defs in definitions_by_name().items() if len(defs) > 1}


def test_a_name_defined_twice_is_a_declared_extension_in_a_later_chapter():
    """Only a cell tagged `extends`, in a later chapter, may define a name again (sync keeps the
    last definition in the module); constants are defined once."""
    wrong = [
        f"{name} in {chapter} (after {defs[0][0]})"
        for name, defs in definitions_by_name().items()
        for (chapter, extends, _), (before, _, _) in zip(defs[1:], defs, strict=False)
        if not extends or chapter == before
    ]
    assert wrong == [], f"defined again without an `extends` cell in a later chapter: {wrong}"
    constants: dict[str, str] = {}
    clashes = []
    for chapter, _, node in export_definitions():
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            for name in [n.id for n in ast.walk(target) if isinstance(n, ast.Name)]:
                if name in constants:
                    clashes.append(f"{name}: {constants[name]} and {chapter}")
                constants[name] = chapter
    assert clashes == []


def test_every_extends_cell_grows_an_earlier_definition():
    names = {name for name, defs in extended().items()}
    stray = [
        f"{node.name} in {chapter}" for chapter, extends, node in export_definitions()
        if extends and isinstance(node, ast.FunctionDef | ast.ClassDef) and node.name not in names
    ]
    assert stray == [], f"an `extends` cell defines something new; export it untagged: {stray}"


def parameters(node: ast.FunctionDef) -> list[tuple[str, str, str | None]]:
    """(name, kind, default) of each parameter, in order."""
    args = node.args
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + args.defaults
    found = [(a.arg, "positional", d and ast.unparse(d)) for a, d in zip(positional, defaults,
                                                                          strict=True)]
    found += [(a.arg, "keyword", d and ast.unparse(d))
              for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return found


def is_dataclass(node: ast.ClassDef) -> bool:
    return any("dataclass" in ast.unparse(d) for d in node.decorator_list)


def interface(node: ast.stmt) -> dict[str, list[tuple[str, str, str | None]]]:
    """What callers use: a function's parameters; a class's constructor (a dataclass's fields, in
    order, of kind "field") and each method that is public or a dunder."""
    if isinstance(node, ast.FunctionDef):
        return {node.name: parameters(node)}
    found = {}
    if is_dataclass(node):
        found["__init__"] = [
            (b.target.id, "field", b.value and ast.unparse(b.value))
            for b in node.body if isinstance(b, ast.AnnAssign) and isinstance(b.target, ast.Name)
        ]
    for b in node.body:
        if isinstance(b, ast.FunctionDef) and b.name != "__post_init__" and (
                not b.name.startswith("_") or b.name.startswith("__")):
            found[b.name] = parameters(b)
    return found


def grown_badly(old: list, new: list) -> str | None:
    """Why `new` breaks a caller of `old`, or None: the earlier parameters stay as they were and
    each added one has a default and is keyword-only (a dataclass can only append fields)."""
    if new[:len(old)] != old:
        return "changes the earlier parameters"
    for name, kind, default in new[len(old):]:
        if default is None or kind not in ("keyword", "field"):
            return f"adds {name}, which is not keyword-only with a default"
    return None


def test_grown_badly_tells_a_compatible_extension_from_a_breaking_one():
    old = [("x", "positional", None), ("seed", "keyword", "0")]
    assert grown_badly(old, old + [("rank", "keyword", "0")]) is None
    assert grown_badly(old, old + [("rank", "positional", "0")]) is not None
    assert grown_badly(old, old + [("rank", "keyword", None)]) is not None
    assert grown_badly(old, [("x", "positional", None), ("seed", "keyword", "1")]) is not None
    assert grown_badly(old[:1], old) is None
    assert grown_badly([("a", "field", "1")], [("a", "field", "1"), ("b", "field", "0")]) is None
    assert grown_badly([("a", "field", "1")], [("b", "field", "0"), ("a", "field", "1")])


@pytest.mark.parametrize("name", sorted(extended()))
def test_an_extension_keeps_the_earlier_signature_and_adds_only_keyword_options(name):
    """Every caller of the earlier definition works unchanged with the grown one: a function's
    parameters, a class's constructor and each of its public methods."""
    defs = extended()[name]
    for (_, _, before), (chapter, _, after) in zip(defs, defs[1:], strict=False):
        assert type(before) is type(after), f"{chapter} turns {name} into another kind of thing"
        old, new = interface(before), interface(after)
        assert old, f"{name} has no callable interface to compare"
        missing = sorted(set(old) - set(new))
        assert missing == [], f"{chapter}'s {name} drops {missing}"
        broken = {part: why for part in old if (why := grown_badly(old[part], new[part]))}
        assert broken == {}, f"{chapter}'s {name}: {broken}"


def calls(name: str, paths: list[Path]) -> list[ast.Call]:
    found = []
    for path in paths:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":
                source = "\n".join(
                    line for line in cell.source.splitlines() if not line.startswith(("%", "!"))
                )
                found += [
                    node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Call)
                    and getattr(node.func, "id", getattr(node.func, "attr", None)) == name
                ]
    return found


def grown_callables() -> list[str]:
    """Extended names whose first definition has a parameter list to check: functions and
    classes with an __init__ (a dataclass's fields are settings that later code reads, not
    parameters some call must pass)."""
    return sorted(name for name, defs in extended().items()
                  if not (isinstance(defs[0][2], ast.ClassDef) and is_dataclass(defs[0][2])))


# A first definition's parameters that no chapter's call uses, allowed by name, and why:
# chapter 22's train_distributed takes train_worker's options and passes them on (the chapters
# call train_worker itself; the training command calls train_distributed).
PASSED_ON = {"train_distributed": {"resume", "overwrite", "progress", "threads", "pairs",
                                   "save_every"}}


@pytest.mark.parametrize("name", grown_callables())
def test_a_first_definition_has_no_parameter_that_only_a_later_chapter_uses(name):
    """The chapter that teaches a function shows its smallest version: each optional parameter
    is used by some call before the chapter that grows the function."""
    defs = extended()[name]
    first_chapter, _, first = defs[0]
    order = [p.name for p in chapters()]
    before = [p for p in chapters()
              if order.index(first_chapter) <= order.index(p.name) < order.index(defs[1][0])]
    offered = interface(first)[name if isinstance(first, ast.FunctionDef) else "__init__"]
    if isinstance(first, ast.ClassDef):
        offered = offered[1:]  # self
    used = set()
    for call in calls(name, before):
        used |= {k.arg for k in call.keywords}
        used |= {p for p, _, _ in offered[:len(call.args)]}
    used |= PASSED_ON.get(name, set())
    unused = [p for p, _, default in offered if default is not None and p not in used]
    assert unused == [], f"{first_chapter}'s {name} has parameters no call uses yet: {unused}"


def test_module_holds_only_definitions():
    """Export cells define things; examples, prints and training stay in the chapters."""
    tree = ast.parse((ROOT / "the_annotated_transformer.py").read_text())
    allowed = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Assign,
               ast.AnnAssign)
    statements = [
        f"line {node.lineno}: {ast.unparse(node)[:60]}"
        for node in tree.body
        if not isinstance(node, allowed)
        and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
    ]
    assert statements == []


def test_module_imports_quietly_without_heavy_libraries():
    probe = (
        "import sys, the_annotated_transformer\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "[]", "importing the module printed or loaded heavy modules"
    assert result.stderr == ""


def part_chapters(*parts: str) -> list[Path]:
    """The chapters of the named parts of _toc.yml ("Part I", ...), in order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [
        ROOT / f"{chapter['file']}.ipynb"
        for part in toc["parts"]
        if part["caption"].split(":")[0] in parts
        for chapter in part["chapters"]
    ]


EXERCISE_ITEM = re.compile(r"^\d+\. \*\*", re.MULTILINE)  # "1. **Title.** ..."


@pytest.mark.parametrize("path", part_chapters("Part I", "Part II"), ids=lambda p: p.stem)
def test_part_one_and_two_chapters_end_with_exercises_whose_checks_nbval_runs(path):
    nb = nbformat.read(path, as_version=4)
    sections = [
        (i, line.strip())
        for i, cell in enumerate(nb.cells)
        if cell.cell_type == "markdown"
        for line in cell.source.splitlines()
        if line.startswith("## ")
    ]
    assert sections and sections[-1][1] == "## Exercises", "the last section is not Exercises"
    cells = nb.cells[sections[-1][0]:]
    text = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    assert 2 <= len(EXERCISE_ITEM.findall(text)) <= 4, "want 2 to 4 exercises, '1. **Title.**'"
    code = [c for c in cells if c.cell_type == "code"]
    solutions = [c for c in code if "hide-cell" in tags(c)]
    checks = [c for c in code if "hide-cell" not in tags(c) and "assert " in c.source]
    assert solutions, "no hidden solution cell (tagged hide-cell)"
    assert checks, "no cell that checks an answer with assert"
    for cell in code:
        assert not {"skip-execution", "raises-exception", "nbval-skip",
                    "nbval-raises-exception"} & set(tags(cell)), "nbval would not run a check"
        assert cell.execution_count is not None, "an exercise cell was not executed"
        assert [o for o in cell.outputs if o.output_type == "error"] == []
