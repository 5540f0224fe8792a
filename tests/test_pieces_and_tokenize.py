"""Real corpora in `annotated-transformer translate` and `evaluate`: a long line of text without
spaces split by the model's own pieces, a source read up to the model's own max_len, and BLEU
with the sacreBLEU tokenizer a language needs (recorded in its signature)."""

import io
import json
import random
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from sacrebleu.metrics import BLEU, CHRF

from annotated_transformer_cli import evaluate as evaluate_cli
from annotated_transformer_cli import translate as translate_cli
from the_annotated_transformer import (
    SUBWORD_FILE,
    TrainConfig,
    beam_translate,
    bleu,
    make_model,
    train_sentencepiece,
)

# A made-up script of 60 CJK characters, written without spaces like Chinese.
CHARACTERS = [chr(0x4E00 + i) for i in range(60)]
ENDS = "。！？"


def sentence(rng: random.Random) -> str:
    """4 to 15 characters and a comma or a sentence's end."""
    return "".join(rng.choices(CHARACTERS, k=rng.randint(4, 15))) + rng.choice("，" + ENDS)


def no_space_lines(n: int, seed: int) -> list[str]:
    """n lines of 1 to 4 such sentences, the same for the same seed."""
    rng = random.Random(seed)
    return ["".join(sentence(rng) for _ in range(rng.randint(1, 4))) for _ in range(n)]


def long_line(seed: int, length: int = 300) -> str:
    rng = random.Random(seed)
    text = ""
    while len(text) < length:
        text += sentence(rng)
    return text[:length]


@pytest.fixture(scope="module")
def sp():
    """A sentencepiece model of the made-up script: one piece per character (and a few merges),
    256 byte pieces for anything else."""
    return train_sentencepiece(no_space_lines(300, seed=0), vocab_size=330)


def model_folder(folder: Path, sp, *, max_len: int = 72) -> Path:
    """An untrained subword model as `annotated-transformer train` leaves one: model.pt holding
    its weights and configuration, subwords.model beside it."""
    folder.mkdir()
    config = TrainConfig(N=1, d_model=16, d_ff=32, h=2, dropout=0.0, subwords=len(sp),
                         share_embeddings=True, max_len=max_len)
    torch.manual_seed(0)
    model = make_model(len(sp), len(sp), N=1, d_model=16, d_ff=32, h=2, dropout=0.0,
                       share_embeddings=True)
    torch.save({"model": model.state_dict(), "config": asdict(config)}, folder / "model.pt")
    (folder / SUBWORD_FILE).write_bytes(sp.serialized_model_proto())
    return folder


def translate(folder: Path, text: str) -> tuple[int, list[str]]:
    out = io.StringIO()
    status = translate_cli.main(["--checkpoint", str(folder), "--beam", "1"],
                                stdin=io.BytesIO(text.encode()), stdout=out)
    return status, out.getvalue().split("\n")[:-1]


def expected(folder: Path, parts: list[str], *, max_len: int) -> str:
    """The CLI's decoding of the parts, joined."""
    from the_annotated_transformer import load_trained_model

    model, vocab_src, vocab_tgt, _ = load_trained_model(folder)
    outputs = translate_cli.beam_decode(model, parts, vocab_src, vocab_tgt, None,
                                        max_len=max_len, beam_size=1, alpha=0.6, use_cache=True)
    return translate_cli.join_outputs(outputs)


# Piece-based splitting


def test_a_300_character_line_without_spaces_is_split_by_pieces_at_sentence_ends(sp):
    line = long_line(seed=1)
    assert " " not in line and len(sp.encode(line)) > 200
    parts = translate_cli.split_pieces(line, sp, 70)
    assert "".join(parts) == line  # nothing lost, nothing added
    assert len(parts) >= 4 and all(len(sp.encode(part)) <= 70 for part in parts)
    assert all(part[-1] in ENDS for part in parts[:-1])  # each cut after a sentence's end


def test_without_a_sentence_end_the_cut_falls_after_a_comma_then_anywhere(sp):
    rng = random.Random(2)
    commas = "".join("".join(rng.choices(CHARACTERS, k=8)) + "，" for _ in range(20))
    parts = translate_cli.split_pieces(commas, sp, 30)
    assert "".join(parts) == commas and all(len(sp.encode(p)) <= 30 for p in parts)
    assert all(part.endswith("，") for part in parts[:-1])
    plain = "".join(rng.choices(CHARACTERS, k=200))  # no punctuation at all
    parts = translate_cli.split_pieces(plain, sp, 30)
    assert "".join(parts) == plain and all(len(sp.encode(p)) <= 30 for p in parts)


def test_a_character_spelled_in_byte_pieces_is_never_cut(sp):
    line = "가나다라마바사" * 10  # Hangul, unseen: three byte pieces per character
    assert len(sp.encode(line)) > 3 * len(line)
    for limit in (4, 5, 7, 11):
        parts = translate_cli.split_pieces(line, sp, limit)
        assert "".join(parts) == line and all(len(sp.encode(p)) <= limit for p in parts)


def test_translate_splits_a_no_space_line_by_pieces_and_writes_one_line(sp, tmp_path, capsys):
    folder = model_folder(tmp_path / "model", sp)
    line = long_line(seed=3)
    status, lines = translate(folder, f"{line}\n")
    parts = translate_cli.split_pieces(line, sp, 70)
    assert status == 0 and len(parts) >= 4
    assert lines == [expected(folder, parts, max_len=72)]  # every part translated, one line
    assert (f"line 1 has {len(sp.encode(line))} tokens, more than the 70 that translation "
            f"reads at once: translated in {len(parts)} pieces") in capsys.readouterr().err


def test_join_outputs_puts_no_space_beside_chinese_or_japanese():
    assert translate_cli.join_outputs(["A dog runs.", "", "It jumps."]) == "A dog runs. It jumps."
    joined = translate_cli.join_outputs(["狗在跑。", "它跳了。", "ボール"])
    assert joined == "狗在跑。它跳了。ボール"


# The model's own max_len


def test_translate_reads_a_source_up_to_the_models_own_max_len(sp, tmp_path, capsys):
    line = long_line(seed=4, length=100)
    pieces = len(sp.encode(line))
    assert 70 < pieces <= 118
    longer = model_folder(tmp_path / "longer", sp, max_len=120)
    status, lines = translate(longer, f"{line}\n")
    assert status == 0 and lines == [expected(longer, [line], max_len=120)]  # read whole
    assert "translated in" not in capsys.readouterr().err
    shorter = model_folder(tmp_path / "shorter", sp, max_len=40)
    status, lines = translate(shorter, f"{line}\n")
    parts = translate_cli.split_pieces(line, sp, 38)
    assert status == 0 and lines == [expected(shorter, parts, max_len=40)]
    assert f"more than the 38 that translation reads at once: translated in {len(parts)}" in (
        capsys.readouterr().err)


def test_beam_decode_at_translates_max_len_is_chapter_15s_beam_translate(sp, tmp_path):
    from the_annotated_transformer import load_trained_model

    folder = model_folder(tmp_path / "model", sp)
    model, vocab, _, _ = load_trained_model(folder)
    sources = [long_line(seed=5, length=100), "一二三。", ""]
    assert translate_cli.beam_decode(model, sources, vocab, vocab, None, max_len=72,
                                     beam_size=2) == beam_translate(
        model, sources, vocab, vocab, None, beam_size=2)


# Scoring: sacreBLEU's tokenizer


@pytest.fixture(scope="module")
def test_set(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("test_set")
    source, reference = folder / "test.zz", folder / "test.zh"
    source.write_text("\n".join(no_space_lines(6, seed=6)) + "\n", "utf-8")
    reference.write_text("\n".join(no_space_lines(6, seed=7)) + "\n", "utf-8")
    return source, reference


def evaluated(folder: Path, test_set: tuple[Path, Path], results: Path, *extra: str) -> dict:
    evaluate_cli.main(["--model", f"zz-zh={folder}", "--test", *map(str, test_set),
                       "--results", str(results), "--keep-outputs", *extra])
    [entry] = json.loads(results.read_text("utf-8"))["results"]
    return entry


def test_evaluate_tokenize_zh_is_in_the_signature_and_leaves_chrf_unchanged(sp, tmp_path,
                                                                           test_set, capsys):
    folder = model_folder(tmp_path / "model", sp)
    default = evaluated(folder, test_set, tmp_path / "13a.json")
    chinese = evaluated(folder, test_set, tmp_path / "zh.json", "--tokenize", "zh")
    references = test_set[1].read_text("utf-8").splitlines()
    assert chinese["outputs"] == default["outputs"]
    assert "|tok:13a|" in default["signature"] and "|tok:zh|" in chinese["signature"]
    # the default is the book's bleu; zh is sacreBLEU's with that tokenizer
    assert (default["bleu"], default["signature"]) == (
        round(bleu(default["outputs"], references)[0], 2), bleu(default["outputs"], references)[1])
    assert chinese["bleu"] == round(
        BLEU(tokenize="zh").corpus_score(chinese["outputs"], [references]).score, 2)
    assert chinese["chrf"] == default["chrf"] == round(
        CHRF().corpus_score(default["outputs"], [references]).score, 2)
    assert f"signatures: BLEU {chinese['signature']}, chrF" in capsys.readouterr().out


def test_evaluate_refuses_a_tokenizer_whose_package_is_missing_before_translating(
        tmp_path, test_set, monkeypatch, capfd):
    import sacrebleu.tokenizers.tokenizer_ja_mecab as ja_mecab

    monkeypatch.setattr(ja_mecab, "MeCab", None)  # as where mecab-python3 is not installed

    def no_model(*args, **kwargs):
        raise AssertionError("no model is loaded before the tokenizer is checked")

    monkeypatch.setattr(evaluate_cli, "load_trained_model", no_model)
    results = tmp_path / "results.json"
    with pytest.raises(SystemExit) as exit_:
        evaluate_cli.main(["--model", str(tmp_path / "model"), "--test", *map(str, test_set),
                           "--tokenize", "ja-mecab", "--results", str(results)])
    assert exit_.value.code == 2 and not results.exists()
    assert capfd.readouterr().err.splitlines() == [
        "annotated-transformer evaluate: error: --tokenize ja-mecab needs packages that are "
        "not installed here: pip install mecab-python3 ipadic"]


def test_evaluate_reads_a_source_up_to_the_models_own_max_len(sp, tmp_path, test_set, capfd):
    folder = model_folder(tmp_path / "model", sp, max_len=40)
    source, reference = tmp_path / "long.zz", tmp_path / "long.zh"
    source.write_text(f"{long_line(seed=8, length=60)}\n一二三。\n", "utf-8")
    reference.write_text("一二三。\n四五六。\n", "utf-8")
    evaluate_cli.main(["--model", str(folder), "--test", str(source), str(reference)])
    assert "1 of 2 long sources are longer than 38 tokens and are cut there" in (
        capfd.readouterr().err)


def test_evaluate_help_says_chrf_ignores_the_tokenizer(capsys):
    with pytest.raises(SystemExit):
        evaluate_cli.main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "chrF reads characters and is the same with any of them" in help_text
