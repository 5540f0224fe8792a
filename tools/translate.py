"""Translate German to English: one sentence per line on stdin, one line per line on stdout.

    echo "Zwei Hunde spielen im Schnee." | python tools/translate.py
    python tools/translate.py --checkpoint checkpoints/multi30k_cpu/last.pt < de.txt > en.txt
    python tools/translate.py --beam 1 < de.txt > en.txt   # greedy decoding

Only translations go to stdout, exactly one line for each input line (an empty line stays
empty); messages go to stderr. By default the book's shipped model (book/models/multi30k_cpu)
translates; --checkpoint takes a folder from export_for_shipping or a model.pt / last.pt file
with vocab_de.json and vocab_en.json beside it. Decoding is the paper's beam search (beam 4,
length penalty alpha 0.6; chapter 15); --beam 1 gives greedy decoding.
"""

import argparse
import contextlib
import io
import sys

from the_annotated_transformer import beam_translate, load_tokenizers, load_trained_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a shipped model folder, or a model.pt / last.pt")
    parser.add_argument("--batch-size", type=int, default=32, help="sentences decoded together")
    parser.add_argument("--beam", type=int, default=4, help="beam size (1: greedy decoding)")
    parser.add_argument("--alpha", type=float, default=0.6,
                        help="length penalty exponent (0: none)")
    args = parser.parse_args()
    lines = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8").read().split("\n")
    if lines[-1] == "":  # the newline that ends the last line
        lines.pop()
    lines = [line.rstrip("\r") for line in lines]
    with contextlib.redirect_stdout(sys.stderr):  # anything printed while loading (or training)
        model, vocab_src, vocab_tgt, _ = load_trained_model(args.checkpoint)
    print(f"translating {len(lines)} lines", file=sys.stderr)
    outputs = beam_translate(model, lines, vocab_src, vocab_tgt, load_tokenizers()[0],
                             beam_size=args.beam, alpha=args.alpha, batch_size=args.batch_size)
    out = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")
    for text in outputs:
        out.write(text.replace("\n", " ") + "\n")
    out.flush()


if __name__ == "__main__":
    main()
