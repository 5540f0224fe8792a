"""The book's translations: gettext catalogs kept in step with the English chapters.

The English chapters are the one source. Sphinx's gettext builder extracts every translatable
message of a page (a paragraph, heading, list item, admonition paragraph, figure caption or
display equation, as its MyST source text) into a template;
this tool merges it into the page's catalog for each language,
`locales/<language>/LC_MESSAGES/<docname>.po` (Sphinx's `locale_dirs` layout, one catalog per
page with `gettext_compact: false`). Merging keeps every translation whose English is
unchanged, marks a translation whose English changed as fuzzy (with the old English as
`#| msgid`), and adds the new messages untranslated. Each catalog records a digest of the
English it was merged from, so a test sees at once when the English changed since.

    python tools/locales.py                      # `make locales`: update every catalog
    python tools/locales.py --start 03_attention # create or update this page's catalog only
    python tools/locales.py --start all          # create or update every page's catalog
    python tools/locales.py --status             # counts only, no extraction
    python tools/locales.py --check              # every problem of every catalog, no extraction

Only the pages in TRANSLATED_PARTS (the introduction and Parts I-II) get catalogs; the other
pages appear in English in every edition, with a note (tools/book_languages.py).
"""

import argparse
import hashlib
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import nbformat
import yaml
from babel.messages.catalog import Catalog
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parents[1]
LOCALES = ROOT / "locales"
# The editions besides English, as Sphinx names their languages.
LANGUAGES = ["zh_CN"]
LANGUAGE_NAMES = {"zh_CN": "Chinese (Simplified)"}
# The parts of _toc.yml whose chapters are translated, besides the root page (the introduction).
TRANSLATED_PARTS = 2
DIGEST_LINE = re.compile(r"^# English source sha256: (?P<digest>[0-9a-f]{64})$", re.MULTILINE)


def toc() -> dict:
    return yaml.safe_load((ROOT / "_toc.yml").read_text())


def translated_pages() -> list[str]:
    """The docnames that have catalogs: the root page and the first TRANSLATED_PARTS parts."""
    book = toc()
    return [book["root"]] + [entry["file"] for part in book["parts"][:TRANSLATED_PARTS]
                             for entry in part["chapters"]]


def page_by_stem(stem: str) -> str:
    """`03_attention` (or `book/03_attention`) as the docname of a translated page."""
    for page in translated_pages():
        if stem in (page, Path(page).name):
            return page
    raise ValueError(f"{stem!r} is not a translated page; those are: "
                     + ", ".join(Path(p).name for p in translated_pages()))


def english_source(docname: str) -> str:
    """The text that a page's messages come from: its Markdown cells (and, for the root page,
    the part captions of _toc.yml, which Sphinx extracts into the root's catalog)."""
    path = ROOT / f"{docname}.ipynb"
    if path.exists():
        nb = nbformat.read(path, as_version=4)
        text = "\n\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    else:
        text = (ROOT / f"{docname}.md").read_text()
    book = toc()
    if docname == book["root"]:
        text += "\n\n" + "\n".join(part.get("caption", "") for part in book["parts"])
    return text


def source_digest(docname: str) -> str:
    return hashlib.sha256(english_source(docname).encode()).hexdigest()


def catalog_path(language: str, docname: str) -> Path:
    return LOCALES / language / "LC_MESSAGES" / f"{docname}.po"


def recorded_digest(path: Path) -> str | None:
    """The digest of the English that the catalog was last merged from."""
    found = DIGEST_LINE.search(path.read_text(encoding="utf-8"))
    return found.group("digest") if found else None


def is_display_math(msgid: str) -> bool:
    """A display equation's message: its LaTeX as written between the `$$`, spaces and line
    breaks included (MyST strips every other message). Nothing in it is translated, so its
    translation is the English as it is."""
    return msgid != msgid.strip()


def nothing_to_translate(msgid: str) -> bool:
    """A display equation, or a message of math, code and numbers only (a table cell such as
    `$O(n)$`): its translation is the English as it is, and `make locales` fills it in."""
    return is_display_math(msgid) or not re.search(r"[^\W\d_]", kept_parts(msgid)[1])


def extract() -> dict[str, Catalog]:
    """Run Sphinx's gettext builder on the whole book (cross-references need every page) and
    read the templates of the translated pages. It works in a folder of its own, so that
    translators may run it side by side."""
    from jupyter_book.sphinx import build_sphinx

    with tempfile.TemporaryDirectory() as work:
        out, doctrees = Path(work) / "gettext", Path(work) / "doctrees"
        result = build_sphinx(
            ROOT, str(out), noconfig=True, path_config=str(ROOT / "_config.yml"),
            confoverrides={"external_toc_path": str(ROOT / "_toc.yml"),
                           "latex_individualpages": False},
            builder="gettext", doctreedir=str(doctrees), freshenv=True, force_all=True,
            warningiserror=True, keep_going=True, quiet=True,
        )
        if result != 0:
            sys.exit("the gettext builder failed (see the warnings above)")
        templates = {}
        for page in translated_pages():
            with open(out / f"{page}.pot", "rb") as f:
                templates[page] = read_po(f)
    return templates


def header_comment(language: str, docname: str, digest: str) -> str:
    return (f"# {LANGUAGE_NAMES[language]} translation of {docname}, from the English page.\n"
            "# Written by `make locales` (tools/locales.py); translate the msgstr lines only.\n"
            "# See CONTRIBUTING.md, \"Translations\".\n"
            f"# English source sha256: {digest}")


def merged(template: Catalog, existing: Catalog | None, language: str) -> Catalog:
    """The catalog for `template`'s messages: translations kept where the English is the same,
    marked fuzzy where it changed (babel's fuzzy matching), display math filled in."""
    if existing is None:
        existing = Catalog(locale=language, fuzzy=False)
        existing.update(template)
    else:
        existing.update(template, update_header_comment=False)
    existing.obsolete.clear()
    for message in existing:
        message.flags &= {"fuzzy"}  # not babel's guesses such as python-brace-format
        if message.id and not message.string and nothing_to_translate(message.id):
            message.string = message.id
    existing.fuzzy = False
    return existing


def write_catalog(catalog: Catalog, path: Path, language: str, docname: str) -> None:
    catalog.header_comment = header_comment(language, docname, source_digest(docname))
    catalog.project = "The Annotated Transformer, as a book"
    catalog.version = docname
    catalog.msgid_bugs_address = ""
    catalog.language_team = f"{LANGUAGE_NAMES[language]} <{language}>"
    catalog.last_translator = ""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        write_po(f, catalog, width=0, omit_header=False, ignore_obsolete=True,
                 include_previous=True, sort_output=False)
    # babel writes a creation and a revision date on every run: drop them, so that a catalog
    # changes only when its messages do.
    text = path.read_text(encoding="utf-8")
    text = re.sub(r'^"(POT-Creation-Date|PO-Revision-Date): .*\\n"\n', "", text, flags=re.M)
    path.write_text(text, encoding="utf-8")


def read_catalog(path: Path) -> Catalog:
    """A catalog as written. babel wraps a long previous English (`#| msgid`) over several
    lines and reads the wrapped lines back as translator comments, which would be written out
    again, rewrapped, on every save: drop them (the fuzzy flag stays)."""
    with open(path, "rb") as f:
        catalog = read_po(f)
    for message in catalog:
        message.user_comments = [line for line in message.user_comments
                                 if not line.startswith("|")]
    return catalog


def status(path: Path) -> tuple[int, int, int]:
    """(translated, fuzzy, untranslated) messages of a catalog."""
    messages = [m for m in read_catalog(path) if m.id]
    fuzzy = sum(1 for m in messages if m.fuzzy)
    untranslated = sum(1 for m in messages if not m.string)
    return len(messages) - fuzzy - untranslated, fuzzy, untranslated


# -- checks: what tests/test_locales.py and `--check` require of every catalog ----------------

# What a translation keeps exactly as the English has it, found in this order (a role holds
# backticks, code may hold dollars): roles, inline code, display and inline math, link targets.
ROLE = re.compile(r"\{(?P<name>[a-z][\w:-]*)\}`(?P<content>[^`]*)`")
CODE = re.compile(r"``.+?``|`[^`\n]+`")
DISPLAY_MATH = re.compile(r"\$\$.+?\$\$", re.DOTALL)
INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)(?:\\.|[^$\\])+?\$")
LINK_TARGET = re.compile(r"\]\((?P<target>[^)\s]+)\)")
NUMBER = re.compile(r"\d+(?:[.,]\d+)*")
HEADING = re.compile(r"^#{1,6}[ \t]+(?P<title>.+?)[ \t]*#*$", re.MULTILINE)


def role_target(name: str, content: str) -> tuple[str, str]:
    """A role as what it points to: `{doc}`1 <01_background>`` -> (doc, 01_background); its
    title text may be translated, its target and its name may not."""
    found = re.fullmatch(r"(?s).*?<(?P<target>[^<>]+)>\s*", content)
    return name, (found.group("target") if found else content).strip()


def kept_parts(text: str) -> tuple[dict[str, Counter], str]:
    """The parts of a message that its translation keeps exactly (roles by name and target,
    inline code, math, link targets, numbers in the running text), and the running text
    without them (what the glossary is matched against)."""
    parts = {kind: Counter() for kind in ("role", "code", "math", "link", "number")}

    def take(kind, pattern, value=lambda m: m.group(0)):
        nonlocal text
        parts[kind].update(value(m) for m in pattern.finditer(text))
        text = pattern.sub(" ", text)

    take("role", ROLE, lambda m: role_target(m.group("name"), m.group("content")))
    take("code", CODE)
    take("math", DISPLAY_MATH)
    take("math", INLINE_MATH)
    take("link", LINK_TARGET, lambda m: m.group("target"))
    take("number", NUMBER)
    return parts, text


def kept_mismatches(msgid: str, msgstr: str) -> list[str]:
    """How a translation's roles, code, math, link targets and numbers differ from the
    English's (each compared as a multiset: order may change, nothing may be added or lost)."""
    english, _ = kept_parts(msgid)
    translation, _ = kept_parts(msgstr)
    problems = []
    for kind in english:
        lost, added = english[kind] - translation[kind], translation[kind] - english[kind]
        if lost or added:
            problems.append(f"{kind} differs: missing {sorted(map(str, lost.elements()))}, "
                            f"added {sorted(map(str, added.elements()))}")
    return problems


@dataclass(frozen=True)
class Term:
    """A glossary row: the English term, its translation, a note for translators."""

    english: str
    translation: str
    note: str = ""

    @property
    def pattern(self) -> re.Pattern:
        """The English term as a word in running text, `-` or a space between its words
        interchangeable, in the singular or plural, in any case; not inside a longer
        hyphenated word (`self-attention` is not `attention`)."""
        words = [re.escape(w) for w in re.split(r"[-\s]+", self.english)]
        last = words[-1]
        words[-1] = (f"(?:{last[:-1]}ies|{last}s?)" if last.endswith("y")
                     else f"{last}(?:e?s)?")
        return re.compile(r"(?<![\w-])" + r"[-\s]?".join(words) + r"(?![\w-])", re.IGNORECASE)

    @property
    def kept(self) -> bool:
        return self.translation == self.english


def glossary_path(language: str) -> Path:
    return LOCALES / language / "glossary.tsv"


def read_glossary(path: Path) -> list[Term]:
    """The glossary, a tab-separated file: english, chinese, note (with a header line)."""
    rows = [line.split("\t") for line in path.read_text(encoding="utf-8").splitlines()]
    terms = []
    for number, row in enumerate(rows[1:], start=2):
        if len(row) < 2 or not row[0].strip() or not row[1].strip():
            raise ValueError(f"{path.name}:{number}: a row needs an English and a translated term")
        terms.append(Term(row[0].strip(), row[1].strip(), row[2].strip() if len(row) > 2 else ""))
    return terms


def terms_in(text: str, glossary: list[Term]) -> list[Term]:
    """The glossary's terms in the running text of an English message, each found where no
    longer term covers it (`multi-head attention` is not also `attention` or `head`)."""
    _, running = kept_parts(text)
    found, covered = [], set()
    for term in sorted(glossary, key=lambda t: -len(t.english)):
        spans = [m.span() for m in term.pattern.finditer(running)
                 if not covered & set(range(*m.span()))]
        if spans:
            found.append(term)
            covered.update(i for start, end in spans for i in range(start, end))
    return found


def introduces(msgstr: str, term: Term) -> bool:
    """The translation gives the term with the English in parentheses: 注意力（attention）."""
    english = term.pattern.pattern.replace("(?<![\\w-])", "").replace("(?![\\w-])", "")
    return re.search(re.escape(term.translation) + r"\s*[（(][^（()）]*?" + english
                     + r"[^（()）]*[）)]", msgstr, re.IGNORECASE) is not None


def glossary_problems(messages: list[tuple[str, str]], glossary: list[Term],
                      headings: set[str] = frozenset()) -> list[str]:
    """Each glossary term in an English message is its translation in the message's
    translation; the first message in running text (not a heading) to use a term gives the
    English in parentheses."""
    problems, introduced = [], set()
    for msgid, msgstr in messages:
        if is_display_math(msgid):  # LaTeX names such as \mathrm{head} are not prose
            continue
        for term in terms_in(msgid, glossary):
            short = msgid if len(msgid) < 60 else msgid[:57] + "..."
            if term.translation not in msgstr:
                problems.append(f"{short!r}: {term.english!r} is not rendered as "
                                f"{term.translation!r}")
            elif not term.kept and msgid not in headings and term not in introduced:
                introduced.add(term)
                if not introduces(msgstr, term):
                    problems.append(f"{short!r}: the first use of {term.english!r} gives no "
                                    f"English: write {term.translation}（{term.english}）")
    return problems


def headings(docname: str) -> set[str]:
    """The page's headings, as their messages read."""
    return {m.group("title") for m in HEADING.finditer(english_source(docname))}


def catalog_problems(path: Path, docname: str, glossary: list[Term] | None = None) -> list[str]:
    """Everything that keeps a catalog from being an up-to-date, complete translation."""
    catalog = read_catalog(path)
    messages = [m for m in catalog if m.id]
    problems = []
    if recorded_digest(path) != source_digest(docname):
        problems.append(f"the English of {docname} changed since the catalog was merged: "
                        "run `make locales`, then translate what it marks fuzzy or leaves empty")
    source = " ".join(english_source(docname).split())
    for message in messages:
        short = message.id if len(message.id) < 60 else message.id[:57] + "..."
        if " ".join(message.id.split()) not in source:
            problems.append(f"{short!r} is no longer in the English: run `make locales`")
        if message.fuzzy:
            problems.append(f"{short!r} is fuzzy (its English changed): check the "
                            "translation, then delete the `#, fuzzy` line")
        elif not message.string:
            problems.append(f"{short!r} is not translated")
        else:
            problems += [f"{short!r}: {p}" for p in kept_mismatches(message.id, message.string)]
    if glossary:
        translated = [(m.id, m.string) for m in messages if m.string and not m.fuzzy]
        problems += glossary_problems(translated, glossary, headings(docname))
    return problems


def check(languages: list[str]) -> list[str]:
    """The problems of every catalog that exists, each naming its file."""
    problems = []
    for language in languages:
        glossary = read_glossary(glossary_path(language))
        for page in translated_pages():
            path = catalog_path(language, page)
            if path.exists():
                name = path.relative_to(ROOT)
                problems += [f"{name}: {p}" for p in catalog_problems(path, page, glossary)]
    return problems


# -- translated notebooks (the Colab editions) -------------------------------------------------

def is_complete(language: str, docname: str) -> bool:
    """The page has a catalog, merged from its English as it is now, with every message
    translated and none fuzzy: the state the tests require of every catalog that exists."""
    path = catalog_path(language, docname)
    if docname not in translated_pages() or not path.exists():
        return False
    _, fuzzy, untranslated = status(path)
    return fuzzy == untranslated == 0 and recorded_digest(path) == source_digest(docname)


def translations(language: str, docname: str) -> dict[str, str]:
    """msgid -> msgstr of a page's catalog (translated, not fuzzy messages only)."""
    return {m.id: m.string for m in read_catalog(catalog_path(language, docname))
            if m.id and m.string and not m.fuzzy}


# A message starts a line (after a heading's hashes, a list marker, a quote or a directive's
# name, whose argument is its title) and ends one.
LINE_START = (r"(?m)^(?P<lead>[ \t]*(?:>[ \t]*)?"
              r"(?:#{1,6}[ \t]+|[-*+][ \t]+|\d+[.)][ \t]+|(?:`{3,}|:{3,})\{[\w:-]+\}[ \t]+)?)")


def translate_markdown(source: str, messages: dict[str, str]) -> str:
    """A Markdown cell with each message replaced by its translation, where the message's
    words stand as a block of their own (a paragraph, a heading, an item, a caption, a table
    cell), however the English wraps its lines. Longer messages go first, so a heading's words
    are never replaced inside a paragraph."""
    for msgid in sorted(messages, key=len, reverse=True):
        if is_display_math(msgid) or messages[msgid] == msgid:
            continue
        words = r"\s+".join(re.escape(word) for word in msgid.split())
        pattern = re.compile(LINE_START + words + r"[ \t]*$")
        msgstr = messages[msgid]
        source = pattern.sub(lambda found, s=msgstr: found.group("lead") + s, source)
        cell = re.compile(r"(?m)(?<=\|)(?P<lead>[ \t]*)" + words + r"(?=[ \t]*\|)")
        source = cell.sub(lambda found, s=msgstr: found.group("lead") + s, source)
    return source


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--start", nargs="+", default=[], metavar="PAGE",
                        help="create or update the catalogs of these pages only (stems, or "
                        "`all`); without it, every catalog that exists is updated")
    parser.add_argument("--language", choices=LANGUAGES, action="append",
                        help="only this language (default: every one)")
    parser.add_argument("--status", action="store_true",
                        help="print each catalog's counts; extract nothing")
    parser.add_argument("--check", action="store_true",
                        help="extract nothing; fail if a catalog is behind its English, "
                        "incomplete, or differs from it in code, math, numbers or terms")
    args = parser.parse_args(argv)
    languages = args.language or LANGUAGES
    try:
        start = (translated_pages() if args.start == ["all"]
                 else [page_by_stem(stem) for stem in args.start])
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    if args.check:
        problems = check(languages)
        print("\n".join(problems) if problems else "every catalog is complete and in step")
        sys.exit(1 if problems else 0)
    if not args.status:
        templates = extract()
        for language in languages:
            for page, template in templates.items():
                path = catalog_path(language, page)
                if page in start or (not start and path.exists()):
                    existing = read_catalog(path) if path.exists() else None
                    write_catalog(merged(template, existing, language), path, language, page)
    for language in languages:
        for page in translated_pages():
            path = catalog_path(language, page)
            if path.exists():
                done, fuzzy, todo = status(path)
                print(f"{path.relative_to(ROOT)}: {done} translated, {fuzzy} fuzzy, "
                      f"{todo} untranslated")


if __name__ == "__main__":
    main()
