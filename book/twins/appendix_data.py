# %% [markdown]
# # Appendix: finding the data and the models
#
# Chapter 9 reads Multi30k with one call, `load_multi30k(split)`, and batches it with
# `TokenBudgetSampler`. What those two do besides the chapter's idea is collected here: where
# the data files are looked for, how a missing file is downloaded and every file checked against
# its published checksum, what the errors say when something is wrong, how the sampler checks
# its arguments and deals its batches out to the processes of a data-parallel run, and the chart
# of sentence lengths that chapter 9 draws. The last section does the same for the trained
# models that the book ships.

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
    SPECIALS,
    SUBWORD_FILE,
    VOCAB_FILES,
    EncoderDecoder,
    Process,
    RunData,
    TokenBudgetSampler,
    TrainConfig,
    Vocab,
    book_data,
    collate_to_batch,
    config_for_devices,
    download_file,
    enable_book_charts,
    encode_examples,
    example_lengths,
    filter_by_length,
    from_rank0,
    load_checkpoint,
    load_subwords,
    make_model,
    multi30k_loader,
    read_vocabularies,
    repository_root,
    save_checkpoint,
    sha256_of,
    tokenize_pairs,
    train_sentencepiece,
    train_worker,
    training_config,
    write_run_files,
)

enable_book_charts()

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
# The French and Czech sides of the same splits, from the same folder of the Multi30k repository.
# They live in a folder of their own, multi30k-fr-cs, beside multi30k (in ../shared/data as in
# the cache), so that the German-English folder stays exactly the six files above.
MULTI30K_FR_CS_SHA256 = {
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}


def multi30k_file(name: str, folder: Path) -> Path:
    """The path of one Multi30k file in folder, downloaded if missing, its checksum verified."""
    path = folder / name
    expected = (MULTI30K_SHA256 | MULTI30K_FR_CS_SHA256)[name]
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
# The same splits exist in French and Czech, line for line with the English side, in a second
# folder, `multi30k-fr-cs`: `load_multi30k(split, languages=("en", "fr"))` reads English-French
# pairs, and `annotated-transformer train --langs en fr` trains a translator on them (chapter 18).

# %% tags=["export"]
import gzip
import os
from pathlib import Path

MULTI30K_SPLITS = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
# Each language's folder under ../shared/data or the cache (data_dir or $MULTI30K_DIR holds all)
MULTI30K_FOLDERS = {"de": "multi30k", "en": "multi30k", "fr": "multi30k-fr-cs",
                    "cs": "multi30k-fr-cs"}


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
    split: str, data_dir: str | os.PathLike | None = None,
    languages: tuple[str, str] = ("de", "en"),
) -> list[tuple[str, str]]:
    """The (source, target) sentence pairs of one Multi30k split, exactly as published:
    German-English unless languages names two others of de, en, fr and cs."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(MULTI30K_SPLITS)}")
    if (len(languages) != 2 or languages[0] == languages[1]
            or not set(languages) <= MULTI30K_FOLDERS.keys()):
        raise ValueError(
            f"languages={tuple(languages)!r}: Multi30k pairs two different ones of "
            f"{', '.join(MULTI30K_FOLDERS)}"
        )
    paths = [
        multi30k_file(f"{split}.{code}.gz",
                      dataset_dir(MULTI30K_FOLDERS[code], "MULTI30K_DIR", data_dir))
        for code in languages
    ]
    return read_sentence_pairs(*paths)


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
# In data-parallel training (chapter 22) every process, or *rank*, makes its own sampler with
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


# %% [markdown]
# ## Settings for your own data
#
# `annotated-transformer train --train SRC TGT --valid SRC TGT` trains on a text of any size
# (from about a million pairs, with `--corpus-dir`, below), and the settings
# that suit Multi30k do not suit them all: a few hundred pairs are spread thin over 8,000
# subwords, and a run on them would end before a 2,000-step warm-up does. Chapter 18's table of
# settings by data size says in which direction each setting moves; `config_for_corpus` is this
# book's extrapolation of those directions into numbers, anchored at Multi30k's 29,000 pairs,
# which get chapter 21's recipe, `cpu_fast_dropout`, unchanged. The thresholds and amounts are
# the book's own choices, and no run checks any size but 29,000. Under 10,000 pairs, below the
# table's rows, the model is smaller and dropout 0.3 (the table says only "above the paper's
# rate at the small end"); chapter 21's model, already smaller and shallower than the paper's,
# serves up to a million pairs, and the table's last row, millions, gets the paper's base model
# and its 4,000-step warm-up at 25,000 padded tokens a step; `warmup` counts micro-batches, so
# the rule takes the micro-batch the run will use (`max_tokens`: `cpu_fast_dropout`'s 750 tokens,
# a CPU's, unless the command's `--max-tokens` gives a GPU's larger one, such as 4096), and on one
# device the run warms up for 4,000 steps to the paper's peak with either (a micro-batch above
# 25,000 tokens is cut to 25,000, and on $R$ devices to at most 25,000 / $R$). A given `--accum-iter`
# makes the step that many micro-batches on each device instead of 25,000 tokens, which keeps
# that warm-up and peak on one device only: on $R$ devices the step holds $R$ times as many, the
# warm-up is 4,000 / $R$ steps and the peak $\sqrt{R}$ times higher. The vocabulary grows with the square
# root of the text (the book's rule, within the table's "fewer merges" for less text). Fewer
# pairs than Multi30k's get a warm-up that covers the same share of the text and more epochs, up
# to about as many optimizer steps as the Multi30k run; at every size `lr_factor` keeps the
# rate's peak, on one device (and below a million pairs without `--accum-iter`), where
# Multi30k's is, which is also the paper's. Below a million pairs the warm-up is a number of
# micro-batches whatever their size: a larger `--max-tokens` shortens the run but not its
# warm-up, and can get it refused, so keep 750 tokens there or lower `warmup`; and a step
# of $k$ micro-batches ($R$ devices times `--accum-iter`) divides the warm-up by $k$,
# by chapter 22's rule, so the peak rises $\sqrt{k}$ times. From a million pairs without
# `--accum-iter`, `batch_tokens` fixes the global step, and the warm-up and peak stay about the
# paper's. Each choice comes with its reason, which the training script prints, and a run whose
# warm-up or peak is more than 5% from the one its sizing aimed at, with `warmup`, `lr_factor` and
# `d_model` left to the sizing, gets a warning with the `--set warmup` that restores both. These are starting points, not settings tuned on each size:
# `--set` changes any of them, and `--config` trains a preset as it is.

# %% tags=["export"]
import math
from typing import Any

# pairs: the book's own thresholds, one below the table's rows and one at its last, untried
SMALL_CORPUS, HUGE_CORPUS = 10_000, 1_000_000


def config_for_corpus(pairs: int, *, max_tokens: int | None = None,
                      accum_iter: int | None = None) -> list[tuple[dict[str, Any], str]]:
    """The TrainConfig fields that depend on how many training pairs there are, in groups,
    each with its reason: the book's extrapolation of the directions in chapter 18's table,
    anchored at Multi30k's size, which gets cpu_fast_dropout's values. On one device, and
    below HUGE_CORPUS pairs without accum_iter, every size peaks at Multi30k's rate, which is
    also the paper's (6.99e-4).
    max_tokens: the micro-batch that the run's devices will take (None: cpu_fast_dropout's),
    which the paper's warm-up steps are counted in from HUGE_CORPUS pairs on; accum_iter: a
    step of that many micro-batches instead of 25,000 tokens (None: batch_tokens sets it)."""
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs must be a positive integer, got {pairs!r}")
    anchor, recipe = MULTI30K_SPLITS["train"], training_config("cpu_fast_dropout")
    scale = pairs / anchor
    # 1) the vocabulary grows with the square root of the text, in steps of 500
    subwords = min(32_000, max(1_000, 500 * round(recipe.subwords * math.sqrt(scale) / 500)))
    choices = [({"subwords": subwords}, f"{recipe.subwords:,} pieces at {anchor:,} pairs times "
                f"the square root of {pairs:,} / {anchor:,}, in steps of 500 within 1,000 to "
                "32,000: fewer merges for less text")]
    # 2) the model: smaller below the table's rows, chapter 21's (smaller and shallower than
    # the paper's) up to its last row, the paper's base model there
    if pairs < SMALL_CORPUS:
        model, why = {"N": 2, "d_model": 256, "d_ff": 512, "h": 4}, (
            f"under {SMALL_CORPUS:,} pairs, a smaller, shallower model than chapter 21's")
    elif pairs < HUGE_CORPUS:
        model, why = {"N": recipe.N, "d_model": recipe.d_model, "d_ff": recipe.d_ff,
                      "h": recipe.h}, f"chapter 21's model, for {SMALL_CORPUS:,} to "\
                                      f"{HUGE_CORPUS:,} pairs"
    else:
        base = TrainConfig()
        model, why = {"N": base.N, "d_model": base.d_model, "d_ff": base.d_ff, "h": base.h}, (
            f"the paper's base model, from {HUGE_CORPUS:,} pairs")
    choices.append((model, why))
    # 3) dropout: stronger for less text, at the paper's sites
    if pairs < SMALL_CORPUS:
        choices.append(({"dropout": 0.3}, f"three times the paper's rate under "
                        f"{SMALL_CORPUS:,} pairs, at the paper's sites"))
    else:
        choices.append(({"dropout": recipe.dropout}, "the paper's rate at the paper's sites"))
    # 4) the warm-up and the peak rate, factor x d_model^-0.5 x warmup^-0.5 (rate): lr_factor
    # keeps the peak where Multi30k's is (and the paper's: 1 x 512^-0.5 x 4000^-0.5 is the same)
    if pairs >= HUGE_CORPUS:
        micro = max_tokens or recipe.max_tokens
        if accum_iter:  # the given accumulation makes the step: accum_iter micro-batches
            accum, share, step = accum_iter, micro, {}
            size = f"{accum} micro-batch{'es' * (accum > 1)} of {micro} padded tokens a step"
        else:  # micro-batches in one step of 25,000 tokens, a larger one cut to 25,000
            accum = max(1, round(25_000 / micro))
            share = min(micro, 25_000 // accum)  # each micro-batch, as config_for_devices cuts it
            step = {"batch_tokens": 25_000}
            size = (f"25,000 padded tokens a step ({accum} micro-batch{'es' * (accum > 1)} of "
                    f"{share}; the paper's step held about 25,000 source and 25,000 target "
                    "tokens, without padding)")
        # warmup counts micro-batches of max_tokens, which config_for_devices scales by
        # max_tokens / share where it cuts them: 4,000 steps of accum micro-batches after it
        where = "on one device, " if accum_iter else ""  # R devices: R x accum_iter a step
        choices.append((step | {"warmup": round(4_000 * accum * share / micro), "lr_factor": 1.0},
                        f"from {HUGE_CORPUS:,} pairs, {where}the paper's 4,000 warm-up steps and "
                        f"factor 1, so its peak rate on one device, at {size}"))
    else:
        warmup = max(1, round(recipe.warmup * min(1.0, scale)))
        lr_factor = round(recipe.lr_factor * math.sqrt(warmup / recipe.warmup)
                          * math.sqrt(model["d_model"] / recipe.d_model), 4)
        share = ("scaled down with the pairs, so that it covers the same share of the text"
                 if pairs < anchor else "kept, so that it covers a smaller share of more text")
        choices.append(({"warmup": warmup, "lr_factor": lr_factor},
                        f"{recipe.warmup:,} warm-up micro-batches at {anchor:,} pairs, {share}; "
                        "lr_factor keeps the peak rate where Multi30k's is, on one device "
                        "without accum_iter"))
    # 5) the run: Multi30k's optimizer steps for less text (at most 100 epochs), its epochs
    # for more; validation BLEU about as often per run as Multi30k's
    epochs = recipe.epochs if pairs >= anchor else min(100, round(recipe.epochs / scale))
    bleu_every = math.ceil(epochs / recipe.epochs)
    choices.append(({"epochs": epochs, "bleu_every": bleu_every},
                    f"{recipe.epochs} epochs at {anchor:,} pairs"
                    + (", kept" if pairs >= anchor else "; fewer pairs, more epochs (about "
                       "Multi30k's optimizer steps, at most 100 epochs)")
                    + f"; validation BLEU every {bleu_every} epoch(s), about {recipe.epochs} "
                    "times a run"))
    return choices


# %%
import pandas as pd


def peak(fields: dict[str, Any]) -> float:
    """rate's highest value: lr_factor x d_model^-0.5 x (warm-up in optimizer steps)^-0.5."""
    config = config_for_devices(training_config("cpu_fast_dropout", **fields), 1)
    return config.lr_factor * config.d_model**-0.5 * (config.warmup / config.accum_iter) ** -0.5


sizes = [400, 2_000, 29_000, 100_000, 1_000_000]
fields_at = {pairs: {name: value for fields, _ in config_for_corpus(pairs)
                     for name, value in fields.items()}
             for pairs in [*sizes, 50, 9_999, 10_000, 999_999, 4_500_000]}
rows = [{"pairs": f"{pairs:,}"} | fields_at[pairs] | {"peak rate": f"{peak(fields_at[pairs]):.2e}"}
        for pairs in sizes]
columns = dict.fromkeys(name for row in rows for name in row)  # every field, in order
multi30k = fields_at[29_000]
assert training_config("cpu_fast_dropout", **multi30k) == training_config("cpu_fast_dropout")
assert all(abs(peak(fields) / peak(multi30k) - 1) < 0.01 for fields in fields_at.values())
for fields, why in config_for_corpus(400):
    print(" ".join(f"{name}={value}" for name, value in fields.items()) + ": " + why)
pd.DataFrame([{name: row.get(name, "") for name in columns} for row in rows]).set_index("pairs")

# %% [markdown]
# ## The trained models
#
# The book ships its trained models in `book/models/<name>/`: chapter 14's word-level model
# (`multi30k_cpu`), chapter 18's subword model (`multi30k_cpu_subword`) and chapter 21's
# half-hour subword model (`multi30k_cpu_fast_dropout`). `export_for_shipping`
# makes such a folder from a training checkpoint. It keeps the weights in half precision, which
# halves the file and changes few if any translations ({doc}`appendix_distributed` measures it on a small model),
# stores tied weights once, and writes an `info.json` with the configuration, the variant
# (pre-norm or post-norm, read from the weights), the command, the training time, the hardware
# and the history of the run. `load_trained_model` converts the weights back to float32 and
# builds the model from the stored configuration.
#
# Outside a copy of the repository (in Colab, where `pip` installs only the module) the folder
# does not exist, so `fetch_shipped_model` downloads the files from the book's repository into a
# cache folder through `download_file`, which keeps each one only if its SHA-256 checksum is the
# one recorded in `SHIPPED_MODELS`. Files already there are checked against the same checksums,
# once per process. With neither a copy nor a network, `load_trained_model` says how to get the
# model, and trains one (an hour or more on a CPU) only when asked to, with
# `train_if_missing=True`.

# %% tags=["export"]
import functools
import json
import os
import shutil
import sys
from pathlib import Path

import torch

BOOK_REPOSITORY = "https://github.com/annotated-transformer/annotated-transformer-book"
# The tag (or commit) of the repository that this copy of the book comes from: the shipped
# model is downloaded from it, and Colab set-up cells install the package from it.
BOOK_REPOSITORY_REF = "v0.2.0"
# Each shipped model's files and their SHA-256 checksums, verified after a download;
# tests/test_shipped_model.py fails when they differ from the files in book/models/<name>.
# multi30k_cpu is chapter 14's word-level model (averaging.json holds chapter 16's
# measurements); multi30k_cpu_subword is chapter 18's subword model and multi30k_cpu_fast_dropout
# chapter 21's half-hour one (results.json holds each one's measurements).
SHIPPED_MODELS = {
    "multi30k_cpu": {
        "model.pt": "7f5e9f5e59a49d401656ed2332705f93d86d118921e8494f36532f743e696548",
        "vocab_de.json": "6f0d3385a8223f9e43922604b4d9b421394968cfc64257893065b3dd88e15066",
        "vocab_en.json": "6e22d0081b9e032fbce602f62bc5a56aa78326cce2e50fe722217285380daebf",
        "info.json": "10f454fd56b9e37da971bc9886d3e86244eec6b03af5126cf7506ccab548abc7",
        "averaging.json": "3f30d9507d5da87fbfa50dbc63290913bb912a88c31e22ca1eb748ea8af6e27f",
    },
    "multi30k_cpu_subword": {
        "model.pt": "6cdd65383b3780f96df11f28d26eb827bed467bdc412ec2a77de72a324e1f32c",
        "subwords.model": "d3f7fe14d9a0a191b496c0a68c212d32217ee3fd1b5c17dba74eb1cee93def72",
        "info.json": "a0cc04b8e4dd180298fbdd87820d93e13f28ae0d7ada04d4096b1d863eb1e854",
        "results.json": "ba9d83b4e98361e717b0a45eacd7b0898267ef18060b83e4e69b4406bc146816",
    },
    "multi30k_cpu_fast_dropout": {
        "model.pt": "026186e0d9884d7d97c27ef5606507dcc2d6fe1d0a3604ae37a0f30f07d3c273",
        "subwords.model": "d3f7fe14d9a0a191b496c0a68c212d32217ee3fd1b5c17dba74eb1cee93def72",
        "info.json": "36764ca0b351550f05fb4956cd8c0dcef8b40dd122e00bfaa45b98cb0a56948a",
        "results.json": "78eeeb118364a49d7357f936117ce956a5cb2551584a16acf6dc779464ed0c31",
    },
}
SHIPPED_PRESETS = {"multi30k_cpu": "cpu", "multi30k_cpu_subword": "cpu_subword",  # for training
                   "multi30k_cpu_fast_dropout": "cpu_fast_dropout"}
# The shipped model with the best validation BLEU: `make translate` uses it (chapters 18, 21).
BEST_SHIPPED_MODEL = "multi30k_cpu_fast_dropout"


def shipped_model_dir(name: str = "multi30k_cpu") -> Path:
    """book/models/<name> in a copy of the repository; else a cache folder (Colab)."""
    if name not in SHIPPED_MODELS:
        raise ValueError(f"name must be one of {', '.join(SHIPPED_MODELS)}, got {name!r}")
    root = repository_root()
    if root is not None and (root / "book" / "models").is_dir():
        return root / "book" / "models" / name
    return Path.home() / ".cache" / "annotated-transformer" / name


@functools.cache
def verified_file(path: Path, sha256: str, size: int, mtime_ns: int) -> None:
    """Check a present file's SHA-256 once per process (and again if its size or time change)."""
    actual = sha256_of(path)
    if actual != sha256:
        raise ValueError(
            f"{path} is not the shipped file (SHA-256 {actual}, expected {sha256}): delete it "
            "to download it again, restore it with `git checkout`, or, after retraining, put "
            "its new checksum in SHIPPED_MODELS"
        )


def fetch_shipped_model(folder: str | os.PathLike | None = None, *, name: str = "multi30k_cpu",
                        base_url: str | None = None) -> Path:
    """The folder holding the shipped model `name`, every file present and verified.

    Files already there are checked against SHIPPED_MODELS[name] (once per process); each
    missing one comes from the book's repository at BOOK_REPOSITORY_REF (base_url replaces
    the address) through download_file, which keeps it only when its checksum is right.
    """
    folder = shipped_model_dir(name) if folder is None else Path(folder)
    base_url = base_url or f"{BOOK_REPOSITORY}/raw/{BOOK_REPOSITORY_REF}/book/models/{name}"
    for file_name, sha256 in SHIPPED_MODELS[name].items():
        path = folder / file_name
        if path.is_file():
            stat = path.stat()
            verified_file(path.resolve(), sha256, stat.st_size, stat.st_mtime_ns)
            continue
        url = f"{base_url}/{file_name}"
        print(f"downloading {url}", file=sys.stderr)
        try:
            download_file(url, path, sha256=sha256)
        except OSError as err:  # no network, an HTTP error, a timeout, a read-only folder
            raise FileNotFoundError(
                f"the trained model's {file_name} is not in {folder} and could not be "
                f"downloaded from {url} ({err}): connect to the internet and try again, or "
                "train a model with `make train` (an hour or more on a CPU) and pass its "
                "checkpoint, or call load_trained_model(train_if_missing=True)"
            ) from err
    return folder


def export_for_shipping(
    checkpoint: str | os.PathLike, folder: str | os.PathLike, *, command: str | None = None,
    run: str | os.PathLike | None = None,
) -> Path:
    """Write a training checkpoint's weights in half precision, its vocabularies and notes.

    run: the run's last.pt, for the notes (training time, hardware, history) when checkpoint
    holds averaged weights, which have none of their own (chapter 16).
    """
    checkpoint, folder = Path(checkpoint), Path(folder)
    state = load_checkpoint(checkpoint)
    notes = state if run is None else load_checkpoint(run)
    stored: list[tuple[torch.Tensor, torch.Tensor]] = []  # (weights, their stored copy)
    weights = {}
    for name, tensor in state["model"].items():
        same = [copy for seen, copy in stored
                if seen.shape == tensor.shape and torch.equal(seen, tensor)]
        if not same:  # tied weights (equal, also after averaging) are stored once
            same = [tensor.half() if tensor.is_floating_point() else tensor]
            stored.append((tensor, same[0]))
        weights[name] = same[0]  # half the size of float32; load_trained_model converts back
    folder.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"model": weights, "config": state["config"]}, folder / "model.pt")
    fields = TrainConfig.__dataclass_fields__
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in fields})
    for name in vocabulary_files(config):
        shutil.copyfile(checkpoint.parent / name, folder / name)
    info = {
        "config": state["config"],
        "command": command or notes.get("command"),
        "training_seconds": round(notes.get("elapsed_s", 0.0), 1),
        "hardware": notes.get("hardware"),
        "cpu": notes.get("cpu"),  # its flags, kernels and caps (runs since chapter 21 asked)
        # pre-norm stacks end with a layer norm (chapter 2); post-norm ones have none
        "variant": "pre-norm" if "encoder.norm.weight" in weights else "post-norm",
        "epochs": notes.get("epoch"),
        "history": notes.get("history", []),
        "torch": torch.__version__,
    }
    if "averaged_from" in state:
        info["averaged_from"] = [Path(path).name for path in state["averaged_from"]]
    (folder / "info.json").write_text(json.dumps(info, indent=1) + "\n", "utf-8")
    return folder / "model.pt"


# A run's notes keep its command as it was typed. The scripts named in the shipped models' notes
# and the stored measurements are today subcommands of the installed `annotated-transformer`
# command, with the same options; current_command shows a stored command in today's form.
RECORDED_PROGRAMS = {
    "python tools/train.py": "annotated-transformer train",
    "python tools/translate.py": "annotated-transformer translate",
    "python tools/evaluate.py": "annotated-transformer evaluate",
    "python tools/average_checkpoints.py": "annotated-transformer average",
}


def current_command(recorded: str) -> str:
    """A command from a run's notes as a reader types it today, so that no page tells the
    reader to run a script by a path it no longer has."""
    for program, command in RECORDED_PROGRAMS.items():
        recorded = recorded.replace(program, command)
    return recorded


def load_trained_model(
    path: str | os.PathLike | None = None, *, name: str = "multi30k_cpu",
    device: str | torch.device = "cpu", train_if_missing: bool = False,
) -> tuple[EncoderDecoder, Vocab, Vocab, TrainConfig]:
    """A trained model in float32 (eval mode) with its vocabularies and configuration.

    path: a folder from export_for_shipping, or a model.pt / last.pt file with the
    vocabularies beside it; by default the book's shipped model `name` (chapter 14's, chapter
    18's "multi30k_cpu_subword" or chapter 21's "multi30k_cpu_fast_dropout"), downloaded when
    it is missing (outside a copy of the repository). Only with train_if_missing=True does a
    missing model that cannot be downloaded get trained, with its preset (half an hour or more
    on a CPU).
    """
    if path is None:
        path = shipped_model_dir(name)
        try:
            fetch_shipped_model(path, name=name)
        except FileNotFoundError as err:
            if not train_if_missing:
                raise
            config = training_config(SHIPPED_PRESETS[name])
            print(f"{err}\ntraining a model with the {SHIPPED_PRESETS[name]} configuration "
                  f"instead (an hour or more on a CPU; checkpoints in {config.checkpoint_dir})",
                  file=sys.stderr)
            resume = (Path(config.checkpoint_dir) / "last.pt").is_file()  # an earlier try
            train_worker(0, 1, config, resume=resume)
            export_for_shipping(Path(config.checkpoint_dir) / "last.pt", path)
    path = Path(path)
    file = path / "model.pt" if path.is_dir() else path
    state = load_checkpoint(file)
    fields = TrainConfig.__dataclass_fields__
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in fields})
    vocab_src, vocab_tgt = read_run_vocabularies(file.parent, config)
    model = make_model(
        len(vocab_src), len(vocab_tgt), N=config.N, d_model=config.d_model, d_ff=config.d_ff,
        h=config.h, dropout=0.0, share_embeddings=config.share_embeddings,
    )
    model.load_state_dict({key: tensor.float() if tensor.is_floating_point() else tensor
                           for key, tensor in state["model"].items()})
    return model.to(device).eval(), vocab_src, vocab_tgt, config

# %% [markdown]
# The three shipped models, every file checked against its checksum:

# %%
import json

for name in SHIPPED_MODELS:
    folder = fetch_shipped_model(name=name)
    info = json.loads((folder / "info.json").read_text())
    size = sum((folder / file).stat().st_size for file in SHIPPED_MODELS[name]) / 1e6
    print(f"{name}: {len(SHIPPED_MODELS[name])} files, {size:.1f} MB, {info['variant']}, "
          f"{info['epochs']} epochs")

# %% [markdown]
# A copy with one changed byte is refused, and the error says what to do:

# %%
import shutil

with tempfile.TemporaryDirectory() as folder:
    copy = Path(folder) / "multi30k_cpu"
    shutil.copytree(shipped_model_dir(), copy)
    data = bytearray((copy / "info.json").read_bytes())
    data[len(data) // 2] ^= 0x01  # flip one bit in the middle
    (copy / "info.json").write_bytes(bytes(data))
    try:
        fetch_shipped_model(copy)
    except ValueError as err:
        print(str(err).replace(folder, "<folder>").split(" (SHA-256")[0], "...")

# %% [markdown]
# ## Subword vocabularies for large corpora and other scripts
#
# Chapter 17 trains one sentencepiece model on every sentence of both languages, which suits
# Multi30k. Three `TrainConfig` fields (defined with chapter 21's in {doc}`appendix_performance`)
# adapt it to other text: `train_subword_model` trains chapter 17's sentencepiece model with
# them, and `multi30k_vocabularies` grows here to call it. At their defaults they train chapter
# 17's model.
#
# * **A sample.** sentencepiece holds every sentence it trains on in memory, so a corpus of
#   millions of pairs would cost it memory and time in proportion. `subword_sentences` caps the
#   sentences one model sees, a million by default. `sample_sentences` draws them by reservoir
#   sampling: it reads the text once, holds at most the cap, gives every sentence the same
#   chance, and keeps the sample in the order of the text, so a text under the cap is used whole
#   and in order, as chapter 17 uses it. The run's seed draws it, so every rank and every rerun
#   gets the same sample.
# * **Character coverage.** sentencepiece gives the most frequent characters pieces of their own
#   until they cover `character_coverage` of the text's characters; the rarer ones get none and,
#   with byte fallback, are spelled as UTF-8 bytes. The book's 1.0 keeps them all; for languages
#   with thousands of characters, such as Chinese or Japanese, sentencepiece's documentation
#   recommends 0.9995.
# * **Separate vocabularies.** With `share_vocab=False` each language gets its own model of
#   `subwords` pieces, trained on its own side and stored as `subwords_src.model` and
#   `subwords_tgt.model` (`vocabulary_files`), which resuming, `export_for_shipping` and
#   `load_trained_model` read back. For languages written in different scripts, which have few
#   characters in common, each side then keeps all its pieces for itself. Two vocabularies cannot
#   share one embedding matrix, so `share_embeddings` must be off.

# %% tags=["export"]
import io
import os
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SUBWORD_FILES = ("subwords_src.model", "subwords_tgt.model")  # share_vocab=False: one per side


def sample_sentences(sentences: Iterable[str], k: int, *, seed: int = 0) -> list[str]:
    """At most k of the non-empty sentences, each with the same chance, in the order they came
    (all of them when there are no more than k): reservoir sampling, which reads the text once
    and holds only k sentences at a time."""
    rng = random.Random(seed)
    kept: list[tuple[int, str]] = []  # (position among the non-empty sentences, sentence)
    for position, sentence in enumerate(s for s in sentences if s):
        if not isinstance(sentence, str):
            raise TypeError("sentences must hold only strings")
        if len(kept) < k:
            kept.append((position, sentence))
        elif (slot := rng.randrange(position + 1)) < k:  # kept with chance k / (position + 1)
            kept[slot] = (position, sentence)
    return [sentence for _, sentence in sorted(kept, key=lambda item: item[0])]


def train_subword_model(
    sentences: Iterable[str],
    *,
    vocab_size: int = 8000,
    max_sentences: int = 1_000_000,
    character_coverage: float = 1.0,
    seed: int = 0,
) -> Any:
    """Chapter 17's train_sentencepiece model (BPE, lossless, byte fallback, in memory) from at
    most max_sentences of the sentences (sample_sentences with seed: every one, in order, when
    there are no more), with character_coverage, the share of the text's characters that get
    pieces of their own (the rarest others are spelled in bytes)."""
    import sentencepiece as spm

    if isinstance(sentences, str):
        raise TypeError("sentences must be an iterable of sentences, got one str: wrap it")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 4:
        raise ValueError(f"vocab_size must be an integer > 4 (the specials), got {vocab_size!r}")
    if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
        raise ValueError(f"max_sentences must be an integer >= 1, got {max_sentences!r}")
    if isinstance(character_coverage, bool) or not isinstance(character_coverage, int | float) or (
            not 0 < character_coverage <= 1):
        raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage!r}")
    sample = sample_sentences(sentences, max_sentences, seed=seed)
    if not sample:
        raise ValueError("sentences holds no non-empty sentence to train on")
    model = io.BytesIO()
    try:  # chapter 17's options, with character_coverage
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
            model_type="bpe", character_coverage=character_coverage, byte_fallback=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            bos_id=SPECIALS.index("<s>"), bos_piece="<s>",
            eos_id=SPECIALS.index("</s>"), eos_piece="</s>",
            pad_id=SPECIALS.index("<blank>"), pad_piece="<blank>",
            unk_id=SPECIALS.index("<unk>"), unk_piece="<unk>",
            num_threads=1, minloglevel=2,
        )
    except RuntimeError as err:  # e.g. vocab_size larger than the text allows
        raise ValueError(f"sentencepiece could not train vocab_size={vocab_size} (bpe) on "
                         f"{len(sample)} sentences: {err}") from err
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def vocabulary_files(config: TrainConfig) -> tuple[str, ...]:
    """The files that hold a run's vocabularies in its folder: two word vocabularies, one joint
    sentencepiece model, or with share_vocab=False one sentencepiece model per language."""
    if not config.subwords:
        return tuple(VOCAB_FILES)
    return (SUBWORD_FILE,) if config.share_vocab else SUBWORD_FILES


def vocabulary_writers(config: TrainConfig, vocab_src: Any, vocab_tgt: Any
                       ) -> dict[str, Callable[[Path], Any]]:
    """Each of the run's vocabulary files with what writes it, for write_run_files."""
    if not config.subwords:
        return dict(zip(VOCAB_FILES, (vocab_src.save, vocab_tgt.save), strict=True))

    def writer(proto: bytes) -> Callable[[Path], Any]:
        return lambda path: Path(path).write_bytes(proto)

    models = (vocab_src,) if config.share_vocab else (vocab_src, vocab_tgt)
    return {name: writer(sp.serialized_model_proto())
            for name, sp in zip(vocabulary_files(config), models, strict=True)}


def read_run_vocabularies(folder: str | os.PathLike, config: TrainConfig) -> tuple[Any, Any]:
    """The vocabularies that a run with this config wrote into folder (vocabulary_files)."""
    if not config.subwords or config.share_vocab:
        return read_vocabularies(folder, subwords=config.subwords > 0)
    paths = [Path(folder) / name for name in SUBWORD_FILES]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"the run's vocabularies are missing: {', '.join(missing)}")
    return load_subwords(paths[0]), load_subwords(paths[1])


# %% tags=["export", "extends"]
from collections.abc import Sequence
from typing import Any


def multi30k_vocabularies(
    config: TrainConfig,
    tokenizers: tuple[Any, Any],
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    save: bool = True,
) -> tuple[Vocab, Vocab]:
    """Chapter 17's vocabularies, with sentencepiece trained as config says (train_subword_model):
    on a sample of at most subword_sentences sentences, with character_coverage, and with
    share_vocab=False one model per language; save=True writes them into the checkpoint
    folder."""
    if pairs is None:  # train only: val and test stay unseen
        pairs = load_multi30k("train")[: config.train_limit]
    if config.subwords:
        options = {"vocab_size": config.subwords, "max_sentences": config.subword_sentences,
                   "character_coverage": config.character_coverage, "seed": config.seed}
        if config.share_vocab:  # both languages, pair by pair, as chapter 17 trains it
            sp = train_subword_model((s for pair in pairs for s in pair), **options)
            vocabs = (sp, sp)
        else:  # each language on its own side
            vocabs = tuple(train_subword_model((pair[side] for pair in pairs), **options)
                           for side in (0, 1))
    else:
        token_pairs = tokenize_pairs(pairs, *tokenizers)
        vocabs = tuple(Vocab.build([pair[side] for pair in token_pairs], min_freq=config.min_freq)
                       for side in (0, 1))
    if save:
        write_run_files(config.checkpoint_dir, vocabulary_writers(config, *vocabs))
    return vocabs


# %% [markdown]
# At the defaults the grown functions train chapter 17's model on Multi30k, byte for byte (with
# the sentencepiece version that `constraints.txt` pins, that is the shipped `subwords.model`;
# another version may train other pieces). A small sample keeps the order of the text. Then separate
# German and English models, each from a capped sample, and how many of their pieces are single
# characters at full coverage and at 0.9995:

# %%
from dataclasses import replace

train = load_multi30k("train")
recipe = training_config(SHIPPED_PRESETS[BEST_SHIPPED_MODEL])
chapter_17 = train_sentencepiece([s for pair in train for s in pair], vocab_size=recipe.subwords)
joint, same = multi30k_vocabularies(recipe, (None, None), pairs=train, save=False)
assert joint is same and joint.serialized_model_proto() == chapter_17.serialized_model_proto()
print(f"defaults, {2 * len(train):,} sentences: {len(joint):,} pieces, chapter 17's model "
      "byte for byte")
print("a sample of 3:", sample_sentences(["a", "b", "", "c", "d", "e", "f"], 3, seed=0))

separate = replace(recipe, subwords=4000, subword_sentences=10_000, share_vocab=False,
                   share_embeddings=False)
for coverage in (1.0, 0.9995):
    models = multi30k_vocabularies(replace(separate, character_coverage=coverage), (None, None),
                                   pairs=train, save=False)
    characters = [sum(len(sp.id_to_piece(i)) == 1 and not sp.is_byte(i) for i in range(len(sp)))
                  for sp in models]
    print(f"share_vocab=False, coverage {coverage}: {len(models[0]):,} German and "
          f"{len(models[1]):,} English pieces, each from a sample of 10,000 of "
          f"{len(train):,} sentences; {characters[0]} and {characters[1]} of them one character")

# %% [markdown]
# ## A corpus encoded once, on disk
#
# Chapter 14 keeps every training pair's ids as Python lists, and chapter 22's ranks each encode
# and sort the whole text themselves. At Multi30k's size that costs little. The paper's WMT 2014
# English-German set has 4.5 million sentence pairs {cite}`vaswani2017attention`, and there
# lists of Python integers take memory in proportion to the text, on every rank: by arithmetic,
# a Python integer and its slot in a list take about 36 bytes an id, 18 times the two bytes an id
# of the encoded files measured below: some 8 GB a rank at that size. The path below is the
# one that binarized data sets take in fairseq {cite}`ott2019fairseq`: encode the text once, store
# the ids as compact arrays on disk, and let every rank map the same files.
#
# `encode_corpus` takes the two sides as iterables of lines (`read_lines` streams a plain or
# gzipped file; the train command streams `--train`'s files), encodes a chunk of lines at a time with the sentencepiece model, and appends the ids of the pairs
# that fit `max_len` to one flat array per side, with each pair's length beside them. Pairs that do
# not fit are left out and counted, as `filter_by_length` counts them. The ids are `uint16` (two
# bytes each) when the vocabulary has at most 65,536 pieces. A header, `corpus.json`, is written
# last, so a folder without it is an encoding that did not finish.

# %% tags=["export"]
import gzip
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

CORPUS_HEADER = "corpus.json"  # written last: a folder without it is an unfinished encoding
CORPUS_MODELS = ("src.model", "tgt.model")  # the sentencepiece models that made the ids


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """A plain or gzipped UTF-8 file's lines one at a time (no BOM, no line ends), so that a
    corpus of any size is read in constant memory."""
    path = Path(path)
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    with (gzip.open if gzipped else open)(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: line {number} is not valid UTF-8 (byte "
                                 f"{raw[err.start]:#04x} at column {err.start + 1})") from None


def model_sha256(sp: Any) -> str:
    """The SHA-256 of a sentencepiece model's bytes: which ids a corpus holds."""
    return hashlib.sha256(sp.serialized_model_proto()).hexdigest()


def write_npy(path: Path, raw: Path, dtype: np.dtype, count: int) -> None:
    """path as an .npy file holding the count values of dtype written raw into raw (a copy
    in blocks: the array is never in memory), and raw deleted."""
    with path.open("wb") as out, raw.open("rb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                  "fortran_order": False, "shape": (count,)}
        np.lib.format.write_array_header_2_0(out, header)
        while block := f.read(1 << 24):
            out.write(block)
    raw.unlink()


def encode_corpus(
    src_lines: Iterable[str], tgt_lines: Iterable[str], sp: Any, folder: str | os.PathLike, *,
    max_len: int, sp_tgt: Any = None, chunk_size: int = 50_000, num_threads: int = 1,
) -> dict[str, Any]:
    """Encode a parallel text once, in chunks, into flat id arrays on disk that any number of
    training processes map (EncodedCorpus) instead of each encoding the text again.

    Pairs that do not fit max_len with `<s>` and `</s>` are left out and counted, as
    filter_by_length does. sp encodes both sides unless sp_tgt encodes the target. Writes, into
    folder: src_tokens.npy and tgt_tokens.npy (every kept pair's ids, one after the other;
    uint16 when the vocabulary fits it), src_lengths.npy and tgt_lengths.npy, the models, and
    last corpus.json, the header it returns: counts, max_len, dtype and the models' SHA-256.
    """
    filter_by_length([], max_len=max_len)  # the same check of max_len as chapter 14's
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    sps = (sp, sp if sp_tgt is None else sp_tgt)
    size = max(s.get_piece_size() for s in sps)
    dtype = np.dtype(np.uint16 if size <= 1 << 16 else np.int32)
    length_dtype = np.dtype(np.uint16 if max_len <= 1 << 16 else np.int32)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CORPUS_HEADER).unlink(missing_ok=True)  # unfinished until the header is back
    raws = [folder / f"{side}_tokens.raw" for side in ("src", "tgt")]
    lengths: list[list[np.ndarray]] = [[], []]
    read = kept = 0
    end = object()  # marks the shorter side's end
    pairs = itertools.zip_longest(src_lines, tgt_lines, fillvalue=end)
    with raws[0].open("wb") as src_out, raws[1].open("wb") as tgt_out:
        while chunk := list(itertools.islice(pairs, chunk_size)):
            if chunk[-1][0] is end or chunk[-1][1] is end:
                short = "source" if chunk[-1][0] is end else "target"
                done = read + sum(end not in pair for pair in chunk)
                raise ValueError(f"the {short} side ends after {done:,} lines but the other "
                                 "goes on: a parallel text has as many lines on both sides")
            # 1) both sides' ids, 2) which pairs fit max_len, 3) append the kept ones
            ids = [s.encode([pair[side] for pair in chunk], num_threads=num_threads)
                   for side, s in enumerate(sps)]
            n = [np.fromiter(map(len, side), dtype=np.int64, count=len(chunk)) for side in ids]
            keep = np.maximum(n[0], n[1]) + 2 <= max_len
            for side, out in enumerate((src_out, tgt_out)):
                flat = itertools.chain.from_iterable(itertools.compress(ids[side], keep))
                out.write(np.fromiter(flat, dtype=dtype, count=int(n[side][keep].sum()))
                          .tobytes())
                lengths[side].append(n[side][keep].astype(length_dtype))
            read, kept = read + len(chunk), kept + int(keep.sum())
    header = {"format": "EncodedCorpus", "version": 1, "pairs": kept, "read": read,
              "dropped": read - kept, "max_len": max_len, "dtype": dtype.name,
              "vocab_src_sha256": model_sha256(sps[0]),
              "vocab_tgt_sha256": model_sha256(sps[1])}
    for side, raw, chunks in zip(("src", "tgt"), raws, lengths, strict=True):
        counts = np.concatenate([np.zeros(0, dtype=length_dtype), *chunks])
        header[f"{side}_tokens"] = int(counts.sum(dtype=np.int64))
        write_npy(folder / f"{side}_tokens.npy", raw, dtype, header[f"{side}_tokens"])
        np.save(folder / f"{side}_lengths.npy", counts)
    for s, name in zip(sps, CORPUS_MODELS, strict=True):
        (folder / name).write_bytes(s.serialized_model_proto())
    (folder / CORPUS_HEADER).write_text(json.dumps(header, indent=1) + "\n", "utf-8")
    return header


# %% [markdown]
# `EncodedCorpus` opens such a folder with `numpy.load(mmap_mode="r")`: the arrays are mapped,
# not read. `corpus[i]` reads pair $i$'s ids from the mapped pages when a batch asks for them, and
# the operating system keeps one copy of each page in memory for all the processes that map the
# file. A rank's own memory holds where each pair starts (eight bytes a pair a side), the pairs'
# lengths, a permutation of all pairs and the epoch's batches of every rank, but none of the ids. Sent to another
# process, the corpus travels as its folder's name, and that process maps the files itself.

# %% tags=["export"]
import json
import operator
import os
from pathlib import Path
from typing import Any

import numpy as np


class EncodedCorpus:
    """A corpus that encode_corpus wrote, memory-mapped: the ids stay on disk, and the pages
    that batches read are shared by every process that maps the same files.

    corpus[i] is pair i's (source ids, target ids) as encode_examples gives them, corpus[:n]
    its first n pairs (as does EncodedCorpus(folder, n)); src_lengths and tgt_lengths count
    each pair's ids (without `<s>` and `</s>`).
    """

    def __init__(self, folder: str | os.PathLike, pairs: int | None = None) -> None:
        self.folder = Path(folder)
        path = self.folder / CORPUS_HEADER
        if not path.is_file():
            raise FileNotFoundError(f"{self.folder} holds no finished encoded corpus (no "
                                    f"{CORPUS_HEADER}): encode it with encode_corpus")
        self.header = json.loads(path.read_text("utf-8"))
        if self.header.get("format") != "EncodedCorpus":
            raise ValueError(f"{path} is not the header of an encoded corpus")
        self.src_tokens, self.tgt_tokens, src_lengths, tgt_lengths = (
            np.load(self.folder / f"{name}.npy", mmap_mode="r")
            for name in ("src_tokens", "tgt_tokens", "src_lengths", "tgt_lengths"))
        if not len(src_lengths) == len(tgt_lengths) == self.header["pairs"]:
            raise ValueError(f"{self.folder}: the length arrays do not hold the "
                             f"{self.header['pairs']} pairs that {CORPUS_HEADER} counts")
        self.pairs = len(src_lengths) if pairs is None else min(pairs, len(src_lengths))
        self.src_lengths, self.tgt_lengths = src_lengths[: self.pairs], tgt_lengths[: self.pairs]
        # where each pair's ids start, in the process's own memory (8 bytes a pair a side)
        self.src_starts = np.concatenate([[0], np.cumsum(self.src_lengths, dtype=np.int64)])
        self.tgt_starts = np.concatenate([[0], np.cumsum(self.tgt_lengths, dtype=np.int64)])

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its folder and size: a process it is sent to maps the files itself."""
        return EncodedCorpus, (str(self.folder), self.pairs)

    def __len__(self) -> int:
        return self.pairs

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            if i.start not in (None, 0) or i.step not in (None, 1):
                raise ValueError(f"an encoded corpus is cut from its start only (corpus[:n]), "
                                 f"got [{i.start}:{i.stop}:{i.step}]")
            return EncodedCorpus(self.folder, range(self.pairs)[i].stop)
        i = operator.index(i)
        if not -self.pairs <= i < self.pairs:
            raise IndexError(f"pair {i} is out of range for a corpus of {self.pairs} pairs")
        i %= self.pairs
        return (self.src_tokens[self.src_starts[i] : self.src_starts[i + 1]].tolist(),
                self.tgt_tokens[self.tgt_starts[i] : self.tgt_starts[i + 1]].tolist())

    def vocabularies(self) -> tuple[Any, Any]:
        """The sentencepiece models that encoded the two sides (one object twice when joint)."""
        src = load_subwords(self.folder / CORPUS_MODELS[0])
        if self.header["vocab_src_sha256"] == self.header["vocab_tgt_sha256"]:
            return src, src
        return src, load_subwords(self.folder / CORPUS_MODELS[1])


# %% [markdown]
# Batches need only the lengths. `StoredLengthSampler` makes exactly `TokenBudgetSampler`'s
# batches, but with numpy: the random order, the stable sort of each pool by length and the
# shuffle of the batches draw the same random numbers, and a batch is cut where the next example
# would push its padded size over `max_tokens`. In a pool sorted by the longer side, a batch's
# padded size is its size times its last example's longer side, so each cut is one vectorized
# comparison instead of a Python loop over the examples (only the first check of the lengths,
# `check_token_budget`'s, still walks them as Python lists). `corpus_loader` is `multi30k_loader` for
# an encoded corpus.

# %% tags=["export"]
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler


class StoredLengthSampler(Sampler[list[int]]):
    """TokenBudgetSampler's batches, the same ones, computed with numpy from length arrays:
    no Python object per example in the batches (check_token_budget walks the lengths once as
    lists), so a rank's batches of millions of pairs stay small."""

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, max_tokens: int,
                 pool_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__()
        self.src_lengths = np.asarray(src_lengths, dtype=np.int32)  # (examples,)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int32)  # (examples,)
        check_token_budget(self.src_lengths.tolist(), self.tgt_lengths.tolist(),
                           max_tokens=max_tokens, pool_size=pool_size,
                           num_replicas=num_replicas, rank=rank)
        self.max_tokens = max_tokens
        self.pool_size = pool_size or len(self.src_lengths)
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.num_replicas, self.rank = num_replicas, rank
        self._cache: tuple[int, list[np.ndarray]] | None = None  # (epoch, its batches)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch and with it the order; call it with the same epoch on every rank."""
        self.epoch = epoch

    def _fill(self, pool: np.ndarray, longest: np.ndarray) -> list[np.ndarray]:
        """Cut a pool sorted by its longer sides into batches, as TokenBudgetSampler's _fill.

        A batch's padded size is its size times its last (longest) example's longer side, so
        a batch from `start` takes examples while (k + 1) x longest[start + k] fits."""
        batches, start = [], 0
        while start < len(pool):
            window = longest[start : start + self.max_tokens // int(longest[start]) + 1]
            padded = np.arange(1, len(window) + 1) * window  # the size with each next example
            over = padded > self.max_tokens
            size = int(np.argmax(over)) if over.any() else len(window)
            batches.append(pool[start : start + size])
            start += size
        return batches

    def batches(self) -> list[np.ndarray]:
        """All ranks' batches of this epoch, in order (rank r takes every num_replicas-th)."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        n = len(self.src_lengths)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).numpy() if self.shuffle else np.arange(n)
        batches = []
        for start in range(0, n, self.pool_size):
            # 1) shuffled pool, 2) sorted by (longer, src, tgt) length, stable, 3) cut
            pool = order[start : start + self.pool_size]
            src, tgt = self.src_lengths[pool], self.tgt_lengths[pool]
            longest = np.maximum(src, tgt)
            by_length = np.lexsort((tgt, src, longest))  # the last key sorts first
            batches += self._fill(pool[by_length], longest[by_length])
        batches = split_batches_for_ranks(batches, self.num_replicas)  # the same count per rank
        if self.shuffle:  # 4) shuffle the batches themselves
            batches = [batches[j] for j in torch.randperm(len(batches), generator=generator)]
        self._cache = (self.epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches()[self.rank :: self.num_replicas]:
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self.batches()) // self.num_replicas


def corpus_loader(corpus: EncodedCorpus, *, max_tokens: int, shuffle: bool, seed: int = 0,
                  num_replicas: int = 1, rank: int = 0) -> DataLoader:
    """multi30k_loader for an encoded corpus: batches from its stored lengths, ids read from
    the mapped files only when a batch is drawn."""
    sampler = StoredLengthSampler(
        corpus.src_lengths.astype(np.int32) + 2, corpus.tgt_lengths.astype(np.int32) + 2,
        max_tokens=max_tokens, shuffle=shuffle, seed=seed, num_replicas=num_replicas, rank=rank,
    )  # with <s> and </s>, as example_lengths counts
    return DataLoader(corpus, batch_sampler=sampler, collate_fn=collate_to_batch)


# %% [markdown]
# Multi30k's training set, encoded with the shipped subword model: the corpus on disk holds the
# pairs that `encode_examples` gives, in its order, and for each of two ranks the stored lengths
# give `TokenBudgetSampler`'s batches.

# %%
import tempfile

sp = load_subwords(fetch_shipped_model(name="multi30k_cpu_fast_dropout") / SUBWORD_FILE)
recipe = training_config("cpu_fast_dropout")
pairs = load_multi30k("train")
with tempfile.TemporaryDirectory() as folder:
    header = encode_corpus((de for de, _ in pairs), (en for _, en in pairs), sp, folder,
                           max_len=recipe.max_len)
    corpus = EncodedCorpus(folder)
    print(f"{header['read']:,} pairs read, {header['dropped']} left out for max_len="
          f"{header['max_len']}, {header['src_tokens'] + header['tgt_tokens']:,} ids stored as "
          f"{header['dtype']}")
    examples = encode_examples(pairs, sp, sp, (None, None), max_len=recipe.max_len)
    print("the pairs of encode_examples, in its order:",
          [corpus[i] for i in range(len(corpus))] == examples)
    for rank in range(2):  # each of two ranks, as chapter 22 deals them
        options = {"max_tokens": recipe.max_tokens, "num_replicas": 2, "rank": rank}
        in_memory = TokenBudgetSampler(*example_lengths(examples), **options)
        stored = corpus_loader(corpus, shuffle=True, **options).batch_sampler
        print(f"rank {rank}: {len(stored)} batches, TokenBudgetSampler's:",
              list(stored) == list(in_memory))
    del corpus, stored  # unmapped before the folder goes (Windows cannot delete mapped files)

# %% [markdown]
# `train_worker` trains on an encoded corpus when `pairs["train"]` is an `EncodedCorpus`:
# `load_data` then hands over to `load_encoded_data`, which takes the corpus's own subword models
# (a resumed run refuses a corpus encoded with other models than its checkpoint's), refuses a
# corpus cut at another `max_len` than the run's, or with one vocabulary per side for a run that
# shares one, and encodes only the validation pairs in memory. `annotated-transformer train --corpus-dir DIR`
# takes this path: the first process encodes the training pairs into `DIR` once, with the run's
# subword models, before any rank loads data, and later runs on the same text reuse the folder.
# That saves the encoding only: each run still reads the whole text, to check and hash it, and,
# unless it resumes, reads it again to draw sentencepiece's sample and trains the subword model
# on it (which must come out the same as the folder's). Under torchrun every process does this,
# so eight processes on one machine pay sentencepiece's time and memory, below, eight times;
# `--devices 8` pays them once, in the process that starts the others, but only torchrun
# restarts a failed process. On several machines `DIR` must be on storage that all of them see, like the
# checkpoint folder; a process that never sees rank 0 begin encoding stops after `CORPUS_WAIT_S`
# with one line naming `DIR`.

# %% [markdown]
# `tools/bench_data.py` measured this path on generated corpora of 0.1, 1 and 4.5 million pairs
# (made-up lower-case words from a fixed list a language, with Zipf-like frequencies),
# each step in a fresh process (`book/data/bench_data_cpu.json`): the size on disk, the speed and
# peak memory of encoding and of training sentencepiece on its sample, and what one rank holds
# while it draws batches, in its own memory and in mapped pages of the corpus, which every rank
# shares. The machine was shared with other work, so the speeds are rough. Real text, with hundreds of
# characters and far more word types, makes sentencepiece's training slower and larger, so its
# column is a lower bound.

# %%
bench = book_data("bench_data_cpu.json")  # written by tools/bench_data.py
machine, settings = bench["machine"], bench["settings"]
print(f"{machine['cpu']}, {machine['cores']} cores, one thread; a rank is 1 of "
      f"{settings['ranks']}, batches of {settings['max_tokens']} padded tokens")
print(f"{'pairs':>10} {'on disk':>8} {'encoding':>11} {'its peak':>9} "
      f"{'sentencepiece peak':>19} {'a rank: own':>12} {'mapped':>7}")
for size in bench["sizes"]:
    print(f"{size['pairs_read']:>10,} {size['disk_mb']:>5.0f} MB {size['pairs_per_s']:>7,}/s "
          f"{size['encode_peak_mb']:>6.0f} MB {size['subwords_peak_mb']:>16.0f} MB "
          f"{size['rank_private_mb']:>9.0f} MB {size['rank_mapped_mb']:>4.0f} MB")
largest = max(bench["sizes"], key=lambda size: size["pairs_read"])
assert largest["pairs_read"] >= 4_500_000, "the benchmark should reach the paper's size"
assert largest["rank_private_mb"] + largest["rank_mapped_mb"] < 1_000, "a rank's data under 1 GB"

# %% [markdown]
# Look at what grows with the text and what does not. The files on disk and a rank's mapped
# pages grow in proportion to the pairs, and the mapped pages are one copy for all the ranks of a
# machine. Encoding's peak stays nearly flat: it holds one chunk of lines at a time, and only the kept
# pairs' lengths (two bytes a pair a side) grow; and
# sentencepiece's stops growing once the text passes its sample's cap. A rank's own memory, the
# offsets and lengths of the pairs and its batches, grows with the pairs too, but at the paper's
# size the rank's data stays under a gigabyte.

# %% tags=["export"]
from typing import Any


def load_encoded_data(process: Process, config: TrainConfig,
                      pairs: dict[str, Any], *, resuming: bool) -> RunData:
    """load_data for pairs["train"] an EncodedCorpus: its own subword models (the checkpoint's
    when resuming, which must be the same), val encoded here, train batched from its stored
    lengths; every rank maps the files that were encoded once."""
    corpus: EncodedCorpus = pairs["train"]
    header = corpus.header
    if header["max_len"] != config.max_len:
        raise ValueError(f"the encoded corpus {corpus.folder} was cut at max_len="
                         f"{header['max_len']} but the run has max_len={config.max_len}: "
                         "encode it again with the run's max_len")
    if config.share_vocab and header["vocab_src_sha256"] != header["vocab_tgt_sha256"]:
        raise ValueError(f"the encoded corpus {corpus.folder} has one vocabulary per side but "
                         "the run shares one (share_vocab=True): encode both sides with one")

    def vocabularies() -> tuple[Any, Any]:
        if resuming:
            return read_run_vocabularies(config.checkpoint_dir, config)
        return corpus.vocabularies()

    vocab_src, vocab_tgt = from_rank0(process, vocabularies)
    stored = (header["vocab_src_sha256"], header["vocab_tgt_sha256"])
    if (model_sha256(vocab_src), model_sha256(vocab_tgt)) != stored:
        raise ValueError(f"the encoded corpus {corpus.folder} holds the ids of other subword "
                         f"models than {config.checkpoint_dir}'s: encode it again")
    if config.subwords != len(vocab_src):
        raise ValueError(f"subwords={config.subwords} but the encoded corpus {corpus.folder} "
                         f"has {len(vocab_src)} pieces: set subwords={len(vocab_src)}")
    val_data = encode_examples(pairs["val"], vocab_src, vocab_tgt, (None, None),
                               max_len=config.max_len)
    shard = {"max_tokens": config.max_tokens, "num_replicas": process.world_size,
             "rank": process.rank, "seed": config.seed}
    train_loader = corpus_loader(corpus, shuffle=True, **shard)
    val_loader = multi30k_loader(val_data, shuffle=False, **shard)
    # the training pairs that max_len left out were counted when the corpus was encoded
    return RunData(vocab_src, vocab_tgt, train_loader, val_loader, list(pairs["val"]),
                   (None, None), (header["dropped"], len(pairs["val"]) - len(val_data)))
