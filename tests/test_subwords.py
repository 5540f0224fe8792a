"""Chapter 17: byte-pair encoding from scratch, and sentencepiece trained in memory."""

import random
from collections import Counter
from itertools import pairwise

import pytest

from the_annotated_transformer import (
    END_OF_WORD,
    SPECIALS,
    learn_bpe,
    merge_pair,
    segment_word,
    train_sentencepiece,
)

# Worked out by hand in the chapter: pairs (H,u) 7, (u,n) 6, (n,d) 6, (d,</w>) 6, (u,t) 3,
# (t,</w>) 3. Ties go to the smaller pair in Python's string order ("d" < "n", "Hu" < "t").
TOY = {"Hund": 4, "Hut": 3, "und": 2}
TOY_MERGES = [
    ("H", "u"),
    ("d", END_OF_WORD),
    ("n", "d" + END_OF_WORD),
    ("Hu", "nd" + END_OF_WORD),
    ("Hu", "t"),
    ("Hut", END_OF_WORD),
    ("u", "nd" + END_OF_WORD),
]


def ranks_of(merges):
    return {pair: rank for rank, pair in enumerate(merges)}


def naive_bpe(word_counts, num_merges):
    """Reference learner: recount every pair before every merge; the same tie-break."""
    words = {word: [*word, END_OF_WORD] for word in word_counts}
    merges = []
    for _ in range(num_merges):
        counts = Counter()
        for word, symbols in words.items():
            for pair in pairwise(symbols):
                counts[pair] += word_counts[word]
        if not counts:
            break
        best = min(counts, key=lambda pair: (-counts[pair], pair))
        merges.append(best)
        words = {word: merge_pair(symbols, best) for word, symbols in words.items()}
    return merges, words


def random_corpus(seed):
    """Small corpora over tiny alphabets: many ties, repeated letters, overlapping pairs."""
    rng = random.Random(seed)
    alphabet = rng.choice(["ab", "abc", "aab", "Hund"])
    corpus = {}
    for _ in range(rng.randint(1, 25)):
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        corpus[word] = rng.randint(1, 6)
    return corpus, rng.randint(0, 40)


def test_learn_bpe_gives_the_merges_worked_out_by_hand():
    assert learn_bpe(TOY, num_merges=10) == TOY_MERGES
    assert learn_bpe(TOY, num_merges=3) == TOY_MERGES[:3]
    assert learn_bpe(TOY, num_merges=0) == []


def test_learn_bpe_stops_when_every_word_is_one_symbol():
    merges = learn_bpe(TOY, num_merges=1000)
    assert len(merges) == 7
    assert all(segment_word(word, ranks_of(merges)) == [word + END_OF_WORD] for word in TOY)


def test_learn_bpe_breaks_ties_by_string_order_not_by_dictionary_order():
    corpus = {"cd": 1, "ab": 1, "ba": 1}  # every pair occurs once
    reversed_corpus = dict(reversed(list(corpus.items())))
    # ("a", "</w>") < ("a", "b") < ("b", "</w>") < ...: "<" sorts before letters
    assert learn_bpe(corpus, 2) == learn_bpe(reversed_corpus, 2) == [("a", END_OF_WORD), ("a", "b")]
    assert learn_bpe(corpus, 50) == learn_bpe(reversed_corpus, 50)


@pytest.mark.parametrize("seed", range(60))
def test_learn_bpe_matches_a_learner_that_recounts_every_pair(seed):
    corpus, num_merges = random_corpus(seed)
    expected, _ = naive_bpe(corpus, num_merges)
    assert learn_bpe(corpus, num_merges) == expected


@pytest.mark.parametrize("seed", range(60))
def test_segment_word_reproduces_the_training_segmentation(seed):
    corpus, num_merges = random_corpus(seed)
    merges = learn_bpe(corpus, num_merges)
    _, trained = naive_bpe(corpus, num_merges)  # every merge applied in order, as in learning
    ranks = ranks_of(merges)
    for word in corpus:
        assert segment_word(word, ranks) == trained[word], word


def test_every_word_segments_into_symbols_that_join_back_to_it():
    corpus = Counter("ein Hund und ein Hut und eine Hütte , und Hunde .".split())
    ranks = ranks_of(learn_bpe(corpus, 20))
    for word in [*corpus, "Eisfischerhütte", "x", "Hund-Hütte", "ÄÖÜß", "Hund</x"]:
        symbols = segment_word(word, ranks)
        assert symbols[-1].endswith(END_OF_WORD)
        assert "".join(symbols) == word + END_OF_WORD


def test_an_unseen_word_segments_into_known_pieces_and_characters_without_unk():
    ranks = ranks_of(TOY_MERGES)
    assert segment_word("Hunde", ranks) == ["Hu", "n", "d", "e", END_OF_WORD]
    assert segment_word("Zug", ranks) == ["Z", "u", "g", END_OF_WORD]
    assert segment_word("Rund", ranks) == ["R", "und" + END_OF_WORD]
    assert segment_word("Hund", {}) == ["H", "u", "n", "d", END_OF_WORD]  # no merges at all
    assert all("<unk>" not in segment_word(w, ranks) for w in ["Zug", "🐕", "Łódź"])


def test_merge_pair_joins_left_to_right_without_overlap():
    assert merge_pair(["a", "a", "a"], ("a", "a")) == ["aa", "a"]
    assert merge_pair(["a", "a", "a", "a"], ("a", "a")) == ["aa", "aa"]
    assert merge_pair(["x", "a", "b", "a", "b"], ("a", "b")) == ["x", "ab", "ab"]
    assert merge_pair(["a", "b"], ("b", "a")) == ["a", "b"]


@pytest.mark.parametrize(
    ("word_counts", "num_merges", "error", "message"),
    [
        (TOY, -1, ValueError, "num_merges"),
        (TOY, 2.5, ValueError, "num_merges"),
        (TOY, True, ValueError, "num_merges"),
        ({}, 10, ValueError, "empty"),
        (Counter(), 10, ValueError, "empty"),
        ("Hund Hut", 10, TypeError, "word_counts"),
        ([("Hund", 4)], 10, TypeError, "word_counts"),
        ({"Hund": 0}, 10, ValueError, "positive"),
        ({"Hund": 1.5}, 10, ValueError, "positive"),
        ({"": 3}, 10, ValueError, "non-empty"),
        ({"Hund" + END_OF_WORD: 3}, 10, ValueError, "end-of-word"),
    ],
)
def test_learn_bpe_rejects_bad_inputs_with_clear_errors(word_counts, num_merges, error, message):
    with pytest.raises(error, match=message):
        learn_bpe(word_counts, num_merges)


def test_segment_word_rejects_an_empty_word():
    with pytest.raises(ValueError, match="non-empty"):
        segment_word("", ranks_of(TOY_MERGES))


CORPUS = [
    "Ein Mädchen läuft über die Straße.",
    "Zwei Männer spielen Fußball auf einer Wiese!",
    "Der Hund (braun) schläft neben der Tür; die Katze nicht.",
    "Eine Frau trägt ein T-Shirt mit der Aufschrift „Grüß Gott“.",
    "A girl runs across the street.",
    "Two men play soccer on a meadow!",
    "The brown dog sleeps next to the door; the cat doesn't.",
    'A woman wears a T-shirt that says "Hello, world" - in capitals.',
    "Öffentliche Äußerungen über Ärger: 3 Jungen, 12 Äpfel, 100% Spaß?",
]


@pytest.fixture(scope="module")
def sp():
    pytest.importorskip("sentencepiece")
    return train_sentencepiece(CORPUS * 4, vocab_size=400)


@pytest.mark.parametrize(
    "text",
    [
        *CORPUS,
        "Größere Übungen über Ölfässer, Äxte und Spaß...",
        "She said: 'Don't!' (twice) — and left; ok?",
        "  zwei  Leerzeichen, Tab\tund Ende ",
        "Ein Café in Łódź 🐕",  # characters never seen in training
        "",
    ],
)
def test_sentencepiece_decodes_every_encoded_text_back_exactly(sp, text):
    ids = sp.encode(text)
    assert sp.decode(ids) == text
    assert SPECIALS.index("<unk>") not in ids  # unseen characters become bytes, not <unk>


def test_sentencepiece_reads_its_own_space_symbol_in_the_input_as_a_space(sp):
    """The one documented exception to lossless decoding: U+2581 is sentencepiece's space."""
    assert sp.decode(sp.encode("a\u2581b")) == "a b"


def test_sentencepiece_uses_the_books_special_ids(sp):
    assert [sp.id_to_piece(i) for i in range(len(SPECIALS))] == list(SPECIALS)
    assert (sp.bos_id(), sp.eos_id(), sp.pad_id(), sp.unk_id()) == (0, 1, 2, 3)
    assert len(sp) == 400


def test_sentencepiece_unigram_model_round_trips_too():
    pytest.importorskip("sentencepiece")
    model = train_sentencepiece(CORPUS * 4, vocab_size=330, model_type="unigram")
    for text in [*CORPUS, "Ein Café in Łódź 🐕"]:
        assert model.decode(model.encode(text)) == text


def test_sentencepiece_without_byte_fallback_maps_unseen_characters_to_unk():
    pytest.importorskip("sentencepiece")
    model = train_sentencepiece(CORPUS * 4, vocab_size=100, byte_fallback=False)
    assert SPECIALS.index("<unk>") in model.encode("Łódź")
    assert model.decode(model.encode(CORPUS[0])) == CORPUS[0]


def test_sentencepiece_writes_no_files(tmp_path, monkeypatch):
    pytest.importorskip("sentencepiece")
    monkeypatch.chdir(tmp_path)
    train_sentencepiece(CORPUS, vocab_size=100, byte_fallback=False)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("sentences", "options", "error", "message"),
    [
        ("Ein Satz.", {}, TypeError, "one str"),
        ([], {}, ValueError, "no non-empty sentence"),
        (["", ""], {}, ValueError, "no non-empty sentence"),
        (["Ein Satz.", 3], {}, TypeError, "only strings"),
        (CORPUS, {"vocab_size": 4}, ValueError, "vocab_size"),
        (CORPUS, {"vocab_size": 2.5}, ValueError, "vocab_size"),
        (CORPUS, {"model_type": "wordpiece"}, ValueError, "model_type"),
        (CORPUS, {"vocab_size": 5000}, ValueError, "could not train vocab_size=5000"),
    ],
)
def test_train_sentencepiece_rejects_bad_inputs_with_clear_errors(
    sentences, options, error, message
):
    pytest.importorskip("sentencepiece")
    with pytest.raises(error, match=message):
        train_sentencepiece(sentences, **options)
