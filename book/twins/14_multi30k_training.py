# %% [markdown]
# # Multi30k: training on one or many devices
#
# Chapters 7 to 11 built every part of the paper's training recipe and tried it on toy data in
# a loop of a few lines. A real run asks more of the loop than correctness. It lasts hours, so
# it has to survive being stopped and continue as if nothing had happened. It may run on a
# laptop, on one GPU or on eight, and should be the same program in each case. And at the end
# someone wants to know how good the translations are, in a number that others can reproduce.
#
# This chapter turns the loop into such a training system for German-to-English translation on
# Multi30k {cite}`elliott2016multi30k`: a configuration with presets for a CPU and for GPUs,
# checkpoints that are written atomically and resume exactly, data split between processes,
# `DistributedDataParallel` with bfloat16 autocast on GPUs, and evaluation with greedy decoding
# and sacreBLEU {cite}`post2018call`. Two small scripts, `tools/train.py` and
# `tools/translate.py`, put it on the command line. In the notebook everything runs on a tiny
# model for a few hundred steps, so that the chapter stays fast; the real runs are commands.

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
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Batch,
    EncoderDecoder,
    LabelSmoothing,
    SimpleLossCompute,
    TokenBudgetSampler,
    TrainState,
    Vocab,
    accumulation_groups,
    collate_batch,
    download_file,
    enable_book_charts,
    encode_pairs,
    example_lengths,
    filter_by_length,
    greedy_decode,
    line_chart,
    load_multi30k,
    load_tokenizers,
    make_model,
    rate,
    repository_root,
    run_groups,
    sha256_of,
    subsequent_mask,
    tokenize,
    tokenize_pairs,
)

enable_book_charts()

# %% [markdown]
# ## A run is a configuration
#
# Everything that decides what a run computes goes into one frozen dataclass: the model's sizes,
# the batch, the schedule, the loss, the seed and where checkpoints go. A run is then fully
# described by one value that can be printed, compared, stored in every checkpoint and checked
# again on resume. Its defaults are the paper's base model; two presets name the runs this
# book cares about.
#
# * **`base`** is the paper's base model ($N=6$, $d_{\text{model}}=512$, $d_{\text{ff}}=2048$,
#   $h=8$, dropout 0.1, label smoothing 0.1, Adam with $\beta_2 = 0.98$ and the warmup schedule
#   of chapter 10), for one or more GPUs. Multi30k is tiny next to WMT: with the paper's 25,000
#   tokens per batch an epoch would be about sixteen optimizer steps. So a batch holds 4,096
#   padded tokens per GPU and the warmup is 1,000 steps (on one GPU, below) instead of 4,000, with `lr_factor=0.5` so that
#   the peak learning rate, $0.5 \cdot 512^{-0.5} \cdot 1000^{-0.5} \approx 0.0007$, is the
#   paper's. We have not run this preset for the book (its machine has no GPU); it is a
#   starting point, not a tested recipe. The GPU-only parts of the code below (bfloat16
#   autocast, NCCL, the GPU report) have tests of their own in `tests/test_gpu.py`, which run
#   only where CUDA is available.
# * **`cpu`** is a small model for a 2-core CPU: $N=3$, $d_{\text{model}}=256$,
#   $d_{\text{ff}}=1024$, $h=8$. Its size came from timing candidates, as described below.
#
# The batch size `max_tokens` is a budget **per device and per micro-batch**: the padded tokens
# (of source and of target, each) that one process puts through the model at once, which is
# what its memory has to hold. One optimizer step then sees
# $R \times$ `accum_iter` $\times$ `max_tokens` padded tokens, with $R$ processes. Adding
# devices therefore enlarges the global batch rather than shrinking each device's share (which
# would leave 512 tokens per GPU of the `base` preset on eight GPUs). The paper's batch of
# about 25,000 tokens is reached with accumulation: `tools/train.py --batch-tokens 25000` picks
# the `accum_iter` that comes nearest for the number of processes it runs with, 6 on one GPU
# (24,576 tokens) and 1 on eight (32,768). A different global batch is a different
# optimization (other steps per epoch, another point in the schedule), so a resumed run must
# keep $R \times$ `accum_iter`.
#
# The schedule is counted in optimizer steps, and a larger global batch takes fewer of them.
# With $k = R \times$ `accum_iter` micro-batches per step, an epoch has about $k$ times fewer
# steps, so `warmup` counts the steps of one process without accumulation and a run with $k$
# micro-batches per step warms up for `warmup`$/k$ steps: every run warms up over the same share
# of the data. Since chapter 10's peak rate falls as the square root of the warm-up, the peak
# is $\sqrt{k}$ times higher, between keeping the rate and scaling it with the batch. Before the
# first step, `schedule_steps` prints the plan, and it refuses in one line, with the numbers and
# the fix, a run that would end before its learning rate peaks. On one GPU the `base` preset's
# epoch is about 112 micro-batches of 4,096 tokens, so it trains about 3,360 steps with 1,000 of
# warm-up; on eight GPUs about 420 steps with 125 of warm-up; the tests check every preset on
# 1, 4 and 8 devices and with `--batch-tokens 25000`.
#
# Both keep separate German and English vocabularies (chapter 9), so the embeddings cannot be
# shared between encoder, decoder and generator as the paper's shared byte-pair vocabulary
# allowed.

# %% tags=["export"]
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TrainConfig:
    """Everything one Multi30k training run depends on; defaults are the paper's base model."""

    N: int = 6
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    dropout: float = 0.1
    max_tokens: int = 4096  # padded tokens per micro-batch on each device (src and tgt each)
    accum_iter: int = 1  # micro-batches per optimizer step, on each device
    epochs: int = 30
    warmup: int = 1000  # warm-up steps of one process without accumulation (schedule_steps)
    lr_factor: float = 0.5
    label_smoothing: float = 0.1
    max_len: int = 72  # longest sentence kept, with <s> and </s>; also the decoding limit
    min_freq: int = 2  # rarer words become <unk>
    seed: int = 0
    checkpoint_dir: str = "checkpoints/multi30k_base"
    train_limit: int | None = None  # use only the first train_limit training pairs (demos, tests)
    val_limit: int | None = None  # the same for the validation pairs
    keep_epochs: int = 0  # also keep the weights of the last keep_epochs epochs, for averaging
    bleu_every: int = 1  # greedy validation BLEU every bleu_every epochs (0: never); keeps best.pt
    subwords: int = 0  # 0: two word vocabularies; else one joint sentencepiece vocabulary this big
    share_embeddings: bool = False  # one matrix for both embeddings and the generator (§3.4)

    def __post_init__(self) -> None:
        for name in ("N", "d_model", "d_ff", "h", "max_tokens", "accum_iter", "epochs", "warmup"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.h:
            raise ValueError(f"d_model={self.d_model} is not divisible by h={self.h} heads")
        for name in ("keep_epochs", "bleu_every", "subwords"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if self.share_embeddings and not self.subwords:
            raise ValueError("share_embeddings=True needs one joint vocabulary: set subwords > 0")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")


def training_config(name: str, **overrides) -> TrainConfig:
    """The preset `name` ("cpu" or "base") with some fields replaced, e.g. epochs=2."""
    presets = {
        # A small model that this book's 2-core CPU trains in about an hour (see the text).
        "cpu": TrainConfig(
            N=3, d_model=256, d_ff=1024, h=8, dropout=0.1, max_tokens=1500, accum_iter=1,
            epochs=12, warmup=1000, lr_factor=0.5, checkpoint_dir="checkpoints/multi30k_cpu",
        ),
        # The paper's base model; batch (per GPU) and warmup sized for Multi30k.
        "base": TrainConfig(),
        # The cpu preset with one joint subword vocabulary and tied embeddings (chapter 17).
        "cpu_subword": TrainConfig(
            N=3, d_model=256, d_ff=1024, h=8, dropout=0.1, max_tokens=1500, accum_iter=1,
            epochs=12, warmup=1000, lr_factor=0.5, subwords=8000, share_embeddings=True,
            checkpoint_dir="checkpoints/multi30k_cpu_subword",
        ),
    }
    if name not in presets:
        raise ValueError(f"name must be one of {', '.join(presets)}, got {name!r}")
    return replace(presets[name], **overrides)

# %% [markdown]
# How large can the CPU model be? We timed candidates on the real data: the full training set
# with its vocabularies (8,012 German and 6,190 English words), a few warm-up steps, then 12 to
# 30 timed optimizer steps of `train_epoch` (defined below), on this book's 2-core build
# machine while other jobs shared it. An epoch of Multi30k's training set is 409,188 target
# tokens, so each speed implies an epoch time. The candidates were A: $N=3$,
# $d_{\text{model}}=256$, $d_{\text{ff}}=1024$, batches of 1,500 tokens, on one thread and on
# two; B: A with $N=4$; C: A with batches of 3,000 tokens; and D: A with $N=2$. Those timings
# are not stored with the book, so we give them here in round numbers only.
#
# What the machine was doing meanwhile mattered more than the candidates did. On one thread
# every candidate ran at roughly 800 to 1,450 target tokens/s, about 5 to 9 minutes per epoch,
# and repeated runs of one candidate differed as much as the candidates did. Two threads were
# the fastest of all in a quiet moment, at about 2,400 tokens/s, but while other jobs were busy
# they fell below 200 tokens/s, 40 minutes or more per epoch. The two
# threads of each matrix product wait for each other, and one of them keeps losing its core.
# That is why the worker below never gives its processes more threads than there are cores, and
# why `tools/train.py` has a `--threads` option: on a shared machine, use one. The `cpu`
# preset takes candidate A, the middle size, with 12 epochs: under two hours of training even
# at the slowest one-thread speed we saw. The run that made the shipped model took about 5 to 6
# minutes per epoch and 67 minutes in all (its `info.json`, read at the end of this chapter,
# records the time of every epoch).
# Its warmup of 1,000 steps covers a little over three of the twelve epochs of 305 steps, and
# `lr_factor=0.5` makes the peak learning rate
# $0.5 \cdot 256^{-0.5} \cdot 1000^{-0.5} \approx 0.001$.

# %%
import pandas as pd

presets = {name: training_config(name) for name in ("cpu", "base")}
fields = ["N", "d_model", "d_ff", "h", "dropout", "max_tokens", "accum_iter", "epochs", "warmup",
          "lr_factor", "label_smoothing", "max_len", "checkpoint_dir"]
pd.DataFrame({name: [getattr(c, f) for f in fields] for name, c in presets.items()}, index=fields)

# %%
for bad in ({"d_model": 100, "h": 8}, {"max_tokens": 0}):
    try:
        training_config("cpu", **bad)
    except ValueError as err:
        print(f"{bad}: {err}")

# %% [markdown]
# ## Checkpoints that survive a crash
#
# A two-hour run will be interrupted sooner or later: a laptop goes to sleep, a shared GPU
# machine reclaims its job, someone presses Ctrl-C. A checkpoint at the end of each epoch limits
# the loss to one epoch, but only if the checkpoint itself is never half written. `torch.save`
# straight onto `last.pt` would replace a good checkpoint with a truncated one if the process
# died in the middle of writing, and the run would lose everything. So we write to a temporary
# file in the same folder, force its bytes to disk, and only then rename it over the old one
# with `os.replace`. On one file system a rename is atomic: whoever opens `last.pt` finds either
# the old checkpoint or the new one, never a mixture. (The temporary file must be in the same
# folder: across file systems a rename becomes a copy, and a copy can be interrupted too.)
#
# A checkpoint that can resume a run exactly holds more than the weights: the optimizer's state
# (Adam's two running moments per parameter), the scheduler's step, the counters of
# `TrainState`, the epoch, and the states of the random number generators, so that dropout
# draws the same masks it would have drawn without the interruption.
#
# Loading uses `torch.load(..., weights_only=True)`. A checkpoint is a pickle, and a full
# unpickler runs whatever code the file names, so loading a checkpoint from someone else would
# be running their program. With `weights_only=True` PyTorch accepts only tensors and plain
# containers of numbers and strings, which is why the random states are stored as the byte
# tensors that `torch.get_rng_state` returns, and the configuration as a plain dict. A file that
# is truncated or not a checkpoint at all gives an error that names it and says what to do.

# %% tags=["export"]
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import torch


def save_checkpoint(checkpoint: dict[str, Any], path: str | os.PathLike) -> None:
    """Write with torch.save to a temporary file beside path, then rename: all or nothing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            torch.save(checkpoint, f)
            f.flush()
            os.fsync(f.fileno())  # the bytes are on disk before the name points at them
        os.chmod(tmp, 0o644)  # mkstemp makes files only their owner can read
        os.replace(tmp, path)  # atomic on POSIX: readers see the old file or the new, never half
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_checkpoint(
    path: str | os.PathLike, *, map_location: str | torch.device = "cpu"
) -> dict[str, Any]:
    """Read a checkpoint with weights_only=True (tensors and plain types; no code is run)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    try:
        checkpoint = torch.load(path, map_location=map_location, weights_only=True)
    except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        raise ValueError(
            f"checkpoint {path} is truncated or corrupted and cannot be read ({err}); "
            "delete it to start again, or resume from an intact copy"
        ) from err
    if not isinstance(checkpoint, dict) or "model" not in checkpoint:
        raise ValueError(f"checkpoint {path} holds no model weights under the key 'model'")
    return checkpoint

# %%
import tempfile
from pathlib import Path

import torch

with tempfile.TemporaryDirectory() as folder:
    path = Path(folder) / "last.pt"
    state = {"model": {"weight": torch.arange(6.0).reshape(2, 3)}, "epoch": 1,
             "rng": [{"torch": torch.get_rng_state(), "cuda": None}]}
    save_checkpoint(state, path)
    loaded = load_checkpoint(path)
    assert torch.equal(loaded["model"]["weight"], state["model"]["weight"])
    assert torch.equal(loaded["rng"][0]["torch"], state["rng"][0]["torch"])
    print("files in the folder after saving:", sorted(p.name for p in Path(folder).iterdir()))

    class Unsaveable:  # torch.save fails halfway through pickling this
        def __reduce__(self):
            raise RuntimeError("the process died while writing")

    try:
        save_checkpoint({"model": {}, "epoch": 2, "oops": Unsaveable()}, path)
    except RuntimeError as err:
        print("saving failed:", err)
    print("files after the failed save:", sorted(p.name for p in Path(folder).iterdir()))
    print("last.pt still holds epoch", load_checkpoint(path)["epoch"])

    path.write_bytes(path.read_bytes()[:200])  # what a crash during a plain torch.save leaves
    try:
        load_checkpoint(path)
    except ValueError as err:
        print(str(err).replace(folder, "<folder>")[:110] + " ...")

# %% [markdown]
# ## Data for each device
#
# The data pipeline is chapter 9's: spaCy's tokenizers, vocabularies of the words seen at least
# twice, pairs longer than `max_len` dropped, and `TokenBudgetSampler` filling batches up to a
# budget of padded tokens. Three things are new.
#
# The vocabularies are built from the training split only (the validation and test sentences
# must stay unseen), once, by rank 0, and written as JSON into the checkpoint folder. The other
# processes of the run receive them from rank 0 (below), not from the folder, which on another
# machine may not exist, and a resumed run and later the translation script read them from the
# folder, so that word $i$ means the same word everywhere. JSON rather than a pickle, for the
# same reason as `weights_only` above.
#
# Each process (each *rank*) trains on its own share of the batches: the sampler builds the
# same list of batches on every rank (same seed, same epoch) and rank $r$ of $R$ takes batches
# $r, r + R, r + 2R, \dots$, like PyTorch's `DistributedSampler` does with single examples.
# The shares are disjoint and together cover the data once per epoch. They must also be of
# *equal length*: in distributed training every rank takes part in every gradient exchange,
# and a rank with one batch more would wait forever for partners that have finished their
# epoch. `split_batches_for_ranks` (appendix, *Finding the data*) splits the largest batches until
# their number is a multiple of $R$.
#
# Finally, a `DataLoader` turns index lists into `Batch` objects (chapter 7) with their masks.

# %% tags=["export"]
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

VOCAB_FILES = ("vocab_de.json", "vocab_en.json")
SUBWORD_FILE = "subwords.model"  # one sentencepiece model for both languages (chapter 17)


def multi30k_vocabularies(
    config: TrainConfig,
    tokenizers: tuple[Any, Any],
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    save: bool = True,
) -> tuple[Vocab, Vocab]:
    """German and English vocabularies built from the training pairs (Multi30k's by default).

    Two word Vocabs, or with config.subwords one sentencepiece model (chapter 17) that serves
    as both. With save=True they are also written into the checkpoint folder, replacing what
    is there.
    """
    if pairs is None:  # train only: val and test stay unseen
        pairs = load_multi30k("train")[: config.train_limit]
    if config.subwords:
        sp = train_sentencepiece(  # noqa: F821 (chapter 17)
            [sentence for pair in pairs for sentence in pair], vocab_size=config.subwords
        )
        vocabs = (sp, sp)
        writers = {SUBWORD_FILE: lambda path: Path(path).write_bytes(sp.serialized_model_proto())}
    else:
        token_pairs = tokenize_pairs(pairs, *tokenizers)
        vocabs = tuple(Vocab.build([pair[side] for pair in token_pairs], min_freq=config.min_freq)
                       for side in (0, 1))
        writers = dict(zip(VOCAB_FILES, (vocab.save for vocab in vocabs), strict=True))
    if save:
        folder = Path(config.checkpoint_dir)
        folder.mkdir(parents=True, exist_ok=True)
        for name, write in writers.items():
            tmp = folder / f".{name}.{os.getpid()}.tmp"
            write(tmp)
            os.replace(tmp, folder / name)  # like checkpoints: a reader never sees half a file
    return vocabs


def load_subwords(path: str | os.PathLike) -> Any:
    """A sentencepiece model from its file, or a one-line error that names the file."""
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as err:
        raise ValueError(f"{path} is not a readable sentencepiece model ({err})") from err


def read_vocabularies(folder: str | os.PathLike, *, subwords: bool = False
                      ) -> tuple[Vocab, Vocab]:
    """The vocabularies a run wrote into its checkpoint folder (for resuming, translating):
    the two word vocabularies, or with subwords=True the one sentencepiece model, twice."""
    names = [SUBWORD_FILE] if subwords else list(VOCAB_FILES)
    paths = [Path(folder) / name for name in names]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"the run's vocabularies are missing: {', '.join(missing)}")
    if subwords:
        sp = load_subwords(paths[0])
        return sp, sp
    return Vocab.load(paths[0]), Vocab.load(paths[1])


def multi30k_examples(
    split: str,
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizers: tuple[Any, Any],
    *,
    max_len: int,
    limit: int | None = None,
) -> list[tuple[list[int], list[int]]]:
    """The first `limit` pairs of a split as ids, without pairs longer than max_len."""
    pairs = load_multi30k(split)[:limit]
    return encode_examples(pairs, vocab_src, vocab_tgt, tokenizers, max_len=max_len)


def encode_examples(
    pairs: Sequence[tuple[str, str]],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizers: tuple[Any, Any],
    *,
    max_len: int,
) -> list[tuple[list[int], list[int]]]:
    """Sentence pairs as id lists, without pairs longer than max_len."""
    if isinstance(vocab_src, Vocab):
        examples = encode_pairs(tokenize_pairs(pairs, *tokenizers), vocab_src, vocab_tgt)
    else:  # sentencepiece: raw text in, ids out
        examples = [(vocab_src.encode(de), vocab_tgt.encode(en)) for de, en in pairs]
    return filter_by_length(examples, max_len=max_len)[0]


def collate_to_batch(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Batch:
    """Pad a list of (src, tgt) id lists into a Batch with its masks (a DataLoader collate_fn)."""
    src, tgt = collate_batch(pairs, pad_id=PAD_ID)  # (batch, n_src), (batch, n_tgt + 1)
    return Batch(src, tgt, pad=PAD_ID)


def multi30k_loader(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    max_tokens: int,
    shuffle: bool,
    seed: int = 0,
    num_replicas: int = 1,
    rank: int = 0,
) -> DataLoader:
    """Token-budget batches of this rank's share of examples, as Batch objects."""
    src_lengths, tgt_lengths = example_lengths(examples)
    sampler = TokenBudgetSampler(
        src_lengths, tgt_lengths, max_tokens=max_tokens, shuffle=shuffle, seed=seed,
        num_replicas=num_replicas, rank=rank,
    )
    return DataLoader(examples, batch_sampler=sampler, collate_fn=collate_to_batch)

# %%
tokenizers = load_tokenizers()
tiny = TrainConfig(train_limit=400)
vocab_src, vocab_tgt = multi30k_vocabularies(tiny, tokenizers, save=False)
examples = multi30k_examples("train", vocab_src, vocab_tgt, tokenizers, max_len=72, limit=400)
shares = [
    multi30k_loader(examples, max_tokens=300, shuffle=True, num_replicas=2, rank=rank)
    for rank in range(2)
]
for share in shares:
    share.batch_sampler.set_epoch(0)
indices = [[i for batch in share.batch_sampler for i in batch] for share in shares]
print("batches per rank:", [len(share) for share in shares])
print("examples per rank:", [len(ix) for ix in indices], "of", len(examples))
assert len(shares[0]) == len(shares[1])
assert not set(indices[0]) & set(indices[1]) and len(set(indices[0] + indices[1])) == len(examples)
print(next(iter(shares[0])))

# %% [markdown]
# ## One epoch, on any device
#
# `train_epoch` and `evaluate` are chapter 8's accumulation core, `run_groups`, with three
# additions for real hardware, and one for reporting. Chapter 8's version has no place for them,
# so this chapter grows it, the way the book grows every definition that a later chapter needs
# more from: it defines `run_groups` again, under the same name, with four new keyword
# arguments whose defaults give chapter 8's loop (the cell below; the appendix describes the
# mechanism).
#
# **Moving batches.** Each `Batch` is moved to the process's device just before use.
#
# **Gradient averaging.** With $R$ processes, `DistributedDataParallel` (DDP) keeps a full copy
# of the model in each {cite}`li2020pytorch`. Every rank computes gradients on its own batch;
# during `backward` DDP adds them up across ranks with an *all-reduce* and divides by $R$, in
# buckets, overlapping the communication with the rest of the backward pass. Every rank then
# holds the same averaged gradient, takes the same optimizer step, and the copies stay
# identical without ever sending weights. What should the average be? One process on the
# whole global batch would follow its loss per token, $\sum_r S_r / \sum_r T_r$, where $S_r$
# is rank $r$'s summed loss and $T_r$ its token count. If each rank divided by its own $T_r$,
# DDP's average would give $\frac{1}{R}\sum_r S_r / T_r$ instead, a mean of per-rank means that
# weighs a rank holding short sentences as much as one holding long ones. So before the first
# backward pass of an optimizer step the ranks add up their token counts $T_r$ with one small
# all-reduce (a single number), and each divides by $T / R$ with $T = \sum_r T_r$: after DDP's
# division by $R$ the gradient is exactly that of $\sum_r S_r / T$. This is chapter 8's rule
# for accumulation, extended across devices: `run_groups`'s new `group_norm`.
# (The test suite checks that two processes take the same steps as one process on the same
# global batches.)
#
# With gradient accumulation, the micro-batches before the last of a group run inside
# `model.no_sync()` (the new `sync_context`): their gradients only accumulate locally, and the
# all-reduce happens once, in the backward pass of the group's last micro-batch, on the sum.
#
# **bfloat16 autocast.** On GPUs that support it, the forward pass runs under
# `torch.autocast(dtype=torch.bfloat16)` (the new `forward_context`): matrix multiplications take
# 16-bit inputs, which moves half the bytes and runs on the tensor cores at several times the
# float32 speed, while reductions such as softmax and the loss stay in float32 and the weights
# and optimizer state remain float32 {cite}`micikevicius2018mixed`. bfloat16 keeps float32's 8
# exponent bits and gives up mantissa bits instead, so unlike float16 it cannot overflow where
# float32 would not, and no loss scaling is needed {cite}`kalamkar2019study`. "Supports" means in
# hardware: GPUs from compute capability 8.0 (Ampere) on. `torch.cuda.is_bf16_supported()` also
# says yes on older GPUs such as the V100 or T4, where bfloat16 is emulated and slower than
# float32, so `autocast_dtype_for` asks for the compute capability instead. On a CPU autocast is
# off: the float32 numbers there are the reference the tests compare against.
#
# **Likelihood.** The label-smoothed loss that training minimizes is not the model's
# likelihood: even a perfect model pays for the smoothing. So the loss function below also adds
# up the plain negative log-likelihood of the reference tokens, and the history reports it per
# token beside the smoothed loss, with the perplexity $e^{\text{NLL}}$.

# %% tags=["export", "extends"]
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext

import torch
from torch import nn


def run_groups(
    batches: Iterable,
    model: nn.Module,
    loss_compute,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler=None,
    *,
    accum_iter: int = 1,
    train_state: TrainState | None = None,
    group_norm: Callable[[int], float] | None = None,
    sync_context: Callable[[bool], AbstractContextManager] | None = None,
    forward_context: Callable[[], AbstractContextManager] | None = None,
    after_group: Callable[[float, int, int], None] | None = None,
) -> tuple[float, int]:
    """Chapter 8's accumulation core, grown by four hooks for real hardware.

    group_norm(T) replaces the divisor T (DDP divides by the tokens of all ranks);
    sync_context(is_last) wraps a micro-batch's forward and backward (DDP's no_sync),
    forward_context() its forward (autocast); after_group(loss, tokens, batches) reports.
    """
    train = optimizer is not None
    total_loss, total_tokens = 0.0, 0
    with torch.set_grad_enabled(train):
        for group in accumulation_groups(batches, accum_iter):
            tokens = sum(batch.ntokens for batch in group)  # T = T_1 + ... + T_k
            norm = group_norm(tokens) if group_norm is not None else max(tokens, 1)
            group_loss = 0.0
            for i, batch in enumerate(group):
                is_last = i == len(group) - 1
                with sync_context(is_last) if sync_context is not None else nullcontext():
                    with forward_context() if forward_context is not None else nullcontext():
                        out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                        loss_sum, loss = loss_compute(out, batch.tgt_y, norm)  # S_i, S_i / T
                    if train:
                        loss.backward()  # .grad accumulates the sum over the group
                group_loss += loss_sum
                if train and train_state is not None:
                    train_state.step += 1
                    train_state.samples += batch.src.size(0)
                    train_state.tokens += batch.ntokens
            if train:
                optimizer.step()  # once per group of accum_iter micro-batches
                optimizer.zero_grad(set_to_none=True)
                if train_state is not None:
                    train_state.accum_step += 1
                if scheduler is not None:
                    scheduler.step()  # the schedule counts optimizer steps
            total_loss += group_loss
            total_tokens += tokens
            if after_group is not None:
                after_group(group_loss, tokens, len(group))
    return total_loss, total_tokens



# %% tags=["export"]
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself, also when DistributedDataParallel wraps it."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def autocast_dtype_for(device: torch.device) -> torch.dtype | None:
    """bfloat16 on GPUs that compute in it natively (compute capability 8.0 on); else None."""
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else None


class LossAndNLL(SimpleLossCompute):
    """SimpleLossCompute that also adds up the labels' plain negative log-likelihood in nll."""

    def __init__(self, generator: nn.Module, criterion: nn.Module, pad_id: int = PAD_ID):
        super().__init__(generator, criterion)
        self.pad_id = pad_id
        self.nll = 0.0

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, norm: float
    ) -> tuple[float, torch.Tensor]:
        logp = self.generator(x)  # (batch, n_tgt, tgt_vocab), log-probabilities
        logp = logp.reshape(-1, logp.size(-1))  # (rows, tgt_vocab)
        y = y.reshape(-1)  # (rows,)
        loss_sum = self.criterion(logp, y)
        gold = logp.detach().gather(1, y.unsqueeze(1)).squeeze(1)  # log p(label), (rows,)
        self.nll -= float(gold.masked_fill(y == self.pad_id, 0.0).sum())
        return float(loss_sum.detach()), loss_sum / norm


def global_norm(tokens: int, device: torch.device) -> float:
    """T / R for the tokens T of all R ranks: DDP's mean of gradients then divides by T."""
    total = torch.tensor([float(tokens)], dtype=torch.float64, device=device)
    dist.all_reduce(total)  # one number per optimizer step
    return max(float(total), 1.0) / dist.get_world_size()


def train_epoch(
    model: nn.Module,
    batches: Iterable[Batch],
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    *,
    device: torch.device,
    accum_iter: int = 1,
    train_state: TrainState,
    autocast_dtype: torch.dtype | None = None,
    bar: Any = None,
) -> tuple[float, int, float]:
    """One training pass over this rank's batches: summed loss, target tokens, summed NLL.

    Under DistributedDataParallel the loss is normalized by the tokens of the whole global
    batch (all ranks, all micro-batches of the step), as one process would normalize it.
    """
    model.train()
    loss_compute = LossAndNLL(unwrap(model).generator, criterion, PAD_ID)
    ddp = isinstance(model, DistributedDataParallel)

    def sync_context(is_last: bool) -> AbstractContextManager:
        # DDP averages gradients across ranks during backward; skip that until the last
        # micro-batch of the group, whose backward carries the accumulated sum.
        return model.no_sync() if ddp and not is_last else nullcontext()

    def forward_context() -> AbstractContextManager:
        return torch.autocast(device.type, dtype=autocast_dtype,
                              enabled=autocast_dtype is not None)

    totals = {"loss": 0.0, "tokens": 0, "start": time.perf_counter()}

    def after_group(loss_sum: float, tokens: int, n_batches: int) -> None:
        totals["loss"] += loss_sum
        totals["tokens"] += tokens
        if bar is not None:
            bar.update(n_batches)
            speed = totals["tokens"] / max(time.perf_counter() - totals["start"], 1e-9)
            bar.set_postfix(loss=f"{totals['loss'] / max(totals['tokens'], 1):.3f}",
                            tokens_per_s=f"{speed:,.0f}",
                            lr=f"{optimizer.param_groups[0]['lr']:.2e}")

    loss, tokens = run_groups(
        (batch.to(device) for batch in batches), model, loss_compute, optimizer, scheduler,
        accum_iter=accum_iter, train_state=train_state,
        group_norm=(lambda t: global_norm(t, device)) if ddp else None,
        sync_context=sync_context, forward_context=forward_context, after_group=after_group,
    )
    return loss, tokens, loss_compute.nll


def evaluate(
    model: nn.Module,
    batches: Iterable[Batch],
    criterion: nn.Module,
    *,
    device: torch.device,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[float, int, float]:
    """Summed loss, target tokens and summed NLL over batches, without dropout or gradients."""
    model = unwrap(model)  # no gradients, so nothing for DDP to synchronize
    model.eval()
    loss_compute = LossAndNLL(model.generator, criterion, PAD_ID)
    loss, tokens = run_groups(
        (batch.to(device) for batch in batches), model, loss_compute,
        forward_context=lambda: torch.autocast(device.type, dtype=autocast_dtype,
                                               enabled=autocast_dtype is not None),
    )
    return loss, tokens, loss_compute.nll

# %% [markdown]
# ## The worker
#
# `train_worker` is everything one process does, from its rank to its last checkpoint. It is a
# sequence of named steps, each a function below:
#
# 1. **`setup_process`: device, threads, process group.** Rank $r$ takes GPU `LOCAL_RANK` (its
#    number on its own machine) if there are GPUs, else the CPU. Several CPU processes on one
#    machine split the cores between them. On this book's 2-core machine, a small model in
#    two gloo processes ran roughly ten times slower with two threads per process than with one,
#    in a quick measurement not stored with the book: four threads on two cores keep waiting for
#    each other. With
#    more than one process, `torch.distributed` connects them, through NCCL between GPUs or
#    gloo between CPU processes; where to meet (`MASTER_ADDR`, `MASTER_PORT`) comes from the
#    environment.
# 2. **`prepare_checkpoint_dir`: one decision about the folder.** Only rank 0 looks at its
#    checkpoint folder, and every rank learns its decision. A fresh run into a folder that
#    already holds another run's `last.pt`, `best.pt` or `epoch_NNN.pt` refuses to start (those
#    files would be overwritten, or mixed into checkpoint averaging) unless told to `overwrite`,
#    which deletes them first; `resume` with no `last.pt` is an error, not a quiet fresh start.
#    A process that `torchrun` restarted after a failure (it sets `TORCHELASTIC_RESTART_COUNT`)
#    continues from `last.pt` when there is one.
# 3. **`load_data`: vocabularies and batches.** Rank 0 builds the vocabularies (or, resuming,
#    reads them from its folder) and sends them to the other ranks, which may run on machines
#    that cannot see rank 0's files. Each rank encodes its sentence pairs and takes its share of
#    the batches.
# 4. **`build_training`: model, optimizer, schedule, loss.** Every rank seeds the generator
#    identically before building the model, so all copies start from the same weights.
# 5. **`resume_run`: one source of truth.** Rank 0 alone reads `last.pt`, checks that its
#    configuration is this one (every field but those a resumed run may change: `epochs`,
#    `checkpoint_dir`, `keep_epochs`, `bleu_every`, and `accum_iter` as long as processes
#    $\times$ `accum_iter` stays the same), and sends the whole checkpoint to the other ranks
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
#    still identical on all ranks, and report. Rank 0 shows a tqdm bar on stderr with the
#    running loss, tokens per second and learning rate; on GPUs each epoch also reports the
#    peak memory (`torch.cuda.max_memory_allocated`) and the GPU's utilization as
#    `nvidia-ml-py` samples it at the end of the epoch, when that package is installed (through
#    `torch.cuda.utilization`, which translates the device index through `CUDA_VISIBLE_DEVICES`
#    into NVML's own numbering).
# 7. **`save_epoch`: the checkpoint.** Rank 0 writes `last.pt`, holding all ranks' random
#    states; `best.pt` (weights only) whenever the validation BLEU is the best so far; and with
#    `keep_epochs=k` the weights of each of the last `k` epochs as `epoch_NNN.pt`, for the
#    checkpoint averaging of chapter 16. The other ranks wait until it has finished, and a
#    failed save stops all of them with rank 0's error.
#
# The same function runs in three ways: called directly for one process, started by
# `train_distributed` below, or started by `torchrun`, in which case it reads `RANK`,
# `WORLD_SIZE` and `LOCAL_RANK` from the environment. Tests and small experiments can pass
# their own sentence pairs (`pairs={"train": ..., "val": ...}`) instead of Multi30k.

# %% tags=["export"]
import hashlib
import inspect
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
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
    folder: str | os.PathLike, *, resume: bool, overwrite: bool, restarted: bool = False
) -> bool:
    """2) Whether to resume from folder/last.pt; never mix a fresh run with another's files."""
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


def training_pairs(
    config: TrainConfig, pairs: dict[str, Sequence[tuple[str, str]]] | None
) -> dict[str, list[tuple[str, str]]]:
    """The train and val sentence pairs, given or Multi30k's, cut to the config's limits."""
    if pairs is None:
        pairs = {split: load_multi30k(split) for split in ("train", "val")}
    missing = sorted({"train", "val"} - set(pairs))
    if missing:
        raise ValueError(f"pairs must hold the splits 'train' and 'val'; missing {missing}")
    return {"train": list(pairs["train"])[: config.train_limit],
            "val": list(pairs["val"])[: config.val_limit]}


def load_data(
    process: Process, config: TrainConfig, pairs: dict[str, list[tuple[str, str]]],
    *, resuming: bool,
) -> RunData:
    """3) Rank 0's vocabularies on every rank, and this rank's share of the batches."""
    tokenizers = load_tokenizers()

    def vocabularies() -> tuple[Vocab, Vocab]:
        if resuming:  # the ids the checkpoint's embeddings were trained with
            return read_vocabularies(config.checkpoint_dir, subwords=config.subwords > 0)
        return multi30k_vocabularies(config, tokenizers, pairs=pairs["train"])

    vocab_src, vocab_tgt = from_rank0(process, vocabularies)
    train_data, val_data = (
        encode_examples(pairs[split], vocab_src, vocab_tgt, tokenizers, max_len=config.max_len)
        for split in ("train", "val")
    )
    shard = {"max_tokens": config.max_tokens, "num_replicas": process.world_size,
             "rank": process.rank, "seed": config.seed}
    train_loader = multi30k_loader(train_data, shuffle=True, **shard)
    val_loader = multi30k_loader(val_data, shuffle=False, **shard)
    return RunData(vocab_src, vocab_tgt, train_loader, val_loader, pairs["val"], tokenizers)


def schedule_steps(config: TrainConfig, *, batches_per_epoch: int, world_size: int) -> dict:
    """The run's schedule in optimizer steps, refused when training would end in the warm-up.

    `config.warmup` counts the steps of one process without accumulation. A run whose steps
    each take k = world_size x accum_iter micro-batches walks the same data in k times fewer
    steps, so its warm-up is warmup / k steps (and its peak rate sqrt(k) times higher).
    """
    k = world_size * config.accum_iter
    per_epoch = math.ceil(batches_per_epoch / config.accum_iter)
    plan = {"micro_batches_per_step": k, "steps_per_epoch": per_epoch,
            "total_steps": config.epochs * per_epoch, "warmup": max(1, round(config.warmup / k))}
    if plan["total_steps"] <= plan["warmup"]:
        raise ValueError(
            f"the run would take {plan['total_steps']} optimizer steps ({per_epoch} per epoch x "
            f"{config.epochs}: {batches_per_epoch} micro-batches per process, accum_iter "
            f"{config.accum_iter}), not more than its {plan['warmup']} warm-up steps "
            f"(warmup={config.warmup} / {k} micro-batches per step), so the learning rate "
            "would never peak: raise epochs or lower warmup"
        )
    return plan


def build_training(
    process: Process, config: TrainConfig, src_vocab: int, tgt_vocab: int, *, warmup: int
) -> Run:
    """4) Model (the same initial weights on every rank), optimizer, schedule and loss; warmup
    is the run's warm-up in its own optimizer steps (schedule_steps)."""
    torch.manual_seed(config.seed)
    model = make_model(
        src_vocab, tgt_vocab, N=config.N, d_model=config.d_model, d_ff=config.d_ff,
        h=config.h, dropout=config.dropout, share_embeddings=config.share_embeddings,
    ).to(process.device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda=lambda step: rate(step, config.d_model, config.lr_factor, warmup),
    )
    criterion = LabelSmoothing(tgt_vocab, PAD_ID, smoothing=config.label_smoothing)
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
    return changes


def read_resume_checkpoint(path: Path, config: TrainConfig, world_size: int) -> dict[str, Any]:
    """last.pt, checked against the configuration of the run that is to continue it."""
    checkpoint = load_checkpoint(path)
    changes = config_differences(checkpoint["config"], config, world_size,
                                 len(checkpoint["rng"]))
    if changes:
        raise ValueError(f"cannot resume from {path}: " + "; ".join(changes))
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
    run.elapsed_s, run.best_bleu = checkpoint["elapsed_s"], checkpoint.get("best_bleu")
    check_same_on_all_ranks(
        process, [run.epoch, run.train_state.accum_step, weights_fingerprint(run.model)],
        f"the epoch, step and weights resumed from rank 0's {path}",
    )
    if len(checkpoint["rng"]) == process.world_size:
        set_rng_states(checkpoint["rng"][process.rank], process.device)
    else:
        if process.rank == 0:
            print(f"{path} was written by {len(checkpoint['rng'])} processes, not "
                  f"{process.world_size}: random states start afresh", file=sys.stderr)
        torch.manual_seed(config.seed + 1_000 * run.epoch + process.rank)
    if process.rank == 0:
        print(f"resumed from {path} after epoch {run.epoch}", file=sys.stderr)


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


def save_epoch(process: Process, config: TrainConfig, run: Run, improved: bool) -> None:
    """7) Rank 0 writes last.pt (and best.pt, epoch_NNN.pt); every rank waits until it is done."""
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
                "optimizer": run.optimizer.state_dict(),
                "scheduler": run.scheduler.state_dict(),
                "train_state": asdict(run.train_state),
                "rng": rng_all,
                "history": run.history,
                "best_bleu": run.best_bleu,
                "elapsed_s": run.elapsed_s,
                "hardware": hardware_name(process.device, process.world_size),
                "command": " ".join(["python", *sys.argv]),
            },
            folder / "last.pt",
        )
        if improved:
            save_checkpoint({**weights, "val_bleu": run.best_bleu}, folder / "best.pt")
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


def train_epochs(
    process: Process, config: TrainConfig, run: Run, data: RunData, *, progress: bool
) -> list[dict[str, float]]:
    """6) The epochs: check the batches, train, validate, score, report, checkpoint."""
    train_loader, val_loader = data.train_loader, data.val_loader
    device, autocast_dtype = process.device, autocast_dtype_for(process.device)
    walls = []  # each epoch's wall-clock time, validation and checkpoint included
    for epoch in range(run.epoch, config.epochs):
        wall = time.perf_counter()
        sampler = train_loader.batch_sampler
        sampler.set_epoch(epoch)  # a new order, the same on every rank
        check_same_on_all_ranks(
            process, [len(train_loader), fingerprint(sampler.batches())],
            f"the number of training batches per rank and the batch list of epoch {epoch + 1} "
            "(every rank must see the same sentence pairs, max_tokens and seed)",
        )
        bar = None
        if progress and process.rank == 0:
            from tqdm.auto import tqdm

            bar = tqdm(total=len(train_loader), desc=f"epoch {epoch + 1}/{config.epochs}",
                       unit="batch", file=sys.stderr, leave=False)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        train_sums = train_epoch(
            run.model, train_loader, run.criterion, run.optimizer, run.scheduler, device=device,
            accum_iter=config.accum_iter, train_state=run.train_state,
            autocast_dtype=autocast_dtype, bar=bar,
        )
        seconds = time.perf_counter() - start
        if bar is not None:
            bar.close()
        check_same_on_all_ranks(process, [weights_fingerprint(run.model)],
                                f"the weights after epoch {epoch + 1}")
        val_sums = evaluate(run.model, val_loader, run.criterion, device=device,
                            autocast_dtype=autocast_dtype)
        loss, tokens, nll, val_loss, val_tokens, val_nll = all_ranks_sum(
            process, [*train_sums, *val_sums]
        )
        run.epoch, run.elapsed_s = epoch + 1, run.elapsed_s + seconds
        record = {
            "epoch": run.epoch,
            "train_loss": loss / max(tokens, 1),
            "train_nll": nll / max(tokens, 1),
            "val_loss": val_loss / max(val_tokens, 1),
            "val_nll": val_nll / max(val_tokens, 1),
            "val_ppl": math.exp(val_nll / max(val_tokens, 1)),
            "seconds": seconds,
            "tokens_per_s": tokens / seconds,
            **device_report(device),
        }
        improved = False
        if config.bleu_every and run.epoch % config.bleu_every == 0:
            record["val_bleu"] = validation_bleu(process, run.model, data, config.max_len)
            improved = run.best_bleu is None or record["val_bleu"] > run.best_bleu
            run.best_bleu = record["val_bleu"] if improved else run.best_bleu
        run.history.append(record)
        save_epoch(process, config, run, improved)
        walls.append(time.perf_counter() - wall)
        if process.rank == 0:
            left = sum(walls) / len(walls) * (config.epochs - run.epoch)
            print(epoch_line(record, epochs=config.epochs, trained_s=run.elapsed_s, left_s=left),
                  flush=True)
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
) -> list[dict[str, float]]:
    """Train (or resume) on one device as one of world_size processes; the per-epoch history.

    Started by train_distributed, by torchrun (rank and world size then come from the
    environment: RANK, WORLD_SIZE, LOCAL_RANK), or called directly for one process. pairs
    replaces Multi30k: {"train": [(german, english), ...], "val": [...]}.
    """
    config = training_config("cpu") if config is None else config
    rank = int(os.environ.get("RANK", 0)) if rank is None else rank
    world_size = int(os.environ.get("WORLD_SIZE", 1)) if world_size is None else world_size
    if config.max_tokens < config.max_len:
        raise ValueError(
            f"max_tokens={config.max_tokens} per device is less than max_len={config.max_len}: "
            "the longest sentences would not fit into a batch; raise max_tokens"
        )
    process = setup_process(rank, world_size, threads)
    try:
        restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
        resuming = from_rank0(process, lambda: prepare_checkpoint_dir(
            config.checkpoint_dir, resume=resume, overwrite=overwrite, restarted=restarted))
        split_pairs = training_pairs(config, pairs)
        data = load_data(process, config, split_pairs, resuming=resuming)
        plan = schedule_steps(config, batches_per_epoch=len(data.train_loader),
                              world_size=process.world_size)
        if progress and process.rank == 0:
            print(f"schedule: {plan['total_steps']} optimizer steps ({config.epochs} epochs of "
                  f"{plan['steps_per_epoch']}), warm-up {plan['warmup']} steps", flush=True)
        run = build_training(process, config, len(data.vocab_src), len(data.vocab_tgt),
                             warmup=plan["warmup"])
        resume_run(process, config, run, resuming=resuming)
        if process.distributed:  # only now: every rank holds rank 0's state
            run.model = wrap_ddp(run.model, process.device)
        return train_epochs(process, config, run, data, progress=progress)
    finally:
        if process.distributed:
            dist.destroy_process_group()

# %% [markdown]
# ## Many processes
#
# On one machine, `train_distributed` starts one process per device with
# `torch.multiprocessing.spawn`, after choosing a free port for them to meet on. On a machine
# with GPUs each process drives one GPU through NCCL; without GPUs the processes share the CPU
# and talk through gloo, which is slower than one process on the same cores but exercises the
# same code (the tests run it this way).
#
# For several machines, PyTorch's launcher `torchrun` starts the processes instead, and sets
# `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` for each; `tools/train.py`
# notices and calls `train_worker` directly. The commands:
#
# ```bash
# python tools/train.py --config cpu                       # one CPU process (one to two hours)
# python tools/train.py --config cpu --threads 1           # the same on a machine shared with others
# python tools/train.py --config base --devices 4          # four GPUs of this machine
# python tools/train.py --config base --batch-tokens 25000  # one GPU, the paper's batch (accum 6)
# torchrun --nproc_per_node=8 tools/train.py --config base  # eight GPUs, started by torchrun
# # two machines with 8 GPUs each; run on both, with node_rank 0 and 1:
# torchrun --nnodes=2 --node_rank=0 --nproc_per_node=8 --max-restarts=3 \
#     --master_addr=10.0.0.1 --master_port=29500 tools/train.py --config base
# ```
#
# An interrupted run continues with the same command plus `--resume`; a fresh run into a
# folder that holds a checkpoint needs `--overwrite`. Only rank 0's checkpoint folder counts:
# the other machines may have none, or an old one, and receive rank 0's state. Under `torchrun`
# with `--max-restarts`, a process that dies (a lost GPU, a killed job) makes the launcher
# restart all of them, and the restarted processes continue from the last checkpoint by
# themselves. The checkpoint records every rank's random state; a run resumed with a
# different number of processes (and an `accum_iter` that keeps the global batch) resumes
# its weights, optimizer and schedule, but draws fresh random states, and says so.
#
# The test suite runs these paths on one CPU: two `torchrun` agents as two simulated machines
# (c10d rendezvous on 127.0.0.1, gloo, one process each, each with its own checkpoint
# folder), which must end with the weights of one process trained on the same global batches;
# a resume where only the first machine has the checkpoint; a worker killed with SIGKILL in the
# middle of an epoch and restarted by `torchrun`; and a machine with other data, which must
# stop the run with the batch-count error within seconds.

# %% tags=["export"]
import os
import socket
from collections.abc import Sequence

import torch


def free_port() -> int:
    """A TCP port that nothing listens on now, for the processes' rendezvous on this machine."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned_worker(rank: int, world_size: int, config: TrainConfig, options: dict) -> None:
    """train_worker with positional arguments, as torch.multiprocessing.spawn passes them."""
    train_worker(rank, world_size, config, **options)


def train_distributed(
    config: TrainConfig,
    world_size: int,
    *,
    resume: bool = False,
    overwrite: bool = False,
    progress: bool = True,
    threads: int | None = None,
    pairs: dict[str, Sequence[tuple[str, str]]] | None = None,
) -> None:
    """Train with world_size processes on this machine: one per GPU, or CPU processes (gloo)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if torch.cuda.is_available() and world_size > torch.cuda.device_count():
        raise ValueError(
            f"world_size={world_size} is more than the {torch.cuda.device_count()} GPUs here"
        )
    options = {"resume": resume, "overwrite": overwrite, "progress": progress,
               "threads": threads, "pairs": pairs}
    if world_size == 1:
        train_worker(0, 1, config, **options)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    torch.multiprocessing.spawn(_spawned_worker, args=(world_size, config, options),
                                nprocs=world_size)

# %% [markdown]
# ## Translating and scoring
#
# To translate, the model decodes greedily (chapter 5's `greedy_decode`, which works on whole
# batches and pads a finished sentence with `</s>`). A translation must never contain `<s>`,
# padding or, unless the reader asks for it, `<unk>`, and nothing in chapter 5's loop prevents
# it: a model that gives those ids a high probability would emit them. So `greedy_decode` grows
# one keyword here, `banned`, whose ids get the log-probability $-\infty$ before the argmax. Sentences are sorted by length before they
# are cut into batches, so that a batch carries little padding, and the results are put back
# in input order. Each output is cut at its first `</s>` and turned back into text.
#
# Turning tokens back into text is the inverse of spaCy's tokenizer, and it matters for the
# score: BLEU compares the output with the reference *as text*, so "a dog ." against "a dog."
# would count a wrong token. Our detokenizer joins the tokens with spaces and then glues what
# spaCy split off: punctuation to the word before it, `n't` and `'s` to their word, an opening
# bracket to the word after it, the parts of a hyphenated word ("T - shirt"), and straight
# quotes alternately to the next and the previous word. It is a handful of rules, not a full
# inverse, and it is tested on examples.
#
# The score is corpus BLEU from sacreBLEU {cite}`post2018call`, which tokenizes hypotheses and
# references itself with a fixed tokenizer and reports a *signature*: the settings that
# produced the number. A BLEU score is only comparable with another computed with the same
# signature, so we always print it with the score.
#
# The table of examples walks the validation set in order from a given position, so that two
# calls show different sentences and a reader can look them up.

# %% tags=["export", "extends"]
import math
from collections.abc import Sequence

import torch


def greedy_decode(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    max_len: int,
    start_symbol: int,
    end_symbol: int | None = None,
    *,
    banned: Sequence[int] = (),
) -> torch.Tensor:
    """Chapter 5's greedy decoding, grown by `banned`: ids that are never chosen.

    A translation must not contain <s>, padding or (unless asked for) <unk>; their
    log-probabilities are set to -inf before the argmax.
    """
    if src.dim() != 2:
        raise ValueError(f"src must have shape (batch, n_src), got {tuple(src.shape)}")
    if max_len < 1:
        raise ValueError(f"max_len must be at least 1 (the start symbol), got {max_len}")
    batch = src.size(0)
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (batch, n_src, d_model), computed once
        ys = torch.full((batch, 1), start_symbol, dtype=torch.long, device=src.device)
        done = torch.zeros(batch, dtype=torch.bool, device=src.device)
        for _ in range(max_len - 1):
            tgt_mask = subsequent_mask(ys.size(1)).to(src.device)  # (1, n, n)
            out = model.decode(memory, src_mask, ys, tgt_mask)  # (batch, n, d_model)
            log_probs = model.generator(out[:, -1])  # (batch, vocab)
            log_probs[:, list(banned)] = -math.inf  # never chosen
            next_word = log_probs.argmax(dim=-1)  # (batch,)
            if end_symbol is not None:
                next_word = next_word.masked_fill(done, end_symbol)
                done = done | (next_word == end_symbol)
            ys = torch.cat([ys, next_word.unsqueeze(1)], dim=1)  # (batch, n + 1)
            if end_symbol is not None and bool(done.all()):
                break
    return ys



# %% tags=["export"]
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

NO_SPACE_BEFORE = {".", ",", "!", "?", ";", ":", "%", ")", "]", "}", "...", "'", "n't", "'s",
                   "'re", "'ve", "'ll", "'d", "'m"}
NO_SPACE_AFTER = {"(", "[", "{", "$"}


def detokenize(tokens: Sequence[str]) -> str:
    """English text from spaCy tokens: words joined by spaces, but none before punctuation."""
    text, glue_next, quote_open = "", False, False
    for token in tokens:
        glue = not text or glue_next or token.lower() in NO_SPACE_BEFORE  # "dog ." -> "dog."
        glue_next = token in NO_SPACE_AFTER  # "( left" -> "(left"
        if token == "-" and text[-1:].isalnum():  # spaCy splits "T-shirt" into T, -, shirt
            glue = glue_next = True
        elif token == '"':  # straight quotes alternate: an opening one sticks to the next word
            glue = glue or quote_open
            glue_next = not quote_open
            quote_open = not quote_open
        text += token if glue else " " + token
    return text


def source_batch(
    src_ids: Sequence[Sequence[int]], *, device: torch.device, bos_id: int = BOS_ID,
    eos_id: int = EOS_ID, pad_id: int = PAD_ID,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sources wrapped in <s> ... </s>, padded into one tensor on device, and their mask."""
    longest = max(len(ids) for ids in src_ids) + 2
    src = torch.full((len(src_ids), longest), pad_id, dtype=torch.long)  # (batch, n_src)
    for row, ids in enumerate(src_ids):
        src[row, : len(ids) + 2] = torch.tensor([bos_id, *ids, eos_id])
    src = src.to(device)
    return src, (src != pad_id).unsqueeze(-2)  # (batch, n_src), (batch, 1, n_src)


def never_generated(bos_id: int = BOS_ID, pad_id: int = PAD_ID, unk_id: int = UNK_ID, *,
                    allow_unk: bool = False) -> list[int]:
    """The ids a translation must not contain: <s> and padding, and <unk> unless allowed."""
    return [bos_id, pad_id] + ([] if allow_unk else [unk_id])


def translate_batch(
    model: nn.Module,
    src_ids: Sequence[Sequence[int]],
    *,
    max_len: int = 72,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
    unk_id: int = UNK_ID,
    allow_unk: bool = False,
) -> list[list[int]]:
    """Greedy translations of a batch of id lists, without `<s>` and cut at `</s>`.

    <s> and padding are never generated, and <unk> only with allow_unk=True.
    """
    device = next(model.parameters()).device
    src, src_mask = source_batch(src_ids, device=device, bos_id=bos_id, eos_id=eos_id,
                                 pad_id=pad_id)
    model.eval()
    out = greedy_decode(model, src, src_mask, max_len, bos_id, end_symbol=eos_id,
                        banned=never_generated(bos_id, pad_id, unk_id, allow_unk=allow_unk))
    results = []
    for row in out[:, 1:].tolist():  # drop <s>
        results.append(row[: row.index(eos_id)] if eos_id in row else row)
    return results


def encode_text(text: str, vocab: Vocab, tokenizer: Any) -> list[int]:
    """A sentence's ids: spaCy's tokens looked up in a word Vocab, or a sentencepiece model's
    pieces of the raw text (tokenizer unused)."""
    if isinstance(vocab, Vocab):
        return vocab.encode(tokenize(text, tokenizer))
    return vocab.encode(text)


def decode_text(ids: Sequence[int], vocab: Vocab) -> str:
    """Plain text from output ids: detokenized words, or the sentencepiece model's decoding."""
    if isinstance(vocab, Vocab):
        return detokenize(vocab.lookup_tokens(ids))
    return vocab.decode(list(ids))


def translate(
    model: nn.Module,
    sentences: Sequence[str],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizer: Any,
    *,
    batch_size: int = 64,
    max_len: int = 72,
    decode_batch: Callable[[list[list[int]]], list[list[int]]] | None = None,
    allow_unk: bool = False,
) -> list[str]:
    """One English line per German sentence, in input order (an empty line stays empty).

    decode_batch turns a batch of source id lists into output id lists: greedy translate_batch
    (with allow_unk) by default; chapter 15 passes beam search.
    """
    if isinstance(sentences, str):
        raise TypeError("sentences must be a list of strings, got one str: wrap it in a list")
    src_ids = [encode_text(s, vocab_src, tokenizer)[: max_len - 2] for s in sentences]
    outputs = [""] * len(sentences)
    order = sorted((i for i, ids in enumerate(src_ids) if ids), key=lambda i: len(src_ids[i]))
    for start in range(0, len(order), batch_size):  # similar lengths together: less padding
        chunk = order[start : start + batch_size]
        batch = [src_ids[i] for i in chunk]
        if decode_batch is None:
            results = translate_batch(model, batch, max_len=max_len, allow_unk=allow_unk)
        else:
            results = decode_batch(batch)
        for i, ids in zip(chunk, results, strict=True):
            outputs[i] = decode_text(ids, vocab_tgt)
    return outputs


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> tuple[float, str]:
    """Corpus BLEU of hypotheses against one reference each, and sacreBLEU's signature."""
    from sacrebleu.metrics import BLEU

    if isinstance(hypotheses, str) or isinstance(references, str):
        raise TypeError("hypotheses and references must be lists of strings, not one str")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"hypotheses has {len(hypotheses)} lines but references has {len(references)}; "
            "they must pair up line by line"
        )
    metric = BLEU()
    score = metric.corpus_score(list(hypotheses), [list(references)])
    return score.score, str(metric.get_signature())


def translation_table(
    model: nn.Module,
    pairs: Sequence[tuple[str, str]],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizer: Any,
    *,
    start: int = 0,
    n: int = 5,
) -> list[dict[str, str]]:
    """Source, reference and model output for pairs[start : start + n], in order."""
    chosen = list(pairs[start : start + n])
    outputs = translate(model, [de for de, _ in chosen], vocab_src, vocab_tgt, tokenizer)
    return [
        {"#": start + i, "German": de, "reference": en, "model": out}
        for i, ((de, en), out) in enumerate(zip(chosen, outputs, strict=True))
    ]

# %%
tokens = ["A", "man", "in", "a", "T", "-", "shirt", "does", "n't", "smile", "(", "really", ")",
          ",", "he", "'s", "saying", '"', "cheese", '"', "."]
print(detokenize(tokens))
assert detokenize(tokens) == 'A man in a T-shirt doesn\'t smile (really), he\'s saying "cheese".'

# %% [markdown]
# ## The whole system, in miniature
#
# Here is the whole system on a tiny configuration that the notebook can afford: one layer,
# $d_{\text{model}}=64$, the first 2,000 training pairs and the first 200 validation pairs, one
# thread, and a fresh temporary checkpoint folder. We train for two epochs and then stop, as if
# the machine had gone away.

# %%
# NBVAL_IGNORE_OUTPUT
# (the demo's losses, perplexities and BLEU differ with another CPU's float kernels)
import shutil

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
# The training loss is the label-smoothed loss of chapter 11 per target token, so it cannot
# reach zero; `val_nll` and `val_ppl` are the validation set's plain negative log-likelihood
# per token and perplexity, and `val_bleu` its greedy BLEU. Each epoch's line also gives the
# training time so far and an estimate of the time left: the mean wall-clock time of the
# epochs this process has run (validation and checkpoint included), times the epochs to go. The checkpoint folder holds the two
# vocabularies, `last.pt`, and `best.pt`, the weights of the epoch with the best validation
# BLEU so far. Starting a fresh run into this folder by mistake is refused, instead of
# overwriting the checkpoint:

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
# stopped.)

# %%
# NBVAL_IGNORE_OUTPUT
# (the resumed epochs' losses differ with another CPU's float kernels; the asserts check)
history = train_worker(0, 1, replace(demo, epochs=4), resume=True, progress=False, threads=1)
state = load_checkpoint(demo_dir / "last.pt")
print(f"epoch {state['epoch']}, train state {state['train_state']}")
print("stored keys:", sorted(state))
assert all(r["val_ppl"] > 1 and 0 <= r["val_bleu"] <= 100 for r in history)
assert history[-1]["val_loss"] < history[0]["val_loss"]
assert state["epoch"] == 4 and [r["epoch"] for r in history] == [1, 2, 3, 4]

# %%
losses = [
    {"epoch": r["epoch"], "loss": round(r[key], 4), "split": split}
    for r in history for key, split in [("train_loss", "train"), ("val_loss", "validation")]
]
line_chart(losses, x="epoch:O", y="loss:Q", color="split:N", y_scale={"zero": False},
           y_title="label-smoothed loss per token", width=360, height=200,
           title="The tiny demo model, stopped after epoch 2 and resumed")

# %% [markdown]
# ## Shipping and loading a trained model
#
# The book ships this chapter's trained model, so that later chapters (and readers without an
# hour or more to spare) can load it; chapter 18 ships a second, better one, trained on subwords, and
# `load_trained_model(name=...)` picks between them. `export_for_shipping` takes a training checkpoint and keeps only what
# translation needs: the weights in half precision (half the bytes; a translation does not
# notice), the two vocabularies, and an `info.json` with the configuration, the variant, the command that
# trained it, its training time and the hardware. `load_trained_model` converts the weights
# back to float32 and builds the model from the stored configuration. Called without a path it
# loads the shipped model from `book/models/multi30k_cpu/`. Outside a copy of the repository
# (in Colab, where `pip` installs only the module) that folder does not exist, so
# `fetch_shipped_model` downloads the five files from the book's repository into a cache folder
# and keeps each one only if its SHA-256 checksum is the one recorded in the module; files
# already there are checked against the same checksums, once per process. With neither a copy
# nor a network, `load_trained_model` says how to get the model; it trains one (67 minutes of
# training on this book's CPU, as the model's note below records) only when asked to, with `train_if_missing=True`.
#
# ```{admonition} Which model this is
# Both shipped models are **pre-norm** (`make_model`'s default `norm_first=True`; their
# `info.json` says `"variant": "pre-norm"`): the layer norm stands before each sublayer and once
# more at the top of each stack, where the paper puts it after each residual addition
# (post-norm, `norm_first=False`; chapter 2 shows both). Pre-norm trains reliably with the short
# warm-up that a run of an hour on a CPU allows; chapter 19 trains the paper's post-norm model
# beside it.
# ```

# %% tags=["export"]
import functools
import json
import os
import shutil
import sys
from pathlib import Path

import torch

BOOK_REPOSITORY = "https://github.com/annotated-transformer/annotated-transformer-book"
# The tag (or commit) of the repository that this copy of the book comes from: the shipped
# model is downloaded from it, and Colab set-up cells install the package from it.
BOOK_REPOSITORY_REF = "v0.2.0"
# Each shipped model's files and their SHA-256 checksums, verified after a download;
# tests/test_shipped_model.py fails when they differ from the files in book/models/<name>.
# multi30k_cpu is this chapter's word-level model (averaging.json holds chapter 16's
# measurements); multi30k_cpu_subword is chapter 18's subword model (results.json holds its
# measurements), the best of the book.
SHIPPED_MODELS = {
    "multi30k_cpu": {
        "model.pt": "7f5e9f5e59a49d401656ed2332705f93d86d118921e8494f36532f743e696548",
        "vocab_de.json": "6f0d3385a8223f9e43922604b4d9b421394968cfc64257893065b3dd88e15066",
        "vocab_en.json": "6e22d0081b9e032fbce602f62bc5a56aa78326cce2e50fe722217285380daebf",
        "info.json": "10f454fd56b9e37da971bc9886d3e86244eec6b03af5126cf7506ccab548abc7",
        "averaging.json": "3f30d9507d5da87fbfa50dbc63290913bb912a88c31e22ca1eb748ea8af6e27f",
    },
    "multi30k_cpu_subword": {
        "model.pt": "6cdd65383b3780f96df11f28d26eb827bed467bdc412ec2a77de72a324e1f32c",
        "subwords.model": "d3f7fe14d9a0a191b496c0a68c212d32217ee3fd1b5c17dba74eb1cee93def72",
        "info.json": "a0cc04b8e4dd180298fbdd87820d93e13f28ae0d7ada04d4096b1d863eb1e854",
        "results.json": "ba9d83b4e98361e717b0a45eacd7b0898267ef18060b83e4e69b4406bc146816",
    },
}
SHIPPED_PRESETS = {"multi30k_cpu": "cpu", "multi30k_cpu_subword": "cpu_subword"}  # for training
# The shipped model with the best validation BLEU: `make translate` uses it (chapter 18).
BEST_SHIPPED_MODEL = "multi30k_cpu_subword"


def shipped_model_dir(name: str = "multi30k_cpu") -> Path:
    """book/models/<name> in a copy of the repository; else a cache folder (Colab)."""
    if name not in SHIPPED_MODELS:
        raise ValueError(f"name must be one of {', '.join(SHIPPED_MODELS)}, got {name!r}")
    root = repository_root()
    if root is not None and (root / "book" / "models").is_dir():
        return root / "book" / "models" / name
    return Path.home() / ".cache" / "annotated-transformer" / name


@functools.cache
def verified_file(path: Path, sha256: str, size: int, mtime_ns: int) -> None:
    """Check a present file's SHA-256 once per process (and again if its size or time change)."""
    actual = sha256_of(path)
    if actual != sha256:
        raise ValueError(
            f"{path} is not the shipped file (SHA-256 {actual}, expected {sha256}): delete it "
            "to download it again, restore it with `git checkout`, or, after retraining, put "
            "its new checksum in SHIPPED_MODELS"
        )


def fetch_shipped_model(folder: str | os.PathLike | None = None, *, name: str = "multi30k_cpu",
                        base_url: str | None = None) -> Path:
    """The folder holding the shipped model `name`, every file present and verified.

    Files already there are checked against SHIPPED_MODELS[name] (once per process); each
    missing one comes from the book's repository at BOOK_REPOSITORY_REF (base_url replaces
    the address) through download_file, which keeps it only when its checksum is right.
    """
    folder = shipped_model_dir(name) if folder is None else Path(folder)
    base_url = base_url or f"{BOOK_REPOSITORY}/raw/{BOOK_REPOSITORY_REF}/book/models/{name}"
    for file_name, sha256 in SHIPPED_MODELS[name].items():
        path = folder / file_name
        if path.is_file():
            stat = path.stat()
            verified_file(path.resolve(), sha256, stat.st_size, stat.st_mtime_ns)
            continue
        url = f"{base_url}/{file_name}"
        print(f"downloading {url}", file=sys.stderr)
        try:
            download_file(url, path, sha256=sha256)
        except OSError as err:  # no network, an HTTP error, a timeout, a read-only folder
            raise FileNotFoundError(
                f"the trained model's {file_name} is not in {folder} and could not be "
                f"downloaded from {url} ({err}): connect to the internet and try again, or "
                "train a model with `make train` (an hour or more on a CPU) and pass its "
                "checkpoint, or call load_trained_model(train_if_missing=True)"
            ) from err
    return folder


def export_for_shipping(
    checkpoint: str | os.PathLike, folder: str | os.PathLike, *, command: str | None = None,
    run: str | os.PathLike | None = None,
) -> Path:
    """Write a training checkpoint's weights in half precision, its vocabularies and notes.

    run: the run's last.pt, for the notes (training time, hardware, history) when checkpoint
    holds averaged weights, which have none of their own (chapter 16).
    """
    checkpoint, folder = Path(checkpoint), Path(folder)
    state = load_checkpoint(checkpoint)
    notes = state if run is None else load_checkpoint(run)
    stored: list[tuple[torch.Tensor, torch.Tensor]] = []  # (weights, their stored copy)
    weights = {}
    for name, tensor in state["model"].items():
        same = [copy for seen, copy in stored
                if seen.shape == tensor.shape and torch.equal(seen, tensor)]
        if not same:  # tied weights (equal, also after averaging) are stored once
            same = [tensor.half() if tensor.is_floating_point() else tensor]
            stored.append((tensor, same[0]))
        weights[name] = same[0]  # half the size of float32; load_trained_model converts back
    folder.mkdir(parents=True, exist_ok=True)
    save_checkpoint({"model": weights, "config": state["config"]}, folder / "model.pt")
    subwords = state["config"].get("subwords", 0) > 0
    for name in [SUBWORD_FILE] if subwords else VOCAB_FILES:
        shutil.copyfile(checkpoint.parent / name, folder / name)
    info = {
        "config": state["config"],
        "command": command or notes.get("command"),
        "training_seconds": round(notes.get("elapsed_s", 0.0), 1),
        "hardware": notes.get("hardware"),
        # pre-norm stacks end with a layer norm (chapter 2); post-norm ones have none
        "variant": "pre-norm" if "encoder.norm.weight" in weights else "post-norm",
        "epochs": notes.get("epoch"),
        "history": notes.get("history", []),
        "torch": torch.__version__,
    }
    if "averaged_from" in state:
        info["averaged_from"] = [Path(path).name for path in state["averaged_from"]]
    (folder / "info.json").write_text(json.dumps(info, indent=1) + "\n", "utf-8")
    return folder / "model.pt"


def load_trained_model(
    path: str | os.PathLike | None = None, *, name: str = "multi30k_cpu",
    device: str | torch.device = "cpu", train_if_missing: bool = False,
) -> tuple[EncoderDecoder, Vocab, Vocab, TrainConfig]:
    """A trained model in float32 (eval mode) with its vocabularies and configuration.

    path: a folder from export_for_shipping, or a model.pt / last.pt file with the
    vocabularies beside it; by default the book's shipped model `name` (this chapter's, or
    chapter 18's "multi30k_cpu_subword"), downloaded when it is missing (outside a copy of
    the repository). Only with train_if_missing=True does a missing model that cannot be
    downloaded get trained, with its preset (an hour or more on a CPU).
    """
    if path is None:
        path = shipped_model_dir(name)
        try:
            fetch_shipped_model(path, name=name)
        except FileNotFoundError as err:
            if not train_if_missing:
                raise
            config = training_config(SHIPPED_PRESETS[name])
            print(f"{err}\ntraining a model with the {SHIPPED_PRESETS[name]} configuration "
                  f"instead (an hour or more on a CPU; checkpoints in {config.checkpoint_dir})",
                  file=sys.stderr)
            resume = (Path(config.checkpoint_dir) / "last.pt").is_file()  # an earlier try
            train_worker(0, 1, config, resume=resume)
            export_for_shipping(Path(config.checkpoint_dir) / "last.pt", path)
    path = Path(path)
    file = path / "model.pt" if path.is_dir() else path
    state = load_checkpoint(file)
    fields = TrainConfig.__dataclass_fields__
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in fields})
    vocab_src, vocab_tgt = read_vocabularies(file.parent, subwords=config.subwords > 0)
    model = make_model(
        len(vocab_src), len(vocab_tgt), N=config.N, d_model=config.d_model, d_ff=config.d_ff,
        h=config.h, dropout=0.0, share_embeddings=config.share_embeddings,
    )
    model.load_state_dict({key: tensor.float() if tensor.is_floating_point() else tensor
                           for key, tensor in state["model"].items()})
    return model.to(device).eval(), vocab_src, vocab_tgt, config

# %% [markdown]
# Now the demo model can translate. Five sentences from the start of the validation set:

# %%
# NBVAL_IGNORE_OUTPUT
# (what the tiny demo model writes changes with its training, which differs between CPUs)
model, vocab_src, vocab_tgt, _ = load_trained_model(demo_dir / "last.pt")
val_pairs = load_multi30k("val")
pd.set_option("display.max_colwidth", 80)
pd.DataFrame(translation_table(model, val_pairs, vocab_src, vocab_tgt, tokenizers[0], start=0, n=5))

# %% [markdown]
# After a few hundred steps on 2,000 sentences the tiny model has learned the shape of a
# Multi30k caption ("A man in a ... is ..."), some frequent words, and little else. The
# translations are poor, as they should be. Its BLEU on the first 200 validation sentences:

# %%
# NBVAL_IGNORE_OUTPUT
# (the demo model's score changes with its training, which differs between CPUs)
sources = [de for de, _ in val_pairs[:200]]
references = [en for _, en in val_pairs[:200]]
hypotheses = translate(model, sources, vocab_src, vocab_tgt, tokenizers[0])
score, signature = bleu(hypotheses, references)
print(f"BLEU {score:.2f} on val[:200] ({signature})")
assert 0.5 < score < 30, score  # a model trained for four tiny epochs: some BLEU, not much

# %% [markdown]
# Shipping the demo model the same way: the weights file shrinks, and rounding the weights to
# float16 and back changes few if any of its translations.

# %%
# NBVAL_IGNORE_OUTPUT
# (how many translations float16 changes depends on the demo model's training)
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
# ## The shipped model: training and BLEU
#
# The model that ships with the book, in `book/models/multi30k_cpu/`, came from one command on
# the book's 2-core CPU, followed by one call that keeps the weights in half precision with the
# vocabularies and a note of how they were made:
#
# ```bash
# python tools/train.py --config cpu --threads 1
# python -c "from the_annotated_transformer import export_for_shipping; \
#     export_for_shipping('checkpoints/multi30k_cpu/last.pt', 'book/models/multi30k_cpu', \
#     command='python tools/train.py --config cpu --threads 1')"
# ```
#
# (`make train` runs the first line; after an interruption, `make train RESUME=1` continues from
# the last epoch's checkpoint.) The note records the rest:

# %%
import json

folder = fetch_shipped_model()  # here, the repository's copy; in Colab, a download
info = json.loads((folder / "info.json").read_text())
print("command: ", info["command"])
print("hardware:", info["hardware"])
print(f"training: {info['epochs']} epochs in {info['training_seconds'] / 60:.0f} minutes")
print(f"weights:  {(folder / 'model.pt').stat().st_size / 1e6:.1f} MB (float16)")
history = [
    {"epoch": row["epoch"], "split": split, "loss": row[f"{split}_loss"]}
    for row in info["history"]
    for split in ("train", "val")
]
line_chart(history, x="epoch:Q", y="loss:Q", color="split:N", formats={"loss": ".3f"},
           y_title="loss per target token (with label smoothing)", width=420, height=220,
           title="The shipped model's training")

# %% [markdown]
# Now the measurement that matters: greedy decoding of every sentence of the validation set
# and of the 2016 Flickr test set, detokenized, scored with sacreBLEU against the single
# reference (cased). The signature says exactly how.

# %%
model, vocab_src, vocab_tgt, config = load_trained_model()
scores = {}
for split in ("val", "test_2016_flickr"):
    pairs = load_multi30k(split)
    hypotheses = translate(model, [de for de, _ in pairs], vocab_src, vocab_tgt, tokenizers[0])
    scores[split], signature = bleu(hypotheses, [en for _, en in pairs])
    print(f"{split:>16}: BLEU {scores[split]:.2f} on {len(pairs):,} sentences")
print("sacreBLEU signature:", signature)

# %% [markdown]
# Twelve epochs, 67 minutes on one core of this book's CPU, give **37.8 BLEU on the validation set and 37.6 on the 2016 Flickr test set**, with greedy decoding that never writes `<unk>` (chapter 18 explains the ban; allowing `<unk>`, the same model scores 36.1 and 36.7). (These numbers are not comparable with the paper's 27.3 on WMT 2014: Multi30k's sentences are short, literal descriptions of photographs, a much easier task than news text.) The validation loss had flattened by epoch 8 while the training loss kept falling, so more epochs of this model would buy little; a larger model, beam search (chapter 15), checkpoint averaging (chapter 16) or a subword vocabulary (chapter 17) are the usual next steps.
#
# What those numbers look like: the first ten sentences of the validation set, in order, with the reference and the model's translation.

# %%
table = translation_table(model, val_pairs, vocab_src, vocab_tgt, tokenizers[0], n=10)
pd.DataFrame(table)

# %% [markdown]
# Most translations are fluent and close to the reference, often with a different but correct word order ("sleeping on a couch in a green room"). The errors are instructive. A German word that is not in the vocabulary reaches the model as `<unk>`, and since the decoder never writes `<unk>`, the model fills the gap with something plausible but wrong: *Baumwolle* (cotton) occurs once in the training set, below `min_freq=2`, and the men are loading "railroad tracks"; *Eisfischerhütte* (ice fishing hut) never occurs in training and becomes "a blue metal structure". Both are limits of a word-level vocabulary built from 29,000 captions, which is what subword vocabularies {cite}`sennrich2016neural` were invented to fix. Not every error is the vocabulary's: *Mountainbike* is in the German vocabulary, and the model still drops the bike.
#
# Translation from the command line is a pipe, German in, one sentence per line, English out, one line per line, using this shipped model:
#
# ```bash
# echo "Ein Hund rennt durch den Schnee." | make -s translate
# ```

# %% [markdown]
# ```{note}
# The classic Annotated Transformer saved only the model's weights after each epoch, with a
# plain `torch.save`, so an interrupted run could not continue where it stopped; and its
# `check_outputs` showed examples from a freshly shuffled validation batch each time. Here a
# checkpoint holds everything needed to resume exactly and is replaced atomically, and example
# translations walk the validation set in order.
# ```
#
# You now have a training system: a configuration per run, data shared out among processes,
# a worker that runs alone, under `spawn` or under `torchrun`, on CPUs or GPUs, checkpoints that
# make an interruption cost at most an epoch, and translation with a reproducible BLEU score.
# The rest of Part III takes up the tools the paper used to get more out of a trained model:
# beam search with a length penalty (chapter 15), averaging the last checkpoints (chapter 16),
# and subword vocabularies (chapter 17).
