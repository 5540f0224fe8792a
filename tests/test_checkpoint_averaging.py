"""Checkpoint averaging (chapter 16): the mean of state dicts, its checks, and the script."""

import json
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from the_annotated_transformer import (
    Vocab,
    average_checkpoints,
    load_checkpoint,
    load_trained_model,
    make_model,
    save_checkpoint,
    subsequent_mask,
    training_config,
)

ROOT = Path(__file__).resolve().parents[1]


def state(seed: int, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "weight": torch.randn(3, 4, generator=g).to(dtype),
        "bias": torch.randn(4, generator=g).to(dtype),
        "steps": torch.tensor(7),  # an integer buffer, equal in every checkpoint
    }


def test_average_of_two_state_dicts_is_the_elementwise_mean():
    a, b = state(0), state(1)
    averaged = average_checkpoints([a, b])
    assert averaged.keys() == a.keys()
    for key in ("weight", "bias"):
        torch.testing.assert_close(averaged[key], (a[key] + b[key]) / 2)
    assert torch.equal(averaged["steps"], a["steps"])


def test_average_of_many_matches_the_float64_mean():
    states = [state(seed) for seed in range(7)]
    averaged = average_checkpoints(states)
    expected = torch.stack([s["weight"].double() for s in states]).mean(dim=0).float()
    assert torch.equal(averaged["weight"], expected)


def test_averaging_one_checkpoint_file_gives_its_weights_back(tmp_path):
    path = tmp_path / "epoch_001.pt"
    save_checkpoint({"model": state(0), "epoch": 1}, path)
    averaged = average_checkpoints([path])
    for key, tensor in state(0).items():
        assert torch.equal(averaged[key], tensor) and averaged[key].dtype == tensor.dtype


def test_the_result_does_not_share_memory_with_the_inputs():
    a = state(0)
    averaged = average_checkpoints([a])
    averaged["weight"].add_(1.0)
    averaged["steps"].add_(1)
    assert torch.equal(a["weight"], state(0)["weight"]) and int(a["steps"]) == 7


def test_half_precision_in_gives_half_precision_out():
    a, b = state(0, torch.float16), state(1, torch.float16)
    averaged = average_checkpoints([a, b])
    assert averaged["weight"].dtype == torch.float16
    expected = ((a["weight"].double() + b["weight"].double()) / 2).half()
    assert torch.equal(averaged["weight"], expected)


def test_different_keys_are_refused_with_their_names():
    b = state(1)
    b["extra"] = b.pop("bias")
    with pytest.raises(ValueError, match=r"missing \['bias'\], unexpected \['extra'\]"):
        average_checkpoints([state(0), b])


def test_different_shapes_are_refused_with_the_key_and_both_shapes():
    b = state(1)
    b["weight"] = torch.zeros(4, 3)
    with pytest.raises(ValueError, match=r"'weight' is \(4, 3\).*but \(3, 4\)"):
        average_checkpoints([state(0), b])


def test_different_dtypes_are_refused():
    with pytest.raises(ValueError, match="float16.*float32"):
        average_checkpoints([state(0), state(1, torch.float16)])


def test_integer_tensors_that_differ_are_refused():
    b = state(1)
    b["steps"] = torch.tensor(8)
    with pytest.raises(ValueError, match="'steps'.*must be equal"):
        average_checkpoints([state(0), b])


def test_an_empty_list_or_a_single_path_is_refused(tmp_path):
    with pytest.raises(ValueError, match="empty"):
        average_checkpoints([])
    with pytest.raises(TypeError, match="list of paths"):
        average_checkpoints(str(tmp_path / "epoch_001.pt"))
    with pytest.raises(TypeError, match="not a tensor"):
        average_checkpoints([{"model": state(0)}])


calls = []


def record_call(*args):
    calls.append(args)
    return args


class RunsCodeWhenUnpickled:
    def __reduce__(self):
        return (record_call, ("this ran while loading",))


def test_checkpoint_files_are_read_with_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"model": state(0), "payload": RunsCodeWhenUnpickled()}, path)
    with pytest.raises(ValueError, match="cannot be read"):
        average_checkpoints([path])
    assert calls == []  # a full unpickler would have called record_call


def test_averaged_model_of_identical_checkpoints_behaves_identically():
    torch.manual_seed(0)
    model = make_model(11, 11, N=1, d_model=32, d_ff=64, h=4, dropout=0.0).eval()
    weights = model.state_dict()
    copy = make_model(11, 11, N=1, d_model=32, d_ff=64, h=4, dropout=0.0).eval()
    copy.load_state_dict(average_checkpoints([weights, weights, weights]))
    src = torch.randint(3, 11, (2, 7))  # (batch, n_src)
    tgt = torch.randint(3, 11, (2, 5))  # (batch, n_tgt)
    src_mask = torch.ones(2, 1, 7, dtype=torch.bool)
    with torch.no_grad():
        expected = model.generator(model(src, tgt, src_mask, subsequent_mask(5)))
        got = copy.generator(copy(src, tgt, src_mask, subsequent_mask(5)))
    assert torch.equal(got, expected)


def load_tool():
    from annotated_transformer_cli import average

    return average


def test_script_writes_an_average_that_load_trained_model_reads(tmp_path):
    config = training_config("cpu", N=1, d_model=16, d_ff=32, h=2)
    vocab = Vocab(["<s>", "</s>", "<blank>", "<unk>", "ein", "hund"])
    run = tmp_path / "run"
    paths = []
    for epoch in (1, 2):
        torch.manual_seed(epoch)
        model = make_model(len(vocab), len(vocab), N=1, d_model=16, d_ff=32, h=2)
        paths.append(run / f"epoch_{epoch:03d}.pt")
        save_checkpoint({"model": model.state_dict(), "config": asdict(config),
                         "epoch": epoch}, paths[-1])
    for name in ("vocab_de.json", "vocab_en.json"):
        vocab.save(run / name)
    output = tmp_path / "averaged" / "model.pt"
    load_tool().main([str(p) for p in paths] + ["--output", str(output)])
    model, vocab_src, _, loaded_config = load_trained_model(output)
    assert vocab_src == vocab and loaded_config == config
    first, second = (load_checkpoint(p)["model"] for p in paths)
    name = "generator.proj.weight"
    torch.testing.assert_close(model.state_dict()[name], (first[name] + second[name]) / 2)
    assert load_checkpoint(output)["averaged_from"] == [str(p) for p in paths]


def test_script_records_results_by_name(tmp_path):
    results = tmp_path / "averaging.json"
    tool = load_tool()
    tool.record(results, {"name": "a", "scores": 1})
    tool.record(results, {"name": "b", "scores": 2})
    tool.record(results, {"name": "a", "scores": 3})
    assert json.loads(results.read_text())["results"] == [
        {"name": "b", "scores": 2}, {"name": "a", "scores": 3}
    ]


@pytest.mark.parametrize("args", [["{missing}", "--output", "{out}"], []])
def test_average_command_refuses_in_one_line_and_writes_nothing(tmp_path, args):
    """A missing checkpoint or no checkpoint at all: one line on stderr, exit 2, no output."""
    words = [a.format(missing=tmp_path / "epoch_001.pt", out=tmp_path / "avg.pt") for a in args]
    done = subprocess.run([sys.executable, "-m", "annotated_transformer_cli", "average", *words],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("annotated-transformer average: error: ")
    assert not (tmp_path / "avg.pt").exists()
