"""The learning-rate schedule of chapter 10 (paper section 5.3)."""

import math

import pytest
import torch
from torch.optim.lr_scheduler import LambdaLR

from the_annotated_transformer import rate


def test_rate_at_step_zero_equals_rate_at_step_one():
    assert rate(0, model_size=512, factor=1.0, warmup=4000) == rate(
        1, model_size=512, factor=1.0, warmup=4000
    )


@pytest.mark.parametrize("model_size, factor, warmup", [(512, 1.0, 4000), (256, 2.0, 400)])
def test_rate_peaks_at_warmup(model_size, factor, warmup):
    rates = [
        rate(s, model_size=model_size, factor=factor, warmup=warmup) for s in range(0, 3 * warmup)
    ]
    assert max(range(len(rates)), key=rates.__getitem__) == warmup
    assert rates[warmup] == pytest.approx(factor * model_size**-0.5 * warmup**-0.5, rel=1e-12)


@pytest.mark.parametrize("step", [1, 7, 3999, 4000, 4001, 12_345, 100_000])
def test_rate_matches_the_papers_formula(step):
    d_model, warmup, factor = 512, 4000, 2.0
    expected = factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)
    assert rate(step, model_size=d_model, factor=factor, warmup=warmup) == pytest.approx(
        expected, rel=1e-12
    )


def test_rate_rises_linearly_during_warmup_and_decays_as_inverse_square_root_after():
    def r(s):
        return rate(s, model_size=512, factor=1.0, warmup=4000)

    assert r(2000) == pytest.approx(2 * r(1000), rel=1e-12)
    assert r(16_000) == pytest.approx(r(64_000) * 2, rel=1e-12)
    assert r(8000) == pytest.approx(math.sqrt(4000 / 8000) * r(4000), rel=1e-12)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"step": -1}, "step"),
        ({"model_size": 0}, "model_size"),
        ({"warmup": 0}, "warmup"),
    ],
)
def test_rate_rejects_bad_arguments_naming_them(kwargs, name):
    args = {"step": 10, "model_size": 512, "factor": 1.0, "warmup": 4000} | kwargs
    with pytest.raises(ValueError, match=name):
        rate(**args)


def test_lambdalr_with_rate_sets_the_optimizers_learning_rate_each_step():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = LambdaLR(optimizer, lambda step: rate(step, model_size=64, factor=1.0, warmup=10))
    seen = []
    for _ in range(25):
        seen.append(optimizer.param_groups[0]["lr"])
        model(torch.randn(4, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    expected = [rate(s, model_size=64, factor=1.0, warmup=10) for s in range(25)]
    assert seen == pytest.approx(expected, rel=1e-12)
    assert seen[0] == seen[1] > 0  # step 0 is treated as step 1: no division by zero
    assert max(range(25), key=seen.__getitem__) == 10
