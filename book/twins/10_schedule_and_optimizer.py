# %% [markdown]
# # The schedule and the optimizer
#
# Sections 5.2 and 5.3 of {cite:t}`vaswani2017attention` give the training's hardware and length,
# the optimizer and the learning rate. This chapter sets up the optimizer and builds the
# learning-rate schedule; what the paper's runs cost in compute is worked out in chapter 14,
# where training on real data starts.

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
    check_schedule,
    enable_book_charts,
    line_chart,
)

enable_book_charts()


# %% [markdown]
# ## Adam
#
# The optimizer is Adam {cite}`kingma2015adam` with $\beta_1 = 0.9$, $\beta_2 = 0.98$ and
# $\epsilon = 10^{-9}$. Adam divides each parameter's update by a running estimate of the root
# mean square of its gradient; $\beta_2 = 0.98$ makes that estimate remember roughly the last 50
# steps (the usual 0.999: roughly 1,000), so that it follows the fast-changing gradients of early
# training.
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
# Transformer into a region it does not recover from. {cite:t}`xiong2020layer` trace this to
# where the layer norms sit: the pre-norm arrangement that this book trains (chapter 5 says why)
# depends on warm-up less. Chapter 19 tests it on the sort task over ten runs: without warm-up,
# the paper's post-norm model stays near the loss of a uniform guess in most of them and far
# behind every other variant in all, while the pre-norm model still learns, if less in the same
# number of steps than with warm-up.
#
# `rate` adds a `factor` that scales the whole curve, as the classic implementation did, and is
# written for PyTorch's `LambdaLR`, which calls it with the number of steps taken so far.

# %% tags=["export"]
def rate(step: int, model_size: int, factor: float, warmup: int) -> float:
    """Learning rate at `step`: linear warmup, then decay as step^-0.5 (paper, eq. 3)."""
    check_schedule(step, model_size, warmup)  # one-line errors for bad settings (appendix)
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
import torch
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
