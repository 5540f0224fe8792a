# %% [markdown]
# # The schedule and the optimizer
#
# Sections 5.2 and 5.3 of {cite:t}`vaswani2017attention` give the hardware, the training time, the
# optimizer and the learning rate. This chapter turns the hardware into a compute budget,
# estimates how much of it the model used, and builds the learning-rate schedule.

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

from the_annotated_transformer import count_parameters, enable_book_charts, line_chart, make_model

enable_book_charts()

# %% [markdown]
# ## Hardware and schedule
#
# The paper trained on 8 NVIDIA P100 GPUs: the base model for 100,000 steps of about 0.4 seconds
# (12 hours), the big model for 300,000 steps of 1.0 second (3.5 days), on batches of about
# 25,000 source tokens and as many target tokens. NVIDIA's datasheet gives a P100 (PCIe) a peak
# of about 9.3 TFLOP/s in 32-bit and 18.7 TFLOP/s in 16-bit floating point (our assumptions).
# The paper's Table 2 multiplies GPU count, time and a "sustained" 9.5 TFLOP/s into a training
# cost of
# $3.3 \cdot 10^{18}$ FLOPs (base) and $2.3 \cdot 10^{19}$ (big): a *budget*, not what was used.

# %%
P100_FP32, P100_FP16 = 9.3e12, 18.7e12  # FLOP/s, peak (assumptions from NVIDIA's datasheet)
P100_PAPER = 9.5e12  # FLOP/s, what the paper's Table 2 assumes
GPUS = 8
runs = {"base": (100_000, 0.4, 12), "big": (300_000, 1.0, 3.5 * 24)}  # steps, s/step, hours
for name, (steps, seconds_per_step, hours) in runs.items():
    gpu_seconds = GPUS * hours * 3600
    print(f"{name:4s}: {hours:g} hours ({steps * seconds_per_step / 3600:.1f} from steps x time "
          f"per step) x {GPUS} GPUs; budget at peak FP32 {gpu_seconds * P100_FP32:.2e}, "
          f"FP16 {gpu_seconds * P100_FP16:.2e}, "
          f"at 9.5 TFLOP/s {gpu_seconds * P100_PAPER:.2e} FLOPs")

# %% [markdown]
# With 9.5 TFLOP/s and the stated times we recover Table 2 (the base model's steps make 11.1
# hours; the 12 presumably include more than the steps).
#
# ## What the model needs
#
# A weight matrix with $p$ entries costs $2p$ floating-point operations per token in the forward
# pass (a multiply and an add per entry) and about twice that backward (gradients for the input
# and for the weights). So training costs about
#
# $$
# 6 \times \text{parameters} \times \text{tokens}
# $$
#
# FLOPs, plus the attention products $QK^\top$ and the weighted sum of values, which have no
# parameters: $2 \cdot 2 \cdot n \cdot d_{\text{model}}$ forward FLOPs per token and attention
# layer for a sequence of $n$ tokens. Embedding lookups cost nothing, but the projection to the
# vocabulary, $d_{\text{model}} \times V$, is paid on every target token. The paper shares one
# embedding matrix between source, target and that projection, with $V = 37{,}000$ byte-pair
# tokens for English-German. The paper reports 65 million parameters for the base model and 213
# million for the big one, without saying exactly what it counted. We count the parts on chapter
# 5's model itself, asked for the paper's arrangement (shared embedding, post-norm), with
# `count_parameters` (chapter 5's exercise 1 derives the same count by formula); the parts cover
# the whole model except the output projection's bias.

# %%
import torch


def paper_model(N: int, d_model: int, d_ff: int, vocab: int) -> torch.nn.Module:
    """The paper's arrangement (one shared embedding, post-norm) on the meta device: every
    shape, no storage, so even the big model costs no memory."""
    with torch.device("meta"):
        return make_model(vocab, vocab, N, d_model, d_ff, share_embeddings=True, norm_first=False)


def transformer_parameters(N: int, d_model: int, d_ff: int, vocab: int) -> dict[str, int]:
    """Parameters of the paper's model by part, counted on the model itself."""
    model = paper_model(N, d_model, d_ff, vocab)
    return {"encoder": count_parameters(model.encoder), "decoder": count_parameters(model.decoder),
            "embedding": vocab * d_model}


configs = {  # the paper's Table 3
    "base": {"N": 6, "d_model": 512, "d_ff": 2048, "vocab": 37_000},
    "big": {"N": 6, "d_model": 1024, "d_ff": 4096, "vocab": 37_000},
}
for name, config in configs.items():
    parts = transformer_parameters(**config)
    print(f"{name:4s}: " + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in parts.items())
          + f"; total {sum(parts.values()) / 1e6:.1f}M")
counted = count_parameters(paper_model(**configs["base"]))  # the shared matrix counted once
summed = sum(transformer_parameters(**configs["base"]).values())
print(f"make_model: {counted:,} parameters; the three parts: {summed:,}; "
      f"difference {counted - summed:,}")
assert counted - summed == configs["base"]["vocab"]  # the output projection's bias


# %% [markdown]
# The FLOPs of one step: encoder weights see the source tokens, decoder weights and the output
# projection the target tokens. For the attention terms we assume about 30 tokens per sentence,
# an assumption, not a number from the paper.

# %%
def training_flops_per_step(N: int, d_model: int, d_ff: int, vocab: int,
                            tokens: int = 25_000, n: int = 30) -> dict[str, float]:
    """FLOPs of one forward and backward pass (3x forward), split into weights and attention."""
    parts = transformer_parameters(N, d_model, d_ff, vocab)
    attend = 2 * 2 * n * d_model  # Q K^T and weights @ V, forward, per token and attention layer
    weights = 2 * tokens * (parts["encoder"] + parts["decoder"] + vocab * d_model)
    attention = tokens * N * attend * 3  # encoder self, decoder self, decoder cross
    return {"weights": 3 * weights, "attention": 3 * attention}


for name, config in configs.items():
    steps, seconds_per_step, _ = runs[name]
    flops = training_flops_per_step(**config)
    per_step = sum(flops.values())
    achieved = per_step / seconds_per_step / GPUS
    print(f"{name:4s}: {per_step:.2e} FLOPs/step ({flops['attention'] / per_step:.1%} attention), "
          f"{per_step * steps:.2e} in {steps:,} steps; {achieved / 1e12:.2f} TFLOP/s per GPU "
          f"= {achieved / P100_FP32:.0%} of FP32 peak")

# %% [markdown]
# By this estimate the base model needed about $10^{18}$ FLOPs, under a third of the paper's
# budget: each GPU delivered about 3 TFLOP/s, a third of its 32-bit peak; the big model, with
# larger matrices, about 4 TFLOP/s, 43% of it. Softmaxes, layer norms, dropout, the optimizer and
# the exchange of gradients take time besides the matrix products. Attention's own products are
# a few percent of the work at these lengths; chapter 6 shows where that changes.
#
# ## Adam
#
# The optimizer is Adam {cite}`kingma2015adam` with $\beta_1 = 0.9$, $\beta_2 = 0.98$ and
# $\epsilon = 10^{-9}$. Adam divides each parameter's update by a running estimate of the root
# mean square of its gradient; $\beta_2 = 0.98$ makes that estimate remember roughly the last 50
# steps (the usual 0.999: roughly 1,000), following the fast-changing gradients of early training.
#
# ## The learning-rate schedule
#
# The learning rate rises linearly for the first $\text{warmup}$ steps, then decays with the
# inverse square root of the step number:
#
# $$
# \text{lrate} = d_{\text{model}}^{-0.5} \cdot
#   \min\left(\text{step}^{-0.5},\ \text{step} \cdot \text{warmup}^{-1.5}\right),
# $$
#
# with $\text{warmup} = 4000$. The two terms are equal at $\text{step} = \text{warmup}$, where the
# rate peaks at $d_{\text{model}}^{-0.5} \cdot \text{warmup}^{-0.5}$; the factor
# $d_{\text{model}}^{-0.5}$ gives wider models smaller steps. Why warm up? At the start Adam's
# estimates of the gradients' scale rest on a handful of steps, and full-size updates can throw a
# Transformer into a region it does not recover from. {cite:t}`xiong2020layer` trace this to where
# the layer norms sit: the norm-before-sub-layer arrangement this book uses (chapter 2) depends on
# warm-up less, and chapter 19 shows it on the sort task, where without warm-up the paper's
# post-norm model learns nothing in 250 steps and the pre-norm model still learns.
#
# `rate` adds a `factor` that scales the whole curve, as the classic implementation did, and is
# written for PyTorch's `LambdaLR`, which calls it with the number of steps taken so far.

# %% tags=["export"]
def rate(step: int, model_size: int, factor: float, warmup: int) -> float:
    """Learning rate at `step`: linear warmup, then decay as step^-0.5 (paper, eq. 3)."""
    if step < 0:
        raise ValueError(f"step={step} must be >= 0")
    if model_size <= 0:
        raise ValueError(f"model_size={model_size} must be a positive d_model")
    if warmup <= 0:
        raise ValueError(f"warmup={warmup} must be a positive number of steps")
    step = max(step, 1)  # LambdaLR starts at step 0, where step^-0.5 would divide by zero
    return factor * model_size**-0.5 * min(step**-0.5, step * warmup**-1.5)


# %% [markdown]
# Three settings over the first 20,000 steps: the paper's, a longer warm-up and a narrower model.
# Doubling the warm-up lowers the peak by $\sqrt 2$ and moves it later, and once both curves decay
# they coincide; halving $d_{\text{model}}$ raises the whole curve by $\sqrt 2$.

# %%
settings = [(512, 1.0, 4000), (512, 1.0, 8000), (256, 1.0, 4000)]
points = [{"step": step,
           "learning rate": rate(step, model_size=d_model, factor=factor, warmup=warmup),
           "setting": f"d_model={d_model}, factor={factor:g}, warmup={warmup}"}
          for d_model, factor, warmup in settings for step in range(0, 20_001, 100)]
line_chart(points, x="step:Q", y="learning rate:Q", color="setting:N", points=False,
           x_title="training step", y_title="learning rate", y_format=".1e",
           formats={"learning rate": ".3e"}, width=520, title="The learning-rate schedule")

# %% [markdown]
# ## Using it with PyTorch
#
# `LambdaLR` multiplies the optimizer's initial learning rate by what the function returns, so
# Adam gets a learning rate of 1 and `rate` supplies the whole value; `scheduler.step()` follows
# every `optimizer.step()`, since the schedule counts updates. A tiny model stands in for the
# Transformer.
#
# ```{note}
# Step 0 counts as step 1, as in the classic version: `LambdaLR` calls the function with 0 when it
# is created, and $0^{-0.5}$ has no value. So the first two updates share the rate of step 1.
# ```

# %%
from torch.optim.lr_scheduler import LambdaLR

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
scheduler = LambdaLR(optimizer, lambda step: rate(step, model_size=512, factor=1.0, warmup=4000))
used = []
for _ in range(5):
    used.append(optimizer.param_groups[0]["lr"])  # the rate this update will use
    optimizer.zero_grad()
    model(torch.randn(8, 4)).pow(2).mean().backward()
    optimizer.step()
    scheduler.step()
print("rates of the first five updates:", [f"{lr:.3e}" for lr in used])
assert used[0] == used[1] == rate(1, model_size=512, factor=1.0, warmup=4000)
assert used[4] == rate(4, model_size=512, factor=1.0, warmup=4000)


# %% [markdown]
# The next chapter adds the last ingredients of training, dropout and label smoothing.
#
# ## Exercises
#
# 1. **Choosing the warm-up for a peak.** Write `warmup_for_peak(peak, d_model, factor)`: the
#    warm-up that makes the schedule's largest learning rate equal to `peak`. The check runs
#    `rate` over the steps and compares its maximum with the peak you asked for.
# 2. **Down to a tenth.** With the paper's settings ($d_\text{model} = 512$, factor 1, warm-up
#    4,000), at which step has the learning rate fallen to a tenth of its peak? Write it in
#    `answer_2`, from the formula, not by search.

# %% tags=["hide-cell"]
# Exercises 1 and 2: our answers (hidden in the book). Replace them with yours.
def warmup_for_peak(peak: float, d_model: int, factor: float) -> float:
    """The peak, at step = warmup, is factor * d_model^-0.5 * warmup^-0.5: solve for warmup."""
    return (factor / (peak * d_model**0.5)) ** 2


answer_2 = 400_000  # after the peak the rate falls as step^-0.5: a tenth at 100 x 4,000 steps

# %%
# Check exercises 1 and 2
import math

for peak, d_model, factor in ((7e-4, 512, 1.0), (1e-3, 256, 2.0), (5e-3, 64, 0.5)):
    warmup = warmup_for_peak(peak, d_model, factor)
    top = max(rate(s, model_size=d_model, factor=factor, warmup=warmup)
              for s in range(1, int(3 * warmup)))
    # the best whole step can miss a fractional warmup by a little: within 1%
    assert math.isclose(top, peak, rel_tol=1e-2), (peak, d_model, factor, warmup)
print("exercise 1: correct")
paper = {"model_size": 512, "factor": 1.0, "warmup": 4000}
assert math.isclose(rate(answer_2, **paper), rate(4000, **paper) / 10)
print("exercise 2: correct")
