# %% [markdown]
# # Subword vocabularies
#
# The model of chapter 14 reads and writes whole words. Its German and English vocabularies hold
# the words seen at least twice in the training captions, and every other word becomes `<unk>`: on
# the way in, the model loses what such a word said; on the way out, it cannot write it. The paper
# avoided both losses. For English-German it cut the text into subword units with byte-pair
# encoding, about 37,000 of them shared by the two languages, and for English-French it used
# 32,000 word pieces {cite}`wu2016google` (§5.1). Because one vocabulary covered both languages,
# one matrix could be the source embedding, the target embedding and the generator's projection
# (§3.4).
#
# This chapter measures what word vocabularies cost on Multi30k, writes byte-pair encoding from
# scratch, compares vocabulary sizes with the maintained tool, sentencepiece
# {cite}`kudo2018sentencepiece`, and counts what one shared vocabulary changes in the model and in
# the batches.

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
    VOCAB_FILES,
    TokenBudgetSampler,
    Vocab,
    check_train_config,
    detokenize,
    enable_book_charts,
    encode_pairs,
    example_lengths,
    filter_by_length,
    load_multi30k,
    load_tokenizers,
    make_model,
    padding_fraction,
    tokenize,
    tokenize_pairs,
    training_config,
    write_run_files,
)

enable_book_charts()

# %% [markdown]
# ## What a word vocabulary loses
#
# First the problem, measured with chapter 14's own pieces: spaCy's tokenizers, and German and
# English vocabularies of the training words seen at least twice (`min_freq=2`).

# %%
import time

import pandas as pd

start = time.perf_counter()
tokenizers = load_tokenizers()  # German, English
splits = {split: load_multi30k(split) for split in ("train", "val", "test_2016_flickr")}
tokens = {  # split -> (German token lists, English token lists)
    split: tuple([tokenize(pair[side], tokenizers[side]) for pair in pairs] for side in (0, 1))
    for split, pairs in splits.items()
}
vocabs = tuple(Vocab.build(tokens["train"][side], min_freq=2) for side in (0, 1))
print(f"tokenized {sum(map(len, splits.values())):,} sentence pairs in "
      f"{time.perf_counter() - start:.1f} s")

rows = []
for side, language in enumerate(("German", "English")):
    train_types = {word for sentence in tokens["train"][side] for word in sentence}
    kept = len(vocabs[side]) - len(SPECIALS)  # the words seen at least twice
    print(f"{language}: {len(train_types):,} distinct words in the training text, "
          f"{kept:,} ({kept / len(train_types):.0%}) of them in the vocabulary")
    for split in ("val", "test_2016_flickr"):
        sentences = tokens[split][side]
        unknown = [[word not in vocabs[side] for word in sentence] for sentence in sentences]
        rows.append({
            "split": split, "language": language,
            "tokens": sum(map(len, sentences)),
            "<unk> tokens": f"{sum(map(sum, unknown)) / sum(map(len, sentences)):.1%}",
            "sentences with an <unk>": f"{sum(map(any, unknown)) / len(sentences):.1%}",
        })
pd.DataFrame(rows)

# %% [markdown]
# German needs nearly 1.8 times as many distinct words as English for the same captions, and a
# smaller share of them occurs twice, so fewer make it into the vocabulary. Per token the loss
# looks small; per sentence it is not: about two in five German validation sentences reach the
# model with at least one `<unk>`, and about one English reference in five holds a word the model
# can never write. The test set is a little kinder, with the same pattern.
#
# Which German words are lost? Mostly long ones:

# %%
from collections import Counter

german_val = [word for sentence in tokens["val"][0] for word in sentence]
lost = [word for word in german_val if word not in vocabs[0]]
train_counts = Counter(word for sentence in tokens["train"][0] for word in sentence)
for name, words in (("all German val tokens", german_val), ("<unk> German val tokens", lost)):
    long_share = sum(len(word) >= 10 for word in words) / len(words)
    hyphen_share = sum("-" in word for word in words) / len(words)
    print(f"{name:>24}: {long_share:.0%} have 10 or more letters, {hyphen_share:.1%} a hyphen")
never = sum(train_counts[word] == 0 for word in lost) / len(lost)
print(f"{never:.0%} of the lost tokens never occur in the training text, the rest once")

examples = ["Eisfischerhütte", "Baumwolle", "Wohltätigkeitsmarathon", "Trockenblumensortiment",
            "kopfsteingepflasterten", "Schaufensterscheibe", "Entsorgungsfahrzeug",
            "Feuerwehrkleidung", "Straßenkundgebung", "Parkplatzpicknick"]
assert all(word in lost for word in examples)
print({word: train_counts[word] for word in examples})

# %% [markdown]
# Long words are rare in the validation text but the majority of the lost ones. German writes its
# compounds as one word (*Eisfischerhütte*, ice-fishing hut; *Trockenblumensortiment*, an
# assortment of dried flowers), and a compound can be new even when each of its parts is common;
# spaCy also keeps hyphenated compounds such as *Roller-Derby-Spielerin* as one token. Most lost
# tokens never occur in the training text, and the rest occur once, one short of `min_freq=2`.
# Lowering `min_freq` to 1 would bring back only those seen once: the next compound is always
# one that nobody has written yet. Subwords change the unit instead. If *Eis*, *fischer* and
# *hütte* are in the vocabulary, every word made of them can be spelled with them.
#
# ## Byte-pair encoding
#
# Byte-pair encoding began as a compression method {cite}`gage1994new`: replace the most frequent
# pair of adjacent bytes by a new byte, and repeat. {cite:t}`sennrich2016neural` turned it into a
# way to build a vocabulary: start from characters, so that every word can be spelled, then merge,
# again and again, the adjacent pair of symbols that occurs most often in the training text, and
# add the merged symbol to the vocabulary. After a few thousand merges the frequent words are
# single symbols, and a rare word is spelled with a few frequent pieces: a compound from its
# parts, an inflected form from its stem and ending.
#
# The learned model is the list of merges, in order. Three details make it work:
#
# 1. **An end-of-word marker.** Each word is spelled as its characters followed by `</w>`, so
#    `er</w>` (the ending of *Fahrer*) and `er` (inside *Bergsteiger*) are different symbols, and
#    a segmented text joins back: concatenate the symbols and turn each `</w>` into a space.
# 2. **Word counts, not sentences.** Merges never cross a word boundary, so the learner needs each
#    distinct word only once, with its count: far fewer than the tokens of the text.
# 3. **Counts that are updated, not recounted.** A merge changes only the words that hold the
#    merged pair, so only those are re-spelled and their pairs recounted; a heap of counts gives
#    the most frequent pair.
#
# Ties go to the pair that comes first in Python's string order (by code point: capitals first),
# so the merges do not depend on the order in which the words were counted.
#
# To segment a word, new or seen, spell it in characters and `</w>`, then repeatedly merge the
# adjacent pair that was learned *earliest*, until no learned pair is left. Each training word
# gets exactly its spelling at the end of learning (`tests/test_subwords.py` checks that on random
# corpora), and a word never seen still falls apart into pieces that exist, in the worst case its
# characters.

# %% tags=["export"]
import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise

END_OF_WORD = "</w>"


def merge_pair(symbols: Sequence[str], pair: tuple[str, str]) -> list[str]:
    """The symbols with every occurrence of pair joined into one symbol, left to right."""
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


def _check_word_counts(word_counts: Mapping[str, int], end_of_word: str) -> None:
    """Raise a clear error for a corpus that learn_bpe cannot use."""
    if not isinstance(word_counts, Mapping):
        raise TypeError(
            f"word_counts must map each word to its count (a dict or Counter), "
            f"got {type(word_counts).__name__}"
        )
    if not word_counts:
        raise ValueError("word_counts is empty: learn_bpe needs at least one word")
    for word, count in word_counts.items():
        if not isinstance(word, str) or not word or end_of_word in word:
            raise ValueError(
                f"word_counts has the key {word!r}: words must be non-empty strings without "
                f"the end-of-word marker {end_of_word!r}"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"word_counts[{word!r}] must be a positive integer, got {count!r}")


def learn_bpe(
    word_counts: Mapping[str, int], num_merges: int, *, end_of_word: str = END_OF_WORD
) -> list[tuple[str, str]]:
    """Up to num_merges merges, each joining the most frequent adjacent pair (Sennrich et al.).

    Words start as their characters plus end_of_word; a pair's count is summed over the words
    that hold it, each weighted by its count. Ties go to the smallest pair in Python's string
    order. Learning stops early when every word is a single symbol.
    """
    if isinstance(num_merges, bool) or not isinstance(num_merges, int) or num_merges < 0:
        raise ValueError(f"num_merges must be an integer >= 0, got {num_merges!r}")
    _check_word_counts(word_counts, end_of_word)
    words = [[*word, end_of_word] for word in word_counts]  # word i, spelled in symbols
    counts = list(word_counts.values())
    pair_counts: Counter[tuple[str, str]] = Counter()  # pair -> occurrences in the corpus
    holders: defaultdict[tuple[str, str], set[int]] = defaultdict(set)  # pair -> word indices
    for i, symbols in enumerate(words):
        for pair in pairwise(symbols):
            pair_counts[pair] += counts[i]
            holders[pair].add(i)
    heap = [(-count, pair) for pair, count in pair_counts.items()]  # most frequent on top
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < num_merges:
        negative_count, pair = heapq.heappop(heap)
        if pair_counts[pair] == 0 or -negative_count != pair_counts[pair]:
            continue  # stale: the pair's count changed after this entry was pushed
        merges.append(pair)
        delta: Counter[tuple[str, str]] = Counter()  # how this merge changes each pair's count
        for i in holders.pop(pair):  # 1) re-spell only the words that hold the pair
            old, new = words[i], merge_pair(words[i], pair)
            old_pairs, new_pairs = list(pairwise(old)), list(pairwise(new))
            for p in old_pairs:  # 2) take out the word's old pairs, put in its new ones
                delta[p] -= counts[i]
            for p in new_pairs:
                delta[p] += counts[i]
            for p in set(old_pairs) - set(new_pairs):
                holders[p].discard(i)
            for p in set(new_pairs) - set(old_pairs):
                holders[p].add(i)
            words[i] = new
        for p, change in delta.items():  # 3) push the new counts; older entries go stale
            if change:
                pair_counts[p] += change
                if pair_counts[p] > 0:
                    heapq.heappush(heap, (-pair_counts[p], p))
    return merges


def segment_word(
    word: str, ranks: Mapping[tuple[str, str], int], *, end_of_word: str = END_OF_WORD
) -> list[str]:
    """A word as BPE symbols (the last ends with end_of_word); ranks: {merge: its position}.

    Repeatedly applies the earliest learned merge that fits; characters that no merge covers
    stay single symbols, so any word can be segmented.
    """
    if not isinstance(word, str) or not word:
        raise ValueError(f"word must be a non-empty string, got {word!r}")
    symbols = [*word, end_of_word]
    while len(symbols) > 1:
        pair = min(pairwise(symbols), key=lambda p: ranks.get(p, math.inf))
        if pair not in ranks:
            break  # no learned merge applies any more
        symbols = merge_pair(symbols, pair)
    return symbols

# %% [markdown]
# A corpus small enough to do by hand: *Hund* (dog) four times, *Hut* (hat) three times and
# *und* (and) twice. Spelled with the marker, the pairs and their counts are
# (H, u) 7, (u, n) 6, (n, d) 6, (d, `</w>`) 6, (u, t) 3 and (t, `</w>`) 3. So the first merge
# is (H, u). Next, (n, d) and (d, `</w>`) tie at 6; `d` sorts before `n`, so `d</w>` comes
# second, and `nd</w>` third. Then *Hund* becomes one symbol (4), *Hut* takes two merges (3
# each, (Hu, t) before (t, `</w>`) because capitals sort first), and *und* comes last (2):

# %%
toy = {"Hund": 4, "Hut": 3, "und": 2}
toy_merges = learn_bpe(toy, num_merges=10)
for rank, (left, right) in enumerate(toy_merges):
    print(f"merge {rank}: {left} + {right} -> {left + right}")
toy_ranks = {pair: rank for rank, pair in enumerate(toy_merges)}
print("segmented after the first 3 merges:",
      {word: segment_word(word, dict(list(toy_ranks.items())[:3])) for word in toy})
print("a word never seen:", segment_word("Hunde", toy_ranks), segment_word("Zug", toy_ranks))

# %% [markdown]
# Only seven merges exist: after the seventh every word is one symbol. A word never seen gets the
# learned merges that fit it. *Hunde* (dogs) gets *Hu* but not *Hund*: every merge that built
# *Hund* went through `d</w>`, because in this corpus *Hund* only ever ended a word. That is the
# end-of-word marker at work. *Zug* (train) shares no learned pair and stays in characters.
#
# Now the real corpus: the words of both languages' training text, counted together, since the
# paper's vocabulary was shared. Eight thousand merges:

# %%
word_counts = Counter(
    word for side in (0, 1) for sentence in tokens["train"][side] for word in sentence
)
print(f"{sum(word_counts.values()):,} training tokens, {len(word_counts):,} distinct words")
start = time.perf_counter()
merges = learn_bpe(word_counts, num_merges=8000)
print(f"learned {len(merges):,} merges in {time.perf_counter() - start:.1f} s")
print("the first 24:", "  ".join(f"{a}+{b}" for a, b in merges[:24]))

alphabet = sorted({char for word in word_counts for char in word})
bpe_symbols = set(alphabet) | {END_OF_WORD} | {left + right for left, right in merges}
print(f"vocabulary: {len(alphabet)} characters + {END_OF_WORD} + {len(merges):,} merged symbols "
      f"= {len(bpe_symbols):,} symbols")

# %% [markdown]
# The first merges attach frequent word endings to the end-of-word marker (German inflections and
# English plurals), make the full stop one symbol, and join common letter pairs. The vocabulary is
# the alphabet of the training text, the marker and one symbol per merge: for both languages,
# about as many symbols as chapter 14's German vocabulary alone.
#
# The symbols of every training word join back to the word, and the lost compounds now come apart
# into pieces that occur in the training text:

# %%
ranks = {pair: rank for rank, pair in enumerate(merges)}
segmented = {word: segment_word(word, ranks) for word in word_counts}
assert all("".join(symbols) == word + END_OF_WORD for word, symbols in segmented.items())
for word in examples:
    print(f"{word:>24} ({train_counts[word]} in train): {' '.join(segment_word(word, ranks))}")

# %% [markdown]
# Some splits follow the seams of the compound: *Schaufenster + scheibe* (shop window, pane),
# *Feuerwehr + kleidung* (fire brigade, clothing), *kopf + stein + gepflasterten* (cobbled).
# Others are merely frequent strings: *Baumwolle* (cotton) keeps *Baum* (tree) but spells *Wolle*
# (wool) as *wo + lle*, and *Eisfischerhütte* keeps only *Eis* whole. Byte-pair encoding knows
# frequencies, not morphology. Still, each piece has an embedding trained on every word that
# contains it, where the word vocabulary had one `<unk>` for all of them.
#
# The price is length. Spelled in symbols, a validation sentence is longer than in words:

# %%
bpe_lengths = {}
for side, language in enumerate(("German", "English")):
    sentences = tokens["val"][side]
    words = sum(map(len, sentences))
    pieces = [symbol for sentence in sentences for word in sentence
              for symbol in segment_word(word, ranks)]
    unknown = sum(symbol not in bpe_symbols for symbol in pieces)
    bpe_lengths[language] = len(pieces) / len(sentences)
    print(f"{language:>7} val: {words / len(sentences):.2f} words, "
          f"{len(pieces) / len(sentences):.2f} BPE symbols per sentence "
          f"({len(pieces) / words - 1:+.0%}); {unknown} symbols outside the vocabulary")

# %% [markdown]
# German sentences grow by about a fifth and English ones by about a tenth: frequent words stay
# whole, and only the rare ones are spelled in pieces, more of them in German. No symbol of the
# validation text is outside the vocabulary, because every character of the validation text also
# occurs in the training text.
#
# ## sentencepiece
#
# In practice one uses a tool. sentencepiece {cite}`kudo2018sentencepiece` implements byte-pair
# encoding and a second algorithm, the unigram language model {cite}`kudo2018subword`, which
# starts from a large set of candidate pieces and prunes the ones that least help the likelihood
# of the training text. It reads raw sentences, not a word tokenizer's output: a space is a symbol
# like any other (shown as `▁`, U+2581, attached to the piece that follows it), so a segmented
# sentence turns back into text by joining its pieces and replacing `▁` by a space, with no
# language-specific rules, unlike chapter 14's `detokenize`.
#
# `train_sentencepiece` trains a model in memory (nothing is written to disk) with three choices:
#
# * **The book's special ids.** `<s>`, `</s>`, `<blank>` and `<unk>` get ids 0 to 3, as in
#   `SPECIALS`, so `Batch`, `collate_batch` and the decoders work unchanged.
# * **Lossless.** We switch off sentencepiece's Unicode normalization and its squeezing of
#   repeated spaces, so that decoding gives back exactly the input text (except the symbol `▁`
#   itself, which comes back as a space).
# * **Every character.** `character_coverage=1.0` gives every character of the training text a
#   piece, and `byte_fallback=True` spells a character never seen in training as its UTF-8 bytes
#   (256 reserved pieces) instead of `<unk>`.
#
# The two languages go in together, as the sentences of one corpus.

# %% tags=["export"]
import io
from collections.abc import Iterable
from typing import Any

SENTENCEPIECE_MODEL_TYPES = ("bpe", "unigram")


def train_sentencepiece(
    sentences: Iterable[str],
    *,
    vocab_size: int = 8000,
    model_type: str = "bpe",
    byte_fallback: bool = True,
    num_threads: int = 1,
) -> Any:
    """A sentencepiece model trained in memory (no files), with the ids of SPECIALS.

    Returns a sentencepiece.SentencePieceProcessor that decodes every encoded text back to
    itself (no normalization, spaces kept, unseen characters as UTF-8 bytes with byte_fallback),
    except the meta symbol U+2581 itself, which comes back as a space.
    """
    import sentencepiece as spm

    if isinstance(sentences, str):
        raise TypeError("sentences must be an iterable of sentences, got one str: wrap it")
    sentences = [s for s in sentences if s]
    if not sentences:
        raise ValueError("sentences holds no non-empty sentence to train on")
    if not all(isinstance(s, str) for s in sentences):
        raise TypeError("sentences must hold only strings")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 4:
        raise ValueError(f"vocab_size must be an integer > 4 (the specials), got {vocab_size!r}")
    if model_type not in SENTENCEPIECE_MODEL_TYPES:
        raise ValueError(
            f"model_type must be one of {', '.join(SENTENCEPIECE_MODEL_TYPES)}, got {model_type!r}"
        )
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,  # the trained model goes here, not into a file
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,  # every character of the training text gets a piece
            byte_fallback=byte_fallback,  # unseen characters become byte pieces, not <unk>
            normalization_rule_name="identity",  # no NFKC: text comes back as it went in
            remove_extra_whitespaces=False,  # keep leading, trailing and repeated spaces
            bos_id=SPECIALS.index("<s>"), bos_piece="<s>",
            eos_id=SPECIALS.index("</s>"), eos_piece="</s>",
            pad_id=SPECIALS.index("<blank>"), pad_piece="<blank>",
            unk_id=SPECIALS.index("<unk>"), unk_piece="<unk>",
            num_threads=num_threads,
            minloglevel=2,  # errors only
        )
    except RuntimeError as err:  # e.g. vocab_size larger than the text allows
        raise ValueError(
            f"sentencepiece could not train vocab_size={vocab_size} ({model_type}) on "
            f"{len(sentences)} sentences: {err}"
        ) from err
    return spm.SentencePieceProcessor(model_proto=model.getvalue())

# %%
train_sentences = [sentence for pair in splits["train"] for sentence in pair]  # German, English
start = time.perf_counter()
sp = train_sentencepiece(train_sentences, vocab_size=8000)
print(f"trained on {len(train_sentences):,} sentences in {time.perf_counter() - start:.1f} s")
print("first ids:", [sp.id_to_piece(i) for i in range(8)], "...")
german, english = splits["val"][1]
for sentence in (german, english):
    print(sp.encode(sentence, out_type=str))
print(sp.encode(german)[:10], "...")

# %% [markdown]
# The ids start with the book's four specials and the 256 byte pieces; the learned pieces follow.
# In this validation pair every word is one piece. A piece that starts a word carries the `▁` of
# the space before it; the full stop, which follows its word without a space, has none.
#
# Decoding gives back every sentence of the validation and test sets; the default normalization
# would have changed one of them, and a character that training never saw becomes bytes rather
# than `<unk>`:

# %%
import unicodedata

held_out = [sentence for split in ("val", "test_2016_flickr") for pair in splits[split]
            for sentence in pair]
same = sum(sp.decode(sp.encode(sentence)) == sentence for sentence in held_out)
print(f"decode(encode(x)) == x for {same:,} of {len(held_out):,} val and test sentences")
changed = [s for s in held_out if unicodedata.normalize("NFKC", s) != s]
print(f"NFKC normalization would change {len(changed)}:", [s[:58] + "..." for s in changed])

unseen = "Ein Café in Łódź 🐕"
print(sp.encode(unseen, out_type=str))
assert sp.decode(sp.encode(unseen)) == unseen

# %% [markdown]
# The one sentence that NFKC would change holds a no-break space (U+00A0, in "120 cm"), which NFKC
# turns into an ordinary space: harmless for most uses, but "lossless" is worth having exactly.
# The Polish letters and the dog do not occur in Multi30k; they come out as their UTF-8 bytes and
# decode back exactly, where without byte fallback each would have been `<unk>`.
#
# ## How large a vocabulary?
#
# The vocabulary size is the one knob. A small vocabulary spells more words in pieces, so
# sentences get longer; a large one keeps more words whole. We train byte-pair models of 2,000 to
# 16,000 pieces and one unigram model, and measure each on the validation set against chapter
# 14's word vocabularies:

# %%
def subword_row(name: str, model: Any, kind: str) -> dict[str, Any]:
    """Vocabulary size, pieces per val sentence and the <unk> share on val and test, for a model."""
    row = {"vocabulary": name, "kind": kind, "size": len(model)}
    for side, language in enumerate(("German", "English")):
        ids = [model.encode(pair[side]) for pair in splits["val"]]
        row[f"{language} tokens per sentence"] = sum(map(len, ids)) / len(ids)
    ids = model.encode(held_out)
    unk = SPECIALS.index("<unk>")
    row["<unk> share"] = sum(i == unk for s in ids for i in s) / sum(map(len, ids))
    return row


held_out_words = [(side, word) for split in ("val", "test_2016_flickr") for side in (0, 1)
                  for sentence in tokens[split][side] for word in sentence]
rows = [{
    "vocabulary": f"words, min_freq=2 ({len(vocabs[0]):,} + {len(vocabs[1]):,})", "kind": "words",
    "size": len(vocabs[0]) + len(vocabs[1]),
    "German tokens per sentence": sum(map(len, tokens["val"][0])) / len(splits["val"]),
    "English tokens per sentence": sum(map(len, tokens["val"][1])) / len(splits["val"]),
    "<unk> share": sum(word not in vocabs[side] for side, word in held_out_words)
    / len(held_out_words),
}]
spelled = {word: segment_word(word, ranks) for _, word in held_out_words}  # each word once
bpe_pieces = [symbol for _, word in held_out_words for symbol in spelled[word]]
rows.append({"vocabulary": "our BPE, 8,000 merges", "kind": "our BPE", "size": len(bpe_symbols),
             "German tokens per sentence": bpe_lengths["German"],
             "English tokens per sentence": bpe_lengths["English"],
             "<unk> share": sum(s not in bpe_symbols for s in bpe_pieces) / len(bpe_pieces)})
start = time.perf_counter()
models = {}
for size in (2000, 4000, 8000, 16000):
    models[f"bpe {size}"] = sp if size == 8000 else train_sentencepiece(
        train_sentences, vocab_size=size)
models["unigram 8000"] = train_sentencepiece(train_sentences, vocab_size=8000,
                                             model_type="unigram")
print(f"trained 4 more models in {time.perf_counter() - start:.1f} s")
rows += [subword_row(f"sentencepiece {name}", model, "sentencepiece " + name.split()[0])
         for name, model in models.items()]
table = pd.DataFrame(rows).drop(columns="kind")
for language in ("German", "English"):  # how much longer than in words
    column = table[f"{language} tokens per sentence"]
    table.insert(table.columns.get_loc(column.name) + 1, f"{language} vs words",
                 (column / column[0] - 1).map("{:+.0%}".format))
table["<unk> share"] = table["<unk> share"].map("{:.2%}".format)
table.round(2)

# %% tags=["export", "hide-cell"]
def vocabulary_chart(rows: Sequence[Mapping[str, Any]], *, title: str, subtitle: str) -> Any:
    """Tokens per sentence against vocabulary size, per language: BPE sizes as a line, the
    other vocabularies as points (rows as `subword_row` makes them)."""
    import altair as alt

    long_rows = [
        {"vocabulary": row["vocabulary"], "kind": row["kind"], "size": row["size"],
         "language": language, "tokens per sentence": row[f"{language} tokens per sentence"]}
        for row in rows for language in ("German", "English")
    ]
    if not long_rows:
        raise ValueError("rows is empty: there are no vocabularies to draw")
    base = alt.Chart(alt.Data(values=long_rows)).encode(
        x=alt.X("size:Q", scale=alt.Scale(type="log", domain=[1500, 20000], nice=False),
                title="vocabulary size, log scale (words: German + English)"),
        y=alt.Y("tokens per sentence:Q", scale=alt.Scale(zero=False),
                title="tokens per val sentence"),
        color=alt.Color("language:N", title=None),
        tooltip=["vocabulary:N", "language:N",
                 alt.Tooltip("tokens per sentence:Q", format=".2f")],
    )
    bpe = alt.datum.kind == "sentencepiece bpe"
    bpe_lines = base.transform_filter(bpe).mark_line(point=True)
    others = base.transform_filter(~bpe).mark_point(size=80, filled=True).encode(
        shape=alt.Shape("kind:N", title=None)
    )
    return (bpe_lines + others).properties(
        width=420, height=240, title=alt.TitleParams(title, subtitle=subtitle)
    )


# %%
vocabulary_chart(rows, title="Longer sentences for a smaller vocabulary",
                 subtitle="lines: sentencepiece BPE of 2,000 to 16,000 pieces; points: the others")

# %% [markdown]
# No subword vocabulary leaves a `<unk>` on the held-out sets, where the word vocabularies lose a
# few percent of the tokens. What the size buys is length: look at how much longer a German
# sentence is than in words, from 2,000 pieces to 16,000. English, with fewer word forms, grows
# less at every size, and each doubling of the vocabulary shortens the sentences less than the one
# before: the frequent words are whole early, and the extra pieces go to rarer and rarer words.
#
# Our byte-pair encoding with 8,000 merges comes out close to sentencepiece's with 8,000 pieces,
# although ours starts from spaCy's words and marks where they end, while sentencepiece starts
# from raw text, marks where words start, and counts its 256 byte pieces among the 8,000. The
# unigram model of the same size gives slightly longer sequences (its sampling of segmentations
# as a regularizer {cite}`kudo2018subword` is not used here).
#
# From here on we keep the byte-pair model with 8,000 pieces for both languages: about the size
# of chapter 14's German vocabulary alone, sentences somewhat longer, and nothing unknown. It is a
# reasonable size, not a tuned one; the paper's 37,000 served about 4.5 million sentence pairs,
# some 155 times Multi30k's 29,000.
#
# ## One vocabulary for both languages
#
# A joint vocabulary is not two vocabularies glued together. Names, numbers, punctuation and
# borrowed words are spelled the same in both languages and get one piece between them:

# %%
used = [Counter(i for pair in splits["train"] for i in sp.encode(pair[side])) for side in (0, 1)]
both = set(used[0]) & set(used[1])
neither = set(range(len(sp))) - set(used[0]) - set(used[1])
print(f"of {len(sp):,} pieces, {len(set(used[0]) - both):,} occur only in German training text, "
      f"{len(set(used[1]) - both):,} only in English, {len(both):,} in both, "
      f"{len(neither):,} in neither")
specials = sum(i < len(SPECIALS) for i in neither)
byte_pieces = sum(sp.is_byte(i) for i in neither)
print(f"  of those in neither: {specials} special, {byte_pieces} bytes, "
      f"{len(neither) - specials - byte_pieces} other pieces")
shared_words = sorted((i for i in both if sp.id_to_piece(i).startswith("▁")
                       and len(sp.id_to_piece(i)) >= 7),
                      key=lambda i: (-min(used[0][i], used[1][i]), sp.id_to_piece(i)))
print("word-initial pieces in both:", [sp.id_to_piece(i) for i in shared_words[:14]])

# %% [markdown]
# About a quarter of the pieces occur in both languages: punctuation and numbers, names (*London*,
# *McDonald*), words borrowed by one language from the other or by both from a third (*Frisbee*,
# *Hockey*, *Person*, *orange*), and many word fragments. Each has one embedding, trained on both
# languages. (Those used by neither are the specials, the byte pieces and, most likely, pieces
# built only on the way to longer ones.) For translation, one vocabulary means that a name or a
# number has the same id in the source and in the target, so copying it is a matter of producing
# the id that the encoder read.
#
# With one vocabulary, chapter 5's `make_model(..., share_embeddings=True)` can tie all three
# matrices as the paper did. What that does to the size of chapter 14's CPU model ($N=3$,
# $d_{\text{model}}=256$, $d_{\text{ff}}=1024$, $h=8$), counted on untrained models
# (`parameters()` lists a shared tensor once):

# %%
config = training_config("cpu")
layer_sizes = {"N": config.N, "d_model": config.d_model, "d_ff": config.d_ff, "h": config.h}


def parameter_counts(name: str, model: Any) -> dict[str, Any]:
    """Parameters in the vocabulary-sized tables (embeddings, generator) and in the rest."""
    tables = {id(p): p for p in (model.src_embed[0].lut.weight, model.tgt_embed[0].lut.weight,
                                 model.generator.proj.weight, model.generator.proj.bias)}
    total = sum(p.numel() for p in model.parameters())
    in_tables = sum(p.numel() for p in tables.values())
    return {"model": name, "embeddings and generator": in_tables, "rest": total - in_tables,
            "total": total}


V = len(sp)
tied = make_model(V, V, **layer_sizes, share_embeddings=True)
counted = [
    parameter_counts(f"words: {len(vocabs[0]):,} German, {len(vocabs[1]):,} English",
                     make_model(len(vocabs[0]), len(vocabs[1]), **layer_sizes)),
    parameter_counts(f"subwords: {V:,} joint, not tied", make_model(V, V, **layer_sizes)),
    parameter_counts(f"subwords: {V:,} joint, tied three ways", tied),
]
assert tied.src_embed[0].lut.weight is tied.tgt_embed[0].lut.weight
assert tied.generator.proj.weight is tied.src_embed[0].lut.weight
print(f"tied subword model: {counted[2]['total'] / counted[0]['total'] - 1:+.1%} parameters "
      "against the word model")
table = pd.DataFrame(counted).set_index("model")
for column in table:
    table[column] = table[column].map("{:,}".format)
table

# %% [markdown]
# With word vocabularies, the three vocabulary-sized tables (the German embedding, the English
# embedding, and the generator's weight and bias) hold almost half of the model's 10.8 million
# parameters. A joint vocabulary without tying makes the model *larger*, because both embedding
# tables now have 8,000 rows. Tied three ways, one $8{,}000 \times 256$ matrix serves all three
# uses (the generator keeps its own biases), and the model shrinks by almost 30%. The layers in
# between are the same in all three models.
#
# ## Longer sentences, fewer of them per batch
#
# Chapter 9's batches hold a budget of padded tokens, not a number of sentences (the `cpu` preset
# gives each batch 1,500 tokens per side), so longer sequences mean fewer sentences per batch and
# more batches, so more optimizer steps, per epoch. The training set under both vocabularies,
# with chapter 14's `max_len=72` and the same sampler and seed:

# %%
train_pairs = splits["train"]
word_examples = encode_pairs(zip(*tokens["train"], strict=True), *vocabs)
subword_examples = [(sp.encode(de), sp.encode(en)) for de, en in train_pairs]
budget_rows = []
for name, examples_ in (("words", word_examples), (f"sentencepiece bpe {V}", subword_examples)):
    kept, dropped = filter_by_length(examples_, max_len=config.max_len)
    src_lengths, tgt_lengths = example_lengths(kept)
    sampler = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=config.max_tokens, seed=0)
    batches = sampler.batches()
    budget_rows.append({
        "tokens": name,
        "German per sentence": sum(len(src) for src, _ in kept) / len(kept),
        "English per sentence": sum(len(tgt) for _, tgt in kept) / len(kept),
        "pairs over max_len": dropped,
        "target tokens per epoch": sum(len(tgt) + 1 for _, tgt in kept),  # labels, with </s>
        "batches per epoch": len(batches),
        "sentences per batch": len(kept) / len(batches),
        "padding": padding_fraction(batches, src_lengths, tgt_lengths),
    })
table = pd.DataFrame(budget_rows).set_index("tokens")
table["padding"] = table["padding"].map("{:.1%}".format)
table.round(2)

# %%
words_row, subwords_row = budget_rows
for key in ("target tokens per epoch", "batches per epoch"):
    print(f"{key}: {subwords_row[key] / words_row[key] - 1:+.1%} with subwords")
ratio = subwords_row["sentences per batch"] / words_row["sentences per batch"]
print(f"sentences per batch: {ratio - 1:+.1%} with subwords")
for row in budget_rows:  # the cpu preset's warmup is counted in optimizer steps
    print(f"{row['tokens']}: warmup of {config.warmup:,} steps ends after "
          f"{config.warmup / row['batches per epoch']:.1f} epochs")

# %% [markdown]
# The length filter drops nothing. Each epoch has more target tokens to predict, and
# proportionally more batches still: the budget binds on the longer side of each pair, and the
# German source grows more than the English target. The padding stays small, because the sampler
# still groups sentences of similar length. For a fixed number of epochs the run takes more
# optimizer steps, and a warmup counted in steps ends earlier in the run.

# %% [markdown]
# ## Growing chapter 14's run for subwords
#
# Chapter 18 trains on subwords; this chapter writes what the run needs. Chapter 14 wrote its
# configuration and data functions for two word vocabularies; they grow by the book's one
# mechanism (README, "Growing a definition"): the same name defined again, chapter 14's parameters
# unchanged, the new options with defaults that give chapter 14's behaviour.
#
# **Configuration.** Two fields: `subwords`, the size of one joint sentencepiece vocabulary (0
# keeps the two word vocabularies), and `share_embeddings`, which ties the three matrices as above
# (§3.4). The preset `cpu_subword` is chapter 14's `cpu` with these two fields changed. The runs
# also differ in what the vocabulary brings with it: an epoch has 343 batches instead of 305 (the
# table above), so the same 12 epochs take more optimizer steps and the warm-up ends earlier.

# %% tags=["export", "extends"]
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TrainConfig:
    """Chapter 14's configuration, grown by a joint subword vocabulary and tied embeddings."""

    N: int = 6
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    dropout: float = 0.1
    max_tokens: int = 4096
    accum_iter: int = 1
    epochs: int = 30
    warmup: int = 1000
    lr_factor: float = 0.5
    label_smoothing: float = 0.1
    max_len: int = 72
    min_freq: int = 2
    seed: int = 0
    checkpoint_dir: str = "checkpoints/multi30k_base"
    train_limit: int | None = None
    val_limit: int | None = None
    keep_epochs: int = 0
    bleu_every: int = 1
    subwords: int = 0  # 0: two word vocabularies; else one joint sentencepiece vocabulary this big
    share_embeddings: bool = False  # one matrix for both embeddings and the generator (§3.4)

    def __post_init__(self) -> None:
        check_train_config(self)
        if isinstance(self.subwords, bool) or not isinstance(self.subwords, int) or (
                self.subwords < 0):
            raise ValueError(f"subwords must be an integer >= 0, got {self.subwords!r}")
        if self.share_embeddings and not self.subwords:
            raise ValueError("share_embeddings=True needs one joint vocabulary: set subwords > 0")


def training_config(name: str, **overrides) -> TrainConfig:
    """The preset `name` ("cpu", "base" or "cpu_subword") with some fields replaced."""
    cpu = TrainConfig(
        N=3, d_model=256, d_ff=1024, h=8, dropout=0.1, max_tokens=1500, accum_iter=1,
        epochs=12, warmup=1000, lr_factor=0.5, checkpoint_dir="checkpoints/multi30k_cpu",
    )
    presets = {
        "cpu": cpu,
        "base": TrainConfig(),
        "cpu_subword": replace(cpu, subwords=8000, share_embeddings=True,
                               checkpoint_dir="checkpoints/multi30k_cpu_subword"),
    }
    if name not in presets:
        raise ValueError(f"name must be one of {', '.join(presets)}, got {name!r}")
    return replace(presets[name], **overrides)


# %% [markdown]
# **Data.** The run's vocabulary is one sentencepiece model, stored beside the checkpoints as
# `subwords.model`, where resuming, `load_trained_model` and `translate` read it. It reads raw
# text: `sp.encode` replaces `tokenize` and `Vocab.encode` on the way in, and `sp.decode` replaces
# `detokenize` on the way out. The same model serves both languages, so each function returns it
# twice where chapter 14 returned a German and an English vocabulary.

# %% tags=["export"]
import os
from pathlib import Path

SUBWORD_FILE = "subwords.model"  # one sentencepiece model for both languages


def load_subwords(path: str | os.PathLike) -> Any:
    """A sentencepiece model from its file, or a one-line error that names the file."""
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as err:
        raise ValueError(f"{path} is not a readable sentencepiece model ({err})") from err


# %% tags=["export", "extends"]
def multi30k_vocabularies(
    config: TrainConfig,
    tokenizers: tuple[Any, Any],
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    save: bool = True,
) -> tuple[Vocab, Vocab]:
    """Chapter 14's two word vocabularies, or with config.subwords one sentencepiece model
    trained on both languages, returned twice; save=True writes them into the checkpoint
    folder."""
    if pairs is None:  # train only: val and test stay unseen
        pairs = load_multi30k("train")[: config.train_limit]
    if config.subwords:
        sp = train_sentencepiece([s for pair in pairs for s in pair], vocab_size=config.subwords)
        vocabs = (sp, sp)
        writers = {SUBWORD_FILE: lambda path: Path(path).write_bytes(sp.serialized_model_proto())}
    else:
        token_pairs = tokenize_pairs(pairs, *tokenizers)
        vocabs = tuple(Vocab.build([pair[side] for pair in token_pairs], min_freq=config.min_freq)
                       for side in (0, 1))
        writers = dict(zip(VOCAB_FILES, (vocab.save for vocab in vocabs), strict=True))
    if save:
        write_run_files(config.checkpoint_dir, writers)
    return vocabs


def read_vocabularies(folder: str | os.PathLike, *, subwords: bool = False
                      ) -> tuple[Vocab, Vocab]:
    """The vocabularies a run wrote into its checkpoint folder: chapter 14's two word
    vocabularies, or with subwords=True the one sentencepiece model, twice."""
    paths = [Path(folder) / name for name in ([SUBWORD_FILE] if subwords else VOCAB_FILES)]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"the run's vocabularies are missing: {', '.join(missing)}")
    if subwords:
        sp = load_subwords(paths[0])
        return sp, sp
    return Vocab.load(paths[0]), Vocab.load(paths[1])


def encode_examples(
    pairs: Sequence[tuple[str, str]],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizers: tuple[Any, Any],
    *,
    max_len: int,
) -> list[tuple[list[int], list[int]]]:
    """Sentence pairs as id lists, without pairs longer than max_len; a sentencepiece model
    reads the raw text (tokenizers unused)."""
    if isinstance(vocab_src, Vocab):
        examples = encode_pairs(tokenize_pairs(pairs, *tokenizers), vocab_src, vocab_tgt)
    else:
        examples = [(vocab_src.encode(de), vocab_tgt.encode(en)) for de, en in pairs]
    return filter_by_length(examples, max_len=max_len)[0]


def encode_text(text: str, vocab: Vocab, tokenizer: Any) -> list[int]:
    """A sentence's ids: spaCy's tokens in a word Vocab, or a sentencepiece model's pieces of
    the raw text (tokenizer unused)."""
    if isinstance(vocab, Vocab):
        return vocab.encode(tokenize(text, tokenizer))
    return vocab.encode(text)


def decode_text(ids: Sequence[int], vocab: Vocab) -> str:
    """Plain text from output ids: detokenized words, or the sentencepiece model's decoding."""
    if isinstance(vocab, Vocab):
        return detokenize(vocab.lookup_tokens(ids))
    return vocab.decode(list(ids))


# %% [markdown]
# A small run's worth: a joint vocabulary of 500 pieces (the four specials and the 256 byte pieces
# among them) from the first 400 training pairs, written into a checkpoint folder and read back,
# then the first validation pair, whose *Baumwolle* (cotton) chapter 14's word model received as
# `<unk>`. With so few pieces most words are spelled in short pieces, but every word reaches the
# encoder, and the ids decode back to the exact text. The word configuration still gives chapter
# 14's two vocabularies.

# %%
import tempfile

with tempfile.TemporaryDirectory() as folder:
    small = training_config("cpu_subword", subwords=500, train_limit=400, checkpoint_dir=folder)
    built, _ = multi30k_vocabularies(small, tokenizers)
    print("checkpoint folder:", sorted(os.listdir(folder)))
    joint, same = read_vocabularies(folder, subwords=True)
assert joint is same and len(joint) == len(built) == 500
german, english = splits["val"][0]
pieces = encode_examples([(german, english)], joint, joint, tokenizers, max_len=72)
src_ids, tgt_ids = pieces[0]
print(len(src_ids), "German ids:", joint.encode(german, out_type=str))
assert decode_text(src_ids, joint) == german and decode_text(tgt_ids, joint) == english
assert encode_text(german, joint, tokenizers[0]) == src_ids
words = training_config("cpu", train_limit=400)
vocab_de, vocab_en = multi30k_vocabularies(words, tokenizers, save=False)
token_pairs = tokenize_pairs(splits["train"][:400], *tokenizers)
assert vocab_en.itos == Vocab.build([en for _, en in token_pairs], min_freq=2).itos
print(f"words: {len(vocab_de):,} German and {len(vocab_en):,} English ids, as in chapter 14")

# %% [markdown]
# **Model.** `make_model(V, V, ..., share_embeddings=True)` with `V = len(sp)`, the tied model
# counted above. The training worker ({doc}`appendix_distributed`) passes `config.share_embeddings` to `make_model` and
# reads the vocabulary with `read_vocabularies(..., subwords=config.subwords > 0)`.
#
# **Translation.** BLEU is computed as before, with sacreBLEU on the decoded text against the
# untouched references, so a subword model's score is directly comparable with chapter 14's.
#
# What to expect: no `<unk>` in either direction. German words that are now lost would reach
# the encoder whole, in pieces seen in other words; rare English words and names could be written
# piece by piece, and so could words that do not exist, when pieces are combined badly.
# {cite:t}`sennrich2016neural` found subword models better on rare and unseen words in WMT news
# translation; whether that shows in BLEU on Multi30k's short captions, chapter 18 measures.

# %% [markdown]
# ```{note}
# The classic Annotated Transformer listed byte-pair encoding and shared embeddings among its
# "additional components" and showed the tying in a block guarded by `if False:`, which never ran
# and would have failed (it named attributes that its model did not have); its Multi30k model kept
# two word vocabularies. Here the tying is a tested option of `make_model`.
# ```
#
# ## What we have
#
# Word vocabularies lose a few percent of the German validation tokens, mostly long words such as compounds, and
# touch about two in five of the sentences. `learn_bpe` and `segment_word` learn and apply
# byte-pair merges in a few dozen lines, and `train_sentencepiece` trains the maintained
# implementation in memory, with the book's special ids, lossless decoding and no `<unk>`. A joint
# vocabulary of 8,000 pieces makes sentences longer and batches smaller in sentences, and, with
# the three matrices tied, the model almost 30% smaller. The next chapter trains on it and puts
# the paper's whole recipe into one table.
