"""Translate with a trained model: one sentence per line on stdin, one line per line on stdout.

    echo "Zwei Hunde spielen im Schnee." | annotated-transformer translate
    annotated-transformer translate --checkpoint checkpoints/multi30k_cpu/last.pt < de.txt > en.txt
    annotated-transformer translate --checkpoint checkpoints/en-fr_cpu_fast_dropout/model < en.txt
    annotated-transformer translate --beam 1 < de.txt > en.txt   # greedy decoding

Only translations go to stdout, exactly one line for each input line (an empty line stays
empty); messages go to stderr. Input is read as bytes: a byte-order mark is dropped, CRLF line
endings are accepted, and a line that is not valid UTF-8 is reported by its number and gives an
empty output line (--stop-on-bad-input stops instead, with nothing written). A line longer than
the model translates at once is split into pieces, translated piece by piece, and reported.
By default the book's best shipped model (BEST_SHIPPED_MODEL: chapter 21's half-hour subword
model in book/models/multi30k_cpu_fast_dropout) translates German to English; --checkpoint takes
a folder from export_for_shipping or `annotated-transformer train` (which translates the
languages its info.json names: a subword model needs no tokenizer of its languages) or a model.pt
or last.pt file with its vocabularies beside it (vocab_de.json and vocab_en.json, or
subwords.model).
Decoding is the paper's beam search (beam 4, length penalty alpha 0.6; chapter 15) with chapter
21's key/value cache; --beam 1 gives greedy decoding. A user error (a bad flag, a missing or
corrupt checkpoint, bad input with --stop-on-bad-input) ends with one line on stderr and exit
status 1 (2 for a bad flag).
"""

import argparse
import contextlib
import inspect
import io
import json
import os
import sys
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


def main(argv: list[str] | None = None, stdin: BinaryIO | None = None,
         stdout: TextIO | None = None) -> int:
    """Translate stdin to stdout; the exit status (user errors are one line on stderr)."""
    args = parse_args(argv)
    stdin = sys.stdin.buffer if stdin is None else stdin
    stdout = stdout or io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    from the_annotated_transformer import (
        BEST_SHIPPED_MODEL,
        beam_translate,
        encode_text,
        load_tokenizers,
        load_trained_model,
        tokenize,
        translate,
    )

    try:
        with contextlib.redirect_stdout(sys.stderr):  # anything printed while loading
            model, vocab_src, vocab_tgt, config = load_trained_model(
                args.checkpoint, name=BEST_SHIPPED_MODEL)
    except (OSError, ValueError) as err:  # missing, truncated or corrupt files
        print("annotated-transformer translate: " + " ".join(str(err).split()), file=sys.stderr)
        return 1
    lines, problems = decode_lines(stdin.read())
    for problem in problems:
        ending = ": stopping" if args.stop_on_bad_input else ": its output line is empty"
        print(f"annotated-transformer translate: {problem}{ending}", file=sys.stderr)
    if problems and args.stop_on_bad_input:
        return 1
    # A word model splits its input with spaCy's German tokenizer; a subword model needs none.
    tokenizer = None if config.subwords else load_tokenizers()[0]
    # beam_translate reads at most translate's max_len tokens, less <s> and </s>, at once.
    limit = inspect.signature(translate).parameters["max_len"].default - 2

    def model_tokens(text: str) -> int:  # words, or subword pieces
        return len(encode_text(text, vocab_src, tokenizer))

    pieces, owner = [], []  # each piece of text to translate, and the line it belongs to
    for number, line in enumerate(lines):
        tokens = model_tokens(line)
        parts = [line]
        if tokens > limit:
            words = line.split() if config.subwords else tokenize(line, tokenizer)
            parts = split_long(words, limit, model_tokens)
        if len(parts) > 1:
            print(f"annotated-transformer translate: line {number + 1} has {tokens} tokens, "
                  f"more than the {limit} that translation reads at once: translated in "
                  f"{len(parts)} pieces", file=sys.stderr)
        pieces += parts
        owner += [number] * len(parts)
    languages = model_languages(args.checkpoint)
    print(f"translating {len(lines)} lines"
          + (f" from {languages[0]} to {languages[1]}" if languages else ""), file=sys.stderr)
    outputs = beam_translate(model, pieces, vocab_src, vocab_tgt, tokenizer, beam_size=args.beam,
                             alpha=args.alpha, batch_size=args.batch_size,
                             use_cache=True)  # chapter 21's key/value cache
    joined = [[] for _ in lines]
    for number, text in zip(owner, outputs, strict=True):
        joined[number].append(text.replace("\n", " "))
    for parts in joined:
        stdout.write(" ".join(part for part in parts if part) + "\n")
    stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
