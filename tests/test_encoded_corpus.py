"""The encoded corpus (book/appendix_data.ipynb): encoded once on disk, memory-mapped by every
rank, batched from its stored lengths; it must give exactly what the in-memory path gives."""

import gzip
import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_training import synthetic_sentence_pairs

from the_annotated_transformer import (
    EncodedCorpus,
    StoredLengthSampler,
    TokenBudgetSampler,
    TrainConfig,
    corpus_loader,
    encode_corpus,
    encode_examples,
    example_lengths,
    filter_by_length,
    read_lines,
    train_sentencepiece,
    train_worker,
    training_config,
)

ROOT = Path(__file__).resolve().parents[1]
MAX_LEN = 12  # short enough that some of the pairs below are left out


@pytest.fixture(scope="module")
def text() -> list[tuple[str, str]]:
    pairs = synthetic_sentence_pairs(600, seed=3)
    # a few longer pairs, so that max_len leaves some out
    return pairs + [(f"{de} {de} {de}", f"{en} {en}") for de, en in pairs[:40]]


@pytest.fixture(scope="module")
def sp(text):
    return train_sentencepiece([s for pair in text for s in pair], vocab_size=320)


@pytest.fixture(scope="module")
def corpus_dir(text, sp, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("corpus")
    encode_corpus((de for de, _ in text), (en for _, en in text), sp, folder, max_len=MAX_LEN,
                  chunk_size=97)  # chunks that do not divide the text
    return folder


def test_the_encoded_corpus_holds_exactly_the_pairs_and_count_of_the_in_memory_path(
        text, sp, corpus_dir):
    corpus = EncodedCorpus(corpus_dir)
    ids = [(sp.encode(de), sp.encode(en)) for de, en in text]
    kept, dropped = filter_by_length(ids, max_len=MAX_LEN)
    assert dropped > 0 and len(kept) > 0
    assert [corpus[i] for i in range(len(corpus))] == kept
    assert kept == encode_examples(text, sp, sp, (None, None), max_len=MAX_LEN)
    header = corpus.header
    assert (header["read"], header["pairs"], header["dropped"]) == (len(text), len(kept), dropped)
    assert header["dtype"] == "uint16" and corpus.src_tokens.dtype == np.uint16
    assert corpus.src_lengths.tolist() == [len(src) for src, _ in kept]
    assert corpus.tgt_lengths.tolist() == [len(tgt) for _, tgt in kept]
    assert corpus[-1] == kept[-1] and len(corpus[:5]) == 5 and corpus[:5][4] == kept[4]
    assert isinstance(corpus.src_tokens, np.memmap)  # mapped, not read


def test_files_read_line_by_line_give_the_same_corpus_as_lists(text, sp, corpus_dir, tmp_path):
    paths = []
    for side, name in enumerate(("train.de.gz", "train.en")):
        data = ("\ufeff" if side else "") + "\r\n".join(pair[side] for pair in text) + "\n"
        path = tmp_path / name
        if name.endswith(".gz"):
            path.write_bytes(gzip.compress(data.encode()))
        else:
            path.write_bytes(data.encode())
        paths.append(path)
    assert list(read_lines(paths[0])) == [de for de, _ in text]
    assert list(read_lines(paths[1])) == [en for _, en in text]
    encode_corpus(read_lines(paths[0]), read_lines(paths[1]), sp, tmp_path / "c", max_len=MAX_LEN)
    for name in ("src_tokens", "tgt_tokens", "src_lengths", "tgt_lengths"):
        assert (np.load(tmp_path / "c" / f"{name}.npy") ==
                np.load(corpus_dir / f"{name}.npy")).all()


@pytest.mark.parametrize("options", [
    {"shuffle": True, "seed": 5},
    {"shuffle": False},
    {"shuffle": True, "seed": 1, "pool_size": 100, "num_replicas": 3, "rank": 2},
])
def test_batches_from_stored_lengths_are_the_in_memory_samplers_batches(corpus_dir, options):
    corpus = EncodedCorpus(corpus_dir)
    examples = [corpus[i] for i in range(len(corpus))]
    in_memory = TokenBudgetSampler(*example_lengths(examples), max_tokens=60, **options)
    stored = StoredLengthSampler(corpus.src_lengths.astype(int) + 2,
                                 corpus.tgt_lengths.astype(int) + 2, max_tokens=60, **options)
    for epoch in (0, 3):
        in_memory.set_epoch(epoch)
        stored.set_epoch(epoch)
        assert [batch.tolist() for batch in stored.batches()] == in_memory.batches()
        assert list(stored) == list(in_memory) and len(stored) == len(in_memory)


def test_the_stored_length_sampler_refuses_what_the_in_memory_one_refuses():
    with pytest.raises(ValueError, match="example 1 has 9 source and 3 target tokens"):
        StoredLengthSampler([3, 9], [3, 3], max_tokens=8)
    with pytest.raises(ValueError, match="rank must be in"):
        StoredLengthSampler([3, 4], [3, 3], max_tokens=8, num_replicas=2, rank=2)


def test_two_ranks_map_the_same_files_and_draw_disjoint_shares_that_cover_the_corpus(
        corpus_dir):
    shares = []
    for rank in range(2):
        corpus = pickle.loads(pickle.dumps(EncodedCorpus(corpus_dir)))  # as a rank receives it
        assert len(pickle.dumps(corpus)) < 500  # the folder's name, not the ids
        loader = corpus_loader(corpus, max_tokens=60, shuffle=True, seed=2, num_replicas=2,
                               rank=rank)
        assert Path(corpus.src_tokens.filename) == corpus_dir / "src_tokens.npy"
        shares.append([i for batch in loader.batch_sampler for i in batch])
        batch = next(iter(loader))
        assert batch.src.shape[0] == len(next(iter(loader.batch_sampler)))
    assert set(shares[0]).isdisjoint(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(len(EncodedCorpus(corpus_dir))))


def test_encode_corpus_refuses_sides_of_unequal_length_and_an_unfinished_folder(sp, tmp_path):
    with pytest.raises(ValueError, match="target side ends after 2 lines"):
        encode_corpus(["a b", "c", "d"], ["a", "b"], sp, tmp_path / "c", max_len=MAX_LEN)
    with pytest.raises(FileNotFoundError, match="no finished encoded corpus"):
        EncodedCorpus(tmp_path / "c")
    with pytest.raises(ValueError, match="max_len must be an integer >= 3"):
        encode_corpus(["a"], ["a"], sp, tmp_path / "d", max_len=2)


def test_train_worker_trains_on_an_encoded_corpus(text, sp, corpus_dir, tmp_path):
    config = TrainConfig(N=1, d_model=16, d_ff=32, h=2, dropout=0.0, max_tokens=60, epochs=1,
                         warmup=2, bleu_every=0, subwords=len(sp), max_len=MAX_LEN,
                         keep_epochs=0, checkpoint_dir=str(tmp_path / "run"))
    history = train_worker(config=config, progress=False, threads=1,
                           pairs={"train": EncodedCorpus(corpus_dir), "val": text[:20]})
    assert len(history) == 1 and np.isfinite(history[0]["train_loss"])
    assert (tmp_path / "run" / "subwords.model").read_bytes() == sp.serialized_model_proto()
    with pytest.raises(ValueError, match="cut at max_len=12 but the run has max_len=20"):
        train_worker(config=TrainConfig(**{**config.__dict__, "max_len": 20}), progress=False,
                     threads=1, overwrite=True,
                     pairs={"train": EncodedCorpus(corpus_dir), "val": text[:20]})


def test_the_data_benchmark_runs_in_quick_mode(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "bench_data.py"), "--quick", "--json", str(out),
         "--work", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "per million pairs" in result.stdout
    rows = json.loads(out.read_text())["sizes"]
    assert len(rows) == 1 and rows[0]["pairs_read"] == rows[0]["pairs"] + rows[0]["dropped"]
    assert rows[0]["rank_data_mb"] < 1000
    assert not (tmp_path / "work").exists() or not any((tmp_path / "work").iterdir())


def train_command(folder: Path, *argv: str) -> subprocess.CompletedProcess:
    files = ["--train", str(folder / "train.de"), str(folder / "train.en"),
             "--valid", str(folder / "val.de"), str(folder / "val.en")]
    tiny = ["--set", "N=1", "--set", "d_model=32", "--set", "d_ff=64", "--set", "h=2",
            "--set", "warmup=2", "--set", "bleu_every=0", "--epochs", "1", "--threads", "1"]
    return subprocess.run([sys.executable, "-m", "annotated_transformer_cli", "train", *files,
                           *tiny, *argv], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_train_command_with_corpus_dir_trains_as_the_in_memory_run_and_reuses_the_encoding(
        tmp_path):
    from the_annotated_transformer import load_checkpoint

    for split, n, seed in (("train", 300, 1), ("val", 30, 2)):
        pairs = synthetic_sentence_pairs(n, seed)
        for side, language in enumerate(("de", "en")):
            (tmp_path / f"{split}.{language}").write_text(
                "\n".join(pair[side] for pair in pairs) + "\n", "utf-8")
    corpus = ["--corpus-dir", str(tmp_path / "corpus")]
    mapped = train_command(tmp_path, "--checkpoint-dir", str(tmp_path / "mapped"), *corpus)
    assert mapped.returncode == 0, mapped.stderr[-2000:]
    assert "encoding 300 training pairs into" in mapped.stderr
    in_memory = train_command(tmp_path, "--checkpoint-dir", str(tmp_path / "in_memory"))
    assert in_memory.returncode == 0, in_memory.stderr[-2000:]
    histories = [load_checkpoint(tmp_path / run / "last.pt")["history"]
                 for run in ("mapped", "in_memory")]
    losses = [[(e["train_loss"], e["val_loss"]) for e in history] for history in histories]
    assert losses[0] == losses[1]  # the same vocabulary, pairs, batches and so weights
    again = train_command(tmp_path, "--checkpoint-dir", str(tmp_path / "mapped"), "--overwrite",
                          *corpus)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "encoding" not in again.stderr  # the folder holds this text's encoding already
    assert json.loads((tmp_path / "corpus" / "corpus.json").read_text())["pairs"] == 300


def write_side_files(folder: Path, name: str, pairs: list) -> list[str]:
    """The two files of a parallel text; None stands for a line of bad bytes."""
    paths = []
    for side, language in enumerate(("de", "en")):
        lines = [b"\xff\xfe bad" if pair[side] is None else pair[side].encode()
                 for pair in pairs]
        path = folder / f"{name}.{language}"
        path.write_bytes(b"\n".join(lines) + b"\n")
        paths.append(str(path))
    return paths


def messy_pairs(n: int, seed: int) -> list:
    """Synthetic pairs with what --clean drops among them: bad bytes, an empty side, a pair
    far longer on one side, and repeats."""
    pairs = list(dict.fromkeys(synthetic_sentence_pairs(n, seed)))
    return (pairs[:7] + [(None, "A dog runs."), ("", "A man."), ("Ja.", "Yes " * 30)]
            + pairs[7:] + pairs[2:5])


def test_streamed_pairs_are_read_parallels_and_read_clean_parallels_pairs_and_hash(tmp_path):
    from annotated_transformer_cli.parallel_text import (
        StreamedPairs,
        read_clean_parallel,
        read_parallel,
    )
    from annotated_transformer_cli.train import pairs_sha256

    clean_text = synthetic_sentence_pairs(50, 4)
    paths = write_side_files(tmp_path, "clean", clean_text)
    gz = Path(paths[0] + ".gz")  # gzipped, with a byte-order mark and CRLF endings
    gz.write_bytes(gzip.compress(b"\xef\xbb\xbf" + Path(paths[0]).read_bytes()
                                 .replace(b"\n", b"\r\n")))
    streamed = StreamedPairs(str(gz), paths[1])
    assert list(streamed) == read_parallel(gz, paths[1]) == clean_text
    assert len(streamed) == 50 and list(streamed[:7]) == clean_text[:7] and len(streamed[:7]) == 7
    val = synthetic_sentence_pairs(5, 5)
    assert (pairs_sha256({"train": streamed, "val": val})
            == pairs_sha256({"train": clean_text, "val": val}))
    assert (pairs_sha256({"train": streamed[:7], "val": []})
            == pairs_sha256({"train": clean_text[:7], "val": []}))
    messy = write_side_files(tmp_path, "messy", messy_pairs(60, 6))
    limits = {"max_chars": 1000, "max_ratio": 3.0}
    kept, dropped = read_clean_parallel(*messy, **limits)
    streamed = StreamedPairs(*messy, clean=limits)
    assert list(streamed) == kept and len(streamed) == len(kept) and streamed.dropped == dropped
    assert list(streamed.side(1)) == [tgt for _, tgt in kept]
    assert sum(dropped.values()) == 6  # 1 not UTF-8, 1 empty, 1 ratio, 3 repeats
    assert pairs_sha256({"train": streamed, "val": []}) == pairs_sha256({"train": kept,
                                                                         "val": []})


@pytest.mark.parametrize("lines", [
    ([b"a", b"\xff b", b"c", b"\xfe"], [b"a", b"b", b"c", b"d"]),  # bad bytes, twice
    ([b"a", b"b", b"c"], [b"a", b"  ", b"c", b""]),  # empty lines, then unequal counts
    ([b"a", b"b", b"c"], [b"a", b"b"]),  # unequal counts
    ([], [b"a"]),  # an empty file
])
def test_streamed_pairs_refuse_what_read_parallel_refuses_with_its_message(tmp_path, lines):
    from annotated_transformer_cli.parallel_text import BadInput, StreamedPairs, read_parallel

    paths = []
    for side, name in enumerate(("t.de", "t.en")):
        (tmp_path / name).write_bytes(b"".join(line + b"\n" for line in lines[side]))
        paths.append(tmp_path / name)
    with pytest.raises(BadInput) as expected:
        read_parallel(*paths)
    with pytest.raises(BadInput) as streamed:
        StreamedPairs(*paths)
    assert str(streamed.value) == str(expected.value)


def corpus_arrays(folder: Path) -> dict[str, list[int]]:
    return {name: np.load(folder / f"{name}.npy").tolist()
            for name in ("src_tokens", "tgt_tokens", "src_lengths", "tgt_lengths")}


@pytest.mark.parametrize("clean", [False, True])
def test_the_streamed_corpus_dir_run_encodes_and_trains_as_the_in_memory_text(tmp_path, clean):
    """--corpus-dir reads --train from its files as it goes; the corpus it encodes is the
    one encode_corpus makes from the pairs read into memory (less those --clean drops), and
    training on it gives the in-memory run's losses and the same data hash."""
    from annotated_transformer_cli.parallel_text import read_clean_parallel, read_parallel
    from the_annotated_transformer import load_checkpoint, load_subwords

    text = messy_pairs(300, 1) if clean else synthetic_sentence_pairs(300, 1)
    train = write_side_files(tmp_path, "train", text)
    write_side_files(tmp_path, "val", synthetic_sentence_pairs(30, 2))
    options = ["--set", "max_len=10", "--set", "max_tokens=100"] + (["--clean"] if clean else [])
    mapped = train_command(tmp_path, "--checkpoint-dir", str(tmp_path / "mapped"),
                           "--corpus-dir", str(tmp_path / "corpus"), *options)
    assert mapped.returncode == 0, mapped.stderr[-2000:]
    in_memory = train_command(tmp_path, "--checkpoint-dir", str(tmp_path / "in_memory"),
                              *options)
    assert in_memory.returncode == 0, in_memory.stderr[-2000:]
    pairs = read_clean_parallel(*train)[0] if clean else read_parallel(*train)
    assert f"encoding {len(pairs)} training pairs into" in mapped.stderr
    sp = load_subwords(tmp_path / "mapped" / "subwords.model")
    expected = tmp_path / "expected"
    header = encode_corpus((de for de, _ in pairs), (en for _, en in pairs), sp, expected,
                           max_len=10)
    assert header["dropped"] > 0  # max_len leaves some out, said once, from the header
    dropped = (f"left out, longer than max_len=10 tokens with <s> and </s>: {header['dropped']} "
               f"of {len(pairs)} training pairs ({header['dropped'] / len(pairs):.1%}) when "
               f"{tmp_path / 'corpus'} was encoded and ")
    assert mapped.stdout.count(dropped) == 1 and "left out" not in mapped.stderr
    assert corpus_arrays(tmp_path / "corpus") == corpus_arrays(expected)
    assert (tmp_path / "in_memory" / "subwords.model").read_bytes() == sp.serialized_model_proto()
    histories = [load_checkpoint(tmp_path / run / "last.pt")["history"]
                 for run in ("mapped", "in_memory")]
    assert ([[(e["train_loss"], e["val_loss"]) for e in history] for history in histories][0]
            == [[(e["train_loss"], e["val_loss"]) for e in history] for history in histories][1])
    data = [json.loads((tmp_path / run / "model" / "info.json").read_text())["data"]
            for run in ("mapped", "in_memory")]
    assert data[0] == data[1] and data[0]["train_pairs"] == len(pairs)


def test_a_bad_line_is_refused_in_one_line_by_the_streamed_run_and_nothing_is_written(tmp_path):
    text = synthetic_sentence_pairs(40, 1)
    text[25] = (text[25][0], "   ")
    write_side_files(tmp_path, "train", text)
    write_side_files(tmp_path, "val", synthetic_sentence_pairs(10, 2))
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "notes.txt").write_text("kept\n", "utf-8")
    result = train_command(tmp_path, "--checkpoint-dir", str(folder), "--corpus-dir",
                           str(tmp_path / "corpus"))
    assert result.returncode == 2
    assert result.stderr == (f"annotated-transformer train: error: {tmp_path / 'train.en'}: "
                             "line 26 is empty: every line must hold one sentence; remove the "
                             "pair from both files\n")
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    assert not (tmp_path / "corpus").exists()


def test_a_process_that_never_sees_rank_0_begin_encoding_stops_naming_shared_storage(
        tmp_path, monkeypatch):
    """Under torchrun on several machines, a --corpus-dir that only rank 0's machine sees stays
    empty on the others: their processes stop with one line naming DIR instead of waiting
    for ever, and write nothing there."""
    import annotated_transformer_cli.train as train

    monkeypatch.setattr(train, "CORPUS_POLL_S", 0)
    monkeypatch.setattr(train, "CORPUS_WAIT_S", 0)
    pairs = {"train": synthetic_sentence_pairs(5, 1), "val": []}
    folder = tmp_path / "ids"
    with pytest.raises(train.BadInput) as refused:
        train.encoded_pairs(training_config("cpu_fast_dropout"), pairs, folder, resume=False,
                            rank0=False)
    assert str(refused.value).startswith(f"--corpus-dir {folder}: rank 0 has not begun "
                                         "encoding there")
    assert str(refused.value).endswith("DIR must be on storage that every machine sees")
    assert "\n" not in str(refused.value) and not folder.exists()
