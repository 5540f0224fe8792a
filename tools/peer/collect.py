"""Gather one interleaved pair of runs, the book's recipe and JoeyNMT's, into the JSON file that
chapter 18 reads (book/data/peer_multi30k.json).

    .venv/bin/python tools/peer/collect.py \
        --book checkpoints/peer_book tools/peer/runs/book/results.json \
        --peer tools/peer/runs/multi30k/results.json \
        --peer tools/peer/runs/multi30k/results_alpha06.json \
        --out book/data/peer_multi30k.json

--book takes the book run's checkpoint folder (its model/info.json gives the training seconds, its
last.pt the optimizer steps) and the results.json that annotated-transformer evaluate wrote for it;
--peer takes each results.json that tools/peer/joeynmt_multi30k.py wrote for the same JoeyNMT run
(the first with training, later ones from --decode-only with another beam alpha), whose
model/validations.txt gives the peer's validation curve. Every score keeps its sacreBLEU signature;
runs scored under different signatures, or made on different machines, are refused. Bad input ends
with one line on stderr and exit status 2.
"""

import argparse
import json
import re
import sys
from pathlib import Path
from typing import NoReturn

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from the_annotated_transformer import load_checkpoint, rate  # noqa: E402

KEPT = ("decoding", "decoding_description", "split", "bleu", "signature", "chrf",
        "chrf_signature", "sentences", "mean_words")


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr and exit status 2, as the book's other tools do."""
    print(f"collect.py: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def book_system(folder: Path, results: Path) -> dict:
    """The book's run: training notes from its model folder, scores from its evaluate run."""
    info = json.loads((folder / "model" / "info.json").read_text("utf-8"))
    state = load_checkpoint(folder / "last.pt")
    scored = json.loads(results.read_text("utf-8"))["results"]
    config = info["config"]
    return {
        "system": "the book, cpu_fast_dropout", "command": info["command"],
        "evaluate_command": scored[0]["command"], "hardware": info["hardware"],
        "torch": info["torch"], "training_seconds": info["training_seconds"],
        "updates": state["train_state"]["accum_step"], "epochs": info["epochs"],
        "target_tokens": state["train_state"]["tokens"], "warmup": config["warmup"],
        "peak_lr": rate(config["warmup"], config["d_model"], config["lr_factor"],
                        config["warmup"]),
        "weights": f"average of {' and '.join(info['averaged_from'])}",
        "parameters": scored[0]["parameters"],
        "validation": [{"update": row["epoch"] * state["train_state"]["accum_step"]
                        // info["epochs"], "bleu": round(row["val_bleu"], 2)}
                       for row in info["history"] if "val_bleu" in row],
        "results": [{key: entry[key] for key in KEPT} for entry in scored],
    }


def peer_validations(run_dir: Path) -> list[dict]:
    """JoeyNMT's greedy validation BLEU (its own sacreBLEU call) at each validation, from the
    model folder's validations.txt, a line per validation: "Steps: 1000 ... bleu: 1.98 ..."."""
    rows = []
    for line in (run_dir / "model" / "validations.txt").read_text("utf-8").splitlines():
        fields = dict(re.findall(r"(\w+): ([\d.]+)", line))
        rows.append({"update": int(fields["Steps"]), "bleu": round(float(fields["bleu"]), 2)})
    return rows


def peer_schedule(run_dir: Path) -> dict:
    """The warm-up (updates) and peak learning rate of the run's config.yaml."""
    path = run_dir / "config.yaml"
    text = path.read_text("utf-8")
    warmup = re.search(r"^\s*learning_rate_warmup: (\d+)$", text, re.M)
    peak = re.search(r"^\s*learning_rate: ([\d.e+-]+)$", text, re.M)
    if warmup is None or peak is None:
        raise ValueError(f"{path} names no learning_rate_warmup or learning_rate")
    return {"warmup": int(warmup[1]), "peak_lr": float(peak[1])}


def peer_system(results: list[Path]) -> dict:
    """JoeyNMT's run: its training notes once, the scores of every decoding of it."""
    first = json.loads(results[0].read_text("utf-8"))
    entries: dict[tuple[str, str], dict] = {}  # each decoding once (greedy is in every file)
    for path in results:
        data = json.loads(path.read_text("utf-8"))
        if data["training"] != first["training"]:
            raise ValueError(f"{path} is another JoeyNMT run than {results[0]}")
        for entry in data["results"]:
            key = entry["decoding_description"], entry["split"]
            entries.setdefault(key, {name: entry[name] for name in KEPT})
    training = first["training"]
    return {
        "system": first["toolkit"], "command": first["command"], "hardware": first["hardware"],
        "torch": first["torch"], "training_seconds": training["training_seconds"],
        "budget_seconds": training["budget_seconds"], "updates": training["updates"],
        "target_tokens": training["target_tokens"], **peer_schedule(results[0].parent),
        "weights": f"best greedy validation BLEU (update {training['best_update']})",
        "parameters": training["parameters"],
        "validation": peer_validations(results[0].parent),
        "results": list(entries.values()),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--book", nargs=2, type=Path, required=True,
                        metavar=("RUN_DIR", "RESULTS"))
    parser.add_argument("--peer", type=Path, action="append", required=True,
                        metavar="RESULTS")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    try:
        systems = [book_system(*args.book), peer_system(args.peer)]
    except (OSError, ValueError) as err:  # a missing or unreadable file, bad JSON or bytes
        fail(str(err))
    except KeyError as err:
        fail(f"a run's notes lack the field {err}")
    signatures = {entry["signature"] for system in systems for entry in system["results"]}
    if len(signatures) != 1:
        fail(f"the runs were scored under {len(signatures)} BLEU "
                 f"signatures: {' and '.join(sorted(signatures))}")
    if len({system["hardware"] for system in systems}) != 1:
        fail("the runs were made on different machines: "
             + " and ".join(system["hardware"] for system in systems))
    try:
        args.out.write_text(json.dumps({"systems": systems}, indent=1) + "\n", "utf-8")
    except OSError as err:
        fail(str(err))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
