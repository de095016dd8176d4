#!/usr/bin/env bash
# Assembles what a GPU call carries for scripts/bench_gpu.sh (`run(..., carry=[".carry", ".whl"])`): the lent
# machine has no network and no ../shared, and its image lacks two of the packages the steps need.
#
#   scripts/gpu_carry.sh [--shards] [SHARED]      (SHARED: default ../shared)
#
#   .carry/corpus           the corpus's .xz samples: the `data` step's books+Wikipedia shards
#   .carry/glue_data        SHARED/data/glue_data: #23's GLUE side (quality_budget_gpu_glue)
#   .carry/site/blingfire   the sentence splitter's library and package file, from this environment: the image has
#                           no blingfire, and its wheel (42 MB, mostly tokenizer models we do not use) would not fit
#   .whl/torchao-*.whl      FP8 (train.fp8), the version installed here, for the image's Python 3.12
#
# --shards carries the `curve` step's data instead of the corpus: runs/books_wiki (built here by `bertforge data
# prepare --config books_wiki` when absent) cut to its first shards that hold 84,000 instances (the curve reads
# 300 x 256) and its vocab, as .carry/books_wiki (~27 MB), which the `data` step copies into place; it saves the
# lease the data preparation (about a minute of device time).
#
# A call carries at most 64 MiB; this prints the total. Both folders are ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
shards=0
[ "${1:-}" = --shards ] && shards=1 && shift
shared=${1:-../shared}
mkdir -p .whl
if [ $shards = 1 ]; then
  [ -f runs/books_wiki/shards_phase1/manifest.json ] ||
    python3 -m bertforge data prepare --config books_wiki --set "docs.source=$shared/corpus/sample_*_50M.txt.xz"
  rm -rf .carry/books_wiki && mkdir -p .carry/books_wiki/shards_phase1 && cp -r runs/books_wiki/vocab .carry/books_wiki/
  python3 - runs/books_wiki/shards_phase1 .carry/books_wiki/shards_phase1 84000 <<'PY'
import json, shutil, sys
src, dst, need = sys.argv[1], sys.argv[2], int(sys.argv[3])
manifest = json.load(open(f"{src}/manifest.json"))
keep = []
for shard in manifest["shards"]:  # the first shards that hold `need` instances, listed as the whole set's
    if sum(s["instances"] for s in keep) >= need:
        break
    keep.append(shard)
    shutil.copy(f"{src}/{shard['file']}", dst)
for key in ("instances", "tokens", "documents"):
    manifest[key] = sum(s[key] for s in keep)
manifest["shards"], manifest["vocab"] = keep, "../vocab/tokenizer.json"
json.dump(manifest, open(f"{dst}/manifest.json", "w"), indent=2)
print(f"{dst}: {len(keep)} shards, {manifest['instances']} instances")
PY
else
  mkdir -p .carry/corpus .carry/site/blingfire
  cp -u "$shared"/corpus/*.txt.xz .carry/corpus/
  [ -d "$shared/data/glue_data" ] && cp -ru "$shared/data/glue_data" .carry/
  pkg=$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("blingfire").origin))')
  cp "$pkg/__init__.py" "$pkg/libblingfiretokdll.so" .carry/site/blingfire/
fi
if ! compgen -G ".whl/torchao-*.whl" >/dev/null; then
  version=$(python3 -c 'import importlib.metadata as m; print(m.version("torchao"))')
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d .whl "torchao==$version"
fi
du -shc .carry .whl | tail -1
