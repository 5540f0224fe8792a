"""Translate with a trained model: one sentence per line on stdin, one line per line on stdout.

    echo "Zwei Hunde spielen im Schnee." | annotated-transformer translate
    annotated-transformer translate --checkpoint checkpoints/multi30k_cpu/last.pt < de.txt > en.txt
    annotated-transformer translate --checkpoint checkpoints/en-fr_cpu_fast_dropout/model < en.txt
    annotated-transformer translate --beam 1 < de.txt > en.txt   # greedy decoding

Only translations go to stdout, exactly one line for each input line (an empty line stays
empty); messages go to stderr. Input is read as bytes: a byte-order mark is dropped, CRLF line
endings are accepted, and a line that is not valid UTF-8 is reported by its number and gives an
empty output line (--stop-on-bad-input stops instead, with nothing written). A line longer than
the model reads at once (its config.max_len tokens, less <s> and </s>) is split into pieces,
translated piece by piece, and reported: a subword model's line is cut between its own pieces,
after a sentence's end where it can, so text without spaces (Chinese, Japanese) splits too.
By default the book's best shipped model (BEST_SHIPPED_MODEL: chapter 21's half-hour subword
model in book/models/multi30k_cpu_fast_dropout) translates German to English; --checkpoint takes
a folder from export_for_shipping or `annotated-transformer train` (which translates the
languages its info.json names: a subword model needs no tokenizer of its languages) or a model.pt
or last.pt file with its vocabularies beside it (vocab_de.json and vocab_en.json, subwords.model,
or subwords_src.model and subwords_tgt.model for a run with share_vocab=False).
Decoding is the paper's beam search (beam 4, length penalty alpha 0.6; chapter 15) with chapter
21's key/value cache; --beam 1 gives greedy decoding. A user error (a bad flag, a missing or
corrupt checkpoint, bad input with --stop-on-bad-input) ends with one line on stderr and exit
status 2, as in the other subcommands.
"""

import argparse
import contextlib
import io
import json
import os
import sys
import unicodedata
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, NoReturn, TextIO

BOM = b"\xef\xbb\xbf"


class OneLineParser(argparse.ArgumentParser):
    """argparse, with a bad flag reported in one line (no usage block) and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def at_least(minimum: int | float, kind: type) -> Callable[[str], int | float]:
    """An argparse type: a number of `kind` that is at least `minimum`."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text} is less than {minimum}")
        return value

    return parse


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, each checked here so that a bad one fails before the model loads."""
    parser = OneLineParser(prog="annotated-transformer translate",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a shipped model folder, or a model.pt / last.pt")
    parser.add_argument("--batch-size", type=at_least(1, int), default=32,
                        help="sentences decoded together (at least 1)")
    parser.add_argument("--beam", type=at_least(1, int), default=4,
                        help="beam size, at least 1 (1: greedy decoding)")
    parser.add_argument("--alpha", type=at_least(0.0, float), default=0.6,
                        help="length penalty exponent, at least 0 (0: none)")
    parser.add_argument("--stop-on-bad-input", action="store_true",
                        help="stop at a line that is not UTF-8 instead of leaving it empty")
    return parser.parse_args(argv)


def decode_lines(data: bytes) -> tuple[list[str], list[str]]:
    """The input's lines as text (no BOM, no line endings), and a message per undecodable line.

    An undecodable line becomes an empty line, so that line numbers stay aligned.
    """
    if data.startswith(BOM):
        data = data[len(BOM):]
    raw = data.split(b"\n")
    if raw[-1] == b"":  # the newline that ends the last line (or empty input)
        raw.pop()
    lines, problems = [], []
    for number, line in enumerate(raw, start=1):
        try:
            lines.append(line.removesuffix(b"\r").decode("utf-8"))
        except UnicodeDecodeError as err:
            lines.append("")
            problems.append(f"line {number} is not valid UTF-8 (byte {line[err.start]:#04x} at "
                            f"column {err.start + 1})")
    return lines, problems


def model_languages(checkpoint: str | os.PathLike | None) -> tuple[str, str] | None:
    """The (source, target) language codes in the info.json beside a model, as the train
    command writes them: ("de", "en") for the shipped models (whose info.json names none), None
    where there is no info.json (a training checkpoint)."""
    if checkpoint is None:
        return ("de", "en")
    path = Path(checkpoint)
    info = (path if path.is_dir() else path.parent) / "info.json"
    try:
        languages = json.loads(info.read_text("utf-8")).get("languages")
        return (languages["src"], languages["tgt"]) if languages else ("de", "en")
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return None  # no info.json (a training checkpoint), or one that names no languages


def split_long(words: list[str], limit: int, count: Callable[[str], int]) -> list[str]:
    """Pieces of a line (its words, joined by spaces), each at most `limit` of the model's
    tokens as `count` counts them (a word vocabulary's tokens, or subword pieces)."""
    pieces, start, step = [], 0, limit
    while start < len(words):
        piece = " ".join(words[start : start + step])
        if step > 1 and count(piece) > limit:  # too many tokens: take fewer words
            step -= 1
            continue
        pieces.append(piece)
        start, step = start + step, limit
    return pieces


SENTENCE_ENDS = frozenset(".!?…。！？‼⁇⁈⁉؟।")
SPACED_ENDS = frozenset(".!?")  # these end a sentence only before a space: 3.5, e.g.


def is_closing(char: str) -> bool:
    """A closing quote or bracket, which stays with the sentence end before it."""
    return char in "\"'" or unicodedata.category(char) in ("Pe", "Pf")


def byte_value(sp, i: int) -> int | None:
    """The byte a byte-fallback piece (<0xE4>) stands for; None for other pieces."""
    return int(sp.id_to_piece(i)[1:-1], 16) if sp.is_byte(i) else None


def piece_texts(sp, ids: list[int]) -> list[str]:
    """The text each piece adds to the line, U+2581 as a space; a character that byte fallback
    spells in several byte pieces belongs to the last of them (the others add "")."""
    texts, pending = [], b""
    for i in ids:
        value = byte_value(sp, i)
        if value is None:
            texts.append("" if sp.is_control(i) or sp.is_unknown(i)
                         else sp.id_to_piece(i).replace("\u2581", " "))
            pending = b""
            continue
        pending += bytes([value])
        try:
            texts.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:  # a character not finished yet (or bad bytes: dropped)
            texts.append("")
            pending = pending if len(pending) < 4 else b""
    return texts


def cut_rank(texts: list[str], e: int) -> int:
    """How good a cut before piece e is: 0 after a sentence's end, 1 after other punctuation,
    2 between words, 3 anywhere else."""
    before, after = "".join(texts[max(0, e - 4) : e]), "".join(texts[e : e + 2])
    core, following = before.rstrip(), after.lstrip()[:1]
    if core:
        last = core.rstrip("".join(c for c in core if is_closing(c)))[-1:]
        if (last in SENTENCE_ENDS and not (following in SENTENCE_ENDS or is_closing(following))
                and (last not in SPACED_ENDS or not after or after[0].isspace())):
            return 0
        if (unicodedata.category(core[-1]).startswith("P")
                and not unicodedata.category(following or " ").startswith("P")):
            return 1
    return 2 if before[-1:].isspace() or after[:1].isspace() else 3


def split_pieces(line: str, sp, limit: int) -> list[str]:
    """Parts of a line, each at most `limit` pieces of the sentencepiece model `sp`, cut where
    the pieces suggest: after a sentence's end, else after other punctuation, else between
    words, else anywhere (never inside a character spelled in byte pieces). Unlike splitting
    on spaces, this works on text written without them (Chinese, Japanese)."""
    ids = sp.encode(line)
    texts = piece_texts(sp, ids)
    parts, start = [], 0
    while start < len(ids):
        stop = min(start + limit, len(ids))
        # a cut inside a character: before a UTF-8 continuation byte
        cuts = [e for e in range(start + 1, stop + 1)
                if e == len(ids) or not 0x80 <= (byte_value(sp, ids[e]) or 0) < 0xC0]
        if not cuts:  # a limit shorter than one character's bytes
            cuts = [next(e for e in range(stop + 1, len(ids) + 1)
                         if e == len(ids) or not 0x80 <= (byte_value(sp, ids[e]) or 0) < 0xC0)]
        # the whole rest where it fits, else the best kind of cut, the latest of its kind
        cuts.sort(key=lambda e: (e != len(ids) and 1 + cut_rank(texts, e), -e))
        # decoded and encoded again, a part can gain a piece (a word start "▁" where it was
        # cut inside a word): take the best cut whose text the model reads within the limit
        end = next((e for e in cuts if len(sp.encode(sp.decode(ids[start:e]))) <= limit),
                   min(cuts))
        text = sp.decode(ids[start:end])
        if text.strip():
            parts.append(text)
        start = end
    return parts


def written_without_spaces(char: str) -> bool:
    """A Chinese or Japanese character or punctuation mark (CJK, kana, fullwidth forms)."""
    code = ord(char)
    return (0x3000 <= code <= 0x30FF or 0x3400 <= code <= 0x9FFF or 0xF900 <= code <= 0xFAFF
            or 0xFF00 <= code <= 0xFFEF or 0x20000 <= code <= 0x3FFFF)


def join_outputs(parts: list[str]) -> str:
    """The translations of a line's parts as one line: a space between two, except beside a
    character of a script written without spaces."""
    text = ""
    for part in filter(None, parts):
        if text and not (written_without_spaces(text[-1]) or written_without_spaces(part[0])):
            text += " "
        text += part
    return text


def beam_decode(model, sentences: list[str], vocab_src, vocab_tgt, tokenizer, *,
                max_len: int, batch_size: int = 32, allow_unk: bool = False,
                **search) -> list[str]:
    """Chapter 15's beam_translate, reading up to max_len - 2 tokens of each source (the
    model's own config.max_len) where beam_translate reads translate's default max_len."""
    from functools import partial

    from the_annotated_transformer import beam_translate_batch, translate_with

    decode = partial(beam_translate_batch, model, allow_unk=allow_unk, **search)
    return translate_with(decode, sentences, vocab_src, vocab_tgt, tokenizer,
                          batch_size=batch_size, max_len=max_len)


def main(argv: list[str] | None = None, stdin: BinaryIO | None = None,
         stdout: TextIO | None = None) -> int:
    """Translate stdin to stdout; the exit status (user errors are one line on stderr)."""
    args = parse_args(argv)
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = stdout or io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    from the_annotated_transformer import (
        BEST_SHIPPED_MODEL,
        encode_text,
        load_tokenizers,
        load_trained_model,
        tokenize,
    )

    try:
        with contextlib.redirect_stdout(sys.stderr):  # anything printed while loading
            model, vocab_src, vocab_tgt, config = load_trained_model(
                args.checkpoint, name=BEST_SHIPPED_MODEL)
    except (OSError, ValueError) as err:  # missing, truncated or corrupt files
        print("annotated-transformer translate: " + " ".join(str(err).split()), file=sys.stderr)
        return 2
    lines, problems = decode_lines(stdin.read())
    for problem in problems:
        ending = ": stopping" if args.stop_on_bad_input else ": its output line is empty"
        print(f"annotated-transformer translate: {problem}{ending}", file=sys.stderr)
    if problems and args.stop_on_bad_input:
        return 2
    # A word model splits its input with spaCy's German tokenizer; a subword model needs none.
    tokenizer = None if config.subwords else load_tokenizers()[0]
    # A source is read up to the length the model trained on (config.max_len), less <s> and </s>.
    limit = config.max_len - 2

    def model_tokens(text: str) -> int:  # words, or subword pieces
        return len(encode_text(text, vocab_src, tokenizer))

    pieces, owner = [], []  # each piece of text to translate, and the line it belongs to
    for number, line in enumerate(lines):
        tokens = model_tokens(line)
        parts = [line]
        if tokens > limit:
            parts = (split_pieces(line, vocab_src, limit) if config.subwords  # by its pieces
                     else split_long(tokenize(line, tokenizer), limit, model_tokens))
        if len(parts) > 1:
            print(f"annotated-transformer translate: line {number + 1} has {tokens} tokens, "
                  f"more than the {limit} that translation reads at once: translated in "
                  f"{len(parts)} pieces", file=sys.stderr)
        pieces += parts
        owner += [number] * len(parts)
    languages = model_languages(args.checkpoint)
    print(f"translating {len(lines)} lines"
          + (f" from {languages[0]} to {languages[1]}" if languages else ""), file=sys.stderr)
    outputs = beam_decode(model, pieces, vocab_src, vocab_tgt, tokenizer, max_len=config.max_len,
                          beam_size=args.beam, alpha=args.alpha, batch_size=args.batch_size,
                          use_cache=True)  # chapter 21's key/value cache
    joined = [[] for _ in lines]
    for number, text in zip(owner, outputs, strict=True):
        joined[number].append(text.replace("\n", " "))
    for parts in joined:
        stdout.write(join_outputs(parts) + "\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
