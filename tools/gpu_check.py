"""Check the GPU paths on a machine with CUDA: the GPU tests, then the base preset in bfloat16.

    make gpu-check                          # or: python tools/gpu_check.py --steps 300 --save

Fails (exit status 1) when there is no CUDA, when a GPU test fails or is skipped although CUDA
is present, when the GPU cannot compute in bfloat16 natively, or when the benchmark breaks (an
error, a loss that is not finite or does not fall). At the end it prints tokens per second,
peak memory, GPU utilization and model FLOPs utilization (MFU); --save also writes them, with
the GPU, torch and the date, to book/data/gpu_check_cuda.json, which chapter 22 reads.
"""

import argparse
import datetime
import itertools
import json
import math
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import torch

from the_annotated_transformer import (
    PAD_ID,
    LabelSmoothing,
    TrainConfig,
    TrainState,
    autocast_dtype_for,
    device_report,
    make_model,
    multi30k_loader,
    rate,
    train_epoch,
    training_config,
)

ROOT = Path(__file__).resolve().parents[1]
# Dense bfloat16 tensor-core peaks in TFLOP/s, from the vendors' data sheets (SXM parts).
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "L40": 181.0,
                    "A10G": 70.0, "A10": 125.0, "L4": 121.0, "RTX 4090": 165.0, "A6000": 155.0}


class CheckFailed(Exception):
    """A GPU path broke: the check must fail, loudly."""


def peak_tflops(device_name: str) -> float | None:
    """The bf16 peak of a GPU named like torch.cuda.get_device_name; None when unknown."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):  # "L40S" before "L40"
        if key in device_name:
            return PEAK_BF16_TFLOPS[key]
    return None


def model_flops_utilization(tokens_per_s: float, n_params: int, peak: float | None) -> float | None:
    """Achieved 6 x parameters FLOPs per trained token (forward and backward) over the peak."""
    if peak is None:
        return None
    return 6 * n_params * tokens_per_s / (peak * 1e12)


def run_gpu_tests(*, allow_skips: bool = False) -> dict[str, Any]:
    """tests/test_gpu.py in its own process, and what its report counted. Where CUDA is
    present a skip counts as a failure; allow_skips is for a CPU, where every test skips."""
    with tempfile.TemporaryDirectory() as folder:
        report = Path(folder) / "gpu.xml"
        command = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_gpu.py"), "-q",
                   "-rs", "-p", "no:cacheprovider", f"--junitxml={report}"]
        start = time.perf_counter()
        try:
            result = subprocess.run(command, cwd=ROOT, timeout=300)
        except subprocess.TimeoutExpired:
            raise CheckFailed("tests/test_gpu.py took more than 5 minutes; stopped") from None
        seconds = time.perf_counter() - start
        if not report.is_file():
            raise CheckFailed(f"tests/test_gpu.py did not run (exit status {result.returncode})")
        suites = list(ET.parse(report).getroot().iter("testsuite"))
    count = {key: sum(int(s.get(key, 0)) for s in suites)
             for key in ("tests", "failures", "errors", "skipped")}
    if result.returncode != 0 or count["failures"] or count["errors"]:
        raise CheckFailed(f"tests/test_gpu.py failed (exit status {result.returncode})")
    if count["skipped"] and not allow_skips:
        raise CheckFailed(f"{count['skipped']} GPU test(s) skipped although CUDA is present "
                          "(see above)")
    return {"command": "python -m pytest tests/test_gpu.py", "exit_status": result.returncode,
            "seconds": seconds, **count,
            "passed": count["tests"] - count["failures"] - count["errors"] - count["skipped"]}


def synthetic_examples(n: int, vocab: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    """n random sentence pairs of Multi30k-like lengths (8 to 40 tokens), ids 4..vocab-1."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(8, 41, (n, 2), generator=generator).tolist()
    return [(torch.randint(4, vocab, (a,), generator=generator).tolist(),
             torch.randint(4, vocab, (b,), generator=generator).tolist()) for a, b in lengths]


def benchmark(config: TrainConfig, device: torch.device, *, steps: int, warmup_steps: int = 10,
              vocab: int = 8000, autocast_dtype: torch.dtype | None = None) -> dict[str, float]:
    """Train config's model for warmup_steps, then time `steps` optimizer steps."""
    torch.manual_seed(0)
    model = make_model(vocab, vocab, N=config.N, d_model=config.d_model, d_ff=config.d_ff,
                       h=config.h, dropout=config.dropout).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rate(step, config.d_model, config.lr_factor, config.warmup))
    criterion = LabelSmoothing(vocab, PAD_ID, smoothing=config.label_smoothing)
    loader = multi30k_loader(synthetic_examples(2000, vocab), max_tokens=config.max_tokens,
                             shuffle=True)
    batches = list(loader)

    def run(n: int) -> float:
        loss, tokens, _ = train_epoch(
            model, itertools.islice(itertools.cycle(batches), n * config.accum_iter), criterion,
            optimizer, scheduler, device=device, accum_iter=config.accum_iter,
            train_state=TrainState(), autocast_dtype=autocast_dtype)
        if not math.isfinite(loss):
            raise CheckFailed(f"the training loss is {loss}")
        return loss / max(tokens, 1), tokens

    first, _ = run(warmup_steps)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    last, tokens = run(steps)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    if not last < first:
        raise CheckFailed(f"the loss did not fall: {first:.3f} after warm-up, {last:.3f} after")
    n_params = sum(p.numel() for p in model.parameters())
    result = {"steps": steps, "seconds": seconds, "tokens_per_s": tokens / seconds,
              "first_loss": first, "last_loss": last, "parameters": n_params,
              **device_report(device)}
    if device.type == "cuda":
        peak = peak_tflops(torch.cuda.get_device_name(device))
        result["mfu"] = model_flops_utilization(result["tokens_per_s"], n_params, peak)
    return result


def summary(result: dict[str, float], device_name: str) -> str:
    """The printed report, one line per number."""
    mfu = result.get("mfu")
    lines = [f"device:           {device_name}",
             f"steps:            {result['steps']} in {result['seconds']:.1f} s",
             f"target tokens/s:  {result['tokens_per_s']:,.0f}",
             f"loss:             {result['first_loss']:.3f} -> {result['last_loss']:.3f}",
             f"peak memory:      {result.get('max_memory_gib', float('nan')):.2f} GiB",
             f"utilization:      {result.get('utilization_percent', float('nan')):.0f}%",
             "MFU:              " + (f"{100 * mfu:.1f}%" if mfu is not None
                                     else "unknown (no peak FLOP/s for this GPU)")]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="timed optimizer steps")
    parser.add_argument("--skip-tests", action="store_true", help="only the benchmark")
    parser.add_argument("--save", action="store_true",
                        help="also write the result to book/data/gpu_check_cuda.json")
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error(f"--steps must be at least 1, got {args.steps}")
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device here; run it on a machine with a GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda", 0)
    try:
        if not args.skip_tests:
            run_gpu_tests()
        dtype = autocast_dtype_for(device)
        if dtype is not torch.bfloat16:
            raise CheckFailed(f"{torch.cuda.get_device_name(device)} (compute capability "
                              f"{torch.cuda.get_device_capability(device)}) has no native "
                              "bfloat16: the base preset would train in float32")
        result = benchmark(training_config("base"), device, steps=args.steps,
                           autocast_dtype=dtype)
    except CheckFailed as err:
        print(f"gpu-check FAILED: {err}", file=sys.stderr)
        return 1
    print(summary(result, torch.cuda.get_device_name(device)))
    if args.save:
        path = ROOT / "book" / "data" / "gpu_check_cuda.json"
        record = {"command": " ".join(["python tools/gpu_check.py", *(argv or sys.argv[1:])]),
                  "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                      "%Y-%m-%d %H:%M UTC"),
                  "gpu": torch.cuda.get_device_name(device), "torch": torch.__version__,
                  "preset": "base", "autocast": "bfloat16", "result": result}
        path.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
