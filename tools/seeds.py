"""Run one of the book's experiments over several seeds and two kernel sets, into book/data.

    python tools/seeds.py sparse_sort --seeds 0 1 2 3 4
    python tools/seeds.py universal_sort --seeds 0 1 2
    python tools/seeds.py model_variations --seeds 0 1 2 3 4
    python tools/seeds.py norm_warmup --seeds 0 1 2 3 4
    python tools/seeds.py checkpoint_averaging --seeds 0 1 2 3 4
    python tools/seeds.py parse_data --seeds 0 1 2
    python tools/seeds.py caption_lm --seeds 0 1 2
    python tools/seeds.py running_average --seeds 0 1 2 3 4
    python tools/seeds.py copy_task --seeds 0 1 2 3 4
    python tools/seeds.py sort_task --seeds 0 1 2 3 4

A finding ("the window loses accuracy", "one shared layer sorts as well as two") compares
training runs, and one run can turn over on another seed or another CPU. This script trains
every variant of an experiment from each seed, once with this CPU's own kernels and once with
the kernel set one level below (`tools/nbval_portable.py` picks it: `avx2` on AVX-512,
`default` on AVX2), each (seed, kernels) pair in its own process with one thread, two at a time.
It writes `book/data/seeds_<experiment>.json`: the command, the machine, and one row per run.
The chapter reads that file, draws every run and claims only what holds in all of them;
nbval reruns one seed with bounds that every stored run met. A run already in the file is
kept, so an interrupted sweep resumes where it stopped.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))
from nbval_portable import other_capability  # noqa: E402

DATA = ROOT / "book" / "data"


def sparse_sort(seed: int) -> list[dict]:
    """Chapter 23: full against window + global encoder self-attention on the sort task."""
    from the_annotated_transformer import sparse_sort_accuracy

    names = {False: "full attention", True: "window r = 1 + 1 global"}
    return [{"variant": names[sparse], "exact": sparse_sort_accuracy(sparse, seed=seed)}
            for sparse in (False, True)]


def universal_sort(seed: int) -> list[dict]:
    """Chapter 26: the Universal Transformer's variants against chapter 13's model."""
    from the_annotated_transformer import UNIVERSAL_SORT_VARIANTS, universal_sort_run

    rows = []
    for variant in UNIVERSAL_SORT_VARIANTS:
        run = universal_sort_run(variant, seed=seed)
        rows.append({"variant": variant, **{k: v for k, v in run.items()
                                            if k not in ("model", "history")}})
    return rows


def model_variations(seed: int) -> list[dict]:
    """Chapter 19: the miniature Table 3, twelve variants of a small sort model."""
    from the_annotated_transformer import MINIATURE_VARIATIONS, train_variation

    return [{"row": row, "variant": variant, **train_variation(change, seed)}
            for row, variant, change in MINIATURE_VARIATIONS]


def norm_warmup(seed: int) -> list[dict]:
    """Chapter 19: post-norm against pre-norm, with and without warm-up."""
    from the_annotated_transformer import train_norm

    return [{"variant": f"{'pre' if pre else 'post'}-norm, "
                        f"{'warm-up' if warmup else 'no warm-up'}",
             "loss": train_norm(pre, warmup, seed)}
            for pre in (False, True) for warmup in (True, False)]


def checkpoint_averaging(seed: int) -> list[dict]:
    """Chapter 16: the last checkpoint of a sort run against averages of the last k."""
    from the_annotated_transformer import (
        average_checkpoints,
        held_out_accuracy,
        held_out_loss,
        sort_model_with_checkpoints,
    )

    model, checkpoints = sort_model_with_checkpoints(seed)
    weights = [w for _, w in checkpoints]
    rows = []
    for k in (1, 2, 5, 10, 20):
        averaged = average_checkpoints(weights[-k:])
        rows.append({"variant": "last checkpoint" if k == 1 else f"average of the last {k}",
                     "loss": held_out_loss(model, averaged),
                     "exact": held_out_accuracy(model, averaged)})
    return rows


def running_average(seed: int) -> list[dict]:
    """Chapter 16: at each of a sort run's last ten checkpoints, is the average of it and the
    four before it lower in held-out loss than the checkpoint alone? The share of the ten."""
    from the_annotated_transformer import (
        average_checkpoints,
        held_out_loss,
        sort_model_with_checkpoints,
    )

    model, checkpoints = sort_model_with_checkpoints(seed)
    weights = [w for _, w in checkpoints]
    ratios = [held_out_loss(model, weights[i])
              / held_out_loss(model, average_checkpoints(weights[i - 4 : i + 1]))
              for i in range(len(weights) - 10, len(weights))]  # single / average of 5
    return [{"variant": "average of 5 lower than the checkpoint",
             "share": sum(r > 1 for r in ratios) / len(ratios),
             "min_ratio": round(min(ratios), 3), "max_ratio": round(max(ratios), 3)}]


def parse_data(seed: int) -> list[dict]:
    """Chapter 20: dev F1 of the parser trained on a quarter, half and all of its sentences."""
    import random

    from the_annotated_transformer import (
        PARSE_MAX_WORDS,
        bracket_score,
        clean_tree,
        load_ptb_sample,
        parse_trees,
        split_by_file,
        train_parser,
        tree_words,
    )

    trees = {name: [clean_tree(t) for t in file] for name, file in load_ptb_sample().items()}
    short = {name: [t for t in split if len(tree_words(t)) <= PARSE_MAX_WORDS]
             for name, split in split_by_file(trees).items()}
    order = list(short["train"])
    random.Random(seed).shuffle(order)
    rows = []
    for fraction in (0.25, 0.5, 1.0):
        subset = order[: int(fraction * len(order))]
        model, src_vocab, tgt_vocab = train_parser(subset, epochs=12, seed=seed, log_every=12)
        parsed = parse_trees(model, short["dev"], src_vocab, tgt_vocab)
        rows.append({"variant": f"{len(subset)} sentences", "sentences": len(subset),
                     "F1": bracket_score(short["dev"], [p.tree for p in parsed]).f1,
                     "well formed": sum(p.well_formed for p in parsed) / len(parsed)})
    return rows


def caption_lm(seed: int) -> list[dict]:
    """Chapter 25: validation perplexity of the caption language model, sinusoidal against
    rotary positions (both tied), and tied against untied embeddings (both sinusoidal)."""
    from the_annotated_transformer import caption_language_model, multi30k_captions

    data = multi30k_captions()
    variants = {"sinusoidal, tied": {"positions": "sinusoidal"},
                "rotary, tied": {"positions": "rotary"},
                "sinusoidal, untied": {"positions": "sinusoidal", "tie_embeddings": False}}
    return [{"variant": name, "perplexity": caption_language_model(data, seed=seed, **options)[1]}
            for name, options in variants.items()]


def chapter_run(chapter: str, seed: int, stop: str) -> dict:
    """Run a chapter's code cells in order, up to and with the one that holds `stop`, with `seed`
    for the model's initialization and for the order of its training batches (the held-out
    sets stay the chapter's). The chapter's own code runs, not a copy of it; an assert that
    fails is listed in the namespace's `failed_asserts` instead of ending the run."""
    import nbformat

    swaps = {"torch.manual_seed(0)\nmodel = make_model(":
             f"torch.manual_seed({seed})\nmodel = make_model(",
             "train_data = torch.Generator().manual_seed(0)":
             f"train_data = torch.Generator().manual_seed({seed})"}
    namespace: dict = {"__name__": "__main__", "failed_asserts": []}
    swapped = 0
    for cell in nbformat.read(ROOT / "book" / f"{chapter}.ipynb", as_version=4).cells:
        if cell.cell_type != "code":
            continue
        source = cell.source
        for old, new in swaps.items():
            swapped += source.count(old)
            source = source.replace(old, new)
        try:
            exec(compile(source, f"<{chapter}>", "exec"), namespace)  # noqa: S102
        except AssertionError as err:
            namespace["failed_asserts"].append(str(err) or "assert")
        if stop in cell.source:
            break
    if swapped != len(swaps):
        raise SystemExit(f"seeds.py: error: {chapter} no longer seeds its model and its training "
                         f"batches as this tool expects ({swapped} of {len(swaps)} seeds found)")
    return namespace


def copy_task(seed: int) -> list[dict]:
    """Chapter 12: the copy model's best validation count and its test count, in shares."""
    run = chapter_run("12_copy_task", seed, stop="share = hits / queries")
    share = run["share"]  # (N, h): how often each cross-attention head points at the symbol
    common = {"epoch": run["best_epoch"], "steps": run["state"].accum_step,
              "share_max": round(float(share.max()), 3),
              "share_layer1": round(float(share[0].mean()), 3),
              "failed_asserts": run["failed_asserts"]}
    return [{"variant": "best validation", "exact": run["best_copies"] / len(run["valid_src"]),
             **common},
            {"variant": "test", "exact": run["test_copies"] / len(run["test_src"]), **common}]


def sort_task(seed: int) -> list[dict]:
    """Chapter 13: the sort model's best validation accuracy, its test accuracy, and the test
    accuracy of each length of sequence."""
    from the_annotated_transformer import PAD_ID

    run = chapter_run("13_sort_task", seed, stop="share = hits / queries")
    test_src, exact_matches = run["test_src"], run["exact_matches"]
    lengths = (test_src != PAD_ID).sum(dim=1)
    by_length = {}
    for n in sorted(set(lengths.tolist())):
        rows = test_src[lengths == n]
        batch = run["seq2seq_batch"](rows, run["sorted_symbols"](rows))
        by_length[str(n)] = round(exact_matches(run["model"], batch) / len(rows), 4)
    common = {"epoch": run["best_epoch"], "steps": run["state"].accum_step,
              "share_max": round(float(run["share"].max()), 3),
              "failed_asserts": run["failed_asserts"]}
    return [{"variant": "best validation", "exact": run["best_accuracy"], **common},
            {"variant": "test", "exact": run["test_accuracy"], "by_length": by_length, **common}]


EXPERIMENTS = {"sparse_sort": (sparse_sort, "23_transformer_as_a_graph"),
               "universal_sort": (universal_sort, "26_universal_transformer"),
               "model_variations": (model_variations, "19_model_variations"),
               "norm_warmup": (norm_warmup, "19_model_variations"),
               "checkpoint_averaging": (checkpoint_averaging, "16_checkpoint_averaging"),
               "running_average": (running_average, "16_checkpoint_averaging"),
               "parse_data": (parse_data, "20_constituency_parsing"),
               "caption_lm": (caption_lm, "25_what_came_after"),
               "copy_task": (copy_task, "12_copy_task"),
               "sort_task": (sort_task, "13_sort_task")}


def one_run(experiment: str, seed: int) -> None:
    """The worker: this process's kernels and every variant's row from one seed, as JSON."""
    import torch

    torch.set_num_threads(1)
    kernels = torch.backends.cpu.get_cpu_capability()
    start = time.perf_counter()
    rows = EXPERIMENTS[experiment][0](seed)
    print(json.dumps([{"seed": seed, "kernels": kernels, **row} for row in rows]))
    print(f"seed {seed}, {kernels}: {time.perf_counter() - start:.0f} s", file=sys.stderr)


def run_pair(experiment: str, seed: int, capability: str | None) -> list[dict]:
    """One worker process with one thread and the given ATEN_CPU_CAPABILITY (None: own)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability is not None:
        env["ATEN_CPU_CAPABILITY"] = capability
    done = subprocess.run(
        [sys.executable, __file__, experiment, "--worker", "--seeds", str(seed)],
        env=env, cwd=ROOT, capture_output=True, text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"seeds.py: error: seed {seed} ({capability or 'own kernels'}) "
                         f"failed:\n{done.stderr[-2000:]}")
    print(done.stderr.strip(), flush=True)
    return json.loads(done.stdout.splitlines()[-1])


def machine() -> dict:
    """What the runs were made on: the CPU, its own kernels, torch, and the thread count."""
    import torch

    cpu = platform.processor()
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"cpu": cpu, "own_kernels": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "threads": 1}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=sorted(EXPERIMENTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help="default: book/data/seeds_<experiment>.json")
    args = parser.parse_args()
    if args.worker:
        one_run(args.experiment, args.seeds[0])
        return 0
    if any(seed < 0 for seed in args.seeds):
        parser.error(f"--seeds must be integers >= 0, got {args.seeds}")
    out = args.out or DATA / f"seeds_{args.experiment}.json"
    if out.is_dir():
        parser.error(f"--out {out} is a folder; give a file name")
    stored = {"runs": []}
    if out.is_file():
        try:
            stored = json.loads(out.read_text())
            if not isinstance(stored, dict) or not isinstance(stored.get("runs"), list):
                raise ValueError("no list of runs")
        except (UnicodeDecodeError, ValueError) as err:
            parser.error(f"--out {out} is not a sweep this tool wrote ({type(err).__name__}); "
                         "move it away to start a new sweep")
    made_on = machine()
    own = made_on["own_kernels"]
    other = other_capability()
    done = {(r["seed"], r["kernels"]) for r in stored["runs"]}
    todo = [(seed, capability) for seed in args.seeds for capability in (None, other)
            if (seed, own if capability is None else capability.upper()) not in done]
    print(f"{args.experiment}: {len(todo)} (seed, kernels) pairs to run, {len(done)} stored",
          flush=True)
    if not todo:
        return 0
    runs = list(stored["runs"])
    with ThreadPoolExecutor(max_workers=2) as pool:  # 2 processes x 1 thread
        for rows in pool.map(lambda job: run_pair(args.experiment, *job), todo):
            runs += rows
            result = {"experiment": args.experiment,
                      "chapter": EXPERIMENTS[args.experiment][1],
                      "command": f"python tools/seeds.py {args.experiment} --seeds "
                                 + " ".join(str(s) for s in sorted({r['seed'] for r in runs})),
                      "machine": made_on, "runs": runs}
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1) + "\n")  # after each pair: resumable
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
