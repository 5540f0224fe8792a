# %% [markdown]
# # Batches and masking
#
# The paper fixes how the decoder is trained (§3.1 and §3.2.3 of
# {cite:t}`vaswani2017attention`): its input is the target offset by one position, and its
# self-attention is masked so that no position sees a later one; each prediction then depends
# only on words already known. This chapter packs sentences of different lengths into rectangular
# tensors, marks the filler, which the paper does not discuss, and builds the two masks that
# attention reads.

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
    attention,
    check_batch,
    enable_book_charts,
    mask_chart,
    subsequent_mask,
)

enable_book_charts()

# %% [markdown]
# ## Padding
#
# A batch is a matrix of token ids, one sentence per row. Shorter sentences are filled up at the
# end with the padding token `<blank>`, id `PAD_ID` (chapter 5's special ids; `BOS_ID` is `<s>`,
# `EOS_ID` is `</s>`). Three source sentences of lengths 5, 3 and 4:

# %%
import torch

src = torch.tensor([[5, 6, 7, 8, 9], [5, 6, 7, PAD_ID, PAD_ID], [9, 8, 7, 6, PAD_ID]])
src

# %% [markdown]
# Padding must change nothing: no query may attend to a padded position (it would take softmax
# weight from real words), and the loss must not count the prediction made there.
#
# ## Teacher forcing: inputs and labels from one sequence
#
# With *teacher forcing* the decoder is given the true target words so far and predicts the next
# word at every position at once. From one target sequence
# $y_0 y_1 \dots y_m$ ($y_0$ is `<s>`, $y_m$ is `</s>`), the decoder's input is
# $y_0 \dots y_{m-1}$ (`tgt`) and the labels are $y_1 \dots y_m$ (`tgt_y`): the paper's offset
# by one position.
#
# ## Two masks
#
# Attention takes a boolean mask, `True` where a query may look at a key (chapter 3). A batch
# needs two:
#
# * `src_mask`, shape `(batch, 1, n_src)`: `True` at the source's real tokens; its one row
#   broadcasts over every query of the encoder's self-attention and of the decoder-to-source
#   attention.
# * `tgt_mask`, shape `(batch, n_tgt, n_tgt)`: query $i$ may see key $j$ if $j$ is a real token
#   **and** $j \le i$ (chapter 2's subsequent mask).
#
# `ntokens` counts the real labels; the next chapter divides the summed loss by its total over one
# update.

# %% tags=["export"]
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
# Targets for the three sentences, between `<s>` and `</s>`, then padded. Look for each label row
# as its input row moved one step left.

# %%
tgt = torch.tensor([[BOS_ID, 5, 6, 7, 8, 9, EOS_ID],
                    [BOS_ID, 5, 6, 7, EOS_ID, PAD_ID, PAD_ID],
                    [BOS_ID, 9, 8, 7, 6, EOS_ID, PAD_ID]])  # (batch, n_tgt + 1)
batch = Batch(src, tgt)
print(batch)
print("decoder input tgt:\n", batch.tgt)
print("labels tgt_y:\n", batch.tgt_y)
assert torch.equal(batch.tgt[:, 1:], batch.tgt_y[:, :-1])
print("src_mask:\n", batch.src_mask.int())
print("real label tokens:", batch.ntokens, "=", 6 + 4 + 5)

# %% [markdown]
# ## What the decoder may see
#
# The target mask of the second sentence: rows are queries (the position that predicts), columns
# are keys. Look for the lower triangle of the subsequent mask, and for the last column, the
# padding, cut off.

# %%
names = {BOS_ID: "<s>", EOS_ID: "</s>", PAD_ID: "<blank>"}
sentence = 1
words = [f"{i}: {names.get(t, str(t))}" for i, t in enumerate(batch.tgt[sentence].tolist())]
mask_chart(batch.tgt_mask[sentence], labels=words, x_title="key (attended to)",
           y_title="query (predicting the next word)", size=260,
           title="tgt_mask for '<s> 5 6 7 </s> <blank>'")

# %% [markdown]
# The padding row still sees real tokens, harmlessly: its label is padding, which the loss skips.
# What matters is that no real query sees a padding or a future key; in the target the subsequent
# mask already hides trailing padding, in the source only the padding mask does. A check:
# `attention` (chapter 3) over `5 6 7 <blank> <blank>` with its `src_mask` gives, at the real
# positions, the outputs of `5 6 7` alone.

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
# ## What we have
#
# `Batch` turns padded matrices into what a training step needs, and `Batch.to(device)` moves it;
# the next chapter writes the loop.
#
# ## Exercises
#
# 1. **The masks by hand.** For the target row `[BOS_ID, 5, EOS_ID, PAD_ID, PAD_ID]`, write down
#    without running anything the decoder input, the labels, `tgt_mask` (a nested list of
#    0 and 1) and `ntokens` that `Batch` makes. The check compares.
# 2. **Padding on the left.** Some decoders pad on the *left*, so that every row's last token
#    lines up. With the row `<blank> <blank> <s> 8 </s>` and only the causal mask
#    `subsequent_mask(5)`, do the attention outputs at the three real positions differ from those
#    of `<s> 8 </s>` alone? Set `answer_2`; the check runs both, then `Batch.make_std_mask`.

# %% tags=["hide-cell"]
# Exercises 1 and 2: our answers (hidden in the book). Replace them with yours.
answer_1 = {
    "tgt": [[BOS_ID, 5, EOS_ID, PAD_ID]],
    "tgt_y": [[5, EOS_ID, PAD_ID, PAD_ID]],
    "tgt_mask": [[[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 1, 0]]],
    "ntokens": 2,
}
answer_2 = True  # the pads stand before the real tokens, where the causal mask lets them be seen

# %%
# Check exercises 1 and 2
exercise = Batch(torch.tensor([[3, 4]]), torch.tensor([[BOS_ID, 5, EOS_ID, PAD_ID, PAD_ID]]))
assert exercise.tgt.tolist() == answer_1["tgt"]
assert exercise.tgt_y.tolist() == answer_1["tgt_y"]
assert exercise.tgt_mask.int().tolist() == answer_1["tgt_mask"]
assert exercise.ntokens == answer_1["ntokens"]
print("exercise 1: correct")
torch.manual_seed(0)
real = torch.randn(1, 3, 8)  # (1, 3, d_k): vectors for <s> 8 </s>
x = torch.cat([torch.randn(1, 2, 8), real], dim=1)  # (1, 5, d_k): two pads on the left
alone, _ = attention(real, real, real, mask=subsequent_mask(3))  # (1, 3, d_k)
causal_only, _ = attention(x, x, x, mask=subsequent_mask(5))  # (1, 5, d_k)
assert bool((causal_only[:, 2:] - alone).abs().max() > 1e-6) == answer_2
row = torch.tensor([[PAD_ID, PAD_ID, BOS_ID, 8, EOS_ID]])
both, _ = attention(x, x, x, mask=Batch.make_std_mask(row, PAD_ID))  # padding and future hidden
assert torch.allclose(both[:, 2:], alone, atol=1e-6)
print("exercise 2: correct; with the padding mask the real positions are unchanged")
