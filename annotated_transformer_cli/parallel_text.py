"""Read a parallel text: two files, plain or gzipped, one sentence per line, line i of one the
translation of line i of the other. Every problem is one line that names the file and the line.

    from parallel_text import read_parallel
    pairs = read_parallel("train.en.gz", "train.fr.gz")   # [(english, french), ...]

Used by annotated-transformer train (--train, --valid) and annotated-transformer evaluate (--test).
Lines are read like annotated-transformer translate reads its input: a byte-order mark is dropped
and CRLF endings are fine.
"""

import gzip
import os
import re
import zlib
from pathlib import Path

from annotated_transformer_cli.translate import decode_lines

GZIP_MAGIC = b"\x1f\x8b"
LANGUAGE_CODE = re.compile(r"[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?")  # en, fr, pt-BR, zh_Hant


class BadInput(ValueError):
    """A file that cannot be read as one side of a parallel text; the message is one line."""


def read_sentences(path: str | os.PathLike) -> list[str]:
    """The lines of a plain or gzipped UTF-8 file; a missing file, bad bytes or an empty line
    raise BadInput naming the file and the line."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path} does not exist" if not path.exists() else f"{path} is not a file")
    try:
        data = path.read_bytes()
        if data.startswith(GZIP_MAGIC):  # gzipped, whatever its name
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as err:
        raise BadInput(f"{path} cannot be read ({type(err).__name__}: {err})") from err
    lines, problems = decode_lines(data)
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


def language_of(path: str | os.PathLike) -> str | None:
    """The language code in a file name such as train.en.gz or val.fr (None if there is none)."""
    name = Path(path).name.removesuffix(".gz").removesuffix(".txt")
    stem, dot, code = name.rpartition(".")
    return code if dot and stem and LANGUAGE_CODE.fullmatch(code) else None


def split_name(path: str | os.PathLike) -> str:
    """A test set's name from its source file: test_2016_flickr.en.gz -> test_2016_flickr."""
    name = Path(path).name.removesuffix(".gz").removesuffix(".txt")
    return name.rpartition(".")[0] if language_of(path) else name
