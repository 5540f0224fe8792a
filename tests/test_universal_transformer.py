"""Chapter 26: adaptive computation time and the Universal Transformer."""

import pytest
import torch
from torch import nn

from the_annotated_transformer import (
    AdaptiveComputationTime,
    UniversalTransformer,
    greedy_decode,
    seq2seq_batch,
    subsequent_mask,
    token_accuracy,
)


def act_run(max_steps: int = 5, seed: int = 0, **options):
    torch.manual_seed(seed)
    act = AdaptiveComputationTime(8, max_steps=max_steps, **options)
    layer = nn.Sequential(nn.Linear(8, 8), nn.Tanh())  # position-wise: positions never mix
    x = torch.randn(3, 6, 8)
    real = torch.ones(3, 6, dtype=torch.bool)
    real[1, 4:] = False
    return act, layer, x, real


def test_no_position_takes_more_than_max_steps_and_padding_none():
    act, layer, x, real = act_run(max_steps=3, halting_bias=-5.0)  # p ~ 0.007: wants to go on
    _, record = act(x, layer, real)
    assert record["steps"][real].eq(3).all()  # stopped by the limit, not by the threshold
    assert record["steps"][~real].eq(0).all()


def test_halting_weights_sum_to_one_at_every_real_position():
    for bias in (-3.0, 0.0, 3.0):
        act, layer, x, real = act_run(halting_bias=bias)
        _, record = act(x, layer, real)
        sums = record["weights"].sum(-1)  # (batch, n)
        torch.testing.assert_close(sums[real], torch.ones(int(real.sum())))
        assert sums[~real].eq(0).all()


def fixed_halting(act: AdaptiveComputationTime, p: float) -> None:
    """Make every position's halting probability p at every step: zero weights, bias logit(p)."""
    with torch.no_grad():
        act.halt.weight.zero_()
        act.halt.bias.fill_(torch.logit(torch.tensor(p)).item())


# Halting by hand, eps = 0.01 (threshold 0.99), max_steps = 5:
#   p = 0.3:   sums 0.3, 0.6, 0.9, then 1.2 > 0.99: N = 4, remainder 1 - 0.9 = 0.1, cost 4.1
#   p = 0.6:   sums 0.6, then 1.2 > 0.99: N = 2, remainder 1 - 0.6 = 0.4, cost 2.4
#   p = 0.995: 0.995 > 0.99 at once: N = 1, remainder 1, cost 2.0
# With max_steps = 3, p = 0.3 is stopped by the limit: N = 3, remainder 1 - 0.6 = 0.4, cost 3.4.
@pytest.mark.parametrize("p, max_steps, steps, weights, cost", [
    (0.3, 5, 4, [0.3, 0.3, 0.3, 0.1, 0.0], 4.1),
    (0.6, 5, 2, [0.6, 0.4, 0.0, 0.0, 0.0], 2.4),
    (0.995, 5, 1, [1.0, 0.0, 0.0, 0.0, 0.0], 2.0),
    (0.3, 3, 3, [0.3, 0.3, 0.4], 3.4),
])
def test_ponder_cost_is_steps_plus_remainder_averaged_over_real_positions(
        p, max_steps, steps, weights, cost):
    act, layer, x, real = act_run(max_steps=max_steps)
    fixed_halting(act, p)
    _, record = act(x, layer, real)
    assert record["steps"][real].eq(steps).all() and record["steps"][~real].eq(0).all()
    torch.testing.assert_close(record["weights"][real],
                               torch.tensor(weights).expand(int(real.sum()), -1))
    # padding (two of the 18 positions) adds nothing and is not counted in the mean
    torch.testing.assert_close(record["ponder"], torch.tensor(cost))


def test_ponder_cost_gradient_reaches_the_halting_unit():
    act, layer, x, real = act_run(halting_bias=0.0)
    _, record = act(x, layer, real)
    record["ponder"].backward()
    assert act.halt.weight.grad is not None and act.halt.weight.grad.abs().sum() > 0


def test_a_halted_position_stops_changing():
    # With a position-wise layer, running longer changes only positions still running: a
    # position that halted within 2 steps has the same output whether 2 or 6 are allowed.
    outputs, records = [], []
    for max_steps in (2, 6):
        act, layer, x, real = act_run(max_steps=max_steps, halting_bias=0.0)
        out, record = act(3 * x, layer, real)  # larger inputs: halting varies more
        outputs.append(out)
        records.append(record)
    halted_early = records[1]["steps"].le(2) & real
    ran_long = records[1]["steps"].ge(3)
    assert halted_early.any() and ran_long.any()
    torch.testing.assert_close(outputs[0][halted_early], outputs[1][halted_early])
    assert not torch.allclose(outputs[0][ran_long], outputs[1][ran_long])


def test_universal_transformer_decoder_is_causal_through_act():
    torch.manual_seed(0)
    model = UniversalTransformer(13, d_model=16, d_ff=32, h=2, max_steps=4).eval()
    src = torch.randint(3, 13, (2, 7))
    tgt = torch.randint(3, 13, (2, 6))
    src_mask = (src != 2).unsqueeze(-2)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(memory, src_mask, tgt, subsequent_mask(6))
        for k in (1, 3, 5):
            prefix = model.decode(memory, src_mask, tgt[:, :k], subsequent_mask(k))
            torch.testing.assert_close(prefix, full[:, :k])


def test_ponder_cost_of_the_model_sums_encoder_and_decoder():
    torch.manual_seed(0)
    model = UniversalTransformer(13, d_model=16, d_ff=32, h=2, max_steps=3)
    fixed_halting(model.encoder_act, 0.6)  # N = 2, remainder 0.4: 2.4 at every real position
    fixed_halting(model.decoder_act, 0.3)  # stopped by max_steps = 3, remainder 0.4: 3.4
    src = torch.randint(3, 13, (4, 5))
    src[0, 3:] = 2  # padding, which ponders nothing and is left out of the mean
    batch = seq2seq_batch(src, src)
    model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    torch.testing.assert_close(model.ponder_cost(), torch.tensor(2.4 + 3.4))
    model.ponder_cost().backward()
    assert model.encoder_act.halt.weight.grad.abs().sum() > 0
    assert model.decoder_act.halt.weight.grad.abs().sum() > 0


def test_greedy_decode_picks_the_universal_transformers_most_likely_next_token():
    torch.manual_seed(0)
    model = UniversalTransformer(13, d_model=16, d_ff=32, h=2, max_steps=3).eval()
    src = torch.randint(3, 13, (4, 5))
    src_mask = (src != 2).unsqueeze(-2)
    ys = greedy_decode(model, src, src_mask, 6, 0)
    assert ys.shape == (4, 6) and ys[:, 0].eq(0).all()
    with torch.no_grad():
        for k in range(1, 6):  # each token: the argmax after the prefix before it
            out = model(src, ys[:, :k], src_mask, subsequent_mask(k))
            assert torch.equal(model.generator(out[:, -1]).argmax(-1), ys[:, k])


def test_token_accuracy_counts_in_place_hits_over_real_target_tokens(monkeypatch):
    import the_annotated_transformer as tat

    tgt = torch.tensor([[4, 5, 2, 2], [6, 7, 8, 9]])  # target rows; 2 pads the first
    batch = seq2seq_batch(tgt, tgt)  # tgt_y: [4 5 </s> pad pad] and [6 7 8 9 </s>]
    asked = {}

    def decoded(model, src, src_mask, max_len, start):
        asked.update(max_len=max_len, start=start)
        # row 0: 4 right, 9 wrong, </s> right; row 1: 6 7 8 right, 3 wrong, then it stopped
        return torch.tensor([[0, 4, 9, 1, 2, 2], [0, 6, 7, 8, 3, 2]])[:, :max_len]

    monkeypatch.setattr(tat, "greedy_decode", decoded)
    # real tokens: 3 + 5 = 8; hits: 2 + 3 = 5
    assert token_accuracy(nn.Identity(), batch) == pytest.approx(5 / 8)
    assert asked == {"max_len": 6, "start": 0}


def test_max_steps_must_be_positive():
    with pytest.raises(ValueError, match="max_steps"):
        AdaptiveComputationTime(8, max_steps=0)
