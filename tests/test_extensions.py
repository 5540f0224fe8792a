"""Grown definitions (README, "Growing a definition"): with its new keywords left at their
defaults, a definition that a later chapter grows behaves exactly as the chapter that teaches it
wrote it. The first definitions are taken from the chapters themselves, not from the module."""

import ast
import copy
import dataclasses
import inspect
import sys
from pathlib import Path

import nbformat
import pytest
import torch
from torch import nn

import the_annotated_transformer as tat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from sync import chapters, definitions  # noqa: E402

V, BOS, EOS, PAD = 11, tat.BOS_ID, tat.EOS_ID, tat.PAD_ID


def export_cells() -> list[tuple[str, list[str], str]]:
    """(chapter, tags, source) of every export cell, in book order."""
    return [
        (path.name, cell.metadata.get("tags", []), cell.source)
        for path in chapters()
        for cell in nbformat.read(path, as_version=4).cells
        if "export" in cell.metadata.get("tags", [])
    ]


def grown_names() -> set[str]:
    counts: dict[str, int] = {}
    for _, _, source in export_cells():
        for name in definitions(source):
            counts[name] = counts.get(name, 0) + 1
    return {name for name, count in counts.items() if count > 1}


def first_definition(name: str):
    """The definition of `name` as its teaching chapter wrote it, run in the module's names."""
    _, _, source = next(c for c in export_cells() if name in definitions(c[2]))
    namespace = dict(vars(tat))
    exec(compile(ast.parse(source), f"<first {name}>", "exec"), namespace)  # noqa: S102
    return namespace[name]


def first_and_grown(name: str):
    """The teaching chapter's definition of `name`, after checking that the module's one is a
    different, grown definition: it adds parameters, each with a default, so a call that leaves
    them out compares the two definitions rather than one with itself."""
    plain = first_definition(name)
    before = inspect.signature(plain).parameters
    after = inspect.signature(getattr(tat, name)).parameters
    added = [p for k, p in after.items() if k not in before]
    assert added, f"the module's {name} has no parameter the first definition lacks"
    assert all(p.default is not inspect.Parameter.empty for p in added), added
    return plain


def tiny_model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = tat.make_model(V, V, N=1, d_model=16, d_ff=32, h=2, dropout=0.0)
    return model.eval()


def test_every_grown_definition_has_a_behaviour_test_here():
    assert grown_names() == {
        "beam_search", "decode_text", "encode_examples", "encode_text", "greedy_decode",
        "evaluate", "multi30k_loader", "multi30k_vocabularies", "read_vocabularies",
        "run_groups", "TokenBudgetSampler", "train_distributed", "train_epoch",
        "training_config", "TrainConfig",
    }


@pytest.mark.parametrize("end_symbol", [None, EOS])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grown_greedy_decode_gives_chapter_5s_ids_with_its_defaults(seed, end_symbol):
    plain = first_and_grown("greedy_decode")
    model = tiny_model(seed)
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 5:] = PAD
    src_mask = (src != PAD).unsqueeze(-2)
    expected = plain(model, src, src_mask, 12, BOS, end_symbol)
    assert torch.equal(tat.greedy_decode(model, src, src_mask, 12, BOS, end_symbol), expected)
    cached = tat.greedy_decode(model, src, src_mask, 12, BOS, end_symbol, use_cache=True)
    assert torch.equal(cached, expected)



@pytest.mark.parametrize("narrowing", [False, True])
@pytest.mark.parametrize("seed", [0, 1])
def test_grown_beam_search_gives_chapter_15s_outputs_with_and_without_the_cache(seed, narrowing):
    plain = first_and_grown("beam_search")
    model = tiny_model(seed)
    with torch.no_grad():
        model.generator.proj.bias[EOS] += 1.0  # sentences end at different steps
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, V, (3, 7), generator=g)
    src[1, 5:] = PAD
    src_mask = (src != PAD).unsqueeze(-2)
    options = {"max_len": 12, "start_symbol": BOS, "end_symbol": EOS, "beam_size": 3,
               "banned": (PAD,), "narrowing": narrowing}
    ids, scores = plain(model, src, src_mask, **options)
    for use_cache in (False, True):
        grown_ids, grown_scores = tat.beam_search(model, src, src_mask, use_cache=use_cache,
                                                  **options)
        assert torch.equal(grown_ids, ids)
        assert torch.allclose(grown_scores, scores, atol=1e-5)


@pytest.mark.parametrize("world_size", [1, 2])
def test_grown_train_distributed_starts_the_workers_as_chapter_22s_with_its_defaults(
    world_size, monkeypatch
):
    """The same train_worker calls, or the same spawn, once the worker's defaults are filled
    in; given a stop rule and vocabularies, the grown one passes them on to each worker."""
    plain = first_and_grown("train_distributed")
    worker = inspect.signature(tat.train_worker)
    started = []

    def record_worker(*args, **kwargs):
        bound = worker.bind(*args, **kwargs)
        bound.apply_defaults()
        started.append(dict(bound.arguments))

    def record_spawn(fn, args=(), nprocs=1, **_):
        for rank in range(nprocs):
            fn(rank, *args)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.multiprocessing, "spawn", record_spawn)
    monkeypatch.setattr(tat, "train_worker", record_worker)
    monkeypatch.setitem(plain.__globals__, "train_worker", record_worker)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    config = tat.TrainConfig(epochs=3)
    options = {"resume": True, "threads": 1, "save_every": 5}
    plain(config, world_size, **options)
    expected, started[:] = list(started), []
    tat.train_distributed(config, world_size, **options)
    assert started == expected and [s["rank"] for s in started] == list(range(world_size))
    assert all(s["stop"] is None and s["vocabularies"] is None for s in started)
    started.clear()
    rule, vocabs = tat.StopRule(max_updates=7), ("source", "target")
    tat.train_distributed(config, world_size, stop=rule, vocabularies=vocabs, **options)
    assert [(s["stop"], s["vocabularies"]) for s in started] == [(rule, vocabs)] * world_size
    with pytest.raises(ValueError, match="world_size must be a positive integer"):
        tat.train_distributed(config, 0)


def random_batches(n: int, seed: int = 0) -> list[tat.Batch]:
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(n):
        src = torch.randint(4, V, (3, 6), generator=g)
        tgt = torch.randint(4, V, (3, 7), generator=g)
        tgt[:, 0] = BOS
        src[0, 4:] = PAD
        tgt[2, 3:] = PAD
        batches.append(tat.Batch(src, tgt, pad=PAD))
    return batches


@pytest.mark.parametrize("accum_iter", [1, 2])
def test_grown_run_groups_trains_as_chapter_8s_with_its_defaults(accum_iter):
    plain = first_and_grown("run_groups")
    results = []
    for run in (plain, tat.run_groups):
        model = tiny_model(0).train()
        criterion = nn.NLLLoss(reduction="sum", ignore_index=PAD)
        loss_compute = tat.SimpleLossCompute(model.generator, criterion)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        state = tat.TrainState()
        loss, tokens = run(random_batches(4), model, loss_compute, optimizer,
                           accum_iter=accum_iter, train_state=state)
        results.append((loss, tokens, copy.deepcopy(vars(state)), model.state_dict()))
    (loss_a, tokens_a, state_a, weights_a), (loss_b, tokens_b, state_b, weights_b) = results
    assert (loss_a, tokens_a, state_a) == (loss_b, tokens_b, state_b)
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


@pytest.mark.parametrize("accum_iter", [1, 2])
def test_grown_train_epoch_and_evaluate_give_chapter_14s_sums_with_their_defaults(accum_iter):
    plain_train, plain_evaluate = first_and_grown("train_epoch"), first_and_grown("evaluate")
    cpu = torch.device("cpu")
    results = []
    for train, evaluate in ((plain_train, plain_evaluate), (tat.train_epoch, tat.evaluate)):
        model = tiny_model(0)
        criterion = tat.LabelSmoothing(V, padding_idx=PAD, smoothing=0.1)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
        state = tat.TrainState()
        trained = train(model, random_batches(5), criterion, optimizer, scheduler, device=cpu,
                        accum_iter=accum_iter, train_state=state)
        evaluated = evaluate(model, random_batches(2, seed=1), criterion, device=cpu)
        results.append((trained, evaluated, copy.deepcopy(vars(state)), model.state_dict()))
    (train_a, eval_a, state_a, weights_a), (train_b, eval_b, state_b, weights_b) = results
    assert state_a["accum_step"] == (5 + accum_iter - 1) // accum_iter
    assert (train_a, eval_a, state_a) == (train_b, eval_b, state_b)
    assert all(torch.equal(weights_a[k], weights_b[k]) for k in weights_a)


def random_lengths(n: int, seed: int) -> tuple[list[int], list[int]]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(1, 30, (n,), generator=g).tolist(),
            torch.randint(1, 30, (n,), generator=g).tolist())


@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_grown_sampler_and_loader_give_chapter_9s_and_14s_batches_with_their_defaults(
    seed, shuffle
):
    plain_sampler = first_and_grown("TokenBudgetSampler")
    src, tgt = random_lengths(300, seed)
    options = {"max_tokens": 120, "pool_size": 100, "shuffle": shuffle, "seed": seed}
    plain, grown = plain_sampler(src, tgt, **options), tat.TokenBudgetSampler(src, tgt, **options)
    for epoch in (0, 3):
        plain.set_epoch(epoch)
        grown.set_epoch(epoch)
        assert list(grown) == list(plain) and len(grown) == len(plain)
    examples = [([5] * a, [6] * b) for a, b in zip(src, tgt, strict=True)]
    plain_loader = first_and_grown("multi30k_loader")
    batches = [[(b.src.tolist(), b.tgt.tolist()) for b in load(examples, max_tokens=120,
                                                               shuffle=shuffle, seed=seed)]
               for load in (plain_loader, tat.multi30k_loader)]
    assert batches[0] == batches[1]


def test_grown_sampler_deals_each_rank_an_equal_disjoint_share():
    src, tgt = random_lengths(301, 5)
    whole = tat.TokenBudgetSampler(src, tgt, max_tokens=120, seed=5)
    shares = [list(tat.TokenBudgetSampler(src, tgt, max_tokens=120, seed=5, num_replicas=3,
                                          rank=r)) for r in range(3)]
    assert len({len(share) for share in shares}) == 1
    dealt = sorted(i for share in shares for batch in share for i in batch)
    assert dealt == sorted(i for batch in whole for i in batch) == list(range(301))


def test_grown_train_config_keeps_chapter_14s_fields_presets_and_errors():
    plain = first_and_grown("TrainConfig")
    first = [(f.name, f.default) for f in dataclasses.fields(plain)]
    grown = [(f.name, f.default) for f in dataclasses.fields(tat.TrainConfig)]
    assert grown[:len(first)] == first
    assert grown[len(first):] == [("subwords", 0), ("share_embeddings", False), ("fast", False),
                                  ("decay", "inverse_sqrt"), ("cpu_bf16", False),
                                  ("paper_dropout", False), ("batch_tokens", 0),
                                  ("subword_sentences", 1_000_000), ("character_coverage", 1.0),
                                  ("share_vocab", True)]
    presets = first_definition("training_config")
    for name in ("cpu", "base"):
        assert dataclasses.asdict(presets(name)) == {
            k: v for k, v in dataclasses.asdict(tat.training_config(name)).items()
            if k in dict(first)}
    for wrong in ({"N": 0}, {"d_model": 250}, {"dropout": 1.0}, {"bleu_every": -1}):
        messages = []
        for config in (plain, tat.TrainConfig):
            with pytest.raises(ValueError) as err:
                config(**wrong)
            messages.append(str(err.value))
        assert messages[0] == messages[1]


PAIRS = [("Ein Hund läuft.", "A dog runs."), ("Ein Hund schläft.", "A dog sleeps."),
         ("Zwei Hunde laufen im Park.", "Two dogs run in the park.")]


def test_grown_vocabulary_functions_give_chapter_14s_word_vocabularies(tmp_path):
    tokenizers = tat.load_tokenizers()
    config = tat.TrainConfig(min_freq=1, checkpoint_dir=str(tmp_path / "grown"))
    plain_config = first_definition("TrainConfig")(min_freq=1, checkpoint_dir=str(tmp_path))
    plain_vocabs = first_definition("multi30k_vocabularies")(plain_config, tokenizers,
                                                              pairs=PAIRS)
    vocabs = tat.multi30k_vocabularies(config, tokenizers, pairs=PAIRS)
    assert [v.itos for v in vocabs] == [v.itos for v in plain_vocabs]
    for name in tat.VOCAB_FILES:
        assert (tmp_path / name).read_bytes() == (tmp_path / "grown" / name).read_bytes()
    read = first_definition("read_vocabularies")(tmp_path)
    assert [v.itos for v in tat.read_vocabularies(tmp_path)] == [v.itos for v in read]
    examples = tat.encode_examples(PAIRS, *vocabs, tokenizers, max_len=8)
    assert examples == first_definition("encode_examples")(PAIRS, *vocabs, tokenizers, max_len=8)
    assert len(examples) == 2  # the park sentence is longer than max_len
    german = "Zwei Hunde laufen."
    ids = tat.encode_text(german, vocabs[0], tokenizers[0])
    assert ids == first_definition("encode_text")(german, vocabs[0], tokenizers[0])
    assert tat.decode_text(ids, vocabs[0]) == first_definition("decode_text")(ids, vocabs[0])
