# The Annotated Transformer, as a book.
#   make book    build the HTML book into _build/html (the default)
#   make test    run every test: unit tests, every chapter (nbval), sync check, build, browser
#   make sync    regenerate the_annotated_transformer.py and the chapters' text twins
#   make lint    ruff
#   make clean   remove what the build made (keeps .venv; `make distclean` removes it too)
# Each target first sets up .venv (tools/setup_env.sh), so any of them works on a fresh clone.

.DEFAULT_GOAL := book
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# Chapters run with 2 threads everywhere (stored outputs, nbval): the same numbers each run,
# and no thread oversubscription on a 2-core machine.
NBVAL := OMP_NUM_THREADS=2 $(PY) -m pytest --nbval --nbval-current-env \
	--nbval-sanitize-with tests/sanitize.cfg -p no:randomly

.PHONY: book test unit notebooks browser sync lint clean distclean setup

$(STAMP): requirements.txt pyproject.toml tools/setup_env.sh tools/vendor_js.py
	bash tools/setup_env.sh

setup: $(STAMP)

book: $(STAMP)
	$(PY) tools/build_book.py

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m pytest tests --ignore=tests/test_browser.py
	$(NBVAL) book
	$(PY) tools/build_book.py
	bash tools/ensure_chromium.sh
	$(PY) -m pytest tests/test_browser.py

sync: $(STAMP)
	$(PY) tools/sync.py

lint: $(STAMP)
	$(PY) -m ruff check .

clean:
	rm -rf _build .pytest_cache .ruff_cache

distclean: clean
	rm -rf $(VENV) _vendor
