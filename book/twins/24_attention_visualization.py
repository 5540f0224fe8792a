# %% [markdown]
# # What the model attends to
#
# Every attention layer computes, for each query position, a row of weights that sums to 1:
# how much of each key position's value it takes. Those rows come with labels attached, a
# token on each axis, so it is tempting to read them as the model's reasons. This chapter draws
# them for chapter 14's translation model, every layer and head of all three kinds of
# attention, and then watches them form while chapter 12's copying model learns.
#
# The pictures show where information *can* flow in one step and how a head spreads it: a head
# with almost all its weight on the previous token moves that token's content forward, one
# that spreads its weight evenly averages. They cannot tell on their own *why* the model
# produced its output: quite different weights can often give the same prediction
# {cite}`jain2019attention`, though "explanation" needs a definition and a test before that
# settles anything {cite}`wiegreffe2019attention`. Two cautions are specific to the
# Transformer. Above the first layer a value vector is not a token but a mixture of the
# sentence, so a weight on "Hund" in layer 3 is a weight on whatever layer 2 left at that
# position {cite}`abnar2020quantifying`. And the residual connections carry each position's
# own vector past the attention, so a head may matter little even where its weights look
# striking. We read the maps as what they are: where each head looked, for one input.

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
    ATTENTION_KINDS,
    PAD_ID,
    AttentionMaps,
    LabelSmoothing,
    SimpleLossCompute,
    TrainState,
    Vocab,
    attention_chart,
    attention_maps,
    attention_records,
    collate_batch,
    copy_batches,
    enable_book_charts,
    exact_matches,
    load_multi30k,
    load_tokenizers,
    load_trained_model,
    make_model,
    random_sequences,
    rate,
    run_epoch,
    seq2seq_batch,
    sequence_set,
    tokenize,
    translate_batch,
)

enable_book_charts()

# %% [markdown]
# ## Capturing the weights
#
# Chapter 3's `MultiHeadedAttention` keeps the weights of its last call in `.attn`, a detached
# tensor of shape (batch, $h$, $n_q$, $n_k$). Each layer has its own modules for the three
# kinds of attention:
#
# * **encoder self-attention** (`encoder.layers[l].self_attn`): source positions look at
#   source positions;
# * **decoder self-attention** (`decoder.layers[l].self_attn`): target positions look at
#   themselves and earlier target positions;
# * **decoder-to-source attention** (`decoder.layers[l].src_attn`): target positions look at
#   the encoder's output. This is the one that can align words.
#
# Greedy decoding calls the decoder once per output token, and each call overwrites `.attn`.
# But the decoder is causal, so one pass over the finished output, *teacher-forced* on the
# tokens the model itself produced, computes exactly the weights that each step used. The
# appendix {doc}`appendix_infrastructure` writes this pass as `attention_maps`, which returns
# one `AttentionMaps` per sentence, cut back to its real length; `attention_records` and
# `attention_chart` turn the maps into the charts below, as they did for chapters 12 and 13.

# %% [markdown]
# `translation_attention` tokenizes German sentences, translates them greedily with chapter
# 14's `translate_batch`, and makes the teacher-forced pass over what came out. Source tokens
# are labelled with the words as written, so a word the vocabulary lacks shows up as itself
# rather than as `<unk>`. Each decoder row is labelled with the token at that position, which
# is the token *before* the one it chooses: the row `<s>` is where the model picks its first
# word.

# %% tags=["export"]
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

# %% [markdown]
# We load the model that chapter 14 trained and the book ships (3 layers of 8 heads in both
# stacks) and translate two validation sentences, which it never trained on. The first repeats
# a word, "Hund", which lets us see whether the model tells the two apart; in the second the
# German verb comes last.

# %%
torch.set_num_threads(1)  # one sentence at a time: small matrices, a second thread only waits
model, vocab_src, vocab_tgt, config = load_trained_model()
tokenizer_de, _ = load_tokenizers()
val = load_multi30k("val")
chosen = [6, 732]  # indices into the validation set
maps = translation_attention(model, [val[i][0] for i in chosen], vocab_src, vocab_tgt,
                             tokenizer_de)
for i, m in zip(chosen, maps, strict=True):
    print(f"validation sentence {i}")
    print("  German:   ", " ".join(m.src_tokens))
    print("  model:    ", " ".join(m.tgt_tokens[1:]))
    print("  reference:", val[i][1])

# %% [markdown]
# ## From matrices to a chart
#
# A heatmap in altair wants long-form data: one row per cell, here one (kind, layer, head,
# query position, key position) with its weight. Positions, not tokens, place the cells,
# because tokens repeat: the two "Hund" must stay two columns. To keep the pages light,
# `attention_records` rounds weights to 3 decimals and leaves out cells below 1%, which the
# colour scale would draw white anyway (the first row and column are always kept, so every
# token stays on the axes).

# %%
records = []
for number, m in enumerate(maps, start=1):
    records += attention_records(m, min_weight=0.01, sentence=number)
# how many weights reach 0.01 moves by one or two with the CPU's float kernels: a rounded count
assert 7_000 < len(records) < 9_500, len(records)
print(f"about {round(len(records), -3):,} cells kept (weights of at least 0.01)")
for record in records[:3]:
    print(record)

# %% [markdown]
# `attention_chart` draws them all as one heatmap, with a widget for each choice: a menu for
# the kind, sliders for layer and head, buttons for the sentence. It opens on the first
# sentence's encoder self-attention in layer 1, head 1; hover over a cell for its tokens and
# weight.

# %% tags=["chart-rows-vary"]
attention_chart(records, controls=("sentence", "kind", "layer", "head"))

# %% [markdown]
# ## Reading the maps
#
# The decoder-to-source maps are the easiest to read, because translation has a notion of
# alignment: which German word an English word renders. With the heads of a layer averaged,
# the German token that gets the most weight when the model chooses each English token is:

# %%
def alignment(m: AttentionMaps, layer: int) -> str:
    """Each output token with the source token its choice attended to most, heads averaged."""
    produced = [*m.tgt_tokens[1:], "</s>"]  # row i chooses the token after position i
    best = m.cross[layer - 1].mean(0).argmax(-1)  # (n_tgt,)
    return "  ".join(f"{out}<-{m.src_tokens[j]}" for out, j in zip(produced, best.tolist(),
                                                                    strict=True))


for number, m in enumerate(maps, start=1):
    for layer in range(1, config.N + 1):
        print(f"sentence {number}, layer {layer}: {alignment(m, layer)}")

# %% [markdown]
# In the encoder, the question is what each word gathers from its neighbours. The two "Hund"
# of the first sentence are the same token with the same embedding; only their positions, and
# so their contexts, differ. The three positions each one attends to most, heads averaged:

# %%
first = maps[0]
for position, token in enumerate(first.src_tokens):
    if token != "Hund":
        continue
    for layer in range(1, config.N + 1):
        weights = first.encoder[layer - 1].mean(0)[position]  # (n_src,): heads averaged
        top = weights.argsort(descending=True)[:3].tolist()
        print(f"Hund at {position}, layer {layer}: "
              + ", ".join(f"{first.src_tokens[j]} at {j} {weights[j]:.2f}" for j in top))

# %% [markdown]
# In both sentences the alignment is the one a bilingual reader would draw, reordering
# included. In the second, the model writes "fallen" and "asleep" while looking at
# "eingeschlafen", the last German word, and only then turns back to "auf" and "Sofa" for "on
# the couch"; in the first, "after" is found at "hinterher", again the last word. The final
# period is chosen while looking at `</s>`, not at the German ".". Layer 1 is the vaguest: its heads
# spread their weight more. In the chart, choose sentence 2, decoder-to-source attention, layer 2, head 1, the sharpest head
# of that kind: nearly one dark cell per row, an alignment table read one row early (the row
# labelled "man" is the step that writes "has", and it looks at "ist").

# %% [markdown]
# Follow each "Hund" up the layers. In layer 1 each looks mostly at itself, with some weight on
# its neighbours; higher up the two part ways, and in layer 3 each looks most at its own
# adjective, "brauner" for the first and "schwarzen" for the second. Identical tokens with
# identical embeddings gather different context, because the positional encodings make their
# queries and keys differ. That is what the decoder needs in order to write "brown dog" and
# "black dog" in the right places, though the weights alone do not show that it uses them so.
#
# ## Every head at a glance
#
# Two numbers describe a map's rows well enough to compare heads. The **entropy** of a row,
# $H = -\sum_j a_{ij} \log_2 a_{ij}$ bits, is 0 when the query takes everything from one key
# and $\log_2 n$ when it spreads evenly over $n$ keys. The **mean distance**
# $\sum_j a_{ij} \lvert i - j \rvert$ says how far from its own position a query looks: 0 for a
# head that looks at itself, 1 for one that always looks at a neighbour. For decoder-to-source
# attention it compares a target with a source position, which means something only because
# German and English captions have similar lengths and order: a small value says the head
# follows the diagonal. Both are averaged over every row of the first 200 validation
# sentences, as the model translates them, so that they describe heads, not one sentence.

# %% tags=["export"]
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


# %%
many = translation_attention(model, [de for de, _ in val[:200]], vocab_src, vocab_tgt,
                             tokenizer_de)
summary = attention_summary(many)
for kind in ATTENTION_KINDS:
    rows = [r for r in summary if r["kind"] == kind]
    sharp = min(rows, key=lambda r: r["entropy"])
    broad = max(rows, key=lambda r: r["entropy"])
    print(f"{ATTENTION_KINDS[kind]}: from {sharp['entropy']:.2f} bits (layer {sharp['layer']} "
          f"head {sharp['head']}) to {broad['entropy']:.2f} bits (layer {broad['layer']} head "
          f"{broad['head']})")
    for layer in range(1, config.N + 1):
        in_layer = [r for r in rows if r["layer"] == layer]
        entropy = sum(r["entropy"] for r in in_layer) / len(in_layer)
        distance = sum(r["distance"] for r in in_layer) / len(in_layer)
        print(f"  layer {layer}, mean of heads: entropy {entropy:.2f} bits, "
              f"distance {distance:.2f}")
attention_summary_chart(summary)

# %% [markdown]
# The summary says how sharp a head is and how far it looks, not *where*. A few patterns are
# worth measuring directly: the share of a query's weight on the previous position, its own,
# the next, the source's `</s>`, and punctuation (`.` and `,`). For each kind and pattern, the
# head with the largest share, and the mean over all heads of that kind:

# %%
def pattern_share(maps: list[AttentionMaps], kind: str, picks) -> torch.Tensor:
    """Mean weight (N, h), over every query of every map, on the keys that `picks` selects."""
    total, rows = 0.0, 0
    for m in maps:
        weights, row_tokens, col_tokens = m.axes(kind)  # (N, h, rows, columns)
        chosen = torch.zeros(weights.shape[-2:])
        for i, j in picks(len(row_tokens), col_tokens):
            if 0 <= j < len(col_tokens):
                chosen[i, j] = 1.0
        total = total + (weights * chosen).sum((-2, -1))
        rows += weights.size(-2)
    return total / rows


patterns = {
    "previous": lambda n, cols: [(i, i - 1) for i in range(n)],
    "same": lambda n, cols: [(i, i) for i in range(n)],
    "next": lambda n, cols: [(i, i + 1) for i in range(n)],
    "</s>": lambda n, cols: [(i, j) for i in range(n) for j, t in enumerate(cols) if t == "</s>"],
    "punctuation": lambda n, cols: [
        (i, j) for i in range(n) for j, t in enumerate(cols) if t in {".", ","}
    ],
}
for kind in ATTENTION_KINDS:
    for name, picks in patterns.items():
        if kind == "decoder" and name in ("next", "</s>"):
            continue  # the causal mask hides the next position, and </s> is never an input
        share = pattern_share(many, kind, picks)  # (N, h)
        layer, head = divmod(int(share.argmax()), share.size(1))
        print(f"{ATTENTION_KINDS[kind]:>28} | {name:>11}: best layer {layer + 1} head "
              f"{head + 1} {share.max():.2f}, mean of heads {share.mean():.2f}")

# %% [markdown]
# What to look for in these numbers:
#
# * **The encoder looks near first, then wide.** Both the mean entropy of its heads and their
#   mean distance grow from layer 1 to layer 3. Layer 1 holds heads defined by relative
#   position: one puts about half of its weight on the previous token, another about half on
#   the token itself, a third leans on the next one. Such heads were also among the few that
#   mattered most in the translation models of {cite:t}`voita2019analyzing`. Layer 3's
#   broadest head spreads its weight about as much as an even split over eight tokens would.
# * **The decoder looks at itself, then further back.** Its sharpest head, in layer 1, puts
#   most of its weight on its own position, and its mean distance grows with depth.
# * **The decoder-to-source attention aligns in layers 2 and 3, not in layer 1.** Layer 1's
#   heads are the broadest; layers 2 and 3 are sharp. The strongest head on the monotone
#   diagonal puts only about a third of its weight there: the word order is mostly, but not
#   entirely, the same in both languages (row $i$ chooses the word after position $i$, so the
#   diagonal of the alignment is the key at $i + 1$, which the table calls "next").
# * **No head parks on `</s>` or on punctuation.** {cite:t}`clark2019what` found heads in BERT
#   that put most of their weight on the separator token and on punctuation, a way to do
#   nothing. Here no head averages more than about a tenth of its weight on `</s>` or on `.`
#   and `,`.

# %% [markdown]
# ## Your own sentence
#
# Change the sentence and run the cell. The model knows the vocabulary of Multi30k's image
# captions: people, animals, clothes, places and what they do there. To keep the page light
# the chart holds only the decoder-to-source attention; pass all three kinds to
# `attention_records` to see the rest.

# %%
SENTENCE = "Eine Frau mit einem roten Hut spielt Gitarre auf der Straße."

mine = translation_attention(model, [SENTENCE], vocab_src, vocab_tgt, tokenizer_de)[0]
print("model:", " ".join(mine.tgt_tokens[1:]))
attention_chart(attention_records(mine, kinds=("cross",), min_weight=0.01),
                controls=("layer", "head"), title=SENTENCE)

# %% [markdown]
# ## Watching attention being learned
#
# The maps of a trained model are the end of a story. To see its beginning we train chapter
# 12's copy model again, with the same settings and seeds, and every so often capture its
# decoder-to-source attention on one held-out sequence. To copy, the decoder must find, for
# each output position, the source position to read. The sequence we watch repeats its symbols
# (3 3 3 6 6 6 0 0 7 5), so the model cannot find the right position by looking for a matching
# symbol: it has to count. The decoder is fed the correct copy at every snapshot (teacher
# forcing), so that the rows mean the same thing before and after training.

# %% nbval_reason="a training run: its counts and weights differ with another CPU's float kernels" tags=["nbval-ignore-output"]
import time

V, d_model = 13, 64
torch.manual_seed(0)
copier = make_model(V, V, N=2, d_model=d_model, d_ff=128, h=4, dropout=0.0)
loss_compute = SimpleLossCompute(copier.generator,
                                 LabelSmoothing(V, padding_idx=PAD_ID, smoothing=0.0))
optimizer = torch.optim.Adam(copier.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lr_lambda=lambda step: rate(step, model_size=d_model, factor=0.5, warmup=100)
)
test_src = random_sequences(100, V, min_len=4, generator=torch.Generator().manual_seed(1))
test_batch = seq2seq_batch(test_src, test_src)
held_out = sequence_set(test_src)
watched = seq2seq_batch(test_src[10:11], test_src[10:11])  # the sequence we watch
digits = {0: "<s>", 1: "</s>", 2: "_"} | {i: str(i - 3) for i in range(3, V)}


def snapshot(step: int, copies: int) -> list[dict]:
    """The copier's decoder-to-source attention on the watched sequence, as chart records."""
    m = attention_maps(copier, watched.src, watched.tgt, src_tokens=[
        [digits[t] for t in watched.src[0].tolist() if t != 2]
    ], tgt_tokens=[[digits[t] for t in watched.tgt[0].tolist() if t != 2]])[0]
    # row i chooses output i + 1, the copy of source position i (the last row chooses </s>)
    on_target = m.cross.diagonal(dim1=-2, dim2=-1).mean(-1)  # (N, h)
    layer, head = divmod(int(on_target.argmax()), on_target.size(1))
    per_layer = " | ".join(
        f"layer {n + 1}: " + " ".join(f"{w:.2f}" for w in row)
        for n, row in enumerate(on_target.tolist())
    )
    print(f"step {step:3d}: {copies:3d}/100 copied | on the position to copy, per head: "
          f"{per_layer}")
    best[step] = (layer + 1, head + 1)
    return attention_records(m, kinds=("cross",), min_weight=0.01, step=step)


best = {}  # step -> (layer, head) with the most weight on the position to copy
train_data = torch.Generator().manual_seed(0)
state = TrainState()
steps_to_watch = {20, 60, 100, 200}
frames = snapshot(0, exact_matches(copier, test_batch))
start = time.perf_counter()
for _epoch in range(60):
    batches = copy_batches(V, 64, 20, generator=train_data, exclude=held_out)
    _, state = run_epoch(
        batches, copier, loss_compute, optimizer, scheduler, train_state=state, log_every=None
    )
    copies = exact_matches(copier, test_batch)
    if state.accum_step in steps_to_watch or copies == 100:
        frames += snapshot(state.accum_step, copies)
    if copies == 100:
        break
print(f"trained in {time.perf_counter() - start:.1f} s")
assert copies >= 95, copies

# %% [markdown]
# The chart opens before training, on the head that copies best at the end; the buttons step
# through training, and the other controls pick any layer and head.

# %% nbval_reason="the chart draws the trained copier's attention, which differs with another CPU" tags=["nbval-ignore-output"]
final_layer, final_head = best[state.accum_step]
attention_chart(frames, controls=("step", "layer", "head"), width=260, height=260,
                initial={"layer": final_layer, "head": final_head})

# %% [markdown]
# Before training, every head puts about a tenth of its weight on the position to copy, what
# an even split over the ten source positions gives, and the first steps, while the warm-up
# keeps the learning rate small, barely change that. Then the diagonal forms, and the count of
# exact copies rises with it: read the printout's copies and per-head weights together. By the time the
# model copies every test sequence, the best heads of layer 1 put most of their weight on the
# position to copy, while the heads of layer 2 stay blurrier. This is one run, a
# demonstration; another CPU's kernels give other steps and weights. Nothing in the symbols
# tells the three 3s apart; what does is chapter 4's positional encoding, which queries and
# keys both carry.
#
# ```{note}
# The classic Annotated Transformer drew a separate small chart for each of a selection of
# layers and heads, each with its own copy of the data. Here one chart holds every layer and
# head once and widgets pick the map, so the page stays light and nothing is left out.
# ```
#
# ## What we have
#
# Tools to look inside a trained Transformer: every attention weight of every layer and head,
# captured in one pass and drawn as one interactive chart; a summary that ranks heads by how
# sharp they are and how far they look; and a view of attention forming during training. They
# showed positional heads low in the encoder, encoder heads that widen with depth, and an
# alignment, reordering included, in the upper layers of the decoder-to-source attention.
#
# What the maps cannot show is what the model would do with other weights. Testing that means
# intervening: switching heads off and measuring the translations, or tracing how information
# flows through the residual stream {cite}`abnar2020quantifying`. The next chapter turns to
# what came after the paper.
