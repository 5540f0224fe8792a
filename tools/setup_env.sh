#!/usr/bin/env bash
# Create .venv with everything the book and its tests need; safe to run again.
# torch: keep a torch that is already there (in the venv, or in the Python that makes it);
# otherwise prefer the CPU build 2.13.0 that this kind of machine has on disk, and fall back
# to whatever fits requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
    # A machine that already has torch (Colab, a GPU box) keeps it: the venv sees it.
    if "$PYTHON" -c "import torch" 2>/dev/null; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
py="$VENV/bin/python"
"$py" -m pip install -q --upgrade pip

if ! "$py" -c "import torch" 2>/dev/null; then
    "$py" -m pip install -q "torch==2.13.0" || echo "torch 2.13.0 not available here; pip picks one" >&2
fi
"$py" -m pip install -q -r requirements.txt
"$py" -m pip install -q --no-deps -e .
"$py" tools/vendor_js.py
touch "$VENV/.installed"
echo "environment ready: $VENV (torch $("$py" -c 'import torch; print(torch.__version__)'))"
