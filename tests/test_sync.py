"""The generated module and the text twins match the chapters."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_module_and_twins_are_in_sync_with_the_chapters():
    result = subprocess.run(
        [sys.executable, "tools/sync.py", "--check"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr + result.stdout


def test_module_names_its_source_chapters_and_says_it_is_generated():
    text = (ROOT / "the_annotated_transformer.py").read_text()
    assert text.startswith("# %% [markdown]")
    assert "GENERATED FILE: do not edit" in text
    assert "# ## From book/intro.ipynb" in text
