"""Chapter 14: checkpoints, resuming, distributed training, translation, BLEU and the scripts."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_training import synthetic_examples, tiny_setup

from the_annotated_transformer import (
    TrainConfig,
    TrainState,
    Vocab,
    bleu,
    detokenize,
    device_report,
    export_for_shipping,
    free_port,
    load_checkpoint,
    load_tokenizers,
    load_trained_model,
    make_model,
    multi30k_loader,
    save_checkpoint,
    train_epoch,
    train_worker,
    training_config,
    translate,
)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "multi30k"
needs_multi30k = pytest.mark.skipif(
    not SHARED.is_dir() and not os.environ.get("MULTI30K_DIR"),
    reason=f"no copy of Multi30k at {SHARED} or in MULTI30K_DIR",
)

TINY = TrainConfig(
    N=1, d_model=32, d_ff=64, h=4, dropout=0.1, max_tokens=300, epochs=3, warmup=20,
    train_limit=240, val_limit=40,
)


# --- checkpoints --------------------------------------------------------------------------


def test_save_checkpoint_round_trips_tensors_and_plain_values(tmp_path):
    state = {"model": {"w": torch.randn(3, 4)}, "epoch": 2,
             "rng": [{"torch": torch.get_rng_state(), "cuda": None}],
             "config": {"N": 1, "name": "tiny", "limit": None}}
    save_checkpoint(state, tmp_path / "last.pt")
    loaded = load_checkpoint(tmp_path / "last.pt")
    assert torch.equal(loaded["model"]["w"], state["model"]["w"])
    assert torch.equal(loaded["rng"][0]["torch"], state["rng"][0]["torch"])
    assert loaded["config"] == state["config"] and loaded["epoch"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left


class _FailsWhilePickled:
    def __reduce__(self):
        raise RuntimeError("killed while writing")


def test_failed_save_leaves_previous_checkpoint_and_no_partial_file(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"model": {"w": torch.ones(2)}, "epoch": 1}, path)
    with pytest.raises(RuntimeError, match="killed while writing"):
        save_checkpoint({"model": {"w": torch.zeros(2)}, "epoch": 2, "x": _FailsWhilePickled()},
                        path)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert load_checkpoint(path)["epoch"] == 1


def test_truncated_checkpoint_raises_error_naming_the_file(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"model": {"w": torch.randn(100)}, "epoch": 1}, path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(ValueError, match=r"checkpoint .*last\.pt is truncated or corrupted"):
        load_checkpoint(path)
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=str(path).replace(".", r"\.")):
        load_checkpoint(path)


class _Arbitrary:
    pass


def test_load_checkpoint_refuses_arbitrary_objects_as_weights_only_does(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": {}, "payload": _Arbitrary()}, path)  # loadable only by full unpickling
    with pytest.raises(ValueError, match="evil.pt"):
        load_checkpoint(path)


def test_missing_checkpoint_raises_file_not_found_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing.pt"):
        load_checkpoint(tmp_path / "nothing.pt")


def test_training_config_presets_and_validation():
    cpu, base = training_config("cpu"), training_config("base")
    assert (base.N, base.d_model, base.d_ff, base.h, base.dropout) == (6, 512, 2048, 8, 0.1)
    assert cpu.label_smoothing == base.label_smoothing == 0.1
    assert training_config("cpu", epochs=2).epochs == 2
    with pytest.raises(ValueError, match="d_model=100 is not divisible by h=8"):
        training_config("cpu", d_model=100)
    with pytest.raises(ValueError, match="name must be one of cpu, base"):
        training_config("gpu")
    with pytest.raises(ValueError, match="keep_epochs must be an integer >= 0, got -1"):
        training_config("cpu", keep_epochs=-1)


def test_train_worker_refuses_a_batch_too_small_to_share_before_starting_processes():
    config = replace(TINY, max_tokens=100)  # 50 per rank for two ranks, less than max_len=72
    with pytest.raises(ValueError, match="max_tokens=100 shared by world_size=2 processes"):
        train_worker(0, 2, config, progress=False)


# --- resuming -----------------------------------------------------------------------------


@needs_multi30k
def test_resumed_run_ends_with_same_weights_and_optimizer_as_uninterrupted_run(tmp_path):
    whole = replace(TINY, checkpoint_dir=str(tmp_path / "whole"))
    parts = replace(TINY, checkpoint_dir=str(tmp_path / "parts"))
    history = train_worker(0, 1, whole, progress=False, threads=1)
    train_worker(0, 1, replace(parts, epochs=1), progress=False, threads=1)  # "interrupted"
    resumed = train_worker(0, 1, parts, resume=True, progress=False, threads=1)
    a = load_checkpoint(tmp_path / "whole" / "last.pt")
    b = load_checkpoint(tmp_path / "parts" / "last.pt")
    assert a["epoch"] == b["epoch"] == 3
    assert a["train_state"] == b["train_state"]
    for name, tensor in a["model"].items():
        assert torch.allclose(tensor, b["model"][name], rtol=0, atol=1e-6), name
    for key, value in a["optimizer"]["state"].items():
        assert torch.allclose(value["exp_avg"], b["optimizer"]["state"][key]["exp_avg"],
                              rtol=0, atol=1e-6)
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"]
    assert [round(r["val_loss"], 6) for r in history] == [round(r["val_loss"], 6) for r in resumed]
    assert history[-1]["val_loss"] < history[0]["val_loss"]  # it learns


@needs_multi30k
def test_keep_epochs_keeps_the_weights_of_the_last_epochs_only(tmp_path):
    config = replace(TINY, checkpoint_dir=str(tmp_path), keep_epochs=2, train_limit=80)
    train_worker(0, 1, config, progress=False, threads=1)
    kept = sorted(p.name for p in tmp_path.glob("epoch_*.pt"))
    assert kept == ["epoch_002.pt", "epoch_003.pt"]
    last = load_checkpoint(tmp_path / "last.pt")
    newest = load_checkpoint(tmp_path / "epoch_003.pt")
    assert newest["epoch"] == 3 and set(newest) == {"model", "config", "epoch"}
    for name, tensor in last["model"].items():
        assert torch.equal(tensor, newest["model"][name]), name
    older = load_checkpoint(tmp_path / "epoch_002.pt")["model"]
    assert any(not torch.equal(older[n], t) for n, t in last["model"].items())


# --- devices ------------------------------------------------------------------------------


def test_bf16_autocast_trains_like_float32_on_the_cpu():
    """The GPU path's autocast, run on the CPU: same losses within bf16 rounding, fp32 weights."""
    losses = {}
    for dtype in (None, torch.bfloat16):
        model, optimizer, scheduler, criterion = tiny_setup()
        loader = multi30k_loader(synthetic_examples(64, 1), max_tokens=60, shuffle=False)
        losses[dtype] = [
            train_epoch(model, loader, criterion, optimizer, scheduler,
                        device=torch.device("cpu"), train_state=TrainState(),
                        autocast_dtype=dtype)[0]
            for _ in range(3)
        ]
        assert all(p.dtype == torch.float32 for p in model.parameters())
    assert losses[None][-1] < losses[None][0]  # it learns, in both precisions
    for full, half in zip(losses[None], losses[torch.bfloat16], strict=True):
        assert half == pytest.approx(full, rel=0.03)
    assert losses[None] != losses[torch.bfloat16]  # autocast did run in bfloat16


def test_device_report_asks_for_the_process_own_gpu(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 3 * 2**29)
    monkeypatch.setattr(torch.cuda, "utilization", lambda device: asked.append(device) or 42)
    gpu = torch.device("cuda", 1)
    assert device_report(gpu) == {"max_memory_gib": 1.5, "utilization_percent": 42.0}
    assert asked == [gpu]  # torch maps it through CUDA_VISIBLE_DEVICES to NVML's index

    def no_nvml(device):
        raise ModuleNotFoundError("No module named 'pynvml'")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    assert device_report(gpu) == {"max_memory_gib": 1.5}
    assert device_report(torch.device("cpu")) == {}


# --- distributed training -----------------------------------------------------------------


def _ddp_worker(rank: int, world_size: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        model, optimizer, scheduler, criterion = tiny_setup()
        model = DistributedDataParallel(model)
        loader = multi30k_loader(synthetic_examples(64, 1), max_tokens=60, shuffle=True,
                                 num_replicas=world_size, rank=rank)
        train_epoch(model, loader, criterion, optimizer, scheduler, device=torch.device("cpu"),
                    accum_iter=2, train_state=TrainState())
        torch.save(model.module.state_dict(), f"{out}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_match_one_process_averaging_per_rank_losses(tmp_path):
    torch.multiprocessing.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name in ranks[0]:
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # the copies never diverge

    # One process, the same global batches: each step follows the mean over ranks of each
    # rank's loss divided by its own token count (accumulated over accum_iter micro-batches).
    model, optimizer, scheduler, criterion = tiny_setup()
    shares = [list(multi30k_loader(synthetic_examples(64, 1), max_tokens=60, shuffle=True,
                                   num_replicas=2, rank=r)) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) >= 4
    for start in range(0, len(shares[0]), 2):  # accum_iter=2
        for share in shares:
            group = share[start : start + 2]
            tokens = sum(b.ntokens for b in group)
            for b in group:
                logp = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
                loss = criterion(logp.reshape(-1, logp.size(-1)), b.tgt_y.reshape(-1))
                (loss / tokens / 2).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    reference, initial = model.state_dict(), tiny_setup()[0].state_dict()
    moved = max(float((reference[n] - initial[n]).abs().max()) for n in reference)
    assert moved > 1e-3  # the steps changed the weights, so the comparison below means something
    for name, tensor in reference.items():
        assert torch.allclose(ranks[0][name], tensor, rtol=1e-4, atol=1e-5), name


@needs_multi30k
def test_train_distributed_with_two_cpu_processes_writes_checkpoint_with_both_random_states(
    tmp_path,
):
    from the_annotated_transformer import train_distributed

    config = replace(TINY, epochs=1, checkpoint_dir=str(tmp_path))
    train_distributed(config, 2, progress=False)
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["epoch"] == 1 and len(state["rng"]) == 2
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])  # own dropout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "vocab_de.json",
                                                          "vocab_en.json"]


# --- translation and BLEU -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "text"),
    [
        (["A", "dog", "runs", "."], "A dog runs."),
        (["Two", "men", ",", "one", "in", "a", "T", "-", "shirt", ",", "talk", "!"],
         "Two men, one in a T-shirt, talk!"),
        (["He", "does", "n't", "know", "the", "girl", "'s", "name", "?"],
         "He doesn't know the girl's name?"),
        (["A", "sign", "(", "red", ")", "says", '"', "stop", '"', "."],
         'A sign (red) says "stop".'),
        ([], ""),
    ],
)
def test_detokenize_glues_punctuation_clitics_hyphens_brackets_and_quotes(tokens, text):
    assert detokenize(tokens) == text


def test_detokenize_inverts_spacy_on_sentences_without_ambiguity():
    english = load_tokenizers()[1]
    for sentence in ["A little girl in a pink T-shirt climbs a tree.",
                     "The man's dog isn't (quite) sure; it waits."]:
        assert detokenize([t.text for t in english(sentence)]) == sentence


def test_bleu_matches_sacrebleu_and_returns_its_signature():
    import sacrebleu

    hypotheses = ["a dog runs on the grass .", "two men are talking", "a cat"]
    references = ["A dog runs on the grass.", "Two men are talking.", "A small cat sleeps."]
    score, signature = bleu(hypotheses, references)
    assert score == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert 0 < score < 100
    assert "nrefs:1" in signature and "tok:13a" in signature and "version:" in signature
    assert bleu(references, references)[0] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="hypotheses has 1 lines but references has 2"):
        bleu(["a"], ["a", "b"])


def _tiny_translator():
    german = load_tokenizers()[0]
    sentences = ["Ein Hund läuft.", "Zwei Männer sprechen auf der Straße miteinander.", "",
                 "Eine Frau.", "Ein Kind spielt im Schnee mit einem roten Ball."]
    tokens = [[t.text for t in german(s)] for s in sentences]
    vocab_src = Vocab.build(tokens, min_freq=1)
    vocab_tgt = Vocab.build([["a", "dog", "runs", ".", "two", "men"]], min_freq=1)
    torch.manual_seed(0)
    model = make_model(len(vocab_src), len(vocab_tgt), N=1, d_model=16, d_ff=32, h=2,
                       dropout=0.0)
    return model, vocab_src, vocab_tgt, german, sentences


def test_translate_keeps_input_order_and_one_output_per_input():
    model, vocab_src, vocab_tgt, german, sentences = _tiny_translator()
    together = translate(model, sentences, vocab_src, vocab_tgt, german, batch_size=2, max_len=8)
    alone = [translate(model, [s], vocab_src, vocab_tgt, german, max_len=8)[0]
             for s in sentences]
    assert len(together) == len(sentences)
    assert together == alone  # sorting by length and batching did not reorder anything
    assert together[2] == ""  # an empty line stays empty
    assert len(set(together)) >= 3  # different outputs, so a reordering would show
    assert all(isinstance(text, str) and "\n" not in text for text in together)
    with pytest.raises(TypeError, match="sentences must be a list"):
        translate(model, "Ein Hund.", vocab_src, vocab_tgt, german)


# --- shipping and the command-line scripts -------------------------------------------------


@needs_multi30k
def test_translate_script_writes_exactly_one_line_per_input_line(tmp_path):
    config = replace(TINY, epochs=1, checkpoint_dir=str(tmp_path / "run"))
    train_worker(0, 1, config, progress=False, threads=1)
    shipped = tmp_path / "shipped"
    export_for_shipping(tmp_path / "run" / "last.pt", shipped, command="pytest")
    model, _, _, loaded_config = load_trained_model(shipped)
    assert next(model.parameters()).dtype == torch.float32
    assert load_checkpoint(shipped / "model.pt")["model"]["generator.proj.weight"].dtype == (
        torch.float16
    )
    assert loaded_config == config
    text = "Ein Hund rennt.\n\nZwei Männer stehen vor einem Haus.\n   \nEnde"  # no final newline
    for checkpoint in (shipped, tmp_path / "run" / "last.pt"):
        result = subprocess.run(
            [sys.executable, str(ROOT / "tools" / "translate.py"), "--checkpoint", str(checkpoint)],
            input=text.encode(), capture_output=True, check=True, timeout=120,
        )
        lines = result.stdout.decode().split("\n")
        assert lines[-1] == "" and len(lines[:-1]) == 5, result.stdout
        assert lines[1] == "" and lines[3] == ""
        assert all(lines[i] for i in (0, 2, 4))
        assert "translating 5 lines" in result.stderr.decode()


def test_train_script_explains_its_options():
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "train.py"), "--help"],
                            capture_output=True, text=True, check=True, timeout=60)
    for option in ("--config", "--devices", "--epochs", "--checkpoint-dir", "--resume"):
        assert option in result.stdout
