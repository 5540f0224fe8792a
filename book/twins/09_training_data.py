# %% [markdown]
# # Training data and batching
#
# Section 5.1 of the paper spends four sentences on data, and they carry two decisions. The
# first is what a token is: {cite:t}`vaswani2017attention` trained on the 4.5 million
# English-German sentence pairs of WMT 2014, split into byte-pair pieces
# {cite}`sennrich2016neural` from a vocabulary of about 37,000 shared by both languages. The
# second is what a batch is: not a fixed number of sentences but sentences of *similar length*,
# gathered until a batch held roughly 25,000 source tokens and as many target tokens.
#
# This chapter builds the same pipeline at laptop scale, on Multi30k {cite}`elliott2016multi30k`:
# about 31,000 short English descriptions of photographs, each with a German translation. We cut
# the sentences into words, give every frequent word an id, build a sampler that fills batches
# up to a token budget, and measure what that buys.

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
    BOS_ID,
    EOS_ID,
    MULTI30K_SPLITS,
    PAD_ID,
    UNK_ID,
    bar_chart,
    check_token_budget,
    enable_book_charts,
    length_histogram,
    load_multi30k,
)

enable_book_charts()

# %% [markdown]
# ## Multi30k
#
# Multi30k's first task comes in three splits that the literature uses again and again: 29,000
# pairs for training, 1,014 for validation and the 1,000 pairs of the 2016 Flickr test set. Each
# split is two gzipped text files, one sentence per line, where line $i$ of the German file
# translates line $i$ of the English one. `load_multi30k(split)` returns a split as a list of
# (German, English) pairs; how it finds the files, downloads a missing one and checks it against
# its published checksum is in the appendix {doc}`appendix_data`. All three splits, and the first
# training pair:

# %%
splits = {split: load_multi30k(split) for split in MULTI30K_SPLITS}
for split, pairs in splits.items():
    print(f"{split:>16}: {len(pairs):,} pairs")
train_pairs = splits["train"]
print(train_pairs[0])

# %% [markdown]
# The captions are short and plain, and the data set is small enough to train on in Part III yet
# real enough to be interesting.
#
# ## Tokens
#
# A model sees a sentence as a sequence of ids from a fixed vocabulary, so first the sentence
# is cut into tokens. The paper's byte-pair pieces never meet a word they cannot spell (chapter
# 17 builds them). With 29,000 captions whole words and punctuation marks do well, cut by the
# rule-based tokenizers of spaCy {cite}`honnibal2020spacy`; a *blank* pipeline holds only those
# rules, so nothing beyond spaCy itself is downloaded. `tokenize` drops the tokens spaCy makes
# of doubled spaces: a space is not a word to translate.

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


def tokenize_pairs(pairs: Sequence[tuple[str, str]], tokenizer_src: Any,
                   tokenizer_tgt: Any) -> list[tuple[list[str], list[str]]]:
    """Each sentence pair as two lists of tokens."""
    return [(tokenize(src, tokenizer_src), tokenize(tgt, tokenizer_tgt)) for src, tgt in pairs]


# %%
spacy_de, spacy_en = load_tokenizers()
tokens = {split: tokenize_pairs(pairs, spacy_de, spacy_en) for split, pairs in splits.items()}
train_tokens = tokens["train"]
print(train_tokens[0][0])
print(train_tokens[0][1])

# %% [markdown]
# "young," became two tokens, and "Büsche." gave its full stop a token of its own.
#
# ## How long the sentences are
#
# Length decides how much a batch of sentences costs, and how much of it is padding when short
# and long sentences share it. The training sentences' lengths, in tokens:

# %%
for language, side in [("German", 0), ("English", 1)]:
    sizes = sorted(len(pair[side]) for pair in train_tokens)
    print(f"{language:>7}: mean {sum(sizes) / len(sizes):.1f} tokens, median "
          f"{sizes[len(sizes) // 2]}, 99th percentile {sizes[int(0.99 * len(sizes))]}, "
          f"longest {sizes[-1]}")
length_histogram(train_tokens, title="Multi30k training sentences by length")

# %% [markdown]
# Half the captions have 12 tokens or fewer and 99% have at most 26, but the tail goes on: the
# longest sentence is more than three times the median. A batch that puts one of those next to
# thirty typical sentences pads all thirty to its length.
#
# ## A vocabulary
#
# The vocabulary maps tokens to ids and back. Four special tokens come first: `<s>` (0) and
# `</s>` (1) mark where a sentence starts and ends, `<blank>` (2) is the padding (`PAD_ID`, the
# padding of chapter 7's `Batch`), and `<unk>` (3) stands for any word the vocabulary does not
# know. Then come the words seen at least twice in the training data: a word seen once would get
# an embedding trained on one example, and mapping it to `<unk>` teaches the model what to do
# with the unknown words of new text. The order (most frequent first, ties alphabetical) is
# deterministic, and the vocabulary is saved as JSON, which loads without running code.
#
# ```{note}
# The classic Annotated Transformer built its vocabularies from the training, validation and
# test sets together, so the test set decided which words the model could know. Here they come
# from the training set alone, and a word that only the test set holds is unknown.
# ```

# %% tags=["export"]
import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIALS = ("<s>", "</s>", "<blank>", "<unk>")  # ids 0, 1, 2, 3; <blank> is the padding


class Vocab:
    """A table between tokens and ids; a token it does not hold maps to the id of `<unk>`."""

    def __init__(self, itos: Sequence[str], *, unk: str = "<unk>") -> None:
        self.itos = list(itos)  # id -> token
        self.stoi = {token: i for i, token in enumerate(self.itos)}  # token -> id
        self.unk = unk
        if len(self.stoi) != len(self.itos) or unk not in self.stoi:
            raise ValueError(f"itos must hold each token once, unk={unk!r} among them")

    @classmethod
    def build(cls, token_lists: Iterable[Sequence[str]], *, min_freq: int = 2,
              specials: Sequence[str] = SPECIALS) -> "Vocab":
        """Specials first, then each token seen at least min_freq times, most frequent first."""
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
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < len(self.itos):
                raise ValueError(f"id {i} is out of range for a vocabulary of {len(self)} tokens")
        return [self.itos[i] for i in ids]

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON: readable, and safe to load (unlike a pickle)."""
        data = {"format": "Vocab", "version": 1, "unk": self.unk, "itos": self.itos}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", "utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocab":
        """A vocabulary that `save` wrote."""
        data = json.loads(Path(path).read_text("utf-8"))
        if not isinstance(data, dict) or data.get("format") != "Vocab":
            raise ValueError(f"{path} is not a vocabulary written by Vocab.save")
        return cls(data["itos"], unk=data["unk"])


# %%
import tempfile

vocab_src = Vocab.build(src for src, _ in train_tokens)  # German
vocab_tgt = Vocab.build(tgt for _, tgt in train_tokens)  # English
print("German: ", vocab_src)
print("English:", vocab_tgt)
print("special ids:", {token: vocab_src[token] for token in SPECIALS})
assert [vocab_src[token] for token in SPECIALS] == [BOS_ID, EOS_ID, PAD_ID, UNK_ID]  # chapter 5's
print("an unseen word:", vocab_tgt["Transformerology"], "=", vocab_tgt.lookup_tokens([UNK_ID]))
for split in ["val", "test_2016_flickr"]:
    for name, side, vocab in [("German", 0, vocab_src), ("English", 1, vocab_tgt)]:
        words = [token for pair in tokens[split] for token in pair[side]]
        unknown = sum(token not in vocab for token in words)
        print(f"{split:>16} {name:>7}: {unknown / len(words):.2%} of tokens are <unk>")
with tempfile.TemporaryDirectory() as folder:  # saved and loaded, the same table
    vocab_src.save(Path(folder) / "vocab_de.json")
    assert Vocab.load(Path(folder) / "vocab_de.json") == vocab_src

# %% [markdown]
# German needs more entries than English for the same captions: it glues words into compounds
# and inflects articles and adjectives. About 2% of the held-out English tokens are unknown
# (1.88% to 2.05% above) and about twice as many German ones (3.92% to 4.63%): German compounds
# are rarer than the words they are made of.
#
# ## From sentences to tensors
#
# `encode_pairs` turns token pairs into id pairs. `filter_by_length` drops the pairs longer than
# `max_len` and counts them: a cap bounds a batch's memory, but one that silently shortened
# sentences would teach translations that stop mid-sentence. `collate_batch` wraps each
# sentence in `<s>` ... `</s>` and pads a batch's sentences to its longest, never further.

# %% tags=["export"]
from collections.abc import Iterable, Sequence

import torch


def encode_pairs(token_pairs: Iterable[tuple[Sequence[str], Sequence[str]]], vocab_src: Vocab,
                 vocab_tgt: Vocab) -> list[tuple[list[int], list[int]]]:
    """Each token pair as two lists of ids (without `<s>` and `</s>`)."""
    return [(vocab_src.encode(src), vocab_tgt.encode(tgt)) for src, tgt in token_pairs]


def filter_by_length(examples: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                     max_len: int) -> tuple[list[tuple[Sequence[int], Sequence[int]]], int]:
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


def collate_batch(batch: Sequence[tuple[Sequence[int], Sequence[int]]], *, bos_id: int = BOS_ID,
                  eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrap each sentence in `<s>` ... `</s>` and pad to the longest in the batch (never cut)."""
    if len(batch) == 0:
        raise ValueError("batch is empty; collate_batch needs at least one (src, tgt) pair")

    def pad(sequences: list[Sequence[int]]) -> torch.Tensor:
        n = max(len(s) for s in sequences) + 2  # the longest, with <s> and </s>
        out = torch.full((len(sequences), n), pad_id, dtype=torch.long)  # (batch, n)
        for row, s in enumerate(sequences):
            out[row, : len(s) + 2] = torch.tensor([bos_id, *s, eos_id], dtype=torch.long)
        return out

    return pad([src for src, _ in batch]), pad([tgt for _, tgt in batch])  # (batch, n_src/tgt)


# %% [markdown]
# ```{note}
# The classic version padded every sentence to 72 tokens with `F.pad`, which crops when given a
# negative amount: a longer sentence would have lost its end and its `</s>` without a word.
# ```
#
# No training pair is longer than 72 tokens; a tighter cap drops a few and reports them:

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
# Every row starts with `<s>` (id 0) and ends its sentence with `</s>` (id 1); shorter rows
# continue with padding (id 2). These two tensors are what chapter 7's `Batch` takes.
#
# ## Batches by token count
#
# A GPU does the same work for a padding position as for a real token. Random batches of a fixed
# number of sentences waste a lot of it: each batch is as long as its longest sentence, and with
# a long tail of lengths most batches hold one. The paper batches sentences of approximately
# equal length together and sizes batches by tokens (about 25,000 per side), which also evens
# out their cost: a batch of short sentences holds more of them.
#
# `TokenBudgetSampler` does this for a PyTorch `DataLoader`. It keeps the *padded* size of a
# batch (sentences times the longest sentence) within `max_tokens`, for source and target
# separately. Each epoch it
#
# 1. shuffles the examples (seeded by `seed + epoch`, so every run agrees),
# 2. sorts them by length, longest side first, within pools of `pool_size` examples (all of them
#    by default; equal lengths keep their shuffled order),
# 3. closes a batch when the next sentence would push it over budget,
# 4. shuffles the batches, so that training does not see short sentences first and long last.
#
# A pair that alone exceeds the budget is an error; the checks of the arguments are in the
# appendix {doc}`appendix_data`. Chapter 22, which trains on several devices at once, grows the
# sampler so that each process takes its own share of the batches.

# %% tags=["export"]
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import Sampler


class TokenBudgetSampler(Sampler[list[int]]):
    """Batches of similar-length examples whose padded src and tgt each fit max_tokens."""

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, max_tokens: int,
                 pool_size: int | None = None, shuffle: bool = True, seed: int = 0) -> None:
        super().__init__()
        self.src_lengths = [int(n) for n in src_lengths]
        self.tgt_lengths = [int(n) for n in tgt_lengths]
        check_token_budget(self.src_lengths, self.tgt_lengths, max_tokens=max_tokens,
                           pool_size=pool_size)
        self.max_tokens = max_tokens
        self.pool_size = pool_size or len(self.src_lengths)
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self._cache: tuple[int, list[list[int]]] | None = None  # (epoch, its batches)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch, and with it the order of the examples and of the batches."""
        self.epoch = epoch

    def _length_key(self, i: int) -> tuple[int, int, int]:
        """Sort by the longer side first: it is the one the budget binds on."""
        src, tgt = self.src_lengths[i], self.tgt_lengths[i]
        return max(src, tgt), src, tgt

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

    def batches(self) -> list[list[int]]:
        """The batches of this epoch, in order (built once per epoch)."""
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
        if self.shuffle:  # 4) shuffle the batches themselves
            batches = [batches[j] for j in torch.randperm(len(batches), generator=generator)]
        self._cache = (self.epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()

    def __len__(self) -> int:
        return len(self.batches())


def padding_fraction(batches: Iterable[Sequence[int]], src_lengths: Sequence[int],
                     tgt_lengths: Sequence[int]) -> float:
    """The share of padding in the padded src and tgt tensors of batches (lists of indices)."""
    padded = real = 0
    for batch in batches:
        for lengths in (src_lengths, tgt_lengths):
            sizes = [lengths[i] for i in batch]
            padded += len(sizes) * max(sizes)  # (batch, longest) positions
            real += sum(sizes)
    return 1 - real / padded


# %% [markdown]
# Multi30k is tiny next to WMT, so we take a budget of 2,048 tokens per side. The sampler goes
# into a `DataLoader` as its `batch_sampler`, with `collate_batch` to make the tensors:

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
# Now the measurement this chapter was after: three ways to batch the same 29,000 training
# pairs. The classic version's, which padded every sentence to 72 tokens; random batches of as
# many sentences as the token-budget sampler puts in a batch on average; and the sampler itself.

# %%
token_batches = sampler.batches()
n = len(examples)
batch_size = round(n / len(token_batches))
order = torch.randperm(n, generator=torch.Generator().manual_seed(0)).tolist()
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
# by token count spend a few percent, and padding every sentence to a fixed length is worse
# still. The gain comes from the sort; sorting smaller pools mixes lengths more across epochs,
# at a price:

# %%
for pool_size in [512, 2048, 8192, None]:
    batches = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=2048,
                                 pool_size=pool_size).batches()
    print(f"pool_size={str(pool_size):>4}: {len(batches)} batches, "
          f"{padding_fraction(batches, src_lengths, tgt_lengths):.1%} padding")

# %% [markdown]
# Sorting the whole training set (the default) wastes the least. It does not freeze the
# batches: thousands of sentences share each length, and the shuffle before the sort mixes them
# differently every epoch.
#
# ## What we have
#
# `load_multi30k` reads a split, `load_tokenizers` and `tokenize_pairs` cut its sentences into
# words, `Vocab` gives the words ids (from the training set only), `encode_pairs`,
# `filter_by_length` and `collate_batch` make padded tensors without cutting a sentence, and
# `TokenBudgetSampler` batches sentences of similar length up to a token budget, so that about
# 2% of each batch is padding instead of half. Chapter 14 trains a Transformer on exactly these
# batches; the next chapter turns to the optimizer and its learning-rate schedule.

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
# 3. **Why the training split only?** This chapter builds the vocabularies from the training
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
