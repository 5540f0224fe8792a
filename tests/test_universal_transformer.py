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


def test_ponder_cost_is_steps_plus_remainder_and_its_gradient_reaches_the_halting_unit():
    act, layer, x, real = act_run(halting_bias=0.0)
    _, record = act(x, layer, real)
    assert 1.0 <= record["ponder"].item() <= 5.0 + 1.0
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
    src = torch.randint(3, 13, (4, 5))
    batch = seq2seq_batch(src, src)
    model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
    expected = model.act["encoder"]["ponder"] + model.act["decoder"]["ponder"]
    torch.testing.assert_close(model.ponder_cost(), expected)
    model.ponder_cost().backward()
    assert model.decoder_act.halt.weight.grad.abs().sum() > 0
    ys = greedy_decode(model.eval(), batch.src, batch.src_mask, 6, 0)
    assert ys.shape[0] == 4
    assert 0.0 <= token_accuracy(model, batch) <= 1.0


def test_max_steps_must_be_positive():
    with pytest.raises(ValueError, match="max_steps"):
        AdaptiveComputationTime(8, max_steps=0)
