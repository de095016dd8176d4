#!/usr/bin/env bash
# The books + Wikipedia demo (`make demo-books`): a BERT-tiny pre-trained on ../shared/corpus/'s sample of English
# books and Wikipedia for a laptop's quarter of an hour, then asked to fill in masked words:
#   the corpus sample (xz) -> documents -> WordPiece vocab -> seq-128 shards with a held-out split
#   (configs/data/books_wiki.yaml) -> BERT-tiny, the demo's LAMB recipe (configs/pretrain/demo_tiny_128.yaml),
#   STEPS updates of 32 sequences -> held-out MLM/NSP accuracy -> fill-mask with transformers.
# STEPS (default 2400: about 13 minutes of training on a 2-core Zen 4 at ~3 updates/s) trades time for quality.
# Every stage skips work already done: re-running after an interruption continues (pretrain --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BF="$PY -m bertforge"
STEPS=${STEPS:-2400}
OUT=runs/books_wiki/pretrain_tiny_$STEPS
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)

echo "== 1/3 data: books + Wikipedia sample -> documents -> vocab -> shards (configs/data/books_wiki.yaml)"
$BF data prepare --config books_wiki

echo "== 2/3 pre-training BERT-tiny, seq 128, LAMB, $STEPS updates (configs/pretrain/demo_tiny_128.yaml)"
$BF pretrain --config demo_tiny_128 --resume \
    --set data.input_dir=runs/books_wiki/shards_phase1 --set data.eval_dir=runs/books_wiki/eval_phase1 \
    --set data.vocab=runs/books_wiki/vocab --set train.output_dir="$OUT" --set train.max_steps="$STEPS" \
    --set train.save_every=400 --set train.eval_every=400 --set train.log_every=100

echo "== 3/3 fill-mask with transformers"
$PY scripts/fill_mask.py "$OUT" --top-k 5 \
    "The capital of France is [MASK]." \
    "She opened the [MASK] and walked into the room." \
    "He was born in London and [MASK] in Paris." \
    "The war ended in [MASK]." \
    "It was a long [MASK] and the children were tired." \
    "The river flows into the [MASK] sea."
echo "== demo done in $(( $(date +%s) - START ))s; model: $($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_dir"])' "$OUT/summary.json")"
