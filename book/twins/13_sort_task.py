# %% [markdown]
# # A second task: sorting
#
# Copying (chapter 12) asks each output position to look at one source position, the one with
# the same index. Sorting asks for more. The $i$-th output is the $i$-th smallest input, and
# which input that is depends on all the others: to place one symbol, the model has to compare
# it with every other symbol in the sequence. That is exactly the all-pairs comparison that
# self-attention computes in a single layer, and it makes sorting a good second test, the one
# used, with copying, by the Deep Graph Library's tutorial that builds the Transformer as a
# graph {cite}`wang2019dgl`.

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
    Batch,
    LabelSmoothing,
    SimpleLossCompute,
    TrainState,
    attention_chart,
    attention_maps,
    attention_records,
    bar_chart,
    drop_sequences,
    enable_book_charts,
    exact_matches,
    greedy_decode,
    line_chart,
    make_model,
    random_sequences,
    rate,
    run_epoch,
    seq2seq_batch,
    sequence_set,
)

enable_book_charts()

# %% [markdown]
# ## The data
#
# The tokens are those of chapter 12: 0, 1 and 2 are `<s>`, `</s>` and the padding, and ids 3
# to 12 stand for the digits 0 to 9. A source is 1 to 10 random digits; its target is the same
# digits in increasing order, between `<s>` and `</s>`. Padding has the id 2, below every digit,
# so before sorting we give it an id above every digit: it stays at the end.

# %% tags=["export"]
from collections.abc import Iterator

import torch


def sort_batches(
    V: int,
    batch_size: int,
    n_batches: int,
    *,
    min_len: int = 1,
    max_len: int = 10,
    generator: torch.Generator | None = None,
    exclude: set[tuple[int, ...]] | None = None,
    pad: int = 2,
) -> Iterator[Batch]:
    """Batches for the sort task: the target is the source's symbols in increasing order."""
    for _ in range(n_batches):
        src = random_sequences(batch_size, V, min_len=min_len, max_len=max_len, generator=generator)
        src = drop_sequences(src, exclude, pad=pad)  # (<= batch_size, max_len)
        yield seq2seq_batch(src, sorted_symbols(src, pad=pad), pad=pad)


def sorted_symbols(src: torch.Tensor, *, pad: int = 2) -> torch.Tensor:
    """Each row's symbols in increasing order, padding kept at the end."""
    above = int(src.max()) + 1  # an id larger than every symbol
    keyed = src.masked_fill(src == pad, above)  # (batch, n_src)
    ordered = keyed.sort(dim=1).values  # (batch, n_src)
    return ordered.masked_fill(ordered == above, pad)


# %%
import torch

V = 13
example = next(sort_batches(V, 3, 1, generator=torch.Generator().manual_seed(0)))
print("src:\n", example.src)
print("tgt_y (labels):\n", example.tgt_y)

# %% [markdown]
# ## Held-out sets that training never sees
#
# Two sets of 1,000 sequences of 4 to 10 digits are held out, each drawn with its own seed, and
# the training batches drop every sequence that is in either. The *validation* set decides when
# training stops; the *test* set is measured once, at the end, so that the accuracy we report
# was not selected by looking at it. Shorter sequences are left out of both sets because there
# are too few of them to hold any out without removing them from training altogether: there are
# only ten sequences of length one. (Sorting depends only on which digits occur, not on their
# order, so a held-out sequence's digits may well have appeared in training in another order;
# what the model has never seen is the sequence itself.)

# %%
test_src = random_sequences(1000, V, min_len=4, max_len=10,
                            generator=torch.Generator().manual_seed(1))
test_batch = seq2seq_batch(test_src, sorted_symbols(test_src))
valid_src = random_sequences(1000, V, min_len=4, max_len=10,
                             generator=torch.Generator().manual_seed(2))
valid_src = drop_sequences(valid_src, sequence_set(test_src))  # no sequence in both sets
valid_batch = seq2seq_batch(valid_src, sorted_symbols(valid_src))
held_out = sequence_set(test_src) | sequence_set(valid_src)
print(f"held out: {len(held_out)} distinct sequences, "
      f"{len(valid_src)} for validation and {len(test_src)} for the test")

# %% [markdown]
# ## Model and training
#
# The set-up is that of chapter 12: the same small model ($N = 2$, $d_{model} = 64$,
# $d_{ff} = 128$, $h = 4$), no dropout and no label smoothing, Adam with the paper's settings
# and the warmup schedule of chapter 10 at half the paper's factor. An epoch is 20 batches of
# 64 sequences; after every fifth we measure exact-match accuracy on the validation set, a
# sequence counting only if every digit and the final `</s>` are right, and keep a copy of the
# weights whenever it is the best so far. We stop when it reaches 99 %, or after 40 epochs, go
# back to the best weights, and only then measure the test set. (The accuracy does not rise
# steadily: with the learning rate still fairly high, it can drop by a few points from one
# measurement to the next, which is why we keep the best weights rather than the last.) The
# matrices of so small a model are too small to share among CPU threads with profit, so this
# chapter computes on one. As in chapter 12, the printed losses and accuracies depend on the
# last bits of floating-point arithmetic, which differ between machines, so the regression
# tests check this cell's result with the bounds in the cell after it rather than by its
# printout.

# %%
# NBVAL_IGNORE_OUTPUT
# (training losses and accuracies differ in their last digits between machines)
import time

torch.set_num_threads(1)  # tiny matrices: a second thread costs more than it saves
d_model = 64
torch.manual_seed(0)
model = make_model(V, V, N=2, d_model=d_model, d_ff=128, h=4, dropout=0.0)
loss_compute = SimpleLossCompute(model.generator, LabelSmoothing(V, padding_idx=2, smoothing=0.0))
optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
scheduler = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lr_lambda=lambda step: rate(step, model_size=d_model, factor=0.5, warmup=100)
)
train_data = torch.Generator().manual_seed(0)
state = TrainState()
history = []
start = time.perf_counter()
best_accuracy, best_epoch, best_weights = -1.0, 0, None
for epoch in range(1, 41):
    batches = sort_batches(V, 64, 20, generator=train_data, exclude=held_out)
    loss, state = run_epoch(
        batches, model, loss_compute, optimizer, scheduler, train_state=state, log_every=None
    )
    if epoch % 5:
        continue
    accuracy = exact_matches(model, valid_batch) / len(valid_src)
    history.append({"epoch": epoch, "loss": round(loss, 4), "accuracy": round(accuracy, 3)})
    print(f"epoch {epoch:2d} | loss per token {loss:.4f} | validation accuracy {accuracy:.1%}")
    if accuracy > best_accuracy:
        best_accuracy, best_epoch = accuracy, epoch
        best_weights = {name: w.clone() for name, w in model.state_dict().items()}
    if accuracy >= 0.99:
        break
elapsed = time.perf_counter() - start
model.load_state_dict(best_weights)  # the weights that did best on the validation set
test_accuracy = exact_matches(model, test_batch) / len(test_src)
print(f"{state.accum_step} optimizer steps, {state.samples:,} training sequences, "
      f"took {elapsed:.1f} s")
print(f"best validation accuracy {best_accuracy:.1%}, after epoch {best_epoch}")
print(f"exact-match accuracy on the 1,000 untouched test sequences: {test_accuracy:.1%}")

# %% [markdown]
# What the regression tests compare: the chosen weights do well on both held-out sets, whether
# or not the validation set reached 99 % within the 40 epochs.

# %%
assert best_accuracy >= 0.9, f"best validation accuracy only {best_accuracy:.1%}"
assert test_accuracy >= 0.9, f"only {test_accuracy:.1%} of the test sequences sorted exactly"
print("at least 90 % of the validation and of the 1,000 test sequences sorted exactly")

# %%
# NBVAL_IGNORE_OUTPUT
# (a chart of this machine's training run, as in the training cell)
line_chart(history, x="epoch:Q", y="accuracy:Q", x_title="epoch (20 steps)",
           y_title="exact-match accuracy", y_format="%", formats={"accuracy": ".1%"},
           extra_tooltip=["loss:Q"], width=420, height=220,
           title="Validation sequences sorted exactly")

# %% [markdown]
# ## Where it errs
#
# Accuracy by length shows where the remaining errors are. One might expect them in the
# longest sequences, which offer the most places to go wrong; in the run stored with this page
# the shorter ones were missed more often: about 94 % of the test sequences of 4 to 6 digits
# came out right, against about 98 % of those of 8 to 10. That is an observation of one run, not
# a finding: which few sequences a model misses changes with its seed and with the last bits of
# its training, and another CPU's run may put its errors elsewhere, so the regression tests do
# not compare this cell's output.

# %%
# NBVAL_IGNORE_OUTPUT
# (which few sequences a trained model misses differs between machines)
lengths = (test_src != 2).sum(dim=1)
by_length = []
for n in range(4, 11):
    rows = lengths == n
    part = seq2seq_batch(test_src[rows], sorted_symbols(test_src[rows]))
    correct = exact_matches(model, part)
    count = int(rows.sum())
    by_length.append({"length": n, "sequences": count, "accuracy": correct / count})
    print(f"length {n:2d}: {correct:3d}/{int(rows.sum()):3d} sorted exactly")

bar_chart(by_length, x="length:O", y="accuracy:Q", x_title="sequence length",
          y_title="exact-match accuracy", value_format="%", value_domain=[0, 1],
          formats={"accuracy": ".1%"}, extra_tooltip=["sequences:Q"], width=320,
          title="Accuracy by length")

# %% [markdown]
# A few test sequences and their greedy decodings, in digits (as with the table above, another
# machine's model may get a different one of them wrong, so nbval does not compare them):

# %%
# NBVAL_IGNORE_OUTPUT
# (the decodings of this machine's trained model; another machine's may miss a sequence)
digits = {0: "<s>", 1: "</s>", 2: "_"} | {i: str(i - 3) for i in range(3, V)}
model.eval()
ys = greedy_decode(model, test_batch.src[:6], test_batch.src_mask[:6], 12, 0, end_symbol=1)
for src_row, out_row in zip(test_batch.src[:6].tolist(), ys.tolist(), strict=True):
    shown = [digits[t] for t in out_row[1:]]
    shown = shown[: shown.index("</s>") + 1] if "</s>" in shown else shown
    print(" ".join(digits[t] for t in src_row if t != 2), " -> ", " ".join(shown))

# %% [markdown]
# ## What the sort model attends to
#
# Chapter 12's `attention_maps` captures every layer's and head's attention in one
# teacher-forced pass; here on two test sequences. The row labelled `<s>` is where the model
# chooses the smallest digit, and the row of each output digit chooses the next one.

# %%
sort_sample = seq2seq_batch(test_src[:2], sorted_symbols(test_src[:2]))
decoder_input = sort_sample.tgt.masked_fill(sort_sample.tgt == 1, 2)  # (2, n_tgt), no </s>
sort_maps = attention_maps(
    model, sort_sample.src, decoder_input,
    src_tokens=[[digits[t] for t in row if t != 2] for row in sort_sample.src.tolist()],
    tgt_tokens=[["<s>", *(digits[t] for t in row if t > 2)] for row in decoder_input.tolist()],
)
sort_records = []
for number, m in enumerate(sort_maps, start=1):
    sort_records += attention_records(m, min_weight=0.01, sequence=number)
print("decoder-to-source maps (N, h, n_tgt, n_src):", [tuple(m.cross.shape) for m in sort_maps])

# %%
# NBVAL_IGNORE_OUTPUT
# (the chart embeds trained weights, whose last digits vary with the CPU.)
attention_chart(sort_records, controls=("sequence", "kind", "layer", "head"),
                initial={"kind": "cross"}, width=260, height=260)

# %% [markdown]
# To write its next digit, the decoder has to find it in the source, wherever it stands. Over
# all 1,000 test sequences, the share of queries whose strongest key in the decoder-to-source
# attention holds exactly the digit that comes next in the sorted output, for each layer and
# head, and the share that a query would score by picking a source position at random:

# %%
# NBVAL_IGNORE_OUTPUT
# (shares of trained weights; their last digit can vary with the CPU.)
decoder_input = test_batch.tgt.masked_fill(test_batch.tgt == 1, 2)  # (1000, n_tgt), no </s>
test_maps = attention_maps(model, test_batch.src, decoder_input)
hits = torch.zeros(2, 4)  # (N, h): queries whose strongest key holds the digit to write next
queries, chance = 0, 0.0
for m, src_row, labels in zip(test_maps, test_batch.src, test_batch.tgt_y, strict=True):
    n = len(m.src_tokens)
    strongest = m.cross[:, :, :n].argmax(dim=-1)  # (N, h, n): query i -> its strongest key
    hits += (src_row[strongest] == labels[:n]).sum(dim=-1)
    chance += (src_row[:n] == labels[:n, None]).float().mean(dim=-1).sum().item()
    queries += n
share = hits / queries
for layer, row in enumerate(share.tolist(), start=1):
    print(f"layer {layer}:", "  ".join(f"head {head} {x:.2f}" for head, x in enumerate(row, 1)))
print(f"at random: {chance / queries:.2f}")
assert share.max() > 0.5

# %% [markdown]
# ## What we have
#
# The same pipeline that learned to copy learns to sort, from nothing but examples, and sorts
# sequences it has never seen: in our run, 96 % of the 1,000 test sequences exactly, with the
# weights that did best on the validation set (97.9 %, after 600 of 800 optimizer steps), in
# about a minute of training on one core of our 2-core CPU (59.0 s in the run stored with this page). The model is not told that the digits are ordered, or what
# sorting is; it has to discover from data which digit comes first and how many times each
# one occurs, and attention lets every output position weigh every input digit to do it.
#
# Part II is complete: we can build batches, train, schedule, regularise and decode. Part III
# turns to a real task, German-to-English translation.

# %% [markdown]
# ## Exercises
#
# 1. **Sorting by counting.** There are only ten digits, so a sorted sequence is fixed by how
#    often each digit occurs. Write `sorted_by_counting(src, V, pad=2)` with `torch.bincount`
#    and no sort; the check compares it with `sorted_symbols` on the 1,000 test sequences.
#    Is counting a plausible description of what the model learned?
# 2. **Repeated digits.** When a digit occurs twice, two output positions must find the same
#    digit in the source. How can the decoder tell that it has written the first copy already,
#    when the source looks the same both times?
#
# ```{dropdown} Answers
# 1. As a description of what the output depends on, yes: to write each digit the right number
#    of times and `</s>` at the right place, the model must in effect know how many of each
#    digit the source holds. It says little about how the weights compute it; the maps above
#    show the second layer looking up the next digit in the source by its content.
# 2. From its own output: the decoder's self-attention sees the digits written so far, and
#    can compare how many copies of the digit it has written with how many the encoder's
#    memory holds.
# ```

# %% tags=["hide-cell"]
# Exercise 1: our solution (hidden in the book). Replace the body with yours.
def sorted_by_counting(src: torch.Tensor, V: int, *, pad: int = 2) -> torch.Tensor:
    """Each row's symbols in increasing order, from how often each occurs; padding at the end."""
    rows = []
    for row in src:
        counts = torch.bincount(row[row != pad], minlength=V)  # (V,)
        symbols = torch.repeat_interleave(torch.arange(V), counts)  # in increasing order
        rows.append(torch.cat([symbols, torch.full((src.size(1) - len(symbols),), pad)]))
    return torch.stack(rows)


# %%
# Check exercise 1
assert torch.equal(sorted_by_counting(test_src, V), sorted_symbols(test_src))
print("exercise 1: correct")
