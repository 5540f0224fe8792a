# %% [markdown]
# # Conclusion
#
# The paper {cite}`vaswani2017attention` ends (§7) with two claims and a plan: a model built on
# attention alone, with no recurrence and no convolution, translates better than the models of its
# time and trains in a fraction of their time; the authors meant to apply it to other tasks and
# modalities, to study restricted attention for long inputs, and to make generation less
# sequential. Its abstract and §6.3 add a third claim, that it generalizes beyond translation, as
# constituency parsing showed. This chapter looks back over what the book built, sets what we
# measured beside what the paper reported, and says what a CPU could not reproduce.

# %% tags=["setup", "hide-cell"]
# Setup (hidden in the book): in Colab, install the book's package; everywhere, import what
# earlier chapters built.
import sys

if "google.colab" in sys.modules:
    import subprocess

    REPO = "https://github.com/annotated-transformer/annotated-transformer-book"
    REF = "v0.2.0"  # the tag or commit this notebook comes from
    package = f"the-annotated-transformer[book] @ git+{REPO}@{REF}"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", package], check=True)

from the_annotated_transformer import (
    enable_book_charts,
    fetch_shipped_model,
    make_model,
    read_vocabularies,
)

enable_book_charts()

# %% [markdown]
# ## What the book built
#
# **Part I** built the model of §3 piece by piece, counted its parameters, and compared
# self-attention with recurrence and convolution as §4 does. **Part II** trained it (§5):
# batches and masks, the training loop, batching by tokens, the warm-up schedule, dropout
# and label smoothing, and two synthetic tasks on which the model can be watched learning.
# **Part III** applied it to German-to-English translation with the beam search and checkpoint
# averaging of §6.1 and subword vocabularies, ran a miniature of Table 3 (§6.2) and
# constituency parsing (§6.3), then made the model fast and its training program run on many
# processes. **Part IV** went beyond the paper: attention as message passing on a graph, the
# attention maps of a trained model, a decoder-only language model with the changes that became
# standard after 2017, and the Universal Transformer.
#
# All of it is one module, `the_annotated_transformer.py`, assembled from the chapters' code and
# checked by the tests, so the code that the later chapters run is the code that the earlier
# chapters explained.
#
# ## Measured here, reported there
#
# The parameter counts are computed again below and the BLEU scores read from the result files
# stored beside the shipped models; the other entries come from the chapter in the last
# column. No row compares like with like, except the parameter counts: the paper trained on WMT 2014's 4.5 million sentence pairs on eight GPUs, we on
# Multi30k's 29,000 captions on CPUs ({doc}`departures` tables every such difference).

# %%
import json

import torch

vocab = 37_000  # the paper's shared English-German BPE vocabulary (§5.1)
counts = {}
for name, config in {"base": {}, "big": {"d_model": 1024, "d_ff": 4096, "h": 16}}.items():
    with torch.device("meta"):  # shapes only: no memory, no time
        model = make_model(vocab, vocab, share_embeddings=True, **config)
    counts[name] = sum(p.numel() for p in model.parameters())
shipped = fetch_shipped_model()  # chapter 14's model: its vocabularies and its configuration
vocab_de, vocab_en = read_vocabularies(shipped)
config = json.loads((shipped / "info.json").read_text())["config"]
with torch.device("meta"):
    ours = make_model(len(vocab_de), len(vocab_en),
                      **{key: config[key] for key in ("N", "d_model", "d_ff", "h")})
counts["ours"] = sum(p.numel() for p in ours.parameters())
print({name: f"{n / 1e6:.1f}M" for name, n in counts.items()})
assert abs(counts["base"] - 65e6) < 3e6 and abs(counts["big"] - 213e6) < 3e6

# %%
import pandas as pd

test = "test_2016_flickr"
subword_dir = fetch_shipped_model(name="multi30k_cpu_subword")  # chapter 18
recipe = json.loads((subword_dir / "results.json").read_text())
bleu = {(e["model"], e["decoding"], e["split"]): e["bleu"] for e in recipe["results"]}
half_hour = fetch_shipped_model(name="multi30k_cpu_fast_dropout") / "results.json"  # ch. 21
fast = {(e["decoding"], e["split"]): e["bleu"]
        for e in json.loads(half_hour.read_text())["results"]}
averages = json.loads((shipped / "averaging.json").read_text())["results"]
word_average = {r["name"]: r["scores"] for r in averages}["average of epochs 13-17"][test]["bleu"]
rows = [
    ("parameters, base model", "65M", f"{counts['base'] / 1e6:.1f}M (computed above)", "5"),
    ("parameters, big model", "213M", f"{counts['big'] / 1e6:.1f}M (computed above)", "5"),
    ("translation model", "base: N=6, d_model=512",
     f"N={config['N']}, d_model={config['d_model']}, {counts['ours'] / 1e6:.1f}M parameters",
     "14"),
    ("BLEU, greedy", "not reported",
     f"{bleu['words', 'greedy', test]:.2f} (Multi30k test 2016, DE→EN, words)", "14"),
    ("BLEU, beam 4, α = 0.6", "27.3 base, 28.4 big (WMT14 EN→DE, averaged)",
     f"{bleu['words', 'beam4', test]:.2f} (Multi30k test 2016, words)", "15"),
    ("BLEU, checkpoint average", "base: last 5, big: last 20 (no separate number)",
     f"{word_average:.2f} (words: last 5 of 17 epochs, greedy, <unk> allowed); "
     f"{bleu['subwords-average', 'greedy', test]:.2f} (subwords: last 5 of 12, greedy)", "16, 18"),
    ("BLEU, the paper's recipe", "shared BPE, tied embeddings, beam 4",
     f"{bleu['subwords-last', 'beam4', test]:.2f} (subwords, tied, beam 4; chosen on val)",
     "18"),
    ("BLEU, that recipe in half an hour of training", "not reported",
     f"{fast['beam4', test]:.2f} (subwords, fast path, 11 epochs on an Intel Xeon, last 2 "
     "averaged, beam 4; one seed; on validation, level with the row above: chapter 21)",
     "21, 18"),
    ("Table 3, one head", "0.9 BLEU worse than 8", "worse than several (sort task)", "19"),
    ("Table 3, other rows", "see the paper", "3 findings reproduced, 2 contradicted", "19"),
    ("parsing, labeled F1", "91.3 (WSJ only, 40k sentences)",
     "42.0 dev, 46.5 test (beam 4, the run on chapter 20's page); dev mean 40.3 over 6 runs "
     "(1,401 short sentences, gold tags)", "20"),
]
pd.set_option("display.max_colwidth", None)  # show each entry whole
pd.DataFrame(rows, columns=["what", "paper", "this book", "chapter"]).set_index("what")

# %% [markdown]
# Three things stand out. The parameter counts come close to Table 3's, ours below for the base
# model and above for the big one, so no single vocabulary size explains both gaps (chapter 5).
# The BLEU scores are higher than the paper's, which says nothing about the models: Multi30k's
# captions are short, simple and repetitive, and we translate German into English, where the paper
# translated English into German and French. What carries over, mostly, is the direction of the
# paper's choices, tested in chapter 18 with sacreBLEU's paired bootstrap: the shared subword
# vocabulary beat words by margins the bootstrap finds real, tying made the model smaller rather
# than better, and beam search's gain was real on the test set for the one subword model tested,
# not for the word model. Averaging the last checkpoints helped in every run of chapter 16's sort
# task, but on Multi30k it helped some runs and decodings and hurt others. The miniature Table 3
# and the miniature parser test the machinery on small problems and can agree with the paper in
# direction, never in size.
#
# ## What a CPU could not reproduce
#
# - **The paper's translation numbers.** The base model needs WMT 2014's 4.5 million sentence
#   pairs and about 12 hours on eight P100 GPUs, the big one 3.5 days; one CPU core trains our
#   small Multi30k model in about an hour (chapter 14). The code supports CUDA and several devices
#   (chapter 22 tests its distributed training with CPU processes), but every model in the book
#   was trained on a CPU; a GPU ran only a short check on random data (chapter 22) and a benchmark
#   (appendix {doc}`appendix_performance`).
# - **The big model and English-French.** The same code builds them; training them is out of
#   reach for the same reason, 36 million English-French sentence pairs.
# - **Table 3 on translation.** Each row of Table 3 is a full training run on WMT; chapter 19
#   ran the rows on sorting instead, and some findings do not transfer (dropout and learned
#   positions behaved differently on the small task).
# - **Parsing at the paper's scale.** The full Wall Street Journal treebank is licensed, and
#   the semi-supervised 92.7 needs 17 million automatically parsed sentences. Chapter 20 uses
#   NLTK's free sample of it, short sentences and gold part-of-speech tags as input.
#
# ## Where to go next
#
# The paper's plan came true within a few years; chapter 25 traces the shapes and layers that
# followed. Beyond them: relative position representations {cite}`shaw2018self`; faster training
# with larger batches and lower precision {cite}`ott2018scaling`; a self-attentive encoder with a
# chart decoder that soon passed the sequence-to-sequence parsers
# {cite}`kitaev2018constituency`; the authors' own library, Tensor2Tensor
# {cite}`vaswani2018tensor2tensor`, which holds the settings the paper used; and the original
# Annotated Transformer {cite}`rush2018annotated`, the shorter notebook this book grew from.
