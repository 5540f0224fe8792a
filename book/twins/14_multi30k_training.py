# %% [markdown]
# # Training on Multi30k
#
# Chapters 7 to 13 built the paper's training recipe and tried it on toy tasks. This chapter
# trains the model on real data, German-to-English translation on Multi30k
# {cite}`elliott2016multi30k`, and measures the result. A real run asks more of the loop than
# correctness: it lasts an hour or more, so it is described by a configuration that can be
# written down and repeated, it writes checkpoints that survive a crash, and it ends in a score
# that others can reproduce. We build the configuration, atomic checkpoints, the pipeline from
# sentences to batches, an epoch of training and evaluation, and translation scored with
# sacreBLEU {cite}`post2018call`; then we look at the model that ships with the book. The
# command that runs the training, `annotated-transformer train`, is the subject of chapter 22.

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
    count_parameters,
    current_command,
    enable_book_charts,
    fetch_shipped_model,
    line_chart,
    load_multi30k,
    load_trained_model,
    make_model,
    padding_fraction,
    run_groups,
    subsequent_mask,
)

enable_book_charts()

# %% [markdown]
# ## A run is a configuration
#
# Everything that decides what a run computes goes into one frozen dataclass: the model's sizes,
# the batch, the schedule, the loss, the seed and where checkpoints go. A run is then one value
# that can be printed, stored in every checkpoint and checked again on resume. Its defaults are
# the preset `base`; two presets name the runs this book cares about.
#
# * **`base`** is the paper's base model ($N=6$, $d_{\text{model}}=512$, $d_{\text{ff}}=2048$,
#   $h=8$, dropout 0.1, label smoothing 0.1, Adam with $\beta_2 = 0.98$ and chapter 10's
#   schedule), for GPUs. Multi30k is tiny next to WMT: with the paper's batches of 25,000 tokens
#   an epoch would be about sixteen optimizer steps. So a batch holds 4,096 padded tokens per GPU
#   and the warm-up is 1,000 steps instead of 4,000, with `lr_factor=0.5`, which keeps the
#   paper's peak learning rate on one GPU, $0.5 \cdot 512^{-0.5} \cdot 1000^{-0.5} \approx 0.0007$.
#   It is a starting point, not a tested recipe: its steps run on a GPU (`make gpu-check`,
#   chapter 22), but nobody has trained it to the end for the book.
# * **`cpu`** is a small model for a 2-core CPU: $N=3$, $d_{\text{model}}=256$,
#   $d_{\text{ff}}=1024$, $h=8$.
#
# `max_tokens` is a budget **per device and per micro-batch**, what one process's memory must
# hold; with $R$ processes one optimizer step sees $R \times$ `accum_iter` $\times$ `max_tokens`
# padded tokens, so more devices enlarge the global batch. A batch of the paper's size is reached
# by accumulation: `annotated-transformer train --config base --batch-tokens 25000` picks the `accum_iter` that comes nearest
# 25,000 padded tokens for the processes it runs with (6 on one GPU, 1 on eight); the paper
# counted real tokens, and padded ones hold fewer (chapter 22 prints how many). With
# $k = R \times$ `accum_iter` micro-batches per step an epoch has about $k$ times fewer optimizer
# steps, so `warmup` counts the steps of one process without accumulation: a run with $k$ warms up for `warmup`$/k$ steps,
# over the same share of the data, and since chapter 10's peak falls as the square root of the
# warm-up, its peak rate is $\sqrt{k}$ times higher; only `base` given `--batch-tokens` divides
# `lr_factor` by the square root of `batch_tokens` / 4,096, its own micro-batches in the batch, to
# keep the paper's peak (appendix {doc}`appendix_performance` grows `TrainConfig` with
# `batch_tokens` and this rule). Before the first step the worker prints the plan that
# `schedule_steps` computes, which refuses a run too short for its rate to peak and decay; a
# resumed run must keep $R \times$ `accum_iter`.
#
# Both presets keep separate German and English vocabularies (below), so the embeddings cannot
# be shared as the paper's joint byte-pair vocabulary allowed; chapter 17 grows this
# configuration for one joint subword vocabulary.

# %% tags=["export"]
from dataclasses import dataclass, replace
from typing import Any


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

    def __post_init__(self) -> None:
        check_train_config(self)


def check_train_config(config: Any) -> None:
    """A one-line error that names the field, for a configuration no run could use."""
    for name in ("N", "d_model", "d_ff", "h", "max_tokens", "accum_iter", "epochs", "warmup"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if config.d_model % config.h:
        raise ValueError(f"d_model={config.d_model} is not divisible by h={config.h} heads")
    for name in ("keep_epochs", "bleu_every"):
        value = getattr(config, name)
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if not 0.0 <= config.dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {config.dropout!r}")
    if not 0.0 <= config.label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {config.label_smoothing!r}")


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
    }
    if name not in presets:
        raise ValueError(f"name must be one of {', '.join(presets)}, got {name!r}")
    return replace(presets[name], **overrides)

# %% [markdown]
# The `cpu` preset is sized for this book's 2-core CPU: about an hour of training on one thread.
# One thread, because the two threads of a matrix product wait for each other, and on a shared
# machine another job keeps taking one of their cores; so `annotated-transformer train` has a
# `--threads` option, and the training worker ({doc}`appendix_distributed`) by default never gives its processes more
# threads than there are cores.
# Its warm-up of 1,000 steps covers a little over three of its twelve epochs of 305 steps (chapter 22
# counts them), and `lr_factor=0.5` makes its peak learning rate
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
# ## What the paper's runs cost
#
# By the paper's account, it trained its base model for 100,000 steps of 0.4 seconds on 8 NVIDIA
# P100 GPUs and the big model for 300,000 steps of 1.0 second, and its Table 2 gives a training
# cost of GPUs $\times$ time $\times$ an assumed 9.5 TFLOP/s per GPU, which the paper calls
# an estimate of the operations used; it is what the GPUs could have done at that rate, a budget
# rather than a count. What a run uses can be estimated. A weight costs 2 FLOPs per token
# forward (a multiply and an add) and about twice that backward, so training costs about
# $6 \times \text{parameters} \times \text{tokens}$, plus attention's own products, a few percent
# at these sentence lengths (chapter 6 shows where that changes). NVIDIA's datasheet gives the PCIe
# P100 a 32-bit peak of 9.3 TFLOP/s (10.6 for the SXM2 part; the paper does not say which).

# %%
import torch

GPUS, PEAK_FP32, TABLE_2 = 8, 9.3e12, 9.5e12  # P100s; FLOP/s: datasheet peak, Table 2's rate
TOKENS, VOCAB = 25_000, 37_000  # tokens per batch and side, shared byte-pair vocabulary
runs = {"base": (512, 2048, 100_000, 0.4, 12), "big": (1024, 4096, 300_000, 1.0, 84)}
for name, (d_model, d_ff, steps, seconds_per_step, hours) in runs.items():
    with torch.device("meta"):  # shapes without storage: even the big model costs no memory
        paper = make_model(VOCAB, VOCAB, 6, d_model, d_ff, share_embeddings=True,
                           norm_first=False)
    weights = count_parameters(paper) - VOCAB  # every matrix once, without the output bias
    flops = 6 * weights * TOKENS * steps  # 2 per weight and token forward, 4 backward
    budget = GPUS * hours * 3600 * TABLE_2
    achieved = flops / (steps * seconds_per_step) / GPUS
    print(f"{name}: {steps:,} steps, about {flops:.1e} FLOPs against Table 2's {budget:.1e}; "
          f"{achieved / 1e12:.1f} TFLOP/s per GPU, {achieved / PEAK_FP32:.0%} of its FP32 peak")

# %% [markdown]
# Look for two gaps: the estimate is well under Table 2's budget, and each GPU delivered well
# under its peak. Softmaxes, layer norms, dropout, the optimizer and the exchange of gradients
# take time besides the matrix products.

# %% [markdown]
# ## Checkpoints that survive a crash
#
# A run of an hour or more will be interrupted sooner or later. A checkpoint at the end of each
# epoch limits the loss to one epoch, but only if the checkpoint is never half written:
# `torch.save` straight onto `last.pt` would leave a truncated file if the process died while
# writing. So `save_checkpoint` writes to a temporary file in the same folder, forces its bytes
# to disk, and only then renames it over the old one with `os.replace`. On one file system a
# rename is atomic: a reader finds the old checkpoint or the new one, never a mixture (across file
# systems a rename becomes a copy, which can be interrupted too).
#
# To resume exactly, a checkpoint holds more than the weights: Adam's two running moments, the
# scheduler's step, the `TrainState` counters, the epoch, and the states of the random number
# generators, so that dropout draws the masks it would have drawn without the interruption.
#
# `load_checkpoint` uses `torch.load(..., weights_only=True)`. A checkpoint is a pickle, and a
# full unpickler runs whatever code the file names, so loading someone else's checkpoint would be
# running their program. With `weights_only=True` PyTorch accepts only tensors and plain
# containers, which is why the random states are stored as byte tensors and the configuration as
# a plain dict. A truncated or foreign file gives an error that names it and says what to do.

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
        raise ValueError(  # torch's own text runs to several lines; its type says enough
            f"checkpoint {path} is truncated or corrupted and cannot be read "
            f"({type(err).__name__}); "
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
        print(str(err).replace(folder, "<folder>"))

# %% [markdown]
# ## The data
#
# Chapter 9 loaded Multi30k and batched it by length; before a model can read it, every sentence
# must become a list of ids from a fixed vocabulary.
#
# **Tokens.** The paper's byte-pair pieces can spell any word (chapter 17 builds them). For 29,000
# captions, whole words and punctuation marks do well, cut by the rule-based tokenizers of spaCy
# {cite}`honnibal2020spacy`; a *blank* pipeline holds only those rules, so nothing beyond spaCy
# itself is downloaded. `tokenize` drops the tokens spaCy makes of doubled spaces: a space is not
# a word to translate.

# %% tags=["export"]
from collections.abc import Sequence
from typing import Any


def load_tokenizers() -> tuple[Any, Any]:
    """spaCy's rule-based German and English tokenizers (blank pipelines: nothing to download)."""
    import spacy

    return spacy.blank("de"), spacy.blank("en")


def tokenize(text: str, tokenizer: Any) -> list[str]:
    """The tokens of one sentence, without the tokens spaCy makes of doubled spaces."""
    split = getattr(tokenizer, "tokenizer", tokenizer)  # a spaCy pipeline, or its tokenizer
    return [token.text for token in split(text) if not token.is_space]


def tokenize_pairs(pairs: Sequence[tuple[str, str]], tokenizer_src: Any,
                   tokenizer_tgt: Any) -> list[tuple[list[str], list[str]]]:
    """Each sentence pair as two lists of tokens."""
    return [(tokenize(src, tokenizer_src), tokenize(tgt, tokenizer_tgt)) for src, tgt in pairs]


# %%
splits = {split: load_multi30k(split) for split in ("train", "val", "test_2016_flickr")}
spacy_de, spacy_en = load_tokenizers()
tokens = {split: tokenize_pairs(pairs, spacy_de, spacy_en) for split, pairs in splits.items()}
train_tokens = tokens["train"]
print(train_tokens[0][0])
print(train_tokens[0][1])

# %% [markdown]
# Look at the punctuation: "young," became two tokens, and "Büsche." gave its full stop a token
# of its own.
#
# **A vocabulary** maps tokens to ids and back. Four special tokens come first, with chapter 5's
# ids: `<s>`, `</s>`, the padding `<blank>`, and `<unk>`, which stands for any word the vocabulary
# does not know. Then come the words seen at least twice in the training split (exercise 2 asks
# why that split alone), most frequent first, ties alphabetical: a word seen once would get an
# embedding trained on one example, and mapping it to `<unk>` teaches the model what to do with
# the unknown words of new text. The vocabulary is saved as JSON, which loads without running
# code.
#
# ```{note}
# The classic Annotated Transformer built its vocabularies from the training, validation and
# test sets together, so the test set decided which words the model could know.
# ```

# %% tags=["export"]
import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

SPECIALS = ("<s>", "</s>", "<blank>", "<unk>")  # ids 0, 1, 2, 3; <blank> is the padding


class Vocab:
    """A table between tokens and ids; a token it does not hold maps to the id of `<unk>`."""

    def __init__(self, itos: Sequence[str], *, unk: str = "<unk>") -> None:
        self.itos = list(itos)  # id -> token
        self.stoi = {token: i for i, token in enumerate(self.itos)}  # token -> id
        self.unk = unk
        if len(self.stoi) != len(self.itos) or unk not in self.stoi:
            raise ValueError(f"itos must hold each token once, unk={unk!r} among them")

    @classmethod
    def build(cls, token_lists: Iterable[Sequence[str]], *, min_freq: int = 2,
              specials: Sequence[str] = SPECIALS) -> "Vocab":
        """Specials first, then each token seen at least min_freq times, most frequent first."""
        counts = Counter()
        for tokens in token_lists:
            if isinstance(tokens, str):
                raise TypeError("token_lists must hold lists of tokens, got a str: tokenize it")
            counts.update(tokens)
        kept = [token for token, c in counts.items() if c >= min_freq and token not in specials]
        kept.sort(key=lambda token: (-counts[token], token))  # frequency desc, then alphabetical
        return cls([*specials, *kept])

    def __len__(self) -> int:
        return len(self.itos)

    def __getitem__(self, token: str) -> int:
        return self.stoi.get(token, self.stoi[self.unk])

    def __contains__(self, token: str) -> bool:
        return token in self.stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocab) and (self.itos, self.unk) == (other.itos, other.unk)

    def __repr__(self) -> str:
        return f"Vocab({len(self):,} tokens: {' '.join(self.itos[:8])} ...)"

    def encode(self, tokens: Iterable[str]) -> list[int]:
        """The ids of tokens (unknown ones become the id of `<unk>`)."""
        return [self[token] for token in tokens]

    def lookup_tokens(self, ids: Iterable[int]) -> list[str]:
        """The tokens of ids (ints, or a 1-D tensor)."""
        ids = [int(i) for i in ids]
        for i in ids:
            if not 0 <= i < len(self.itos):
                raise ValueError(f"id {i} is out of range for a vocabulary of {len(self)} tokens")
        return [self.itos[i] for i in ids]

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON: readable, and safe to load (unlike a pickle)."""
        data = {"format": "Vocab", "version": 1, "unk": self.unk, "itos": self.itos}
        Path(path).write_text(json.dumps(data, ensure_ascii=False, indent=0) + "\n", "utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Vocab":
        """A vocabulary that `save` wrote."""
        data = json.loads(Path(path).read_text("utf-8"))
        if not isinstance(data, dict) or data.get("format") != "Vocab":
            raise ValueError(f"{path} is not a vocabulary written by Vocab.save")
        return cls(data["itos"], unk=data["unk"])


# %%
import tempfile

vocab_src = Vocab.build(src for src, _ in train_tokens)  # German
vocab_tgt = Vocab.build(tgt for _, tgt in train_tokens)  # English
print("German: ", vocab_src)
print("English:", vocab_tgt)
print("special ids:", {token: vocab_src[token] for token in SPECIALS})
assert [vocab_src[token] for token in SPECIALS] == [BOS_ID, EOS_ID, PAD_ID, UNK_ID]  # chapter 5's
print("an unseen word:", vocab_tgt["Transformerology"], "=", vocab_tgt.lookup_tokens([UNK_ID]))
for split in ["val", "test_2016_flickr"]:
    for name, side, vocab in [("German", 0, vocab_src), ("English", 1, vocab_tgt)]:
        words = [token for pair in tokens[split] for token in pair[side]]
        unknown = sum(token not in vocab for token in words)
        print(f"{split:>16} {name:>7}: {unknown / len(words):.2%} of tokens are <unk>")
with tempfile.TemporaryDirectory() as folder:  # saved and loaded, the same table
    vocab_src.save(Path(folder) / "vocab_de.json")
    assert Vocab.load(Path(folder) / "vocab_de.json") == vocab_src

# %% [markdown]
# German needs more entries than English for the same captions, since it glues words into
# compounds and inflects articles and adjectives, and about twice as large a share of its
# held-out tokens is unknown: a compound is rarer than the words it is made of.
#
# **From sentences to tensors.** `encode_pairs` turns token pairs into id pairs.
# `filter_by_length` drops the pairs longer than `max_len` and counts them: a cap bounds a batch's
# memory, but one that silently shortened sentences would teach translations that stop
# mid-sentence. `collate_batch` wraps each sentence in `<s>` ... `</s>` and pads a batch to its
# longest sentence, never further.
#
# ```{note}
# The classic version padded every sentence to 72 tokens with `F.pad`, which crops when given a
# negative amount: a longer sentence would silently have lost its end and its `</s>`.
# ```

# %% tags=["export"]
from collections.abc import Iterable, Sequence

import torch


def encode_pairs(token_pairs: Iterable[tuple[Sequence[str], Sequence[str]]], vocab_src: Vocab,
                 vocab_tgt: Vocab) -> list[tuple[list[int], list[int]]]:
    """Each token pair as two lists of ids (without `<s>` and `</s>`)."""
    return [(vocab_src.encode(src), vocab_tgt.encode(tgt)) for src, tgt in token_pairs]


def filter_by_length(examples: Sequence[tuple[Sequence[int], Sequence[int]]], *,
                     max_len: int) -> tuple[list[tuple[Sequence[int], Sequence[int]]], int]:
    """The pairs whose both sides fit max_len with `<s>` and `</s>`, and how many were dropped."""
    if not isinstance(max_len, int) or max_len < 3:
        raise ValueError(f"max_len must be an integer >= 3 (<s>, a token, </s>), got {max_len!r}")
    kept = [(src, tgt) for src, tgt in examples if max(len(src), len(tgt)) + 2 <= max_len]
    return kept, len(examples) - len(kept)


def example_lengths(
    examples: Sequence[tuple[Sequence[int], Sequence[int]]],
) -> tuple[list[int], list[int]]:
    """The source and target lengths as collate_batch makes them (with `<s>` and `</s>`)."""
    return [len(src) + 2 for src, _ in examples], [len(tgt) + 2 for _, tgt in examples]


def collate_batch(batch: Sequence[tuple[Sequence[int], Sequence[int]]], *, bos_id: int = BOS_ID,
                  eos_id: int = EOS_ID, pad_id: int = PAD_ID) -> tuple[torch.Tensor, torch.Tensor]:
    """Wrap each sentence in `<s>` ... `</s>` and pad to the longest in the batch (never cut)."""
    if len(batch) == 0:
        raise ValueError("batch is empty; collate_batch needs at least one (src, tgt) pair")

    def pad(sequences: list[Sequence[int]]) -> torch.Tensor:
        n = max(len(s) for s in sequences) + 2  # the longest, with <s> and </s>
        out = torch.full((len(sequences), n), pad_id, dtype=torch.long)  # (batch, n)
        for row, s in enumerate(sequences):
            out[row, : len(s) + 2] = torch.tensor([bos_id, *s, eos_id], dtype=torch.long)
        return out

    return pad([src for src, _ in batch]), pad([tgt for _, tgt in batch])  # (batch, n_src/tgt)


# %%
examples = encode_pairs(train_tokens, vocab_src, vocab_tgt)
for max_len in [72, 32]:
    kept, dropped = filter_by_length(examples, max_len=max_len)
    print(f"max_len={max_len}: kept {len(kept):,} pairs, dropped {dropped}")

src, tgt = collate_batch(examples[:3])
print(src.shape, tgt.shape)
print(tgt)
print(" ".join(vocab_tgt.lookup_tokens(tgt[1])))

# %% [markdown]
# No training pair is longer than 72 tokens; a tighter cap drops a few and says how many. In the
# padded rows, look for `<s>` (id 0) at the start, `</s>` (id 1) after each sentence and padding
# (id 2) after that: these two tensors are what chapter 7's `Batch` takes.
#
# Chapter 9's `TokenBudgetSampler` sorts the whole training set by length before it cuts batches.
# Sorting within smaller pools would mix lengths more from epoch to epoch, at a price in padding:

# %%
src_lengths, tgt_lengths = example_lengths(examples)  # with <s> and </s>
for pool_size in [512, 2048, 8192, None]:
    batches = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=2048,
                                 pool_size=pool_size).batches()
    print(f"pool_size={str(pool_size):>4}: {len(batches)} batches, "
          f"{padding_fraction(batches, src_lengths, tgt_lengths):.1%} padding")

# %% [markdown]
# The whole-set sort wastes the least, and it does not freeze the batches: hundreds of sentences
# share each common length, and the shuffle before the sort mixes them differently every epoch.
#
# **Run files and batches.** A run builds its vocabularies once, on its first process (its
# *rank* 0; chapter 22 runs several), and writes them as JSON into the checkpoint folder. The
# other processes receive them from it, not from the folder, which on another machine may not
# exist; a resumed run and later the translation script read them from the folder, so that word
# $i$ means the same word everywhere. `multi30k_loader` puts the sampler and `collate_batch` into
# a `DataLoader` that yields `Batch` objects (chapter 7) with their masks.

# %% tags=["export"]
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

VOCAB_FILES = ("vocab_de.json", "vocab_en.json")


def multi30k_vocabularies(
    config: TrainConfig,
    tokenizers: tuple[Any, Any],
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    save: bool = True,
) -> tuple[Vocab, Vocab]:
    """German and English word vocabularies built from the training pairs (Multi30k's by
    default); with save=True also written into the checkpoint folder, replacing what is there.
    """
    if pairs is None:  # train only: val and test stay unseen
        pairs = load_multi30k("train")[: config.train_limit]
    token_pairs = tokenize_pairs(pairs, *tokenizers)
    vocabs = tuple(Vocab.build([pair[side] for pair in token_pairs], min_freq=config.min_freq)
                   for side in (0, 1))
    if save:
        write_run_files(config.checkpoint_dir,
                        dict(zip(VOCAB_FILES, (vocab.save for vocab in vocabs), strict=True)))
    return vocabs


def write_run_files(folder: str | os.PathLike, writers: dict[str, Callable[[Path], Any]]
                    ) -> None:
    """Call each writer on a temporary file in `folder`, then rename it to its name: like
    checkpoints, a reader never sees half a file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, write in writers.items():
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        write(tmp)
        os.replace(tmp, folder / name)


def read_vocabularies(folder: str | os.PathLike) -> tuple[Vocab, Vocab]:
    """The two word vocabularies a run wrote into its checkpoint folder (for resuming and
    translating), or a one-line error that names the missing files."""
    paths = [Path(folder) / name for name in VOCAB_FILES]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"the run's vocabularies are missing: {', '.join(missing)}")
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
    examples = encode_pairs(tokenize_pairs(pairs, *tokenizers), vocab_src, vocab_tgt)
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
) -> DataLoader:
    """Token-budget batches of examples, as Batch objects."""
    src_lengths, tgt_lengths = example_lengths(examples)
    sampler = TokenBudgetSampler(
        src_lengths, tgt_lengths, max_tokens=max_tokens, shuffle=shuffle, seed=seed
    )
    return DataLoader(examples, batch_sampler=sampler, collate_fn=collate_to_batch)

# %%
tokenizers = load_tokenizers()
first_pairs = load_multi30k("train")[:400]  # a small vocabulary, quick to build
vocab_src, vocab_tgt = multi30k_vocabularies(TrainConfig(), tokenizers, pairs=first_pairs,
                                             save=False)
examples = multi30k_examples("train", vocab_src, vocab_tgt, tokenizers, max_len=72, limit=400)
loader = multi30k_loader(examples, max_tokens=300, shuffle=True)
loader.batch_sampler.set_epoch(0)
indices = [i for batch in loader.batch_sampler for i in batch]
print(f"{len(loader)} batches hold {len(indices)} of the {len(examples)} examples")
assert sorted(indices) == list(range(len(examples)))  # each example once per epoch
print(next(iter(loader)))

# %% [markdown]
# ## One epoch
#
# `train_epoch` and `evaluate` apply chapter 8's accumulation core, `run_groups`, to these
# batches, moving each `Batch` to the model's device just before use. They also add up the plain
# negative log-likelihood of the reference tokens: the label-smoothed loss that training
# minimizes is not the model's likelihood (even a perfect model pays for the smoothing), so the
# history reports the NLL per token and the perplexity $e^{\text{NLL}}$ beside it. Chapter 22
# grows all three for several devices and bfloat16; here they are the whole loop of one process.

# %% tags=["export"]
from collections.abc import Iterable

import torch
from torch import nn


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
) -> tuple[float, int, float]:
    """One training pass over batches: summed loss, target tokens, summed NLL."""
    model.train()
    loss_compute = LossAndNLL(model.generator, criterion, PAD_ID)
    loss, tokens = run_groups(
        (batch.to(device) for batch in batches), model, loss_compute, optimizer, scheduler,
        accum_iter=accum_iter, train_state=train_state,
    )
    return loss, tokens, loss_compute.nll


def evaluate(
    model: nn.Module, batches: Iterable[Batch], criterion: nn.Module, *, device: torch.device
) -> tuple[float, int, float]:
    """Summed loss, target tokens and summed NLL over batches, without dropout or gradients."""
    model.eval()
    loss_compute = LossAndNLL(model.generator, criterion, PAD_ID)
    loss, tokens = run_groups((batch.to(device) for batch in batches), model, loss_compute)
    return loss, tokens, loss_compute.nll

# %% [markdown]
# A check that the loop trains: a tiny model (one layer, $d_{\text{model}}=64$) takes two epochs
# over the 400 training pairs above, two micro-batches per optimizer step, and its loss on 200
# validation pairs must fall. With a vocabulary from 400 sentences it is no translator yet.

# %% nbval_reason="the losses differ in their last digits with another CPU's float kernels; the asserts check" tags=["nbval-ignore-output"]
import math

torch.manual_seed(0)
tiny = make_model(len(vocab_src), len(vocab_tgt), N=1, d_model=64, d_ff=128, h=4)
criterion = LabelSmoothing(len(vocab_tgt), padding_idx=PAD_ID, smoothing=0.1)
optimizer = torch.optim.Adam(tiny.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)  # constant rate
loader = multi30k_loader(examples, max_tokens=300, shuffle=True)
val_loader = multi30k_loader(
    multi30k_examples("val", vocab_src, vocab_tgt, tokenizers, max_len=72, limit=200),
    max_tokens=300, shuffle=False,
)
cpu = torch.device("cpu")
loss, tokens, _ = evaluate(tiny, val_loader, criterion, device=cpu)
val_losses = [loss / tokens]
state = TrainState()
for epoch in range(2):
    loader.batch_sampler.set_epoch(epoch)
    train_epoch(tiny, loader, criterion, optimizer, scheduler, device=cpu, accum_iter=2,
                train_state=state)
    loss, tokens, _ = evaluate(tiny, val_loader, criterion, device=cpu)
    val_losses.append(loss / tokens)
print("validation loss per token, before and after each epoch:",
      " ".join(f"{x:.2f}" for x in val_losses))
print(f"{state.step} micro-batches in {state.accum_step} optimizer steps")
assert state.accum_step == 2 * math.ceil(len(loader) / 2)
assert val_losses[0] > val_losses[1] > val_losses[2]

# %% [markdown]
# ## Translating and scoring
#
# To translate, the model decodes greedily (chapter 5's `greedy_decode`). A translation must
# never contain `<s>`, padding or, unless the reader asks for it, `<unk>`, and nothing in chapter
# 5's loop keeps a model from emitting them; so `greedy_decode` grows one keyword here, `banned`,
# whose ids get the log-probability $-\infty$ before the argmax. `translate_with` sorts the
# sentences by length before cutting them into batches (less padding), cuts each output at its
# first `</s>`, turns it back into text and restores the input order; it takes the decoder as an
# argument, and `translate` gives it greedy decoding (chapter 15 gives it beam search).
#
# Turning tokens back into text matters for the score: BLEU compares text, so "a dog ." against
# "a dog." would count a wrong token. `detokenize` joins the tokens with spaces and glues back
# what spaCy split off: punctuation to the word before, `n't` and `'s` to their word, an opening
# bracket to the word after, the parts of "T - shirt", and straight quotes alternately to the next
# and the previous word. It is a handful of rules, tested on examples, not a full inverse.
#
# The score is corpus BLEU from sacreBLEU {cite}`post2018call`, which tokenizes hypotheses and
# references itself and reports a *signature*, the settings that produced the number. Scores are
# comparable only under the same signature, so we print it with every score.
# `translation_table` walks the validation set in order from a given position, so that a reader
# can look the sentences up.

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
from functools import partial
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
    """A sentence's ids: spaCy's tokens looked up in a word Vocab."""
    return vocab.encode(tokenize(text, tokenizer))


def decode_text(ids: Sequence[int], vocab: Vocab) -> str:
    """Plain text from output ids, the words detokenized."""
    return detokenize(vocab.lookup_tokens(ids))


def translate_with(
    decode_batch: Callable[[list[list[int]]], list[list[int]]],
    sentences: Sequence[str],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizer: Any,
    *,
    batch_size: int = 64,
    max_len: int = 72,
) -> list[str]:
    """Text in, text out, in input order (an empty line stays empty); decode_batch turns a
    batch of source id lists, sorted by length so that they share little padding, into
    output id lists."""
    if isinstance(sentences, str):
        raise TypeError("sentences must be a list of strings, got one str: wrap it in a list")
    src_ids = [encode_text(s, vocab_src, tokenizer)[: max_len - 2] for s in sentences]
    outputs = [""] * len(sentences)
    order = sorted((i for i, ids in enumerate(src_ids) if ids), key=lambda i: len(src_ids[i]))
    for start in range(0, len(order), batch_size):  # similar lengths together: less padding
        chunk = order[start : start + batch_size]
        results = decode_batch([src_ids[i] for i in chunk])
        for i, ids in zip(chunk, results, strict=True):
            outputs[i] = decode_text(ids, vocab_tgt)
    return outputs


def translate(
    model: nn.Module,
    sentences: Sequence[str],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizer: Any,
    *,
    batch_size: int = 64,
    max_len: int = 72,
    allow_unk: bool = False,
) -> list[str]:
    """One English line per German sentence, in input order, decoded greedily."""
    decode = partial(translate_batch, model, max_len=max_len, allow_unk=allow_unk)
    return translate_with(decode, sentences, vocab_src, vocab_tgt, tokenizer,
                          batch_size=batch_size, max_len=max_len)


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
# ## The shipped model: training and BLEU
#
# The model that ships with the book, in `book/models/multi30k_cpu/`, came from one command on
# the book's 2-core CPU, followed by one call that keeps what translation needs:
#
# ```bash
# annotated-transformer train --config cpu --threads 1
# python -c "from the_annotated_transformer import export_for_shipping; \
#     export_for_shipping('checkpoints/multi30k_cpu/last.pt', 'book/models/multi30k_cpu', \
#     command='annotated-transformer train --config cpu --threads 1')"
# ```
#
# (`train` also writes such a folder itself, `checkpoints/multi30k_cpu/model`; the second call
# is how the shipped one was made. `annotated-transformer` is the command that
# installing the package provides,
# `.venv/bin/annotated-transformer` in a copy of the repository; `make train CONFIG=cpu` runs the first line without `--threads 1`, and `make train CONFIG=cpu RESUME=1` continues an interrupted run from
# its last checkpoint.) `export_for_shipping` keeps the weights in half precision, the two
# vocabularies, and an `info.json` with the configuration, the variant, the command, the training
# time and the hardware. `load_trained_model` builds the model from them in float32; outside a
# copy of the repository it first downloads the files and checks their checksums
# ({doc}`appendix_data`). Chapters 18 and 21 ship better models, trained on subwords, and
# `load_trained_model(name=...)` picks among them. All are pre-norm, the book's default
# (chapter 5 says why; their `info.json` says `"variant": "pre-norm"`). The note records the
# rest:

# %%
import json

folder = fetch_shipped_model()  # here, the repository's copy; in Colab, a download
info = json.loads((folder / "info.json").read_text())
print("command: ", current_command(info["command"]))
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
# Now the measurement that matters: greedy decoding of every sentence of the validation set and
# of the 2016 Flickr test set, detokenized, scored with sacreBLEU against the single reference
# (cased). The signature says exactly how.

# %%
model, vocab_src, vocab_tgt, config = load_trained_model()
scores = {}
val_pairs = load_multi30k("val")
for split in ("val", "test_2016_flickr"):
    pairs = load_multi30k(split)
    hypotheses = translate(model, [de for de, _ in pairs], vocab_src, vocab_tgt, tokenizers[0])
    scores[split], signature = bleu(hypotheses, [en for _, en in pairs])
    print(f"{split:>16}: BLEU {scores[split]:.2f} on {len(pairs):,} sentences")
print("sacreBLEU signature:", signature)

# %% [markdown]
# Twelve epochs, 67 minutes on one core of this book's CPU, give **37.8 BLEU on the validation
# set and 37.6 on the 2016 Flickr test set**, with greedy decoding that never writes `<unk>`
# (chapter 18 explains the ban and measures what allowing `<unk>` costs). These numbers are not
# comparable with the paper's 27.3 (base model, English to German, WMT
# 2014): Multi30k's short, literal descriptions of
# photographs are a much easier task than news text. In the chart above, look for the validation
# loss flattening while the training loss keeps falling: more epochs of this model would buy
# little; a larger model, beam search (chapter 15), checkpoint averaging (chapter 16) or a subword
# vocabulary (chapter 17) are the usual next steps.
#
# The first ten sentences of the validation set, in order, with the reference and the model's
# translation:

# %%
pd.set_option("display.max_colwidth", None)  # whole sentences: the text below quotes them
table = translation_table(model, val_pairs, vocab_src, vocab_tgt, tokenizers[0], n=10)
pd.DataFrame(table)

# %% [markdown]
# All ten read fluently, and half are close to the reference, some in a different but correct
# word order ("sleeping on a couch in a green room"). The errors are instructive. A German word
# that is not in the vocabulary reaches the model as `<unk>`, and since the decoder never writes
# `<unk>`, the model fills the gap with something plausible but wrong: *Baumwolle* (cotton)
# occurs once in the training set, below `min_freq=2`, and the men are loading "railroad tracks";
# *Eisfischerhütte* (ice fishing hut) never occurs in training and becomes "a blue metal
# structure". Both are limits of a word vocabulary built from 29,000 captions, which subword
# vocabularies {cite}`sennrich2016neural` were invented to fix. Not every error is the
# vocabulary's: *Mountainbike* is in the German vocabulary, and the model still drops the bike.
#
# Translation from the command line is a pipe, German in and English out, one sentence per line,
# here with this chapter's model and greedy decoding (without `--checkpoint`, or through
# `make -s translate`, it uses the book's best shipped model, chapter 21's, with beam search):
#
# ```bash
# echo "Ein Hund rennt durch den Schnee." | \
#     annotated-transformer translate --checkpoint book/models/multi30k_cpu --beam 1
# ```

# %% [markdown]
# ```{note}
# The classic Annotated Transformer saved only the model's weights after each epoch, with a
# plain `torch.save`, so an interrupted run could not continue, and it showed examples from a
# freshly shuffled validation batch each time. Here a checkpoint holds everything needed to
# resume and is replaced atomically, and the examples walk the validation set in order.
# ```
#
# You now have what a training run needs: a configuration per run, checkpoints that make an
# interruption cost at most an epoch, word vocabularies and token-budget batches, an epoch of
# training and evaluation, and translation with a reproducible BLEU score. The rest of Part III
# takes up what the paper used to get more out of a trained model: beam search with a length
# penalty (chapter 15), averaging the last checkpoints (chapter 16), and subword vocabularies
# (chapter 17).

# %% [markdown]
# ## Exercises
#
# 1. **A vocabulary by hand.** What does
#    `Vocab.build([["a", "b", "a"], ["a", "b", "c"]]).encode(["b", "c", "a"])` return? Work it
#    out from the rules (specials first, then tokens seen at least twice, most frequent first,
#    `<unk>` for the rest) and write it in `answer_1`.
# 2. **Why the training split only?** This chapter builds the vocabularies from the training
#    sentences alone. What would go wrong, in the numbers it reports, if the test sentences
#    helped choose the vocabulary?
#
# ```{dropdown} Answer to 2
# The test set would no longer be unseen: words that occur only in it would get ids of their own
# instead of `<unk>`, so the share of `<unk>` reported for the test set would flatter the
# vocabulary, lower than new text would show. The model would gain little from those ids:
# training never shows it those words.
# ```

# %% tags=["hide-cell"]
# Exercise 1: our answer (hidden in the book). Replace it with yours.
answer_1 = [5, 3, 4]  # ids 0-3 are the specials; "a" (3 times) gets 4, "b" 5; "c" is <unk>

# %%
# Check exercise 1
toy = Vocab.build([["a", "b", "a"], ["a", "b", "c"]])
assert toy.encode(["b", "c", "a"]) == answer_1
print("exercise 1: correct")
