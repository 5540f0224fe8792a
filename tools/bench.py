"""Measure what chapter 21's fast paths buy: training and decoding speed, in one process.

    python tools/bench.py          # `make bench`: the cpu preset and the paper's base size
    python tools/bench.py --quick  # `make bench-quick`: the same rows, tiny, in seconds
    python tools/bench.py --save   # and write book/data/bench_cpu.json (bench_cuda.json on a GPU)
    python tools/bench.py --decoding-only --out F  # the ceilings and decoding rows only

Every row runs `--repeats` times after a warm-up (the training rows of one group take turns); the
table gives the median and the range (min-max) and each row's ratio to the first row of its group,
since ratios measured in one run are what another machine reproduces, not the absolute numbers.
Training rows time a full step (forward, backward, optimizer step) on batches of random token ids
whose lengths follow Multi30k's (a gamma distribution fitted to its sentence lengths; no text is
read); their MFU is the counted matmul FLOPs (torch.utils.flop_counter, forward and backward) per
second over the float32 matmul peak measured at the start of the same run (the bfloat16 row's, over
the bfloat16 peak). The fast rows and torch.nn.Transformer's use the fused loss and Adam's fused
step; the readable row is chapter 8's step as it is. The compiled row is the fast step with the
model passed through torch.compile (inductor; C++ kernels on a CPU), which compiles in the warm-up
pass, for minutes, so --quick leaves it out. Decoding rows translate Multi30k's validation
sentences with the shipped model at the cpu size, when both are present (random ids otherwise); at
the base size, for which no trained model exists, an untrained model translates random ids of
Multi30k's lengths, with </s> made impossible so that every output has BASE_OUTPUT_LEN tokens,
about the length of a Multi30k translation.
Peak memory is the most tensor memory allocated at once during one step (training) or one batch
(decoding), from torch.profiler's memory events on a CPU, and torch.cuda.max_memory_allocated on
a GPU, above what was allocated before it. For the roofline of decoding, the run also measures
the rate of reading a 512 MB float32 tensor (far larger than the caches), counts each decoder's
matmul FLOPs (a first pass, which is also the warm-up) and records the bytes of the weights that
every decoding step reads whole (the decoder's layers and the generator).
"""

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from the_annotated_transformer import (  # noqa: E402
    Batch,
    LabelSmoothing,
    TokenBudgetSampler,
    beam_search,
    greedy_decode,
    label_smoothing_loss,
    make_model,
    same_tokens,
    source_batch,
    use_fast_path,
)

PAD, BOS, EOS = 2, 0, 1


@dataclass(frozen=True)
class Size:
    """A model size and the batches it trains on."""

    name: str
    N: int
    d_model: int
    d_ff: int
    h: int
    max_tokens: int  # the token budget of a batch (chapter 9's TokenBudgetSampler)
    steps: int  # timed training steps per repeat


# the base size trains on the cpu preset's budget, so that `make bench` stays near 10 minutes
FULL_SIZES = [Size("cpu", 3, 256, 1024, 8, 1500, 6), Size("base", 6, 512, 2048, 8, 1500, 2)]
QUICK_SIZES = [Size("tiny", 1, 32, 64, 2, 300, 2), Size("tiny-2", 2, 64, 128, 4, 300, 2)]
VOCAB = (8316, 6384)  # about the shipped model's German and English vocabularies
QUICK_VOCAB = (500, 400)
TRAINING_KINDS = ("readable", "fast", "torch.nn.Transformer", "fast, bf16 autocast",
                  "fast, torch.compile")
QUICK_KINDS = TRAINING_KINDS[:4]  # compiling takes minutes, even at the tiny sizes
BASE_OUTPUT_LEN = 15  # <s> and 14 tokens, about Multi30k's mean English length with </s>


# 1) the machine
def hardware(device: torch.device) -> dict:
    """CPU model, threads, torch version and the GPU, if any, for the JSON."""
    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "device": str(device), "python": platform.python_version()}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: torch.device, n: int, repeats: int,
                dtype: torch.dtype = torch.float32) -> float:
    """The best rate (FLOP/s) of an n x n product in dtype on this device, now, taken both as
    a @ b and as nn.Linear takes it (a @ b.T): on a CPU without native bfloat16 the two run
    different kernels, ten times apart, and the model's layers use the second."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for product in (torch.matmul, torch.nn.functional.linear):
        product(a, b)  # warm-up
        for _ in range(repeats):
            sync(device)
            start = time.perf_counter()
            product(a, b)
            sync(device)
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def memory_bandwidth(device: torch.device, megabytes: int, repeats: int) -> float:
    """The best rate (bytes/s) of reading a float32 tensor far larger than the caches, now:
    the rate at which a decoding step can stream weights that do not stay in a cache."""
    x = torch.ones(megabytes * 2**20 // 4, device=device)
    best = float("inf")
    x.sum()  # warm-up, and the pages are touched
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        x.sum()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return x.numel() * 4 / best


def decoder_weight_bytes(model: nn.Module) -> int:
    """The bytes of the weights that every decoding step reads whole: the decoder's layers and
    the generator (a tied matrix counted once); the embedding reads only one row per token."""
    params = {id(p): p for part in (model.decoder, model.generator) for p in part.parameters()}
    return sum(p.numel() * p.element_size() for p in params.values())


def peak_memory(run: Callable[[], object], device: torch.device) -> float:
    """The most tensor memory (MB) allocated at once while `run` runs, above the start."""
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 1e6
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        run()
    # allocations are an op's own (self) memory, frees are the "[memory]" events
    events = [e for e in prof.events() if e.self_cpu_memory_usage != 0]
    now = peak = 0
    for event in sorted(events, key=lambda e: e.time_range.start):
        now += event.self_cpu_memory_usage
        peak = max(peak, now)
    return peak / 1e6


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


# 2) the data: Multi30k-shaped random batches
def multi30k_lengths(n: int, generator: torch.Generator) -> tuple[list[int], list[int]]:
    """Source and target lengths (with <s> and </s>) shaped like Multi30k's, at most 72."""
    gamma = torch.distributions.Gamma(torch.tensor(11.0), torch.tensor(11.0 / 12.5))
    torch.manual_seed(int(torch.randint(0, 2**31, (1,), generator=generator)))
    tgt = gamma.sample((n,)).round().clamp(3, 70) + 2  # English: mean about 14.5 with <s> </s>
    src = (tgt + torch.randint(-2, 2, (n,), generator=generator)).clamp(5, 72)  # German
    return [int(x) for x in src], [int(x) for x in tgt]


def random_batch(src_len: list[int], tgt_len: list[int], vocab: tuple[int, int],
                 generator: torch.Generator, pad_to: int | None = None) -> Batch:
    """A Batch of random ids (>= 3: no <s>, </s> or padding inside) with the given lengths."""
    n_src, n_tgt = pad_to or max(src_len), pad_to or max(tgt_len)
    src = torch.full((len(src_len), n_src), PAD)
    tgt = torch.full((len(tgt_len), n_tgt), PAD)
    for row, (s, t) in enumerate(zip(src_len, tgt_len, strict=True)):
        src[row, :s] = torch.randint(3, vocab[0], (s,), generator=generator)
        tgt[row, :t] = torch.randint(3, vocab[1], (t,), generator=generator)
    return Batch(src, tgt, pad=PAD)


def budget_batches(size: Size, vocab: tuple[int, int], count: int, device: torch.device, *,
                   pad_to: int | None = None, seed: int = 0) -> list[Batch]:
    """`count` batches on `device`: token-budget batches (pad_to=None) or fixed-size ones
    padded to pad_to."""
    g = torch.Generator().manual_seed(seed)
    src_len, tgt_len = multi30k_lengths(4000, g)
    if pad_to is None:
        sampler = TokenBudgetSampler(src_len, tgt_len, max_tokens=size.max_tokens, seed=seed)
        groups = sampler.batches()[:count]
    else:
        per_batch = max(1, size.max_tokens // pad_to)
        groups = [list(range(i * per_batch, (i + 1) * per_batch)) for i in range(count)]
    return [random_batch([src_len[i] for i in ids], [tgt_len[i] for i in ids], vocab, g,
                         pad_to).to(device) for ids in groups]


# 3) the models that train
class TorchTransformer(nn.Module):
    """torch.nn.Transformer between our embeddings (with positions) and our generator."""

    def __init__(self, reference: nn.Module, size: Size, dropout: float) -> None:
        super().__init__()
        self.src_embed = copy.deepcopy(reference.src_embed)
        self.tgt_embed = copy.deepcopy(reference.tgt_embed)
        self.generator = copy.deepcopy(reference.generator)
        with warnings.catch_warnings():  # its nested-tensor fast path is for inference only
            warnings.simplefilter("ignore", UserWarning)
            self.transformer = nn.Transformer(size.d_model, size.h, size.N, size.N, size.d_ff,
                                              dropout, batch_first=True, norm_first=True)

    def forward(self, batch: Batch) -> torch.Tensor:
        n = batch.tgt.size(1)  # True in torch's masks = may NOT attend
        causal = torch.ones(n, n, dtype=torch.bool, device=batch.tgt.device).triu(1)
        src_pad, tgt_pad = batch.src == PAD, batch.tgt == PAD
        return self.transformer(
            self.src_embed(batch.src), self.tgt_embed(batch.tgt), tgt_mask=causal,
            src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad, tgt_is_causal=True,
        )


def adam(model: nn.Module, fused: bool) -> torch.optim.Adam:
    """The paper's Adam; fused=True updates every parameter in one kernel where torch can."""
    options = {"lr": 1e-4, "betas": (0.9, 0.98), "eps": 1e-9}
    if not fused:
        return torch.optim.Adam(model.parameters(), **options)
    try:
        return torch.optim.Adam(model.parameters(), fused=True, **options)
    except RuntimeError:  # torch < 2.4 has no fused Adam on a CPU
        print("bench: this torch has no fused Adam here; the fast rows use the plain one",
              file=sys.stderr)
        return torch.optim.Adam(model.parameters(), **options)


def training_step(kind: str, size: Size, vocab: tuple[int, int], device: torch.device
                  ) -> tuple[nn.Module, Callable[[Batch], None]]:
    """A model of the given kind and a function that trains it one step on a batch."""
    torch.manual_seed(0)
    model = make_model(vocab[0], vocab[1], N=size.N, d_model=size.d_model, d_ff=size.d_ff,
                       h=size.h, dropout=0.1)
    criterion = LabelSmoothing(vocab[1], PAD, smoothing=0.1)
    if kind.startswith("fast"):
        use_fast_path(model)
    elif kind == "torch.nn.Transformer":
        model = TorchTransformer(model, size, dropout=0.1)
    model.to(device).train()
    if kind == "fast, torch.compile":  # inductor's generated kernels (C++ on a CPU), in place:
        model.compile(dynamic=True)  # the first steps compile, in the untimed warm-up pass
    optimizer = adam(model, fused=kind != "readable")
    bf16 = torch.autocast(device.type, dtype=torch.bfloat16, enabled="bf16" in kind)

    def step(batch: Batch) -> None:
        if kind == "readable":  # chapter 8's loss: generator log-probs, then LabelSmoothing
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
            log_probs = model.generator(out)
            loss = criterion(log_probs.reshape(-1, vocab[1]), batch.tgt_y.reshape(-1))
        else:  # the fused loss on the logits, in float32
            with bf16:  # matrix products in bfloat16 for that row, float32 weights
                if kind == "torch.nn.Transformer":
                    out = model(batch)
                else:
                    out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                logits = model.generator.proj(out)
            loss = label_smoothing_loss(logits.float().reshape(-1, vocab[1]),
                                        batch.tgt_y.reshape(-1), padding_idx=PAD, smoothing=0.1)
        (loss / batch.ntokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def time_training(runs: dict[str, tuple[Callable[[Batch], None], list[Batch]]], repeats: int,
                  device: torch.device) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Real target tokens/s of each repeat of each run (a step and its batches), and the FLOPs
    of one pass of each. The repeats take turns, one pass of every run and then the next, so
    that a slow minute of a shared machine slows every row alike, not only the one it hits."""
    from torch.utils.flop_counter import FlopCounterMode

    flops = {}
    for name, (step, batches) in runs.items():
        with FlopCounterMode(display=False) as counter:  # the warm-up pass, counted
            for batch in batches:
                step(batch)
        flops[name] = counter.get_total_flops()
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, (step, batches) in runs.items():
            sync(device)
            start = time.perf_counter()
            for batch in batches:
                step(batch)
            sync(device)
            tokens = sum(batch.ntokens for batch in batches)
            rates[name].append(tokens / (time.perf_counter() - start))
    return rates, flops


# 4) decoding
def decoding_sources(size: Size, trained: bool, vocab: tuple[int, int], device: torch.device,
                     count: int, seed: int = 0) -> tuple[nn.Module, list[list[int]], str, int]:
    """A model of the size, its source id lists, where they came from and the max_len to decode
    them with: the shipped model (trained=True, if it and Multi30k are here), or an untrained
    model that never ends."""
    if trained:
        try:
            from the_annotated_transformer import (
                load_multi30k,
                load_tokenizers,
                load_trained_model,
                tokenize,
            )

            model, vocab_src, _, _ = load_trained_model(device=device)
            german = load_tokenizers()[0]
            pairs = load_multi30k("val")[:count]
            ids = [vocab_src.encode(tokenize(de, german))[:70] for de, _ in pairs]
            return model, ids, "the shipped model on the first Multi30k validation sentences", 72
        except (OSError, ValueError, ImportError) as err:
            print(f"bench: no shipped model or Multi30k ({err}); random ids instead",
                  file=sys.stderr)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = make_model(vocab[0], vocab[1], N=size.N, d_model=size.d_model, d_ff=size.d_ff,
                       h=size.h, dropout=0.0).to(device).eval()
    with torch.no_grad():  # an untrained model's outputs would end anywhere: never end them
        model.generator.proj.bias[EOS] = -1e4
    src_len, _ = multi30k_lengths(count, g)
    ids = [torch.randint(3, vocab[0], (n - 2,), generator=g).tolist() for n in src_len]
    return model, ids, ("an untrained model on random ids of Multi30k-like lengths, every "
                        f"output {BASE_OUTPUT_LEN} tokens long"), BASE_OUTPUT_LEN


def decoders(max_len: int, batch_size: int) -> dict[str, tuple[Callable, int]]:
    """Each decoding row: a function of (model, src, src_mask) and its sentences per batch."""
    def greedy(cache: bool) -> Callable:
        return lambda m, s, mask: greedy_decode(m, s, mask, max_len, BOS, end_symbol=EOS,
                                                use_cache=cache)

    def bf16(decode: Callable) -> Callable:
        def run(m: nn.Module, s: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            with torch.autocast(s.device.type, dtype=torch.bfloat16):
                return decode(m, s, mask)
        return run

    def beam(cache: bool) -> Callable:
        return lambda m, s, mask: beam_search(m, s, mask, max_len=max_len, start_symbol=BOS,
                                              end_symbol=EOS, beam_size=4, use_cache=cache)

    return {
        "greedy, one sentence at a time (classic)": (greedy(False), 1),
        "greedy, batched": (greedy(False), batch_size),
        "greedy, batched, cache": (greedy(True), batch_size),
        "greedy, batched, cache, fast attention": (greedy(True), batch_size),
        "greedy, batched, cache, fast, bf16": (bf16(greedy(True)), batch_size),
        "beam 4, batched": (beam(False), batch_size),
        "beam 4, batched, cache": (beam(True), batch_size),
    }


def time_decoding(model: nn.Module, decode: Callable, ids: list[list[int]], per_batch: int,
                  repeats: int, device: torch.device
                  ) -> tuple[list[float], float, list, float]:
    """Sentences/s of each repeat, the peak memory of the first batch, the outputs, and the
    matmul FLOPs counted over all the sentences (in a first pass that is also the warm-up)."""
    from torch.utils.flop_counter import FlopCounterMode

    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # similar lengths together
    chunks = [[ids[i] for i in order[j : j + per_batch]] for j in range(0, len(ids), per_batch)]
    batches = [source_batch(chunk, device=device) for chunk in chunks]
    with FlopCounterMode(display=False) as counter:
        outputs = [decode(model, src, mask) for src, mask in batches]
    memory = peak_memory(lambda: decode(model, *batches[0]), device)
    rates = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        outputs = [decode(model, src, mask) for src, mask in batches]
        sync(device)
        rates.append(len(ids) / (time.perf_counter() - start))
    return rates, memory, outputs, counter.get_total_flops()


# 5) the run
def run(quick: bool, repeats: int, device: torch.device, decoding_only: bool = False) -> dict:
    sizes, vocab = (QUICK_SIZES, QUICK_VOCAB) if quick else (FULL_SIZES, VOCAB)
    peak = matmul_peak(device, 256 if quick else 2048, 3 if quick else 10)
    peak_bf16 = matmul_peak(device, 256 if quick else 2048, 3 if quick else 10, torch.bfloat16)
    bandwidth = memory_bandwidth(device, 32 if quick else 512, 3 if quick else 10)
    print(f"matmul peak: {peak / 1e9:.1f} GFLOP/s float32, {peak_bf16 / 1e9:.1f} bfloat16; "
          f"memory read {bandwidth / 1e9:.1f} GB/s", flush=True)
    results = {"hardware": hardware(device), "quick": quick, "repeats": repeats,
               "matmul_peak_gflops": peak / 1e9, "matmul_peak_bf16_gflops": peak_bf16 / 1e9,
               "memory_read_gbs": bandwidth / 1e9, "training": [], "batching": [],
               "decoding": [], "decoding_sources": {}, "decoder_weight_mb": {}}
    for size in [] if decoding_only else sizes:
        batches = budget_batches(size, vocab, size.steps, device)
        runs = {kind: (training_step(kind, size, vocab, device)[1], batches)
                for kind in (QUICK_KINDS if quick else TRAINING_KINDS)}
        rates, flops = time_training(runs, repeats, device)
        tokens = sum(batch.ntokens for batch in batches)
        for kind, (step, _) in runs.items():
            memory = peak_memory(lambda s=step, b=batches[0]: s(b), device)
            median = statistics.median(rates[kind])
            against = peak_bf16 if "bf16" in kind else peak
            results["training"].append({
                "size": size.name, "model": kind, "tokens_per_s": spread(rates[kind]),
                "mfu": flops[kind] / (tokens / median) / against,
                "flops_per_token": flops[kind] / tokens,
                "mfu_of": "bfloat16" if "bf16" in kind else "float32",
                "peak_memory_mb": memory, "steps": len(batches), "tokens": tokens,
            })
        del runs  # the models and their optimizers, before the next size's
        print(f"trained {size.name}", flush=True)
    size = sizes[0]  # token budget against padding to 72, the fast path at the first size
    runs = {} if decoding_only else {
        label: (training_step("fast", size, vocab, device)[1],
                budget_batches(size, vocab, size.steps, device, pad_to=pad_to, seed=1))
        for label, pad_to in (("token budget", None), ("every batch padded to 72", 72))}
    rates, _ = time_training(runs, repeats, device)
    for label, (_, batches) in runs.items():
        padded = sum(b.tgt_y.numel() for b in batches)
        results["batching"].append({
            "size": size.name, "batching": label, "real_tokens_per_s": spread(rates[label]),
            "padding": 1 - sum(b.ntokens for b in batches) / padded,
        })
    print("batched", flush=True)
    for size, trained in ((sizes[0], not quick), (sizes[1], False)):
        model, ids, source, max_len = decoding_sources(size, trained, vocab, device,
                                                       12 if quick else 64)
        results["decoding_sources"][size.name] = source
        results["decoder_weight_mb"][size.name] = decoder_weight_bytes(model) / 1e6
        results["decoding"] += decoding_rows(size.name, model, ids, decoders(
            max_len, 4 if quick else 32), repeats, device, {"float32": peak, "bf16": peak_bf16})
    return results


def until_end(ids: list[int]) -> list[int]:
    """A decoded row without the padding after its first </s>."""
    return ids[: ids.index(EOS) + 1] if EOS in ids else ids


def decoding_rows(size: str, model: nn.Module, ids: list[list[int]],
                  rows: dict[str, tuple[Callable, int]], repeats: int, device: torch.device,
                  peaks: dict[str, float]) -> list[dict]:
    """Each decoder's row, whether the cached decoders gave the recomputing ones' tokens, and
    the matmul FLOPs per sentence with their share of the matmul peak (MFU)."""
    fast_model = use_fast_path(copy.deepcopy(model))
    results, reference = [], {}
    for label, (decode, per_batch) in rows.items():
        which = fast_model if "fast" in label else model
        rates, memory, outputs, flops = time_decoding(which, decode, ids, per_batch, repeats,
                                                      device)
        same = agree = None
        if label.startswith("greedy, batched") or label.startswith("beam"):
            key = "greedy" if label.startswith("greedy") else "beam"
            tokens = [row for out in outputs for row in (out[0] if key == "beam" else out)
                      .tolist()]
            if "bf16" in label:  # other rounding, so not always the same tokens: how many
                agree = statistics.mean(  # sentences agree up to their </s>
                    until_end(a) == until_end(b)
                    for a, b in zip(tokens, reference[key], strict=True))
            else:
                same = reference.setdefault(key, tokens) == tokens
        results.append({"size": size, "decoder": label, "sentences_per_s": spread(rates),
                        "peak_memory_mb": memory, "sentences": len(ids), "batch": per_batch,
                        "same_as_recompute": same, "same_as_float32": agree,
                        "flops_per_sentence": flops / len(ids),
                        "mfu": flops / len(ids) * statistics.median(rates)
                        / peaks["bf16" if "bf16" in label else "float32"],
                        "mfu_of": "bfloat16" if "bf16" in label else "float32"})
        print(f"decoded {size} {label}", flush=True)
    return results


def table(results: dict) -> str:
    """The rows as text, each with its ratio to the first row of its group."""
    def rate(row: dict, key: str) -> str:
        s = row[key]
        return f"{s['median']:10.1f}  ({s['min']:.1f}-{s['max']:.1f})"

    lines = [f"hardware: {results['hardware']}",
             f"matmul peak: {results['matmul_peak_gflops']:.1f} GFLOP/s float32, "
             f"{results['matmul_peak_bf16_gflops']:.1f} bfloat16; memory read "
             f"{results['memory_read_gbs']:.1f} GB/s",
             f"weights read by each decoding step (MB): {results['decoder_weight_mb']}"]
    lines.append("\ntraining (fwd+bwd+Adam), target tokens/s: median (min-max), ratio, MFU "
                 "(of the peak in its dtype), peak MB")
    first = {}
    for row in results["training"]:
        base = first.setdefault(row["size"], row["tokens_per_s"]["median"])
        lines.append(f"  {row['size']:>6} {row['model']:<22}{rate(row, 'tokens_per_s')}  "
                     f"x{row['tokens_per_s']['median'] / base:5.2f}  {100 * row['mfu']:5.1f}%  "
                     f"{row['peak_memory_mb']:8.1f}")
    lines.append("\nbatching (fast path), real target tokens/s, ratio, padding")
    for row in results["batching"]:
        base = results["batching"][0]["real_tokens_per_s"]["median"]
        lines.append(f"  {row['batching']:<28}{rate(row, 'real_tokens_per_s')}  "
                     f"x{row['real_tokens_per_s']['median'] / base:5.2f}  "
                     f"{100 * row['padding']:4.1f}% padding")
    lines.append("\ndecoding, sentences/s, ratio, MFU, matmul GFLOP per sentence, peak MB, same "
                 "tokens as without the cache (bf16: the sentences that float32 decodes the same)")
    first = {}
    for row in results["decoding"]:
        if row["size"] not in first:
            lines.append(f"  {row['size']}: {results['decoding_sources'][row['size']]}")
        base = first.setdefault(row["size"], row["sentences_per_s"]["median"])
        same = same_tokens(row) or ""
        lines.append(f"  {row['size']:>6} {row['decoder']:<40}{rate(row, 'sentences_per_s')}  "
                     f"x{row['sentences_per_s']['median'] / base:6.2f}  "
                     f"{100 * row['mfu']:5.1f}%  {row['flops_per_sentence'] / 1e9:6.2f}  "
                     f"{row['peak_memory_mb']:8.1f}  {same}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes, few repeats, no compiled row")
    parser.add_argument("--decoding-only", action="store_true",
                        help="only the ceilings and the decoding rows (the performance appendix's "
                             "roofline), "
                             "without the training and batching rows, which take most of the "
                             "time on a CPU without bfloat16 units")
    parser.add_argument("--repeats", type=int, help="timed repeats per row (default 3; quick 2)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", help="write the results as JSON to this file")
    parser.add_argument("--save", action="store_true",
                        help="write the JSON to book/data/bench_<device type>.json")
    args = parser.parse_args(argv)
    repeats = args.repeats if args.repeats is not None else (2 if args.quick else 3)
    if repeats < 1:
        parser.error("--repeats must be at least 1")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        parser.error(f"--device {args.device!r} is not a torch device (cpu, cuda, cuda:1, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this machine has no CUDA GPU")
    out = args.out or (str(ROOT / "book" / "data" / f"bench_{device.type}.json")
                       if args.save else None)
    if out:  # before the run, not after minutes of it
        if Path(out).is_dir():
            parser.error(f"--out {out}: is a folder; give a file name")
        try:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            parser.error(f"--out {out}: cannot create its folder ({err.strerror})")
    start = time.perf_counter()
    results = run(args.quick, repeats, device, args.decoding_only)
    results["decoding_only"] = args.decoding_only
    results["seconds"] = round(time.perf_counter() - start, 1)
    results["command"] = " ".join(["python tools/bench.py", *(argv or sys.argv[1:])])
    print(table(results))
    if out:
        text = json.dumps(results, indent=1) + "\n"
        try:
            Path(out).write_text(text)
        except OSError as err:  # the run is not lost: its JSON goes to stdout instead
            print(f"bench: cannot write {out} ({err.strerror}); the JSON follows on stdout",
                  file=sys.stderr)
            print(text, end="")
            return 1
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
