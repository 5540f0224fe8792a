"""The chapters' prose: every number it states is printed by the book, cited or an input; it
describes the book as it is, not how it came to be; and the reading path keeps its length.

What "a number" is grows with the drifts that reviews found. A digit in running text is checked
against everything the chapter prints (below); a number behind "about" must round a value that the
chapter's cells print; a count written as a word ("two runs", "both shipped models", "trained
twice") must be a count that the chapter prints or that its data files hold; and a sentence may
not rest on evidence that the book does not store ("a quick measurement not stored with the
book"). Each check lets a legitimate case through only by the ALLOWED list, with its reason.
"""

import ast
import bisect
import functools
import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import nbformat
import pytest
from chart_rows import VEGA_LITE_MIME  # tests/conftest.py puts tools/ on the path
from sync import chapters, toc_files

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

# Numbers that the prose states without a cell printing them, each with its reason: a digit or
# a number behind "about" as written ("4.5", "81%"), a count in words as written ("two runs").
CITED = "a published figure, cited in the sentence"
# Reasons that several chapters share.
PAIRS = "Multi30k's training pairs, printed by chapter 9"
BASE_SIZE = CITED + " (the paper's Table 3: base parameters)"
BIG_SIZE = CITED + " (the paper's Table 3: big parameters)"
ALLOWED: dict[tuple[str, str], str] = {
    ("09_training_data", "4.5"): CITED + " (WMT 2014's 4.5 million pairs, the paper's §5.1)",
    ("09_training_data", "25,000"): CITED + " (the paper's §5.1: tokens per batch)",
    ("09_training_data", "37,000"): CITED + " (the paper's §5.1: the shared byte-pair vocabulary)",
    ("09_training_data", "32,000"): CITED + " (the paper's §5.1: English-French word-pieces)",
    ("11_regularization", "25.3"): CITED + " (the paper's Table 3)",
    ("12_copy_task", "20,000"): "the exercise's input (its answer draws 20_000 sequences)",
    ("14_multi30k_training", "25,000"): CITED + " (the paper's §5.1: tokens per batch)",
    ("14_multi30k_training", "29,000"): PAIRS,
    ("14_multi30k_training", "305"): "the cpu preset's micro-batches per epoch, printed by "
                                     "chapter 22's schedule cell",
    ("14_multi30k_training", "10.6"): CITED + " (NVIDIA's P100 datasheet: the SXM2 part's FP32 "
                                      "peak)",
    ("14_multi30k_training", "4,000"): CITED + " (the paper's §5.3: warm-up steps)",
    ("15_beam_search", "6,190"): "the English vocabulary's size, printed by chapter 14",
    ("17_subword_vocabularies", "10.8"): "the 10,757,166 parameters printed below, in millions",
    ("17_subword_vocabularies", "120"): 'quoted from a caption ("120 cm")',
    ("17_subword_vocabularies", "29,000"): PAIRS,
    ("17_subword_vocabularies", "32,000"): CITED + " (the paper's §5.1: English-French pieces)",
    ("17_subword_vocabularies", "37,000"): CITED + " (the paper's §5.1: English-German pieces)",
    ("18_results", "213"): BIG_SIZE,
    ("18_results", "29,000"): PAIRS,
    ("18_results", "4.5"): CITED + " (WMT 2014's 4.5 million pairs)",
    ("18_results", "42"): "the peer run's 42.0 training minutes, printed by the peer section's "
                          "cell (peer_multi30k.json)",
    ("18_results", "65"): BASE_SIZE,
    ("19_model_variations", "100,000"): CITED + " (the paper's §5.2, Table 3: base steps)",
    ("19_model_variations", "two rows"): "rows B and E of the paper's Table 3, named in the next "
                                         "paragraphs",
    ("20_constituency_parsing", "21"): CITED + " (the paper's §6.3: beam size 21)",
    ("20_constituency_parsing", "40,000"): CITED + " (the paper's §6.3: the WSJ training set)",
    ("20_constituency_parsing", "88.3"): CITED + " (the paper's Table 4: Vinyals et al., WSJ only)",
    ("20_constituency_parsing", "90.4"): CITED + " (the paper's Table 4: the Berkeley parser)",
    ("20_constituency_parsing", "91.3"): CITED + " (the paper's Table 4)",
    ("20_constituency_parsing", "91.7"): CITED + " (the paper's Table 4: RNNG, WSJ only)",
    ("20_constituency_parsing", "92.7"): CITED + " (the paper's Table 4)",
    ("20_constituency_parsing", "93.3"): CITED + " (the paper's Table 4: RNNG, generative)",
    ("21_making_it_fast", "42"): "the peer run's 42.0 training minutes on the EPYC, printed by "
                                 "chapter 18",
    ("23_transformer_as_a_graph", "21"): "5 + 9 + 7 nodes, the sum the sentence works out",
    ("25_what_came_after", "175"): CITED + " (GPT-3's 175 billion parameters)",
    ("25_what_came_after", "213"): BIG_SIZE,
    ("25_what_came_after", "two models"): "the experiment's input: the cell below trains one model "
                                          "per position encoding",
    ("26_universal_transformer", "99.5%"): "the graph tutorial's figure, named in the sentence",
    ("26_universal_transformer", "three runs"): "the experiment's input: the cell below trains "
                                                "the three models the sentence lists",
    ("27_conclusion", "29,000"): PAIRS,
    ("27_conclusion", "4.5"): CITED + " (WMT 2014's 4.5 million pairs)",
    ("27_conclusion", "92.7"): CITED + " (the paper's Table 4)",
}


@functools.cache
def notebook(path: Path):
    """A notebook, read once for every test in this file (none of them changes it)."""
    return nbformat.read(path, as_version=4)


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
    parts += [path.read_text() for path in data_files()]
    return "\n".join(parts)


def data_files() -> list[Path]:
    """The stored results that the book reads: book/data and the shipped models' JSON files, but
    not their vocabularies, which map every word to an id and so hold every whole number up to
    their size (they would "print" any count)."""
    return [path for path in [*ROOT.glob("book/data/*.json"), *ROOT.glob("book/models/*/*.json")]
            if not path.name.startswith("vocab")]


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
    nb = notebook(path)
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


# The prose as sentences, and what the cells print.

def sentences(text: str) -> list[str]:
    """The text's sentences, each on one line: split at blank lines, headings and list items,
    then after a full stop, question or exclamation mark that a capital follows."""
    found = []
    for block in re.split(r"\n\s*\n|\n(?=\s*(?:#|[-*+] |\d+\. ))", text):
        block = " ".join(block.split())
        found += [part for part in re.split(r"(?<=[.!?])\s+(?=[A-Z*(\"“])", block) if part]
    return found


def output_text(cell) -> str:
    """What a code cell shows: its streams, and its results as text, HTML or JSON (a chart's
    rows); not its images."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        parts += [value if isinstance(value, str) else json.dumps(value)
                  for mime, value in output.get("data", {}).items()
                  if not mime.startswith("image/")]
    return "\n".join(parts)


# A number as a cell prints it: 1,014.5, 3.2e-05, 65.2M (also read as 65,200,000).
PRINTED_VALUE = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(\.\d+)?(?:e([-+]?\d+))?([kMB]\b)?")
SUFFIXES = {"k": 1e3, "M": 1e6, "B": 1e9}


def printed_values(cells: list) -> list[float]:
    """Every number that the cells print, sorted."""
    values = set()
    for cell in cells:
        for match in PRINTED_VALUE.finditer(output_text(cell)):
            whole, fraction, exponent, suffix = match.groups()
            value = float(whole.replace(",", "") + (fraction or "")) * 10.0 ** int(exponent or 0)
            values |= {value, value * SUFFIXES[suffix]} if suffix else {value}
    return sorted(values)


# Numbers behind "about". "About" says that a number is rounded, not that it may be anything:
# "about 0.77 million more parameters" over counts that differ by 792,320, or "about 41" where the
# chapter prints 40.3 and 42.0, are drifts. So an approximate number must be what a printed value
# gives when rounded to the approximate number's last written digit (see `step`), or, where the
# sentence compares ("more", "faster", "by", "times"), a difference or ratio of two printed values
# rounded so. The values are those that the chapter's cells print (or a chapter's that the
# sentence names), not its data files: the prose rounds what the reader can see. A published
# figure or an input goes to ALLOWED with its reason.
# Words ("a few hundred", "half") are not checked: they bound too loosely to test.
AMOUNT = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
APPROXIMATE_AMOUNT = re.compile(
    rf"(?:\b(?:about|around|roughly|approximately|nearly|almost)\s+|[~≈]\s?)({AMOUNT})(\s?\\?%)?"
    rf"(?:\s*(?:to|and|or|-|–)\s*({AMOUNT})(\s?\\?%)?)?(?:\s+(thousand|million|billion)\b)?",
    re.IGNORECASE)
SCALES = {"thousand": 1e3, "million": 1e6, "billion": 1e9}
COMPARISON = re.compile(r"\b(?:more|fewer|less|larger|smaller|higher|lower|better|worse|faster|"
                        r"slower|ahead|behind|apart|gap|difference|by|times|x)\b|×", re.IGNORECASE)


class Approximation(NamedTuple):
    written: str  # as the prose writes it, the ALLOWED key: "0.77", "81%"
    value: float
    tolerance: float  # half the step of its last written digit, at its scale
    percent: bool
    compared: bool  # the sentence compares: the number may be a difference or a ratio


def step(number: str) -> float:
    """The step of a number's last written digit: 0.01 for 0.77, 1 for 41, 100 for 2,400 (the
    trailing zeros of a whole number are rounding, not digits)."""
    digits = number.replace(",", "")
    if "." in digits:
        return 10.0 ** -len(digits.split(".")[1])
    return 10.0 ** (len(digits) - len(digits.rstrip("0")))


def approximations(sentence: str) -> list[Approximation]:
    """The numbers behind "about" (and the second number of "about 800 to 1,450")."""
    found = []
    for match in APPROXIMATE_AMOUNT.finditer(sentence):
        scale = SCALES.get((match.group(5) or "").lower(), 1)
        around = sentence[max(0, match.start() - 30):match.end() + 40]
        for number, percent in (match.group(1, 2), match.group(3, 4)):
            if number:
                found.append(Approximation(
                    number + ("%" if percent else ""), float(number.replace(",", "")) * scale,
                    step(number) * scale / 2, bool(percent), bool(COMPARISON.search(around))))
    return found


def has_value_within(values: list[float], low: float, high: float) -> bool:
    i = bisect.bisect_left(values, low - 1e-9 * abs(low))
    return i < len(values) and values[i] <= high + 1e-9 * abs(high)


def rounds_a_printed_value(approximation: Approximation, values: list[float]) -> bool:
    """Whether a printed value (or, in a comparison, a difference or ratio of two) rounds to the
    approximate number; a percentage may round a printed fraction (81% for 0.8117)."""
    low, high = (approximation.value - approximation.tolerance,
                 approximation.value + approximation.tolerance)
    ranges = [(low, high)] + ([(low / 100, high / 100)] if approximation.percent else [])
    if any(has_value_within(values, lo, hi) for lo, hi in ranges):
        return True
    if not approximation.compared:
        return False
    # b - a = the number; b / a = the number, or 1 + the number for a percentage (12% faster).
    ratios = [(1 + lo, 1 + hi) for lo, hi in ranges[1:]] or ranges
    differences = any(has_value_within(values, a + lo, a + hi)
                      for a in values for lo, hi in ranges)
    return differences or any(has_value_within(values, a * lo, a * hi)
                              for a in values if a > 0 for lo, hi in ratios)


def typed_strings(cell) -> list[str]:
    """The strings typed into a code cell that is neither setup nor a definition: a table row
    written as text ("about 41 dev, 43 test") is prose that the cell's output only repeats."""
    tags = cell.get("metadata", {}).get("tags", [])
    if {"setup", "export", "extends"} & set(tags):
        return []
    lines = [line for line in cell.source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    return [node.value for node in ast.walk(ast.parse("\n".join(lines)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def approximations_in(nb) -> Iterator[tuple[str, str]]:
    """(number, sentence) for every number behind "about" in the prose, checked against every
    cell's output and those of the chapters the sentence names, and in a cell's typed strings,
    checked against the other cells' outputs."""
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    values = printed_values(code)
    for sentence in sentences(markdown_text(nb)):
        if not (found := approximations(sentence)):
            continue
        shown = values
        if named := named_chapters(sentence):
            shown = sorted(values + [value for path in named
                                     for value in chapter_evidence(path).values])
        yield from ((a.written, sentence) for a in found if not rounds_a_printed_value(a, shown))
    for cell in code:
        if typed := [(a, text) for text in typed_strings(cell) for a in approximations(text)]:
            others = printed_values([other for other in code if other is not cell])
            yield from ((a.written, text) for a, text in typed
                        if not rounds_a_printed_value(a, others))


@functools.cache
def approximations_off(path: Path) -> list[tuple[str, str]]:
    return list(approximations_in(notebook(path)))


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_every_number_behind_about_rounds_a_printed_one(path):
    off = [(number, sentence[:160]) for number, sentence in approximations_off(path)
           if (path.stem, number) not in ALLOWED]
    assert off == [], (
        f"{path.stem}: these approximate numbers round nothing that its cells print: {off}; "
        "print the value, round it as printed, or add a cited figure or input to ALLOWED")


# Counts written as words. "Both shipped models" (there are three), "trained twice" (five seeds
# under two kernel sets) and "the two runs on the Intel Xeon" (four) are numbers too. Checked: a
# number word, or 2 to 20 in digits, before a noun that counts what the book stores (COUNTED);
# "both" before such a noun with a word between ("both shipped models"; a bare "both models"
# points back at two things just named); "a pair of"; "trained/run twice" and "twice more".
# Evidence: the count printed beside its noun ("5 seeds", "seeds: 5", "epochs 8-12"), held by a
# data file the chapter reads (its records, their distinct seeds or kernel sets, the runs of one
# row or machine, {"epochs": 12}), the rows of a table it prints, or set in its code
# ("epochs=12"); or the same in a chapter the sentence names; else ALLOWED, as an input or a
# citation. Left alone: nouns of definitions (two heads, two layers), of hardware (two cores,
# eight GPUs) and ordinary English ("both ... and", "twice as fast"), which count no stored
# result. An enumeration in the sentence ("trained twice, with seeds 0 and 1") is no evidence: it
# repeats the count, it does not prove it.
NUMBER_WORDS = {word: n for n, word in enumerate(
    "two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split(), start=2)} | {"both": 2, "a pair of": 2}
COUNTED = (r"runs?|seeds?|models?|rows?|epochs?|kernel sets?|trials?|sessions?|measurements?|"
           r"timings?")
NOT_A_MODIFIER = r"(?:of|and|or|to|the|these|those|its|their|our|more)\b"
COUNT = re.compile(
    rf"(?<![\w,.])({'|'.join(sorted(NUMBER_WORDS, key=len, reverse=True))}|\d+)\s+"
    rf"(?:(?!{NOT_A_MODIFIER})([a-z][\w-]*[^\Ws])\s+)?({COUNTED})\b(?!(?<=rows)\s+of\b)",
    re.IGNORECASE)  # "rows of W" are a matrix's; a modifier ending in s is a noun ("tokens runs")
TWICE = re.compile(r"\b(?:trained|run|ran|rerun|repeated|measured|timed)\s+twice\b|"
                   r"\btwice\s+more\b", re.IGNORECASE)


class Count(NamedTuple):
    written: str  # the ALLOWED key: "two runs", "trained twice"
    n: int
    noun: str  # singular: "run", "kernel" (for kernel sets)


def singular(noun: str) -> str:
    noun = noun.lower().replace("kernel set", "kernel")
    return noun[:-1] if noun.endswith("s") and not noun.endswith("ss") else noun


def counts(sentence: str) -> list[Count]:
    """The counts of stored things that a sentence states, in words or small digits."""
    found = []
    for match in COUNT.finditer(sentence):
        word, modifier, noun = match.groups()
        n = int(word) if word.isdigit() else NUMBER_WORDS[word.lower()]
        if (word.isdigit() and not 2 <= n <= 20) or (word.lower() == "both" and not modifier):
            continue  # a size rather than a count; "both X" pointing back
        found.append(Count(" ".join(match.group(0).lower().split()), n, singular(noun)))
    return found + [Count(" ".join(match.group(0).lower().split()), 2, "run")
                    for match in TWICE.finditer(sentence)]


def prints_count(count: Count, shown: str) -> bool:
    """Whether the text prints the count beside its noun ("5 seeds", "5 kernel sets", "seeds:
    5"; not "seed 2", which names one) or as a span of it ("epochs 8-12" are five, "epochs 10
    and 11" two)."""
    noun = re.escape(count.noun)
    if re.search(rf"(?<![\w.,]){count.n}\s+(?:[\w-]+\s+)?{noun}s?\b|"
                 rf"\b{noun}s\W{{1,3}}{count.n}(?![\w.])", shown, re.IGNORECASE):
        return True
    spans = re.findall(rf"\b{noun}s\s+(\d+)\s*(-|–|to|and)\s*(\d+)\b", shown, re.IGNORECASE)
    return any((2 if word == "and" else int(last) - int(first) + 1) == count.n
               for first, word, last in spans)


def table_rows(outputs: str) -> set[tuple[int, str]]:
    """The rows of each table that the outputs print (a DataFrame's HTML body)."""
    return {(body.count("<tr"), "row") for body in re.findall(r"<tbody>(.*?)</tbody>", outputs,
                                                             re.DOTALL)}


@functools.cache
def read_json(path: Path):
    return json.loads(path.read_text())


def chapter_data(nb, stem: str) -> list:
    """The data files that a chapter reads: a book/data file that it names (by file name, or by
    the experiment name that tools/seeds.py takes) or that names it, and the files of a shipped
    model that it names (shipped_model_dir() without a name is multi30k_cpu)."""
    text = "\n".join(cell.source for cell in nb.cells)
    found = []
    for path in data_files():
        data, folder = read_json(path), path.parent.name
        if folder == "data":
            named = (re.search(rf"\b{path.stem.removeprefix('seeds_')}\b", text)
                     or isinstance(data, dict) and data.get("chapter") == stem)
        else:
            named = (re.search(rf"\b{folder}\b", text)
                     or folder == "multi30k_cpu" and "shipped_model_dir()" in text)
        if named:
            found.append(data)
    return found


def nodes(node, key: str = "") -> Iterator[tuple[str, object]]:
    """Every value in a JSON document with the key it is stored under (a list's items under the
    list's key)."""
    yield key, node
    if isinstance(node, dict):
        for child_key, child in node.items():
            yield from nodes(child, child_key)
    elif isinstance(node, list):
        for child in node:
            yield from nodes(child, key)


def record_counts(key: str, records: list[dict]) -> set[tuple[int, str]]:
    """What a list of records counts: the records (under their key: "runs"), the distinct values
    of each field (a nested dict's fields too: config.seed), and, for runs, the runs of each
    row, variant, kernel set or machine."""
    rows = [{**{k: v for k, v in record.items() if not isinstance(v, dict | list)},
             **{k: v for nested in record.values() if isinstance(nested, dict)
                for k, v in nested.items() if not isinstance(v, dict | list)}}
            for record in records]
    found = {(len(rows), singular(key))}
    for field in {field for row in rows for field in row}:
        groups = Counter(json.dumps(row[field]) for row in rows if field in row)
        found.add((len(groups), singular(field)))
        if field == "variant":
            found.add((len(groups), "row"))  # a variant is the row of the table it fills
        if key == "runs" and field in ("row", "variant", "kernels", "hardware"):
            found |= {(size, "run") for size in groups.values()}
    return found


def stored_counts(documents: list) -> set[tuple[int, str]]:
    """Every (count, noun) that the documents hold, and the number of shipped models."""
    found = {(sum(1 for path in ROOT.glob("book/models/*/info.json")), "model")}
    for document in documents:
        for key, node in nodes(document):
            if isinstance(node, list) and node and all(isinstance(x, dict) for x in node):
                found |= record_counts(key, node)
            elif isinstance(node, int) and not isinstance(node, bool) and key.endswith("s"):
                found.add((node, singular(key)))  # {"epochs": 12}, not {"seed": 2}
    return found


class Evidence(NamedTuple):
    """What a chapter shows and stores."""
    text: str  # its cells' outputs and the data files it reads, as text
    code: str  # its cells' source
    values: list[float]  # every number they print, sorted
    counts: set[tuple[int, str]]  # the counts its data files hold, the rows of its tables


def evidence(nb, stem: str) -> Evidence:
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    outputs = "\n".join(output_text(cell) for cell in code)
    data = chapter_data(nb, stem)
    return Evidence("\n".join([outputs, *map(json.dumps, data)]),
                    "\n".join(cell.source for cell in code), printed_values(code),
                    stored_counts(data) | table_rows(outputs))


@functools.cache
def chapter_evidence(path: Path) -> Evidence:
    return evidence(notebook(path), path.stem)


def named_chapters(sentence: str) -> list[Path]:
    """The chapters that a sentence names ("chapter 19", "chapters 16 and 18"): a number it
    quotes from them is checked against theirs too."""
    numbers = {int(number) for match in re.finditer(
        r"\bchapters?\s+(\d+(?:(?:,\s*|\s+(?:and|or|to)\s+)\d+)*)", sentence, re.IGNORECASE)
        for number in re.findall(r"\d+", match.group(1))}
    return [path for path in chapters()
            if path.stem[:2].isdigit() and int(path.stem[:2]) in numbers]


def shows_count(count: Count, shown: Evidence) -> bool:
    """Whether a chapter prints or stores the count, or its code sets it as an input ("the same
    12 epochs": epochs=12)."""
    given = rf"\b{re.escape(count.noun)}s\s*=\s*{count.n}(?![\w.])"
    return ((count.n, count.noun) in shown.counts or prints_count(count, shown.text)
            or re.search(given, shown.code, re.IGNORECASE) is not None)


def unsupported_counts(nb, stem: str) -> list[tuple[str, str]]:
    """(count, sentence) for every count that neither the chapter nor a chapter the sentence
    names prints or stores."""
    own = evidence(nb, stem)
    return [(count.written, sentence) for sentence in sentences(markdown_text(nb))
            for count in counts(sentence)
            if not any(shows_count(count, shown) for shown in
                       [own, *map(chapter_evidence, named_chapters(sentence))])]


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_every_count_in_words_is_printed_or_stored(path):
    nb = notebook(path)
    off = [(count, sentence[:160]) for count, sentence in unsupported_counts(nb, path.stem)
           if (path.stem, count) not in ALLOWED]
    assert off == [], (
        f"{path.stem}: these counts are neither printed nor held by the data it reads: {off}; "
        "print the count, correct it, or add an input or citation to ALLOWED")


# Evidence that the book does not store. A claim that rests on "trials outside this page", "a
# quick measurement not stored with the book", "two earlier runs of this cell" or a run that
# "was stopped after its first epoch" cannot be checked by a reader or by this file: the prose
# keeps what a cell prints or a data file holds, and drops the rest.
UNSTORED = re.compile(
    r"not stored (?:with|in|on) (?:the|this) (?:book|page|chapter)|"
    r"outside (?:this|the) (?:page|book|chapter)|\b(?:earlier|previous) runs?\b|"
    r"\bquick measurements?\b|\bin (?:our |some |separate |other )?trials\b|"
    r"\b(?:was|were) (?:stopped|cut short|abandoned)\b|\bnot pinned down\b|\bnot shown here\b|"
    r"\bin (?:a|one) (?:separate|later|previous|earlier) (?:run|session|measurement)\b",
    re.IGNORECASE)


def unstored_evidence(text: str) -> list[str]:
    """The sentences that cite evidence the book does not store."""
    return [sentence for sentence in sentences(text) if UNSTORED.search(sentence)]


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_no_sentence_rests_on_evidence_that_the_book_does_not_store(path):
    found = unstored_evidence(markdown_text(notebook(path)))
    assert found == [], f"{path.stem}: store the evidence or drop the claim: {found}"


# Claims that no number carries. A fresh reading found "above every averaged six-epoch seed" with
# no seeds stored, "the only differences between the two runs" where the steps differed too, and
# "a minute or two of training" with no time printed. So: a quantifier over runs, seeds or models
# ("every seed", "all runs", "each of the models") needs a chapter that prints or stores several
# of them; "the only difference" and its kin are listed in ALLOWED with what shows that nothing
# else differs; a duration in the prose needs a time that the chapter prints or a data file it
# reads holds, or a citation in the sentence (the paper's "12 hours").
# A quantifier's noun agrees with it ("every seed", "all runs"), which leaves out verbs ("all
# positions run", "every rank seeds"); its modifiers are not plural nouns.
QUANTIFIED = re.compile(
    r"\b(?:(?:every|each)\s+(?:of\s+(?:the|its|their|these)\s+(?=\S+s\b))?|"
    r"(?:all|none)\s+(?:of\s+(?:the|its|their|these)\s+)?)"
    r"(?:(?!of\b|and\b)[\w-]*(?:[^\Ws]|ss)\s+){0,2}?(runs?|seeds?|models?)\b", re.IGNORECASE)
ONLY_DIFFERENCE = re.compile(r"\bonly\s+(?:differences?|changes?)\b|\beverything\s+else\b",
                             re.IGNORECASE)
DURATION = re.compile(
    r"\b(?:a|an|one|a\s+few|few|several|tens\s+of|hundreds\s+of|two|three|four|five|ten|"
    r"\d[\d,.]*)\s+(?:or\s+(?:two|three|so)\s+)?(?:seconds|minutes?|hours?|days?)\b|"
    r"\b(?:in|within|takes?|took|under)\s+(?:seconds|minutes|hours|days)\b", re.IGNORECASE)
PRINTED_TIME = re.compile(
    r"\d[\d,.]*\s*(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b|"
    r'"[\w]*(?:seconds|minutes|_s|_min|time|hours)[\w]*"\s*:\s*[\d.]', re.IGNORECASE)
CITED_HERE = re.compile(r"\{cite\}|\bthe paper\b|§", re.IGNORECASE)


def agrees(match: re.Match) -> bool:
    """Whether a quantifier's noun agrees with it: "every seed", "each of the runs", "all runs"."""
    plural = match.group(1).lower().endswith("s")
    words = match.group(0).lower().split()
    return plural == (words[0] in ("all", "none") or words[1:2] == ["of"])


def phrase(match: re.Match) -> str:
    return " ".join(match.group(0).lower().split())


def shows_several(noun: str, shown: Evidence) -> bool:
    """Whether a chapter stores or prints several runs (seeds, models): a count of two or more
    in its data, or the noun printed twice in its outputs."""
    noun = singular(noun)
    return (any(n >= 2 and what == noun for n, what in shown.counts)
            or len(re.findall(rf"\b{noun}s?\b", shown.text, re.IGNORECASE)) >= 2)


def unsupported_claims(nb, stem: str) -> list[tuple[str, str]]:
    """(phrase, sentence) for each quantifier over runs, seeds or models that nothing the
    chapter (or a chapter the sentence names) shows carries, each "only difference", and each
    duration where the chapter prints no time and the sentence cites nothing."""
    own = evidence(nb, stem)
    times = PRINTED_TIME.search(own.text) is not None
    found = []
    for sentence in sentences(markdown_text(nb)):
        shown = [own, *map(chapter_evidence, named_chapters(sentence))]
        found += [(phrase(match), sentence) for match in QUANTIFIED.finditer(sentence)
                  if agrees(match) and not any(shows_several(match.group(1), ev) for ev in shown)]
        found += [(phrase(match), sentence) for match in ONLY_DIFFERENCE.finditer(sentence)]
        if not times and not CITED_HERE.search(sentence):
            found += [(phrase(match), sentence) for match in DURATION.finditer(sentence)]
    return found


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_every_quantifier_difference_and_duration_rests_on_what_the_chapter_shows(path):
    off = [(claim, sentence[:160]) for claim, sentence in unsupported_claims(
        notebook(path), path.stem) if (path.stem, claim) not in ALLOWED]
    assert off == [], (
        f"{path.stem}: these claims rest on nothing the chapter prints or stores: {off}; print "
        "the runs or the time, narrow the claim, or add the reason it holds to ALLOWED")


def test_quantifiers_differences_and_durations_are_found():
    def cell(printed: str):
        made = nbformat.v4.new_code_cell("print(x)")
        made.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
        return made

    prose = ("It beats every averaged six-epoch seed. The vocabulary is the only difference. "
             "Training takes a minute or two. The paper trained for 12 hours {cite} here.")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(prose), cell("loss 1.2")])
    assert [claim for claim, _ in unsupported_claims(nb, "x")] == [
        "every averaged six-epoch seed", "only difference", "a minute"]
    nb.cells[1].outputs[0].text = "seed 0: 39.1\nseed 1: 39.4\ntrained in 71.5 s"
    assert [claim for claim, _ in unsupported_claims(nb, "x")] == ["only difference"]
    ordinary = ("Each head attends. All layers share one width. As all positions run at once, "
                "every rank seeds its generator. A second product averages the values.")
    nb.cells[0].source = ordinary
    assert unsupported_claims(nb, "x") == []


def test_the_approximate_number_check_wants_the_printed_value_rounded():
    # The reviewer's drifts: a difference of 792,320 is not "about 0.77 million", and with 40.3
    # and 42.0 printed, "about 41" rounds neither.
    parameters = [10_757_166.0, 11_549_486.0]
    [drift] = approximations("untying costs about 0.77 million more parameters")
    [fixed] = approximations("untying costs about 0.79 million more parameters")
    assert drift.compared and not rounds_a_printed_value(drift, parameters)
    assert rounds_a_printed_value(fixed, parameters)
    [f1] = approximations("about 41 dev F1")
    assert not rounds_a_printed_value(f1, [40.3, 42.0, 46.5])
    assert rounds_a_printed_value(f1, [40.9, 42.8])
    # Rounded at the last written digit; a share may round a printed fraction.
    assert [a.written for a in approximations("roughly 800 to 1,450 tokens/s, about 81%")] == [
        "800", "1,450", "81%"]
    assert step("2,400") == 100 and step("25,000") == 1000 and step("0.77") == 0.01
    assert rounds_a_printed_value(approximations("about 81% padding")[0], [0.8117])
    assert rounds_a_printed_value(approximations("about 2,400 tokens/s")[0], [2372.0])
    assert not rounds_a_printed_value(approximations("about 2,500 tokens/s")[0], [2372.0])
    assert rounds_a_printed_value(approximations("about 5 times faster")[0], [310.2, 1552.0])


def test_a_typed_table_row_is_checked_against_the_other_cells():
    def cell(source: str, printed: str):
        made = nbformat.v4.new_code_cell(source)
        made.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
        return made

    row = 'rows = [("parsing F1", "about 41 dev, 43 test")]\nprint(rows)'
    nb = nbformat.v4.new_notebook(cells=[cell("print(f1)", "dev 40.3 test 42.0"),
                                         cell(row, "[('parsing F1', 'about 41 dev, 43 test')]")])
    assert [number for number, _ in approximations_in(nb)] == ["41"]
    nb.cells[0].outputs[0].text = "dev 40.9 test 42.8"
    assert list(approximations_in(nb)) == []


def test_counts_in_words_are_found_and_ordinary_english_is_not():
    drifts = ("Both shipped models, every file checked. Every row is trained twice, with seeds 0 "
              "and 1. The two runs on the Intel Xeon trained faster still. We ran the preset "
              "twice more; three timing runs; 5 seeds; a pair of models.")
    assert [(c.written, c.n, c.noun) for s in sentences(drifts) for c in counts(s)] == [
        ("both shipped models", 2, "model"), ("trained twice", 2, "run"), ("two runs", 2, "run"),
        ("three timing runs", 3, "run"), ("5 seeds", 5, "seed"), ("a pair of models", 2, "model"),
        ("twice more", 2, "run")]
    ordinary = ("Both languages share one vocabulary, and both models agree. Two heads attend; "
                "the two sublayers differ. It is twice as fast on two cores. Exchange two rows "
                "of W. The 1,000 runs of 11 tokens runs.")
    assert [c for s in sentences(ordinary) for c in counts(s)] == []


def test_a_count_passes_only_where_the_book_prints_or_stores_it():
    assert prints_count(Count("five seeds", 5, "seed"), "5 seeds under 2 kernel sets")
    assert prints_count(Count("two kernel sets", 2, "kernel"), "5 seeds under 2 kernel sets")
    assert prints_count(Count("three runs", 3, "run"), "runs: 3")
    assert prints_count(Count("two epochs", 2, "epoch"), "average of epochs 10 and 11")
    assert prints_count(Count("five epochs", 5, "epoch"), "average of epochs 8-12")
    assert not prints_count(Count("two seeds", 2, "seed"), "seeds 0 1 2 3 4; seed 2: 0.51")
    sweep = {"runs": [{"seed": seed, "kernels": kernels, "row": row, "config": {"epochs": 6}}
                      for seed in range(5) for kernels in ("AVX2", "AVX512") for row in "AB"]}
    stored = stored_counts([sweep])
    assert {(5, "seed"), (2, "kernel"), (20, "run"), (10, "run"), (2, "row")} <= stored
    assert (2, "seed") not in stored and (4, "run") not in stored
    assert (len(list(ROOT.glob("book/models/*/info.json"))), "model") in stored


def test_narrated_evidence_that_the_book_does_not_store_is_found():
    narrated = ("Words scored 16 F1 in trials outside this page. Threads wait, in a quick "
                "measurement not stored with the book. Other machines print others, as do two "
                "earlier runs of this cell. The run was stopped after its first epoch.")
    assert len(unstored_evidence(narrated)) == 4
    stored = ("The seeds are stored in book/data. In our run (the shares above) the heads "
              "differ. The run's checkpoints were not kept, so its rows are not scored.")
    assert unstored_evidence(stored) == []


# The reading path's length. The book is read from the intro through chapter 27; appendices
# and the bibliography are reference, not reading. Words are the whitespace-split words of the
# markdown cells; code lines are the non-blank lines of code cells other than the setup cell.
READING_PATH_WORDS = 45_000
PARTS_I_II_WORDS = 10_000  # the intro and chapters 01 to 13, the core a course assigns
PART_II_WORDS = 4_650  # chapters 07 to 13
CHAPTER_BUDGETS = {"21": (3_200, 500), "22": (1_800, 500)}  # (words, code lines)
README_WORDS = 2_000


def reading_path() -> list[Path]:
    return [ROOT / f"{name}.ipynb" for name in toc_files()
            if re.fullmatch(r"book/(?:intro|\d\d_\w+)", name)]


def prose_words(nb) -> int:
    return sum(len(cell.source.split()) for cell in nb.cells if cell.cell_type == "markdown")


def code_lines(nb) -> int:
    return sum(1 for cell in nb.cells if cell.cell_type == "code"
               and "setup" not in cell.get("metadata", {}).get("tags", [])
               for line in cell.source.splitlines() if line.strip())


def test_the_reading_path_keeps_its_word_budget():
    path = reading_path()
    assert [p.stem for p in path][:2] == ["intro", "01_background"] and len(path) == 28
    words = {p.stem: prose_words(notebook(p)) for p in path}
    part_ii = sum(n for stem, n in words.items() if "07" <= stem[:2] <= "13")
    core = sum(n for stem, n in words.items() if stem == "intro" or stem[:2] <= "13")
    assert sum(words.values()) <= READING_PATH_WORDS, f"reading path: {sum(words.values())} words"
    assert core <= PARTS_I_II_WORDS, f"intro and chapters 01-13: {core} words"
    assert part_ii <= PART_II_WORDS, f"Part II (chapters 07-13): {part_ii} words"


@pytest.mark.parametrize("number", sorted(CHAPTER_BUDGETS))
def test_the_longest_chapters_keep_their_budgets(number):
    [path] = [p for p in reading_path() if p.stem.startswith(number + "_")]
    nb = notebook(path)
    words, lines = CHAPTER_BUDGETS[number]
    assert prose_words(nb) <= words and code_lines(nb) <= lines, (
        f"{path.stem}: {prose_words(nb)} words (at most {words}), "
        f"{code_lines(nb)} code lines (at most {lines})")


def test_the_readme_keeps_its_word_budget():
    words = len((ROOT / "README.md").read_text().split())
    assert words <= README_WORDS, f"README.md: {words} words (at most {README_WORDS})"


def test_the_allow_list_names_only_numbers_that_the_prose_states():
    stated = set()
    for path in chapters():
        nb = notebook(path)
        stated |= {(path.stem, number) for number in stated_numbers(markdown_text(nb))}
        stated |= {(path.stem, written) for written, _ in approximations_off(path)}
        stated |= {(path.stem, count.written)
                   for sentence in sentences(markdown_text(nb)) for count in counts(sentence)}
    stale = sorted(set(ALLOWED) - stated)
    assert stale == [], f"ALLOWED names numbers that the prose no longer states: {stale}"


HISTORY = re.compile(
    r"first version of this book|this book's first version|earlier version of this|"
    r"\bthe issue\b|an issue asked|\bissue #?\d+|\bnot met\b|goals? (?:was|were|is|are) met|"
    r"\bonce (?:said|reported|claimed)\b",
    re.IGNORECASE)


@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.stem)
def test_no_chapter_tells_the_books_development_history(path):
    nb = notebook(path)
    text = "\n".join(cell.source for cell in nb.cells)
    assert HISTORY.findall(text) == [], ("the book describes itself as it is; history goes to "
                                         "CHANGELOG.md")


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
    nb = notebook(path)
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
             for cell in chart_cells(notebook(path))}
    assert sorted(set(TYPED_NUMBERS) - found) == []
