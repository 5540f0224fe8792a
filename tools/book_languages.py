"""Sphinx extension: every page links to the same page in the book's other editions.

tools/build_book.py builds the English book into _build/html and each translation
(tools/locales.py) into _build/html/<language>/, from the same sources: a page keeps its path,
so the other edition's page is found by going up to the edition's root. On a translated
edition, a page whose catalog is missing, incomplete or behind its English is shown in
English, with a note that says so and links to the English page; a complete page's Colab
button opens its translated Colab edition, colab/<language>/<stem>.ipynb, when `make sync`
wrote one. `_config.yml` loads it through `local_extensions`.
"""

from html import escape
from pathlib import Path

from sphinx import addnodes
from sphinx.locale import init as init_locale
from sphinx.transforms import SphinxTransform
from sphinx.util.i18n import docname_to_domain

from locales import LANGUAGES, is_complete

ROOT = Path(__file__).resolve().parents[1]
ENGLISH = "en"
# Each edition's name in its own language, for the link that leads to it.
LABELS = {ENGLISH: "English", "zh_CN": "中文"}
HTML_LANG = {ENGLISH: "en", "zh_CN": "zh-CN"}
# The note on a page that a translated edition shows in English, in that edition's language.
UNTRANSLATED = {
    "zh_CN": "本页尚未译成中文，以下是英文原文。{link}",
}
ENGLISH_LINK = {"zh_CN": "阅读英文版"}


def edition(language: str | None) -> str:
    return language if language in LANGUAGES else ENGLISH


def edition_url(pagename: str, current: str, target: str) -> str:
    """The relative URL of `pagename` in the `target` edition, from that page in `current`."""
    up = "../" * (pagename.count("/") + (current != ENGLISH))
    return up + ("" if target == ENGLISH else f"{target}/") + f"{pagename}.html"


class TranslateToctreeCaptions(SphinxTransform):
    """The part captions of _toc.yml in the edition's language. Sphinx extracts them into the
    root page's catalog, but sphinx-external-toc adds the toctrees (priority 100) after Sphinx
    translated the page (20), so this looks them up in the same catalog."""

    default_priority = 150

    def apply(self, **kwargs) -> None:
        if edition(self.config.language) == ENGLISH:
            return
        domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
        dirs = [str(Path(self.env.srcdir) / d) for d in self.config.locale_dirs]
        catalog, found = init_locale(dirs, self.config.language, domain)
        if not found:
            return
        for toctree in self.document.findall(addnodes.toctree):
            caption = toctree.get("caption")
            if caption and catalog.gettext(caption) != caption:
                toctree["caption"] = toctree["rawcaption"] = catalog.gettext(caption)


def languages_html(pagename: str, current: str) -> str:
    links = [f'<a href="{escape(edition_url(pagename, current, target))}" '
             f'hreflang="{HTML_LANG[target]}" lang="{HTML_LANG[target]}">{LABELS[target]}</a>'
             for target in [ENGLISH, *LANGUAGES] if target != current]
    return f'<p class="book-languages">{" · ".join(links)}</p>\n'


def untranslated_html(pagename: str, current: str) -> str:
    url = escape(edition_url(pagename, current, ENGLISH))
    link = f'<a href="{url}" hreflang="en">{ENGLISH_LINK[current]}</a>'
    return (f'<div class="admonition note book-untranslated" lang="{HTML_LANG[current]}">'
            f'<p>{UNTRANSLATED[current].format(link=link)}</p></div>\n')


def add_language_links(app, pagename: str, templatename: str, context: dict, doctree) -> None:
    """An html-page-context hook: the links to the other editions above each page's text, the
    note on an untranslated page, and (after book_charts' hook) the translated Colab edition."""
    if doctree is None or "body" not in context:  # the search and index pages
        return
    current = edition(app.config.language)
    head = languages_html(pagename, current)
    translated = current != ENGLISH and is_complete(current, pagename)
    if current != ENGLISH and not translated:
        head += untranslated_html(pagename, current)
    context["body"] = head + context["body"]
    colab = ROOT / "colab" / current / f"{Path(pagename).name}.ipynb"
    if translated and colab.exists():
        for group in context.get("header_buttons", []):
            if group.get("label") == "launch-buttons":
                for button in group["buttons"]:
                    if button.get("text") == "Colab":
                        button["url"] = button["url"].replace("/colab/", f"/colab/{current}/")


def setup(app) -> dict:
    app.add_transform(TranslateToctreeCaptions)
    app.connect("html-page-context", add_language_links, priority=650)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
