"""Attention on a graph (chapter 23) against the dense attention of chapter 3."""

import pytest
import torch

from the_annotated_transformer import (
    Batch,
    SparseEncoder,
    attention,
    graph_attention,
    graph_transformer,
    make_model,
    mask_to_edges,
    packed_edges,
    packed_positions,
    subsequent_mask,
    window_global_mask,
)


def heads_to_nodes(x: torch.Tensor) -> torch.Tensor:
    """(batch, h, n, d) -> (batch * n, h, d): one row per token node."""
    batch, h, n, d = x.shape
    return x.transpose(1, 2).reshape(batch * n, h, d)


def dense_and_graph(mask: torch.Tensor, h: int = 3, d_k: int = 5, seed: int = 0):
    torch.manual_seed(seed)
    batch, n_q, n_k = mask.shape
    q, k, v = (torch.randn(batch, h, n, d_k, dtype=torch.float64) for n in (n_q, n_k, n_k))
    dense, dense_weights = attention(q, k, v, mask=mask.unsqueeze(1))
    key_nodes, query_nodes = mask_to_edges(mask)
    out, weights = graph_attention(
        heads_to_nodes(q), heads_to_nodes(k), heads_to_nodes(v), key_nodes, query_nodes
    )
    out = out.reshape(batch, n_q, h, d_k).transpose(1, 2)
    return dense, dense_weights, out, weights, key_nodes, query_nodes


def padding_mask(lengths: list[int], n_q: int, n_k: int) -> torch.Tensor:
    keep = torch.arange(n_k)[None, :] < torch.tensor(lengths)[:, None]  # (batch, n_k)
    return keep[:, None, :].expand(len(lengths), n_q, n_k)


def test_graph_attention_equals_dense_attention_with_padding():
    dense, _, graph, *_ = dense_and_graph(padding_mask([7, 3, 5], n_q=7, n_k=7))
    torch.testing.assert_close(graph, dense)


def test_graph_attention_equals_dense_attention_with_causal_mask():
    dense, _, graph, *_ = dense_and_graph(subsequent_mask(6).expand(2, 6, 6))
    torch.testing.assert_close(graph, dense)


def test_graph_attention_equals_dense_cross_attention_between_different_lengths():
    dense, _, graph, *_ = dense_and_graph(padding_mask([4, 2], n_q=3, n_k=4))
    torch.testing.assert_close(graph, dense)


def test_edge_weights_are_the_dense_weights_and_sum_to_one_per_query():
    mask = padding_mask([5, 2], n_q=4, n_k=5)
    _, dense_weights, _, weights, key_nodes, query_nodes = dense_and_graph(mask)
    b, i, j = mask.nonzero(as_tuple=True)
    torch.testing.assert_close(weights, dense_weights[b, :, i, j])
    sums = torch.zeros(8, 3, dtype=weights.dtype).index_add(0, query_nodes, weights)
    torch.testing.assert_close(sums, torch.ones_like(sums))


def test_mask_to_edges_numbers_nodes_sentence_by_sentence():
    mask = torch.tensor([[[True, False]], [[False, True]]])  # (batch=2, n_q=1, n_k=2)
    key_nodes, query_nodes = mask_to_edges(mask)
    assert key_nodes.tolist() == [0, 3]
    assert query_nodes.tolist() == [0, 1]
    assert len(mask_to_edges(subsequent_mask(10))[0]) == 10 * 11 // 2


def test_a_query_without_edges_gets_a_zero_output():
    mask = torch.tensor([[[True, True], [False, False]]])  # the second query sees nothing
    *_, key_nodes, query_nodes = dense_and_graph(mask)
    q = torch.randn(2, 1, 4)
    kv = torch.randn(2, 1, 4)
    out, _ = graph_attention(q, kv, kv, key_nodes, query_nodes)
    assert torch.equal(out[1], torch.zeros(1, 4))
    assert out[0].abs().sum() > 0


def test_bad_edge_lists_and_masks_raise_clear_errors():
    x = torch.randn(3, 1, 4)
    with pytest.raises(ValueError, match="same length"):
        graph_attention(x, x, x, torch.tensor([0, 1]), torch.tensor([0]))
    with pytest.raises(ValueError, match=r"\(batch, n_q, n_k\)"):
        mask_to_edges(torch.ones(4, 4, dtype=torch.bool))


def padded_batch(src_lengths: list[int], tgt_lengths: list[int], vocab: int = 11) -> Batch:
    """Random ids 3..vocab-1 with padding (id 2) after each sentence's length."""
    torch.manual_seed(1)
    src = torch.randint(3, vocab, (len(src_lengths), max(src_lengths)))
    tgt = torch.randint(3, vocab, (len(tgt_lengths), max(tgt_lengths) + 1))
    for row, (n_src, n_tgt) in enumerate(zip(src_lengths, tgt_lengths, strict=True)):
        src[row, n_src:] = 2
        tgt[row, n_tgt:] = 2  # n_tgt real tokens; Batch drops the last column (padding)
    return Batch(src, tgt, pad=2)


def dense_and_packed(model: torch.nn.Module, batch: Batch):
    real_src, real_tgt = batch.src != 2, batch.tgt != 2
    dense = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)[real_tgt]
    packed = graph_transformer(
        model, batch.src[real_src], real_src.sum(1), batch.tgt[real_tgt], real_tgt.sum(1)
    )
    return dense, packed


@pytest.mark.parametrize("norm_first", [True, False])
def test_packed_graph_model_equals_dense_model_on_real_positions(norm_first):
    model = make_model(11, 11, N=2, d_model=32, d_ff=64, h=4, norm_first=norm_first).eval()
    batch = padded_batch([7, 3, 5], [2, 6, 4])
    dense, packed = dense_and_packed(model, batch)
    assert packed.shape == (12, 32)  # 2 + 6 + 4 target nodes, no padding node
    torch.testing.assert_close(packed, dense, atol=1e-5, rtol=1e-5)


def test_packed_graph_model_has_the_dense_models_gradients():
    model = make_model(11, 11, N=2, d_model=32, d_ff=64, h=4).eval()
    batch = padded_batch([6, 2, 4], [3, 5, 1])
    grads = []
    for output in dense_and_packed(model, batch):
        model.zero_grad()
        (model.generator(output) * torch.linspace(0, 1, 11)).sum().backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    dense, packed = grads
    assert dense.keys() == packed.keys()
    for name in dense:
        torch.testing.assert_close(packed[name], dense[name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_edges_stay_within_each_sentence():
    key_nodes, query_nodes = packed_edges(torch.tensor([2, 3]), torch.tensor([2, 3]), causal=True)
    pairs = set(zip(key_nodes.tolist(), query_nodes.tolist(), strict=True))
    # sentence 0 is nodes 0-1, sentence 1 is nodes 2-4; keys at or before the query
    assert pairs == {(0, 0), (0, 1), (1, 1), (2, 2), (2, 3), (3, 3), (2, 4), (3, 4), (4, 4)}
    sentence, position = packed_positions(torch.tensor([2, 3]))
    assert sentence.tolist() == [0, 0, 1, 1, 1] and position.tolist() == [0, 1, 0, 1, 2]


def test_packed_inputs_must_match_their_lengths():
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2).eval()
    with pytest.raises(ValueError, match="src must hold sum"):
        graph_transformer(model, torch.tensor([3, 4, 5]), torch.tensor([2, 2]),
                          torch.tensor([3]), torch.tensor([1]))
    with pytest.raises(ValueError, match="positive lengths"):
        packed_positions(torch.tensor([2, 0]))


def test_window_with_global_tokens_has_edges_linear_in_length():
    counts = [int(window_global_mask(n, r=4, n_global=2).sum()) for n in (64, 128, 256, 512)]
    steps = [b - a for a, b in zip(counts, counts[1:], strict=False)]
    # each doubling adds edges in proportion to the added positions: (2r + 1 + ~2g) per position
    assert [s / d for s, d in zip(steps, (64, 128, 256), strict=True)] == pytest.approx(
        [9 + 4] * 3, abs=0.1
    )
    assert counts[-1] < 512 * 512 / 20


def test_window_with_global_tokens_connects_any_two_positions_in_two_hops():
    mask = window_global_mask(40, r=1, n_global=1)[0].float()
    assert bool(((mask @ mask) > 0).all())
    assert not bool(mask.bool().all())


def test_sparse_encoder_keeps_far_tokens_out_of_a_positions_output():
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).eval()
    sparse = SparseEncoder(model.encoder, r=1, n_global=0)
    x = torch.randn(1, 8, 16)
    mask = torch.ones(1, 1, 8, dtype=torch.bool)
    changed = x.clone()
    changed[0, 7] += 1.0  # position 7 is 7 steps from position 0, outside a window of r = 1
    assert torch.equal(sparse(x, mask)[0, :6], sparse(changed, mask)[0, :6])
    assert not torch.equal(model.encoder(x, mask)[0, 0], model.encoder(changed, mask)[0, 0])
    wide = SparseEncoder(model.encoder, r=8, n_global=0)  # a window wider than the sentence
    torch.testing.assert_close(wide(x, mask), model.encoder(x, mask))
