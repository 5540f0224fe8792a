# %% [markdown]
# # What the model attends to
#
# Every attention layer computes, for each query position, a row of weights that sums to 1:
# how much of each key position's value it takes. Those rows are the one part of a Transformer
# that comes with labels attached, a token on each axis, so it is tempting to read them as the
# model's reasons. This chapter draws them for the translation model of chapter 14, every layer
# and every head of all three kinds of attention, and then watches them form while the small
# copying model of chapter 12 learns.
#
# What can the pictures tell us? They show where information *can* flow in one step, and how
# the model spreads that flow: a head that puts almost all of its weight on the previous token
# moves that token's content forward; a head that spreads its weight evenly computes an average.
# What they cannot tell us on their own is *why* the model produced its output.
# {cite:t}`jain2019attention` found that quite different attention weights can often give the
# same prediction, and that attention often disagrees with gradient-based measures of which
# inputs matter; {cite:t}`wiegreffe2019attention` answered that this does not make attention
# meaningless, only that "explanation" needs a definition and a test, and that weights learned
# jointly with the model are harder to replace than the first study suggested. Two more reasons
# for care are specific to the Transformer. A value vector is not a token: above the first
# layer, position $j$ already holds a mixture of the whole sentence, so a weight on "Hund" in
# layer 3 is a weight on whatever layer 2 left at that position {cite}`abnar2020quantifying`.
# And the residual connections carry each position's own vector past the attention, so a head
# may matter little even where its weights look striking. We will read the maps as what they
# are: a record of where each head looked, for one input.

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
# Chapter 3's `MultiHeadedAttention` already keeps the weights of its last call in `.attn`, a
# detached tensor of shape (batch, $h$, $n_q$, $n_k$). A Transformer has three kinds of
# attention, and each layer has its own modules for them:
#
# * **encoder self-attention** (`encoder.layers[l].self_attn`): source positions look at
#   source positions, an $n_{src} \times n_{src}$ map per head;
# * **decoder self-attention** (`decoder.layers[l].self_attn`): target positions look at
#   themselves and earlier target positions, $n_{tgt} \times n_{tgt}$, zero above the diagonal
#   because of the causal mask;
# * **decoder-to-source attention** (`decoder.layers[l].src_attn`): target positions look at
#   the encoder's output, $n_{tgt} \times n_{src}$. This is the one that can align words.
#
# One forward pass fills all of them. When the model translates, greedy decoding calls the
# decoder once per output token, and each call overwrites `.attn`; but the decoder is causal, so
# one pass over the finished output, *teacher-forced* on the tokens the model itself produced,
# computes exactly the weights that each step used. We run that pass in evaluation mode (no
# dropout), stack the layers, and cut each sentence of a padded batch back to its real length,
# so that no row or column belongs to padding.
#
# The appendix {doc}`appendix_infrastructure` writes this down as `attention_maps`, which
# returns one `AttentionMaps` per sentence, together with `attention_records` and
# `attention_chart`, which turn the maps into the charts below; chapters 12 and 13 used them on
# the copy and sort models. Here we use the same three functions on translation.

# %% [markdown]
# For translation we want the maps behind the model's own output. `translation_attention`
# tokenizes German sentences, translates them greedily with chapter 14's `translate_batch`, and
# makes the teacher-forced pass over what came out. Source tokens are labelled with the words
# as written, so a word the vocabulary lacks shows up as itself rather than as `<unk>`. The
# decoder's rows are labelled with the token at that position, which is the token *before* the
# one it chooses: the row `<s>` is where the model picks its first word.

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
# We load the model that chapter 14 trained on Multi30k and shipped with the book (3 layers of
# 8 heads each, in both stacks) and translate two sentences of the validation set, which the
# model never trained on. The first repeats a word, "Hund", which lets us see whether the
# model tells the two apart; in the second the German verb comes last.

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
# A heatmap in altair wants long-form data: one row per cell, with the fields that place it
# and colour it. Here a cell is one (kind, layer, head, query position, key position) with its
# weight. Positions, not tokens, place the cells, because tokens repeat: the two "Hund" of the
# first sentence must stay two columns. Tokens are only labels. To keep the book's pages light
# we round weights to 3 decimals and, for the charts, leave out cells below 1%, which a colour
# scale from 0 to 1 would draw as white anyway (the first row and column are always kept, so
# every token stays on the axes). The appendix's `attention_records` makes these rows.

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
# `attention_chart` (in the appendix) draws all of them as one heatmap and lets the reader choose
# which map to see. Each choice is a Vega-Lite parameter bound to a widget (a menu for the
# kind, sliders for layer and head, buttons for the sentence) and a filter keeps the cells of the chosen map. The data is
# embedded once, as CSV, about a quarter of the size of the same rows as JSON objects. The
# categories on each axis are "position token" strings, sorted by position; the axes print
# only the token.
#
# Pick a sentence, a kind, a layer and a head. The chart opens on the first sentence's encoder
# self-attention in layer 1, head 1; hover over a cell for its tokens and weight.

# %% tags=["chart-rows-vary"]
attention_chart(records, controls=("sentence", "kind", "layer", "head"))

# %% [markdown]
# ## Reading the maps
#
# The decoder-to-source maps are the easiest to read, because translation has a notion of
# alignment: which German word an English word renders. Averaged over the 8 heads of a layer,
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
# In both sentences the alignment is the one a bilingual reader would draw, and it is not
# monotone. In the second, the model writes "fallen" and "asleep" while looking at
# "eingeschlafen", the last German word, in all three layers, and only then turns back to
# "auf" and "Sofa" (and in layer 3 "dem") for "on the couch". In the first, "after" is found at
# "hinterher", again the last German word. The final period is chosen while looking at
# `</s>` rather than at the German ".". Layer 1 is the vaguest: its heads spread their weight
# more, and the most-weighted source token for "A" and for `</s>` is `<s>`. In the chart,
# choose sentence 2, decoder-to-source attention, layer 2, head 1, the sharpest head of that
# kind: nearly one dark cell per row, an alignment table read one row early (the row labelled
# "man" is the step that writes "has", and it looks at "ist").

# %% [markdown]
# In layer 1 each "Hund" looks mostly at itself (0.61 and 0.52), with some weight on its
# neighbours. In layer 2 the second one looks most at "dem" (0.23), its own article, while the
# first splits its weight between itself and the start of the sentence. In layer 3 each
# looks most at its own adjective: "brauner" (0.32) for the first, "schwarzen" (0.23) for the
# second. Identical tokens with
# identical embeddings gather different context, because the positional encodings make their
# queries and keys differ. That is what the decoder needs in order to write "brown dog" and
# "black dog" in the right places, though the weights alone do not show that it uses them so.
#
# ## Every head at a glance
#
# Two numbers describe a map's rows well enough to compare heads. The **entropy** of a row,
# $H = -\sum_j a_{ij} \log_2 a_{ij}$ bits, is 0 when the query takes everything from one key
# and $\log_2 n$ when it spreads evenly over $n$ keys (3.3 bits for 10). The **mean distance**
# $\sum_j a_{ij} \lvert i - j \rvert$ says how far from its own position a query looks: 1 for a
# head that always looks at a neighbour, 0 for one that looks at itself. For decoder-to-source
# attention the "distance" compares a target position with a source position, which is
# meaningful only because German and English sentences here have similar lengths and order; a
# small value means the head follows the diagonal. We average both over every row of the first
# 200 validation sentences, translated by the model, so that the numbers describe heads rather
# than one sentence.

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
# worth measuring directly: the share of a query's weight on the previous position, on its own
# position, on the next, on the source's `</s>`, and on punctuation (`.` and `,`). For each kind
# and pattern, the head with the largest share, and the mean over all heads of that kind:

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
# What the numbers say about our model:
#
# * **The encoder looks near first, then wide.** The mean entropy of its heads grows from 1.02
#   bits in layer 1 to 2.52 bits in layer 3, and the mean distance from 1.60 to 4.47 positions.
#   Layer 1 holds heads defined by relative position: head 5 puts half of its weight (0.50) on
#   the previous token, head 4 0.29 on the next one, head 1 0.51 on the token itself. Heads of
#   this kind were also among the few that mattered most in the translation models of
#   {cite:t}`voita2019analyzing`. Layer 3's broadest head (head 6, 2.96 bits) spreads its
#   weight about as much as an even split over eight tokens would.
# * **The decoder looks at itself, then further back.** Its sharpest head, layer 1 head 6,
#   puts about 0.7 of its weight on its own position, and head 5 of the same layer about a
#   third on the previous one; the mean distance grows from 1.78 in layer 1 to 3.16 in layer 3.
# * **The decoder-to-source attention aligns in layers 2 and 3, not in layer 1.** Layer 1's
#   heads are the broadest (mean 2.06 bits, up to 2.52), layers 2 and 3 are sharp (1.18 and
#   1.30 bits). The strongest head on the monotone diagonal, layer 2 head 1, puts about a third
#   of its weight there on average: a word order that is mostly, but not entirely, the same in both
#   languages (a target row $i$ chooses the word after position $i$, so the diagonal of the
#   alignment is the key at $i + 1$, which the table calls "next").
# * **No head parks on `</s>` or on punctuation.** {cite:t}`clark2019what` found heads in BERT
#   that put most of their weight on the separator token and on punctuation, a way to do
#   nothing. Here no head averages more than about a tenth of its weight on `</s>` or on `.`
#   and `,`.

# %% [markdown]
# ## Your own sentence
#
# Change the sentence and run the cell; the chart is drawn again in Jupyter, VS Code and Colab
# alike. The model knows the vocabulary of Multi30k's image
# captions: people, animals, clothes, places and what they do there. To keep this page light
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
# The maps of a trained model are the end of a story. To see its beginning we train the copy
# model of chapter 12 again, with the same settings and seeds, and every so often capture its
# decoder-to-source attention on one held-out sequence. To copy, the decoder must find, for
# each output position, the source position it should read. The sequence we watch repeats its
# symbols (3 3 3 6 6 6 0 0 7 5), so the model cannot find the right position by looking for a
# matching symbol: it has to count. We feed the decoder the correct copy at every snapshot
# (teacher forcing), so that the rows mean the same thing before and after training.

# %%
# NBVAL_IGNORE_OUTPUT
# (a training run: its counts and weights differ with another CPU's float kernels)
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
# through training, and the other controls pick any other layer and head.

# %%
# NBVAL_IGNORE_OUTPUT
# (the chart draws the trained copier's attention, which differs with another CPU)
final_layer, final_head = best[state.accum_step]
attention_chart(frames, controls=("step", "layer", "head"), width=260, height=260,
                initial={"layer": final_layer, "head": final_head})

# %% [markdown]
# Before training, every head puts about 0.1 of its weight on the position to copy, what ten
# equal shares of the ten source positions would give. For the first 20 steps, while the
# warmup keeps the learning rate small, that barely changes. Then
# the diagonal forms, and the count of exact copies follows it. In the run stored with this page
# (another machine's run differs in the details), at step 100 no head puts more than 0.34 of its
# weight on the right position and the model copies 28 of the 100 test sequences; at step 200
# the best head is at 0.64 and the model copies 78. When it copies all 100, the best heads of
# layer 1 put about 0.9 of their weight on the position to copy, while the heads of layer 2 stay
# blurrier and share their weight with the neighbouring positions.
# Nothing in the symbols tells the three 3s apart; what does is the positional encoding of
# chapter 4, which queries and keys both carry.
#
# ```{note}
# The classic Annotated Transformer drew a separate small chart for each of a selection of
# layers and heads, each carrying its own copy of the data. Here one chart holds every layer
# and head once and widgets pick the map, so the page stays light and nothing is left out.
# ```
#
# ## What we have
#
# Tools to look inside a trained Transformer: every attention weight of every layer and head,
# captured in one pass over the model's own translation, as long-form records and as one
# interactive chart; a summary that ranks heads by how sharp they are and how far they look;
# and a view of attention forming during training. On our translation model they showed heads
# in the lowest encoder layer that look at fixed neighbours, encoder heads that widen with
# depth, and a decoder-to-source attention whose upper layers draw a word alignment, reordering
# included; on the copy task, a diagonal that sharpens as the count of exact copies rises.
#
# What the maps cannot show, as the first section warned, is what the model would do with
# other weights. Testing that means intervening: switching heads off and measuring the
# translations, or tracing how information flows through the residual stream across layers
# {cite}`abnar2020quantifying`. The tools of this chapter give those experiments their
# pictures. The next chapter turns to what came after the paper, and the conclusion then
# looks back over what the book built and measured.
