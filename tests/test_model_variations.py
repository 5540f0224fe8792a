"""Chapter 19's model variants: a key size d_k of its own (Table 3, row B), other positions (E)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from the_annotated_transformer import (
    KeySizeAttention,
    LabelSmoothing,
    LearnedPositionalEmbedding,
    MultiHeadedAttention,
    PositionalEncoding,
    SimpleLossCompute,
    copy_batches,
    make_model,
    make_variant,
    rate,
    run_epoch,
)

V = 13


def attention_modules(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, MultiHeadedAttention)]


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def padded_input(seed=0, batch=2, n=6, d_model=32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, d_model, generator=g)  # (batch, n, d_model)
    mask = torch.ones(batch, 1, n, dtype=torch.bool)
    mask[1, :, 4:] = False  # the second row ends in two padding positions
    return x, mask


def test_key_size_attention_with_the_standard_width_matches_multi_headed_attention():
    torch.manual_seed(0)
    standard = MultiHeadedAttention(4, 32, dropout=0.0).eval()
    same = KeySizeAttention(4, 32, d_k=8, dropout=0.0).eval()
    same.load_state_dict(standard.state_dict())
    x, mask = padded_input()
    torch.testing.assert_close(same(x, x, x, mask), standard(x, x, x, mask))
    torch.testing.assert_close(same.attn, standard.attn)


def test_narrow_keys_match_scaled_dot_product_attention_head_by_head():
    torch.manual_seed(0)
    h, d_model, d_k = 4, 32, 2
    module = KeySizeAttention(h, d_model, d_k=d_k, dropout=0.0).eval()
    x, mask = padded_input()
    memory = torch.randn(2, 6, d_model)
    out = module(x, memory, memory, mask)  # (batch, n_q, d_model)

    w_q, w_k, w_v, w_o = module.linears
    q = w_q(x).view(2, -1, h, d_k).transpose(1, 2)  # (batch, h, n_q, d_k)
    k = w_k(memory).view(2, -1, h, d_k).transpose(1, 2)  # (batch, h, n_k, d_k)
    v = w_v(memory).view(2, -1, h, d_model // h).transpose(1, 2)  # (batch, h, n_k, d_v)
    heads = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1))
    expected = w_o(heads.transpose(1, 2).reshape(2, -1, d_model))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert module.attn.shape == (2, h, 6, 6)
    assert w_q.out_features == w_k.out_features == h * d_k and w_v.out_features == d_model


def test_make_variant_with_defaults_builds_the_same_model_as_make_model():
    torch.manual_seed(0)
    reference = make_model(V, V, N=2, d_model=32, d_ff=64, h=4)
    torch.manual_seed(0)
    variant = make_variant(V, V, N=2, d_model=32, d_ff=64, h=4, d_k=8)  # d_k = d_model / h
    assert reference.state_dict().keys() == variant.state_dict().keys()
    for name, tensor in reference.state_dict().items():
        assert torch.equal(tensor, variant.state_dict()[name]), name


def test_make_variant_narrows_every_attention_layer_and_removes_their_parameters():
    N, d_model, h, d_k = 2, 32, 4, 2
    base = make_variant(V, V, N=N, d_model=d_model, d_ff=64, h=h, share_embeddings=True)
    narrow = make_variant(V, V, N=N, d_model=d_model, d_ff=64, h=h, d_k=d_k,
                          share_embeddings=True)
    modules = attention_modules(narrow)
    assert len(modules) == 3 * N  # encoder self, decoder self and decoder-encoder attention
    assert all(isinstance(m, KeySizeAttention) and (m.h, m.d_k, m.d_v) == (h, d_k, 8)
               for m in modules)
    # W^Q and W^K of each layer lose (d_model + 1) * (d_model - h * d_k) weights and biases
    assert count(base) - count(narrow) == 3 * N * 2 * (d_model + 1) * (d_model - h * d_k)
    assert narrow.generator.proj.weight is narrow.src_embed[0].lut.weight  # tying kept


def test_row_b_removes_the_parameters_that_the_paper_reports():
    """Table 3: 65M for the base model, 60M with d_k = 32, 58M with d_k = 16."""
    with torch.device("meta"):
        counts = {d_k: count(make_variant(37_000, 37_000, d_k=d_k, share_embeddings=True))
                  for d_k in (64, 32, 16)}
    assert round((counts[64] - counts[32]) / 1e6) == 65 - 60
    assert round((counts[64] - counts[16]) / 1e6) == 65 - 58


def test_make_variant_swaps_in_learned_positions():
    model = make_variant(V, V, N=1, d_model=32, d_ff=64, h=4, positions="learned", max_len=12)
    reference = make_variant(V, V, N=1, d_model=32, d_ff=64, h=4)
    for embed in (model.src_embed, model.tgt_embed):
        assert isinstance(embed[1], LearnedPositionalEmbedding)
        assert embed[1].position.weight.shape == (12, 32)
    assert isinstance(reference.src_embed[1], PositionalEncoding)
    assert count(model) - count(reference) == 2 * 12 * 32


def test_without_positions_the_encoder_ignores_the_order_of_the_source():
    torch.manual_seed(0)
    model = make_variant(V, V, N=2, d_model=32, d_ff=64, h=4, positions="none").eval()
    src = torch.tensor([[3, 4, 5, 6, 7, 8]])
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    mask = torch.ones(1, 1, 6, dtype=torch.bool)
    memory = model.encode(src, mask)  # (1, n_src, d_model)
    torch.testing.assert_close(model.encode(src[:, perm], mask), memory[:, perm])
    with_positions = make_variant(V, V, N=2, d_model=32, d_ff=64, h=4).eval()
    shuffled = with_positions.encode(src[:, perm], mask)
    assert (shuffled - with_positions.encode(src, mask)[:, perm]).abs().max() > 1e-3


def test_make_variant_rejects_unknown_positions_and_bad_key_sizes():
    with pytest.raises(ValueError, match="positions='rotary'"):
        make_variant(V, V, N=1, d_model=32, d_ff=64, h=4, positions="rotary")
    with pytest.raises(ValueError, match="d_k=0"):
        make_variant(V, V, N=1, d_model=32, d_ff=64, h=4, d_k=0)
    with pytest.raises(ValueError, match="d_k=2.5"):
        KeySizeAttention(4, 32, d_k=2.5)


def test_a_variant_with_learned_positions_and_narrow_keys_learns_to_copy():
    torch.manual_seed(0)
    model = make_variant(V, V, N=1, d_model=32, d_ff=64, h=4, d_k=4, dropout=0.0,
                         positions="learned", max_len=12)
    table = model.src_embed[1].position.weight.detach().clone()
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, padding_idx=2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rate(step, model_size=32, factor=1.0, warmup=40)
    )
    test = list(copy_batches(V, 200, 1, max_len=6, generator=torch.Generator().manual_seed(1)))
    before, _ = run_epoch(test, model, loss_compute, mode="eval", log_every=None)
    batches = copy_batches(V, 32, 150, max_len=6, generator=torch.Generator().manual_seed(0))
    run_epoch(batches, model, loss_compute, optimizer, scheduler, log_every=None)
    after, _ = run_epoch(test, model, loss_compute, mode="eval", log_every=None)
    assert after < 0.25 * before, (before, after)
    assert not torch.equal(model.src_embed[1].position.weight, table)  # the positions trained
