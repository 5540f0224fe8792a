"""Run every chapter under nbval once, as other machines would: one thread, another CPU's kernels.

    python tools/nbval_portable.py [--first book/12_copy_task.ipynb ...] [chapters ...]

The stored outputs were made here with 2 threads and this CPU's own kernels (`make nbval`
checks them under those same settings). A reader's laptop, Colab or a CI runner computes the
same cells with other float kernels and another thread count, so `make test` checks every
chapter the way such a machine would: with OMP_NUM_THREADS=1 and ATEN_CPU_CAPABILITY one level
below this CPU's, `avx2` on a CPU with AVX-512 (what a CPU without AVX-512 runs), `default`
(PyTorch's portable kernels, no vector instructions) on a CPU whose best is AVX2.

Two runs go side by side, one thread each (2 processes x 1 thread, never more than the 2 cores
this book is tested on): the chapters given with `--first` in one, every other chapter in the
other. Each run's output is printed when it ends; the script fails when either run fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from sync import chapters  # noqa: E402

# This CPU's best kernels (torch.backends.cpu.get_cpu_capability()) -> the set one level below.
LOWER_CAPABILITY = {"AVX512": "avx2", "AVX512_BF16": "avx2", "AVX512_VNNI": "avx2"}


def other_capability() -> str:
    """The ATEN_CPU_CAPABILITY that gives this CPU other kernels than its own best ones."""
    native = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    return LOWER_CAPABILITY.get(native, "default")


def split_runs(notebooks: list[Path], first: list[Path]) -> dict[str, tuple[dict, list]]:
    """Each run's name -> (its environment, its chapters); every chapter is in exactly one, and
    every run has one thread and the other kernels."""
    unknown = sorted(set(first) - set(notebooks))
    if unknown:
        raise SystemExit(f"nbval_portable.py: error: --first names a notebook that is "
                         f"not among the chapters run: {unknown[0]}")
    env = {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": other_capability()}
    runs = {
        "first half": (env, [nb for nb in notebooks if nb in first]),
        "second half": (env, [nb for nb in notebooks if nb not in first]),
    }
    return {name: run for name, run in runs.items() if run[1]}


def nbval_command(notebooks: list[Path]) -> list[str]:
    """The nbval command of `make nbval`, on the given notebooks."""
    return [
        sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
        "--nbval-sanitize-with", "tests/sanitize.cfg", "-q",
        *[str(nb.relative_to(ROOT)) for nb in notebooks],
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path,
                        help="chapters to run (default: every chapter of _toc.yml)")
    parser.add_argument("--first", action="append", default=[], type=Path, metavar="NOTEBOOK",
                        help="run this chapter in the first of the two runs")
    args = parser.parse_args()
    notebooks = [nb.resolve() for nb in args.notebooks] or chapters()
    runs = split_runs(notebooks, [nb.resolve() for nb in args.first])
    started = {}
    for name, (env, chosen) in runs.items():
        log = tempfile.TemporaryFile("w+", encoding="utf-8")  # read back when it ends
        process = subprocess.Popen(
            nbval_command(chosen), cwd=ROOT, env={**os.environ, **env},
            stdout=log, stderr=subprocess.STDOUT,
        )
        started[name] = (process, log, time.perf_counter())
    failed = []
    for name, (process, log, start) in started.items():
        code = process.wait()
        log.seek(0)
        env, chosen = runs[name]
        print(f"===== nbval, {name} ({env}), {len(chosen)} chapters: exit {code}, "
              f"{time.perf_counter() - start:.0f} s", flush=True)
        print(log.read(), flush=True)
        log.close()
        if code != 0:
            failed.append(name)
    if failed:
        print(f"nbval failed as another machine would run it: {', '.join(failed)}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
