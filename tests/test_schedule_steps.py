"""Schedules in optimizer steps: every preset leaves its warm-up on 1, 4 and 8 devices, and the
`gpu` preset keeps its global batch and warm-up on 1, 2, 4 and 8 (tests/test_gpu_preset.py
checks it on every count from 1 to 8)."""

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from annotated_transformer_cli.train import (
    accum_for_batch,  # tests/conftest.py puts tools/ on the path
)
from the_annotated_transformer import (
    config_for_devices,
    multi30k_loader,
    rate,
    schedule_steps,
    training_config,
)

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("preset, world_size, batch_tokens", [
    ("base", 1, None), ("base", 4, None), ("base", 8, None), ("base", 1, 25000),
    ("base", 4, 25000), ("base", 8, 25000), ("cpu", 1, None), ("cpu", 2, None),
    ("cpu_subword", 1, None), ("cpu", 1, 25000),
])
def test_every_preset_reaches_its_peak_learning_rate_and_decays(
    lengths_of_multi30k, preset, world_size, batch_tokens
):
    config = training_config(preset)
    if batch_tokens is not None:
        accum = accum_for_batch(batch_tokens, config.max_tokens, world_size)
        config = training_config(preset, accum_iter=accum)
    loader = multi30k_loader(lengths_of_multi30k, max_tokens=config.max_tokens, shuffle=True,
                             num_replicas=world_size, rank=0)
    plan = schedule_steps(config, batches_per_epoch=len(loader), world_size=world_size)
    assert plan["total_steps"] > 2 * plan["warmup"], plan  # peaks in the first half, then decays
    rates = [rate(s, config.d_model, config.lr_factor, plan["warmup"])
             for s in range(1, plan["total_steps"] + 1)]
    peak = max(range(len(rates)), key=rates.__getitem__) + 1
    assert peak == plan["warmup"] and rates[-1] < rates[peak - 1]


@pytest.mark.parametrize("world_size", [1, 2])
def test_the_half_hour_preset_leaves_its_warm_up_and_decays(subword_lengths_of_multi30k,
                                                            world_size):
    """cpu_fast warms up for about half its run (chapter 21), on the shipped subword lengths."""
    config = training_config("cpu_fast")
    loader = multi30k_loader(subword_lengths_of_multi30k, max_tokens=config.max_tokens,
                             shuffle=True, num_replicas=world_size, rank=0)
    plan = schedule_steps(config, batches_per_epoch=len(loader), world_size=world_size)
    assert plan["warmup"] == config.warmup // world_size
    assert plan["total_steps"] > plan["warmup"] * 1.5, plan  # a third of the run after the peak
    rates = [rate(s, config.d_model, config.lr_factor, plan["warmup"])
             for s in range(1, plan["total_steps"] + 1)]
    peak = max(range(len(rates)), key=rates.__getitem__) + 1
    assert peak == plan["warmup"] and rates[-1] < 0.8 * rates[peak - 1]


def test_more_micro_batches_per_step_walk_the_same_warm_up_in_fewer_steps():
    config = training_config("base", accum_iter=2)
    one = schedule_steps(training_config("base"), batches_per_epoch=112, world_size=1)
    eight = schedule_steps(config, batches_per_epoch=14, world_size=4)
    assert one["warmup"] == 1000 and eight["warmup"] == 125 and eight["micro_batches_per_step"] == 8
    assert eight["steps_per_epoch"] == 7 and eight["total_steps"] == 30 * 7
    # the learning rate at the same point of the data is sqrt(8) times the one-process rate
    assert rate(125, 512, 0.5, 125) == pytest.approx(math.sqrt(8) * rate(1000, 512, 0.5, 1000))


@pytest.mark.parametrize("preset, world_size", [
    ("cpu_subword", 1), ("cpu_fast", 1), ("cpu_fast_dropout", 1), ("gpu", 1), ("gpu", 8),
])
def test_every_subword_preset_passes_the_margin_after_its_warm_up(subword_lengths_of_multi30k,
                                                                  preset, world_size):
    config = config_for_devices(training_config(preset), world_size)
    loader = multi30k_loader(subword_lengths_of_multi30k, max_tokens=config.max_tokens,
                             shuffle=True, num_replicas=world_size, rank=0)
    plan = schedule_steps(config, batches_per_epoch=len(loader), world_size=world_size)
    assert 4 * plan["total_steps"] >= 5 * plan["warmup"], plan


def test_the_gpu_preset_takes_the_same_batch_and_warm_up_on_1_2_4_and_8_devices(
    subword_lengths_of_multi30k
):
    plans, batches = {}, {}
    for world_size in (1, 2, 4, 8):
        config = config_for_devices(training_config("gpu"), world_size)
        batches[world_size] = world_size * config.accum_iter * config.max_tokens
        loader = multi30k_loader(subword_lengths_of_multi30k, max_tokens=config.max_tokens,
                                 shuffle=True, num_replicas=world_size, rank=0)
        plans[world_size] = schedule_steps(config, batches_per_epoch=len(loader),
                                           world_size=world_size)
    assert set(batches.values()) == {training_config("gpu").batch_tokens}  # the global batch
    assert len({p["warmup"] for p in plans.values()}) == 1, plans
    # each device's share of the batch pads less than one micro-batch: at most a step an epoch less
    assert {plans[1]["steps_per_epoch"] - p["steps_per_epoch"] for p in plans.values()} <= {0, 1}
    assert plans[1]["total_steps"] >= 4 * plans[1]["warmup"]  # a long decay after the peak


def test_config_for_devices_derives_accumulation_from_the_global_batch():
    gpu = training_config("gpu", max_tokens=2048, batch_tokens=16384)  # 8 micro-batches a step
    assert [config_for_devices(gpu, n).accum_iter for n in (1, 2, 4, 8, 16)] == [8, 4, 2, 1, 1]
    assert config_for_devices(training_config("base", accum_iter=3), 4).accum_iter == 3
    resolved = config_for_devices(gpu, 2)
    assert config_for_devices(resolved, 2) == resolved  # resuming keeps it
    with pytest.raises(ValueError, match=r"accum_iter=4 and batch_tokens=16384 both set"):
        config_for_devices(replace(gpu, accum_iter=4), 1)
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        config_for_devices(gpu, 0)
    with pytest.raises(ValueError, match="batch_tokens must be an integer >= 0, got -1"):
        training_config("gpu", batch_tokens=-1)


def test_a_run_less_than_a_quarter_longer_than_its_warm_up_is_refused():
    config = training_config("cpu", epochs=1)  # warm-up 1000 steps
    assert schedule_steps(config, batches_per_epoch=1250, world_size=1)["total_steps"] == 1250
    with pytest.raises(ValueError, match="1249 optimizer steps .* fewer than 1.25 times its "
                                         "1000 warm-up steps"):
        schedule_steps(config, batches_per_epoch=1249, world_size=1)


def test_a_run_that_would_end_inside_its_warm_up_is_refused_in_one_line_with_the_numbers():
    config = training_config("cpu", epochs=2)
    with pytest.raises(ValueError) as err:
        schedule_steps(config, batches_per_epoch=300, world_size=1)
    message = str(err.value)
    assert "\n" not in message
    assert "600 optimizer steps (300 per epoch x 2:" in message
    assert "1000 warm-up steps" in message and "raise epochs or lower warmup" in message


@pytest.mark.parametrize("devices", [1, 2])
def test_the_train_script_refuses_a_run_inside_its_warm_up_before_training(tmp_path, devices):
    done = subprocess.run(
        [sys.executable, "-m", "annotated_transformer_cli", "train", "--config", "cpu",
         "--epochs", "1",
         "--checkpoint-dir", str(tmp_path / "run"), "--threads", "1",
         "--devices", str(devices)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 2  # a user error, like every refusal
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("annotated-transformer train: error: the run would take")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()  # nothing written, not even the vocabularies
