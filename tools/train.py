"""Train the book's Multi30k German-to-English Transformer on one or several devices.

    python tools/train.py --config cpu                         # one CPU process, about 2 hours
    python tools/train.py --config base --devices 4            # four GPUs of this machine
    torchrun --nproc_per_node=8 tools/train.py --config base   # started by torchrun
    python tools/train.py --config cpu --resume                # continue after an interruption

Under torchrun (which sets RANK and WORLD_SIZE) each process trains directly; otherwise
--devices processes are started here: one per GPU, or CPU processes talking through gloo.
Each epoch's checkpoint goes to --checkpoint-dir/last.pt, with the vocabularies beside it.
"""

import argparse
import os

from the_annotated_transformer import train_distributed, train_worker, training_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=["cpu", "base"], default="cpu",
                        help="preset: a small model for a CPU, or the paper's base model")
    parser.add_argument("--devices", type=int, default=1,
                        help="processes on this machine: GPUs if there are any, else CPU processes")
    parser.add_argument("--epochs", type=int, help="train until this many epochs are done")
    parser.add_argument("--checkpoint-dir", help="folder for last.pt and the vocabularies")
    parser.add_argument("--threads", type=int,
                        help="CPU threads per process (default: the cores shared among processes)")
    parser.add_argument("--keep-epochs", type=int,
                        help="also keep the last K epochs' weights (epoch_NNN.pt), for averaging")
    parser.add_argument("--resume", action="store_true",
                        help="continue from the checkpoint folder's last.pt if it exists")
    args = parser.parse_args()
    overrides = {}
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    if args.checkpoint_dir is not None:
        overrides["checkpoint_dir"] = args.checkpoint_dir
    if args.keep_epochs is not None:
        overrides["keep_epochs"] = args.keep_epochs
    config = training_config(args.config, **overrides)
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # one of torchrun's processes
        train_worker(config=config, resume=args.resume, threads=args.threads)
    else:
        train_distributed(config, args.devices, resume=args.resume, threads=args.threads)


if __name__ == "__main__":
    main()
