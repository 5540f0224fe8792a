"""The set-up: layers, the constraints file, missing tools, and the Colab pin."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

import the_annotated_transformer as book

ROOT = Path(__file__).resolve().parents[1]


def test_constraints_hold_the_versions_of_the_environment_the_tests_run_in():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "lock.py"), "--check"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_constraints_leave_torch_to_the_machine():
    pins = (ROOT / "constraints.txt").read_text().splitlines()
    assert not [p for p in pins if p.lower().startswith(("torch==", "nvidia-", "triton=="))]
    assert any(p.startswith("spacy==") for p in pins)


def test_first_layer_is_torch_and_the_book_extra_only():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["dependencies"] == ["torch>=2.5,<3"]  # a range: Colab keeps its torch
    runtime = {r.split("=")[0].split(">")[0].split("<")[0] for r in
               project["optional-dependencies"]["book"]}
    assert {"spacy", "sacrebleu"} <= runtime
    assert not runtime & {"jupyter-book", "pytest", "playwright", "nbval", "ruff"}


def test_setup_env_names_an_unknown_layer_in_one_line():
    result = subprocess.run(["bash", str(ROOT / "tools" / "setup_env.sh"), "everything"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "setup_env.sh: unknown layer 'everything': use cli, book or test"
    ]


def test_vendor_js_without_npm_says_so_in_one_line_and_needs_none_when_done(tmp_path,
                                                                          monkeypatch):
    spec = importlib.util.spec_from_file_location("vendor_js", ROOT / "tools" / "vendor_js.py")
    vendor_js = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(vendor_js)
    monkeypatch.setenv("PATH", str(tmp_path))  # no npm
    monkeypatch.setattr(vendor_js, "VENDOR", tmp_path / "vendor")
    with pytest.raises(SystemExit, match=r"^vendor_js\.py: npm is missing: install Node\.js"):
        vendor_js.main()
    (tmp_path / "vendor").mkdir()
    for name, version, *_ in vendor_js.PACKAGES:
        (tmp_path / "vendor" / f".{name}-{version}").touch()
    vendor_js.main()  # everything vendored: npm is not needed


def test_colab_cells_and_the_model_download_use_the_books_own_tag():
    ref = str(yaml.safe_load((ROOT / "_config.yml").read_text())["repository"]["branch"])
    assert book.BOOK_REPOSITORY_REF == ref
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        setup = next(c for c in nbformat.read(path, as_version=4).cells
                     if "setup" in c.metadata.get("tags", []))
        assert f'REF = "{ref}"' in setup.source and "git+{REPO}@{REF}" in setup.source, path.name
