"""Chapter 14: checkpoints, resuming, distributed training, translation, BLEU and the scripts."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_training import synthetic_examples, synthetic_sentence_pairs, tiny_setup

from the_annotated_transformer import (
    LossAndNLL,
    SimpleLossCompute,
    TrainConfig,
    TrainState,
    Vocab,
    autocast_dtype_for,
    bleu,
    config_differences,
    cpu_computes_bf16,
    detokenize,
    device_report,
    export_for_shipping,
    free_port,
    load_checkpoint,
    load_tokenizers,
    load_trained_model,
    make_model,
    multi30k_loader,
    prepare_checkpoint_dir,
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
    N=1, d_model=32, d_ff=64, h=4, dropout=0.1, max_tokens=300, epochs=3, warmup=5,
    train_limit=240, val_limit=40,
)
# Injected sentence pairs: the training tests do not need the Multi30k files.
PAIRS = {"train": synthetic_sentence_pairs(240, 0), "val": synthetic_sentence_pairs(40, 1)}


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
    with pytest.raises(ValueError, match=r"checkpoint .*last\.pt is truncated or corrupted") as err:
        load_checkpoint(path)
    assert len(str(err.value).splitlines()) == 1  # one line, however long torch's own text
    path.write_bytes(b"not a checkpoint at all")
    with pytest.raises(ValueError, match=str(path).replace(".", r"\.")) as err:
        load_checkpoint(path)
    assert len(str(err.value).splitlines()) == 1


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
        training_config("tpu")
    with pytest.raises(ValueError, match="keep_epochs must be an integer >= 0, got -1"):
        training_config("cpu", keep_epochs=-1)


def test_train_worker_refuses_a_batch_smaller_than_the_longest_sentence_before_starting():
    config = replace(TINY, max_tokens=50)  # per device, less than max_len=72
    with pytest.raises(ValueError, match="max_tokens=50 per device is less than max_len=72"):
        train_worker(0, 2, config, progress=False)


# --- the checkpoint folder ----------------------------------------------------------------


def test_a_fresh_run_refuses_a_folder_holding_another_runs_checkpoints(tmp_path):
    assert prepare_checkpoint_dir(tmp_path, resume=False, overwrite=False) is False  # empty
    for name in ("last.pt", "best.pt", "epoch_003.pt", "vocab_de.json"):
        (tmp_path / name).write_bytes(b"x")
    with pytest.raises(FileExistsError, match=f"{tmp_path} already holds another run's "
                                              "best.pt, epoch_003.pt, last.pt: resume it"):
        prepare_checkpoint_dir(tmp_path, resume=False, overwrite=False)
    assert prepare_checkpoint_dir(tmp_path, resume=True, overwrite=False) is True
    assert prepare_checkpoint_dir(tmp_path, resume=False, overwrite=False, restarted=True)
    assert prepare_checkpoint_dir(tmp_path, resume=False, overwrite=True) is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["vocab_de.json"]  # rebuilt later
    with pytest.raises(ValueError, match="resume and overwrite exclude each other"):
        prepare_checkpoint_dir(tmp_path, resume=True, overwrite=True)


def test_resume_without_a_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    config = replace(TINY, checkpoint_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match=f"cannot resume: the checkpoint folder "
                                                f"{tmp_path} holds no last.pt"):
        train_worker(0, 1, config, resume=True, progress=False, threads=1, pairs=PAIRS)
    assert list(tmp_path.iterdir()) == []  # nothing was trained or written


def test_resume_config_check_names_every_field_that_may_not_change():
    stored = {**vars(TINY), "warmup": 10, "lr_factor": 2.0, "seed": 3, "epochs": 1}
    changes = config_differences(stored, TINY, 1, 1)
    assert changes == ["warmup=10 in the checkpoint but 5 now",
                       "lr_factor=2.0 in the checkpoint but 0.5 now",
                       "seed=3 in the checkpoint but 0 now"]  # epochs may change
    assert config_differences(vars(TINY), replace(TINY, accum_iter=2), 2, 4) == []
    assert config_differences(vars(TINY), TINY, 2, 1) == [
        "processes x accum_iter = 1 in the checkpoint but 2 x 1 now (another global batch)"
    ]


# --- resuming -----------------------------------------------------------------------------


def test_resumed_run_ends_with_same_weights_and_optimizer_as_uninterrupted_run(tmp_path):
    whole = replace(TINY, checkpoint_dir=str(tmp_path / "whole"))
    parts = replace(TINY, checkpoint_dir=str(tmp_path / "parts"))
    run = {"progress": False, "threads": 1, "pairs": PAIRS}
    history = train_worker(0, 1, whole, **run)
    train_worker(0, 1, replace(parts, epochs=1), **run)  # "interrupted"
    resumed = train_worker(0, 1, parts, resume=True, **run)
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
    with pytest.raises(ValueError, match=r"cannot resume from .*parts/last\.pt: warmup=5 in "
                                         "the checkpoint but 9 now"):
        train_worker(0, 1, replace(parts, warmup=9, epochs=4), resume=True, **run)


class Interrupted(Exception):
    """Stands for a process lost in the middle of an epoch."""


def test_a_run_resumed_from_inside_an_epoch_ends_like_the_uninterrupted_run(
    tmp_path, monkeypatch
):
    import the_annotated_transformer as tat

    whole = replace(TINY, checkpoint_dir=str(tmp_path / "whole"))
    parts = replace(TINY, checkpoint_dir=str(tmp_path / "parts"))
    run = {"progress": False, "threads": 1, "pairs": PAIRS, "save_every": 2}
    history = train_worker(0, 1, whole, **run)
    per_epoch = load_checkpoint(tmp_path / "whole" / "last.pt")["train_state"]["step"] // 3
    assert per_epoch > 5  # so that epoch 2 holds checkpoints at batches 2 and 4
    epoch_core = tat.train_epoch

    def dies_in_epoch_2(model, batches, *args, train_state, **kwargs):
        def until_batch_5():
            for i, batch in enumerate(batches):
                if i == 5 and train_state.step >= per_epoch:
                    raise Interrupted
                yield batch

        return epoch_core(model, until_batch_5(), *args, train_state=train_state, **kwargs)

    monkeypatch.setattr(tat, "train_epoch", dies_in_epoch_2)
    with pytest.raises(Interrupted):
        train_worker(0, 1, parts, **run)
    monkeypatch.undo()
    state = load_checkpoint(tmp_path / "parts" / "last.pt")
    assert (state["epoch"], state["batch"]) == (1, 4)  # the last save before batch 5
    assert state["train_state"]["step"] == per_epoch + 4
    resumed = train_worker(0, 1, parts, resume=True, **run)
    a = load_checkpoint(tmp_path / "whole" / "last.pt")
    b = load_checkpoint(tmp_path / "parts" / "last.pt")
    assert (b["epoch"], b["batch"]) == (3, 0) and a["train_state"] == b["train_state"]
    for name, tensor in a["model"].items():
        assert torch.allclose(tensor, b["model"][name], rtol=0, atol=1e-6), name
    assert [round(r["val_loss"], 6) for r in history] == [round(r["val_loss"], 6) for r in resumed]
    assert resumed[1]["resumed_at_batch"] == 4 and "resumed_at_batch" not in resumed[2]
    with pytest.raises(ValueError, match="save_every must be a whole number of steps"):
        train_worker(0, 1, parts, resume=True, **{**run, "save_every": -1})


def test_history_reports_nll_perplexity_and_bleu_and_best_pt_keeps_the_best_epoch(tmp_path):
    import math

    config = replace(TINY, checkpoint_dir=str(tmp_path))
    history = train_worker(0, 1, config, progress=False, threads=1, pairs=PAIRS)
    for record in history:
        assert record["val_ppl"] == pytest.approx(math.exp(record["val_nll"]))
        assert record["train_nll"] > 0 and record["val_nll"] > 0
        assert 0 <= record["val_bleu"] <= 100
    best = load_checkpoint(tmp_path / "best.pt")
    bleus = [r["val_bleu"] for r in history]
    assert best["val_bleu"] == max(bleus) and best["epoch"] == 1 + bleus.index(max(bleus))
    assert set(best) == {"model", "config", "epoch", "val_bleu"}


def test_loss_and_nll_adds_the_plain_likelihood_beside_the_smoothed_loss():
    from the_annotated_transformer import PAD_ID, LabelSmoothing

    torch.manual_seed(0)
    model = make_model(10, 10, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    x = torch.randn(2, 5, 16)
    y = torch.tensor([[4, 5, 6, PAD_ID, PAD_ID], [7, 8, 9, 3, PAD_ID]])
    criterion = LabelSmoothing(10, PAD_ID, smoothing=0.1)
    both = LossAndNLL(model.generator, criterion, PAD_ID)
    loss_sum, loss = both(x, y, 7.0)
    plain_sum, plain = SimpleLossCompute(model.generator, criterion)(x, y, 7.0)
    assert loss_sum == pytest.approx(plain_sum) and torch.allclose(loss, plain)
    logp = model.generator(x).reshape(-1, 10)
    nll = torch.nn.functional.nll_loss(logp, y.reshape(-1), ignore_index=PAD_ID, reduction="sum")
    assert both.nll == pytest.approx(float(nll.detach()))


def test_keep_epochs_keeps_the_weights_of_the_last_epochs_only(tmp_path):
    config = replace(TINY, checkpoint_dir=str(tmp_path), keep_epochs=2, train_limit=80,
                     bleu_every=0)
    train_worker(0, 1, config, progress=False, threads=1, pairs=PAIRS)
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


def test_bf16_only_on_gpus_that_compute_in_it_natively(monkeypatch):
    capability = {"value": (7, 0)}  # a V100: is_bf16_supported() says yes, but it emulates
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: capability["value"])
    assert autocast_dtype_for(torch.device("cuda", 0)) is None
    capability["value"] = (8, 0)  # an A100
    assert autocast_dtype_for(torch.device("cuda", 0)) == torch.bfloat16
    assert autocast_dtype_for(torch.device("cpu")) is None


@pytest.mark.parametrize("avx512_bf16, amx", [(False, False), (True, False), (False, True)])
def test_bf16_on_cpus_only_when_asked_and_computed_natively(monkeypatch, avx512_bf16, amx):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    native = avx512_bf16 or amx
    assert cpu_computes_bf16() == native
    assert autocast_dtype_for(torch.device("cpu")) is None  # float32 unless the run asks
    assert autocast_dtype_for(torch.device("cpu"), cpu_bf16=True) == (
        torch.bfloat16 if native else None)


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


def _one_process_steps(shares: list[list], per_rank_means: bool) -> dict:
    """One process on the ranks' global batches, normalized globally or per rank."""
    model, optimizer, scheduler, criterion = tiny_setup()
    for start in range(0, len(shares[0]), 2):  # accum_iter=2
        groups = [share[start : start + 2] for share in shares]
        everything = sum(b.ntokens for group in groups for b in group)
        for group in groups:
            tokens = sum(b.ntokens for b in group)
            for b in group:
                logp = model.generator(model(b.src, b.tgt, b.src_mask, b.tgt_mask))
                loss = criterion(logp.reshape(-1, logp.size(-1)), b.tgt_y.reshape(-1))
                (loss / tokens / 2 if per_rank_means else loss / everything).backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model.state_dict()


def test_two_gloo_processes_take_the_steps_of_one_process_normalized_by_global_tokens(tmp_path):
    torch.multiprocessing.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for name in ranks[0]:
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # the copies never diverge

    # One process, the same global batches: each step follows the summed loss of both ranks'
    # micro-batches divided by their total token count, as if it were one batch.
    shares = [list(multi30k_loader(synthetic_examples(64, 1), max_tokens=60, shuffle=True,
                                   num_replicas=2, rank=r)) for r in range(2)]
    assert len(shares[0]) == len(shares[1]) >= 4
    reference = _one_process_steps(shares, per_rank_means=False)
    initial = tiny_setup()[0].state_dict()
    moved = max(float((reference[n] - initial[n]).abs().max()) for n in reference)
    assert moved > 1e-3  # the steps changed the weights, so the comparison below means something
    for name, tensor in reference.items():
        assert torch.allclose(ranks[0][name], tensor, rtol=0, atol=1e-6), name
    # A mean of per-rank means (each rank dividing by its own tokens) is measurably different.
    means = _one_process_steps(shares, per_rank_means=True)
    assert max(float((means[n] - reference[n]).abs().max()) for n in reference) > 1e-4


def test_train_distributed_with_two_cpu_processes_writes_checkpoint_with_both_random_states(
    tmp_path,
):
    from the_annotated_transformer import train_distributed

    config = replace(TINY, epochs=1, checkpoint_dir=str(tmp_path))
    train_distributed(config, 2, progress=False, threads=1, pairs=PAIRS)
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["epoch"] == 1 and len(state["rng"]) == 2
    assert not torch.equal(state["rng"][0]["torch"], state["rng"][1]["torch"])  # own dropout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["best.pt", "last.pt",
                                                          "vocab_de.json", "vocab_en.json"]


def test_a_survivor_resumes_a_two_process_run_alone_only_with_twice_the_accumulation(
    tmp_path, capfd,
):
    """Chapter 22's runbook: one machine of two goes on alone if the global batch stays."""
    from the_annotated_transformer import train_distributed, train_worker

    config = replace(TINY, epochs=1, checkpoint_dir=str(tmp_path))
    train_distributed(config, 2, progress=False, threads=1, pairs=PAIRS)
    steps_after_one_epoch = load_checkpoint(tmp_path / "last.pt")["train_state"]["step"]
    alone = replace(config, epochs=2)
    with pytest.raises(ValueError, match=r"processes x accum_iter = 2 in the checkpoint but 1 x 1"):
        train_worker(0, 1, alone, resume=True, progress=False, threads=1, pairs=PAIRS)
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1  # the refusal changed nothing
    train_worker(0, 1, replace(alone, accum_iter=2), resume=True, progress=False, threads=1,
                 pairs=PAIRS)
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["epoch"] == 2 and len(state["rng"]) == 1
    assert state["train_state"]["step"] > steps_after_one_epoch
    assert "written by 2 processes, not 1: random states start afresh" in capfd.readouterr().err

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
    config = replace(TINY, epochs=1, checkpoint_dir=str(tmp_path / "run"), bleu_every=0)
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
            [sys.executable, "-m", "annotated_transformer_cli", "translate",
             "--checkpoint", str(checkpoint)],
            input=text.encode(), capture_output=True, check=True, timeout=120,
        )
        lines = result.stdout.decode().split("\n")
        assert lines[-1] == "" and len(lines[:-1]) == 5, result.stdout
        assert lines[1] == "" and lines[3] == ""
        assert all(lines[i] for i in (0, 2, 4))
        assert "translating 5 lines" in result.stderr.decode()


def test_train_script_explains_its_options():
    result = subprocess.run([sys.executable, "-m", "annotated_transformer_cli", "train", "--help"],
                            capture_output=True, text=True, check=True, timeout=60)
    for option in ("--config", "--devices", "--epochs", "--checkpoint-dir", "--resume",
                   "--overwrite", "--max-tokens", "--accum-iter", "--batch-tokens"):
        assert option in result.stdout
    assert "on EACH device" in result.stdout  # what the batch size means


def test_batch_tokens_picks_the_accumulation_nearest_the_papers_batch():
    sys.path.insert(0, str(ROOT / "tools"))
    from annotated_transformer_cli.train import accum_for_batch

    assert accum_for_batch(25_000, 4096, 1) == 6  # 24,576 tokens per step on one GPU
    assert accum_for_batch(25_000, 4096, 8) == 1  # 32,768 on eight
    assert accum_for_batch(25_000, 1500, 2) == 8
    with pytest.raises(ValueError, match="--batch-tokens must be a positive integer, got 0"):
        accum_for_batch(0, 4096, 1)


def run_train_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "annotated_transformer_cli", "train", *args],
                          capture_output=True, text=True, timeout=120)


def test_train_script_on_a_finished_run_says_so_and_trains_nothing(tmp_path):
    torch.save({"epoch": 12, "model": {}}, tmp_path / "last.pt")  # what the script reads
    for extra in ([], ["--resume"]):
        result = run_train_script("--config", "cpu", "--checkpoint-dir", str(tmp_path), *extra)
        assert result.returncode == 0, result.stderr
        assert "has finished" in result.stderr and "after epoch 12 of 12" in result.stderr
        assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]  # nothing written


def test_train_script_resume_with_nothing_to_resume_is_one_line_and_an_error(tmp_path):
    result = run_train_script("--config", "cpu", "--checkpoint-dir", str(tmp_path), "--resume")
    assert result.returncode == 2  # a user error, like every refusal
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("annotated-transformer train: error: cannot resume")


@pytest.mark.parametrize("flags, message", [
    (["--epochs", "0"], "epochs must be a positive integer, got 0"),
    (["--max-tokens", "-5"], "max_tokens must be a positive integer, got -5"),
    (["--save-every", "-1"], "save_every must be a whole number of steps >= 0, got -1"),
])
def test_train_script_names_a_bad_value_in_one_line(tmp_path, flags, message):
    result = run_train_script("--config", "cpu", "--checkpoint-dir", str(tmp_path), *flags)
    assert result.returncode == 2 and "Traceback" not in result.stderr  # 2: nothing ran
    last = result.stderr.strip().splitlines()[-1]
    assert last == f"annotated-transformer train: error: {message}"


def test_epoch_line_shows_the_epoch_of_all_the_training_time_and_an_estimate_of_the_rest():
    from the_annotated_transformer import duration, epoch_line

    record = {"epoch": 3, "train_loss": 2.5, "val_loss": 2.25, "val_ppl": 8.0, "val_bleu": 20.5,
              "tokens_per_s": 1234.4, "seconds": 300.0}
    line = epoch_line(record, epochs=12, trained_s=900.0, left_s=2700.0)
    assert line.startswith("epoch  3/12 | train loss 2.5000 | val loss 2.2500 | val ppl 8.00")
    assert line.endswith(
        "val BLEU 20.50 | 1,234 tokens/s | 300.0 s | trained 15.0 min, about 45.0 min left")
    assert [duration(s) for s in (42, 90, 7200)] == ["42 s", "1.5 min", "2.00 h"]


def test_a_checkpoint_from_inside_an_epoch_resumes_only_with_as_many_processes(tmp_path):
    from the_annotated_transformer import read_resume_checkpoint

    path = tmp_path / "last.pt"
    save_checkpoint({"model": {}, "config": vars(TINY), "rng": [{}, {}], "epoch": 1,
                     "batch": 4}, path)
    one = replace(TINY, accum_iter=2)  # 1 x 2 micro-batches per step, as 2 x 1 before
    with pytest.raises(ValueError, match="written 4 micro-batches into epoch 2 by 2 processes"):
        read_resume_checkpoint(path, one, world_size=1)
    save_checkpoint({"model": {}, "config": vars(TINY), "rng": [{}, {}], "epoch": 1,
                     "batch": 0}, path)
    assert read_resume_checkpoint(path, one, world_size=1)["epoch"] == 1  # epoch boundary: fine
