"""Chapters 9 and 14: the Multi30k loader and batch sampler (9); tokenizers, vocabulary and
collate function (14)."""

import gzip
import io
import json
import shutil
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import the_annotated_transformer as tat
from the_annotated_transformer import (
    MULTI30K_FR_CS_SHA256,
    MULTI30K_SHA256,
    MULTI30K_SPLITS,
    SPECIALS,
    TokenBudgetSampler,
    Vocab,
    collate_batch,
    example_lengths,
    filter_by_length,
    load_multi30k,
    load_tokenizers,
    multi30k_dir,
    padding_fraction,
    read_sentence_pairs,
    tokenize,
)

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"no shared copy of Multi30k at {SHARED}"
)
SHARED_FR_CS = SHARED.parent / "multi30k-fr-cs"
needs_fr_cs = pytest.mark.skipif(
    not (SHARED.is_dir() and SHARED_FR_CS.is_dir()),
    reason=f"no shared copy of Multi30k's French and Czech files at {SHARED_FR_CS}",
)


def copy_split(split: str, folder: Path) -> None:
    for language in ("de", "en"):
        shutil.copyfile(SHARED / f"{split}.{language}.gz", folder / f"{split}.{language}.gz")


def no_network(*args, **kwargs):
    raise urllib.error.URLError("no network in this test")


# The loader.


@needs_shared
def test_default_folder_is_the_shared_copy_next_to_the_repository(monkeypatch):
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    assert multi30k_dir() == SHARED.resolve()


def test_multi30k_dir_prefers_the_argument_then_the_environment_variable(monkeypatch, tmp_path):
    monkeypatch.setenv("MULTI30K_DIR", str(tmp_path / "from_env"))
    assert multi30k_dir() == tmp_path / "from_env"
    assert multi30k_dir(tmp_path / "given") == tmp_path / "given"


@needs_shared
@pytest.mark.parametrize("split", list(MULTI30K_SPLITS))
def test_load_multi30k_reads_each_split_with_its_published_size(monkeypatch, split):
    monkeypatch.setattr(urllib.request, "urlopen", no_network)  # must not download
    pairs = load_multi30k(split, SHARED)
    assert len(pairs) == MULTI30K_SPLITS[split]
    assert all(isinstance(de, str) and isinstance(en, str) and de and en for de, en in pairs)


@needs_shared
def test_load_multi30k_pairs_german_with_english_line_by_line():
    de, en = load_multi30k("train", SHARED)[0]
    assert de == "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
    assert en == "Two young, White males are outside near many bushes."


@needs_shared
def test_checksums_in_the_code_match_the_published_sha256sums():
    published = dict(
        reversed(line.split()) for line in (SHARED / "SHA256SUMS").read_text().splitlines()
    )
    assert published == MULTI30K_SHA256


@needs_fr_cs
def test_french_and_czech_checksums_match_their_published_sha256sums():
    published = dict(
        reversed(line.split()) for line in (SHARED_FR_CS / "SHA256SUMS").read_text().splitlines()
    )
    assert published == MULTI30K_FR_CS_SHA256


@needs_fr_cs
@pytest.mark.parametrize("other", ["fr", "cs"])
def test_load_multi30k_pairs_english_with_french_or_czech_line_by_line(monkeypatch, other):
    monkeypatch.setattr(urllib.request, "urlopen", no_network)  # both folders are on disk
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    pairs = load_multi30k("val", languages=("en", other))
    assert len(pairs) == MULTI30K_SPLITS["val"]
    # the English side is the German-English pairs' English side, line for line
    assert [en for en, _ in pairs] == [en for _, en in load_multi30k("val", SHARED)]
    assert all(text for _, text in pairs)
    with gzip.open(SHARED_FR_CS / f"val.{other}.gz", "rt", encoding="utf-8") as f:
        assert [text for _, text in pairs] == f.read().splitlines()


@needs_fr_cs
def test_without_shared_french_is_downloaded_verified_and_kept_in_its_own_cache_folder(
        monkeypatch, tmp_path):
    urls = []

    def fake_urlopen(url, timeout=None):
        urls.append(url)
        name = url.rsplit("/", 1)[1]
        return io.BytesIO((SHARED_FR_CS if ".fr." in name else SHARED).joinpath(name).read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    monkeypatch.setattr(tat, "repository_root", lambda: tmp_path / "repo")  # no ../shared
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MULTI30K_DIR", raising=False)
    pairs = load_multi30k("test_2016_flickr", languages=("fr", "en"))
    assert len(pairs) == MULTI30K_SPLITS["test_2016_flickr"]
    assert urls == [tat.MULTI30K_URL + f"test_2016_flickr.{code}.gz" for code in ("fr", "en")]
    cache = tmp_path / "home" / ".cache" / "annotated-transformer"
    assert {str(p.relative_to(cache)) for p in cache.rglob("*.gz")} == {
        "multi30k/test_2016_flickr.en.gz", "multi30k-fr-cs/test_2016_flickr.fr.gz"}
    assert load_multi30k("test_2016_flickr", languages=("fr", "en")) == pairs  # no new download
    assert len(urls) == 2


def test_a_french_download_with_a_wrong_checksum_raises_and_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(b"<html>"))
    with pytest.raises(ValueError, match=r"val\.fr\.gz, but its SHA-256 checksum"):
        load_multi30k("val", tmp_path, languages=("fr", "en"))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("languages", [("en", "es"), ("fr", "fr"), ("de", "en", "fr")])
def test_languages_outside_multi30k_raise_value_error_naming_its_four(languages):
    with pytest.raises(ValueError, match=r"Multi30k pairs two different ones of de, en, fr, cs"):
        load_multi30k("val", languages=languages)


def test_unknown_split_raises_value_error_naming_the_splits():
    with pytest.raises(ValueError, match="split='dev' is not one of train, val"):
        load_multi30k("dev")


@needs_shared
def test_corrupted_file_raises_error_naming_the_file_and_the_fix(tmp_path):
    copy_split("val", tmp_path)
    data = bytearray((tmp_path / "val.en.gz").read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte
    (tmp_path / "val.en.gz").write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"val\.en\.gz is truncated or corrupted.*delete it"):
        load_multi30k("val", tmp_path)


@needs_shared
def test_truncated_file_raises_error_naming_the_file(tmp_path):
    copy_split("val", tmp_path)
    data = (tmp_path / "val.de.gz").read_bytes()
    (tmp_path / "val.de.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match=r"val\.de\.gz is truncated or corrupted"):
        load_multi30k("val", tmp_path)


def test_missing_file_without_network_raises_error_naming_the_file(monkeypatch, tmp_path):
    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    with pytest.raises(FileNotFoundError, match=r"val\.de\.gz is not in .*MULTI30K_DIR"):
        load_multi30k("val", tmp_path)
    assert list(tmp_path.iterdir()) == []  # no half-written file left behind


@needs_shared
def test_missing_file_is_downloaded_verified_and_kept(monkeypatch, tmp_path):
    urls = []

    def fake_urlopen(url, timeout=None):
        urls.append(url)
        return io.BytesIO((SHARED / url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", fake_urlopen)
    pairs = load_multi30k("test_2016_flickr", tmp_path / "cache")
    assert pairs == load_multi30k("test_2016_flickr", SHARED)
    assert urls == [
        "https://raw.githubusercontent.com/multi30k/dataset/master/data/task1/raw/"
        f"test_2016_flickr.{language}.gz"
        for language in ("de", "en")
    ]
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [
        "test_2016_flickr.de.gz",
        "test_2016_flickr.en.gz",
    ]


def test_download_with_a_wrong_checksum_raises_and_keeps_nothing(monkeypatch, tmp_path):
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: io.BytesIO(b"<html>"))
    with pytest.raises(ValueError, match=r"val\.de\.gz, but its SHA-256 checksum"):
        load_multi30k("val", tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_unequal_line_counts_raise_value_error_naming_both_files(tmp_path):
    for name, text in [("a.de.gz", "eins\nzwei\ndrei\n"), ("a.en.gz", "one\ntwo\n")]:
        with gzip.open(tmp_path / name, "wt", encoding="utf-8") as f:
            f.write(text)
    with pytest.raises(ValueError, match=r"a\.de\.gz has 3 lines but a\.en\.gz has 2"):
        read_sentence_pairs(tmp_path / "a.de.gz", tmp_path / "a.en.gz")


def test_read_sentence_pairs_keeps_empty_lines_but_not_the_final_newline(tmp_path):
    for name, text in [("b.de.gz", "eins\n\ndrei\n"), ("b.en.gz", "one\n\nthree\n")]:
        with gzip.open(tmp_path / name, "wt", encoding="utf-8") as f:
            f.write(text)
    pairs = read_sentence_pairs(tmp_path / "b.de.gz", tmp_path / "b.en.gz")
    assert pairs == [("eins", "one"), ("", ""), ("drei", "three")]


# Tokenizers.


def test_tokenize_splits_punctuation_and_drops_doubled_spaces():
    spacy_de, spacy_en = load_tokenizers()
    assert tokenize("Zwei  Hunde laufen.", spacy_de) == ["Zwei", "Hunde", "laufen", "."]
    assert tokenize("Two young, white males.", spacy_en) == [
        "Two",
        "young",
        ",",
        "white",
        "males",
        ".",
    ]
    assert tokenize("Don't go.", spacy_en.tokenizer) == ["Do", "n't", "go", "."]


# The vocabulary.


def test_vocab_puts_specials_first_then_frequency_then_alphabet():
    vocab = Vocab.build([["b", "a", "c"], ["a", "c", "b", "a"], ["d", "e"], ["a"]])
    # counts: a 4, b 2, c 2, d 1, e 1; min_freq=2 keeps a, b, c
    assert vocab.itos == ["<s>", "</s>", "<blank>", "<unk>", "a", "b", "c"]
    assert [vocab[token] for token in SPECIALS] == [0, 1, 2, 3]
    assert len(vocab) == 7


def test_vocab_maps_unknown_and_rare_tokens_to_unk():
    vocab = Vocab.build([["a", "a", "rare"]], min_freq=2)
    assert vocab.encode(["a", "rare", "never-seen"]) == [4, 3, 3]
    assert "rare" not in vocab and "a" in vocab
    assert Vocab.build([["a", "a", "rare"]], min_freq=1)["rare"] == 5


def test_vocab_round_trips_through_json(tmp_path):
    vocab = Vocab.build([["Männer", "im", "Freien"]] * 2 + [["Büsche", "."]] * 3)
    vocab.save(tmp_path / "vocab.json")
    data = json.loads((tmp_path / "vocab.json").read_text("utf-8"))  # plain JSON, not a pickle
    assert data["itos"][:4] == list(SPECIALS)
    loaded = Vocab.load(tmp_path / "vocab.json")
    assert loaded == vocab
    assert loaded.itos == vocab.itos
    ids = loaded.encode(["Büsche", "Männer", "unbekannt"])
    assert loaded.lookup_tokens(torch.tensor(ids)) == ["Büsche", "Männer", "<unk>"]


def test_vocab_load_rejects_a_json_file_that_is_not_a_vocabulary(tmp_path):
    (tmp_path / "other.json").write_text('{"itos": ["a"]}')
    with pytest.raises(ValueError, match="not a vocabulary written by Vocab.save"):
        Vocab.load(tmp_path / "other.json")


def test_vocab_build_rejects_sentences_that_were_not_tokenized():
    with pytest.raises(TypeError, match="tokenize it"):
        Vocab.build(["a sentence", "another sentence"])


def test_lookup_tokens_rejects_ids_out_of_range():
    with pytest.raises(ValueError, match="id 4 is out of range for a vocabulary of 4 tokens"):
        Vocab(SPECIALS).lookup_tokens([0, 4])


# From examples to tensors.


def test_collate_batch_wraps_in_bos_eos_and_pads_to_the_longest():
    src, tgt = collate_batch([([5, 6, 7], [8]), ([9], [10, 11])])
    assert torch.equal(src, torch.tensor([[0, 5, 6, 7, 1], [0, 9, 1, 2, 2]]))
    assert torch.equal(tgt, torch.tensor([[0, 8, 1, 2], [0, 10, 11, 1]]))
    assert src.dtype == tgt.dtype == torch.long


def test_collate_batch_never_cuts_a_long_sentence():
    long = list(range(4, 204))
    src, _ = collate_batch([(long, [4]), ([4], [4])])
    assert src.shape == (2, 202)
    assert src[0, 1:-1].tolist() == long and src[0, -1] == 1


def test_filter_by_length_drops_pairs_longer_than_max_len_and_counts_them():
    examples = [([4] * 8, [4] * 3), ([4] * 3, [4] * 9), ([4] * 2, [4] * 2)]
    kept, dropped = filter_by_length(examples, max_len=10)  # 8 + <s> + </s> = 10 fits
    assert kept == [examples[0], examples[2]]
    assert dropped == 1
    assert example_lengths(kept) == ([10, 4], [5, 4])


def test_padding_fraction_counts_padded_positions_on_both_sides():
    src_lengths, tgt_lengths = [2, 4, 3], [3, 3, 1]
    # batch [0, 1]: src 2*4=8 positions, 6 real; tgt 2*3=6, 6 real. batch [2]: no padding.
    fraction = padding_fraction([[0, 1], [2]], src_lengths, tgt_lengths)
    assert fraction == pytest.approx(1 - (6 + 6 + 3 + 1) / (8 + 6 + 3 + 1))


# The token-budget sampler.


def random_lengths(n: int, seed: int) -> tuple[list[int], list[int]]:
    generator = torch.Generator().manual_seed(seed)
    src = torch.randint(3, 60, (n,), generator=generator)
    tgt = (src + torch.randint(-5, 6, (n,), generator=generator)).clamp(min=3)
    return src.tolist(), tgt.tolist()


@pytest.mark.parametrize("pool_size", [None, 64, 1000])
def test_sampler_batches_never_exceed_the_token_budget(pool_size):
    src_lengths, tgt_lengths = random_lengths(1000, seed=1)
    sampler = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=300, pool_size=pool_size)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in sampler:
            assert len(batch) * max(src_lengths[i] for i in batch) <= 300
            assert len(batch) * max(tgt_lengths[i] for i in batch) <= 300


@pytest.mark.parametrize("shuffle", [True, False])
def test_sampler_yields_every_example_exactly_once_per_epoch(shuffle):
    src_lengths, tgt_lengths = random_lengths(777, seed=2)
    sampler = TokenBudgetSampler(
        src_lengths, tgt_lengths, max_tokens=256, pool_size=100, shuffle=shuffle
    )
    for epoch in range(3):
        sampler.set_epoch(epoch)
        seen = [i for batch in sampler for i in batch]
        assert sorted(seen) == list(range(777))
        assert len(list(sampler)) == len(sampler)


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_sampler_splits_batches_across_ranks_without_overlap(num_replicas):
    src_lengths, tgt_lengths = random_lengths(500, seed=3)
    for epoch in range(4):
        per_rank = []
        for rank in range(num_replicas):
            sampler = TokenBudgetSampler(
                src_lengths,
                tgt_lengths,
                max_tokens=200,
                seed=7,
                num_replicas=num_replicas,
                rank=rank,
            )
            sampler.set_epoch(epoch)
            per_rank.append([i for batch in sampler for i in batch])
            assert len(list(sampler)) == len(sampler)
        seen = [i for indices in per_rank for i in indices]
        assert sorted(seen) == list(range(500))  # disjoint, and together complete
        counts = {
            len(
                TokenBudgetSampler(
                    src_lengths,
                    tgt_lengths,
                    max_tokens=200,
                    seed=7,
                    num_replicas=num_replicas,
                    rank=rank,
                )
            )
            for rank in range(num_replicas)
        }
        assert len(counts) == 1  # every rank takes the same number of steps


def test_sampler_splits_a_batch_when_the_count_does_not_divide_among_ranks():
    # Three examples of length 10 with budget 20: two batches, [a, b] and [c]; 3 ranks need 3.
    sampler = TokenBudgetSampler([10] * 3, [10] * 3, max_tokens=20, num_replicas=3, rank=0)
    assert sorted(map(len, sampler.batches())) == [1, 1, 1]


def test_set_epoch_changes_the_order_deterministically():
    src_lengths, tgt_lengths = random_lengths(400, seed=4)

    def order(epoch: int, seed: int = 0) -> list[list[int]]:
        sampler = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=250, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(0) == order(0)
    assert order(1) == order(1)
    assert order(0) != order(1)
    assert order(0, seed=1) != order(0)


def test_sampler_without_shuffle_gives_the_same_batches_every_epoch():
    src_lengths, tgt_lengths = random_lengths(300, seed=5)
    sampler = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=250, shuffle=False)
    first = list(sampler)
    sampler.set_epoch(1)
    assert list(sampler) == first


def test_sampler_groups_similar_lengths_and_pads_less_than_random_batches():
    src_lengths, tgt_lengths = random_lengths(2000, seed=6)
    batches = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=500).batches()
    size = round(2000 / len(batches))
    order = torch.randperm(2000, generator=torch.Generator().manual_seed(0)).tolist()
    random_batches = [order[i : i + size] for i in range(0, 2000, size)]
    ours = padding_fraction(batches, src_lengths, tgt_lengths)
    theirs = padding_fraction(random_batches, src_lengths, tgt_lengths)
    assert ours < theirs / 3


def test_sampler_rejects_an_example_longer_than_the_budget():
    with pytest.raises(
        ValueError, match=r"example 1 has 30 source and 5 target tokens.*max_tokens=20"
    ):
        TokenBudgetSampler([5, 30, 6], [5, 5, 6], max_tokens=20)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_tokens": 0}, "max_tokens must be a positive integer"),
        (
            {"max_tokens": 50, "num_replicas": 2, "rank": 2},
            r"rank must be in \[0, num_replicas=2\)",
        ),
        ({"max_tokens": 50, "pool_size": 0}, "pool_size must be a positive integer"),
    ],
)
def test_sampler_rejects_bad_options_with_a_message_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TokenBudgetSampler([5, 6], [5, 6], **kwargs)


def test_sampler_rejects_lengths_of_different_counts():
    with pytest.raises(ValueError, match="src_lengths has 2 entries but tgt_lengths has 1"):
        TokenBudgetSampler([5, 6], [5], max_tokens=50)


def test_sampler_and_collate_make_tensors_within_budget_in_a_dataloader():
    generator = torch.Generator().manual_seed(8)
    examples = [
        (
            torch.randint(4, 50, (int(n),), generator=generator).tolist(),
            torch.randint(4, 50, (int(m),), generator=generator).tolist(),
        )
        for n, m in torch.randint(1, 30, (200, 2), generator=generator)
    ]
    src_lengths, tgt_lengths = example_lengths(examples)
    sampler = TokenBudgetSampler(src_lengths, tgt_lengths, max_tokens=128)
    loader = DataLoader(examples, batch_sampler=sampler, collate_fn=collate_batch)
    rows = 0
    for src, tgt in loader:
        assert src.numel() <= 128 and tgt.numel() <= 128
        assert (src[:, 0] == 0).all() and (tgt[:, 0] == 0).all()
        rows += src.shape[0]
    assert rows == 200
