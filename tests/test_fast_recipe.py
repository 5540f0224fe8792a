"""book/data/fast_recipe.json, the half-hour runs chapter 21 draws: its shape, and its claims."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from record_run import run_entry  # tests/conftest.py puts tools/ on the path

from the_annotated_transformer import TrainConfig, training_config

ROOT = Path(__file__).resolve().parents[1]
RUNS = json.loads((ROOT / "book" / "data" / "fast_recipe.json").read_text())["runs"]
SUBWORD = ROOT / "book" / "models" / "multi30k_cpu_subword"


def score(run: dict, decoding: str, weights: str = "last epoch") -> float:
    return next(row["bleu"] for row in run["evaluation"]
                if row["decoding"] == decoding and row["weights"] == weights)


def preset_runs() -> list[dict]:
    """The runs that are cpu_fast itself, whatever their seed and folder."""
    return [run for run in RUNS if TrainConfig(**run["config"]) == training_config(
        "cpu_fast", seed=run["config"]["seed"], keep_epochs=run["config"]["keep_epochs"],
        checkpoint_dir=run["config"]["checkpoint_dir"])]


@pytest.mark.parametrize("run", RUNS, ids=lambda run: run["name"])
def test_each_run_records_its_command_machine_history_and_validation_scores(run):
    config = TrainConfig(**run["config"])  # a configuration this code can rebuild
    assert config.checkpoint_dir in run["command"]  # the command is the one that made it
    assert run["hardware"] and run["torch"] and run["training_seconds"] > 0
    assert [row["epoch"] for row in run["history"]] == list(range(1, config.epochs + 1))
    assert all(row["val_bleu"] > 0 for row in run["history"])
    assert {"greedy", "beam4"} <= {row["decoding"] for row in run["evaluation"]}
    for row in run["evaluation"]:  # chosen on validation: no test score is recorded
        assert row["split"] == "val" and row["sentences"] == 1014
        assert row["signature"].startswith("nrefs:1|")
    assert len({run["name"] for run in RUNS}) == len(RUNS)


def test_the_preset_ran_from_three_seeds_each_above_cpu_subword_after_six_epochs():
    seeds = sorted(run["config"]["seed"] for run in preset_runs())
    assert len(seeds) >= 3 and len(set(seeds)) == len(seeds), seeds
    info = json.loads((SUBWORD / "info.json").read_text())
    sixth = info["history"][5]["val_bleu"]
    scored = json.loads((SUBWORD / "results.json").read_text())["results"]
    best = next(row["bleu"] for row in scored if row["model"] == "subwords-last"
                and row["decoding"] == "beam4" and row["split"] == "val")
    for run in preset_runs():  # chapter 21: above cpu_subword's sixth epoch, below its end
        assert sixth < run["history"][5]["val_bleu"]
        assert score(run, "beam4", last_two(run)) < best


def last_two(run: dict) -> str:
    """The weights label of the average of the run's last two epochs."""
    epochs = run["config"]["epochs"]
    return f"average of epochs {epochs - 1} and {epochs}"


def test_averaging_the_last_two_epochs_helps_the_paper_decay_and_barely_moves_the_linear():
    averaged = [run for run in RUNS
                if any(row["weights"] == last_two(run) for row in run["evaluation"])]
    assert len(averaged) >= 5 and {run["config"]["decay"] for run in averaged} == {
        "inverse_sqrt", "linear"}
    for run in averaged:
        for decoding in ("greedy", "beam4"):
            gain = score(run, decoding, last_two(run)) - score(run, decoding)
            if run["config"]["decay"] == "inverse_sqrt":
                assert gain > 0, (run["name"], decoding, gain)
            else:  # the linear decay's last steps are already small
                assert abs(gain) < 0.5, (run["name"], decoding, gain)


def test_record_run_keeps_validation_rows_and_names_a_model_it_cannot_find():
    checkpoint = {"config": {"seed": 2}, "hardware": "cpu", "elapsed_s": 1800.04,
                  "history": [{"epoch": 1, "val_bleu": 6.001234567, "lr": 1e-3}]}
    results = [{"model": "S2", "decoding": "greedy", "split": split, "bleu": bleu,
                "signature": "nrefs:1|x", "sentences": 1014, "seconds": 40.0}
               for split, bleu in (("val", 37.1), ("test_2016_flickr", 38.0))]
    entry = run_entry("seed 2", "cpu_fast with seed=2", "python ...", checkpoint, results,
                      {"S2": "last epoch"})
    assert entry["training_seconds"] == 1800.0
    assert entry["history"] == [{"epoch": 1, "val_bleu": 6.0012}]
    assert entry["evaluation"] == [{"decoding": "greedy", "split": "val", "bleu": 37.1,
                                    "signature": "nrefs:1|x", "sentences": 1014,
                                    "weights": "last epoch"}]
    with pytest.raises(ValueError, match=r"no results for model\(s\) avg in the results file"):
        run_entry("seed 2", "", "", checkpoint, results, {"S2": "last", "avg": "average"})


def test_record_run_refuses_unreadable_input_in_one_line_and_leaves_the_recipe_alone(tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text('{"runs": []}\n')
    (tmp_path / "results.json").write_bytes(b"\xff\xfe not json")
    (tmp_path / "last.pt").write_bytes(b"\x80\x02 not a checkpoint")
    done = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "record_run.py"), "--name", "x", "--changes", "y",
         "--command", "z", "--checkpoint", str(tmp_path / "last.pt"),
         "--results", str(tmp_path / "results.json"), "--weights", "S2=last epoch",
         "--recipe", str(recipe)],
        capture_output=True, text=True, check=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("record_run.py: error: ") and done.stderr.count("\n") == 1
    assert recipe.read_text() == '{"runs": []}\n'


AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def avx2_runs() -> list[dict]:
    """The runs that are cpu_avx2 itself, whatever their seed, folder and kept epochs."""
    return [run for run in RUNS if TrainConfig(**run["config"]) == training_config(
        "cpu_avx2", seed=run["config"]["seed"], keep_epochs=run["config"]["keep_epochs"],
        checkpoint_dir=run["config"]["checkpoint_dir"])]


def test_the_avx2_preset_ran_three_seeds_inside_half_an_hour_on_a_cpu_capped_to_avx2():
    runs = avx2_runs()
    assert sorted(run["config"]["seed"] for run in runs) == [0, 1, 2]
    for run in runs:
        assert run["training_seconds"] <= 30 * 60
        assert run["training_seconds"] == pytest.approx(
            sum(row["seconds"] for row in run["history"]), abs=0.5)
        cpu = run["cpu"]  # an AVX-512 CPU with every kernel library capped to AVX2
        assert cpu["caps"] == AVX2_CAPS and cpu["torch_kernels"] == "AVX2"
        assert "avx512f" in cpu["vector_flags"] and cpu["cores"] == cpu["threads"] == 2
        # the preset keeps the last epoch (keep_epochs=0): at least the last two averaged
        assert score(run, "beam4") >= score(run, "beam4", last_two(run))


def test_the_avx2_presets_test_scores_are_its_chosen_weights_and_stay_below_the_xeons():
    """Chapter 21's claims: above cpu_fast, below cpu_fast_dropout on validation and test."""
    scores = json.loads((ROOT / "book" / "data" / "cpu_avx2_scores.json").read_text())["results"]
    dropout = [run for run in RUNS if TrainConfig(**run["config"]) == training_config(
        "cpu_fast_dropout", seed=run["config"]["seed"],
        checkpoint_dir=run["config"]["checkpoint_dir"])]
    shipped = json.loads((ROOT / "book" / "models" / "multi30k_cpu_fast_dropout" / "results.json"
                          ).read_text())["results"]
    shipped_beam = {row["split"]: row["bleu"] for row in shipped if row["decoding"] == "beam4"}
    assert dropout and set(shipped_beam) == {"val", "test_2016_flickr"}  # seeds 1 and 0
    for run in avx2_runs():
        mine = [row for row in scores if row["model"] == f"seed {run['config']['seed']}"]
        assert {(row["decoding"], row["split"]) for row in mine} == {
            (d, s) for d in ("greedy", "beam4") for s in ("val", "test_2016_flickr")}
        for row in mine:  # the last epoch of this run, scored as it was chosen on validation
            assert row["path"] == f"{run['config']['checkpoint_dir']}/last.pt"
            if row["split"] == "val":
                assert row["bleu"] == score(run, row["decoding"])
        assert all(score(run, "beam4") > score(fast, "beam4", weights)
                   for fast in preset_runs() for weights in ("last epoch", last_two(fast)))
        assert all(score(run, "beam4") < score(other, "beam4", last_two(other))
                   for other in dropout) and score(run, "beam4") < shipped_beam["val"]
        assert next(row["bleu"] for row in mine if row["decoding"] == "beam4"
                    and row["split"] == "test_2016_flickr") < shipped_beam["test_2016_flickr"]
