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


def test_averaging_the_last_two_epochs_helps_the_paper_decay_and_not_the_linear_one():
    averaged = [run for run in RUNS
                if any(row["weights"] == last_two(run) for row in run["evaluation"])]
    assert len(averaged) >= 5
    for run in averaged:
        helps = run["config"]["decay"] == "inverse_sqrt"
        for decoding in ("greedy", "beam4"):
            gain = score(run, decoding, last_two(run)) - score(run, decoding)
            assert (gain > 0) == helps, (run["name"], decoding, gain)


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
