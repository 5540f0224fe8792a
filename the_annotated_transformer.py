# %% [markdown]
# # the_annotated_transformer
#
# GENERATED FILE: do not edit. `make sync` writes it from the cells tagged `export` in the
# book's chapters, in the order of `_toc.yml`; each block below names its chapter. To change a
# definition, edit the chapter that explains it, then run `make sync`.

# %%
"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), as built in the book."""

# A grown class stands where its last chapter defines it, after earlier code that names it in
# annotations: those annotations stay unevaluated strings (PEP 563).
from __future__ import annotations


# %% [markdown]
# ## From book/intro.ipynb


# %%
from collections.abc import Sequence
from typing import Any


def paper_results_chart(results: Sequence[dict[str, Any]]) -> Any:
    """Two bar panels with a row per model: the BLEU score, and the training cost in FLOPs."""
    import altair as alt

    if not results:
        raise ValueError("results is empty: there are no models to draw")
    bars = alt.Chart(alt.Data(values=list(results))).mark_bar().encode(
        y=alt.Y("model:N", sort=None, title=None),
        color=alt.Color("kind:N", title=None),
        tooltip=["model:N", "BLEU:Q", alt.Tooltip("cost:Q", title="FLOPs (10^18)")],
    )
    bleu = bars.encode(
        x=alt.X("BLEU:Q", scale=alt.Scale(domain=[20, 30], clamp=True), title="BLEU (EN-DE)")
    ).properties(width=300, height=180, title="English-to-German BLEU, newstest2014")
    cost = bars.encode(
        x=alt.X("cost:Q", title="training cost (10¹⁸ FLOPs)"),
        y=alt.Y("model:N", sort=None, title=None, axis=None),
    ).properties(width=200, height=180, title="Training cost (none given for ByteNet)")
    return alt.hconcat(bleu, cost).resolve_scale(y="shared")  # one row per model in both


# %% [markdown]
# ## From book/02_encoder_decoder.ipynb


# %%
import copy

import torch
from torch import nn


class EncoderDecoder(nn.Module):
    """The Transformer's outer shape: encode the source once, decode the target against it."""

    def __init__(self, encoder: nn.Module, decoder: nn.Module, src_embed: nn.Module,
                 tgt_embed: nn.Module, generator: nn.Module) -> None:
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder
        self.src_embed = src_embed
        self.tgt_embed = tgt_embed
        self.generator = generator

    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model); `self.generator` turns it into log-probs."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Memory (batch, n_src, d_model) from source token ids (batch, n_src)."""
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor,
               tgt_mask: torch.Tensor) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model) for target ids (batch, n_tgt) given memory."""
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)


class Generator(nn.Module):
    """The last step: a linear map to the vocabulary, then log-softmax over it."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Log-probabilities (..., vocab) of the next token."""
        return torch.log_softmax(self.proj(x), dim=-1)


def clones(module: nn.Module, N: int) -> nn.ModuleList:
    """N independent deep copies of `module`: same shape, separate weights."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(N)])


# %%
class LayerNorm(nn.Module):
    """Normalize each position's features to mean 0, variance 1, then scale and shift."""

    def __init__(self, features: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(features))  # gamma
        self.bias = nn.Parameter(torch.zeros(features))  # beta
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # biased, as torch.nn.LayerNorm
        return self.weight * (x - mean) / torch.sqrt(var + self.eps) + self.bias


# %%
class SublayerConnection(nn.Module):
    """A residual connection around one sublayer, with layer norm before (pre) or after (post)."""

    def __init__(self, size: int, dropout: float, norm_first: bool = True) -> None:
        super().__init__()
        self.norm = LayerNorm(size)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, sublayer) -> torch.Tensor:
        """x + Dropout(Sublayer(LayerNorm(x))) in pre-norm; LayerNorm(x + ...) in post-norm."""
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


# %%
class EncoderLayer(nn.Module):
    """One encoder layer: self-attention, then feed-forward, each in a sublayer connection."""

    def __init__(self, size: int, self_attn: nn.Module, feed_forward: nn.Module,
                 dropout: float, norm_first: bool = True) -> None:
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first=norm_first), 2)
        self.size = size
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))  # (batch, n, d_model)
        return self.sublayer[1](x, self.feed_forward)


class Encoder(nn.Module):
    """N encoder layers; a final layer norm in pre-norm models, whose stream is unnormalized."""

    def __init__(self, layer: EncoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Memory (batch, n_src, d_model) from embedded source (batch, n_src, d_model)."""
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, attention over the memory, feed-forward."""

    def __init__(self, size: int, self_attn: nn.Module, src_attn: nn.Module,
                 feed_forward: nn.Module, dropout: float, norm_first: bool = True) -> None:
        super().__init__()
        self.size = size
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = clones(SublayerConnection(size, dropout, norm_first=norm_first), 3)
        self.norm_first = norm_first

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor | None) -> torch.Tensor:
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))  # (batch, n_tgt, d)
        x = self.sublayer[1](x, lambda x: self.src_attn(x, memory, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Decoder(nn.Module):
    """N decoder layers; a final layer norm in pre-norm models."""

    def __init__(self, layer: DecoderLayer, N: int) -> None:
        super().__init__()
        self.layers = clones(layer, N)
        self.norm = LayerNorm(layer.size) if layer.norm_first else nn.Identity()

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor | None,
                tgt_mask: torch.Tensor | None) -> torch.Tensor:
        """Output (batch, n_tgt, d_model) from the embedded target and the memory."""
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


# %%
def subsequent_mask(size: int) -> torch.Tensor:
    """Causal mask (1, size, size): True where query position i may attend key j, i.e. j <= i."""
    check_positive_int(size, "size", "the target length")  # one-line errors (appendix)
    return torch.tril(torch.ones(1, size, size, dtype=torch.bool))


# %% [markdown]
# ## From book/03_attention.ipynb


# %%
import math

import torch
from torch import nn


def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              mask: torch.Tensor | None = None,
              dropout: nn.Module | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention: (output (..., n_q, d_v), weights (..., n_q, n_k))."""
    d_k = query.size(-1)
    scores = query @ key.transpose(-2, -1) / math.sqrt(d_k)  # (batch, h, n_q, n_k)
    if mask is not None:
        _check_mask(mask, scores)  # a one-line error for a mask of the wrong shape (appendix)
        # True (or 1) = may attend; the rest get the lowest finite score, so softmax gives ~0.
        scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)  # (batch, h, n_q, n_k), each row sums to 1
    if dropout is not None:
        weights = dropout(weights)
    return weights @ value, weights  # (batch, h, n_q, d_v)


# %%
class MultiHeadedAttention(nn.Module):
    """h attention heads in parallel on learned projections; keeps the last weights in .attn."""

    def __init__(self, h: int, d_model: int, dropout: float = 0.1) -> None:
        super().__init__()
        if d_model % h != 0:
            raise ValueError(f"d_model={d_model} is not divisible by h={h} heads")
        self.d_k = d_model // h  # we assume d_v = d_k
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)  # W^Q, W^K, W^V, W^O
        self.attn: torch.Tensor | None = None  # (batch, h, n_q, n_k), for visualization
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (batch, n_q, d_model), key/value (batch, n_k, d_model) -> (batch, n_q, d_model)"""
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (batch, 1, n_q or 1, n_k): the same mask for every head
        # 1) project with W^Q, W^K, W^V, and split d_model into h heads of width d_k
        query, key, value = [
            self.split_heads(linear(x))  # (batch, h, n, d_k)
            for linear, x in zip(self.linears[:3], (query, key, value), strict=True)
        ]
        # 2) attend, in all heads at once
        x, weights = attention(query, key, value, mask=mask, dropout=self.dropout)
        self.attn = weights.detach()
        # 3) merge the heads back, 4) the output projection W^O
        return self.linears[-1](self.merge_heads(x))

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, n, h * width) -> (batch, h, n, width): head i gets the i-th slice."""
        return x.view(*x.shape[:2], self.h, -1).transpose(1, 2)

    def merge_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, h, n, width) -> (batch, n, h * width), the inverse of split_heads."""
        return x.transpose(1, 2).reshape(x.size(0), x.size(2), -1)


# %% [markdown]
# ## From book/04_feed_forward_embeddings.ipynb


# %%
import torch
from torch import nn


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, the same two-layer MLP at every position."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.1) -> None:
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, n, d_model) -> (batch, n, d_ff) -> (batch, n, d_model)."""
        return self.w_2(self.dropout(self.w_1(x).relu()))


# %%
class Embeddings(nn.Module):
    """A learned vector per token id, scaled by sqrt(d_model)."""

    def __init__(self, d_model: int, vocab: int) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab, d_model)
        self.d_model = d_model
        self.vocab = vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, n) -> vectors (batch, n, d_model)."""
        check_token_ids(x, self.vocab)  # one-line errors (appendix)
        return self.lut(x) * self.d_model**0.5  # (batch, n, d_model)


# %%
class PositionalEncoding(nn.Module):
    """Add the sinusoidal position signal of §3.5 to embeddings, then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.max_len = max_len
        position = torch.arange(max_len, dtype=torch.float32).unsqueeze(1)  # (max_len, 1)
        two_i = torch.arange(0, d_model, 2, dtype=torch.float32)  # 2i = 0, 2, 4, ...
        omega = 1.0 / 10000.0 ** (two_i / d_model)  # (ceil(d_model / 2),) radians per position
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * omega)
        pe[:, 1::2] = torch.cos(position * omega[: d_model // 2])
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)  # (1, max_len, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embeddings (batch, n, d_model) -> the same plus PE[:n], with dropout."""
        n = x.size(1)
        if n > self.max_len:
            raise ValueError(
                f"sequence length {n} is longer than the positional table (max_len={self.max_len})"
            )
        return self.dropout(x + self.pe[:, :n])


# %%
class LearnedPositionalEmbedding(nn.Module):
    """Add a trained vector per position (the alternative of Table 3, row E), then dropout."""

    def __init__(self, d_model: int, dropout: float, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.max_len = max_len
        self.position = nn.Embedding(max_len, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Embeddings (batch, n, d_model) -> the same plus a learned vector per position."""
        n = x.size(1)
        if n > self.max_len:
            raise ValueError(
                f"sequence length {n} is longer than the learned table (max_len={self.max_len})"
            )
        positions = torch.arange(n, device=x.device)  # (n,)
        return self.dropout(x + self.position(positions))


# %% [markdown]
# ## From book/05_full_model.ipynb


# %%
from copy import deepcopy

import torch
from torch import nn


def make_model(src_vocab: int, tgt_vocab: int, N: int = 6, d_model: int = 512, d_ff: int = 2048,
               h: int = 8, dropout: float = 0.1, *, norm_first: bool = True,
               share_embeddings: bool = False) -> EncoderDecoder:
    """A Transformer. Defaults: the paper's base sizes (N=6, d_model=512, d_ff=2048, h=8,
    dropout=0.1), but pre-norm layers and separate embeddings, unlike the paper's model. Dropout
    also falls on the attention weights and feed-forward hidden units (the classic's sites, not
    the paper's; paper_dropout_only turns it off there)."""
    if share_embeddings and src_vocab != tgt_vocab:
        raise ValueError(f"share_embeddings=True needs one vocabulary: src_vocab={src_vocab} "
                         f"!= tgt_vocab={tgt_vocab}")
    c = deepcopy
    attn = MultiHeadedAttention(h, d_model, dropout=dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
    position = PositionalEncoding(d_model, dropout)
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout, norm_first=norm_first), N),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout, norm_first=norm_first), N),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab),
    )
    for p in model.parameters():  # biases keep nn.Linear's U(±1/sqrt(fan_in)), norms 1 and 0
        if p.dim() > 1:  # matrices: Xavier/Glorot
            nn.init.xavier_uniform_(p)
    if share_embeddings:  # one (vocab, d_model) matrix, three uses (§3.4)
        shared = model.src_embed[0].lut.weight
        model.tgt_embed[0].lut.weight = shared
        model.generator.proj.weight = shared
    return model


# %%
def count_parameters(model: nn.Module) -> int:
    """The entries a model trains; `parameters()` lists a shared matrix once."""
    return sum(p.numel() for p in model.parameters())


# %%
# The ids of <s>, </s>, <blank> (padding) and <unk> in the translation vocabularies (chapter 9's
# order); the toy tasks of chapters 12 and 13 have no <unk> and give id 3 to a symbol
BOS_ID, EOS_ID, PAD_ID, UNK_ID = 0, 1, 2, 3


# %% [markdown]
# ## From book/07_batches_and_masking.ipynb


# %%
import torch


class Batch:
    """A batch of token sequences with its masks, and for training, decoder inputs and labels."""

    def __init__(self, src: torch.Tensor, tgt: torch.Tensor | None = None, pad: int = PAD_ID):
        check_batch(src, tgt)  # one-line errors for ids of the wrong type or shape (appendix)
        self.src = src  # (batch, n_src)
        self.src_mask = (src != pad).unsqueeze(-2)  # (batch, 1, n_src)
        if tgt is not None:
            self.tgt = tgt[:, :-1]  # (batch, n_tgt): decoder input, y_0 .. y_{m-1}
            self.tgt_y = tgt[:, 1:]  # (batch, n_tgt): labels, y_1 .. y_m
            self.tgt_mask = self.make_std_mask(self.tgt, pad)  # (batch, n_tgt, n_tgt)
            self.ntokens = int((self.tgt_y != pad).sum())

    @staticmethod
    def make_std_mask(tgt: torch.Tensor, pad: int) -> torch.Tensor:
        """Mask hiding padding and future positions: query i may see key j if j is real, j <= i."""
        tgt_mask = (tgt != pad).unsqueeze(-2)  # (batch, 1, n_tgt)
        return tgt_mask & subsequent_mask(tgt.size(-1)).to(tgt.device)  # (batch, n_tgt, n_tgt)

    def to(self, device: torch.device | str) -> "Batch":
        """Move every tensor of the batch to `device` (in place) and return the batch."""
        for name, value in vars(self).items():
            if isinstance(value, torch.Tensor):
                setattr(self, name, value.to(device))
        return self

    def __len__(self) -> int:
        return self.src.size(0)

    def __repr__(self) -> str:
        shapes = [f"{k}={tuple(v.shape)}" for k, v in vars(self).items() if torch.is_tensor(v)]
        ntokens = f", ntokens={self.ntokens}" if hasattr(self, "ntokens") else ""
        return f"Batch({', '.join(shapes)}{ntokens})"


# %% [markdown]
# ## From book/08_training_loop.ipynb


# %%
from dataclasses import dataclass


@dataclass
class TrainState:
    """Counters that outlive one epoch: micro-batches, optimizer steps, sentences and tokens."""

    step: int = 0  # micro-batches seen (forward and backward passes)
    accum_step: int = 0  # optimizer steps taken
    samples: int = 0  # sentences seen
    tokens: int = 0  # target tokens seen (without padding)


# %%
import torch
from torch import nn


class SimpleLossCompute:
    """Generator, then criterion; return the summed loss and the loss divided by `norm`."""

    def __init__(self, generator: nn.Module, criterion: nn.Module):
        self.generator = generator
        self.criterion = criterion  # must return the loss summed over the real tokens

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor, norm: float
    ) -> tuple[float, torch.Tensor]:
        x = self.generator(x)  # (batch, n_tgt, tgt_vocab), log-probabilities
        loss_sum = self.criterion(x.reshape(-1, x.size(-1)), y.reshape(-1))  # over all tokens
        return float(loss_sum.detach()), loss_sum / norm


# %%
import time
from collections.abc import Iterable, Iterator


def accumulation_groups(batches: Iterable, accum_iter: int) -> Iterator[list]:
    """Consecutive groups of `accum_iter` batches; the last group may be shorter."""
    group = []
    for batch in batches:
        group.append(batch)
        if len(group) == accum_iter:
            yield group
            group = []
    if group:
        yield group


def run_epoch(data_iter: Iterable, model: nn.Module, loss_compute,
              optimizer: torch.optim.Optimizer | None = None, scheduler=None, *,
              mode: str = "train", accum_iter: int = 1, train_state: TrainState | None = None,
              log_every: int | None = 40, progress: bool = False) -> tuple[float, TrainState]:
    """Run one pass over `data_iter`; return the mean loss per target token and the counters."""
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    if not isinstance(accum_iter, int) or accum_iter < 1:
        raise ValueError(f"accum_iter must be a positive integer, got {accum_iter!r}")
    train = mode == "train"
    if train and optimizer is None:
        raise ValueError("optimizer is required when mode='train'")
    state = TrainState() if train_state is None else train_state  # never shared between calls
    model.train(train)  # dropout on for training, off for evaluation
    groups = accumulation_groups(data_iter, accum_iter)
    if progress:
        from tqdm.auto import tqdm

        groups = tqdm(groups, desc=mode, unit="group", leave=False)
    total_loss, total_tokens = 0.0, 0
    log_loss, log_tokens, start = 0.0, 0, time.perf_counter()  # since the last log line
    for group in groups:
        loss_sum, tokens = run_groups(group, model, loss_compute, optimizer if train else None,
                                      scheduler, accum_iter=len(group), train_state=state)
        total_loss, total_tokens = total_loss + loss_sum, total_tokens + tokens
        log_loss, log_tokens = log_loss + loss_sum, log_tokens + tokens
        if train and log_every and state.accum_step % log_every == 0:
            lr = optimizer.param_groups[0]["lr"]
            speed = log_tokens / max(time.perf_counter() - start, 1e-9)
            print(f"step {state.accum_step:6d} | loss {log_loss / max(log_tokens, 1):.4f}"
                  f" | lr {lr:.3g} | {speed:,.0f} tokens/s")
            log_loss, log_tokens, start = 0.0, 0, time.perf_counter()
    return total_loss / max(total_tokens, 1), state


# %% [markdown]
# ## From book/09_training_data.ipynb


# %%
from collections.abc import Iterable, Iterator, Sequence

import torch
from torch.utils.data import Sampler


def padding_fraction(batches: Iterable[Sequence[int]], src_lengths: Sequence[int],
                     tgt_lengths: Sequence[int]) -> float:
    """The share of padding in the padded src and tgt tensors of batches (lists of indices)."""
    padded = real = 0
    for batch in batches:
        for lengths in (src_lengths, tgt_lengths):
            sizes = [lengths[i] for i in batch]
            padded += len(sizes) * max(sizes)  # (batch, longest) positions
            real += sum(sizes)
    return 1 - real / padded


# %% [markdown]
# ## From book/10_schedule_and_optimizer.ipynb


# %%
def rate(step: int, model_size: int, factor: float, warmup: int) -> float:
    """Learning rate at `step`: linear warmup, then decay as step^-0.5 (paper, eq. 3)."""
    check_schedule(step, model_size, warmup)  # one-line errors for bad settings (appendix)
    step = max(step, 1)  # LambdaLR starts at step 0, where step^-0.5 would divide by zero
    return factor * model_size**-0.5 * min(step**-0.5, step * warmup**-1.5)


# %% [markdown]
# ## From book/11_regularization.ipynb


# %%
import torch
from torch import nn


class LabelSmoothing(nn.Module):
    """KL divergence to a smoothed one-hot target (label smoothing, paper section 5.4)."""

    def __init__(self, size: int, padding_idx: int, smoothing: float = 0.0) -> None:
        super().__init__()
        check_smoothing(size, padding_idx, smoothing)  # one-line errors (appendix)
        self.criterion = nn.KLDivLoss(reduction="sum")
        self.size = size
        self.padding_idx = padding_idx
        self.smoothing = smoothing
        self.confidence = 1.0 - smoothing
        self.true_dist: torch.Tensor | None = None

    def smoothed_targets(
        self, target: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Target distributions (rows, size) for token ids (rows,); padding gets no mass."""
        fill = self.smoothing / (self.size - 2)
        true_dist = torch.full((target.size(0), self.size), fill, dtype=dtype, device=target.device)
        true_dist.scatter_(1, target.unsqueeze(1), self.confidence)
        true_dist[:, self.padding_idx] = 0.0
        true_dist.masked_fill_((target == self.padding_idx).unsqueeze(1), 0.0)
        return true_dist

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Summed KL(true_dist || exp(x)) for log-probabilities x (rows, size), targets (rows,)."""
        check_log_probs(x, target, self.size)  # one-line errors for wrong shapes (appendix)
        true_dist = self.smoothed_targets(target, dtype=x.dtype)  # (rows, size)
        self.true_dist = true_dist
        # Where the target is 0 the term is 0; mask x there so that log 0 = -inf gives no nan.
        x = x.masked_fill(true_dist == 0, 0.0)
        return self.criterion(x, true_dist)


# %%
from typing import Any


def smoothed_targets_chart(true_dist: torch.Tensor, target: torch.Tensor, *, title: str) -> Any:
    """Each position's target distribution (positions, vocabulary) as a grid with its numbers."""
    import altair as alt

    if true_dist.dim() != 2 or true_dist.size(0) != target.numel():
        raise ValueError(f"true_dist must be (positions={target.numel()}, vocabulary), "
                         f"got shape {tuple(true_dist.shape)}")
    cells = [{"position": f"{row} (target {target[row].item()})", "token": col,
              "probability": round(true_dist[row, col].item(), 4)}
             for row in range(true_dist.size(0)) for col in range(true_dist.size(1))]
    base = alt.Chart(alt.Data(values=cells)).encode(
        x=alt.X("token:O", title="token id"), y=alt.Y("position:O", title="target position"))
    heatmap = base.mark_rect().encode(
        color=alt.Color("probability:Q", scale=alt.Scale(scheme="blues", domain=[0, 1])),
        tooltip=["position:O", "token:O", "probability:Q"])
    labels = base.mark_text(fontSize=11).encode(text=alt.Text("probability:Q", format=".2f"))
    return (heatmap + labels).properties(width=300, height=200, title=title)


# %% [markdown]
# ## From book/12_copy_task.ipynb


# %%
import torch
from torch import nn

FIRST_SYMBOL = max(BOS_ID, EOS_ID, PAD_ID) + 1  # the ids below it are <s>, </s> and <blank>


def random_sequences(
    n: int,
    V: int,
    *,
    min_len: int = 1,
    max_len: int = 10,
    generator: torch.Generator | None = None,
    pad: int = PAD_ID,
    first: int = FIRST_SYMBOL,
) -> torch.Tensor:
    """`n` random rows of tokens first..V-1 of random lengths, padded with `pad` at the end."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")
    if V <= first:
        raise ValueError(f"V={V} leaves no content tokens: tokens below first={first} are special")
    tokens = torch.randint(first, V, (n, max_len), generator=generator)  # (n, max_len)
    lengths = torch.randint(min_len, max_len + 1, (n,), generator=generator)  # (n,)
    tokens[torch.arange(max_len) >= lengths[:, None]] = pad
    return tokens


def sequence_set(tokens: torch.Tensor, *, pad: int = PAD_ID) -> set[tuple[int, ...]]:
    """The rows of a padded token matrix as a set of tuples, padding removed."""
    return {tuple(t for t in row if t != pad) for row in tokens.tolist()}


def drop_sequences(
    tokens: torch.Tensor, exclude: set[tuple[int, ...]] | None, *, pad: int = PAD_ID
) -> torch.Tensor:
    """The rows of `tokens` that are not in `exclude` (a `sequence_set`), to hold data out."""
    if not exclude:
        return tokens
    keep = [tuple(t for t in row if t != pad) not in exclude for row in tokens.tolist()]
    return tokens[torch.tensor(keep, dtype=torch.bool)]


# %%
from collections.abc import Iterator

import torch


def seq2seq_batch(
    src: torch.Tensor, tgt: torch.Tensor, *, start: int = BOS_ID, end: int = EOS_ID,
    pad: int = PAD_ID,
) -> Batch:
    """A Batch from padded source and target rows; each target gets `start` and `end` added."""
    if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != tgt.size(0):
        raise ValueError(
            "src and tgt must have shapes (batch, n_src) and (batch, n_tgt), "
            f"got {tuple(src.shape)} and {tuple(tgt.shape)}"
        )
    n, length = tgt.shape
    full = torch.full((n, length + 2), pad, dtype=tgt.dtype)  # (batch, n_tgt + 2)
    full[:, 0] = start
    full[:, 1:-1] = tgt
    lengths = (tgt != pad).sum(dim=1)  # (batch,), padding only at the end
    full[torch.arange(n), lengths + 1] = end
    return Batch(src, full, pad=pad)


def copy_batches(
    V: int,
    batch_size: int,
    n_batches: int,
    *,
    min_len: int = 1,
    max_len: int = 10,
    generator: torch.Generator | None = None,
    exclude: set[tuple[int, ...]] | None = None,
) -> Iterator[Batch]:
    """Batches for the copy task: the target is the source between <s> (0) and </s> (1)."""
    for _ in range(n_batches):
        src = random_sequences(
            batch_size, V, min_len=min_len, max_len=max_len, generator=generator
        )  # (batch_size, max_len)
        src = drop_sequences(src, exclude)  # (<= batch_size, max_len)
        yield seq2seq_batch(src, src)


# %%
import torch
from torch import nn


def exact_matches(model: nn.Module, batch: Batch, *, start: int = BOS_ID, end: int = EOS_ID) -> int:
    """How many targets of `batch` greedy decoding reproduces exactly, up to and with `end`."""
    model.eval()
    with torch.no_grad():
        ys = greedy_decode(
            model, batch.src, batch.src_mask, batch.tgt_y.size(1) + 1, start, end_symbol=end
        )  # (batch, <= n_tgt + 1), each row starting with `start`

    def until_end(tokens: list[int]) -> list[int]:
        return tokens[: tokens.index(end) + 1] if end in tokens else tokens

    return sum(
        until_end(guess) == until_end(want)
        for guess, want in zip(ys[:, 1:].tolist(), batch.tgt_y.tolist(), strict=True)
    )


# %% [markdown]
# ## From book/13_sort_task.ipynb


# %%
from collections.abc import Iterator

import torch


def sort_batches(V: int, batch_size: int, n_batches: int, *, min_len: int = 1,
                 max_len: int = 10, generator: torch.Generator | None = None,
                 exclude: set[tuple[int, ...]] | None = None,
                 pad: int = PAD_ID) -> Iterator[Batch]:
    """Batches for the sort task: the target is the source's symbols in increasing order."""
    for _ in range(n_batches):
        src = random_sequences(batch_size, V, min_len=min_len, max_len=max_len, generator=generator)
        src = drop_sequences(src, exclude, pad=pad)  # (<= batch_size, max_len)
        yield seq2seq_batch(src, sorted_symbols(src, pad=pad), pad=pad)


def sorted_symbols(src: torch.Tensor, *, pad: int = PAD_ID) -> torch.Tensor:
    """Each row's symbols in increasing order, padding kept at the end."""
    above = int(src.max()) + 1  # an id larger than every symbol
    keyed = src.masked_fill(src == pad, above)  # (batch, n_src)
    ordered = keyed.sort(dim=1).values  # (batch, n_src)
    return ordered.masked_fill(ordered == above, pad)


# %% [markdown]
# ## From book/14_multi30k_training.ipynb


# %%
from dataclasses import dataclass, replace
from typing import Any


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


# %%
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
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

VOCAB_FILES = ("vocab_de.json", "vocab_en.json")


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


def collate_to_batch(pairs: Sequence[tuple[Sequence[int], Sequence[int]]]) -> Batch:
    """Pad a list of (src, tgt) id lists into a Batch with its masks (a DataLoader collate_fn)."""
    src, tgt = collate_batch(pairs, pad_id=PAD_ID)  # (batch, n_src), (batch, n_tgt + 1)
    return Batch(src, tgt, pad=PAD_ID)


# %%
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


# %%
import math
from collections.abc import Sequence

import torch


# %%
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


# %% [markdown]
# ## From book/15_beam_search.ipynb


# %%
from collections.abc import Mapping, Sequence

import torch
from torch import nn


class TableModel(nn.Module):
    """A stand-in model whose next-token probabilities come from a table: for examples and tests.

    table maps a prefix of generated ids (without the start symbol) to probabilities over the
    vocab ids; a prefix that is not in the table ends the sentence (end_symbol gets 1).
    """

    def __init__(
        self, table: Mapping[tuple[int, ...], Sequence[float]], *, vocab: int, end_symbol: int
    ) -> None:
        super().__init__()
        self.log_probs = {}
        for prefix, probs in table.items():
            probs = torch.as_tensor(probs, dtype=torch.float)
            if probs.shape != (vocab,) or (probs < 0).any() or abs(float(probs.sum()) - 1) > 1e-5:
                raise ValueError(f"table[{prefix}] must hold {vocab} probabilities that sum "
                                 f"to 1, got {probs.tolist()}")
            self.log_probs[tuple(prefix)] = probs.log()  # log 0 = -inf: impossible
        self.ends = torch.full((vocab,), -torch.inf)
        self.ends[end_symbol] = 0.0
        self.generator = nn.Identity()  # decode already gives log-probabilities

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """A memory of zeros (batch, n_src, 1): the table ignores the source."""
        return torch.zeros(*src.shape, 1)

    def decode(
        self, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor,
        tgt_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Log-probabilities (batch, n_tgt, vocab) of the token after each prefix of tgt."""
        rows = [
            torch.stack([self.log_probs.get(tuple(ids[1 : i + 1]), self.ends)
                         for i in range(len(ids))])
            for ids in tgt.tolist()
        ]
        return torch.stack(rows)


# %%
import math
from collections.abc import Sequence

import torch
from torch import nn


def length_penalty(length: int | torch.Tensor, *, alpha: float) -> float | torch.Tensor:
    """GNMT's lp(Y) = ((5 + |Y|) / 6) ** alpha; a score is log P(Y | X) / lp(Y)."""
    return ((5 + length) / 6) ** alpha


def _beam_limits(
    src: torch.Tensor, src_mask: torch.Tensor, max_len: int | torch.Tensor, beam_size: int,
    alpha: float,
) -> torch.Tensor:
    """Raise on a bad argument of beam_search; return max_len as a (batch,) tensor."""
    if isinstance(beam_size, bool) or not isinstance(beam_size, int):
        raise TypeError(f"beam_size must be an int, got {beam_size!r}")
    if beam_size < 1:
        raise ValueError(f"beam_size must be at least 1, got {beam_size}")
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not alpha >= 0:
        raise ValueError(f"alpha must be a number >= 0 (0: no length penalty), got {alpha!r}")
    if not isinstance(src, torch.Tensor) or src.dim() != 2:
        got = tuple(src.shape) if isinstance(src, torch.Tensor) else type(src).__name__
        raise ValueError(f"src must be a tensor of shape (batch, n_src), got {got}")
    batch, n_src = src.shape
    if not isinstance(src_mask, torch.Tensor) or src_mask.shape != (batch, 1, n_src):
        got = tuple(src_mask.shape) if isinstance(src_mask, torch.Tensor) else src_mask
        raise ValueError(f"src_mask must have shape (batch, 1, n_src) = {(batch, 1, n_src)} "
                         f"for src of shape {(batch, n_src)}, got {got}")
    limits = torch.as_tensor(max_len, device=src.device)
    if limits.is_floating_point() or limits.dtype == torch.bool or limits.dim() > 1:
        raise TypeError(f"max_len must be an int or a (batch,) tensor of ints, got {max_len!r}")
    limits = limits.expand(batch) if limits.dim() == 0 else limits
    if limits.shape != (batch,):
        raise ValueError(f"max_len must be one int or one per sentence, shape ({batch},), "
                         f"got shape {tuple(limits.shape)}")
    if batch and int(limits.min()) < 1:
        raise ValueError(f"max_len must be at least 1 (the start symbol), got {max_len}")
    return limits.long()


# %%
from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
from torch import nn


def beam_translate_batch(
    model: nn.Module,
    src_ids: Sequence[Sequence[int]],
    *,
    extra_len: int = 50,
    bos_id: int = BOS_ID,
    eos_id: int = EOS_ID,
    pad_id: int = PAD_ID,
    unk_id: int = UNK_ID,
    allow_unk: bool = False,
    **search: Any,
) -> list[list[int]]:
    """Beam-search translations of id lists, each at most len(source) + extra_len tokens.

    Never <s> or padding, and <unk> only with allow_unk=True (as translate_batch). search
    holds beam_search's own options (beam_size, alpha, narrowing), passed on unchanged.
    """
    device = next(model.parameters()).device
    src, src_mask = source_batch(src_ids, device=device, bos_id=bos_id, eos_id=eos_id,
                                 pad_id=pad_id)
    limits = torch.tensor([len(ids) + extra_len + 1 for ids in src_ids], device=device)
    model.eval()
    out, _ = beam_search(model, src, src_mask, max_len=limits, start_symbol=bos_id,
                         end_symbol=eos_id,
                         banned=never_generated(bos_id, pad_id, unk_id, allow_unk=allow_unk),
                         **search)
    results = []
    for row in out[:, 1:].tolist():  # drop <s>
        results.append(row[: row.index(eos_id)] if eos_id in row else row)
    return results


def beam_translate(
    model: nn.Module,
    sentences: Sequence[str],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizer: Any,
    *,
    extra_len: int = 50,
    batch_size: int = 32,
    allow_unk: bool = False,
    **search: Any,
) -> list[str]:
    """translate with beam search: one English line per German sentence, in input order.

    search holds beam_search's options (beam_size, alpha, narrowing), passed on unchanged.
    """
    decode = partial(beam_translate_batch, model, extra_len=extra_len, allow_unk=allow_unk,
                     **search)
    return translate_with(decode, sentences, vocab_src, vocab_tgt, tokenizer,
                          batch_size=batch_size)


# %%
def beam_sweep_chart(sweep: Any, *, reference_length: float, subset: int) -> Any:
    """BLEU and mean output length against the beam size, a line per alpha; dashed: references.

    `sweep` is a DataFrame with the columns "beam size", "alpha", "BLEU" and "mean length".
    """
    import altair as alt

    missing = {"beam size", "alpha", "BLEU", "mean length"} - set(sweep.columns)
    if missing:
        raise ValueError(f"sweep lacks the columns {sorted(missing)}")
    base = alt.Chart(sweep).encode(
        x=alt.X("beam size:O", title="beam size k"),
        color=alt.Color("alpha:N", title="α"),
        tooltip=["beam size:O", "alpha:N", "BLEU:Q", "mean length:Q"],
    )
    bleu_panel = base.mark_line(point=True).encode(
        y=alt.Y("BLEU:Q", scale=alt.Scale(zero=False), title="BLEU")
    ).properties(width=260, height=220, title=f"BLEU, val[:{subset}]")
    length_panel = base.mark_line(point=True).encode(
        y=alt.Y("mean length:Q", scale=alt.Scale(zero=False), title="mean output length (tokens)")
    ).properties(width=260, height=220, title="Output length (dashed: references)")
    reference = alt.Chart(alt.Data(values=[{"y": reference_length}])).mark_rule(
        strokeDash=[4, 4]
    ).encode(y="y:Q")
    return alt.hconcat(bleu_panel, length_panel + reference)


# %% [markdown]
# ## From book/16_checkpoint_averaging.ipynb


# %%
import os
from collections.abc import Mapping, Sequence

import torch


def average_checkpoints(
    checkpoints: Sequence[str | os.PathLike | Mapping[str, torch.Tensor]],
) -> dict[str, torch.Tensor]:
    """The elementwise mean of one model's weights at several points of one training run.

    Each item is a checkpoint file (its "model" weights, read by load_checkpoint with
    weights_only=True) or a state dict. Floating-point tensors are summed in float64 and cast
    back to their own dtype; other tensors (integer counters, masks) must be equal everywhere.
    """
    if isinstance(checkpoints, str | os.PathLike | Mapping):
        raise TypeError("checkpoints must be a list of paths or state dicts, not a single one")
    if len(checkpoints) == 0:
        raise ValueError("checkpoints is empty: give at least one path or state dict to average")
    names = [str(c) if isinstance(c, str | os.PathLike) else f"checkpoints[{i}]"
             for i, c in enumerate(checkpoints)]
    first = _weights_to_average(checkpoints[0], names[0])
    total = {k: v.double() if v.is_floating_point() else v for k, v in first.items()}
    for item, name in zip(checkpoints[1:], names[1:], strict=True):
        state = _weights_to_average(item, name)
        _check_same_layout(first, state, names[0], name)
        for key, tensor in state.items():
            if tensor.is_floating_point():
                total[key] += tensor.double()  # float64: no rounding drift over many checkpoints
            elif not torch.equal(tensor, first[key]):
                raise ValueError(
                    f"{name}: {key!r} holds {tensor.dtype} values that differ from {names[0]}; "
                    "only floating-point tensors are averaged, the others must be equal"
                )
    n = len(checkpoints)
    return {k: (v / n).to(first[k].dtype) if v.is_floating_point() else v.clone()
            for k, v in total.items()}


def _weights_to_average(
    item: str | os.PathLike | Mapping[str, torch.Tensor], name: str
) -> Mapping[str, torch.Tensor]:
    """A state dict: the "model" entry of a checkpoint file, or the mapping itself."""
    if isinstance(item, str | os.PathLike):
        item = load_checkpoint(item)["model"]
    if not isinstance(item, Mapping):
        raise TypeError(f"{name} must be a checkpoint path or a state dict, got {type(item)}")
    for key, value in item.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: {key!r} is a {type(value).__name__}, not a tensor; "
                            "pass a state dict such as checkpoint['model']")
    return item


def _check_same_layout(
    first: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor], first_name: str,
    name: str,
) -> None:
    """Raise unless `other` has the keys, shapes and dtypes of `first`: the same model."""
    missing, extra = sorted(first.keys() - other.keys()), sorted(other.keys() - first.keys())
    if missing or extra:
        raise ValueError(f"{name} does not have the keys of {first_name}: missing "
                         f"{missing[:3] or 'none'}, unexpected {extra[:3] or 'none'}")
    for key, tensor in other.items():
        if tensor.shape != first[key].shape or tensor.dtype != first[key].dtype:
            raise ValueError(
                f"{name}: {key!r} is {tuple(tensor.shape)} {tensor.dtype}, but "
                f"{tuple(first[key].shape)} {first[key].dtype} in {first_name}; checkpoints "
                "of different models (or precisions) cannot be averaged"
            )


# %%
import functools

import torch
from torch import nn

SORT_V = 13  # <s>, </s>, padding and the digits 0-9 (chapter 12)


@functools.cache
def averaging_test_set() -> tuple[Batch, frozenset]:
    """1,000 held-out sort sequences of 4 to 10 digits (seed 1), and their set, which training
    excludes."""
    src = random_sequences(1000, SORT_V, min_len=4, max_len=10,
                           generator=torch.Generator().manual_seed(1))
    return seq2seq_batch(src, sorted_symbols(src)), frozenset(sequence_set(src))


def sort_model_with_checkpoints(
    seed: int = 0, *, steps: int = 500, every: int = 20
) -> tuple[nn.Module, list[tuple[int, dict[str, torch.Tensor]]]]:
    """Chapter 13's sort model trained for `steps` optimizer steps from `seed`, and a copy of
    its weights every `every` steps: (optimizer step, weights) pairs."""
    torch.manual_seed(seed)
    model = make_model(SORT_V, SORT_V, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)
    criterion = LabelSmoothing(SORT_V, padding_idx=PAD_ID, smoothing=0.0)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: rate(step, model_size=64, factor=0.5, warmup=100)
    )
    data = torch.Generator().manual_seed(seed)
    _, held_out = averaging_test_set()
    state, checkpoints = TrainState(), []
    while state.accum_step < steps:
        batches = sort_batches(SORT_V, 64, every, generator=data, exclude=held_out)
        run_epoch(batches, model, SimpleLossCompute(model.generator, criterion), optimizer,
                  scheduler, train_state=state, log_every=None)
        checkpoints.append((state.accum_step, {k: v.clone() for k, v in
                                               model.state_dict().items()}))
    return model, checkpoints


def held_out_loss(model: nn.Module, weights: dict[str, torch.Tensor]) -> float:
    """Loss per target token of `weights` on the held-out sequences, with teacher forcing."""
    test_batch, _ = averaging_test_set()
    model.load_state_dict(weights)
    criterion = LabelSmoothing(SORT_V, padding_idx=PAD_ID, smoothing=0.0)
    loss, _ = run_epoch([test_batch], model, SimpleLossCompute(model.generator, criterion),
                        mode="eval", log_every=None)
    return loss


def held_out_accuracy(model: nn.Module, weights: dict[str, torch.Tensor]) -> float:
    """Share of held-out sequences that greedy decoding with `weights` sorts exactly."""
    test_batch, _ = averaging_test_set()
    model.load_state_dict(weights)
    return exact_matches(model, test_batch) / test_batch.src.size(0)


# %%
from typing import Any


def bleu_points_chart(results: Any, *, title: str) -> Any:
    """A row per set of weights, a dot per split: the "val BLEU" and "test BLEU" of `results`.

    `results` is a DataFrame indexed by the name of the weights, in the order to show them.
    """
    import altair as alt

    missing = {"val BLEU", "test BLEU"} - set(results.columns)
    if missing:
        raise ValueError(f"results lacks the columns {sorted(missing)}")
    points = [
        {"weights": name, "split": split, "BLEU": row[f"{split} BLEU"]}
        for name, row in results.iterrows()
        for split in ("val", "test")
    ]
    return (
        alt.Chart(alt.Data(values=points))
        .mark_point(filled=True, size=70)
        .encode(
            x=alt.X("BLEU:Q", title="greedy sacreBLEU", scale=alt.Scale(zero=False)),
            y=alt.Y("weights:N", title=None, sort=list(results.index)),
            color=alt.Color("split:N", title=None),
            tooltip=["weights:N", "split:N", alt.Tooltip("BLEU:Q", format=".2f")],
        )
        .properties(width=380, height=230, title=title)
    )


# %% [markdown]
# ## From book/17_subword_vocabularies.ipynb


# %%
import heapq
import math
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from itertools import pairwise

END_OF_WORD = "</w>"


def merge_pair(symbols: Sequence[str], pair: tuple[str, str]) -> list[str]:
    """The symbols with every occurrence of pair joined into one symbol, left to right."""
    merged, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            merged.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            merged.append(symbols[i])
            i += 1
    return merged


def _check_word_counts(word_counts: Mapping[str, int], end_of_word: str) -> None:
    """Raise a clear error for a corpus that learn_bpe cannot use."""
    if not isinstance(word_counts, Mapping):
        raise TypeError(
            f"word_counts must map each word to its count (a dict or Counter), "
            f"got {type(word_counts).__name__}"
        )
    if not word_counts:
        raise ValueError("word_counts is empty: learn_bpe needs at least one word")
    for word, count in word_counts.items():
        if not isinstance(word, str) or not word or end_of_word in word:
            raise ValueError(
                f"word_counts has the key {word!r}: words must be non-empty strings without "
                f"the end-of-word marker {end_of_word!r}"
            )
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"word_counts[{word!r}] must be a positive integer, got {count!r}")


def learn_bpe(
    word_counts: Mapping[str, int], num_merges: int, *, end_of_word: str = END_OF_WORD
) -> list[tuple[str, str]]:
    """Up to num_merges merges, each joining the most frequent adjacent pair (Sennrich et al.).

    Words start as their characters plus end_of_word; a pair's count is summed over the words
    that hold it, each weighted by its count. Ties go to the smallest pair in Python's string
    order. Learning stops early when every word is a single symbol.
    """
    if isinstance(num_merges, bool) or not isinstance(num_merges, int) or num_merges < 0:
        raise ValueError(f"num_merges must be an integer >= 0, got {num_merges!r}")
    _check_word_counts(word_counts, end_of_word)
    words = [[*word, end_of_word] for word in word_counts]  # word i, spelled in symbols
    counts = list(word_counts.values())
    pair_counts: Counter[tuple[str, str]] = Counter()  # pair -> occurrences in the corpus
    holders: defaultdict[tuple[str, str], set[int]] = defaultdict(set)  # pair -> word indices
    for i, symbols in enumerate(words):
        for pair in pairwise(symbols):
            pair_counts[pair] += counts[i]
            holders[pair].add(i)
    heap = [(-count, pair) for pair, count in pair_counts.items()]  # most frequent on top
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < num_merges:
        negative_count, pair = heapq.heappop(heap)
        if pair_counts[pair] == 0 or -negative_count != pair_counts[pair]:
            continue  # stale: the pair's count changed after this entry was pushed
        merges.append(pair)
        delta: Counter[tuple[str, str]] = Counter()  # how this merge changes each pair's count
        for i in holders.pop(pair):  # 1) re-spell only the words that hold the pair
            old, new = words[i], merge_pair(words[i], pair)
            old_pairs, new_pairs = list(pairwise(old)), list(pairwise(new))
            for p in old_pairs:  # 2) take out the word's old pairs, put in its new ones
                delta[p] -= counts[i]
            for p in new_pairs:
                delta[p] += counts[i]
            for p in set(old_pairs) - set(new_pairs):
                holders[p].discard(i)
            for p in set(new_pairs) - set(old_pairs):
                holders[p].add(i)
            words[i] = new
        for p, change in delta.items():  # 3) push the new counts; older entries go stale
            if change:
                pair_counts[p] += change
                if pair_counts[p] > 0:
                    heapq.heappush(heap, (-pair_counts[p], p))
    return merges


def segment_word(
    word: str, ranks: Mapping[tuple[str, str], int], *, end_of_word: str = END_OF_WORD
) -> list[str]:
    """A word as BPE symbols (the last ends with end_of_word); ranks: {merge: its position}.

    Repeatedly applies the earliest learned merge that fits; characters that no merge covers
    stay single symbols, so any word can be segmented.
    """
    if not isinstance(word, str) or not word:
        raise ValueError(f"word must be a non-empty string, got {word!r}")
    symbols = [*word, end_of_word]
    while len(symbols) > 1:
        pair = min(pairwise(symbols), key=lambda p: ranks.get(p, math.inf))
        if pair not in ranks:
            break  # no learned merge applies any more
        symbols = merge_pair(symbols, pair)
    return symbols


# %%
import io
from collections.abc import Iterable
from typing import Any

SENTENCEPIECE_MODEL_TYPES = ("bpe", "unigram")


def train_sentencepiece(
    sentences: Iterable[str],
    *,
    vocab_size: int = 8000,
    model_type: str = "bpe",
    byte_fallback: bool = True,
    num_threads: int = 1,
) -> Any:
    """A sentencepiece model trained in memory (no files), with the ids of SPECIALS.

    Returns a sentencepiece.SentencePieceProcessor that decodes every encoded text back to
    itself (no normalization, spaces kept, unseen characters as UTF-8 bytes with byte_fallback),
    except the meta symbol U+2581 itself, which comes back as a space.
    """
    import sentencepiece as spm

    if isinstance(sentences, str):
        raise TypeError("sentences must be an iterable of sentences, got one str: wrap it")
    sentences = [s for s in sentences if s]
    if not sentences:
        raise ValueError("sentences holds no non-empty sentence to train on")
    if not all(isinstance(s, str) for s in sentences):
        raise TypeError("sentences must hold only strings")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 4:
        raise ValueError(f"vocab_size must be an integer > 4 (the specials), got {vocab_size!r}")
    if model_type not in SENTENCEPIECE_MODEL_TYPES:
        raise ValueError(
            f"model_type must be one of {', '.join(SENTENCEPIECE_MODEL_TYPES)}, got {model_type!r}"
        )
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,  # the trained model goes here, not into a file
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,  # every character of the training text gets a piece
            byte_fallback=byte_fallback,  # unseen characters become byte pieces, not <unk>
            normalization_rule_name="identity",  # no NFKC: text comes back as it went in
            remove_extra_whitespaces=False,  # keep leading, trailing and repeated spaces
            bos_id=SPECIALS.index("<s>"), bos_piece="<s>",
            eos_id=SPECIALS.index("</s>"), eos_piece="</s>",
            pad_id=SPECIALS.index("<blank>"), pad_piece="<blank>",
            unk_id=SPECIALS.index("<unk>"), unk_piece="<unk>",
            num_threads=num_threads,
            minloglevel=2,  # errors only
        )
    except RuntimeError as err:  # e.g. vocab_size larger than the text allows
        raise ValueError(
            f"sentencepiece could not train vocab_size={vocab_size} ({model_type}) on "
            f"{len(sentences)} sentences: {err}"
        ) from err
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


# %%
def vocabulary_chart(rows: Sequence[Mapping[str, Any]], *, title: str, subtitle: str) -> Any:
    """Tokens per sentence against vocabulary size, per language: BPE sizes as a line, the
    other vocabularies as points (rows as `subword_row` makes them)."""
    import altair as alt

    long_rows = [
        {"vocabulary": row["vocabulary"], "kind": row["kind"], "size": row["size"],
         "language": language, "tokens per sentence": row[f"{language} tokens per sentence"]}
        for row in rows for language in ("German", "English")
    ]
    if not long_rows:
        raise ValueError("rows is empty: there are no vocabularies to draw")
    base = alt.Chart(alt.Data(values=long_rows)).encode(
        x=alt.X("size:Q", scale=alt.Scale(type="log", domain=[1500, 20000], nice=False),
                title="vocabulary size, log scale (words: German + English)"),
        y=alt.Y("tokens per sentence:Q", scale=alt.Scale(zero=False),
                title="tokens per val sentence"),
        color=alt.Color("language:N", title=None),
        tooltip=["vocabulary:N", "language:N",
                 alt.Tooltip("tokens per sentence:Q", format=".2f")],
    )
    bpe = alt.datum.kind == "sentencepiece bpe"
    bpe_lines = base.transform_filter(bpe).mark_line(point=True)
    others = base.transform_filter(~bpe).mark_point(size=80, filled=True).encode(
        shape=alt.Shape("kind:N", title=None)
    )
    return (bpe_lines + others).properties(
        width=420, height=240, title=alt.TitleParams(title, subtitle=subtitle)
    )


# %%
from dataclasses import dataclass, replace


# %%
import os
from pathlib import Path

SUBWORD_FILE = "subwords.model"  # one sentencepiece model for both languages


def load_subwords(path: str | os.PathLike) -> Any:
    """A sentencepiece model from its file, or a one-line error that names the file."""
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (OSError, RuntimeError) as err:
        raise ValueError(f"{path} is not a readable sentencepiece model ({err})") from err


# %%
def read_vocabularies(folder: str | os.PathLike, *, subwords: bool = False
                      ) -> tuple[Vocab, Vocab]:
    """The vocabularies a run wrote into its checkpoint folder: chapter 14's two word
    vocabularies, or with subwords=True the one sentencepiece model, twice."""
    paths = [Path(folder) / name for name in ([SUBWORD_FILE] if subwords else VOCAB_FILES)]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"the run's vocabularies are missing: {', '.join(missing)}")
    if subwords:
        sp = load_subwords(paths[0])
        return sp, sp
    return Vocab.load(paths[0]), Vocab.load(paths[1])


def encode_examples(
    pairs: Sequence[tuple[str, str]],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizers: tuple[Any, Any],
    *,
    max_len: int,
) -> list[tuple[list[int], list[int]]]:
    """Sentence pairs as id lists, without pairs longer than max_len; a sentencepiece model
    reads the raw text (tokenizers unused)."""
    if isinstance(vocab_src, Vocab):
        examples = encode_pairs(tokenize_pairs(pairs, *tokenizers), vocab_src, vocab_tgt)
    else:
        examples = [(vocab_src.encode(de), vocab_tgt.encode(en)) for de, en in pairs]
    return filter_by_length(examples, max_len=max_len)[0]


def encode_text(text: str, vocab: Vocab, tokenizer: Any) -> list[int]:
    """A sentence's ids: spaCy's tokens in a word Vocab, or a sentencepiece model's pieces of
    the raw text (tokenizer unused)."""
    if isinstance(vocab, Vocab):
        return vocab.encode(tokenize(text, tokenizer))
    return vocab.encode(text)


def decode_text(ids: Sequence[int], vocab: Vocab) -> str:
    """Plain text from output ids: detokenized words, or the sentencepiece model's decoding."""
    if isinstance(vocab, Vocab):
        return detokenize(vocab.lookup_tokens(ids))
    return vocab.decode(list(ids))


# %% [markdown]
# ## From book/18_results.ipynb


# %%
from collections.abc import Sequence
from typing import Any


def paired_bootstrap(
    baseline: Sequence[str], system: Sequence[str], references: Sequence[str],
    *, samples: int = 1000,
) -> dict[str, float]:
    """sacreBLEU's paired bootstrap test of `system` against `baseline` on one test set: both
    BLEU scores, their 95% half-intervals over the resampled sets, and the p-value of the
    hypothesis that the two systems are equally good."""
    if not len(baseline) == len(system) == len(references) > 0:
        raise ValueError(f"baseline, system and references must be equally long and not empty, "
                         f"got {len(baseline)}, {len(system)} and {len(references)} sentences")
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    test = PairedTest([("baseline", list(baseline)), ("system", list(system))],
                      {"BLEU": BLEU()}, [list(references)], test_type="bs", n_samples=samples)
    _, scores = test()
    ours, theirs = scores["BLEU"]
    return {"baseline": ours.score, "baseline_ci": float(ours.ci), "system": theirs.score,
            "system_ci": float(theirs.ci), "difference": theirs.score - ours.score,
            "p_value": float(theirs.p_value)}


# %%
import string


def non_words(outputs: Sequence[str], known: set[str], tokenizer: Any) -> list[list[str]]:
    """For each output, its words (letters only) that `known` lacks, ignoring case: the words
    a model made up, when `known` holds every word of the target side's training text."""
    return [[word for word in tokenize(output, tokenizer)
             if word.isalpha() and word.lower() not in known] for output in outputs]


def plain_words(text: str) -> list[str]:
    """The words of `text` between spaces, without the punctuation around them."""
    marks = string.punctuation + "“”„"
    return [word.strip(marks) for word in text.split() if word.strip(marks)]


def shared_names(source: str, reference: str) -> list[str]:
    """The capitalized words that a source and its reference share exactly, each once; the
    reference's first word is left out, since every sentence starts with a capital."""
    later = set(plain_words(reference)[1:])
    return [word for word in dict.fromkeys(plain_words(source))
            if word[0].isupper() and word in later]


# %% [markdown]
# ## From book/19_model_variations.ipynb


# %%
import torch
from torch import nn


class KeySizeAttention(MultiHeadedAttention):
    """Multi-head attention with its own query/key width d_k; values keep d_v = d_model / h."""

    def __init__(self, h: int, d_model: int, d_k: int, dropout: float = 0.1) -> None:
        super().__init__(h, d_model, dropout=dropout)
        if not isinstance(d_k, int) or d_k < 1:
            raise ValueError(f"d_k={d_k!r} must be a positive integer")
        self.d_k = d_k  # queries and keys: h heads of width d_k
        self.d_v = d_model // h  # values: h heads of width d_v, as in MultiHeadedAttention
        self.linears[0] = nn.Linear(d_model, h * d_k)  # W^Q
        self.linears[1] = nn.Linear(d_model, h * d_k)  # W^K

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query (batch, n_q, d_model), key/value (batch, n_k, d_model) -> (batch, n_q, d_model)."""
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (batch, 1, n_q or 1, n_k): the same mask for every head
        # 1) project: queries and keys to h heads of d_k, values to h heads of d_v
        query, key, value = [
            self.split_heads(linear(x))  # (batch, h, n, d_k or d_v)
            for linear, x in zip(self.linears[:3], (query, key, value), strict=True)
        ]
        # 2) attend: scores from d_k-wide dot products, outputs d_v wide
        x, weights = attention(query, key, value, mask=mask, dropout=self.dropout)
        self.attn = weights.detach()  # (batch, h, n_q, n_k)
        # 3) merge the heads: (batch, h, n_q, d_v) -> (batch, n_q, h * d_v), 4) W^O
        return self.linears[-1](self.merge_heads(x))


# %%
import torch
from torch import nn

POSITIONS = ("sinusoidal", "learned", "none")


def make_variant(
    src_vocab: int,
    tgt_vocab: int,
    *,
    N: int = 6,
    d_model: int = 512,
    d_ff: int = 2048,
    h: int = 8,
    d_k: int | None = None,
    dropout: float = 0.1,
    positions: str = "sinusoidal",
    max_len: int = 5000,
    share_embeddings: bool = False,
) -> EncoderDecoder:
    """make_model plus Table 3's other knobs: a key size d_k of its own, and the position signal."""
    if positions not in POSITIONS:
        raise ValueError(f"positions={positions!r} must be one of {POSITIONS}")
    model = make_model(
        src_vocab, tgt_vocab, N, d_model, d_ff, h, dropout, share_embeddings=share_embeddings
    )
    if d_k is not None and d_k != d_model // h:  # row B: narrower (or wider) queries and keys
        for layer in [*model.encoder.layers, *model.decoder.layers]:
            for name in ("self_attn", "src_attn"):
                if hasattr(layer, name):
                    setattr(layer, name, _xavier(KeySizeAttention(h, d_model, d_k, dropout)))
    if positions != "sinusoidal":  # row E: item 1 of each embedding is the position signal
        for embed in (model.src_embed, model.tgt_embed):
            if positions == "learned":
                embed[1] = LearnedPositionalEmbedding(d_model, dropout, max_len=max_len)
            else:
                embed[1] = nn.Dropout(dropout)  # no position signal, the same dropout
    return model


def _xavier(module: nn.Module) -> nn.Module:
    """Initialize a module's matrices as make_model does (Xavier/Glorot uniform)."""
    for p in module.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    return module


# %%
import functools

import torch

MINIATURE_VOCAB = 13  # <s>, </s>, padding and the digits 0-9 (chapter 12)
MINIATURE = {"N": 2, "d_model": 32, "d_ff": 64, "h": 4, "dropout": 0.1, "smoothing": 0.1}
MINIATURE_STEPS, MINIATURE_BATCH = 250, 32
MINIATURE_VARIATIONS = [  # (row of Table 3, variant, the change to the base model)
    ("base", "N=2, d_model=32, h=4, d_k=d_v=8", {}),
    ("A", "h=1, d_k=d_v=32", {"h": 1}),
    ("A", "h=2, d_k=d_v=16", {"h": 2}),
    ("A", "h=8, d_k=d_v=4", {"h": 8}),
    ("B", "d_k=2 (d_v=8)", {"d_k": 2}),
    ("C", "N=1", {"N": 1}),
    ("C", "d_model=16, d_k=d_v=4", {"d_model": 16, "d_ff": 32}),
    ("C", "d_model=64, d_k=d_v=16", {"d_model": 64, "d_ff": 128}),
    ("D", "P_drop=0", {"dropout": 0.0}),
    ("D", "ε_ls=0", {"smoothing": 0.0}),
    ("E", "learned positions", {"positions": "learned"}),
    ("E", "no positions (control)", {"positions": "none"}),
]


@functools.cache
def miniature_test_set() -> tuple[Batch, frozenset]:
    """500 sequences of 4 to 10 digits from a seed no training run uses, and their set (which
    training batches exclude)."""
    data = torch.Generator().manual_seed(100)
    src = random_sequences(500, MINIATURE_VOCAB, min_len=4, max_len=10, generator=data)
    return seq2seq_batch(src, sorted_symbols(src)), frozenset(sequence_set(src))


def train_miniature(model: nn.Module, seed: int, *, smoothing: float, peak: float,
                    warmup: bool = True) -> dict:
    """Train `model` for the miniature's steps from `seed`; held-out loss and exact matches.

    The schedule is chapter 10's with 100 warm-up steps and `factor=peak`; warmup=False starts
    at the schedule's peak and decays from there as the warmed-up schedule does after step 100.
    """
    test_batch, held_out = miniature_test_set()
    V, d_model = MINIATURE_VOCAB, model.generator.proj.in_features
    loss_compute = SimpleLossCompute(
        model.generator, LabelSmoothing(V, padding_idx=PAD_ID, smoothing=smoothing)
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)

    def schedule(step: int) -> float:
        return rate(step if warmup else max(step, 100), model_size=d_model, factor=peak,
                    warmup=100)

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=schedule)
    data = torch.Generator().manual_seed(seed)
    batches = sort_batches(V, MINIATURE_BATCH, MINIATURE_STEPS, generator=data,
                           exclude=held_out)
    run_epoch(batches, model, loss_compute, optimizer, scheduler, log_every=None)
    cross_entropy = SimpleLossCompute(model.generator, LabelSmoothing(V, padding_idx=PAD_ID))
    loss, _ = run_epoch([test_batch], model, cross_entropy, mode="eval", log_every=None)
    return {"loss": loss, "exact": exact_matches(model, test_batch) / len(test_batch),
            "params": sum(p.numel() for p in model.parameters())}


def train_variation(change: dict, seed: int) -> dict:
    """The base miniature with `change` applied, trained from `seed` (chapter 10's schedule at
    factor 0.5)."""
    options = MINIATURE | change
    smoothing = options.pop("smoothing")
    torch.manual_seed(seed)
    V = MINIATURE_VOCAB
    model = make_variant(V, V, **options, max_len=12)  # sequences have at most 11 tokens
    return train_miniature(model, seed, smoothing=smoothing, peak=0.5)


def train_norm(norm_first: bool, warmup: bool, seed: int) -> float:
    """Held-out loss of the miniature without dropout or smoothing, post- or pre-norm, with or
    without warm-up, at four times the variations' peak learning rate (factor 2, not 0.5)."""
    torch.manual_seed(seed)
    V = MINIATURE_VOCAB
    model = make_model(V, V, N=2, d_model=32, d_ff=64, h=4, dropout=0.0, norm_first=norm_first)
    return train_miniature(model, seed, smoothing=0.0, peak=2.0, warmup=warmup)["loss"]


# %% [markdown]
# ## From book/20_constituency_parsing.ipynb


# %%
import os
import re
import zipfile
from pathlib import Path
from typing import NamedTuple

PTB_SAMPLE_URL = (
    "https://raw.githubusercontent.com/nltk/nltk_data/gh-pages/packages/corpora/treebank.zip"
)
PTB_SAMPLE_SHA256 = "9da92d76c3666cfb6cddeaed0f7e86b344cce0f0928a286d439e555f19c37399"


def ptb_sample_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The treebank folder: data_dir, $PTB_SAMPLE_DIR, ../shared/data/ptb-sample, or the cache."""
    return dataset_dir("ptb-sample", "PTB_SAMPLE_DIR", data_dir)


def ptb_sample_file(folder: Path) -> Path:
    """treebank.zip in folder, downloaded from the NLTK data repository if missing, verified."""
    path = folder / "treebank.zip"
    if not path.exists():
        try:
            download_file(PTB_SAMPLE_URL, path, sha256=PTB_SAMPLE_SHA256)
        except OSError as err:  # no network, an HTTP error, a timeout, a read-only folder
            raise FileNotFoundError(
                f"treebank.zip is not in {folder} and could not be downloaded from "
                f"{PTB_SAMPLE_URL} ({err}): connect to the internet and try again, copy the "
                "file there, or set PTB_SAMPLE_DIR to a folder that holds it"
            ) from err
    actual = sha256_of(path)
    if actual != PTB_SAMPLE_SHA256:
        raise ValueError(
            f"{path} is truncated or corrupted (SHA-256 {actual}, expected "
            f"{PTB_SAMPLE_SHA256}): delete it to download it again, or set PTB_SAMPLE_DIR to "
            "a folder with an intact copy"
        )
    return path


class Tree(NamedTuple):
    """A constituent: its label and its children, which are Trees or (at the leaves) words."""

    label: str
    children: tuple


SEXPR_TOKEN = re.compile(r"\(|\)|[^\s()]+")


def read_trees(text: str) -> list[Tree]:
    """Every bracketed tree in text; the treebank's unlabeled outer bracket becomes TOP."""
    trees, stack = [], []  # stack: [label, children] of each open bracket
    tokens = SEXPR_TOKEN.findall(text)
    for i, token in enumerate(tokens):
        if token == "(":
            labeled = i + 1 < len(tokens) and tokens[i + 1] not in "()"
            stack.append(["" if labeled else "TOP", []])  # "": the label comes next
        elif token == ")":
            if not stack:
                raise ValueError(f"token {i} closes a bracket that was never opened")
            label, children = stack.pop()
            (stack[-1][1] if stack else trees).append(Tree(label, tuple(children)))
        elif not stack:
            raise ValueError(f"token {i}, {token!r}, stands outside any bracket")
        elif stack[-1][0] == "":
            stack[-1][0] = token
        else:
            stack[-1][1].append(token)
    if stack:
        raise ValueError(f"the text ends with {len(stack)} brackets still open")
    return trees


def load_ptb_sample(data_dir: str | os.PathLike | None = None) -> dict[str, list[Tree]]:
    """The sample's trees, file by file: {"wsj_0001": [Tree, ...], ...}."""
    with zipfile.ZipFile(ptb_sample_file(ptb_sample_dir(data_dir))) as archive:
        names = sorted(n for n in archive.namelist() if n.endswith(".mrg"))
        return {Path(n).stem: read_trees(archive.read(n).decode("utf-8")) for n in names}


# %%
def base_label(label: str) -> str:
    """NP-SBJ-1 -> NP, NP=2 -> NP; labels that start with '-' (-NONE-, -LRB-) stay whole."""
    return label if label.startswith("-") else re.split(r"[-=]", label)[0]


def is_preterminal(tree: Tree) -> bool:
    """A tag over one word: (NN board)."""
    return len(tree.children) == 1 and isinstance(tree.children[0], str)


def clean_tree(tree: Tree) -> Tree | None:
    """Parsing's usual preprocessing: no TOP, no empty elements, no function tags."""
    if tree.label == "TOP" and len(tree.children) == 1:
        return clean_tree(tree.children[0])
    if is_preterminal(tree):
        return None if tree.label == "-NONE-" else tree
    children = tuple(c for c in map(clean_tree, tree.children) if c is not None)
    return Tree(base_label(tree.label), children) if children else None


def preterminals(tree: Tree) -> list[Tree]:
    """The (tag, (word,)) leaves of a tree, left to right."""
    if is_preterminal(tree):
        return [tree]
    return [leaf for child in tree.children for leaf in preterminals(child)]


def tree_words(tree: Tree) -> list[str]:
    return [leaf.children[0] for leaf in preterminals(tree)]


def tree_tags(tree: Tree) -> list[str]:
    return [leaf.label for leaf in preterminals(tree)]


# %%
from collections.abc import Sequence


def linearize(tree: Tree) -> list[str]:
    """The tree as tokens: "(NP" opens, ")" closes, and each word is written as its tag."""
    if is_preterminal(tree):
        return [tree.label]
    return [f"({tree.label}", *(t for child in tree.children for t in linearize(child)), ")"]


class Delinearized(NamedTuple):
    tree: Tree
    well_formed: bool  # False: delinearize had to repair the tokens


def _close(stack: list) -> bool:
    """Close the innermost open bracket into its parent; False if it was empty (dropped)."""
    label, children = stack.pop()
    if children:
        stack[-1][1].append(Tree(label, tuple(children)))
    return bool(children)


def delinearize(tokens: Sequence[str], sentence: Sequence[str]) -> Delinearized:
    """A tree over the words of sentence from predicted tokens, repaired if they form none."""
    stack, n_words, ok = [["", []]], 0, True  # stack[0] collects the roots
    for token in tokens:
        if token.startswith("(") and len(token) > 1:
            stack.append([token[1:], []])
        elif token == ")":
            ok = len(stack) > 1 and _close(stack) and ok  # a stray ")" is dropped
        elif len(stack) > 1 and n_words < len(sentence):
            stack[-1][1].append(Tree(token, (sentence[n_words],)))
            n_words += 1
        else:
            ok = False  # a leaf outside every bracket, or one word too many
    ok = ok and len(stack) == 1 and n_words == len(sentence)
    while len(stack) > 1:
        _close(stack)
    roots = stack[0][1] + [Tree("XX", (word,)) for word in sentence[n_words:]]
    if len(roots) == 1 and not is_preterminal(roots[0]):
        return Delinearized(roots[0], ok)
    return Delinearized(Tree("S", tuple(roots)), False)


# %%
PTB_SAMPLE_SPLITS = {"train": (1, 159), "dev": (160, 179), "test": (180, 199)}


def split_by_file(trees: dict[str, list[Tree]]) -> dict[str, list[Tree]]:
    """Train, dev and test trees by file number; a sentence seen in an earlier split is dropped.

    Different articles can share a sentence word for word; dropping the repeats keeps every
    sentence in one split only.
    """
    splits, seen = {}, set()
    for split, (low, high) in PTB_SAMPLE_SPLITS.items():
        chosen = [tree for name, file_trees in sorted(trees.items())
                  if low <= int(name.removeprefix("wsj_")) <= high for tree in file_trees]
        splits[split] = [t for t in chosen if tuple(tree_words(t)) not in seen]
        seen |= {tuple(tree_words(t)) for t in chosen}
    return splits


# %%
from collections import Counter

EVALB_DELETED = frozenset({"TOP", "-NONE-", ",", ":", "``", "''", "."})  # COLLINS.prm
EVALB_EQUAL = {"PRT": "ADVP"}


def labeled_spans(tree: Tree, gold_tags: Sequence[str]) -> Counter:
    """The (label, start, end) brackets evalb scores; punctuation (by gold tag) takes no place."""
    position = [0]  # position[i]: the words before word i that are not deleted
    for tag in gold_tags:
        position.append(position[-1] + (tag not in EVALB_DELETED))
    spans, n_seen = Counter(), 0

    def visit(node: Tree) -> None:
        nonlocal n_seen
        if is_preterminal(node):
            n_seen += 1
            return
        start = n_seen
        for child in node.children:
            visit(child)
        first, end = position[min(start, len(gold_tags))], position[min(n_seen, len(gold_tags))]
        if end > first and node.label not in EVALB_DELETED:
            spans[EVALB_EQUAL.get(node.label, node.label), first, end] += 1

    visit(tree)
    if n_seen != len(gold_tags):
        raise ValueError(f"tree has {n_seen} words but gold_tags has {len(gold_tags)} tags")
    return spans


class BracketScore(NamedTuple):
    """evalb's totals: brackets matched, in the gold trees, in the predicted trees."""

    matched: int
    gold: int
    predicted: int

    @property
    def precision(self) -> float:
        return self.matched / self.predicted if self.predicted else 0.0

    @property
    def recall(self) -> float:
        return self.matched / self.gold if self.gold else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0


def bracket_score(gold: Sequence[Tree], predicted: Sequence[Tree]) -> BracketScore:
    """Labeled bracket precision and recall over a corpus, evalb-style (COLLINS.prm)."""
    if len(gold) != len(predicted):
        raise ValueError(f"{len(gold)} gold trees but {len(predicted)} predicted trees")
    matched = n_gold = n_predicted = 0
    for g, p in zip(gold, predicted, strict=True):
        if tree_words(g) != tree_words(p):
            raise ValueError(f"the trees have different words: {tree_words(g)} and "
                             f"{tree_words(p)}")
        gold_spans, predicted_spans = labeled_spans(g, tree_tags(g)), labeled_spans(p, tree_tags(g))
        matched += sum((gold_spans & predicted_spans).values())
        n_gold += sum(gold_spans.values())
        n_predicted += sum(predicted_spans.values())
    return BracketScore(matched, n_gold, n_predicted)


# %%
import torch

PARSE_MAX_WORDS = 20  # sentences this long or shorter: the miniature's budget


def parser_vocabularies(trees: Sequence[Tree]) -> tuple[Vocab, Vocab]:
    """Source (tags) and target (bracket tokens and tags) vocabularies of training trees."""
    return (Vocab.build([tree_tags(t) for t in trees], min_freq=1),
            Vocab.build([linearize(t) for t in trees], min_freq=1))


def train_parser(
    trees: Sequence[Tree], *, epochs: int, N: int = 2, d_model: int = 128, h: int = 4,
    max_tokens: int = 1000, warmup: int = 200, seed: int = 0, log_every: int = 3,
) -> tuple[EncoderDecoder, Vocab, Vocab]:
    """make_model, unchanged, trained on (tags, linearized tree) pairs; prints the loss."""
    torch.manual_seed(seed)
    src_vocab, tgt_vocab = parser_vocabularies(trees)
    examples = [(src_vocab.encode(tree_tags(t)), tgt_vocab.encode(linearize(t))) for t in trees]
    model = make_model(len(src_vocab), len(tgt_vocab), N=N, d_model=d_model,
                       d_ff=4 * d_model, h=h, dropout=0.1)
    criterion = LabelSmoothing(len(tgt_vocab), padding_idx=PAD_ID, smoothing=0.1)
    loss_compute = SimpleLossCompute(model.generator, criterion)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rate(step, d_model, factor=0.5, warmup=warmup))
    for epoch in range(epochs):
        loader = multi30k_loader(examples, max_tokens=max_tokens, shuffle=True, seed=seed + epoch)
        loss, _ = run_epoch(loader, model, loss_compute, optimizer, scheduler, log_every=None)
        if (epoch + 1) % log_every == 0:
            print(f"epoch {epoch + 1:2d} | loss {loss:.3f}")
    return model, src_vocab, tgt_vocab


def parse_trees(
    model: EncoderDecoder, trees: Sequence[Tree], src_vocab: Vocab, tgt_vocab: Vocab, *,
    beam_size: int = 4, alpha: float = 0.3, batch_size: int = 64,
) -> list[Delinearized]:
    """Parse the tag sequences of trees with beam search (input length + 300 tokens at most)."""
    results = []
    for i in range(0, len(trees), batch_size):
        chunk = trees[i : i + batch_size]
        ids = [src_vocab.encode(tree_tags(t)) for t in chunk]
        outputs = beam_translate_batch(model, ids, beam_size=beam_size, alpha=alpha,
                                       extra_len=300)
        results += [delinearize(tgt_vocab.lookup_tokens(out), tree_words(t))
                    for t, out in zip(chunk, outputs, strict=True)]
    return results


# %%
from html import escape


def _layout(
    tree: Tree, depth: int, centers: Sequence[float], words: list[str]
) -> tuple[float, list[tuple]]:
    """x of tree's node and (x, depth, label, children's (x, depth)) for it and all below.

    The next leaf sits at centers[len(words)] (and appends its word to words); a parent sits
    above the middle of its children.
    """
    if is_preterminal(tree):
        x = centers[len(words)]
        words.append(tree.children[0])
        return x, [(x, depth, tree.label, [])]
    xs, nodes = [], []
    for child in tree.children:
        x, below = _layout(child, depth + 1, centers, words)
        xs.append((x, depth + 1))
        nodes += below
    x = sum(child_x for child_x, _ in xs) / len(xs)
    return x, [(x, depth, tree.label, xs), *nodes]


def trees_svg(trees: Sequence[tuple[str, Tree]], *, char: float = 7.0, dy: int = 30) -> str:
    """An SVG drawing of titled trees side by side, with the words in italics at the bottom.

    Each leaf gets a column as wide as its word or tag, about char pixels a character.
    """
    parts, left, bottom = [], 0.0, 0
    for title, tree in trees:
        widths = [char * max(len(leaf.label), len(leaf.children[0])) + 14
                  for leaf in preterminals(tree)]
        centers = [left + sum(widths[:i]) + w / 2 for i, w in enumerate(widths)]
        words: list[str] = []
        _, nodes = _layout(tree, 1, centers, words)
        deepest = max(depth for _, depth, _, _ in nodes)
        bottom = max(bottom, (deepest + 2) * dy)
        parts.append(f'<text x="{left + 4}" y="14" font-weight="bold">{escape(title)}</text>')
        for x, depth, label, child_xs in nodes:
            y = depth * dy + 10
            ends = child_xs or [(x, deepest + 1)]  # a tag's line goes down to its word
            for child_x, child_depth in ends:
                parts.append(f'<line x1="{x}" y1="{y + 4}" x2="{child_x}" '
                             f'y2="{child_depth * dy - 2}" stroke="#ccc"/>')
            parts.append(f'<text x="{x}" y="{y}" text-anchor="middle">{escape(label)}</text>')
        for x, word in zip(centers, words, strict=True):
            parts.append(f'<text x="{x}" y="{(deepest + 1) * dy + 10}" text-anchor="middle" '
                         f'font-style="italic">{escape(word)}</text>')
        left += sum(widths) + 40
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{left:.0f}" height="{bottom}" '
            f'font-family="sans-serif" font-size="12">{"".join(parts)}</svg>')


# %%
import math


def allowed_next(prefix: Sequence[str], n_words: int, steps_left: int
                 ) -> tuple[bool, bool, bool, bool]:
    """After `prefix`, what keeps a well-formed tree over n_words possible within steps_left:
    (may open a bracket, may close one, may write a leaf, may end)."""
    children: list[int] = []  # per open bracket, the children it has so far
    leaves = opened = 0
    for token in prefix:
        if token == ")":
            children.pop()
            if children:
                children[-1] += 1
        else:
            if children:
                children[-1] += 1
            if token.startswith("(") and len(token) > 1:
                children.append(0)
                opened += 1
            else:
                leaves += 1
    depth, left = len(children), n_words - leaves
    may_open = (left > 0 and (depth > 0 or not prefix) and opened < 2 * n_words
                and steps_left >= left + depth + 2)
    may_close = depth > 0 and children[-1] > 0 and (depth > 1 or left == 0)
    may_leaf = depth > 0 and left > 0 and steps_left >= left + depth
    return may_open, may_close, may_leaf, bool(prefix) and depth == 0 and left == 0


def parse_constrained(
    model: EncoderDecoder, trees: Sequence[Tree], src_vocab: Vocab, tgt_vocab: Vocab, *,
    batch_size: int = 64, extra_len: int = 300,
) -> list[Delinearized]:
    """Greedy parses of the trees' tag sequences, each step restricted by allowed_next: every
    output is a well-formed tree over the sentence's words."""
    opens = [i for i, token in enumerate(tgt_vocab.itos)
             if token.startswith("(") and len(token) > 1]
    close = tgt_vocab[")"]
    leaves = [i for i, token in enumerate(tgt_vocab.itos)
              if token not in SPECIALS and token != ")" and i not in opens]
    results = []
    model.eval()
    for first in range(0, len(trees), batch_size):
        chunk = trees[first : first + batch_size]
        tags = [tree_tags(t) for t in chunk]
        src = collate_batch([(src_vocab.encode(t), []) for t in tags], pad_id=PAD_ID)[0]
        src_mask = (src != PAD_ID).unsqueeze(-2)  # (batch, 1, n_src)
        max_len = src.size(1) + extra_len
        prefixes: list[list[str]] = [[] for _ in chunk]
        done = [False] * len(chunk)
        ys = torch.full((len(chunk), 1), BOS_ID, dtype=torch.long)
        with torch.no_grad():
            memory = model.encode(src, src_mask)  # (batch, n_src, d_model)
            while not all(done):
                out = model.decode(memory, src_mask, ys, subsequent_mask(ys.size(1)))
                log_probs = model.generator(out[:, -1])  # (batch, vocab)
                mask = torch.full_like(log_probs, -math.inf)
                for row, prefix in enumerate(prefixes):
                    if done[row]:
                        mask[row, PAD_ID] = 0.0
                        continue
                    may_open, may_close, may_leaf, may_end = allowed_next(
                        prefix, len(tags[row]), max_len - ys.size(1))
                    allowed = (opens if may_open else []) + ([close] if may_close else [])
                    allowed += (leaves if may_leaf else []) + ([EOS_ID] if may_end else [])
                    mask[row, allowed] = 0.0
                next_ids = (log_probs + mask).argmax(dim=-1)  # (batch,)
                for row, token_id in enumerate(next_ids.tolist()):
                    if not done[row]:
                        done[row] = token_id == EOS_ID
                        if not done[row]:
                            prefixes[row].append(tgt_vocab.itos[token_id])
                ys = torch.cat([ys, next_ids[:, None]], dim=1)
        results += [delinearize(prefix, tree_words(t)) for prefix, t in zip(prefixes, chunk,
                                                                         strict=True)]
    return results


# %% [markdown]
# ## From book/21_making_it_fast.ipynb


# %%
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn


class PackedLinear:
    """Several linear maps of one input as one matrix product, their weights stacked once:
    called on x, it returns each map's output, in order."""

    def __init__(self, linears: Sequence[nn.Linear]) -> None:
        self.weight = torch.cat([linear.weight for linear in linears])  # (sum of outs, in)
        self.bias = torch.cat([linear.bias for linear in linears])
        self.sizes = [linear.out_features for linear in linears]

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return F.linear(x, self.weight, self.bias).split(self.sizes, dim=-1)


class DecoderCache:
    """What the decoder keeps between steps, per layer: the keys and values of the target
    tokens so far and of the memory, one row per sentence (or hypothesis) being decoded."""

    def __init__(
        self, model: EncoderDecoder, memory: torch.Tensor, src_mask: torch.Tensor | None
    ) -> None:
        self.layers = list(model.decoder.layers)
        self.self_k: list[torch.Tensor | None] = [None] * len(self.layers)  # (rows, h, t, d_k)
        self.self_v: list[torch.Tensor | None] = [None] * len(self.layers)
        # W^Q, W^K and W^V of each self-attention side by side, concatenated once per call:
        # each step then projects the new token with one matrix product instead of three
        self.self_qkv = [PackedLinear(layer.self_attn.linears[:3]) for layer in self.layers]
        # the memory's keys, values and mask, projected once (W^K and W^V packed likewise)
        self.memory_k, self.memory_v = [], []  # (sentences, h, n_src, d_k) per layer
        for layer in self.layers:
            attn = layer.src_attn
            k, v = PackedLinear(attn.linears[1:3])(memory)
            self.memory_k.append(attn.split_heads(k))
            self.memory_v.append(attn.split_heads(v))
        self.memory_mask = None if src_mask is None else src_mask.unsqueeze(1)  # (sentences, 1,
        # 1, n_src); the cross_* lists below are these rows gathered for each row's sentence
        self.sentence = torch.arange(memory.size(0), device=memory.device)  # (rows,)
        self.cross_k, self.cross_v, self.src_mask = self.memory_k, self.memory_v, self.memory_mask

    def select(self, index: torch.Tensor) -> None:
        """Keep the rows `index` (rows_kept,), in that order: drop the finished ones (greedy)
        or follow each hypothesis to the one it extends (beam search)."""
        self.self_k = [None if t is None else t[index] for t in self.self_k]
        self.self_v = [None if t is None else t[index] for t in self.self_v]
        sentence = self.sentence[index]
        # the rows of one sentence share its memory, so a beam that only reorders hypotheses
        # within their sentences leaves the memory's rows as they are, uncopied
        if not torch.equal(sentence, self.sentence):
            self.sentence = sentence
            self.cross_k = [k[sentence] for k in self.memory_k]  # (rows, h, n_src, d_k)
            self.cross_v = [v[sentence] for v in self.memory_v]
            if self.memory_mask is not None:
                self.src_mask = self.memory_mask[sentence]  # (rows, 1, 1, n_src)


# %%
def attend_cached(
    attn: MultiHeadedAttention,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
) -> torch.Tensor:
    """attn's output (rows, 1, d_model) for one new position, whose query (rows, h, 1, d_k)
    meets keys and values (rows, h, n_k, d_k), all three already projected."""
    if getattr(attn, "fused", False):  # FastMultiHeadedAttention, below
        mask = None if mask is None else mask != 0
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask)
    else:
        out, _ = attention(query, key, value, mask=mask)  # (rows, h, 1, d_k)
    return attn.linears[-1](attn.merge_heads(out))  # (rows, 1, d_model)


def decode_step(
    model: EncoderDecoder, cache: DecoderCache, tokens: torch.Tensor, position: int
) -> torch.Tensor:
    """Log-probabilities (rows, V) of the token after `tokens` (rows,), which stand at
    `position`; their keys and values join the cache. For decoding: no dropout is applied."""
    embed, positions = model.tgt_embed
    x = embed(tokens.unsqueeze(1))  # (rows, 1, d_model)
    if isinstance(positions, PositionalEncoding):
        x = x + positions.pe[:, position : position + 1]
    elif isinstance(positions, LearnedPositionalEmbedding):
        x = x + positions.position.weight[position]
    else:
        raise ValueError("decode_step knows PositionalEncoding and LearnedPositionalEmbedding, "
                         f"not {type(positions).__name__}")
    for i, layer in enumerate(cache.layers):

        def self_attend(y: torch.Tensor, i: int = i, attn: nn.Module = layer.self_attn):
            # 1) the new token's query, key and value in one product; its key and value
            # join those of the tokens before it
            q, k, v = (attn.split_heads(t) for t in cache.self_qkv[i](y))
            if cache.self_k[i] is not None:
                k = torch.cat([cache.self_k[i], k], dim=2)  # (rows, h, t + 1, d_k)
                v = torch.cat([cache.self_v[i], v], dim=2)
            cache.self_k[i], cache.self_v[i] = k, v
            return attend_cached(attn, q, k, v, None)  # every earlier token is visible

        def cross_attend(y: torch.Tensor, i: int = i, attn: nn.Module = layer.src_attn):
            # 2) attention to the memory, whose keys and values the cache holds
            query = attn.split_heads(attn.linears[0](y))  # (rows, h, 1, d_k)
            return attend_cached(attn, query, cache.cross_k[i], cache.cross_v[i],
                                 cache.src_mask)

        x = layer.sublayer[0](x, self_attend)
        x = layer.sublayer[1](x, cross_attend)
        x = layer.sublayer[2](x, layer.feed_forward)  # (rows, 1, d_model)
    return model.generator(model.decoder.norm(x)[:, -1])  # (rows, V)


# %%
import math
from collections.abc import Sequence


def cached_greedy_decode(
    model: EncoderDecoder,
    src: torch.Tensor,
    src_mask: torch.Tensor | None,
    max_len: int,
    start_symbol: int,
    end_symbol: int | None = None,
    *,
    banned: Sequence[int] = (),
) -> torch.Tensor:
    """greedy_decode's output, computed one new position per step with a DecoderCache."""
    batch = src.size(0)
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (batch, n_src, d_model)
        cache = DecoderCache(model, memory, src_mask)
        pad = start_symbol if end_symbol is None else end_symbol
        ys = torch.full((batch, max_len), pad, dtype=torch.long, device=src.device)
        ys[:, 0] = start_symbol
        rows = torch.arange(batch, device=src.device)  # the sentence of each cache row
        tokens, length = ys[:, 0], 1
        for t in range(1, max_len):
            log_probs = decode_step(model, cache, tokens, t - 1)  # (rows, V)
            log_probs[:, list(banned)] = -math.inf
            tokens = log_probs.argmax(dim=-1)  # (rows,)
            ys[rows, t] = tokens
            length = t + 1
            if end_symbol is None:
                continue
            going = tokens != end_symbol
            if not bool(going.all()):  # drop the sentences that have just ended
                keep = going.nonzero().squeeze(1)  # (rows_kept,)
                if keep.numel() == 0:
                    break
                rows, tokens = rows[keep], tokens[keep]
                cache.select(keep)
    return ys[:, :length]


# %%
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
    use_cache: bool = False,
) -> torch.Tensor:
    """Chapter 14's greedy decoding, grown by `use_cache`: the same ids, one new position per
    step with cached_greedy_decode."""
    if use_cache:
        return cached_greedy_decode(
            model, src, src_mask, max_len, start_symbol, end_symbol, banned=banned
        )
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


# %%
import math
from collections.abc import Sequence

import torch
from torch import nn


def beam_search(
    model: nn.Module,
    src: torch.Tensor,
    src_mask: torch.Tensor,
    *,
    max_len: int | torch.Tensor,
    start_symbol: int,
    end_symbol: int,
    beam_size: int = 4,
    alpha: float = 0.6,
    banned: Sequence[int] = (),
    narrowing: bool = False,
    use_cache: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Chapter 15's beam search, grown by `use_cache`: the same outputs, one new position per
    step from a DecoderCache whose rows follow the live hypotheses."""
    limits = _beam_limits(src, src_mask, max_len, beam_size, alpha)
    if end_symbol in banned:
        raise ValueError(f"banned holds the end symbol {end_symbol}: no output could end")
    banned_ids = torch.tensor(sorted(set(banned)), dtype=torch.long, device=src.device)
    batch, k, device = src.size(0), beam_size, src.device
    steps = int(limits.max()) - 1 if batch else 0  # the most tokens any sentence may generate
    every = torch.arange(batch, device=device)
    with torch.no_grad():
        memory = model.encode(src, src_mask)  # (batch, n_src, d_model), once per sentence
        if use_cache:  # a row per sentence, then per live hypothesis
            cache = DecoderCache(model, memory, src_mask)
            parent = every.unsqueeze(-1).expand(batch, k)  # (batch, k): each slot's row
        ys = torch.full((batch, k, 1), start_symbol, dtype=torch.long, device=device)
        live = torch.full((batch, k), -math.inf, device=device)  # log P; -inf: not live
        live[:, 0] = 0.0  # one hypothesis to begin with: <s>
        n_finished = torch.zeros(batch, dtype=torch.long, device=device)
        best_ids = torch.full((batch, steps + 1), end_symbol, dtype=torch.long, device=device)
        best_ids[:, 0] = start_symbol
        best_score = torch.full((batch,), -math.inf, device=device)
        best_len = torch.zeros(batch, dtype=torch.long, device=device)
        nothing = limits == 1  # max_len 1 leaves only the empty output, with log P = 0
        best_score[nothing], live[nothing] = 0.0, -math.inf
        for t in range(1, steps + 1):  # t: tokens generated once this step is done
            rows = (live > -math.inf).nonzero(as_tuple=True)  # (sentence, slot) of live ones
            if rows[0].numel() == 0:
                break
            # 1) decode the live hypotheses of all sentences as one batch of rows
            if use_cache:  # only the last token, against the cached keys and values
                cache.select(parent[rows])  # the rows of the live hypotheses, in order
                log_probs = decode_step(model, cache, ys[rows][:, -1], t - 1)
            else:
                out = model.decode(memory[rows[0]], src_mask[rows[0]], ys[rows],
                                   subsequent_mask(t).to(device))  # (n_live, t, d_model)
                log_probs = model.generator(out[:, -1])  # (n_live, V)
            log_probs[:, banned_ids] = -math.inf
            V = log_probs.size(-1)
            # 2) every extension of every live hypothesis: log P(prefix) + log p(word | prefix)
            candidates = torch.full((batch, k, V), -math.inf, device=device)
            candidates[rows] = live[rows].unsqueeze(-1) + log_probs
            # 3) the best 2k candidates, best first: k of them may end, k others can go on
            top, index = candidates.view(batch, k * V).topk(min(2 * k, k * V), dim=-1)
            slot, word = index // V, index % V  # (batch, 2k) each
            rank = torch.arange(top.size(-1), device=device)
            at_limit = (t + 1 >= limits).unsqueeze(-1)  # (batch, 1)
            ends = (top > -math.inf) & ((word == end_symbol) | at_limit)
            goes = (top > -math.inf) & ~ends
            if narrowing:  # the best candidates fill the slots that finished ones do not hold
                kept = rank < (k - n_finished).unsqueeze(-1)  # (batch, 2k)
                finished, goes = kept & ends, kept & goes
            else:  # an ending candidate among the best k finishes; the best k others go on
                finished = ends & (rank < k)
                goes = goes & (goes.cumsum(dim=-1) <= k)
            # 4) the finished candidates: the best of them may beat the best output so far
            ys = torch.cat([ys[every.unsqueeze(-1), slot], word.unsqueeze(-1)], dim=-1)
            n_finished += finished.sum(dim=-1)
            score = torch.where(finished, top / length_penalty(t, alpha=alpha), -math.inf)
            new_best, new_pos = score.max(dim=-1)  # (batch,)
            better = new_best > best_score
            best_score = torch.where(better, new_best, best_score)
            best_len = torch.where(better, t, best_len)
            best_ids[better, : t + 1] = ys[every, new_pos][better]
            # 5) the candidates that go on fill the k slots, in the order of their scores
            pick = torch.argsort((~goes).to(torch.int8), dim=-1, stable=True)[:, :k]  # (batch, k)
            live = torch.where(goes.gather(-1, pick), top.gather(-1, pick), -math.inf)
            ys = ys[every.unsqueeze(-1), pick]  # (batch, k, t + 1)
            if use_cache:  # the cache row of the hypothesis that each slot extends
                row_of = torch.zeros(batch, k, dtype=torch.long, device=device)
                row_of[rows] = torch.arange(rows[0].numel(), device=device)
                parent = row_of[every.unsqueeze(-1), slot.gather(-1, pick)]  # (batch, k)
            # 6) a sentence stops with k finished outputs, or when no live hypothesis can
            # beat its best finished one any more
            bound = live.max(dim=-1).values / length_penalty(limits - 1, alpha=alpha)
            live[(best_score >= bound) | (n_finished >= k)] = -math.inf
    n_out = int(best_len.max()) + 1 if batch else 1
    return best_ids[:, :n_out], best_score  # (batch, n_out), (batch,)


# %%
class FastMultiHeadedAttention(MultiHeadedAttention):
    """MultiHeadedAttention through PyTorch's fused attention: the same weights and result.

    The attention weights are not stored; reading `.attn` computes the last call's weights
    (batch, h, n_q, n_k), before dropout, from the queries and keys that it keeps.
    """

    fused = True  # attend_cached takes the fused kernel too

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query (batch, n_q, d_model), key/value (batch, n_k, d_model) -> (batch, n_q, d_model)."""
        if mask is not None:
            mask = mask != 0  # boolean: True = may attend (a float mask would be added)
            if mask.dim() == 3:
                mask = mask.unsqueeze(1)  # (batch, 1, n_q or 1, n_k)
        # 1) project (one matmul for inputs that are the same tensor) and split into heads
        query, key, value = [self.split_heads(x) for x in self.project(query, key, value)]
        self._last = (query.detach(), key.detach(), mask)  # for .attn, if it is read
        # 2) softmax(Q K^T / sqrt(d_k)) V in one call, with attention dropout in training
        p = self.dropout.p if self.training else 0.0
        x = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=p)
        # 3) merge the heads, 4) W^O
        return self.linears[-1](self.merge_heads(x))  # (batch, n_q, d_model)

    def project(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
    ) -> list[torch.Tensor]:
        """W^Q query, W^K key, W^V value, each (batch, n, d_model). Self-attention passes one
        tensor three times and attention to the memory passes it twice: their projections
        become one matmul with the weights side by side, which a CPU runs faster."""
        q, k, v = self.linears[:3]
        if query is key and key is value:
            weight = torch.cat([q.weight, k.weight, v.weight])  # (3 d_model, d_model)
            bias = torch.cat([q.bias, k.bias, v.bias])
            return list(F.linear(query, weight, bias).chunk(3, dim=-1))
        if key is value:
            weight, bias = torch.cat([k.weight, v.weight]), torch.cat([k.bias, v.bias])
            return [q(query), *F.linear(key, weight, bias).chunk(2, dim=-1)]
        return [q(query), k(key), v(value)]

    @property
    def attn(self) -> torch.Tensor | None:
        """The last call's attention weights (batch, h, n_q, n_k), computed when read."""
        last = getattr(self, "_last", None)
        if last is None:
            return None
        query, key, mask = last
        return attention(query, key, key, mask=mask)[1]  # the weights (the output is unused)

    @attn.setter
    def attn(self, value: torch.Tensor | None) -> None:
        if value is not None:
            raise ValueError("FastMultiHeadedAttention computes .attn itself; only None is allowed")
        self._last = None


class FastEmbeddings(Embeddings):
    """Embeddings without the id-range check, whose min and max wait for the device."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, n) -> vectors (batch, n, d_model); nn.Embedding rejects bad ids."""
        return self.lut(x) * self.d_model**0.5


class FastLayerNorm(LayerNorm):
    """LayerNorm through PyTorch's fused kernel: chapter 2's formula in one operation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., features) -> (..., features), normalized over the last dimension."""
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


FAST_CLASSES = {MultiHeadedAttention: FastMultiHeadedAttention, Embeddings: FastEmbeddings,
                LayerNorm: FastLayerNorm}


def use_fast_path(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Switch the model's attention, embeddings and layer norms to the fast classes (or back).

    Only each module's class changes: parameters, buffers and the state dict stay as they are,
    so a checkpoint of either path loads into the other. Subclasses (chapter 19's
    KeySizeAttention) are left alone. Returns the model, changed in place.
    """
    for module in model.modules():
        for readable, fast in FAST_CLASSES.items():
            if type(module) is (readable if enabled else fast):
                module.__class__ = fast if enabled else readable
    return model


# %%
from torch import nn


def paper_dropout_only(model: nn.Module, enabled: bool = True) -> nn.Module:
    """Dropout only where the paper's §5.4 applies it: on each sublayer's output and on the
    embeddings plus positions. The attention weights and the feed-forward layer's hidden units,
    which the classic also drops, keep every value. Returns the model, changed in place."""
    if enabled:
        for module in model.modules():
            if isinstance(module, (MultiHeadedAttention, PositionwiseFeedForward)):
                module.dropout.p = 0.0
    return model


# %% [markdown]
# ## From book/22_training_on_many_devices.ipynb


# %%
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


# %%
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


# %%
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


# %%
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


# %%
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


# %%
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


# %% [markdown]
# ## From book/23_transformer_as_a_graph.ipynb


# %%
import math

import torch


def mask_to_edges(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges (key node, query node) of a (batch, n_q, n_k) mask: one per position allowed."""
    if mask.dim() != 3:
        raise ValueError(f"mask must have shape (batch, n_q, n_k), got {tuple(mask.shape)}")
    batch, n_q, n_k = mask.shape
    b, i, j = mask.bool().nonzero(as_tuple=True)  # each (E,)
    return b * n_k + j, b * n_q + i  # key nodes, query nodes


# %%
from typing import Any


def graph_chart(mask: torch.Tensor, *, title: str) -> Any:
    """A mask (1, n_q, n_k) as a graph: keys on the bottom row, queries on top, a line per edge."""
    import altair as alt

    if mask.dim() != 3 or mask.size(0) != 1:
        raise ValueError(f"mask must be one sentence's (1, n_q, n_k), got {tuple(mask.shape)}")
    key_nodes, query_nodes = mask_to_edges(mask)
    n_q, n_k = mask.shape[1:]
    pairs = zip(key_nodes.tolist(), query_nodes.tolist(), strict=True)
    edges = [{"x": k, "y": 0, "x2": q, "y2": 1} for k, q in pairs]
    nodes = [{"x": k, "y": 0, "role": "key"} for k in range(n_k)]
    nodes += [{"x": q, "y": 1, "role": "query"} for q in range(n_q)]
    scale_x = alt.Scale(domain=[-0.5, max(n_q, n_k) - 0.5])
    scale_y = alt.Scale(domain=[-0.3, 1.3])
    lines = alt.Chart(alt.Data(values=edges)).mark_rule(opacity=0.5).encode(
        x=alt.X("x:Q", scale=scale_x, axis=None), y=alt.Y("y:Q", scale=scale_y, axis=None),
        x2="x2:Q", y2="y2:Q",
    )
    points = alt.Chart(alt.Data(values=nodes)).mark_circle(size=220, opacity=1).encode(
        x=alt.X("x:Q", scale=scale_x), y=alt.Y("y:Q", scale=scale_y),
        color=alt.Color("role:N", title="node"),
        tooltip=["role:N", alt.Tooltip("x:Q", title="position")],
    )
    return (lines + points).properties(width=170, height=120, title=title)


# %%
def graph_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_nodes: torch.Tensor,
    query_nodes: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention along edges (key node -> query node): (output (n_q, h, d_v), weights (E, h)).

    `query` is (n_q, h, d_k), `key` (n_k, h, d_k), `value` (n_k, h, d_v): one row per node.
    Cost grows with the number of edges, not with n_q * n_k. A query node with no edge gets 0.
    """
    if key_nodes.shape != query_nodes.shape or key_nodes.dim() != 1:
        raise ValueError(
            f"key_nodes {tuple(key_nodes.shape)} and query_nodes {tuple(query_nodes.shape)} "
            "must be two 1-D tensors of the same length, one entry per edge"
        )
    n_q, h, d_k = query.shape
    # 1) one score per edge and head
    scores = (query[query_nodes] * key[key_nodes]).sum(-1) / math.sqrt(d_k)  # (E, h)
    # 2) softmax over the edges that arrive at the same query node
    top = torch.full((n_q, h), -math.inf, dtype=scores.dtype, device=scores.device)
    top = top.scatter_reduce(0, query_nodes[:, None].expand_as(scores), scores, "amax")
    weights = (scores - top[query_nodes]).exp()  # (E, h)
    total = torch.zeros((n_q, h), dtype=scores.dtype, device=scores.device)
    total = total.index_add(0, query_nodes, weights)  # (n_q, h)
    weights = weights / total[query_nodes]  # (E, h), sums to 1 at each query node
    # 3) a message per edge, 4) summed at its query node
    messages = weights[..., None] * value[key_nodes]  # (E, h, d_v)
    output = torch.zeros((n_q, h, value.size(-1)), dtype=value.dtype, device=value.device)
    return output.index_add(0, query_nodes, messages), weights


# %%
def packed_positions(lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sentence index and position of each node when sentences of these lengths are packed."""
    if lengths.dim() != 1 or len(lengths) == 0 or bool((lengths < 1).any()):
        raise ValueError(f"lengths must be a 1-D tensor of positive lengths, got {lengths}")
    sentence = torch.repeat_interleave(torch.arange(len(lengths)), lengths)  # (nodes,)
    starts = torch.cumsum(lengths, 0) - lengths  # (batch,) the first node of each sentence
    return sentence, torch.arange(len(sentence)) - starts[sentence]  # (nodes,), (nodes,)


def packed_edges(
    q_lengths: torch.Tensor, k_lengths: torch.Tensor, *, causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Edges (key node, query node) within each packed sentence; no node is padding.

    causal=True keeps a key only at or before the query's position (decoder self-attention).
    """
    if q_lengths.shape != k_lengths.shape:
        raise ValueError(f"{len(q_lengths)} query lengths but {len(k_lengths)} key lengths")
    q_sentence, q_position = packed_positions(q_lengths)
    k_sentence, k_position = packed_positions(k_lengths)
    allowed = q_sentence[:, None] == k_sentence[None, :]  # (q nodes, k nodes)
    if causal:
        allowed &= k_position[None, :] <= q_position[:, None]
    query_nodes, key_nodes = allowed.nonzero(as_tuple=True)  # each (E,)
    return key_nodes, query_nodes


# %%
from torch import nn


def graph_heads(
    mha: nn.Module, x_query: torch.Tensor, x_key: torch.Tensor, edges: tuple[torch.Tensor, ...]
) -> torch.Tensor:
    """A MultiHeadedAttention layer, with its own weights, on nodes: (q nodes, d_model).

    Attention dropout is not applied: this path is for a model in eval mode.
    """
    h, d_k = mha.h, mha.d_k
    query = mha.linears[0](x_query).view(-1, h, d_k)  # (q nodes, h, d_k)
    key = mha.linears[1](x_key).view(-1, h, d_k)  # (k nodes, h, d_k)
    value = mha.linears[2](x_key).view(-1, h, d_k)  # (k nodes, h, d_k)
    heads, _ = graph_attention(query, key, value, *edges)  # (q nodes, h, d_k)
    return mha.linears[3](heads.reshape(-1, h * d_k))  # (q nodes, d_model)


def graph_embed(embed: nn.Sequential, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Token embeddings (nodes, d_model) plus the sinusoidal encoding of each node's position."""
    tokens, encoding = embed
    if not isinstance(encoding, PositionalEncoding):
        raise TypeError(f"graph_embed needs the sinusoidal PositionalEncoding, got {encoding}")
    return encoding.dropout(tokens(ids[None])[0] + encoding.pe[0, positions])


def graph_encoder_layer(layer: nn.Module, x: torch.Tensor, edges: tuple) -> torch.Tensor:
    """One EncoderLayer on nodes: its own sublayers, graph attention for self-attention."""
    x = layer.sublayer[0](x, lambda x: graph_heads(layer.self_attn, x, x, edges))
    return layer.sublayer[1](x, layer.feed_forward)  # (nodes, d_model)


def graph_decoder_layer(
    layer: nn.Module, y: torch.Tensor, memory: torch.Tensor, self_edges: tuple, memory_edges: tuple
) -> torch.Tensor:
    """One DecoderLayer on target nodes, attending to the memory's nodes along memory_edges."""
    y = layer.sublayer[0](y, lambda y: graph_heads(layer.self_attn, y, y, self_edges))
    y = layer.sublayer[1](y, lambda y: graph_heads(layer.src_attn, y, memory, memory_edges))
    return layer.sublayer[2](y, layer.feed_forward)  # (target nodes, d_model)


def graph_transformer(
    model: nn.Module,
    src: torch.Tensor,
    src_lengths: torch.Tensor,
    tgt: torch.Tensor,
    tgt_lengths: torch.Tensor,
) -> torch.Tensor:
    """Decoder output (target nodes, d_model) of an EncoderDecoder on packed sentences.

    src (source nodes,) and tgt (target nodes,) hold the ids of all sentences one after the
    other, without padding; the lengths say where each sentence ends.
    """
    for name, ids, lengths in (("src", src, src_lengths), ("tgt", tgt, tgt_lengths)):
        if ids.dim() != 1 or len(ids) != int(lengths.sum()):
            raise ValueError(f"{name} must hold sum({name}_lengths) = {int(lengths.sum())} ids "
                             f"in one dimension, got shape {tuple(ids.shape)}")
    self_edges = packed_edges(src_lengths, src_lengths)
    x = graph_embed(model.src_embed, src, packed_positions(src_lengths)[1])
    for layer in model.encoder.layers:
        x = graph_encoder_layer(layer, x, self_edges)
    memory = model.encoder.norm(x)  # (source nodes, d_model)
    causal_edges = packed_edges(tgt_lengths, tgt_lengths, causal=True)
    memory_edges = packed_edges(tgt_lengths, src_lengths)
    y = graph_embed(model.tgt_embed, tgt, packed_positions(tgt_lengths)[1])
    for layer in model.decoder.layers:
        y = graph_decoder_layer(layer, y, memory, causal_edges, memory_edges)
    return model.decoder.norm(y)


# %%
def window_global_mask(n: int, r: int, n_global: int) -> torch.Tensor:
    """Position i sees positions i - r .. i + r; the first n_global positions see and are seen
    by all. (1, n, n) boolean, as the masks of the model."""
    if not 0 <= n_global <= n or r < 0:
        raise ValueError(f"need r >= 0 and 0 <= n_global <= n, got r={r}, "
                         f"n_global={n_global}, n={n}")
    positions = torch.arange(n)
    window = (positions[:, None] - positions[None, :]).abs() <= r  # (n, n)
    is_global = positions < n_global  # (n,)
    return (window | is_global[:, None] | is_global[None, :]).unsqueeze(0)  # (1, n, n)


# %%
class SparseEncoder(nn.Module):
    """An Encoder whose self-attention also obeys window_global_mask(n, r, n_global)."""

    def __init__(self, encoder: nn.Module, *, r: int, n_global: int) -> None:
        super().__init__()
        self.encoder, self.r, self.n_global = encoder, r, n_global

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """x (batch, n, d_model), padding mask (batch, 1, n) -> memory (batch, n, d_model)."""
        n = x.size(1)
        pattern = window_global_mask(n, self.r, min(self.n_global, n)).to(x.device)  # (1, n, n)
        return self.encoder(x, mask & pattern)  # (batch, n, n): padding and pattern


# %%
def sparse_sort_accuracy(sparse: bool, *, seed: int = 0, epochs: int = 30) -> float:
    """Chapter 13's sort model trained from `seed` for a fixed budget, with full or window +
    global encoder self-attention: its exact-match accuracy on 1,000 held-out sequences."""
    V = 13  # as in chapter 13: 10 digits and 3 special tokens
    test_src = random_sequences(1000, V, min_len=4, max_len=10,
                                generator=torch.Generator().manual_seed(1))
    torch.manual_seed(seed)
    model = make_model(V, V, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)
    if sparse:
        model.encoder = SparseEncoder(model.encoder, r=1, n_global=1)
    loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, padding_idx=PAD_ID))
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda=lambda step: rate(step, model_size=64, factor=0.5, warmup=100)
    )
    data, state = torch.Generator().manual_seed(seed), TrainState()
    for _ in range(epochs):
        batches = sort_batches(V, 64, 20, generator=data, exclude=sequence_set(test_src))
        _, state = run_epoch(batches, model, loss_compute, optimizer, scheduler,
                             train_state=state, log_every=None)
    test_batch = seq2seq_batch(test_src, sorted_symbols(test_src))
    return exact_matches(model, test_batch) / len(test_src)


# %% [markdown]
# ## From book/24_attention_visualization.ipynb


# %%
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn


def translation_attention(
    model: nn.Module,
    sentences: Sequence[str],
    vocab_src: Vocab,
    vocab_tgt: Vocab,
    tokenizer: Any,
    *,
    max_len: int = 72,
) -> "list[AttentionMaps]":
    """Translate German sentences greedily, then capture the attention behind each translation."""
    if isinstance(sentences, str):
        raise TypeError("sentences must be a list of strings, got one str: wrap it in a list")
    words = [tokenize(s, tokenizer)[: max_len - 2] for s in sentences]
    if not all(words):
        raise ValueError("sentences must not be empty: an empty sentence has no attention")
    src_ids = [vocab_src.encode(w) for w in words]
    out_ids = translate_batch(model, src_ids, max_len=max_len)  # without <s> and </s>
    src, tgt = collate_batch(list(zip(src_ids, out_ids, strict=True)))  # <s> ... </s>, padded
    tgt = tgt[:, :-1].masked_fill(tgt[:, :-1] == 1, 2)  # (batch, n_tgt): <s> and the output
    device = next(model.parameters()).device
    return attention_maps(
        model,
        src.to(device),
        tgt.to(device),
        src_tokens=[["<s>", *w, "</s>"] for w in words],
        tgt_tokens=[["<s>", *vocab_tgt.lookup_tokens(ids)] for ids in out_ids],
    )


# %%
import itertools
import math
from collections.abc import Sequence
from typing import Any

import torch


def attention_summary(
    maps: "Sequence[AttentionMaps]", *, kinds: Sequence[str] = ("encoder", "decoder", "cross")
) -> list[dict[str, Any]]:
    """Per kind, layer and head, over every row of every map: entropy (bits), mean |i - j|."""
    if not maps:
        raise ValueError("maps is empty: summarize at least one sentence")
    summary = []
    for kind in kinds:
        entropy, distance, rows = 0.0, 0.0, 0
        for m in maps:
            weights, _, _ = m.axes(kind)  # (N, h, rows, columns)
            i = torch.arange(weights.size(-2)).unsqueeze(1)  # (rows, 1)
            j = torch.arange(weights.size(-1)).unsqueeze(0)  # (1, columns)
            # H = -sum_j a log2 a, with 0 log 0 = 0
            entropy = entropy - torch.special.xlogy(weights, weights).sum((-2, -1)) / math.log(2)
            distance = distance + (weights * (i - j).abs()).sum((-2, -1))  # (N, h)
            rows += weights.size(-2)
        for layer, head in itertools.product(*(range(n) for n in entropy.shape)):
            summary.append({
                "kind": kind, "layer": layer + 1, "head": head + 1,
                "entropy": round(float(entropy[layer, head]) / rows, 3),
                "distance": round(float(distance[layer, head]) / rows, 3),
            })
    return summary


def attention_summary_chart(summary: Sequence[dict[str, Any]], *, cell: int = 26):
    """A layer x head grid per kind, coloured by entropy and labelled with the mean distance."""
    import altair as alt

    middle = (min(r["entropy"] for r in summary) + max(r["entropy"] for r in summary)) / 2
    base = alt.Chart(alt.Data(values=list(summary))).encode(
        x=alt.X("head:O", title="head"),
        y=alt.Y("layer:O", title="layer"),
        tooltip=[
            "kind:N", "layer:O", "head:O",
            alt.Tooltip("entropy:Q", format=".2f", title="entropy (bits)"),
            alt.Tooltip("distance:Q", format=".2f", title="mean distance"),
        ],
    )
    cells = base.mark_rect().encode(
        color=alt.Color("entropy:Q", scale=alt.Scale(scheme="viridis"), title="entropy (bits)")
    )
    labels = base.mark_text(fontSize=9).encode(
        text=alt.Text("distance:Q", format=".1f"),
        color=alt.condition(f"datum.entropy > {middle}", alt.value("black"), alt.value("white")),
    )
    kinds = list(dict.fromkeys(r["kind"] for r in summary))
    return alt.hconcat(*[
        (cells + labels)
        .transform_filter(f"datum.kind == '{kind}'")
        .properties(width=alt.Step(cell), height=alt.Step(cell),
                    title=ATTENTION_KINDS.get(kind, kind))
        for kind in kinds
    ]).resolve_scale(color="shared")


# %% [markdown]
# ## From book/25_what_came_after.ipynb


# %%
import math

import torch
from torch import nn


def rotary(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0) -> torch.Tensor:
    """Rotate each pair of features (2i, 2i+1) of x (..., n, d) by the angle position * theta_i.

    theta_i = base^(-2i/d), the frequencies of the sinusoidal encoding; positions is (n,).
    """
    d = x.size(-1)
    if d % 2:
        raise ValueError(f"rotary positions need an even feature size, got {d}")
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)  # (d/2,)
    angle = positions.to(torch.float32)[:, None] * theta  # (n, d/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., n, d/2) each
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.flatten(-2)  # (..., n, d), pairs interleaved again


class RotaryMultiHeadedAttention(MultiHeadedAttention):
    """MultiHeadedAttention whose queries and keys are rotated by their positions (RoPE)."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Self-attention on positions 0..n-1: (batch, n, d_model) -> (batch, n, d_model)."""
        if mask is not None and mask.dim() == 3:
            mask = mask.unsqueeze(1)  # (batch, 1, n, n): the same mask for every head
        query, key, value = [
            self.split_heads(linear(x))  # (batch, h, n, d_k)
            for linear, x in zip(self.linears, (query, key, value), strict=False)
        ]
        positions = torch.arange(query.size(2), device=query.device)
        query, key = rotary(query, positions), rotary(key, positions)  # the only change
        x, weights = attention(query, key, value, mask=mask, dropout=self.dropout)
        self.attn = weights.detach()
        return self.linears[-1](self.merge_heads(x))


# %%
class LanguageModel(nn.Module):
    """A decoder-only Transformer: embed, N causal self-attention layers, next-token log-probs."""

    def __init__(self, embed: nn.Module, layers: nn.Module, generator: nn.Module) -> None:
        super().__init__()
        self.embed, self.layers, self.generator = embed, layers, generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Token ids (batch, n) -> log-probabilities (batch, n, vocab) of each next token."""
        mask = subsequent_mask(x.size(1)).to(x.device)  # (1, n, n): no peeking ahead
        return self.generator(self.layers(self.embed(x), mask))


def make_language_model(
    vocab: int,
    N: int = 2,
    d_model: int = 128,
    d_ff: int = 512,
    h: int = 4,
    dropout: float = 0.1,
    *,
    positions: str = "sinusoidal",
    tie_embeddings: bool = True,
) -> LanguageModel:
    """The book's encoder stack with a causal mask, which is a decoder without cross-attention.

    positions: "sinusoidal" (added to the embeddings, §3.5) or "rotary" (inside attention).
    tie_embeddings: the output layer reuses the embedding matrix (§3.4), as GPT-2 does.
    """
    if positions not in ("sinusoidal", "rotary"):
        raise ValueError(f"positions must be 'sinusoidal' or 'rotary', got {positions!r}")
    if positions == "rotary":
        attn = RotaryMultiHeadedAttention(h, d_model, dropout=dropout)
        embed = nn.Sequential(Embeddings(d_model, vocab), nn.Dropout(dropout))
    else:
        attn = MultiHeadedAttention(h, d_model, dropout=dropout)
        embed = nn.Sequential(Embeddings(d_model, vocab), PositionalEncoding(d_model, dropout))
    ff = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
    layers = Encoder(EncoderLayer(d_model, attn, ff, dropout), N)
    model = LanguageModel(embed, layers, Generator(d_model, vocab))
    for p in model.parameters():
        if p.dim() > 1:
            nn.init.xavier_uniform_(p)
    if tie_embeddings:
        model.generator.proj.weight = embed[0].lut.weight  # one (vocab, d_model) matrix
    return model


# %%
import torch.nn.functional as F


def lm_batches(
    sentences: list[list[int]], *, batch_size: int, generator: torch.Generator | None = None
) -> list[torch.Tensor]:
    """`<s> ids </s>` rows, batched with sentences of similar length, in a shuffled order."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    batches = []
    for start in range(0, len(order), batch_size):
        rows = [[BOS_ID, *sentences[i], EOS_ID] for i in order[start : start + batch_size]]
        batch = torch.full((len(rows), max(map(len, rows))), PAD_ID, dtype=torch.long)
        for r, row in enumerate(rows):
            batch[r, : len(row)] = torch.tensor(row)
        batches.append(batch)  # (batch_size, n)
    return [batches[i] for i in torch.randperm(len(batches), generator=generator).tolist()]


def lm_nll(model: nn.Module, batch: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of every real next token of `batch`, and their count."""
    log_probs = model(batch[:, :-1])  # (batch, n - 1, vocab): predictions for tokens 1..n-1
    target = batch[:, 1:]  # (batch, n - 1)
    nll = F.nll_loss(log_probs.flatten(0, 1), target.flatten(), ignore_index=PAD_ID,
                     reduction="sum")
    return nll, int((target != PAD_ID).sum())


def perplexity(model: nn.Module, batches: list[torch.Tensor]) -> float:
    """exp(mean NLL per token) over all batches: the model's average branching factor."""
    model.eval()
    total, tokens = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            nll, n = lm_nll(model, batch)
            total, tokens = total + nll.item(), tokens + n
    return math.exp(total / tokens)


def cosine_rate(step: int, *, warmup: int, total: int, floor: float = 0.1) -> float:
    """The learning rate at `step` as a fraction of the peak: a linear rise over `warmup`
    steps, then half a cosine down to `floor` at step `total`."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def train_language_model(
    model: nn.Module,
    batches: list[torch.Tensor],
    *,
    epochs: int,
    lr: float = 5e-3,
    warmup: int = 200,
    weight_decay: float = 0.1,
    clip: float = 1.0,
) -> list[float]:
    """AdamW, warm-up and cosine decay, gradients clipped to norm `clip`; each epoch's mean
    training loss. Weight decay pulls on the matrices only, not on biases and norm gains."""
    matrices = [p for p in model.parameters() if p.dim() > 1]
    others = [p for p in model.parameters() if p.dim() <= 1]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": weight_decay}, {"params": others,
                                                              "weight_decay": 0.0}],
        lr=lr, betas=(0.9, 0.95),
    )
    total = epochs * len(batches)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: cosine_rate(step, warmup=warmup, total=total)
    )
    losses = []
    for _ in range(epochs):
        model.train()
        loss_sum, tokens = 0.0, 0
        for batch in batches:
            nll, n = lm_nll(model, batch)
            (nll / n).backward()
            nn.utils.clip_grad_norm_(model.parameters(), clip)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
            loss_sum, tokens = loss_sum + nll.item(), tokens + n
        losses.append(loss_sum / tokens)
    return losses


def multi30k_captions() -> tuple[Vocab, list[list[int]], list[list[int]]]:
    """The English captions of Multi30k's train and val splits as ids, with a vocabulary of
    the training words seen at least twice."""
    _, tokenizer_en = load_tokenizers()
    train = [tokenize(en, tokenizer_en) for _, en in load_multi30k("train")]
    val = [tokenize(en, tokenizer_en) for _, en in load_multi30k("val")]
    vocab = Vocab.build(train, min_freq=2)
    return vocab, [vocab.encode(t) for t in train], [vocab.encode(t) for t in val]


def caption_language_model(
    data: tuple[Vocab, list[list[int]], list[list[int]]],
    *,
    seed: int,
    epochs: int = 2,
    **options,
) -> tuple[LanguageModel, float]:
    """make_language_model(**options) trained on the captions from `seed` (its initial
    weights and its batch order) with batches of 64, and its validation perplexity."""
    vocab, train_ids, val_ids = data
    batches = lm_batches(train_ids, batch_size=64,
                         generator=torch.Generator().manual_seed(seed))
    torch.manual_seed(seed)
    model = make_language_model(len(vocab), **options)
    train_language_model(model, batches, epochs=epochs)
    return model, perplexity(model, lm_batches(val_ids, batch_size=128))


# %%
def lm_step(
    model: LanguageModel,
    cache: list[tuple[torch.Tensor, torch.Tensor]],
    tokens: torch.Tensor,
    position: int,
) -> torch.Tensor:
    """Log-probabilities (rows, vocab) of the token after `tokens` (rows,), which stand at
    `position`; `cache` holds each layer's keys and values so far and gains this token's."""
    embed, positions = model.embed
    x = embed(tokens[:, None])  # (rows, 1, d_model)
    if isinstance(positions, PositionalEncoding):
        x = x + positions.pe[:, position : position + 1]
    where = torch.tensor([position], device=tokens.device)
    for i, layer in enumerate(model.layers.layers):

        def self_attend(y: torch.Tensor, i: int = i, attn: nn.Module = layer.self_attn):
            q, k, v = (attn.split_heads(linear(y)) for linear in attn.linears[:3])  # (rows,
            # h, 1, d_k) each
            if isinstance(attn, RotaryMultiHeadedAttention):
                q, k = rotary(q, where), rotary(k, where)
            if i < len(cache):  # the keys and values of the tokens before this one
                k = torch.cat([cache[i][0], k], dim=2)  # (rows, h, position + 1, d_k)
                v = torch.cat([cache[i][1], v], dim=2)
                cache[i] = (k, v)
            else:
                cache.append((k, v))
            out, _ = attention(q, k, v)  # no mask: every cached token comes before this one
            return attn.linears[-1](attn.merge_heads(out))

        x = layer.sublayer[0](x, self_attend)
        x = layer.sublayer[1](x, layer.feed_forward)
    return model.generator(model.layers.norm(x)[:, -1])  # (rows, vocab)


def keep_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """logits (vocab,) with -inf outside the nucleus: the fewest likeliest tokens whose
    probabilities add up to at least top_p."""
    probs, order = logits.softmax(-1).sort(descending=True)
    likelier = probs.cumsum(-1) - probs  # the mass of the tokens ranked above each one
    outside = torch.zeros_like(logits, dtype=torch.bool)
    outside[order] = likelier >= top_p
    return logits.masked_fill(outside, -math.inf)


def sample(
    model: LanguageModel,
    prompt: list[int],
    *,
    max_len: int = 30,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> list[int]:
    """Continue `prompt` (ids, starting with <s>) one sampled token at a time, until </s>.

    temperature < 1 sharpens the distribution, > 1 flattens it; top_k keeps the k likeliest
    tokens, top_p the nucleus. Each step runs one position through the model (lm_step).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be at least 1 or None, got {top_k}")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")
    if not prompt:
        raise ValueError("the prompt must hold at least one id (<s>)")
    model.eval()
    device = next(model.parameters()).device
    ids, cache = list(prompt), []
    with torch.no_grad():
        for position, token in enumerate(ids[:-1]):  # the prompt's keys and values
            lm_step(model, cache, torch.tensor([token], device=device), position)
        while len(ids) < max_len and ids[-1] != EOS_ID:
            token = torch.tensor([ids[-1]], device=device)
            log_probs = lm_step(model, cache, token, len(ids) - 1)[0]  # (vocab,)
            logits = log_probs / temperature
            if top_k is not None:
                kth = logits.topk(min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, -math.inf)
            if top_p is not None:
                logits = keep_top_p(logits, top_p)
            ids.append(int(torch.multinomial(logits.softmax(-1), 1, generator=generator)))
    return ids


# %% [markdown]
# ## From book/26_universal_transformer.ipynb


# %%
from collections.abc import Callable

import torch
from torch import nn


class AdaptiveComputationTime(nn.Module):
    """Apply one shared layer up to max_steps times per position, halting adaptively (ACT).

    At each step a halting unit gives every position a probability of stopping now; a position
    stops once its probabilities add up to more than 1 - eps, and its last step gets the
    remainder instead. The output is the steps' states weighted by these numbers, which sum
    to 1 per position. A halted position is no longer updated.
    """

    def __init__(
        self, d_model: int, max_steps: int, *, eps: float = 0.01, halting_bias: float = -1.0
    ) -> None:
        super().__init__()
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}")
        self.halt = nn.Linear(d_model, 1)
        # a negative bias starts every position with a small halting probability: it ponders
        nn.init.constant_(self.halt.bias, halting_bias)
        self.max_steps, self.threshold = max_steps, 1.0 - eps
        self.signal = PositionalEncoding(d_model, dropout=0.0, max_len=max(max_steps, 512))

    def forward(
        self, x: torch.Tensor, step: Callable[[torch.Tensor], torch.Tensor], real: torch.Tensor
    ) -> tuple[torch.Tensor, dict]:
        """x (batch, n, d_model); step(state) -> new state; real (batch, n) marks non-padding.

        Returns the weighted state (batch, n, d_model) and a record with the number of steps
        of each position, its halting weights (batch, n, max_steps) and its ponder cost.
        """
        batch, n, _ = x.shape
        halted = ~real  # padding never runs
        total = torch.zeros(batch, n, device=x.device)  # sum of halting probabilities so far
        remainder = torch.zeros(batch, n, device=x.device)
        steps = torch.zeros(batch, n, device=x.device)
        weights, output = [], torch.zeros_like(x)
        timestep = self.signal.pe[0, : self.max_steps]  # (max_steps, d_model)
        for t in range(self.max_steps):
            # 1) the position and timestep signal, then the halting probability
            state = self.signal(x) + timestep[t]  # (batch, n, d_model)
            p = torch.sigmoid(self.halt(state)).squeeze(-1)  # (batch, n)
            running = ~halted
            # 2) who stops now: their sum would pass the threshold, or this is the last step
            stops = running & ((total + p > self.threshold) | (t == self.max_steps - 1))
            goes_on = running & ~stops
            # 3) weights: p while going on, the remainder 1 - total at the halting step
            remainder = torch.where(stops, 1.0 - total, remainder)
            w = torch.where(goes_on, p, torch.where(stops, remainder, torch.zeros_like(p)))
            total = total + w
            steps = steps + running.float()
            # 4) one step of the shared layer; halted positions keep their state
            new = step(state)
            x = torch.where(running[..., None], new, x)
            output = output + w[..., None] * new
            weights.append(w)
            halted = halted | stops
            if bool(halted.all()):
                break
        unused = [torch.zeros_like(p)] * (self.max_steps - len(weights))  # steps never run
        weights = torch.stack(weights + unused, dim=-1)  # (batch, n, max_steps)
        ponder = ((steps + remainder) * real).sum() / real.sum()  # N(t) + R(t), Graves 2016
        return output, {"steps": steps, "weights": weights, "ponder": ponder}


# %%
from copy import deepcopy


class UniversalTransformer(nn.Module):
    """One shared encoder layer and one shared decoder layer, each repeated with ACT.

    Same interface as EncoderDecoder (encode, decode, generator), so greedy_decode works;
    the last call's ACT records are kept in .act["encoder"] and .act["decoder"].
    """

    def __init__(
        self, V: int, d_model: int = 64, d_ff: int = 128, h: int = 4, *,
        max_steps: int = 4, dropout: float = 0.0, pad: int = PAD_ID,
    ) -> None:
        super().__init__()
        attn = MultiHeadedAttention(h, d_model, dropout=dropout)
        ff = PositionwiseFeedForward(d_model, d_ff, dropout=dropout)
        c = deepcopy
        self.encoder_layer = EncoderLayer(d_model, c(attn), c(ff), dropout)
        self.decoder_layer = DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout)
        self.encoder_act = AdaptiveComputationTime(d_model, max_steps)
        self.decoder_act = AdaptiveComputationTime(d_model, max_steps)
        self.encoder_norm, self.decoder_norm = LayerNorm(d_model), LayerNorm(d_model)
        self.src_embed, self.tgt_embed = Embeddings(d_model, V), Embeddings(d_model, V)
        self.generator = Generator(d_model, V)
        self.pad, self.act = pad, {}
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """Memory (batch, n_src, d_model): the shared encoder layer, as often as ACT says."""
        x, self.act["encoder"] = self.encoder_act(
            self.src_embed(src), lambda s: self.encoder_layer(s, src_mask), src != self.pad
        )
        return self.encoder_norm(x)

    def decode(
        self, memory: torch.Tensor, src_mask: torch.Tensor, tgt: torch.Tensor,
        tgt_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model), the shared decoder layer repeated by ACT."""
        y, self.act["decoder"] = self.decoder_act(
            self.tgt_embed(tgt),
            lambda s: self.decoder_layer(s, memory, src_mask, tgt_mask),
            tgt != self.pad,
        )
        return self.decoder_norm(y)

    def forward(
        self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor, tgt_mask: torch.Tensor
    ) -> torch.Tensor:
        """Decoder output (batch, n_tgt, d_model), as EncoderDecoder.forward."""
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)

    def ponder_cost(self) -> torch.Tensor:
        """The ponder costs of the last forward pass, encoder plus decoder."""
        return self.act["encoder"]["ponder"] + self.act["decoder"]["ponder"]


# %%
import torch.nn.functional as F


def token_accuracy(model: nn.Module, batch: Batch) -> float:
    """The fraction of target tokens (with `</s>`) that greedy decoding gets right in place."""
    model.eval()
    with torch.no_grad():
        ys = greedy_decode(model, batch.src, batch.src_mask, batch.tgt_y.size(1) + 1, 0)
    real = batch.tgt_y != 2  # (batch, n_tgt)
    guess = ys[:, 1:]  # (batch, <= n_tgt)
    hits = (guess == batch.tgt_y[:, : guess.size(1)]) & real[:, : guess.size(1)]
    return hits.sum().item() / real.sum().item()


def train_sorter(
    model: nn.Module, *, V: int, epochs: int, ponder_weight: float = 0.0,
    exclude: set | None = None, record_every: int = 10, probe: Batch | None = None,
    seed: int = 0,
) -> list[dict]:
    """Chapter 13's schedule; adds ponder_weight * ponder cost when the model has one.

    Every record_every epochs, the mean steps per real position of encoder and decoder on the
    probe batch (teacher-forced), for models that ponder.
    """
    torch.manual_seed(seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: rate(step, model_size=64, factor=0.5, warmup=100)
    )
    data, history = torch.Generator().manual_seed(seed), []
    for epoch in range(1, epochs + 1):
        model.train()
        for batch in sort_batches(V, 64, 20, generator=data, exclude=exclude):
            out = model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
            loss = F.nll_loss(model.generator(out).flatten(0, 1), batch.tgt_y.flatten(),
                              ignore_index=2)
            if ponder_weight:
                loss = loss + ponder_weight * model.ponder_cost()
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            scheduler.step()
        if probe is not None and epoch % record_every == 0 and hasattr(model, "act"):
            model.eval()
            with torch.no_grad():
                model(probe.src, probe.tgt, probe.src_mask, probe.tgt_mask)
            for side, ids in (("encoder", probe.src), ("decoder", probe.tgt)):
                steps = model.act[side]["steps"][ids != 2]
                history.append({"epoch": epoch, "stack": side, "mean steps": steps.mean().item()})
    return history


# %%
import time

UNIVERSAL_SORT_VARIANTS = {  # name -> (steps of the shared layers, ponder weight tau)
    "universal, tau = 1e-4": (4, 1e-4),
    "universal, tau = 1e-2": (4, 1e-2),
    "universal, 4 fixed steps": (4, None),  # halting switched off: every position takes 4
    "universal, 1 step": (1, 0.0),  # one shared layer per stack, applied once
    "chapter 13 Transformer": None,  # two different layers per stack
}


def universal_sort_run(
    variant: str, *, seed: int = 0, epochs: int = 60, probe: Batch | None = None
) -> dict:
    """Train one of UNIVERSAL_SORT_VARIANTS from `seed` on chapter 13's task: the model, its
    steps history on `probe`, and its size, accuracies, mean ACT steps and training time on
    the 1,000 held-out test sequences."""
    if variant not in UNIVERSAL_SORT_VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of "
                         f"{', '.join(UNIVERSAL_SORT_VARIANTS)}")
    V = 13  # chapter 13's 10 digits and 3 special tokens
    test_src = random_sequences(1000, V, min_len=4, max_len=10,
                                generator=torch.Generator().manual_seed(1))
    test_batch = seq2seq_batch(test_src, sorted_symbols(test_src))
    torch.manual_seed(seed)
    setting, tau = UNIVERSAL_SORT_VARIANTS[variant], 0.0
    if setting is None:
        model = make_model(V, V, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)
    else:
        max_steps, tau = setting
        model = UniversalTransformer(V, d_model=64, d_ff=128, h=4, max_steps=max_steps)
        if tau is None:  # halting probabilities of about 1e-13, frozen: no position stops early
            for act in (model.encoder_act, model.decoder_act):
                nn.init.constant_(act.halt.bias, -30.0)
                act.halt.requires_grad_(False)
            tau = 0.0
    start = time.perf_counter()
    history = train_sorter(model, V=V, epochs=epochs, ponder_weight=tau,
                           exclude=sequence_set(test_src), probe=probe, seed=seed)
    result = {"model": model, "history": history, "seconds": time.perf_counter() - start,
              "parameters": sum(p.numel() for p in model.parameters()),
              "token accuracy": token_accuracy(model, test_batch),
              "exact": exact_matches(model, test_batch) / len(test_src)}
    if hasattr(model, "act"):  # mean steps per real position, read with teacher forcing
        with torch.no_grad():
            model(test_batch.src, test_batch.tgt, test_batch.src_mask, test_batch.tgt_mask)
        for side, ids in (("encoder", test_batch.src), ("decoder", test_batch.tgt)):
            result[f"{side} steps"] = model.act[side]["steps"][ids != 2].mean().item()
    return result


# %%
from typing import Any


def steps_chart(cells: list[dict], *, title: str = "ACT steps per source position") -> Any:
    """One row per sequence, one cell per position labelled with its digit, coloured by steps."""
    import altair as alt

    if not cells:
        raise ValueError("cells is empty: nothing to draw")
    base = alt.Chart(alt.Data(values=cells)).encode(
        x=alt.X("position:O", title="source position"),
        y=alt.Y("sequence:N", title="test sequence", sort=None),
    )
    squares = base.mark_rect().encode(
        color=alt.Color("steps:O", title="steps", scale=alt.Scale(scheme="blues")),
        tooltip=["sequence:N", "position:O", "digit:N", "steps:O"],
    )
    return (squares + base.mark_text().encode(text="digit:N")).properties(title=title)


# %% [markdown]
# ## From book/appendix_infrastructure.ipynb


# %%
import json
import sys
import uuid

VEGA_LITE_MIME = "application/vnd.vegalite.v5+json"
VEGA_LITE_V5_SCHEMA = "https://vega.github.io/schema/vega-lite/v5.json"


def book_chart_bundle(spec: dict, **metadata) -> dict[str, dict | str]:
    """The stored form of a chart: a Vega-Lite spec that notebook front ends draw themselves."""
    title = spec.get("title", "untitled")
    text = title.get("text", "untitled") if isinstance(title, dict) else title
    return {
        VEGA_LITE_MIME: {**spec, "$schema": VEGA_LITE_V5_SCHEMA},
        "text/plain": f"<altair chart: {text}>",
    }


def book_chart_html(spec: dict) -> str:
    """The built book's form of a chart: a container and a call to the page's own vegaEmbed."""
    chart_id = f"vega-chart-{uuid.uuid4().hex}"
    spec_json = json.dumps(spec, sort_keys=True).replace("</", "<\\/")  # never end the script
    options = '{"actions": false}'
    script = f'vegaEmbed(document.getElementById("{chart_id}"), {spec_json}, {options});'
    return f'<div id="{chart_id}" class="book-chart"></div>\n<script>\n{script}\n</script>'


def enable_book_charts() -> None:
    """Show altair charts as the bundle above; in Colab, as altair's HTML that Colab draws."""
    import altair as alt

    if "google.colab" in sys.modules:
        alt.renderers.enable("colab")
        return
    alt.renderers.register("book", book_chart_bundle)
    alt.renderers.enable("book")


# %%
from collections.abc import Mapping, Sequence
from typing import Any


def chart_rows(rows: Any, fields: Sequence[str | None]) -> list[dict[str, Any]]:
    """Rows (a list of dicts or a DataFrame) as a list of dicts that hold every named field."""
    records = rows.to_dict("records") if hasattr(rows, "to_dict") else list(rows)
    if not records:
        raise ValueError("rows is empty: there is nothing to draw")
    names = [field.split(":")[0] for field in fields if field is not None]
    missing = [name for name in names if name not in records[0]]
    if missing:
        raise ValueError(f"fields {missing} are not in the rows, which have {list(records[0])}")
    return records


def axis_title(title: str | None) -> Any:
    """An axis title for altair: None keeps the field's name, "" hides the title."""
    import altair as alt

    if title == "":
        return None
    return alt.Undefined if title is None else title


def chart_scale(options: Mapping[str, Any] | None) -> Any:
    """An altair scale from its options, or altair's default scale for none."""
    import altair as alt

    return alt.Scale(**options) if options else alt.Undefined


def chart_tooltip(fields: Sequence[str | None], formats: Mapping[str, str] | None) -> list:
    """A tooltip entry per field, formatted where `formats` names a d3 format for it."""
    import altair as alt

    formats = formats or {}
    return [
        alt.Tooltip(field, format=formats[field.split(":")[0]])
        if field.split(":")[0] in formats else field
        for field in dict.fromkeys(f for f in fields if f is not None)
    ]


def line_chart(
    rows: Any,
    *,
    x: str,
    y: str,
    title: str,
    color: str | None = None,
    column: str | None = None,
    x_title: str | None = None,
    y_title: str | None = None,
    color_title: str | None = None,
    x_scale: Mapping[str, Any] | None = None,
    y_scale: Mapping[str, Any] | None = None,
    y_format: str | None = None,
    formats: Mapping[str, str] | None = None,
    extra_tooltip: Sequence[str] = (),
    points: bool = True,
    dash: bool = False,
    line_color: str | None = None,
    width: int = 480,
    height: int = 260,
) -> Any:
    """Curves of y against x, one per value of `color`, in one panel per value of `column`.

    An axis title of None keeps the field's name and "" hides it. `x_scale` and `y_scale` are
    altair scale options (`{"type": "log", "base": 2}`); `y_format` formats the y axis; `formats`
    maps fields to the d3 format their tooltip shows.
    """
    import altair as alt

    records = chart_rows(rows, [x, y, color, column, *extra_tooltip])
    encoding = {
        "x": alt.X(x, title=axis_title(x_title), scale=chart_scale(x_scale)),
        "y": alt.Y(y, title=axis_title(y_title), scale=chart_scale(y_scale),
                   axis=alt.Axis(format=y_format) if y_format else alt.Undefined),
        "tooltip": chart_tooltip([color, column, x, y, *extra_tooltip], formats),
    }
    if color is not None:
        encoding["color"] = alt.Color(color, title=color_title, sort=None)
        if dash:
            encoding["strokeDash"] = alt.StrokeDash(color, title=color_title, sort=None)
    if column is not None:
        encoding["column"] = alt.Column(column, title=None, sort=None)
    mark = {"point": True} if points else {}
    if line_color is not None:
        mark["color"] = line_color
    return (
        alt.Chart(alt.Data(values=records))
        .mark_line(**mark)
        .encode(**encoding)
        .properties(width=width, height=height, title=title)
    )


def bar_chart(
    rows: Any,
    *,
    x: str,
    y: str,
    title: str,
    x_title: str | None = None,
    y_title: str | None = None,
    value_format: str | None = None,
    value_domain: Sequence[float] | None = None,
    formats: Mapping[str, str] | None = None,
    extra_tooltip: Sequence[str] = (),
    width: int = 480,
    height: int = 200,
) -> Any:
    """One bar per category: the quantitative field (":Q") of x and y is the bar's length.

    Axis titles as in `line_chart`; `value_format` formats the value axis (`"%"`),
    `value_domain` fixes its range.
    """
    import altair as alt

    quantitative = [field for field in (x, y) if field.endswith(":Q")]
    if len(quantitative) != 1:
        raise ValueError(f"exactly one of x={x!r} and y={y!r} must be quantitative (':Q')")
    records = chart_rows(rows, [x, y, *extra_tooltip])
    channels = {}
    for name, field, title_text in (("x", x, x_title), ("y", y, y_title)):
        options = {"title": axis_title(title_text)}
        if field in quantitative:
            options["axis"] = alt.Axis(format=value_format) if value_format else alt.Undefined
            domain = {"domain": list(value_domain)} if value_domain else None
            options["scale"] = chart_scale(domain)
        else:
            options["sort"] = None
        channels[name] = (alt.X if name == "x" else alt.Y)(field, **options)
    category = y if x in quantitative else x
    return (
        alt.Chart(alt.Data(values=records))
        .mark_bar()
        .encode(**channels, tooltip=chart_tooltip([category, *extra_tooltip, *quantitative],
                                                  formats))
        .properties(width=width, height=height, title=title)
    )


def mask_chart(
    mask: Any,
    *,
    title: str,
    labels: Sequence[str] | None = None,
    x_title: str = "key position j",
    y_title: str = "query position i",
    size: int = 300,
) -> Any:
    """A boolean mask (n_q, n_k), or (1, n_q, n_k), as a grid: blue where a query may attend.

    `labels` names the positions (tokens, say) instead of numbering them.
    """
    import altair as alt

    if mask.dim() == 3 and mask.size(0) == 1:
        mask = mask[0]
    if mask.dim() != 2:
        raise ValueError(f"mask must be (n_q, n_k) or (1, n_q, n_k), got {tuple(mask.shape)}")
    n_q, n_k = mask.shape
    if labels is not None and len(labels) != max(n_q, n_k):
        raise ValueError(f"labels has {len(labels)} names for a mask of shape {(n_q, n_k)}")
    names = list(labels) if labels is not None else [str(i) for i in range(max(n_q, n_k))]
    cells = [
        {"query": names[i], "key": names[j], "may attend": bool(mask[i, j])}
        for i in range(n_q)
        for j in range(n_k)
    ]
    colors = alt.Scale(domain=[True, False], range=["#4c78a8", "#e8e8e8"])
    return (
        alt.Chart(alt.Data(values=cells))
        .mark_rect(stroke="white")
        .encode(
            x=alt.X("key:N", sort=names, title=x_title),
            y=alt.Y("query:N", sort=names, title=y_title),
            color=alt.Color("may attend:N", scale=colors),
            tooltip=["query:N", "key:N", "may attend:N"],
        )
        .properties(width=size, height=size, title=title)
    )


# %%
import math
from typing import Any

import torch


def scaling_chart(scaling: Any, *, n_keys: int) -> Any:
    """Spread of the scores, largest weight and entropy against d_k, scaled and unscaled."""
    import altair as alt

    log2 = alt.Scale(type="log", base=2)
    common = alt.Chart(scaling).encode(
        x=alt.X("d_k:Q", scale=log2, axis=alt.Axis(values=[1, 8, 64, 512])),
        color=alt.Color("scores:N", title=None, legend=alt.Legend(orient="bottom")),
        tooltip=["d_k", "scores", "std of scores", "mean max weight", "mean entropy (nats)"],
    )
    lines = common.mark_line(point=True).properties(width=150, height=160)
    spread = lines.encode(y=alt.Y("std of scores:Q", scale=alt.Scale(type="log")))
    peak = lines.encode(y=alt.Y("mean max weight:Q", scale=alt.Scale(domain=[0, 1])))
    entropy = lines.encode(
        y=alt.Y("mean entropy (nats):Q", scale=alt.Scale(domain=[0, math.log(n_keys)]))
    )
    return (spread.properties(title="spread of the scores")
            | peak.properties(title="largest softmax weight")
            | entropy.properties(title="entropy of the weights"))


def weights_heatmap(weights: torch.Tensor, *, title: str) -> Any:
    """One map of attention weights (n_q, n_k): a cell per query and key, darker for more."""
    import altair as alt

    if weights.dim() != 2:
        raise ValueError(f"weights must be (n_q, n_k), got shape {tuple(weights.shape)}")
    cells = [{"query": i, "key": j, "weight": round(w, 3)}
             for i, row in enumerate(weights.tolist()) for j, w in enumerate(row)]
    return alt.Chart(alt.Data(values=cells)).mark_rect().encode(
        x="key:O", y="query:O", color=alt.Color("weight:Q", scale=alt.Scale(scheme="blues")),
        tooltip=["query:O", "key:O", "weight:Q"],
    ).properties(width=220, height=220, title=title)


def encoding_heatmap(pe: torch.Tensor, *, title: str) -> Any:
    """A positional encoding table (positions, d_model) as a grid, red below 0, blue above."""
    import altair as alt

    cells = [{"position": pos, "dimension": dim, "value": round(value, 2)}
             for pos, row in enumerate(pe.tolist()) for dim, value in enumerate(row)]
    ticks = [alt.Axis(values=list(range(0, size, 8))) for size in pe.shape]  # every 8th label
    return alt.Chart(alt.Data(values=cells)).mark_rect().encode(
        x=alt.X("dimension:O", axis=ticks[1]), y=alt.Y("position:O", axis=ticks[0]),
        color=alt.Color("value:Q", scale=alt.Scale(scheme="redblue", domain=[-1, 1])),
        tooltip=["position:O", "dimension:O", "value:Q"],
    ).properties(width=384, height=240, title=title)


# %%
from typing import Any

import torch


def check_positive_int(value: int, name: str, meaning: str) -> None:
    """Raise TypeError unless `value` is an int, ValueError unless it is at least 1."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int ({meaning}), got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be at least 1 ({meaning}), got {value}")


def _check_mask(mask: torch.Tensor, scores: torch.Tensor) -> None:
    """Raise ValueError unless `mask` broadcasts to the scores without enlarging them."""
    try:
        fits = torch.broadcast_shapes(mask.shape, scores.shape) == scores.shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the "
                         f"attention scores of shape {tuple(scores.shape)} (batch, h, n_q, n_k)")


def check_token_ids(x: torch.Tensor, vocab: int) -> None:
    """Raise TypeError for ids that are not integers, ValueError for one outside [0, vocab)."""
    if x.is_floating_point() or x.is_complex():
        raise TypeError(f"token ids must be an integer tensor, got dtype {x.dtype}")
    if x.numel() and (x.min() < 0 or x.max() >= vocab):
        bad = x[(x < 0) | (x >= vocab)][0].item()
        raise ValueError(f"token id {bad} is outside the vocabulary [0, {vocab})")


def is_id_matrix(x: Any) -> bool:
    """Whether `x` is a (batch, n) tensor of integer token ids."""
    return isinstance(x, torch.Tensor) and x.dim() == 2 and not x.is_floating_point()


def check_batch(src: torch.Tensor, tgt: torch.Tensor | None) -> None:
    """Raise unless src is (batch, n_src) ids and tgt, if given, (batch, n_tgt >= 2) ids."""
    if not is_id_matrix(src):
        raise TypeError("src must be an integer tensor of shape (batch, n_src)")
    if tgt is None:
        return
    if not is_id_matrix(tgt):
        raise TypeError("tgt must be an integer tensor of shape (batch, n_tgt)")
    if tgt.size(0) != src.size(0) or tgt.size(1) < 2:
        raise ValueError(f"tgt must have shape ({src.size(0)}, n_tgt) with n_tgt >= 2, "
                         f"got {tuple(tgt.shape)}")


def check_schedule(step: int, model_size: int, warmup: int) -> None:
    """Raise ValueError for a negative step, or a model size or warm-up that is not positive."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    if model_size <= 0:
        raise ValueError(f"model_size={model_size} must be a positive d_model")
    if warmup <= 0:
        raise ValueError(f"warmup={warmup} must be a positive number of steps")


def check_smoothing(size: int, padding_idx: int, smoothing: float) -> None:
    """Raise ValueError unless the vocabulary, padding id and smoothing make a target."""
    if size < 3:
        raise ValueError(f"size={size} must be >= 3: the true token, padding and another")
    if not 0 <= padding_idx < size:
        raise ValueError(f"padding_idx={padding_idx} must be in [0, size={size})")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing={smoothing} must be in [0, 1)")


def check_log_probs(x: torch.Tensor, target: torch.Tensor, size: int) -> None:
    """Raise ValueError unless x is (rows, size) and target (rows,)."""
    if x.dim() != 2 or x.size(1) != size:
        raise ValueError(f"x must be log-probabilities of shape (rows, {size}), "
                         f"got {tuple(x.shape)}")
    if target.shape != x.shape[:1]:
        raise ValueError(f"target must have shape ({x.size(0)},), got {tuple(target.shape)}")


# %%
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

ATTENTION_KINDS = {
    "encoder": "encoder self-attention",
    "decoder": "decoder self-attention",
    "cross": "decoder-to-source attention",
}


@dataclass(frozen=True)
class AttentionMaps:
    """A sentence pair's attention weights, each (N layers, h heads, rows, columns), and tokens."""

    encoder: torch.Tensor  # (N, h, n_src, n_src)
    decoder: torch.Tensor  # (N, h, n_tgt, n_tgt)
    cross: torch.Tensor  # (N, h, n_tgt, n_src)
    src_tokens: list[str]  # the n_src source tokens
    tgt_tokens: list[str]  # the n_tgt decoder inputs: <s>, then the tokens produced so far

    def axes(self, kind: str) -> tuple[torch.Tensor, list[str], list[str]]:
        """The weights of one kind with the tokens of its rows (queries) and columns (keys)."""
        if kind not in ATTENTION_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}")
        rows = self.src_tokens if kind == "encoder" else self.tgt_tokens
        cols = self.tgt_tokens if kind == "decoder" else self.src_tokens
        return getattr(self, kind), rows, cols


def real_length(ids: torch.Tensor, pad_id: int) -> int:
    """How many ids of a 1-D row come before its padding (padding only at the end)."""
    n = int((ids != pad_id).sum())
    if n == 0 or bool((ids[n:] != pad_id).any()):
        raise ValueError(
            f"each row must be at least one token followed only by padding (pad_id={pad_id}), "
            f"got {ids.tolist()}"
        )
    return n


def attention_maps(
    model: nn.Module,
    src: torch.Tensor,
    tgt: torch.Tensor,
    *,
    src_tokens: Sequence[Sequence[str]] | None = None,
    tgt_tokens: Sequence[Sequence[str]] | None = None,
    pad_id: int = 2,
) -> list[AttentionMaps]:
    """Every layer's and head's attention in one teacher-forced pass, one entry per sentence.

    src (batch, n_src) and tgt (batch, n_tgt) hold ids padded at the end with pad_id; tgt is
    the decoder input (starting with <s>). Padding is cut away; tokens default to the ids.
    """
    if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != tgt.size(0):
        raise ValueError(
            "src and tgt must have shapes (batch, n_src) and (batch, n_tgt), "
            f"got {tuple(src.shape)} and {tuple(tgt.shape)}"
        )
    src_mask = (src != pad_id).unsqueeze(-2)  # (batch, 1, n_src)
    tgt_mask = (tgt != pad_id).unsqueeze(-2) & subsequent_mask(tgt.size(1)).to(tgt.device)
    was_training = model.training
    model.eval()  # no dropout: the weights the model uses when it translates
    with torch.no_grad():
        model(src, tgt, src_mask, tgt_mask)
    model.train(was_training)
    encoder = torch.stack([layer.self_attn.attn for layer in model.encoder.layers], dim=1)
    decoder = torch.stack([layer.self_attn.attn for layer in model.decoder.layers], dim=1)
    cross = torch.stack([layer.src_attn.attn for layer in model.decoder.layers], dim=1)
    # each (batch, N, h, rows, columns)
    maps = []
    for b in range(src.size(0)):
        n_src, n_tgt = real_length(src[b], pad_id), real_length(tgt[b], pad_id)
        s_tok = src_tokens[b] if src_tokens else [str(i) for i in src[b, :n_src].tolist()]
        t_tok = tgt_tokens[b] if tgt_tokens else [str(i) for i in tgt[b, :n_tgt].tolist()]
        if len(s_tok) != n_src or len(t_tok) != n_tgt:
            raise ValueError(
                f"sentence {b} has {n_src} source and {n_tgt} target ids but "
                f"{len(s_tok)} src_tokens and {len(t_tok)} tgt_tokens"
            )
        maps.append(AttentionMaps(
            encoder=encoder[b, :, :, :n_src, :n_src].cpu(),  # (N, h, n_src, n_src)
            decoder=decoder[b, :, :, :n_tgt, :n_tgt].cpu(),  # (N, h, n_tgt, n_tgt)
            cross=cross[b, :, :, :n_tgt, :n_src].cpu(),  # (N, h, n_tgt, n_src)
            src_tokens=list(s_tok),
            tgt_tokens=list(t_tok),
        ))
    return maps


# %%
from collections.abc import Sequence
from typing import Any


def attention_records(
    maps: AttentionMaps,
    *,
    kinds: Sequence[str] = ("encoder", "decoder", "cross"),
    decimals: int = 3,
    min_weight: float = 0.0,
    **fields: Any,
) -> list[dict[str, Any]]:
    """Long-form rows for a heatmap: one per (kind, layer, head, row, column) with its weight.

    Rows and columns are positions (tokens may repeat), labelled by their tokens; layers and
    heads count from 1; `fields` (e.g. sentence=1) are added to every row. Rounded weights below
    min_weight are left out, except in the first row and column, which keep every position on
    a chart's axes.
    """
    records = []
    for kind in kinds:
        weights, row_tokens, col_tokens = maps.axes(kind)  # (N, h, rows, columns)
        for layer, per_layer in enumerate(weights.tolist(), start=1):
            for head, matrix in enumerate(per_layer, start=1):
                for row, weight_row in enumerate(matrix):
                    for col, weight in enumerate(weight_row):
                        weight = round(weight, decimals)
                        if weight < min_weight and row > 0 and col > 0:
                            continue
                        records.append({
                            **fields, "kind": kind, "layer": layer, "head": head,
                            "row": row, "row_token": row_tokens[row],
                            "col": col, "col_token": col_tokens[col], "weight": weight,
                        })
    return records


# %%
import csv
import io
from collections.abc import Sequence
from typing import Any


def attention_chart(
    records: Sequence[dict[str, Any]],
    *,
    controls: Sequence[str] = ("kind", "layer", "head"),
    width: int = 340,
    height: int = 340,
    title: str = "",
    initial: dict[str, Any] | None = None,
):
    """One heatmap of `attention_records` rows with a widget per control field to pick a map.

    The data is embedded once; the widgets (a menu for the kind, a slider for runs of three or
    more integers, buttons otherwise) drive a filter, so one chart shows every layer and head.
    The chart opens on the first value of each control, or on the values `initial` gives.
    """
    import altair as alt

    if not records:
        raise ValueError("records is empty: there is no attention to draw")
    missing = [field for field in controls if field not in records[0]]
    if missing:
        raise ValueError(f"controls {missing} are not fields of the records: {list(records[0])}")
    params = []
    for field in controls:
        values = list(dict.fromkeys(r[field] for r in records))  # in order of appearance
        name = f"{field} "
        if field == "kind":
            labels = [ATTENTION_KINDS.get(v, v) for v in values]
            bind = alt.binding_select(options=values, labels=labels, name=name)
        elif len(values) > 2 and values == list(range(values[0], values[0] + len(values))):
            bind = alt.binding_range(min=values[0], max=values[-1], step=1, name=name)
        else:
            bind = alt.binding_radio(options=values, name=name)
        value = (initial or {}).get(field, values[0])
        if value not in values:
            raise ValueError(f"initial {field}={value!r} is not among the values {values}")
        params.append(alt.param(name=f"pick_{field}", value=value, bind=bind))
    picked = " && ".join(f"datum['{field}'] == pick_{field}" for field in controls)
    fields = list(records[0])
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    writer.writerows(records)
    parse = {f: "number" if isinstance(records[0][f], int | float) else "string" for f in fields}
    data = alt.Data(values=text.getvalue(), format=alt.CsvDataFormat(type="csv", parse=parse))
    # "position token" categories keep repeated tokens apart; the axes show only the token.
    axis = {"labelExpr": "substring(datum.value, indexof(datum.value, ' ') + 1)"}
    return (
        alt.Chart(data)
        .transform_filter(picked)
        .transform_calculate(
            query="datum.row + ' ' + datum.row_token", key="datum.col + ' ' + datum.col_token"
        )
        .mark_rect()
        .encode(
            x=alt.X("key:N", sort=alt.EncodingSortField("col", op="min"), title="key (looked at)",
                    axis=alt.Axis(labelAngle=-45, **axis)),
            y=alt.Y("query:N", sort=alt.EncodingSortField("row", op="min"),
                    title="query (looking)", axis=alt.Axis(**axis)),
            color=alt.Color("weight:Q", title="weight",
                            scale=alt.Scale(domain=[0, 1], range=["white", "#08306b"])),
            tooltip=[
                alt.Tooltip("row_token:N", title="query"),
                alt.Tooltip("col_token:N", title="key"),
                alt.Tooltip("weight:Q", format=".3f"),
                alt.Tooltip("row:O", title="query position"),
                alt.Tooltip("col:O", title="key position"),
            ],
        )
        .add_params(*params)
        .properties(width=width, height=height, title=title)
    )


# %%
import hashlib
import os
import tempfile
import urllib.request
from pathlib import Path


def repository_root() -> Path | None:
    """The folder holding the_annotated_transformer.py (a notebook has no __file__: search up)."""
    module_file = globals().get("__file__")
    if module_file is not None and Path(module_file).name == "the_annotated_transformer.py":
        return Path(module_file).resolve().parent
    for folder in [Path.cwd(), *Path.cwd().parents]:
        if (folder / "the_annotated_transformer.py").is_file():
            return folder
    return None


def sha256_of(path: str | os.PathLike) -> str:
    """The SHA-256 checksum of a file, read in blocks of 1 MiB."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download_file(url: str, path: Path, *, sha256: str) -> None:
    """Download url to path through a temporary file, renamed only once its checksum is right."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", delete=False) as f:
        tmp = Path(f.name)
        try:
            with urllib.request.urlopen(url, timeout=60) as response:
                for block in iter(lambda: response.read(1 << 20), b""):
                    f.write(block)
        except BaseException:
            f.close()
            tmp.unlink(missing_ok=True)
            raise
    if sha256_of(tmp) != sha256:
        tmp.unlink()
        raise ValueError(
            f"downloaded {url}, but its SHA-256 checksum is not the expected {sha256}: the "
            "download broke or the published file changed; try again, or put intact copies "
            f"in {path.parent} (or in a folder named by MULTI30K_DIR)"
        )
    os.replace(tmp, path)


# %%
import json


def book_data(name: str) -> Any:
    """A JSON file from book/data: from the checkout, else from the book's repository."""
    root = repository_root()
    if root is not None and (root / "book" / "data" / name).is_file():
        return json.loads((root / "book" / "data" / name).read_text())
    url = f"{BOOK_REPOSITORY}/raw/{BOOK_REPOSITORY_REF}/book/data/{name}"
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            return json.loads(response.read())
    except OSError as err:  # no such file, or no network
        raise FileNotFoundError(f"book/data/{name} is not in this checkout, and downloading "
                                f"{url} failed ({err})") from None


def seed_summary(runs: Sequence[Mapping[str, Any]], metric: str) -> list[dict[str, Any]]:
    """Per variant, in the order the runs name them: how many runs, and the metric's mean,
    lowest and highest value over them."""
    if not runs:
        raise ValueError("runs is empty: there is nothing to summarize")
    if any(metric not in run for run in runs):
        raise ValueError(f"metric {metric!r} is not in every run; a run has {list(runs[0])}")
    values: dict[str, list[float]] = {}
    for run in runs:
        values.setdefault(run["variant"], []).append(float(run[metric]))
    return [{"variant": variant, "runs": len(v), "mean": sum(v) / len(v), "min": min(v),
             "max": max(v)} for variant, v in values.items()]


def seeds_chart(
    runs: Sequence[Mapping[str, Any]], *, metric: str, title: str, value_format: str = "%",
    width: int = 420,
) -> Any:
    """Every run as a point (colour: the kernels it ran with), each variant's mean as a tick."""
    import altair as alt

    records = chart_rows([{k: run[k] for k in ("variant", "seed", "kernels", metric)}
                          for run in runs], ["variant", "seed", "kernels", metric])
    order = list(dict.fromkeys(r["variant"] for r in records))
    y = alt.Y("variant:N", sort=order, title=None)
    points = alt.Chart(alt.Data(values=records)).mark_point(filled=True, size=60).encode(
        x=alt.X(f"{metric}:Q", title=metric, axis=alt.Axis(format=value_format),
                scale=alt.Scale(zero=False)),
        y=y, color=alt.Color("kernels:N", title="kernels"),
        tooltip=["variant:N", "seed:O", "kernels:N", alt.Tooltip(f"{metric}:Q", format=".4")],
    )
    means = [{"variant": s["variant"], "mean": s["mean"]} for s in seed_summary(records, metric)]
    ticks = alt.Chart(alt.Data(values=means)).mark_tick(color="black", thickness=2, size=18)
    tooltip = ["variant:N", alt.Tooltip("mean:Q", format=".4")]
    ticks = ticks.encode(x="mean:Q", y=y, tooltip=tooltip)
    return (points + ticks).properties(title=title, width=width)


# %% [markdown]
# ## From book/appendix_performance.ipynb


# %%
import math

import torch
import torch.nn.functional as F


def label_smoothing_loss(
    logits: torch.Tensor, target: torch.Tensor, *, padding_idx: int, smoothing: float
) -> torch.Tensor:
    """LabelSmoothing's summed KL divergence, from F.cross_entropy and two more columns.

    logits (rows, V) are scores before the softmax (log-probabilities work too), target (rows,).
    """
    V = logits.size(-1)
    fill = smoothing / (V - 2)  # LabelSmoothing's mass on each token but the target and pad
    if fill * V > 1:
        raise ValueError(f"smoothing={smoothing} is too large for a vocabulary of {V}: "
                         f"F.cross_entropy's label_smoothing would be {fill * V:.3f} > 1")
    keep = target != padding_idx  # (rows,) the rows that LabelSmoothing counts
    # 1) cross-entropy with fill on every token, padding too, and 1 - fill * V more on the target
    loss = F.cross_entropy(logits, target, ignore_index=padding_idx, label_smoothing=fill * V,
                           reduction="sum")
    # 2) take back the fill that padding got, and give it to the target
    log_z = logits.logsumexp(dim=-1)  # (rows,)
    log_p_target = logits.gather(1, target.unsqueeze(1)).squeeze(1) - log_z
    log_p_pad = logits[:, padding_idx] - log_z
    loss = loss + fill * torch.where(keep, log_p_pad - log_p_target, 0.0).sum()
    # 3) the smoothed target's negative entropy, a constant: from cross-entropy to KL
    confidence = 1.0 - smoothing
    neg_entropy = sum(n * q * math.log(q) for q, n in ((confidence, 1), (fill, V - 2)) if q > 0)
    return loss + neg_entropy * keep.sum()


# %%
import math
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class TrainConfig:
    """Chapter 17's configuration, grown by the fast path, a schedule that ends at zero, the
    paper's dropout sites, bfloat16 on CPUs and a global batch for any number of GPUs; the
    last three fields choose how sentencepiece is trained (the data appendix)."""

    N: int = 6
    d_model: int = 512
    d_ff: int = 2048
    h: int = 8
    dropout: float = 0.1
    max_tokens: int = 4096
    accum_iter: int = 1
    epochs: int = 30
    warmup: int = 1000
    lr_factor: float = 0.5
    label_smoothing: float = 0.1
    max_len: int = 72
    min_freq: int = 2
    seed: int = 0
    checkpoint_dir: str = "checkpoints/multi30k_base"
    train_limit: int | None = None
    val_limit: int | None = None
    keep_epochs: int = 0
    bleu_every: int = 1
    subwords: int = 0  # 0: two word vocabularies; else one joint sentencepiece vocabulary this big
    share_embeddings: bool = False  # one matrix for both embeddings and the generator (§3.4)
    fast: bool = False  # the fast path, the fused loss and Adam's fused step
    decay: str = "inverse_sqrt"  # after the warm-up: the paper's step^-0.5, or "linear" to 0
    cpu_bf16: bool = False  # bfloat16 autocast on a CPU with AMX or AVX512-BF16 (chapter 22)
    paper_dropout: bool = False  # dropout only where §5.4 puts it: none in attention or the FFN
    batch_tokens: int = 0  # > 0: padded tokens per optimizer step on all devices (sets accum_iter)
    # sentencepiece for large corpora and other scripts (the data appendix grows its training)
    subword_sentences: int = 1_000_000  # trains on a seeded sample of at most this many sentences
    character_coverage: float = 1.0  # the share of the text's characters that get pieces
    share_vocab: bool = True  # one model for both languages; False: one model per language

    def __post_init__(self) -> None:
        check_train_config(self)
        if isinstance(self.subwords, bool) or not isinstance(self.subwords, int) or (
                self.subwords < 0):
            raise ValueError(f"subwords must be an integer >= 0, got {self.subwords!r}")
        if self.share_embeddings and not self.subwords:
            raise ValueError("share_embeddings=True needs one joint vocabulary: set subwords > 0")
        if self.decay not in ("inverse_sqrt", "linear"):
            raise ValueError(f"decay must be 'inverse_sqrt' or 'linear', got {self.decay!r}")
        if isinstance(self.batch_tokens, bool) or not isinstance(self.batch_tokens, int) or (
                self.batch_tokens < 0):
            raise ValueError(f"batch_tokens must be an integer >= 0, got {self.batch_tokens!r}")
        if isinstance(self.subword_sentences, bool) or not isinstance(
                self.subword_sentences, int) or self.subword_sentences < 1:
            raise ValueError(
                f"subword_sentences must be an integer >= 1, got {self.subword_sentences!r}")
        if isinstance(self.character_coverage, bool) or not isinstance(
                self.character_coverage, int | float) or not 0 < self.character_coverage <= 1:
            raise ValueError("character_coverage must be a number in (0, 1], got "
                             f"{self.character_coverage!r}")
        if self.share_embeddings and not self.share_vocab:
            raise ValueError("share_embeddings=True needs one joint vocabulary, and share_vocab="
                             "False gives two: set share_embeddings=False")


def training_config(name: str, **overrides) -> TrainConfig:
    """The preset `name` ("cpu", "base", "cpu_subword", "cpu_fast", "cpu_fast_dropout",
    "cpu_avx2" or "gpu") with some fields replaced."""
    cpu = TrainConfig(
        N=3, d_model=256, d_ff=1024, h=8, dropout=0.1, max_tokens=1500, accum_iter=1,
        epochs=12, warmup=1000, lr_factor=0.5, checkpoint_dir="checkpoints/multi30k_cpu",
    )
    presets = {
        "cpu": cpu,
        "base": TrainConfig(),
        "cpu_subword": replace(cpu, subwords=8000, share_embeddings=True,
                               checkpoint_dir="checkpoints/multi30k_cpu_subword"),
    }
    presets["cpu_fast"] = replace(presets["cpu_subword"], fast=True, dropout=0.0, max_tokens=750,
                                  warmup=2000, epochs=6,
                                  checkpoint_dir="checkpoints/multi30k_cpu_fast")
    presets["cpu_fast_dropout"] = replace(presets["cpu_fast"], dropout=0.1, paper_dropout=True,
                                          epochs=11, keep_epochs=2,
                                          checkpoint_dir="checkpoints/multi30k_cpu_fast_dropout")
    # A 2-core CPU with AVX2 only (chapter 21): the same model and dropout in 7 epochs. Half the
    # subwords make the same text cheaper to train on (tools/levers.py), and a run this short
    # ends with the rate on the straight line to zero from a 1,000-step warm-up; its last epoch
    # scored at least as high as the last two averaged on validation (beam 4) for each of its
    # seeds, so it keeps that one.
    presets["cpu_avx2"] = replace(presets["cpu_fast_dropout"], subwords=4000, epochs=7,
                                  decay="linear", warmup=1000, keep_epochs=0,
                                  checkpoint_dir="checkpoints/multi30k_cpu_avx2")
    # One GPU: cpu_fast_dropout's model and dropout (bfloat16 autocast comes with CUDA, see
    # autocast_dtype_for). At the CPU's batches a GPU mostly waits on the host's kernel launches
    # (bench_cuda.json, gpu_check_cuda.json; the appendix's GPU section), so a step here is one
    # micro-batch of 32,768 padded tokens, about 24,400 target tokens on Multi30k: the paper's
    # batch, 17 steps an epoch. On R devices config_for_devices gives each about 32,768 / R, so
    # the global batch, the warm-up and the peak stay (chapter 22 prints it for 1 to 8). About
    # 1,000 steps in 60 epochs; the 200-step warm-up peaks at 2.2e-3, and the rate then falls in
    # a straight line to zero, as cpu_avx2's short run does; keep_epochs=5 averages the last 5.
    presets["gpu"] = replace(presets["cpu_fast_dropout"], max_tokens=32768, batch_tokens=32768,
                             warmup=200, epochs=60, decay="linear", keep_epochs=5,
                             checkpoint_dir="checkpoints/multi30k_gpu")
    if name not in presets:
        raise ValueError(f"name must be one of {', '.join(presets)}, got {name!r}")
    config = replace(presets[name], **overrides)
    if name == "base" and config.batch_tokens and "lr_factor" not in overrides:
        # the paper's model keeps the paper's peak rate, d_model^-0.5 * 4000^-0.5, at any global
        # batch: the square-root rule (chapter 22) would raise it sqrt(k) times at k micro-batches
        config = replace(config, lr_factor=config.lr_factor * math.sqrt(
            config.max_tokens / config.batch_tokens))
    return config


# %%
def config_for_devices(config: TrainConfig, world_size: int) -> TrainConfig:
    """config as world_size devices train it. With batch_tokens set, accum_iter is the one that
    brings world_size x accum_iter x max_tokens nearest batch_tokens (at least 1); where that
    would overshoot, each device takes batch_tokens / (world_size x accum_iter) tokens instead,
    and warmup is scaled to count the same tokens, so that a step sees the same global batch,
    and the run the same warm-up, on any number of devices. Without it, config as it is."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    if not config.batch_tokens:
        return config
    accum = max(1, round(config.batch_tokens / (config.max_tokens * world_size)))
    if config.accum_iter not in (1, accum):
        raise ValueError(
            f"accum_iter={config.accum_iter} and batch_tokens={config.batch_tokens} both set the "
            f"accumulation (batch_tokens gives accum_iter={accum} on {world_size} device(s)): "
            "set batch_tokens=0 to choose accum_iter yourself"
        )
    share = config.batch_tokens // (world_size * accum)  # each device's tokens, to the token
    if share >= config.max_tokens:  # max_tokens is what a device may hold: never above it
        return replace(config, accum_iter=accum)
    if share < config.max_len:
        raise ValueError(
            f"batch_tokens={config.batch_tokens} on {world_size} devices leaves {share} tokens "
            f"per device, fewer than max_len={config.max_len}: use fewer devices")
    return replace(config, accum_iter=accum, max_tokens=share,
                   warmup=max(1, round(config.warmup * config.max_tokens / share)))


# %%
def linear_rate(step: int, model_size: int, factor: float, warmup: int, total: int) -> float:
    """rate()'s warm-up to the same peak, then a straight line down to 0 at step `total`."""
    peak = rate(warmup, model_size, factor, warmup)
    if step <= warmup:
        return rate(step, model_size, factor, warmup)
    return peak * max(total - step, 0) / max(total - warmup, 1)


class FusedLabelSmoothing(LabelSmoothing):
    """LabelSmoothing through label_smoothing_loss: the same sum, without the (rows, V) target."""

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Summed KL divergence for log-probabilities x (rows, size) and targets (rows,)."""
        return label_smoothing_loss(x, target, padding_idx=self.padding_idx,
                                    smoothing=self.smoothing)


# %%
from typing import Any


def bench_results(name: str = "bench_cpu.json") -> dict[str, Any]:
    """A `make bench` result file from book/data (the appendix's `book_data`)."""
    return book_data(name)


def same_tokens(row: dict[str, Any]) -> str | None:
    """A decoding row's check: the tokens of the decoder without the cache, or the share of
    sentences that float32 decodes the same (bfloat16 rows); None where nothing was compared."""
    if row.get("same_as_float32") is not None:
        return f"{100 * row['same_as_float32']:.0f}% as in float32"
    return {None: None, True: "same", False: "DIFFERENT"}[row.get("same_as_recompute")]


def bench_table(results: dict[str, Any]) -> Any:
    """The rows as a pandas DataFrame: median, range, ratio to the first row of each group."""
    import pandas as pd

    rows = []
    groups = [("training", "tokens_per_s", "target tokens/s", lambda r: (r["size"], r["model"])),
              ("batching", "real_tokens_per_s", "real target tokens/s",
               lambda r: (r["size"], r["batching"])),
              ("decoding", "sentences_per_s", "sentences/s",
               lambda r: (r["size"], r["decoder"]))]
    for group, key, unit, name in groups:
        first = {}
        for row in results[group]:
            size, label = name(row)
            base = first.setdefault(size, row[key]["median"])
            rows.append({"group": group, "size": size, "row": label, "unit": unit,
                         "median": round(row[key]["median"], 1),
                         "range": f"{row[key]['min']:.1f} to {row[key]['max']:.1f}",
                         "ratio": round(row[key]["median"] / base, 2),
                         "MFU %": round(100 * row["mfu"], 1) if "mfu" in row else None,
                         "peak MB": round(row["peak_memory_mb"], 1)
                         if "peak_memory_mb" in row else None,
                         "tokens": same_tokens(row)})
    return pd.DataFrame(rows)


def decoding_roofline(results: dict[str, Any], size: str, steps: int) -> Any:
    """Each float32 decoder at `size` against the fastest it could run on the run's machine:
    its counted FLOPs at the measured matmul peak, or the weights that each of its `steps`
    decoding steps reads whole, streamed at the measured memory read rate, whichever is
    slower (a roofline, which ignores the caches' own reads and the encoder's weights)."""
    import pandas as pd

    peak, read = results["matmul_peak_gflops"] * 1e9, results["memory_read_gbs"] * 1e9
    weights = results["decoder_weight_mb"][size] * 1e6
    decoders = [row for row in results["decoding"]
                if row["size"] == size and row["mfu_of"] == "float32"]
    classic = decoders[0]["sentences_per_s"]["median"]
    rows = []
    for row in decoders:
        flops = row["flops_per_sentence"]
        streamed = weights * steps / row["batch"]  # one read per step serves the whole batch
        bound = 1 / max(flops / peak, streamed / read)  # sentences/s
        measured = row["sentences_per_s"]["median"]
        rows.append({"decoder": row["decoder"], "GFLOP/sentence": round(flops / 1e9, 2),
                     "weight MB/sentence": round(streamed / 1e6, 1),
                     "FLOP/byte": round(flops / streamed, 1),
                     "bound": "matmul" if flops / peak > streamed / read else "memory",
                     "bound sentences/s": round(bound, 1), "measured": round(measured, 1),
                     "% of bound": round(100 * measured / bound, 1),
                     "bound / classic": round(bound / classic, 1)})
    return pd.DataFrame(rows).set_index("decoder")


def bench_chart(results: dict[str, Any]) -> Any:
    """Speed-ups over the first row of each group, one bar per row, with the hardware named."""
    import altair as alt

    table = bench_table(results)
    table["what"] = (table["group"] + " " + table["size"]).str.strip()
    table = table[["what", "row", "median", "range", "unit", "ratio"]]  # no empty cells
    hw = results["hardware"]
    title = f"make bench: {hw['cpu']}, {hw['threads']} thread(s), torch {hw['torch']}"
    return alt.Chart(alt.Data(values=table.to_dict("records"))).mark_bar().encode(
        x=alt.X("ratio:Q", title="speed relative to the first row of its group"),
        y=alt.Y("row:N", title=None, sort=None),
        color=alt.Color("what:N", title=None, legend=alt.Legend(orient="bottom")),
        row=alt.Row("what:N", title=None, sort=None),
        tooltip=["what:N", "row:N", "median:Q", "range:N", "unit:N", "ratio:Q"],
    ).resolve_scale(y="independent").properties(width=360, title=title)


# %%
import json
import re
import statistics
from typing import Any


def stopped_after(run: dict[str, Any], epoch: int) -> dict[str, Any]:
    """The run as if it had ended after `epoch`: the rate schedule and the batch order do not
    depend on the number of epochs, so its first epochs are the shorter run's."""
    last_two = f"average of epochs {epoch - 1} and {epoch}"
    weights = {f"epoch {epoch}": "last epoch", last_two: last_two}
    return {**run, "name": f"{run['name']}, stopped after epoch {epoch}",
            "config": {**run["config"], "epochs": epoch}, "history": run["history"][:epoch],
            "training_seconds": sum(row["seconds"] for row in run["history"][:epoch]),
            "evaluation": [{**row, "weights": weights[row["weights"]]}
                           for row in run["evaluation"] if row["weights"] in weights]}


def recipe_runs() -> list[dict[str, Any]]:
    """Chapter 18's cpu_subword and the runs of book/data/fast_recipe.json; a run also scored
    after an earlier epoch stands, too, for the run stopped there (stopped_after)."""
    folder = fetch_shipped_model(name="multi30k_cpu_subword")
    scores = json.loads((folder / "results.json").read_text())["results"]
    runs = [{**json.loads((folder / "info.json").read_text()), "name": "cpu_subword",
             "evaluation": [{**row, "weights": "last epoch"} for row in scores
                            if row["model"] == "subwords-last"]}]
    for run in book_data("fast_recipe.json")["runs"]:
        earlier = sorted({int(match[1]) for row in run["evaluation"]
                          if (match := re.fullmatch(r"epoch (\d+)", row["weights"]))})
        runs += [run, *(stopped_after(run, epoch) for epoch in earlier)]
    return runs


def recipe_change(config: TrainConfig) -> str:
    """The nearest of the presets cpu_subword, cpu_fast, cpu_fast_dropout and cpu_avx2 (the
    first of equals), and the fields in which `config` differs from it, seed and folders aside."""
    changes = {}
    for name in ("cpu_subword", "cpu_fast", "cpu_fast_dropout", "cpu_avx2"):
        preset = vars(training_config(name))
        changes[name] = [f"{field}={value!r}" for field, value in vars(config).items()
                         if value != preset[field]
                         and field not in ("seed", "checkpoint_dir", "keep_epochs", "bleu_every")]
    name = min(changes, key=lambda n: len(changes[n]))
    return ", ".join([name, *changes[name]])


def recipe_table(runs: list[dict[str, Any]]) -> Any:
    """One row per configuration and CPU: its seeds, training minutes, and validation BLEU of
    beam 4 on the last epoch's weights and on the last two epochs' average, each as the mean
    over the seeds with their range."""
    import pandas as pd

    def spread(values: list[float], digits: int = 2) -> str:
        """The mean of `values`, with their range when there are several; "-" for none."""
        if not values:
            return "-"
        mean, low, high = (f"{v:.{digits}f}" for v in (sum(values) / len(values), min(values),
                                                        max(values)))
        return mean if len(values) == 1 else f"{mean} ({low} to {high})"

    def beam(group: list[dict[str, Any]], weights: str) -> list[float]:
        return [row["bleu"] for run in group for row in run["evaluation"]
                if row["decoding"] == "beam4" and row["split"] == "val"
                and row["weights"] == weights]

    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run in runs:
        cpu = run["hardware"].split(", ")[1]  # "1 CPU process(es) x 2 thread(s), AMD EPYC, ..."
        cpu = cpu.replace("(R)", "").removesuffix(" Processor")
        if run.get("cpu", {}).get("caps"):  # its kernel libraries capped to an older CPU's
            cpu += f", capped to {run['cpu']['torch_kernels']}"
        groups.setdefault((recipe_change(TrainConfig(**run["config"])), cpu), []).append(run)
    rows = []
    for (change, cpu), group in groups.items():
        epochs = group[0]["config"]["epochs"]
        rows.append({
            "configuration": change, "seeds": ", ".join(str(r["config"]["seed"]) for r in group),
            "CPU": cpu, "training min": spread([r["training_seconds"] / 60 for r in group], 1),
            "beam 4, last epoch": spread(beam(group, "last epoch")),
            "beam 4, last two averaged": spread(
                beam(group, f"average of epochs {epochs - 1} and {epochs}")),
        })
    return pd.DataFrame(rows).set_index("configuration")


def lever_table(results: dict[str, Any]) -> Any:
    """tools/levers.py's run: for each lever, the optimizer steps and target tokens of the same
    sentences, the seconds they took (median and range over the repeats), and the speed against
    the recipe (its median over the lever's; above 1: faster on the same text)."""
    import pandas as pd

    def seconds(values: list[float]) -> str:
        return f"{statistics.median(values):.1f} ({min(values):.1f} to {max(values):.1f})"

    return pd.DataFrame([{
        "lever": row["lever"], "steps": row["steps"], "target tokens": row["target_tokens"],
        "seconds": seconds(row["seconds"]), "speed vs recipe": round(row["ratio"], 2),
    } for row in results["levers"]]).set_index("lever")


# %% [markdown]
# ## From book/appendix_distributed.ipynb


# %%
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


# %%
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
# ## From book/appendix_data.ipynb


# %%
import os
from pathlib import Path


def dataset_dir(name: str, env: str, data_dir: str | os.PathLike | None = None) -> Path:
    """A data set's folder: data_dir, $env, ../shared/data/<name> beside the repository, or the
    cache ~/.cache/annotated-transformer/<name> (where a download goes)."""
    if data_dir is not None:
        return Path(data_dir).expanduser()
    if os.environ.get(env):
        return Path(os.environ[env]).expanduser()
    root = repository_root()
    if root is not None and (root.parent / "shared" / "data" / name).is_dir():
        return (root.parent / "shared" / "data" / name).resolve()
    return Path.home() / ".cache" / "annotated-transformer" / name


def multi30k_dir(data_dir: str | os.PathLike | None = None) -> Path:
    """The Multi30k folder: data_dir, $MULTI30K_DIR, ../shared/data/multi30k, or the cache."""
    return dataset_dir("multi30k", "MULTI30K_DIR", data_dir)


# %%
MULTI30K_URL = "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
MULTI30K_SHA256 = {
    "train.de.gz": "726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6",
    "train.en.gz": "d79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f",
    "val.de.gz": "f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a",
    "val.en.gz": "14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28",
    "test_2016_flickr.de.gz": "9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8",
    "test_2016_flickr.en.gz": "611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9",
}
# The French and Czech sides of the same splits, from the same folder of the Multi30k repository.
# They live in a folder of their own, multi30k-fr-cs, beside multi30k (in ../shared/data as in
# the cache), so that the German-English folder stays exactly the six files above.
MULTI30K_FR_CS_SHA256 = {
    "train.fr.gz": "622e75069e9f4c577425c4f277116ce66e63a2401c0a2312d90073cb12379a3c",
    "train.cs.gz": "a65adb8b32e3bc664f21ecba7a6e7f6950fd1f405e135f7c312faabdb6255077",
    "val.fr.gz": "ca3106f1a72390591d25f6c45cb4cd39dec4cd3f123e099748a3ce5256c160e9",
    "val.cs.gz": "b63226e05c4bd5dd6a42897d74b86a1b9d2c31498252c572b1ea7f7996927fcc",
    "test_2016_flickr.fr.gz": "6d326e188d259fb1d04ac19eae3af956559b3a0b93d7635e56c90987c40c8b90",
    "test_2016_flickr.cs.gz": "200a4a74cc9560f051924abb9803be008d1908d77f747e9141aeb86dfd2797f1",
}


def multi30k_file(name: str, folder: Path) -> Path:
    """The path of one Multi30k file in folder, downloaded if missing, its checksum verified."""
    path = folder / name
    expected = (MULTI30K_SHA256 | MULTI30K_FR_CS_SHA256)[name]
    if not path.exists():
        url = MULTI30K_URL + name
        try:
            download_file(url, path, sha256=expected)
        except OSError as err:  # no network, an HTTP error, a timeout, a read-only folder
            raise FileNotFoundError(
                f"Multi30k file {name} is not in {folder} and could not be downloaded from "
                f"{url} ({err}): connect to the internet and try again, copy the file there, "
                "or set MULTI30K_DIR to a folder that holds the Multi30k files"
            ) from err
    actual = sha256_of(path)
    if actual != expected:
        raise ValueError(
            f"Multi30k file {path} is truncated or corrupted (SHA-256 {actual}, expected "
            f"{expected}): delete it to download it again, or set MULTI30K_DIR to a folder "
            "with intact copies"
        )
    return path


# %%
import gzip
import os
from pathlib import Path

MULTI30K_SPLITS = {"train": 29_000, "val": 1_014, "test_2016_flickr": 1_000}
# Each language's folder under ../shared/data or the cache (data_dir or $MULTI30K_DIR holds all)
MULTI30K_FOLDERS = {"de": "multi30k", "en": "multi30k", "fr": "multi30k-fr-cs",
                    "cs": "multi30k-fr-cs"}


def read_sentence_pairs(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike
) -> list[tuple[str, str]]:
    """Line i of the gzipped src_path paired with line i of tgt_path; unequal counts raise."""
    sides = []
    for path in (src_path, tgt_path):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines[-1] == "":  # the newline that ends the last line
            lines.pop()
        sides.append(lines)
    src, tgt = sides
    if len(src) != len(tgt):
        raise ValueError(
            f"{Path(src_path).name} has {len(src)} lines but {Path(tgt_path).name} has "
            f"{len(tgt)}: the files are not parallel; delete both to download them again"
        )
    return list(zip(src, tgt, strict=True))


def load_multi30k(
    split: str, data_dir: str | os.PathLike | None = None,
    languages: tuple[str, str] = ("de", "en"),
) -> list[tuple[str, str]]:
    """The (source, target) sentence pairs of one Multi30k split, exactly as published:
    German-English unless languages names two others of de, en, fr and cs."""
    if split not in MULTI30K_SPLITS:
        raise ValueError(f"split={split!r} is not one of {', '.join(MULTI30K_SPLITS)}")
    if (len(languages) != 2 or languages[0] == languages[1]
            or not set(languages) <= MULTI30K_FOLDERS.keys()):
        raise ValueError(
            f"languages={tuple(languages)!r}: Multi30k pairs two different ones of "
            f"{', '.join(MULTI30K_FOLDERS)}"
        )
    paths = [
        multi30k_file(f"{split}.{code}.gz",
                      dataset_dir(MULTI30K_FOLDERS[code], "MULTI30K_DIR", data_dir))
        for code in languages
    ]
    return read_sentence_pairs(*paths)


# %%
from collections.abc import Sequence


def check_token_budget(
    src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, max_tokens: int,
    pool_size: int | None = None, num_replicas: int = 1, rank: int = 0,
) -> None:
    """Raise a ValueError naming the argument if TokenBudgetSampler cannot keep its promise."""
    n = len(src_lengths)
    if len(tgt_lengths) != n:
        raise ValueError(
            f"src_lengths has {n} entries but tgt_lengths has {len(tgt_lengths)}; "
            "both must describe the same examples"
        )
    if n == 0:
        raise ValueError("src_lengths is empty; the sampler needs at least one example")
    pool_size = n if pool_size is None else pool_size
    for name, value in [("max_tokens", max_tokens), ("pool_size", pool_size),
                        ("num_replicas", num_replicas)]:
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if not isinstance(rank, int) or not 0 <= rank < num_replicas:
        raise ValueError(f"rank must be in [0, num_replicas={num_replicas}), got {rank!r}")
    if n < num_replicas:
        raise ValueError(
            f"{n} examples cannot give each of num_replicas={num_replicas} ranks a batch"
        )
    too_long = [i for i in range(n) if max(src_lengths[i], tgt_lengths[i]) > max_tokens]
    if too_long:
        i = too_long[0]
        raise ValueError(
            f"example {i} has {src_lengths[i]} source and {tgt_lengths[i]} target "
            f"tokens, more than max_tokens={max_tokens} on its own ({len(too_long)} of {n} "
            "examples exceed it): drop long pairs first (filter_by_length) or raise max_tokens"
        )


# %%
def split_batches_for_ranks(batches: list[list[int]], num_replicas: int) -> list[list[int]]:
    """Halve the largest batches until every rank can have the same number of them."""
    while len(batches) % num_replicas:
        j = max(range(len(batches)), key=lambda k: len(batches[k]))
        if len(batches[j]) < 2:
            raise ValueError(
                f"cannot share {len(batches)} one-example batches equally among "
                f"num_replicas={num_replicas} ranks; raise max_tokens"
            )
        half = len(batches[j]) // 2
        batches[j : j + 1] = [batches[j][:half], batches[j][half:]]
    return batches


# %%
from collections import Counter
from collections.abc import Sequence
from typing import Any


def length_histogram(pairs: Sequence[tuple[Sequence[str], Sequence[str]]], *, title: str) -> Any:
    """How many sentence pairs have each length, German (side 0) over English (side 1)."""
    import altair as alt

    rows = []
    for language, side in [("German", 0), ("English", 1)]:
        counts = Counter(len(pair[side]) for pair in pairs)
        rows += [{"language": language, "tokens": n, "sentences": c} for n, c in counts.items()]
    if not rows:
        raise ValueError("pairs is empty: there are no lengths to count")
    return (
        alt.Chart(alt.Data(values=rows))
        .mark_bar(opacity=0.6)
        .encode(
            x=alt.X("tokens:Q", bin=alt.Bin(step=1), title="sentence length (tokens)"),
            y=alt.Y("sentences:Q", stack=None, title="training sentences"),
            color=alt.Color("language:N", title=None),
            tooltip=["language:N", "tokens:Q", "sentences:Q"],
        )
        .properties(width=520, height=220, title=title)
    )


# %%
import math
from typing import Any

# pairs: the book's own thresholds, one below the table's rows and one at its last, untried
SMALL_CORPUS, HUGE_CORPUS = 10_000, 1_000_000


def config_for_corpus(pairs: int, *, max_tokens: int | None = None,
                      accum_iter: int | None = None) -> list[tuple[dict[str, Any], str]]:
    """The TrainConfig fields that depend on how many training pairs there are, in groups,
    each with its reason: the book's extrapolation of the directions in chapter 18's table,
    anchored at Multi30k's size, which gets cpu_fast_dropout's values. On one device, and
    below HUGE_CORPUS pairs without accum_iter, every size peaks at Multi30k's rate, which is
    also the paper's (6.99e-4).
    max_tokens: the micro-batch that the run's devices will take (None: cpu_fast_dropout's),
    which the paper's warm-up steps are counted in from HUGE_CORPUS pairs on; accum_iter: a
    step of that many micro-batches instead of 25,000 tokens (None: batch_tokens sets it)."""
    if isinstance(pairs, bool) or not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs must be a positive integer, got {pairs!r}")
    anchor, recipe = MULTI30K_SPLITS["train"], training_config("cpu_fast_dropout")
    scale = pairs / anchor
    # 1) the vocabulary grows with the square root of the text, in steps of 500
    subwords = min(32_000, max(1_000, 500 * round(recipe.subwords * math.sqrt(scale) / 500)))
    choices = [({"subwords": subwords}, f"{recipe.subwords:,} pieces at {anchor:,} pairs times "
                f"the square root of {pairs:,} / {anchor:,}, in steps of 500 within 1,000 to "
                "32,000: fewer merges for less text")]
    # 2) the model: smaller below the table's rows, chapter 21's (smaller and shallower than
    # the paper's) up to its last row, the paper's base model there
    if pairs < SMALL_CORPUS:
        model, why = {"N": 2, "d_model": 256, "d_ff": 512, "h": 4}, (
            f"under {SMALL_CORPUS:,} pairs, a smaller, shallower model than chapter 21's")
    elif pairs < HUGE_CORPUS:
        model, why = {"N": recipe.N, "d_model": recipe.d_model, "d_ff": recipe.d_ff,
                      "h": recipe.h}, f"chapter 21's model, for {SMALL_CORPUS:,} to "\
                                      f"{HUGE_CORPUS:,} pairs"
    else:
        base = TrainConfig()
        model, why = {"N": base.N, "d_model": base.d_model, "d_ff": base.d_ff, "h": base.h}, (
            f"the paper's base model, from {HUGE_CORPUS:,} pairs")
    choices.append((model, why))
    # 3) dropout: stronger for less text, at the paper's sites
    if pairs < SMALL_CORPUS:
        choices.append(({"dropout": 0.3}, f"three times the paper's rate under "
                        f"{SMALL_CORPUS:,} pairs, at the paper's sites"))
    else:
        choices.append(({"dropout": recipe.dropout}, "the paper's rate at the paper's sites"))
    # 4) the warm-up and the peak rate, factor x d_model^-0.5 x warmup^-0.5 (rate): lr_factor
    # keeps the peak where Multi30k's is (and the paper's: 1 x 512^-0.5 x 4000^-0.5 is the same)
    if pairs >= HUGE_CORPUS:
        micro = max_tokens or recipe.max_tokens
        if accum_iter:  # the given accumulation makes the step: accum_iter micro-batches
            accum, share, step = accum_iter, micro, {}
            size = f"{accum} micro-batch{'es' * (accum > 1)} of {micro} padded tokens a step"
        else:  # micro-batches in one step of 25,000 tokens, a larger one cut to 25,000
            accum = max(1, round(25_000 / micro))
            share = min(micro, 25_000 // accum)  # each micro-batch, as config_for_devices cuts it
            step = {"batch_tokens": 25_000}
            size = (f"25,000 padded tokens a step ({accum} micro-batch{'es' * (accum > 1)} of "
                    f"{share}; the paper's step held about 25,000 source and 25,000 target "
                    "tokens, without padding)")
        # warmup counts micro-batches of max_tokens, which config_for_devices scales by
        # max_tokens / share where it cuts them: 4,000 steps of accum micro-batches after it
        where = "on one device, " if accum_iter else ""  # R devices: R x accum_iter a step
        choices.append((step | {"warmup": round(4_000 * accum * share / micro), "lr_factor": 1.0},
                        f"from {HUGE_CORPUS:,} pairs, {where}the paper's 4,000 warm-up steps and "
                        f"factor 1, so its peak rate on one device, at {size}"))
    else:
        warmup = max(1, round(recipe.warmup * min(1.0, scale)))
        lr_factor = round(recipe.lr_factor * math.sqrt(warmup / recipe.warmup)
                          * math.sqrt(model["d_model"] / recipe.d_model), 4)
        share = ("scaled down with the pairs, so that it covers the same share of the text"
                 if pairs < anchor else "kept, so that it covers a smaller share of more text")
        choices.append(({"warmup": warmup, "lr_factor": lr_factor},
                        f"{recipe.warmup:,} warm-up micro-batches at {anchor:,} pairs, {share}; "
                        "lr_factor keeps the peak rate where Multi30k's is, on one device "
                        "without accum_iter"))
    # 5) the run: Multi30k's optimizer steps for less text (at most 100 epochs), its epochs
    # for more; validation BLEU about as often per run as Multi30k's
    epochs = recipe.epochs if pairs >= anchor else min(100, round(recipe.epochs / scale))
    bleu_every = math.ceil(epochs / recipe.epochs)
    choices.append(({"epochs": epochs, "bleu_every": bleu_every},
                    f"{recipe.epochs} epochs at {anchor:,} pairs"
                    + (", kept" if pairs >= anchor else "; fewer pairs, more epochs (about "
                       "Multi30k's optimizer steps, at most 100 epochs)")
                    + f"; validation BLEU every {bleu_every} epoch(s), about {recipe.epochs} "
                    "times a run"))
    return choices


# %%
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
# multi30k_cpu is chapter 14's word-level model (averaging.json holds chapter 16's
# measurements); multi30k_cpu_subword is chapter 18's subword model and multi30k_cpu_fast_dropout
# chapter 21's half-hour one (results.json holds each one's measurements).
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
    "multi30k_cpu_fast_dropout": {
        "model.pt": "026186e0d9884d7d97c27ef5606507dcc2d6fe1d0a3604ae37a0f30f07d3c273",
        "subwords.model": "d3f7fe14d9a0a191b496c0a68c212d32217ee3fd1b5c17dba74eb1cee93def72",
        "info.json": "36764ca0b351550f05fb4956cd8c0dcef8b40dd122e00bfaa45b98cb0a56948a",
        "results.json": "78eeeb118364a49d7357f936117ce956a5cb2551584a16acf6dc779464ed0c31",
    },
}
SHIPPED_PRESETS = {"multi30k_cpu": "cpu", "multi30k_cpu_subword": "cpu_subword",  # for training
                   "multi30k_cpu_fast_dropout": "cpu_fast_dropout"}
# The shipped model with the best validation BLEU: `make translate` uses it (chapters 18, 21).
BEST_SHIPPED_MODEL = "multi30k_cpu_fast_dropout"


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
    fields = TrainConfig.__dataclass_fields__
    config = TrainConfig(**{k: v for k, v in state["config"].items() if k in fields})
    for name in vocabulary_files(config):
        shutil.copyfile(checkpoint.parent / name, folder / name)
    info = {
        "config": state["config"],
        "command": command or notes.get("command"),
        "training_seconds": round(notes.get("elapsed_s", 0.0), 1),
        "hardware": notes.get("hardware"),
        "cpu": notes.get("cpu"),  # its flags, kernels and caps (runs since chapter 21 asked)
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


# A run's notes keep its command as it was typed. The scripts named in the shipped models' notes
# and the stored measurements are today subcommands of the installed `annotated-transformer`
# command, with the same options; current_command shows a stored command in today's form.
RECORDED_PROGRAMS = {
    "python tools/train.py": "annotated-transformer train",
    "python tools/translate.py": "annotated-transformer translate",
    "python tools/evaluate.py": "annotated-transformer evaluate",
    "python tools/average_checkpoints.py": "annotated-transformer average",
}


def current_command(recorded: str) -> str:
    """A command from a run's notes as a reader types it today, so that no page tells the
    reader to run a script by a path it no longer has."""
    for program, command in RECORDED_PROGRAMS.items():
        recorded = recorded.replace(program, command)
    return recorded


def load_trained_model(
    path: str | os.PathLike | None = None, *, name: str = "multi30k_cpu",
    device: str | torch.device = "cpu", train_if_missing: bool = False,
) -> tuple[EncoderDecoder, Vocab, Vocab, TrainConfig]:
    """A trained model in float32 (eval mode) with its vocabularies and configuration.

    path: a folder from export_for_shipping, or a model.pt / last.pt file with the
    vocabularies beside it; by default the book's shipped model `name` (chapter 14's, chapter
    18's "multi30k_cpu_subword" or chapter 21's "multi30k_cpu_fast_dropout"), downloaded when
    it is missing (outside a copy of the repository). Only with train_if_missing=True does a
    missing model that cannot be downloaded get trained, with its preset (half an hour or more
    on a CPU).
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
    vocab_src, vocab_tgt = read_run_vocabularies(file.parent, config)
    model = make_model(
        len(vocab_src), len(vocab_tgt), N=config.N, d_model=config.d_model, d_ff=config.d_ff,
        h=config.h, dropout=0.0, share_embeddings=config.share_embeddings,
    )
    model.load_state_dict({key: tensor.float() if tensor.is_floating_point() else tensor
                           for key, tensor in state["model"].items()})
    return model.to(device).eval(), vocab_src, vocab_tgt, config


# %%
import io
import os
import random
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SUBWORD_FILES = ("subwords_src.model", "subwords_tgt.model")  # share_vocab=False: one per side


def sample_sentences(sentences: Iterable[str], k: int, *, seed: int = 0) -> list[str]:
    """At most k of the non-empty sentences, each with the same chance, in the order they came
    (all of them when there are no more than k): reservoir sampling, which reads the text once
    and holds only k sentences at a time."""
    rng = random.Random(seed)
    kept: list[tuple[int, str]] = []  # (position among the non-empty sentences, sentence)
    for position, sentence in enumerate(s for s in sentences if s):
        if not isinstance(sentence, str):
            raise TypeError("sentences must hold only strings")
        if len(kept) < k:
            kept.append((position, sentence))
        elif (slot := rng.randrange(position + 1)) < k:  # kept with chance k / (position + 1)
            kept[slot] = (position, sentence)
    return [sentence for _, sentence in sorted(kept, key=lambda item: item[0])]


def train_subword_model(
    sentences: Iterable[str],
    *,
    vocab_size: int = 8000,
    max_sentences: int = 1_000_000,
    character_coverage: float = 1.0,
    seed: int = 0,
) -> Any:
    """Chapter 17's train_sentencepiece model (BPE, lossless, byte fallback, in memory) from at
    most max_sentences of the sentences (sample_sentences with seed: every one, in order, when
    there are no more), with character_coverage, the share of the text's characters that get
    pieces of their own (the rarest others are spelled in bytes)."""
    import sentencepiece as spm

    if isinstance(sentences, str):
        raise TypeError("sentences must be an iterable of sentences, got one str: wrap it")
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size <= 4:
        raise ValueError(f"vocab_size must be an integer > 4 (the specials), got {vocab_size!r}")
    if isinstance(max_sentences, bool) or not isinstance(max_sentences, int) or max_sentences < 1:
        raise ValueError(f"max_sentences must be an integer >= 1, got {max_sentences!r}")
    if isinstance(character_coverage, bool) or not isinstance(character_coverage, int | float) or (
            not 0 < character_coverage <= 1):
        raise ValueError(f"character_coverage must be in (0, 1], got {character_coverage!r}")
    sample = sample_sentences(sentences, max_sentences, seed=seed)
    if not sample:
        raise ValueError("sentences holds no non-empty sentence to train on")
    model = io.BytesIO()
    try:  # chapter 17's options, with character_coverage
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sample), model_writer=model, vocab_size=vocab_size,
            model_type="bpe", character_coverage=character_coverage, byte_fallback=True,
            normalization_rule_name="identity", remove_extra_whitespaces=False,
            bos_id=SPECIALS.index("<s>"), bos_piece="<s>",
            eos_id=SPECIALS.index("</s>"), eos_piece="</s>",
            pad_id=SPECIALS.index("<blank>"), pad_piece="<blank>",
            unk_id=SPECIALS.index("<unk>"), unk_piece="<unk>",
            num_threads=1, minloglevel=2,
        )
    except RuntimeError as err:  # e.g. vocab_size larger than the text allows
        raise ValueError(f"sentencepiece could not train vocab_size={vocab_size} (bpe) on "
                         f"{len(sample)} sentences: {err}") from err
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def vocabulary_files(config: TrainConfig) -> tuple[str, ...]:
    """The files that hold a run's vocabularies in its folder: two word vocabularies, one joint
    sentencepiece model, or with share_vocab=False one sentencepiece model per language."""
    if not config.subwords:
        return tuple(VOCAB_FILES)
    return (SUBWORD_FILE,) if config.share_vocab else SUBWORD_FILES


def vocabulary_writers(config: TrainConfig, vocab_src: Any, vocab_tgt: Any
                       ) -> dict[str, Callable[[Path], Any]]:
    """Each of the run's vocabulary files with what writes it, for write_run_files."""
    if not config.subwords:
        return dict(zip(VOCAB_FILES, (vocab_src.save, vocab_tgt.save), strict=True))

    def writer(proto: bytes) -> Callable[[Path], Any]:
        return lambda path: Path(path).write_bytes(proto)

    models = (vocab_src,) if config.share_vocab else (vocab_src, vocab_tgt)
    return {name: writer(sp.serialized_model_proto())
            for name, sp in zip(vocabulary_files(config), models, strict=True)}


def read_run_vocabularies(folder: str | os.PathLike, config: TrainConfig) -> tuple[Any, Any]:
    """The vocabularies that a run with this config wrote into folder (vocabulary_files)."""
    if not config.subwords or config.share_vocab:
        return read_vocabularies(folder, subwords=config.subwords > 0)
    paths = [Path(folder) / name for name in SUBWORD_FILES]
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(f"the run's vocabularies are missing: {', '.join(missing)}")
    return load_subwords(paths[0]), load_subwords(paths[1])


# %%
from collections.abc import Sequence
from typing import Any


def multi30k_vocabularies(
    config: TrainConfig,
    tokenizers: tuple[Any, Any],
    *,
    pairs: Sequence[tuple[str, str]] | None = None,
    save: bool = True,
) -> tuple[Vocab, Vocab]:
    """Chapter 17's vocabularies, with sentencepiece trained as config says (train_subword_model):
    on a sample of at most subword_sentences sentences, with character_coverage, and with
    share_vocab=False one model per language; save=True writes them into the checkpoint
    folder."""
    if pairs is None:  # train only: val and test stay unseen
        pairs = load_multi30k("train")[: config.train_limit]
    if config.subwords:
        options = {"vocab_size": config.subwords, "max_sentences": config.subword_sentences,
                   "character_coverage": config.character_coverage, "seed": config.seed}
        if config.share_vocab:  # both languages, pair by pair, as chapter 17 trains it
            sp = train_subword_model((s for pair in pairs for s in pair), **options)
            vocabs = (sp, sp)
        else:  # each language on its own side
            vocabs = tuple(train_subword_model((pair[side] for pair in pairs), **options)
                           for side in (0, 1))
    else:
        token_pairs = tokenize_pairs(pairs, *tokenizers)
        vocabs = tuple(Vocab.build([pair[side] for pair in token_pairs], min_freq=config.min_freq)
                       for side in (0, 1))
    if save:
        write_run_files(config.checkpoint_dir, vocabulary_writers(config, *vocabs))
    return vocabs


# %%
import gzip
import hashlib
import itertools
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

CORPUS_HEADER = "corpus.json"  # written last: a folder without it is an unfinished encoding
CORPUS_MODELS = ("src.model", "tgt.model")  # the sentencepiece models that made the ids


def read_lines(path: str | os.PathLike) -> Iterator[str]:
    """A plain or gzipped UTF-8 file's lines one at a time (no BOM, no line ends), so that a
    corpus of any size is read in constant memory."""
    path = Path(path)
    with path.open("rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    with (gzip.open if gzipped else open)(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            raw = raw.removesuffix(b"\n").removesuffix(b"\r")
            if number == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")  # a byte-order mark
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: line {number} is not valid UTF-8 (byte "
                                 f"{raw[err.start]:#04x} at column {err.start + 1})") from None


def model_sha256(sp: Any) -> str:
    """The SHA-256 of a sentencepiece model's bytes: which ids a corpus holds."""
    return hashlib.sha256(sp.serialized_model_proto()).hexdigest()


def write_npy(path: Path, raw: Path, dtype: np.dtype, count: int) -> None:
    """path as an .npy file holding the count values of dtype written raw into raw (a copy
    in blocks: the array is never in memory), and raw deleted."""
    with path.open("wb") as out, raw.open("rb") as f:
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                  "fortran_order": False, "shape": (count,)}
        np.lib.format.write_array_header_2_0(out, header)
        while block := f.read(1 << 24):
            out.write(block)
    raw.unlink()


def encode_corpus(
    src_lines: Iterable[str], tgt_lines: Iterable[str], sp: Any, folder: str | os.PathLike, *,
    max_len: int, sp_tgt: Any = None, chunk_size: int = 50_000, num_threads: int = 1,
) -> dict[str, Any]:
    """Encode a parallel text once, in chunks, into flat id arrays on disk that any number of
    training processes map (EncodedCorpus) instead of each encoding the text again.

    Pairs that do not fit max_len with `<s>` and `</s>` are left out and counted, as
    filter_by_length does. sp encodes both sides unless sp_tgt encodes the target. Writes, into
    folder: src_tokens.npy and tgt_tokens.npy (every kept pair's ids, one after the other;
    uint16 when the vocabulary fits it), src_lengths.npy and tgt_lengths.npy, the models, and
    last corpus.json, the header it returns: counts, max_len, dtype and the models' SHA-256.
    """
    filter_by_length([], max_len=max_len)  # the same check of max_len as chapter 14's
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    sps = (sp, sp if sp_tgt is None else sp_tgt)
    size = max(s.get_piece_size() for s in sps)
    dtype = np.dtype(np.uint16 if size <= 1 << 16 else np.int32)
    length_dtype = np.dtype(np.uint16 if max_len <= 1 << 16 else np.int32)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CORPUS_HEADER).unlink(missing_ok=True)  # unfinished until the header is back
    raws = [folder / f"{side}_tokens.raw" for side in ("src", "tgt")]
    lengths: list[list[np.ndarray]] = [[], []]
    read = kept = 0
    end = object()  # marks the shorter side's end
    pairs = itertools.zip_longest(src_lines, tgt_lines, fillvalue=end)
    with raws[0].open("wb") as src_out, raws[1].open("wb") as tgt_out:
        while chunk := list(itertools.islice(pairs, chunk_size)):
            if chunk[-1][0] is end or chunk[-1][1] is end:
                short = "source" if chunk[-1][0] is end else "target"
                done = read + sum(end not in pair for pair in chunk)
                raise ValueError(f"the {short} side ends after {done:,} lines but the other "
                                 "goes on: a parallel text has as many lines on both sides")
            # 1) both sides' ids, 2) which pairs fit max_len, 3) append the kept ones
            ids = [s.encode([pair[side] for pair in chunk], num_threads=num_threads)
                   for side, s in enumerate(sps)]
            n = [np.fromiter(map(len, side), dtype=np.int64, count=len(chunk)) for side in ids]
            keep = np.maximum(n[0], n[1]) + 2 <= max_len
            for side, out in enumerate((src_out, tgt_out)):
                flat = itertools.chain.from_iterable(itertools.compress(ids[side], keep))
                out.write(np.fromiter(flat, dtype=dtype, count=int(n[side][keep].sum()))
                          .tobytes())
                lengths[side].append(n[side][keep].astype(length_dtype))
            read, kept = read + len(chunk), kept + int(keep.sum())
    header = {"format": "EncodedCorpus", "version": 1, "pairs": kept, "read": read,
              "dropped": read - kept, "max_len": max_len, "dtype": dtype.name,
              "vocab_src_sha256": model_sha256(sps[0]),
              "vocab_tgt_sha256": model_sha256(sps[1])}
    for side, raw, chunks in zip(("src", "tgt"), raws, lengths, strict=True):
        counts = np.concatenate([np.zeros(0, dtype=length_dtype), *chunks])
        header[f"{side}_tokens"] = int(counts.sum(dtype=np.int64))
        write_npy(folder / f"{side}_tokens.npy", raw, dtype, header[f"{side}_tokens"])
        np.save(folder / f"{side}_lengths.npy", counts)
    for s, name in zip(sps, CORPUS_MODELS, strict=True):
        (folder / name).write_bytes(s.serialized_model_proto())
    (folder / CORPUS_HEADER).write_text(json.dumps(header, indent=1) + "\n", "utf-8")
    return header


# %%
import json
import operator
import os
from pathlib import Path
from typing import Any

import numpy as np


class EncodedCorpus:
    """A corpus that encode_corpus wrote, memory-mapped: the ids stay on disk, and the pages
    that batches read are shared by every process that maps the same files.

    corpus[i] is pair i's (source ids, target ids) as encode_examples gives them, corpus[:n]
    its first n pairs (as does EncodedCorpus(folder, n)); src_lengths and tgt_lengths count
    each pair's ids (without `<s>` and `</s>`).
    """

    def __init__(self, folder: str | os.PathLike, pairs: int | None = None) -> None:
        self.folder = Path(folder)
        path = self.folder / CORPUS_HEADER
        if not path.is_file():
            raise FileNotFoundError(f"{self.folder} holds no finished encoded corpus (no "
                                    f"{CORPUS_HEADER}): encode it with encode_corpus")
        self.header = json.loads(path.read_text("utf-8"))
        if self.header.get("format") != "EncodedCorpus":
            raise ValueError(f"{path} is not the header of an encoded corpus")
        self.src_tokens, self.tgt_tokens, src_lengths, tgt_lengths = (
            np.load(self.folder / f"{name}.npy", mmap_mode="r")
            for name in ("src_tokens", "tgt_tokens", "src_lengths", "tgt_lengths"))
        if not len(src_lengths) == len(tgt_lengths) == self.header["pairs"]:
            raise ValueError(f"{self.folder}: the length arrays do not hold the "
                             f"{self.header['pairs']} pairs that {CORPUS_HEADER} counts")
        self.pairs = len(src_lengths) if pairs is None else min(pairs, len(src_lengths))
        self.src_lengths, self.tgt_lengths = src_lengths[: self.pairs], tgt_lengths[: self.pairs]
        # where each pair's ids start, in the process's own memory (8 bytes a pair a side)
        self.src_starts = np.concatenate([[0], np.cumsum(self.src_lengths, dtype=np.int64)])
        self.tgt_starts = np.concatenate([[0], np.cumsum(self.tgt_lengths, dtype=np.int64)])

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its folder and size: a process it is sent to maps the files itself."""
        return EncodedCorpus, (str(self.folder), self.pairs)

    def __len__(self) -> int:
        return self.pairs

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            if i.start not in (None, 0) or i.step not in (None, 1):
                raise ValueError(f"an encoded corpus is cut from its start only (corpus[:n]), "
                                 f"got [{i.start}:{i.stop}:{i.step}]")
            return EncodedCorpus(self.folder, range(self.pairs)[i].stop)
        i = operator.index(i)
        if not -self.pairs <= i < self.pairs:
            raise IndexError(f"pair {i} is out of range for a corpus of {self.pairs} pairs")
        i %= self.pairs
        return (self.src_tokens[self.src_starts[i] : self.src_starts[i + 1]].tolist(),
                self.tgt_tokens[self.tgt_starts[i] : self.tgt_starts[i + 1]].tolist())

    def vocabularies(self) -> tuple[Any, Any]:
        """The sentencepiece models that encoded the two sides (one object twice when joint)."""
        src = load_subwords(self.folder / CORPUS_MODELS[0])
        if self.header["vocab_src_sha256"] == self.header["vocab_tgt_sha256"]:
            return src, src
        return src, load_subwords(self.folder / CORPUS_MODELS[1])


# %%
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler


class StoredLengthSampler(Sampler[list[int]]):
    """TokenBudgetSampler's batches, the same ones, computed with numpy from length arrays:
    no Python object per example in the batches (check_token_budget walks the lengths once as
    lists), so a rank's batches of millions of pairs stay small."""

    def __init__(self, src_lengths: Sequence[int], tgt_lengths: Sequence[int], *, max_tokens: int,
                 pool_size: int | None = None, shuffle: bool = True, seed: int = 0,
                 num_replicas: int = 1, rank: int = 0) -> None:
        super().__init__()
        self.src_lengths = np.asarray(src_lengths, dtype=np.int32)  # (examples,)
        self.tgt_lengths = np.asarray(tgt_lengths, dtype=np.int32)  # (examples,)
        check_token_budget(self.src_lengths.tolist(), self.tgt_lengths.tolist(),
                           max_tokens=max_tokens, pool_size=pool_size,
                           num_replicas=num_replicas, rank=rank)
        self.max_tokens = max_tokens
        self.pool_size = pool_size or len(self.src_lengths)
        self.shuffle, self.seed, self.epoch = shuffle, seed, 0
        self.num_replicas, self.rank = num_replicas, rank
        self._cache: tuple[int, list[np.ndarray]] | None = None  # (epoch, its batches)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch and with it the order; call it with the same epoch on every rank."""
        self.epoch = epoch

    def _fill(self, pool: np.ndarray, longest: np.ndarray) -> list[np.ndarray]:
        """Cut a pool sorted by its longer sides into batches, as TokenBudgetSampler's _fill.

        A batch's padded size is its size times its last (longest) example's longer side, so
        a batch from `start` takes examples while (k + 1) x longest[start + k] fits."""
        batches, start = [], 0
        while start < len(pool):
            window = longest[start : start + self.max_tokens // int(longest[start]) + 1]
            padded = np.arange(1, len(window) + 1) * window  # the size with each next example
            over = padded > self.max_tokens
            size = int(np.argmax(over)) if over.any() else len(window)
            batches.append(pool[start : start + size])
            start += size
        return batches

    def batches(self) -> list[np.ndarray]:
        """All ranks' batches of this epoch, in order (rank r takes every num_replicas-th)."""
        if self._cache is not None and self._cache[0] == self.epoch:
            return self._cache[1]
        n = len(self.src_lengths)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).numpy() if self.shuffle else np.arange(n)
        batches = []
        for start in range(0, n, self.pool_size):
            # 1) shuffled pool, 2) sorted by (longer, src, tgt) length, stable, 3) cut
            pool = order[start : start + self.pool_size]
            src, tgt = self.src_lengths[pool], self.tgt_lengths[pool]
            longest = np.maximum(src, tgt)
            by_length = np.lexsort((tgt, src, longest))  # the last key sorts first
            batches += self._fill(pool[by_length], longest[by_length])
        batches = split_batches_for_ranks(batches, self.num_replicas)  # the same count per rank
        if self.shuffle:  # 4) shuffle the batches themselves
            batches = [batches[j] for j in torch.randperm(len(batches), generator=generator)]
        self._cache = (self.epoch, batches)
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.batches()[self.rank :: self.num_replicas]:
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self.batches()) // self.num_replicas


def corpus_loader(corpus: EncodedCorpus, *, max_tokens: int, shuffle: bool, seed: int = 0,
                  num_replicas: int = 1, rank: int = 0) -> DataLoader:
    """multi30k_loader for an encoded corpus: batches from its stored lengths, ids read from
    the mapped files only when a batch is drawn."""
    sampler = StoredLengthSampler(
        corpus.src_lengths.astype(np.int32) + 2, corpus.tgt_lengths.astype(np.int32) + 2,
        max_tokens=max_tokens, shuffle=shuffle, seed=seed, num_replicas=num_replicas, rank=rank,
    )  # with <s> and </s>, as example_lengths counts
    return DataLoader(corpus, batch_sampler=sampler, collate_fn=collate_to_batch)


# %%
from typing import Any


def load_encoded_data(process: Process, config: TrainConfig,
                      pairs: dict[str, Any], *, resuming: bool) -> RunData:
    """load_data for pairs["train"] an EncodedCorpus: its own subword models (the checkpoint's
    when resuming, which must be the same), val encoded here, train batched from its stored
    lengths; every rank maps the files that were encoded once."""
    corpus: EncodedCorpus = pairs["train"]
    header = corpus.header
    if header["max_len"] != config.max_len:
        raise ValueError(f"the encoded corpus {corpus.folder} was cut at max_len="
                         f"{header['max_len']} but the run has max_len={config.max_len}: "
                         "encode it again with the run's max_len")
    if config.share_vocab and header["vocab_src_sha256"] != header["vocab_tgt_sha256"]:
        raise ValueError(f"the encoded corpus {corpus.folder} has one vocabulary per side but "
                         "the run shares one (share_vocab=True): encode both sides with one")

    def vocabularies() -> tuple[Any, Any]:
        if resuming:
            return read_run_vocabularies(config.checkpoint_dir, config)
        return corpus.vocabularies()

    vocab_src, vocab_tgt = from_rank0(process, vocabularies)
    stored = (header["vocab_src_sha256"], header["vocab_tgt_sha256"])
    if (model_sha256(vocab_src), model_sha256(vocab_tgt)) != stored:
        raise ValueError(f"the encoded corpus {corpus.folder} holds the ids of other subword "
                         f"models than {config.checkpoint_dir}'s: encode it again")
    if config.subwords != len(vocab_src):
        raise ValueError(f"subwords={config.subwords} but the encoded corpus {corpus.folder} "
                         f"has {len(vocab_src)} pieces: set subwords={len(vocab_src)}")
    val_data = encode_examples(pairs["val"], vocab_src, vocab_tgt, (None, None),
                               max_len=config.max_len)
    shard = {"max_tokens": config.max_tokens, "num_replicas": process.world_size,
             "rank": process.rank, "seed": config.seed}
    train_loader = corpus_loader(corpus, shuffle=True, **shard)
    val_loader = multi30k_loader(val_data, shuffle=False, **shard)
    # the training pairs that max_len left out were counted when the corpus was encoded
    return RunData(vocab_src, vocab_tgt, train_loader, val_loader, list(pairs["val"]),
                   (None, None), (header["dropped"], len(pairs["val"]) - len(val_data)))
