#!/usr/bin/env bash
# The end-to-end demo (`make demo`), on this machine, from nothing:
#   built-in corpus (this Python's documentation) -> documents -> WordPiece vocab -> seq-128 shards
#   -> pre-train BERT-tiny with LAMB (configs/pretrain/demo_tiny_128.yaml) -> held-out MLM/NSP accuracy
#   -> fill-mask predictions -> a Hugging Face model directory that `transformers` loads.
# Every stage skips work already done: re-running after an interruption continues (pretrain --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BF="$PY -m bertforge"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)

echo "== 1/4 environment"
$BF info

echo "== 2/4 data: builtin:python-docs -> documents -> vocab -> shards (configs/data/demo.yaml)"
$BF data prepare --config demo

echo "== 3/4 pre-training BERT-tiny, seq 128, LAMB (configs/pretrain/demo_tiny_128.yaml)"
$BF pretrain --config demo_tiny_128 --resume --json-summary runs/demo/pretrain/dllogger.json

echo "== 4/4 evaluation, fill-mask with transformers"
$PY scripts/fill_mask.py runs/demo/pretrain \
    "The [MASK] statement is used to leave a loop." \
    "Use the import statement to load a [MASK]." \
    "This function returns a new [MASK] object." \
    "The default value of the argument is [MASK]."
echo "== demo done in $(( $(date +%s) - START ))s; model: $(cat runs/demo/pretrain/summary.json | $PY -c 'import json,sys; print(json.load(sys.stdin)["model_dir"])')"
