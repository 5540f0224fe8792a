# %% [markdown]
# # The schedule and the optimizer
#
# Sections 5.2 and 5.3 of {cite:t}`vaswani2017attention` say on what hardware the Transformer
# was trained, for how long, and with which optimizer and learning rate. This chapter turns the
# hardware numbers into a compute budget, estimates how much of it the model used, and then
# builds the learning-rate schedule, the one piece of this part of the paper that is code.

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

from the_annotated_transformer import enable_book_charts, line_chart, make_model

enable_book_charts()

# %% [markdown]
# ## Hardware and schedule
#
# The paper trained on one machine with 8 NVIDIA P100 GPUs. Each training step took about
# 0.4 seconds for the base model, which was trained for 100,000 steps (12 hours); the big model
# took 1.0 second per step and was trained for 300,000 steps (3.5 days). Sentence pairs were
# batched by approximate length so that each batch held about 25,000 source tokens and 25,000
# target tokens (chapter 9 builds such batches).
#
# What does that amount to? NVIDIA's datasheet gives a P100 (PCIe) a peak of about 9.3 TFLOP/s
# in 32-bit floating point and 18.7 TFLOP/s in 16-bit; we take these as assumptions. The paper
# itself, in its Table 2, multiplies GPU count, training time and a "sustained" 9.5 TFLOP/s per
# P100 to report a training cost of $3.3 \cdot 10^{18}$ FLOPs (base) and $2.3 \cdot 10^{19}$
# (big). That is a *budget*: what the GPUs could have done running flat out. The cell below
# computes both budgets.

# %%
P100_FP32 = 9.3e12  # FLOP/s, peak, 32-bit (assumption from NVIDIA's datasheet)
P100_FP16 = 18.7e12  # FLOP/s, peak, 16-bit (same)
P100_PAPER = 9.5e12  # FLOP/s, what the paper's Table 2 assumes
GPUS = 8
runs = {  # name: (training steps, seconds per step, hours of training) as the paper reports
    "base": (100_000, 0.4, 12),
    "big": (300_000, 1.0, 3.5 * 24),
}

for name, (steps, seconds_per_step, hours) in runs.items():
    gpu_seconds = GPUS * hours * 3600
    print(
        f"{name:4s}: {hours:g} hours ({steps * seconds_per_step / 3600:.1f} from steps x time "
        f"per step) x {GPUS} GPUs; budget at peak FP32 {gpu_seconds * P100_FP32:.2e}, "
        f"FP16 {gpu_seconds * P100_FP16:.2e}, at 9.5 TFLOP/s {gpu_seconds * P100_PAPER:.2e} FLOPs"
    )

# %% [markdown]
# With 9.5 TFLOP/s and the stated training times we recover the paper's Table 2 numbers. (The
# base model's 100,000 steps at 0.4 s make 11.1 hours; the 12 hours presumably include more
# than the steps themselves.)
#
# ## What the model needs
#
# How much of that budget does the model actually use? A good estimate comes from counting
# multiply-adds. A weight matrix with $p$ entries applied to one token costs $2p$ floating-point
# operations (a multiply and an add per entry) in the forward pass, and about twice that in the
# backward pass (one product for the gradient with respect to the input, one for the gradient
# with respect to the weights). So training costs about
#
# $$
# 6 \times \text{parameters} \times \text{tokens}
# $$
#
# FLOPs, plus the attention products $QK^\top$ and the weighted sum of values, which have no
# parameters: for a sequence of $n$ tokens they cost $2 \cdot 2 \cdot n \cdot d_{\text{model}}$
# forward FLOPs per token and per attention layer. Embedding lookups cost nothing, but the
# final projection to the vocabulary, $d_{\text{model}} \times V$, is paid on every target
# token.
#
# We count parameters from the paper's formulas, and then check the count against the model
# of chapter 5: an attention sub-layer has four $d_{\text{model}} \times d_{\text{model}}$
# projections with biases, a feed-forward sub-layer two matrices of
# $d_{\text{model}} \times d_{\text{ff}}$ with biases, each layer norm $2 d_{\text{model}}$
# parameters; an encoder layer has one attention and two norms, a decoder layer two attentions
# and three norms. The paper shares one embedding matrix of $V \times d_{\text{model}}$ between
# source, target and the pre-softmax projection, with $V = 37{,}000$ byte-pair tokens for
# English-German.

# %%
import torch


def attention_parameters(d_model: int) -> int:
    """Weights and biases of the four projections W^Q, W^K, W^V, W^O."""
    return 4 * (d_model * d_model + d_model)


def feed_forward_parameters(d_model: int, d_ff: int) -> int:
    """Weights and biases of the two linear layers of the position-wise feed-forward net."""
    return d_model * d_ff + d_ff + d_ff * d_model + d_model


def transformer_parameters(N: int, d_model: int, d_ff: int, vocab: int) -> dict[str, int]:
    """Parameters of the paper's model by part (one shared embedding, post-norm layers)."""
    norm = 2 * d_model
    feed_forward = feed_forward_parameters(d_model, d_ff)
    encoder_layer = attention_parameters(d_model) + feed_forward + 2 * norm
    decoder_layer = 2 * attention_parameters(d_model) + feed_forward + 3 * norm
    return {
        "encoder": N * encoder_layer, "decoder": N * decoder_layer, "embedding": vocab * d_model
    }


configs = {  # the paper's Table 3
    "base": {"N": 6, "d_model": 512, "d_ff": 2048, "vocab": 37_000},
    "big": {"N": 6, "d_model": 1024, "d_ff": 4096, "vocab": 37_000},
}
for name, config in configs.items():
    parts = transformer_parameters(**config)
    print(f"{name:4s}: " + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in parts.items())
          + f"; total {sum(parts.values()) / 1e6:.1f}M")

# %% [markdown]
# The model that chapter 5 builds agrees, when asked for the paper's arrangement: one shared
# embedding and layer norms after each sub-layer (post-norm). The only difference is the bias of
# the output projection, one number per vocabulary entry, which the formula leaves out.

# %%
torch.manual_seed(0)
base = make_model(37_000, 37_000, share_embeddings=True, norm_first=False)
counted = sum(p.numel() for p in base.parameters())  # the shared matrix is counted once
formula = sum(transformer_parameters(**configs["base"]).values())
print(f"make_model: {counted:,} parameters; formula: {formula:,}; difference {counted - formula:,}")
assert counted - formula == configs["base"]["vocab"]  # the output projection's bias
del base

# %% [markdown]
# The paper reports 65 million parameters for the base model and 213 million for the big one;
# our counts come within a few percent (the paper does not say exactly what it counted).
#
# Now the FLOPs of one training step. Encoder weights see the source tokens, decoder weights and
# the output projection see the target tokens. For the attention terms we need a sentence
# length; we assume about 30 tokens, an assumption, not a number from the paper.

# %%
TOKENS_PER_BATCH = 25_000  # source tokens, and as many target tokens
SENTENCE_LENGTH = 30  # assumed average tokens per sentence


def training_flops_per_step(
    N: int, d_model: int, d_ff: int, vocab: int, tokens: int = TOKENS_PER_BATCH,
    n: int = SENTENCE_LENGTH,
) -> dict[str, float]:
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
    print(
        f"{name:4s}: {per_step:.2e} FLOPs/step ({flops['attention'] / per_step:.1%} attention), "
        f"{per_step * steps:.2e} in {steps:,} steps; {achieved / 1e12:.2f} TFLOP/s per GPU "
        f"= {achieved / P100_FP32:.0%} of FP32 peak"
    )

# %% [markdown]
# By this estimate the base model needed about $10^{18}$ FLOPs, a little under a third of the
# paper's budget: at 0.4 s per step each GPU delivered about 3 TFLOP/s, a third of its 32-bit
# peak (a sixth of the 16-bit one). The big model, with larger matrices that keep a GPU busier,
# reached about 4 TFLOP/s, 43% of the 32-bit peak. Such fractions were normal for real training
# in 2017: besides the matrix products there are softmaxes, layer norms, dropout,
# the optimizer's update and the exchange of gradients among the 8 GPUs. Attention's own
# products are only a few percent of the work at these sentence lengths; chapter 6 shows where
# that changes.
#
# ## Adam
#
# The optimizer is Adam {cite}`kingma2015adam`, with $\beta_1 = 0.9$, $\beta_2 = 0.98$ and
# $\epsilon = 10^{-9}$. Adam divides each parameter's update by a running estimate of the root
# mean square of its gradient; $\beta_2$ sets how long that estimate remembers. The usual
# default of 0.999 averages over roughly the last 1,000 steps, 0.98 over roughly the last 50,
# so the estimate follows the quickly changing gradients of early training more closely. The
# small $\epsilon$ only protects against division by zero.
#
# ## The learning-rate schedule
#
# The learning rate is not constant. It rises linearly for the first $\text{warmup}$ steps,
# then decays with the inverse square root of the step number:
#
# $$
# \text{lrate} = d_{\text{model}}^{-0.5} \cdot
#   \min\left(\text{step}^{-0.5},\ \text{step} \cdot \text{warmup}^{-1.5}\right),
# $$
#
# with $\text{warmup} = 4000$. The two terms of the minimum are equal at
# $\text{step} = \text{warmup}$, so that is where the rate peaks, at
# $d_{\text{model}}^{-0.5} \cdot \text{warmup}^{-0.5}$. Why warm up? At the start the
# weights are random and Adam's estimates of the gradients' scale rest on a handful of steps;
# full-size updates then can throw a Transformer into a region it does not recover from.
# {cite:t}`xiong2020layer` trace this to where the layer norms sit, and show that the layer
# arrangement this book uses (norm before each sub-layer, chapter 2) depends on warmup less.
# Chapter 19 puts this to the test on the sort task: without warm-up, the paper's post-norm
# model learns nothing in 250 steps, while the pre-norm model still learns, only more slowly.
# The factor $d_{\text{model}}^{-0.5}$ makes wider models take smaller steps.
#
# The function below adds a `factor` to scale the whole curve, as the classic implementation
# did. It is written to be handed to PyTorch's `LambdaLR`, which calls it with the number of
# scheduler steps taken so far, starting from 0.

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
# ```{note}
# Step 0 counts as step 1 here, as in the classic version. `LambdaLR` calls the function once
# with 0 when it is created, to set the rate of the first update, and $0^{-0.5}$ has no value;
# the consequence is that the first two updates share the rate of step 1.
# ```
#
# A few values, and the peak where the formula says it is:

# %%
for step in (0, 1, 2000, 4000, 8000, 20_000, 100_000):
    print(f"step {step:7,d}: rate {rate(step, model_size=512, factor=1.0, warmup=4000):.4e}")

peak = max(range(1, 20_001), key=lambda s: rate(s, model_size=512, factor=1.0, warmup=4000))
print(f"peak at step {peak}; 512^-0.5 * 4000^-0.5 = {512**-0.5 * 4000**-0.5:.4e}")

# %% [markdown]
# The chart shows three settings over the first 20,000 steps: the paper's (512, 1, 4000), a
# longer warmup and a narrower model. Doubling the warmup lowers the peak by $\sqrt 2$ and moves
# it later, and once both curves are decaying they coincide, since the decay term does not
# depend on the warmup; halving $d_{\text{model}}$ raises the whole curve by $\sqrt 2$. (The
# chart samples every 100th step; the curves are smooth.)

# %%
settings = [(512, 1.0, 4000), (512, 1.0, 8000), (256, 1.0, 4000)]
points = [
    {
        "step": step,
        "learning rate": rate(step, model_size=d_model, factor=factor, warmup=warmup),
        "setting": f"d_model={d_model}, factor={factor:g}, warmup={warmup}",
    }
    for d_model, factor, warmup in settings
    for step in range(0, 20_001, 100)
]
line_chart(points, x="step:Q", y="learning rate:Q", color="setting:N", points=False,
           x_title="training step", y_title="learning rate", y_format=".1e",
           formats={"learning rate": ".3e"}, width=520, title="The learning-rate schedule")

# %% [markdown]
# ## Using it with PyTorch
#
# `LambdaLR` multiplies the optimizer's initial learning rate by whatever the function returns,
# so we give Adam a learning rate of 1 and let `rate` supply the whole value. A tiny model
# stands in for the Transformer; the optimizer's settings are the paper's.

# %%
from torch.optim.lr_scheduler import LambdaLR

torch.manual_seed(0)
model = torch.nn.Linear(4, 4)
optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
scheduler = LambdaLR(
    optimizer, lr_lambda=lambda step: rate(step, model_size=512, factor=1.0, warmup=4000)
)

used = []
for _ in range(5):
    used.append(optimizer.param_groups[0]["lr"])  # the rate this update will use
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    scheduler.step()
print("rates of the first five updates:", [f"{lr:.3e}" for lr in used])
assert used[0] == used[1] == rate(1, model_size=512, factor=1.0, warmup=4000)
assert used[4] == rate(4, model_size=512, factor=1.0, warmup=4000)


# %% [markdown]
# In a training loop, `scheduler.step()` follows every `optimizer.step()`, once
# per batch, not once per epoch: the schedule counts updates.
#
# You now have the paper's optimizer and its learning-rate schedule, and a sense of the compute
# behind its results: about $10^{18}$ FLOPs for the base model, a third of what its GPUs could
# deliver. The next chapter adds the last ingredients of training, dropout and label smoothing.

# %% [markdown]
# ## Exercises
#
# 1. **Choosing the warmup for a peak.** Write `warmup_for_peak(peak, d_model, factor)`: the
#    warmup that makes the schedule's largest learning rate equal to `peak`. The check runs
#    `rate` over the steps and compares its maximum with the peak you asked for.
# 2. **Down to a tenth.** With the paper's settings ($d_\text{model} = 512$, factor 1, warmup
#    4,000), at which step has the learning rate fallen to a tenth of its peak? Write it in
#    `answer_2`, from the formula, not by search.
# 3. **Why warm up at all?** Adam divides each update by a running estimate of the gradient's
#    size. Why can its first updates be too large, and why would a post-norm model (chapter 2)
#    suffer more from that than a pre-norm one?
#
# ```{dropdown} Answer to 3
# In the first steps Adam's second-moment estimate rests on a handful of gradients, so the
# normalized update can be large in directions where the gradient happened to be small. In a
# post-norm model the gradients of the last layers are large at initialization
# {cite}`xiong2020layer`, so large early updates there can throw training off; a small, rising
# learning rate gives the estimates time to settle. Pre-norm keeps the gradients better spread
# and tolerates a short warmup or none.
# ```

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
