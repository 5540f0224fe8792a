"""`annotated-transformer translate` as a user meets it: odd input bytes, long lines, bad flags, bad
files."""

import io
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from annotated_transformer_cli import translate as translate_cli
from the_annotated_transformer import (
    BEST_SHIPPED_MODEL,
    beam_translate,
    load_tokenizers,
    load_trained_model,
    shipped_model_dir,
    tokenize,
)

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, "-m", "annotated_transformer_cli", "translate"]


def run_main(args: list[str], data: bytes) -> tuple[int, list[str]]:
    """The translate subcommand's main in this process: its exit status and its output lines."""
    out = io.StringIO()
    status = translate_cli.main(args, stdin=io.BytesIO(data), stdout=out)
    text = out.getvalue()
    assert text == "" or text.endswith("\n")
    return status, text.split("\n")[:-1]


def run_script(args: list[str], data: bytes = b"Ein Hund.\n") -> subprocess.CompletedProcess:
    return subprocess.run([*COMMAND, *args], input=data,
                          capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def greedy():
    """Greedy translations by the model the script uses, for comparing with its output."""
    model, vocab_src, vocab_tgt, _ = load_trained_model(name=BEST_SHIPPED_MODEL)

    def translations(sentences: list[str]) -> list[str]:
        return beam_translate(model, sentences, vocab_src, vocab_tgt, load_tokenizers()[0],
                              beam_size=1)

    translations.vocab_src = vocab_src  # the script counts a line's tokens with it
    return translations


def test_translate_gives_one_line_per_input_line_through_a_bom_crlf_bad_bytes_and_empty_lines(
    greedy, capsys
):
    data = (b"\xef\xbb\xbfEin Hund rennt.\r\n\r\nEin \xff Mann.\n\nZwei Hunde spielen im Schnee.")
    status, lines = run_main(["--beam", "1"], data)
    expected = greedy(["Ein Hund rennt.", "Zwei Hunde spielen im Schnee."])
    assert status == 0
    assert lines == [expected[0], "", "", "", expected[1]]  # the BOM and the CR are gone
    errors = capsys.readouterr().err
    assert "line 3 is not valid UTF-8 (byte 0xff at column 5): its output line is empty" in errors


def test_translate_stops_at_an_undecodable_line_when_asked(capsys):
    status, lines = run_main(["--stop-on-bad-input"], b"Ein Hund.\n\xc3\x28\n")
    assert status == 2 and lines == []
    assert "line 2 is not valid UTF-8 (byte 0xc3 at column 1): stopping" in capsys.readouterr().err


def test_translate_splits_a_500_token_line_and_says_so(greedy, capsys):
    line = " ".join(["Ein Hund rennt."] * 125)

    def count(text: str) -> int:  # the shipped model's subword pieces
        return len(greedy.vocab_src.encode(text))

    status, lines = run_main(["--beam", "1"], f"Ein Mann.\n{line}\n".encode())
    assert status == 0 and len(lines) == 2
    assert lines[0] == greedy(["Ein Mann."])[0]
    pieces = translate_cli.split_pieces(line, greedy.vocab_src, 70)  # as the command splits
    assert len(pieces) > 5 and all(count(piece) <= 70 for piece in pieces)
    assert " ".join(pieces) == line and all(piece.endswith(".") for piece in pieces)
    assert lines[1] == " ".join(greedy(pieces))  # every piece translated, none dropped
    assert (f"line 2 has {count(line)} tokens, more than the 70 that translation reads at "
            f"once: translated in {len(pieces)} pieces") in capsys.readouterr().err


def test_split_long_keeps_every_token_and_each_piece_within_the_limit():
    german = load_tokenizers()[0]
    tokens = tokenize("Der Mann (z. B. ein Koch) trägt 3,5 kg Äpfel - und lacht! " * 20, german)
    pieces = translate_cli.split_long(tokens, 9, lambda text: len(tokenize(text, german)))
    assert [t for piece in pieces for t in tokenize(piece, german)] == tokens
    assert all(len(tokenize(piece, german)) <= 9 for piece in pieces)


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--beam", "0", "argument --beam: 0 is less than 1"),
    ("--batch-size", "0", "argument --batch-size: 0 is less than 1"),
    ("--alpha", "x", "argument --alpha: 'x' is not a number"),
])
def test_translate_rejects_a_bad_flag_in_one_line(flag, value, message):
    result = run_script([flag, value])
    errors = result.stderr.decode().splitlines()
    assert result.returncode == 2 and result.stdout == b""
    assert errors == [
        f"annotated-transformer translate: error: {message} (--help lists the options)"]


def test_translate_reports_a_missing_checkpoint_in_one_line(tmp_path):
    result = run_script(["--checkpoint", str(tmp_path / "nothing.pt")])
    assert result.returncode == 2 and result.stdout == b""
    assert result.stderr.decode().splitlines() == [
        f"annotated-transformer translate: checkpoint {tmp_path / 'nothing.pt'} does not exist"
    ]


def test_translate_reports_a_truncated_checkpoint_in_one_line(tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(shipped_model_dir(), folder)
    weights = folder / "model.pt"
    weights.write_bytes(weights.read_bytes()[:1000])
    result = run_script(["--checkpoint", str(folder)])
    errors = result.stderr.decode().splitlines()
    assert result.returncode == 2 and result.stdout == b""
    assert len(errors) == 1 and "Traceback" not in result.stderr.decode()
    assert errors[0].startswith(
        f"annotated-transformer translate: checkpoint {weights} is truncated or corrupted")
