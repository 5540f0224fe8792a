"""tools/levers.py: the recipe's batches and step as the trainer makes them, and its bad flags."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from levers import VARIANTS, Variant, batches, padding_share, training_step

from the_annotated_transformer import PAD_ID, FastMultiHeadedAttention, training_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_first_variant_is_the_recipe_and_every_other_moves_one_lever():
    recipe = training_config("cpu_fast_dropout")
    base = VARIANTS[0]
    assert (base.subwords, base.max_tokens, base.dropout, base.compiled) == (
        recipe.subwords, recipe.max_tokens, recipe.dropout, False)
    for variant in VARIANTS[1:]:
        moved = [field for field in ("subwords", "max_tokens", "dropout", "compiled")
                 if getattr(variant, field) != getattr(base, field)]
        assert len(moved) == 1, (variant.name, moved)


def test_batches_keep_the_budget_and_padding_counts_only_pad_positions():
    same = [([5] * 6, [7] * 8) for _ in range(40)]  # one length: nothing to pad
    assert padding_share(same, 100) == 0
    mixed = [([5] * n, [7] * (n + 2)) for n in range(3, 30)]
    cut = batches(mixed, 100)
    assert sum(b.src.size(0) for b in cut) == len(mixed)
    assert all(b.src.numel() <= 100 and b.tgt.numel() <= 100 for b in cut)
    padded = sum(b.src.numel() + b.tgt.numel() for b in cut)
    real = sum(int((b.src != PAD_ID).sum() + (b.tgt != PAD_ID).sum()) for b in cut)
    assert padding_share(mixed, 100) == pytest.approx(1 - real / padded) and real < padded


def test_a_variant_step_trains_the_recipes_model_with_its_dropout_setting():
    torch.manual_seed(0)
    examples = [(torch.randint(3, 400, (n,)).tolist(), torch.randint(3, 400, (n + 1,)).tolist())
                for n in range(4, 12)]
    batch = batches(examples, 400)[0]
    for variant, differs in ((VARIANTS[0], True), (Variant("no dropout", dropout=0.0), False)):
        model, step = training_step(variant)
        assert isinstance(model.encoder.layers[0].self_attn, FastMultiHeadedAttention)
        assert model.encoder.layers[0].self_attn.dropout.p == 0  # the paper's sites only
        first, second = (model(batch.src, batch.tgt, batch.src_mask, batch.tgt_mask)
                         for _ in range(2))
        assert (not torch.equal(first, second)) == differs  # dropout draws, or is off
        before = [p.detach().clone() for p in model.parameters()]
        step(batch)
        assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True)
                   if p.requires_grad and a.dim() > 1)


def test_levers_refuses_bad_flags_in_one_line_before_measuring(tmp_path):
    for flags, message in ((["--sentences", "5"], "--sentences must be at least 100"),
                           (["--out", str(tmp_path)], "is a folder; give a file name"),
                           (["--out", "/proc/no/such/folder/levers.json"],
                            "cannot create its folder")):
        done = subprocess.run([sys.executable, "tools/levers.py", *flags], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and message in done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr and done.stdout == ""
