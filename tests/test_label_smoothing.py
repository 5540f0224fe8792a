"""Label smoothing of chapter 11 (paper section 5.4)."""

import math

import pytest
import torch
import torch.nn.functional as F

from the_annotated_transformer import LabelSmoothing


def smoothed(size=7, padding_idx=0, smoothing=0.2, target=(3, 0, 6, 1, 0, 2)):
    crit = LabelSmoothing(size=size, padding_idx=padding_idx, smoothing=smoothing)
    target = torch.tensor(target)
    x = torch.randn(len(target), size).log_softmax(dim=-1)
    loss = crit(x, target)
    return crit, target, x, loss


def test_each_non_padding_row_of_the_target_sums_to_one():
    crit, target, _, _ = smoothed()
    sums = crit.true_dist.sum(dim=1)
    real = target != crit.padding_idx
    torch.testing.assert_close(sums[real], torch.ones(int(real.sum())))


def test_target_has_confidence_on_the_true_token_and_the_rest_spread_evenly():
    crit, target, _, _ = smoothed(size=7, smoothing=0.2)
    row = crit.true_dist[0]  # target 3
    assert row[3].item() == pytest.approx(0.8)
    others = [i for i in range(7) if i not in (0, 3)]
    torch.testing.assert_close(row[others], torch.full((5,), 0.2 / 5))


def test_padding_column_and_padding_rows_of_the_target_are_zero():
    crit, target, _, _ = smoothed(padding_idx=2, target=(3, 2, 6, 1, 2, 0))
    assert torch.all(crit.true_dist[:, 2] == 0)
    assert torch.all(crit.true_dist[target == 2] == 0)
    assert torch.all(crit.true_dist[target != 2].sum(dim=1) > 0.99)


def test_loss_is_finite_when_predictions_contain_zero_probabilities():
    crit = LabelSmoothing(size=5, padding_idx=0, smoothing=0.4)
    predict = torch.tensor([[0.0, 0.2, 0.7, 0.05, 0.05]]).repeat(3, 1)  # log(0) in padding column
    target = torch.tensor([2, 0, 1])  # one padding row, whose prediction is also ignored
    x = predict.log().requires_grad_()
    loss = crit(x, target)
    assert torch.isfinite(loss)
    loss.backward()
    assert torch.isfinite(x.grad).all()
    assert torch.all(x.grad[:, 0] == 0) and torch.all(x.grad[1] == 0)


def test_loss_is_infinite_not_nan_when_the_prediction_rules_out_a_target_token():
    crit = LabelSmoothing(size=5, padding_idx=0, smoothing=0.4)
    x = torch.tensor([[0.0, 0.2, 0.8, 0.0, 0.0]]).log()
    assert crit(x, torch.tensor([2])).item() == math.inf


def test_loss_equals_a_hand_computed_kl_divergence():
    crit = LabelSmoothing(size=4, padding_idx=0, smoothing=0.2)
    p = torch.tensor([[0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.0, 0.3, 0.3, 0.4]])
    target = torch.tensor([1, 0, 3])
    # q for target 1: [0, 0.8, 0.1, 0.1]; for target 3: [0, 0.1, 0.1, 0.8]; the padding row is 0.
    expected = (
        0.8 * math.log(0.8 / 0.6) + 0.1 * math.log(0.1 / 0.2) + 0.1 * math.log(0.1 / 0.1)
    ) + (0.1 * math.log(0.1 / 0.3) + 0.1 * math.log(0.1 / 0.3) + 0.8 * math.log(0.8 / 0.4))
    assert crit(p.log(), target).item() == pytest.approx(expected, rel=1e-6)


def test_without_smoothing_the_loss_is_the_cross_entropy_of_the_non_padding_rows():
    torch.manual_seed(0)
    x = torch.randn(5, 6).log_softmax(dim=-1)
    target = torch.tensor([1, 0, 4, 5, 0])
    ours = LabelSmoothing(size=6, padding_idx=0, smoothing=0.0)(x, target)
    theirs = F.nll_loss(x, target, ignore_index=0, reduction="sum")
    torch.testing.assert_close(ours, theirs)


def test_loss_equals_pytorch_label_smoothed_cross_entropy_minus_the_target_entropy():
    torch.manual_seed(0)
    size, padding_idx, smoothing = 9, 0, 0.1
    logits = torch.randn(7, size, dtype=torch.float64)
    logits[:, padding_idx] = -math.inf
    x = logits.log_softmax(dim=-1)
    target = torch.tensor([3, 1, 0, 8, 2, 0, 5])
    ours = LabelSmoothing(size, padding_idx, smoothing=smoothing)(x, target)
    theirs = F.cross_entropy(
        x[:, 1:],
        target - 1,
        ignore_index=-1,
        reduction="sum",
        label_smoothing=smoothing * (size - 1) / (size - 2),
    )
    entropy = -(1 - smoothing) * math.log(1 - smoothing) - smoothing * math.log(
        smoothing / (size - 2)
    )
    rows = int((target != padding_idx).sum())
    assert ours.dtype == torch.float64
    assert ours.item() == pytest.approx(theirs.item() - rows * entropy, rel=1e-12)


def test_loss_is_smallest_when_the_prediction_equals_the_smoothed_target():
    crit = LabelSmoothing(size=6, padding_idx=0, smoothing=0.1)
    target = torch.tensor([2])
    exact = crit.smoothed_targets(target)
    assert crit(exact.log(), target).item() == pytest.approx(0.0, abs=1e-7)
    # KL(smoothed || prediction) by hand: 0.9 on the word, 0.025 on each of the 4 others
    sharper = torch.tensor([[0.0, 0.01, 0.96, 0.01, 0.01, 0.01]])
    expected = 0.9 * math.log(0.9 / 0.96) + 4 * 0.025 * math.log(0.025 / 0.01)
    assert crit(sharper.log(), target).item() == pytest.approx(expected, rel=1e-5)
    flatter = torch.tensor([[0.0, 0.05, 0.8, 0.05, 0.05, 0.05]])
    expected = 0.9 * math.log(0.9 / 0.8) + 4 * 0.025 * math.log(0.025 / 0.05)
    assert crit(flatter.log(), target).item() == pytest.approx(expected, rel=1e-5)
    others = [crit(p.log(), target).item() for p in (sharper, flatter)]
    assert min(others) > crit(exact.log(), target).item() + 1e-3  # both miss the minimum


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"size": 2, "padding_idx": 0}, "size"),
        ({"size": 5, "padding_idx": 5}, "padding_idx"),
        ({"size": 5, "padding_idx": 0, "smoothing": 1.0}, "smoothing"),
    ],
)
def test_constructor_rejects_bad_arguments_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LabelSmoothing(**kwargs)


def test_forward_rejects_wrong_shapes_naming_the_argument():
    crit = LabelSmoothing(size=5, padding_idx=0, smoothing=0.1)
    with pytest.raises(ValueError, match="x must be"):
        crit(torch.zeros(2, 3, 5), torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="target must"):
        crit(torch.zeros(2, 5), torch.tensor([1, 2, 3]))
