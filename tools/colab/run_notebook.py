"""Execute one notebook top to bottom with nbclient, for tools/colab_check.py.

Runs inside the Colab venv, so nbclient, jupyter_client and the kernel are Colab's versions; the
kernel is `python -m ipykernel_launcher` of this very interpreter (a kernel spec written into
the user's Jupyter folder, under the fresh HOME that the harness gives each notebook). Writes
the executed notebook beside the input and a JSON result: {"ok": bool, "error": the error's
first line or "", "cell": the failing cell's index or null}.
usage: python run_notebook.py NOTEBOOK RESULT_JSON --timeout SECONDS
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import nbclient
import nbformat
from jupyter_core.paths import jupyter_data_dir
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

KERNEL_NAME = "colab-check"


def write_kernel_spec() -> None:
    """A kernel spec, in the user's Jupyter folder, that starts this interpreter's ipykernel."""
    spec_dir = Path(jupyter_data_dir()) / "kernels" / KERNEL_NAME
    spec_dir.mkdir(parents=True, exist_ok=True)
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (Colab check)", "language": "python"}
    (spec_dir / "kernel.json").write_text(json.dumps(spec))


def first_line(text: str) -> str:
    """The first non-empty line of text (an error's summary)."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def execute(notebook: Path, timeout: int) -> dict:
    """Run every cell in the notebook's folder; the result as run_notebook.py writes it."""
    nb = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=timeout, kernel_name=KERNEL_NAME,
                                     resources={"metadata": {"path": str(notebook.parent)}})
    result = {"ok": True, "error": "", "cell": None}
    try:
        client.execute()
    except CellExecutionError as err:
        result = {"ok": False, "error": first_line(f"{err.ename}: {err.evalue}"), "cell": None}
    except (CellTimeoutError, DeadKernelError) as err:
        result = {"ok": False, "error": first_line(f"{type(err).__name__}: {err}"), "cell": None}
    for index, cell in enumerate(nb.cells):  # the first cell with an error output
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
            result["cell"] = index
            break
    nbformat.write(nb, notebook.with_name(notebook.stem + ".executed.ipynb"))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("result", type=Path)
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args()
    write_kernel_spec()
    args.result.write_text(json.dumps(execute(args.notebook, args.timeout)))


if __name__ == "__main__":
    main()
