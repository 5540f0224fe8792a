"""`make test`'s nbval split: every chapter runs once, in one thread, with another CPU's kernels."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import nbval_portable  # noqa: E402
from sync import chapters  # noqa: E402


def test_every_chapter_runs_exactly_once_with_one_thread_and_other_kernels():
    every = chapters()
    runs = nbval_portable.split_runs(every, every[3:5])
    chosen = [nb for _, notebooks in runs.values() for nb in notebooks]
    assert sorted(chosen) == sorted(every)
    assert runs["first half"][1] == every[3:5]
    assert all(env["OMP_NUM_THREADS"] == "1" for env, _ in runs.values())
    assert all(env["ATEN_CPU_CAPABILITY"] in {"avx2", "default"} for env, _ in runs.values())


def test_the_makefile_splits_the_whole_book_into_two_runs():
    makefile = (Path(__file__).resolve().parents[1] / "Makefile").read_text()
    assert "$(addprefix --first ,$(NBVAL_FIRST_HALF))" in makefile
    assert "--other-kernels" not in makefile


def test_a_run_without_chapters_is_left_out():
    assert list(nbval_portable.split_runs(chapters(), [])) == ["second half"]


def test_first_must_name_a_chapter_that_runs():
    every = chapters()
    with pytest.raises(SystemExit, match="not among the chapters run"):
        nbval_portable.split_runs(every[:2], [every[5]])
