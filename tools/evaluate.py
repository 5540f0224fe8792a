"""Score trained models with sacreBLEU under several decodings, for chapter 18's results table.

    python tools/evaluate.py --model words=book/models/multi30k_cpu \
        --model subwords=checkpoints/multi30k_cpu_subword/last.pt \
        --decodings greedy beam4 --splits val test_2016_flickr --threads 2 \
        --results book/models/multi30k_cpu_subword/results.json

Each model is NAME=PATH, where PATH is anything load_trained_model reads (a shipped folder, a
model.pt, last.pt or an averaged checkpoint with its vocabularies beside it). Each decoding is
one of DECODINGS below. Every (model, decoding, split) gets one entry in --results, replacing
an entry with the same three names, with its BLEU, sacreBLEU's signature, the time it took and
the mean output length (and with --keep-outputs the translations); a line per entry is
printed as it is measured.
"""

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from the_annotated_transformer import (
    beam_translate,
    bleu,
    hardware_name,
    load_multi30k,
    load_tokenizers,
    load_trained_model,
    translate,
)

# name: (description, keyword arguments of translate or beam_translate)
DECODINGS = {
    "greedy": ("greedy", {}),
    "greedy-unk": ("greedy, <unk> allowed", {"allow_unk": True}),
    "beam4": ("beam 4, alpha 0.6", {"beam_size": 4, "alpha": 0.6}),
    "beam4-narrowing": ("beam 4, alpha 0.6, narrowing beam",
                        {"beam_size": 4, "alpha": 0.6, "narrowing": True}),
}


def model_spec(text: str) -> tuple[str, Path]:
    """NAME=PATH from the command line."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH")
    return name, Path(path)


def decode(model, sources: list[str], vocabs: tuple, tokenizer, decoding: str) -> list[str]:
    """The model's translations of sources with the named decoding."""
    kwargs = DECODINGS[decoding][1]
    if "beam_size" in kwargs:
        return beam_translate(model, sources, *vocabs, tokenizer, use_cache=True, **kwargs)
    return translate(model, sources, *vocabs, tokenizer, **kwargs)


def record(results: Path, entries: list[dict]) -> None:
    """Add entries to the JSON file, replacing those with the same model, decoding and split."""
    data = json.loads(results.read_text("utf-8")) if results.is_file() else {"results": []}
    keys = {(e["model"], e["decoding"], e["split"]) for e in entries}
    kept = [e for e in data["results"] if (e["model"], e["decoding"], e["split"]) not in keys]
    data["results"] = kept + entries
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=1) + "\n", "utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=model_spec, action="append", required=True,
                        help="NAME=PATH of a model to score (repeat for several)")
    parser.add_argument("--decodings", nargs="+", choices=sorted(DECODINGS), default=["greedy"])
    parser.add_argument("--splits", nargs="+", default=["val", "test_2016_flickr"],
                        choices=["val", "test_2016_flickr"],
                        help="Multi30k splits to score (the other test sets stay unused)")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")
    parser.add_argument("--results", type=Path, required=True, help="JSON file to add to")
    parser.add_argument("--keep-outputs", action="store_true",
                        help="store the translations too, for scoring them in other ways")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    command = shlex.join(["python", "tools/evaluate.py", *(sys.argv[1:] if argv is None else argv)])
    pairs = {split: load_multi30k(split) for split in args.splits}
    jobs = [(name, path, decoding, split) for name, path in args.model
            for decoding in args.decodings for split in args.splits]
    loaded, tokenizer = {}, load_tokenizers()[0]
    for name, path, decoding, split in tqdm(jobs, desc="evaluating", unit="run"):
        if name not in loaded:
            try:
                loaded[name] = load_trained_model(path)
            except (OSError, ValueError) as err:
                sys.exit(f"evaluate.py: error: model {name}: {err}")
        model, vocab_src, vocab_tgt, _ = loaded[name]
        sources, references = zip(*pairs[split], strict=True)
        start = time.perf_counter()
        outputs = decode(model, list(sources), (vocab_src, vocab_tgt), tokenizer, decoding)
        seconds = time.perf_counter() - start
        score, signature = bleu(outputs, list(references))
        entry = {
            "model": name, "path": str(path), "decoding": decoding,
            "decoding_description": DECODINGS[decoding][0], "split": split,
            "bleu": round(score, 2), "signature": signature, "sentences": len(outputs),
            "seconds": round(seconds, 1),
            "mean_words": round(sum(len(o.split()) for o in outputs) / len(outputs), 2),
            "parameters": sum(p.numel() for p in model.parameters()),  # a tied matrix once
            "command": command, "hardware": hardware_name(torch.device("cpu"), 1),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        }
        if args.keep_outputs:
            entry["outputs"] = outputs
        record(args.results, [entry])
        tqdm.write(f"{name:>12} {decoding:>16} {split:>16}: BLEU {score:5.2f} "
                   f"({seconds:.0f} s, {entry['mean_words']} words per output)")


if __name__ == "__main__":
    main()
