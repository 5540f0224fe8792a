"""Batch (chapter 7): decoder inputs and labels, masks and token counts for padded batches."""

import pytest
import torch

from the_annotated_transformer import Batch, subsequent_mask

PAD = 2


@pytest.fixture
def batch() -> Batch:
    src = torch.tensor([[5, 6, 7, 8], [5, 6, PAD, PAD]])
    tgt = torch.tensor([[0, 5, 6, 7, 8, 1], [0, 5, 6, 1, PAD, PAD]])
    return Batch(src, tgt, pad=PAD)


def test_src_mask_is_true_exactly_at_non_padding_source_tokens(batch):
    expected = torch.tensor([[[True, True, True, True]], [[True, True, False, False]]])
    assert batch.src_mask.shape == (2, 1, 4)
    assert batch.src_mask.dtype == torch.bool
    assert torch.equal(batch.src_mask, expected)


def test_tgt_and_tgt_y_are_the_target_without_last_and_without_first_token(batch):
    assert torch.equal(batch.tgt, torch.tensor([[0, 5, 6, 7, 8], [0, 5, 6, 1, PAD]]))
    assert torch.equal(batch.tgt_y, torch.tensor([[5, 6, 7, 8, 1], [5, 6, 1, PAD, PAD]]))


def test_tgt_mask_is_padding_mask_and_subsequent_mask(batch):
    n = batch.tgt.size(1)
    assert batch.tgt_mask.shape == (2, n, n)
    for b in range(2):
        for i in range(n):
            for j in range(n):
                allowed = j <= i and batch.tgt[b, j] != PAD
                assert bool(batch.tgt_mask[b, i, j]) == allowed, (b, i, j)
    # A sentence without padding gets exactly the subsequent mask.
    assert torch.equal(batch.tgt_mask[0], subsequent_mask(n)[0])


def test_tgt_mask_hides_padding_key_even_from_later_padding_queries(batch):
    # Sentence 1: input "<s> 5 6 </s> <blank>"; the padding key (position 4) is hidden from all.
    assert not batch.tgt_mask[1, :, 4].any()
    assert batch.tgt_mask[1, 4, :4].all()


def test_ntokens_counts_non_padding_labels_as_an_int(batch):
    assert batch.ntokens == 5 + 3
    assert isinstance(batch.ntokens, int)


def test_source_only_batch_has_no_target_fields():
    batch = Batch(torch.tensor([[3, 4, PAD]]))
    assert torch.equal(batch.src_mask, torch.tensor([[[True, True, False]]]))
    assert not hasattr(batch, "tgt") and not hasattr(batch, "ntokens")


def test_pad_argument_selects_the_padding_token():
    batch = Batch(torch.tensor([[3, 0, 0]]), torch.tensor([[1, 3, 0, 0]]), pad=0)
    assert torch.equal(batch.src_mask, torch.tensor([[[True, False, False]]]))
    assert batch.ntokens == 1


def test_to_moves_every_tensor_and_returns_the_batch(batch):
    moved = batch.to(torch.device("meta"))
    assert moved is batch
    for name in ("src", "src_mask", "tgt", "tgt_y", "tgt_mask"):
        assert getattr(batch, name).device.type == "meta", name
    assert batch.ntokens == 8


@pytest.mark.parametrize(
    "src, tgt, error",
    [
        (torch.tensor([3, 4, 5]), None, TypeError),  # one-dimensional src
        (torch.rand(2, 3), None, TypeError),  # floating-point src
        (torch.tensor([[3, 4]]), torch.tensor([0, 3, 1]), TypeError),  # one-dimensional tgt
        (torch.tensor([[3, 4]]), torch.tensor([[0]]), ValueError),  # nothing to predict
        (torch.tensor([[3, 4]]), torch.tensor([[0, 3], [0, 4]]), ValueError),  # batch sizes
    ],
)
def test_bad_input_is_rejected_with_a_message_naming_the_argument(src, tgt, error):
    with pytest.raises(error, match="src|tgt"):
        Batch(src, tgt)
