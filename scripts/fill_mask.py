"""Fill-mask predictions of a `bertforge pretrain` run's final model, loaded by `transformers` as any Hugging Face
model directory is (the demos' last step):

    python scripts/fill_mask.py RUN_DIR [--top-k K] "a sentence with [MASK] ." ...

prints the run's held-out accuracy (summary.json), the model as transformers sees it, then each sentence's top-K
tokens with their probabilities."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

# transformers imports torchao where it is installed; on a CPU-only torch its optional CUDA kernels fail to load,
# and it and torch log that at import: noise in the demo's last step, nothing this script uses
for name in ("torchao", "torch.utils._pytree"):
    logging.getLogger(name).setLevel(logging.ERROR)

import transformers  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", help="a pretrain train.output_dir (its summary.json names the final model)")
    ap.add_argument("sentences", nargs="+", help="sentences with one [MASK] each")
    ap.add_argument("--top-k", type=int, default=3)
    args = ap.parse_args()
    transformers.logging.set_verbosity_error()  # the NSP head and pooler are not part of a masked-LM model
    summary = json.loads(Path(args.run_dir, "summary.json").read_text(encoding="utf-8"))
    model_dir = summary["model_dir"]
    model = transformers.AutoModelForMaskedLM.from_pretrained(model_dir)
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    vocab = len(tok)
    nsp = summary.get("final_eval_nsp_acc")
    print(
        f"held-out MLM accuracy {summary['final_eval_mlm_acc']:.3f} (chance {1 / vocab:.5f} with {vocab} tokens)"
        + (f", NSP accuracy {nsp:.3f}" if nsp is not None else "")
        + f", after {summary['step']} steps ({summary['sequences']:,} sequences, "
        f"{summary['train_time_s']:.0f}s of training)"
    )
    print(
        f"transformers {transformers.__version__} loaded {model_dir}: {type(model).__name__}, "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, tokenizer {type(tok).__name__}"
    )
    fill = transformers.pipeline("fill-mask", model=model, tokenizer=tok, top_k=args.top_k)
    width = max(len(s) for s in args.sentences)
    for text in args.sentences:
        guesses = ", ".join(f"{p['token_str']} ({p['score']:.3f})" for p in fill(text))
        print(f"  {text:<{width}} -> {guesses}")


if __name__ == "__main__":
    main()
