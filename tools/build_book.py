"""Build the HTML book into _build/html, with Sphinx warnings treated as errors."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    # --all: an incremental Sphinx build keeps stale navigation on pages it did not rewrite.
    command = ["jupyter-book", "build", str(ROOT), "--all", "--warningiserror", "--keep-going"]
    bindir = Path(sys.executable).parent
    result = subprocess.run([str(bindir / command[0]), *command[1:]], cwd=ROOT)
    if result.returncode != 0:
        sys.exit("the book did not build (see the warnings above)")
    index = ROOT / "_build" / "html" / "index.html"
    print(f"\nThe book is built. Open {index.as_uri()} in a browser,")
    print("or serve it: python -m http.server -d _build/html 8000")


if __name__ == "__main__":
    main()
