"""Attention on a graph (chapter 21) against the dense attention of chapter 3."""

import pytest
import torch

from the_annotated_transformer import (
    attention,
    graph_attention,
    mask_to_edges,
    subsequent_mask,
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
