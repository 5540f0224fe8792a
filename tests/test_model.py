"""The model of Part I (chapters 2 to 5), checked against PyTorch's own layers and the paper."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from the_annotated_transformer import (
    DecoderLayer,
    Embeddings,
    EncoderLayer,
    LayerNorm,
    LearnedPositionalEmbedding,
    MultiHeadedAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    SublayerConnection,
    attention,
    greedy_decode,
    make_model,
    subsequent_mask,
)


@pytest.fixture(autouse=True)
def no_mha_fastpath():
    """PyTorch's inference fast path zeroes padded outputs; compare with the plain math path."""
    enabled = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    yield
    torch.backends.mha.set_fastpath_enabled(enabled)


def qkv(batch=2, h=3, n_q=5, n_k=7, d_k=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, h, n, d_k, generator=g) for n in (n_q, n_k, n_k))


# attention -------------------------------------------------------------------------------------


def test_attention_matches_scaled_dot_product_attention_without_mask():
    q, k, v = qkv()
    out, weights = attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v))
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))


def test_attention_matches_scaled_dot_product_attention_with_padding():
    q, k, v = qkv()
    keep = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])  # (batch, n_k)
    mask = keep[:, None, None, :]  # (batch, 1, 1, n_k)
    out, weights = attention(q, k, v, mask=mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    assert torch.all(weights[1, :, :, 4:] == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 5))


def test_attention_matches_scaled_dot_product_attention_causal():
    q, k, v = qkv(n_q=6, n_k=6)
    out, weights = attention(q, k, v, mask=subsequent_mask(6))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    assert torch.all(weights.triu(diagonal=1) == 0)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 6))


def test_attention_accepts_integer_masks_with_one_meaning_attend():
    q, k, v = qkv(n_q=6, n_k=6)
    out_bool, _ = attention(q, k, v, mask=subsequent_mask(6))
    out_int, _ = attention(q, k, v, mask=subsequent_mask(6).long())
    torch.testing.assert_close(out_bool, out_int)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_masking_works_in_half_precision(dtype):
    q, k, v = (t.to(dtype) for t in qkv(n_q=6, n_k=6))
    out, weights = attention(q, k, v, mask=subsequent_mask(6))
    assert torch.isfinite(out).all()
    assert torch.all(weights.triu(diagonal=1) == 0)
    reference = F.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), is_causal=True)
    torch.testing.assert_close(out.float(), reference, atol=2e-2, rtol=2e-2)


def test_attention_rejects_mask_that_does_not_broadcast():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 6\).*\(2, 3, 5, 7\)"):
        attention(q, k, v, mask=torch.ones(2, 1, 1, 6, dtype=torch.bool))


def test_attention_rejects_mask_that_would_enlarge_the_scores():
    q, k, v = qkv(batch=1)
    with pytest.raises(ValueError, match="does not broadcast"):
        attention(q, k, v, mask=torch.ones(4, 1, 5, 7, dtype=torch.bool))


# multi-head attention --------------------------------------------------------------------------


def mha_pair(d_model=16, h=4, seed=0):
    """Our MultiHeadedAttention and torch's MultiheadAttention with the same weights."""
    torch.manual_seed(seed)
    ours = MultiHeadedAttention(h, d_model, dropout=0.0).eval()
    theirs = nn.MultiheadAttention(d_model, h, dropout=0.0, batch_first=True).eval()
    copy_attention(ours, theirs)
    return ours, theirs


def test_multi_headed_attention_matches_torch_without_mask():
    ours, theirs = mha_pair()
    query, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    with torch.no_grad():
        expected, expected_weights = theirs(query, memory, memory, average_attn_weights=False)
        torch.testing.assert_close(ours(query, memory, memory), expected)
    torch.testing.assert_close(ours.attn, expected_weights)
    assert ours.attn.shape == (2, 4, 5, 7)


def test_multi_headed_attention_matches_torch_with_key_padding_mask():
    ours, theirs = mha_pair()
    x = torch.randn(2, 6, 16)
    keep = torch.tensor([[True] * 6, [True] * 2 + [False] * 4])
    with torch.no_grad():
        expected, _ = theirs(x, x, x, key_padding_mask=~keep)
        torch.testing.assert_close(ours(x, x, x, mask=keep.unsqueeze(1)), expected)


def test_multi_headed_attention_applies_a_per_query_mask_to_every_head():
    ours, theirs = mha_pair()
    x = torch.randn(2, 6, 16)
    mask = subsequent_mask(6).expand(2, 6, 6)  # (batch, n_q, n_k)
    with torch.no_grad():
        expected, _ = theirs(x, x, x, attn_mask=~subsequent_mask(6)[0])
        torch.testing.assert_close(ours(x, x, x, mask=mask), expected)


def test_multi_headed_attention_rejects_d_model_not_divisible_by_h():
    with pytest.raises(ValueError, match=r"d_model=512.*h=7"):
        MultiHeadedAttention(h=7, d_model=512)


def test_multi_headed_attention_rejects_unbroadcastable_mask():
    mha = MultiHeadedAttention(h=2, d_model=8)
    x = torch.randn(2, 5, 8)
    with pytest.raises(ValueError, match=r"mask of shape \(2, 1, 1, 4\)"):
        mha(x, x, x, mask=torch.ones(2, 1, 4, dtype=torch.bool))


# layer norm, sublayers, encoder layer ----------------------------------------------------------


def test_layer_norm_matches_torch_layer_norm():
    torch.manual_seed(0)
    ours, theirs = LayerNorm(12, eps=1e-6), nn.LayerNorm(12, eps=1e-6)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
        ours.bias.uniform_(-1, 1)
        theirs.load_state_dict(ours.state_dict())
    x = torch.randn(3, 4, 12) * 5 + 2
    torch.testing.assert_close(ours(x), theirs(x))
    assert set(dict(ours.named_parameters())) == {"weight", "bias"}


def test_layer_norm_uses_eps_inside_the_square_root():
    x = torch.tensor([[0.0, 0.0, 0.0, 1e-4]])  # variance far below eps
    torch.testing.assert_close(
        LayerNorm(4, eps=1e-2)(x), F.layer_norm(x, (4,), eps=1e-2), rtol=0, atol=1e-7
    )


def test_sublayer_connection_post_norm_normalizes_after_the_residual():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    post = SublayerConnection(8, dropout=0.0, norm_first=False)
    pre = SublayerConnection(8, dropout=0.0, norm_first=True)
    double = lambda t: 2 * t  # noqa: E731
    torch.testing.assert_close(post(x, double), F.layer_norm(3 * x, (8,), eps=1e-6))
    torch.testing.assert_close(pre(x, double), x + 2 * F.layer_norm(x, (8,), eps=1e-6))


def copy_attention(ours: MultiHeadedAttention, theirs: nn.MultiheadAttention) -> None:
    """Load our four projections into torch's packed in_proj and out_proj."""
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([lin.weight for lin in ours.linears[:3]]))
        theirs.in_proj_bias.copy_(torch.cat([lin.bias for lin in ours.linears[:3]]))
        theirs.out_proj.weight.copy_(ours.linears[3].weight)
        theirs.out_proj.bias.copy_(ours.linears[3].bias)


def copy_feed_forward_and_norms(ours: nn.Module, theirs: nn.Module, norms: list) -> None:
    """Load our feed-forward weights into torch's layer; give both the same random norms."""
    with torch.no_grad():
        theirs.linear1.load_state_dict(ours.feed_forward.w_1.state_dict())
        theirs.linear2.load_state_dict(ours.feed_forward.w_2.state_dict())
        for i, norm in enumerate(norms):
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-0.5, 0.5)
            ours.sublayer[i].norm.load_state_dict(norm.state_dict())


D_MODEL, H, D_FF = 16, 4, 32


@pytest.mark.parametrize("norm_first", [True, False])
def test_encoder_layer_matches_torch_transformer_encoder_layer(norm_first):
    torch.manual_seed(0)
    ours = EncoderLayer(
        D_MODEL,
        MultiHeadedAttention(H, D_MODEL, dropout=0.0),
        PositionwiseFeedForward(D_MODEL, D_FF, dropout=0.0),
        dropout=0.0,
        norm_first=norm_first,
    ).eval()
    theirs = nn.TransformerEncoderLayer(
        D_MODEL, H, dim_feedforward=D_FF, dropout=0.0, batch_first=True, norm_first=norm_first,
        activation="relu", layer_norm_eps=1e-6,
    ).eval()
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_feed_forward_and_norms(ours, theirs, [theirs.norm1, theirs.norm2])
    x = torch.randn(2, 6, D_MODEL)
    keep = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])
    with torch.no_grad():
        expected = theirs(x, src_key_padding_mask=~keep)
        torch.testing.assert_close(ours(x, keep.unsqueeze(1)), expected)


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_layer_matches_torch_transformer_decoder_layer(norm_first):
    torch.manual_seed(0)
    ours = DecoderLayer(
        D_MODEL,
        MultiHeadedAttention(H, D_MODEL, dropout=0.0),
        MultiHeadedAttention(H, D_MODEL, dropout=0.0),
        PositionwiseFeedForward(D_MODEL, D_FF, dropout=0.0),
        dropout=0.0,
        norm_first=norm_first,
    ).eval()
    theirs = nn.TransformerDecoderLayer(
        D_MODEL, H, dim_feedforward=D_FF, dropout=0.0, batch_first=True, norm_first=norm_first,
        activation="relu", layer_norm_eps=1e-6,
    ).eval()
    copy_attention(ours.self_attn, theirs.self_attn)
    copy_attention(ours.src_attn, theirs.multihead_attn)
    copy_feed_forward_and_norms(ours, theirs, [theirs.norm1, theirs.norm2, theirs.norm3])
    x, memory = torch.randn(2, 5, D_MODEL), torch.randn(2, 7, D_MODEL)
    src_keep = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    with torch.no_grad():
        expected = theirs(
            x, memory, tgt_mask=~subsequent_mask(5)[0], memory_key_padding_mask=~src_keep
        )
        got = ours(x, memory, src_mask=src_keep.unsqueeze(1), tgt_mask=subsequent_mask(5))
    torch.testing.assert_close(got, expected)


# masks and positions ---------------------------------------------------------------------------


def test_subsequent_mask_is_lower_triangular_bool():
    mask = subsequent_mask(5)
    assert mask.shape == (1, 5, 5) and mask.dtype == torch.bool
    assert torch.equal(mask[0], torch.ones(5, 5, dtype=torch.bool).tril())
    assert mask[0, 2, 2] and mask[0, 2, 0] and not mask[0, 2, 3]


def test_subsequent_mask_rejects_non_positive_size():
    with pytest.raises(ValueError, match="size must be at least 1"):
        subsequent_mask(0)


def test_subsequent_mask_rejects_a_float_size():
    with pytest.raises(TypeError, match="size must be an int"):
        subsequent_mask(3.0)


def test_subsequent_mask_accepts_tensor_sizes():
    assert torch.equal(subsequent_mask(torch.tensor(3)), subsequent_mask(3))


def test_positional_encoding_values_follow_the_formula():
    d_model = 10
    pe = PositionalEncoding(d_model, dropout=0.0, max_len=50).pe[0]
    for pos in (0, 1, 7, 49):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def test_positional_encoding_handles_odd_d_model():
    pe = PositionalEncoding(7, dropout=0.0, max_len=20).pe[0]
    assert pe.shape == (20, 7)
    assert pe[3, 6].item() == pytest.approx(math.sin(3 / 10000 ** (6 / 7)), abs=1e-6)


def test_positional_encoding_adds_the_table_to_the_input():
    module = PositionalEncoding(8, dropout=0.0, max_len=20)
    x = torch.randn(2, 5, 8)
    torch.testing.assert_close(module(x), x + module.pe[:, :5])


@pytest.mark.parametrize("module_type", [PositionalEncoding, LearnedPositionalEmbedding])
def test_position_modules_reject_sequences_longer_than_max_len(module_type):
    module = module_type(8, dropout=0.0, max_len=10)
    with pytest.raises(ValueError, match=r"11.*max_len=10"):
        module(torch.zeros(1, 11, 8))


def test_embeddings_scale_by_sqrt_d_model():
    embed = Embeddings(d_model=16, vocab=5)
    ids = torch.tensor([[0, 4, 2]])
    torch.testing.assert_close(embed(ids), embed.lut.weight[ids] * 4.0)


@pytest.mark.parametrize("bad", [5, -1])
def test_embeddings_reject_token_ids_outside_the_vocabulary(bad):
    with pytest.raises(ValueError, match=rf"token id {bad} is outside the vocabulary \[0, 5\)"):
        Embeddings(d_model=4, vocab=5)(torch.tensor([[0, bad]]))


def test_embeddings_reject_float_ids():
    with pytest.raises(TypeError, match="integer"):
        Embeddings(d_model=4, vocab=5)(torch.tensor([[0.0, 1.0]]))


# the full model --------------------------------------------------------------------------------


def count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def base_formula(vocab, N, d_model, d_ff, h):
    """Parameters of the tied pre-norm model, from the shapes of its parts."""
    attn = 4 * (d_model * d_model + d_model)
    ff = d_model * d_ff + d_ff + d_ff * d_model + d_model
    norm = 2 * d_model
    encoder = N * (attn + ff + 2 * norm) + norm
    decoder = N * (2 * attn + ff + 3 * norm) + norm
    return encoder + decoder + vocab * d_model + vocab  # shared embedding + generator bias


def test_base_model_parameter_count_matches_formula_and_paper():
    torch.manual_seed(0)
    model = make_model(37_000, 37_000, share_embeddings=True)
    n = count(model)
    assert n == base_formula(37_000, N=6, d_model=512, d_ff=2048, h=8) == 63_121_544
    assert abs(n - 65e6) / 65e6 < 0.05  # Table 3: 65M


def test_big_model_parameter_count_on_meta_device():
    with torch.device("meta"):
        model = make_model(37_000, 37_000, d_model=1024, d_ff=4096, h=16, share_embeddings=True)
    n = count(model)
    assert n == base_formula(37_000, N=6, d_model=1024, d_ff=4096, h=16)
    assert abs(n - 213e6) / 213e6 < 0.05  # Table 3: 213M


def test_post_norm_model_has_no_final_stack_norms():
    pre = make_model(11, 11, N=2, d_model=16, d_ff=32, h=2)
    post = make_model(11, 11, N=2, d_model=16, d_ff=32, h=2, norm_first=False)
    assert count(pre) - count(post) == 2 * 2 * 16
    assert all(not s.norm_first for s in post.modules() if isinstance(s, SublayerConnection))


def small_model(**options):
    torch.manual_seed(0)
    return make_model(11, 11, N=2, d_model=32, d_ff=64, h=4, **options).eval()


@pytest.mark.parametrize("norm_first", [True, False])
def test_decoder_output_at_i_ignores_target_tokens_after_i(norm_first):
    model = small_model(norm_first=norm_first)
    src = torch.randint(1, 11, (2, 7), generator=torch.Generator().manual_seed(0))
    src_mask = torch.ones(2, 1, 7, dtype=torch.bool)
    tgt = torch.randint(1, 11, (2, 6), generator=torch.Generator().manual_seed(1))
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] % 10) + 1  # every token after position 3 differs
    tgt_mask = subsequent_mask(6)
    with torch.no_grad():
        out = model(src, tgt, src_mask, tgt_mask)
        out_changed = model(src, changed, src_mask, tgt_mask)
    assert out.shape == (2, 6, 32)
    torch.testing.assert_close(out[:, :4], out_changed[:, :4])
    assert not torch.allclose(out[:, 4:], out_changed[:, 4:])


def test_model_keeps_the_classic_call_signatures():
    model = small_model()
    src, tgt = torch.tensor([[1, 2, 3, 4]]), torch.tensor([[1, 5, 6]])
    src_mask, tgt_mask = torch.ones(1, 1, 4, dtype=torch.bool), subsequent_mask(3)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        out = model.decode(memory, src_mask, tgt, tgt_mask)
        log_probs = model.generator(out)
        torch.testing.assert_close(model(src, tgt, src_mask, tgt_mask), out)
    assert memory.shape == (1, 4, 32) and out.shape == (1, 3, 32)
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(1, 3))


def test_share_embeddings_ties_one_parameter_and_accumulates_its_gradient():
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2, share_embeddings=True)
    shared = model.src_embed[0].lut.weight
    assert model.tgt_embed[0].lut.weight is shared and model.generator.proj.weight is shared
    assert sum(p is shared for p in model.parameters()) == 1
    src, tgt = torch.tensor([[1, 2, 3]]), torch.tensor([[4, 5]])
    out = model(src, tgt, torch.ones(1, 1, 3, dtype=torch.bool), subsequent_mask(2))
    model.generator.proj(out)[..., 7].sum().backward()  # logits: only row 7 of the output layer
    grad = shared.grad
    assert grad is not None
    # rows 1-3 are used only as source embeddings, rows 4-5 only as target embeddings, and the
    # generator's read of row 7 gives it a gradient too: all three uses land in one tensor
    assert all(grad[i].abs().sum() > 0 for i in (1, 2, 3, 4, 5, 7))
    assert grad[9].abs().sum() == 0


def test_share_embeddings_rejects_different_vocabularies():
    with pytest.raises(ValueError, match=r"src_vocab=11.*tgt_vocab=12"):
        make_model(11, 12, N=1, share_embeddings=True)


def test_untied_model_has_three_separate_tables():
    model = make_model(11, 11, N=1, d_model=16, d_ff=32, h=2)
    assert model.src_embed[0].lut.weight is not model.tgt_embed[0].lut.weight
    assert model.generator.proj.weight is not model.tgt_embed[0].lut.weight


def test_matrices_are_xavier_uniform_initialized():
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=64, d_ff=256, h=4)
    w = model.encoder.layers[0].feed_forward.w_1.weight  # (256, 64)
    bound = math.sqrt(6 / (64 + 256))
    assert w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    assert torch.equal(model.encoder.norm.weight, torch.ones(64))  # vectors keep their init


# greedy decoding -------------------------------------------------------------------------------


class ScriptedModel(nn.Module):
    """A stand-in for a model that emits a fixed script of tokens per sequence."""

    def __init__(self, scripts: list[list[int]], vocab: int = 10) -> None:
        super().__init__()
        self.scripts = scripts
        self.vocab = vocab
        self.generator = nn.Identity()
        self.calls = 0

    def encode(self, src, src_mask):
        return torch.zeros(src.size(0), src.size(1), 1)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        self.calls += 1
        step = tgt.size(1) - 1
        logits = torch.zeros(tgt.size(0), tgt.size(1), self.vocab)
        for b, script in enumerate(self.scripts):
            logits[b, -1, script[min(step, len(script) - 1)]] = 1.0
        return logits


def test_greedy_decode_stops_when_every_sequence_has_ended():
    model = ScriptedModel([[5, 2, 7, 7, 7, 7], [4, 4, 6, 2, 8, 8]])  # 2 is the end symbol
    src = torch.ones(2, 3, dtype=torch.long)
    ys = greedy_decode(model, src, torch.ones(2, 1, 3), max_len=10, start_symbol=1, end_symbol=2)
    assert ys.tolist() == [[1, 5, 2, 2, 2], [1, 4, 4, 6, 2]]
    assert model.calls == 4


def test_greedy_decode_runs_to_max_len_without_end_symbol():
    model = ScriptedModel([[5, 2, 7], [4]])
    ys = greedy_decode(model, torch.ones(2, 3, dtype=torch.long), None, max_len=6, start_symbol=1)
    assert ys.tolist() == [[1, 5, 2, 7, 7, 7], [1, 4, 4, 4, 4, 4]]


def test_greedy_decode_matches_one_sentence_at_a_time_on_a_real_model():
    model = small_model()
    src = torch.tensor([[1, 2, 3, 4, 5], [3, 1, 4, 1, 0]])
    src_mask = (src != 0).unsqueeze(-2)
    batch = greedy_decode(model, src, src_mask, max_len=8, start_symbol=1)
    assert batch.shape == (2, 8) and torch.all(batch[:, 0] == 1)
    for b in range(2):
        one = slice(b, b + 1)
        single = greedy_decode(model, src[one], src_mask[one], max_len=8, start_symbol=1)
        assert torch.equal(single[0], batch[b])


def test_greedy_decode_rejects_unbatched_source():
    with pytest.raises(ValueError, match=r"src must have shape \(batch, n_src\)"):
        greedy_decode(small_model(), torch.tensor([1, 2, 3]), None, max_len=5, start_symbol=1)
