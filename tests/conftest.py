"""What several test files share: one headless Chromium or Chrome, found by
tools/find_browser.py, and Multi30k's training pairs encoded once as the presets encode them."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
from find_browser import BrowserNotFound, find_browser  # noqa: E402

# Headless, as root, on a machine with no network: no sandbox, GPU or background services.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    try:
        executable = find_browser()
    except BrowserNotFound as err:
        pytest.fail(f"{err} (or run tools/ensure_chromium.sh)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
MODELS = Path(__file__).resolve().parents[1] / "book" / "models"


def multi30k_train() -> list:
    from the_annotated_transformer import load_multi30k

    return load_multi30k("train", MULTI30K if MULTI30K.is_dir() else None)


@pytest.fixture(scope="session")
def lengths_of_multi30k():
    """Multi30k's training pairs as the word-level presets encode them (shipped vocabularies)."""
    from the_annotated_transformer import encode_examples, load_tokenizers, read_vocabularies

    vocab_src, vocab_tgt = read_vocabularies(MODELS / "multi30k_cpu")
    return encode_examples(multi30k_train(), vocab_src, vocab_tgt, load_tokenizers(), max_len=72)


@pytest.fixture(scope="session")
def subword_lengths_of_multi30k():
    """Multi30k's training pairs as the subword presets encode them (shipped subword model)."""
    from the_annotated_transformer import encode_examples, read_vocabularies

    sp, _ = read_vocabularies(MODELS / "multi30k_cpu_subword", subwords=True)
    return encode_examples(multi30k_train(), sp, sp, (None, None), max_len=72)
