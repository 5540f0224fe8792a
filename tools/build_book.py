"""Build the HTML book into _build/html, with Sphinx warnings treated as errors.

The English edition goes to _build/html; each translation (tools/locales.py: the catalogs in
locales/) goes to _build/html/<language>/, built from the same sources with Sphinx's
`language` set, so each page keeps its path in every edition (tools/book_languages.py links
them). `--language zh_CN` builds that edition alone, `--language en` the English alone.
"""

import argparse
import subprocess
import sys
import time
from pathlib import Path

from locales import LANGUAGES

ROOT = Path(__file__).resolve().parents[1]
HTML = ROOT / "_build" / "html"


def build_english() -> None:
    # --all: an incremental Sphinx build keeps stale navigation on pages it did not rewrite.
    command = ["jupyter-book", "build", str(ROOT), "--all", "--warningiserror", "--keep-going"]
    bindir = Path(sys.executable).parent
    result = subprocess.run([str(bindir / command[0]), *command[1:]], cwd=ROOT)
    if result.returncode != 0:
        sys.exit("the book did not build (see the warnings above)")


def build_translation(language: str) -> None:
    """Jupyter Book's own build, as `jupyter-book build` runs it, into _build/html/<language>
    (its command line cannot place it there), with doctrees of its own."""
    from jupyter_book.sphinx import build_sphinx

    out = HTML / language
    result = build_sphinx(
        ROOT, str(out), noconfig=True, path_config=str(ROOT / "_config.yml"),
        confoverrides={"external_toc_path": str(ROOT / "_toc.yml"),
                       "latex_individualpages": False, "language": language},
        builder="html", doctreedir=str(ROOT / "_build" / f".doctrees-{language}"),
        # a fresh read: Sphinx reads a page again when its catalog changed, not when it was
        # deleted, which would leave its translation standing
        freshenv=True, force_all=True, warningiserror=True, keep_going=True,
    )
    if result != 0:
        sys.exit(f"the {language} edition did not build (see the warnings above)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--language", choices=["en", *LANGUAGES],
                        help="build this edition only (default: English, then every translation)")
    args = parser.parse_args()
    if args.language in LANGUAGES:
        build_translation(args.language)
        return
    seconds = {}
    start = time.perf_counter()
    build_english()
    seconds["en"] = time.perf_counter() - start
    if args.language is None:
        for language in LANGUAGES:  # a process each: Sphinx and docutils keep global state
            start = time.perf_counter()
            result = subprocess.run([sys.executable, __file__, "--language", language], cwd=ROOT)
            if result.returncode != 0:
                sys.exit(result.returncode)
            seconds[language] = time.perf_counter() - start
    index = HTML / "index.html"
    print("\n" + ", ".join(f"{name} built in {s:.0f} s" for name, s in seconds.items()))
    print(f"The book is built. Open {index.as_uri()} in a browser,")
    for language in seconds.keys() - {"en"}:
        print(f"  its {language} edition: {(HTML / language / 'index.html').as_uri()}")
    print("or serve it: python -m http.server -d _build/html 8000")


if __name__ == "__main__":
    main()
