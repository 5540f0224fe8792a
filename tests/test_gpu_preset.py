"""The `gpu` preset is sound for a short run (its rate ends at zero, its global batch, warm-up and
peak are the same on any number of devices, one micro-batch a step on one GPU), and `base` at
the paper's batch peaks at the paper's rate; the CPU presets are as they were."""

import math

import pytest

from the_annotated_transformer import (
    config_for_devices,
    linear_rate,
    multi30k_loader,
    rate,
    schedule_steps,
    training_config,
)

PAPER_PEAK = 512**-0.5 * 4000**-0.5  # lrate at step 4000: d_model^-0.5 * warmup^-0.5



def plan_on(examples, config, devices: int) -> tuple:
    """config as `devices` devices train it, and its schedule on these examples."""
    config = config_for_devices(config, devices)
    loader = multi30k_loader(examples, max_tokens=config.max_tokens, shuffle=True,
                             num_replicas=devices, rank=0)
    return config, schedule_steps(config, batches_per_epoch=len(loader), world_size=devices)


def schedule(config, plan) -> list[float]:
    """The rate of every update of the run, as build_training's LambdaLR gives them."""
    warmup, total = plan["warmup"], plan["total_steps"]
    if config.decay == "linear":
        return [linear_rate(s, config.d_model, config.lr_factor, warmup, total)
                for s in range(total)]
    return [rate(s, config.d_model, config.lr_factor, warmup) for s in range(total)]


def test_the_gpu_preset_decays_in_a_straight_line_to_a_low_rate_by_its_last_update(
    subword_lengths_of_multi30k
):
    config, plan = plan_on(subword_lengths_of_multi30k, training_config("gpu"), 1)
    assert config.decay == "linear"
    rates = schedule(config, plan)
    peak = max(rates)
    assert rates.index(peak) == plan["warmup"] and peak == pytest.approx(2.21e-3, rel=0.01)
    assert rates[-1] < 0.01 * peak  # the last update, at under 1% of the peak
    assert linear_rate(plan["total_steps"], config.d_model, config.lr_factor, plan["warmup"],
                       plan["total_steps"]) == 0.0
    # half-way down the decay, half the peak: a straight line
    middle = (plan["warmup"] + plan["total_steps"]) // 2
    assert rates[middle] == pytest.approx(peak / 2, rel=0.01)
    assert 4 * plan["warmup"] <= plan["total_steps"]  # most of the run decays


def test_the_gpu_preset_takes_its_whole_step_as_one_micro_batch_on_one_gpu(
        subword_lengths_of_multi30k):
    preset = training_config("gpu")
    config, plan = plan_on(subword_lengths_of_multi30k, preset, 1)
    assert config.accum_iter == 1 and config.max_tokens == preset.batch_tokens == 32768
    assert plan["micro_batches_per_step"] == 1 and plan["warmup"] == preset.warmup
    # about the paper's batch of ~25,000 target tokens a step on Multi30k
    target = sum(len(tgt) for _, tgt in subword_lengths_of_multi30k) / plan["steps_per_epoch"]
    assert 22_000 < target < 27_000
    # the run's length: about a thousand updates
    assert 900 <= plan["total_steps"] <= 1100


@pytest.mark.parametrize("devices", range(1, 9))
def test_the_gpu_preset_keeps_its_global_batch_warm_up_and_peak_on_any_device_count(
    subword_lengths_of_multi30k, devices
):
    preset = training_config("gpu")
    one, one_plan = plan_on(subword_lengths_of_multi30k, preset, 1)
    config, plan = plan_on(subword_lengths_of_multi30k, preset, devices)
    tokens = devices * config.accum_iter * config.max_tokens
    assert preset.batch_tokens - devices < tokens <= preset.batch_tokens  # to within a token each
    assert config.max_tokens <= preset.max_tokens  # never more than a device may hold
    assert plan["warmup"] == one_plan["warmup"]
    assert max(schedule(config, plan)) == pytest.approx(max(schedule(one, one_plan)), rel=1e-3)
    # smaller micro-batches pad less: at most one step an epoch fewer
    assert 0 <= one_plan["steps_per_epoch"] - plan["steps_per_epoch"] <= 1


def test_config_for_devices_shares_the_batch_only_where_accumulation_would_overshoot():
    gpu = training_config("gpu")
    assert [config_for_devices(gpu, n).max_tokens for n in (1, 2, 3, 8)] == [
        32768, 16384, 10922, 4096]
    assert [config_for_devices(gpu, n).warmup for n in (1, 2, 3, 8)] == [200, 400, 600, 1600]
    assert {config_for_devices(gpu, n).accum_iter for n in range(1, 9)} == {1}
    for devices in (1, 3, 7):  # applied again (a resumed run), it changes nothing
        resolved = config_for_devices(gpu, devices)
        assert config_for_devices(resolved, devices) == resolved
    # a batch that accumulation undershoots keeps its budget: base at the paper's batch
    paper = training_config("base", batch_tokens=25000)
    assert config_for_devices(paper, 1).max_tokens == 4096
    assert config_for_devices(paper, 1).accum_iter == 6
    assert config_for_devices(paper, 8).max_tokens == 3125  # 8 x 3,125 = 25,000
    # a batch too small for the devices: one line
    with pytest.raises(ValueError) as err:
        config_for_devices(gpu, 512)
    assert str(err.value) == ("batch_tokens=32768 on 512 devices leaves 64 tokens per device, "
                              "fewer than max_len=72: use fewer devices")


@pytest.mark.parametrize("devices", [1, 2, 8])
def test_base_at_the_papers_batch_peaks_at_the_papers_rate(lengths_of_multi30k, devices):
    preset = training_config("base", batch_tokens=25000)
    config, plan = plan_on(lengths_of_multi30k, preset, devices)
    tokens = devices * config.accum_iter * config.max_tokens
    peak = rate(plan["warmup"], config.d_model, config.lr_factor, plan["warmup"])
    # the paper's rate at 25,000 tokens, moved by the square-root rule to the step's tokens
    assert peak == pytest.approx(PAPER_PEAK * math.sqrt(tokens / 25000), rel=0.005)
    assert peak == pytest.approx(PAPER_PEAK, rel=0.02)
    # without the scaled factor it would peak about 2.4 times higher on one GPU
    unscaled = rate(plan["warmup"], config.d_model, 0.5, plan["warmup"])
    assert unscaled / peak == pytest.approx(math.sqrt(25000 / 4096), rel=0.02)


def test_base_keeps_its_rate_without_a_batch_and_a_given_lr_factor_wins():
    assert training_config("base").lr_factor == 0.5  # 6.99e-4 at step 1000: the paper's peak
    assert rate(1000, 512, 0.5, 1000) == pytest.approx(PAPER_PEAK)
    assert training_config("base", batch_tokens=4096) == training_config("base", batch_tokens=4096,
                                                                          lr_factor=0.5)
    assert training_config("base", batch_tokens=25000, lr_factor=0.3).lr_factor == 0.3
    assert training_config("base", batch_tokens=25000).lr_factor == pytest.approx(
        0.5 * math.sqrt(4096 / 25000))
    # other presets keep their factor with a batch: the square-root rule of chapter 22
    assert training_config("cpu_fast_dropout", batch_tokens=25000).lr_factor == 0.5


@pytest.mark.parametrize("name, fields", [
    ("cpu", dict(max_tokens=1500, warmup=1000, epochs=12, lr_factor=0.5, decay="inverse_sqrt",
                 batch_tokens=0, accum_iter=1)),
    ("cpu_fast", dict(max_tokens=750, warmup=2000, epochs=6, lr_factor=0.5, batch_tokens=0)),
    ("cpu_fast_dropout", dict(max_tokens=750, warmup=2000, epochs=11, keep_epochs=2,
                              lr_factor=0.5, decay="inverse_sqrt", batch_tokens=0)),
    ("cpu_avx2", dict(max_tokens=750, warmup=1000, epochs=7, keep_epochs=0, lr_factor=0.5,
                      decay="linear", subwords=4000, batch_tokens=0)),
    ("base", dict(max_tokens=4096, warmup=1000, epochs=30, lr_factor=0.5,
                  decay="inverse_sqrt", batch_tokens=0)),
])
def test_the_cpu_presets_and_base_are_as_they_were_on_one_device(name, fields):
    config = training_config(name)
    assert {key: getattr(config, key) for key in fields} == fields
    assert config_for_devices(config, 1) == config


def test_the_train_script_gives_base_the_papers_peak_at_the_papers_batch():
    """annotated-transformer train builds its configuration through training_config and
    config_for_devices, so --batch-tokens 25000 gets the scaled factor (prepared, not trained)."""
    from annotated_transformer_cli import train

    args = train.parse_args(["--config", "base", "--batch-tokens", "25000"])
    config = train.prepare(args, 1)[0]
    assert config.lr_factor == pytest.approx(0.5 * math.sqrt(4096 / 25000))
    assert config.accum_iter == 6 and config.max_tokens == 4096


def test_the_gpu_run_records_the_peak_and_the_last_updates_rate():
    import gpu_run  # tools/gpu_run.py

    plan = {"warmup": 200, "total_steps": 1020}
    rates = gpu_run.schedule_rates(training_config("gpu"), plan)
    assert rates["peak_rate"] == pytest.approx(0.5 * 256**-0.5 * 200**-0.5)
    assert rates["last_rate"] == pytest.approx(rates["peak_rate"] / 820)  # one step before zero
    paper_decay = gpu_run.schedule_rates(training_config("cpu_fast_dropout"), plan)
    assert paper_decay["last_rate"] == pytest.approx(rate(1019, 256, 0.5, 200))
