# %% [markdown]
# # The schedule and the optimizer
#
# Section 5.2 of {cite:t}`vaswani2017attention` gives the hardware and the length of training:
# one machine with eight NVIDIA P100 GPUs; the base model trained for 100,000 steps of about 0.4
# seconds, 12 hours in all, the big model for 300,000 steps of about 1.0 second, 3.5 days.
# Section 5.3 gives the optimizer, Adam, under a learning rate that rises over the first 4,000
# steps and then decays; this chapter builds the schedule. The book's runs are far smaller: the
# shipped models' records say what they took.

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
    BOOK_REPOSITORY,
    BOOK_REPOSITORY_REF,
    SHIPPED_MODELS,
    check_schedule,
    download_file,
    enable_book_charts,
    line_chart,
    shipped_model_dir,
)

enable_book_charts()

# %%
import json

# The paper's §5.2 (one machine, 8 P100 GPUs). It gives no token rate: ours is an estimate, §5.1's
# batch of about 25,000 target tokens (pieces of a 37,000 byte-pair vocabulary) over a step.
paper = {"base": (100_000, 0.4, "12 hours"), "big": (300_000, 1.0, "3.5 days")}
for size, (steps, seconds, reported) in paper.items():
    print(f"paper, {size}: 8 P100 GPUs, {steps:,} steps of {seconds} s, {reported}; our estimate "
          f"{25_000 / seconds:,.0f} target tokens/s (25,000 a batch / {seconds} s; "
          "byte-pair pieces)")


def shipped_info(name: str) -> dict:
    """A shipped model's training record, info.json: in Colab it alone is downloaded, no weights."""
    path = shipped_model_dir(name) / "info.json"
    if not path.is_file():
        url = f"{BOOK_REPOSITORY}/raw/{BOOK_REPOSITORY_REF}/book/models/{name}/info.json"
        download_file(url, path, sha256=SHIPPED_MODELS[name]["info.json"])
    return json.loads(path.read_text())


for name in SHIPPED_MODELS:  # the book's shipped models: what their training records hold
    info = shipped_info(name)
    seconds = sum(row["seconds"] for row in info["history"])
    tokens = sum(row["tokens_per_s"] * row["seconds"] for row in info["history"])
    config = info["config"]
    unit = f"pieces of {config['subwords']:,}" if config.get("subwords") else "words"
    print(f"{name}: {info['hardware']}, {info['epochs']} epochs, "
          f"{info['training_seconds'] / 3600:.2f} hours, {tokens / seconds:,.0f} target tokens/s "
          f"({unit}), warm-up {config['warmup']}, factor {config['lr_factor']}")


# %% [markdown]
# Look for the scale (the rates count different tokens): by our estimate, the paper's base run went
# through tens of times more target tokens a second than any shipped model, for many times as long.
# The last columns are the shipped models' schedules ({doc}`departures`).

# %% [markdown]
# ## Adam
#
# Adam {cite}`kingma2015adam` runs with $\beta_1 = 0.9$, $\beta_2 = 0.98$ and $\epsilon = 10^{-9}$.
# It divides each parameter's update by a running root mean square of its gradient;
# $\beta_2 = 0.98$ (the usual 0.999) shortens that memory to roughly the last 50 steps, which tracks
# the fast-changing gradients of early training more closely; the paper gives no reason.
#
# ## The learning-rate schedule
#
# The rate rises linearly for the first $\text{warmup}$ steps, then decays with the inverse square
# root of the step number:
#
# $$
# \text{lrate} = d_{\text{model}}^{-0.5} \cdot
#   \min\left(\text{step}^{-0.5},\ \text{step} \cdot \text{warmup}^{-1.5}\right),
# $$
#
# with $\text{warmup} = 4000$. The two terms meet at $\text{step} = \text{warmup}$, where the rate
# peaks at $d_{\text{model}}^{-0.5} \cdot \text{warmup}^{-0.5}$; the factor
# $d_{\text{model}}^{-0.5}$ gives wider models smaller steps. The usual reason for warm-up: Adam's
# early estimates of the gradients' scale rest on a handful of steps, and full-size updates then
# can throw a Transformer into a region it does not recover from. {cite:t}`xiong2020layer` trace this
# to where the layer norms sit: the pre-norm arrangement this book trains (chapter 5) needs
# warm-up less. Chapter 19 measures it on the sort task over five seeds: without warm-up the
# paper's post-norm model ends far behind every other variant, while the pre-norm model still
# learns, if less than with warm-up.
#
# `rate` adds a `factor` that scales the whole curve, as the classic implementation did; PyTorch's
# `LambdaLR` calls it with the number of steps taken so far.

# %% tags=["export"]
def rate(step: int, model_size: int, factor: float, warmup: int) -> float:
    """Learning rate at `step`: linear warmup, then decay as step^-0.5 (paper, eq. 3)."""
    check_schedule(step, model_size, warmup)  # one-line errors for bad settings (appendix)
    step = max(step, 1)  # LambdaLR starts at step 0, where step^-0.5 would divide by zero
    return factor * model_size**-0.5 * min(step**-0.5, step * warmup**-1.5)


# %% [markdown]
# Three settings over the first 20,000 steps: the paper's, a longer warm-up and a narrower model.
# Look for the doubled warm-up lowering the peak by $\sqrt 2$ and moving it later, the two curves
# coinciding once both decay, and the halved $d_{\text{model}}$ raising the whole curve by
# $\sqrt 2$.

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
# `LambdaLR` multiplies the optimizer's learning rate by what the function returns, so Adam gets a
# rate of 1 and `rate` supplies the whole value; `scheduler.step()` follows every
# `optimizer.step()`. A tiny model stands in for the Transformer.
#
# ```{note}
# Step 0 counts as step 1, as in the classic version: `LambdaLR` calls the function with 0 when it
# is created, where $0^{-0.5}$ has no value. So the first two updates share a rate.
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
