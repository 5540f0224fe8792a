"""A peer's number on the same work: JoeyNMT 2.3.0 trained on Multi30k German->English for the
book's training-time budget, decoded greedy and with beam 4, scored as the book scores.

Run it with the peer's own virtual environment (tools/peer/README.md sets it up):

    tools/peer/.venv/bin/python tools/peer/joeynmt_multi30k.py --threads 2
    tools/peer/.venv/bin/python tools/peer/joeynmt_multi30k.py --budget 120 --threads 1 \
        --eval-sentences 200 --run-dir tools/peer/runs/smoke            # a smoke run

Steps: 1) write Multi30k's splits as JoeyNMT's plain files, with the book's joint sentencepiece BPE
of 8,000 pieces trained on both sides of the training split; 2) fill the config template
tools/peer/joeynmt_multi30k.yaml (--set KEY=VALUE changes a field, dotted keys); 3) train with
JoeyNMT's own trainer until --budget seconds of training are spent (validation not counted, as the
book does not count it), then validate once more so best.ckpt has seen the last weights; 4) decode
val and test_2016_flickr with best.ckpt, greedy and beam 4; 5) score with the book's sacreBLEU BLEU
and chrF (the_annotated_transformer.bleu and annotated_transformer_cli.evaluate.chrf) and write <run
dir>/results.json. The budget defaults to the training seconds of the book's shipped
cpu_fast_dropout model (book/models/multi30k_cpu_fast_dropout/info.json).
"""

import argparse
import copy
import datetime
import json
import os
import platform
import shlex
import string
import sys
import time
from pathlib import Path
from typing import Any

import torch
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path += [str(ROOT), str(ROOT / "tools")]  # the book's module and its scoring script, last

from joeynmt.config import parse_global_args, set_validation_args  # noqa: E402
from joeynmt.helpers import make_model_dir  # noqa: E402
from joeynmt.helpers_for_ddp import get_logger  # noqa: E402
from joeynmt.prediction import prepare, test  # noqa: E402
from joeynmt.training import TrainManager  # noqa: E402

import the_annotated_transformer as book  # noqa: E402

TEMPLATE = Path(__file__).with_suffix(".yaml")
BOOK_MODEL_INFO = ROOT / "book/models/multi30k_cpu_fast_dropout/info.json"
SPLITS = {"val": "dev", "test_2016_flickr": "test"}  # Multi30k split: JoeyNMT's name for it
DECODINGS = {"greedy": 1, "beam4": 4}  # name: JoeyNMT's beam_size (1 is greedy search)


class BudgetTrainManager(TrainManager):
    """JoeyNMT's TrainManager that stops after `budget` seconds of training: it has a limit on
    updates and epochs but none on time. Time spent validating is not counted."""

    def __init__(self, budget: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.budget = budget
        self.started = time.perf_counter()
        self.validation_seconds = 0.0

    def training_seconds(self) -> float:
        """Wall-clock seconds since training began, less those spent validating."""
        return time.perf_counter() - self.started - self.validation_seconds

    def train_and_validate(self, train_data: Any, valid_data: Any) -> None:
        self.started, self.validation_seconds = time.perf_counter(), 0.0
        super().train_and_validate(train_data, valid_data)

    def _train_step(self, batch: Any) -> tuple[float, int]:
        # JoeyNMT ends its batch loop, after this batch's update, once is_max_update is set
        result = super()._train_step(batch)
        if self.training_seconds() >= self.budget:
            self.stats.is_max_update = True
        return result

    def _validate(self, valid_data: Any) -> None:
        start = time.perf_counter()
        super()._validate(valid_data)
        self.validation_seconds += time.perf_counter() - start


def allow_whole_vocabulary() -> None:
    """Give sentencepiece back the SetVocabulary that JoeyNMT 2.3.0 calls and sentencepiece 0.2
    (the book's) no longer has. JoeyNMT uses it to forbid pieces outside its vocabulary; ours is
    the model's whole piece list, so nothing is forbidden: the stand-in checks that and does
    nothing else."""
    import sentencepiece as spm

    if hasattr(spm.SentencePieceProcessor, "SetVocabulary"):
        return

    def set_vocabulary(self: spm.SentencePieceProcessor, valid_vocab: list[str]) -> None:
        known = set(valid_vocab)
        missing = [self.id_to_piece(i) for i in range(self.get_piece_size())
                   if self.id_to_piece(i) not in known]
        if missing:
            raise ValueError(f"{len(missing)} sentencepiece pieces are not in JoeyNMT's "
                             f"vocabulary (first {missing[0]!r}): write vocab.txt from the model")

    spm.SentencePieceProcessor.SetVocabulary = set_vocabulary


def book_budget() -> float:
    """The training seconds of the book's shipped cpu_fast_dropout model."""
    info = json.loads(BOOK_MODEL_INFO.read_text("utf-8"))
    return float(info["training_seconds"])


def write_lines(path: Path, lines: list[str]) -> None:
    """One sentence a line, as JoeyNMT's plain dataset reads them."""
    if any("\n" in line for line in lines):
        raise ValueError(f"{path}: a sentence holds a line break")
    path.write_text("".join(line + "\n" for line in lines), "utf-8")


def write_data(data_dir: Path, source_dir: Path | None, eval_sentences: int | None,
               vocab_size: int) -> dict[str, list[str]]:
    """Write the splits and the joint sentencepiece model and vocabulary into data_dir; return
    each evaluated split's English references."""
    data_dir.mkdir(parents=True, exist_ok=True)
    references = {}
    for split in ["train", *SPLITS]:
        pairs = book.load_multi30k(split, source_dir)
        if split != "train" and eval_sentences:
            pairs = pairs[:eval_sentences]
        german, english = (list(side) for side in zip(*pairs, strict=True))
        write_lines(data_dir / f"{split}.de", german)
        write_lines(data_dir / f"{split}.en", english)
        if split == "train":  # 1) the book's segmentation, as the train command trains it
            sentences = [s for pair in pairs for s in pair]
            sp = book.train_sentencepiece(sentences, vocab_size=vocab_size)
            (data_dir / "sp.model").write_bytes(sp.serialized_model_proto())
            pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
            write_lines(data_dir / "vocab.txt", pieces)
        else:
            references[split] = english
    return references


def parse_override(text: str) -> tuple[list[str], Any]:
    """KEY=VALUE from --set: the dotted key's parts and the value as YAML reads it."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--set {text!r} is not KEY=VALUE")
    return key.split("."), yaml.safe_load(value)


def apply_override(cfg: dict, keys: list[str], value: Any) -> None:
    """Set cfg[k1][k2]...[kn] = value; a key the template lacks is an error (a typo)."""
    node = cfg
    for i, key in enumerate(keys):
        if not isinstance(node, dict) or key not in node:
            raise ValueError(f"--set {'.'.join(keys)}: the config has no {'.'.join(keys[:i + 1])}")
        if i == len(keys) - 1:
            node[key] = value
        else:
            node = node[key]


def write_config(run_dir: Path, seed: int, overrides: list[tuple[list[str], Any]]) -> dict:
    """The template with its placeholders filled and the overrides applied, saved beside the
    run as config.yaml."""
    text = string.Template(TEMPLATE.read_text("utf-8")).substitute(
        run_dir=run_dir.resolve().as_posix(), seed=seed)
    cfg = yaml.safe_load(text)
    for keys, value in overrides:
        apply_override(cfg, keys, value)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False), "utf-8")
    return cfg


def train(cfg: dict, budget: float) -> dict[str, Any]:
    """Train within the budget; return what the run did (steps, tokens, seconds, speed)."""
    model_dir = Path(cfg["model_dir"])
    make_model_dir(model_dir, overwrite=True)
    get_logger("", log_file=(model_dir / "train.log").as_posix())
    args = parse_global_args(copy.deepcopy(cfg), rank=0, mode="train")
    model, train_data, dev_data, _ = prepare(args, rank=0, mode="train")
    trainer = BudgetTrainManager(
        budget, model=model, model_dir=args.model_dir, device=args.device, n_gpu=args.n_gpu,
        rank=0, num_workers=args.num_workers, autocast=args.autocast, seed=args.seed,
        train_args=args.train, dev_args=set_validation_args(args.test),
    )
    trainer.train_and_validate(train_data=train_data, valid_data=dev_data)
    seconds, stats = trainer.training_seconds(), trainer.stats
    print(f"trained {seconds:.0f} s: {stats.steps} updates, {stats.total_tokens} target tokens "
          f"({stats.total_tokens / seconds:.0f} a second)", flush=True)
    if stats.steps % args.train.validation_freq:  # weights newer than the last validation
        trainer._validate(dev_data)
    return {
        "budget_seconds": budget, "training_seconds": round(seconds, 1),
        "validation_seconds": round(trainer.validation_seconds, 1),
        "updates": stats.steps, "epochs_started": stats.epochs,
        "target_tokens": stats.total_tokens,
        "target_tokens_per_s": round(stats.total_tokens / seconds, 1),
        "best_update": stats.best_ckpt_iter, "best_val_bleu_greedy": stats.best_ckpt_score,
        "parameters": sum(p.numel() for p in model.parameters()),
    }


def decode(cfg: dict, run_dir: Path, beam_alpha: float) -> dict[tuple[str, str], tuple]:
    """Each (decoding, split)'s hypotheses from best.ckpt and the seconds they took."""
    cfg = copy.deepcopy(cfg)
    cfg["testing"]["load_model"] = (Path(cfg["model_dir"]) / "best.ckpt").as_posix()
    args = parse_global_args(copy.deepcopy(cfg), rank=0, mode="test")
    model, _, dev_data, test_data = prepare(args, rank=0, mode="test")
    data = {"dev": dev_data, "test": test_data}
    outputs = {}
    for decoding, beam_size in DECODINGS.items():
        cfg["testing"]["beam_size"], cfg["testing"]["beam_alpha"] = beam_size, beam_alpha
        prefix = run_dir / "hyps" / decoding
        prefix.parent.mkdir(exist_ok=True)
        for split, name in SPLITS.items():
            only = {"model": model, "dev": None, "test": None, name: data[name]}
            start = time.perf_counter()
            test(cfg=copy.deepcopy(cfg), output_path=prefix.as_posix(), prepared=only)
            seconds = time.perf_counter() - start
            lines = Path(f"{prefix}.{name}").read_text("utf-8").split("\n")[:-1]
            outputs[decoding, split] = lines, seconds
    return outputs


def score(outputs: dict, references: dict[str, list[str]], beam_alpha: float) -> list[dict]:
    """The book's BLEU and chrF with their sacreBLEU signatures for every output."""
    from annotated_transformer_cli.evaluate import chrf  # the function the book's table uses

    entries = []
    for (decoding, split), (hypotheses, seconds) in outputs.items():
        bleu, signature = book.bleu(hypotheses, references[split])
        chrf_score, chrf_signature = chrf(hypotheses, references[split])
        description = "greedy" if decoding == "greedy" else f"beam 4, alpha {beam_alpha}"
        entries.append({
            "decoding": decoding, "decoding_description": description, "split": split,
            "bleu": round(bleu, 2), "signature": signature,
            "chrf": round(chrf_score, 2), "chrf_signature": chrf_signature,
            "sentences": len(hypotheses), "seconds": round(seconds, 1),
            "mean_words": round(sum(len(h.split()) for h in hypotheses) / len(hypotheses), 2),
        })
        print(f"{decoding:>8} {split:>16}: BLEU {bleu:5.2f}, chrF {chrf_score:5.2f} "
              f"({seconds:.0f} s)", flush=True)
    return entries


def cpu_model() -> str:
    """The processor's model name as Linux reports it (platform's guess elsewhere)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float,
                        help="training seconds, validation excluded (default: the book's "
                             "cpu_fast_dropout model's, from its info.json)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "tools/peer/runs/multi30k",
                        help="folder for data, model, hypotheses and results.json (replaced)")
    parser.add_argument("--data-dir", type=Path,
                        help="Multi30k folder (default: the book's, $MULTI30K_DIR or "
                             "../shared/data/multi30k, downloaded if missing)")
    parser.add_argument("--eval-sentences", type=int,
                        help="validate and score only the first N sentences of val and test "
                             "(for a smoke run; default all)")
    parser.add_argument("--beam-alpha", type=float, default=1.0,
                        help="beam search length penalty (default JoeyNMT's documented 1.0)")
    parser.add_argument("--seed", type=int, default=42, help="JoeyNMT's random_seed")
    parser.add_argument("--decode-only", action="store_true",
                        help="decode and score the model already in --run-dir (another "
                             "--beam-alpha, say) without training; --set and data options "
                             "are ignored")
    parser.add_argument("--results", type=Path,
                        help="where to write the results (default <run dir>/results.json)")
    parser.add_argument("--set", type=parse_override, action="append", default=[],
                        metavar="KEY=VALUE", help="change a config field, e.g. "
                        "training.learning_rate=0.0005 (repeat for several)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be at least 1, got {args.threads}")
    if args.budget is not None and args.budget <= 0:
        parser.error(f"--budget must be a positive number of seconds, got {args.budget}")
    if args.eval_sentences is not None and args.eval_sentences < 1:
        parser.error(f"--eval-sentences must be at least 1, got {args.eval_sentences}")
    return args


def read_references(data_dir: Path) -> dict[str, list[str]]:
    """The English references that write_data wrote for the evaluated splits."""
    return {split: (data_dir / f"{split}.en").read_text("utf-8").split("\n")[:-1]
            for split in SPLITS}


def prepare_run(args: argparse.Namespace) -> tuple[dict, dict[str, list[str]], dict | None]:
    """The config, the references and (with --decode-only) the earlier run's training notes;
    bad input exits with one line."""
    run_dir = args.run_dir
    try:
        if args.decode_only:
            cfg = yaml.safe_load((run_dir / "config.yaml").read_text("utf-8"))
            earlier = json.loads((run_dir / "results.json").read_text("utf-8"))
            return cfg, read_references(run_dir / "data"), earlier["training"]
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg = write_config(run_dir, args.seed, args.set)
        references = write_data(run_dir / "data", args.data_dir, args.eval_sentences,
                                vocab_size=cfg["data"]["src"]["voc_limit"])
    except (OSError, ValueError, KeyError) as err:
        sys.exit(f"joeynmt_multi30k.py: error: {err}")
    return cfg, references, None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    allow_whole_vocabulary()
    budget = args.budget if args.budget is not None else book_budget()
    run_dir = args.run_dir
    cfg, references, training = prepare_run(args)
    if training is None:
        print(f"training for {budget:.0f} s on {args.threads} thread(s); logs in "
              f"{cfg['model_dir']}/train.log", flush=True)
        training = train(cfg, budget)
    outputs = decode(cfg, run_dir, args.beam_alpha)
    command = shlex.join(["python", "tools/peer/joeynmt_multi30k.py",
                          *(sys.argv[1:] if argv is None else argv)])
    import joeynmt

    results = {
        "toolkit": f"joeynmt {joeynmt.__version__}", "torch": torch.__version__,
        "command": command, "config": (run_dir / "config.yaml").as_posix(),
        "budget_seconds": training.get("budget_seconds"), "training": training,
        "cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
        "hardware": book.hardware_name(torch.device("cpu"), 1),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "results": score(outputs, references, args.beam_alpha),
    }
    results_path = args.results or run_dir / "results.json"
    results_path.write_text(json.dumps(results, indent=1) + "\n", "utf-8")
    print(f"results in {results_path}", flush=True)


if __name__ == "__main__":
    main()
