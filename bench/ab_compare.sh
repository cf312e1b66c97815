#!/usr/bin/env bash
# Before/after: the same `tilegrad bench` run on two source trees (or on two
# ISA tables of one), alternating A, B, A, B, ... so both see the same
# machine state, and each case's median over the rounds side by side.
#
#   bench/ab_compare.sh [-n ROUNDS] [-o OUT_DIR] TREE_A TREE_B [-- BENCH_ARGS...]
#
# TREE_A / TREE_B: source trees to build (Release, CLI only), e.g. a
# `git worktree` or `git archive` of the old commit and the checkout; one
# tree twice with ISA_A / ISA_B compares two ISA tables.
# Env: ISA_A, ISA_B (--isa for each side; default: the bench's own choice).
# BENCH_ARGS go to every run (e.g. --threads 16 --section attn --reps 3).
# Prints, per case (the bench's attention rows, forward rows and memory
# rows, by their number and name), median ms of A and B and B/A time.
# OUT_DIR (default a temp dir) keeps every run's JSON.
#
#   bench/ab_compare.sh -c TREE_A TREE_B -- THREADS exact|split|bf16 PAIRS SHAPES
#
# -c: call by call instead: both trees' libraries in one process
# (bench/ab_calls/ab_calls.c), the forward and the backward of each shape
# alternating between them; the medians of the per-pair ratios. Much
# tighter where the machine drifts (the lent Xeon: 0.95-1.05 for two builds
# of the same kernels, where separate runs drifted by 25%).
set -euo pipefail
rounds=3 out="" calls=0
while getopts "cn:o:" opt; do
  case $opt in
    c) calls=1 ;;
    n) rounds=$OPTARG ;;
    o) out=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
a=${1:?usage: bench/ab_compare.sh [-c] [-n ROUNDS] [-o OUT_DIR] TREE_A TREE_B [-- ARGS...]}
b=${2:?need TREE_B}
shift 2
[ "${1:-}" = "--" ] && shift
out=${out:-$(mktemp -d /tmp/tg-ab.XXXXXX)}
mkdir -p "$out"

if [ "$calls" = 1 ]; then
  [ $# = 4 ] || { echo "-c needs: THREADS exact|split|bf16 PAIRS SHAPES" >&2; exit 2; }
  for t in "$a" "$b"; do
    cmake -S "$t" -B "$t/build-ab" -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF >/dev/null
    cmake --build "$t/build-ab" -j"$(nproc)" --target tilegrad >/dev/null
  done
  here=$(cd "$(dirname "$0")/.." && pwd)
  cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -I"$here/include" "$here/bench/ab_calls/ab_calls.c" \
    -ldl -lm -o "$out/ab_calls"
  exec "$out/ab_calls" "$(cd "$a" && pwd)/build-ab/libtilegrad.so" \
    "$(cd "$b" && pwd)/build-ab/libtilegrad.so" "$@"
fi

build() { # tree -> its CLI
  cmake -S "$1" -B "$1/build-ab" -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=OFF >/dev/null
  cmake --build "$1/build-ab" -j"$(nproc)" --target tilegrad_cli >/dev/null
  echo "$1/build-ab/tilegrad"
}
cli_a=$(build "$a")
cli_b=$(build "$b")
isa_a=(); isa_b=()
[ -n "${ISA_A:-}" ] && isa_a=(--isa "$ISA_A")
[ -n "${ISA_B:-}" ] && isa_b=(--isa "$ISA_B")

for r in $(seq 1 "$rounds"); do
  "$cli_a" bench "${isa_a[@]}" "$@" --json "$out/a-$r.json" >/dev/null 2>&1
  "$cli_b" bench "${isa_b[@]}" "$@" --json "$out/b-$r.json" >/dev/null 2>&1
  echo "round $r of $rounds done" >&2
done

python3 - "$out" "$rounds" "$a${ISA_A:+ ($ISA_A)}" "$b${ISA_B:+ ($ISA_B)}" <<'PY'
import json, statistics, sys
out, rounds, name_a, name_b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def cases(path):
    """{case: median ms} from one bench JSON: the attention step and its
    forward per shape, each memory-bound kernel."""
    d = json.load(open(path))
    res = {}
    for r in d.get("attention_bwd", {}).get("results", []):
        if not r.get("ok"):
            continue
        shape = "{B},{H},{Hkv},{qL},{D},{c}".format(c="causal" if r["causal"] else "full", **r)
        if r.get("window"):
            shape += ",W{}".format(r["window"])
        res["bwd step " + shape] = r["ms_median"]
        if "fwd" in r:
            res["fwd      " + shape] = r["fwd"]["ms_median"]
    for r in d.get("memory_bound", {}).get("results", []):
        if r.get("ok"):
            res[r["kernel"]] = r["ms_median"]
    return res

A = [cases(f"{out}/a-{r}.json") for r in range(1, rounds + 1)]
B = [cases(f"{out}/b-{r}.json") for r in range(1, rounds + 1)]
meta = json.load(open(f"{out}/a-1.json"))
print(f"A = {name_a}\nB = {name_b}\ncpu: {meta.get('cpu', '?')}  threads: {meta.get('threads', '?')}  "
      f"rounds: {rounds} (median of the per-round medians)")
print(f"{'case':<48} {'A ms':>10} {'B ms':>10} {'B/A':>7}")
ratios = []
for key in A[0]:
    va = [x[key] for x in A if key in x]
    vb = [x[key] for x in B if key in x]
    if not va or not vb:
        continue
    ma, mb = statistics.median(va), statistics.median(vb)
    ratios.append(mb / ma)
    print(f"{key:<48} {ma:10.3f} {mb:10.3f} {mb / ma:7.3f}")
if ratios:
    g = 1.0
    for x in ratios:
        g *= x
    print(f"geomean B/A time: {g ** (1 / len(ratios)):.3f} over {len(ratios)} cases")
PY
