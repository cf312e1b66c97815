#!/usr/bin/env bash
# Device: bench/train_model.py (tilegrad vs sdpa vs eager) at $T threads.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
if [ ! -f build/libtilegrad.so ]; then
  { cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build -j16 --target tilegrad; } > "$o/build.log" 2>&1 || { tail -30 "$o/build.log"; exit 1; }
fi
export TILEGRAD_LIB=$PWD/build/libtilegrad.so
for s in ${SEQS:-2048}; do
  timeout ${TMO:-500} python3 bench/train_model.py --seq $s --steps ${STEPS:-8} --warmup 2 --threads ${T:-16} \
    --tilegrad-precision ${PREC:-exact} ${EXTRA:-} --json "$o/train-$s-${T:-16}t-${PREC:-exact}.json" > "$o/train-$s-${T:-16}t-${PREC:-exact}.txt" 2> "$o/train-$s-${T:-16}t-${PREC:-exact}.err"
  echo "seq $s rc=$?"; tail -25 "$o/train-$s-${T:-16}t-${PREC:-exact}.txt"
done
