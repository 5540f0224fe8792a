"""Run the chapters under nbval as other machines would: one thread, and another CPU's kernels.

    python tools/nbval_portable.py [book/12_copy_task.ipynb ...]   (default: every chapter)

The stored outputs were made here with 2 threads and this CPU's AVX-512 kernels. A reader's
laptop, Colab or a CI runner computes the same cells with other float kernels, so the chapters
must pass nbval there too. Two runs go side by side, one thread each (2 processes x 1 thread,
never more than the 2 cores this book is tested on):

* `1 thread`: OMP_NUM_THREADS=1, this CPU's default kernels (other reduction orders);
* `avx2`: OMP_NUM_THREADS=1 and ATEN_CPU_CAPABILITY=avx2, PyTorch's AVX2 kernels, which is
  what a CPU without AVX-512 runs.

Each run's output is printed when it ends; the script fails when either run fails.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "1 thread": {"OMP_NUM_THREADS": "1"},
    "avx2": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2"},
}


def nbval_command(notebooks: list[str]) -> list[str]:
    """The nbval command of `make test`, on the given notebooks."""
    return [
        sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env",
        "--nbval-sanitize-with", "tests/sanitize.cfg", "-q", *notebooks,
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", default=["book"])
    args = parser.parse_args()
    runs = {}
    for name, env in VARIANTS.items():
        log = tempfile.TemporaryFile("w+", encoding="utf-8")  # read back when it ends
        runs[name] = (
            subprocess.Popen(
                nbval_command(args.notebooks), cwd=ROOT, env={**os.environ, **env},
                stdout=log, stderr=subprocess.STDOUT,
            ),
            log,
            time.perf_counter(),
        )
    failed = []
    for name, (process, log, start) in runs.items():
        code = process.wait()
        log.seek(0)
        print(f"===== nbval, {name} ({VARIANTS[name]}): exit {code}, "
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
