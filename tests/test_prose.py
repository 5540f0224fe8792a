"""The chapters' prose: every number it states is printed by the book or marked as approximate,
and it describes the book as it is, not how it came to be."""

import ast
import json
import re
from pathlib import Path

import nbformat
import pytest
from chart_rows import VEGA_LITE_MIME  # tests/conftest.py puts tools/ on the path
from sync import chapters

ROOT = Path(__file__).resolve().parents[1]

# A decimal (3.14, 1,014.5) or a percentage (95 %, 12.5%) in running text.
NUMBER = re.compile(
    r"(?<![\w.$^{/-])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+|\d+)\s?(\\?%)?(?![\w.]\d)")
# Words that mark a number as approximate or as a bound, and words that make it a reference
# (section 5.4, Table 2, equation 3) rather than a measurement.
APPROXIMATE = re.compile(
    r"(about|around|roughly|nearly|almost|approximately|~|≈|over|under|below|above|up to|"
    r"at least|at most|more than|less than|fewer than|some)\s*$", re.IGNORECASE)
REFERENCE = re.compile(r"(section|sections|§|table|equation|eq\.|chapter|chapters|figure|"
                       r"version|v|python|torch|pytorch|sacrebleu)\s*$", re.IGNORECASE)
PERCENTAGE = re.compile(r"(?<![\d.])(\d+\.\d+)\s?%")
# The second number of a range ("roughly 800 to 1,450") is as approximate as the first.
RANGE = re.compile(r"\d[\d,.]*\s?%?\s*(?:to|and|or|-|–)\s*$")
# A whole number with a unit after it (305 steps, 5 minutes, 8 of 10) is a measurement at any
# size; without one, a number from 10 up is checked too (a count, a size), but not a year or a
# small number without a unit, which is too often an input (3 seeds, 2 cores) or an ordinal.
UNIT = re.compile(r"\s+(?:(?:optimizer|training|target|source)\s+)?(?:seconds?|minutes?|hours?|"
                  r"steps|epochs|tokens|sentences|pairs|runs|parameters|batches|"
                  r"of\s+(?:(?:the|its|their)\s+)?[\d,]+\b)")

# Numbers that the prose states without a cell printing them, each with its reason.
CITED = "a published figure, cited in the sentence"
# Reasons that several chapters share.
PAIRS = "Multi30k's training pairs, printed by chapter 9"
BASE_SIZE = CITED + " (the paper's Table 3: base parameters)"
BIG_SIZE = CITED + " (the paper's Table 3: big parameters)"
ALLOWED: dict[tuple[str, str], str] = {
    ("09_training_data", "4.5"): CITED + " (WMT 2014's 4.5 million pairs, the paper's §5.1)",
    ("10_schedule_and_optimizer", "213"): BIG_SIZE,
    ("10_schedule_and_optimizer", "250"): "chapter 19's training length, which the sentence names",
    ("10_schedule_and_optimizer", "65"): BASE_SIZE,
    ("11_regularization", "25.3"): CITED + " (the paper's Table 3)",
    ("12_copy_task", "0.0125"): "the schedule's peak, worked out in the sentence",
    ("12_copy_task", "20,000"): "the exercise's input (its answer draws 20_000 sequences)",
    ("12_copy_task", "65"): BASE_SIZE,
    ("14_multi30k_training", "125"): "1,000 warm-up steps over 8 processes, as the sentence says",
    ("14_multi30k_training", "24,576"): "6 x 4,096 tokens, the accumulation the sentence gives",
    ("14_multi30k_training", "25,000"): CITED + " (the paper's §5.1: tokens per batch)",
    ("14_multi30k_training", "29,000"): PAIRS,
    ("14_multi30k_training", "3,000"): "a candidate's batch size, an input of the comparison",
    ("14_multi30k_training", "305"): "len(multi30k_loader(...)) over the 29,000 training pairs "
                                     "at 1,500 tokens, the cpu preset's batches per epoch",
    ("14_multi30k_training", "32,768"): "8 x 4,096 tokens, the processes the sentence gives",
    ("14_multi30k_training", "4,000"): CITED + " (the paper's §5.3: warm-up steps)",
    ("15_beam_search", "2,014"): "1,014 validation and 1,000 test sentences, both printed",
    ("15_beam_search", "6,190"): "the English vocabulary's size, printed by chapter 9",
    ("17_subword_vocabularies", "10.8"): "the 10,757,166 parameters printed below, in millions",
    ("17_subword_vocabularies", "120"): 'quoted from a caption ("120 cm")',
    ("17_subword_vocabularies", "29,000"): PAIRS,
    ("17_subword_vocabularies", "32,000"): CITED + " (the paper's §5.1: English-French pieces)",
    ("17_subword_vocabularies", "37,000"): CITED + " (the paper's §5.1: English-German pieces)",
    ("18_results", "12.5%"): "printed by chapter 17, which the sentence names",
    ("18_results", "213"): BIG_SIZE,
    ("18_results", "29,000"): PAIRS,
    ("18_results", "4.5"): CITED + " (WMT 2014's 4.5 million pairs)",
    ("18_results", "65"): BASE_SIZE,
    ("19_model_variations", "100,000"): CITED + " (the paper's §5.2, Table 3: base steps)",
    ("20_constituency_parsing", "21"): CITED + " (the paper's §6.3: beam size 21)",
    ("20_constituency_parsing", "40,000"): CITED + " (the paper's §6.3: the WSJ training set)",
    ("20_constituency_parsing", "88.3"): CITED + " (the paper's Table 4: Vinyals et al., WSJ only)",
    ("20_constituency_parsing", "90.4"): CITED + " (the paper's Table 4: the Berkeley parser)",
    ("20_constituency_parsing", "91.3"): CITED + " (the paper's Table 4)",
    ("20_constituency_parsing", "91.7"): CITED + " (the paper's Table 4: RNNG, WSJ only)",
    ("20_constituency_parsing", "92.7"): CITED + " (the paper's Table 4)",
    ("22_training_on_many_devices", "4,096"): "the base preset's max_tokens (chapter 14)",
    ("23_transformer_as_a_graph", "21"): "5 + 9 + 7 nodes, the sum the sentence works out",
    ("25_what_came_after", "175"): CITED + " (GPT-3's 175 billion parameters)",
    ("25_what_came_after", "213"): BIG_SIZE,
    ("26_universal_transformer", "99.5%"): "the graph tutorial's figure, named in the sentence",
    ("27_conclusion", "27"): CITED + " (the paper's Table 2: 27.3, rounded)",
    ("27_conclusion", "29,000"): PAIRS,
    ("27_conclusion", "4.5"): CITED + " (WMT 2014's 4.5 million pairs)",
    ("27_conclusion", "92.7"): CITED + " (the paper's Table 4)",
}


def without_code_blocks(text: str) -> str:
    """The text without its fenced code blocks (commands), keeping the text inside directives
    (```{note}, ```{figure}), which is prose."""
    kept, fences = [], []  # fences: for each open block, whether it is code
    for line in text.splitlines():
        fence = re.match(r"\s*(`{3,})(\S*)", line)
        if fence and fences and not fence.group(2):
            fences.pop()  # a closing fence
        elif fence:
            fences.append(not fence.group(2).startswith("{"))
        elif not any(fences):
            kept.append(line)
    return "\n".join(kept)


def markdown_text(nb) -> str:
    """The markdown cells, without math, code, links, citations and directive options."""
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    text = without_code_blocks(text)
    text = re.sub(r"^:[\w-]+:.*$", " ", text, flags=re.MULTILINE)  # a figure's :width: option
    for pattern in (r"\$\$.*?\$\$", r"\$[^$\n]*\$", r"`[^`\n]*`", r"\]\([^)]*\)"):
        text = re.sub(pattern, " ", text, flags=re.DOTALL)
    return text


def printed_text(nb) -> str:
    """What the chapter's code and outputs hold, and the data files that the book reads."""
    parts = []
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        parts.append(cell.source)
        for output in cell.get("outputs", []):
            parts.append(output.get("text", ""))
            for value in output.get("data", {}).values():
                parts.append(value if isinstance(value, str) else json.dumps(value))
    for path in [*ROOT.glob("book/data/*.json"), *ROOT.glob("book/models/*/*.json")]:
        parts.append(path.read_text())
    return "\n".join(parts)


def stated_numbers(text: str) -> list[str]:
    """Decimals, percentages and measured whole numbers in the text that are neither
    approximate nor references."""
    found = []
    for match in NUMBER.finditer(text):
        number, percent = match.groups()
        value = int(number.replace(",", "")) if not percent and "." not in number else None
        if value is not None and not UNIT.match(text, match.end(1)) and (
                value < 10 or 1900 <= value <= 2099):
            continue  # a year, an ordinal or a small count
        before = text[max(0, match.start() - 24):match.start()]
        if RANGE.search(before):
            before = text[max(0, match.start() - 48):match.start()]
            before = before[:RANGE.search(before).start()]
        if APPROXIMATE.search(before) or REFERENCE.search(before):
            continue
        found.append(number + ("%" if percent else ""))
    return found


def is_printed(number: str, printed: str) -> bool:
    """A decimal appears in the printed text; a whole number appears there as a whole number
    (305 in "305 batches", not in "0.305" or "13050"); a whole percentage may be a printed one
    rounded (21% for 21.3%)."""
    bare = number.rstrip("%")
    forms = {bare, bare.replace(",", "")}
    if "." in bare:
        return any(form in printed for form in forms)
    if any(re.search(rf"(?<![\d.,]){re.escape(form)}(?!\d|[.,]\d)", printed) for form in forms):
        return True
    return number.endswith("%") and any(
        round(float(value)) == int(bare) for value in PERCENTAGE.findall(printed))


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_every_number_in_the_prose_is_printed_or_marked(path):
    nb = nbformat.read(path, as_version=4)
    printed = printed_text(nb)
    unprinted = []
    for number in stated_numbers(markdown_text(nb)):
        if is_printed(number, printed):
            continue
        if (path.stem, number) not in ALLOWED:
            unprinted.append(number)
    assert unprinted == [], (
        f"{path.stem} states numbers that no cell prints and no data file holds: {unprinted}; "
        "print them, mark them approximate ('about'), or add them to ALLOWED with a reason")


def test_the_number_check_finds_measurements_and_skips_marked_numbers():
    text = ("In 2017 the run took 305 steps and about 40 minutes, roughly 800 to 1,450 tokens/s; "
            "it copied 33 of the 100 sequences (section 5.4, 3 seeds) at 12.5% or 0.98 loss; "
            "5 of 8 runs, a vocabulary of 8,012 words, batches of 1,500\ntokens, in 2 cores.")
    assert stated_numbers(text) == [
        "305", "33", "100", "12.5%", "0.98", "5", "8", "8,012", "1,500"]


def test_the_prose_leaves_out_commands_and_figure_options():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "Run it:\n\n```bash\npython train.py --batch-tokens 25000\n```\n\n"
        "```{figure} a.svg\n:width: 340px\n\nA caption of 21 nodes.\n```")])
    assert stated_numbers(markdown_text(nb)) == ["21"]
    printed = "steps: 305\nshare 0.305, 21.3% of references, run 13050"
    assert is_printed("305", printed) and is_printed("21%", printed)
    assert not is_printed("30", printed) and not is_printed("130", printed)
    assert not is_printed("22%", printed)


def test_the_allow_list_names_only_numbers_that_the_prose_states():
    stated = {(path.stem, number) for path in chapters()
              for number in stated_numbers(markdown_text(nbformat.read(path, as_version=4)))}
    assert sorted(set(ALLOWED) - stated) == []


HISTORY = re.compile(
    r"first version of this book|this book's first version|earlier version of this|"
    r"\bthe issue\b|an issue asked|\bissue #?\d+|\bnot met\b|goals? (?:was|were|is|are) met|"
    r"\bonce (?:said|reported|claimed)\b",
    re.IGNORECASE)


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_no_chapter_tells_the_books_development_history(path):
    nb = nbformat.read(path, as_version=4)
    text = "\n".join(cell.source for cell in nb.cells)
    assert HISTORY.findall(text) == [], "the book describes itself as it is; history goes to "
    "the README's changelog"


# A chart draws what its cell computed or what a data file holds. A chart cell that types three or
# more decimals into its source is listed here with the reason they are inputs, not results;
# any other would be a chart whose rows were copied from some run.
TYPED_NUMBERS: dict[tuple[str, tuple[float, ...]], str] = {
    ("intro", (23.75, 24.6, 25.16, 9.6, 26.03, 27.3, 3.3, 28.4)):
        "the paper's Table 2 (BLEU and training cost), cited beside the chart",
    ("10_schedule_and_optimizer", (1.0, 1.0, 1.0)): "the schedule's factor, an input",
    ("11_regularization", (0.4, 0.2, 0.1, 0.0, 0.5, 0.1, 0.1)):
        "a smoothing value and a made-up prediction, the example's input",
    ("11_regularization", (0.0, 0.1, 0.3, 0.0)): "the smoothing values the chart compares",
    ("16_checkpoint_averaging", (0.5, 0.5, 0.0, 1.0, 0.0, 0.5, 0.125, 0.0, 0.5, 1.0)):
        "the interpolation grid and the points it marks",
    ("appendix_infrastructure", (0.9, 0.94, 0.92, 0.91, 0.85, 0.88)):
        "made-up accuracies that show how the seeds chart draws",
}


def typed_decimals(source: str) -> tuple[float, ...]:
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    tree = ast.parse("\n".join(lines))
    return tuple(node.value for node in ast.walk(tree)
                 if isinstance(node, ast.Constant) and type(node.value) is float)


def chart_cells(nb) -> list:
    return [cell for cell in nb.cells if cell.cell_type == "code" and any(
        VEGA_LITE_MIME in output.get("data", {})
        for output in cell.get("outputs", []))]


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_no_chart_draws_rows_typed_into_its_cell(path):
    nb = nbformat.read(path, as_version=4)
    typed = [numbers for cell in chart_cells(nb)
             if len(numbers := typed_decimals(cell.source)) >= 3
             and (path.stem, numbers) not in TYPED_NUMBERS]
    assert typed == [], (
        f"{path.stem}: a chart cell types these numbers into its source: {typed}; compute the "
        "rows in the cell or read them from a data file (or list the numbers in TYPED_NUMBERS "
        "with the reason they are inputs)")


def test_the_typed_numbers_list_names_only_cells_that_exist():
    found = {(path.stem, typed_decimals(cell.source))
             for path in chapters()
             for cell in chart_cells(nbformat.read(path, as_version=4))}
    assert sorted(set(TYPED_NUMBERS) - found) == []
