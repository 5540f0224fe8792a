"""A training process for the torchrun tests: tiny model, synthetic pairs, one thread.

    torchrun ... tests/dist_worker.py CHECKPOINT_DIR EPOCHS [--resume] [--n-train N]
                                      [--kill-rank R --kill-epoch E [--kill-batch B]]
                                      [--save-every S]

--kill-rank makes that rank SIGKILL itself before batch B (default 1) of epoch E, on the first
attempt only (torchrun's TORCHELASTIC_RESTART_COUNT is 0), to simulate a worker lost
mid-epoch; --save-every writes last.pt every S optimizer steps inside the epochs as well.
"""

import argparse
import os
import signal
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tiny_training import DIST_CONFIG, synthetic_sentence_pairs  # noqa: E402

import the_annotated_transformer as tat  # noqa: E402


def killing(train_epoch, kill_epoch: int, kill_batch: int):
    """train_epoch that dies by SIGKILL before batch kill_batch of epoch kill_epoch."""
    calls = {"n": 0}

    def wrapped(model, batches, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] != kill_epoch:
            return train_epoch(model, batches, *args, **kwargs)

        def die_before_batch():
            for i, batch in enumerate(batches):
                if i == kill_batch:
                    os.kill(os.getpid(), signal.SIGKILL)
                yield batch

        return train_epoch(model, die_before_batch(), *args, **kwargs)

    return wrapped


def main() -> None:

    parser = argparse.ArgumentParser()
    parser.add_argument("checkpoint_dir")
    parser.add_argument("epochs", type=int)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--n-train", type=int, default=320)
    parser.add_argument("--kill-rank", type=int)
    parser.add_argument("--kill-epoch", type=int)
    parser.add_argument("--kill-batch", type=int, default=1)
    parser.add_argument("--save-every", type=int, default=0)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    first_attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) == 0
    if args.kill_rank == rank and first_attempt:
        tat.train_epoch = killing(tat.train_epoch, args.kill_epoch, args.kill_batch)
    config = replace(DIST_CONFIG, checkpoint_dir=args.checkpoint_dir, epochs=args.epochs)
    pairs = {"train": synthetic_sentence_pairs(args.n_train, 0),
             "val": synthetic_sentence_pairs(40, 1)}
    tat.train_worker(config=config, resume=args.resume, progress=False, threads=1, pairs=pairs,
                     save_every=args.save_every)


if __name__ == "__main__":
    main()
