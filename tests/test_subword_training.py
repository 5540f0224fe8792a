"""Training on one joint subword vocabulary with tied embeddings (chapters 14, 17 and 18)."""

from dataclasses import replace

import pytest
import torch
from tiny_training import synthetic_sentence_pairs

from the_annotated_transformer import (
    SUBWORD_FILE,
    TrainConfig,
    export_for_shipping,
    load_checkpoint,
    load_trained_model,
    multi30k_vocabularies,
    read_vocabularies,
    train_worker,
    training_config,
    translate,
)

# Injected pairs with punctuation, digits, umlauts and repeated spaces, so that the round trip
# has something to get wrong.
EXTRA = [("Zwei  Männer (beide 30) spielen Fußball.", "Two  men (both 30) play soccer."),
         ("Ein Mädchen isst ein Eis - lecker!", "A girl eats an ice cream - yummy!")]
PAIRS = {"train": synthetic_sentence_pairs(240, 0) + EXTRA * 20,
         "val": synthetic_sentence_pairs(40, 1)}
TINY = TrainConfig(
    N=1, d_model=32, d_ff=64, h=4, dropout=0.1, max_tokens=300, epochs=2, warmup=5,
    subwords=320, share_embeddings=True, bleu_every=1,
)
RUN = {"progress": False, "threads": 1, "pairs": PAIRS}


def test_cpu_subword_preset_is_the_cpu_preset_with_one_tied_subword_vocabulary():
    cpu, subword = training_config("cpu"), training_config("cpu_subword")
    assert subword.subwords == 8000 and subword.share_embeddings
    assert replace(subword, subwords=0, share_embeddings=False,
                   checkpoint_dir=cpu.checkpoint_dir) == cpu  # the same budget otherwise
    with pytest.raises(ValueError, match="share_embeddings=True needs one joint vocabulary"):
        TrainConfig(share_embeddings=True)
    with pytest.raises(ValueError, match="subwords must be an integer >= 0"):
        TrainConfig(subwords=-1)


def test_the_joint_subword_vocabulary_round_trips_text_exactly_and_is_saved(tmp_path):
    config = replace(TINY, checkpoint_dir=str(tmp_path))
    vocab_src, vocab_tgt = multi30k_vocabularies(config, (None, None), pairs=PAIRS["train"])
    assert vocab_src is vocab_tgt and len(vocab_src) == 320  # one vocabulary, both languages
    texts = [s for pair in PAIRS["val"] + EXTRA for s in pair] + ["Ünbekannt: ½ € 🙂 “Zitat”"]
    for text in texts:
        ids = vocab_src.encode(text)
        assert vocab_tgt.decode(ids) == text  # unseen characters come back as bytes
    assert sorted(p.name for p in tmp_path.iterdir()) == [SUBWORD_FILE]
    read_src, read_tgt = read_vocabularies(tmp_path, subwords=True)
    assert read_src.encode(texts[0]) == vocab_src.encode(texts[0])
    with pytest.raises(FileNotFoundError, match="vocab_de.json"):
        read_vocabularies(tmp_path)  # a word-level reader does not take the subword file
    (tmp_path / SUBWORD_FILE).write_bytes(b"not a model")
    with pytest.raises(ValueError, match="is not a readable sentencepiece model"):
        read_vocabularies(tmp_path, subwords=True)


def test_a_subword_run_ties_three_matrices_resumes_ships_and_translates_plain_text(tmp_path):
    config = replace(TINY, checkpoint_dir=str(tmp_path / "run"))
    train_worker(0, 1, replace(config, epochs=1), **RUN)
    history = train_worker(0, 1, config, resume=True, **RUN)  # reads subwords.model back
    assert [r["epoch"] for r in history] == [1, 2]
    state = load_checkpoint(tmp_path / "run" / "last.pt")["model"]
    tied = ("src_embed.0.lut.weight", "tgt_embed.0.lut.weight", "generator.proj.weight")
    assert all(torch.equal(state[tied[0]], state[name]) for name in tied)

    export_for_shipping(tmp_path / "run" / "last.pt", tmp_path / "ship")
    stored = torch.load(tmp_path / "ship" / "model.pt", weights_only=True)["model"]
    assert len({stored[name].data_ptr() for name in tied}) == 1  # stored once, not three times
    model, vocab_src, vocab_tgt, loaded = load_trained_model(tmp_path / "ship")
    assert loaded.subwords == 320 and vocab_src is vocab_tgt
    weight = model.src_embed[0].lut.weight
    assert model.tgt_embed[0].lut.weight is weight and model.generator.proj.weight is weight
    with torch.no_grad():
        weight[5, 0] = 7.0  # one tensor: the change shows in all three uses
    assert model.tgt_embed[0].lut.weight[5, 0] == 7.0 == model.generator.proj.weight[5, 0]
    outputs = translate(model, [de for de, _ in PAIRS["val"][:8]] + [""], vocab_src, vocab_tgt,
                        None)
    assert outputs[-1] == "" and any(outputs)
    assert not any(mark in text for text in outputs for mark in ("▁", "<s>", "<unk>", "<blank>"))
