#!/usr/bin/env bash
# Device: phase profile (temporary instrumented tree build-prof/src), the
# avx512bf16 table with three parts or not, and the f32 GEMM's efficiency by D.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
grep -m1 "model name" /proc/cpuinfo > "$o/cpu.txt"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16 &&
  cmake -S build-prof/src -B build-prof/b -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-prof/b -j16; } > "$o/build.log" 2>&1 || { tail -20 "$o/build.log"; exit 1; }
P=build-prof/b/tilegrad
SH='1,8,8,1024,64,0 1,8,8,2048,128,1 1,8,4,1024,256,0 1,6,2,1024,512,1 1,6,2,384,128,0'
{
for t in 2 16; do for pr in bf16 exact; do for s in $SH; do
  echo "== $t $pr $s"
  TGP=1 $P bench --section attn --shapes "$s" --reps 3 --precision $pr --threads $t 2>&1 | grep -E "TGP|^1 "
done; done; done
} > "$o/prof.txt" 2>&1
echo prof done
# avx512bf16 table: exact with three parts from D 64 (TGX) or the f32 GEMM (default 0)
S3='1,8,8,1024,64,0;1,8,8,2048,128,1;1,8,4,1024,256,0;1,6,2,1024,512,1'
for t in 16 2; do for r in 1 2 3; do for cfg in parts fma; do
  e=""; [ $cfg = parts ] && e="TGX_MIN_D_FWD=64 TGX_MIN_D_BWD=64"
  env $e $P bench --isa avx512bf16 --section attn --shapes "$S3" --reps 3 --precision exact --threads $t 2>/dev/null |
    awk -v c=$cfg -v t=$t -v r=$r '/^FlashAttention-2 training forward/{f=1} /^[0-9]+ +[0-9]+,/{print t, r, c, (f?"fwd":"bwd"), $2, $4}'
done; done; done > "$o/bf16parts.txt"
echo parts done
# f32 FMA GEMM by D at 1 thread (avx512: all five products; avx512bf16: P, dS products)
for isa in avx512 avx512bf16; do
  build-dev/tilegrad bench --isa $isa --section attn --threads 1 --reps 3 --precision exact \
    --shapes '1,2,2,1024,64,0;1,2,2,1024,128,0;1,2,2,1024,256,0;1,1,1,1024,512,0' 2>&1 | grep -E "^[0-9] |peak|FMA" | sed "s/^/$isa /"
done > "$o/gemm-by-d.txt"
echo all done
