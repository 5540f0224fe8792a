"""tools/colab_check.py, the Colab stand-in: its URL map, its network guard, and that it fails a
notebook that reads a shipped file without fetching it (the bug of chapter 27 before it called
fetch_shipped_model) or that uses the network outside the map, and passes one that fetches.

The end-to-end test runs tiny notebooks through the real harness: the Colab venv (built once and
shared with `make test-colab`), the local remote, a setup cell that installs the package from
it. Their setup cells install the package without its `book` extra, which they do not use.
"""

import importlib.util
import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import colab_check  # noqa: E402

from the_annotated_transformer import (  # noqa: E402
    BOOK_REPOSITORY,
    BOOK_REPOSITORY_REF,
    MULTI30K_URL,
    PTB_SAMPLE_URL,
    SHIPPED_MODELS,
)

GUARD = ROOT / "tools" / "colab" / "sitecustomize.py"


def load_guard():
    """tools/colab/sitecustomize.py as a module of another name (this process keeps its own)."""
    spec = importlib.util.spec_from_file_location("colab_guard", GUARD)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_url_map_answers_the_chapters_downloads_from_local_copies(tmp_path):
    guard = load_guard()
    url_map = colab_check.url_map(tmp_path)
    (tmp_path / "book" / "data").mkdir(parents=True)
    (tmp_path / "book" / "data" / "x.json").write_text("{}")
    raw = f"{BOOK_REPOSITORY}/raw/{BOOK_REPOSITORY_REF}/"
    assert guard.local_copy(raw + "book/data/x.json", url_map) == (True,
                                                                     tmp_path / "book/data/x.json")
    assert guard.local_copy(raw + "book/data/absent.json", url_map) == (True, None)  # a 404
    assert guard.local_copy(raw + "../../etc/passwd", url_map) == (True, None)
    assert guard.local_copy(f"{BOOK_REPOSITORY}/raw/v0.0.1/book/data/x.json", url_map)[0] is False
    assert guard.local_copy(MULTI30K_URL + "val.de.gz", url_map)[1].name == "val.de.gz"
    assert guard.local_copy(PTB_SAMPLE_URL, url_map)[1].name == "treebank.zip"
    fr_cs = ROOT.parent / "shared" / "data" / "multi30k-fr-cs"
    if (fr_cs / "val.fr.gz").is_file():  # a prefix's second folder
        assert guard.local_copy(MULTI30K_URL + "val.fr.gz", url_map)[1] == fr_cs / "val.fr.gz"
    assert guard.local_copy("https://example.org/", url_map) == (False, None)


def test_only_kernels_and_loopback_count():
    guard = load_guard()
    assert guard.is_kernel(["/v/bin/python", "-m", "ipykernel_launcher", "-f", "c.json"])
    assert not guard.is_kernel(["/v/bin/python", "-m", "pip", "install", "x"])
    assert guard.is_loopback("127.0.0.1") and guard.is_loopback("::1")
    assert guard.is_loopback("localhost")
    assert not guard.is_loopback("192.0.2.1") and not guard.is_loopback("example.org")


def test_guard_serves_the_map_and_refuses_and_records_the_rest(tmp_path):
    """In a separate process (the guard changes urllib and socket for good): a mapped URL is
    served, an unmapped one refused, no connection or name look-up leaves the machine."""
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "a.txt").write_text("local copy")
    (tmp_path / "map.json").write_text(json.dumps({"https://example.org/d/":
                                                   [str(tmp_path / "files")]}))
    script = textwrap.dedent(f"""
        import importlib.util, socket, sys, urllib.error, urllib.request
        spec = importlib.util.spec_from_file_location("guard", {str(GUARD)!r})
        guard = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(guard)
        guard.activate({str(tmp_path / "map.json")!r}, {str(tmp_path / "log.jsonl")!r})
        assert "google.colab" in sys.modules
        with urllib.request.urlopen("https://example.org/d/a.txt", timeout=5) as response:
            assert response.read() == b"local copy"
        for url, error in [("https://example.org/d/b.txt", urllib.error.HTTPError),
                           ("https://example.org/other", urllib.error.URLError)]:
            try:
                urllib.request.urlopen(url, timeout=5)
                raise SystemExit(url + " was not refused")
            except error:
                pass
        for call in [lambda: socket.create_connection(("192.0.2.1", 80), timeout=5),
                     lambda: socket.getaddrinfo("example.org", 443)]:
            try:
                call()
                raise SystemExit("not refused")
            except OSError:
                pass
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen()
        socket.create_connection(server.getsockname(), timeout=5).close()  # loopback is fine
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    log = (tmp_path / "log.jsonl").read_text().splitlines()
    assert [json.loads(line)["kind"] for line in log] == ["served", "missing", "url", "connect",
                                                           "resolve"]


def test_bad_notebook_names_are_one_line_errors():
    with pytest.raises(SystemExit, match="no notebook"):
        colab_check.notebook_path("99_no_such_chapter")
    assert set(colab_check.DEFAULT_CHAPTERS) <= set(colab_check.toc_stems())


def tiny_notebook(path: Path, code: str) -> Path:
    """A notebook with a chapter's kind of setup cell (Colab only) and one cell of code."""
    setup = textwrap.dedent(f"""\
        import sys

        if "google.colab" in sys.modules:
            import subprocess

            package = "the-annotated-transformer @ git+{BOOK_REPOSITORY}@{BOOK_REPOSITORY_REF}"
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)
        """)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(setup, metadata={"tags": ["setup"]}),
                nbformat.v4.new_code_cell(textwrap.dedent(code))]
    nbformat.write(nb, path)
    return path


def test_harness_fails_unfetched_shipped_files_and_unmapped_urls(tmp_path):
    """The bug of the old chapter 27 (a shipped file read without fetch_shipped_model) and a
    download outside the map fail; the same read after fetch_shipped_model passes; a notebook
    whose setup installs nothing fails, as Colab's shell would not find annotated-transformer."""
    unfetched = tiny_notebook(tmp_path / "unfetched.ipynb", """
        from the_annotated_transformer import read_vocabularies, shipped_model_dir
        read_vocabularies(shipped_model_dir())
        """)
    fetched = tiny_notebook(tmp_path / "fetched.ipynb", """
        from the_annotated_transformer import fetch_shipped_model, read_vocabularies
        vocab_de, vocab_en = read_vocabularies(fetch_shipped_model())
        assert len(vocab_de) > 1000
        """)
    unmapped = tiny_notebook(tmp_path / "unmapped.ipynb", """
        import urllib.request
        try:  # a chapter that swallows the error still fails: the guard recorded it
            urllib.request.urlopen("https://example.org/data.json", timeout=5)
        except OSError:
            pass
        """)
    uninstalled = tmp_path / "uninstalled.ipynb"
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('no setup cell')")]
    nbformat.write(nb, uninstalled)
    results = colab_check.check([unfetched, fetched, unmapped, uninstalled], jobs=2, timeout=300)
    for result in results:  # what a failure leaves for a reader: not needed here
        shutil.rmtree(result.folder, ignore_errors=True)
    by_name = {result.name: result for result in results}
    assert not by_name["unfetched"].ok
    assert "vocabularies are missing" in by_name["unfetched"].error
    assert by_name["fetched"].ok, by_name["fetched"].error
    assert by_name["fetched"].served == len(SHIPPED_MODELS["multi30k_cpu"])
    assert not by_name["unmapped"].ok
    assert "network outside the map" in by_name["unmapped"].error
    assert "example.org" in by_name["unmapped"].error
    assert not by_name["uninstalled"].ok
    assert "installed no annotated-transformer command" in by_name["uninstalled"].error

