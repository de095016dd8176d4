#!/usr/bin/env bash
# The GPU measurements that the CPU suite cannot take, in priority order, inside a bounded lease:
#
#   scripts/bench_gpu.sh OUT_DIR SECONDS [EARLIER_DIR] [STEP ...]
#
# OUT_DIR     where the reports (<spec>.json), the loss curves (curves.tgz) and the log (bench_gpu.log) go: at
#             most five files, each written as soon as it exists, so a command killed at its limit keeps them
# SECONDS     the wall time this command may use: no step, and no benchmark inside a step, starts once fewer
#             than MARGIN seconds (default 150: about the longest single entry) are left
# EARLIER_DIR OUT_DIR of an earlier call (not one from before 2026-11-27 15:00 UTC: packed entries then ran half
#             the rows per update under the same names), copied back: its reports' finished entries are kept (`bertforge bench
#             --resume`) and only the rest is measured; its curves are restored
# STEP        accept, tests, profile, levers, loop, data, curve (default: these, in this order), long, or a spec name;
#             SPEC:A,B runs only the spec's entries whose names contain A or B (`bench --only`)
#   accept   issue 19's acceptance first: the best candidate for each target (best_*: every lever on, packed,
#            LayerNorms in bf16, 4 micro-batches per update; first in the spec), the HF baselines, the loop vs its
#            isolated step, then the levers they combine (CUDA graphs, compiled around the varlen kernel, packed
#            phase 2; CUDA graphs with 4 micro-batches per update, and compiled layer by layer:
#            lever_cudagraphs_accum4_*, lever_cudagraphs_layers_*). One 560-second call measures about the
#            best_* entries and the baselines (each loop entry takes 60-150 s, most of it compiling)
#   tests    the CUDA tests: compiled step, CUDA graphs (with accumulation, and layer by layer), bf16 LayerNorm,
#            compiled LAMB, FP8, step parts, pinned loaders, varlen (attention dropout in the kernel, the
#            segmented layout)
#   profile  (or profile:base128, profile:large128, profile:large512: that one alone)
#            `bertforge pretrain --profile 10` of the best_* configurations (BERT-large phase 1 and 2, BERT-base
#            phase 1; CUDA graphs off): top kernels and the step's parts (forward, backward, clip, optimizer,
#            between) into the log
#   levers   pretrain_loop_gpu's new levers (attention dropout in the varlen kernel, the segmented layout,
#            compiled LAMB, CUDA graphs) and the entries they are compared with
#   long     benchmarks/modernbert_long_gpu.yml   issue 22: ModernBERT-base tokens/s at 8,192 and 1,024 (measured
#            2026-11-26: benchmarks/reports/h100-2026-11-26; not in the default steps)
#   loop     benchmarks/pretrain_loop_gpu.yml     issue 19: the rest of it (`bertforge pretrain` itself, vs HF)
#   data     books+Wikipedia phase-1 shards (`data prepare --config books_wiki`) from the corpus's .xz samples
#            in $CORPUS (default .carry/corpus, else ../shared/corpus); skipped when the shards exist, and
#            copied from .carry/books_wiki where the shards were built beforehand and carried
#            (`scripts/gpu_carry.sh --shards`: the curve's 300 x 256 sequences need 7 of the 64 shards)
#   curve    benchmarks/pretrain_curve_gpu.yml    issue 19: 300 steps on those shards, fast paths vs eager
#
# #23's quality_budget_gpu runs one side per lease, named in its spec (`data`, then quality_budget_gpu:_ours or
# :_hf in a second call while the machine is warm); after a side, its record and final model go to OUT as
# quality_<side>.tgz.NN (15 MiB parts: a call brings back files of at most 16 MiB), which an EARLIER_DIR
# restores, and `cat DIR/quality_<side>.tgz.* | tar xzf -` restores anywhere (benchmarks/quality_budget_gpu_glue.yml).
#
# The lent machine has no network and its image lacks blingfire and torchao: `scripts/gpu_carry.sh` assembles
# .carry (the corpus's .xz files, ../shared/data/glue_data, the sentence splitter's library) and .whl (torchao's
# wheel, installed into /tmp/site when torchao is missing); carry both.
set -uo pipefail
cd "$(dirname "$0")/.."
usage="usage: scripts/bench_gpu.sh OUT_DIR SECONDS [EARLIER_DIR] [STEP ...]"
out=${1:?$usage}
seconds=${2:?$usage}
earlier=${3:-}
shift $(($# < 3 ? $# : 3))
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(accept tests profile levers loop data curve)
margin=${MARGIN:-150}
end=$((SECONDS + seconds))
corpus=${CORPUS:-$([ -d .carry/corpus ] && echo .carry/corpus || echo ../shared/corpus)}
quality=${QUALITY:-runs/bench/quality_gpu}  # quality_budget_gpu.yml's out_dir

mkdir -p "$out"
exec > >(tee -a "$out/bench_gpu.log") 2>&1
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
if ! python3 -c "import torchao" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl &&
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
if ! python3 -c "import importlib.util as u, sys; sys.exit(u.find_spec('blingfire') is None)" 2>/dev/null &&
  [ -d .carry/site/blingfire ]; then  # the `data` step's sentence splitter
  export PYTHONPATH="$PYTHONPATH:$PWD/.carry/site"
fi
if [ ! -e ../shared/data/glue_data ] && [ -d .carry/glue_data ]; then  # where the specs look for it
  mkdir -p ../shared/data && ln -s "$PWD/.carry/glue_data" ../shared/data/glue_data
fi
if [ -n "$earlier" ] && [ -d "$earlier" ]; then
  cp -n "$earlier"/*.json "$out"/ 2>/dev/null
  [ -f "$earlier/curves.tgz" ] && mkdir -p runs && tar xzf "$earlier/curves.tgz" -C runs && cp "$earlier/curves.tgz" "$out/"
  for first in "$earlier"/quality_*.tgz.00; do
    [ -f "$first" ] && cat "${first%.00}".* | tar xzf -
  done
fi

echo "== $(date -Is) $(git rev-parse --short HEAD 2>/dev/null) steps: ${steps[*]}; ${seconds}s, margin ${margin}s"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
# NNLSHP's plan is scipy's nnls (~11 s at seq 512, K=3 with 1.17; reported 4-60x slower in scipy 1.12-1.15)
python3 -c "import scipy; print('scipy', scipy.__version__)" 2>/dev/null || echo "scipy: missing"

left() { echo $((end - SECONDS - margin)); }

pack_side() {  # pack_side SIDE: the side's record and final model (paths relative to here) into OUT, 15 MiB parts
  local record=$quality/$1/side.json model
  [ -f "$record" ] || { echo "pack $1: no $record"; return; }
  model=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["model_dir"])' "$record")
  rm -f "$out/quality_$1.tgz."*
  tar czf - "$record" "$model" | split -b 15M -d - "$out/quality_$1.tgz." && ls -l "$out"/quality_"$1".tgz.*
}

bench() {  # bench SPEC[:A,B]: run what its report in OUT_DIR lacks (of the entries named), until the time is up
  local spec=${1%%:*} only=()
  [[ $1 == *:* ]] && IFS=, read -ra names <<<"${1#*:}" && for n in "${names[@]}"; do only+=(--only "$n"); done
  python3 -m bertforge bench --spec "$spec" --json "$out/$spec.json" --resume --stop-after "$(left)" "${only[@]}"
}

profile() {  # profile CONFIG SEQ_LEN MAX_PRED MICRO_BATCH: 10 profiled steps of a best_* configuration (packed K=3
  # synthetic rows, compiled around the flash kernel, compiled LAMB, bf16 LayerNorms) without CUDA graphs, whose
  # replays would hide the kernels that the profile is for
  local dir=/tmp/bertforge-profile-$1-$4
  [ "$(left)" -gt 0 ] || { echo "profile $1: not started, ${margin}s or less left"; return; }  # timeout 0 = none
  rm -rf "$dir"
  timeout "$(left)" python3 -m bertforge pretrain --config "$1" --profile 10 \
    --set train.output_dir="$dir" --set data.input_dir=synthetic --set data.eval_dir=null \
    --set data.synthetic_seq_len="$2" --set data.synthetic_max_pred="$3" --set data.synthetic_pack=3 \
    --set train.max_steps=16 --set train.micro_batch_size="$4" --set train.global_batch_size="$4" \
    --set train.log_every=5 --set train.save_every=0 --set train.tensorboard=false --set train.plot=false \
    --set train.compile=true --set train.cuda_graphs=false --set optim.compile=true --set train.attention=auto \
    --set train.low_precision_layernorm=true --set train.precision=bf16 \
    --set train.init_checkpoint=null --set model.init_from=null
}

for step in "${steps[@]}"; do
  if [ "$(left)" -le 0 ]; then
    echo "== $step: not started, ${margin}s or less left"
    continue
  fi
  echo "== $(date -Is) $step ($(left)s to start benchmarks in)"
  case $step in
    tests)
      # one line per test as it ends (-v), so a run cut at its limit still says which passed; at most
      # TESTS_LIMIT seconds (default 300), so that the lease always measures something
      limit=$(left); [ "$limit" -gt "${TESTS_LIMIT:-300}" ] && limit=${TESTS_LIMIT:-300}
      timeout "$limit" python3 -m pytest -v -m "not slow" -p no:cacheprovider \
        tests/train/test_gpu_step.py tests/model/test_gpu_varlen.py tests/train/test_fp8.py
      ;;
    accept) bench pretrain_loop_gpu:_hf,p1_large128_loop,p1_large128_iso,p2_large512_packed_loop,best_,lever_cudagraphs,lever_compiled_varlen ;;
    levers) bench pretrain_loop_gpu:p2_large512_packed_loop,lever_sdpa,lever_unpadded,_varlen_,lever_compiled_large128,lever_compiled_base128,optcompiled,cudagraphs,lever_lpln,lever_compiled_nodrop ;;
    loop) bench pretrain_loop_gpu ;;
    long) bench modernbert_long_gpu ;;
    profile | profile:*)  # profile:base128 (or large128, large512) profiles that one alone
      if python3 -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then
        [[ $step == profile || $step == *large128* ]] && profile pretrain_large_128 128 20 256
        [[ $step == profile || $step == *base128* ]] && profile pretrain_base_128 128 20 512
        [[ $step == profile || $step == *large512* ]] && profile pretrain_large_512 512 80 64
      else
        echo "profile: no CUDA device here (BERT-large on the CPU would take hours)"
      fi
      ;;
    data)
      if [ -f runs/books_wiki/shards_phase1/manifest.json ]; then
        echo "runs/books_wiki/shards_phase1 exists"
      elif [ -f .carry/books_wiki/shards_phase1/manifest.json ]; then  # built where the CPU is, carried
        mkdir -p runs && cp -r .carry/books_wiki runs/ && echo "runs/books_wiki from .carry/books_wiki"
      else
        timeout "$(left)" python3 -m bertforge data prepare --config books_wiki \
          --set "docs.source=$corpus/sample_*_50M.txt.xz"
      fi
      ;;
    curve)
      bench pretrain_curve_gpu
      [ -d runs/curves ] && tar czf "$out/curves.tgz.tmp" -C runs curves && mv "$out/curves.tgz.tmp" "$out/curves.tgz"
      ;;
    quality_budget_gpu:_ours | quality_budget_gpu:_hf)
      bench "$step"
      pack_side "${step##*_}"
      ;;
    *) bench "$step" ;;
  esac
done
echo "== $(date -Is) done; reports in $out (bertforge bench --show FILE prints one)"
