#!/usr/bin/env bash
# The users' grid against PyTorch: bench/vs_torch.py on ten shapes users
# train (the four classic vs_torch shapes, then D 512 / 256 / 160 / 96, GQA
# up to 8, L 384-3072), one file per (threads, precision mode, pass).
# The Xeon figures in bench/results/*/README.md come from this command.
set -euo pipefail
usage() {
  cat <<'EOF'
usage: bench/users_grid.sh [options]

Runs bench/vs_torch.py once per thread count, precision mode and pass on the
users' grid and writes OUT/vs-torch-<threads>-<mode>-<bwd|fwd>.txt.

  --threads "16 2"        thread counts (default: "2")
  --precisions "bf16 exact"  tilegrad's --precision modes (default: "bf16 exact")
  --forward               also time the forward (vs_torch.py --forward): *-fwd.txt
  --reps N                timed runs per contender (default 15)
  --torch-dtypes LIST     PyTorch dtypes to time (default: f32,bf16; the
                          Xeon runs used bf16, PyTorch's faster dtype there)
  --shapes 'B,H,Hkv,L,D,causal;...'  another grid (CI: one tiny shape)
  --out DIR               where the files go (default: users-grid-out)
  --python PY             the Python with torch (default: python3)
  -h, --help              this text

TILEGRAD_LIB / TILEGRAD_CLI name the library and CLI vs_torch.py uses (default:
build/). Example (the Xeon rows):
  bench/users_grid.sh --threads "16 2" --forward --torch-dtypes bf16 --out /tmp/grid
EOF
}
GRID='1,8,8,1024,64,0;1,8,8,2048,128,1;2,8,4,1024,256,0;4,16,16,512,64,1;1,6,2,1024,512,1;1,8,4,1024,256,0;1,4,4,2560,160,0;1,16,2,3072,64,1;1,8,8,2048,96,1;1,6,2,384,128,0'
threads=2 precs="bf16 exact" passes=bwd reps=15 dtypes=f32,bf16 out=users-grid-out py=python3
while [ $# -gt 0 ]; do
  case $1 in
    --threads) threads=$2; shift ;;
    --precisions) precs=$2; shift ;;
    --forward) passes="bwd fwd" ;;
    --reps) reps=$2; shift ;;
    --torch-dtypes) dtypes=$2; shift ;;
    --shapes) GRID=$2; shift ;;
    --out) out=$2; shift ;;
    --python) py=$2; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "users_grid.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for th in $threads; do
  for prec in $precs; do
    for pass in $passes; do
      f="$out/vs-torch-$th-$prec-$pass.txt"
      fwd=(); [ "$pass" = fwd ] && fwd=(--forward)
      "$py" "$here/vs_torch.py" --shapes "$GRID" --threads "$th" --reps "$reps" \
        --precision "$prec" --torch-dtypes "$dtypes" "${fwd[@]}" > "$f"
      echo "$f: $(grep -E '^speedup vs' "$f" || echo 'no summary line')"
    done
  done
done
