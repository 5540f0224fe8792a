"""Measure the encoded-corpus data path (book/appendix_data.ipynb) at the paper's data size.

    python tools/bench_data.py                        # 0.1, 1 and 4.5 million pairs
    python tools/bench_data.py --sizes 100000 1000000 # chosen sizes
    python tools/bench_data.py --quick                # one tiny size, in seconds (make test)

For each size it generates a parallel text (two plain files, seeded: sentences of 5 to 60
words, about 22 on average, drawn from a Zipf-like vocabulary of made-up words, the target about
as long as the source), then measures, each step in a fresh child process so that one step's
memory does not count against another's:

1. subwords: train_sentencepiece on a uniform sample of at most --sample sentences of both
   sides, read line by line (the vocabulary size is config_for_corpus's for the size): peak RSS
   and seconds;
2. encode: encode_corpus from the two files, line by line: peak RSS, seconds, pairs per second,
   and the size of the corpus folder on disk;
3. rank: what one training rank holds, --ranks ranks sharing the corpus: it maps the folder,
   builds its batches from the stored lengths (corpus_loader) and draws --draws batches through
   the DataLoader (ids read, padded, made tensors). Reported: its peak RSS minus the peak of a
   bare child that imports the same modules and does nothing else, and the resident size of the
   mapped corpus pages that it touched (the page cache, shared by every rank that maps them).

Peak RSS is resource.getrusage's ru_maxrss of the child. The table prints per size and per
million pairs; the results, with the machine (CPU, cores), torch and the date, go to --json
(book/data/bench_data_cpu.json by default; with --quick nothing is written unless --json is
given). Corpora are written under --work (/tmp/bench_data) and deleted after each size. Run it
with OMP_NUM_THREADS=1 on a shared machine: every step uses one core.
"""

import argparse
import datetime
import json
import os
import platform
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = (100_000, 1_000_000, 4_500_000)
QUICK_SIZE = 2_000
WORDS = 50_000  # made-up words per language
ZIPF = 1.1  # word r's weight is 1 / r^ZIPF
MB = 1 << 20


# ---- the text -----------------------------------------------------------------------------

def made_up_words(n: int, rng: random.Random) -> list[str]:
    """n distinct lower-case words of 2 to 12 letters, short ones first (the frequent ones)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    words, seen = [], set()
    while len(words) < n:
        length = min(12, 2 + int(rng.expovariate(1 / (2 + 4 * len(words) / n))))
        word = "".join(rng.choices(letters, k=length))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def write_corpus(folder: Path, pairs: int, seed: int) -> tuple[Path, Path]:
    """Two files of `pairs` lines each (src.txt, tgt.txt), written a chunk at a time."""
    import numpy as np

    rng = np.random.default_rng(seed)
    vocab = [made_up_words(WORDS, random.Random(seed + side)) for side in (0, 1)]
    weights = 1.0 / np.arange(1, WORDS + 1) ** ZIPF
    cumulative = np.cumsum(weights / weights.sum())
    paths = (folder / "src.txt", folder / "tgt.txt")
    folder.mkdir(parents=True, exist_ok=True)
    with paths[0].open("w", encoding="utf-8") as src, paths[1].open("w", encoding="utf-8") as tgt:
        for start in range(0, pairs, 50_000):
            n = min(50_000, pairs - start)
            # a source length of 5..60 words (lognormal, about 22 on average), a target of
            # 0.8 to 1.25 times it
            n_src = np.clip(np.round(rng.lognormal(3.0, 0.45, n)), 5, 60).astype(int)
            n_tgt = np.clip(np.round(n_src * rng.uniform(0.8, 1.25, n)), 5, 60).astype(int)
            for out, lengths, words in ((src, n_src, vocab[0]), (tgt, n_tgt, vocab[1])):
                ids = np.searchsorted(cumulative, rng.random(int(lengths.sum()))).tolist()
                lines, at = [], 0
                for length in lengths.tolist():
                    lines.append(" ".join([words[i] for i in ids[at : at + length]]))
                    at += length
                out.write("\n".join(lines) + "\n")
    return paths


# ---- the steps, each in a child process ------------------------------------------------

def peak_rss_mb() -> float:
    """This process's peak resident size so far (ru_maxrss: KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (MB if sys.platform == "darwin" else 1024)


def status_mb(field: str) -> float:
    """A field of /proc/self/status in MB (VmRSS: resident now, VmHWM: its peak); nan if none."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def reset_peak() -> float:
    """Reset this process's peak resident size (Linux: 5 into /proc/self/clear_refs), so that
    VmHWM measures only what follows; the resident size now, which the peak is compared with."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass
    return status_mb("VmRSS")


def mapped_rss_mb(folder: Path) -> float:
    """The resident size of this process's mappings of files in folder (/proc/self/smaps)."""
    total, inside = 0, False
    try:
        lines = Path("/proc/self/smaps").read_text().splitlines()
    except OSError:
        return float("nan")
    for line in lines:
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5 and ":" in fields[3]:
            inside = len(fields) >= 6 and fields[5].startswith(str(folder))
        elif inside and fields[:1] == ["Rss:"]:
            total += int(fields[1])
    return total / 1024


def step_subwords(args: dict) -> dict:
    from the_annotated_transformer import read_lines, train_sentencepiece

    before = reset_peak()
    start = time.perf_counter()
    # a uniform sample of at most args["sample"] sentences of both sides, read once (reservoir)
    rng, sample = random.Random(0), []
    lines = (line for path in args["paths"] for line in read_lines(path))
    for position, line in enumerate(lines):
        if len(sample) < args["sample"]:
            sample.append(line)
        elif (slot := rng.randrange(position + 1)) < args["sample"]:
            sample[slot] = line
    sp = train_sentencepiece(sample, vocab_size=args["subwords"], num_threads=1)
    Path(args["model"]).write_bytes(sp.serialized_model_proto())
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": peak_rss_mb(),
            "added_peak_mb": status_mb("VmHWM") - before, "pieces": len(sp)}


def step_encode(args: dict) -> dict:
    from the_annotated_transformer import encode_corpus, load_subwords, read_lines

    sp = load_subwords(args["model"])
    before = reset_peak()
    start = time.perf_counter()
    header = encode_corpus(read_lines(args["paths"][0]), read_lines(args["paths"][1]), sp,
                           args["corpus"], max_len=args["max_len"])
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": peak_rss_mb(),
            "added_peak_mb": status_mb("VmHWM") - before, "header": header}


def step_bare(args: dict) -> dict:
    import numpy  # noqa: F401  (the rank step's imports, and nothing else)
    import torch  # noqa: F401

    import the_annotated_transformer  # noqa: F401

    return {"peak_rss_mb": peak_rss_mb(), "rss_mb": status_mb("VmRSS")}


def step_rank(args: dict) -> dict:
    from the_annotated_transformer import EncodedCorpus, corpus_loader

    before = reset_peak()
    start = time.perf_counter()
    corpus = EncodedCorpus(args["corpus"])
    loader = corpus_loader(corpus, max_tokens=args["max_tokens"], shuffle=True, seed=0,
                           num_replicas=args["ranks"], rank=0)
    batches = len(loader)  # this rank's share of the epoch's batches, made here
    made = time.perf_counter() - start
    drawn, tokens = 0, 0
    start = time.perf_counter()
    for batch in loader:
        drawn += 1
        tokens += batch.ntokens
        if drawn == args["draws"]:
            break
    return {"batches_per_rank": batches, "batching_seconds": made,
            "draw_seconds": time.perf_counter() - start, "drawn": drawn, "tokens": int(tokens),
            "peak_rss_mb": peak_rss_mb(), "added_peak_mb": status_mb("VmHWM") - before,
            "added_rss_mb": status_mb("VmRSS") - before,
            "mapped_rss_mb": mapped_rss_mb(Path(args["corpus"]))}


STEPS = {"subwords": step_subwords, "encode": step_encode, "bare": step_bare, "rank": step_rank}


def in_child(step: str, args: dict) -> dict:
    """Run one step in a fresh Python process; its result as JSON on the last stdout line."""
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, __file__, "--child", step, json.dumps(args)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode != 0:
        raise SystemExit(f"bench_data.py: error: the {step} step failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---- one size, the table ---------------------------------------------------------------

def folder_mb(folder: Path) -> float:
    return sum(path.stat().st_size for path in folder.iterdir() if path.is_file()) / MB


def measure(pairs: int, work: Path, options: argparse.Namespace) -> dict:
    """Generate, encode and draw from a corpus of `pairs` pairs; the row of the table."""
    from the_annotated_transformer import config_for_corpus

    subwords = options.subwords or next(fields["subwords"] for fields, _ in
                                        config_for_corpus(pairs) if "subwords" in fields)
    folder = work / f"pairs_{pairs}"
    shutil.rmtree(folder, ignore_errors=True)
    try:
        start = time.perf_counter()
        paths = write_corpus(folder / "text", pairs, seed=options.seed)
        generated = time.perf_counter() - start
        text_mb = folder_mb(folder / "text")
        files = {"paths": [str(path) for path in paths], "model": str(folder / "subwords.model"),
                 "corpus": str(folder / "corpus")}
        subword = in_child("subwords", files | {"subwords": subwords, "sample": options.sample})
        encode = in_child("encode", files | {"max_len": options.max_len})
        bare = in_child("bare", {})
        rank = in_child("rank", files | {"max_tokens": options.max_tokens,
                                         "ranks": options.ranks, "draws": options.draws})
        header = encode["header"]
        load = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3
        row = {
            "pairs_read": header["read"], "pairs": header["pairs"], "dropped": header["dropped"],
            "subwords": subword["pieces"], "sample": min(options.sample, 2 * pairs),
            "ids": header["src_tokens"] + header["tgt_tokens"], "dtype": header["dtype"],
            "text_mb": round(text_mb, 1), "disk_mb": round(folder_mb(folder / "corpus"), 1),
            "generate_s": round(generated, 1),
            "subwords_s": round(subword["seconds"], 1),
            "subwords_peak_mb": round(subword["peak_rss_mb"], 1),
            "subwords_added_mb": round(subword["added_peak_mb"], 1),
            "encode_s": round(encode["seconds"], 1),
            "encode_peak_mb": round(encode["peak_rss_mb"], 1),
            "encode_added_mb": round(encode["added_peak_mb"], 1),
            "pairs_per_s": round(header["read"] / encode["seconds"]),
            "bare_peak_mb": round(bare["peak_rss_mb"], 1), "bare_rss_mb": round(bare["rss_mb"], 1),
            "rank_peak_mb": round(rank["peak_rss_mb"], 1),
            "rank_data_mb": round(rank["added_peak_mb"], 1),
            "rank_held_mb": round(rank["added_rss_mb"], 1),
            "rank_private_mb": round(rank["added_peak_mb"] - rank["mapped_rss_mb"], 1),
            "rank_mapped_mb": round(rank["mapped_rss_mb"], 1),
            "batches_per_rank": rank["batches_per_rank"],
            "batching_s": round(rank["batching_seconds"], 2),
            "drawn": rank["drawn"], "draw_s": round(rank["draw_seconds"], 2),
            "load_average_1_5_15_min": [round(x, 2) for x in load],  # others' work shares cores
        }
    finally:
        if not options.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return row


def print_table(rows: list[dict], options: argparse.Namespace) -> None:
    print(f"\nencoded corpus, max_len {options.max_len}; each rank: 1 of {options.ranks}, "
          f"max_tokens {options.max_tokens}, {options.draws} batches drawn")
    print(f"{'pairs':>10} {'dropped':>8} {'pieces':>6} {'text MB':>8} {'disk MB':>8} "
          f"{'spm s':>6} {'spm MB':>7} {'enc s':>7} {'enc MB':>7} {'pairs/s':>8} "
          f"{'rank MB':>8} {'mapped':>7} {'own MB':>7} {'batch s':>8}")
    for row in rows:
        print(f"{row['pairs_read']:>10,} {row['dropped']:>8,} {row['subwords']:>6} "
              f"{row['text_mb']:>8.1f} {row['disk_mb']:>8.1f} {row['subwords_s']:>6.1f} "
              f"{row['subwords_peak_mb']:>7.0f} {row['encode_s']:>7.1f} "
              f"{row['encode_peak_mb']:>7.0f} {row['pairs_per_s']:>8,} "
              f"{row['rank_data_mb']:>8.1f} {row['rank_mapped_mb']:>7.1f} "
              f"{row['rank_private_mb']:>7.1f} {row['batching_s']:>8.2f}")
    print("spm: sentencepiece on the sample, enc: encode_corpus (seconds, peak RSS of the whole "
          "process); rank MB: a rank's peak RSS above its RSS before it opened the corpus (of a "
          f"bare process's {rows[0]['bare_rss_mb']:.0f} MB: torch and the module), mapped: the "
          "corpus pages it touched (page cache, shared among ranks; at most the corpus on disk), "
          "own MB: the rest, its own; batch s: making its batches")
    print(f"\nper million pairs\n{'pairs':>10} {'disk MB':>8} {'enc s':>7} {'rank MB':>8} "
          f"{'batch s':>8}   (and, not per million: encoding's peak above its start)")
    for row in rows:
        m = row["pairs_read"] / 1e6
        print(f"{row['pairs_read']:>10,} {row['disk_mb'] / m:>8.1f} {row['encode_s'] / m:>7.1f} "
              f"{row['rank_data_mb'] / m:>8.1f} {row['batching_s'] / m:>8.2f}   "
              f"{row['encode_added_mb']:.0f} MB")


def machine() -> dict:
    import numpy
    import sentencepiece
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__,
            "numpy": numpy.__version__, "sentencepiece": sentencepiece.__version__,
            "python": platform.python_version(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, metavar="PAIRS",
                        help="corpus sizes in pairs (default: "
                             f"{' '.join(map(str, DEFAULT_SIZES))})")
    parser.add_argument("--quick", action="store_true",
                        help=f"one tiny size ({QUICK_SIZE:,} pairs), for the tests")
    parser.add_argument("--sample", type=int, default=1_000_000,
                        help="sentences (both sides) that sentencepiece trains on, at most")
    parser.add_argument("--subwords", type=int,
                        help="vocabulary size (default: config_for_corpus's for each size)")
    parser.add_argument("--max-len", type=int, default=72, help="pairs longer are left out")
    parser.add_argument("--max-tokens", type=int, default=4096,
                        help="padded tokens per batch on a rank (default: the base preset's)")
    parser.add_argument("--ranks", type=int, default=8, help="ranks sharing the corpus")
    parser.add_argument("--draws", type=int, default=300, help="batches a rank draws")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_data"),
                        help="where the corpora are written (and deleted after each size)")
    parser.add_argument("--keep", action="store_true", help="keep the corpora")
    parser.add_argument("--json", type=Path,
                        help="write the results here (default: book/data/bench_data_cpu.json; "
                             "with --quick, only when given)")
    options = parser.parse_args(argv)
    for name in ("sample", "max_tokens", "ranks", "draws"):
        if getattr(options, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be a positive integer")
    if options.sizes and options.quick:
        parser.error("give --sizes or --quick, not both")
    if options.sizes and min(options.sizes) < 100:
        parser.error("--sizes: each size must be at least 100 pairs")
    return options


def main(argv: list[str] | None = None) -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":  # one step, in its own process
        print(json.dumps(STEPS[sys.argv[2]](json.loads(sys.argv[3]))))
        return
    options = parse_args(argv)
    sizes = [QUICK_SIZE] if options.quick else (options.sizes or list(DEFAULT_SIZES))
    if options.quick:
        options.draws = min(options.draws, 20)
    rows = []
    for pairs in sizes:
        print(f"{pairs:,} pairs ...", file=sys.stderr, flush=True)
        rows.append(measure(pairs, options.work, options))
    print_table(rows, options)
    path = options.json or (None if options.quick else ROOT / "book/data/bench_data_cpu.json")
    if path is not None:
        settings = {name: getattr(options, name) for name in
                    ("sample", "subwords", "max_len", "max_tokens", "ranks", "draws", "seed")}
        result = {"machine": machine(), "settings": settings,
                  "command": "python tools/bench_data.py " + " ".join(sys.argv[1:]),
                  "sizes": rows}
        path.write_text(json.dumps(result, indent=1) + "\n", "utf-8")
        print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
