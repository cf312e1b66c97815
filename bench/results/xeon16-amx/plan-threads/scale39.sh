#!/usr/bin/env bash
# Device: 1 -> 16 thread scaling of the backward step on the users' grid,
# exact and bf16 mode, the ceilings (FMA, AMX peaks) measured at each count.
set -uo pipefail
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF && cmake --build build-dev -j16 --target tilegrad_cli; } > "$o/build.log" 2>&1 || exit 1
S='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
for p in exact bf16; do for t in 1 16; do
  build-dev/tilegrad bench --section attn --shapes "$S" --reps 3 --threads $t --precision $p > "$o/scale-$p-${t}t.txt" 2>&1
  echo "== $p $t threads rc=$?"
done; done
python3 - "$o" <<'PY'
import re, sys
o = sys.argv[1]
def read(p, t):
    txt = open(f"{o}/scale-{p}-{t}t.txt").read()
    fma = float(re.search(r"f32 FMA peak\s+([\d.]+)", txt).group(1))
    amx = re.search(r"AMX bf16 peak\s+([\d.]+)", txt)
    rows = {m.group(1): float(m.group(2)) for m in re.finditer(r"^\d+\s+(\S+)\s+[\d.]+\s+([\d.]+)", txt, re.M)}
    return fma, float(amx.group(1)) if amx else 0.0, rows
for p in ("exact", "bf16"):
    f1, a1, r1 = read(p, 1); f16, a16, r16 = read(p, 16)
    print(f"{p}: FMA peak {f1:.0f} -> {f16:.0f} ({f16/f1:.1f}x), AMX peak {a1:.0f} -> {a16:.0f} ({a16/max(a1,1):.1f}x)")
    for s in r1:
        sc = r1[s] / r16[s]
        print(f"  {s:<24} {r1[s]:8.2f} -> {r16[s]:7.2f} ms  {sc:5.1f}x  ({sc/(f16/f1):.2f} of the FMA peak's scaling)")
PY
