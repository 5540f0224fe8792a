"""Read a parallel text: two files, plain or gzipped, one sentence per line, line i of one the
translation of line i of the other. Every problem is one line that names the file and the line.

    from parallel_text import read_parallel
    pairs = read_parallel("train.en.gz", "train.fr.gz")   # [(english, french), ...]

Used by annotated-transformer train (--train, --valid) and annotated-transformer evaluate (--test).
Lines are read like annotated-transformer translate reads its input: a byte-order mark is dropped
and CRLF endings are fine.

    pairs, dropped = read_clean_parallel("train.en.gz", "train.fr.gz")   # train --clean

read_clean_parallel drops and counts the pairs that read_parallel would refuse (an empty or
undecodable line) and those that are over-long, badly length-matched or exact repeats.
"""

import copy
import gzip
import hashlib
import itertools
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from annotated_transformer_cli.translate import decode_lines

GZIP_MAGIC = b"\x1f\x8b"
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?")  # en, fr, pt-BR, zh_Hant


class BadInput(ValueError):
    """A file that cannot be read as one side of a parallel text; the message is one line."""


def read_bytes(path: Path) -> bytes:
    """A plain or gzipped file's bytes; a missing or unreadable file raises BadInput."""
    if not path.is_file():
        raise BadInput(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    try:
        data = path.read_bytes()
        if data.startswith(GZIP_MAGIC):  # gzipped, whatever its name
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise BadInput(f"{path} cannot be read ({type(err).__name__}: {err})") from err
    return data


def read_sentences(path: str | os.PathLike) -> list[str]:
    """The lines of a plain or gzipped UTF-8 file; a missing file, bad bytes or an empty line
    raise BadInput naming the file and the line."""
    path = Path(path)
    lines, problems = decode_lines(read_bytes(path))
    if problems:
        more = f" (and {len(problems) - 1} more such lines)" if len(problems) > 1 else ""
        raise BadInput(f"{path}: {problems[0]}{more}: the text must be UTF-8")
    empty = [number for number, line in enumerate(lines, start=1) if not line.strip()]
    if empty:
        more = f" (and {len(empty) - 1} more empty lines)" if len(empty) > 1 else ""
        raise BadInput(f"{path}: line {empty[0]} is empty{more}: every line must hold one "
                       "sentence; remove the pair from both files")
    if not lines:
        raise BadInput(f"{path} is empty: it holds no sentence")
    return lines


def read_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike
                  ) -> list[tuple[str, str]]:
    """(source, target) sentence pairs, line by line; files of unequal length raise BadInput
    with both line counts."""
    src, tgt = read_sentences(src_path), read_sentences(tgt_path)
    if len(src) != len(tgt):
        raise BadInput(f"{src_path} has {len(src):,} lines but {tgt_path} has {len(tgt):,}: "
                       "a parallel text has the same number of lines on both sides")
    return list(zip(src, tgt, strict=True))


CLEAN_REASONS = ("not UTF-8", "empty", "too long", "length ratio", "duplicate")
MAX_CHARS = 1000  # --clean's default limit per side, in characters
MAX_RATIO = 3.0  # --clean's default limit on the longer side's characters over the shorter's


def raw_lines(path: str | os.PathLike) -> Iterator[bytes]:
    """The lines of a plain or gzipped file one at a time, as bytes (a byte-order mark
    dropped, CRLF endings fine); a missing or unreadable file raises BadInput. Streamed: a
    corpus of millions of lines is never held as bytes."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == GZIP_MAGIC  # gzipped, whatever its name
        with (gzip.open if gzipped else open)(path, "rb") as f:
            for number, line in enumerate(f, start=1):
                line = line.removesuffix(b"\n").removesuffix(b"\r")
                yield line.removeprefix(b"\xef\xbb\xbf") if number == 1 else line
    except (OSError, EOFError, zlib.error) as err:
        raise BadInput(f"{path} cannot be read ({type(err).__name__}: {err})") from err


def lines_or_none(path: str | os.PathLike) -> Iterator[str | None]:
    """raw_lines decoded, None for a line that is not UTF-8."""
    for line in raw_lines(path):
        try:
            yield line.decode("utf-8")
        except UnicodeDecodeError:
            yield None


def parallel_lines(src_path: str | os.PathLike, tgt_path: str | os.PathLike
                   ) -> Iterator[tuple[str | None, str | None]]:
    """Line i of one file with line i of the other, streamed; files of unequal length, or
    empty ones, raise BadInput (at their end) with both line counts."""
    src, tgt, end = lines_or_none(src_path), lines_or_none(tgt_path), object()
    n = more_src = 0
    for line in src:
        other = next(tgt, end)
        if other is end:  # the target ended first: this source line is one more
            more_src = 1
            break
        n += 1
        yield line, other
    more_src += sum(1 for _ in src)
    more_tgt = sum(1 for _ in tgt)
    if more_src or more_tgt:
        raise BadInput(f"{src_path} has {n + more_src:,} lines but {tgt_path} has "
                       f"{n + more_tgt:,}: a parallel text has the same number of lines on "
                       "both sides (--clean drops bad pairs, but cannot tell which lines "
                       "belong together)")
    if not n:
        raise BadInput(f"{src_path} and {tgt_path} are empty: they hold no sentence")


def clean_pairs(pairs: Iterable[tuple[str | None, str | None]], dropped: Counter, *,
                max_chars: int = MAX_CHARS, max_ratio: float = MAX_RATIO
                ) -> Iterator[tuple[str, str]]:
    """The pairs that pass every rule, in their order, counting each dropped one under the
    first of CLEAN_REASONS it meets: a side not UTF-8 (None), a side empty or blank, a side
    over max_chars characters, a longer side over max_ratio times the shorter in characters,
    or a pair already seen (by an 8-byte hash: one pass, memory for the hashes only)."""
    seen: set[bytes] = set()
    for src, tgt in pairs:
        if src is None or tgt is None:
            dropped["not UTF-8"] += 1
            continue
        n_src, n_tgt = len(src.strip()), len(tgt.strip())
        if not n_src or not n_tgt:
            dropped["empty"] += 1
        elif max(n_src, n_tgt) > max_chars:
            dropped["too long"] += 1
        elif max(n_src, n_tgt) > max_ratio * min(n_src, n_tgt):
            dropped["length ratio"] += 1
        else:
            key = hashlib.blake2b(f"{len(src)}:{src}{tgt}".encode(), digest_size=8).digest()
            if key in seen:
                dropped["duplicate"] += 1
                continue
            seen.add(key)
            yield src, tgt


def read_clean_parallel(src_path: str | os.PathLike, tgt_path: str | os.PathLike, *,
                        max_chars: int = MAX_CHARS, max_ratio: float = MAX_RATIO
                        ) -> tuple[list[tuple[str, str]], Counter]:
    """read_parallel's pairs less those clean_pairs drops, and how many it dropped for each
    reason, in one pass over the files; files of unequal length, or nothing left, still raise
    BadInput."""
    dropped: Counter = Counter()
    pairs = list(clean_pairs(parallel_lines(src_path, tgt_path), dropped, max_chars=max_chars,
                             max_ratio=max_ratio))
    if not pairs:
        raise BadInput(f"--clean leaves no pair of {src_path} and {tgt_path} "
                       f"({cleaning_summary(dropped, 0)})")
    return pairs, dropped


class StreamedPairs:
    """--train's pairs read from their two files each time they are iterated, never held in
    memory: the train command's way with --corpus-dir, for corpora of millions of pairs.

    Built by one pass over the files that refuses what read_parallel refuses, with the same
    one-line messages (with clean, the limits of clean_pairs: drops what read_clean_parallel
    drops, and refuses what it refuses), counts the pairs and hashes their text as
    pairs_sha256 does. What it keeps: with clean, one byte a line (kept or not) and, while
    checking, clean_pairs's hashes. streamed[:n] is its first n pairs, side(k) one side's
    sentences."""

    def __init__(self, src_path: str | os.PathLike, tgt_path: str | os.PathLike, *,
                 clean: dict | None = None) -> None:
        self.paths = (src_path, tgt_path)
        self.limit: int | None = None
        self.keep: bytearray | None = None  # with clean: 1 for each line kept, else 0
        self.dropped: Counter | None = None
        self._digest = hashlib.sha256()  # pairs_sha256's lines for "train", so far
        if clean is None:
            self.pairs = self._check()
            return
        self.keep, self.dropped = bytearray(), Counter()

        def marked() -> Iterator[tuple[str | None, str | None]]:
            for pair in parallel_lines(src_path, tgt_path):
                self.keep.append(0)
                yield pair

        self.pairs = 0
        for src, tgt in clean_pairs(marked(), self.dropped, **clean):
            self.keep[-1] = 1  # clean_pairs yields the pair it read last, or reads on
            self.pairs += 1
            self._digest.update(f"train\t{src}\t{tgt}\n".encode())
        if not self.pairs:
            raise BadInput(f"--clean leaves no pair of {src_path} and {tgt_path} "
                           f"({cleaning_summary(self.dropped, 0)})")

    def _check(self) -> int:
        """read_parallel's checks in one pass over both files; the number of pairs."""
        end = object()
        counts, bad, empty = [0, 0], [0, 0], [0, 0]  # lines, undecodable ones, empty ones
        first: dict[tuple[str, int], str | int] = {}  # (kind, side): the first such line
        for raws in itertools.zip_longest(*map(raw_lines, self.paths), fillvalue=end):
            texts = []
            for side, raw in enumerate(raws):
                if raw is end:
                    continue
                counts[side] += 1
                try:
                    texts.append(raw.decode("utf-8"))
                except UnicodeDecodeError as err:
                    bad[side] += 1
                    first.setdefault(("bad", side), (
                        f"line {counts[side]} is not valid UTF-8 (byte {raw[err.start]:#04x} "
                        f"at column {err.start + 1})"))
                    continue
                if not texts[-1].strip():
                    empty[side] += 1
                    first.setdefault(("empty", side), counts[side])
            if len(texts) == 2:
                self._digest.update(f"train\t{texts[0]}\t{texts[1]}\n".encode())
        for side, path in enumerate(self.paths):
            if bad[side]:
                more = f" (and {bad[side] - 1} more such lines)" if bad[side] > 1 else ""
                raise BadInput(f"{path}: {first['bad', side]}{more}: the text must be UTF-8")
            if empty[side]:
                more = f" (and {empty[side] - 1} more empty lines)" if empty[side] > 1 else ""
                raise BadInput(f"{path}: line {first['empty', side]} is empty{more}: every line "
                               "must hold one sentence; remove the pair from both files")
            if not counts[side]:
                raise BadInput(f"{path} is empty: it holds no sentence")
        if counts[0] != counts[1]:
            raise BadInput(f"{self.paths[0]} has {counts[0]:,} lines but {self.paths[1]} has "
                           f"{counts[1]:,}: a parallel text has the same number of lines on "
                           "both sides")
        return counts[0]

    def __len__(self) -> int:
        return self.pairs if self.limit is None else min(self.limit, self.pairs)

    def __getitem__(self, cut: slice) -> "StreamedPairs":
        if not isinstance(cut, slice) or cut.start not in (None, 0) or cut.step not in (None, 1):
            raise ValueError(f"streamed pairs are cut from their start only ([:n]), got {cut!r}")
        streamed = copy.copy(self)
        if cut.stop is not None:
            streamed.limit = len(range(len(self))[: cut.stop])
        return streamed

    def side(self, k: int) -> Iterator[str]:
        """The sentences of one side (0: source, 1: target), read from its file."""
        lines = lines_or_none(self.paths[k])
        return itertools.islice(lines if self.keep is None else
                                itertools.compress(lines, self.keep), len(self))

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return zip(self.side(0), self.side(1), strict=True)

    def train_digest(self) -> "hashlib._Hash":
        """A sha256 fed pairs_sha256's lines for these pairs as its "train" split: the one the
        checking pass computed, or, when cut shorter, one more pass."""
        if len(self) == self.pairs:
            return self._digest.copy()
        digest = hashlib.sha256()
        for src, tgt in self:
            digest.update(f"train\t{src}\t{tgt}\n".encode())
        return digest


def cleaning_summary(dropped: Counter, kept: int, *, max_chars: int = MAX_CHARS,
                     max_ratio: float = MAX_RATIO) -> str:
    """One line: the pairs kept and the pairs dropped for each reason."""
    labels = {"not UTF-8": "not UTF-8", "empty": "empty",
              "too long": f"over {max_chars:,} characters",
              "length ratio": f"one side over {max_ratio:g} times as long",
              "duplicate": "repeats of an earlier pair"}
    total = kept + sum(dropped.values())
    reasons = ", ".join(f"{dropped[reason]:,} {labels[reason]}" for reason in CLEAN_REASONS)
    return f"kept {kept:,} of {total:,} pairs; dropped {reasons}"


def language_of(path: str | os.PathLike) -> str | None:
    """The language code in a file name such as train.en.gz or val.fr (None if there is none)."""
    name = Path(path).name.removesuffix(".gz").removesuffix(".txt")
    stem, dot, code = name.rpartition(".")
    return code if dot and stem and LANGUAGE_CODE.fullmatch(code) else None


def split_name(path: str | os.PathLike) -> str:
    """A test set's name from its source file: test_2016_flickr.en.gz -> test_2016_flickr."""
    name = Path(path).name.removesuffix(".gz").removesuffix(".txt")
    return name.rpartition(".")[0] if language_of(path) else name
