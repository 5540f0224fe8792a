"""Every command of the README's "Training and translating" block, as written: each `make train`
line through make to annotated-transformer train and every check it makes before training (the
own-data line trains, at a tiny size, through make), `make translate` on its German sentence, and
annotated-transformer evaluate on the model folder that training wrote."""

import dataclasses
import gzip
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

import the_annotated_transformer as tat

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
ENGLISH, FRENCH = SHARED / "multi30k", SHARED / "multi30k-fr-cs"
TINY_SET = "N=1 d_model=32 d_ff=64 h=2 subwords=400 warmup=2 bleu_every=1"
pytestmark = pytest.mark.skipif(
    not (ENGLISH / "train.en.gz").is_file() or not (FRENCH / "train.fr.gz").is_file(),
    reason=f"Multi30k's English and French files are not in {SHARED}")


def readme_commands() -> list[str]:
    """The lines of the section's bash block, without their comments."""
    text = (ROOT / "README.md").read_text("utf-8")
    section = text.split("## Training and translating", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)[1]
    return [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]


def make_train_argv(words: list[str]) -> list[str]:
    """What `make train VAR=...` runs: annotated-transformer train's arguments, from make -n."""
    done = subprocess.run(["make", "-n", *words], cwd=ROOT, capture_output=True, text=True,
                          check=True, timeout=120)
    command = done.stdout.replace("\\\n", " ")
    [line] = [line for line in command.splitlines() if "annotated-transformer train" in line]
    words = shlex.split(line)
    return words[words.index("train") + 1 :]


def write_pairs(folder: Path, name: str, n: int) -> None:
    """name.en.gz and name.fr.gz: the first n English-French pairs of Multi30k's train split."""
    for language, source in (("en", ENGLISH), ("fr", FRENCH)):
        with gzip.open(source / f"train.{language}.gz", "rt", encoding="utf-8") as f:
            lines = [next(f) for _ in range(n)]
        with gzip.open(folder / f"{name}.{language}.gz", "wt", encoding="utf-8") as f:
            f.writelines(lines)


def test_the_training_block_is_the_commands_this_file_runs():
    kinds = [" ".join(command.split()[:2]) if command.startswith("make") else command.split()[0]
             for command in readme_commands()]
    assert set(kinds) == {"make train", "echo", ".venv/bin/annotated-transformer"}, kinds


def test_each_make_train_line_passes_every_check_of_the_train_command(tmp_path, monkeypatch):
    from annotated_transformer_cli.train import parse_args, prepare

    write_pairs(tmp_path, "train", 300)
    write_pairs(tmp_path, "val", 40)
    monkeypatch.chdir(tmp_path)  # the README's file names are relative
    resumable = tmp_path / "resumable"
    resumable.mkdir()
    recipe = tat.training_config("cpu_fast_dropout")
    tat.save_checkpoint({"epoch": 11, "model": {}, "config": dataclasses.asdict(recipe)},
                        resumable / "last.pt")
    checked = []
    for command in readme_commands():
        if not command.startswith("make train"):
            continue
        argv = make_train_argv(shlex.split(command)[1:])
        folder = resumable if "--resume" in argv else tmp_path / f"run{len(checked)}"
        config, languages, pairs, notes = prepare(
            parse_args([*argv, "--checkpoint-dir", str(folder)]), 1)
        given = dict(arg.split("=", 1) for arg in shlex.split(command)[2:])
        if "CONFIG" in given:
            assert config == tat.training_config(given["CONFIG"], checkpoint_dir=str(folder))
        elif "TRAIN" in given:
            assert languages == ("en", "fr") and len(pairs["train"]) == 300
            assert notes[0].startswith("sized for 300 training pairs")
        elif "LANGS" in given:
            assert languages == ("en", "fr") and len(pairs["train"]) == 29_000
        elif "RESUME" in given:
            assert config.epochs == int(given["EPOCHS"]) and config.subwords == recipe.subwords
            assert notes[0].startswith(f"settings from {folder / 'last.pt'}")
        elif "SET" in given:
            assert (config.dropout, config.epochs) == (0.3, 20)
        else:  # plain `make train`: the best recipe, as it is
            assert config == dataclasses.replace(recipe, checkpoint_dir=str(folder))
        checked.append(command)
    assert len(checked) == 6, checked


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The README's own-data line, through make, at a tiny size: its model folder."""
    folder = tmp_path_factory.mktemp("own")
    write_pairs(folder, "train", 300)
    write_pairs(folder, "val", 40)
    [command] = [c for c in readme_commands() if c.startswith("make train TRAIN=")]
    words = [word if "=" not in word or word.split("=")[0] not in ("TRAIN", "VALID") else
             word.split("=")[0] + "=" + " ".join(str(folder / name)
                                                 for name in word.split("=")[1].split())
             for word in shlex.split(command)]
    venv_bin = str(ROOT / ".venv" / "bin")  # as a reader without an activated venv runs it
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p.rstrip("/") != venv_bin)
    done = subprocess.run(
        [*words, f"SET={TINY_SET}", "EPOCHS=2", f"CHECKPOINT_DIR={folder / 'run'}"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PATH": path})
    assert done.returncode == 0, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    model = shlex.quote(str(folder / "run" / "model"))
    # make runs .venv/bin/annotated-transformer, which is not on PATH here: its path is printed
    assert (f"translate with: .venv/bin/annotated-transformer translate --checkpoint {model} "
            "< sentences.en; score with: .venv/bin/annotated-transformer evaluate --model "
            f"{model} --test SRC_FILE REF_FILE") in last, last
    return folder


def test_make_translate_reads_the_readmes_german_sentence():
    [command] = [c for c in readme_commands() if "make -s translate" in c]
    done = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    [line] = done.stdout.splitlines()
    assert "dog" in line.lower()  # Zwei Hunde spielen im Schnee.


def test_evaluate_scores_the_model_folder_that_training_wrote(trained):
    [command] = [c for c in readme_commands() if "annotated-transformer evaluate" in c]
    words = shlex.split(command)
    words[words.index("--model") + 1] = str(trained / "run" / "model")
    test = words.index("--test")
    words[test + 1 : test + 3] = [str(trained / "val.en.gz"), str(trained / "val.fr.gz")]
    done = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"greedy +val: BLEU +\d+\.\d\d, chrF +\d+\.\d\d", done.stdout), done.stdout

