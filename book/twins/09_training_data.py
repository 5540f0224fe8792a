# %% [markdown]
# # Training data and batching
#
# Section 5.1 of the paper spends four sentences on data, and they carry two decisions that
# shape everything after them. The first is what a token is: {cite:t}`vaswani2017attention`
# trained on the 4.5 million English-German sentence pairs of WMT 2014 and split words into
# byte-pair pieces {cite}`sennrich2016neural` from a vocabulary of about 37,000 shared by both
# languages. The second is what a batch is: not a fixed number of sentences but sentences of
# *similar length*, gathered until a batch held roughly 25,000 source and 25,000 target tokens.
#
# This chapter builds the same pipeline at a scale a laptop can hold. The data is Multi30k
# {cite}`elliott2016multi30k`: about 31,000 short English descriptions of photographs, each with
# a German translation. We read it, cut it into words, give every frequent word an id, and then
# build the part the paper cares about: a sampler that fills batches up to a token budget. At
# the end we measure what that buys.

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
    bar_chart,
    download_file,
    enable_book_charts,
    repository_root,
    sha256_of,
)

enable_book_charts()

# %% [markdown]
# ## Multi30k
#
# Multi30k's first task comes in three splits that the literature uses again and again: 29,000
# pairs for training, 1,014 for validation and the 1,000 pairs of the 2016 Flickr test set. Each
# split is two gzipped text files, one sentence per line, where line $i$ of the German file
# translates line $i$ of the English one.
#
# Data that arrives over the network can arrive broken, and a broken download that is read
# anyway fails much later and far from the cause (a model that trains on half a file, a BLEU
# score that nobody can reproduce). So the loader checks every file against its published
# SHA-256 checksum before reading it, downloads a missing file into a temporary file that is
# renamed only once its checksum is right, and when something is wrong says which file and
# what to do about it. It looks for the files in this order: the `data_dir` argument, the folder
# named by the environment variable `MULTI30K_DIR`, a shared copy at `../shared/data/multi30k`
# next to the repository (this is how the book's tests run offline), and a cache folder in the
# home directory.
# The download and the checksum are the book's plumbing, used again for the trained model of
# chapter 14; their code is in the appendix {doc}`appendix_infrastructure`.

# %% tags=["export"]
import gzip
import os
from pathlib import Path

MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SPLITS = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}


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
# All three splits, and the first training pair:

# %%
splits = {split: load_multi30k(split) for split in MULTI30K_SPLITS}
for split, pairs in splits.items():
    print(f"{split:>16}: {len(pairs):,} pairs")
train_pairs = splits["train"]
print(train_pairs[0])

# %% [markdown]
# The captions are short and plain, which makes Multi30k a good first translation task: small
# enough to train on in Part III, real enough to be interesting. The sizes match the published
# ones, and every file passed its checksum on the way in.
#
# ## Tokens
#
# A model sees a sentence as a sequence of ids from a fixed vocabulary, so first the sentence
# must be cut into tokens. The paper used byte-pair encoding, which splits rare words into
# frequent pieces and so never meets a word it cannot spell. With 29,000 captions a simpler
# choice does well: whole words and punctuation marks, cut by the rule-based tokenizers of
# spaCy {cite}`honnibal2020spacy` for German and English. A *blank* spaCy pipeline holds only
# those rules (no statistical model), so nothing has to be downloaded beyond the spaCy package
# itself; and spaCy is imported inside the function, so that the book's module stays importable
# without it.
#
# A few training captions contain doubled spaces. spaCy keeps such a space as a token of its
# own; `tokenize` drops it, since a space is not a word to translate.

# %% tags=["export"]
from collections.abc import Sequence
from typing import Any


def load_tokenizers() -> tuple[Any, Any]:
    """spaCy's rule-based German and English tokenizers (blank pipelines: nothing to download)."""
    import spacy

    return spacy.blank("de"), spacy.blank("en")


def tokenize(text: str, tokenizer: Any) -> list[str]:
    """The tokens of one sentence, without the tokens spaCy makes of doubled spaces."""
    split = getattr(tokenizer, "tokenizer", tokenizer)  # a spaCy pipeline, or its tokenizer
    return [token.text for token in split(text) if not token.is_space]


def tokenize_pairs(
    pairs: Sequence[tuple[str, str]], tokenizer_src: Any, tokenizer_tgt: Any
) -> list[tuple[list[str], list[str]]]:
    """Each sentence pair as two lists of tokens."""
    return [(tokenize(src, tokenizer_src), tokenize(tgt, tokenizer_tgt)) for src, tgt in pairs]


# %% [markdown]
# We tokenize every split once and keep the tokens; everything after this works on them.

# %%
import time

spacy_de, spacy_en = load_tokenizers()
start = time.perf_counter()
tokens = {split: tokenize_pairs(pairs, spacy_de, spacy_en) for split, pairs in splits.items()}
seconds = time.perf_counter() - start
n_sentences = 2 * sum(len(pairs) for pairs in splits.values())
print(f"tokenized {n_sentences:,} sentences in {seconds:.1f} s")
train_tokens = tokens["train"]
print(train_tokens[0][0])
print(train_tokens[0][1])

# %% [markdown]
# A few seconds for all of it on this book's two-core CPU: rule-based tokenization is cheap.
# Note how "young," became two tokens, "young" and ",", while "Büsche." lost its full stop to a
# token of its own.
#
# ## How long the sentences are
#
# Length matters twice: it decides how much a batch of sentences costs, and how much of a batch
# is wasted on padding when short and long sentences share it. Here is the distribution of
# sentence lengths, in tokens, in the training set.

# %% tags=["export", "hide-cell"]
from collections import Counter


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


# %%
for language, side in [("German", 0), ("English", 1)]:
    sizes = sorted(len(pair[side]) for pair in train_tokens)
    print(
        f"{language:>7}: mean {sum(sizes) / len(sizes):.1f} tokens, median "
        f"{sizes[len(sizes) // 2]}, 99th percentile {sizes[int(0.99 * len(sizes))]}, "
        f"longest {sizes[-1]}"
    )

length_histogram(train_tokens, title="Multi30k training sentences by length")

# %% [markdown]
# Half the captions have 12 tokens or fewer and 99% have at most 26, but the tail goes on: the
# longest sentence is more than three times the median. A batch that puts one of those next to
# thirty typical sentences pads all thirty to its length.
#
# ## A vocabulary
#
# The vocabulary maps tokens to ids and back. It holds four special tokens first, at fixed
# ids: `<s>` (0) and `</s>` (1) mark where a sentence starts and ends, `<blank>` (2) is the
# padding, which is why the `Batch` of chapter 7 takes `pad=2`, and `<unk>` (3) stands for any
# word the vocabulary does not know. After them come the words seen at least twice in the
# training data. A word seen once is, as far as a model can tell, noise: it would get an
# embedding trained on a single example. Mapping it to `<unk>` also teaches the model what to do
# with the unknown words it will meet in new text.
#
# The ids are deterministic: most frequent first, ties in alphabetical order. Two runs, or two
# machines in a distributed job, then agree on every id without sharing a file. The vocabulary
# is saved as JSON, a list of tokens that a person can read and a program can load without
# executing anything (unlike a pickle).

# %% tags=["export"]
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIALS = ("<s>", "</s>", "<blank>", "<unk>")  # ids 0, 1, 2, 3; <blank> is the padding


class Vocab:
    """A table between tokens and ids; a token it does not hold maps to the id of `<unk>`."""

    def __init__(self, itos: Sequence[str], *, unk: str = "<unk>") -> None:
        itos = list(itos)
        if len(set(itos)) != len(itos):
            raise ValueError("itos has repeated tokens; each token needs exactly one id")
        if unk not in itos:
            raise ValueError(f"unk={unk!r} is not among the tokens in itos")
        self.itos = itos  # id -> token
        self.stoi = {token: i for i, token in enumerate(itos)}  # token -> id
        self.unk = unk

    @classmethod
    def build(
        cls,
        token_lists: Iterable[Sequence[str]],
        *,
        min_freq: int = 2,
        specials: Sequence[str] = SPECIALS,
    ) -> "Vocab":
        """Specials first, then each token seen at least min_freq times, most frequent first."""
        if not isinstance(min_freq, int) or min_freq < 1:
            raise ValueError(f"min_freq must be a positive integer, got {min_freq!r}")
        if "<unk>" not in specials:
            raise ValueError(f"specials must include '<unk>', got {tuple(specials)}")
        counts = Counter()
        for tokens in token_lists:
            if isinstance(tokens, str):
                raise TypeError("token_lists must hold lists of tokens, got a str: tokenize it")
            counts.update(tokens)
        kept = [token for token, c in counts.items() if c >= min_freq and token not in specials]
        kept.sort(key=lambda token: (-counts[token], token))  # frequency desc, then alphabetical
        return cls([*specials, *kept])

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, self.stoi[self.unk])

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and (self.itos, self.unk) == (other.itos, other.unk)

    def __repr__(self) -> str:
        return f"Vocab({len(self):,} tokens: {' '.join(self.itos[:8])} ...)"

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """The ids of tokens (unknown ones become the id of `<unk>`)."""
        return [self[token] for token in tokens]

    def lookup_tokens(self, ids: Iterable[int]) -> list[str]:
        """The tokens of ids (ints, or a 1-D tensor)."""
        tokens = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.itos):
                raise ValueError(f"id {i} is out of range for a vocabulary of {len(self)} tokens")
            tokens.append(self.itos[i])
        return tokens

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON: readable, and safe to load (unlike a pickle)."""
        import json

        data = {"format": "Vocab", "version": 1, "unk": self.unk, "itos": self.itos}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", "utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocab":
        """A vocabulary that `save` wrote."""
        import json

        data = json.loads(Path(path).read_text("utf-8"))
        if not isinstance(data, dict) or data.get("format") != "Vocab":
            raise ValueError(f"{path} is not a vocabulary written by Vocab.save")
        return cls(data["itos"], unk=data["unk"])


# %% [markdown]
# ```{note}
# The classic Annotated Transformer built its vocabularies from the training, validation and
# test sets together, so the test set decided which words the model could know. Here they come
# from the training set alone; the validation and test sets are for measuring, and any word
# that only they contain is, honestly, unknown.
# ```

# %%
vocab_src = Vocab.build(src for src, _ in train_tokens)  # German
vocab_tgt = Vocab.build(tgt for _, tgt in train_tokens)  # English
print("German: ", vocab_src)
print("English:", vocab_tgt)
print("special ids:", {token: vocab_src[token] for token in SPECIALS})
print("an unseen word:", vocab_tgt["Transformerology"], "=", vocab_tgt.lookup_tokens([3]))

for split in ["val", "test_2016_flickr"]:
    for name, side, vocab in [("German", 0, vocab_src), ("English", 1, vocab_tgt)]:
        words = [token for pair in tokens[split] for token in pair[side]]
        unknown = sum(token not in vocab for token in words)
        print(f"{split:>16} {name:>7}: {unknown / len(words):.2%} of tokens are <unk>")

# %% [markdown]
# German needs more entries than English for the same captions: it glues words into compounds
# and inflects articles and adjectives, so one English word can have several German forms.
# About 2% of the held-out English tokens are unknown (1.88% to 2.05% above) and about twice as
# many German ones (3.92% to 4.63%): German compounds are rarer than the words they are made of.
#
# Saving and loading gives back the same table:

# %%
import tempfile

with tempfile.TemporaryDirectory() as folder:
    vocab_src.save(Path(folder) / "vocab_de.json")
    assert Vocab.load(Path(folder) / "vocab_de.json") == vocab_src
    print((Path(folder) / "vocab_de.json").read_text("utf-8")[:90].replace("\n", " "))

# %% [markdown]
# ## From sentences to tensors
#
# A training example is now a pair of id lists. Three small functions take it the rest of the
# way. `encode_pairs` turns token pairs into id pairs. `filter_by_length` drops the pairs that
# are longer than a chosen `max_len` and says how many it dropped: a batch of the longest
# sentences costs memory in proportion to their length (and attention, to its square), so a
# training run may want a cap, but a cap that silently shortens sentences teaches the model
# translations that stop mid-sentence. `collate_batch` wraps each sentence in `<s>` ... `</s>`
# and pads every sentence of a batch to the longest one in that batch, never further, and never
# shorter.

# %% tags=["export"]
from collections.abc import Iterable, Sequence

import torch


def encode_pairs(
    token_pairs: Iterable[tuple[Sequence[str], Sequence[str]]], vocab_src: Vocab, vocab_tgt: Vocab
) -> list[tuple[list[int], list[int]]]:
    """Each token pair as two lists of ids (without `<s>` and `</s>`)."""
    return [(vocab_src.encode(src), vocab_tgt.encode(tgt)) for src, tgt in token_pairs]


def filter_by_length(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]], *, max_len: int
) -> tuple[list[tuple[Sequence[int], Sequence[int]]], int]:
    """The pairs whose both sides fit max_len with `<s>` and `</s>`, and how many were dropped."""
    if not isinstance(max_len, int) or max_len < 3:
        raise ValueError(f"max_len must be an integer >= 3 (<s>, a token, </s>), got {max_len!r}")
    kept = [(src, tgt) for src, tgt in examples if max(len(src), len(tgt)) + 2 <= max_len]
    return kept, len(examples) - len(kept)


def example_lengths(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> tuple[list[int], list[int]]:
    """The source and target lengths as collate_batch makes them (with `<s>` and `</s>`)."""
    return [len(src) + 2 for src, _ in examples], [len(tgt) + 2 for _, tgt in examples]


def collate_batch(
    batch: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    bos_id: int = 0,
    eos_id: int = 1,
    pad_id: int = 2,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrap each sentence in `<s>` ... `</s>` and pad to the longest in the batch (never cut)."""
    if len(batch) == 0:
        raise ValueError("batch is empty; collate_batch needs at least one (src, tgt) pair")

    def pad(sequences: list[Sequence[int]]) -> torch.Tensor:
        n = max(len(s) for s in sequences) + 2  # the longest, with <s> and </s>
        out = torch.full((len(sequences), n), pad_id, dtype=torch.long)  # (batch, n)
        for row, s in enumerate(sequences):
            out[row, : len(s) + 2] = torch.tensor([bos_id, *s, eos_id], dtype=torch.long)
        return out

    src = pad([src for src, _ in batch])  # (batch, n_src)
    tgt = pad([tgt for _, tgt in batch])  # (batch, n_tgt)
    return src, tgt


# %% [markdown]
# ```{note}
# The classic version padded every sentence to a fixed 72 tokens with `F.pad`, which given a
# negative amount crops instead of padding: a longer sentence would have lost its end and its
# `</s>` without a word. Here nothing is cut; long pairs are dropped before batching, and
# counted.
# ```
#
# No Multi30k training pair is longer than 72 tokens, so that cap drops nothing; a tighter one
# drops a few and reports them:

# %%
examples = encode_pairs(train_tokens, vocab_src, vocab_tgt)
for max_len in [72, 32]:
    kept, dropped = filter_by_length(examples, max_len=max_len)
    print(f"max_len={max_len}: kept {len(kept):,} pairs, dropped {dropped}")

src, tgt = collate_batch(examples[:3])
print(src.shape, tgt.shape)
print(tgt)
print(" ".join(vocab_tgt.lookup_tokens(tgt[1])))

# %% [markdown]
# Every row starts with `<s>` (id 0) and ends its sentence with `</s>` (id 1); the rows of the
# sentences shorter than the longest one continue with padding (id 2, `<blank>`). These two
# tensors are what the `Batch` of chapter 7 takes, with `pad=2`.
#
# ## Batches by token count
#
# A GPU does the same work for a padding position as for a real token, so every padding token
# is wasted time and memory. Batches of a fixed number of sentences drawn at random waste a lot:
# each batch is as long as its longest sentence, and with a long tail of lengths, most batches
# hold one. The paper's remedy is to batch sentences of approximately equal length together and
# to size batches by tokens, not sentences (about 25,000 of each side per batch). Sizing by
# tokens also makes the batches' cost even: a batch of short sentences holds more of them.
#
# `TokenBudgetSampler` does this for a PyTorch `DataLoader`. It counts the *padded* size of a
# batch, number of sentences times the longest sentence, since that is what the tensors hold,
# and keeps it within `max_tokens` for the source and the target separately. Each epoch it
#
# 1. shuffles the examples (seeded by `seed + epoch`, so every run and every rank agree),
# 2. sorts them by length, within pools of `pool_size` examples (by default all of them; equal
#    lengths keep their shuffled order, so the batches differ from epoch to epoch), longest side
#    first,
# 3. walks the sorted list and closes a batch when the next sentence would push it over budget,
# 4. shuffles the order of the batches, so that training does not see short sentences first
#    and long ones last.
#
# Two decisions need stating. A sentence pair that alone exceeds the budget raises a
# `ValueError` when the sampler is made, naming the example: it could never fit, and yielding it
# alone would break the promise that no batch exceeds the budget; `filter_by_length` is the
# place to drop it. And for data-parallel training, the sampler deals the batches out to
# `num_replicas` ranks like `DistributedSampler` does with examples: rank $r$ takes every
# `num_replicas`-th batch from the $r$-th on. Each rank must take the same number of steps, or
# the ranks' gradient exchange waits forever. Rather than drop batches (losing examples) or repeat
# them (counting examples twice), the sampler halves its largest batches until their number
# divides evenly. Every example is then in exactly one batch of one rank, every epoch.

# %% tags=["export"]
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import Sampler


class TokenBudgetSampler(Sampler[list[int]]):
    """Batches of similar-length examples whose padded src and tgt each fit max_tokens."""

    def __init__(
        self,
        src_lengths: Sequence[int],
        tgt_lengths: Sequence[int],
        *,
        max_tokens: int,
        pool_size: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
    ) -> None:
        super().__init__()
        self.src_lengths = [int(n) for n in src_lengths]
        self.tgt_lengths = [int(n) for n in tgt_lengths]
        n = len(self.src_lengths)
        if len(self.tgt_lengths) != n:
            raise ValueError(
                f"src_lengths has {n} entries but tgt_lengths has {len(self.tgt_lengths)}; "
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
        too_long = [
            i for i in range(n) if max(self.src_lengths[i], self.tgt_lengths[i]) > max_tokens
        ]
        if too_long:
            i = too_long[0]
            raise ValueError(
                f"example {i} has {self.src_lengths[i]} source and {self.tgt_lengths[i]} target "
                f"tokens, more than max_tokens={max_tokens} on its own ({len(too_long)} such "
                "examples): drop long pairs first (filter_by_length) or raise max_tokens"
            )
        self.max_tokens = max_tokens
        self.pool_size = pool_size
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self._cache: tuple[int, list[list[int]]] | None = None  # (epoch, its batches)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch and with it the order; call it with the same epoch on every rank."""
        self.epoch = epoch

    def _fill(self, pool: list[int]) -> list[list[int]]:
        """Cut a length-sorted pool into batches, closing one when the next example won't fit."""
        batches, batch, max_src, max_tgt = [], [], 0, 0
        for i in pool:
            src, tgt = max(max_src, self.src_lengths[i]), max(max_tgt, self.tgt_lengths[i])
            if (len(batch) + 1) * max(src, tgt) > self.max_tokens:  # padded size over budget
                batches.append(batch)
                batch, src, tgt = [], self.src_lengths[i], self.tgt_lengths[i]
            batch.append(i)
            max_src, max_tgt = src, tgt
        batches.append(batch)
        return batches

    def _split_to_multiple(self, batches: list[list[int]]) -> list[list[int]]:
        """Halve the largest batches until every rank can have the same number of them."""
        while len(batches) % self.num_replicas:
            j = max(range(len(batches)), key=lambda k: len(batches[k]))
            if len(batches[j]) < 2:
                raise ValueError(
                    f"cannot share {len(batches)} one-example batches equally among "
                    f"num_replicas={self.num_replicas} ranks; raise max_tokens"
                )
            half = len(batches[j]) // 2
            batches[j : j + 1] = [batches[j][:half], batches[j][half:]]
        return batches

    def batches(self) -> list[list[int]]:
        """All ranks' batches of this epoch, in order (rank r takes every num_replicas-th)."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        n = len(self.src_lengths)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).tolist() if self.shuffle else list(range(n))
        batches = []
        for start in range(0, n, self.pool_size):
            # 1) shuffled pool, 2) sorted by length (stable: ties stay shuffled), 3) cut
            pool = sorted(order[start : start + self.pool_size], key=self._length_key)
            batches += self._fill(pool)
        batches = self._split_to_multiple(batches)
        if self.shuffle:  # 4) shuffle the batches themselves
            batches = [batches[j] for j in torch.randperm(len(batches), generator=generator)]
        self._cache = (self.epoch, batches)
        return batches

    def _length_key(self, i: int) -> tuple[int, int, int]:
        """Sort by the longer side first: it is the one the budget binds on."""
        src, tgt = self.src_lengths[i], self.tgt_lengths[i]
        return max(src, tgt), src, tgt

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return len(self.batches()) // self.num_replicas


def padding_fraction(
    batches: Iterable[Sequence[int]], src_lengths: Sequence[int], tgt_lengths: Sequence[int]
) -> float:
    """The share of padding in the padded src and tgt tensors of batches (lists of indices)."""
    padded = real = 0
    for batch in batches:
        for lengths in (src_lengths, tgt_lengths):
            sizes = [lengths[i] for i in batch]
            padded += len(sizes) * max(sizes)  # (batch, longest) positions
            real += sum(sizes)
    return 1 - real / padded


# %% [markdown]
# Multi30k is tiny next to WMT, and an epoch of 25,000-token batches would be only a handful of
# steps, so we take a budget of 2,048 tokens per side. The sampler goes straight into a
# `DataLoader` as its `batch_sampler`, with `collate_batch` to make the tensors:

# %%
from torch.utils.data import DataLoader

src_lengths, tgt_lengths = example_lengths(examples)
sampler = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=2048, seed=0)
loader = DataLoader(examples, batch_sampler=sampler, collate_fn=collate_batch)

largest = 0
for epoch in range(2):
    sampler.set_epoch(epoch)
    for step, (src, tgt) in enumerate(loader):
        if step == 0:
            print(f"epoch {epoch}: {len(loader)} batches, the first: src {tuple(src.shape)}, "
                  f"tgt {tuple(tgt.shape)}")
        largest = max(largest, src.numel(), tgt.numel())
print(f"largest padded tensor: {largest} tokens (budget 2048)")

# %% [markdown]
# Now the measurement this chapter was after. We compare three ways to batch the same 29,000
# training pairs: the classic version's, which padded every sentence to 72 tokens; random
# batches of a fixed number of sentences, as many per batch as the token-budget sampler puts
# on average; and the token-budget sampler itself.

# %%
token_batches = sampler.batches()
n = len(examples)
batch_size = round(n / len(token_batches))
generator = torch.Generator().manual_seed(0)
order = torch.randperm(n, generator=generator).tolist()
random_batches = [order[i : i + batch_size] for i in range(0, n, batch_size)]

real = sum(src_lengths) + sum(tgt_lengths)
results = {
    "padded to 72 (classic)": 1 - real / (2 * n * 72),
    f"random, {batch_size} pairs each": padding_fraction(random_batches, src_lengths, tgt_lengths),
    "token budget 2,048": padding_fraction(token_batches, src_lengths, tgt_lengths),
}
for name, fraction in results.items():
    print(f"{name:>26}: {fraction:.1%} of the tensor positions are padding")
ratio = results[f"random, {batch_size} pairs each"] / results["token budget 2,048"]
print(f"random batches pad {ratio:.1f} times as much as token-budget batches")
print(f"{len(random_batches)} random batches, {len(token_batches)} token-budget batches")

bar_chart([{"batching": name, "padding": share} for name, share in results.items()],
          x="padding:Q", y="batching:N", value_format="%", value_domain=[0, 1],
          formats={"padding": ".1%"}, x_title="share of tensor positions that are padding",
          y_title="", height=120, title="Padding in one epoch of Multi30k")

# %% [markdown]
# Random batches of the same average size spend about half of every tensor on padding; batches
# by token count spend a few percent. Put the other way, random batching would need about twice
# the compute for the same real tokens. Padding every sentence to a fixed length is worse
# still. The gain comes from the sort, and the pool size sets how much of it we keep. Sorting
# smaller pools mixes lengths more across epochs, at a price:

# %%
for pool_size in [512, 2048, 8192, None]:
    pooled = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=2048, pool_size=pool_size)
    batches = pooled.batches()
    print(
        f"pool_size={str(pool_size):>4}: {len(batches)} batches, "
        f"{padding_fraction(batches, src_lengths, tgt_lengths):.1%} padding"
    )

# %% [markdown]
# Sorting the whole training set (the default) wastes the least. It does not freeze the
# batches: lengths are small integers, so thousands of sentences share each length, and the
# shuffle before the sort mixes them differently every epoch.
#
# Finally, data parallelism. With two or three ranks, each makes its own sampler with the same
# seed and its own `rank`, and the ranks' batches together hold every example exactly once:

# %%
for num_replicas in [2, 3]:
    ranks = [
        TokenBudgetSampler(
            src_lengths, tgt_lengths, max_tokens=2048, num_replicas=num_replicas, rank=rank
        )
        for rank in range(num_replicas)
    ]
    seen = [i for rank in ranks for batch in rank for i in batch]
    assert sorted(seen) == list(range(n))  # every example once, none twice
    print(f"{num_replicas} ranks: {[len(rank) for rank in ranks]} batches each")

# %% [markdown]
# ## What we have
#
# The book can now turn Multi30k into training batches. `load_multi30k` reads a split and
# checks it, `load_tokenizers` and `tokenize_pairs` cut the sentences into words, `Vocab` gives
# the words ids (built from the training set only, saved as JSON), `encode_pairs`,
# `filter_by_length` and `collate_batch` make padded tensors without cutting a sentence, and
# `TokenBudgetSampler` groups sentences of similar length into batches of a fixed token budget,
# for one process or many, so that about 2% of each batch is padding instead of half.
#
# Chapter 14 trains a Transformer on exactly these batches. First, the next chapter turns to
# the other half of the paper's training recipe: the optimizer and its learning-rate schedule.

# %% [markdown]
# ## Exercises
#
# 1. **Padding, counted by hand.** Three sentence pairs have source lengths 3, 5 and 8 and
#    target lengths 4, 4 and 9. What share of the padded tensors is padding when all three go
#    into one batch, and when the batches are `[0, 1]` and `[2]`? Write both as exact fractions
#    (`fractions.Fraction`) in `answer_1`; the check compares them with `padding_fraction`.
# 2. **A vocabulary by hand.** What does
#    `Vocab.build([["a", "b", "a"], ["a", "b", "c"]]).encode(["b", "c", "a"])` return? Work it
#    out from the rules (specials first, then tokens seen at least twice, most frequent first,
#    `<unk>` for the rest) and write it in `answer_2`.
# 3. **Why the training split only?** Chapter 9 builds the vocabularies from the training
#    sentences alone. What would go wrong, in the numbers we report, if the test sentences
#    helped choose the vocabulary?
#
# ```{dropdown} Answer to 3
# The test set would no longer be unseen: words that occur only in it would get their own ids
# instead of `<unk>`, so the share of `<unk>` tokens we report for the test set would flatter
# the vocabulary, lower than new text would show. The model itself would gain little from
# those ids: training never shows it those words, so it learns nothing about them.
# ```

# %% tags=["hide-cell"]
# Exercises 1 and 2: our answers (hidden in the book). Replace them with yours.
from fractions import Fraction

answer_1 = (
    1 - Fraction(3 + 5 + 8 + 4 + 4 + 9, 3 * 8 + 3 * 9),  # one batch: 3 rows of 8 and of 9
    1 - Fraction(3 + 5 + 8 + 4 + 4 + 9, 2 * 5 + 2 * 4 + 8 + 9),  # batches [0, 1] and [2]
)
answer_2 = [5, 3, 4]  # ids 0-3 are the specials; "a" (3 times) gets 4, "b" 5; "c" is <unk>

# %%
# Check exercises 1 and 2
import math

src_lengths, tgt_lengths = [3, 5, 8], [4, 4, 9]
one = padding_fraction([[0, 1, 2]], src_lengths, tgt_lengths)
two = padding_fraction([[0, 1], [2]], src_lengths, tgt_lengths)
assert math.isclose(one, answer_1[0]) and math.isclose(two, answer_1[1])
print(f"exercise 1: correct ({answer_1[0]} and {answer_1[1]})")
toy = Vocab.build([["a", "b", "a"], ["a", "b", "c"]])
assert toy.encode(["b", "c", "a"]) == answer_2
print("exercise 2: correct")
