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
$PY - <<'PYEOF'
import json
from pathlib import Path

import transformers

transformers.logging.set_verbosity_error()  # the NSP head and pooler are not part of a masked-LM model: expected
summary = json.loads(Path("runs/demo/pretrain/summary.json").read_text())
model_dir = summary["model_dir"]
vocab = sum(1 for _ in open(Path(model_dir) / "vocab.txt", encoding="utf-8"))
print(f"held-out MLM accuracy {summary['final_eval_mlm_acc']:.3f} (chance {1 / vocab:.5f} with {vocab} tokens), "
      f"NSP accuracy {summary['final_eval_nsp_acc']:.3f}, after {summary['step']} steps "
      f"({summary['sequences']:,} sequences, {summary['train_time_s']:.0f}s of training)")
model = transformers.AutoModelForMaskedLM.from_pretrained(model_dir)
tok = transformers.AutoTokenizer.from_pretrained(model_dir)
print(f"transformers {transformers.__version__} loaded {model_dir}: {type(model).__name__}, "
      f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, tokenizer {type(tok).__name__}")
fill = transformers.pipeline("fill-mask", model=model, tokenizer=tok, top_k=3)
for text in ["The [MASK] statement is used to leave a loop.",
             "Use the import statement to load a [MASK].",
             "This function returns a new [MASK] object.",
             "The default value of the argument is [MASK]."]:
    guesses = ", ".join(f"{p['token_str']} ({p['score']:.3f})" for p in fill(text))
    print(f"  {text:<48} -> {guesses}")
PYEOF
echo "== demo done in $(( $(date +%s) - START ))s; model: $(cat runs/demo/pretrain/summary.json | $PY -c 'import json,sys; print(json.load(sys.stdin)["model_dir"])')"
