"""Real corpora, part 1: annotated-transformer train --clean drops and counts bad pairs (and
refuses them in one line without it), pairs longer than max_len are counted and printed, and a
run stops at a number of updates, at a number of minutes, or when validation BLEU stops
improving, leaving a finished run that a larger limit resumes."""

import gzip
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_training import synthetic_sentence_pairs

import the_annotated_transformer as tat
from annotated_transformer_cli import train as train_cli
from annotated_transformer_cli.parallel_text import (
    BadInput,
    clean_pairs,
    cleaning_summary,
    read_clean_parallel,
)
from the_annotated_transformer import StopRule, TrainConfig, load_checkpoint, train_worker

ERROR = "annotated-transformer train: error: "
GOOD = [("Ein Hund läuft.", "A dog runs."), ("Eine Katze sitzt.", "A cat sits."),
        ("Zwei Kinder spielen im Park.", "Two children play in the park.")]
# Each bad pair with the one reason --clean counts it under (the first of CLEAN_REASONS).
BAD = [
    (None, "A dog runs."),  # not UTF-8 (lines_or_none's None)
    ("", "A man sits."),  # empty
    ("Ein Mann sitzt.", "   "),  # blank counts as empty
    ("Wort " * 250, "word " * 250),  # 1,250 characters a side: too long
    ("Ja.", "Yes, that is exactly what the man in the red hat said."),  # length ratio
    GOOD[0],  # a repeat of the first pair
    GOOD[2],
]
COUNTS = {"not UTF-8": 1, "empty": 2, "too long": 1, "length ratio": 1, "duplicate": 2}


def test_clean_pairs_counts_each_reason_and_keeps_the_rest_in_order():
    dropped = Counter()
    kept = list(clean_pairs(GOOD + BAD + [("Ein Ball.", "A ball.")], dropped))
    assert kept == GOOD + [("Ein Ball.", "A ball.")]
    assert dropped == COUNTS
    assert cleaning_summary(dropped, len(kept)) == (
        "kept 4 of 11 pairs; dropped 1 not UTF-8, 2 empty, 1 over 1,000 characters, 1 one side "
        "over 3 times as long, 2 repeats of an earlier pair")
    # the limits are options: a looser ratio keeps the short answer, a higher cap the long pair
    loose = Counter()
    kept = list(clean_pairs(GOOD + BAD, loose, max_chars=2000, max_ratio=20))
    assert loose == {"not UTF-8": 1, "empty": 2, "duplicate": 2}
    assert len(kept) == 5


def write_pairs(folder: Path, name: str, pairs: list, languages=("de", "en")) -> list[str]:
    """Two files, line for line; a None side is written as bytes that are not UTF-8."""
    paths = []
    for side, language in enumerate(languages):
        path = folder / f"{name}.{language}"
        lines = [b"\xff\xfe bad" if pair[side] is None else pair[side].encode()
                 for pair in pairs]
        path.write_bytes(b"\n".join(lines) + b"\n")
        paths.append(str(path))
    return paths


def test_read_clean_parallel_reads_bad_bytes_as_a_pair_to_drop_and_refuses_unequal_files(
        tmp_path):
    src, tgt = write_pairs(tmp_path, "train", GOOD + BAD)
    pairs, dropped = read_clean_parallel(src, tgt)
    assert pairs == GOOD and dropped == COUNTS
    # a byte-order mark and CRLF endings are read as read_parallel reads them
    Path(src).write_bytes(b"\xef\xbb\xbf" + Path(src).read_bytes().replace(b"\n", b"\r\n"))
    assert read_clean_parallel(src, tgt) == (pairs, dropped)
    short = tmp_path / "short.en"
    short.write_text("A dog runs.\n", "utf-8")
    with pytest.raises(BadInput, match=r"has 10 lines but .* has 1: .*cannot tell which"):
        read_clean_parallel(src, short)
    with pytest.raises(BadInput, match=r"short.en has 1 lines but .* has 10: "):
        read_clean_parallel(short, tgt)
    empty = tmp_path / "empty.de"
    empty.write_bytes(b"")
    with pytest.raises(BadInput, match="are empty: they hold no sentence"):
        read_clean_parallel(empty, empty)
    only_bad = write_pairs(tmp_path, "bad", BAD[:3])
    with pytest.raises(BadInput, match="--clean leaves no pair of .*kept 0 of 3 pairs"):
        read_clean_parallel(*only_bad)


@pytest.fixture()
def corpus(tmp_path) -> dict[str, list[str]]:
    """A few hundred distinct synthetic pairs with BAD among them, and a clean validation."""
    train = list(dict.fromkeys(synthetic_sentence_pairs(400, 0)))
    train = train[:5] + GOOD + BAD + train[5:]
    val = synthetic_sentence_pairs(20, 1)
    return {"train": write_pairs(tmp_path, "train", train),
            "valid": write_pairs(tmp_path, "val", val), "n_train": len(train)}


TINY = ["--set", "N=1", "--set", "d_model=16", "--set", "d_ff=32", "--set", "h=2",
        "--set", "warmup=2", "--set", "bleu_every=1", "--epochs", "2", "--threads", "1"]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_without_clean_an_empty_line_refuses_in_one_line_and_leaves_the_folder(corpus,
                                                                                 tmp_path, capsys):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept\n", "utf-8")
    before = snapshot(folder)
    argv = ["--train", *corpus["train"], "--valid", *corpus["valid"], *TINY,
            "--checkpoint-dir", str(folder)]
    with pytest.raises(SystemExit) as stop:
        train_cli.main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(ERROR)
    assert "line 9 is not valid UTF-8" in err  # the first bad line of the source file
    assert snapshot(folder) == before
    # --valid is not cleaned: its empty line stays an error with --clean
    bad_valid = write_pairs(tmp_path, "badval", [("", "A dog.")] + GOOD)
    with pytest.raises(SystemExit) as stop:
        train_cli.main(["--train", *corpus["train"], "--valid", *bad_valid, "--clean", *TINY,
                        "--checkpoint-dir", str(folder)])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "line 1 is empty" in err
    assert snapshot(folder) == before


@pytest.mark.parametrize("argv, message", [
    (["--clean-max-chars", "100"], "--clean-max-chars goes with --clean"),
    (["--clean", "--clean-max-ratio", "0.5"], "--clean-max-ratio must be a number of at least 1"),
    (["--max-updates", "5", "--set", "max_updates=6"], "max_updates is set twice"),
    (["--max-minutes", "-1"], "max_minutes must be a number >= 0"),
    (["--set", "patience=x"], "patience is a whole number"),
])
def test_bad_cleaning_and_stopping_options_are_one_line_with_status_2(corpus, tmp_path, capsys,
                                                                      argv, message):
    with pytest.raises(SystemExit) as stop:
        train_cli.main(["--train", *corpus["train"], "--valid", *corpus["valid"], *argv,
                        "--checkpoint-dir", str(tmp_path / "run")])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err
    assert not (tmp_path / "run").exists()


def test_clean_prints_the_counts_first_and_trains_on_what_is_left(corpus, tmp_path, capsys):
    """End to end: --clean's line, then the recipe sized to the pairs that are left; a run
    stopped by --max-updates ends as a finished run whose model folder holds the weights it
    stopped with; the same command again has nothing to train; a larger limit resumes."""
    folder = tmp_path / "run"
    argv = ["--train", *corpus["train"], "--valid", *corpus["valid"], "--clean", *TINY,
            "--checkpoint-dir", str(folder), "--max-updates", "3"]
    train_cli.main(argv)
    err = capsys.readouterr().err
    kept = corpus["n_train"] - len(BAD)
    first = err.splitlines()[0]
    assert first == (f"  --clean {corpus['train'][0]} {corpus['train'][1]}: kept {kept} of "
                     f"{corpus['n_train']} pairs; dropped 1 not UTF-8, 2 empty, 1 over 1,000 "
                     "characters, 1 one side over 3 times as long, 2 repeats of an earlier pair")
    assert f"sized for {kept} training pairs" in err
    last = load_checkpoint(folder / "last.pt")
    assert last["train_state"]["accum_step"] == 3 and last["stopped"].startswith("max_updates=3")
    assert last["stopping"] == {"max_updates": 3, "max_minutes": 0.0, "patience": 0}
    assert (folder / "best.pt").is_file()
    assert "the weights it stopped with, 3 micro-batches into epoch 1" in err
    info = (folder / "model" / "info.json").read_text("utf-8")
    assert '"train_pairs": ' + str(kept) in info and '"duplicate": 2' in info

    train_cli.main(argv)  # the same command: nothing to train, status 0
    err = capsys.readouterr().err
    assert "has finished: " in err and "stopped early (max_updates=3" in err
    assert load_checkpoint(folder / "last.pt")["train_state"]["accum_step"] == 3

    with pytest.raises(SystemExit) as stop:  # a larger limit without --resume: another run
        train_cli.main([*argv[:-1], "5"])
    assert stop.value.code == 2 and "--resume to continue it" in capsys.readouterr().err

    train_cli.main(["--resume", "--checkpoint-dir", str(folder), "--threads", "1",
                    "--train", *corpus["train"], "--valid", *corpus["valid"], "--clean",
                    "--max-updates", "5"])
    err = capsys.readouterr().err
    last = load_checkpoint(folder / "last.pt")
    assert last["train_state"]["accum_step"] == 5 and "resumed from" in err
    assert last["stopping"]["max_updates"] == 5


# The worker, called directly: a small subword run on synthetic pairs.
PAIRS = {"train": synthetic_sentence_pairs(200, 0), "val": synthetic_sentence_pairs(20, 1)}
CONFIG = TrainConfig(N=1, d_model=16, d_ff=32, h=2, dropout=0.1, max_tokens=120, epochs=4,
                     warmup=3, subwords=320, share_embeddings=True, bleu_every=1)
RUN = {"progress": False, "threads": 1, "pairs": PAIRS}


def test_max_updates_stops_after_exactly_that_many_and_a_resumed_run_goes_on_as_if_it_had_not(
        tmp_path):
    whole = replace(CONFIG, checkpoint_dir=str(tmp_path / "whole"), accum_iter=2)
    history = train_worker(0, 1, whole, stop=StopRule(max_updates=7), **RUN)
    last = load_checkpoint(tmp_path / "whole" / "last.pt")
    assert last["train_state"]["accum_step"] == 7
    assert history[-1]["stopped"] == "max_updates=7: 7 optimizer updates done"
    assert last["batch"] == history[-1]["stopped_at_batch"] > 0  # inside an epoch
    assert "val_bleu" in history[-1]

    parts = replace(whole, checkpoint_dir=str(tmp_path / "parts"))
    train_worker(0, 1, parts, stop=StopRule(max_updates=3), **RUN)
    assert load_checkpoint(tmp_path / "parts" / "last.pt")["train_state"]["accum_step"] == 3
    train_worker(0, 1, parts, resume=True, stop=StopRule(max_updates=7), **RUN)
    resumed = load_checkpoint(tmp_path / "parts" / "last.pt")
    assert resumed["train_state"] == last["train_state"]
    for name, weight in last["model"].items():
        torch.testing.assert_close(resumed["model"][name], weight, rtol=0, atol=0)


def test_patience_stops_after_that_many_validations_without_a_new_best(tmp_path, monkeypatch):
    scores = iter([10.0, 12.0, 12.0, 11.5, 13.0])  # the third and fourth are no new best

    monkeypatch.setattr(tat, "validation_bleu", lambda *args, **kwargs: next(scores))
    config = replace(CONFIG, epochs=5, checkpoint_dir=str(tmp_path))
    history = train_worker(0, 1, config, stop=StopRule(patience=2), **RUN)
    assert [r["val_bleu"] for r in history] == [10.0, 12.0, 12.0, 11.5]
    assert history[-1]["stopped"] == ("patience=2: 2 validations without a new best BLEU (the "
                                      "best, 12.00, was validation 2)")
    last = load_checkpoint(tmp_path / "last.pt")
    assert (last["epoch"], last["batch"], last["stopped"]) == (4, 0, history[-1]["stopped"])
    assert load_checkpoint(tmp_path / "best.pt")["val_bleu"] == 12.0
    with pytest.raises(ValueError, match="patience=2 counts validations with BLEU"):
        train_worker(0, 1, replace(config, bleu_every=0), stop=StopRule(patience=2), **RUN)


class FakeTime:
    """time, with a perf_counter that moves 20 seconds on every reading."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        self.now += 20.0
        return self.now

    def __getattr__(self, name: str):
        import time

        return getattr(time, name)


def test_max_minutes_stops_on_the_clock_of_training(tmp_path, monkeypatch):
    monkeypatch.setattr(tat, "time", FakeTime())
    config = replace(CONFIG, checkpoint_dir=str(tmp_path))
    history = train_worker(0, 1, config, stop=StopRule(max_minutes=1.5), **RUN)
    last = load_checkpoint(tmp_path / "last.pt")
    assert history[-1]["stopped"].startswith("max_minutes=1.5: ")
    assert last["stopped"] == history[-1]["stopped"] and last["elapsed_s"] >= 90
    assert last["train_state"]["accum_step"] > 0 and last["epoch"] < config.epochs


def test_stop_rule_checks_its_fields_and_says_why():
    with pytest.raises(ValueError, match="max_updates must be a whole number >= 0"):
        StopRule(max_updates=-1)
    with pytest.raises(ValueError, match="max_minutes must be a number >= 0"):
        StopRule(max_minutes=float("nan"))
    history = [{"val_bleu": 3.0}, {"val_bleu": 2.0}]
    assert tat.stop_reason(None, updates=10**6, minutes=10**6, history=history) is None
    assert tat.stop_reason(StopRule(), updates=10**6, minutes=10**6, history=history) is None
    assert tat.stop_reason(StopRule(max_updates=5), updates=4, minutes=0, history=[]) is None
    assert tat.stop_reason(StopRule(patience=1), updates=0, minutes=0, history=history) == (
        "patience=1: 1 validations without a new best BLEU (the best, 3.00, was validation 1)")


def test_pairs_longer_than_max_len_are_counted_and_printed_even_without_progress(tmp_path,
                                                                                capsys):
    long = ("Hund " * 40, "dog " * 40)
    pairs = {"train": PAIRS["train"] + [long] * 3, "val": PAIRS["val"] + [long]}
    config = replace(CONFIG, epochs=1, max_len=40, checkpoint_dir=str(tmp_path))
    train_worker(0, 1, config, progress=False, threads=1, pairs=pairs)
    out = capsys.readouterr().out
    assert ("left out, longer than max_len=40 tokens with <s> and </s>: 3 of 203 training "
            "pairs (1.5%) and 1 of 21 validation pairs") in out


def test_gzipped_files_are_cleaned_too(tmp_path):
    src, tgt = write_pairs(tmp_path, "train", GOOD + BAD)
    for path in (src, tgt):
        Path(path + ".gz").write_bytes(gzip.compress(Path(path).read_bytes()))
    pairs, dropped = read_clean_parallel(src + ".gz", tgt + ".gz")
    assert pairs == GOOD and dropped == COUNTS


def test_two_processes_stop_together_at_the_same_update(corpus, tmp_path, capfd):
    """--devices 2 with a stop rule, which train_distributed passes on to both processes: the
    clock's all-reduce runs at every step, and both ranks stop at max_updates, the run
    finished with its model folder."""
    folder = tmp_path / "run"
    train_cli.main(["--train", *corpus["train"], "--valid", *corpus["valid"], "--clean", *TINY,
                    "--checkpoint-dir", str(folder), "--devices", "2", "--max-updates", "2",
                    "--max-minutes", "600"])
    last = load_checkpoint(folder / "last.pt")
    assert last["train_state"]["accum_step"] == 2 and len(last["rng"]) == 2
    assert last["stopped"].startswith("max_updates=2: ")
    assert last["stopping"] == {"max_updates": 2, "max_minutes": 600.0, "patience": 0}
    assert (folder / "model" / "model.pt").is_file()
    assert "stopped early: max_updates=2" in capfd.readouterr().out  # the processes' output
