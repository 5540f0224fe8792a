"""Add one half-hour training run to book/data/fast_recipe.json, the file chapter 21 draws.

    python tools/record_run.py --name "cpu_fast, seed 2" --changes "cpu_fast with seed=2" \
        --command "python -c \"...train_worker(...)\"" \
        --checkpoint checkpoints/multi30k_cpu_fast_seed2/last.pt \
        --results /tmp/seed2_eval.json --weights S2="last epoch" \
        --weights avg="average of epochs 5 and 6"

The run's configuration, machine, training time and per-epoch history come from its last.pt; its
scores come from an `annotated-transformer evaluate` results file, validation rows only (the
book chooses on the validation split and never records a test score for these runs). --weights
names what each evaluated model was (its evaluate NAME). A run with the same --name is
replaced, and the others keep their order, which chapter 21 relies on.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

from the_annotated_transformer import load_checkpoint

RECIPE = Path(__file__).resolve().parents[1] / "book" / "data" / "fast_recipe.json"
HISTORY_KEYS = ("epoch", "train_loss", "val_loss", "val_ppl", "val_bleu", "seconds",
                "tokens_per_s")
EVALUATION_KEYS = ("decoding", "split", "bleu", "signature", "sentences")


def run_entry(name: str, changes: str, command: str, checkpoint: dict, results: list[dict],
              weights: dict[str, str]) -> dict:
    """The run as chapter 21 reads it: notes from the checkpoint, validation scores by model."""
    missing = sorted(set(weights) - {row["model"] for row in results})
    if missing:
        raise ValueError(f"no results for model(s) {', '.join(missing)} in the results file")
    return {
        "name": name, "changes": changes, "command": command, "config": checkpoint["config"],
        "hardware": checkpoint["hardware"], "torch": torch.__version__,
        **({"cpu": checkpoint["cpu"]} if "cpu" in checkpoint else {}),  # flags, kernels, caps
        "training_seconds": round(checkpoint["elapsed_s"], 1),
        "history": [{key: round(value, 4) if isinstance(value, float) else value
                     for key, value in row.items() if key in HISTORY_KEYS}
                    for row in checkpoint["history"]],
        "evaluation": [{key: row[key] for key in EVALUATION_KEYS}
                       | {"weights": weights[row["model"]]}
                       for row in results if row["model"] in weights and row["split"] == "val"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", required=True, help="the run's row name in chapter 21")
    parser.add_argument("--changes", required=True, help="what differs from its base preset")
    parser.add_argument("--command", required=True, help="the exact command that trained it")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the run's last.pt")
    parser.add_argument("--results", type=Path, required=True,
                        help="annotated-transformer evaluate's --results file for this "
                        "run's models")
    parser.add_argument("--weights", action="append", required=True, metavar="NAME=WEIGHTS",
                        help="an evaluated model's NAME and what its weights were")
    parser.add_argument("--recipe", type=Path, default=RECIPE, help=argparse.SUPPRESS)
    args = parser.parse_args()
    pairs = [item.split("=", 1) for item in args.weights]
    if any(len(pair) != 2 for pair in pairs):
        parser.error("--weights takes NAME=WEIGHTS, e.g. S2='last epoch'")
    try:
        results = json.loads(args.results.read_text())["results"]
        entry = run_entry(args.name, args.changes, args.command,
                          load_checkpoint(args.checkpoint), results, dict(pairs))
        recipe = json.loads(args.recipe.read_text())
    except (OSError, ValueError, KeyError, TypeError) as err:  # JSONDecodeError is a ValueError
        first_line = str(err).splitlines()[0] if str(err) else ""
        sys.exit(f"record_run.py: error: {type(err).__name__}: {first_line}")
    runs = recipe["runs"]
    names = [run["name"] for run in runs]
    if args.name in names:
        runs[names.index(args.name)] = entry
    else:
        runs.append(entry)
    partial = args.recipe.with_suffix(".json.partial")  # the old file stays whole until replaced
    partial.write_text(json.dumps(recipe, indent=1) + "\n")
    partial.replace(args.recipe)
    scores = ", ".join(f"{row['decoding']} {row['bleu']} ({row['weights']})"
                       for row in entry["evaluation"])
    print(f"{args.name}: {entry['training_seconds'] / 60:.1f} training min; {scores}")


if __name__ == "__main__":
    main()
