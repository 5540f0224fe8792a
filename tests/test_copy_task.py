"""The copy task (chapter 12): its data, exact-match scoring, and a small model that learns it."""

import torch
from torch import nn

from the_annotated_transformer import (
    LabelSmoothing,
    SimpleLossCompute,
    TrainState,
    copy_batches,
    drop_sequences,
    exact_matches,
    make_model,
    random_sequences,
    rate,
    run_epoch,
    seq2seq_batch,
    sequence_set,
)

V, START, END, PAD = 13, 0, 1, 2


def test_random_sequences_have_lengths_in_range_and_padding_only_at_the_end():
    tokens = random_sequences(
        500, V, min_len=2, max_len=6, generator=torch.Generator().manual_seed(0)
    )
    assert tokens.shape == (500, 6)
    real = tokens != PAD
    lengths = real.sum(dim=1)
    assert lengths.min() == 2 and lengths.max() == 6
    assert torch.equal(real, torch.arange(6) < lengths[:, None])  # no padding before a symbol
    assert tokens[real].min() >= 3 and tokens[real].max() == V - 1


def test_copy_batch_target_is_the_source_between_start_and_end():
    batch = next(copy_batches(V, 8, 1, generator=torch.Generator().manual_seed(0)))
    for src, tgt, tgt_y in zip(
        batch.src.tolist(), batch.tgt.tolist(), batch.tgt_y.tolist(), strict=True
    ):
        symbols = [t for t in src if t != PAD]
        full = [START, *symbols, END]
        assert tgt[: len(full) - 1] == full[:-1]
        assert tgt_y[: len(full) - 1] == full[1:]
        assert set(tgt_y[len(full) - 1 :]) <= {PAD}
    assert batch.ntokens == int((batch.src != PAD).sum()) + 8  # the symbols and one </s> each


def test_copy_batches_are_reproducible_from_the_generator_seed():
    a = [b.src for b in copy_batches(V, 4, 3, generator=torch.Generator().manual_seed(5))]
    b = [b.src for b in copy_batches(V, 4, 3, generator=torch.Generator().manual_seed(5))]
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_excluded_sequences_never_appear_in_training_batches():
    # 3 symbols, lengths 1 to 3: 3 + 9 + 27 = 39 possible sequences, so training draws many
    # held-out ones unless they are dropped.
    held_out = sequence_set(random_sequences(20, 6, max_len=3, generator=torch.Generator()))
    assert len(held_out) >= 10
    seen = set()
    batches = copy_batches(
        6, 64, 20, max_len=3, generator=torch.Generator().manual_seed(1), exclude=held_out
    )
    for batch in batches:
        seen |= sequence_set(batch.src)
    assert len(seen) >= 39 - len(held_out) - 2
    assert not seen & held_out


def test_drop_sequences_keeps_the_other_rows_in_order():
    tokens = torch.tensor([[3, 4, PAD], [5, PAD, PAD], [3, 4, 5]])
    kept = drop_sequences(tokens, {(5,)})
    assert torch.equal(kept, tokens[[0, 2]])


def test_seq2seq_batch_puts_end_right_after_the_last_symbol():
    tgt = torch.tensor([[7, 8, PAD], [9, 9, 9]])
    batch = seq2seq_batch(tgt, tgt)
    assert batch.tgt.tolist() == [[START, 7, 8, END], [START, 9, 9, 9]]
    assert batch.tgt_y.tolist() == [[7, 8, END, PAD], [9, 9, 9, END]]


class CopyOracle(nn.Module):
    """A stand-in model whose greedy decoding copies the source, and then stops (or not)."""

    def __init__(self, stop: bool) -> None:
        super().__init__()
        self.stop = stop
        self.generator = nn.Identity()

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        return src

    def decode(self, memory, src_mask, ys, tgt_mask) -> torch.Tensor:
        position = ys.size(1) - 1
        if position < memory.size(1):
            next_token = memory[:, position]
        else:
            next_token = torch.full_like(memory[:, 0], PAD)
        if self.stop:
            next_token = next_token.masked_fill(next_token == PAD, END)
        scores = nn.functional.one_hot(next_token, V).float()  # (batch, V)
        return scores.unsqueeze(1).expand(-1, ys.size(1), -1)  # (batch, n, V)


def test_exact_matches_needs_the_symbols_and_the_end_token():
    src = random_sequences(30, V, generator=torch.Generator().manual_seed(0))
    batch = seq2seq_batch(src, src)
    assert exact_matches(CopyOracle(stop=True), batch) == 30
    assert exact_matches(CopyOracle(stop=False), batch) == 0
    tgt = src.clone()
    tgt[:10, 0] = (src[:10, 0] - 3 + 1) % (V - 3) + 3  # a different first symbol in 10 targets
    assert exact_matches(CopyOracle(stop=True), seq2seq_batch(src, tgt)) == 20


def test_small_transformer_learns_to_copy_held_out_sequences():
    torch.manual_seed(0)
    d_model = 32
    model = make_model(V, V, N=2, d_model=d_model, d_ff=64, h=4, dropout=0.0)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, PAD, smoothing=0.0))
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rate(step, model_size=d_model, factor=0.5, warmup=100)
    )
    test_src = random_sequences(
        20, V, min_len=3, max_len=5, generator=torch.Generator().manual_seed(1)
    )
    test_batch = seq2seq_batch(test_src, test_src)
    assert exact_matches(model, test_batch) < 5
    data = torch.Generator().manual_seed(0)
    state = TrainState()
    copies = 0
    for _ in range(60):  # at most 600 optimizer steps
        batches = copy_batches(V, 64, 10, max_len=5, generator=data, exclude=sequence_set(test_src))
        _, state = run_epoch(
            batches, model, loss_compute, optimizer, scheduler, train_state=state, log_every=None
        )
        copies = exact_matches(model, test_batch)
        if copies == 20:
            break
    assert copies == 20, f"{copies}/20 exact copies after {state.accum_step} steps"
