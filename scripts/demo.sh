#!/usr/bin/env bash
# The end-to-end demo (`make demo`). Runs every stage that has landed, on this machine, from nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
BF=.venv/bin/bertforge
OUT=${DEMO_DIR:-runs/demo}
mkdir -p "$OUT"
$BF info
