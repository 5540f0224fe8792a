"""Measure the levers of chapter 21's half-hour recipe on this CPU, as ratios from one run.

    python tools/levers.py --out book/data/levers_avx2.json

Each lever changes one thing in the training step of the recipe `cpu_fast_dropout` (the fast
path, dropout where the paper puts it, Adam's fused step, 750-token batches, 8,000 shared
subwords) and trains on the same Multi30k sentences: their real ids, encoded by the variant's own
sentencepiece model and cut into batches by the trainer's TokenBudgetSampler. The variants take
turns, one pass of every variant and then the next, --repeats times, so that a slow minute slows
them alike. A lever's ratio is the recipe's median seconds for the sentences over the variant's:
above 1, the lever trains on the same text faster. What a lever does to BLEU is not measured
here; chapter 21's runs measure that. Packing is not timed: the share of padding in the recipe's
batches bounds what it could buy.

Emulate a CPU without AVX-512 by capping the kernel libraries before Python starts:
ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2; the output records
the caps and the kernels torch chose (cpu_notes).
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from the_annotated_transformer import (  # noqa: E402
    PAD_ID,
    Batch,
    Process,
    TokenBudgetSampler,
    build_training,
    collate_to_batch,
    cpu_notes,
    example_lengths,
    hardware_name,
    label_smoothing_loss,
    load_multi30k,
    train_sentencepiece,
    training_config,
)


@dataclass(frozen=True)
class Variant:
    """The recipe's training step with one lever moved."""

    name: str
    subwords: int = 8000
    max_tokens: int = 750
    dropout: float = 0.1
    compiled: bool = False


VARIANTS = (
    Variant("recipe (cpu_fast_dropout)"),
    Variant("torch.compile of the model", compiled=True),
    Variant("1,500-token batches", max_tokens=1500),
    Variant("6,000 subwords", subwords=6000),
    Variant("4,000 subwords", subwords=4000),
    Variant("no dropout (its random numbers)", dropout=0.0),
)


def encoded(pairs: list[tuple[str, str]], train: list[tuple[str, str]], vocab_size: int
            ) -> list[tuple[list[int], list[int]]]:
    """The pairs as ids of a sentencepiece model trained on all of `train`, as the runs do."""
    sp = train_sentencepiece([s for pair in train for s in pair], vocab_size=vocab_size)
    return [(sp.encode(de), sp.encode(en)) for de, en in pairs]


def batches(examples: list[tuple[list[int], list[int]]], max_tokens: int) -> list[Batch]:
    """The trainer's batches of these examples: token budget, lengths grouped, seed 0."""
    src_len, tgt_len = example_lengths(examples)
    sampler = TokenBudgetSampler(src_len, tgt_len, max_tokens=max_tokens, shuffle=True, seed=0)
    return [collate_to_batch([examples[i] for i in ids]) for ids in sampler.batches()]


def training_step(variant: Variant) -> tuple[torch.nn.Module, Callable[[Batch], None]]:
    """The recipe's model, built as the train command builds it, and one optimizer step of it."""
    config = training_config("cpu_fast_dropout", subwords=variant.subwords,
                             max_tokens=variant.max_tokens, dropout=variant.dropout)
    run = build_training(Process(0, 1, torch.device("cpu")), config, variant.subwords,
                         variant.subwords, warmup=config.warmup, total=10**6)
    model, optimizer = run.model.train(), run.optimizer
    if variant.compiled:  # inductor compiles in the first passes, which are not timed
        model.compile(dynamic=True)

    def step(batch: Batch) -> None:
        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
        logits = model.generator.proj(out)  # (batch, n, V): the fused loss takes the logits
        loss = label_smoothing_loss(logits.reshape(-1, logits.size(-1)),
                                    batch.tgt_y.reshape(-1), padding_idx=PAD_ID,
                                    smoothing=config.label_smoothing)
        (loss / batch.ntokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def padding_share(examples: list[tuple[list[int], list[int]]], max_tokens: int) -> float:
    """The share of source and target positions in the recipe's batches that are padding."""
    padded = real = 0
    for batch in batches(examples, max_tokens):
        padded += batch.src.numel() + batch.tgt.numel()
        real += int((batch.src != PAD_ID).sum() + (batch.tgt != PAD_ID).sum())
    return 1 - real / padded


def measure(sentences: int, repeats: int) -> dict:
    """Seconds per pass of every variant over the same sentences, interleaved, and the ratios."""
    train = load_multi30k("train")
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    pairs = [train[int(i)] for i in order[:sentences]]
    examples = {size: encoded(pairs, train, size) for size in {v.subwords for v in VARIANTS}}
    runs = {v.name: (training_step(v)[1], batches(examples[v.subwords], v.max_tokens))
            for v in VARIANTS}
    for name, (step, work) in runs.items():  # warm-up, and compilation
        start = time.perf_counter()
        for batch in work:
            step(batch)
        print(f"warm-up {name}: {time.perf_counter() - start:.1f} s", flush=True)
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for repeat in range(repeats):
        for name, (step, work) in runs.items():
            start = time.perf_counter()
            for batch in work:
                step(batch)
            seconds[name].append(time.perf_counter() - start)
        print(f"repeat {repeat + 1}/{repeats} done", flush=True)
    base = statistics.median(seconds[VARIANTS[0].name])
    rows = []
    for variant in VARIANTS:
        work = runs[variant.name][1]
        rows.append({
            "lever": variant.name, "subwords": variant.subwords,
            "max_tokens": variant.max_tokens, "dropout": variant.dropout,
            "compiled": variant.compiled, "steps": len(work),
            "target_tokens": sum(b.ntokens for b in work), "seconds": seconds[variant.name],
            "ratio": base / statistics.median(seconds[variant.name]),
        })
    return {"sentences": sentences, "repeats": repeats, "levers": rows,
            "padding_share": padding_share(examples[8000], 750)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=1500,
                        help="training sentences each variant trains on per pass (default 1500)")
    parser.add_argument("--repeats", type=int, default=3, help="timed passes (default 3)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)
    if args.sentences < 100 or args.repeats < 1 or args.threads < 1:
        parser.error("--sentences must be at least 100, --repeats and --threads at least 1")
    if args.out is not None:  # before minutes of measuring, not after
        if args.out.is_dir():
            parser.error(f"--out {args.out} is a folder; give a file name")
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--out {args.out}: cannot create its folder ({err.strerror})")
    torch.set_num_threads(args.threads)
    results = {"hardware": hardware_name(torch.device("cpu"), 1), "cpu": cpu_notes(),
               "torch": torch.__version__,
               "command": " ".join(["python", "tools/levers.py", *(argv or sys.argv[1:])]),
               **measure(args.sentences, args.repeats)}
    for row in results["levers"]:
        print(f"{row['lever']:<34} {row['ratio']:.3f}  ({row['steps']} steps, "
              f"{row['target_tokens']} target tokens)")
    print(f"padding: {results['padding_share']:.1%} of the recipe's batch positions")
    if args.out is not None:
        try:
            args.out.write_text(json.dumps(results, indent=1) + "\n")
        except OSError as err:  # the table above keeps the ratios
            sys.exit(f"levers.py: error: cannot write {args.out} ({err.strerror})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
