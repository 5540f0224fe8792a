"""Average the weights of a run's last checkpoints into one model, and optionally score it.

    annotated-transformer average checkpoints/multi30k_cpu_avg/epoch_01{5,6,7}.pt \
        --output checkpoints/multi30k_cpu_avg/average_15-17.pt
    annotated-transformer average checkpoints/multi30k_cpu_avg/epoch_01{5,6,7}.pt \
        --bleu --threads 1 --results book/models/multi30k_cpu/averaging.json --name "epochs 15-17"

The checkpoints must come from one training run (chapter 16 explains why); they are read with
weights_only=True. The averaged file holds the weights, the first checkpoint's configuration and the
list of files it was averaged from; the vocabularies are copied beside it, so that
`load_trained_model(output)` and `annotated-transformer translate --checkpoint` can use it. --bleu
translates the Multi30k validation and 2016 Flickr test sets greedily and scores them with
sacreBLEU, as chapter 14 does.
"""

import datetime
import json
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from annotated_transformer_cli.translate import OneLineParser
from the_annotated_transformer import (
    TrainConfig,
    average_checkpoints,
    bleu,
    hardware_name,
    load_checkpoint,
    load_multi30k,
    load_tokenizers,
    load_trained_model,
    save_checkpoint,
    translate,
    vocabulary_files,
)


def write_average(checkpoints: list[Path], output: Path) -> None:
    """Save the average of `checkpoints` to `output`, with the vocabularies beside it."""
    first = load_checkpoint(checkpoints[0])
    if "config" not in first:
        raise ValueError(f"checkpoint {checkpoints[0]} has no 'config': cannot rebuild its model")
    weights = average_checkpoints(checkpoints)
    save_checkpoint(
        {"model": weights, "config": first["config"],
         "averaged_from": [str(path) for path in checkpoints]},
        output,
    )
    fields = TrainConfig.__dataclass_fields__
    config = TrainConfig(**{k: v for k, v in first["config"].items() if k in fields})
    for name in vocabulary_files(config):
        source, target = checkpoints[0].parent / name, output.parent / name
        if not source.is_file():
            raise FileNotFoundError(f"no {name} beside {checkpoints[0]}: the model needs it")
        if source.resolve() != target.resolve():
            shutil.copyfile(source, target)


def greedy_bleu(path: Path, splits: list[str], limit: int | None) -> dict[str, dict]:
    """Greedy sacreBLEU of the model in `path` on each split, as chapter 14 measures it."""
    model, vocab_src, vocab_tgt, _ = load_trained_model(path)
    tokenizer = load_tokenizers()[0]
    scores = {}
    for split in splits:
        pairs = load_multi30k(split)[:limit]
        start = time.perf_counter()
        hypotheses = translate(model, [de for de, _ in pairs], vocab_src, vocab_tgt, tokenizer)
        score, signature = bleu(hypotheses, [en for _, en in pairs])
        seconds = time.perf_counter() - start
        scores[split] = {"bleu": round(score, 2), "sentences": len(pairs),
                         "seconds": round(seconds, 1), "signature": signature}
        print(f"{split:>16}: BLEU {score:.2f} on {len(pairs):,} sentences ({seconds:.0f} s)")
    return scores


def record(results: Path, entry: dict) -> None:
    """Add `entry` to the JSON file's list of results, replacing one with the same name."""
    data = json.loads(results.read_text("utf-8")) if results.is_file() else {"results": []}
    data["results"] = [r for r in data["results"] if r["name"] != entry["name"]] + [entry]
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=1) + "\n", "utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="annotated-transformer average",
                           description=__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", type=Path,
                        help="checkpoint files of one run (epoch_NNN.pt, last.pt or model.pt)")
    parser.add_argument("--output", type=Path, help="write the averaged model to this file")
    parser.add_argument("--bleu", action="store_true",
                        help="score the averaged model with greedy decoding and sacreBLEU")
    parser.add_argument("--splits", nargs="+", default=["val", "test_2016_flickr"],
                        help="Multi30k splits to score (default: val test_2016_flickr)")
    parser.add_argument("--limit", type=int, help="score only the first LIMIT sentences")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")
    parser.add_argument("--results", type=Path, help="add the scores to this JSON file")
    parser.add_argument("--name", help="the entry's name in --results (default: the files)")
    args = parser.parse_args(argv)
    if args.output is None and not args.bleu:
        parser.error("nothing to do: give --output, --bleu, or both")
    if args.results is not None and not args.bleu:
        parser.error("--results records BLEU scores: it needs --bleu")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        output = args.output or Path(folder) / "average.pt"
        try:  # missing, truncated or mismatched checkpoints: one line, not a traceback
            write_average(args.checkpoints, output)
        except (OSError, ValueError) as err:
            parser.exit(2, f"{parser.prog}: error: {' '.join(str(err).split())}\n")
        print(f"averaged {len(args.checkpoints)} checkpoint(s)"
              + (f" into {args.output}" if args.output else ""))
        if not args.bleu:
            return
        scores = greedy_bleu(output, args.splits, args.limit)
    if args.results is not None:
        record(args.results, {
            "name": args.name or " + ".join(str(path) for path in args.checkpoints),
            "checkpoints": [str(path) for path in args.checkpoints],
            "epochs": [load_checkpoint(path).get("epoch") for path in args.checkpoints],
            "scores": scores,
            "command": shlex.join(["annotated-transformer", "average",
                                   *(sys.argv[1:] if argv is None else argv)]),
            "hardware": hardware_name(torch.device("cpu"), 1),
            "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        })


if __name__ == "__main__":
    main()
