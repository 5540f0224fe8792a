"""The peer comparison's data: tools/peer/collect.py gathers a pair of runs, refuses pairs
scored or run unlike each other, and the stored pair in book/data is one such pair."""

import importlib.util
import json
from pathlib import Path

import pytest

import the_annotated_transformer as tat

ROOT = Path(__file__).resolve().parents[1]
SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0"
HARDWARE = "1 CPU process(es) x 2 thread(s), Some CPU, 2 cores"


def load_collect():
    """tools/peer/collect.py, a maintainer's script, as a module."""
    path = ROOT / "tools" / "peer" / "collect.py"
    spec = importlib.util.spec_from_file_location("peer_collect", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def entry(decoding: str, description: str, split: str, bleu: float, **extra) -> dict:
    return {"decoding": decoding, "decoding_description": description, "split": split,
            "bleu": bleu, "signature": SIGNATURE, "chrf": bleu + 20, "chrf_signature": "c",
            "sentences": 10, "mean_words": 12.0, **extra}


def book_run(folder: Path) -> Path:
    """A book run's folder as `annotated-transformer train` leaves it, and evaluate's results."""
    (folder / "model").mkdir(parents=True)
    info = {"command": "annotated-transformer train", "hardware": HARDWARE, "torch": "2.13.0",
            "training_seconds": 100.0, "epochs": 11,
            "config": {"warmup": 2000, "d_model": 256, "lr_factor": 0.5},
            "averaged_from": ["epoch_010.pt", "epoch_011.pt"],
            "history": [{"epoch": epoch, "val_bleu": 30.0 + epoch} for epoch in range(1, 12)]}
    (folder / "model" / "info.json").write_text(json.dumps(info))
    state = {"model": {}, "train_state": {"accum_step": 7590, "tokens": 4_000_000}}
    tat.save_checkpoint(state, folder / "last.pt")
    results = folder / "results.json"
    common = {"command": "annotated-transformer evaluate", "parameters": 7586624}
    results.write_text(json.dumps({"results": [
        entry("greedy", "greedy", "val", 40.0, **common),
        entry("beam4", "beam 4, alpha 0.6", "val", 41.0, **common)]}))
    return results


def peer_results(path: Path, alpha: float, *, signature: str = SIGNATURE,
                 hardware: str = HARDWARE) -> Path:
    training = {"budget_seconds": 100.0, "training_seconds": 100.2, "updates": 6000,
                "target_tokens": 2_000_000,
                "best_update": 6000, "parameters": 7578624}
    results = [entry("greedy", "greedy", "val", 38.0), entry("beam4", f"beam 4, alpha {alpha}",
                                                              "val", 39.0 + alpha)]
    for result in results:
        result["signature"] = signature
    (path.parent / "model").mkdir(exist_ok=True)
    (path.parent / "config.yaml").write_text(
        "training:\n  learning_rate_warmup: 4000\n  learning_rate: 0.0002\n"
        "  learning_rate_min: 1.0e-08\n")
    (path.parent / "model" / "validations.txt").write_text(
        "Steps: 1000\tloss: 4.42281\tacc: 0.26\tppl: 83.3\tbleu: 1.98329\tLR: 0.00005000\t*\n"
        "Steps: 6000\tloss: 1.93799\tacc: 0.61\tppl: 6.94\tbleu: 31.82070\tLR: 0.00016330\t*\n")
    path.write_text(json.dumps({"toolkit": "joeynmt 2.3.0", "command": "python peer",
                                "hardware": hardware, "torch": "2.13.0",
                                "training": training, "results": results}))
    return path


def test_collect_keeps_both_runs_and_every_decoding(tmp_path: Path) -> None:
    collect = load_collect()
    results = book_run(tmp_path / "book")
    peer = [peer_results(tmp_path / "a.json", 1.0), peer_results(tmp_path / "b.json", 0.6)]
    out = tmp_path / "peer.json"
    collect.main(["--book", str(tmp_path / "book"), str(results), "--peer", str(peer[0]),
                  "--peer", str(peer[1]), "--out", str(out)])
    book, joey = json.loads(out.read_text())["systems"]
    assert (book["updates"], book["training_seconds"], book["target_tokens"]) == (
        7590, 100.0, 4_000_000)
    assert book["weights"] == "average of epoch_010.pt and epoch_011.pt"
    assert [e["bleu"] for e in book["results"]] == [40.0, 41.0]
    assert book["warmup"] == 2000 and book["peak_lr"] == pytest.approx(0.5 / 16 / 2000**0.5)
    assert (joey["warmup"], joey["peak_lr"]) == (4000, 0.0002)
    assert book["validation"][0] == {"update": 690, "bleu": 31.0}  # 7,590 updates / 11 epochs
    assert book["validation"][-1] == {"update": 7590, "bleu": 41.0}
    assert (joey["budget_seconds"], joey["updates"], joey["target_tokens"]) == (
        100.0, 6000, 2_000_000)
    assert joey["validation"] == [{"update": 1000, "bleu": 1.98}, {"update": 6000, "bleu": 31.82}]
    # the greedy decoding is the same in both peer files and kept once; each beam alpha kept
    assert [e["decoding_description"] for e in joey["results"]] == [
        "greedy", "beam 4, alpha 1.0", "beam 4, alpha 0.6"]


@pytest.mark.parametrize("change", ["signature", "hardware"])
def test_collect_refuses_runs_made_unlike_each_other(tmp_path: Path, change: str,
                                                     capsys: pytest.CaptureFixture) -> None:
    collect = load_collect()
    results = book_run(tmp_path / "book")
    other = {change: "nrefs:1|tok:intl" if change == "signature" else "1 x 2, Another CPU"}
    peer = peer_results(tmp_path / "a.json", 1.0, **other)
    with pytest.raises(SystemExit) as stop:
        collect.main(["--book", str(tmp_path / "book"), str(results), "--peer", str(peer),
                      "--out", str(tmp_path / "peer.json")])
    message = capsys.readouterr().err
    assert stop.value.code == 2 and "collect.py: error:" in message and other[change] in message
    assert not (tmp_path / "peer.json").exists()


def test_stored_pair_had_the_same_seconds_machine_and_metric() -> None:
    """Chapter 18's pair: JoeyNMT's budget is the book run's training time, on one machine."""
    book, joey = tat.book_data("peer_multi30k.json")["systems"]
    assert joey["budget_seconds"] == book["training_seconds"]
    assert abs(joey["training_seconds"] - joey["budget_seconds"]) < 60  # stops within a batch
    assert book["hardware"] == joey["hardware"] and "2 thread(s)" in book["hardware"]
    signatures = {e["signature"] for system in (book, joey) for e in system["results"]}
    assert signatures == {SIGNATURE}
    for system in (book, joey):
        cells = {(e["decoding"], e["split"]) for e in system["results"]}
        assert cells >= {(d, s) for d in ("greedy", "beam4") for s in ("val", "test_2016_flickr")}


@pytest.mark.parametrize("damage", ["missing", "bad bytes", "no field"])
def test_collect_refuses_bad_input_in_one_line(tmp_path: Path, damage: str,
                                               capsys: pytest.CaptureFixture) -> None:
    collect = load_collect()
    results = book_run(tmp_path / "book")
    peer = peer_results(tmp_path / "a.json", 1.0)
    if damage == "missing":
        peer.unlink()
    elif damage == "bad bytes":
        peer.write_bytes(b"\xff\xfe{")
    else:
        peer.write_text(json.dumps({**json.loads(peer.read_text()), "training": {}}))
    with pytest.raises(SystemExit) as stop:
        collect.main(["--book", str(tmp_path / "book"), str(results), "--peer", str(peer),
                      "--out", str(tmp_path / "peer.json")])
    message = capsys.readouterr().err
    assert stop.value.code == 2 and message.startswith("collect.py: error:")
    assert message.count("\n") == 1
    assert not (tmp_path / "peer.json").exists()
