"""A tiny model, optimizer and synthetic sentence pairs, shared by the training tests."""

import torch

from the_annotated_transformer import TrainConfig, make_model


def synthetic_examples(n: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """n pairs of random id lists (ids 4..19, lengths 2..8), the same for the same seed."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(n):
        n_src, n_tgt = (int(x) for x in torch.randint(2, 9, (2,), generator=generator))
        examples.append((torch.randint(4, 20, (n_src,), generator=generator).tolist(),
                         torch.randint(4, 20, (n_tgt,), generator=generator).tolist()))
    return examples


def tiny_setup(device: torch.device | str = "cpu", seed: int = 0):
    """Model, optimizer, schedule and summed loss, with the same initial weights on any device."""
    torch.manual_seed(seed)
    model = make_model(20, 20, N=1, d_model=16, d_ff=32, h=2, dropout=0.0).to(device)
    # Plain SGD: Adam would divide the float noise in gradients that are zero in exact
    # arithmetic (the key projection's bias) by its own tiny running size, and amplify it.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    criterion = torch.nn.NLLLoss(reduction="sum", ignore_index=2)
    return model, optimizer, scheduler, criterion


GERMAN = ["Hund", "Katze", "Mann", "Frau", "Kind", "läuft", "spielt", "sitzt", "rot", "groß",
          "im", "Park", "auf", "der", "Straße", "mit", "einem", "Ball"]
ENGLISH = ["dog", "cat", "man", "woman", "child", "runs", "plays", "sits", "red", "big",
           "in", "park", "on", "the", "street", "with", "a", "ball"]


def synthetic_sentence_pairs(n: int, seed: int) -> list[tuple[str, str]]:
    """n (German, English) sentences of 2..8 words, the English word for word (learnable)."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        length = int(torch.randint(2, 9, (1,), generator=generator))
        words = torch.randint(0, len(GERMAN), (length,), generator=generator).tolist()
        pairs.append((" ".join(GERMAN[w] for w in words) + ".",
                      " ".join(ENGLISH[w] for w in words) + "."))
    return pairs


# The torchrun tests' run: no dropout, so that two processes and one process on the same
# global batches compute the same function; no BLEU, to stay fast.
DIST_CONFIG = TrainConfig(
    N=1, d_model=32, d_ff=64, h=4, dropout=0.0, max_tokens=200, epochs=2, warmup=5,
    bleu_every=0,
)
