"""Subword vocabularies for real corpora (appendix_data): sentencepiece trained on a seeded sample
of at most subword_sentences sentences, with character_coverage, and with share_vocab=False one
model per language, which a run saves, resumes from, ships, loads and translates with."""

import io
import re
from dataclasses import replace
from pathlib import Path

import pytest
from tiny_training import synthetic_sentence_pairs

import the_annotated_transformer as tat
from annotated_transformer_cli import train as train_cli
from annotated_transformer_cli import translate as translate_cli

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "multi30k"
# English letters written in Greek ones: a target side in another script than the German source
GREEK = str.maketrans("abcdefghiklmnoprstuwxyz", "αβψδεφγηικλμνοπρστυωξυζ")
PAIRS = {split: [(de, en.translate(GREEK)) for de, en in synthetic_sentence_pairs(n, seed)]
         for split, n, seed in (("train", 240, 0), ("val", 40, 1))}
TINY = tat.TrainConfig(N=1, d_model=32, d_ff=64, h=4, dropout=0.1, max_tokens=300, epochs=1,
                       warmup=5, subwords=320, bleu_every=1)
RUN = {"progress": False, "threads": 1, "pairs": PAIRS}


@pytest.fixture
def trainer_calls(monkeypatch) -> list[dict]:
    """What each sentencepiece training is given: its options and how many sentences it reads."""
    import sentencepiece as spm

    calls, real = [], spm.SentencePieceTrainer.train

    def counting(**options):
        sentences = list(options.pop("sentence_iterator"))
        calls.append(options | {"sentences": sentences})
        return real(sentence_iterator=iter(sentences), **options)

    monkeypatch.setattr(spm.SentencePieceTrainer, "train", counting)
    return calls


def test_a_sample_holds_at_most_k_sentences_in_the_order_of_the_text():
    text = [f"sentence {i}" for i in range(1000)]
    sample = tat.sample_sentences(iter(text), 50, seed=3)
    assert len(sample) == 50 == len(set(sample))
    assert sample == sorted(sample, key=text.index)  # the text's order
    assert sample == tat.sample_sentences(text, 50, seed=3)  # the seed draws it
    assert sample != tat.sample_sentences(text, 50, seed=4)
    assert sample[-1] != text[49]  # not merely the first 50
    assert tat.sample_sentences(["a", "", "b", "c"], 3, seed=0) == ["a", "b", "c"]  # all: as is
    with pytest.raises(TypeError, match="only strings"):
        tat.sample_sentences(["a", 5], 3)


def test_sentencepiece_sees_at_most_subword_sentences_sentences(trainer_calls):
    config = replace(TINY, subword_sentences=100)
    sp, same = tat.multi30k_vocabularies(config, (None, None), pairs=PAIRS["train"], save=False)
    assert sp is same and len(sp) == 320
    [call] = trainer_calls
    assert len(call["sentences"]) == 100  # of 480 sentences on the two sides
    everything = [s for pair in PAIRS["train"] for s in pair]
    assert set(call["sentences"]) <= set(everything)
    tat.multi30k_vocabularies(replace(TINY, subword_sentences=480), (None, None),
                              pairs=PAIRS["train"], save=False)
    assert trainer_calls[1]["sentences"] == everything  # under the cap: all, in order


def test_the_defaults_train_chapter_17s_model_byte_for_byte():
    sentences = [s for pair in PAIRS["train"] for s in pair]
    chapter_17 = tat.train_sentencepiece(sentences, vocab_size=400)
    assert (tat.train_subword_model(sentences, vocab_size=400).serialized_model_proto()
            == chapter_17.serialized_model_proto())
    assert (tat.TrainConfig().subword_sentences
            == tat.train_subword_model.__kwdefaults__["max_sentences"])


def test_multi30k_gets_the_shipped_subword_model_unchanged():
    shipped = ROOT / "book" / "models" / tat.BEST_SHIPPED_MODEL / tat.SUBWORD_FILE
    if not (SHARED / "train.de.gz").is_file() or not shipped.is_file():
        pytest.skip("Multi30k or the shipped model is not on this machine")
    config = tat.training_config(tat.SHIPPED_PRESETS[tat.BEST_SHIPPED_MODEL])
    sp, _ = tat.multi30k_vocabularies(config, (None, None), save=False)
    assert sp.serialized_model_proto() == shipped.read_bytes()


def test_character_coverage_reaches_sentencepiece_and_leaves_rare_characters_to_bytes(
        trainer_calls):
    rare = [("Ein Hund läuft.", "ψ Ωmega ϗ"), ("Der Mann ß.", "ϡ ϰ Ϡ")]
    pairs = PAIRS["train"] + rare
    models = [tat.multi30k_vocabularies(replace(TINY, subwords=350, character_coverage=c),
                                        (None, None), pairs=pairs, save=False)[0]
              for c in (1.0, 0.995)]
    assert [call["character_coverage"] for call in trainer_calls] == [1.0, 0.995]
    pieces = [{sp.id_to_piece(i) for i in range(len(sp))} for sp in models]
    assert "ϗ" in pieces[0] and "ϗ" not in pieces[1]  # seen once: no piece of its own at 0.995
    assert models[1].decode(models[1].encode("ϗ Ϡ")) == "ϗ Ϡ"  # spelled in bytes, not lost
    with pytest.raises(ValueError, match=r"character_coverage must be a number in \(0, 1\]"):
        tat.TrainConfig(character_coverage=0)
    assert train_cli.parse_sets(["character_coverage=0.9995"]) == {"character_coverage": 0.9995}


def test_separate_vocabularies_are_trained_each_on_its_own_side_and_saved(tmp_path):
    config = replace(TINY, share_vocab=False, checkpoint_dir=str(tmp_path))
    vocab_src, vocab_tgt = tat.multi30k_vocabularies(config, (None, None), pairs=PAIRS["train"])
    assert vocab_src is not vocab_tgt and len(vocab_src) == len(vocab_tgt) == 320
    for sp, own, other in ((vocab_src, "a", "α"), (vocab_tgt, "α", "a")):
        pieces = [sp.id_to_piece(i) for i in range(len(tat.SPECIALS), len(sp)) if not sp.is_byte(i)]
        assert any(own in piece for piece in pieces)
        assert not any(other in piece for piece in pieces)  # nothing of the other side's text
    assert sorted(p.name for p in tmp_path.iterdir()) == list(tat.SUBWORD_FILES)
    read_src, read_tgt = tat.read_run_vocabularies(tmp_path, config)
    de, greek = PAIRS["val"][0]
    assert read_src.encode(de) == vocab_src.encode(de)
    assert read_tgt.encode(greek) == vocab_tgt.encode(greek)
    (tmp_path / tat.SUBWORD_FILES[1]).unlink()
    with pytest.raises(FileNotFoundError, match="subwords_tgt.model"):
        tat.read_run_vocabularies(tmp_path, config)


@pytest.fixture
def own_files(tmp_path) -> list[str]:
    """--train and --valid for PAIRS, German and Greek-lettered English, as plain files."""
    for name, split in (("train", "train"), ("valid", "val")):
        for language, side in (("de", 0), ("el", 1)):
            lines = [pair[side] for pair in PAIRS[split]]
            (tmp_path / f"{name}.{language}").write_text("\n".join(lines) + "\n", "utf-8")
    return ["--train", str(tmp_path / "train.de"), str(tmp_path / "train.el"),
            "--valid", str(tmp_path / "valid.de"), str(tmp_path / "valid.el")]


def test_separate_vocabularies_cannot_share_embeddings_and_the_command_unties_them(
        own_files, tmp_path):
    with pytest.raises(ValueError, match="share_vocab=False gives two"):
        tat.TrainConfig(subwords=320, share_embeddings=True, share_vocab=False)
    assert tat.training_config("cpu_fast_dropout").share_embeddings  # tied in the recipe
    given = ["--set", "share_vocab=false", "--set", "subwords=320",
             "--checkpoint-dir", str(tmp_path / "run")]
    config = train_cli.prepare(train_cli.parse_args(own_files + given), 1)[0]
    assert not config.share_vocab and not config.share_embeddings
    assert not (tmp_path / "run").exists()  # checked and trained, nothing written yet


def test_a_run_with_separate_vocabularies_resumes_ships_loads_and_translates(tmp_path):
    config = replace(TINY, share_vocab=False, checkpoint_dir=str(tmp_path / "run"))
    tat.train_worker(0, 1, config, **RUN)
    run = tmp_path / "run"
    assert {*tat.SUBWORD_FILES} <= {p.name for p in run.iterdir()}
    assert not (run / tat.SUBWORD_FILE).exists()
    history = tat.train_worker(0, 1, replace(config, epochs=2), resume=True, **RUN)
    assert [r["epoch"] for r in history] == [1, 2]  # resumed with the two models read back
    tat.export_for_shipping(run / "last.pt", tmp_path / "ship")
    assert {p.name for p in (tmp_path / "ship").iterdir()} >= {*tat.SUBWORD_FILES, "model.pt"}
    model, vocab_src, vocab_tgt, loaded = tat.load_trained_model(tmp_path / "ship")
    assert not loaded.share_vocab and vocab_src is not vocab_tgt
    assert model.src_embed[0].lut.weight is not model.tgt_embed[0].lut.weight
    out = io.StringIO()
    status = translate_cli.main(["--checkpoint", str(tmp_path / "ship"), "--beam", "2"],
                                stdin=io.BytesIO(PAIRS["val"][0][0].encode() + b"\n"), stdout=out)
    assert status == 0
    [line] = out.getvalue().splitlines()
    assert line.strip() and not any(ch in line for ch in "abcdefghiklmnoprstuwxyz")  # Greek


@pytest.mark.parametrize("share_vocab", [True, False])
def test_the_command_trains_each_vocabulary_once_and_the_run_uses_it(own_files, tmp_path,
                                                                      trainer_calls, share_vocab):
    tiny = ["--config", "cpu_fast_dropout", "--set", "N=1", "--set", "d_model=32", "--set",
            "d_ff=64", "--set", "h=2", "--set", "subwords=320", "--set", "warmup=2", "--set",
            "max_tokens=300", "--set", f"share_vocab={share_vocab}", "--epochs", "1",
            "--threads", "1", "--checkpoint-dir", str(tmp_path / "run")]
    train_cli.main(own_files + tiny)
    files = (tat.SUBWORD_FILE,) if share_vocab else tat.SUBWORD_FILES
    # the check, the count of long pairs and the run share one training per model
    assert len(trainer_calls) == len(files)
    saved = [(tmp_path / "run" / name).read_bytes() for name in files]
    assert [(tmp_path / "run" / "model" / name).read_bytes() for name in files] == saved


def test_own_text_with_separate_vocabularies_is_sized_to_fit_each_side(tmp_path, capfd):
    """300 German and Greek-lettered pairs without --config: config_for_corpus's 1,000 subwords
    are more than either side can give, and each side allows another size, so the run takes
    the size both sides allow, says so, and trains (one update, a tiny model)."""
    pairs = [(de, en.translate(GREEK)) for de, en in synthetic_sentence_pairs(300, 0)]
    files = []
    for name, split in (("train", pairs), ("valid", PAIRS["val"])):
        for language, side in (("de", 0), ("el", 1)):
            path = tmp_path / f"{name}.{language}"
            path.write_text("\n".join(pair[side] for pair in split) + "\n", "utf-8")
            files.append(str(path))
    run = tmp_path / "run"
    train_cli.main(["--train", *files[:2], "--valid", *files[2:], "--set", "share_vocab=false",
                    "--set", "N=1", "--set", "d_model=32", "--set", "d_ff=64", "--set", "h=2",
                    "--max-updates", "1", "--threads", "1", "--checkpoint-dir", str(run)])
    err = capfd.readouterr().err
    [note] = [line.strip() for line in err.splitlines() if "the nearest size to 1000" in line]
    size = int(re.match(r"subwords=(\d+): ", note)[1])
    assert note == (f"subwords={size}: the nearest size to 1000 that the 300 training pairs "
                    "allow on both sides (share_vocab=False: a vocabulary of this size for "
                    "each language)")
    config = tat.load_checkpoint(run / "last.pt")["config"]
    assert (config["subwords"], config["share_vocab"], config["share_embeddings"]) == (
        size, False, False)
    models = tat.read_run_vocabularies(run, tat.TrainConfig(**config))
    assert [len(sp) for sp in models] == [size, size]
    sides = [[pair[side] for pair in pairs] for side in (0, 1)]
    limits = []  # the largest size that each side's text allows, as sentencepiece says it
    for text in sides:
        with pytest.raises(ValueError, match=r"value <= \d+") as refused:
            tat.train_subword_model(text, vocab_size=1000)
        limits.append(int(re.search(r"value <= (\d+)", str(refused.value))[1]))
    assert limits[0] != limits[1] and size == min(limits)  # the smaller side decides
    assert (run / "model" / tat.SUBWORD_FILES[1]).is_file()  # a finished (stopped) run


def test_a_given_subword_size_too_large_for_one_side_names_the_size_both_allow(tmp_path,
                                                                              capfd):
    from annotated_transformer_cli.train import parse_args, prepare

    pairs = [(de, en.translate(GREEK)) for de, en in synthetic_sentence_pairs(300, 0)]
    files = []
    for name, split in (("train", pairs), ("valid", PAIRS["val"])):
        for language, side in (("de", 0), ("el", 1)):
            path = tmp_path / f"{name}.{language}"
            path.write_text("\n".join(pair[side] for pair in split) + "\n", "utf-8")
            files.append(str(path))
    argv = ["--train", *files[:2], "--valid", *files[2:], "--set", "share_vocab=false",
            "--set", "subwords=1000", "--checkpoint-dir", str(tmp_path / "run")]
    with pytest.raises(SystemExit) as stopped:
        prepare(parse_args(argv), 1)
    [line] = capfd.readouterr().err.splitlines()
    assert stopped.value.code == 2
    most = int(re.search(r"--set subwords=(\d+)$", line)[1])
    assert "(at most" in line and "for each language, share_vocab=False)" in line
    config = prepare(parse_args([*argv[:-4], "--set", f"subwords={most}", *argv[-2:]]), 1)[0]
    assert config.subwords == most  # the size it names is taken by both sides
    assert not (tmp_path / "run").exists()


def test_the_sized_settings_note_leaves_out_what_a_given_field_makes_untrue():
    """--set bleu_every=0: no 'validation BLEU every N epoch(s)' in the note, the given value
    named; a given warm-up leaves lr_factor without its 'peak rate' reason."""
    settings, notes = train_cli.sized_settings(300, {"bleu_every": 0})
    assert "bleu_every" not in settings and not any("validation BLEU" in n for n in notes)
    assert notes[-1].startswith(f"epochs={settings['epochs']}: ")
    assert notes[-1].endswith("; given: bleu_every=0")
    _, plain = train_cli.sized_settings(300, {})
    assert "validation BLEU every" in plain[-1]  # said when it holds
    settings, notes = train_cli.sized_settings(300, {"warmup": 100})
    [line] = [n for n in notes if n.startswith("lr_factor=")]
    assert "peak rate" not in line and line.endswith("given: warmup=100")
    _, notes = train_cli.sized_settings(300, {"epochs": 5})
    assert notes[-1].startswith("bleu_every=") and "times a run" not in notes[-1]
