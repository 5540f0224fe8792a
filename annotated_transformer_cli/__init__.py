"""The book's reader-facing command, `annotated-transformer`: train, translate, evaluate, average.

Each subcommand is one module here with its own `main(argv)`; `main.py` dispatches to them.
Maintainers' scripts (benchmarks, seed sweeps, the book's build) stay in tools/.
"""
