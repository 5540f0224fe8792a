"""Chapter 22's multi-process paths under torchrun, on this CPU: gloo, 127.0.0.1, one thread.

Two torchrun agents (--nnodes 2, c10d rendezvous) stand for two machines, each with its own
checkpoint folder. Every launch has a timeout, so that a hang fails the test instead of
blocking the suite.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from tiny_training import DIST_CONFIG, synthetic_sentence_pairs

from the_annotated_transformer import free_port, load_checkpoint, train_worker

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "dist_worker.py"
TIMEOUT_S = 240  # one launch: seconds of training, the rest is starting Python and torch
PAIRS = {"train": synthetic_sentence_pairs(320, 0), "val": synthetic_sentence_pairs(40, 1)}


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _finish(procs: list[subprocess.Popen]) -> list[tuple[int, str]]:
    """Each launch's exit status and output; a launch still running at the timeout fails."""
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=TIMEOUT_S)
            results.append((proc.returncode, out))
    except subprocess.TimeoutExpired:
        for proc in procs:
            proc.kill()
        outputs = [proc.communicate()[0] for proc in procs]
        pytest.fail(f"torchrun hung for more than {TIMEOUT_S} s:\n" + "\n".join(outputs))
    return results


def two_nodes(folders: list[Path], epochs: int, extra: list[list[str]] | None = None,
              node_ranks: list[int] | None = None):
    """Two torchrun agents, one process each, meeting on 127.0.0.1: by c10d rendezvous, which
    gives the ranks in the order the agents arrive, or, with node_ranks, by static rendezvous,
    which makes the process of folders[i] the rank node_ranks[i]."""
    port = free_port()
    extra = extra or [[], []]
    if node_ranks is None:
        meeting = [["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}",
                    "--rdzv-id", "test"]] * 2
    else:
        meeting = [["--node-rank", str(rank), "--master-addr", "127.0.0.1",
                    "--master-port", str(port)] for rank in node_ranks]
    procs = []
    for folder, more, rendezvous in zip(folders, extra, meeting, strict=True):
        command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                   "--nproc-per-node", "1", *rendezvous, "--max-restarts", "0", str(SCRIPT),
                   str(folder), str(epochs), *more]
        procs.append(subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return _finish(procs)


def assert_same_weights(a: dict, b: dict) -> None:
    for name, tensor in a.items():
        assert torch.allclose(tensor, b[name], rtol=0, atol=1e-6), name


def assert_same_schedule(a: dict, b: dict) -> None:
    """The learning-rate schedule counted the same optimizer steps and stands at the same rate:
    two ranks step the schedule once per global batch, as one process does."""
    assert a["scheduler"]["last_epoch"] == b["scheduler"]["last_epoch"] > 0
    assert a["scheduler"]["_last_lr"] == pytest.approx(b["scheduler"]["_last_lr"], rel=1e-12)
    assert a["optimizer"]["param_groups"][0]["lr"] == b["optimizer"]["param_groups"][0]["lr"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[int, dict]:
    """One process on the same global batches: accum_iter=2 takes what two ranks take."""
    folder = tmp_path_factory.mktemp("one_process")
    config = replace(DIST_CONFIG, accum_iter=2, checkpoint_dir=str(folder))
    train_worker(0, 1, config, progress=False, threads=1, pairs=PAIRS)
    after = {2: load_checkpoint(folder / "last.pt")}
    train_worker(0, 1, replace(config, epochs=3), resume=True, progress=False, threads=1,
                 pairs=PAIRS)
    after[3] = load_checkpoint(folder / "last.pt")
    return after


def test_two_torchrun_nodes_train_like_one_process_and_resume_from_rank_0_only(
    tmp_path, reference
):
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    results = two_nodes(nodes, 2)
    assert all(code == 0 for code, _ in results), results
    # The weights are compared on all ranks after every epoch; rank 0 wrote the checkpoint.
    written = [folder for folder in nodes if (folder / "last.pt").exists()]
    assert len(written) == 1, "only rank 0 writes checkpoints"
    state = load_checkpoint(written[0] / "last.pt")
    assert state["epoch"] == 2 and len(state["rng"]) == 2
    assert state["train_state"]["accum_step"] == reference[2]["train_state"]["accum_step"]
    assert_same_schedule(state, reference[2])
    assert_same_weights(state["model"], reference[2]["model"])

    # Resume with the checkpoint on one node only (the other has an empty folder), once with
    # that node as rank 1 and once as rank 0: the ranks are fixed by static rendezvous.
    holder = nodes.index(written[0])
    empty = nodes[1 - holder]
    shutil.rmtree(empty, ignore_errors=True)
    empty.mkdir()
    holder_first = [0, 1] if holder == 0 else [1, 0]  # the rank of each node's process
    results = two_nodes(nodes, 3, extra=[["--resume"], ["--resume"]],
                        node_ranks=holder_first[::-1])
    # rank 0 has no checkpoint: both ranks stop with its error, naming its folder; none trained
    assert all(code != 0 for code, _ in results), results
    for _, out in results:
        assert f"cannot resume: the checkpoint folder {empty} holds no last.pt" in out, out
    assert load_checkpoint(written[0] / "last.pt")["epoch"] == 2
    assert list(empty.iterdir()) == []

    results = two_nodes(nodes, 3, extra=[["--resume"], ["--resume"]],
                        node_ranks=holder_first)
    # rank 0 has the checkpoint: both ranks resume its state and end like one process
    assert [code for code, _ in results] == [0, 0], results
    assert f"resumed from {written[0] / 'last.pt'} after epoch 2" in results[holder][1]
    resumed = load_checkpoint(written[0] / "last.pt")
    assert resumed["epoch"] == 3
    assert resumed["train_state"]["accum_step"] == reference[3]["train_state"]["accum_step"]
    assert_same_schedule(resumed, reference[3])
    assert_same_weights(resumed["model"], reference[3]["model"])
    assert not (empty / "last.pt").exists(), "only rank 0 writes checkpoints"


def test_a_node_with_other_data_stops_both_with_the_batch_count_error(tmp_path):
    results = two_nodes([tmp_path / "a", tmp_path / "b"], 2,
                        extra=[[], ["--n-train", "300"]])
    for code, out in results:
        assert code != 0
        assert "the ranks disagree on the number of training batches per rank" in out, out
    for folder in (tmp_path / "a", tmp_path / "b"):  # refused before anything was written
        assert not folder.exists() or not any(folder.iterdir()), sorted(folder.iterdir())


@pytest.mark.parametrize(("save_every", "resumed_at"), [
    (0, "after epoch 1\n"),  # from the checkpoint of epoch 1
    (2, "after epoch 1, 2 micro-batches into epoch 2"),  # from the one written inside epoch 2
])
def test_a_worker_killed_mid_epoch_is_restarted_by_torchrun_and_ends_like_no_kill(
    tmp_path, reference, save_every, resumed_at
):
    folder = tmp_path / "run"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", "2", "--max-restarts", "1", str(SCRIPT), str(folder), "3",
               "--kill-rank", "1", "--kill-epoch", "2", "--kill-batch", "3",
               "--save-every", str(save_every)]
    proc = subprocess.Popen(command, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    [(code, out)] = _finish([proc])
    assert code == 0, out
    assert "resumed from" in out and resumed_at in out, out  # the restart continued the run
    state = load_checkpoint(folder / "last.pt")
    assert state["epoch"] == 3
    assert state["train_state"]["accum_step"] == reference[3]["train_state"]["accum_step"]
    assert_same_schedule(state, reference[3])
    assert_same_weights(state["model"], reference[3]["model"])
