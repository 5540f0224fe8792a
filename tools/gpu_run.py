"""One GPU, for real: the GPU tests, the `gpu` preset trained and scored, a bench, in one JSON.

    python tools/gpu_run.py                       # `make gpu-run`: book/data/gpu_run_cuda.json
    python tools/gpu_run.py --out FILE            # the JSON elsewhere (on a device machine, $OUT)
    python tools/gpu_run.py --dry-run --out FILE  # the same steps on a CPU, tiny, in about a minute

It takes four steps; --budget-minutes (8) bounds the bench, which comes last and leaves out the
rows that would end the run later. How long the training takes on a GPU has not been measured
(the stored benches time steps of a few thousand tokens, the preset's are 32,768), so give the
run a time limit with room; the JSON is rewritten after each step:

1. tests/test_gpu.py in its own process, where a skip fails (the first part of `make gpu-check`);
2. training_config("gpu") on Multi30k German-English to the end of its schedule (one process,
   one micro-batch of 32,768 tokens a step, the rate falling to zero in a straight line after
   its warm-up, bfloat16 autocast, a greedy validation BLEU after every epoch), its last
   keep_epochs epochs averaged as `annotated-transformer average` averages them;
3. the average scored on val and test_2016_flickr with sacreBLEU and its signature, greedy and
   beam 4 (annotated-transformer evaluate's decodings; the beam runs with the cache);
4. training throughput of the preset's model on batches of 4k, 16k and 32k tokens: the readable
   model and the fast path, each in float32, TF32 and bfloat16, and the fast path in bfloat16
   under torch.compile (tools/bench.py's batches and timing).

The JSON holds the device, torch and CUDA versions, the schedule (steps, warm-up, the peak rate
and the last update's), every epoch of the run, the training minutes until the validation BLEU
first reached 38 and 40, tokens/s, MFU, peak memory, the scores, the averaged weights' SHA-256
and the bench's rows. It is rewritten after each step, so a run cut
short leaves what it measured ("complete" is false until the end).

The data is never downloaded here: Multi30k must be in multi30k_dir() ($MULTI30K_DIR,
../shared/data/multi30k, or the cache, where `make gpu-run` and `make train` download it).
--export DIR also writes the averaged model, in half precision as the book ships models
(model.pt, subwords.model, info.json). Step 1 needs pytest (the test layer); a subword run
needs no spaCy.
CONTRIBUTING.md says how to run it on a machine without a network.

Exit status 0 when every step ran; 1 when one failed (a GPU test, the training, a number out of
range), after writing what was measured; 2 for bad input (no CUDA without --dry-run, no
Multi30k, an --out that cannot be written), with one line on stderr.
"""

import argparse
import contextlib
import datetime
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tools")]  # the module, and the sibling scripts

import bench  # noqa: E402
import gpu_check  # noqa: E402
import torch  # noqa: E402
from gpu_check import model_flops_utilization, peak_tflops  # noqa: E402

from annotated_transformer_cli.average import write_average  # noqa: E402
from the_annotated_transformer import (  # noqa: E402
    MULTI30K_SHA256,
    PAD_ID,
    LabelSmoothing,
    TrainConfig,
    bleu,
    config_for_devices,
    encode_examples,
    export_for_shipping,
    linear_rate,
    load_checkpoint,
    load_multi30k,
    load_trained_model,
    make_model,
    multi30k_dir,
    multi30k_loader,
    rate,
    read_vocabularies,
    schedule_steps,
    sha256_of,
    train_worker,
    training_config,
)

DEFAULT_OUT = ROOT / "book" / "data" / "gpu_run_cuda.json"
SPLITS = ("val", "test_2016_flickr")
DECODINGS = ("greedy", "beam4")
PRECISIONS = ("float32", "tf32", "bfloat16")
BLEU_MARKS = (38, 40)


class BadInput(Exception):
    """What the user gave cannot work: one line, exit status 2."""


class StepFailed(Exception):
    """A step ran and broke: exit status 1, after the JSON is written."""


@dataclass(frozen=True)
class Plan:
    """The sizes of one run: the real one on a GPU, or the dry run's tiny ones on a CPU."""

    config: TrainConfig
    score_limit: int | None  # sentences of each split to score (None: all)
    bench_size: dict  # N, d_model, d_ff, h of the benched model
    bench_vocab: tuple[int, int]
    bench_batches: tuple[tuple[str, int, int], ...]  # (name, max_tokens, batches per pass)
    repeats: int
    matmul_n: int
    compile_backend: str


def real_plan(checkpoint_dir: Path) -> Plan:
    """The `gpu` preset as it is, scored on whole splits, benched at 4k, 16k and 32k tokens."""
    config = training_config("gpu", checkpoint_dir=str(checkpoint_dir))
    size = {"N": config.N, "d_model": config.d_model, "d_ff": config.d_ff, "h": config.h}
    return Plan(config, None, size, (8000, 8000),
                (("4k", 4096, 8), ("16k", 16384, 4), ("32k", 32768, 2)),
                repeats=3, matmul_n=8192, compile_backend="inductor")


def dry_plan(checkpoint_dir: Path) -> Plan:
    """The same steps at tiny sizes: a 1-layer model, 300 pairs, two short epochs of the
    preset's schedule (8 micro-batches a step, where the preset takes one on one GPU, so that
    accumulation runs too), 40 sentences scored, tiny bench batches, and torch.compile with the
    "eager" backend (Dynamo captures the graphs; no code generation)."""
    config = training_config(
        "gpu", N=1, d_model=32, d_ff=64, h=4, subwords=600, max_tokens=128, batch_tokens=1024,
        warmup=16, epochs=2, keep_epochs=2, train_limit=300, val_limit=40,
        checkpoint_dir=str(checkpoint_dir))
    return Plan(config, 40, {"N": 1, "d_model": 32, "d_ff": 64, "h": 4}, (200, 200),
                (("128", 128, 2), ("256", 256, 2), ("512", 512, 2)),
                repeats=1, matmul_n=256, compile_backend="eager")


# 1) the machine and the record
def device_info(device: torch.device) -> dict[str, Any]:
    """The device, torch, CUDA and the host, for the JSON."""
    info = {"type": device.type, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "host": bench.hardware(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=torch.cuda.get_device_name(device),
                    capability=list(torch.cuda.get_device_capability(device)),
                    memory_gib=props.total_memory / 2**30,
                    multiprocessors=props.multi_processor_count,
                    cudnn=torch.backends.cudnn.version())
    else:
        info["name"] = info["host"]["cpu"]
    return info


def finite(value: Any) -> Any:
    """value with every NaN or infinity (a diverged loss, say) as None: strict JSON."""
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [finite(item) for item in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def save(record: dict[str, Any], out: Path) -> None:
    """Write the JSON atomically: a reader never sees half of it."""
    text = json.dumps(finite(record), indent=1, allow_nan=False) + "\n"
    partial = out.with_name(out.name + ".partial")
    partial.write_text(text)
    os.replace(partial, out)


def check_out(out: Path) -> None:
    """--out must be a file whose folder exists or can be made."""
    if out.is_dir():
        raise BadInput(f"--out {out}: is a folder; give a file name")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise BadInput(f"--out {out}: cannot create its folder ({err.strerror})") from None


def check_data() -> Path:
    """Multi30k's train, val and 2016 test files must be here: nothing is downloaded."""
    folder = multi30k_dir()
    names = [name for name in MULTI30K_SHA256 if name.split(".")[0] in ("train", *SPLITS)]
    missing = [name for name in names if not (folder / name).is_file()]
    if missing:
        raise BadInput(
            f"Multi30k is not in {folder} (missing {', '.join(missing)}); nothing is downloaded "
            "here: set MULTI30K_DIR to a folder that holds it, or run `make gpu-run`, which "
            "downloads it first")
    return folder


# 2) the GPU tests
def run_gpu_tests(*, dry_run: bool) -> dict[str, Any]:
    """gpu_check's run of tests/test_gpu.py. On a GPU a failure or a skip fails the run; on a
    CPU (the dry run) every test skips, and only the command and its report are exercised."""
    try:
        return gpu_check.run_gpu_tests(allow_skips=dry_run)
    except gpu_check.CheckFailed as err:
        raise StepFailed(str(err)) from None


# 3) the training run
def minutes_to(history: list[dict[str, float]], mark: float) -> float | None:
    """Training minutes (validation and checkpoints aside) until the greedy validation BLEU
    after an epoch first reached `mark`; None when it never did."""
    seconds = 0.0
    for row in history:
        seconds += row["seconds"]
        if row.get("val_bleu", -1.0) >= mark:
            return seconds / 60
    return None


def schedule_rates(config: TrainConfig, schedule: dict[str, int]) -> dict[str, float]:
    """The rate at the end of the warm-up (the peak) and at the run's last update (LambdaLR's
    step total - 1), as the trainer's schedule gives them."""
    warmup, total = schedule["warmup"], schedule["total_steps"]

    def at(step: int) -> float:
        if config.decay == "linear":
            return linear_rate(step, config.d_model, config.lr_factor, warmup, total)
        return rate(step, config.d_model, config.lr_factor, warmup)

    return {"peak_rate": at(warmup), "last_rate": at(total - 1)}


def weights_sha256(weights: dict[str, torch.Tensor]) -> str:
    """SHA-256 of the weights' names, dtypes, shapes and bytes: the same weights, the same sum,
    whatever file holds them."""
    digest = hashlib.sha256()
    for name in sorted(weights):
        tensor = weights[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def train(plan: Plan, threads: int | None, result: dict[str, Any]) -> Path:
    """Train the preset to the end of its schedule on one device, put what it did into
    `result` (before checking it, so that a run that went wrong is on record too), and
    return the averaged checkpoint of its last keep_epochs epochs."""
    config = config_for_devices(plan.config, 1)
    start = time.perf_counter()
    history = train_worker(0, 1, plan.config, overwrite=True, progress=False, threads=threads)
    wall = time.perf_counter() - start
    folder = Path(config.checkpoint_dir)
    # the schedule the worker ran: its micro-batches per epoch, from its own vocabulary
    sp, _ = read_vocabularies(folder, subwords=True)
    pairs = load_multi30k("train")[: config.train_limit]
    examples = encode_examples(pairs, sp, sp, (None, None), max_len=config.max_len)
    batches = len(multi30k_loader(examples, max_tokens=config.max_tokens, shuffle=True))
    schedule = schedule_steps(config, batches_per_epoch=batches, world_size=1)
    schedule |= schedule_rates(config, schedule)
    done = load_checkpoint(folder / "last.pt")["train_state"]["accum_step"]
    epochs = list(range(config.epochs - config.keep_epochs + 1, config.epochs + 1))
    seconds = sum(row["seconds"] for row in history)
    tokens_per_s = sum(row["tokens_per_s"] * row["seconds"] for row in history) / seconds
    memory = [row["max_memory_gib"] for row in history if "max_memory_gib" in row]
    result.update({
        "preset": "gpu", "config": asdict(config), "devices": 1,
        "tokens_per_step": config.accum_iter * config.max_tokens, "schedule": schedule,
        "optimizer_steps": done, "history": history,
        "training_minutes": seconds / 60, "wall_minutes": wall / 60,
        "minutes_to_bleu": {str(mark): minutes_to(history, mark) for mark in BLEU_MARKS},
        "best_val_bleu": max(row.get("val_bleu", 0.0) for row in history),
        "tokens_per_s": tokens_per_s,
        "peak_memory_gib": max(memory) if memory else None,
        "autocast": history[-1].get("autocast", "float32"),
        "averaged_epochs": epochs,
    })
    if done != schedule["total_steps"] or len(history) != config.epochs:
        raise StepFailed(f"the run took {done} optimizer steps in {len(history)} epochs; its "
                         f"schedule has {schedule['total_steps']} in {config.epochs}")
    if not all(math.isfinite(row["train_loss"]) and 0 <= row.get("val_bleu", 0) <= 100
               for row in history):
        raise StepFailed("a training loss is not finite or a BLEU is out of [0, 100]")
    average = folder / "average.pt"
    write_average([folder / f"epoch_{epoch:03d}.pt" for epoch in epochs], average)
    return average


def score(average: Path, device: torch.device, limit: int | None) -> tuple[list[dict], dict]:
    """sacreBLEU of the averaged weights on each split, greedy and beam 4, as
    annotated-transformer evaluate decodes (the beam with the cache), in float32."""
    from annotated_transformer_cli import evaluate  # its decodings, so that the scores compare

    model, vocab_src, vocab_tgt, config = load_trained_model(average, device=device)
    rows = []
    for split in SPLITS:
        sources, references = zip(*load_multi30k(split)[:limit], strict=True)
        for decoding in DECODINGS:
            start = time.perf_counter()
            outputs = evaluate.decode(model, list(sources), (vocab_src, vocab_tgt), None,
                                      decoding, max_len=config.max_len)
            bench.sync(device)
            seconds = time.perf_counter() - start
            value, signature = bleu(outputs, list(references))
            if not 0 <= value <= 100:
                raise StepFailed(f"BLEU {value} on {split} ({decoding}) is out of [0, 100]")
            rows.append({"split": split, "decoding": decoding,
                         "decoding_description": evaluate.DECODINGS[decoding][0],
                         "bleu": value, "signature": signature, "sentences": len(outputs),
                         "seconds": seconds,
                         "mean_words": sum(len(o.split()) for o in outputs) / len(outputs)})
            print(f"{split:>16} {decoding:>6}: BLEU {value:5.2f} ({seconds:.1f} s)", flush=True)
    weights = load_checkpoint(average)["model"]
    checksum = {"file": str(average.name), "file_sha256": sha256_of(average),
                "weights_sha256": weights_sha256(weights),
                "parameters": sum(p.numel() for p in model.parameters())}
    return rows, checksum


# 4) the bench
@contextlib.contextmanager
def matmul_precision(precision: str):
    """float32 products in TF32 on tensor cores for "tf32", in full float32 otherwise."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def readable_bf16_step(size: bench.Size, vocab: tuple[int, int], device: torch.device
                       ) -> Callable:
    """bench.py's readable step with the forward pass under bfloat16 autocast, as the trainer
    runs it: the generator's log-probabilities and LabelSmoothing in float32."""
    torch.manual_seed(0)
    model = make_model(vocab[0], vocab[1], N=size.N, d_model=size.d_model, d_ff=size.d_ff,
                       h=size.h, dropout=0.1).to(device).train()
    criterion = LabelSmoothing(vocab[1], PAD_ID, smoothing=0.1)
    optimizer = bench.adam(model, fused=False)

    def step(batch) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            log_probs = model.generator(model(batch.src, batch.tgt, batch.src_mask,
                                              batch.tgt_mask))
        loss = criterion(log_probs.float().reshape(-1, vocab[1]), batch.tgt_y.reshape(-1))
        (loss / batch.ntokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def bench_step(path: str, precision: str, size: bench.Size, vocab: tuple[int, int],
               device: torch.device) -> Callable:
    """One optimizer step of the readable model or the fast path in one precision."""
    if precision == "bfloat16":
        if path == "readable":
            step = readable_bf16_step(size, vocab, device)
        else:
            step = bench.training_step("fast, bf16 autocast", size, vocab, device)[1]
    else:
        step = bench.training_step(path, size, vocab, device)[1]

    def run(batch) -> None:
        with matmul_precision(precision):
            step(batch)

    return run


def compiled_step(size: bench.Size, vocab: tuple[int, int], device: torch.device,
                  backend: str) -> Callable:
    """The fast path in bfloat16 with its model compiled in place (nn.Module.compile), so
    that bench.py's step calls the compiled forward. Token-budget batches differ in shape, so
    the graphs are compiled for dynamic shapes once, not again for every new shape."""
    model, step = bench.training_step("fast, bf16 autocast", size, vocab, device)
    model.compile(backend=backend, dynamic=True)
    return step


def time_compiled(step: Callable, batches: list, repeats: int, device: torch.device
                  ) -> tuple[list[float], float]:
    """Target tokens/s of each repeat after a warm-up pass (which compiles), and its seconds."""
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    bench.sync(device)
    warmup = time.perf_counter() - start
    tokens = sum(batch.ntokens for batch in batches)
    rates = []
    for _ in range(repeats):
        bench.sync(device)
        start = time.perf_counter()
        for batch in batches:
            step(batch)
        bench.sync(device)
        rates.append(float(tokens) / (time.perf_counter() - start))
    return rates, warmup


def run_bench(plan: Plan, device: torch.device, deadline: float,
              progress: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Training throughput rows: for each batch size, readable and fast in each precision,
    then the compiled fast path; a size or the compiled rows that would pass the deadline
    are left out and named in "skipped". progress(result) after each group of rows."""
    peaks = {}
    for precision in PRECISIONS:
        dtype = torch.bfloat16 if precision == "bfloat16" else torch.float32
        with matmul_precision(precision):
            peaks[precision] = bench.matmul_peak(device, plan.matmul_n, 5, dtype)
    datasheet = peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
    result = {"model": plan.bench_size, "vocab": list(plan.bench_vocab), "repeats": plan.repeats,
              "matmul_peak_tflops": {p: peaks[p] / 1e12 for p in PRECISIONS},
              "datasheet_bf16_tflops": datasheet, "rows": [], "skipped": []}
    sizes = [bench.Size(name, **plan.bench_size, max_tokens=max_tokens, steps=count)
             for name, max_tokens, count in plan.bench_batches]
    batches = {size.name: bench.budget_batches(size, plan.bench_vocab, size.steps, device)
               for size in sizes}
    fast_bf16_flops = {}
    for size in sizes:
        if time.perf_counter() > deadline - 20:
            result["skipped"].append(f"{size.name}: out of time")
            continue
        runs = {(path, precision): (bench_step(path, precision, size, plan.bench_vocab, device),
                                    batches[size.name])
                for path in ("readable", "fast") for precision in PRECISIONS}
        rates, flops = bench.time_training(runs, plan.repeats, device)
        tokens = sum(batch.ntokens for batch in batches[size.name])
        for (path, precision), (step, _) in runs.items():
            memory = bench.peak_memory(lambda s=step, b=batches[size.name][0]: s(b), device)
            median = statistics.median(rates[(path, precision)])
            result["rows"].append({
                "batch": size.name, "max_tokens": size.max_tokens, "path": path,
                "precision": precision, "compiled": False,
                "tokens_per_s": bench.spread(rates[(path, precision)]),
                "mfu": flops[(path, precision)] / (tokens / median) / peaks[precision],
                "flops_per_token": flops[(path, precision)] / tokens,
                "peak_memory_mb": memory, "steps": len(batches[size.name]),
                "tokens": int(tokens)})
        fast_bf16_flops[size.name] = flops[("fast", "bfloat16")] / tokens
        del runs
        progress(result)
        print(f"benched {size.name}", flush=True)
    if time.perf_counter() > deadline - 90:  # compiling takes a minute or more on a GPU
        result["skipped"].append("torch.compile: out of time")
        return result
    try:
        step = compiled_step(sizes[0], plan.bench_vocab, device, plan.compile_backend)
        for size in sizes:
            if size.name not in fast_bf16_flops:
                continue
            rates, warmup = time_compiled(step, batches[size.name], plan.repeats, device)
            median = statistics.median(rates)
            result["rows"].append({
                "batch": size.name, "max_tokens": size.max_tokens, "path": "fast",
                "precision": "bfloat16", "compiled": plan.compile_backend,
                "tokens_per_s": bench.spread(rates),
                "mfu": fast_bf16_flops[size.name] * median / peaks["bfloat16"],
                "flops_per_token": fast_bf16_flops[size.name], "compile_seconds": warmup,
                "peak_memory_mb": bench.peak_memory(
                    lambda b=batches[size.name][0]: step(b), device),
                "steps": len(batches[size.name]),
                "tokens": int(sum(b.ntokens for b in batches[size.name]))})
            progress(result)
            print(f"benched {size.name} compiled", flush=True)
    except Exception as err:  # a compiler failure is a finding of the run, not its end
        result["compile_error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:300]}"
        print(f"torch.compile failed: {result['compile_error']}", file=sys.stderr)
    return result


def bench_table(result: dict[str, Any]) -> str:
    """The bench rows as text, each with its ratio to float32 of its path and batch."""
    lines = []
    base = {}
    for row in result["rows"]:
        median = row["tokens_per_s"]["median"]
        first = base.setdefault((row["batch"], row["path"]), median)
        name = f"{row['path']}{', compiled' if row['compiled'] else ''}"
        lines.append(f"  {row['batch']:>4} {name:<16} {row['precision']:<9} {median:12,.0f} "
                     f"tokens/s  x{median / first:5.2f}  MFU {100 * row['mfu']:5.1f}%  "
                     f"{row['peak_memory_mb']:8.1f} MB")
    return "\n".join(lines)


# 5) the run
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"the JSON to write (default {DEFAULT_OUT.relative_to(ROOT)})")
    parser.add_argument("--dry-run", action="store_true",
                        help="the same steps on a CPU at tiny sizes (no GPU needed)")
    parser.add_argument("--checkpoint-dir", type=Path,
                        help="the run's folder (default checkpoints/gpu_run; dry run: a "
                             "temporary folder); its earlier run files are deleted")
    parser.add_argument("--budget-minutes", type=float, default=8.0,
                        help="the bench leaves out what would end the run later than this")
    parser.add_argument("--threads", type=int, help="CPU threads (dry run: 1)")
    parser.add_argument("--skip-tests", action="store_true", help="leave out tests/test_gpu.py")
    parser.add_argument("--skip-bench", action="store_true", help="leave out the bench")
    parser.add_argument("--export", type=Path, metavar="DIR",
                        help="also write the averaged model there as the book ships models "
                             "(half precision, about 15 MB: small enough to come back from a "
                             "device machine)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    start = time.perf_counter()
    args = parse_args(argv)
    try:
        if args.dry_run:
            os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the dry run is the CPU's, on any machine
        elif not torch.cuda.is_available():
            raise BadInput("no CUDA device here: run it on a GPU machine, or --dry-run for the "
                           "same steps on a CPU at tiny sizes")
        if args.threads is not None and args.threads < 1:
            raise BadInput(f"--threads must be at least 1, got {args.threads}")
        if args.budget_minutes <= 0:
            raise BadInput(f"--budget-minutes must be positive, got {args.budget_minutes}")
        check_out(args.out)
        if args.export is not None and args.export.exists() and not args.export.is_dir():
            raise BadInput(f"--export {args.export}: is a file; give a folder")
        data = check_data()
    except BadInput as err:
        print(f"gpu_run.py: error: {err}", file=sys.stderr)
        return 2
    device = torch.device("cpu") if args.dry_run else torch.device("cuda", 0)
    threads = args.threads if args.threads is not None else (1 if args.dry_run else None)
    if threads is not None:
        torch.set_num_threads(threads)
    deadline = start + 60 * args.budget_minutes
    with contextlib.ExitStack() as stack:
        folder = args.checkpoint_dir
        if folder is None:
            folder = (Path(stack.enter_context(tempfile.TemporaryDirectory()))
                      if args.dry_run else ROOT / "checkpoints" / "gpu_run")
        plan = (dry_plan if args.dry_run else real_plan)(folder)
        record = {
            "command": " ".join(["python tools/gpu_run.py", *(sys.argv[1:] if argv is None
                                                              else argv)]),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "dry_run": args.dry_run, "complete": False, "budget_minutes": args.budget_minutes,
            "device": device_info(device), "data": str(data), "steps": {},
        }
        try:
            save(record, args.out)
        except OSError as err:
            print(f"gpu_run.py: error: --out {args.out}: cannot write it ({err.strerror})",
                  file=sys.stderr)
            return 2

        def step(name: str, work: Callable[[], Any]) -> Any:
            """Run one step, note its seconds, and write the JSON after it."""
            began = time.perf_counter()
            print(f"== {name}", flush=True)
            try:
                return work()
            finally:
                record["steps"][name] = round(time.perf_counter() - began, 1)
                record["seconds"] = round(time.perf_counter() - start, 1)
                save(record, args.out)

        try:
            if not args.skip_tests:
                record["gpu_tests"] = step("gpu_tests",
                                           lambda: run_gpu_tests(dry_run=args.dry_run))
            record["training"] = {}
            average = step("training", lambda: train(plan, threads, record["training"]))
            scores, averaged = step("scores", lambda: score(average, device, plan.score_limit))
            record["scores"], record["averaged"] = scores, averaged
            if args.export is not None:
                shipped = step("export", lambda: export_for_shipping(
                    average, args.export, command=record["command"],
                    run=average.parent / "last.pt"))
                record["export"] = {"folder": str(args.export),
                                    "model_sha256": sha256_of(shipped)}
            record["training"]["mfu"] = (
                model_flops_utilization(record["training"]["tokens_per_s"],
                                        averaged["parameters"],
                                        peak_tflops(record["device"]["name"]))
                if device.type == "cuda" else None)
            if not args.skip_bench:
                def partial(result: dict[str, Any]) -> None:
                    record["bench"] = result
                    save(record, args.out)

                record["bench"] = step("bench", lambda: run_bench(plan, device, deadline,
                                                                  partial))
                print(bench_table(record["bench"]))
        except Exception as err:  # recorded, so that the JSON that comes back says what broke
            record["error"] = (str(err) if isinstance(err, StepFailed)
                               else f"{type(err).__name__}: {err}")
            save(record, args.out)
            if not isinstance(err, StepFailed):
                traceback.print_exc()
            print(f"gpu_run.py FAILED: {record['error'].splitlines()[0]}", file=sys.stderr)
            return 1
        record["complete"] = True
        record["seconds"] = round(time.perf_counter() - start, 1)
        save(record, args.out)
    training = record["training"]
    marks = ", ".join(f"{mark} BLEU: " + (f"{m:.1f} min" if m is not None else "not reached")
                      for mark, m in training["minutes_to_bleu"].items())
    print(f"{record['device']['name']}: {len(training['history'])} epochs in "
          f"{training['training_minutes']:.1f} training minutes ({marks}); "
          f"{training['tokens_per_s']:,.0f} tokens/s; whole run "
          f"{record['seconds'] / 60:.1f} min; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
