"""The trained Multi30k model that the book ships (book/models/multi30k_cpu)."""

import json

import pytest
import torch

from the_annotated_transformer import (
    bleu,
    load_multi30k,
    load_tokenizers,
    load_trained_model,
    shipped_model_dir,
    translate,
)

FOLDER = shipped_model_dir()


def test_shipped_model_is_small_half_precision_and_loads_with_weights_only():
    weights = FOLDER / "model.pt"
    assert weights.stat().st_size < 30e6, "the shipped weights must stay under 30 MB"
    state = torch.load(weights, weights_only=True, map_location="cpu")
    floats = [t for t in state["model"].values() if t.is_floating_point()]
    assert floats and all(t.dtype == torch.float16 for t in floats)
    info = json.loads((FOLDER / "info.json").read_text())
    assert info["command"].startswith("python tools/train.py --config cpu")
    assert info["training_seconds"] > 0 and info["hardware"]


@pytest.fixture(scope="module")
def shipped():
    torch.manual_seed(0)
    return load_trained_model()


def test_shipped_model_scores_at_least_30_bleu_on_the_first_200_test_sentences(shipped):
    model, vocab_src, vocab_tgt, _ = shipped
    pairs = load_multi30k("test_2016_flickr")[:200]
    hypotheses = translate(model, [de for de, _ in pairs], vocab_src, vocab_tgt,
                           load_tokenizers()[0])
    score, signature = bleu(hypotheses, [en for _, en in pairs])
    print(f"BLEU {score:.2f} ({signature})")
    assert score >= 30, f"BLEU {score:.2f} on test_2016_flickr[:200] is below 30"
