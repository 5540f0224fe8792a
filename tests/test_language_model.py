"""Chapter 25: rotary positions, the decoder-only language model, its recipe and sampling."""

import math

import pytest
import torch

from the_annotated_transformer import (
    EOS_ID,
    MultiHeadedAttention,
    RotaryMultiHeadedAttention,
    cosine_rate,
    count_parameters,
    keep_top_p,
    lm_batches,
    lm_nll,
    lm_step,
    make_language_model,
    perplexity,
    rotary,
    sample,
    train_language_model,
)


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
def test_language_model_is_causal(positions):
    torch.manual_seed(0)
    model = make_language_model(30, N=2, d_model=16, d_ff=32, h=2, positions=positions).eval()
    x = torch.randint(4, 30, (2, 10))
    for t in range(10):
        changed = x.clone()
        changed[:, t] = 4 + (x[:, t] - 3) % 26  # another token at position t
        with torch.no_grad():
            before, after = model(x), model(changed)
        torch.testing.assert_close(after[:, :t], before[:, :t], rtol=0, atol=0)
        assert not torch.allclose(after[:, t], before[:, t])


def test_rotary_scores_depend_only_on_the_offset():
    torch.manual_seed(0)
    q, k = torch.randn(5, 32, dtype=torch.float64), torch.randn(5, 32, dtype=torch.float64)

    def scores(m: int, n: int) -> torch.Tensor:
        rq = rotary(q[:, None], torch.tensor([m]))[:, 0]  # (5, 32)
        rk = rotary(k[:, None], torch.tensor([n]))[:, 0]
        return (rq * rk).sum(-1)  # (5,)

    for m, n in [(0, 3), (7, 2), (5, 5)]:
        for shift in (1, 10, 100):  # the angles are float32, as in the model
            torch.testing.assert_close(scores(m + shift, n + shift), scores(m, n),
                                       atol=1e-5, rtol=1e-5)
    assert not torch.allclose(scores(0, 3), scores(0, 4))


def test_rotary_keeps_lengths_and_leaves_position_zero_alone():
    x = torch.randn(2, 3, 6, 8)  # (batch, h, n, d_k)
    rotated = rotary(x, torch.arange(6))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(rotated[..., 0, :], x[..., 0, :])
    with pytest.raises(ValueError, match="even feature size"):
        rotary(torch.randn(4, 5), torch.arange(4))


def test_rotary_attention_has_the_weights_of_multi_headed_attention():
    plain, rotated = MultiHeadedAttention(4, 32), RotaryMultiHeadedAttention(4, 32)
    rotated.load_state_dict(plain.state_dict())  # same names and shapes
    plain.eval(), rotated.eval()
    x = torch.randn(1, 1, 32)  # one position: rotation by angle 0 changes nothing
    torch.testing.assert_close(rotated(x, x, x), plain(x, x, x))


def test_lm_batches_hold_every_sentence_once_between_start_and_end():
    sentences = [[5] * n for n in (3, 1, 4, 1, 5, 9, 2, 6)]
    batches = lm_batches(sentences, batch_size=3, generator=torch.Generator().manual_seed(0))
    rows = [row[row != 2].tolist() for batch in batches for row in batch]
    assert sorted(len(r) - 2 for r in rows) == sorted(len(s) for s in sentences)
    assert all(r[0] == 0 and r[-1] == EOS_ID for r in rows)
    with pytest.raises(ValueError, match="batch_size"):
        lm_batches(sentences, batch_size=0)


def test_a_uniform_model_has_the_vocabulary_size_as_perplexity():
    model = make_language_model(40, N=1, d_model=16, d_ff=32, h=2)
    torch.nn.init.zeros_(model.generator.proj.weight)
    torch.nn.init.zeros_(model.generator.proj.bias)
    batches = lm_batches([[7, 8, 9], [10, 11]], batch_size=2)
    assert perplexity(model, batches) == pytest.approx(40)
    nll, tokens = lm_nll(model, batches[0])
    assert tokens == 3 + 1 + 2 + 1  # every word and each </s>, no padding
    assert nll.item() == pytest.approx(tokens * math.log(40), rel=1e-5)


def test_sampling_with_top_k_one_is_greedy_and_checks_its_arguments():
    torch.manual_seed(0)
    model = make_language_model(20, N=1, d_model=16, d_ff=32, h=2).eval()
    ids = sample(model, [0, 5], max_len=8, top_k=1, generator=torch.Generator().manual_seed(3))
    greedy = [0, 5]
    with torch.no_grad():
        while len(greedy) < 8 and greedy[-1] != EOS_ID:
            greedy.append(int(model(torch.tensor([greedy]))[0, -1].argmax()))
    assert ids == greedy
    with pytest.raises(ValueError, match="temperature"):
        sample(model, [0], temperature=0)
    with pytest.raises(ValueError, match="top_k"):
        sample(model, [0], top_k=0)


def test_tied_embeddings_share_one_matrix_and_untied_ones_do_not():
    tied = make_language_model(50, N=1, d_model=16, d_ff=32, h=2)
    untied = make_language_model(50, N=1, d_model=16, d_ff=32, h=2, tie_embeddings=False)
    assert tied.generator.proj.weight is tied.embed[0].lut.weight
    assert untied.generator.proj.weight is not untied.embed[0].lut.weight
    assert count_parameters(untied) - count_parameters(tied) == 50 * 16


def test_cosine_rate_rises_to_the_peak_then_falls_to_the_floor():
    rates = [cosine_rate(step, warmup=10, total=110) for step in range(120)]
    assert rates[0] == pytest.approx(0.1) and rates[9] == pytest.approx(1.0)
    assert all(a < b for a, b in zip(rates[:10], rates[1:10], strict=False))  # linear rise
    assert all(a >= b for a, b in zip(rates[10:], rates[11:], strict=False))  # then falling
    assert rates[60] == pytest.approx(0.55)  # halfway down: floor + (1 - floor) / 2
    assert rates[110] == pytest.approx(0.1) and rates[119] == pytest.approx(0.1)


@pytest.mark.parametrize("positions", ["sinusoidal", "rotary"])
def test_cached_steps_give_the_log_probabilities_of_the_full_pass(positions):
    torch.manual_seed(0)
    model = make_language_model(30, N=2, d_model=16, d_ff=32, h=2, positions=positions).eval()
    x = torch.randint(4, 30, (3, 9))
    cache = []
    with torch.no_grad():
        full = model(x)  # (3, 9, 30)
        steps = torch.stack([lm_step(model, cache, x[:, t], t) for t in range(9)], dim=1)
    torch.testing.assert_close(steps, full, atol=1e-5, rtol=1e-5)
    assert len(cache) == 2 and cache[0][0].shape == (3, 2, 9, 8)  # (rows, h, n, d_k)


def test_the_nucleus_is_the_fewest_likeliest_tokens_reaching_top_p():
    logits = torch.tensor([0.0, 3.0, 1.0, 2.0])  # probabilities 0.03, 0.64, 0.09, 0.24
    kept = lambda p: (keep_top_p(logits, p) > -math.inf).nonzero().flatten().tolist()  # noqa: E731
    assert kept(0.5) == [1]
    assert kept(0.8) == [1, 3]
    assert kept(0.95) == [1, 2, 3]
    assert kept(1.0) == [0, 1, 2, 3]
    assert torch.equal(keep_top_p(logits, 0.8)[[1, 3]], logits[[1, 3]])  # kept ones unchanged


def test_sampling_with_a_tiny_top_p_is_greedy_and_top_p_is_checked():
    torch.manual_seed(0)
    model = make_language_model(20, N=1, d_model=16, d_ff=32, h=2, positions="rotary").eval()
    generator = torch.Generator().manual_seed(5)
    assert sample(model, [0, 5, 6], max_len=9, top_p=1e-6, generator=generator) == sample(
        model, [0, 5, 6], max_len=9, top_k=1, generator=generator)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match="top_p"):
            sample(model, [0], top_p=bad)
    with pytest.raises(ValueError, match="prompt"):
        sample(model, [])


def test_the_recipe_lowers_the_training_loss():
    torch.manual_seed(0)
    model = make_language_model(20, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    batches = lm_batches([[5, 6, 7, 8], [9, 10, 11], [5, 6, 12]] * 4, batch_size=4)
    losses = train_language_model(model, batches, epochs=6, lr=1e-2, warmup=3)
    assert losses[-1] < 0.5 * losses[0], losses
