#!/usr/bin/env bash
# The first layer alone is enough for `make translate`: in a fresh venv (in a temporary folder,
# reusing pip's cache of wheels, not byte-compiling) with no npm, node or Jupyter Book on PATH,
# translate three sentences, then check that the venv holds none of the later layers' tools.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1) a PATH with every tool of the current one except npm, node and Jupyter's commands
mkdir "$tmp/bin"
IFS=: read -ra dirs <<< "$PATH"
for dir in "${dirs[@]}"; do
    for tool in "$dir"/*; do
        name=$(basename "$tool")
        case "$name" in npm | npx | node | nodejs | jupyter | jupyter-book | jb) continue ;; esac
        [ -x "$tool" ] && [ ! -e "$tmp/bin/$name" ] && ln -s "$tool" "$tmp/bin/$name"
    done
done

# 2) make translate with a venv of its own
printf 'Zwei Hunde spielen im Schnee.\nEin Mann fährt Fahrrad.\nEine Frau liest ein Buch.\n' \
    > "$tmp/de.txt"
PATH="$tmp/bin" PIP_NO_COMPILE=1 make -s --no-print-directory translate VENV="$tmp/venv" \
    < "$tmp/de.txt" > "$tmp/en.txt" 2> "$tmp/err.txt" || {
    cat "$tmp/err.txt" >&2
    echo "check_cli_layer.sh: make translate failed with only the first layer" >&2
    exit 1
}

# 3) three English lines, and no tool of the later layers in the venv
cat "$tmp/en.txt"
lines=$(grep -c . "$tmp/en.txt" || true)
[ "$lines" -eq 3 ] && [ "$(wc -l < "$tmp/en.txt")" -eq 3 ] || {
    echo "check_cli_layer.sh: expected 3 translated lines, got $lines" >&2
    exit 1
}
"$tmp/venv/bin/python" - <<'PY'
import importlib.util
import sys

later = [m for m in ("jupyter_book", "jupytext", "pytest", "nbval", "playwright", "ruff")
         if importlib.util.find_spec(m) is not None]
if later:
    sys.exit(f"check_cli_layer.sh: the first layer installed {', '.join(later)}")
PY
echo "check_cli_layer.sh: the first layer alone translated 3 sentences"
