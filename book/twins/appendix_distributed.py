# %% [markdown]
# # Appendix: the training worker
#
# Chapter 22 explains what changes when many processes train one model: equal shares of the
# batches, a loss divided by the tokens of all ranks, one gradient exchange per optimizer step, a
# schedule counted in optimizer steps. Around that loop, `train_worker` does what every process
# of a real run must also do: set itself up, agree with the other processes, check them, save and
# resume. This appendix lists the worker step by step, says what happens when a machine of a
# multi-machine run dies, and runs the whole system on a tiny model: stopped, resumed, translated
# and shipped.

# %% tags=["setup", "hide-cell"]
# Setup (hidden in the book): in Colab, install the book's package; everywhere, import what
# earlier chapters built.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPO = "https://github.com/annotated-transformer/annotated-transformer-book"
    REF = "v0.2.0"  # the tag or commit this notebook comes from
    package = f"the-annotated-transformer[book] @ git+{REPO}@{REF}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

from the_annotated_transformer import (
    PAD_ID,
    EncodedCorpus,
    FusedLabelSmoothing,
    LabelSmoothing,
    TrainConfig,
    TrainState,
    Vocab,
    _spawned_worker,
    autocast_dtype_for,
    bleu,
    config_for_devices,
    enable_book_charts,
    encode_examples,
    evaluate,
    export_for_shipping,
    free_port,
    line_chart,
    linear_rate,
    load_checkpoint,
    load_encoded_data,
    load_multi30k,
    load_tokenizers,
    load_trained_model,
    make_model,
    multi30k_loader,
    multi30k_vocabularies,
    paper_dropout_only,
    rate,
    read_run_vocabularies,
    save_checkpoint,
    schedule_steps,
    train_epoch,
    training_config,
    translate,
    translation_table,
    unwrap,
    use_fast_path,
    vocabulary_writers,
    write_run_files,
)

enable_book_charts()

# %% [markdown]
# ## The worker, step by step
#
# `train_worker` is a sequence of named steps, each a function below:
#
# 1. **`setup_process`: device, threads, process group.** Rank $r$ takes GPU `LOCAL_RANK` (its
#    number on its own machine) if there are GPUs, else the CPU. Several CPU processes on one
#    machine split the cores between them, so that their threads do not wait for each other on
#    cores they share. With more than one process, `torch.distributed` connects them, through
#    NCCL between GPUs or gloo between CPU processes; where to meet (`MASTER_ADDR`,
#    `MASTER_PORT`) comes from the environment.
# 2. **`prepare_checkpoint_dir`: one decision about the folder.** Only rank 0 looks at its
#    checkpoint folder, and every rank learns its decision. A fresh run into a folder that
#    already holds another run's `last.pt`, `best.pt` or `epoch_NNN.pt` refuses to start (those
#    files would be overwritten, or mixed into checkpoint averaging) unless told to `overwrite`;
#    `resume` with no `last.pt` is an error, not a quiet fresh start. Here it only looks: the
#    old checkpoints are deleted, and the new vocabularies written, by `start_run_folder` after
#    step 5, once every check has passed, the first epoch's comparison of the ranks' batches
#    (step 6) included, so that a refused run leaves its folder as it was.
#    A process that `torchrun` restarted after a failure (it sets `TORCHELASTIC_RESTART_COUNT`)
#    continues from `last.pt` when there is one.
# 3. **`load_data`: vocabularies and batches.** Rank 0 builds the vocabularies (or, resuming,
#    reads them from its folder) and sends them to the other ranks, which may run on machines
#    that cannot see rank 0's files. Each rank encodes all the sentence pairs and takes its share
#    of the batches (given an `EncodedCorpus`, it maps training pairs encoded once instead:
#    {doc}`appendix_data`); pairs longer than `max_len` are left out (chapter 14's
#    `filter_by_length`), and rank 0 prints how many of each split when there are any (for an
#    encoded corpus, the training count made when it was encoded). Chapter 22's
#    `schedule_steps` then counts the run's optimizer steps.
# 4. **`build_training`: model, optimizer, schedule, loss.** Every rank seeds the generator
#    identically before building the model, so all copies start from the same weights. The
#    schedule is `rate`, or with `decay="linear"` `linear_rate` ({doc}`appendix_performance`), which needs the
#    run's length in steps; `fast=True` trains on chapter 21's fast path, fused loss and fused
#    Adam step.
# 5. **`resume_run`: one source of truth.** Rank 0 alone reads `last.pt`, checks that its
#    configuration is this one (every field but those a resumed run may change: `epochs`,
#    `checkpoint_dir`, `keep_epochs`, `bleu_every`, and `accum_iter` as long as processes
#    $\times$ `accum_iter` stays the same; `epochs` not under a linear decay, whose line would
#    jump back up from near zero), and sends the whole checkpoint to the other ranks
#    *before* DDP wraps the model. Everything that changes during training is restored:
#    weights, optimizer, scheduler, counters, epoch, and each rank's random state (torch's CPU
#    generator and, on a GPU, its CUDA generator; nothing here draws from Python's `random` or
#    NumPy). The ranks then compare a fingerprint of epoch, step and weights (one all-reduce),
#    and stop together, naming the folder, if they disagree. Without resuming, each rank
#    reseeds with its rank so that dropout masks differ between ranks.
# 6. **`train_epochs`: the epoch loop.** At the start of every epoch the ranks check, again
#    with one small all-reduce, that they hold the same number of batches and the same batch
#    list: a rank with one batch more would wait forever in a gradient exchange that no
#    partner joins, so a difference (other data, another `max_tokens`) is an error within
#    seconds instead. Then train, validate (the per-rank sums of loss, tokens and NLL are added
#    up over all ranks), translate the validation sources greedily every `bleu_every` epochs
#    (each rank translates its share) and score them with BLEU, check that the weights are
#    still identical on all ranks, and report. Rank 0 shows a tqdm bar on stderr; on GPUs each
#    epoch also reports the peak memory (`torch.cuda.max_memory_allocated`) and the GPU's
#    utilization as `nvidia-ml-py` samples it at the end of the epoch, when that package is
#    installed (through `torch.cuda.utilization`, which translates the device index through
#    `CUDA_VISIBLE_DEVICES` into NVML's own numbering).
# 7. **`save_epoch`: the checkpoint.** Rank 0 writes `last.pt`, holding all ranks' random
#    states; `best.pt` (weights only) whenever the validation BLEU is the best so far; and with
#    `keep_epochs=k` the weights of each of the last `k` epochs as `epoch_NNN.pt`, for the
#    checkpoint averaging of chapter 16. The other ranks wait until it has finished, and a
#    failed save stops all of them with rank 0's error.
#
# **Resuming inside an epoch.** An epoch of the `base` preset on a slow machine can take long
# enough that losing one hurts (the paper wrote its checkpoints at 10-minute intervals, §6.1), so
# with `save_every=N` (`--save-every N`) rank 0 also writes `last.pt` every $N$ optimizer steps
# inside an epoch, marked with the number of micro-batches done. It counts steps, not minutes,
# because every rank must decide to save at the same moment without asking the others: the step
# count is the same on every rank, a clock is not. A run resumed from such a checkpoint skips
# those micro-batches of the epoch's batch order (seeded, so the same as before) and continues
# with the next one (`checkpointed_batches`). One detail makes that exact: a `DataLoader` draws a
# number from torch's random generator when its iterator is created, so a run resumed inside an
# epoch puts the saved random state back after that draw.
#
# **Stopping early.** `stop=StopRule(...)` ends a run before its last epoch: after
# `max_updates` optimizer steps, after `max_minutes` of training (the time the epoch lines
# count, without validation), or after `patience` validations in a row without a new best BLEU.
# The limits are checked before each optimizer step and after each validation. Every rank counts
# the same steps and computes the same BLEU; for the clock the ranks take the slowest one's time
# (one small all-reduce at each check, only with `max_minutes`), so that all of them stop at the
# same step. A stop inside an epoch validates the weights it stopped with, writes `best.pt` when they
# score best (with `bleu_every` above 0), and writes `last.pt` marked with the micro-batches done, like a checkpoint inside an
# epoch, together with the rule and the reason. The learning-rate schedule follows `epochs`, not
# the limit, so a run resumed with a larger limit goes on where it stopped (with as many
# processes, when it stopped inside an epoch). Nothing in this appendix runs a `StopRule`:
# `tests/test_cleaning_and_stopping.py` checks these claims, from exactly `max_updates` steps and
# a resumed run that goes on as if it had not stopped to two processes that stop at the same
# update.
#
# The same function runs in three ways: called directly for one process, started by
# `train_distributed`, or started by `torchrun`, in which case it reads `RANK`, `WORLD_SIZE` and
# `LOCAL_RANK` from the environment. Tests and small experiments can pass their own sentence
# pairs (`pairs={"train": ..., "val": ...}`) instead of Multi30k.

# %% tags=["export"]
import hashlib
import inspect
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader


def rng_states(device: torch.device) -> dict[str, torch.Tensor | None]:
    """This process's random number generator states, as tensors (safe for weights_only)."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return {"torch": torch.get_rng_state(), "cuda": cuda}


def set_rng_states(states: dict[str, torch.Tensor | None], device: torch.device) -> None:
    """Restore what rng_states returned, so that dropout draws the same masks again."""
    torch.set_rng_state(states["torch"])
    if device.type == "cuda" and states.get("cuda") is not None:
        torch.cuda.set_rng_state(states["cuda"], device)


def device_report(device: torch.device) -> dict[str, float]:
    """Peak GPU memory of this process and the GPU's utilization (nvidia-ml-py, if installed)."""
    if device.type != "cuda":
        return {}
    report = {"max_memory_gib": torch.cuda.max_memory_allocated(device) / 2**30}
    try:  # torch asks NVML, translating the index through CUDA_VISIBLE_DEVICES
        report["utilization_percent"] = float(torch.cuda.utilization(device))
    except Exception:  # nvidia-ml-py missing or no driver access: memory alone is still useful
        pass
    return report


def hardware_name(device: torch.device, world_size: int) -> str:
    """The devices a run used, in words, for the checkpoint and the shipped model's notes."""
    if device.type == "cuda":
        return f"{world_size} x {torch.cuda.get_device_name(device)}"
    cpu = platform.processor() or platform.machine()
    try:  # Linux names the processor model here
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
        cpu = f"{names[0]}, {len(names)} cores" if names else cpu
    except OSError:
        pass
    return f"{world_size} CPU process(es) x {torch.get_num_threads()} thread(s), {cpu}"


KERNEL_CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile")


def cpu_notes() -> dict[str, Any]:
    """The CPU beside a run, for its notes: a minute on one CPU is not a minute on another.
    Besides the cores, the vector instructions it has, the kernels torch chose, and the caps
    that made the kernel libraries act like an older CPU (chapter 21 emulates AVX2 that way)."""
    flags: set[str] = set()
    try:  # Linux lists the instruction sets here
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next((set(line.split(":", 1)[1].split()) for line in f
                          if line.startswith("flags")), set())
    except OSError:
        pass
    return {"cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "vector_flags": [flag for flag in VECTOR_FLAGS if flag in flags],
            "torch_kernels": torch.backends.cpu.get_cpu_capability(),
            "caps": {name: os.environ[name] for name in KERNEL_CAPS if name in os.environ}}


RESUMABLE_CHANGES = ("epochs", "checkpoint_dir", "keep_epochs", "bleu_every", "accum_iter")
RUN_FILES = ("last.pt", "best.pt", "epoch_*.pt")


@dataclass
class Process:
    """Where this process stands in the run: its rank, how many there are, its device."""

    rank: int
    world_size: int
    device: torch.device

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


@dataclass
class Run:
    """What changes as a run trains, and what it trains with."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    criterion: nn.Module
    train_state: TrainState
    history: list[dict[str, float]]
    epoch: int = 0  # epochs done
    batch: int = 0  # micro-batches of the next epoch done (a checkpoint inside an epoch)
    elapsed_s: float = 0.0  # seconds of training, over all sessions of the run
    best_bleu: float | None = None


def setup_process(rank: int, world_size: int, threads: int | None) -> Process:
    """1) One device per process, never more CPU threads than cores, and the process group."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        if threads is None and world_size > 1:
            local_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
            threads = max(1, (cores or os.cpu_count() or 1) // local_size)
    if threads is not None:
        torch.set_num_threads(threads)
    if world_size > 1:  # MASTER_ADDR and MASTER_PORT come from train_distributed or torchrun
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world_size,
                                store=attempt_store(rank, world_size))
    return Process(rank, world_size, device)


def attempt_store(rank: int, world_size: int) -> dist.Store | None:
    """Under torchrun, the rendezvous store seen through this attempt's own key prefix.

    After a restart the store still holds the addresses that the dead processes published;
    read by the new ones, they lead nowhere. None outside torchrun (the default env:// store).
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None:
        return None
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"  # else rank 0's
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                          is_master=not agent_store and rank == 0)
    return dist.PrefixStore(f"annotated-transformer/attempt-{attempt}", store)


def from_rank0(process: Process, compute: Callable[[], Any]) -> Any:
    """compute() on rank 0 only, and its result sent to every rank; its error raised on all."""
    result, error = None, None
    if process.rank == 0:
        try:
            result = compute()
        except Exception as err:  # the other ranks must hear of it, or they wait forever
            error = err
    if process.distributed:
        box = [(result, error)]
        dist.broadcast_object_list(box, src=0)
        result, error = box[0]
    if error is not None:
        raise error
    return result


def fingerprint(value: Any) -> int:
    """A 56-bit hash of repr(value): two ranks agree on it when they agree on the value."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=7).digest(), "big")


def weights_fingerprint(model: nn.Module) -> int:
    """An exact integer summary of the weights' bits, independent of any float rounding."""
    total = 0
    for tensor in unwrap(model).state_dict().values():
        values = tensor.detach().cpu().contiguous().reshape(-1)
        if values.dtype == torch.float32:
            values = values.view(torch.int32)  # the bits, so that the sum is exact
        total = (total * 1_000_003 + int(values.long().sum())) % (1 << 55)
    return total


def check_same_on_all_ranks(process: Process, values: list[int], what: str) -> None:
    """Stop every rank with one clear error when the ranks' values differ (one all-reduce)."""
    if not process.distributed:
        return
    both = torch.tensor([*values, *(-v for v in values)], dtype=torch.int64,
                        device=process.device)
    dist.all_reduce(both, op=dist.ReduceOp.MAX)  # the largest value, and minus the smallest
    high = both[: len(values)].tolist()
    low = [-v for v in both[len(values) :].tolist()]
    if high != low:
        raise RuntimeError(
            f"rank {process.rank} of {process.world_size}: the ranks disagree on {what} "
            f"(this rank has {values}; across the ranks they range from {low} to {high})"
        )


def prepare_checkpoint_dir(
    folder: str | os.PathLike, *, resume: bool, overwrite: bool, restarted: bool = False,
    check_only: bool = False,
) -> bool:
    """2) Whether to resume from folder/last.pt; never mix a fresh run with another's files.
    With check_only it only looks: the worker deletes nothing until every check has passed."""
    if resume and overwrite:
        raise ValueError("resume and overwrite exclude each other: choose one")
    folder = Path(folder)
    if (folder / "last.pt").is_file() and (resume or restarted):
        return True
    if resume:
        raise FileNotFoundError(
            f"cannot resume: the checkpoint folder {folder} holds no last.pt; start without "
            "resume, or point the checkpoint folder at the run to continue"
        )
    old = sorted(path for pattern in RUN_FILES for path in folder.glob(pattern))
    if old and not (overwrite or restarted):
        raise FileExistsError(
            f"the checkpoint folder {folder} already holds another run's "
            f"{', '.join(p.name for p in old)}: resume it, overwrite it (its checkpoints are "
            "deleted), or choose another checkpoint folder"
        )
    if not check_only:
        for path in old:
            path.unlink()
    return False


@dataclass
class RunData:
    """What a rank trains and validates on."""

    vocab_src: Vocab
    vocab_tgt: Vocab
    train_loader: DataLoader
    val_loader: DataLoader
    val_pairs: list[tuple[str, str]]  # the validation sentences, for BLEU
    tokenizers: tuple[Any, Any]
    left_out: tuple[int, int] = (0, 0)  # training and validation pairs longer than max_len


def training_pairs(
    config: TrainConfig, pairs: dict[str, Sequence[tuple[str, str]]] | None
) -> dict[str, list[tuple[str, str]]]:
    """The train and val sentence pairs, given or Multi30k's, cut to the config's limits."""
    if pairs is None:
        pairs = {split: load_multi30k(split) for split in ("train", "val")}
    missing = sorted({"train", "val"} - set(pairs))
    if missing:
        raise ValueError(f"pairs must hold the splits 'train' and 'val'; missing {missing}")
    train = pairs["train"]  # an EncodedCorpus (appendix_data) stays mapped: corpus[:n]
    train = train if isinstance(train, EncodedCorpus) else list(train)
    return {"train": train[: config.train_limit],
            "val": list(pairs["val"])[: config.val_limit]}


def load_data(
    process: Process, config: TrainConfig, pairs: dict[str, list[tuple[str, str]]],
    *, resuming: bool, vocabs: tuple[Vocab, Vocab] | None = None,
) -> RunData:
    """3) Rank 0's vocabularies (vocabs when given, for a fresh run) on every rank, and this
    rank's share of the batches. A sentencepiece model reads raw text, so a subword run needs
    no spaCy tokenizers."""
    if isinstance(pairs["train"], EncodedCorpus):  # encoded once, on disk (appendix_data)
        return load_encoded_data(process, config, pairs, resuming=resuming)
    tokenizers = (None, None) if config.subwords else load_tokenizers()

    def vocabularies() -> tuple[Vocab, Vocab]:
        if resuming:  # the ids the checkpoint's embeddings were trained with
            return read_run_vocabularies(config.checkpoint_dir, config)
        if vocabs is not None:  # trained already by the caller (the training command's check)
            return vocabs
        return multi30k_vocabularies(config, tokenizers, pairs=pairs["train"], save=False)

    vocab_src, vocab_tgt = from_rank0(process, vocabularies)
    train_data, val_data = (
        encode_examples(pairs[split], vocab_src, vocab_tgt, tokenizers, max_len=config.max_len)
        for split in ("train", "val")
    )
    shard = {"max_tokens": config.max_tokens, "num_replicas": process.world_size,
             "rank": process.rank, "seed": config.seed}
    train_loader = multi30k_loader(train_data, shuffle=True, **shard)
    val_loader = multi30k_loader(val_data, shuffle=False, **shard)
    left_out = (len(pairs["train"]) - len(train_data), len(pairs["val"]) - len(val_data))
    return RunData(vocab_src, vocab_tgt, train_loader, val_loader, pairs["val"], tokenizers,
                   left_out)


def start_run_folder(process: Process, config: TrainConfig, data: RunData, *, overwrite: bool,
                     restarted: bool) -> None:
    """5b) A fresh run's first writes, once every check has passed, so that a refused run
    leaves its folder as it found it: rank 0 deletes the checkpoints that overwrite replaces
    and writes the vocabularies beside last.pt."""
    def write() -> None:
        prepare_checkpoint_dir(config.checkpoint_dir, resume=False, overwrite=overwrite,
                               restarted=restarted)
        write_run_files(config.checkpoint_dir,
                        vocabulary_writers(config, data.vocab_src, data.vocab_tgt))

    from_rank0(process, write)


def build_training(
    process: Process, config: TrainConfig, src_vocab: int, tgt_vocab: int, *, warmup: int,
    total: int,
) -> Run:
    """4) Model (the same initial weights on every rank), optimizer, schedule and loss; warmup
    and total are the run's warm-up and length in its own optimizer steps (schedule_steps).
    config.fast trains on chapter 21's fast path, with the fused loss and Adam, and
    config.paper_dropout drops only where the paper does."""
    torch.manual_seed(config.seed)
    model = make_model(
        src_vocab, tgt_vocab, N=config.N, d_model=config.d_model, d_ff=config.d_ff,
        h=config.h, dropout=config.dropout, share_embeddings=config.share_embeddings,
    ).to(process.device)
    use_fast_path(paper_dropout_only(model, config.paper_dropout), config.fast)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9,
                                 fused=config.fast or None)
    def lr_lambda(step: int) -> float:
        if config.decay == "linear":
            return linear_rate(step, config.d_model, config.lr_factor, warmup, total)
        return rate(step, config.d_model, config.lr_factor, warmup)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lr_lambda)
    loss = FusedLabelSmoothing if config.fast else LabelSmoothing
    criterion = loss(tgt_vocab, PAD_ID, smoothing=config.label_smoothing)
    return Run(model, optimizer, scheduler, criterion, TrainState(), [])


def config_differences(stored: dict[str, Any], config: TrainConfig, world_size: int,
                       stored_world_size: int) -> list[str]:
    """What a resumed run would change that it may not: every field but RESUMABLE_CHANGES."""
    changes = [
        f"{name}={stored[name]!r} in the checkpoint but {value!r} now"
        for name, value in asdict(config).items()
        if name in stored and name not in RESUMABLE_CHANGES and stored[name] != value
    ]
    before = stored_world_size * stored.get("accum_iter", config.accum_iter)
    if before != world_size * config.accum_iter:
        changes.append(
            f"processes x accum_iter = {before} in the checkpoint but "
            f"{world_size} x {config.accum_iter} now (another global batch)"
        )
    if config.decay == "linear" and stored.get("epochs", config.epochs) != config.epochs:
        changes.append(  # resumed longer, the rate would jump back up from near zero
            f"epochs={stored['epochs']} in the checkpoint but {config.epochs} now (a linear "
            "decay ends at the run's last step; a longer run starts afresh)")
    return changes


def read_resume_checkpoint(path: Path, config: TrainConfig, world_size: int) -> dict[str, Any]:
    """last.pt, checked against the configuration of the run that is to continue it."""
    checkpoint = load_checkpoint(path)
    changes = config_differences(checkpoint["config"], config, world_size,
                                 len(checkpoint["rng"]))
    if changes:
        raise ValueError(f"cannot resume from {path}: " + "; ".join(changes))
    writers = len(checkpoint["rng"])
    if checkpoint.get("batch") and writers != world_size:  # the ranks' shares would differ
        raise ValueError(
            f"cannot resume from {path}: it was written {checkpoint['batch']} micro-batches "
            f"into epoch {checkpoint['epoch'] + 1} by {writers} processes, and {world_size} "
            f"would split that epoch differently; resume with {writers} processes"
        )
    return checkpoint


def resume_run(process: Process, config: TrainConfig, run: Run, *, resuming: bool) -> None:
    """5) Rank 0's checkpoint on every rank, before DDP wraps the model; ranks must agree."""
    if not resuming:
        torch.manual_seed(config.seed + process.rank)  # each rank its own dropout masks
        return
    path = Path(config.checkpoint_dir) / "last.pt"
    checkpoint = from_rank0(process, lambda: read_resume_checkpoint(path, config,
                                                                    process.world_size))
    run.model.load_state_dict(checkpoint["model"])
    run.optimizer.load_state_dict(checkpoint["optimizer"])
    run.scheduler.load_state_dict(checkpoint["scheduler"])
    run.train_state = TrainState(**checkpoint["train_state"])
    run.epoch, run.history = checkpoint["epoch"], checkpoint["history"]
    run.batch = checkpoint.get("batch", 0)
    run.elapsed_s, run.best_bleu = checkpoint["elapsed_s"], checkpoint.get("best_bleu")
    check_same_on_all_ranks(
        process, [run.epoch, run.batch, run.train_state.accum_step,
                  weights_fingerprint(run.model)],
        f"the epoch, batch, step and weights resumed from rank 0's {path}",
    )
    if len(checkpoint["rng"]) == process.world_size:
        set_rng_states(checkpoint["rng"][process.rank], process.device)
    else:
        if process.rank == 0:
            print(f"{path} was written by {len(checkpoint['rng'])} processes, not "
                  f"{process.world_size}: random states start afresh", file=sys.stderr)
        torch.manual_seed(config.seed + 1_000 * run.epoch + process.rank)
    if process.rank == 0:
        inside = f", {run.batch} micro-batches into epoch {run.epoch + 1}" if run.batch else ""
        print(f"resumed from {path} after epoch {run.epoch}{inside}", file=sys.stderr)


def validation_bleu(process: Process, model: nn.Module, data: RunData, max_len: int) -> float:
    """Greedy BLEU on the validation pairs; each rank translates its share of the sources."""
    pairs = data.val_pairs
    share = [de for de, _ in pairs[process.rank :: process.world_size]]
    outputs = translate(unwrap(model), share, data.vocab_src, data.vocab_tgt, data.tokenizers[0],
                        max_len=max_len)
    shares = [outputs]
    if process.distributed:
        shares = [None] * process.world_size
        dist.all_gather_object(shares, outputs)
    hypotheses = [""] * len(pairs)
    for rank, translated in enumerate(shares):  # back into the order of the pairs
        hypotheses[rank :: process.world_size] = translated
    return bleu(hypotheses, [en for _, en in pairs])[0]


def all_ranks_sum(process: Process, values: list[float]) -> list[float]:
    """The sums over all ranks of a few numbers (loss sums, token counts)."""
    if not process.distributed:
        return values
    totals = torch.tensor(values, dtype=torch.float64, device=process.device)
    dist.all_reduce(totals)
    return totals.tolist()


def save_epoch(
    process: Process, config: TrainConfig, run: Run, improved: bool, *, elapsed_s: float = 0.0,
    stop: "StopRule | None" = None, stopped: str | None = None,
) -> None:
    """7) Rank 0 writes last.pt (and best.pt, epoch_NNN.pt); every rank waits until it is done.

    Inside an epoch (run.batch > 0) it writes last.pt only (and best.pt when a stop there
    improved on it); elapsed_s is then the training time of the epoch so far. With a stop
    rule, last.pt also holds the rule and, once the run has stopped, why.
    """
    rng_all = [rng_states(process.device)]
    if process.distributed:
        rng_all = [None] * process.world_size
        dist.all_gather_object(rng_all, rng_states(process.device))
    folder = Path(config.checkpoint_dir)

    def save() -> None:
        weights = {"model": unwrap(run.model).state_dict(), "config": asdict(config),
                   "epoch": run.epoch}
        save_checkpoint(
            {
                **weights,
                "batch": run.batch,
                "optimizer": run.optimizer.state_dict(),
                "scheduler": run.scheduler.state_dict(),
                "train_state": asdict(run.train_state),
                "rng": rng_all,
                "history": run.history,
                "best_bleu": run.best_bleu,
                "elapsed_s": run.elapsed_s + elapsed_s,
                "hardware": hardware_name(process.device, process.world_size),
                "cpu": cpu_notes(),
                "command": " ".join(["python", *sys.argv]),
                **({} if stop is None else {"stopping": asdict(stop), "stopped": stopped}),
            },
            folder / "last.pt",
        )
        if improved:
            save_checkpoint({**weights, "val_bleu": run.best_bleu}, folder / "best.pt")
        if run.batch:
            return
        if config.keep_epochs:  # weights only: what checkpoint averaging needs
            save_checkpoint(weights, folder / f"epoch_{run.epoch:03d}.pt")
            stale = run.epoch - config.keep_epochs
            (folder / f"epoch_{stale:03d}.pt").unlink(missing_ok=True)

    from_rank0(process, save)  # also the barrier: no rank runs ahead of a slow or failed save


def duration(seconds: float) -> str:
    """A time span as a person reads it: seconds, minutes or hours."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 3600 else f"{seconds / 3600:.2f} h"


def epoch_line(
    record: dict[str, float], *, epochs: int, trained_s: float, left_s: float
) -> str:
    """One line per epoch: losses, perplexity, BLEU, speed, the training time so far and an
    estimate of the time left, and on GPUs memory and load."""
    line = (f"epoch {record['epoch']:2d}/{epochs} | train loss {record['train_loss']:.4f} | "
            f"val loss {record['val_loss']:.4f} | val ppl {record['val_ppl']:.2f}")
    if "val_bleu" in record:
        line += f" | val BLEU {record['val_bleu']:.2f}"
    line += (f" | {record['tokens_per_s']:,.0f} tokens/s | {record['seconds']:.1f} s | "
             f"trained {duration(trained_s)}, about {duration(left_s)} left")
    if "max_memory_gib" in record:
        line += f" | {record['max_memory_gib']:.1f} GiB peak"
    if "utilization_percent" in record:
        line += f" | GPU {record['utilization_percent']:.0f}% busy"
    return line


def checkpointed_batches(
    batches: Iterable, *, start: int, every: int, save: Callable[[int], None]
) -> Iterator:
    """The batches from number `start` on; before batch i, save(i) whenever i is a multiple of
    `every` (0: never). run_groups asks for a group's first batch only after the step of the
    group before, so at save(i) the weights hold every step of batches 0 .. i - 1."""
    state = torch.get_rng_state()
    iterator = iter(batches)  # a DataLoader draws a number from torch's generator here
    if start:  # resumed inside the epoch: the checkpoint's random state follows that draw
        torch.set_rng_state(state)
    for i, batch in enumerate(iterator):
        if i < start:
            continue  # trained before the checkpoint this run resumed from
        if every and i > start and i % every == 0:
            save(i)
        yield batch


@dataclass(frozen=True)
class StopRule:
    """When a run ends before its last epoch (0: no such limit): after max_updates optimizer
    steps, after max_minutes of training (the time the epoch lines count, validation not
    included), or after `patience` validations in a row without a new best BLEU."""

    max_updates: int = 0
    max_minutes: float = 0.0
    patience: int = 0

    def __post_init__(self) -> None:
        for name in ("max_updates", "patience"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0 (0: no limit), got "
                                 f"{value!r}")
        minutes = self.max_minutes
        if isinstance(minutes, bool) or not isinstance(minutes, int | float) or not (
                0 <= minutes < math.inf):
            raise ValueError(f"max_minutes must be a number >= 0 (0: no limit), got {minutes!r}")


def stop_reason(stop: StopRule | None, *, updates: int, minutes: float,
                history: Sequence[dict[str, float]]) -> str | None:
    """Why the run stops now, in words; None while it goes on."""
    if stop is None:
        return None
    if stop.max_updates and updates >= stop.max_updates:
        return f"max_updates={stop.max_updates}: {updates} optimizer updates done"
    if stop.max_minutes and minutes >= stop.max_minutes:
        return f"max_minutes={stop.max_minutes:g}: {minutes:.1f} minutes of training done"
    scores = [record["val_bleu"] for record in history if "val_bleu" in record]
    if stop.patience and scores:
        best = scores.index(max(scores))  # the first of the best: a tie is no new best
        if len(scores) - 1 - best >= stop.patience:
            return (f"patience={stop.patience}: {len(scores) - 1 - best} validations without "
                    f"a new best BLEU (the best, {scores[best]:.2f}, was validation {best + 1})")
    return None


def until_stop(batches: Iterable, *, start: int, every: int, stop: Callable[[int], bool]
               ) -> Iterator:
    """The batches from number `start` on, until stop(i) says to stop before batch i; it is
    asked whenever i - start is a multiple of `every` (an optimizer step's first batch)."""
    for i, batch in enumerate(batches, start=start):
        if i > start and (i - start) % every == 0 and stop(i):
            return
        yield batch


def slowest_rank_minutes(process: Process, seconds: float) -> float:
    """The most minutes any rank has trained: one clock for all, so that all stop together."""
    if not process.distributed:
        return seconds / 60
    most = torch.tensor([seconds], dtype=torch.float64, device=process.device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    return most.item() / 60


def check_batches(process: Process, train_loader: DataLoader, epoch: int) -> None:
    """Stop every rank when the ranks' batch counts or batch lists of `epoch` differ."""
    sampler = train_loader.batch_sampler
    sampler.set_epoch(epoch)  # a new order, the same on every rank
    check_same_on_all_ranks(
        process, [len(train_loader), fingerprint(sampler.batches())],
        f"the number of training batches per rank and the batch list of epoch {epoch + 1} "
        "(every rank must see the same sentence pairs, max_tokens and seed)",
    )


def train_epochs(
    process: Process,
    config: TrainConfig,
    run: Run,
    data: RunData,
    *,
    progress: bool,
    save_every: int = 0,
    stop: StopRule | None = None,
) -> list[dict[str, float]]:
    """6) The epochs: check the batches, train, validate, score, report, checkpoint (also
    every `save_every` optimizer steps inside an epoch, when it is not 0), until the last
    epoch or until the stop rule says to stop."""
    train_loader, val_loader = data.train_loader, data.val_loader
    device = process.device
    autocast_dtype = autocast_dtype_for(device, config.cpu_bf16)
    if config.cpu_bf16 and device.type == "cpu" and autocast_dtype is None and process.rank == 0:
        print("cpu_bf16: this CPU has no bfloat16 instructions (AMX or AVX512-BF16); "
              "training in float32", file=sys.stderr)
    walls = []  # each epoch's wall-clock time, validation and checkpoint included

    def why_stop(seconds: float) -> str | None:  # seconds: trained in this epoch so far
        if stop is None:
            return None
        minutes = slowest_rank_minutes(process, run.elapsed_s + seconds) if stop.max_minutes else 0
        return stop_reason(stop, updates=run.train_state.accum_step, minutes=minutes,
                           history=run.history)

    for epoch in range(run.epoch, config.epochs):
        why = why_stop(0.0)
        if why is not None:  # resumed with a limit that the run has reached already
            if process.rank == 0:
                print(f"stopped early: {why}", flush=True)
            break
        wall = time.perf_counter()
        check_batches(process, train_loader, epoch)
        bar = None
        if progress and process.rank == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(train_loader), initial=run.batch, unit="batch",
                       desc=f"epoch {epoch + 1}/{config.epochs}", file=sys.stderr, leave=False)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start, resumed_at = time.perf_counter(), run.batch

        def save_inside(i: int, start: float = start) -> None:
            run.batch = i
            save_epoch(process, config, run, False, elapsed_s=time.perf_counter() - start,
                       stop=stop)

        stopped = {}  # why and before which batch a stop rule ended this epoch

        def stop_here(i: int, start: float = start, stopped: dict = stopped) -> bool:
            why = why_stop(time.perf_counter() - start)
            stopped.update({} if why is None else {"why": why, "batch": i})
            return why is not None

        batches = checkpointed_batches(train_loader, start=run.batch, save=save_inside,
                                       every=save_every * config.accum_iter)
        if stop is not None:
            batches = until_stop(batches, start=run.batch, every=config.accum_iter,
                                 stop=stop_here)
        train_sums = train_epoch(
            run.model, batches, run.criterion, run.optimizer, run.scheduler, device=device,
            accum_iter=config.accum_iter, train_state=run.train_state,
            autocast_dtype=autocast_dtype, bar=bar,
        )
        seconds = time.perf_counter() - start
        # validating draws from the generator (a DataLoader's seed): a stop inside an epoch
        # keeps the state of its batch, as the run that had not stopped has it there
        at_stop = rng_states(device) if stopped else None
        if bar is not None:
            bar.close()
        check_same_on_all_ranks(process, [weights_fingerprint(run.model)],
                                f"the weights after epoch {epoch + 1}")
        val_sums = evaluate(run.model, val_loader, run.criterion, device=device,
                            autocast_dtype=autocast_dtype)
        loss, tokens, nll, val_loss, val_tokens, val_nll = all_ranks_sum(
            process, [*train_sums, *val_sums]
        )
        run.epoch, run.batch, run.elapsed_s = epoch + 1, 0, run.elapsed_s + seconds
        if stopped:  # the epoch is not done: a resumed run goes on from this batch
            run.epoch, run.batch = epoch, stopped["batch"]
        record = {
            "epoch": epoch + 1,
            "train_loss": loss / max(tokens, 1),
            "train_nll": nll / max(tokens, 1),
            "val_loss": val_loss / max(val_tokens, 1),
            "val_nll": val_nll / max(val_tokens, 1),
            "val_ppl": math.exp(val_nll / max(val_tokens, 1)),
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            **device_report(device),
        }
        if autocast_dtype is not None:
            record["autocast"] = "bfloat16"
        if resumed_at:  # the training numbers cover the batches after the checkpoint only
            record["resumed_at_batch"] = resumed_at
        last = epoch + 1 == config.epochs and not stopped
        why = None if last else stopped.get("why") or why_stop(0.0)  # updates or minutes
        if stopped:
            record["stopped_at_batch"] = stopped["batch"]
        improved = False
        if config.bleu_every and ((epoch + 1) % config.bleu_every == 0 or why is not None):
            record["val_bleu"] = validation_bleu(process, run.model, data, config.max_len)
            improved = run.best_bleu is None or record["val_bleu"] > run.best_bleu
            run.best_bleu = record["val_bleu"] if improved else run.best_bleu
        run.history.append(record)
        if why is None and not last:  # patience, counting this validation
            why = why_stop(0.0)
        if why is not None:
            record["stopped"] = why
        if at_stop is not None:
            set_rng_states(at_stop, device)
        save_epoch(process, config, run, improved, stop=stop, stopped=why)
        walls.append(time.perf_counter() - wall)
        if process.rank == 0:
            left = 0 if why else sum(walls) / len(walls) * (config.epochs - run.epoch)
            print(epoch_line(record, epochs=config.epochs, trained_s=run.elapsed_s, left_s=left),
                  flush=True)
            if why is not None:
                print(f"stopped early: {why}", flush=True)
        if why is not None:
            break
    return run.history


def wrap_ddp(model: nn.Module, device: torch.device) -> DistributedDataParallel:
    """DDP that does not re-send the constant positional-encoding tables every forward pass."""
    options = {"device_ids": [device.index] if device.type == "cuda" else None}
    # torch 2.13 renamed broadcast_buffers (and deprecated the old name) to forward_sync_buffers
    known = inspect.signature(DistributedDataParallel).parameters
    options["forward_sync_buffers" if "forward_sync_buffers" in known else "broadcast_buffers"] = (
        False
    )
    return DistributedDataParallel(model, **options)


def train_worker(
    rank: int | None = None,
    world_size: int | None = None,
    config: TrainConfig | None = None,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    threads: int | None = None,
    pairs: dict[str, Sequence[tuple[str, str]]] | None = None,
    save_every: int = 0,
    stop: StopRule | None = None,
    vocabularies: tuple[Any, Any] | None = None,
) -> list[dict[str, float]]:
    """Train (or resume) on one device as one of world_size processes; the per-epoch history.

    Started by train_distributed, by torchrun (rank and world size then come from the
    environment: RANK, WORLD_SIZE, LOCAL_RANK), or called directly for one process. pairs
    replaces Multi30k: {"train": [(german, english), ...], "val": [...]}. save_every: also
    write last.pt every that many optimizer steps inside an epoch (0: after each epoch only).
    stop: a StopRule that may end the run before its last epoch (None: all epochs are trained).
    vocabularies: the (source, target) vocabularies a fresh run uses, when its caller has
    trained them already from the same config and pairs (None: they are trained here).
    A config with batch_tokens gets the accum_iter that keeps its global batch on world_size
    devices (config_for_devices).
    """
    config = training_config("cpu") if config is None else config
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    config = config_for_devices(config, world_size)
    if config.max_tokens < config.max_len:
        raise ValueError(
            f"max_tokens={config.max_tokens} per device is less than max_len={config.max_len}: "
            "the longest sentences would not fit into a batch; raise max_tokens"
        )
    if not isinstance(save_every, int) or save_every < 0:
        raise ValueError(f"save_every must be a whole number of steps >= 0, got {save_every!r}")
    if stop is not None and stop.patience and not config.bleu_every:
        raise ValueError(f"patience={stop.patience} counts validations with BLEU, and "
                         "bleu_every=0 has none: set bleu_every to 1 or more")
    process = setup_process(rank, world_size, threads)
    try:
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        resuming = from_rank0(process, lambda: prepare_checkpoint_dir(
            config.checkpoint_dir, resume=resume, overwrite=overwrite, restarted=restarted,
            check_only=True))
        split_pairs = training_pairs(config, pairs)
        data = load_data(process, config, split_pairs, resuming=resuming, vocabs=vocabularies)
        plan = schedule_steps(config, batches_per_epoch=len(data.train_loader),
                              world_size=process.world_size)
        if progress and process.rank == 0:
            print(f"schedule: {plan['total_steps']} optimizer steps ({config.epochs} epochs of "
                  f"{plan['steps_per_epoch']}), warm-up {plan['warmup']} steps", flush=True)
        if process.rank == 0 and any(data.left_out):  # said even without progress
            (train, val), total = data.left_out, len(split_pairs["train"])
            when = ""
            if isinstance(split_pairs["train"], EncodedCorpus):  # counted at its encoding
                total = split_pairs["train"].header["read"]
                when = f" when {split_pairs['train'].folder} was encoded"
            print(f"left out, longer than max_len={config.max_len} tokens with <s> and </s>: "
                  f"{train:,} of {total:,} training pairs ({train / total:.1%}){when} and "
                  f"{val:,} of {len(split_pairs['val']):,} validation pairs", flush=True)
        run = build_training(process, config, len(data.vocab_src), len(data.vocab_tgt),
                             warmup=plan["warmup"], total=plan["total_steps"])
        resume_run(process, config, run, resuming=resuming)
        if not resuming:  # every check has passed: only now is anything written or deleted
            check_batches(process, data.train_loader, run.epoch)  # the ranks agree on the data
            start_run_folder(process, config, data, overwrite=overwrite, restarted=restarted)
        if process.distributed:  # only now: every rank holds rank 0's state
            run.model = wrap_ddp(run.model, process.device)
        history = train_epochs(process, config, run, data, progress=progress,
                               save_every=save_every, stop=stop)
        if process.distributed:  # no rank tears down while another still talks to it
            dist.barrier()
        return history
    finally:
        if process.distributed:
            dist.destroy_process_group()

# %% [markdown]
# `train_distributed` (chapter 22) grows by the same two options, `stop` and `vocabularies`,
# and passes them on to `train_worker`, so that a run on several devices can also stop early
# and use vocabularies its caller has trained already:

# %% tags=["export", "extends"]
import os
from collections.abc import Sequence
from typing import Any

import torch


def train_distributed(
    config: TrainConfig,
    world_size: int,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    threads: int | None = None,
    pairs: dict[str, Sequence[tuple[str, str]]] | None = None,
    save_every: int = 0,
    stop: StopRule | None = None,
    vocabularies: tuple[Any, Any] | None = None,
) -> None:
    """Chapter 22's world_size processes on this machine, each given the stop rule and the
    vocabularies that train_worker takes (None: every epoch; vocabularies built by rank 0)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if torch.cuda.is_available() and world_size > torch.cuda.device_count():
        raise ValueError(
            f"world_size={world_size} is more than the {torch.cuda.device_count()} GPUs here"
        )
    options = {"resume": resume, "overwrite": overwrite, "progress": progress,
               "threads": threads, "pairs": pairs, "save_every": save_every, "stop": stop,
               "vocabularies": vocabularies}
    if world_size == 1:
        train_worker(0, 1, config, **options)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    torch.multiprocessing.spawn(_spawned_worker, args=(world_size, config, options),
                                nprocs=world_size)


# %% [markdown]
# ## When a machine dies
#
# `torchrun` treats a failure as a change of membership {cite}`pytorch2024elastic`: when a process
# dies, or a whole machine, every launcher that still runs stops its processes and waits at the
# rendezvous for the group to form again, and with restarts left (`--max-restarts`) starts them
# anew. The restarted processes know they were restarted (`TORCHELASTIC_RESTART_COUNT`) and
# continue from rank 0's `last.pt`, so a failure costs what was trained since that checkpoint:
# the epoch it interrupted, or at most $N$ steps with `--save-every N`. What happens
# next depends on how many machines the run insists on.
#
# * **A fixed number of machines** (`--nnodes=2`): the group forms again only when two machines
#   meet at the rendezvous. The survivor waits; start the dead machine again, or a replacement
#   with the same data, with the same command. If none comes before the rendezvous times out, the
#   launcher gives up. Nothing is lost beyond the last checkpoint: the same command with
#   `--resume`, on two machines, continues later.
# * **A range** (`--nnodes=1:2`, in chapter 22's command in place of `--nnodes=2`, with
#   `--batch-tokens 25000` after `--config base`): the survivor can go on alone, with half the
#   processes. The checkpoint knows how many processes made it, and a resumed run must keep
#   processes $\times$ `accum_iter`, the number of micro-batches in one optimizer step, or it
#   would continue with another global batch and another schedule. Without `--batch-tokens`,
#   `accum_iter` stays what it was, and the survivor stops with the one-line error below. With
#   `--batch-tokens`, `annotated-transformer train` chooses `accum_iter` for the processes present, so the
#   survivor doubles its accumulation and continues with the same global batch (when the numbers
#   divide). Its processes draw fresh random states, since the checkpoint holds one per process of
#   the old group, and they say so. A checkpoint written inside an epoch (`--save-every`) is the
#   exception: fewer processes would share out that epoch's batches differently, so it resumes
#   only with as many processes as wrote it, and the survivor says so in one line.
# * **Where the checkpoint lives.** Only rank 0 reads and writes `last.pt`, and which machine
#   holds rank 0 is decided at each rendezvous; the other machines may have no checkpoint, or an
#   old one, and receive rank 0's state. Keep `--checkpoint-dir` on storage that every machine
#   sees; otherwise a restart can put rank 0 on a machine without the checkpoint, and the
#   restarted run, finding no `last.pt`, starts again from the first epoch.
#
# The test suite runs these paths on one CPU: two `torchrun` agents as two simulated machines
# (c10d rendezvous on 127.0.0.1, gloo, one process each, each with its own checkpoint folder),
# which must end with the weights of one process trained on the same global batches; a resume
# where only the first machine has the checkpoint; a worker killed with SIGKILL in the middle of
# an epoch and restarted by `torchrun`; and a machine with other data, which must stop the run
# with the batch-count error within seconds.
#
# The check that protects the global batch, on the `base` preset that two machines of eight GPUs
# would run:

# %%
from dataclasses import asdict, replace

config = training_config("base")
stored = asdict(config)  # what last.pt records, from 16 processes (two machines of 8)
for accum_iter in [1, 2]:
    now = replace(config, accum_iter=accum_iter)
    problems = config_differences(stored, now, world_size=8, stored_world_size=16)
    print(f"8 processes, accum_iter {accum_iter}:", problems or "resumes")
assert config_differences(stored, replace(config, accum_iter=2), 8, 16) == []

# %% [markdown]
# ## The whole system, in miniature
#
# Here is the whole system on the tiny configuration of chapter 22: one layer,
# $d_{\text{model}}=64$, the first 2,000 training pairs and the first 200 validation pairs, one
# thread, and a fresh temporary checkpoint folder. We train for two epochs and then stop, as if
# the machine had gone away.

# %% nbval_reason="the demo's losses, perplexities and BLEU differ with another CPU's float kernels" tags=["nbval-ignore-output"]
import shutil
import tempfile
from pathlib import Path

demo_dir = Path(tempfile.mkdtemp(prefix="annotated-transformer-demo-"))
demo = TrainConfig(
    N=1, d_model=64, d_ff=256, h=4, dropout=0.1, max_tokens=500, epochs=2, warmup=100,
    lr_factor=1.0, train_limit=2000, val_limit=200, checkpoint_dir=str(demo_dir),
)
history = train_worker(0, 1, demo, progress=False, threads=1)
print(sorted(p.name for p in demo_dir.iterdir()))
print("reported each epoch:", ", ".join(key for key in history[-1] if key != "epoch"))
assert [r["epoch"] for r in history] == [1, 2]
assert history[-1]["val_loss"] < history[0]["val_loss"]

# %% [markdown]
# Chapter 22 explains the epoch lines. The checkpoint folder holds the two vocabularies,
# `last.pt`, and `best.pt`, the weights of the epoch with the best validation BLEU so far.
# Starting a fresh run into this folder by mistake is refused, instead of overwriting the
# checkpoint:

# %%
try:
    train_worker(0, 1, demo, progress=False, threads=1)
except FileExistsError as err:
    print(str(err).replace(str(demo_dir), "<folder>"))

# %% [markdown]
# Now we "restart" with `resume=True` and a budget of four epochs: the worker reads `last.pt`
# and continues with epoch 3, with the optimizer moments, learning rate, step counter and
# random state that an uninterrupted run would have had at that point. (The test suite checks
# that claim: a run stopped and resumed ends with exactly the weights of one that never
# stopped, also when it stopped in the middle of an epoch with `save_every` set, and also with
# two processes under `torchrun`, one of them killed.)

# %% nbval_reason="the resumed epochs' losses differ with another CPU's float kernels; the asserts check" tags=["nbval-ignore-output"]
history = train_worker(0, 1, replace(demo, epochs=4), resume=True, progress=False, threads=1)
state = load_checkpoint(demo_dir / "last.pt")
print(f"epoch {state['epoch']}, train state {state['train_state']}")
print("stored keys:", sorted(state))
assert all(r["val_ppl"] > 1 and 0 <= r["val_bleu"] <= 100 for r in history)
assert history[-1]["val_loss"] < history[0]["val_loss"]
assert state["epoch"] == 4 and [r["epoch"] for r in history] == [1, 2, 3, 4]

# %% tags=["chart-rows-vary"]
losses = [
    {"epoch": r["epoch"], "loss": round(r[key], 4), "split": split}
    for r in history for key, split in [("train_loss", "train"), ("val_loss", "validation")]
]
line_chart(losses, x="epoch:O", y="loss:Q", color="split:N", y_scale={"zero": False},
           y_title="label-smoothed loss per token", width=360, height=200,
           title="The tiny demo model, stopped after epoch 2 and resumed")

# %% [markdown]
# Now the demo model can translate, loaded the way chapter 14 loads the shipped one. Five
# sentences from the start of the validation set:

# %% nbval_reason="what the tiny demo model writes changes with its training, which differs between CPUs" tags=["nbval-ignore-output"]
import pandas as pd

tokenizers = load_tokenizers()
model, vocab_src, vocab_tgt, _ = load_trained_model(demo_dir / "last.pt")
val_pairs = load_multi30k("val")
pd.set_option("display.max_colwidth", 80)
pd.DataFrame(translation_table(model, val_pairs, vocab_src, vocab_tgt, tokenizers[0], start=0, n=5))

# %% [markdown]
# After a few hundred steps on 2,000 sentences the tiny model has learned the shape of a
# Multi30k caption ("A man in a ... is ..."), some frequent words, and little else. The
# translations are poor, as they should be. Its BLEU on the first 200 validation sentences:

# %% nbval_reason="the demo model's score changes with its training, which differs between CPUs" tags=["nbval-ignore-output"]
sources = [de for de, _ in val_pairs[:200]]
references = [en for _, en in val_pairs[:200]]
hypotheses = translate(model, sources, vocab_src, vocab_tgt, tokenizers[0])
score, signature = bleu(hypotheses, references)
print(f"BLEU {score:.2f} on val[:200] ({signature})")
assert 0.5 < score < 30, score  # a model trained for four tiny epochs: some BLEU, not much

# %% [markdown]
# Shipping the demo model the same way: the weights file shrinks, and rounding the weights to
# float16 and back changes few if any of its translations.

# %% nbval_reason="how many translations float16 changes depends on the demo model's training" tags=["nbval-ignore-output"]
shipped_dir = demo_dir / "shipped"
export_for_shipping(demo_dir / "last.pt", shipped_dir, command="(the notebook's demo)")
sizes = {p.name: p.stat().st_size for p in [demo_dir / "last.pt", shipped_dir / "model.pt"]}
print(f"training checkpoint {sizes['last.pt'] / 1e6:.2f} MB, shipped weights "
      f"{sizes['model.pt'] / 1e6:.2f} MB")
print(sorted(p.name for p in shipped_dir.iterdir()))
shipped, *_ = load_trained_model(shipped_dir)
print("dtype after loading:", next(shipped.parameters()).dtype)
half_hypotheses = translate(shipped, sources, vocab_src, vocab_tgt, tokenizers[0])
same = sum(a == b for a, b in zip(half_hypotheses, hypotheses, strict=True))
print(f"{same} of {len(sources)} translations unchanged by rounding the weights to float16")
shutil.rmtree(demo_dir)
assert same >= 0.9 * len(sources), same

# %% [markdown]
# ## What the worker guarantees
#
# The ranks start from the same weights and the same batch lists, check that they still agree
# after every epoch, and stop together with one clear error when they do not. The checkpoint
# resumes exactly, and a failure costs at most the epoch it interrupted, or the last $N$ steps
# with checkpoints every $N$ steps.
