# %% [markdown]
# # Training on many devices
#
# Chapter 14 trained the shipped model with one command,
# `annotated-transformer train --config cpu --threads 1`. The same command trains on several GPUs
# of one machine, or on several machines, with PyTorch's `DistributedDataParallel` (DDP): every device trains its own copy of the model on
# its share of the batches, and every copy takes the same averaged gradient step. This chapter grows Part II's data loader and training loop for that. Four rules carry it:
# every process gets an equal share of the batches, the loss is divided by the tokens of all
# processes, gradients are exchanged once per optimizer step, and the schedule counts optimizer
# steps.

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
    Batch,
    LossAndNLL,
    TrainConfig,
    TrainState,
    accumulation_groups,
    book_data,
    check_token_budget,
    collate_to_batch,
    config_for_devices,
    encode_examples,
    example_lengths,
    fetch_shipped_model,
    linear_rate,
    load_multi30k,
    load_tokenizers,
    multi30k_vocabularies,
    rate,
    read_vocabularies,
    split_batches_for_ranks,
    train_worker,
    training_config,
)

# %% [markdown]
# ## Each rank its share of the batches
#
# Each process (each *rank*) trains on its own share of the batches. The sampler builds the same
# list of batches on every rank (same seed, same epoch), and rank $r$ of $R$ takes batches
# $r, r + R, r + 2R, \dots$, as PyTorch's `DistributedSampler` does with single examples. The
# shares are disjoint and together cover the data once per epoch. They must also be of *equal
# length*: every rank takes part in every gradient exchange, and a rank with one batch more would
# wait forever for partners that have finished their epoch. `split_batches_for_ranks` (appendix
# {doc}`appendix_data`) splits the largest batches until their number is a multiple of $R$.
#
# So chapter 9's `TokenBudgetSampler` and chapter 14's `multi30k_loader` grow two keywords,
# `num_replicas` ($R$) and `rank` ($r$), whose defaults give one process all the batches.

# %% tags=["export", "extends"]
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler


class TokenBudgetSampler(Sampler[list[int]]):
    """Chapter 9's sampler, dealing every num_replicas-th batch to process `rank`."""

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, max_tokens: int,
                 pool_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__()
        self.src_lengths = [int(n) for n in src_lengths]
        self.tgt_lengths = [int(n) for n in tgt_lengths]
        check_token_budget(self.src_lengths, self.tgt_lengths, max_tokens=max_tokens,
                           pool_size=pool_size, num_replicas=num_replicas, rank=rank)
        self.max_tokens = max_tokens
        self.pool_size = pool_size or len(self.src_lengths)
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.num_replicas, self.rank = num_replicas, rank
        self._cache: tuple[int, list[list[int]]] | None = None  # (epoch, its batches)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch and with it the order; call it with the same epoch on every rank."""
        self.epoch = epoch

    def _length_key(self, i: int) -> tuple[int, int, int]:
        """Sort by the longer side first: it is the one the budget binds on."""
        src, tgt = self.src_lengths[i], self.tgt_lengths[i]
        return max(src, tgt), src, tgt

    def _fill(self, pool: list[int]) -> list[list[int]]:
        """Cut a length-sorted pool into batches, closing one when the next example won't fit."""
        batches, batch, max_src, max_tgt = [], [], 0, 0
        for i in pool:
            src, tgt = max(max_src, self.src_lengths[i]), max(max_tgt, self.tgt_lengths[i])
            if (len(batch) + 1) * max(src, tgt) > self.max_tokens:  # padded size over budget
                batches.append(batch)
                batch, src, tgt = [], self.src_lengths[i], self.tgt_lengths[i]
            batch.append(i)
            max_src, max_tgt = src, tgt
        batches.append(batch)
        return batches

    def batches(self) -> list[list[int]]:
        """All ranks' batches of this epoch, in order (rank r takes every num_replicas-th)."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        n = len(self.src_lengths)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).tolist() if self.shuffle else list(range(n))
        batches = []
        for start in range(0, n, self.pool_size):
            # 1) shuffled pool, 2) sorted by length (stable: ties stay shuffled), 3) cut
            pool = sorted(order[start : start + self.pool_size], key=self._length_key)
            batches += self._fill(pool)
        batches = split_batches_for_ranks(batches, self.num_replicas)  # the same count per rank
        if self.shuffle:  # 4) shuffle the batches themselves
            batches = [batches[j] for j in torch.randperm(len(batches), generator=generator)]
        self._cache = (self.epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        yield from self.batches()[self.rank :: self.num_replicas]

    def __len__(self) -> int:
        return len(self.batches()) // self.num_replicas


# %% tags=["export", "extends"]
from collections.abc import Sequence

from torch.utils.data import DataLoader


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


# %% [markdown]
# Two ranks on the first 400 training pairs: equal numbers of batches, no example in both
# shares, every example in one of them.

# %%
tokenizers = load_tokenizers()
first_pairs = load_multi30k("train")[:400]  # a small vocabulary, quick to build
first_src, first_tgt = multi30k_vocabularies(TrainConfig(), tokenizers, pairs=first_pairs,
                                             save=False)
examples = encode_examples(first_pairs, first_src, first_tgt, tokenizers, max_len=72)
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

# %% [markdown]
# ## One epoch on many devices
#
# Chapter 14's `train_epoch` and `evaluate` run chapter 8's `run_groups` in one process. Many
# processes need three hooks in that loop, and a progress bar a fourth. This chapter grows
# `run_groups` with them, as keyword arguments whose defaults give chapter 8's loop, and grows
# `train_epoch` and `evaluate` to pass them.
#
# **Gradient averaging.** DDP keeps a full copy of the model on each of the $R$ ranks
# {cite}`li2020pytorch`. Every rank computes gradients on its own batch; during `backward` DDP
# sums them across ranks with an *all-reduce* and divides by $R$, in buckets that overlap the
# communication with the rest of the backward pass. Every rank then holds the same gradient and
# takes the same optimizer step, so the copies stay identical without ever sending weights.
#
# **Which average.** One process on the whole global batch would follow its loss per token,
# $\sum_r S_r / \sum_r T_r$, where $S_r$ is rank $r$'s summed loss and $T_r$ its number of target
# tokens. If each rank divided by its own $T_r$, DDP's average would be
# $\frac{1}{R}\sum_r S_r / T_r$, a mean of per-rank means that weighs a rank of short sentences
# as much as a rank of long ones. So before the first backward pass of an optimizer step the
# ranks add up their token counts with one small all-reduce, and each divides its loss by $T / R$
# with $T = \sum_r T_r$: after DDP's division by $R$ the gradient is exactly that of
# $\sum_r S_r / T$. This is chapter 8's rule for accumulation, extended across devices:
# `run_groups`'s new `group_norm`.
#
# **One exchange per step.** With gradient accumulation, the micro-batches before the last of a
# group run inside `model.no_sync()` (the new `sync_context`): their gradients only accumulate
# locally, and the all-reduce happens once, in the backward pass of the group's last
# micro-batch, on the sum.
#
# **bfloat16 autocast.** On GPUs that compute in bfloat16 natively (compute capability 8.0 on),
# the forward pass runs under `torch.autocast(dtype=torch.bfloat16)` (the new `forward_context`):
# matrix multiplications take 16-bit inputs, while reductions such as softmax and the loss, the
# weights and the optimizer state stay float32 {cite}`micikevicius2018mixed`. bfloat16 keeps
# float32's exponent range, so no loss scaling is needed {cite}`kalamkar2019study`. On a
# CPU it runs only when asked (`cpu_bf16=True`) and the CPU computes bfloat16 natively (appendix
# {doc}`appendix_performance`).
#
# **Progress.** `after_group` moves rank 0's tqdm bar (`bar`) once per optimizer step.
#
# The test suite checks that two processes take the same steps as one process on the same
# global batches.

# %% tags=["export"]
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def unwrap(model: nn.Module) -> nn.Module:
    """The model itself, also when DistributedDataParallel wraps it."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def cpu_computes_bf16() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX), by torch's own probes."""
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)


def autocast_dtype_for(device: torch.device, cpu_bf16: bool = False) -> torch.dtype | None:
    """bfloat16 where the hardware computes it natively: GPUs of compute capability 8.0 on, and
    CPUs with bfloat16 instructions when the run asks for them (cpu_bf16); else None."""
    if device.type == "cpu":
        return torch.bfloat16 if cpu_bf16 and cpu_computes_bf16() else None
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else None


def global_norm(tokens: int, device: torch.device) -> float:
    """T / R for the tokens T of all R ranks: DDP's mean of gradients then divides by T."""
    total = torch.tensor([float(tokens)], dtype=torch.float64, device=device)
    dist.all_reduce(total)  # one number per optimizer step
    return max(float(total), 1.0) / dist.get_world_size()


# %% tags=["export", "extends"]
import time
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel


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
    """Chapter 8's accumulation core, grown by four hooks for many devices and autocast.

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
# `train_worker` is everything one process does, from its rank to its last checkpoint. It sets up
# its device and process group, gets rank 0's vocabularies, takes its share of the batches, builds
# the model from the same seed as every other rank, resumes from rank 0's checkpoint when asked,
# and trains, validates and saves, epoch by epoch, with the loop above; checks between these steps
# stop every rank at once, with one clear error, when a rank holds other data or other weights.
# Appendix {doc}`appendix_distributed` lists it, with its checkpoint folder's rules.
#
# Each rank here keeps the whole training text and its ids in Python lists, which suits
# Multi30k; at the paper's 4.5 million pairs {cite}`vaswani2017attention` every rank would hold
# all of it. With `--corpus-dir DIR` rank 0 alone encodes the text, into flat arrays in DIR;
# every rank maps those files (one copy in memory per machine) and cuts batches from the stored
# lengths, so a rank's own memory grows much more slowly than the text (appendix
# {doc}`appendix_data` prints it at up to the paper's size). DIR, like the checkpoint folder, must
# be on storage that every machine sees. Under torchrun every process still reads the text and
# trains the vocabulary; `--devices 8` does that once, on one machine, without torchrun's
# restarts. For WMT's English-German on one machine, sized as chapter 18 describes (pairs over 72
# pieces are left out, long test sources cut: `--set max_len=N`):
#
# ```bash
# annotated-transformer train --devices 8 --train train.en train.de \
#     --valid dev.en dev.de --corpus-dir ids --max-tokens 4096
# ```
#
# ## Steps are optimizer steps
#
# Chapter 10's schedule counts optimizer steps, and one step of a run with $R$ processes and
# `accum_iter` micro-batches per process takes $k = R \times$ `accum_iter` micro-batches. Over
# the same data such a run takes $k$ times fewer steps than one process without accumulation, so
# `schedule_steps` divides the preset's `warmup`, given for that one process, by $k$; with the
# shorter warm-up the learning rate peaks $\sqrt{k}$ times higher. It also refuses a run that is
# not at least a quarter longer than its warm-up: its learning rate would peak too late to decay.
#
# A preset with `batch_tokens` fixes the global batch instead. `config_for_devices` (appendix
# {doc}`appendix_performance`) picks the `accum_iter` that comes nearest it for the devices
# present; where that would overshoot the batch, each device takes an equal share of it, and
# `warmup` is scaled to count the same tokens. A preset whose budget per device is its whole batch, as `gpu`'s is, thus keeps its padded
# batch, warm-up and peak on any number of devices; its real tokens a step vary a little. The
# `base` preset with `batch_tokens` keeps the paper's peak rate: its `lr_factor` shrinks by the
# square root of `batch_tokens` / 4,096, its own budget, which undoes the shorter warm-up's rise.

# %% tags=["export"]
import math


def schedule_steps(config: TrainConfig, *, batches_per_epoch: int, world_size: int) -> dict:
    """The run's schedule in optimizer steps, refused when training would barely leave its warm-up.

    `config.warmup` counts the steps of one process without accumulation. A run whose steps
    each take k = world_size x accum_iter micro-batches walks the same data in k times fewer
    steps, so its warm-up is warmup / k steps (and its peak rate sqrt(k) times higher). A run
    must be at least 1.25 times its warm-up, so that a fifth of it, at least, comes after the peak.
    """
    k = world_size * config.accum_iter
    per_epoch = math.ceil(batches_per_epoch / config.accum_iter)
    plan = {"micro_batches_per_step": k, "steps_per_epoch": per_epoch,
            "total_steps": config.epochs * per_epoch, "warmup": max(1, round(config.warmup / k))}
    if 4 * plan["total_steps"] < 5 * plan["warmup"]:  # fewer than 1.25 x warm-up
        raise ValueError(
            f"the run would take {plan['total_steps']} optimizer steps ({per_epoch} per epoch x "
            f"{config.epochs}: {batches_per_epoch} micro-batches per process, accum_iter "
            f"{config.accum_iter}), fewer than 1.25 times its {plan['warmup']} warm-up steps "
            f"(warmup={config.warmup} / {k} micro-batches per step), so the learning rate "
            "would peak too late to decay: raise epochs or lower warmup"
        )
    return plan



# %% [markdown]
# The `base` preset's schedule on one GPU and on eight, and `cpu`'s, counted on Multi30k's own
# sentence lengths: each of the eight GPUs gets an eighth of the micro-batches, and the warm-up
# shrinks with the number of steps.

# %%
tokenizers = load_tokenizers()
# any vocabulary gives the same sentence lengths: a small one, quick to build
small_src, small_tgt = multi30k_vocabularies(TrainConfig(), tokenizers, save=False,
                                             pairs=load_multi30k("train")[:400])
examples = encode_examples(load_multi30k("train"), small_src, small_tgt, tokenizers, max_len=72)
for name, devices in (("base", 1), ("base", 8), ("cpu", 1)):
    preset = training_config(name)
    per_device = len(multi30k_loader(examples, max_tokens=preset.max_tokens, shuffle=True,
                                     num_replicas=devices))
    plan = schedule_steps(preset, batches_per_epoch=per_device, world_size=devices)
    print(f"{name}, {devices} device(s): {per_device} micro-batches per device and epoch, "
          f"{plan['total_steps']:,} optimizer steps in {preset.epochs} epochs, "
          f"warm-up {plan['warmup']}")


# %% [markdown]
# The `gpu` preset (appendix {doc}`appendix_performance`) on one to eight GPUs, on the shipped
# subword model's lengths, and `base` at 25,000 padded tokens a step on one GPU and on
# eight (the target tokens a step are the real ones):

# %%
sp, _ = read_vocabularies(fetch_shipped_model(name="multi30k_cpu_subword"), subwords=True)
subword_examples = encode_examples(load_multi30k("train"), sp, sp, (None, None), max_len=72)
target_tokens = sum(len(tgt) for _, tgt in subword_examples)
gpu = training_config("gpu")
for devices in range(1, 9):
    config = config_for_devices(gpu, devices)
    per_device = len(multi30k_loader(subword_examples, max_tokens=config.max_tokens,
                                     shuffle=True, num_replicas=devices))
    plan = schedule_steps(config, batches_per_epoch=per_device, world_size=devices)
    steps, warmup = plan["total_steps"], plan["warmup"]
    peak, end = (linear_rate(s, config.d_model, config.lr_factor, warmup, steps)
                 for s in (warmup, steps))
    tokens = devices * config.accum_iter * config.max_tokens
    print(f"{devices} GPU(s): {tokens:,} tokens a step ({config.max_tokens:,} per GPU; "
          f"{target_tokens / plan['steps_per_epoch']:,.0f} target), {steps:,} steps, warm-up "
          f"{warmup}, peak {peak:.2e} falling to {end:.0e}")
    assert gpu.batch_tokens - devices < tokens <= gpu.batch_tokens and warmup == gpu.warmup

word_target = sum(len(tgt) for _, tgt in examples)
paper = 512**-0.5 * 4000**-0.5  # the paper's peak: d_model^-0.5 * warmup^-0.5
for devices in (1, 8):
    config = config_for_devices(training_config("base", batch_tokens=25000), devices)
    per_device = len(multi30k_loader(examples, max_tokens=config.max_tokens, shuffle=True,
                                     num_replicas=devices))
    plan = schedule_steps(config, batches_per_epoch=per_device, world_size=devices)
    warmup = plan["warmup"]
    peak = rate(warmup, config.d_model, config.lr_factor, warmup)
    tokens = devices * config.accum_iter * config.max_tokens
    print(f"base, --batch-tokens 25000, {devices} GPU(s): {tokens:,} tokens a step "
          f"({word_target / plan['steps_per_epoch']:,.0f} target), warm-up {warmup}, "
          f"peak {peak:.2e} (the paper's {paper:.2e})")
    assert abs(peak / paper - 1) < 0.02

# %% [markdown]
# ## Many processes
#
# On one machine, `train_distributed` starts one process per device with
# `torch.multiprocessing.spawn`. With GPUs each
# process drives one GPU and the processes talk through NCCL; without GPUs they share the CPU and
# talk through gloo, which runs the same code on any machine (the tests run it so).
# On several machines PyTorch's launcher `torchrun` starts the processes and sets `RANK`,
# `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR` and `MASTER_PORT` for each; `annotated-transformer
# train` notices and calls `train_worker` directly. The commands:
#
# ```bash
# annotated-transformer train --config cpu               # one CPU process
# annotated-transformer train --config base --devices 4  # four GPUs: batch x4, peak x2
# # one GPU, 25,000 padded tokens (accum 6):
# annotated-transformer train --config base --batch-tokens 25000
# # eight GPUs: batch x8, peak x2.8 (-m: torchrun starts Python):
# torchrun --nproc_per_node=8 -m annotated_transformer_cli train --config base
# # two machines with 8 GPUs each; the same command on both, meeting on the first:
# torchrun --nnodes=2 --nproc_per_node=8 --max-restarts=3 --rdzv-backend=c10d \
#     --rdzv-endpoint=10.0.0.1:29500 --rdzv-id=multi30k -m annotated_transformer_cli train \
#     --config base
# ```
#
# Under `torchrun` with `--max-restarts`, a process that dies makes the launcher restart all of
# them, and they continue from the last checkpoint by themselves; appendix
# {doc}`appendix_distributed` says what a failure costs and what to do when a whole machine is
# lost. The test suite runs `train_worker` under `torchrun` on one CPU, with two agents as two
# simulated machines: they must end with the weights of one process trained on the same global
# batches, also when a worker is killed in the middle of an epoch; the command, restarted, must
# continue its run.

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
    save_every: int = 0,
) -> None:
    """Train with world_size processes on this machine: one per GPU, or CPU processes (gloo)."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if torch.cuda.is_available() and world_size > torch.cuda.device_count():
        raise ValueError(
            f"world_size={world_size} is more than the {torch.cuda.device_count()} GPUs here"
        )
    options = {"resume": resume, "overwrite": overwrite, "progress": progress,
               "threads": threads, "pairs": pairs, "save_every": save_every}
    if world_size == 1:
        train_worker(0, 1, config, **options)
        return
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    torch.multiprocessing.spawn(_spawned_worker, args=(world_size, config, options),
                                nprocs=world_size)

# %% [markdown]
# ## On a GPU: one measurement
#
# No model in this book was trained on a GPU. What was measured is the `base` preset's training
# step on one GPU: `make gpu-check` ran it on random token ids of Multi30k-like lengths, under
# bfloat16 autocast, and stored the result (`book/data/gpu_check_cuda.json`). It shows that the
# GPU path runs; it is one run, not a benchmark and not a training run.

# %%
check = book_data("gpu_check_cuda.json")
result = check["result"]
print(f"{check['command']} on {check['gpu']}, torch {check['torch']}, {check['date']}:")
print(f"  {result['tokens_per_s']:,.0f} target tokens/s with bfloat16 autocast, peak memory "
      f"{result['max_memory_gib']:.1f} GiB, GPU busy {result['utilization_percent']:.0f}% of "
      f"the time, MFU {result['mfu']:.1%}")


# %% [markdown]
# Look at the last two numbers: the GPU was busy for only part of the time, and its matrix units
# reached a small fraction of their bfloat16 peak. The `base` model is small for this GPU, most
# likely so small that a step is many short kernels that one Python process launches one after
# another, and the host, not the GPU, sets the pace. Larger batches per GPU (`--max-tokens`) give
# each kernel more work; the `gpu` preset takes its whole step of 32,768 tokens as one micro-batch
# for that reason, untested: no stored run uses that preset.

# %% [markdown]
# ## The whole system, in miniature
#
# A configuration that the notebook can afford runs every step of the worker: one layer,
# $d_{\text{model}}=64$, the first 2,000 training pairs and the first 200 validation pairs, one
# process with one thread, two epochs.

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
shutil.rmtree(demo_dir)

# %% [markdown]
# Each line is one epoch. Look for the validation loss falling from one epoch to the next; a run this small shows that the system works, not how well it translates. Appendix
# {doc}`appendix_distributed` trains the same tiny model, stops it, resumes it, translates with it
# and ships it.

# %% [markdown]
# ## What we have
#
# Many ranks train like one process on their global batch: each takes an equal share of the
# batches, divides its loss by the tokens of all ranks, exchanges gradients once per optimizer
# step, and counts its schedule in those steps. `train_worker` runs that loop alone, under
# `spawn` on one machine or under `torchrun` on many, on CPUs or GPUs. Part IV goes beyond the
# paper.
