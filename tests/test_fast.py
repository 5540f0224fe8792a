"""Chapter 21's fast paths give the readable path's results: cache, fused attention, loss."""

import copy

import pytest
import torch
import torch.nn.functional as F

from the_annotated_transformer import (
    DecoderCache,
    FastEmbeddings,
    FastLayerNorm,
    FastMultiHeadedAttention,
    LabelSmoothing,
    LayerNorm,
    MultiHeadedAttention,
    attention_maps,
    beam_search,
    beam_translate,
    greedy_decode,
    label_smoothing_loss,
    load_tokenizers,
    load_trained_model,
    make_model,
    make_variant,
    source_batch,
    subsequent_mask,
    tokenize,
    use_fast_path,
)

PAD = 2


def random_model(seed: int = 0, eos_bias: float = 3.0, **options) -> torch.nn.Module:
    """A small untrained model whose generator favours </s> (id 1), so sentences end."""
    torch.manual_seed(seed)
    options = {"N": 2, "d_model": 32, "d_ff": 64, "h": 4, **options}
    model = make_model(30, 30, **options).eval()
    with torch.no_grad():
        model.generator.proj.bias[1] += eos_bias
    return model


def padded_source(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 30, (5, 9), generator=g)
    src[1, 6:] = src[3, 3:] = PAD
    return src, (src != PAD).unsqueeze(-2)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("end_symbol", [1, None])
@pytest.mark.parametrize("norm_first", [True, False])
def test_cached_greedy_decode_gives_the_recomputed_ids_on_random_models(seed, end_symbol,
                                                                         norm_first):
    model = random_model(seed, norm_first=norm_first)
    src, src_mask = padded_source(seed)
    expected = greedy_decode(model, src, src_mask, 16, 0, end_symbol=end_symbol)
    got = greedy_decode(model, src, src_mask, 16, 0, end_symbol=end_symbol, use_cache=True)
    assert torch.equal(got, expected)


def test_cached_greedy_decode_ends_with_the_last_sentence_and_pads_with_end_symbol():
    model = random_model(0, eos_bias=2.0)
    src, src_mask = padded_source(0)
    got = greedy_decode(model, src, src_mask, 40, 0, end_symbol=1, use_cache=True)
    ended = (got == 1).any(dim=1)
    assert ended.all() and got.size(1) < 40  # every sentence ended before max_len
    last = got[:, -1]
    assert (last == 1).all() and (got[:, -2] != 1).any()  # the longest ends at the last step
    assert torch.equal(got, greedy_decode(model, src, src_mask, 40, 0, end_symbol=1))


def test_cached_greedy_decode_works_with_learned_positions_and_without_a_mask():
    torch.manual_seed(0)
    model = make_variant(30, 30, N=2, d_model=32, d_ff=64, h=4, positions="learned").eval()
    src = torch.randint(3, 30, (3, 6))
    expected = greedy_decode(model, src, None, 10, 0)
    assert torch.equal(greedy_decode(model, src, None, 10, 0, use_cache=True), expected)


@pytest.mark.parametrize("beam_size", [1, 2, 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_cached_beam_search_gives_the_recomputed_output_on_random_models(beam_size, seed):
    model = random_model(seed)
    src, src_mask = padded_source(seed)
    limits = torch.tensor([5, 12, 1, 9, 12])  # one sentence per limit, one allows nothing
    kwargs = {"max_len": limits, "start_symbol": 0, "end_symbol": 1, "beam_size": beam_size}
    ids, scores = beam_search(model, src, src_mask, **kwargs)
    got_ids, got_scores = beam_search(model, src, src_mask, use_cache=True, **kwargs)
    assert torch.equal(got_ids, ids)
    assert torch.allclose(got_scores, scores, atol=1e-5)


def test_decoder_cache_select_keeps_and_reorders_rows():
    model = random_model(0)
    src, src_mask = padded_source(0)
    cache = DecoderCache(model, model.encode(src, src_mask), src_mask)
    index = torch.tensor([3, 0, 0])
    before = [t.clone() for t in cache.cross_k]
    cache.select(index)
    assert cache.src_mask.shape == (3, 1, 1, 9)
    assert all(torch.equal(new, old[index]) for new, old in zip(cache.cross_k, before,
                                                                strict=True))


@pytest.fixture(scope="module")
def shipped():
    model, vocab_src, vocab_tgt, _ = load_trained_model()
    german = load_tokenizers()[0]
    sentences = ["Ein Hund rennt über eine grüne Wiese.", "Zwei Männer arbeiten an einem Dach.",
                 "Eine Gruppe von Kindern spielt Fußball am Strand.", "Ein Mann schläft.",
                 "Eine ältere Frau mit Brille verkauft Obst auf einem Markt in der Stadt."]
    ids = [vocab_src.encode(tokenize(s, german)) for s in sentences]
    src, src_mask = source_batch(ids, device=torch.device("cpu"))
    return model, vocab_src, vocab_tgt, german, sentences, src, src_mask


def test_cached_decoding_gives_the_shipped_models_tokens_greedy_and_beam(shipped):
    model, _, _, _, _, src, src_mask = shipped
    greedy = greedy_decode(model, src, src_mask, 72, 0, end_symbol=1)
    assert (greedy == 1).any(dim=1).all()  # real translations that end
    assert torch.equal(greedy_decode(model, src, src_mask, 72, 0, end_symbol=1, use_cache=True),
                       greedy)
    kwargs = {"max_len": 60, "start_symbol": 0, "end_symbol": 1, "beam_size": 4}
    ids, scores = beam_search(model, src, src_mask, **kwargs)
    got_ids, got_scores = beam_search(model, src, src_mask, use_cache=True, **kwargs)
    assert torch.equal(got_ids, ids) and torch.allclose(got_scores, scores, atol=1e-4)


@pytest.mark.parametrize("d_k", [3, 12])
def test_cached_decoders_work_with_a_key_size_of_its_own(d_k):
    # chapter 19's KeySizeAttention: queries and keys d_k wide, values d_model / h = 8 wide
    torch.manual_seed(0)
    model = make_variant(30, 30, N=2, d_model=32, d_ff=64, h=4, d_k=d_k).eval()
    with torch.no_grad():
        model.generator.proj.bias[1] += 3.0
    src, src_mask = padded_source(0)
    expected = greedy_decode(model, src, src_mask, 12, 0, end_symbol=1)
    assert torch.equal(greedy_decode(model, src, src_mask, 12, 0, end_symbol=1, use_cache=True),
                       expected)
    beams = [beam_search(model, src, src_mask, max_len=12, start_symbol=0, end_symbol=1,
                         use_cache=cache)[0] for cache in (False, True)]
    assert torch.equal(*beams)


def test_cached_beam_translate_gives_the_same_english(shipped):
    model, vocab_src, vocab_tgt, german, sentences, _, _ = shipped
    plain = beam_translate(model, sentences, vocab_src, vocab_tgt, german)
    assert beam_translate(model, sentences, vocab_src, vocab_tgt, german, use_cache=True) == plain


def test_fast_path_decodes_the_shipped_models_greedy_tokens(shipped):
    model, _, _, _, _, src, src_mask = shipped
    greedy = greedy_decode(model, src, src_mask, 72, 0, end_symbol=1)
    fast = use_fast_path(copy.deepcopy(model))
    for cache in (False, True):
        assert torch.equal(greedy_decode(fast, src, src_mask, 72, 0, end_symbol=1,
                                         use_cache=cache), greedy)


def masked_batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    src, tgt = torch.randint(3, 30, (4, 9), generator=g), torch.randint(3, 30, (4, 7), generator=g)
    src[1, 5:] = tgt[2, 3:] = tgt[0, 6:] = PAD
    tgt_mask = (tgt != PAD).unsqueeze(-2) & subsequent_mask(7)
    return src, tgt, (src != PAD).unsqueeze(-2), tgt_mask


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("norm_first", [True, False])
def test_fast_path_equals_readable_path_outputs_and_gradients(training, norm_first):
    torch.manual_seed(0)
    readable = make_model(30, 30, N=2, d_model=32, d_ff=64, h=4, dropout=0.0,
                          norm_first=norm_first)
    fast = use_fast_path(copy.deepcopy(readable))
    src, tgt, src_mask, tgt_mask = masked_batch()
    results = []
    for model in (readable, fast):
        model.train(training)
        out = model(src, tgt, src_mask, tgt_mask)
        loss = model.generator(out).logsumexp(-1).sum() + out.pow(2).sum()
        grads = torch.autograd.grad(loss, list(model.parameters()))
        results.append((out, grads))
    (out_r, grads_r), (out_f, grads_f) = results
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-5)
    for g_f, g_r in zip(grads_f, grads_r, strict=True):
        torch.testing.assert_close(g_f, g_r, atol=1e-4, rtol=1e-4)


def test_fast_attention_equals_readable_attention_with_a_float_mask_and_padding():
    torch.manual_seed(0)
    readable = MultiHeadedAttention(4, 32, dropout=0.0).eval()
    fast = use_fast_path(copy.deepcopy(readable))
    x = torch.randn(3, 6, 32)
    mask = torch.ones(3, 1, 6)
    mask[0, :, 4:] = 0  # a float mask: 0 = hidden, as the readable module reads it
    torch.testing.assert_close(fast(x, x, x, mask), readable(x, x, x, mask))
    torch.testing.assert_close(fast.attn, readable.attn)


@pytest.mark.parametrize("inputs", ["self", "memory", "separate"])
def test_fast_attention_packs_projections_without_changing_outputs_or_gradients(inputs):
    torch.manual_seed(0)
    readable = MultiHeadedAttention(4, 32, dropout=0.0)
    fast = use_fast_path(copy.deepcopy(readable))
    x, m, v = torch.randn(3, 5, 32), torch.randn(3, 7, 32), torch.randn(3, 7, 32)
    args = {"self": (x, x, x), "memory": (x, m, m), "separate": (x, m, v)}[inputs]
    results = []
    for module in (readable, fast):
        out = module(*args)
        results.append((out, torch.autograd.grad(out.pow(2).sum(), list(module.parameters()))))
    (out_r, grads_r), (out_f, grads_f) = results
    torch.testing.assert_close(out_f, out_r, atol=1e-5, rtol=1e-5)
    for g_f, g_r in zip(grads_f, grads_r, strict=True):  # each of W^Q, W^K, W^V its own
        torch.testing.assert_close(g_f, g_r, atol=1e-4, rtol=1e-4)


def test_fast_layer_norm_equals_chapter_2s_layer_norm_and_switches_back():
    torch.manual_seed(0)
    readable = LayerNorm(16)
    with torch.no_grad():
        readable.weight.uniform_(0.5, 1.5), readable.bias.uniform_(-1, 1)
    fast = use_fast_path(copy.deepcopy(readable))
    assert type(fast) is FastLayerNorm
    x = torch.randn(4, 3, 16) * 5 + 2
    results = []
    for module in (readable, fast):
        out = module(x)
        results.append((out, torch.autograd.grad(out.sin().sum(), list(module.parameters()))))
    torch.testing.assert_close(results[1][0], results[0][0], atol=1e-5, rtol=1e-5)
    for g_f, g_r in zip(results[1][1], results[0][1], strict=True):
        torch.testing.assert_close(g_f, g_r, atol=1e-4, rtol=1e-4)
    assert type(use_fast_path(fast, False)) is LayerNorm


def test_decoder_cache_copies_the_memory_only_when_the_rows_sentences_change():
    model = random_model(0)
    src, src_mask = padded_source(0)
    memory = model.encode(src, src_mask)
    cache = DecoderCache(model, memory, src_mask)
    cache.select(torch.tensor([0, 0, 2, 2]))  # two hypotheses each for sentences 0 and 2
    shared = cache.cross_k
    cache.select(torch.tensor([1, 0, 3, 3]))  # reordered within each sentence: nothing to copy
    assert cache.cross_k is shared
    cache.select(torch.tensor([2, 3]))  # sentence 0 is done: the memory's rows follow
    assert cache.sentence.tolist() == [2, 2] and cache.src_mask.shape == (2, 1, 1, 9)
    fresh = DecoderCache(model, memory, src_mask)
    for got, full in zip(cache.cross_v, fresh.cross_v, strict=True):
        assert torch.equal(got, full[[2, 2]])


def test_fast_attention_keeps_no_weights_until_read_and_attention_maps_still_work():
    torch.manual_seed(0)
    readable = make_model(30, 30, N=2, d_model=32, d_ff=64, h=4)
    fast = use_fast_path(copy.deepcopy(readable))
    src, tgt, _, _ = masked_batch()
    tgt[:, 0] = 0
    maps_r, maps_f = attention_maps(readable, src, tgt), attention_maps(fast, src, tgt)
    for a, b in zip(maps_r, maps_f, strict=True):
        for kind in ("encoder", "decoder", "cross"):
            torch.testing.assert_close(getattr(b, kind), getattr(a, kind), atol=1e-6, rtol=1e-5)
    layer = fast.decoder.layers[0].self_attn
    assert "attn" not in vars(layer) or vars(layer)["attn"] is None  # nothing stored
    layer.attn = None
    assert layer.attn is None
    with pytest.raises(ValueError, match="computes .attn itself"):
        layer.attn = torch.zeros(1)


def test_state_dict_loads_across_paths_and_switching_back_restores_the_readable_classes():
    torch.manual_seed(0)
    readable = make_model(30, 30, N=2, d_model=32, d_ff=64, h=4)
    torch.manual_seed(1)
    fast = use_fast_path(make_model(30, 30, N=2, d_model=32, d_ff=64, h=4))
    assert list(fast.state_dict()) == list(readable.state_dict())
    fast.load_state_dict(readable.state_dict())  # strict: same names and shapes
    src, tgt, src_mask, tgt_mask = masked_batch()
    readable.eval(), fast.eval()
    torch.testing.assert_close(fast(src, tgt, src_mask, tgt_mask),
                               readable(src, tgt, src_mask, tgt_mask), atol=1e-5, rtol=1e-5)
    assert isinstance(fast.src_embed[0], FastEmbeddings)
    assert isinstance(fast.encoder.layers[0].self_attn, FastMultiHeadedAttention)
    use_fast_path(fast, False)
    assert type(fast.src_embed[0]).__name__ == "Embeddings"
    assert type(fast.encoder.layers[0].self_attn) is MultiHeadedAttention


def test_fast_embeddings_still_reject_an_id_outside_the_vocabulary():
    fast = use_fast_path(make_model(30, 30, N=1, d_model=16, d_ff=32, h=2))
    with pytest.raises(IndexError):
        fast.src_embed[0](torch.tensor([[1, 30]]))


@pytest.mark.parametrize("smoothing", [0.0, 0.1, 0.4])
def test_label_smoothing_loss_equals_label_smoothing_value_and_gradient(smoothing):
    V = 25
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, V, generator=g, requires_grad=True)
    target = torch.randint(0, V, (40,), generator=g)
    target[:6] = PAD
    book = LabelSmoothing(V, PAD, smoothing)(logits.log_softmax(-1), target)
    fused = label_smoothing_loss(logits, target, padding_idx=PAD, smoothing=smoothing)
    from_log_probs = label_smoothing_loss(logits.log_softmax(-1), target, padding_idx=PAD,
                                          smoothing=smoothing)
    torch.testing.assert_close(fused, book)
    torch.testing.assert_close(from_log_probs, book)
    (g_book,), (g_fused,) = (torch.autograd.grad(x, logits) for x in (book, fused))
    torch.testing.assert_close(g_fused, g_book, atol=1e-6, rtol=1e-5)


def test_plain_cross_entropy_label_smoothing_differs_by_more_than_a_constant():
    V = 25
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(40, V, generator=g, requires_grad=True)
    target = torch.randint(3, V, (40,), generator=g)
    book = LabelSmoothing(V, PAD, 0.1)(logits.log_softmax(-1), target)
    plain = F.cross_entropy(logits, target, ignore_index=PAD, label_smoothing=0.1,
                            reduction="sum")
    (g_book,), (g_plain,) = (torch.autograd.grad(x, logits) for x in (book, plain))
    assert (g_book - g_plain).abs().max() > 1e-3  # a constant would leave the gradient alone
    # what differs: torch's target gives the padding column 0.1 / V, LabelSmoothing's none
    torch.testing.assert_close(g_book[:, PAD] - g_plain[:, PAD], torch.full((40,), 0.1 / V))


def test_label_smoothing_loss_rejects_smoothing_too_large_for_the_vocabulary():
    with pytest.raises(ValueError, match="smoothing=0.9 is too large for a vocabulary of 3"):
        label_smoothing_loss(torch.randn(2, 3), torch.tensor([0, 1]), padding_idx=2,
                             smoothing=0.9)
