"""Beam search (chapter 15): agreement with greedy and exhaustive search, batching, scores."""

import itertools
import math

import pytest
import torch

from the_annotated_transformer import (
    TableModel,
    beam_search,
    beam_translate,
    greedy_decode,
    length_penalty,
    load_tokenizers,
    load_trained_model,
    make_model,
    subsequent_mask,
    translate,
)

BOS, EOS, PAD = 0, 1, 2


def tiny_model(V: int = 11, *, seed: int = 0, eos_bias: float = 2.0) -> torch.nn.Module:
    """A small random model whose outputs end at varied lengths (</s> made more likely)."""
    torch.manual_seed(seed)
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=0.0).eval()
    with torch.no_grad():
        model.generator.proj.bias[EOS] += eos_bias
    return model


def padded_batch(V: int = 11, *, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources of different lengths padded with PAD, and their mask (batch, 1, n_src)."""
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, V, (8, 7), generator=g)  # (batch, n_src)
    for row, length in enumerate([7, 6, 5, 4, 3, 7, 2, 5]):
        src[row, length:] = PAD
    return src, (src != PAD).unsqueeze(-2)


def output_log_prob(model, src: torch.Tensor, src_mask: torch.Tensor, ids: list[int]) -> float:
    """log P of ids (after <s>) given one source, by one teacher-forced pass."""
    tgt = torch.tensor([[BOS, *ids]])  # (1, 1 + n)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        out = model.decode(memory, src_mask, tgt[:, :-1], subsequent_mask(len(ids)))
        log_probs = model.generator(out)  # (1, n, V)
    return log_probs.gather(-1, tgt[:, 1:].unsqueeze(-1)).sum().item()


def generated(row: torch.Tensor) -> list[int]:
    """The generated ids of one output row: after <s>, up to and including the first </s>."""
    ids = row[1:].tolist()
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def until_end(row: torch.Tensor) -> list[int]:
    """The words of one output row: after <s> and before the first </s> (or the padding)."""
    ids = row[1:].tolist()
    return ids[: ids.index(EOS)] if EOS in ids else ids


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_beam_size_one_gives_exactly_greedy_decodes_output(alpha):
    model = tiny_model()
    src, src_mask = padded_batch()
    expected = greedy_decode(model, src, src_mask, 10, BOS, end_symbol=EOS)
    ids, _ = beam_search(model, src, src_mask, max_len=10, start_symbol=BOS, end_symbol=EOS,
                         beam_size=1, alpha=alpha)
    assert torch.equal(ids, expected)
    lengths = {len(generated(row)) for row in ids}
    assert len(lengths) > 2, "the test model should end its outputs at different lengths"


@pytest.mark.parametrize("alpha", [0.0, 0.6])
def test_a_beam_holding_every_hypothesis_finds_the_best_output_of_exhaustive_enumeration(alpha):
    V, max_len = 4, 4  # every output of up to 3 tokens over 4 ids
    model = tiny_model(V, seed=3, eos_bias=0.5)
    src = torch.tensor([[3, 3, 3]])
    src_mask = torch.ones(1, 1, 3, dtype=torch.bool)
    best_score, best_ids = -math.inf, None
    for n in range(1, max_len):
        for ids in itertools.product(range(V), repeat=n):
            ends = ids[-1] == EOS
            if EOS in ids[:-1] or (not ends and n < max_len - 1):
                continue  # not an output: </s> inside, or stopped short of max_len without </s>
            score = output_log_prob(model, src, src_mask, list(ids)) / length_penalty(
                n, alpha=alpha)
            if score > best_score:
                best_score, best_ids = score, list(ids)
    # wide enough that nothing is ever pruned: every candidate of every step fits in the beam
    ids, score = beam_search(model, src, src_mask, max_len=max_len, start_symbol=BOS,
                             end_symbol=EOS, beam_size=V**3 + V**2, alpha=alpha)
    assert generated(ids[0]) == best_ids
    assert score.item() == pytest.approx(best_score, abs=1e-5)


def test_a_beam_as_wide_as_the_vocabulary_agrees_with_exhaustive_search_on_two_tokens():
    V = 5
    model = tiny_model(V, seed=4, eos_bias=0.0)
    src = torch.tensor([[3, 4, 3, 4]])
    src_mask = torch.ones(1, 1, 4, dtype=torch.bool)
    outputs = [[EOS]] + [[a, EOS] for a in range(V) if a != EOS]
    outputs += [[a, b] for a in range(V) for b in range(V) if a != EOS and b != EOS]
    scores = [output_log_prob(model, src, src_mask, ids) for ids in outputs]
    best = outputs[max(range(len(outputs)), key=scores.__getitem__)]
    ids, score = beam_search(model, src, src_mask, max_len=3, start_symbol=BOS, end_symbol=EOS,
                             beam_size=V, alpha=0.0)
    assert generated(ids[0]) == best
    assert score.item() == pytest.approx(max(scores), abs=1e-5)


def test_beam_search_finds_the_more_probable_output_that_greedy_decoding_misses():
    # ids: 0 <s>, 1 </s>, 2 "A", 3 "The", 4 "dog", 5 "puppy"
    table = {
        (): [0.0, 0.1, 0.5, 0.4, 0.0, 0.0],
        (2,): [0.0, 0.1, 0.0, 0.0, 0.35, 0.55],  # after "A" the mass is split
        (2, 5): [0.0, 0.7, 0.0, 0.0, 0.3, 0.0],
        (3,): [0.0, 0.1, 0.0, 0.0, 0.8, 0.1],  # after "The" it is not
    }
    model = TableModel(table, vocab=6, end_symbol=EOS)
    src, src_mask = torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 1, 3, dtype=torch.bool)
    greedy = greedy_decode(model, src, src_mask, 6, BOS, end_symbol=EOS)
    assert generated(greedy[0]) == [2, 5, EOS]  # "A puppy": 0.5 * 0.55 * 0.7 = 0.1925
    ids, score = beam_search(model, src, src_mask, max_len=6, start_symbol=BOS, end_symbol=EOS,
                             beam_size=2, alpha=0.0)
    assert generated(ids[0]) == [3, 4, EOS]  # "The dog": 0.4 * 0.8 = 0.32
    assert score.item() == pytest.approx(math.log(0.32))


def test_batched_results_equal_one_sentence_at_a_time():
    model = tiny_model(seed=5)
    src, src_mask = padded_batch(seed=6)
    limits = torch.tensor([9, 5, 12, 7, 3, 10, 6, 8])  # one max_len per sentence
    ids, scores = beam_search(model, src, src_mask, max_len=limits, start_symbol=BOS,
                              end_symbol=EOS, beam_size=3, alpha=0.6)
    for row in range(src.size(0)):
        n = int(src_mask[row].sum())  # its own length: no padding at all
        one_ids, one_score = beam_search(
            model, src[row : row + 1, :n], src_mask[row : row + 1, :, :n],
            max_len=int(limits[row]), start_symbol=BOS, end_symbol=EOS, beam_size=3, alpha=0.6)
        assert until_end(ids[row]) == until_end(one_ids[0])
        assert scores[row].item() == pytest.approx(one_score.item(), abs=1e-5)
        assert len(until_end(ids[row])) <= int(limits[row]) - 1


def test_finished_hypotheses_are_not_extended_and_outputs_are_padded_with_the_end_symbol():
    table = {
        (): [0.0, 0.2, 0.5, 0.3],  # "</s>" finishes at once, but "2" and "3" may do better
        (2,): [0.0, 0.6, 0.2, 0.2],
        (3,): [0.0, 0.1, 0.5, 0.4],
    }
    model = TableModel(table, vocab=4, end_symbol=EOS)
    decoded = []
    decode = model.decode

    def recording_decode(memory, src_mask, tgt, tgt_mask):
        decoded.extend(tuple(row) for row in tgt.tolist())
        return decode(memory, src_mask, tgt, tgt_mask)

    model.decode = recording_decode
    src = torch.zeros(2, 3, dtype=torch.long)
    src_mask = torch.ones(2, 1, 3, dtype=torch.bool)
    ids, scores = beam_search(model, src, src_mask, max_len=6, start_symbol=BOS,
                              end_symbol=EOS, beam_size=3, alpha=0.0)
    # step 1 finishes "</s>" (0.2) and keeps "2" (0.5) and "3" (0.3); step 2 extends only those
    assert sorted(set(decoded)) == [(BOS,), (BOS, 2), (BOS, 3)]
    assert generated(ids[0]) == [2, EOS] and scores[0].item() == pytest.approx(math.log(0.3))
    # a shorter output in the batch is padded with </s>
    ids, _ = beam_search(model, src, src_mask, max_len=torch.tensor([6, 1]), start_symbol=BOS,
                         end_symbol=EOS, beam_size=3, alpha=0.0)
    assert ids.tolist() == [[BOS, 2, EOS], [BOS, EOS, EOS]]


@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
def test_scores_equal_the_recomputed_length_penalised_log_probabilities(alpha):
    model = tiny_model(seed=7)
    src, src_mask = padded_batch(seed=8)
    ids, scores = beam_search(model, src, src_mask, max_len=8, start_symbol=BOS,
                              end_symbol=EOS, beam_size=4, alpha=alpha)
    for row in range(src.size(0)):
        out = generated(ids[row])  # |Y| counts </s>; an output cut at max_len has none
        log_p = output_log_prob(model, src[row : row + 1], src_mask[row : row + 1], out)
        expected = log_p / ((5 + len(out)) / 6) ** alpha
        assert scores[row].item() == pytest.approx(expected, abs=1e-5)


def test_length_penalty_is_one_for_one_token_and_grows_with_length_for_positive_alpha():
    assert length_penalty(1, alpha=0.6) == pytest.approx(1.0)
    assert length_penalty(13, alpha=0.6) == pytest.approx(3.0**0.6)
    assert length_penalty(40, alpha=0.0) == 1.0
    lengths = torch.arange(1, 20)
    assert torch.all(length_penalty(lengths, alpha=0.6).diff() > 0)


def test_max_len_one_gives_the_empty_output_and_an_output_without_end_is_cut_at_max_len():
    model = tiny_model(eos_bias=-20.0)  # </s> never wins: outputs run to max_len
    src, src_mask = padded_batch()
    ids, scores = beam_search(model, src, src_mask, max_len=torch.tensor([1, 4, 6, 1, 2, 3, 5, 6]),
                              start_symbol=BOS, end_symbol=EOS, beam_size=2)
    assert ids.shape == (8, 6)
    assert [len(until_end(row)) for row in ids] == [0, 3, 5, 0, 1, 2, 4, 5]
    assert scores[0].item() == 0.0 and scores[3].item() == 0.0


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        ({"beam_size": 0}, ValueError, "beam_size must be at least 1"),
        ({"beam_size": 2.0}, TypeError, "beam_size must be an int"),
        ({"alpha": -0.5}, ValueError, "alpha must be a number >= 0"),
        ({"src": torch.zeros(5, dtype=torch.long)}, ValueError, r"src must be .*\(batch, n_src\)"),
        ({"src_mask": torch.ones(2, 5, dtype=torch.bool)}, ValueError,
         r"src_mask must have shape \(batch, 1, n_src\) = \(2, 1, 5\)"),
        ({"src_mask": torch.ones(3, 1, 5, dtype=torch.bool)}, ValueError, "src_mask must have"),
        ({"max_len": 0}, ValueError, "max_len must be at least 1"),
        ({"max_len": 7.5}, TypeError, "max_len must be an int"),
        ({"max_len": torch.tensor([5, 6, 7])}, ValueError, r"one per sentence, shape \(2,\)"),
    ],
)
def test_bad_arguments_raise_errors_that_name_them(change, error, message):
    model = tiny_model()
    arguments = {
        "src": torch.full((2, 5), 3), "src_mask": torch.ones(2, 1, 5, dtype=torch.bool),
        "max_len": 6, "start_symbol": BOS, "end_symbol": EOS, "beam_size": 2, "alpha": 0.6,
    } | change
    src, src_mask = arguments.pop("src"), arguments.pop("src_mask")
    with pytest.raises(error, match=message):
        beam_search(model, src, src_mask, **arguments)


def test_table_model_rejects_rows_that_are_not_probability_distributions():
    with pytest.raises(ValueError, match="must hold 3 probabilities that sum to 1"):
        TableModel({(): [0.5, 0.6, 0.0]}, vocab=3, end_symbol=EOS)
    with pytest.raises(ValueError, match="must hold 3 probabilities"):
        TableModel({(): [0.5, 0.5]}, vocab=3, end_symbol=EOS)


def test_beam_translate_with_beam_size_one_matches_translate_on_the_shipped_model():
    model, vocab_src, vocab_tgt, _ = load_trained_model()
    tokenizer = load_tokenizers()[0]
    sentences = ["Ein Hund rennt durch den Schnee.", "", "Zwei Männer spielen Fußball.",
                 "Eine Frau liest ein Buch im Park."]
    greedy = translate(model, sentences, vocab_src, vocab_tgt, tokenizer)
    beam1 = beam_translate(model, sentences, vocab_src, vocab_tgt, tokenizer, beam_size=1)
    beam4 = beam_translate(model, sentences, vocab_src, vocab_tgt, tokenizer)
    assert beam1 == greedy
    assert beam4[1] == "" and all(beam4[i] for i in (0, 2, 3))
    with pytest.raises(TypeError, match="wrap it in a list"):
        beam_translate(model, "Ein Hund.", vocab_src, vocab_tgt, tokenizer)


def test_the_beam_keeps_k_live_hypotheses_after_one_finishes_and_narrowing_does_not():
    # ids: 0 <s>, 1 </s>, 2 "A", 3 "B", 4 "x"; alpha=1 lets a longer output win
    table = {
        (): [0.0, 0.3, 0.45, 0.25, 0.0],  # the empty output takes a slot at the first step
        (2,): [0.0, 0.33, 0.0, 0.33, 0.34],
        (2, 4): [0.0, 1.0, 0.0, 0.0, 0.0],
        (2, 3): [0.0, 1.0, 0.0, 0.0, 0.0],
        (3,): [0.0, 1.0, 0.0, 0.0, 0.0],  # "B </s>": 0.25, scored log(0.25) / (7/6)
    }
    model = TableModel(table, vocab=5, end_symbol=EOS)
    src, src_mask = torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 1, 3, dtype=torch.bool)
    kwargs = {"max_len": 6, "start_symbol": BOS, "end_symbol": EOS, "beam_size": 2, "alpha": 1.0}
    ids, score = beam_search(model, src, src_mask, **kwargs)
    assert generated(ids[0]) == [3, EOS]  # "B" stayed in the beam beside "A"
    assert score.item() == pytest.approx(math.log(0.25) / length_penalty(2, alpha=1.0))
    narrow, narrow_score = beam_search(model, src, src_mask, narrowing=True, **kwargs)
    assert generated(narrow[0]) == [EOS]  # "B" lost its slot to the empty output
    assert narrow_score.item() == pytest.approx(math.log(0.3))
    assert score.item() > narrow_score.item()


@pytest.mark.parametrize("narrowing", [False, True])
def test_with_the_cache_both_beams_give_the_same_outputs_as_without(narrowing):
    model = tiny_model(seed=8)
    src, src_mask = padded_batch(seed=9)
    kwargs = {"max_len": 9, "start_symbol": BOS, "end_symbol": EOS, "beam_size": 3,
              "narrowing": narrowing}
    ids, score = beam_search(model, src, src_mask, **kwargs)
    cached, cached_score = beam_search(model, src, src_mask, use_cache=True, **kwargs)
    assert torch.equal(ids, cached)
    assert torch.allclose(score, cached_score, atol=1e-5)


def test_banned_ids_are_never_generated_by_greedy_or_beam_search_with_or_without_cache():
    model = tiny_model(seed=10, eos_bias=0.0)
    with torch.no_grad():  # make the banned ids the model's favourites
        model.generator.proj.bias[[BOS, PAD, 3]] += 6.0
    src, src_mask = padded_batch(seed=11)
    banned = [BOS, PAD, 3]
    plain = greedy_decode(model, src, src_mask, 8, BOS, end_symbol=EOS)
    assert any(i in banned for row in plain for i in row[1:].tolist()), "test needs favourites"
    outputs = [greedy_decode(model, src, src_mask, 8, BOS, end_symbol=EOS, banned=banned,
                             use_cache=cache) for cache in (False, True)]
    outputs += [beam_search(model, src, src_mask, max_len=8, start_symbol=BOS, end_symbol=EOS,
                            banned=banned, use_cache=cache)[0] for cache in (False, True)]
    for out in outputs:
        assert not any(i in banned for row in out for i in row[1:].tolist())
    assert torch.equal(outputs[0], outputs[1]) and torch.equal(outputs[2], outputs[3])
    with pytest.raises(ValueError, match="end symbol"):
        beam_search(model, src, src_mask, max_len=8, start_symbol=BOS, end_symbol=EOS,
                    banned=[EOS])


def test_translate_never_writes_unk_unless_asked_on_the_shipped_model():
    model, vocab_src, vocab_tgt, _ = load_trained_model()
    tokenizer = load_tokenizers()[0]
    with torch.no_grad():  # a model that would rather say <unk> than anything else
        model.generator.proj.bias[3] += 20.0
    sentence = ["Ein Hund rennt durch den Schnee."]
    for decode in (translate, beam_translate):
        assert "<unk>" in decode(model, sentence, vocab_src, vocab_tgt, tokenizer,
                                 allow_unk=True)[0]
        text = decode(model, sentence, vocab_src, vocab_tgt, tokenizer)[0]
        assert text and not any(s in text for s in ("<unk>", "<s>", "<blank>"))
