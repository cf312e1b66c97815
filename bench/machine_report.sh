#!/usr/bin/env bash
# One machine's tables for the README: the FA-2 backward step and the
# memory-bound kernels with every ISA table this CPU runs, at each thread
# count, and PyTorch side by side (the faster of its float32 and bf16 SDPA
# backward) at each thread count. For the lent many-core machine or any
# other; each run names the CPU, the ISA and the threads.
#
#   bench/machine_report.sh OUT_DIR [THREADS...]      (default threads: 2)
#
# Env: ISAS (default "avx512 avx2 portable"), SECTIONS (default "attn mem"), TORCH_SHAPES (vs_torch.py --shapes;
# default its --quick set), TORCH_REPS (default 3), PYTHON (default python3;
# needs torch and numpy; vs_torch is skipped without torch).
# Writes OUT_DIR/bench-<isa>-<n>t.{txt,json}, OUT_DIR/vs-torch-<n>t.{txt,json}.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: bench/machine_report.sh OUT_DIR [THREADS...]}
shift
if [ $# -gt 0 ]; then threads=("$@"); else threads=(2); fi
mkdir -p "$out"
py=${PYTHON:-python3}

cmake -S . -B build-report -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF >/dev/null
cmake --build build-report -j"$(nproc)" --target tilegrad_cli >/dev/null
grep -m1 "model name" /proc/cpuinfo | tee "$out/cpu.txt"
grep -m1 "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -E "^(avx2|fma|avx512f|avx512_bf16|amx_bf16|amx_tile)$" \
  | tr '\n' ' ' | tee -a "$out/cpu.txt"
echo | tee -a "$out/cpu.txt"

for n in "${threads[@]}"; do
  for isa in ${ISAS:-avx512 avx2 portable}; do
    for section in ${SECTIONS:-attn mem}; do
      f="$out/bench-$isa-$section-${n}t"
      # an ISA this CPU lacks is refused at once (exit 2): skip it
      build-report/tilegrad bench --threads "$n" --isa "$isa" --section "$section" --reps 5 \
        --json "$f.json" > "$f.txt" 2>/dev/null || { rm -f "$f.txt" "$f.json"; continue; }
      echo "== $isa, $n threads, $section"; grep -E "^cpu|isa:|FMA peak|triad|^[0-9]" "$f.txt"
    done
  done
done

if ! "$py" -c "import torch" 2>/dev/null; then
  echo "no torch for $py: PyTorch side by side skipped"
  exit 0
fi
for n in "${threads[@]}"; do
  shapes=(--quick)
  [ -n "${TORCH_SHAPES:-}" ] && shapes=(--shapes "$TORCH_SHAPES")
  TILEGRAD_LIB="$PWD/build-report/libtilegrad.so" TILEGRAD_CLI="$PWD/build-report/tilegrad" \
    PYTHONUNBUFFERED=1 "$py" bench/vs_torch.py --threads "$n" --reps "${TORCH_REPS:-3}" \
    "${shapes[@]}" --json "$out/vs-torch-${n}t.json" | tee "$out/vs-torch-${n}t.txt"
done
