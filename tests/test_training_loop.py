"""The training loop (chapter 8): exact gradient accumulation, step counts, fresh state, eval."""

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from the_annotated_transformer import (
    Batch,
    SimpleLossCompute,
    TrainState,
    make_model,
    run_epoch,
)

V, PAD = 11, 2


def random_batches(n_batches: int, size: int = 3, length: int = 6, seed: int = 0) -> list[Batch]:
    """Batches of one shape whose rows carry different amounts of padding."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n_batches):
        src = torch.randint(3, V, (size, length), generator=g)
        tgt = torch.randint(3, V, (size, length + 1), generator=g)
        tgt[:, 0] = 0
        lengths = torch.randint(1, length + 1, (size,), generator=g)
        src[torch.arange(length) >= lengths[:, None]] = PAD
        tgt[torch.arange(length + 1) >= lengths[:, None] + 1] = PAD
        batches.append(Batch(src, tgt, pad=PAD))
    return batches


def concatenated(batches: list[Batch]) -> Batch:
    return Batch(
        torch.cat([b.src for b in batches]),
        torch.cat([torch.cat([b.tgt, b.tgt_y[:, -1:]], dim=1) for b in batches]),
        pad=PAD,
    )


def small_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return make_model(V, V, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)


def criterion() -> nn.Module:
    return nn.NLLLoss(reduction="sum", ignore_index=PAD)


def sgd(parameters) -> torch.optim.Optimizer:
    return torch.optim.SGD(parameters, lr=0.05)


def adam(parameters) -> torch.optim.Optimizer:
    # Adam's first step is about lr * sign(gradient); eps=1e-4 keeps gradients that are zero up
    # to rounding from flipping a whole step, so the comparison tests the gradients themselves.
    return torch.optim.Adam(parameters, lr=0.05, eps=1e-4)


def train_once(model: nn.Module, batches: list[Batch], make_optimizer, **options) -> nn.Module:
    optimizer = make_optimizer(model.parameters())
    loss_compute = SimpleLossCompute(model.generator, criterion())
    run_epoch(batches, model, loss_compute, optimizer, log_every=None, **options)
    return model


def largest_difference(a: nn.Module, b: nn.Module) -> float:
    pairs = zip(a.parameters(), b.parameters(), strict=True)
    return max(float((p - q).detach().abs().max()) for p, q in pairs)


@pytest.mark.parametrize("make_optimizer", [sgd, adam])
def test_accumulating_4_micro_batches_equals_one_step_on_the_4_times_larger_batch(
    make_optimizer,
):
    micro = random_batches(4)
    assert len({b.ntokens for b in micro}) > 1  # token counts differ, so the weighting matters
    base = small_model()
    big = train_once(copy.deepcopy(base), [concatenated(micro)], make_optimizer, accum_iter=1)
    accumulated = train_once(copy.deepcopy(base), micro, make_optimizer, accum_iter=4)
    assert largest_difference(big, base) > 1e-3  # the step did something
    for p, q in zip(big.parameters(), accumulated.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_accumulation_differs_from_one_step_per_micro_batch():
    micro = random_batches(4)
    base = small_model()
    grouped = train_once(copy.deepcopy(base), micro, sgd, accum_iter=4)
    separate = train_once(copy.deepcopy(base), micro, sgd, accum_iter=1)
    assert largest_difference(grouped, separate) > 1e-4


def test_optimizer_and_scheduler_step_once_per_group_and_once_for_a_final_partial_group():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = []
    optimizer.register_step_post_hook(lambda *args: steps.append(1))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    loss_compute = SimpleLossCompute(model.generator, criterion())
    _, state = run_epoch(
        random_batches(7), model, loss_compute, optimizer, scheduler, accum_iter=3, log_every=None
    )
    assert len(steps) == 3  # groups of 3, 3 and 1
    assert scheduler.last_epoch == 3
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01 / 4)
    assert (state.step, state.accum_step, state.samples) == (7, 3, 21)
    assert all(p.grad is None for p in model.parameters())  # nothing left for the next epoch


def test_final_partial_group_equals_a_step_on_its_own_batches():
    batches = random_batches(5)
    base = small_model()
    all_five = train_once(copy.deepcopy(base), batches, sgd, accum_iter=4)
    by_hand = train_once(copy.deepcopy(base), batches[:4], sgd, accum_iter=4)
    by_hand = train_once(by_hand, batches[4:], sgd, accum_iter=4)
    for p, q in zip(all_five.parameters(), by_hand.parameters(), strict=True):
        torch.testing.assert_close(p, q, atol=1e-6, rtol=1e-5)


def test_train_state_is_fresh_per_call_and_carried_when_passed():
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_compute = SimpleLossCompute(model.generator, criterion())
    batches = random_batches(2)
    tokens = sum(b.ntokens for b in batches)
    _, first = run_epoch(batches, model, loss_compute, optimizer, log_every=None)
    _, second = run_epoch(batches, model, loss_compute, optimizer, log_every=None)
    assert first is not second
    assert first == second == TrainState(step=2, accum_step=2, samples=6, tokens=tokens)
    _, carried = run_epoch(
        batches, model, loss_compute, optimizer, train_state=first, log_every=None
    )
    assert carried is first
    assert carried == TrainState(step=4, accum_step=4, samples=12, tokens=2 * tokens)


def test_eval_mode_changes_no_parameter_and_returns_the_mean_token_loss():
    model = small_model()
    model.train()
    before = copy.deepcopy(model.state_dict())
    batches = random_batches(3)
    loss_compute = SimpleLossCompute(model.generator, criterion())
    loss, state = run_epoch(batches, model, loss_compute, mode="eval")
    assert not model.training
    assert state == TrainState()
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name
    assert all(p.grad is None for p in model.parameters())
    big = concatenated(batches)
    with torch.no_grad():
        log_probs = model.generator(model(big.src, big.tgt, big.src_mask, big.tgt_mask))
    expected = F.nll_loss(log_probs.reshape(-1, V), big.tgt_y.reshape(-1), ignore_index=PAD)
    assert loss == pytest.approx(float(expected), rel=1e-5)


def test_simple_loss_compute_returns_the_sum_and_the_sum_divided_by_norm():
    torch.manual_seed(0)
    generator = nn.Sequential(nn.Linear(4, V), nn.LogSoftmax(dim=-1))
    x = torch.randn(2, 3, 4)
    y = torch.tensor([[3, 4, PAD], [5, PAD, PAD]])
    loss_sum, loss = SimpleLossCompute(generator, criterion())(x, y, 3)
    expected = F.nll_loss(
        generator(x).reshape(-1, V), y.reshape(-1), ignore_index=PAD, reduction="sum"
    )
    assert isinstance(loss_sum, float)
    assert loss_sum == pytest.approx(float(expected.detach()), rel=1e-6)
    torch.testing.assert_close(loss, expected / 3)
    assert loss.requires_grad


def test_prints_one_line_every_log_every_optimizer_steps(capsys):
    model = small_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_compute = SimpleLossCompute(model.generator, criterion())
    run_epoch(random_batches(10), model, loss_compute, optimizer, accum_iter=2, log_every=2)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("|")[0].split() for line in lines] == [["step", "2"], ["step", "4"]]


@pytest.mark.parametrize(
    "options, match",
    [
        ({"mode": "test"}, "mode"),
        ({"accum_iter": 0}, "accum_iter"),
        ({"optimizer": None}, "optimizer"),
    ],
)
def test_bad_options_raise_value_error_naming_the_option(options, match):
    model = small_model()
    arguments = {"optimizer": torch.optim.SGD(model.parameters(), lr=0.01)} | options
    optimizer = arguments.pop("optimizer")
    loss_compute = SimpleLossCompute(model.generator, criterion())
    with pytest.raises(ValueError, match=match):
        run_epoch(random_batches(1), model, loss_compute, optimizer, **arguments)
