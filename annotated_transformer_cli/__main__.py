"""`python -m annotated_transformer_cli train ...`, the same as `annotated-transformer train ...`
(torchrun starts it this way: `torchrun --nproc_per_node=8 -m annotated_transformer_cli train`)."""

from annotated_transformer_cli.main import main

main()
