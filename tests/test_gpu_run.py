"""tools/gpu_run.py on a CPU: its dry run takes every step of the GPU run at tiny sizes and
writes the JSON that the GPU run will write; bad input is one line and exit status 2."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_run  # noqa: E402

from the_annotated_transformer import (  # noqa: E402
    load_multi30k,
    load_trained_model,
    sha256_of,
    training_config,
)

HEX64 = set("0123456789abcdef")


@pytest.fixture(scope="module")
def multi30k():
    """The splits the run reads, fetched once where they are not here yet (the run never
    downloads)."""
    for split in ("train", *gpu_run.SPLITS):
        load_multi30k(split)


@pytest.fixture(scope="module")
def dry_run(multi30k, tmp_path_factory):
    """One dry run in its own process, as the command line runs it; its JSON and output. Its
    budget is far beyond what the dry run takes anywhere, so that no row is left out for time
    on a slow machine (the deadline has its own test below)."""
    folder = tmp_path_factory.mktemp("gpu_run")
    out = folder / "gpu_run_cpu.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "tools/gpu_run.py", "--dry-run", "--out", str(out),
         "--checkpoint-dir", str(folder / "run"), "--export", str(folder / "model"),
         "--budget-minutes", "600"],
        cwd=ROOT, capture_output=True, text=True, timeout=600, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text()), done, folder


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_the_dry_run_ends_complete_with_the_device_and_every_step(dry_run):
    record, done, _ = dry_run
    assert record["dry_run"] is True and record["complete"] is True and "error" not in record
    assert record["command"].startswith("python tools/gpu_run.py --dry-run")
    device = record["device"]
    assert device["type"] == "cpu" and device["name"] and device["torch"] == torch.__version__
    assert set(record["steps"]) == {"gpu_tests", "training", "scores", "export", "bench"}
    assert all(is_number(s) and s >= 0 for s in record["steps"].values())
    # the whole run's seconds hold its steps' (each rounded to 0.1 s)
    assert sum(record["steps"].values()) <= record["seconds"] + 0.05 * len(record["steps"])
    assert record["budget_minutes"] == 600
    assert "wrote" in done.stdout.splitlines()[-1]


def test_the_dry_run_runs_the_gpu_tests_which_all_skip_as_it_hides_any_cuda_device(dry_run):
    """The dry run sets CUDA_VISIBLE_DEVICES to nothing, so on a CUDA machine too the GPU
    tests skip: the counts below hold on either."""
    tests = dry_run[0]["gpu_tests"]
    assert tests["tests"] == tests["skipped"] >= 3 and tests["exit_status"] == 0
    assert tests["failures"] == tests["errors"] == tests["passed"] == 0


def test_the_dry_run_trains_the_gpu_preset_to_the_end_of_its_schedule(dry_run):
    training = dry_run[0]["training"]
    config, schedule = training["config"], training["schedule"]
    preset = training_config("gpu")
    # the preset's recipe at tiny sizes: subwords, tying, the paper's dropout, the fast path
    assert training["preset"] == "gpu" and config["fast"] and config["paper_dropout"]
    assert config["share_embeddings"] and config["subwords"] > 0
    assert config["batch_tokens"] == 8 * config["max_tokens"] and config["accum_iter"] == 8
    assert preset.batch_tokens == preset.max_tokens  # one micro-batch a step on one GPU
    assert training["tokens_per_step"] == config["batch_tokens"]
    assert schedule["micro_batches_per_step"] == 8
    assert training["optimizer_steps"] == schedule["total_steps"] == (
        config["epochs"] * schedule["steps_per_epoch"])
    assert 4 * schedule["total_steps"] >= 5 * schedule["warmup"] >= 5
    history = training["history"]
    assert [row["epoch"] for row in history] == list(range(1, config["epochs"] + 1))
    for row in history:
        assert is_number(row["train_loss"]) and row["seconds"] > 0 and row["tokens_per_s"] > 0
        assert 0 <= row["val_bleu"] <= 100
    assert history[-1]["train_loss"] < history[0]["train_loss"]
    assert training["training_minutes"] == pytest.approx(
        sum(row["seconds"] for row in history) / 60)
    assert 0 < training["training_minutes"] <= training["wall_minutes"]
    assert set(training["minutes_to_bleu"]) == {"38", "40"}
    for minutes in training["minutes_to_bleu"].values():
        assert minutes is None or 0 < minutes <= training["training_minutes"]
    assert training["tokens_per_s"] > 0 and training["autocast"] in ("float32", "bfloat16")
    assert training["mfu"] is None and training["peak_memory_gib"] is None  # on a CPU
    assert training["averaged_epochs"] == list(
        range(config["epochs"] - config["keep_epochs"] + 1, config["epochs"] + 1))


def test_the_dry_run_scores_the_average_on_both_splits_greedy_and_with_the_beam(dry_run):
    record = dry_run[0]
    scores = record["scores"]
    assert [(r["split"], r["decoding"]) for r in scores] == [
        (split, decoding) for split in gpu_run.SPLITS for decoding in gpu_run.DECODINGS]
    for row in scores:
        assert 0 <= row["bleu"] <= 100 and row["sentences"] == 40 and row["seconds"] > 0
        assert row["signature"].startswith("nrefs:1|case:mixed|") and row["mean_words"] > 0
    averaged = record["averaged"]
    assert set(averaged["file_sha256"]) <= HEX64 and len(averaged["file_sha256"]) == 64
    assert set(averaged["weights_sha256"]) <= HEX64 and len(averaged["weights_sha256"]) == 64
    assert averaged["parameters"] > 0


def test_the_exported_model_loads_and_holds_the_averaged_weights(dry_run):
    record, _, folder = dry_run
    assert record["export"]["model_sha256"] == sha256_of(folder / "model" / "model.pt")
    model, _, _, config = load_trained_model(folder / "model")
    assert config.batch_tokens == record["training"]["config"]["batch_tokens"]
    assert sum(p.numel() for p in model.parameters()) == record["averaged"]["parameters"]
    info = json.loads((folder / "model" / "info.json").read_text())
    assert info["averaged_from"] == [f"epoch_{e:03d}.pt"
                                     for e in record["training"]["averaged_epochs"]]


def test_the_dry_run_benches_three_batches_both_paths_three_precisions_and_compile(dry_run):
    result = dry_run[0]["bench"]
    assert result["skipped"] == [] and "compile_error" not in result
    assert set(result["matmul_peak_tflops"]) == set(gpu_run.PRECISIONS)
    assert all(v > 0 for v in result["matmul_peak_tflops"].values())
    plain = [(r["batch"], r["path"], r["precision"]) for r in result["rows"] if not r["compiled"]]
    batches = [name for name, _, _ in gpu_run.dry_plan(Path("unused")).bench_batches]
    assert plain == [(b, path, precision) for b in batches for path in ("readable", "fast")
                     for precision in gpu_run.PRECISIONS]
    compiled = [r for r in result["rows"] if r["compiled"]]
    assert [r["batch"] for r in compiled] == batches
    assert all(r["compiled"] == "eager" and r["precision"] == "bfloat16" for r in compiled)
    peak = result["matmul_peak_tflops"]
    for row in result["rows"]:
        rate = row["tokens_per_s"]
        assert 0 < rate["min"] <= rate["median"] <= rate["max"]
        # MFU is the row's FLOP rate over the bench's own matmul peak in that precision (its
        # size is the machine's: a ratio to print, not to assert)
        assert row["mfu"] == pytest.approx(
            row["flops_per_token"] * rate["median"] / (peak[row["precision"]] * 1e12))
        assert row["flops_per_token"] > 0 and row["peak_memory_mb"] > 0
        assert row["tokens"] > 0 and row["steps"] >= 1
    for batch in batches:  # a precision changes no FLOP count; the compiled path is "fast"'s
        for path in ("readable", "fast"):
            counted = {r["flops_per_token"] for r in result["rows"]
                       if (r["batch"], r["path"]) == (batch, path)}
            assert len(counted) == 1, (batch, path, counted)


def test_a_bench_past_its_deadline_leaves_out_every_size_and_compiling(tmp_path):
    plan = gpu_run.dry_plan(tmp_path)
    written = []
    result = gpu_run.run_bench(plan, torch.device("cpu"), deadline=0.0, progress=written.append)
    names = [name for name, _, _ in plan.bench_batches]
    assert result["rows"] == [] and written == []
    assert result["skipped"] == [f"{name}: out of time" for name in names] + [
        "torch.compile: out of time"]


def test_without_cuda_the_gpu_run_is_refused_in_one_line_with_exit_status_2(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_run.main(["--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gpu_run.py: error: no CUDA device here")
    assert not (tmp_path / "x.json").exists()


def test_without_multi30k_the_run_is_refused_in_one_line_with_exit_status_2(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "nowhere"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    assert gpu_run.main(["--dry-run", "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Multi30k is not in" in err and "MULTI30K_DIR" in err
    assert str(tmp_path / "nowhere") in err and "train.de.gz" in err


def test_an_out_that_is_a_folder_is_refused_in_one_line_with_exit_status_2(
        tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    assert gpu_run.main(["--dry-run", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a folder" in err


def test_a_failed_step_leaves_the_json_with_its_error_and_exit_status_1(
        multi30k, tmp_path, monkeypatch, capsys):
    def broken(*, dry_run):
        raise gpu_run.StepFailed("tests/test_gpu.py failed (exit status 1)")

    monkeypatch.setattr(gpu_run, "run_gpu_tests", broken)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", ""))
    out = tmp_path / "x.json"
    assert gpu_run.main(["--dry-run", "--out", str(out)]) == 1
    record = json.loads(out.read_text())
    assert record["complete"] is False and record["error"].startswith("tests/test_gpu.py")
    assert "training" not in record and "gpu_tests" in record["steps"]
    assert "gpu_run.py FAILED: tests/test_gpu.py failed" in capsys.readouterr().err


def test_minutes_to_a_bleu_count_training_seconds_until_an_epoch_first_reaches_it():
    history = [{"seconds": 60.0, "val_bleu": 30.0}, {"seconds": 90.0, "val_bleu": 38.5},
               {"seconds": 30.0, "val_bleu": 37.0}, {"seconds": 30.0, "val_bleu": 40.0}]
    assert gpu_run.minutes_to(history, 38) == pytest.approx(2.5)
    assert gpu_run.minutes_to(history, 40) == pytest.approx(3.5)
    assert gpu_run.minutes_to(history, 41) is None


def test_a_diverged_number_is_written_as_null_so_the_json_stays_strict():
    assert gpu_run.finite({"a": [1.0, float("nan")], "b": float("inf"), "c": "x"}) == {
        "a": [1.0, None], "b": None, "c": "x"}


def test_the_weights_checksum_depends_on_the_weights_only():
    weights = {"b": torch.arange(3.0), "a": torch.ones(2, 2)}
    same = {"a": torch.ones(2, 2), "b": torch.arange(3.0)}
    changed = {"a": torch.ones(2, 2), "b": torch.tensor([0.0, 1.0, 2.5])}
    assert gpu_run.weights_sha256(weights) == gpu_run.weights_sha256(same)
    assert gpu_run.weights_sha256(weights) != gpu_run.weights_sha256(changed)


def test_make_gpu_run_has_pytest_and_multi30k_before_gpu_run_starts():
    """Step 1 runs pytest (the test layer), and gpu_run.py downloads nothing: the target
    fetches Multi30k's splits first, as make train would."""
    text = (ROOT / "Makefile").read_text("utf-8")
    rule = text.split("\ngpu-run:", 1)[1].split("\n\n", 1)[0]
    assert rule.split("\n", 1)[0].split() == ["$(TEST_LAYER)"]
    fetch, run = rule.index("load_multi30k(split)"), rule.index("tools/gpu_run.py")
    assert fetch < run and all(split in rule for split in gpu_run.SPLITS)


def test_reader_facing_files_carry_no_device_machine_instructions():
    for path in ("README.md", "Makefile", "tools/gpu_run.py"):
        text = (ROOT / path).read_text("utf-8")
        assert "/work/" not in text and "carry" not in text, path
