"""Chapter 20: the treebank reader, linearization, repair, the file split and bracket F1."""

import zipfile
from pathlib import Path

import pytest
import torch

from the_annotated_transformer import (
    PTB_SAMPLE_SHA256,
    Tree,
    Vocab,
    allowed_next,
    bracket_score,
    clean_tree,
    delinearize,
    labeled_spans,
    linearize,
    load_ptb_sample,
    make_model,
    parse_constrained,
    ptb_sample_dir,
    ptb_sample_file,
    read_trees,
    split_by_file,
    tree_tags,
    tree_words,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "ptb-sample"
needs_sample = pytest.mark.skipif(
    not (SHARED / "treebank.zip").is_file(),
    reason=f"no copy of NLTK's Penn Treebank sample at {SHARED} (its license forbids shipping it)",
)

GOLD = "(S (NP (DT the) (NN cat)) (VP (VBD sat) (PP (IN on) (NP (DT the) (NN mat)))) (. .))"


def tree(text: str) -> Tree:
    (only,) = read_trees(text)
    return only


@pytest.fixture(scope="module")
def sample() -> dict[str, list[Tree]]:
    return {name: [clean_tree(t) for t in trees]
            for name, trees in load_ptb_sample(SHARED).items()}


@needs_sample
def test_every_tree_of_the_sample_survives_linearize_then_delinearize(sample):
    trees = [t for file_trees in sample.values() for t in file_trees]
    assert len(trees) == 3914
    for t in trees:
        back = delinearize(linearize(t), tree_words(t))
        assert back.well_formed, linearize(t)
        assert back.tree == t


@needs_sample
def test_split_by_file_puts_each_sentence_in_one_split_only(sample):
    splits = split_by_file(sample)
    assert list(splits) == ["train", "dev", "test"]
    sentences = [{tuple(tree_words(t)) for t in trees} for trees in splits.values()]
    assert all(sentences)
    assert not sentences[0] & sentences[1] and not sentences[0] & sentences[2]
    assert not sentences[1] & sentences[2]
    kept = sum(len(trees) for trees in splits.values())
    assert 3900 < kept <= 3914  # only repeated sentences are dropped


def test_reader_keeps_words_tags_and_labels_and_marks_the_outer_bracket_top():
    (raw,) = read_trees("( (S (NP-SBJ (NNP Vinken)) (VP (VBZ is) (NP (-NONE- *T*-1))) (. .)) )")
    assert raw.label == "TOP"
    cleaned = clean_tree(raw)
    assert cleaned == tree("(S (NP (NNP Vinken)) (VP (VBZ is)) (. .))")
    assert tree_words(cleaned) == ["Vinken", "is", "."]
    assert tree_tags(cleaned) == ["NNP", "VBZ", "."]


@pytest.mark.parametrize("text, problem", [
    ("(S (NP (DT the))", "still open"), ("(S (DT the)))", "never opened"), ("word", "outside"),
])
def test_reader_rejects_unbalanced_text_with_a_clear_error(text, problem):
    with pytest.raises(ValueError, match=problem):
        read_trees(text)


def test_delinearize_repairs_unbalanced_brackets_and_says_so():
    words = ["the", "cat", "sat"]
    missing_close = delinearize(["(S", "(NP", "DT", "NN", ")", "(VP", "VBD"], words)
    assert missing_close == (tree("(S (NP (DT the) (NN cat)) (VP (VBD sat)))"), False)
    stray_close = delinearize(["(S", "(NP", "DT", "NN", ")", ")", ")", "VBD"], words)
    assert not stray_close.well_formed
    assert tree_words(stray_close.tree) == words  # every word placed exactly once
    too_many = delinearize(["(S", "DT", "NN", "VBD", "NN", ")"], words)
    assert too_many == (tree("(S (DT the) (NN cat) (VBD sat))"), False)
    two_roots = delinearize(["(NP", "DT", "NN", ")", "(VP", "VBD", ")"], words)
    assert two_roots == (tree("(S (NP (DT the) (NN cat)) (VP (VBD sat)))"), False)
    empty = delinearize(["(S", "(NP", ")", "DT", "NN", "VBD", ")"], words)
    assert empty == (tree("(S (DT the) (NN cat) (VBD sat))"), False)
    assert delinearize(["(S", "DT", "NN", "VBD", ")"], words).well_formed


def test_identical_trees_score_one():
    gold = tree(GOLD)
    score = bracket_score([gold], [gold])
    assert (score.matched, score.gold, score.predicted) == (5, 5, 5)
    assert score.precision == score.recall == score.f1 == 1.0


def test_one_missing_bracket_gives_the_hand_computed_precision_and_recall():
    no_pp = tree("(S (NP (DT the) (NN cat)) (VP (VBD sat) (IN on) (NP (DT the) (NN mat))) (. .))")
    score = bracket_score([tree(GOLD)], [no_pp])
    assert score.precision == 4 / 4 and score.recall == 4 / 5
    assert score.f1 == pytest.approx(2 * 1 * 0.8 / 1.8)


def test_one_wrong_span_lowers_precision_and_recall_alike():
    pp_on_s = tree("(S (NP (DT the) (NN cat)) (VP (VBD sat)) (PP (IN on) (NP (DT the) (NN mat)))"
                   " (. .))")
    score = bracket_score([tree(GOLD)], [pp_on_s])
    assert score.precision == score.recall == 4 / 5


def test_punctuation_takes_no_place_and_prt_counts_as_advp():
    gold = tree("(S (NP (NNP Kim)) (VP (VBD gave) (PRT (RP up))) (. .))")
    assert labeled_spans(gold, tree_tags(gold)) == {("S", 0, 3): 1, ("NP", 0, 1): 1,
                                                   ("VP", 1, 3): 1, ("ADVP", 2, 3): 1}
    with_period = tree("(S (NP (NNP Kim)) (VP (VBD gave) (ADVP (RB up)) (. .)))")
    assert bracket_score([gold], [with_period]).f1 == 1.0  # the VP may swallow the period


def test_bracket_score_rejects_trees_over_different_words():
    with pytest.raises(ValueError, match="different words"):
        bracket_score([tree(GOLD)], [tree("(S (NN dog))")])
    with pytest.raises(ValueError, match="1 gold trees but 0"):
        bracket_score([tree(GOLD)], [])


def test_loader_names_a_corrupted_copy(tmp_path):
    with zipfile.ZipFile(tmp_path / "treebank.zip", "w") as archive:
        archive.writestr("treebank/combined/wsj_0001.mrg", "( (S (NN x)) )")
    with pytest.raises(ValueError, match="truncated or corrupted"):
        ptb_sample_file(tmp_path)
    assert PTB_SAMPLE_SHA256 in str(pytest.raises(ValueError, ptb_sample_file, tmp_path).value)


def test_data_folder_comes_from_the_argument_then_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PTB_SAMPLE_DIR", str(tmp_path / "env"))
    assert ptb_sample_dir(tmp_path / "arg") == tmp_path / "arg"
    assert ptb_sample_dir() == tmp_path / "env"


@pytest.mark.parametrize("prefix, steps_left, expected", [
    ([], 9, (True, False, False, False)),  # only a root may start
    (["(S"], 9, (True, False, True, False)),  # an empty bracket may not close
    (["(S"], 3, (False, False, True, False)),  # two leaves and a ")" must still fit
    (["(S", "NN"], 9, (True, False, True, False)),  # the root closes only after every word
    (["(S", "(NP", "NN"], 9, (True, True, True, False)),
    (["(S", "(NP", "(NP", "(NP", "NN"], 20, (False, True, True, False)),  # 2 brackets a word
    (["(S", "NN", "VBZ"], 9, (False, True, False, False)),  # no words left to fill a bracket
    (["(S", "NN", "VBZ", ")"], 9, (False, False, False, True)),  # one root, then the end
])
def test_allowed_next_keeps_exactly_the_tokens_that_can_still_make_a_tree(prefix, steps_left,
                                                                         expected):
    assert allowed_next(prefix, 2, steps_left) == expected


def test_constrained_parses_of_an_untrained_model_are_trees_over_the_sentences_words():
    trees = [tree(GOLD), tree("(S (NP (NNS dogs)) (VP (VBP bark)))"),
             tree("(S (NP (PRP it)) (VP (VBZ rains)) (. .))")]
    src_vocab = Vocab.build([tree_tags(t) for t in trees], min_freq=1)
    tgt_vocab = Vocab.build([linearize(t) for t in trees], min_freq=1)
    torch.manual_seed(0)
    model = make_model(len(src_vocab), len(tgt_vocab), N=1, d_model=16, d_ff=32, h=2)
    parsed = parse_constrained(model, trees, src_vocab, tgt_vocab, batch_size=2, extra_len=20)
    assert all(p.well_formed for p in parsed)
    assert [tree_words(p.tree) for p in parsed] == [tree_words(t) for t in trees]
    bracket_score(trees, [p.tree for p in parsed])  # scorable: same words, one tree each
