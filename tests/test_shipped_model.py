"""The trained Multi30k model that the book ships (book/models/multi30k_cpu)."""

import functools
import http.server
import io
import json
import shutil
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
import torch

import the_annotated_transformer as book
from the_annotated_transformer import (
    BEST_SHIPPED_MODEL,
    SHIPPED_MODELS,
    bleu,
    fetch_shipped_model,
    free_port,
    load_multi30k,
    load_tokenizers,
    load_trained_model,
    sha256_of,
    shipped_model_dir,
    training_config,
    translate,
)

ROOT = Path(__file__).resolve().parents[1]

FOLDER = shipped_model_dir()


@pytest.mark.parametrize("model", sorted(SHIPPED_MODELS))
def test_module_records_the_checksums_of_the_shipped_files(model):
    folder = shipped_model_dir(model)
    assert sorted(p.name for p in folder.iterdir()) == sorted(SHIPPED_MODELS[model])
    for name, expected in SHIPPED_MODELS[model].items():
        assert sha256_of(folder / name) == expected, (
            f"{folder / name} changed: put its new SHA-256 in SHIPPED_MODELS[{model!r}] "
            "(book/appendix_data.ipynb), or Colab readers will be refused the download"
        )


@pytest.fixture
def server(tmp_path):
    """A local web server for tmp_path/site: the repository's address, without a network."""
    site = tmp_path / "site"
    site.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *args: None
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield site, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("model", sorted(SHIPPED_MODELS))
def test_info_names_the_variant_that_the_weights_are(model):
    """A pre-norm model has a final layer norm per stack (chapter 2); post-norm has none."""
    folder = shipped_model_dir(model)
    info = json.loads((folder / "info.json").read_text())
    weights = torch.load(folder / "model.pt", weights_only=True)["model"]
    final_norm = "encoder.norm.weight" in weights and "decoder.norm.weight" in weights
    assert info["variant"] == ("pre-norm" if final_norm else "post-norm")


def test_fetch_shipped_model_downloads_every_file_and_verifies_it(server, tmp_path):
    site, url = server
    shutil.copytree(FOLDER, site / "model")
    target = fetch_shipped_model(tmp_path / "cache", base_url=f"{url}/model")
    for name in SHIPPED_MODELS["multi30k_cpu"]:
        assert (target / name).read_bytes() == (FOLDER / name).read_bytes(), name


def test_fetch_shipped_model_refuses_a_corrupted_download_and_keeps_nothing(server, tmp_path):
    site, url = server
    shutil.copytree(FOLDER, site / "model")
    (site / "model" / "vocab_en.json").write_text("{}")
    with pytest.raises(ValueError, match=r"vocab_en\.json, but its SHA-256 checksum"):
        fetch_shipped_model(tmp_path / "cache", base_url=f"{url}/model")
    assert not (tmp_path / "cache" / "vocab_en.json").exists()
    assert not list((tmp_path / "cache").glob(".*"))  # no temporary file left


def test_fetch_shipped_model_offline_names_the_file_and_what_to_do(tmp_path):
    offline = f"http://127.0.0.1:{free_port()}/model"  # nothing listens there
    with pytest.raises(FileNotFoundError, match=r"model\.pt is not in .*`make train`"):
        fetch_shipped_model(tmp_path / "cache", base_url=offline)


def test_load_trained_model_outside_a_repository_downloads_the_shipped_model(
    server, tmp_path, monkeypatch
):
    site, url = server
    ref = book.BOOK_REPOSITORY_REF  # the download comes from the book's own tag or commit
    shutil.copytree(FOLDER, site / "raw" / ref / "book" / "models" / "multi30k_cpu")
    monkeypatch.setattr(book, "repository_root", lambda: None)  # as in Colab after pip install
    monkeypatch.setattr(book, "BOOK_REPOSITORY", url)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert shipped_model_dir() == tmp_path / "home" / ".cache" / "annotated-transformer" / (
        "multi30k_cpu")
    model, vocab_src, vocab_tgt, config = load_trained_model()
    assert (shipped_model_dir() / "model.pt").read_bytes() == (FOLDER / "model.pt").read_bytes()
    assert config.d_model == 256 and len(vocab_src) > 1000 and not model.training


def test_load_trained_model_offline_without_a_copy_says_how_to_get_it_and_never_trains(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(book, "repository_root", lambda: None)
    monkeypatch.setattr(book, "BOOK_REPOSITORY", f"http://127.0.0.1:{free_port()}")  # offline
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def train_worker(*args, **kwargs):
        raise AssertionError("load_trained_model started a training run")

    monkeypatch.setattr(book, "train_worker", train_worker)
    with pytest.raises(FileNotFoundError, match=r"could not be downloaded.*train_if_missing=True"):
        load_trained_model()
    assert not (tmp_path / "home" / ".cache" / "annotated-transformer" / "multi30k_cpu" /
                "model.pt").exists()


def test_fetch_shipped_model_checks_present_files_once_per_process(tmp_path, monkeypatch):
    folder = tmp_path / "copy"
    shutil.copytree(FOLDER, folder)
    hashed = []
    monkeypatch.setattr(book, "sha256_of", lambda path: hashed.append(path.name) or (
        sha256_of(path)))
    fetch_shipped_model(folder)
    fetch_shipped_model(folder)
    assert sorted(hashed) == sorted(SHIPPED_MODELS["multi30k_cpu"])  # each hashed once
    vocab = folder / "vocab_en.json"
    vocab.write_text(vocab.read_text().replace('"a"', '"b"', 1))  # changed: checked again
    with pytest.raises(ValueError, match=r"vocab_en\.json is not the shipped file"):
        fetch_shipped_model(folder)


def test_shipped_model_is_small_half_precision_and_loads_with_weights_only():
    weights = FOLDER / "model.pt"
    assert weights.stat().st_size < 30e6, "the shipped weights must stay under 30 MB"
    state = torch.load(weights, weights_only=True, map_location="cpu")
    floats = [t for t in state["model"].values() if t.is_floating_point()]
    assert floats and all(t.dtype == torch.float16 for t in floats)
    info = json.loads((FOLDER / "info.json").read_text())
    assert info["command"].startswith("python tools/train.py --config cpu")  # as it was trained
    assert info["training_seconds"] > 0 and info["hardware"]


@pytest.fixture(scope="module")
def shipped():
    torch.manual_seed(0)
    return load_trained_model()


def greedy_bleu_on_200_test_sentences(model, vocab_src, vocab_tgt) -> float:
    """Greedy sacreBLEU on the first 200 sentences of test_2016_flickr (printed with signature)."""
    pairs = load_multi30k("test_2016_flickr")[:200]
    hypotheses = translate(model, [de for de, _ in pairs], vocab_src, vocab_tgt,
                           load_tokenizers()[0])
    score, signature = bleu(hypotheses, [en for _, en in pairs])
    print(f"BLEU {score:.2f} greedy on test_2016_flickr[:200] ({signature})")
    return score


def test_shipped_model_scores_at_least_30_bleu_on_the_first_200_test_sentences(shipped):
    model, vocab_src, vocab_tgt, _ = shipped
    score = greedy_bleu_on_200_test_sentences(model, vocab_src, vocab_tgt)
    assert score >= 30, f"BLEU {score:.2f} on test_2016_flickr[:200] is below 30"


def test_translate_script_decodes_greedily_with_beam_1_and_differently_with_beam_4():
    model, vocab_src, vocab_tgt, _ = load_trained_model(name=BEST_SHIPPED_MODEL)
    pairs = load_multi30k("val")[:40]
    german = [de for de, _ in pairs]
    outputs = {}
    for beam in (1, 4):
        result = subprocess.run(
            [sys.executable, "-m", "annotated_transformer_cli", "translate", "--beam", str(beam)],
            input="\n".join(german).encode(), capture_output=True, check=True, timeout=300,
        )
        outputs[beam] = result.stdout.decode().split("\n")[:-1]
        assert len(outputs[beam]) == len(german)
    assert outputs[1] == translate(model, german, vocab_src, vocab_tgt, load_tokenizers()[0])
    assert outputs[4] != outputs[1]  # the default is the paper's beam search


def test_the_best_shipped_model_is_small_and_ties_its_three_matrices():
    folder = shipped_model_dir(BEST_SHIPPED_MODEL)
    assert (folder / "model.pt").stat().st_size < 30e6, "the shipped weights must stay under 30 MB"
    model, vocab_src, vocab_tgt, config = load_trained_model(name=BEST_SHIPPED_MODEL)
    assert config.subwords and config.share_embeddings and vocab_src is vocab_tgt
    assert model.generator.proj.weight is model.src_embed[0].lut.weight
    assert model.tgt_embed[0].lut.weight is model.src_embed[0].lut.weight


def test_make_translate_on_the_test_set_writes_no_special_token_and_keeps_38_bleu(capsys):
    """make translate's path (`annotated-transformer translate`, best model, beam 4) on
    test_2016_flickr."""
    from annotated_transformer_cli import translate as translate_cli

    pairs = load_multi30k("test_2016_flickr")
    stdout = io.StringIO()
    stdin = io.BytesIO(("\n".join(de for de, _ in pairs) + "\n").encode())
    assert translate_cli.main([], stdin=stdin, stdout=stdout) == 0
    lines = stdout.getvalue().split("\n")[:-1]
    assert len(lines) == len(pairs) and all(lines)
    special = [line for line in lines if any(t in line for t in ("<s>", "<blank>", "<unk>"))]
    assert not special, f"{len(special)} outputs hold a special token, e.g. {special[0]!r}"
    score, signature = bleu(lines[:200], [en for _, en in pairs[:200]])
    print(f"BLEU {score:.2f} on test_2016_flickr[:200] ({signature})")
    assert score >= 38, f"BLEU {score:.2f} on test_2016_flickr[:200] is below 38"


def test_the_half_hour_model_records_its_run_and_keeps_40_bleu_on_200_test_sentences():
    """Chapter 21's cpu_fast_dropout model: under 30 training minutes by its own record."""
    folder = shipped_model_dir("multi30k_cpu_fast_dropout")
    info = json.loads((folder / "info.json").read_text())
    assert info["training_seconds"] <= 30 * 60 and info["epochs"] == len(info["history"]) == 11
    assert info["training_seconds"] == pytest.approx(sum(r["seconds"] for r in info["history"]),
                                                     abs=0.1)
    assert info["averaged_from"] == ["epoch_010.pt", "epoch_011.pt"]  # the last two epochs
    model, vocab_src, vocab_tgt, config = load_trained_model(name="multi30k_cpu_fast_dropout")
    preset = training_config("cpu_fast_dropout")
    assert replace(config, epochs=11, keep_epochs=2, checkpoint_dir=preset.checkpoint_dir) == preset
    scored = json.loads((folder / "results.json").read_text())["results"]
    beam = {row["split"]: row["bleu"] for row in scored if row["decoding"] == "beam4"}
    assert beam["val"] >= 41 and beam["test_2016_flickr"] >= 40  # the goal it was trained for
    score = greedy_bleu_on_200_test_sentences(model, vocab_src, vocab_tgt)
    assert score >= 40, f"BLEU {score:.2f} on test_2016_flickr[:200] is below 40"
