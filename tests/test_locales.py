"""The translations (locales/, tools/locales.py) stay in step with the English chapters.

Every catalog that exists must be a complete translation of its page as the page is now: no
message untranslated or fuzzy, none gone from the English, the English unchanged since the
catalog was merged (`make locales`), each message's roles, code, math, link targets and
numbers exactly the English's, and the glossary's terms used. The unit tests below show each
check failing on a small broken catalog; the last tests run the checks on the real catalogs.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import locales  # noqa: E402
from locales import (  # noqa: E402
    LANGUAGES,
    Term,
    catalog_path,
    glossary_path,
    glossary_problems,
    kept_mismatches,
    read_glossary,
    terms_in,
    translated_pages,
)

GLOSSARY = [Term("attention", "注意力"), Term("multi-head attention", "多头注意力"),
            Term("self-attention", "自注意力"), Term("head", "头"), Term("mask", "掩码"),
            Term("vocabulary", "词表"), Term("key", "键"), Term("Transformer", "Transformer")]


# -- numbers, code, math, roles ----------------------------------------------------------------

def test_a_faithful_translation_keeps_roles_code_math_and_numbers():
    msgid = ("Scores are divided by $\\sqrt{d_k}$ with `d_k = 64` {cite}`vaswani2017attention`; "
             "see {doc}`chapter 2 <02_encoder_decoder>` and [the code](https://x.org/a.py).")
    msgstr = ("分数除以 $\\sqrt{d_k}$，其中 `d_k = 64` {cite}`vaswani2017attention`；"
              "见{doc}`第 2 章 <02_encoder_decoder>`和[代码](https://x.org/a.py)。")
    assert kept_mismatches(msgid, msgstr) == []


@pytest.mark.parametrize("msgstr, kind", [
    ("分数除以 $\\sqrt{d}$，`d_k = 64`，共 2 章 {cite}`vaswani2017attention`", "math"),
    ("分数除以 $\\sqrt{d_k}$，`d_k=64`，共 2 章 {cite}`vaswani2017attention`", "code"),
    ("分数除以 $\\sqrt{d_k}$，`d_k = 64`，共两章 {cite}`vaswani2017attention`", "number"),
    ("分数除以 $\\sqrt{d_k}$，`d_k = 64`，共 2 章", "role"),
    ("分数除以 $\\sqrt{d_k}$，`d_k = 64`，共 2 章 {cite}`vaswani2017`", "role"),
])
def test_a_changed_or_lost_math_code_number_or_citation_is_reported(msgstr, kind):
    msgid = ("Scores are divided by $\\sqrt{d_k}$, `d_k = 64`, 2 chapters "
             "{cite}`vaswani2017attention`")
    problems = kept_mismatches(msgid, msgstr)
    assert [p.split(" ")[0] for p in problems] == [kind]


def test_a_cross_reference_may_translate_its_title_but_not_its_target():
    msgid = "See {doc}`chapter 2 <02_encoder_decoder>`."
    assert kept_mismatches(msgid, "见{doc}`第二章 <02_encoder_decoder>`。") == []
    assert kept_mismatches(msgid, "见{doc}`第二章 <03_attention>`。") != []


# -- the glossary ------------------------------------------------------------------------------

def test_the_longest_glossary_term_wins_and_plurals_count():
    found = terms_in("Multi-head attention splits keys among heads; self-attention, "
                     "vocabularies and `mask` (code) follow.", GLOSSARY)
    assert {t.english for t in found} == {"multi-head attention", "key", "head",
                                          "self-attention", "vocabulary"}


def test_a_term_rendered_otherwise_is_reported():
    problems = glossary_problems([("Attention is all.", "注意（attention）就是一切。")], GLOSSARY)
    assert problems and "'attention' is not rendered as '注意力'" in problems[0]


def test_the_first_use_gives_the_english_and_later_uses_need_not():
    good = [("Multi-head attention", "多头注意力"),  # a heading: no parentheses needed
            ("Each head uses a mask.", "每个头（head）使用一个掩码（mask）。"),
            ("A mask again.", "又一个掩码。")]
    assert glossary_problems(good, GLOSSARY, headings={"Multi-head attention"}) == []
    bad = [("Each head uses a mask.", "每个头（head）使用一个掩码。")]
    problems = glossary_problems(bad, GLOSSARY)
    assert len(problems) == 1 and "掩码（mask）" in problems[0]


def test_a_term_kept_in_english_needs_no_parentheses():
    assert glossary_problems([("The Transformer.", "Transformer 模型。")], GLOSSARY) == []


def test_the_glossary_file_reads_and_names_a_bad_row(tmp_path):
    terms = read_glossary(glossary_path("zh_CN"))
    assert len(terms) >= 40
    assert {"attention", "positional encoding", "label smoothing", "Transformer"} <= {
        t.english for t in terms}
    assert len({t.english.lower() for t in terms}) == len(terms)
    bad = tmp_path / "glossary.tsv"
    bad.write_text("english\tchinese\tnote\nattention\t\tno translation\n", encoding="utf-8")
    with pytest.raises(ValueError, match="glossary.tsv:2"):
        read_glossary(bad)


# -- a whole catalog, in step or not -----------------------------------------------------------

PAGE = "book/scratch"
ENGLISH = "# Attention\n\nAttention uses a mask; $d_k = 64$.\n\n## Heads\n\nEach head attends."


def scratch_catalog(tmp_path, monkeypatch, messages, english=ENGLISH, digest_of=ENGLISH):
    """A catalog of a made-up page in tmp_path, merged (as `make locales` writes it) from
    `digest_of` while the page's English is `english`."""
    from babel.messages.catalog import Catalog

    monkeypatch.setattr(locales, "english_source", lambda docname: digest_of)
    catalog = Catalog(locale="zh_CN")
    for msgid, msgstr, *flags in messages:
        catalog.add(msgid, msgstr, flags=flags)
    path = tmp_path / "scratch.po"
    locales.write_catalog(catalog, path, "zh_CN", PAGE)
    monkeypatch.setattr(locales, "english_source", lambda docname: english)
    return path


GOOD = [("Attention", "注意力"),
        ("Attention uses a mask; $d_k = 64$.", "注意力（attention）使用掩码（mask）；$d_k = 64$。"),
        ("Heads", "头"),
        ("Each head attends.", "每个头（head）各自关注。")]


def test_a_complete_catalog_in_step_with_its_english_passes(tmp_path, monkeypatch):
    path = scratch_catalog(tmp_path, monkeypatch, GOOD)
    assert locales.catalog_problems(path, PAGE, GLOSSARY) == []
    assert locales.status(path) == (4, 0, 0)


def test_an_untranslated_message_fails(tmp_path, monkeypatch):
    path = scratch_catalog(tmp_path, monkeypatch, GOOD[:3] + [("Each head attends.", "")])
    problems = locales.catalog_problems(path, PAGE, GLOSSARY)
    assert problems == ["'Each head attends.' is not translated"]


def test_a_fuzzy_message_fails(tmp_path, monkeypatch):
    path = scratch_catalog(tmp_path, monkeypatch, GOOD[:3] + [GOOD[3] + ("fuzzy",)])
    problems = locales.catalog_problems(path, PAGE, GLOSSARY)
    assert len(problems) == 1 and "is fuzzy" in problems[0]


def test_an_english_edit_fails_until_the_catalog_is_merged(tmp_path, monkeypatch):
    edited = ENGLISH.replace("Each head attends.", "Each head attends alone.")
    path = scratch_catalog(tmp_path, monkeypatch, GOOD, english=edited)
    problems = locales.catalog_problems(path, PAGE, GLOSSARY)
    assert any("changed since the catalog was merged" in p for p in problems)
    assert any("'Each head attends.' is no longer in the English" in p for p in problems)


def test_a_broken_message_in_a_catalog_fails(tmp_path, monkeypatch):
    broken = GOOD[:1] + [("Attention uses a mask; $d_k = 64$.",
                          "注意力（attention）使用掩码（mask）；$d_k=64$。")] + GOOD[2:]
    path = scratch_catalog(tmp_path, monkeypatch, broken)
    problems = locales.catalog_problems(path, PAGE, GLOSSARY)
    assert len(problems) == 1 and "math differs" in problems[0]


def test_merging_keeps_translations_and_marks_a_changed_english_fuzzy():
    from babel.messages.catalog import Catalog

    old = Catalog(locale="zh_CN")
    old.add("Each head attends.", "每个头各自关注。")
    old.add("A mask hides the future.", "掩码遮住未来。")
    template = Catalog()
    template.add("Each head attends.")
    template.add("A mask hides the future positions.")
    template.add("\n\\mathrm{softmax}(x)\n")
    new = {m.id: m for m in locales.merged(template, old, "zh_CN") if m.id}
    assert new["Each head attends."].string == "每个头各自关注。"
    assert not new["Each head attends."].fuzzy
    assert new["A mask hides the future positions."].fuzzy  # the old translation, to check
    assert new["\n\\mathrm{softmax}(x)\n"].string == "\n\\mathrm{softmax}(x)\n"



def test_a_long_previous_english_survives_a_save_without_turning_into_comments(tmp_path):
    """babel writes a long `#| msgid` over several lines and reads them back as comments; a
    catalog read and saved again must not collect them."""
    from babel.messages.catalog import Catalog
    from babel.messages.pofile import write_po

    catalog = Catalog(locale="zh_CN")
    catalog.add("The masks, by hand, of the whole target row.", "整行目标的掩码。",
                flags=["fuzzy"], previous_id="The masks by hand. " + "word " * 40)
    path = tmp_path / "page.po"
    with open(path, "wb") as f:
        write_po(f, catalog, width=0, include_previous=True, omit_header=True)
    assert path.read_text().count("#|") >= 2  # wrapped over several lines
    [message] = [m for m in locales.read_catalog(path) if m.id]
    assert message.fuzzy and message.user_comments == []

def test_a_page_that_is_not_translated_is_named_in_one_line():
    with pytest.raises(ValueError, match="'14_multi30k_training' is not a translated page"):
        locales.page_by_stem("14_multi30k_training")


# -- the real catalogs -------------------------------------------------------------------------

def test_translated_pages_are_the_introduction_and_parts_one_and_two():
    pages = translated_pages()
    assert pages[0] == "book/intro" and pages[-1] == "book/13_sort_task" and len(pages) == 14


CATALOGS = [(language, page) for language in LANGUAGES for page in translated_pages()
            if catalog_path(language, page).exists()]


@pytest.mark.parametrize("language, page", CATALOGS)
def test_each_catalog_is_a_complete_translation_of_its_english_as_it_is_now(language, page):
    glossary = read_glossary(glossary_path(language))
    assert locales.catalog_problems(catalog_path(language, page), page, glossary) == []


# -- the editions' links and the translated Colab editions -------------------------------------

def test_each_edition_links_to_the_same_page_in_the_other():
    from book_languages import edition_url

    assert edition_url("book/03_attention", "en", "zh_CN") == "../zh_CN/book/03_attention.html"
    assert edition_url("book/03_attention", "zh_CN", "en") == "../../book/03_attention.html"


def test_a_translated_markdown_cell_replaces_each_block_however_the_english_wraps():
    source = ("# Attention\n\nAttention maps a query and\nkey-value pairs to an output.\n\n"
              "* An item about attention\n\n| Layer | Cost |\n|:--|:--|\n| Attention | $O(1)$ |\n\n"
              "```{dropdown} Answer to 3\nAttention\n```")
    messages = {"Attention": "注意力", "Layer": "层", "Cost": "代价", "Answer to 3": "第 3 题答案",
                "Attention maps a query and key-value pairs to an output.":
                    "注意力把查询映射为输出。",
                "An item about attention": "关于注意力的一项", "$O(1)$": "$O(1)$"}
    assert locales.translate_markdown(source, messages) == (
        "# 注意力\n\n注意力把查询映射为输出。\n\n* 关于注意力的一项\n\n| 层 | 代价 |\n|:--|:--|\n"
        "| 注意力 | $O(1)$ |\n\n```{dropdown} 第 3 题答案\n注意力\n```")


def test_math_and_code_only_messages_need_no_translation():
    assert locales.nothing_to_translate("$O(n^2 \\cdot d)$")
    assert locales.nothing_to_translate(" \\mathrm{FFN}(x) = \\max(0, x W_1 + b_1) W_2 + b_2 ")
    assert not locales.nothing_to_translate("$O(1)$ per layer")


def test_a_complete_translation_gets_a_colab_edition_in_its_language(tmp_path, monkeypatch):
    import nbformat
    from colab_notebooks import colab_path, translated_colab_files
    from sync import chapters, refreshed, repository, toc_files

    url, ref = repository()
    notebooks = {path: refreshed(nbformat.read(path, as_version=4), url, ref)
                 for path in chapters() if path.exists()}
    monkeypatch.setattr(locales, "LOCALES", tmp_path)
    assert translated_colab_files(notebooks, url, ref, toc_files()) == {}  # no catalog: none
    heading = sorted(locales.headings("book/intro"))[0]
    from babel.messages.catalog import Catalog

    catalog = Catalog(locale="zh_CN")
    catalog.add(heading, "【标题】")
    locales.write_catalog(catalog, catalog_path("zh_CN", "book/intro"), "zh_CN", "book/intro")
    files = translated_colab_files(notebooks, url, ref, toc_files())
    intro = ROOT / "book" / "intro.ipynb"
    assert list(files) == [colab_path(intro, "zh_CN")] == [ROOT / "colab/zh_CN/intro.ipynb"]
    edition = nbformat.reads(files[colab_path(intro, "zh_CN")], as_version=4)
    text = "\n".join(cell.source for cell in edition.cells if cell.cell_type == "markdown")
    assert "【标题】" in text and f"# {heading}\n" not in text
    assert "/zh_CN/book/intro.html" in edition.cells[0].source  # links lead to the Chinese book
