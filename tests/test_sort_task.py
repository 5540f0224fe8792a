"""The sort task's data (chapter 13): sorted targets, padding kept at the end, held-out rows."""

import torch

from the_annotated_transformer import random_sequences, sequence_set, sort_batches, sorted_symbols

V, START, END, PAD = 13, 0, 1, 2


def test_sorted_symbols_sorts_each_row_and_keeps_padding_at_the_end():
    src = torch.tensor([[9, 3, 7, PAD], [5, PAD, PAD, PAD], [12, 12, 4, 3]])
    expected = torch.tensor([[3, 7, 9, PAD], [5, PAD, PAD, PAD], [3, 4, 12, 12]])
    assert torch.equal(sorted_symbols(src), expected)


def test_sort_batch_target_is_the_sorted_source_between_start_and_end():
    batch = next(sort_batches(V, 16, 1, generator=torch.Generator().manual_seed(0)))
    for src, tgt_y in zip(batch.src.tolist(), batch.tgt_y.tolist(), strict=True):
        symbols = sorted(t for t in src if t != PAD)
        assert tgt_y[: len(symbols) + 1] == [*symbols, END]
        assert set(tgt_y[len(symbols) + 1 :]) <= {PAD}
    assert (batch.tgt[:, 0] == START).all()


def test_sort_batches_skip_held_out_sequences():
    held_out = sequence_set(random_sequences(20, 6, max_len=3, generator=torch.Generator()))
    batches = sort_batches(
        6, 64, 10, max_len=3, generator=torch.Generator().manual_seed(1), exclude=held_out
    )
    seen = set().union(*(sequence_set(batch.src) for batch in batches))
    assert seen and not seen & held_out
