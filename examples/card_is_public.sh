#!/usr/bin/env bash
# The demos' check of a model card before it is published: it names none of the given local
# paths or folder names, no machine path at all, and serves REPO_ID.
#   examples/card_is_public.sh CARD REPO_ID LOCAL...
set -euo pipefail
CARD=$1 REPO_ID=$2
shift 2
for local in "$@"; do
  if grep -qF -- "$local" "$CARD"; then
    echo "error: $CARD names the local path '$local'"; exit 1
  fi
done
NO_PATHS='import sys; from eaglequant.results.provenance import machine_paths as m; p = m(open(sys.argv[1]).read()); sys.exit(f"error: {sys.argv[1]} names the machine path {p[0]}" if p else 0)'
.venv/bin/python -c "$NO_PATHS" "$CARD"
grep -F '"model": "'"$REPO_ID"'"' "$CARD" >/dev/null \
  || { echo "error: $CARD does not serve $REPO_ID"; exit 1; }
