"""annotated-transformer: train a Transformer translator, translate with it, score it, average it.

    annotated-transformer train --train train.en.gz train.fr.gz --valid val.en.gz val.fr.gz
    annotated-transformer translate --checkpoint checkpoints/en-fr/model < en.txt > fr.txt
    annotated-transformer evaluate --model checkpoints/en-fr/model --test test.en test.fr
    annotated-transformer average run/epoch_01{5,6,7}.pt --output run/average.pt

`annotated-transformer SUBCOMMAND --help` explains each one.
"""

import importlib
import shlex
import shutil
import sys
from pathlib import Path

SUBCOMMANDS = {
    "train": "train a translator on Multi30k or on your own parallel text",
    "translate": "translate lines from stdin to stdout with a trained model",
    "evaluate": "score models on test files (or Multi30k's splits) with sacreBLEU",
    "average": "average a run's last checkpoints into one model",
}


def command_name() -> str:
    """How a user can type this command to run it again: its name where PATH finds this one,
    else the path of the script beside this Python, else `python -m`."""
    script = Path(sys.executable).parent / "annotated-transformer"
    found = shutil.which("annotated-transformer")
    if found and Path(found).resolve() == script.resolve():
        return "annotated-transformer"
    if script.exists():
        try:
            return script.relative_to(Path.cwd()).as_posix()
        except ValueError:
            return shlex.quote(str(script))
    return f"{shlex.quote(sys.executable)} -m annotated_transformer_cli"


def usage() -> str:
    width = max(map(len, SUBCOMMANDS))
    lines = [f"  {name:<{width}}  {what}" for name, what in SUBCOMMANDS.items()]
    return ("usage: annotated-transformer {" + ",".join(SUBCOMMANDS) + "} ...\n\n"
            + __doc__.splitlines()[0] + "\n\n" + "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] in ("-h", "--help"):
        print(usage(), end="")
        return
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"annotated-transformer: error: unknown subcommand {name!r}; choose one of "
              + ", ".join(SUBCOMMANDS), file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(importlib.import_module(f"annotated_transformer_cli.{name}").main(rest))
