"""Chapter 18's measures of a translation system: the paired bootstrap, made-up words, names."""

import random

import pytest
from sacrebleu.metrics import BLEU

from the_annotated_transformer import (
    load_tokenizers,
    non_words,
    paired_bootstrap,
    plain_words,
    shared_names,
)

WORDS = "a dog cat man woman runs sits on the green red grass street to its owner near".split()
_rng = random.Random(0)
REFERENCES = [" ".join(_rng.choices(WORDS, k=_rng.randint(5, 12))) for _ in range(80)]
WORSE = [" ".join(word if _rng.random() < 0.6 else "x" for word in line.split())
         for line in REFERENCES]  # about 40% of the words lost


def test_bootstrap_scores_are_sacrebleus_and_a_clear_gain_is_real():
    result = paired_bootstrap(WORSE, REFERENCES, REFERENCES, samples=200)
    assert result["baseline"] == pytest.approx(BLEU().corpus_score(WORSE, [REFERENCES]).score)
    assert result["system"] == pytest.approx(100.0)
    assert result["difference"] == pytest.approx(result["system"] - result["baseline"])
    assert result["p_value"] < 0.01
    assert result["baseline_ci"] > 0


def test_bootstrap_finds_no_real_gap_between_two_equally_good_systems_and_repeats_itself():
    pairs = list(zip(WORSE, REFERENCES, strict=True))
    odd = [r if i % 2 else w for i, (w, r) in enumerate(pairs)]  # the good half differs
    even = [w if i % 2 else r for i, (w, r) in enumerate(pairs)]
    first = paired_bootstrap(odd, even, REFERENCES, samples=200)
    assert abs(first["difference"]) < 10 and first["p_value"] > 0.05
    assert paired_bootstrap(odd, even, REFERENCES, samples=200) == first


@pytest.mark.parametrize("baseline, system, references, samples, message", [
    (WORSE[:3], WORSE[:2], WORSE[:3], 10, "equally long"),
    ([], [], [], 10, "not empty"),
    (WORSE, WORSE, REFERENCES, 0, "samples must be at least 1"),
])
def test_bootstrap_refuses_mismatched_input_in_one_line(baseline, system, references, samples,
                                                       message):
    with pytest.raises(ValueError, match=message) as err:
        paired_bootstrap(baseline, system, references, samples=samples)
    assert "\n" not in str(err.value)


def test_non_words_are_the_letter_words_missing_from_the_training_text_ignoring_case():
    english = load_tokenizers()[1]
    known = {"a", "dog", "runs", "boston", "terrier"}
    outputs = ["A dog runs.", "A dgo runs 3 times!", "Boston Terrier, bouuifier."]
    assert non_words(outputs, known, english) == [[], ["dgo", "times"], ["bouuifier"]]


def test_plain_words_drop_the_punctuation_around_words_but_not_inside():
    assert plain_words('A "Boston" terrier, in New York. -- ok') == [
        "A", "Boston", "terrier", "in", "New", "York", "ok"]
    assert plain_words("E.S.E. „Gelati“") == ["E.S.E", "Gelati"]


def test_shared_names_are_capitalized_words_of_both_sides_after_the_first_word():
    source = "Ein Boston Terrier läuft in New York über Gras, Boston."
    reference = "A Boston terrier runs across grass in New York."
    assert shared_names(source, reference) == ["Boston", "New", "York"]  # each once
    assert shared_names("Ein Hund läuft.", "A dog runs.") == []  # "A" is the first word
    assert shared_names("Gras ist grün.", "The Gras is green, Gras.") == ["Gras"]
