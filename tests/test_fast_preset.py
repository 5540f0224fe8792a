"""Chapter 21's cpu_fast preset: the fast path, the fused loss, half the batch, a linear decay."""

import json
from dataclasses import replace

import pytest
import torch
from tiny_training import synthetic_sentence_pairs

from the_annotated_transformer import (
    KERNEL_CAPS,
    PAD_ID,
    VECTOR_FLAGS,
    FastMultiHeadedAttention,
    FusedLabelSmoothing,
    LabelSmoothing,
    MultiHeadedAttention,
    TrainConfig,
    export_for_shipping,
    linear_rate,
    load_checkpoint,
    load_trained_model,
    make_model,
    paper_dropout_only,
    rate,
    train_worker,
    training_config,
    use_fast_path,
)

PAIRS = {"train": synthetic_sentence_pairs(240, 0), "val": synthetic_sentence_pairs(40, 1)}
TINY = TrainConfig(
    N=1, d_model=32, d_ff=64, h=4, dropout=0.1, max_tokens=300, epochs=3, warmup=5,
    subwords=320, share_embeddings=True, bleu_every=0, fast=True, decay="linear",
)
RUN = {"progress": False, "threads": 1, "pairs": PAIRS}


def test_cpu_fast_is_cpu_subword_on_the_fast_path_without_dropout_at_half_the_batch():
    subword, fast = training_config("cpu_subword"), training_config("cpu_fast")
    assert (fast.fast, fast.dropout, fast.epochs, fast.decay) == (True, 0.0, 6, "inverse_sqrt")
    # half the tokens per step and twice the warm-up steps: the same warm-up share of the data
    assert (fast.max_tokens * 2, fast.warmup) == (subword.max_tokens, subword.warmup * 2)
    assert replace(fast, fast=False, dropout=0.1, epochs=12, max_tokens=1500, warmup=1000,
                   checkpoint_dir=subword.checkpoint_dir) == subword
    for step in (1, 700, 2000, 5000):  # the square-root rule at the same point of the data
        small = rate(2 * step, fast.d_model, fast.lr_factor, fast.warmup)
        big = rate(step, subword.d_model, subword.lr_factor, subword.warmup)
        assert small == pytest.approx(big / 2**0.5, rel=1e-12)
    with pytest.raises(ValueError, match="decay must be 'inverse_sqrt' or 'linear', got 'cos'"):
        TrainConfig(decay="cos")


def test_linear_rate_warms_up_like_rate_then_falls_in_a_straight_line_to_zero():
    warmup, total = 30, 130
    rates = [linear_rate(s, 256, 0.5, warmup, total) for s in range(total + 5)]
    assert rates[:warmup + 1] == [rate(s, 256, 0.5, warmup) for s in range(warmup + 1)]
    assert max(rates) == rates[warmup] == rate(warmup, 256, 0.5, warmup)
    steps = [b - a for a, b in zip(rates[warmup:total], rates[warmup + 1:total + 1], strict=True)]
    assert all(d == pytest.approx(-rates[warmup] / (total - warmup)) for d in steps)
    assert rates[total:] == [0.0] * 5


def test_fused_label_smoothing_gives_label_smoothings_loss_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(12, 50, requires_grad=True)
    target = torch.randint(0, 50, (12,))
    target[[2, 7]] = PAD_ID  # padding rows count for nothing
    grads = []
    for loss in (LabelSmoothing, FusedLabelSmoothing):
        logits.grad = None
        value = loss(50, PAD_ID, smoothing=0.1)(logits.log_softmax(-1), target)
        value.backward()
        grads.append((value.detach(), logits.grad.clone()))
    (a, grad_a), (b, grad_b) = grads
    assert b == pytest.approx(float(a), rel=1e-5)
    assert torch.allclose(grad_a, grad_b, atol=1e-6)


class Interrupted(Exception):
    """Stands for a process lost in the middle of the run."""


def test_a_fast_run_trains_resumes_exactly_and_ships(tmp_path, monkeypatch):
    import the_annotated_transformer as tat

    whole = replace(TINY, checkpoint_dir=str(tmp_path / "whole"))
    parts = replace(TINY, checkpoint_dir=str(tmp_path / "parts"))
    for name in KERNEL_CAPS:  # as on a machine capped like chapter 21's AVX2 runs, in part
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    history = train_worker(0, 1, whole, **RUN)
    assert history[-1]["val_loss"] < history[0]["val_loss"]  # it learns
    state = load_checkpoint(tmp_path / "whole" / "last.pt")
    assert state["scheduler"]["_last_lr"] == [0.0]  # the linear decay ended at the last step
    epoch_core, calls = tat.train_epoch, []

    def dies_in_epoch_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Interrupted  # after epoch 2's checkpoint, as if the machine went away
        return epoch_core(*args, **kwargs)

    monkeypatch.setattr(tat, "train_epoch", dies_in_epoch_3)
    with pytest.raises(Interrupted):
        train_worker(0, 1, parts, **RUN)
    monkeypatch.setattr(tat, "train_epoch", epoch_core)
    assert load_checkpoint(tmp_path / "parts" / "last.pt")["epoch"] == 2
    train_worker(0, 1, parts, resume=True, **RUN)
    b = load_checkpoint(tmp_path / "parts" / "last.pt")
    assert b["train_state"] == state["train_state"]
    for name, tensor in state["model"].items():
        assert torch.allclose(tensor, b["model"][name], rtol=0, atol=1e-6), name
    with pytest.raises(ValueError, match="a linear decay ends at the run's last step"):
        train_worker(0, 1, replace(parts, epochs=5), resume=True, **RUN)

    export_for_shipping(tmp_path / "whole" / "last.pt", tmp_path / "ship")
    model, _, _, config = load_trained_model(tmp_path / "ship")
    assert config.fast and config.decay == "linear"
    cpu = json.loads((tmp_path / "ship" / "info.json").read_text())["cpu"]
    assert cpu == state["cpu"] and cpu["caps"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert cpu["torch_kernels"] == torch.backends.cpu.get_cpu_capability()
    assert set(cpu["vector_flags"]) <= set(VECTOR_FLAGS) and cpu["threads"] == 1
    assert any(type(m) is MultiHeadedAttention for m in model.modules())  # loads readable
    assert not any(isinstance(m, FastMultiHeadedAttention) for m in model.modules())


@pytest.mark.parametrize("native", [False, True])
def test_cpu_bf16_trains_in_bfloat16_only_where_the_cpu_computes_it(
        tmp_path, monkeypatch, capsys, native):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: native)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    config = replace(TINY, epochs=1, cpu_bf16=True, checkpoint_dir=str(tmp_path / "run"))
    train_worker(0, 1, config, **RUN)
    history = load_checkpoint(tmp_path / "run" / "last.pt")["history"]
    assert ("autocast" in history[-1]) == native
    assert history[-1].get("autocast", "bfloat16") == "bfloat16"
    said = capsys.readouterr().err
    assert ("this CPU has no bfloat16 instructions" in said) != native


def test_paper_dropout_keeps_dropout_on_sublayer_outputs_and_embeddings_only():
    def dropout_by_owner(model: torch.nn.Module) -> dict[str, set[float]]:
        owners = {}
        for module in model.modules():
            for child in module.children():
                if isinstance(child, torch.nn.Dropout):
                    owners.setdefault(type(module).__name__, set()).add(child.p)
        return owners

    def model() -> torch.nn.Module:
        return make_model(50, 50, N=2, d_model=32, d_ff=64, h=4, dropout=0.1)

    assert set().union(*dropout_by_owner(model()).values()) == {0.1}
    assert paper_dropout_only(model(), enabled=False).state_dict().keys() == (
        model().state_dict().keys())
    assert dropout_by_owner(paper_dropout_only(model(), enabled=False)) == dropout_by_owner(model())
    owners = dropout_by_owner(use_fast_path(paper_dropout_only(model())))
    assert owners == {"SublayerConnection": {0.1}, "PositionalEncoding": {0.1},
                      "FastMultiHeadedAttention": {0.0}, "PositionwiseFeedForward": {0.0}}
    attention = use_fast_path(paper_dropout_only(model())).encoder.layers[0].self_attn.train()
    x = torch.randn(3, 7, 32)
    assert torch.equal(attention(x, x, x), attention(x, x, x))  # nothing dropped in training


def test_cpu_fast_dropout_is_cpu_fast_with_the_papers_dropout_for_eleven_epochs():
    fast, half_hour = training_config("cpu_fast"), training_config("cpu_fast_dropout")
    assert replace(fast, dropout=0.1, paper_dropout=True, epochs=11, keep_epochs=2,
                   checkpoint_dir=half_hour.checkpoint_dir) == half_hour


def test_a_paper_dropout_run_resumes_exactly_and_ships_its_last_two_epochs_averaged(
        tmp_path, monkeypatch):
    import the_annotated_transformer as tat
    from annotated_transformer_cli.average import write_average

    config = replace(TINY, decay="inverse_sqrt", paper_dropout=True, keep_epochs=2)
    whole = replace(config, checkpoint_dir=str(tmp_path / "whole"))
    history = train_worker(0, 1, whole, **RUN)
    assert history[-1]["val_loss"] < history[0]["val_loss"]  # it learns
    epoch_core, calls = tat.train_epoch, []

    def dies_in_epoch_3(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise Interrupted
        return epoch_core(*args, **kwargs)

    monkeypatch.setattr(tat, "train_epoch", dies_in_epoch_3)
    parts = replace(config, checkpoint_dir=str(tmp_path / "parts"))
    with pytest.raises(Interrupted):
        train_worker(0, 1, parts, **RUN)
    monkeypatch.undo()
    train_worker(0, 1, parts, resume=True, **RUN)
    a, b = (load_checkpoint(tmp_path / run / "last.pt")["model"] for run in ("whole", "parts"))
    for name, tensor in a.items():
        assert torch.allclose(tensor, b[name], rtol=0, atol=1e-6), name
    kept = sorted(p.name for p in (tmp_path / "whole").glob("epoch_*.pt"))
    assert kept == ["epoch_002.pt", "epoch_003.pt"]  # the last two, to average
    write_average([tmp_path / "whole" / name for name in kept], tmp_path / "whole" / "avg.pt")
    export_for_shipping(tmp_path / "whole" / "avg.pt", tmp_path / "ship",
                        run=tmp_path / "whole" / "last.pt")
    model, _, _, shipped = load_trained_model(tmp_path / "ship")
    assert shipped.paper_dropout and not model.training
