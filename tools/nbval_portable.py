"""Run the chapters under nbval as other machines would: one thread, and another CPU's kernels.

    python tools/nbval_portable.py [book/12_copy_task.ipynb ...]   (default: every chapter)

The stored outputs were made here with 2 threads and this CPU's AVX-512 kernels. A reader's
laptop, Colab or a CI runner computes the same cells with other float kernels, so the chapters
must pass nbval there too. Two runs go side by side, one thread each (2 processes x 1 thread,
never more than the 2 cores this book is tested on):

* `1 thread`: OMP_NUM_THREADS=1, this CPU's own kernels (other reduction orders);
* `other kernels`: OMP_NUM_THREADS=1 and ATEN_CPU_CAPABILITY one level below this CPU's:
  `avx2` on a CPU with AVX-512 (what a CPU without AVX-512 runs), `default` (PyTorch's
  portable kernels, no vector instructions) on a CPU whose best is AVX2.

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
# This CPU's best kernels (torch.backends.cpu.get_cpu_capability()) -> the set one level below.
LOWER_CAPABILITY = {"AVX512": "avx2", "AVX512_BF16": "avx2", "AVX512_VNNI": "avx2"}


def other_capability() -> str:
    """The ATEN_CPU_CAPABILITY that gives this CPU other kernels than its own best ones."""
    native = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    return LOWER_CAPABILITY.get(native, "default")


def variants() -> dict[str, dict[str, str]]:
    """The environments of the two runs."""
    return {
        "1 thread": {"OMP_NUM_THREADS": "1"},
        "other kernels": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": other_capability()},
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
    runs, envs = {}, variants()
    for name, env in envs.items():
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
        print(f"===== nbval, {name} ({envs[name]}): exit {code}, "
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
