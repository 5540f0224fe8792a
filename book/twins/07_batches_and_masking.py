# %% [markdown]
# # Batches and masking
#
# Part I built a model that maps a source sentence and the beginning of a target sentence to a
# guess at the next target word. Training it means feeding it many sentences at once, and
# sentences have different lengths. This chapter packs them into rectangular tensors, marks
# which entries are real and which are filler, and builds the two masks that the model's
# attention layers read: one that hides the filler, and one that stops the decoder from looking
# at the words it is meant to predict.

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

from the_annotated_transformer import attention, enable_book_charts, mask_chart, subsequent_mask

enable_book_charts()

# %% [markdown]
# ## Padding
#
# A batch is a matrix of token indices, one sentence per row. Rows must have one length, so
# shorter sentences are filled up at the end with a padding token. In this book the padding
# token has index 2 (the vocabulary of Part III reserves 0 for the start of a sentence `<s>`,
# 1 for its end `</s>` and 2 for the blank `<blank>`). Here are three source sentences of
# lengths 5, 3 and 4, padded to 5:

# %%
import torch

pad = 2
src = torch.tensor(
    [
        [5, 6, 7, 8, 9],
        [5, 6, 7, pad, pad],
        [9, 8, 7, 6, pad],
    ]
)  # (batch, n_src)
src

# %% [markdown]
# Padding must change nothing. A padded position is not a word, so no query may attend to it
# (it would dilute the softmax with weight taken from real words), and the loss must not
# count the model's prediction at it.
#
# ## Teacher forcing: inputs and labels from one sequence
#
# The decoder is trained with *teacher forcing*: at every position it is given the true target
# words so far, not its own earlier guesses, and is asked for the next one. All positions are
# trained in parallel from one target sequence $y_0 y_1 \dots y_m$, where $y_0$ is `<s>` and
# $y_m$ is `</s>`. The decoder's input is the sequence without its last token, $y_0 \dots
# y_{m-1}$ (`tgt`), and the label at each position is the next token, $y_1 \dots y_m$
# (`tgt_y`): the same sequence shifted one step to the left. The paper calls this offsetting
# the output embeddings by one position {cite}`vaswani2017attention`.
#
# ## Two masks
#
# Attention takes a boolean mask, `True` where a query may look at a key (chapter 3). A batch
# needs two:
#
# * `src_mask`, shape `(batch, 1, n_src)`: `True` at the source's real tokens. It is the same
#   for every query, so it has a single query row that broadcasts over all of them; the encoder's
#   self-attention and the decoder's attention to the encoder both use it.
# * `tgt_mask`, shape `(batch, n_tgt, n_tgt)`: a query at position $i$ may look at key $j$ if
#   $j$ is a real token **and** $j \le i$. The second condition is the subsequent mask of
#   chapter 2; without it, the decoder would see the word it is asked to predict one column to
#   its right, and would learn to copy it rather than to predict it.
#
# Because each query row of `tgt_mask` is different, this mask is a full square per sentence.
#
# The last number a batch carries is `ntokens`, the count of real (non-padding) labels in
# `tgt_y`. The training loop of the next chapter divides the summed loss by it, so that each
# step's loss is a mean per token, whose size does not depend on how many tokens the batch
# holds.

# %% tags=["export"]
import torch


class Batch:
    """A batch of token sequences with its masks, and for training, decoder inputs and labels."""

    def __init__(self, src: torch.Tensor, tgt: torch.Tensor | None = None, pad: int = 2):
        if not isinstance(src, torch.Tensor) or src.dim() != 2 or src.is_floating_point():
            raise TypeError("src must be an integer tensor of shape (batch, n_src)")
        self.src = src  # (batch, n_src)
        self.src_mask = (src != pad).unsqueeze(-2)  # (batch, 1, n_src)
        if tgt is not None:
            if not isinstance(tgt, torch.Tensor) or tgt.dim() != 2 or tgt.is_floating_point():
                raise TypeError("tgt must be an integer tensor of shape (batch, n_tgt)")
            if tgt.size(0) != src.size(0) or tgt.size(1) < 2:
                raise ValueError(
                    f"tgt must have shape ({src.size(0)}, n_tgt) with n_tgt >= 2, "
                    f"got {tuple(tgt.shape)}"
                )
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
        shapes = ", ".join(
            f"{name}={tuple(value.shape)}"
            for name, value in vars(self).items()
            if isinstance(value, torch.Tensor)
        )
        ntokens = f", ntokens={self.ntokens}" if hasattr(self, "ntokens") else ""
        return f"Batch({shapes}{ntokens})"


# %% [markdown]
# A target batch for the three sentences above: each starts with `<s>` (0) and ends with
# `</s>` (1) before its padding.

# %%
tgt = torch.tensor(
    [
        [0, 5, 6, 7, 8, 9, 1],
        [0, 5, 6, 7, 1, pad, pad],
        [0, 9, 8, 7, 6, 1, pad],
    ]
)  # (batch, n_tgt + 1)
batch = Batch(src, tgt, pad=pad)
batch

# %% [markdown]
# The shapes are as promised, and the shift is visible: the label row is the input row moved
# one step left, so `tgt_y[:, i]` is the word that follows `tgt[:, i]`.

# %%
print("decoder input tgt:\n", batch.tgt)
print("labels tgt_y:\n", batch.tgt_y)
assert torch.equal(batch.tgt[:, 1:], batch.tgt_y[:, :-1])
print("src_mask:\n", batch.src_mask.int())
print("real label tokens:", batch.ntokens, "=", 6 + 4 + 5)

# %% [markdown]
# ## What the decoder may see
#
# The target mask of the second sentence, `<s> 5 6 7 </s> <blank>`, as a heatmap: rows are
# queries (the position that is predicting), columns are keys (the positions it may attend
# to). The lower triangle is the subsequent mask; the last column is cut off because it is
# padding.

# %%
names = {0: "<s>", 1: "</s>", 2: "<blank>"}
sentence = 1
words = [f"{i}: {names.get(t, str(t))}" for i, t in enumerate(batch.tgt[sentence].tolist())]
mask_chart(batch.tgt_mask[sentence], labels=words, x_title="key (attended to)",
           y_title="query (predicting the next word)", size=260,
           title="tgt_mask for '<s> 5 6 7 </s> <blank>'")

# %% [markdown]
# The padding query row (the last one) is still allowed to see the real tokens. That is
# harmless: its output is never used, because its label is padding and the loss skips it. What
# matters is that no real query sees a padding key or a future key. On the target side the
# subsequent mask alone would already hide the padding from every real query, since padding
# only ever comes after the last real token; the padding half of `tgt_mask` is there for
# completeness. On the source side, where every query may look in both directions, the
# padding mask is what keeps filler out.
#
# ## Padding changes nothing
#
# A direct check that padding is invisible: the `attention` of chapter 3, run over the second
# source sentence `5 6 7 <blank> <blank>` with its `src_mask`, gives the same outputs at the
# real positions as over the three real tokens alone, with no mask at all. (Random vectors
# stand in for the queries, keys and values; the mask is all that matters.)

# %%
torch.manual_seed(0)
d_k = 8
x = torch.randn(1, 5, d_k)  # (1, n_src, d_k): 3 real positions, then 2 padding positions
mask = batch.src_mask[sentence : sentence + 1]  # (1, 1, n_src)
padded, _ = attention(x, x, x, mask=mask)  # (1, n_src, d_k)
alone, _ = attention(x[:, :3], x[:, :3], x[:, :3])  # (1, 3, d_k)
print("largest difference at the real positions:", float((padded[:, :3] - alone).abs().max()))
assert torch.allclose(padded[:, :3], alone, atol=1e-6)

# %% [markdown]
# ## Moving a batch
#
# `Batch.to(device)` moves every tensor it holds, so that a training loop can build batches on
# the CPU and send each to the GPU just before use. On a CPU-only machine it is a no-op:

# %%
device = "cuda" if torch.cuda.is_available() else "cpu"
moved = Batch(src, tgt, pad=pad).to(device)
print(sorted({str(t.device.type) for t in vars(moved).values() if isinstance(t, torch.Tensor)}))

# %% [markdown]
# ```{note}
# The classic Annotated Transformer builds the same masks; here `ntokens` is a Python integer
# rather than a tensor, so that the loop can add token counts without touching the GPU, and bad
# input (a one-dimensional or floating-point `src`, a target with fewer than two tokens) is
# rejected with a message instead of failing deep inside attention.
# ```
#
# ## What we have
#
# `Batch` turns padded source and target matrices into everything one training step needs:
# the decoder's inputs and labels, a padding mask for the source, a padding-and-future mask for
# the target, and the number of tokens to average the loss over. The next chapter writes the
# loop that feeds batches through the model, computes that loss and updates the parameters.

# %% [markdown]
# ## Exercises
#
# 1. **The masks by hand.** For the target row `[0, 5, 1, 2, 2]` (`<s>`, one token, `</s>`, two
#    pads) and `pad = 2`, write down without running anything the decoder input, the labels,
#    `tgt_mask` (as a nested list of 0 and 1) and `ntokens` that `Batch` makes. The check
#    compares.
# 2. **Is the padding part of `tgt_mask` needed?** Padding stands at the end of each target
#    row, and the causal mask already hides every later position. Does leaving the padding out
#    of `tgt_mask` change the attention output at any *real* target position? Set `answer_2` to
#    `True` or `False`; the check runs `attention` both ways. When would the answer change?
#
# ```{dropdown} Answer to the last question
# When the padding is not at the end: a batch padded on the left (as some decoders of later
# models are, to line up the last tokens) puts pads *before* real tokens, where the causal mask
# lets real queries see them.
# ```

# %% tags=["hide-cell"]
# Exercises 1 and 2: our answers (hidden in the book). Replace them with yours.
answer_1 = {
    "tgt": [[0, 5, 1, 2]],
    "tgt_y": [[5, 1, 2, 2]],
    "tgt_mask": [[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]],
    "ntokens": 2,
}
answer_2 = False  # real queries come before every pad, and the causal mask hides what follows

# %%
# Check exercises 1 and 2
exercise = Batch(torch.tensor([[3, 4]]), torch.tensor([[0, 5, 1, 2, 2]]), pad=2)
assert exercise.tgt.tolist() == answer_1["tgt"]
assert exercise.tgt_y.tolist() == answer_1["tgt_y"]
assert exercise.tgt_mask.int().tolist() == answer_1["tgt_mask"]
assert exercise.ntokens == answer_1["ntokens"]
print("exercise 1: correct")
torch.manual_seed(0)
tgt_rows = torch.tensor([[0, 5, 6, 7, 1], [0, 8, 1, 2, 2]])  # (2, n): the second is padded
x = torch.randn(2, 5, 8)
real = (tgt_rows != 2).unsqueeze(-1)  # (2, n, 1): the positions whose outputs are used
both, _ = attention(x, x, x, mask=Batch.make_std_mask(tgt_rows, 2))
causal_only, _ = attention(x, x, x, mask=subsequent_mask(5))
changed = bool(((both - causal_only).abs() * real).max() > 1e-6)
assert changed == answer_2
print("exercise 2: correct")
