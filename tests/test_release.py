"""Releases (tools/release.py): one version for the package and the tag that Colab opens."""

from pathlib import Path

from release import release_tag, shipped_problems, version_problems

ROOT = Path(__file__).resolve().parents[1]
CONFIG = (ROOT / "_config.yml").read_text()


def test_the_package_version_is_the_tag_that_the_book_names():
    assert version_problems((ROOT / "pyproject.toml").read_text(), CONFIG) == []
    assert release_tag(CONFIG).startswith("v")


def test_a_version_that_is_not_the_tag_is_named_in_one_line():
    problems = version_problems('[project]\nversion = "9.9.9"\n', CONFIG)
    assert len(problems) == 1
    assert "9.9.9" in problems[0] and release_tag(CONFIG) in problems[0]
    assert version_problems("[project]\n", CONFIG) == ["pyproject.toml has no version line"]


def test_every_shipped_file_is_committed_with_its_recorded_checksum():
    assert shipped_problems() == []


def test_a_shipped_file_missing_or_changed_is_named():
    problems = shipped_problems({"multi30k_cpu": {"info.json": "0" * 64, "nope.pt": "0" * 64}})
    assert problems == [
        "book/models/multi30k_cpu/info.json does not have the SHA-256 that SHIPPED_MODELS "
        "records (book/appendix_data.ipynb): update one or the other",
        "book/models/multi30k_cpu/nope.pt is not committed: Colab readers could not download it",
    ]
