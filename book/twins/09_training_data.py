# %% [markdown]
# # Training data and batching
#
# Section 5.1 of {cite:t}`vaswani2017attention` makes two decisions about data. The first is what a
# token is: the paper trained on the 4.5 million English-German sentence pairs of WMT 2014, split into
# byte-pair pieces {cite}`sennrich2016neural` from a shared vocabulary of about 37,000 (for
# English-French, 36 million pairs in 32,000 word-pieces). The second is what a batch is: sentence
# pairs of similar length, roughly 25,000 source and as many target tokens a batch. The book trains on
# a much smaller corpus, German into English (the paper's reverse), cut into words (chapter 14) or
# pieces (chapter 17), in smaller batches ({doc}`departures`); this chapter builds the batching and
# measures what it buys.

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
    MULTI30K_SPLITS,
    check_token_budget,
    enable_book_charts,
    length_histogram,
    load_multi30k,
)

enable_book_charts()

# %% [markdown]
# ## Multi30k
#
# Our data is Multi30k {cite}`elliott2016multi30k`: short English descriptions of photographs,
# each with a German translation, in its usual three splits (training, validation, and the 2016
# Flickr test set). `load_multi30k(split)` returns a split as (German, English) pairs; how it
# finds, downloads and checks the files is in {doc}`appendix_data`.

# %%
splits = {split: load_multi30k(split) for split in MULTI30K_SPLITS}
for split, pairs in splits.items():
    print(f"{split:>16}: {len(pairs):,} pairs")
train_pairs = splits["train"]
print(train_pairs[0])

# %% [markdown]
# ## How long the sentences are
#
# Length decides what a batch costs, and how much of it is padding when short and long sentences
# share it. For lengths, words split at spaces will do (chapter 14 cuts proper tokens):

# %%
words = [(de.split(), en.split()) for de, en in train_pairs]  # (German, English) words
for language, side in [("German", 0), ("English", 1)]:
    sizes = sorted(len(pair[side]) for pair in words)
    print(f"{language:>7}: mean {sum(sizes) / len(sizes):.1f} words, median "
          f"{sizes[len(sizes) // 2]}, 99th percentile {sizes[int(0.99 * len(sizes))]}, "
          f"longest {sizes[-1]}")
length_histogram(words, title="Multi30k training sentences by length")

# %% [markdown]
# Look for the tail: the longest captions are several times the median, and a batch that holds
# one of them pads every other sentence in it to that length.
#
# ## Batches by token count
#
# A GPU does the same work for a padding position as for a real token, and a random batch is as
# long as its longest sentence. Batching sentences of similar length, as the paper does, wastes
# little.
#
# `TokenBudgetSampler` does this for a PyTorch `DataLoader`, keeping the *padded* size of a batch
# (sentences times the longest sentence) within `max_tokens`, for source and target separately.
# Each epoch it shuffles the examples (seeded by `seed + epoch`, so a run can be repeated), sorts
# them by length within pools of `pool_size` (all of them by default), closes a batch when the
# next sentence would push it over budget, and shuffles the batches, so that training does not
# meet short sentences first and long ones last.
#
# Chapter 22 grows it to deal the batches out to several processes. `padding_fraction` measures what a
# set of batches wastes.

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
# Three ways to batch the same training pairs, each sentence with its `<s>` and `</s>`: the classic
# version's, which pads every sentence to 72 tokens; random batches of as many sentences as the
# sampler's batches hold on average; and the sampler, with a budget of 2,048 tokens per side.

# %%
import torch

src_lengths = [len(de) + 2 for de, _ in words]  # with <s> and </s>
tgt_lengths = [len(en) + 2 for _, en in words]
token_batches = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=2048, seed=0).batches()
n = len(words)
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
print(f"{len(random_batches)} random batches, {len(token_batches)} token-budget batches")


def padded_sizes(batches: list[list[int]]) -> list[int]:
    """Each batch's padded size, source and target: sentences times the longest."""
    return [len(b) * max(lengths[i] for i in b) for b in batches
            for lengths in (src_lengths, tgt_lengths)]


assert max(padded_sizes(token_batches)) <= 2048  # every batch within its budget

# %% [markdown]
# Look for the orders of magnitude: random batches of the same average size spend about half their
# positions on padding, batches by token count a few percent, and padding to a fixed length more
# still. No batch goes over the budget.
#
# ## What we have
#
# `TokenBudgetSampler` batches sentences of similar length up to a token budget; chapter 14 trains
# on its batches.

# %% [markdown]
# ## Exercises
#
# 1. **Padding, counted by hand.** Three sentence pairs have source lengths 3, 5 and 8 and
#    target lengths 4, 4 and 9. What share of the padded tensors is padding when all three go
#    into one batch, and when the batches are `[0, 1]` and `[2]`? Write both as exact fractions
#    (`fractions.Fraction`) in `answer_1`; the check compares them with `padding_fraction`.
# 2. **Even costs.** Over one epoch, whose padded size (sentences times the longest, per side)
#    varies more from batch to batch: the sampler's batches or the random batches above? Set
#    `answer_2` to `"token budget"` or `"random"`; the check compares the spread of the sizes
#    relative to their mean.

# %% tags=["hide-cell"]
# Exercises 1 and 2: our answers (hidden in the book). Replace them with yours.
from fractions import Fraction

answer_1 = (
    1 - Fraction(3 + 5 + 8 + 4 + 4 + 9, 3 * 8 + 3 * 9),  # one batch: 3 rows of 8 and of 9
    1 - Fraction(3 + 5 + 8 + 4 + 4 + 9, 2 * 5 + 2 * 4 + 8 + 9),  # batches [0, 1] and [2]
)
answer_2 = "random"  # each random batch is as long as the longest of its sentences, which varies;
# the sampler fills every batch up to about the same budget

# %%
# Check exercises 1 and 2
import math


def spread(sizes: list[int]) -> float:
    """Standard deviation over mean."""
    t = torch.tensor(sizes, dtype=torch.float)
    return float(t.std() / t.mean())


one = padding_fraction([[0, 1, 2]], [3, 5, 8], [4, 4, 9])
two = padding_fraction([[0, 1], [2]], [3, 5, 8], [4, 4, 9])
assert math.isclose(one, answer_1[0]) and math.isclose(two, answer_1[1])
print(f"exercise 1: correct ({answer_1[0]} and {answer_1[1]})")
by_budget, at_random = spread(padded_sizes(token_batches)), spread(padded_sizes(random_batches))
assert answer_2 == ("random" if at_random > by_budget else "token budget")
print(f"exercise 2: correct (spread {by_budget:.2f} by token budget, {at_random:.2f} at random)")
