"""tools/gpu_check.py on a CPU: what it computes and prints, and that it fails without CUDA."""

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
import gpu_check  # noqa: E402

from the_annotated_transformer import TrainConfig  # noqa: E402


def test_peak_flops_are_found_by_device_name_most_specific_first():
    assert gpu_check.peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert gpu_check.peak_tflops("NVIDIA L40S") == 362.0  # not the L40's
    assert gpu_check.peak_tflops("NVIDIA A100-SXM4-40GB") == 312.0
    assert gpu_check.peak_tflops("Tesla V100-SXM2-16GB") is None


def test_mfu_is_six_flops_per_parameter_and_token_over_the_peak():
    assert gpu_check.model_flops_utilization(1e5, 50_000_000, 100.0) == pytest.approx(0.3)
    assert gpu_check.model_flops_utilization(1e5, 50_000_000, None) is None


def test_without_cuda_the_check_fails_instead_of_skipping(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu_check.main(["--steps", "1"]) == 1
    assert "no CUDA device here" in capsys.readouterr().err


def test_benchmark_trains_and_reports_on_the_cpu():
    tiny = replace(TrainConfig(N=1, d_model=32, d_ff=64, h=4, max_tokens=400, warmup=5),
                   dropout=0.0)
    torch.set_num_threads(1)
    result = gpu_check.benchmark(tiny, torch.device("cpu"), steps=6, warmup_steps=4, vocab=40)
    assert result["steps"] == 6 and result["tokens_per_s"] > 0
    assert result["last_loss"] < result["first_loss"]
    text = gpu_check.summary(result, "cpu")
    assert "target tokens/s" in text and "MFU:              unknown" in text


def test_the_stored_gpu_check_names_its_gpu_and_its_numbers_are_sane():
    """What chapter 22 reads: one `make gpu-check` run of the base preset on a GPU."""
    import json

    record = json.loads((ROOT / "book" / "data" / "gpu_check_cuda.json").read_text())
    assert record["command"].startswith("python tools/gpu_check.py") and record["gpu"]
    result = record["result"]
    assert result["last_loss"] < result["first_loss"] and result["steps"] >= 100
    assert result["tokens_per_s"] > 0 and 0 < result["mfu"] < 1
    assert result["parameters"] == sum(p.numel() for p in gpu_check.make_model(
        8000, 8000, N=6, d_model=512, d_ff=2048, h=8).parameters())
