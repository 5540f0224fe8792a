"""`make bench-quick` (tools/bench.py --quick) runs and prints every row of the table."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import bench  # noqa: E402


def test_bench_quick_prints_every_row_and_writes_the_json(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "tools/bench.py", "--quick", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300, check=True)
    lines = run.stdout.splitlines()
    expected = [f"{size.name:>6} {kind:<22}" for size in bench.QUICK_SIZES
                for kind in bench.QUICK_KINDS]
    expected += ["token budget", "every batch padded to 72"]
    expected += [f"{size.name:>6} {label:<40}" for size in bench.QUICK_SIZES
                 for label in bench.decoders(12, 4)]
    for label in expected:
        assert any(label in line for line in lines), f"no row {label!r} in:\n{run.stdout}"
    results = json.loads(out.read_text())
    assert {"cpu", "threads", "torch"} <= set(results["hardware"])
    assert len(results["training"]) == 8 and len(results["decoding"]) == 14
    # MFU: the row's FLOP rate over the run's own matmul peak in its precision (how large it
    # is depends on the machine: printed, not asserted)
    peak = {"float32": results["matmul_peak_gflops"] * 1e9,
            "bfloat16": results["matmul_peak_bf16_gflops"] * 1e9}
    for row in results["training"]:
        spread = row["tokens_per_s"]
        assert spread["min"] <= spread["median"] <= spread["max"]
        assert row["mfu"] == pytest.approx(
            row["flops_per_token"] * spread["median"] / peak[row["mfu_of"]])
    assert all(row["same_as_recompute"] is not False for row in results["decoding"])
    assert results["memory_read_gbs"] > 0 and set(results["decoder_weight_mb"]) == {
        size.name for size in bench.QUICK_SIZES}
    for row in results["decoding"]:
        assert row["flops_per_sentence"] > 0
        assert row["mfu"] == pytest.approx(
            row["flops_per_sentence"] * row["sentences_per_s"]["median"] / peak[row["mfu_of"]])
    flops = {(row["size"], row["decoder"]): row["flops_per_sentence"]
             for row in results["decoding"]}
    for size in bench.QUICK_SIZES:
        assert flops[size.name, "greedy, batched, cache"] < flops[size.name, "greedy, batched"]
    padding = [row["padding"] for row in results["batching"]]
    assert padding[0] < 0.2 < padding[1]  # the token budget pads far less than 72 tokens


@pytest.mark.parametrize("flags, message", [
    (["--repeats", "0"], "--repeats must be at least 1"),
    (["--device", "nowhere"], "is not a torch device"),
    (["--out", "/proc/no/such/folder/bench.json"], "cannot create its folder"),
    (["--out", "tools"], "is a folder; give a file name"),
])
def test_bench_refuses_bad_flags_in_one_line_before_running(flags, message):
    done = subprocess.run([sys.executable, "tools/bench.py", "--quick", *flags], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert message in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize("name", ["bench_cpu.json", "bench_cuda.json"])
def test_the_stored_bench_runs_hold_every_row_and_what_they_ran_on(name):
    """What chapter 21 reads: the full sizes, every row, the GPU named in the CUDA run."""
    results = json.loads((ROOT / "book" / "data" / name).read_text())
    assert not results["quick"] and results["command"].startswith("python tools/bench.py")
    kinds = [(row["size"], row["model"]) for row in results["training"]]
    made_before_compile = [(size.name, kind) for size in bench.FULL_SIZES  # both stored runs
                           for kind in bench.TRAINING_KINDS if "torch.compile" not in kind]
    assert kinds in ([(size.name, kind) for size in bench.FULL_SIZES
                      for kind in bench.TRAINING_KINDS], made_before_compile)
    labels = [(row["size"], row["decoder"]) for row in results["decoding"]]
    assert labels == [(size.name, label) for size in bench.FULL_SIZES
                      for label in bench.decoders(72, 32)]
    assert all(row["same_as_recompute"] is not False for row in results["decoding"])
    assert ("gpu" in results["hardware"]) == (name == "bench_cuda.json")


def test_the_roofline_run_counts_flops_and_weights_for_every_decoder():
    """Chapter 21's roofline reads these; the first run (bench_cpu.json) predates them."""
    results = json.loads((ROOT / "book" / "data" / "bench_cpu_epyc.json").read_text())
    assert results["decoding_only"] and results["training"] == results["batching"] == []
    assert results["command"].startswith("python tools/bench.py --decoding-only")
    labels = [(row["size"], row["decoder"]) for row in results["decoding"]]
    assert labels == [(size.name, label) for size in bench.FULL_SIZES
                      for label in bench.decoders(72, 32)]
    assert all(row["same_as_recompute"] is not False for row in results["decoding"])
    assert results["memory_read_gbs"] > 0
    assert set(results["decoder_weight_mb"]) == {size.name for size in bench.FULL_SIZES}
    for row in results["decoding"]:
        assert row["flops_per_sentence"] > 0 and (row["mfu_of"] == "bfloat16" or 0 < row["mfu"] < 1)
