"""Check that the commit about to be tagged is a release that Colab readers can use.

    python tools/release.py            # or: make release
    python tools/release.py --check    # what the publishing workflow runs on every push

One version names a release everywhere: pyproject.toml's `version` (say 0.2.0) and the tag
`v0.2.0` that _config.yml names as `repository.branch`. `make sync` writes that tag into every
chapter's setup cell (what Colab installs) and into the module's BOOK_REPOSITORY_REF (where the
shipped models are downloaded from), and the Colab button opens the notebooks at it. The script
fails, one line per problem, when the version and the tag disagree, when `make sync` is out of
date, when a shipped model's file is not committed or its checksum is not the one recorded in
SHIPPED_MODELS, and (not with --check) when the work tree has uncommitted changes or the tag
already names another commit. Otherwise it prints the two git commands that publish the release.
"""

import argparse
import hashlib
import re
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from sync import stale_files  # noqa: E402

from the_annotated_transformer import SHIPPED_MODELS  # noqa: E402

VERSION_LINE = re.compile(r'^version = "([^"]+)"$', re.MULTILINE)


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, check=False)


def release_tag(config_text: str) -> str:
    return str(yaml.safe_load(config_text)["repository"]["branch"])


def version_problems(pyproject_text: str, config_text: str) -> list[str]:
    """The package's version and the tag of _config.yml must be one release: v<version>."""
    found = VERSION_LINE.search(pyproject_text)
    if found is None:
        return ["pyproject.toml has no version line"]
    tag = release_tag(config_text)
    if tag != f"v{found.group(1)}":
        return [f"pyproject.toml says version {found.group(1)} but _config.yml's repository.branch "
                f"is {tag}: make them one release (v{found.group(1)}), then run `make sync`"]
    return []


def sync_problems() -> list[str]:
    stale = [path.relative_to(ROOT).as_posix() for path in stale_files()]
    return [f"out of date, run `make sync`: {', '.join(stale)}"] if stale else []


def shipped_problems(models: dict[str, dict[str, str]] = SHIPPED_MODELS) -> list[str]:
    """Every file the download code fetches at the tag must be committed, with its checksum."""
    problems = []
    for name, files in models.items():
        for file_name, sha256 in files.items():
            path = f"book/models/{name}/{file_name}"
            blob = git("show", f"HEAD:{path}")
            if blob.returncode != 0:
                problems.append(f"{path} is not committed: Colab readers could not download it")
            elif hashlib.sha256(blob.stdout).hexdigest() != sha256:
                problems.append(f"{path} does not have the SHA-256 that SHIPPED_MODELS records "
                                "(book/appendix_data.ipynb): update one or the other")
    return problems


def tree_problems(tag: str) -> list[str]:
    problems = []
    if git("status", "--porcelain").stdout.strip():
        problems.append("the work tree has uncommitted changes: commit them first")
    tagged = git("rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
    head = git("rev-parse", "HEAD").stdout.strip()
    if tagged.returncode == 0 and tagged.stdout.decode().strip() != head.decode():
        problems.append(f"the tag {tag} already names another commit: raise the version")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only the version, sync and shipped-file checks, not the tree or tag")
    args = parser.parse_args()
    config_text = (ROOT / "_config.yml").read_text()
    tag = release_tag(config_text)
    problems = (version_problems((ROOT / "pyproject.toml").read_text(), config_text)
                + sync_problems() + shipped_problems())
    if not args.check:
        problems += tree_problems(tag)
    for problem in problems:
        print(f"release.py: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)
    if args.check:
        print(f"one release: version and tag {tag}, the chapters in sync, the shipped files "
              "committed with their checksums")
    else:
        print(f"{tag} is ready: git tag {tag} && git push origin {tag}")


if __name__ == "__main__":
    main()
