#!/usr/bin/env bash
# Assembles what a GPU call carries for scripts/bench_gpu.sh (`run(..., carry=[".carry", ".whl"])`): the lent
# machine has no network and no ../shared, and its image lacks two of the packages the steps need.
#
#   scripts/gpu_carry.sh [SHARED]      (SHARED: default ../shared)
#
#   .carry/corpus           the corpus's .xz samples: the `data` step's books+Wikipedia shards
#   .carry/glue_data        SHARED/data/glue_data: #23's GLUE side (quality_budget_gpu_glue)
#   .carry/site/blingfire   the sentence splitter's library and package file, from this environment: the image has
#                           no blingfire, and its wheel (42 MB, mostly tokenizer models we do not use) would not fit
#   .whl/torchao-*.whl      FP8 (train.fp8), the version installed here, for the image's Python 3.12
#
# A call carries at most 64 MiB; this prints the total. Both folders are ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${1:-../shared}
mkdir -p .carry/corpus .carry/site/blingfire .whl
cp -u "$shared"/corpus/*.txt.xz .carry/corpus/
[ -d "$shared/data/glue_data" ] && cp -ru "$shared/data/glue_data" .carry/
pkg=$(python3 -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("blingfire").origin))')
cp "$pkg/__init__.py" "$pkg/libblingfiretokdll.so" .carry/site/blingfire/
if ! compgen -G ".whl/torchao-*.whl" >/dev/null; then
  version=$(python3 -c 'import importlib.metadata as m; print(m.version("torchao"))')
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    -d .whl "torchao==$version"
fi
du -shc .carry .whl | tail -1
