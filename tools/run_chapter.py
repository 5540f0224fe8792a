"""Execute chapter notebooks in place and store their outputs (what the book renders).

    python tools/run_chapter.py book/03_attention.ipynb [more.ipynb ...] [--from-twin]

`--from-twin` first takes the cells' text from the chapter's twin in book/twins/ (for those who
write in a text editor). Chapters run with the working directory `book/` and 2 threads, as
nbval runs them in `make test`, so the stored outputs are the ones the tests compare.
"""

import argparse
import os
import sys
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from sync import PAIRING, twin_path  # noqa: E402


def from_twin(path: Path) -> nbformat.NotebookNode:
    """The twin's cells, with the notebook's metadata when the notebook already exists."""
    nb = jupytext.read(twin_path(path))
    if path.exists():
        old = nbformat.read(path, as_version=4)
        nb.metadata = old.metadata
        for cell, before in zip(nb.cells, old.cells, strict=False):  # keep ids: smaller diffs
            if cell.cell_type == before.cell_type and "id" in before:
                cell.id = before.id
    nb.metadata.setdefault("jupytext", {})["formats"] = PAIRING
    nb.metadata["kernelspec"] = {
        "display_name": "Python 3", "language": "python", "name": "python3"
    }
    return nb


def execute(path: Path, nb: nbformat.NotebookNode) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    client = NotebookClient(
        nb,
        timeout=1800,
        kernel_name="python3",
        record_timing=False,  # no timestamps in the stored notebook: re-runs give small diffs
        resources={"metadata": {"path": str(path.parent)}},
    )
    client.execute()  # numbers the cells 1, 2, ... in order, as nbval expects
    nbformat.write(nb, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--from-twin", action="store_true")
    args = parser.parse_args()
    for path in args.notebooks:
        path = path.resolve()
        nb = from_twin(path) if args.from_twin else nbformat.read(path, as_version=4)
        print(f"running {path.relative_to(ROOT)}", flush=True)
        execute(path, nb)


if __name__ == "__main__":
    main()
