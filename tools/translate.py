"""Translate German to English: one sentence per line on stdin, one line per line on stdout.

    echo "Zwei Hunde spielen im Schnee." | python tools/translate.py
    python tools/translate.py --checkpoint checkpoints/multi30k_cpu/last.pt < de.txt > en.txt

Only translations go to stdout, exactly one line for each input line (an empty line stays
empty); messages go to stderr. By default the book's shipped model (book/models/multi30k_cpu)
translates; --checkpoint takes a folder from export_for_shipping or a model.pt / last.pt file
with vocab_de.json and vocab_en.json beside it.
"""

import argparse
import contextlib
import io
import sys

from the_annotated_transformer import load_tokenizers, load_trained_model, translate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a shipped model folder, or a model.pt / last.pt")
    parser.add_argument("--batch-size", type=int, default=64, help="sentences decoded together")
    args = parser.parse_args()
    lines = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8").read().split("\n")
    if lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    with contextlib.redirect_stdout(sys.stderr):  # anything printed while loading (or training)
        model, vocab_src, vocab_tgt, _ = load_trained_model(args.checkpoint)
    print(f"translating {len(lines)} lines", file=sys.stderr)
    outputs = translate(model, lines, vocab_src, vocab_tgt, load_tokenizers()[0],
                        batch_size=args.batch_size)
    out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    for text in outputs:
        out.write(text.replace("\n", " ") + "\n")
    out.flush()


if __name__ == "__main__":
    main()
