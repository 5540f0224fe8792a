"""Every command line of every ```bash block in README.md, as written from the repository's root:
each one is run for real at a tiny size (tests/test_readme_training.py runs the block of
"Training and translating"), or its program is run with --help, or it is named in ALLOWED below
with the reason; and a line that names a script, a program or a make target that does not exist
fails here, whichever way it is covered."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

# The README's sections whose every line another test runs for real, and that test.
RUN_FOR_REAL = {"Training and translating": "tests/test_readme_training.py"}
# Lines that no test runs as a whole, each with its reason; `make -n` still checks their target.
ALLOWED = {
    "make book": "builds the whole book (minutes); make test builds it and opens every page",
    "make test": "runs every test, this one among them",
}
# Words of a command that name files of the repository (not the reader's own data).
REPOSITORY_PATH = re.compile(r"^(\.venv|tools|book|tests|annotated_transformer_cli|colab)/"
                             r"|\.(py|sh|ipynb)$")


def bash_blocks() -> list[tuple[str, str]]:
    """(section title, command line) for every line of every ```bash block, comments removed
    and continued lines joined."""
    section, commands = "", []
    for part in re.split(r"^(## .*)$", README.read_text("utf-8"), flags=re.M):
        if part.startswith("## "):
            section = part[3:].strip()
            continue
        for block in re.findall(r"```bash\n(.*?)```", part, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                command = re.split(r"\s#", " " + line, maxsplit=1)[0].strip()
                if command:
                    commands.append((section, command))
    return commands


def stages(command: str) -> list[list[str]]:
    """The words of each program of a pipeline."""
    return [shlex.split(stage) for stage in command.split(" | ")]


def test_every_readme_command_is_covered():
    """Run for real by another test, allowed with a reason, or checked with --help below."""
    uncovered = [command for section, command in bash_blocks()
                 if section not in RUN_FOR_REAL and command not in ALLOWED
                 and not all(words[0].startswith(".venv/bin/") for words in stages(command))]
    assert uncovered == [], "add each to a test, or to ALLOWED with its reason"
    for test in RUN_FOR_REAL.values():
        assert (ROOT / test).is_file(), test
    assert bash_blocks(), "README.md has no ```bash block"


@pytest.mark.parametrize(("section", "command"), bash_blocks(), ids=lambda x: x[:60])
def test_readme_command_names_only_what_exists_and_its_program_answers_help(section, command):
    for words in stages(command):
        program = words[0]
        for word in words:
            path = word.split("=", 1)[-1]
            if REPOSITORY_PATH.search(path):
                assert (ROOT / path).exists(), f"{command!r} names {path}, which does not exist"
        if program == "echo":
            continue
        if program == "make":  # every target exists and the Makefile parses with these variables
            done = subprocess.run(["make", "-n", *words[1:]], cwd=ROOT, capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 0, done.stderr[-2000:]
            continue
        assert program.startswith(".venv/bin/"), f"{command!r}: no check for {program} here"
        assert (ROOT / program).is_file(), f"{command!r}: {program} is not installed"
        subcommand = [words[1]] if len(words) > 1 and not words[1].startswith("-") else []
        done = subprocess.run([str(ROOT / program), *subcommand, "--help"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


def test_the_readmes_text_names_only_make_targets_and_subcommands_that_exist():
    """Commands in the prose, in `code`: make's targets, the installed command's subcommands and
    what it names under .venv/bin."""
    from annotated_transformer_cli.main import SUBCOMMANDS

    targets = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text("utf-8"), re.M))
    spans = re.findall(r"`([^`\n]+)`", README.read_text("utf-8"))
    named = [words for words in (span.split() for span in spans)
             if words and words[0] in ("make", "annotated-transformer")
             or words and words[0].startswith(".venv/bin/")]
    assert any(words[0] == "annotated-transformer" for words in named), "the command is unnamed"
    for words in named:
        rest = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        if words[0] == "make":
            assert set(rest) <= targets, f"{' '.join(words)}: no such make target"
        elif words[0] == "annotated-transformer":
            assert not rest or rest[0] in SUBCOMMANDS or rest[0].isupper(), " ".join(words)
        else:
            assert (ROOT / words[0]).exists(), f"{' '.join(words)}: {words[0]} is not there"
