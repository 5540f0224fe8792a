"""Your own translator: annotated-transformer train on a parallel text of your own (a few hundred
English-French pairs of Multi30k), then annotated-transformer translate and annotated-transformer
evaluate on its model folder; and every bad input refused in one line with exit status 2 before
anything trains."""

import dataclasses
import gzip
import importlib
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import the_annotated_transformer as tat
from annotated_transformer_cli.train import parse_sets

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data"
ENGLISH = SHARED / "multi30k"
FRENCH = SHARED / "multi30k-fr-cs"
N_TRAIN, N_VAL = 300, 40
ERROR = "annotated-transformer train: error: "  # how each of train's refusals begins
TINY = ["--set", "N=1", "--set", "d_model=32", "--set", "d_ff=64", "--set", "h=2",
        "--set", "subwords=400", "--set", "warmup=2", "--set", "bleu_every=1", "--epochs", "2",
        "--threads", "1"]


def load_tool(name: str):
    """A subcommand's module of the annotated-transformer command."""
    return importlib.import_module(f"annotated_transformer_cli.{name}")


def first_lines(path: Path, n: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [next(f).rstrip("\n") for _ in range(n)]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """train.en / train.fr plain, val.en.gz / val.fr.gz gzipped: the first pairs of Multi30k."""
    needed = [ENGLISH / "train.en.gz", FRENCH / "train.fr.gz", ENGLISH / "val.en.gz",
              FRENCH / "val.fr.gz"]
    if not all(path.is_file() for path in needed):
        pytest.skip(f"the English and French Multi30k files are not in {SHARED} (../shared is "
                    "absent on this machine)")
    folder = tmp_path_factory.mktemp("own")
    for language, source in (("en", ENGLISH), ("fr", FRENCH)):
        lines = first_lines(source / f"train.{language}.gz", N_TRAIN)
        (folder / f"train.{language}").write_text("\n".join(lines) + "\n", "utf-8")
        lines = first_lines(source / f"val.{language}.gz", N_VAL)
        (folder / f"val.{language}.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n")
                                                                  .encode()))
    return folder


def own_files(folder: Path) -> list[str]:
    return ["--train", str(folder / "train.en"), str(folder / "train.fr"),
            "--valid", str(folder / "val.en.gz"), str(folder / "val.fr.gz")]


@pytest.fixture(scope="module")
def model_dir(data, tmp_path_factory) -> Path:
    """The command line, end to end: a tiny en-fr model, two epochs averaged, in a folder."""
    run = tmp_path_factory.mktemp("run")
    done = subprocess.run(
        [sys.executable, "-m", "annotated_transformer_cli", "train", *own_files(data), *TINY,
         "--checkpoint-dir", str(run)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"model folder {run / 'model'} (epochs 1, 2 averaged)" in done.stderr
    return run / "model"


def test_train_writes_a_model_folder_with_its_languages_and_the_last_epochs_averaged(model_dir):
    assert sorted(p.name for p in model_dir.iterdir()) == ["info.json", "model.pt",
                                                            "subwords.model"]
    info = json.loads((model_dir / "info.json").read_text("utf-8"))
    assert info["languages"] == {"src": "en", "tgt": "fr"}
    assert info["averaged_from"] == ["epoch_001.pt", "epoch_002.pt"]
    assert info["data"]["train_pairs"] == N_TRAIN and info["data"]["valid_pairs"] == N_VAL
    config = info["config"]
    assert (config["N"], config["d_model"], config["subwords"]) == (1, 32, 400)
    assert config["paper_dropout"] and config["fast"]  # the rest is cpu_fast_dropout's
    assert [record["epoch"] for record in info["history"]] == [1, 2]


def test_translate_reads_the_folder_without_a_german_or_english_tokenizer(model_dir,
                                                                         monkeypatch, capsys):
    def no_spacy():
        raise AssertionError("a subword model needs no spaCy tokenizer")

    monkeypatch.setattr(tat, "load_tokenizers", no_spacy)
    sentences = ["A dog runs in the park.", "Two men are playing football."]
    out = io.StringIO()
    stdin = io.BytesIO(f"{sentences[0]}\n\n{sentences[1]}\n".encode())
    status = load_tool("translate").main(["--checkpoint", str(model_dir), "--beam", "1"],
                                         stdin=stdin, stdout=out)
    assert status == 0
    model, vocab_src, vocab_tgt, _ = tat.load_trained_model(model_dir)
    expected = tat.beam_translate(model, sentences, vocab_src, vocab_tgt, None, beam_size=1,
                                  use_cache=True)
    assert out.getvalue().split("\n")[:-1] == [expected[0], "", expected[1]]
    assert "translating 3 lines from en to fr" in capsys.readouterr().err


def test_evaluate_scores_the_folder_with_bleu_and_chrf_and_their_signatures(data, model_dir,
                                                                           tmp_path):
    results = tmp_path / "results.json"
    load_tool("evaluate").main(["--model", f"en-fr={model_dir}", "--test",
                                str(data / "val.en.gz"), str(data / "val.fr.gz"),
                                "--results", str(results), "--keep-outputs"])
    [entry] = json.loads(results.read_text("utf-8"))["results"]
    assert (entry["model"], entry["split"], entry["decoding"]) == ("en-fr", "val", "greedy")
    assert entry["sentences"] == N_VAL
    assert entry["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert entry["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no")
    from sacrebleu.metrics import CHRF

    references = first_lines(FRENCH / "val.fr.gz", N_VAL)
    chrf = CHRF().corpus_score(entry["outputs"], [references]).score
    assert entry["chrf"] == round(chrf, 2) and entry["bleu"] >= 0.0


def test_evaluate_says_how_many_sources_it_cuts_at_70_tokens(data, model_dir, tmp_path,
                                                            capfd):
    lines = first_lines(ENGLISH / "val.en.gz", 3)
    lines[1] = " ".join([lines[1]] * 12)  # far over 70 pieces
    source, reference = tmp_path / "long.en", tmp_path / "long.fr"
    source.write_text("\n".join(lines) + "\n", "utf-8")
    reference.write_text("\n".join(first_lines(FRENCH / "val.fr.gz", 3)) + "\n", "utf-8")
    load_tool("evaluate").main(["--model", f"en-fr={model_dir}", "--test", str(source),
                                str(reference)])
    assert ("annotated-transformer evaluate: 1 of 3 long sources are longer than 70 tokens and "
            "are cut there") in capfd.readouterr().err


def test_evaluate_refuses_multi30k_german_english_splits_for_an_en_fr_model(model_dir, tmp_path,
                                                                            capfd):
    with pytest.raises(SystemExit) as exit_:
        load_tool("evaluate").main(["--model", f"en-fr={model_dir}",
                                    "--results", str(tmp_path / "r.json")])
    assert exit_.value.code == 2
    assert capfd.readouterr().err.splitlines() == [
        "annotated-transformer evaluate: error: model en-fr translates en to fr, but --splits val "
        "test_2016_flickr are Multi30k's German-English sentences: give its test sets with "
        "--test SRC_FILE REF_FILE"]


def broken_copy(data: Path, tmp_path: Path, change) -> Path:
    """A copy of the data folder with train.fr's bytes changed by `change`."""
    folder = tmp_path / "data"
    shutil.copytree(data, folder)
    path = folder / "train.fr"
    path.write_bytes(change(path.read_bytes()))
    return folder


def refused(argv: list[str], tmp_path: Path, capfd) -> str:
    """Run the train subcommand's main, which must stop with exit status 2 before training; its
    one line."""
    from annotated_transformer_cli.train import main

    run = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--checkpoint-dir", str(run)])
    lines = capfd.readouterr().err.splitlines()
    assert exit_.value.code == 2 and len(lines) == 1, lines
    assert not run.exists()  # nothing trained, nothing written
    return lines[0]


def replace_line(number: int, text: bytes):
    def change(data: bytes) -> bytes:
        lines = data.split(b"\n")
        lines[number - 1] = text
        return b"\n".join(lines)

    return change


@pytest.mark.parametrize(("change", "message"), [
    (lambda data: data.split(b"\n", 1)[1], "{en} has 300 lines but {fr} has 299: a parallel "
     "text has the same number of lines on both sides"),
    (replace_line(17, b"  "), "{fr}: line 17 is empty: every line must hold one sentence; "
     "remove the pair from both files"),
    (replace_line(5, b"Un chien \xff noir."), "{fr}: line 5 is not valid UTF-8 (byte 0xff at "
     "column 10): the text must be UTF-8"),
    (lambda data: b"", "{fr} is empty: it holds no sentence"),
], ids=["unequal-length", "empty-line", "bad-bytes", "empty-file"])
def test_train_refuses_a_bad_file_in_one_line_naming_file_and_line(data, tmp_path, capfd,
                                                                  change, message):
    folder = broken_copy(data, tmp_path, change)
    line = refused(own_files(folder), tmp_path, capfd)
    names = {"en": folder / "train.en", "fr": folder / "train.fr"}
    assert line == ERROR + message.format(**names)


def test_train_refuses_a_missing_file_in_one_line(data, tmp_path, capfd):
    argv = own_files(data)
    argv[2] = str(tmp_path / "nothing.fr")
    line = refused(argv, tmp_path, capfd)
    assert line == f"{ERROR}{tmp_path / 'nothing.fr'} does not exist"


def test_train_refuses_a_vocabulary_larger_than_the_text_allows(data, tmp_path, capfd):
    line = refused([*own_files(data), "--set", "subwords=20000"], tmp_path, capfd)
    assert line.startswith(ERROR + "subwords=20000 is a larger vocabulary than the 300 "
                           "training pairs allow (at most ")
    most = int(line.split("at most ")[1].split()[0])
    assert line.endswith(f"pieces): lower it, e.g. --set subwords={most}")
    tat.train_sentencepiece([s for f in ("train.en", "train.fr")
                             for s in (data / f).read_text("utf-8").splitlines()],
                            vocab_size=most)  # the size it suggests trains


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", "dropuot=0.3"], "--set dropuot=0.3: TrainConfig has no field 'dropuot' (did you "
     "mean dropout?)"),
    (["--set", "dropout=abc"], "--set dropout=abc: dropout is a number, got 'abc'"),
    (["--set", "dropout=1.5"], "dropout must be in [0, 1), got 1.5"),
    (["--set", "epochs=2.5"], "--set epochs=2.5: epochs is a whole number, got '2.5'"),
    (["--set", "fast=maybe"], "--set fast=maybe: fast is true or false, got 'maybe'"),
    (["--set", "dropout"], "--set 'dropout': expected FIELD=VALUE, e.g. --set dropout=0.3"),
    (["--set", "epochs=3", "--epochs", "4"], "epochs is set twice, by --epochs and by --set: "
     "give it once"),
    (["--config", "nosuch"], "--config: name must be one of "),
    (["--config", "cpu"], "--config cpu has word vocabularies, which need spaCy's German and "
     "English tokenizers; for en-fr choose a subword preset (cpu_subword, cpu_fast_dropout) or "
     "--set subwords=8000"),
], ids=["unknown-field", "not-a-number", "out-of-range", "not-whole", "not-a-bool", "no-value",
        "twice", "unknown-preset", "word-model-for-en-fr"])
def test_train_checks_config_and_set_before_the_run_in_one_line(data, tmp_path, capfd, argv,
                                                                message):
    line = refused([*own_files(data), *argv], tmp_path, capfd)
    assert line.startswith(ERROR + message)


def test_set_reads_each_value_as_its_trainconfig_fields_type():
    assert parse_sets(["dropout=0.3", "epochs=20", "fast=false", "share_embeddings=yes",
                       "train_limit=none", "val_limit=100", "decay=linear"]) == {
        "dropout": 0.3, "epochs": 20, "fast": False, "share_embeddings": True,
        "train_limit": None, "val_limit": 100, "decay": "linear"}
    with pytest.raises(ValueError, match="--set dropout=nan: dropout is a finite number"):
        parse_sets(["dropout=nan"])


# Multi30k's own French and Czech: --langs without --train.

needs_multi30k_french = pytest.mark.skipif(
    not (ENGLISH / "val.en.gz").is_file() or not (FRENCH / "val.fr.gz").is_file(),
    reason=f"Multi30k's English and French files are not in {SHARED}")
LIMITS = ["--set", "train_limit=300", "--set", "val_limit=40"]
SMALL = ["--set", "subwords=400", *LIMITS]


def no_network(*args, **kwargs):
    raise urllib.error.URLError("no network in this test")


@needs_multi30k_french
def test_langs_without_train_reads_that_pair_of_multi30k_without_downloading(monkeypatch):
    from annotated_transformer_cli.train import parse_args, prepare

    monkeypatch.setattr(urllib.request, "urlopen", no_network)  # both folders are on disk
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    config, languages, pairs, _ = prepare(parse_args(["--langs", "en", "fr", *SMALL]), 1)
    assert languages == ("en", "fr")
    assert config.checkpoint_dir == "checkpoints/en-fr_cpu_fast_dropout"
    assert (len(pairs["train"]), len(pairs["val"])) == (29_000, 1_014)
    assert pairs["val"][:3] == list(zip(first_lines(ENGLISH / "val.en.gz", 3),
                                        first_lines(FRENCH / "val.fr.gz", 3), strict=True))


@needs_multi30k_french
def test_langs_de_en_without_train_is_the_default_run():
    from annotated_transformer_cli.train import parse_args, prepare

    given = prepare(parse_args(["--langs", "de", "en", *SMALL]), 1)
    assert given == prepare(parse_args(SMALL), 1)
    assert given[1:] == (("de", "en"), None, [])  # the chapters' own Multi30k path, as it is


@pytest.mark.parametrize("langs", [["en", "es"], ["fr", "fr"]])
def test_langs_without_train_outside_multi30k_is_refused_in_one_line(langs, tmp_path, capfd):
    line = refused(["--langs", *langs], tmp_path, capfd)
    assert line == (f"{ERROR}--langs {' '.join(langs)}: without --train, --langs picks "
                    "a Multi30k pair, two different ones of de, en, fr, cs; for other languages "
                    "give your files with --train and --valid (--help lists the options)")


@needs_multi30k_french
def test_train_langs_en_fr_trains_on_multi30k_english_french(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "annotated_transformer_cli", "train", "--langs", "en", "fr", *TINY,
         *LIMITS, "--epochs", "1",
         "--checkpoint-dir", str(tmp_path / "run")],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    info = json.loads((tmp_path / "run" / "model" / "info.json").read_text("utf-8"))
    assert info["languages"] == {"src": "en", "tgt": "fr"}
    sha256 = info["data"].pop("sha256")  # of the pairs: a finished run knows its text
    assert info["data"] == {"train": "Multi30k train", "valid": "Multi30k val",
                            "train_pairs": 29_000, "valid_pairs": 1_014}
    assert re.fullmatch(r"[0-9a-f]{64}", sha256)


# A refused run loses nothing: every check runs before a file is written or deleted.


def tree_hashes(folder: Path) -> dict[str, str] | None:
    """Every file under folder by its relative path, with its SHA-256 (None: no folder)."""
    if not folder.exists():
        return None
    return {path.relative_to(folder).as_posix(): tat.sha256_of(path) if path.is_file() else "/"
            for path in sorted(folder.rglob("*"))}


@pytest.fixture
def finished(model_dir, tmp_path) -> Path:
    """A copy of the finished two-epoch run (last.pt, best.pt, epoch_NNN.pt, model/)."""
    folder = tmp_path / "finished"
    shutil.copytree(model_dir.parent, folder)
    assert {"last.pt", "best.pt", "epoch_001.pt", "epoch_002.pt", "subwords.model"} <= {
        path.name for path in folder.iterdir()}
    return folder


def tiny_with(*argv: str) -> list[str]:
    """TINY's options with argv after them, less TINY's --set of a field that argv sets."""
    given = {arg.split("=")[0] for arg in argv if "=" in arg}
    pairs = [TINY[i : i + 2] for i in range(0, len(TINY), 2)]
    return [arg for pair in pairs if pair[1].split("=")[0] not in given for arg in pair] + [
        *argv]


def refused_in(folder: Path, argv: list[str], capfd) -> str:
    """The train subcommand's main on folder must stop with status 2 and one error line, the folder
    unchanged byte for byte (or still absent)."""
    from annotated_transformer_cli.train import main

    before = tree_hashes(folder)
    with pytest.raises(SystemExit) as exit_:
        main([*argv, "--checkpoint-dir", str(folder)])
    lines = capfd.readouterr().err.splitlines()  # what the run chose, then the error
    errors = [line for line in lines if line.startswith(ERROR)]
    assert exit_.value.code == 2 and errors == lines[-1:], lines
    assert tree_hashes(folder) == before
    return lines[-1]


@pytest.mark.parametrize(("argv", "message"), [
    (["--overwrite", "--set", "warmup=2000"], "the run would take "),
    (["--overwrite", "--set", "subwords=20000"], "subwords=20000 is a larger vocabulary"),
    (["--overwrite", "--set", "dropout=1.5"], "dropout must be in [0, 1), got 1.5"),
    (["--resume", "--set", "warmup=3"], "cannot resume from "),
    ([], "the checkpoint folder {folder} already holds another run's best.pt, epoch_001.pt, "
     "epoch_002.pt, last.pt: give --resume to continue it, --overwrite to delete its "
     "checkpoints and start afresh, or --checkpoint-dir DIR for another folder (make train: "
     "RESUME=1, OVERWRITE=1, CHECKPOINT_DIR=DIR)"),
], ids=["warm-up-too-long", "vocabulary-too-large", "bad-value", "resume-changed", "no-option"])
def test_a_refused_run_leaves_a_finished_run_byte_for_byte(data, finished, capfd, argv,
                                                           message):
    line = refused_in(finished, [*own_files(data), *tiny_with("--epochs", "3", *argv)], capfd)
    assert line.startswith(ERROR + message.format(folder=finished)), line


def test_a_finished_run_is_answered_with_status_0_only_for_its_own_request(data, finished,
                                                                          tmp_path, capfd):
    """The same request trains nothing and says so; other settings or other sentence pairs
    into that folder would train nothing either, so they are refused, naming the options."""
    from annotated_transformer_cli.train import main

    main([*own_files(data), *TINY, "--checkpoint-dir", str(finished)])  # returns: status 0
    assert "has finished" in capfd.readouterr().err
    line = refused_in(finished, [*own_files(data), *tiny_with("--set", "dropout=0.2")], capfd)
    assert "holds a finished run that differs from this request (dropout=" in line, line
    assert line.endswith("(make train: RESUME=1, OVERWRITE=1, CHECKPOINT_DIR=DIR)"), line
    other = tmp_path / "other"
    shutil.copytree(data, other)
    for language in ("en", "fr"):  # the same number of pairs, one of them changed
        path = other / f"train.{language}"
        path.write_text(path.read_text("utf-8").replace("\n", "\nA ", 1), "utf-8")
    line = refused_in(finished, [*own_files(other), *TINY], capfd)
    assert "other sentence pairs" in line, line


@pytest.mark.parametrize("given", [[], ["--overwrite"]], ids=["as-started", "overwrite"])
def test_a_process_that_torchrun_restarted_continues_the_run_from_its_last_pt(
        data, finished, capfd, monkeypatch, given):
    """torchrun --max-restarts runs the same command again after a process dies, with
    TORCHELASTIC_RESTART_COUNT > 0: the run's last.pt is then continued, neither refused as
    another run's (as the same request is without the count, above) nor deleted by the
    --overwrite that started the run."""
    from annotated_transformer_cli.train import main

    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
                        "TORCHELASTIC_RESTART_COUNT": "1"}.items():
        monkeypatch.setenv(name, value)
    main([*own_files(data), *tiny_with("--epochs", "3", *given), "--checkpoint-dir",
          str(finished)])
    assert f"settings from {finished / 'last.pt'}" in capfd.readouterr().err
    state = tat.load_checkpoint(finished / "last.pt")
    assert state["epoch"] == 3 and [row["epoch"] for row in state["history"]] == [1, 2, 3]


@pytest.mark.parametrize(("argv", "message"), [
    (["--set", "warmup=2000"], "the run would take "),
    (["--resume"], "cannot resume: the checkpoint folder {folder} holds no last.pt"),
], ids=["warm-up-too-long", "resume-nothing"])
def test_a_refused_run_creates_no_folder_and_no_vocabulary(data, tmp_path, capfd, argv, message):
    folder = tmp_path / "new"
    line = refused_in(folder, [*own_files(data), *tiny_with(*argv)], capfd)
    assert line.startswith(ERROR + message.format(folder=folder)), line


# Your own text sized by config_for_corpus: given only --train and --valid.


def test_config_for_corpus_gives_multi30k_the_shipped_recipe_unchanged():
    fields = {name: value for group, _ in tat.config_for_corpus(29_000)
              for name, value in group.items()}
    assert tat.training_config("cpu_fast_dropout", **fields) == tat.training_config(
        "cpu_fast_dropout")


def test_config_for_corpus_moves_each_setting_the_way_chapter_18s_table_does():
    sizes = [50, 400, 2_000, 9_999, 10_000, 29_000, 100_000, 1_000_000, 4_500_000]
    configs = [tat.training_config("cpu_fast_dropout", **{
        name: value for group, _ in tat.config_for_corpus(n) for name, value in group.items()})
        for n in sizes]
    for fewer, more in itertools.pairwise(configs):
        assert fewer.subwords <= more.subwords and fewer.dropout >= more.dropout
        assert (fewer.N, fewer.d_model, fewer.d_ff) <= (more.N, more.d_model, more.d_ff)
        assert fewer.epochs >= more.epochs
    assert configs[1].subwords < 8_000 and configs[1].epochs <= 100
    assert configs[-1].subwords == 32_000 and configs[-1].batch_tokens == 25_000
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="pairs must be a positive integer"):
            tat.config_for_corpus(bad)


@pytest.mark.parametrize("pairs", [50, 400, 9_999, 10_000, 28_999, 29_000, 50_000, 100_000,
                                   999_999, 1_000_000, 4_500_000])
def test_config_for_corpus_keeps_the_papers_peak_rate_and_prints_true_reasons(pairs):
    """The peak, lr_factor x d_model^-0.5 x (warm-up steps)^-0.5, is Multi30k's 6.99e-4 (the
    paper's too) at every size, and each printed reason says what the numbers do there."""
    groups = tat.config_for_corpus(pairs)
    config = tat.config_for_devices(tat.training_config("cpu_fast_dropout", **{
        name: value for group, _ in groups for name, value in group.items()}), 1)
    warmup = tat.schedule_steps(config, batches_per_epoch=10**6, world_size=1)["warmup"]
    peak = tat.rate(warmup, config.d_model, config.lr_factor, warmup)
    assert peak == pytest.approx(6.99e-4, rel=0.01)
    reasons = " ".join(why for _, why in groups)
    assert ("the paper's base model" in reasons) == (config.d_model == 512) == (pairs >= 1_000_000)
    if pairs >= 1_000_000:  # the paper's schedule: 4,000 steps, factor 1
        assert (warmup, config.lr_factor, config.batch_tokens) == (4_000, 1.0, 25_000)
        assert "the paper's 4,000 warm-up steps and factor 1" in reasons
    elif pairs >= 29_000:
        assert config.warmup == 2_000 and "kept, so that it covers a smaller share" in reasons
    else:
        assert config.warmup <= 2_000 and "scaled down with the pairs" in reasons
    assert (config.dropout == 0.3) == (pairs < 10_000) == ("three times" in reasons)


@pytest.mark.parametrize("max_tokens,accum_iter", [(None, None), (4096, None), (8192, None),
                                                   (32768, None), (65536, None), (None, 8),
                                                   (4096, 3), (None, 1)])
def test_a_given_max_tokens_keeps_the_papers_warm_up_steps_and_peak_at_wmt_size(max_tokens,
                                                                                 accum_iter):
    """From a million pairs the sized warm-up is counted in the micro-batches that the run
    takes: --max-tokens (a GPU's larger micro-batch, one above 25,000 cut to the step) or
    --accum-iter (a step of that many micro-batches) keeps 4,000 warm-up steps and the
    paper's peak on one device, and the note says what it counts in."""
    from annotated_transformer_cli.train import sized_settings

    given = {name: value for name, value in (("max_tokens", max_tokens),
                                             ("accum_iter", accum_iter)) if value is not None}
    settings, notes = sized_settings(4_500_000, given)
    config = tat.config_for_devices(tat.training_config("cpu_fast_dropout", **settings, **given),
                                    1)
    warmup = tat.schedule_steps(config, batches_per_epoch=10**6, world_size=1)["warmup"]
    assert warmup == 4_000 and config.lr_factor == 1.0 and config.d_model == 512
    assert tat.rate(warmup, config.d_model, config.lr_factor, warmup) == pytest.approx(
        512**-0.5 * 4_000**-0.5)
    note = " ".join(notes)
    if accum_iter is None:  # the step is 25,000 tokens of the micro-batches the device takes
        micro = "micro-batch" if config.accum_iter == 1 else "micro-batches"
        assert f"25,000 padded tokens a step ({config.accum_iter} {micro} of " \
               f"{config.max_tokens};" in note
        assert config.max_tokens == min(max_tokens or 750, 25_000)
    else:
        assert config.batch_tokens == 0 and config.accum_iter == accum_iter
        assert f"at {accum_iter} micro-batch" in note and "25,000 padded" not in note


@pytest.mark.parametrize("pairs,given,devices,warned", [
    (4_500_000, {"max_tokens": 4096, "accum_iter": 2}, 8, (500, 1.98e-3, 4_000)),
    (4_500_000, {"max_tokens": 4096, "accum_iter": 2}, 1, None),
    (4_500_000, {"max_tokens": 4096}, 8, None),
    (100_000, {"accum_iter": 4}, 1, (500, 1.40e-3, 2_000)),
    (100_000, {}, 8, (250, 1.98e-3, 2_000)),
    (100_000, {}, 1, None), (400, {}, 1, None)])
def test_train_warns_when_devices_or_accum_iter_move_the_sized_warm_up_and_peak(
        pairs, given, devices, warned):
    """The sized reasons hold on one device (and below a million pairs without --accum-iter);
    a run whose step takes more micro-batches than that gets one line with its own warm-up and
    peak, and the --set warmup that brings both back to the aim."""
    from annotated_transformer_cli.train import schedule_warning, sized_settings

    settings, notes = sized_settings(pairs, given)
    config = tat.config_for_devices(tat.training_config("cpu_fast_dropout", **settings, **given),
                                    devices)
    line = schedule_warning(pairs, config, devices, given)
    if warned is None:
        assert line is None
        return
    steps, peak, aim = warned
    assert line.startswith(f"warning: warm-up {steps:,} optimizer steps and peak rate {peak:.3g}, "
                           f"where the sizing aimed at {aim:,} and 0.000699")
    warmup = int(line.rsplit("--set warmup=", 1)[1].split()[0])
    fixed = dataclasses.replace(config, warmup=warmup)  # no batch_tokens: nothing rescales it
    plan = tat.schedule_steps(fixed, batches_per_epoch=10**6, world_size=devices)
    assert plan["warmup"] == aim
    assert tat.rate(aim, fixed.d_model, fixed.lr_factor, aim) == pytest.approx(6.99e-4, rel=0.01)
    assert schedule_warning(pairs, config, devices, given | {"warmup": warmup}) is None
    if pairs < 1_000_000 and "accum_iter" in given:  # the printed reason says its condition
        assert "on one device without accum_iter" in " ".join(notes)


def test_train_says_once_how_many_pairs_are_longer_than_max_len(data, tmp_path, capfd):
    """One line per run, the worker's, with the counts that the run's own subword model gives."""
    import sentencepiece

    from annotated_transformer_cli.parallel_text import read_parallel
    from annotated_transformer_cli.train import main

    folder = tmp_path / "run"
    main([*own_files(data), *tiny_with("--set", "max_len=36", "--max-updates", "1"),
          "--checkpoint-dir", str(folder)])
    out, err = capfd.readouterr()
    lines = [line for line in (out + err).splitlines() if "max_len=36" in line]
    sp = sentencepiece.SentencePieceProcessor(model_file=str(folder / "subwords.model"))
    longer = {split: sum(max(len(sp.encode(src)), len(sp.encode(tgt))) + 2 > 36
                         for src, tgt in read_parallel(*files))
              for split, files in (("train", own_files(data)[1:3]),
                                   ("val", own_files(data)[4:6]))}
    assert 0 < longer["train"] < N_TRAIN
    assert lines == [
        f"left out, longer than max_len=36 tokens with <s> and </s>: {longer['train']} of "
        f"{N_TRAIN} training pairs ({longer['train'] / N_TRAIN:.1%}) and {longer['val']} of "
        f"{N_VAL} validation pairs"], lines


def test_four_hundred_pairs_given_only_train_and_valid_pass_every_check(data, tmp_path):
    """The README's own-data command on 400 pairs: sized, then the worker's own schedule
    check on the batches it would train on, which the recipe's settings fail."""
    from annotated_transformer_cli.train import parse_args, prepare

    folder = tmp_path / "data"
    for language, source in (("en", ENGLISH), ("fr", FRENCH)):
        lines = first_lines(source / f"train.{language}.gz", 400)
        (folder / f"train.{language}").parent.mkdir(exist_ok=True)
        (folder / f"train.{language}").write_text("\n".join(lines) + "\n", "utf-8")
    argv = ["--train", str(folder / "train.en"), str(folder / "train.fr"),
            "--valid", str(data / "val.en.gz"), str(data / "val.fr.gz")]
    config, languages, pairs, notes = prepare(parse_args(argv), 1)
    assert config.checkpoint_dir == "checkpoints/en-fr" and languages == ("en", "fr")
    assert notes[0].startswith("sized for 400 training pairs (config_for_corpus;")
    assert [line.split(":")[0] for line in notes[1:]] == [
        "subwords=1000", "N=2 d_model=256 d_ff=512 h=4", "dropout=0.3",
        "warmup=28 lr_factor=0.0592",
        "epochs=100 bleu_every=10"]
    sp = tat.train_sentencepiece([s for pair in pairs["train"] for s in pair],
                                 vocab_size=config.subwords)
    examples = tat.encode_examples(pairs["train"], sp, sp, (None, None), max_len=config.max_len)
    loader = tat.multi30k_loader(examples, max_tokens=config.max_tokens, shuffle=True,
                                 num_replicas=1, rank=0, seed=0)
    plan = tat.schedule_steps(config, batches_per_epoch=len(loader), world_size=1)
    assert plan["total_steps"] >= 5 * plan["warmup"]  # well past its warm-up
    with pytest.raises(ValueError, match="the run would take"):  # what the recipe would do
        tat.schedule_steps(tat.training_config("cpu_fast_dropout"),
                           batches_per_epoch=len(loader), world_size=1)
    given = prepare(parse_args([*argv, "--config", "cpu_fast_dropout", "--set", "subwords=999"]),
                    1)  # a preset as it is, but for what --set changes
    assert (given[0].subwords, given[0].epochs, given[0].dropout, given[3]) == (999, 11, 0.1, [])
    given = prepare(parse_args([*argv, "--set", "dropout=0.2", "--epochs", "150"]), 1)
    assert (given[0].dropout, given[0].epochs, given[0].subwords) == (0.2, 150, 1000)
    assert [line.split(":")[0] for line in given[3][1:]][-2:] == ["warmup=28 lr_factor=0.0592",
                                                                "bleu_every=10"]


# What a user types after training: resume without repeating the settings, evaluate without
# a results file or with the shipped model.


def test_resume_takes_the_runs_settings_from_its_checkpoint_without_set(data, finished, capfd):
    from annotated_transformer_cli.main import command_name
    from annotated_transformer_cli.train import main

    main([*own_files(data), "--resume", "--epochs", "3", "--threads", "1",
          "--checkpoint-dir", str(finished)])  # none of TINY's --set options repeated
    err = capfd.readouterr().err
    assert f"settings from {finished / 'last.pt'}, with the options given now (epochs" in err
    state = tat.load_checkpoint(finished / "last.pt")
    assert state["epoch"] == 3
    assert (state["config"]["d_model"], state["config"]["subwords"]) == (32, 400)
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"model folder {finished / 'model'} (epochs 2, 3 averaged); translate "
                           f"with: {command_name()} translate --checkpoint {finished / 'model'} "
                           "< sentences.en; score with: ")
    assert last.endswith(f"{command_name()} evaluate --model {finished / 'model'} --test SRC_FILE "
                         "REF_FILE")


def test_evaluate_needs_only_a_model_and_a_test_set(data, model_dir, capfd):
    load_tool("evaluate").main(["--model", str(model_dir), "--test", str(data / "val.en.gz"),
                                str(data / "val.fr.gz")])
    err = "".join(capfd.readouterr())  # tqdm.write prints the scores on stdout
    assert f"{model_dir}" in err and "val: BLEU" in err and "chrF" in err


def test_evaluate_without_a_model_scores_the_shipped_one(tmp_path, capfd):
    for language in ("de", "en"):
        lines = first_lines(ENGLISH / f"val.{language}.gz", 3)
        (tmp_path / f"three.{language}").write_text("\n".join(lines) + "\n", "utf-8")
    load_tool("evaluate").main(["--test", str(tmp_path / "three.de"), str(tmp_path / "three.en")])
    err = "".join(capfd.readouterr())
    assert f"{tat.BEST_SHIPPED_MODEL} greedy" in " ".join(err.split())
    assert "three: BLEU" in err and not list(tmp_path.glob("*.json"))  # printed, not stored
