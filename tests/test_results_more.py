"""The extra rows of chapters 16 and 18 (book/data/results_multi30k_more.json) and the test
translations chapter 18 bootstraps (book/data/test_outputs_multi30k.json): their shape, and
the claims the chapters make from them."""

import json
from dataclasses import fields
from pathlib import Path

import pytest

from the_annotated_transformer import TrainConfig, bleu, load_multi30k, training_config

ROOT = Path(__file__).resolve().parents[1]
MORE = json.loads((ROOT / "book" / "data" / "results_multi30k_more.json").read_text())
STORED = json.loads((ROOT / "book" / "data" / "test_outputs_multi30k.json").read_text())
SUBWORD = json.loads(
    (ROOT / "book" / "models" / "multi30k_cpu_subword" / "results.json").read_text())
FAST = json.loads(
    (ROOT / "book" / "models" / "multi30k_cpu_fast_dropout" / "results.json").read_text())
TEST = "test_2016_flickr"


def bleu_of(model: str, decoding: str, split: str = TEST) -> float:
    [entry] = [e for e in MORE["results"] + SUBWORD["results"] + FAST["results"]
               if (e["model"], e["decoding"], e["split"]) == (model, decoding, split)]
    return entry["bleu"]


def test_the_untied_run_is_cpu_subword_with_only_tying_changed():
    run = MORE["untied_run"]
    config = TrainConfig(**run["config"])
    preset = training_config("cpu_subword")
    changed = {field.name for field in fields(TrainConfig)
               if getattr(config, field.name) != getattr(preset, field.name)}
    assert changed == {"share_embeddings", "checkpoint_dir", "keep_epochs"}
    assert config.share_embeddings is False and config.keep_epochs == 5
    assert [row["epoch"] for row in run["history"]] == list(range(1, 13))
    assert run["training_seconds"] == pytest.approx(sum(r["seconds"] for r in run["history"]),
                                                    abs=0.1)
    assert config.checkpoint_dir in run["command"] and run["hardware"] and run["torch"]


def test_every_extra_row_is_scored_like_the_chapters_table():
    signature = SUBWORD["results"][0]["signature"]
    seen = set()
    for entry in MORE["results"]:
        assert entry["signature"] == signature
        assert entry["sentences"] == {"val": 1014, TEST: 1000}[entry["split"]]
        seen.add((entry["model"], entry["decoding"], entry["split"]))
    models = ("subwords-untied", "subwords-untied-average", "fast-last",  # chapter 18
              *(f"untied-epoch-{n}" for n in range(8, 12)),  # chapter 16
              "untied-average-11-12", "untied-average-10-12")
    assert seen == {(m, d, s) for m in models for d in ("greedy", "beam4") for s in ("val", TEST)}


def test_stored_test_translations_score_what_the_tables_say():
    references = [en for _, en in load_multi30k(TEST)]
    assert len({(e["model"], e["decoding"]) for e in STORED["results"]}) == len(STORED["results"])
    for entry in STORED["results"]:
        assert entry["split"] == TEST and len(entry["outputs"]) == len(references)
        scored = round(bleu(entry["outputs"], references)[0], 2)
        assert scored == entry["bleu"] == bleu_of(entry["model"], entry["decoding"])


@pytest.mark.parametrize("decoding", ["greedy", "beam4"])
def test_the_chapters_claims_hold_in_the_data(decoding):
    # tying: within a tenth of a point on the test set; the untied model still beats words
    assert abs(bleu_of("subwords-last", decoding) - bleu_of("subwords-untied", decoding)) < 0.1
    assert bleu_of("subwords-untied", decoding) > bleu_of("words", decoding) + 2
    # averaging: chapter 21's average beats its last epoch; the untied run's does not
    assert bleu_of("fast-dropout", decoding) > bleu_of("fast-last", decoding)
    assert bleu_of("subwords-untied-average", decoding) < bleu_of("subwords-untied", decoding)


def test_chapter_16s_claims_hold_for_the_untied_runs_epochs():
    singles = ["untied-epoch-8", "untied-epoch-9", "untied-epoch-10", "untied-epoch-11",
               "subwords-untied"]
    averages = ["untied-average-11-12", "untied-average-10-12", "subwords-untied-average"]
    for decoding in ("greedy", "beam4"):
        for split in ("val", TEST):
            single = [bleu_of(name, decoding, split) for name in singles]
            averaged = [bleu_of(name, decoding, split) for name in averages]
            assert max(averaged) - min(averaged) < max(single) - min(single)  # steadier
            if split == "val":  # on validation every average beats every single epoch
                assert min(averaged) > max(single)
            else:  # on the test set only the average of two beats them all
                assert bleu_of("untied-average-11-12", decoding, split) > max(single)
                assert min(averaged) < max(single)
