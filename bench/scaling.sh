#!/usr/bin/env bash
# Thread scaling of the FA-2 backward step, and the PyTorch side-by-side at
# the largest thread count, on a many-core machine (we ran it on the lent
# 16-core Xeon; see bench/README.md).
#
#   bench/scaling.sh OUT_DIR [THREADS...]     (default threads: 1 2 4 8 16)
#
# Builds tilegrad (no tests) into build-scaling, runs `tilegrad bench
# --section attn` at each thread count on SHAPES, then bench/vs_torch.py at
# the largest count on TORCH_SHAPES. Needs cmake, gcc, python3 with torch and
# numpy. Writes OUT_DIR/attn-<n>t.{json,txt}, OUT_DIR/scaling.txt, OUT_DIR/scaling-ratio.txt
# (bench/scaling_ratio.py: first count -> last), OUT_DIR/vs-torch-<n>t.json.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/scaling.sh OUT_DIR [THREADS...]}
shift
if [ $# -gt 0 ]; then threads=("$@"); else threads=(1 2 4 8 16); fi
mkdir -p "$out"

cmake -S . -B build-scaling -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build build-scaling -j"$(nproc)" --target tilegrad_cli >/dev/null

# Few (B*H_kv = 8) and many (32) kv heads, both head dims the grid cares most
# about, causal and not.
SHAPES='1,16,16,2048,128,1;1,8,2,4096,128,0;2,16,16,1024,64,0;1,8,8,2048,256,1'
TORCH_SHAPES='1,16,16,2048,128,1;1,8,2,4096,128,0;2,16,16,1024,64,0;1,8,8,2048,256,1;4,16,4,512,64,1;2,8,8,1024,128,0'

for n in "${threads[@]}"; do
  echo "== $n threads" | tee -a "$out/scaling.txt"
  build-scaling/tilegrad bench --threads "$n" --section attn --shapes "$SHAPES" --reps 5 \
    --json "$out/attn-${n}t.json" 2>/dev/null | tee "$out/attn-${n}t.txt" | tee -a "$out/scaling.txt"
done
# the step's speedup from the first thread count to the last, over the FMA peak's
python3 bench/scaling_ratio.py "$out/attn-${threads[0]}t.txt" "$out/attn-${threads[${#threads[@]}-1]}t.txt" \
  | tee "$out/scaling-ratio.txt"

last=${threads[${#threads[@]}-1]}
TILEGRAD_LIB="$PWD/build-scaling/libtilegrad.so" TILEGRAD_CLI="$PWD/build-scaling/tilegrad" \
  PYTHONUNBUFFERED=1 python3 bench/vs_torch.py --threads "$last" --reps 5 \
  --shapes "$TORCH_SHAPES" --json "$out/vs-torch-${last}t.json" | tee "$out/vs-torch-${last}t.txt"
