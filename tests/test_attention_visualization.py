"""Chapter 24: capturing attention maps, their long-form records, and the charts drawn from them."""

import pytest
import torch

from the_annotated_transformer import (
    ATTENTION_KINDS,
    AttentionMaps,
    attention_chart,
    attention_maps,
    attention_records,
    attention_summary,
    attention_summary_chart,
    make_model,
)


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return make_model(11, 11, N=2, d_model=32, d_ff=64, h=4, dropout=0.5)


SRC = torch.tensor([[0, 5, 6, 7, 1], [0, 8, 1, 2, 2]])  # (batch, n_src), 2 = padding
TGT = torch.tensor([[0, 4, 9, 3], [0, 10, 2, 2]])  # (batch, n_tgt)


def test_attention_maps_have_layers_heads_rows_and_columns_of_each_kind():
    maps = attention_maps(tiny_model(), SRC, TGT)
    assert [tuple(m.encoder.shape) for m in maps] == [(2, 4, 5, 5), (2, 4, 3, 3)]
    assert [tuple(m.decoder.shape) for m in maps] == [(2, 4, 4, 4), (2, 4, 2, 2)]
    assert [tuple(m.cross.shape) for m in maps] == [(2, 4, 4, 5), (2, 4, 2, 3)]
    assert maps[1].src_tokens == ["0", "8", "1"] and maps[1].tgt_tokens == ["0", "10"]


def test_each_row_of_attention_sums_to_one_over_real_positions_and_the_decoder_is_causal():
    for m in attention_maps(tiny_model(), SRC, TGT):
        for kind in ATTENTION_KINDS:
            weights, rows, cols = m.axes(kind)
            assert weights.shape[-2:] == (len(rows), len(cols))
            torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
        assert (m.decoder.triu(diagonal=1) == 0).all()


def test_padded_batch_gives_the_maps_of_each_sentence_alone_in_eval_mode():
    model = tiny_model()  # dropout 0.5: the maps must come from evaluation mode
    batch = attention_maps(model, SRC, TGT)
    assert model.training, "attention_maps must leave the model in the mode it found it"
    alone = attention_maps(model, SRC[1:, :3], TGT[1:, :2])[0]
    for kind in ATTENTION_KINDS:
        torch.testing.assert_close(batch[1].axes(kind)[0], alone.axes(kind)[0])


def test_attention_maps_match_a_direct_computation_of_the_first_encoder_head():
    model = tiny_model().eval()
    m = attention_maps(model, SRC[:1], TGT[:1])[0]
    layer = model.encoder.layers[0]
    x = layer.sublayer[0].norm(model.src_embed(SRC[:1]))  # pre-norm input of the first layer
    q = layer.self_attn.linears[0](x)[..., :8]  # head 0: the first d_k = 8 features
    k = layer.self_attn.linears[1](x)[..., :8]
    expected = torch.softmax(q @ k.transpose(-2, -1) / 8**0.5, dim=-1)[0]  # (n_src, n_src)
    torch.testing.assert_close(m.encoder[0, 0], expected.detach())


def test_padding_inside_a_sentence_or_mismatched_tokens_raise_value_error():
    model = tiny_model()
    with pytest.raises(ValueError, match="followed only by padding"):
        attention_maps(model, torch.tensor([[0, 2, 5, 1]]), TGT[:1])
    with pytest.raises(ValueError, match="src_tokens"):
        attention_maps(model, SRC[:1], TGT[:1], src_tokens=[["<s>", "a"]])
    with pytest.raises(ValueError, match="batch, n_src"):
        attention_maps(model, SRC[0], TGT[0])


def hand_made_maps() -> AttentionMaps:
    """One layer, one head; the source repeats the token "a" at positions 0 and 2."""
    encoder = torch.tensor([[[[0.5, 0.25, 0.25], [0.0, 1.0, 0.0], [0.1234, 0.0, 0.8766]]]])
    decoder = torch.tensor([[[[1.0, 0.0], [0.4, 0.6]]]])
    cross = torch.tensor([[[[0.2, 0.3, 0.5], [0.7, 0.0002, 0.2998]]]])
    return AttentionMaps(encoder, decoder, cross, ["a", "b", "a"], ["<s>", "x"])


def test_records_line_up_tokens_with_rows_and_columns_keeping_repeats_apart():
    records = attention_records(hand_made_maps(), kinds=("encoder",), sentence=7)
    triples = [(r["row"], r["row_token"], r["col"], r["col_token"], r["weight"]) for r in records]
    assert triples == [
        (0, "a", 0, "a", 0.5), (0, "a", 1, "b", 0.25), (0, "a", 2, "a", 0.25),
        (1, "b", 0, "a", 0.0), (1, "b", 1, "b", 1.0), (1, "b", 2, "a", 0.0),
        (2, "a", 0, "a", 0.123), (2, "a", 1, "b", 0.0), (2, "a", 2, "a", 0.877),
    ]
    assert {(r["kind"], r["layer"], r["head"], r["sentence"]) for r in records} == {
        ("encoder", 1, 1, 7)
    }


def test_records_of_cross_attention_have_target_rows_and_source_columns():
    records = attention_records(hand_made_maps(), kinds=("cross",), min_weight=0.01)
    triples = [(r["row_token"], r["col"], r["col_token"], r["weight"]) for r in records]
    # (1, 1) rounds to 0.0 and is left out; the first row and column are always kept
    assert triples == [
        ("<s>", 0, "a", 0.2), ("<s>", 1, "b", 0.3), ("<s>", 2, "a", 0.5),
        ("x", 0, "a", 0.7), ("x", 2, "a", 0.3),
    ]


def test_chart_has_a_widget_per_control_and_embeds_the_data_once():
    records = attention_records(hand_made_maps(), sentence=1)
    records += attention_records(hand_made_maps(), sentence=2)
    spec = attention_chart(records, controls=("sentence", "kind", "layer", "head")).to_dict()
    params = {p["name"]: p for p in spec["params"]}
    assert set(params) == {"pick_sentence", "pick_kind", "pick_layer", "pick_head"}
    assert params["pick_kind"]["bind"]["options"] == ["encoder", "decoder", "cross"]
    assert params["pick_sentence"]["bind"]["input"] == "radio"
    datasets = list(spec.get("datasets", {}).values())
    inline = [spec["data"]["values"]] if "values" in spec.get("data", {}) else []
    (csv_text,) = datasets + inline  # exactly one copy of the data
    assert csv_text.count("\n") == len(records) + 1  # a header and one line per record
    filters = [t["filter"] for t in spec["transform"] if "filter" in t]
    assert filters == [
        "datum['sentence'] == pick_sentence && datum['kind'] == pick_kind && "
        "datum['layer'] == pick_layer && datum['head'] == pick_head"
    ]


def test_chart_rejects_controls_that_are_not_fields():
    with pytest.raises(ValueError, match="step"):
        attention_chart(attention_records(hand_made_maps()), controls=("step",))


def test_summary_gives_entropy_in_bits_and_mean_distance():
    summary = {r["kind"]: r for r in attention_summary([hand_made_maps()])}
    # encoder rows: 1.5 bits, 0 bits and H(0.1234, 0.8766); distances 0.75, 0, 2 * 0.1234
    h3 = -(0.1234 * torch.tensor(0.1234).log2() + 0.8766 * torch.tensor(0.8766).log2())
    assert summary["encoder"]["entropy"] == pytest.approx((1.5 + 0 + float(h3)) / 3, abs=1e-3)
    assert summary["encoder"]["distance"] == pytest.approx((0.75 + 0 + 0.2468) / 3, abs=1e-3)
    assert summary["decoder"]["distance"] == pytest.approx(0.4 / 2, abs=1e-3)
    spec = attention_summary_chart(list(summary.values())).to_dict()
    assert len(spec["hconcat"]) == 3


def test_translation_attention_labels_words_as_written_and_rows_by_the_model_output():
    from the_annotated_transformer import Vocab, load_tokenizers, translation_attention

    tokenizer_de, _ = load_tokenizers()
    vocab_src = Vocab(["<s>", "</s>", "<blank>", "<unk>", "ein", "Hund", "."])
    vocab_tgt = Vocab(["<s>", "</s>", "<blank>", "<unk>", "a", "dog", "."])
    torch.manual_seed(0)
    model = make_model(len(vocab_src), len(vocab_tgt), N=1, d_model=16, d_ff=32, h=2)
    long, short = translation_attention(
        model, ["ein Hund rennt .", "Hund"], vocab_src, vocab_tgt, tokenizer_de, max_len=6
    )
    assert long.src_tokens == ["<s>", "ein", "Hund", "rennt", ".", "</s>"]  # not <unk>
    assert short.src_tokens == ["<s>", "Hund", "</s>"]
    for maps in (long, short):
        assert maps.tgt_tokens[0] == "<s>" and "</s>" not in maps.tgt_tokens
        assert 1 <= len(maps.tgt_tokens) <= 6  # <s> and at most max_len - 1 produced tokens
        assert maps.cross.shape == (1, 2, len(maps.tgt_tokens), len(maps.src_tokens))
    with pytest.raises(TypeError, match="list of strings"):
        translation_attention(model, "ein Hund", vocab_src, vocab_tgt, tokenizer_de)
    with pytest.raises(ValueError, match="empty"):
        translation_attention(model, [""], vocab_src, vocab_tgt, tokenizer_de)
