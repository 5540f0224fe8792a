"""Chapter 25: rotary positions, the decoder-only language model, its batches and sampling."""

import math

import pytest
import torch

from the_annotated_transformer import (
    EOS_ID,
    MultiHeadedAttention,
    RotaryMultiHeadedAttention,
    lm_batches,
    lm_nll,
    make_language_model,
    perplexity,
    rotary,
    sample,
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
