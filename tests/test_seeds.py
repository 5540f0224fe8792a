"""Findings over seeds: the sweeps in book/data, the helpers that read them, tools/seeds.py."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from the_annotated_transformer import (
    UNIVERSAL_SORT_VARIANTS,
    book_data,
    seed_summary,
    seeds_chart,
    universal_sort_run,
)

ROOT = Path(__file__).resolve().parents[1]
SWEEPS = sorted((ROOT / "book" / "data").glob("seeds_*.json"))
METRIC = {"sparse_sort": "exact", "universal_sort": "token accuracy", "model_variations": "exact",
          "norm_warmup": "loss", "checkpoint_averaging": "exact", "parse_data": "F1",
          "caption_lm": "perplexity", "copy_task": "exact", "sort_task": "exact",
          "running_average": "share"}


def summary(name: str, metric: str) -> dict[str, dict]:
    return {row["variant"]: row for row in seed_summary(book_data(name)["runs"], metric)}


def test_every_experiment_of_the_tool_has_a_stored_sweep():
    assert sorted(p.name for p in SWEEPS) == [f"seeds_{name}.json" for name in sorted(METRIC)]



def test_make_seeds_reruns_every_stored_sweep_with_its_command():
    """`make seeds` must remake what the chapters draw, with the seeds each file was made with."""
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nseeds:", 1)[1].split("\n\n", 1)[0]
    commands = [line.strip().replace("$(PY)", "python") for line in recipe.splitlines()[1:]]
    stored = [json.loads(path.read_text())["command"] for path in SWEEPS]
    assert sorted(commands) == sorted(stored)

@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_a_sweep_has_three_seeds_of_every_variant_under_two_kernel_sets(path):
    sweep = json.loads(path.read_text())
    assert sweep["command"].startswith(f"python tools/seeds.py {sweep['experiment']} --seeds")
    assert (ROOT / "book" / f"{sweep['chapter']}.ipynb").is_file()
    assert {"cpu", "own_kernels", "torch", "threads"} <= set(sweep["machine"])
    metric = METRIC[sweep["experiment"]]
    kernels = {run["kernels"] for run in sweep["runs"]}
    assert len(kernels) == 2 and sweep["machine"]["own_kernels"] in kernels
    variants = {run["variant"] for run in sweep["runs"]}
    for variant in variants:
        for kernel_set in kernels:
            seeds = [r["seed"] for r in sweep["runs"]
                     if r["variant"] == variant and r["kernels"] == kernel_set]
            assert len(seeds) == len(set(seeds)) >= 3, (variant, kernel_set, seeds)
    top = float("inf") if metric in ("loss", "perplexity") else 1.0
    assert all(0.0 <= run[metric] <= top for run in sweep["runs"])


def test_chapter_23_claims_hold_in_its_sweep():
    runs = book_data("seeds_sparse_sort.json")["runs"]
    rows = {row["variant"]: row for row in seed_summary(runs, "exact")}
    full, window = rows["full attention"], rows["window r = 1 + 1 global"]
    # the chapter says: the means are within 2 points, and neither variant wins every pair
    assert abs(full["mean"] - window["mean"]) < 0.02
    pairs = {}
    for run in runs:
        pairs.setdefault((run["seed"], run["kernels"]), {})[run["variant"]] = run["exact"]
    wins = [p["full attention"] > p["window r = 1 + 1 global"] for p in pairs.values()]
    assert 0 < sum(wins) < len(wins)
    # and every run met the bound that its nbval cell asserts for seed 0
    assert full["min"] >= 0.75 and window["min"] >= 0.75


def test_chapter_26_claims_hold_in_its_sweep():
    runs = book_data("seeds_universal_sort.json")["runs"]
    rows = summary("seeds_universal_sort.json", "token accuracy")
    assert set(rows) == set(UNIVERSAL_SORT_VARIANTS)
    # every run met the bounds that chapter 26's nbval cell asserts for seed 0
    for name in ("universal, tau = 1e-4", "universal, tau = 1e-2"):
        assert rows[name]["min"] >= 0.90, rows[name]
    assert rows["chapter 13 Transformer"]["min"] >= 0.95
    # the chapter says: the five means lie within 2 points, every range overlaps the
    # Transformer's, so no variant is better; and the one-step model is as good as any
    means = [row["mean"] for row in rows.values()]
    assert max(means) - min(means) < 0.02
    transformer = rows["chapter 13 Transformer"]
    assert all(r["min"] < transformer["max"] and transformer["min"] < r["max"]
               for r in rows.values())
    # in every run: the larger ponder weight takes fewer steps, the decoder more than the encoder
    by_run = {}
    for run in runs:
        by_run.setdefault((run["seed"], run["kernels"]), {})[run["variant"]] = run
    assert len(by_run) == 6
    for pair in by_run.values():
        small, large = pair["universal, tau = 1e-4"], pair["universal, tau = 1e-2"]
        assert large["encoder steps"] <= small["encoder steps"] < small["decoder steps"]
        assert large["decoder steps"] < small["decoder steps"]
        assert pair["universal, 4 fixed steps"]["encoder steps"] == 4.0


def test_chapter_19_claims_hold_in_its_sweeps():
    """Seven rows beat or lose to the base model in all ten (seed, kernels) pairs, four split;
    the post-norm model without warm-up is the only one that fails to learn."""
    runs = book_data("seeds_model_variations.json")["runs"]
    base = {(r["seed"], r["kernels"]): r["loss"] for r in runs if r["row"] == "base"}
    lower: dict[str, int] = {}
    for r in runs:
        if r["row"] != "base":
            lower[r["variant"]] = lower.get(r["variant"], 0) + (r["loss"] < base[r["seed"],
                                                                                 r["kernels"]])
    assert sorted(v for v, n in lower.items() if n == 10) == sorted(
        ["h=8, d_k=d_v=4", "P_drop=0", "ε_ls=0", "learned positions"])
    assert sorted(v for v, n in lower.items() if n == 0) == sorted(
        ["h=1, d_k=d_v=32", "d_model=16, d_k=d_v=4", "no positions (control)"])
    norm = summary("seeds_norm_warmup.json", "loss")
    assert norm["post-norm, no warm-up"]["min"] > max(
        row["max"] for name, row in norm.items() if name != "post-norm, no warm-up")


def test_chapter_16_claims_hold_in_its_sweep():
    """Every average beats the last checkpoint; twenty checkpoints are worse than ten."""
    runs: dict[tuple, dict[str, float]] = {}
    for run in book_data("seeds_checkpoint_averaging.json")["runs"]:
        runs.setdefault((run["seed"], run["kernels"]), {})[run["variant"]] = run["loss"]
    assert len(runs) == 10
    for loss in runs.values():
        assert all(v < loss["last checkpoint"] for k, v in loss.items() if k != "last checkpoint")
        assert loss["average of the last 20"] > loss["average of the last 10"]


def test_seed_summary_gives_mean_and_range_per_variant_in_order():
    runs = [{"variant": v, "seed": s, "kernels": "AVX2", "acc": a}
            for v, s, a in [("B", 0, 0.5), ("A", 0, 0.9), ("B", 1, 0.7), ("A", 1, 0.8)]]
    rows = seed_summary(runs, "acc")
    assert [r["variant"] for r in rows] == ["B", "A"]
    assert rows[0] == {"variant": "B", "runs": 2, "mean": pytest.approx(0.6), "min": 0.5,
                       "max": 0.7}


def test_seed_summary_and_chart_name_bad_input():
    with pytest.raises(ValueError, match="runs is empty"):
        seed_summary([], "acc")
    with pytest.raises(ValueError, match="metric 'acc' is not in every run"):
        seed_summary([{"variant": "A", "seed": 0, "kernels": "AVX2", "loss": 1.0}], "acc")
    with pytest.raises(KeyError):
        seeds_chart([{"variant": "A", "seed": 0, "acc": 1.0}], metric="acc", title="no kernels")


def test_seeds_chart_draws_every_run_and_a_mean_per_variant():
    runs = [{"variant": "A", "seed": s, "kernels": k, "acc": 0.5 + 0.1 * s}
            for s in range(3) for k in ("AVX2", "AVX512")]
    spec = seeds_chart(runs, metric="acc", title="t").to_dict()
    points, ticks = spec["layer"]
    assert len(points["data"]["values"]) == 6
    assert ticks["data"]["values"] == [{"variant": "A", "mean": pytest.approx(0.6)}]


def test_an_unknown_variant_is_named_in_one_line():
    with pytest.raises(ValueError, match="unknown variant 'universal'"):
        universal_sort_run("universal", epochs=0)


@pytest.mark.parametrize("variant, steps", [("universal, 4 fixed steps", 4),
                                            ("universal, 1 step", 1)])
def test_the_fixed_step_baselines_take_their_steps_at_every_position(variant, steps):
    run = universal_sort_run(variant, epochs=1)
    assert run["encoder steps"] == run["decoder steps"] == steps
    if steps == 4:  # the halting unit is frozen at a bias that never stops a position early
        act = run["model"].encoder_act
        assert not act.halt.bias.requires_grad and act.halt.bias.item() == -30.0


def test_seeds_tool_resumes_and_makes_no_run_that_is_stored(tmp_path):
    own = torch.backends.cpu.get_cpu_capability()
    other = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, 'tools'); "
         "from nbval_portable import other_capability; print(other_capability())"],
        cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip().upper()
    runs = [{"seed": 0, "kernels": k, "variant": v, "exact": 0.9}
            for k in (own, other) for v in ("full attention", "window r = 1 + 1 global")]
    out = tmp_path / "sweep.json"
    out.write_text(json.dumps({"runs": runs}))
    done = subprocess.run([sys.executable, "tools/seeds.py", "sparse_sort", "--seeds", "0",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "0 (seed, kernels) pairs to run, 2 stored" in done.stdout


def test_seeds_tool_refuses_a_negative_seed_in_one_line():
    done = subprocess.run([sys.executable, "tools/seeds.py", "sparse_sort", "--seeds", "0", "-1"],
                          cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--seeds must be integers >= 0" in done.stderr.strip().splitlines()[-1]


def test_seeds_tool_refuses_a_folder_as_out(tmp_path):
    done = subprocess.run([sys.executable, "tools/seeds.py", "sparse_sort", "--out",
                           str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2
    assert "is a folder" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_the_chapters_chart_draws_exactly_the_runs_of_its_sweep(path):
    """The stored chart's points are the file's runs, not rows left from an older sweep. The
    chart is in the chapter the sweep names, or in the appendix that keeps the toy tasks' seed
    bookkeeping (chapters 12 and 13 link to it)."""
    import nbformat

    sweep = json.loads(path.read_text())
    pages = [sweep["chapter"], "appendix_infrastructure"]
    cells = [cell for page in pages
             for cell in nbformat.read(ROOT / "book" / f"{page}.ipynb", as_version=4).cells]
    key = ("variant", "seed", "kernels", METRIC[sweep["experiment"]])
    drawn = [
        sorted(tuple(p.get(k) for k in key) for p in spec["layer"][0]["data"]["values"])
        for cell in cells if cell.cell_type == "code" and "seeds_chart(" in cell.source
        for output in cell.outputs
        for spec in [output.get("data", {}).get("application/vnd.vegalite.v5+json")] if spec
    ]
    assert sorted(tuple(r[k] for k in key) for r in sweep["runs"]) in drawn


def test_book_data_names_a_file_that_is_neither_here_nor_downloadable(monkeypatch):
    import the_annotated_transformer as book

    monkeypatch.setattr(book, "BOOK_REPOSITORY", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(FileNotFoundError, match="no_such_sweep.json is not in this checkout"):
        book_data("no_such_sweep.json")


def test_chapter_20_claims_hold_in_its_sweep():
    curves: dict[tuple, list] = {}
    for run in book_data("seeds_parse_data.json")["runs"]:
        curves.setdefault((run["seed"], run["kernels"]), []).append(run)
    assert len(curves) >= 6
    for curve in curves.values():
        low, mid, high = sorted(curve, key=lambda run: run["sentences"])
        # the chapter says: each doubling raised dev F1, the second less than the first
        assert 0 < high["F1"] - mid["F1"] < mid["F1"] - low["F1"]
        # and more outputs were well formed with all the sentences than with a quarter
        assert high["well formed"] > low["well formed"]
        # and every run met the bound that its nbval cell asserts for seed 0 (in points)
        assert 100 * high["F1"] > 100 * low["F1"] + 10


def test_chapter_25_claims_hold_in_its_sweep():
    pairs: dict[tuple, dict] = {}
    for run in book_data("seeds_caption_lm.json")["runs"]:
        pairs.setdefault((run["seed"], run["kernels"]), {})[run["variant"]] = run["perplexity"]
    assert len(pairs) >= 6
    for pair in pairs.values():
        # the chapter says: rotary below sinusoidal, and untied below tied, in every pair
        assert pair["rotary, tied"] < pair["sinusoidal, tied"]
        assert pair["sinusoidal, untied"] < pair["sinusoidal, tied"] - 2
        # and every run met the bounds that its nbval cell asserts for seed 0
        assert all(25 < ppl < 35 for ppl in pair.values())


def test_chapter_12_bounds_hold_in_every_run_of_its_sweep():
    """Chapter 12 asserts >= 98 of 100 validation and >= 95 test copies, and first-layer heads
    that find the symbol; the stored run is one of the sweep's."""
    runs = book_data("seeds_copy_task.json")["runs"]
    assert min(r["exact"] for r in runs if r["variant"] == "best validation") >= 0.98
    tests = [r for r in runs if r["variant"] == "test"]
    assert min(r["exact"] for r in tests) >= 0.95
    assert all(r["share_max"] > 0.9 and r["share_layer1"] > 0.5 for r in tests)
    assert all(r["failed_asserts"] == [] for r in runs)
    epochs = [r["epoch"] for r in tests]
    assert max(epochs) >= 1.5 * min(epochs)  # "varied almost twofold"


def test_chapter_13_bounds_hold_and_no_length_fails_more_in_every_run():
    runs = book_data("seeds_sort_task.json")["runs"]
    assert min(r["exact"] for r in runs) >= 0.9
    tests = [r for r in runs if r["variant"] == "test"]
    assert all(r["share_max"] > 0.5 and r["failed_asserts"] == [] for r in tests)

    def mean_at(run: dict, lengths: range) -> float:
        return sum(run["by_length"][str(n)] for n in lengths) / len(lengths)

    short_worse = sum(mean_at(r, range(4, 7)) < mean_at(r, range(8, 11)) for r in tests)
    assert 0 < short_worse < len(tests)


def test_chapter_run_refuses_a_chapter_that_no_longer_seeds_as_expected(tmp_path, monkeypatch):
    """tools/seeds.py runs a chapter's own cells with another seed; if the chapter changes how it
    seeds, the sweep must stop with one line rather than rerun seed 0 five times."""
    import nbformat

    sys.path.insert(0, str(ROOT / "tools"))
    import seeds

    book = tmp_path / "book"
    book.mkdir()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    nbformat.write(nb, book / "99_none.ipynb")
    monkeypatch.setattr(seeds, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="no longer seeds its model"):
        seeds.chapter_run("99_none", 3, stop="x = 1")


def test_chapter_16_running_average_is_lower_at_every_late_checkpoint_of_every_run():
    runs = book_data("seeds_running_average.json")["runs"]
    assert all(r["share"] == 1.0 and r["min_ratio"] > 1 for r in runs)  # "in every run ... each"


@pytest.mark.parametrize("content", [b"\xff\xfe", b"", b"[1, 2]", b'{"runs": 3}'])
def test_seeds_tool_refuses_an_unreadable_stored_sweep_in_one_line(tmp_path, content):
    out = tmp_path / "sweep.json"
    out.write_bytes(content)
    done = subprocess.run([sys.executable, "tools/seeds.py", "copy_task", "--seeds", "0",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "is not a sweep this tool wrote" in done.stderr.strip().splitlines()[-1]
    assert out.read_bytes() == content  # nothing overwritten
