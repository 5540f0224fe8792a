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
    SUBWORD_FILE,
    VOCAB_FILES,
    EncoderDecoder,
    TokenBudgetSampler,
    TrainConfig,
    Vocab,
    config_for_devices,
    download_file,
    enable_book_charts,
    load_checkpoint,
    make_model,
    read_vocabularies,
    repository_root,
    save_checkpoint,
    sha256_of,
    train_worker,
    training_config,
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
# pairs, and `tools/train.py --langs en fr` trains a translator on them (chapter 18).

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
# `tools/train.py --train SRC TGT --valid SRC TGT` trains on a text of any size, and the settings
# that suit Multi30k do not suit them all: a few hundred pairs are spread thin over 8,000
# subwords, and a run on them would end before a 2,000-step warm-up does. Chapter 18's table of
# settings by data size says in which direction each setting moves; `config_for_corpus` is this
# book's extrapolation of those directions into numbers, anchored at Multi30k's 29,000 pairs,
# which get chapter 21's recipe, `cpu_fast_dropout`, unchanged. The thresholds and amounts are
# the book's own choices, and no run checks any size but 29,000. Under 10,000 pairs, below the
# table's rows, the model is smaller and dropout 0.3 (the table says only "above the paper's
# rate at the small end"); chapter 21's model, already smaller and shallower than the paper's,
# serves up to a million pairs, and the table's last row, millions, gets the paper's base model
# and its 4,000-step warm-up at 25,000 padded tokens a step. The vocabulary grows with the square
# root of the text (the book's rule, within the table's "fewer merges" for less text). Fewer
# pairs than Multi30k's get a warm-up that covers the same share of the text and more epochs, up
# to about as many optimizer steps as the Multi30k run; at every size `lr_factor` keeps the
# rate's peak where Multi30k's is, which is also the paper's. Each choice comes with its reason,
# which the training script prints. These are starting points, not settings tuned on each size:
# `--set` changes any of them, and `--config` trains a preset as it is.

# %% tags=["export"]
import math
from typing import Any

# pairs: the book's own thresholds, one below the table's rows and one at its last, untried
SMALL_CORPUS, HUGE_CORPUS = 10_000, 1_000_000


def config_for_corpus(pairs: int) -> list[tuple[dict[str, Any], str]]:
    """The TrainConfig fields that depend on how many training pairs there are, in groups,
    each with its reason: the book's extrapolation of the directions in chapter 18's table,
    anchored at Multi30k's size, which gets cpu_fast_dropout's values. Every size peaks at
    Multi30k's rate, which is also the paper's (6.99e-4)."""
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
        accum = round(25_000 / recipe.max_tokens)  # micro-batches in one step of 25,000 tokens
        choices.append(({"batch_tokens": 25_000, "warmup": 4_000 * accum, "lr_factor": 1.0},
                        f"from {HUGE_CORPUS:,} pairs, the paper's 4,000 warm-up steps and factor "
                        f"1, so its peak rate, at 25,000 padded tokens a step ({accum} "
                        f"micro-batches of {recipe.max_tokens}; the paper's step held about "
                        "25,000 source and 25,000 target tokens, without padding)"))
    else:
        warmup = max(1, round(recipe.warmup * min(1.0, scale)))
        lr_factor = round(recipe.lr_factor * math.sqrt(warmup / recipe.warmup)
                          * math.sqrt(model["d_model"] / recipe.d_model), 4)
        share = ("scaled down with the pairs, so that it covers the same share of the text"
                 if pairs < anchor else "kept, so that it covers a smaller share of more text")
        choices.append(({"warmup": warmup, "lr_factor": lr_factor},
                        f"{recipe.warmup:,} warm-up micro-batches at {anchor:,} pairs, {share}; "
                        "lr_factor keeps the peak rate where Multi30k's is"))
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
    subwords = state["config"].get("subwords", 0) > 0
    for name in [SUBWORD_FILE] if subwords else VOCAB_FILES:
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
    vocab_src, vocab_tgt = read_vocabularies(file.parent, subwords=config.subwords > 0)
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
