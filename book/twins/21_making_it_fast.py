# %% [markdown]
# # Making it fast
#
# The model of Part I was written to be read: every attention weight is a tensor you can print,
# decoding recomputes the whole prefix at every step, and the loss builds the smoothed target
# distribution in full. This chapter keeps that model and adds, beside it, the paths that a
# production Transformer takes: a key/value cache for decoding, PyTorch's fused attention and
# layer norm, packed projections, a loss in one call, and batches cut by a token budget. Each one
# is a switch, and each one is checked here to give the readable code's result. `make bench`
# (`tools/bench.py`) measures what they buy, and the chapter ends with a recipe that trains the
# book's best model in under half an hour of training on a 2-core Xeon, and asks what half an hour
# buys on a slower CPU capped to AVX2.

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
    Embeddings,
    EncoderDecoder,
    LayerNorm,
    LearnedPositionalEmbedding,
    MultiHeadedAttention,
    PositionalEncoding,
    PositionwiseFeedForward,
    _beam_limits,
    attention,
    attention_maps,
    beam_search,
    bench_results,
    bench_table,
    book_data,
    greedy_decode,
    length_penalty,
    lever_table,
    load_tokenizers,
    load_trained_model,
    make_model,
    rate,
    recipe_runs,
    recipe_table,
    source_batch,
    subsequent_mask,
    tokenize,
    training_config,
)

# %% [markdown]
# ## Decoding with a key/value cache
#
# Chapter 5's `greedy_decode` runs the decoder over the whole prefix at every step: to choose
# token $t+1$ it embeds tokens $0 \dots t$ again, projects all of them into queries, keys and
# values in every layer, and keeps only the last output. The decoder is causal, so nothing about
# the first $t$ positions changed when token $t$ arrived: their keys and values in each layer
# are the ones computed one step earlier. A decoder that keeps them needs, per step, only the
# new token: one query, one key and one value per layer, and one row through the feed-forward
# networks. A sentence of $n$ tokens then costs $n$ decoder positions instead of
# $1 + 2 + \dots + n = n(n+1)/2$.
#
# The cache keeps or changes three things:
#
# 1. **Self-attention keys and values, per layer.** Each step appends the new token's key and
#    value, (rows, h, 1, $d_k$), to those kept, (rows, h, t, $d_k$), and the new query attends
#    to all of them. It needs no mask: every earlier token is visible, none later exists yet.
# 2. **The memory's keys and values, once.** Attention to the source projects the encoder's
#    output with each decoder layer's $W^K$ and $W^V$. The memory does not change while a
#    sentence is decoded, so `DecoderCache` projects it once per sentence, not once per step.
# 3. **Finished sentences leave the batch.** When a sentence has produced `</s>`,
#    `DecoderCache.select` drops its rows, so the remaining steps compute only the sentences
#    still going.
#
# `decode_step` runs one step through the layers of a model that `make_model` built, reusing
# each layer's own sublayer connections and linear maps, so either layer-norm placement works.
# `PackedLinear` stacks each self-attention's $W^Q$, $W^K$ and $W^V$ into one matrix, once per
# call, so that every step projects the new token with one matrix product instead of three; the
# memory's $W^K$ and $W^V$ are stacked the same way.

# %% tags=["export"]
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


# %% tags=["export"]
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


# %% [markdown]
# Greedy decoding with the cache keeps a tensor `rows` that says which sentence each row of
# the cache belongs to. The output is allocated at its full length and filled in, so a sentence
# that has left the batch keeps its `</s>` padding, and the loop ends when the last sentence
# ends: the output is `greedy_decode`'s, shape and all. `greedy_decode` grows one keyword,
# `use_cache`, that hands the work over; the default keeps chapter 14's loop, the reference that
# the check below compares against.

# %% tags=["export"]
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


# %% [markdown]
# Beam search (chapter 15) grows the same keyword. Its rows are the live hypotheses of all
# sentences, and they change at every step: a hypothesis in slot 2 may extend the one that sat
# in slot 0. So after choosing the best candidates, `beam_search` records for each slot the
# cache row of the hypothesis it extends, and at the next step `DecoderCache.select` gathers
# those rows of the self-attention keys and values. The memory's keys and values depend only on
# the sentence: `DecoderCache` keeps them once per sentence, with a tensor `sentence` that names
# each row's sentence, and copies them to the rows only when that tensor changes, which happens
# when the beam first widens and when a sentence finishes. Most steps only reorder hypotheses
# within their sentences and copy nothing of the memory.

# %% tags=["export", "extends"]
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


# %% [markdown]
# The check: on a small untrained model, with padding in the source, the cached decoders give
# exactly the ids of the recomputing ones, greedy with and without an end symbol, and beams of 1
# and 4. An untrained model rarely produces `</s>` by chance, so we make it likelier by raising
# its bias in the generator: then sentences end at different steps, and one runs to `max_len`.

# %%
torch.manual_seed(0)
small = make_model(40, 40, N=2, d_model=64, d_ff=128, h=4).eval()
with torch.no_grad():
    small.generator.proj.bias[1] += 1.5  # </s> (id 1) now ends most sentences, at various steps
src = torch.randint(3, 40, (6, 11))
src[1, 7:] = src[4, 4:] = 2  # padding (id 2)
src_mask = (src != 2).unsqueeze(-2)  # (6, 1, 11)
for end_symbol in (1, None):
    readable = greedy_decode(small, src, src_mask, 20, 0, end_symbol=end_symbol)
    cached = greedy_decode(small, src, src_mask, 20, 0, end_symbol=end_symbol, use_cache=True)
    assert torch.equal(readable, cached)
    print(f"greedy, end_symbol={end_symbol}: same ids {tuple(cached.shape)}")
for k in (1, 4):
    beams = [beam_search(small, src, src_mask, max_len=20, start_symbol=0, end_symbol=1,
                         beam_size=k, use_cache=cache) for cache in (False, True)]
    assert torch.equal(beams[0][0], beams[1][0])
    assert torch.allclose(beams[0][1], beams[1][1], atol=1e-4)
    print(f"beam {k}: same ids {tuple(beams[1][0].shape)}, scores within 1e-4")

# %% [markdown]
# And on the model that chapter 14 trained, which translates for real: five German sentences,
# greedy and beam 4 with the cache give the recomputing decoders' translations, token for
# token.

# %%
model, vocab_src, vocab_tgt, _ = load_trained_model()
german = load_tokenizers()[0]
sentences = ["Zwei Hunde spielen im Schnee.", "Ein Mann fährt mit dem Fahrrad die Straße entlang.",
             "Eine Frau in einem roten Kleid singt auf einer Bühne.", "Kinder lachen.",
             "Ein kleines Mädchen mit einem Hut sitzt auf einer Bank im Park und liest ein Buch."]
src, src_mask = source_batch([vocab_src.encode(tokenize(s, german)) for s in sentences],
                             device=torch.device("cpu"))
greedy = [greedy_decode(model, src, src_mask, 72, 0, end_symbol=1, use_cache=c)
          for c in (False, True)]
beam = [beam_search(model, src, src_mask, max_len=60, start_symbol=0, end_symbol=1,
                    use_cache=c)[0] for c in (False, True)]
assert torch.equal(*greedy) and torch.equal(*beam)
for row in beam[1][:, 1:].tolist():
    print(" ".join(vocab_tgt.lookup_tokens(row[: row.index(1)] if 1 in row else row)))

# %% [markdown]
# ## The fast path
#
# `attention` of chapter 3 computes the scores $QK^\top/\sqrt{d_k}$, masks them, applies the
# softmax, and multiplies by $V$: four operations, each of which writes a (batch, h, $n_q$,
# $n_k$) tensor to memory and reads it back, and in training keeps it for the backward pass.
# PyTorch's `torch.nn.functional.scaled_dot_product_attention` does the same arithmetic in one
# call that picks a fused kernel where one exists. Such a kernel, in the manner of
# FlashAttention {cite}`dao2022flashattention`, walks over blocks of keys while keeping running
# softmax statistics, so the full weight matrix is never stored, and recomputes what the
# backward pass needs.
#
# `FastMultiHeadedAttention` is `MultiHeadedAttention` with only its `forward` changed: the
# same four linear maps, so a state dict moves between the two unchanged, and the fused call in
# place of `attention`. It does not keep the weights, which is the point; but chapter 12's
# `attention_maps` and chapter 24's pictures read `.attn`. So the module keeps a reference to
# the last queries and keys, and `.attn` computes the weights (before dropout) from them when,
# and only when, someone reads it.
#
# Three smaller changes do the same arithmetic in fewer calls:
#
# - **Packed projections.** In self-attention the query, key and value are one tensor, so their
#   three projections become one product with $W^Q$, $W^K$ and $W^V$ side by side, whose output is
#   cut in three; attention to the memory packs $W^K$ and $W^V$ the same way. One wide product
#   should keep a CPU's vector units busier than three narrow ones. The weights stay three
#   `nn.Linear` modules, concatenated at every call, so the state dict does not change.
# - **`FastLayerNorm`** computes chapter 2's layer norm with `F.layer_norm`, one kernel forward
#   and one backward, where the readable version writes a full tensor for each of its mean,
#   variance, subtraction, square root, division, product and sum.
# - **`FastEmbeddings`** drops chapter 4's check that every token id lies inside the
#   vocabulary. That check reads the ids' minimum and maximum on the host, so on a GPU every
#   forward pass waits for the device to catch up (a host sync). `nn.Embedding` itself still
#   fails on an id out of range, only with a less helpful message.
#
# `use_fast_path(model)` switches a built model to the fast classes in place, and
# `use_fast_path(model, False)` back.

# %% tags=["export"]
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


# %% [markdown]
# The check: a readable model and its fast copy, in eval mode and in train mode with dropout
# 0, on a batch whose source and target are padded, with the target's causal mask. The
# outputs, the loss's gradients with respect to every parameter, and the attention maps that
# chapter 12 draws agree to float32 rounding; the state dict of the one loads into the other.

# %%
import copy

torch.manual_seed(0)
readable = make_model(40, 40, N=2, d_model=64, d_ff=128, h=4, dropout=0.0)
fast = use_fast_path(copy.deepcopy(readable))
src = torch.randint(3, 40, (4, 9))
tgt = torch.randint(3, 40, (4, 7))
src[1, 6:] = tgt[2, 4:] = 2
src_mask = (src != 2).unsqueeze(-2)  # (4, 1, 9)
tgt_mask = (tgt != 2).unsqueeze(-2) & subsequent_mask(7)  # (4, 7, 7)
for mode in ("eval", "train"):
    outputs, grads = [], []
    for m in (readable, fast):
        m.train(mode == "train")
        m.zero_grad()
        out = m(src, tgt, src_mask, tgt_mask)
        m.generator(out).sum().backward()
        outputs.append(out)
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    out_diff = (outputs[0] - outputs[1]).abs().max().item()
    grad_diff = (grads[0] - grads[1]).abs().max().item()
    assert out_diff < 1e-5 and grad_diff < 1e-4, (out_diff, grad_diff)
    print(f"{mode}: outputs and gradients agree within 1e-5 and 1e-4")
maps = [attention_maps(m, src, torch.where(tgt == 2, 2, tgt))[0] for m in (readable, fast)]
assert all(torch.allclose(getattr(maps[0], k), getattr(maps[1], k), atol=1e-6)
           for k in ("encoder", "decoder", "cross"))
print("attention_maps: the same weights from both;",
      "fast keeps none until read:", fast.decoder.layers[0].self_attn.__dict__.get("attn"))
readable.load_state_dict(fast.state_dict())
fast.load_state_dict(readable.state_dict())
print("state dicts load across:", list(readable.state_dict()) == list(fast.state_dict()))

# %% [markdown]
# ## The loss in one call
#
# Chapter 11's `LabelSmoothing` builds the smoothed target distribution, a (rows, V) tensor,
# and sums the KL divergence to it. `label_smoothing_loss` computes the same value and gradient
# from `F.cross_entropy`, which fuses the softmax and the loss and never builds that tensor.
# PyTorch's smoothing is not quite the book's (it spreads its mass over padding and the target
# too, and it returns a cross-entropy), so two small corrections follow the call.
# `FusedLabelSmoothing` is `LabelSmoothing` computed that way. The algebra, and the check that
# value and gradient match, are in {doc}`appendix_performance`.
#
# ## Batching by tokens
#
# The last gain is not in the model but in what it is fed. Chapter 9's `TokenBudgetSampler`
# sorts sentences by length within a pool and cuts batches that fit a budget of padded tokens,
# so almost no position is padding. The simplest alternative pads every sentence to the longest
# one allowed, 72 tokens. Multi30k's sentences are far shorter, so most of such a batch is
# padding, which costs as much to compute as real tokens. `make bench` compares the two at the
# same padded size per batch, counting only real target tokens.

# %% [markdown]
# ## What it buys
#
# `make bench` runs every row in one process, on one thread, and repeats it; the table gives
# the median with the range, and each row's ratio to the first row of its group. The training
# rows time steps (forward, backward and an Adam step, with dropout) of the readable model, of
# the fast path with `label_smoothing_loss` and Adam's fused step, of `torch.nn.Transformer`
# between the same embeddings and generator, and of the fast path under bfloat16 autocast. Then
# come the two batchings and the decoders. At the cpu size the decoders translate Multi30k
# validation sentences with the shipped model; no trained model of the base size exists, so
# there an untrained one decodes random ids of Multi30k's lengths, every output 15 tokens long.
# The numbers come from `book/data/bench_cpu.json`, written by one run on a 2-core cloud CPU
# with bfloat16 matrix units (the first line names it). Absolute speeds belong to that machine;
# the ratios within a group are what the run can tell.

# %%
results = bench_results()
hw = results["hardware"]
print(f"{hw['cpu']}, {hw['cores']} cores, {hw['threads']} thread(s), torch {hw['torch']}, "
      f"{results['repeats']} repeats; matmul peak {results['matmul_peak_gflops']:.1f} GFLOP/s "
      f"in float32, {results['matmul_peak_bf16_gflops']:.1f} in bfloat16")
for size, source in results["decoding_sources"].items():
    print(f"decoding at the {size} size: {source}")
bench_table(results).drop(columns="group").set_index(["size", "row"])

# %% [markdown]
# What to look for, mostly in the ratio column (one run, so a demonstration; the ranges show
# how much each row moved between repeats):
#
# - **Decoding gains the most.** The cache makes batched greedy decoding about three to five
#   times as fast, and beam search gains as much; the cached decoders give the recomputing
#   ones' tokens (the tokens column). At the base size, batching and the cache together leave
#   the classic decoder, which translates one sentence at a time, over ten times behind.
# - **The token budget** gives several times the real tokens per second of padding every batch to
#   72.
# - **Training on the fast path** is ahead of the readable model at both sizes, and level with or
#   a little ahead of `torch.nn.Transformer`: the same matrices, in fewer kernels. It buys speed,
#   not memory (the `peak MB` column).
# - **bfloat16 autocast**, on this CPU's matrix units, adds the largest training gain of all,
#   most at the base size, and speeds up decoding too; but its decoded sentences are not all
#   float32's (the tokens column), and a bench cannot tell what it does to a training run.
#
# {doc}`appendix_performance` reads the run further: each ratio, memory and MFU, a roofline
# that bounds how far float32 decoding with the cache can go on a CPU, the same bench on a GPU,
# and a bfloat16 training step on a CPU.

# %% [markdown]
# ## Thirty minutes on two cores
#
# Chapter 18's subword model, `cpu_subword`, trained for about 80 minutes on a 2-core EPYC: more
# than a reader gives one sitting. The preset `cpu_fast_dropout` keeps its model, data, vocabulary
# and the paper's rate schedule, and trains a model about as good in under half an hour of
# training on a 2-core Xeon. Part of that gain is the Xeon's: on the EPYC, the same recipe took 42
# minutes (chapter 18's peer run; the table below names each run's CPU). The recipe:
#
# - **The fast path** (`fast=True`). The trainer (chapter 22) switches the model with
#   `use_fast_path`, takes Adam's fused step, and computes the loss with `FusedLabelSmoothing`.
#   The arithmetic is the one checked above, so this buys time and nothing else.
# - **Half the batch, twice the steps.** Batches of 750 tokens instead of 1,500 give an epoch
#   twice as many optimizer steps, each from half as much data. After its warm-up the paper's rate
#   falls as $\text{step}^{-1/2}$, so at the same point of the data the smaller batches' rate is
#   $1/\sqrt{2}$ of the larger ones': the square-root rule that Malladi et al. derived for Adam
#   when the batch size changes {cite}`malladi2022sdes`, in its rate only (it also rescales Adam's
#   $\beta$s and $\epsilon$). Twice the warm-up steps keep the warm-up at the same share of the
#   data and scale its peak by the same $1/\sqrt{2}$, so the whole schedule follows the rule.
# - **Dropout where the paper puts it** (`paper_dropout=True`). Section 5.4 drops each sublayer's
#   output before the residual sum, and the sums of embeddings and positions. Chapter 11, like the
#   classic Annotated Transformer, also drops the attention weights and the feed-forward layer's
#   hidden units. On a CPU those sites are expensive: dropout draws one random number per element,
#   the hidden layer is four times as wide as the model, and attention with dropout cannot take
#   PyTorch's fused kernel. `paper_dropout_only` sets the rate of those two kinds of site to zero
#   and leaves the others at the configured rate.
# - **11 epochs**, the last two averaged (chapter 16).
#
# The preset `cpu_fast` is the same recipe without dropout, for 6 epochs. `TrainConfig` grows by
# the fields `fast`, `paper_dropout`, `decay` and `cpu_bf16`, and `training_config` by the two
# presets; the definitions are in {doc}`appendix_performance`. The cell below prints what each
# preset changes, and checks the square-root rule at a few points of the data.

# %% tags=["export"]
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


# %%
subword, fast = training_config("cpu_subword"), training_config("cpu_fast")
half_hour = training_config("cpu_fast_dropout")
for (a, b), (old, new) in {("cpu_subword", "cpu_fast"): (subword, fast),
                           ("cpu_fast", "cpu_fast_dropout"): (fast, half_hour)}.items():
    print(f"{a} -> {b}")
    for name, value in vars(new).items():
        if getattr(old, name) != value:
            print(f"{name:>14}: {getattr(old, name)!r} -> {value!r}")
# the same point of the data: step s of 1,500-token batches, step 2s of 750-token ones
for s in (500, 1000, 2000, 3000):
    big = rate(s, subword.d_model, subword.lr_factor, subword.warmup)
    small = rate(2 * s, fast.d_model, fast.lr_factor, fast.warmup)
    print(f"1,500 tokens, step {s:>4}: {big:.2e}   750 tokens, step {2 * s:>4}: {small:.2e}"
          f"   ratio {small / big:.3f}")
    assert abs(small / big - 2**-0.5) < 1e-9  # the square-root rule, at every step

# %% [markdown]
# ### On the slower EPYC, capped to AVX2
#
# The half hour above is the Xeon's. Many laptops and cloud machines stop at AVX2, vectors half as
# wide as AVX-512's. On the EPYC capped to AVX2, an epoch of this model took longer than on the
# Xeon, but not much longer than uncapped (chapter 18's peer run, `cpu_fast` below): these runs
# measure a slower machine more than narrower vectors. The preset `cpu_avx2` trains the same model
# with the same dropout for less: seven epochs, with the rate falling after its warm-up in a
# straight line to zero (`decay="linear"`), so that a run this short ends at a low rate; a warm-up
# of 1,000 steps instead of 2,000; and 4,000 subwords instead of 8,000, which cut a sentence into
# more tokens but make each one cheaper, the output layer being half as wide.

# %%
avx2 = training_config("cpu_avx2")
print("cpu_fast_dropout -> cpu_avx2")
for name, value in vars(avx2).items():
    if getattr(half_hour, name) != value:
        print(f"{name:>14}: {getattr(half_hour, name)!r} -> {value!r}")

# %% [markdown]
# Each of its runs was on an AMD EPYC with AVX-512, its kernel libraries capped to AVX2 at
# start-up (`ATEN_CPU_CAPABILITY=avx2`, `ONEDNN_MAX_CPU_ISA=AVX2`,
# `MKL_ENABLE_INSTRUCTIONS=AVX2`). The capped EPYC keeps its own caches and clock, so it
# approximates an AVX2 CPU; no CPU that stops at AVX2 ran these recipes. `tools/levers.py` timed
# the recipe's training step against variants that each move one lever, on the same sentences, in
# turns:

# %%
levers = book_data("levers_avx2.json")
cpu = levers["cpu"]
print(f"{levers['hardware']}, torch {levers['torch']}: vector flags "
      f"{', '.join(cpu['vector_flags'])}; kernels {cpu['torch_kernels']}; caps {cpu['caps']}")
print(f"padding: {levers['padding_share']:.1%} of the positions in the recipe's batches")
rows = {row["lever"]: row for row in levers["levers"]}
for slower in ("torch.compile of the model", "1,500-token batches"):  # in every repeat
    assert all(a > b for a, b in zip(rows[slower]["seconds"], levers["levers"][0]["seconds"],
                                     strict=True))
lever_table(levers)

# %% [markdown]
# One run of the tool: compare each lever with the recipe repeat by repeat. `torch.compile` and
# 1,500-token batches were slower in every repeat, and larger batches also halve the optimizer
# steps. Fewer subwords were faster despite more tokens, 6,000 in every repeat and 4,000 not in
# every one; single runs of seven epochs point the same way (the runs below). Dropout at the
# paper's sites stayed within the spread of the repeats, and packing could save at most the
# padding printed above the table. None of this brings the EPYC's epochs down to the Xeon's, so
# `cpu_avx2` mainly trains for fewer epochs.

# %% [markdown]
# ### The runs behind the recipe
#
# Each row below is a configuration, named by the nearest preset and the fields in which it
# differs, with its seeds and CPU. The scores are BLEU on the validation set, beam 4 on the last
# epoch's weights and on the average of the last two; with several seeds, the mean and the range.
# The presets were chosen on these scores, and the test set was read only afterwards, for the
# chosen weights. Minutes are training minutes, without the validation after each epoch; they
# compare only within one CPU, and even there roughly: on the EPYC, `cpu_fast`'s slowest seed took
# half as long again as its fastest. A run with the paper's decay that was also scored after an
# earlier epoch gives that shorter run too: neither that schedule nor the batch order depends on
# the number of epochs. The runs' notes are in `book/data/fast_recipe.json`.

# %%
recipe_table(recipe_runs())

# %% [markdown]
# Only this chapter's three presets have several seeds (`cpu_fast_dropout` two), and their ranges
# show how far the seed alone moves a score; every other row is one run, a demonstration, and a
# difference smaller than those ranges is not a finding. What to look for:
#
# - **The half hour reaches `cpu_subword`'s level; it does not beat it.** The seeds of
#   `cpu_fast_dropout`, with their last two epochs averaged, lie on either side of `cpu_subword`'s
#   beam score after its last epoch.
# - **Without dropout, more epochs do not pay reliably.** `cpu_fast`'s seeds stay below
#   `cpu_subword`. One ten-epoch run, on the Xeon, scored below all of them at its last epoch
#   and above all of them with its last two averaged; its validation loss rises after epoch 7
#   (the appendix).
# - **The paper's dropout sites** cost fewer minutes than dropout everywhere, for about the same
#   scores after twelve epochs. Stopped within the half hour, dropout everywhere has run fewer
#   epochs, and with its last two averaged it scores below both seeds of the preset.
# - **Averaging the last two epochs** raised the beam score in every run with the paper's rate
#   schedule; with the linear decay, whose last steps are already small, it moved the score by
#   under half a point either way, and `cpu_avx2` keeps its last epoch (`keep_epochs=0`).
# - **Half an hour on the capped EPYC is not enough for the Xeon's scores.** The three seeds of
#   `cpu_avx2` trained well inside it and scored above every seed of `cpu_fast`, but below
#   `cpu_subword` and both seeds of `cpu_fast_dropout`, each with the weights it keeps. No
#   single run closed the gap: an eighth epoch, a lower peak rate, smaller batches, or 8,000
#   subwords in seven epochs (over the half hour) or six.
#
# The book ships the seed-0 run of `cpu_fast_dropout`, its epochs 10 and 11 averaged, in half
# precision. Chosen on validation, it became `BEST_SHIPPED_MODEL`, the model that `make translate`
# uses; chapter 18 sets its test scores beside the other models'. `cpu_avx2` did not beat it on
# validation, so it is not shipped; its seeds, with their last epoch's weights, were scored on
# test2016 once, after that choice:

# %%
scores = book_data("cpu_avx2_scores.json")["results"]
for seed in (0, 1, 2):
    bleu = {(r["decoding"], r["split"]): r["bleu"] for r in scores if r["model"] == f"seed {seed}"}
    print(f"cpu_avx2, seed {seed}, last epoch: val greedy {bleu['greedy', 'val']:.2f}, beam 4 "
          f"{bleu['beam4', 'val']:.2f}; test2016 greedy {bleu['greedy', 'test_2016_flickr']:.2f},"
          f" beam 4 {bleu['beam4', 'test_2016_flickr']:.2f}")
print("sacreBLEU", scores[0]["signature"])

# %% [markdown]
# On test2016 too, the half hour on the capped EPYC stays below the Xeon's model.
# {doc}`appendix_performance` follows every run epoch by epoch and lists what remains untried.

# %% [markdown]
# ## What we have
#
# Beside the readable model, a fast one that is the same model: `greedy_decode` and `beam_search`
# with `use_cache=True` decode one new position per step from a `DecoderCache` and give the same
# tokens, and they are what `make translate` uses; `use_fast_path` switches a model to fused
# attention, packed projections, fused layer norm and unchecked embeddings without touching its
# state dict, and still hands out attention maps on request. `make bench` measures what each buys,
# and `make bench-quick` runs the same rows in seconds as a test. The preset `cpu_fast_dropout`,
# the fast path with the paper's dropout sites and half the batch under the square-root rule,
# trained in under half an hour of training on a 2-core Xeon the model that `make translate` uses;
# on the slower EPYC, capped to AVX2, `cpu_avx2` trains in under half an hour too, to lower
# scores. Chapter 22 takes the same training code to several processes and devices.
