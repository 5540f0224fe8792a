# The Annotated Transformer, as a book.
#   make book    build the HTML book into _build/html (the default)
#   make test    run every test: unit tests, every chapter (nbval), sync check, build, browser,
#                a chapter in JupyterLab
#   make sync    regenerate the_annotated_transformer.py and the chapters' text twins
#   make lint    ruff
#   make clean   remove what the build made (keeps .venv; `make distclean` removes it too)
#   make train   train the Multi30k model: CONFIG=cpu|base DEVICES=1 EPOCHS= RESUME=1
#   make translate   German on stdin, English on stdout (CHECKPOINT= to pick another model)
# Each target first sets up .venv (tools/setup_env.sh), so any of them works on a fresh clone.

.DEFAULT_GOAL := book
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Chapters run with 2 threads everywhere (stored outputs, nbval): the same numbers each run,
# and no thread oversubscription on a 2-core machine.
NBVAL := OMP_NUM_THREADS=2 $(PY) -m pytest --nbval --nbval-current-env \
	--nbval-sanitize-with tests/sanitize.cfg

CONFIG ?= cpu
DEVICES ?= 1

.PHONY: book test sync lint clean distclean setup train translate

# Set-up messages go to stderr, so that `make translate` writes nothing but translations.
$(STAMP): requirements.txt pyproject.toml tools/setup_env.sh tools/vendor_js.py
	@bash tools/setup_env.sh 1>&2

setup: $(STAMP)

book: $(STAMP)
	$(PY) tools/build_book.py

test: lint
	$(PY) -m pytest tests --ignore=tests/test_browser.py --ignore=tests/test_jupyterlab.py
	$(NBVAL) book
	$(PY) tools/build_book.py
	bash tools/ensure_chromium.sh
	$(PY) -m pytest tests/test_browser.py
	OMP_NUM_THREADS=1 $(PY) -m pytest tests/test_jupyterlab.py

sync: $(STAMP)
	$(PY) tools/sync.py

train: $(STAMP)
	$(PY) tools/train.py --config $(CONFIG) --devices $(DEVICES) \
		$(if $(EPOCHS),--epochs $(EPOCHS)) $(if $(RESUME),--resume)

translate: $(STAMP)
	@$(PY) tools/translate.py $(if $(CHECKPOINT),--checkpoint $(CHECKPOINT))

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf _build .pytest_cache .ruff_cache

distclean: clean
	rm -rf $(VENV) _vendor
