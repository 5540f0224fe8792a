"""Train a Transformer translator: the book's best recipe on Multi30k, or on your own parallel text.

    annotated-transformer train                           # cpu_fast_dropout on Multi30k de-en
    annotated-transformer train --langs en fr             # Multi30k's English-French
    annotated-transformer train --train train.en.gz train.fr.gz --valid val.en.gz val.fr.gz
    annotated-transformer train --train a.en b.fr --valid c.en d.fr --set dropout=0.3
    annotated-transformer train --config cpu              # chapter 14's word-level model
    annotated-transformer train --config base --devices 4 # four GPUs of this machine
    annotated-transformer train --config base --batch-tokens 25000   # about the paper's batch
    torchrun --nproc_per_node=8 -m annotated_transformer_cli train --config base
    annotated-transformer train --resume                  # continue after an interruption
    annotated-transformer train --save-every 500          # also a checkpoint every 500 steps
    annotated-transformer train --train a.en b.de --valid c.en d.de --corpus-dir ids/  # millions

--train and --valid each take two files, source then target: plain or gzipped, UTF-8, one
sentence per line, line i of one the translation of line i of the other (the language codes
come from names such as train.en.gz, or from --langs). The joint sentencepiece vocabulary is
built from the --train pair only, from a seeded sample of at most subword_sentences sentences
(a million); --set character_coverage=0.9995 suits languages with thousands of characters, and
--set share_vocab=false gives each language a vocabulary of its own (for different scripts;
share_embeddings is then off). Without --train, --langs picks two of Multi30k's languages
(de, en, fr, cs): load_multi30k reads that pair's train and val files, downloading any that
../shared/data lacks into the cache and checking each against its checksum. --config takes any
preset that training_config knows, and --set FIELD=VALUE changes any TrainConfig field; both
are checked before anything runs. Your own text without --config gets the book's recipe sized
to it by config_for_corpus (book/appendix_data.ipynb, after chapter 18's table of settings by
data size): subwords, model size, dropout, warm-up and epochs follow the number of pairs, and
the run prints each choice and why. --resume takes the settings stored in last.pt, so only
what changes (--epochs) needs giving. With --corpus-dir, the training pairs are encoded once, by
the first process, into flat id arrays in that folder (encode_corpus, book/appendix_data.ipynb),
and every training process maps them and makes its batches from their stored lengths, instead
of each encoding the whole text: the way for corpora of millions of pairs. The command then
reads --train from its files each time it needs it (checks, the vocabulary's sample, the
encoding) instead of holding it in memory. The folder is reused while the text, max_len and the
vocabulary settings are the same.

A run can also stop before its last epoch: after --max-updates optimizer steps, after
--max-minutes of training, or after --patience validations without a new best BLEU (each also
a --set field; 0, the default, is no limit). A stopped run is a finished one (last.pt, best.pt
with validation BLEU, the model folder) that says why it stopped; --resume with a larger
limit continues it.

Under torchrun (which sets RANK and WORLD_SIZE) each process trains directly; otherwise
--devices processes are started here: one per GPU, or CPU processes talking through gloo.
Each epoch's checkpoint goes to --checkpoint-dir/last.pt (rank 0's folder), with the
vocabularies beside it, and best.pt holds the weights with the best validation BLEU; with
--save-every N, last.pt is also written every N optimizer steps, and --resume continues from
inside the epoch. At the end the last keep_epochs epochs are averaged (chapter 16) into a
model folder (--model-dir, by default <checkpoint-dir>/model) that annotated-transformer translate
--checkpoint and annotated-transformer evaluate --model read; its info.json names the languages.

Bad input (a missing file, bad bytes, an empty line, files of unequal length, a vocabulary
larger than the text allows, an unknown --set field or a bad value, a schedule that would not
leave its warm-up, a folder that holds another run, a finished one included unless this is its
own command) ends with one line on stderr and exit status 2, before anything in the checkpoint
folder is written or deleted; with --clean, the bad pairs of --train are dropped and counted
instead (see --clean). Training pairs longer than max_len pieces are left out of training, and
the run says how many.
"""

import argparse
import dataclasses
import difflib
import hashlib
import json
import os
import re
import shlex
import sys
import tempfile
import time
import typing
from pathlib import Path
from typing import Any, NoReturn

import torch.multiprocessing

from annotated_transformer_cli.average import write_average
from annotated_transformer_cli.main import command_name
from annotated_transformer_cli.parallel_text import (
    CLEAN_REASONS,
    MAX_CHARS,
    MAX_RATIO,
    BadInput,
    StreamedPairs,
    cleaning_summary,
    language_of,
    read_clean_parallel,
    read_parallel,
)
from annotated_transformer_cli.translate import OneLineParser
from the_annotated_transformer import (
    CORPUS_HEADER,
    MULTI30K_FOLDERS,
    EncodedCorpus,
    StopRule,
    TrainConfig,
    config_differences,
    config_for_corpus,
    config_for_devices,
    encode_corpus,
    export_for_shipping,
    load_checkpoint,
    load_multi30k,
    model_sha256,
    multi30k_vocabularies,
    prepare_checkpoint_dir,
    read_run_vocabularies,
    stop_reason,
    train_distributed,
    train_worker,
    training_config,
)

DEFAULT_CONFIG = "cpu_fast_dropout"  # the book's best recipe (chapter 21)
# --corpus-dir under torchrun: how often a process other than rank 0 looks for the encoding,
# and how long it waits for rank 0 to begin it (a DIR that this machine does not share)
CORPUS_POLL_S, CORPUS_WAIT_S = 5, 1_800
MULTI30K_LANGUAGES = ("de", "en")
TRUE, FALSE = ("true", "yes", "1", "on"), ("false", "no", "0", "off")


def fail(message: str, status: int = 2) -> NoReturn:
    """One line on stderr and the exit status: 2 for bad input, options or folder (a schedule
    that never leaves its warm-up, a folder holding another run), 1 for data that cannot be
    had (Multi30k neither on disk nor downloadable)."""
    print(f"annotated-transformer train: error: {message}", file=sys.stderr)
    raise SystemExit(status)


def accum_for_batch(batch_tokens: int, max_tokens: int, world_size: int) -> int:
    """The accum_iter that brings processes x accum_iter x max_tokens nearest batch_tokens
    (config_for_devices's rule, which the trainer applies to `batch_tokens`)."""
    if batch_tokens < 1:
        raise ValueError(f"--batch-tokens must be a positive integer, got {batch_tokens}")
    config = TrainConfig(max_tokens=max_tokens, batch_tokens=batch_tokens)
    return config_for_devices(config, world_size).accum_iter


def parse_value(name: str, kind: Any, text: str) -> Any:
    """A --set value as the TrainConfig field's type: int, float, bool, str, or X | None."""
    options = typing.get_args(kind)
    if type(None) in options:  # int | None: "none" is None
        if text.lower() == "none":
            return None
        kind = next(option for option in options if option is not type(None))
    if kind is bool:
        if text.lower() in TRUE + FALSE:
            return text.lower() in TRUE
        raise ValueError(f"{name} is true or false, got {text!r}")
    if kind is int:
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} is a whole number, got {text!r}") from None
    if kind is float:
        try:
            value = float(text)
        except ValueError:
            raise ValueError(f"{name} is a number, got {text!r}") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"{name} is a finite number, got {text!r}")
        return value
    if kind is str:
        return text
    raise ValueError(f"{name} has the type {kind}, which --set cannot read")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """--set FIELD=VALUE options as TrainConfig overrides (and StopRule's fields, which
    prepare takes out); a ValueError names the bad one."""
    types = typing.get_type_hints(TrainConfig) | typing.get_type_hints(StopRule)
    overrides = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"--set {item!r}: expected FIELD=VALUE, e.g. --set dropout=0.3")
        if name not in types:
            close = difflib.get_close_matches(name, types, n=1)
            hint = f"did you mean {close[0]}?" if close else f"the fields: {', '.join(types)}"
            raise ValueError(f"--set {item}: TrainConfig has no field {name!r} ({hint})")
        if name in overrides:
            raise ValueError(f"--set {name} is given twice")
        try:
            overrides[name] = parse_value(name, types[name], text.strip())
        except ValueError as err:
            raise ValueError(f"--set {item}: {err}") from None
    return overrides


FOLDER_OPTIONS = ("--resume to continue it, --overwrite to delete its checkpoints and start "
                  "afresh, or --checkpoint-dir DIR for another folder (make train: RESUME=1, "
                  "OVERWRITE=1, CHECKPOINT_DIR=DIR)")


def user_error(err: Exception) -> str:
    """The one line for a refused run; a folder that holds another run names the options."""
    message = str(err).strip().splitlines()[-1] if str(err).strip() else type(err).__name__
    if isinstance(err, FileExistsError) or "already holds another run's" in message:
        message = f"{message.split(': resume it')[0]}: give {FOLDER_OPTIONS}"
    return message


def pairs_sha256(pairs: dict[str, Any] | None) -> str | None:
    """A fingerprint of the training and validation pairs (None: Multi30k), kept in the model
    folder's info.json so that a finished run is not taken for a run on other text."""
    if pairs is None:
        return None
    streamed = isinstance(pairs["train"], StreamedPairs)  # hashed while it was checked
    digest = pairs["train"].train_digest() if streamed else hashlib.sha256()
    for split in ("val",) if streamed else ("train", "val"):
        for source, target in pairs[split]:
            digest.update(f"{split}\t{source}\t{target}\n".encode())
    return digest.hexdigest()


def stopped_run(checkpoint: dict[str, Any], stop: StopRule | None) -> str | None:
    """Why a run that stopped early (its last.pt says so) would stop again at once under this
    request's stop rule; None when it did not stop, or when this rule lets it go on."""
    if not checkpoint.get("stopped"):
        return None
    return stop_reason(stop, updates=checkpoint["train_state"]["accum_step"],
                       minutes=checkpoint["elapsed_s"] / 60, history=checkpoint["history"])


def finished_run(config: TrainConfig, model_dir: Path, *, world_size: int = 1,
                 data: dict[str, Any] | None = None, stop: StopRule | None = None) -> str | None:
    """What to tell a user whose checkpoint folder holds a run that has done all its epochs,
    or stopped where this request's stop rule would stop it, when this request is that run's;
    a finished run with other settings or other data is refused (status 2), naming the
    options, since nothing would be trained."""
    path = Path(config.checkpoint_dir) / "last.pt"
    if not path.is_file():
        return None
    checkpoint = load_checkpoint(path)
    done = checkpoint["epoch"]
    stopped = stopped_run(checkpoint, stop)
    if done < config.epochs and stopped is None:
        return None
    changes = config_differences(checkpoint.get("config", {}), config, world_size,
                                 len(checkpoint.get("rng", [None])))
    info = model_dir / "info.json"
    stored = json.loads(info.read_text("utf-8")).get("data") if info.is_file() else None
    if data is not None and stored and "sha256" in stored and stored["sha256"] != data["sha256"]:
        changes.append(f"other sentence pairs ({stored.get('train')} in {info})")
    if changes:
        raise BadInput(f"{config.checkpoint_dir} holds a finished run that differs from this "
                       f"request ({'; '.join(changes)}): give {FOLDER_OPTIONS}")
    if stopped is not None:
        where = (f"{path} stopped early ({stopped}), so there is nothing to train. To train "
                 "longer, resume with a larger limit (--resume with --max-updates N, "
                 "--max-minutes M or --patience P; 0 for none)")
    else:
        where = (f"{path} is after epoch {done} of {config.epochs}, so there is nothing to "
                 "train. To train longer, resume with more epochs (--resume --epochs N, or make "
                 "train RESUME=1 EPOCHS=N)")
    return (f"the run in {config.checkpoint_dir} has finished: {where}; to start again, "
            "--overwrite (OVERWRITE=1); to use the model, " + command_name()
            + " translate --checkpoint "
            + shlex.quote(str(model_dir if (model_dir / "model.pt").is_file() else path)))


def restarted_by_torchrun() -> bool:
    """Whether torchrun (--max-restarts) has restarted this process after one of the run's
    processes died: its last.pt is then this run's own, which it continues, as train_worker
    does, instead of refusing the folder as another run's."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def check_folder(config: TrainConfig, args: argparse.Namespace) -> None:
    """Refuse a folder that holds another run, or --resume without a last.pt, before the
    vocabulary is trained; it only looks (a finished run is answered later, once the
    vocabulary's size is known: status 0 for the same request, 2 for another)."""
    last = Path(config.checkpoint_dir) / "last.pt"
    if not args.overwrite and last.is_file():
        checkpoint = load_checkpoint(last)
        if checkpoint["epoch"] >= config.epochs or stopped_run(checkpoint, args.stop):
            return
    try:
        prepare_checkpoint_dir(config.checkpoint_dir, resume=args.resume,
                               overwrite=args.overwrite, restarted=restarted_by_torchrun(),
                               check_only=True)
    except (FileExistsError, FileNotFoundError, ValueError) as err:
        raise BadInput(user_error(err)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line; --help explains every option."""
    parser = OneLineParser(prog="annotated-transformer train", description=__doc__.splitlines()[0])
    parser.add_argument("--config",
                        help="a preset of training_config, trained as it is (default: "
                             "cpu_fast_dropout, the book's best recipe, on Multi30k; for "
                             "--train, that recipe sized to the text by config_for_corpus: "
                             "subwords, model size, dropout, warm-up and epochs follow the "
                             "number of pairs; cpu: chapter 14's word model; base: the paper's "
                             "base model; a wrong name lists them all)")
    parser.add_argument("--train", nargs=2, metavar=("SRC_FILE", "TGT_FILE"),
                        help="your own training text: source and target files, plain or .gz, "
                             "one sentence per line (default: Multi30k German-English)")
    parser.add_argument("--valid", nargs=2, metavar=("SRC_FILE", "TGT_FILE"),
                        help="the validation pair that goes with --train")
    parser.add_argument("--langs", nargs=2, metavar=("SRC", "TGT"),
                        help="language codes of --train's files (default: from their names, "
                             "as in train.en.gz); without --train, the Multi30k pair to train "
                             "on: two of de, en, fr, cs (e.g. --langs en fr), downloaded if "
                             "need be; they go into the model folder's info.json")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="change a TrainConfig field of the preset, e.g. --set dropout=0.3 "
                             "(repeatable; true/false for flags, none for an empty limit)")
    parser.add_argument("--model-dir",
                        help="where the averaged model goes (default: <checkpoint-dir>/model)")
    parser.add_argument("--devices", type=int, default=1,
                        help="processes on this machine: GPUs if there are any, else CPU processes")
    parser.add_argument("--epochs", type=int, help="train until this many epochs are done")
    parser.add_argument("--max-tokens", type=int,
                        help="padded tokens per micro-batch on EACH device, at most (not shared "
                             "among devices; batch_tokens, given or sized, may lower it to fit "
                             "the step); one "
                             "optimizer step sees processes x accum-iter x this")
    parser.add_argument("--accum-iter", type=int,
                        help="micro-batches accumulated per optimizer step on each device")
    parser.add_argument("--batch-tokens", type=int,
                        help="choose --accum-iter so that one optimizer step sees about this "
                             "many padded tokens over all processes (25000: about the paper's "
                             "batch, which counted 25,000 source and 25,000 target tokens "
                             "without padding)")
    parser.add_argument("--bleu-every", type=int,
                        help="greedy validation BLEU every N epochs (0: never); keeps best.pt")
    parser.add_argument("--checkpoint-dir",
                        help="folder for last.pt and the vocabularies (default: the preset's; "
                             "checkpoints/SRC-TGT for --train sized by config_for_corpus; "
                             "checkpoints/SRC-TGT_CONFIG with --config, or for another "
                             "Multi30k pair with --langs)")
    parser.add_argument("--threads", type=int,
                        help="CPU threads per process (default: the cores shared among processes)")
    parser.add_argument("--corpus-dir", metavar="DIR",
                        help="encode the training pairs once into DIR (encode_corpus: flat id "
                             "arrays, reused while they match the text and the vocabulary) and "
                             "let every process map them, instead of each process encoding the "
                             "text itself: for corpora of millions of pairs (--train is then "
                             "read from its files as it is needed, never held in memory, "
                             "--clean keeping 8 bytes a pair while it checks; every "
                             "process still reads the text and trains the vocabulary; on "
                             "several machines DIR must be shared, as --checkpoint-dir must)")
    parser.add_argument("--save-every", type=int, default=0, metavar="N",
                        help="also write last.pt every N optimizer steps inside an epoch, so "
                             "that a resumed run loses at most N steps (default 0: per epoch)")
    parser.add_argument("--clean", action="store_true",
                        help="drop and count the bad pairs of --train instead of stopping at "
                             "the first: a side empty or not UTF-8 (such a line is read as "
                             "nothing, so the pair goes, and the files stay aligned), a side "
                             "longer than --clean-max-chars, a longer side more than "
                             "--clean-max-ratio times the shorter, and exact repeats of an "
                             "earlier pair (the first is kept); one line says how many went "
                             "for each reason and how many are left. Files of unequal length "
                             "stay an error: which lines belong together cannot be known. "
                             "--valid is not cleaned: its BLEU is comparable between runs only "
                             "on the same sentences, so an empty line there stays an error")
    parser.add_argument("--clean-max-chars", type=int, metavar="N",
                        help="--clean drops a pair with a side longer than N characters "
                             f"(default {MAX_CHARS:,}). Characters, not words: text without "
                             "spaces (Chinese, Japanese) has no words to count, and a side "
                             "this long is rather a paragraph than a sentence; pairs over "
                             "max_len pieces are left out of training in any case")
    parser.add_argument("--clean-max-ratio", type=float, metavar="R",
                        help="--clean drops a pair whose longer side has more than R times "
                             f"the characters of the shorter (default {MAX_RATIO:g}; Moses' "
                             "clean-corpus-n.perl uses 9 on words). Scripts that pack more "
                             "into a character (Chinese, Japanese) need a larger R against "
                             "an alphabetic language")
    parser.add_argument("--max-updates", type=int, metavar="N",
                        help="stop after N optimizer updates (the --set field max_updates; "
                             "default 0: no limit); the schedule still follows the epochs")
    parser.add_argument("--max-minutes", type=float, metavar="M",
                        help="stop after M minutes of training, validation not counted (the "
                             "--set field max_minutes; default 0: no limit)")
    parser.add_argument("--patience", type=int, metavar="P",
                        help="stop after P validations in a row without a new best BLEU "
                             "(the --set field patience; default 0: never; needs bleu_every)")
    parser.add_argument("--keep-epochs", type=int,
                        help="keep the last K epochs' weights (epoch_NNN.pt) and average them "
                             "into the model folder (the preset's number by default)")
    start = parser.add_mutually_exclusive_group()
    start.add_argument("--resume", action="store_true",
                       help="continue from the checkpoint folder's last.pt (an error if none)")
    start.add_argument("--overwrite", action="store_true",
                       help="start afresh, deleting the checkpoints already in the folder")
    args = parser.parse_args(argv)
    args.stop, args.cleaning = None, None  # prepare sets them: the stop rule, what --clean did
    if (args.train is None) != (args.valid is None):
        parser.error("--train and --valid go together: give both pairs of files")
    if args.clean and args.train is None:
        parser.error("--clean cleans --train's files: give --train and --valid")
    for name in ("clean_max_chars", "clean_max_ratio"):
        if getattr(args, name) is not None and not args.clean:
            parser.error(f"--{name.replace('_', '-')} goes with --clean")
    if args.clean_max_chars is not None and args.clean_max_chars < 1:
        parser.error(f"--clean-max-chars must be at least 1, got {args.clean_max_chars}")
    if args.clean_max_ratio is not None and not 1 <= args.clean_max_ratio < float("inf"):
        parser.error(f"--clean-max-ratio must be a number of at least 1, got "
                     f"{args.clean_max_ratio:g}")
    if args.langs is not None and args.train is None and (
            args.langs[0] == args.langs[1] or not set(args.langs) <= MULTI30K_FOLDERS.keys()):
        parser.error(f"--langs {' '.join(args.langs)}: without --train, --langs picks a Multi30k "
                     f"pair, two different ones of {', '.join(MULTI30K_FOLDERS)}; for other "
                     "languages give your files with --train and --valid")
    return args


def guess_languages(train: list[str], valid: list[str]) -> tuple[str, str]:
    """The language codes in the training files' names, checked against the validation files'."""
    codes = tuple(language_of(path) for path in train)
    if None in codes or codes[0] == codes[1]:
        raise BadInput(f"cannot tell the two languages from the names {train[0]} and {train[1]}: "
                       "name them with --langs SRC TGT (e.g. --langs en fr)")
    other = tuple(language_of(path) for path in valid)
    if None not in other and other != codes:
        raise BadInput(f"--valid's files are {other[0]}, {other[1]} but --train's are "
                       f"{codes[0]}, {codes[1]}: give both pairs in the same order")
    return codes


def check_vocabulary(config: TrainConfig, train: list[tuple[str, str]], *,
                     adjust: bool = False) -> tuple[int, tuple[Any, Any]]:
    """Train the run's sentencepiece vocabularies as the run would (multi30k_vocabularies), so
    that a size the text cannot give is refused before the run starts; with adjust, the
    nearest size the text allows instead. The size and the vocabularies trained with it,
    which the run then uses rather than training them again. With share_vocab=False the size
    must fit each language's side: sentencepiece names one side's limit at a time, so the
    size it names is tried again until both sides take it."""
    size, tried = config.subwords, []
    while True:
        try:
            vocabs = multi30k_vocabularies(dataclasses.replace(config, subwords=size),
                                           (None, None), pairs=train, save=False)
        except ValueError as err:
            most = re.search(r"value <= (\d+)", str(err))
            least = re.search(r"smaller than required_chars\. \d+ vs (\d+)", str(err))
            limit = int((most or least)[1]) if most or least else None
            # the other side's limit: only separate vocabularies have one, at most two tries
            again = adjust or (not config.share_vocab and most is not None)
            if limit is not None and again and limit not in tried and len(tried) < 3:
                tried.append(size)
                size = limit
                continue
            if most is None and least is None:
                raise BadInput(" ".join(str(err).split())) from None
            size = limit
        else:
            if adjust or size == config.subwords:
                return size, vocabs
        sides = "" if config.share_vocab else " for each language, share_vocab=False"
        if size < config.subwords:
            raise BadInput(
                f"subwords={config.subwords} is a larger vocabulary than the {len(train):,} "
                f"training pairs allow (at most {size} pieces{sides}): lower it, e.g. --set "
                f"subwords={size}") from None
        raise BadInput(
            f"subwords={config.subwords} is a smaller vocabulary than the characters of the "
            f"{len(train):,} training pairs need{sides} (at least {size} pieces): raise it, "
            f"e.g. --set subwords={size}") from None


def stop_options(args: argparse.Namespace, overrides: dict[str, Any]) -> dict[str, Any]:
    """StopRule's fields given now, by their flags or by --set (taken out of overrides, which
    are TrainConfig's), checked: a ValueError names a bad one."""
    names = [field.name for field in dataclasses.fields(StopRule)]
    given = {name: overrides.pop(name) for name in names if name in overrides}
    for name in names:
        if getattr(args, name) is not None:
            if name in given:
                raise ValueError(f"{name} is set twice, by --{name.replace('_', '-')} and by "
                                 "--set: give it once")
            given[name] = getattr(args, name)
    StopRule(**given)
    return given


def resumed_stop(folder: Path) -> dict[str, Any]:
    """The stop rule stored in folder/last.pt ({} when there is none)."""
    try:
        return dict(load_checkpoint(folder / "last.pt").get("stopping") or {})
    except Exception:  # no last.pt: the worker's own checks answer that
        return {}


def read_train(args: argparse.Namespace
               ) -> tuple[list[tuple[str, str]] | StreamedPairs, str | None]:
    """--train's pairs; with --clean, less the bad ones, and the line that counts them (also
    kept in args.cleaning for the model folder's info.json). With --corpus-dir they are
    StreamedPairs, read from the files each time they are needed: the command's memory does
    not grow with the text, except --clean's 8-byte key a kept pair (and a byte a line) while
    it checks."""
    limits = {"max_chars": args.clean_max_chars or MAX_CHARS,
              "max_ratio": args.clean_max_ratio or MAX_RATIO}
    if args.corpus_dir is not None:
        pairs = StreamedPairs(*args.train, clean=limits if args.clean else None)
        if not args.clean:
            return pairs, None
        dropped = pairs.dropped
    elif not args.clean:
        return read_parallel(*args.train), None
    else:
        pairs, dropped = read_clean_parallel(*args.train, **limits)
    args.cleaning = limits | {"dropped": {reason: dropped[reason] for reason in CLEAN_REASONS}}
    return pairs, (f"--clean {args.train[0]} {args.train[1]}: "
                   + cleaning_summary(dropped, len(pairs), **limits))


def resumed_config(folder: Path, overrides: dict[str, Any]) -> TrainConfig | None:
    """The configuration stored in folder/last.pt with the options given now on top (None
    when there is no last.pt): --resume needs no --set repeated."""
    path = folder / "last.pt"
    try:
        stored = load_checkpoint(path)["config"]
    except Exception:  # none, or no settings in it: the worker's own checks answer that
        return None
    names = {field.name for field in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{name: value for name, value in stored.items() if name in names}
                       | overrides)


# what a clause of config_for_corpus's reasons speaks of: a clause about a field given on the
# command line no longer holds, and the note leaves it out
CLAUSE_TOPICS = {"epochs": ("epochs", "times a run"), "bleu_every": ("validation BLEU",),
                 "warmup": ("warm-up", "peak rate"), "lr_factor": ("lr_factor",),
                 "d_model": ("peak rate",)}


def sized_settings(pairs: int, overrides: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """config_for_corpus's fields for a text of this many pairs, less those given on the
    command line, and one line for each group: the values and the reason, less the clauses of
    the reason about a given field (validation BLEU with --set bleu_every=0), and the given
    fields named. A given max_tokens is the micro-batch, and a given accum_iter the step, that
    the sized warm-up is counted in."""
    settings, notes = {}, []
    for fields, why in config_for_corpus(pairs, max_tokens=overrides.get("max_tokens"),
                                         accum_iter=overrides.get("accum_iter")):
        kept = {name: value for name, value in fields.items() if name not in overrides}
        if not kept:
            continue
        settings |= kept
        clauses = re.split(r"; (?![^(]*\))", why)  # at the semicolons outside parentheses
        given = {name for name in overrides if name in fields and name not in kept} | {
            name for name, topic in CLAUSE_TOPICS.items() if name in overrides
            and any(word in clause for word in topic for clause in clauses)}
        held = [clause for clause in clauses if not any(
            word in clause for name in given for word in CLAUSE_TOPICS.get(name, ()))]
        if given:
            sized_with = " ".join(f"{name}={value}" for name, value in fields.items()
                                  if name in given)
            held = held or [f"config_for_corpus's value for {pairs:,} pairs"
                            + (f", with {sized_with}" if sized_with else "")]
            held.append("given: " + " ".join(f"{name}={overrides[name]}" for name in
                                             sorted(given, key=list(overrides).index)))
        notes.append(" ".join(f"{name}={value}" for name, value in kept.items())
                     + ": " + "; ".join(held))
    return settings, notes


def schedule_warning(pairs: int, config: TrainConfig, world_size: int,
                     overrides: dict[str, Any]) -> str | None:
    """One line when the run's warm-up (in optimizer steps) or peak rate is more than 5% from
    what config_for_corpus sized for this many pairs on one device (a step of world_size x
    accum_iter micro-batches walks the warm-up in that many times fewer steps, and peaks
    sqrt of that higher), with the --set warmup that restores both; None when they hold or
    warmup, lr_factor or d_model was given."""
    if overrides.keys() & {"warmup", "lr_factor", "d_model"}:
        return None
    sized = {name: value for group, _ in config_for_corpus(pairs) for name, value in group.items()}
    aim = config_for_devices(training_config(DEFAULT_CONFIG, **sized), 1)
    aim_warmup = max(1, round(aim.warmup / aim.accum_iter))
    k = world_size * config.accum_iter
    warmup = max(1, round(config.warmup / k))
    peak, aim_peak = (config.lr_factor * config.d_model**-0.5 * steps**-0.5
                      for steps in (warmup, aim_warmup))
    if abs(warmup / aim_warmup - 1) <= 0.05 and abs(peak / aim_peak - 1) <= 0.05:
        return None
    return (f"warning: warm-up {warmup:,} optimizer steps and peak rate {peak:.3g}, where the "
            f"sizing aimed at {aim_warmup:,} and {aim_peak:.3g}: each step takes {world_size} "
            f"device(s) x accum_iter {config.accum_iter} micro-batches; --set "
            f"warmup={aim_warmup * k} keeps the aim")


def prepare(args: argparse.Namespace, world_size: int
            ) -> tuple[TrainConfig, tuple[str, str], dict | None, list[str]]:
    """The configuration, the languages, the sentence pairs (None: Multi30k) and the lines
    that say how the settings were chosen, every option and input file checked; bad ones end
    here with one line and exit status 2. Your own text without --config is sized by
    config_for_corpus; --resume takes the settings stored in last.pt."""
    fields = ("epochs", "checkpoint_dir", "max_tokens", "accum_iter", "keep_epochs", "bleu_every")
    overrides = {name: getattr(args, name) for name in fields if getattr(args, name) is not None}
    if args.batch_tokens is not None and args.accum_iter is not None:
        fail("give --batch-tokens or --accum-iter, not both")
    if args.batch_tokens is not None:
        if args.batch_tokens < 1:
            fail(f"--batch-tokens must be a positive integer, got {args.batch_tokens}")
        overrides["batch_tokens"] = args.batch_tokens
    if args.save_every < 0:
        fail(f"save_every must be a whole number of steps >= 0, got {args.save_every}")
    name = args.config or DEFAULT_CONFIG
    try:
        training_config(name)  # the name alone first: its error lists the presets
    except ValueError as err:
        fail(f"--config: {err}")
    try:
        sets = parse_sets(args.set)
        both = sorted(overrides.keys() & sets.keys())
        if both:
            raise ValueError(f"{both[0]} is set twice, by --{both[0].replace('_', '-')} and by "
                             "--set: give it once")
        overrides |= sets
        if overrides.get("share_vocab") is False and "share_embeddings" not in overrides:
            overrides["share_embeddings"] = False  # two vocabularies cannot share one matrix
        stop_given = stop_options(args, overrides)
        config = training_config(name, **overrides)  # a bad value is one line
    except ValueError as err:
        fail(str(err))
    languages, pairs, notes, cleaned = MULTI30K_LANGUAGES, None, [], None
    sized = args.train is not None and args.config is None
    try:
        if args.train is not None:
            train, cleaned = read_train(args)
            pairs = {"train": train, "val": read_parallel(*args.valid)}
            languages = tuple(args.langs) if args.langs else guess_languages(args.train,
                                                                              args.valid)
        elif args.langs is not None and tuple(args.langs) != MULTI30K_LANGUAGES:
            languages = tuple(args.langs)
            pairs = {split: load_multi30k(split, languages=languages) for split in ("train", "val")}
        if pairs is not None and "checkpoint_dir" not in overrides:
            folder = f"checkpoints/{'-'.join(languages)}" + ("" if sized else f"_{name}")
            config = dataclasses.replace(config, checkpoint_dir=folder)
        if restarted_by_torchrun() and (Path(config.checkpoint_dir) / "last.pt").is_file():
            args.resume, args.overwrite = True, False  # the run itself, restarted: continue it
        resumed = resumed_config(Path(config.checkpoint_dir), overrides) if args.resume else None
        if resumed is not None:
            config, sized = resumed, False
            given = sorted(overrides.keys() - {"checkpoint_dir"})
            notes.append(f"settings from {Path(config.checkpoint_dir) / 'last.pt'}, with the "
                         f"options given now ({', '.join(given) or 'none'}) on top")
        rule = (resumed_stop(Path(config.checkpoint_dir)) if args.resume else {}) | stop_given
        args.stop = StopRule(**rule) if any(rule.values()) else None
        if sized:
            train = pairs["train"][: overrides.get("train_limit")]
            settings, notes = sized_settings(len(train), overrides)
            config = training_config(name, **(settings | overrides
                                              | {"checkpoint_dir": config.checkpoint_dir}))
            notes.insert(0, f"sized for {len(train):,} training pairs (config_for_corpus; "
                            "--set changes any setting, --config takes a preset as it is):")
        config = config_for_devices(config, world_size)  # batch_tokens: the same global batch
        warning = schedule_warning(len(train), config, world_size, overrides) if sized else None
        if warning:
            notes.append(warning)
        if not config.subwords and languages != MULTI30K_LANGUAGES:
            raise BadInput(
                f"--config {name} has word vocabularies, which need spaCy's German and "
                f"English tokenizers; for {'-'.join(languages)} choose a subword preset "
                "(cpu_subword, cpu_fast_dropout) or --set subwords=8000")
        check_folder(config, args)
        args.vocabularies = None  # the check's sentencepiece models, which the run then uses
        if config.subwords and not args.resume:
            train = pairs["train"] if pairs else load_multi30k("train")
            adjust = sized and "subwords" not in overrides
            size, vocabs = check_vocabulary(config, train[: config.train_limit], adjust=adjust)
            if size != config.subwords:
                notes.append(f"subwords={size}: the nearest size to {config.subwords} that "
                             f"the {len(train[: config.train_limit]):,} training pairs allow"
                             + ("" if config.share_vocab else " on both sides (share_vocab="
                                "False: a vocabulary of this size for each language)"))
                config = dataclasses.replace(config, subwords=size)
            args.vocabularies = vocabs
    except BadInput as err:
        fail(str(err))
    except (OSError, ValueError) as err:  # Multi30k missing and not downloadable, or corrupt
        fail(str(err), status=1)
    return config, languages, pairs, ([cleaned] if cleaned else []) + notes


def write_model_folder(config: TrainConfig, model_dir: Path, languages: tuple[str, str],
                       data: dict[str, Any] | None) -> str:
    """Average the run's kept epochs (or take last.pt) into a model folder as
    export_for_shipping writes one, with the languages in its info.json; what was averaged.
    A run stopped inside an epoch gives the weights it stopped with: the kept epochs' files
    would leave out the updates after the last whole epoch."""
    folder = Path(config.checkpoint_dir)
    last = folder / "last.pt"
    checkpoint = load_checkpoint(last)
    done, inside = checkpoint["epoch"], checkpoint.get("batch", 0)
    kept = [folder / f"epoch_{epoch:03d}.pt"
            for epoch in range(max(1, done - config.keep_epochs + 1), done + 1)]
    kept = [path for path in kept if config.keep_epochs and path.is_file() and not inside]
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        source = last
        if kept:
            source = Path(tmp) / "average.pt"
            write_average(kept, source)
        export_for_shipping(source, model_dir, run=last)
    info_path = model_dir / "info.json"
    info = json.loads(info_path.read_text("utf-8"))
    info["languages"] = {"src": languages[0], "tgt": languages[1]}
    if data is not None:
        info["data"] = data
    info_path.write_text(json.dumps(info, indent=1, ensure_ascii=False) + "\n", "utf-8")
    epochs = [int(path.stem.removeprefix("epoch_")) for path in kept]
    if len(epochs) > 1:
        return f"epochs {', '.join(map(str, epochs))} averaged"
    if inside:
        return f"the weights it stopped with, {inside} micro-batches into epoch {done + 1}"
    return f"the weights after epoch {epochs[0] if epochs else done}"


def encoded_pairs(config: TrainConfig, pairs: dict[str, Any] | None, folder: Path, *,
                  resume: bool, rank0: bool, vocabs: tuple[Any, Any] | None = None
                  ) -> dict[str, Any]:
    """--corpus-dir: the training pairs as an EncodedCorpus in folder, encoded here once by the
    run's subword models (vocabs, trained by the checks; the checkpoint's when resuming)
    unless folder already holds this text's encoding by them; under torchrun rank 0 encodes
    and the other processes wait for it."""
    if not config.subwords:
        raise BadInput("--corpus-dir stores subword ids: choose a subword preset or "
                       "--set subwords=N")
    if pairs is None:
        pairs = {split: load_multi30k(split) for split in ("train", "val")}
    train = pairs["train"]  # StreamedPairs stay on disk
    train = (train if isinstance(train, StreamedPairs) else list(train))[: config.train_limit]
    vocabulary = {name: value for name, value in dataclasses.asdict(config).items()
                  if "subword" in name or "vocab" in name or "character" in name}
    stamp = {"text_sha256": pairs_sha256({"train": train, "val": []}),
             "max_len": config.max_len, "vocabulary": vocabulary}
    stamp_path, header_path = folder / "text.json", folder / CORPUS_HEADER
    if resume:  # the ids that the checkpoint's embeddings were trained with
        vocabs = read_run_vocabularies(config.checkpoint_dir, config)
    hashes = tuple(model_sha256(vocab) for vocab in vocabs) if vocabs else None

    def ready() -> bool:
        if not (header_path.is_file() and stamp_path.is_file()
                and json.loads(stamp_path.read_text("utf-8")) == stamp):
            return False
        header = json.loads(header_path.read_text("utf-8"))
        return hashes in (None, (header["vocab_src_sha256"], header["vocab_tgt_sha256"]))

    if rank0 and not ready():
        if vocabs is None:
            vocabs = multi30k_vocabularies(config, (None, None), pairs=train, save=False)
        folder.mkdir(parents=True, exist_ok=True)
        header_path.unlink(missing_ok=True)  # no process takes the old arrays for the new text
        stamp_path.write_text(json.dumps(stamp) + "\n", "utf-8")
        print(f"encoding {len(train):,} training pairs into {folder} ...", file=sys.stderr)
        sides = ((train.side(0), train.side(1)) if isinstance(train, StreamedPairs) else
                 ((src for src, _ in train), (tgt for _, tgt in train)))
        encode_corpus(*sides, vocabs[0], folder, max_len=config.max_len, sp_tgt=vocabs[1])
    waited = 0.0
    while not ready():  # another torchrun process: rank 0 is encoding
        try:  # rank 0 writes the stamp before it encodes
            started = json.loads(stamp_path.read_text("utf-8")) == stamp
        except (OSError, ValueError):  # none yet, or being written
            started = False
        if not started and waited >= CORPUS_WAIT_S:  # rank 0 never began here
            raise BadInput(f"--corpus-dir {folder}: rank 0 has not begun encoding there after "
                           f"{waited:.0f} s; on several machines DIR must be on storage that "
                           "every machine sees")
        time.sleep(CORPUS_POLL_S)
        waited += CORPUS_POLL_S
    # the pairs that max_len left out are said by the worker, from the corpus's header
    return {"train": EncodedCorpus(folder), "val": pairs["val"]}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torchrun = "RANK" in os.environ and "WORLD_SIZE" in os.environ  # one of torchrun's processes
    world_size = int(os.environ["WORLD_SIZE"]) if torchrun else args.devices
    rank0 = int(os.environ.get("RANK", 0)) == 0
    config, languages, pairs, notes = prepare(args, world_size)
    model_dir = Path(args.model_dir or Path(config.checkpoint_dir) / "model")
    data = None if pairs is None else {
        "train": args.train or "Multi30k train", "valid": args.valid or "Multi30k val",
        "train_pairs": len(pairs["train"]), "valid_pairs": len(pairs["val"]),
        "sha256": pairs_sha256(pairs)}
    if data is not None and args.cleaning is not None:
        data["clean"] = args.cleaning
    if rank0:
        for line in notes:  # how the settings were chosen, one line each
            print(("" if line.endswith(":") else "  ") + line, file=sys.stderr)
        recipe = args.config or (f"{DEFAULT_CONFIG}, sized" if args.train else DEFAULT_CONFIG)
        print(f"{'-'.join(languages)}, {recipe}: {world_size} process(es) x accum_iter "
              f"{config.accum_iter} x max_tokens {config.max_tokens} = "
              f"{world_size * config.accum_iter * config.max_tokens:,} padded tokens per "
              "optimizer step", file=sys.stderr)
    options = {"resume": args.resume, "overwrite": args.overwrite, "threads": args.threads,
               "save_every": args.save_every, "pairs": pairs, "stop": args.stop,
               "vocabularies": args.vocabularies}
    try:
        message = None if args.overwrite else finished_run(
            config, model_dir, world_size=world_size, data=data, stop=args.stop)
        if message is None and args.corpus_dir is not None:  # encoded once, mapped by all
            options["pairs"] = encoded_pairs(config, pairs, Path(args.corpus_dir),
                                             resume=args.resume, rank0=rank0,
                                             vocabs=options.get("vocabularies"))
        if message is None and torchrun:
            train_worker(config=config, **options)
        elif message is None:
            train_distributed(config, args.devices, **options)
        if message is not None:
            if rank0:
                print(f"annotated-transformer train: {message}", file=sys.stderr)
            return
        if rank0:
            what = write_model_folder(config, model_dir, languages, data)
            folder = shlex.quote(str(model_dir))
            print(f"model folder {model_dir} ({what}); translate with: {command_name()} "
                  f"translate --checkpoint {folder} < sentences.{languages[0]}; score with: "
                  f"{command_name()} evaluate --model {folder} --test SRC_FILE "
                  "REF_FILE", file=sys.stderr)
    except (FileExistsError, FileNotFoundError, ValueError) as err:  # a wrong folder or config
        fail(user_error(err))
    except torch.multiprocessing.ProcessRaisedException as err:  # the same, in a spawned worker
        last = str(err).strip().splitlines()[-1]
        kind, _, message = last.partition(": ")
        if kind not in ("FileExistsError", "FileNotFoundError", "ValueError"):
            raise
        fail(user_error(ValueError(message)))


if __name__ == "__main__":
    main()
