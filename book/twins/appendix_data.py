# %% [markdown]
# # Appendix: finding the data
#
# Chapter 9 reads Multi30k with one call, `load_multi30k(split)`, and batches it with
# `TokenBudgetSampler`. What those two do besides the chapter's idea is collected here: where
# the data files are looked for, how a missing file is downloaded and every file checked against
# its published checksum, what the errors say when something is wrong, how the sampler checks
# its arguments and deals its batches out to the processes of a data-parallel run, and the chart
# of sentence lengths that chapter 9 draws.

# %% tags=["setup", "hide-cell"]
# Setup (hidden in the book): in Colab, install the book's package; everywhere, import what
# earlier chapters built.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPO = "https://github.com/annotated-transformer/annotated-transformer-book"
    REF = "v0.2.0"  # the tag or commit this notebook comes from
    package = f"the-annotated-transformer[book] @ git+{REPO}@{REF}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

from the_annotated_transformer import (
    TokenBudgetSampler,
    download_file,
    repository_root,
    sha256_of,
)

# %% [markdown]
# ## Where the data is
#
# A data set is looked for in one folder, chosen in this order: the `data_dir` argument, the
# folder named by an environment variable (`MULTI30K_DIR` for Multi30k), a shared copy at
# `../shared/data/<name>` beside the repository (this is how the book's tests run offline), and
# a cache folder in the home directory, where a download goes. Chapter 20 finds its treebank
# sample the same way.

# %% tags=["export"]
import os
from pathlib import Path


def dataset_dir(name: str, env: str, data_dir: str | os.PathLike | None = None) -> Path:
    """A data set's folder: data_dir, $env, ../shared/data/<name> beside the repository, or the
    cache ~/.cache/annotated-transformer/<name> (where a download goes)."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    if os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    root = repository_root()
    if root is not None and (root.parent / "shared" / "data" / name).is_dir():
        return (root.parent / "shared" / "data" / name).resolve()
    return Path.home() / ".cache" / "annotated-transformer" / name


def multi30k_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The Multi30k folder: data_dir, $MULTI30K_DIR, ../shared/data/multi30k, or the cache."""
    return dataset_dir("multi30k", "MULTI30K_DIR", data_dir)


# %% [markdown]
# The argument wins over the environment variable, and the variable over the folders found on
# disk:

# %%
import tempfile

with tempfile.TemporaryDirectory() as folder:
    previous = os.environ.get("MULTI30K_DIR")
    os.environ["MULTI30K_DIR"] = folder
    try:
        chosen = [multi30k_dir("given"), multi30k_dir()]
    finally:  # leave the environment as it was
        del os.environ["MULTI30K_DIR"]
        if previous is not None:
            os.environ["MULTI30K_DIR"] = previous
assert chosen == [Path("given"), Path(folder)]
print("data_dir first, then MULTI30K_DIR")

# %% [markdown]
# ## Downloads and checksums
#
# Data that arrives over the network can arrive broken, and a broken file that is read anyway
# fails much later and far from the cause: a model that trains on half a file, a BLEU score that
# nobody can reproduce. So `multi30k_file` checks every file against its published SHA-256
# checksum before it is read, and downloads a missing one with `download_file` from the
# appendix {doc}`appendix_infrastructure`, which renames the download into place only once its
# checksum is right. When something is wrong, the error names the file and what to do about it.

# %% tags=["export"]
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}


def multi30k_file(name: str, folder: Path) -> Path:
    """The path of one Multi30k file in folder, downloaded if missing, its checksum verified."""
    path = folder / name
    expected = MULTI30K_SHA256[name]
    if not path.exists():
        url = MULTI30K_URL + name
        try:
            download_file(url, path, sha256=expected)
        except OSError as err:  # no network, an HTTP error, a timeout, a read-only folder
            raise FileNotFoundError(
                f"Multi30k file {name} is not in {folder} and could not be downloaded from "
                f"{url} ({err}): connect to the internet and try again, copy the file there, "
                "or set MULTI30K_DIR to a folder that holds the Multi30k files"
            ) from err
    actual = sha256_of(path)
    if actual != expected:
        raise ValueError(
            f"Multi30k file {path} is truncated or corrupted (SHA-256 {actual}, expected "
            f"{expected}): delete it to download it again, or set MULTI30K_DIR to a folder "
            "with intact copies"
        )
    return path


# %% [markdown]
# All six files pass their checksums; a copy with one byte flipped does not, and the error says
# which file it is:

# %%
for name in MULTI30K_SHA256:
    multi30k_file(name, multi30k_dir())

with tempfile.TemporaryDirectory() as folder:
    data = bytearray((multi30k_dir() / "val.en.gz").read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte in the middle
    (Path(folder) / "val.en.gz").write_bytes(bytes(data))
    try:
        multi30k_file("val.en.gz", Path(folder))
    except ValueError as err:
        print(str(err).split(" (")[0].replace(folder, "<folder>"))

# %% [markdown]
# ## Reading a split
#
# Each split is two gzipped files, one sentence per line. `read_sentence_pairs` pairs line $i$
# of one with line $i$ of the other and refuses two files of different lengths, which cannot be
# translations of each other. `load_multi30k`, the call chapter 9 makes, checks the split's
# name, finds the folder, verifies (and if need be downloads) both files, and reads them.

# %% tags=["export"]
import gzip
import os
from pathlib import Path

MULTI30K_SPLITS = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}


def read_sentence_pairs(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike
) -> list[tuple[str, str]]:
    """Line i of the gzipped src_path paired with line i of tgt_path; unequal counts raise."""
    sides = []
    for path in (src_path, tgt_path):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines[-1] == "":  # the newline that ends the last line
            lines.pop()
        sides.append(lines)
    src, tgt = sides
    if len(src) != len(tgt):
        raise ValueError(
            f"{Path(src_path).name} has {len(src)} lines but {Path(tgt_path).name} has "
            f"{len(tgt)}: the files are not parallel; delete both to download them again"
        )
    return list(zip(src, tgt, strict=True))


def load_multi30k(
    split: str, data_dir: str | os.PathLike | None = None
) -> list[tuple[str, str]]:
    """The (German, English) sentence pairs of one Multi30k split, exactly as published."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(MULTI30K_SPLITS)}")
    folder = multi30k_dir(data_dir)
    return read_sentence_pairs(
        multi30k_file(f"{split}.de.gz", folder), multi30k_file(f"{split}.en.gz", folder)
    )


# %% [markdown]
# Two files that are not parallel, and the error they give:

# %%
with tempfile.TemporaryDirectory() as folder:
    for name, text in [("a.de.gz", "eins\nzwei\ndrei\n"), ("a.en.gz", "one\ntwo\n")]:
        with gzip.open(Path(folder) / name, "wt", encoding="utf-8") as f:
            f.write(text)
    try:
        read_sentence_pairs(Path(folder) / "a.de.gz", Path(folder) / "a.en.gz")
    except ValueError as err:
        print(err)

# %% [markdown]
# ## The sampler's arguments
#
# `TokenBudgetSampler` checks its arguments when it is made, so that a mistake shows where it
# was made rather than as a hang or an oversized batch later: lengths for the same examples,
# positive integer options, a rank in range, and no example that alone exceeds the budget (the
# message names the first one and how many there are; `filter_by_length` drops them).

# %% tags=["export"]
from collections.abc import Sequence


def check_token_budget(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, max_tokens: int,
    pool_size: int | None = None, num_replicas: int = 1, rank: int = 0,
) -> None:
    """Raise a ValueError naming the argument if TokenBudgetSampler cannot keep its promise."""
    n = len(src_lengths)
    if len(tgt_lengths) != n:
        raise ValueError(
            f"src_lengths has {n} entries but tgt_lengths has {len(tgt_lengths)}; "
            "both must describe the same examples"
        )
    if n == 0:
        raise ValueError("src_lengths is empty; the sampler needs at least one example")
    pool_size = n if pool_size is None else pool_size
    for name, value in [("max_tokens", max_tokens), ("pool_size", pool_size),
                        ("num_replicas", num_replicas)]:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank!r}")
    if n < num_replicas:
        raise ValueError(
            f"{n} examples cannot give each of num_replicas={num_replicas} ranks a batch"
        )
    too_long = [i for i in range(n) if max(src_lengths[i], tgt_lengths[i]) > max_tokens]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"example {i} has {src_lengths[i]} source and {tgt_lengths[i]} target "
            f"tokens, more than max_tokens={max_tokens} on its own ({len(too_long)} of {n} "
            "examples exceed it): drop long pairs first (filter_by_length) or raise max_tokens"
        )


# %%
for options in [{"max_tokens": 0}, {"max_tokens": 20},
                {"max_tokens": 50, "num_replicas": 2, "rank": 2}]:
    try:
        check_token_budget([5, 30, 6], [5, 5, 6], **options)
    except ValueError as err:
        print(f"{options}: {err}")


# %% [markdown]
# ## Batches for several processes
#
# In data-parallel training (chapter 14) every process, or *rank*, makes its own sampler with
# the same seed and its own `rank`. All of them build the same list of batches, and rank $r$ of
# $R$ takes batches $r, r + R, r + 2R, \dots$, as PyTorch's `DistributedSampler` does with single
# examples. Every rank must take the same number of steps, or the gradient exchange waits
# forever for a rank that has finished its epoch. Rather than drop batches (losing examples) or
# repeat them (counting examples twice), `split_batches_for_ranks` halves the largest batches
# until their number divides evenly; half a batch is still within the budget, and every example
# is in exactly one batch of one rank, every epoch.

# %% tags=["export"]
def split_batches_for_ranks(batches: list[list[int]], num_replicas: int) -> list[list[int]]:
    """Halve the largest batches until every rank can have the same number of them."""
    while len(batches) % num_replicas:
        j = max(range(len(batches)), key=lambda k: len(batches[k]))
        if len(batches[j]) < 2:
            raise ValueError(
                f"cannot share {len(batches)} one-example batches equally among "
                f"num_replicas={num_replicas} ranks; raise max_tokens"
            )
        half = len(batches[j]) // 2
        batches[j : j + 1] = [batches[j][:half], batches[j][half:]]
    return batches


# %% [markdown]
# Three batches for two ranks: the largest is halved. Then the Multi30k training set (lengths
# counted in words split at spaces, which needs no tokenizer) for two and three ranks, whose
# batches together hold every example exactly once:

# %%
print(split_batches_for_ranks([[0, 1, 2, 3], [4, 5], [6]], num_replicas=2))

pairs = load_multi30k("train")
src_lengths = [len(de.split()) + 2 for de, _ in pairs]  # with <s> and </s>
tgt_lengths = [len(en.split()) + 2 for _, en in pairs]
for num_replicas in [2, 3]:
    ranks = [TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=2048,
                                num_replicas=num_replicas, rank=rank)
             for rank in range(num_replicas)]
    seen = sorted(i for sampler in ranks for batch in sampler for i in batch)
    assert seen == list(range(len(pairs)))  # every example once, none twice
    print(f"{num_replicas} ranks: {[len(sampler) for sampler in ranks]} batches each")

# %% [markdown]
# ## The chart of sentence lengths
#
# Chapter 9 draws how many training sentences have each length, German and English overlaid;
# this is the altair code behind that one call.

# %% tags=["export"]
from collections import Counter
from collections.abc import Sequence
from typing import Any


def length_histogram(pairs: Sequence[tuple[Sequence[str], Sequence[str]]], *, title: str) -> Any:
    """How many sentence pairs have each length, German (side 0) over English (side 1)."""
    import altair as alt

    rows = []
    for language, side in [("German", 0), ("English", 1)]:
        counts = Counter(len(pair[side]) for pair in pairs)
        rows += [{"language": language, "tokens": n, "sentences": c} for n, c in counts.items()]
    if not rows:
        raise ValueError("pairs is empty: there are no lengths to count")
    return (
        alt.Chart(alt.Data(values=rows))
        .mark_bar(opacity=0.6)
        .encode(
            x=alt.X("tokens:Q", bin=alt.Bin(step=1), title="sentence length (tokens)"),
            y=alt.Y("sentences:Q", stack=None, title="training sentences"),
            color=alt.Color("language:N", title=None),
            tooltip=["language:N", "tokens:Q", "sentences:Q"],
        )
        .properties(width=520, height=220, title=title)
    )
