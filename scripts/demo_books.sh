#!/usr/bin/env bash
# The books + Wikipedia demo (`make demo-books`): a small encoder pre-trained on ../shared/corpus/'s sample of
# English books and Wikipedia for a laptop's quarter of an hour, then asked to fill in masked words:
#   the corpus sample (xz) -> documents -> WordPiece vocab (configs/data/books_wiki.yaml) -> shards with a
#   held-out split -> pre-training -> held-out MLM accuracy -> fill-mask with transformers.
# MODEL picks the recipe:
#   modern (default): ModernBERT-tiny (configs/pretrain/modernbert_tiny_1024.yaml: 4 layers x 128, MLM only,
#     30% masking, AdamW + WSD) on MLM-only 1,024-token rows; STEPS updates of 8 rows (default 560: about 11
#     minutes of training on a 2-core Zen 4 at ~0.86 updates/s).
#   bert: BERT-tiny with the demo's LAMB recipe (configs/pretrain/demo_tiny_128.yaml: MLM + NSP, seq 128);
#     STEPS updates of 32 (default 2400: about 13 minutes at ~3 updates/s).
# STEPS trades time for quality. Every stage skips work already done: re-running after an interruption
# continues (pretrain --resume).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
BF="$PY -m bertforge"
MODEL=${MODEL:-modern}
D=runs/books_wiki
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
START=$(date +%s)

echo "== 1/3 data: books + Wikipedia sample -> documents -> vocab -> shards (configs/data/books_wiki.yaml)"
case "$MODEL" in
modern)
    STEPS=${STEPS:-560}
    OUT=$D/pretrain_modern_tiny_$STEPS
    $BF data prepare --config books_wiki --set shards.objective=mlm --set shards.seq_len=1024 \
        --set shards.dupe_factor=1 --set shards.num_shards=16 --set shards_subdir=shards_mlm_1024 \
        --set eval_subdir=eval_mlm_1024
    echo "== 2/3 pre-training ModernBERT-tiny, 1,024-token rows, $STEPS updates (modernbert_tiny_1024.yaml)"
    $BF pretrain --config modernbert_tiny_1024 --resume \
        --set data.input_dir=$D/shards_mlm_1024 --set data.eval_dir=$D/eval_mlm_1024 --set data.vocab=$D/vocab \
        --set data.eval_mlm_probability=0.15 --set train.output_dir="$OUT" --set train.max_steps="$STEPS" \
        --set train.save_every="$STEPS" --set train.eval_every=$(( STEPS >= 4 ? STEPS / 4 : 1 )) --set train.log_every=$(( STEPS >= 20 ? STEPS / 20 : 1 ))
    ;;
bert)
    STEPS=${STEPS:-2400}
    OUT=$D/pretrain_tiny_$STEPS
    $BF data prepare --config books_wiki
    echo "== 2/3 pre-training BERT-tiny, seq 128, LAMB, $STEPS updates (configs/pretrain/demo_tiny_128.yaml)"
    $BF pretrain --config demo_tiny_128 --resume \
        --set data.input_dir=$D/shards_phase1 --set data.eval_dir=$D/eval_phase1 --set data.vocab=$D/vocab \
        --set train.output_dir="$OUT" --set train.max_steps="$STEPS" \
        --set train.save_every=400 --set train.eval_every=400 --set train.log_every=100
    ;;
*)
    echo "MODEL=$MODEL: choose modern or bert" >&2
    exit 2
    ;;
esac

echo "== 3/3 fill-mask with transformers"
$PY scripts/fill_mask.py "$OUT" --top-k 5 \
    "The capital of France is [MASK]." \
    "She opened the [MASK] and walked into the room." \
    "He was born in London and [MASK] in Paris." \
    "The war ended in [MASK]." \
    "It was a long [MASK] and the children were tired." \
    "The river flows into the [MASK] sea."
echo "== demo done in $(( $(date +%s) - START ))s; model: $($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["model_dir"])' "$OUT/summary.json")"
