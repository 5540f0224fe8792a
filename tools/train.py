"""Train the book's Multi30k German-to-English Transformer on one or several devices.

    python tools/train.py --config cpu                         # one CPU process, about 2 hours
    python tools/train.py --config base --devices 4            # four GPUs of this machine
    python tools/train.py --config base --batch-tokens 25000   # the paper's batch, accumulated
    torchrun --nproc_per_node=8 tools/train.py --config base   # started by torchrun
    python tools/train.py --config cpu --resume                # continue after an interruption
    python tools/train.py --config base --save-every 500       # also a checkpoint every 500 steps

Under torchrun (which sets RANK and WORLD_SIZE) each process trains directly; otherwise
--devices processes are started here: one per GPU, or CPU processes talking through gloo.
Each epoch's checkpoint goes to --checkpoint-dir/last.pt (rank 0's folder), with the
vocabularies beside it, and best.pt holds the weights with the best validation BLEU; with
--save-every N, last.pt is also written every N optimizer steps, and --resume continues from
inside the epoch.
"""

import argparse
import os
import sys
from pathlib import Path

import torch.multiprocessing

from the_annotated_transformer import (
    TrainConfig,
    load_checkpoint,
    train_distributed,
    train_worker,
    training_config,
)


def accum_for_batch(batch_tokens: int, max_tokens: int, world_size: int) -> int:
    """The accum_iter that brings processes x accum_iter x max_tokens nearest batch_tokens."""
    if batch_tokens < 1:
        raise ValueError(f"--batch-tokens must be a positive integer, got {batch_tokens}")
    return max(1, round(batch_tokens / (max_tokens * world_size)))


def finished_run(config: TrainConfig) -> str | None:
    """What to tell a user whose checkpoint folder holds a run that has done all its epochs."""
    path = Path(config.checkpoint_dir) / "last.pt"
    if not path.is_file():
        return None
    done = load_checkpoint(path)["epoch"]
    if done < config.epochs:
        return None
    return (f"the run in {config.checkpoint_dir} has finished: {path} is after epoch {done} of "
            f"{config.epochs}, so there is nothing to train. To train longer, resume with more "
            "epochs (--resume --epochs N, or make train RESUME=1 EPOCHS=N); to start again, "
            "--overwrite; to use the model, tools/translate.py --checkpoint " + str(path))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --help explains every option."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config",
                        choices=["cpu", "cpu_subword", "cpu_fast", "cpu_fast_dropout", "base"],
                        default="cpu",
                        help="preset: a small model for a CPU (with word vocabularies, or one "
                             "joint subword vocabulary and tied embeddings, or that on the fast "
                             "path without dropout, at half the batch, for 6 epochs, or for 11 "
                             "with dropout where the paper puts it), or the paper's base model")
    parser.add_argument("--devices", type=int, default=1,
                        help="processes on this machine: GPUs if there are any, else CPU processes")
    parser.add_argument("--epochs", type=int, help="train until this many epochs are done")
    parser.add_argument("--max-tokens", type=int,
                        help="padded tokens per micro-batch on EACH device (not shared among "
                             "devices); one optimizer step sees processes x accum-iter x this")
    parser.add_argument("--accum-iter", type=int,
                        help="micro-batches accumulated per optimizer step on each device")
    parser.add_argument("--batch-tokens", type=int,
                        help="choose --accum-iter so that one optimizer step sees about this "
                             "many padded tokens over all processes (the paper: 25000)")
    parser.add_argument("--bleu-every", type=int,
                        help="greedy validation BLEU every N epochs (0: never); keeps best.pt")
    parser.add_argument("--checkpoint-dir", help="folder for last.pt and the vocabularies")
    parser.add_argument("--threads", type=int,
                        help="CPU threads per process (default: the cores shared among processes)")
    parser.add_argument("--save-every", type=int, default=0, metavar="N",
                        help="also write last.pt every N optimizer steps inside an epoch, so "
                             "that a resumed run loses at most N steps (default 0: per epoch)")
    parser.add_argument("--keep-epochs", type=int,
                        help="also keep the last K epochs' weights (epoch_NNN.pt), for averaging")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from the checkpoint folder's last.pt (an error if none)")
    start.add_argument("--overwrite", action="store_true",
                       help="start afresh, deleting the checkpoints already in the folder")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # one of torchrun's processes
    world_size = int(os.environ["WORLD_SIZE"]) if torchrun else args.devices
    fields = ("epochs", "checkpoint_dir", "max_tokens", "accum_iter", "keep_epochs", "bleu_every")
    overrides = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    if args.batch_tokens is not None and args.accum_iter is not None:
        sys.exit("train.py: error: give --batch-tokens or --accum-iter, not both")
    try:  # a bad value (--epochs 0, --max-tokens -5) is one line, not a traceback
        config = training_config(args.config, **overrides)
        if args.batch_tokens is not None:
            accum = accum_for_batch(args.batch_tokens, config.max_tokens, world_size)
            config = training_config(args.config, **overrides, accum_iter=accum)
    except ValueError as err:
        sys.exit(f"train.py: error: {err}")
    if int(os.environ.get("RANK", 0)) == 0:
        print(f"{world_size} process(es) x accum_iter {config.accum_iter} x max_tokens "
              f"{config.max_tokens} = {world_size * config.accum_iter * config.max_tokens:,} "
              "padded tokens per optimizer step", file=sys.stderr)
    options = {"resume": args.resume, "overwrite": args.overwrite, "threads": args.threads,
               "save_every": args.save_every}
    try:
        message = None if args.overwrite else finished_run(config)
        if message is not None:
            print(f"train.py: {message}", file=sys.stderr)
            return
        if torchrun:
            train_worker(config=config, **options)
        else:
            train_distributed(config, args.devices, **options)
    except (FileExistsError, FileNotFoundError, ValueError) as err:  # a wrong folder or config
        sys.exit(f"train.py: error: {err}")
    except torch.multiprocessing.ProcessRaisedException as err:  # the same, in a spawned worker
        last = str(err).strip().splitlines()[-1]
        kind, _, message = last.partition(": ")
        if kind not in ("FileExistsError", "FileNotFoundError", "ValueError"):
            raise
        sys.exit(f"train.py: error: {message}")


if __name__ == "__main__":
    main()
