#!/usr/bin/env bash
# Builds tilegrad and runs every test: the C suites (ctest, Release), the
# installed package's consumers (find_package, pkg-config), the C suites
# cross-built for aarch64 under qemu (scripts/test_aarch64.sh), the same
# x86-64 suites under AddressSanitizer + UndefinedBehaviorSanitizer, the
# PyTorch oracle and Python package suite (pytest; on Debian's torch 1.13, then on
# torch 2.9.1 with transformers 5.17.0 in a venv for the custom ops and the
# transformers backend), the pip-install check, a short
# libFuzzer run, the ThreadSanitizer race check and the microkernel suite
# built with clang. Installs what it needs first (scripts/setup.sh test).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh test
jobs=$(nproc)

# The torch front's custom ops (torch.compile, torch.export, opcheck) need
# torch >= 2.4: the Python suites run again on torch 2.9.1 from the package
# index, with transformers 5.17.0 for the attention backend
# (tilegrad.transformers), in a venv that is created once and reused
# (TG_TORCH_VENV; the x86-64 torch wheel pulls its CUDA runtime wheels, ~3-4
# GB, to import). A missing venv is installed in the background while the C
# stages run: the download and unpacking took ~240 s of a CI run's wall time
# on their own, mostly waiting on the network and the disk.
tv="${TG_TORCH_VENV:-$PWD/build-torch-venv}"
torch_venv_ok() {
  "$tv/bin/python" -c 'import torch, numpy, pytest, hypothesis, transformers
assert torch.__version__.split("+")[0] == "2.9.1"
assert transformers.__version__ == "5.17.0"' 2>/dev/null
}
venv_pid="" venv_log="${TMPDIR:-/tmp}/tilegrad-torch-venv.$$.log"
if ! torch_venv_ok; then
  ( [ -x "$tv/bin/python" ] || python3 -m venv "$tv"
    "$tv/bin/python" -m pip install --disable-pip-version-check --no-cache-dir -q \
      torch==2.9.1 transformers==5.17.0 numpy pytest hypothesis ) >"$venv_log" 2>&1 &
  venv_pid=$!
fi
# Each stage prints its start and the seconds the previous one took, so a
# slow CI run shows where its time went.
t_stage=0 stage_name=setup
stage() {
  echo "== ($stage_name: $((SECONDS - t_stage)) s)"
  t_stage=$SECONDS stage_name=$1
  echo "== $1: $2"
}

# ctest runs as many suites at once as there are CPUs: the suites' f64
# references are serial and dominate their time (a 2-core AMD EPYC of family
# 23 ran the ASan suites' test_attention for about 3 minutes per table), and
# every suite sets OMP_WAIT_POLICY=passive but the one that must spin
# (tests/CMakeLists.txt), so oversubscribed threads sleep instead.
stage release "build (Release) and ctest"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DTG_BUILD_TESTS=ON >/dev/null
cmake --build build -j"$jobs" >/dev/null
(cd build && ctest -j"$jobs" --output-on-failure)
# bench/ab_calls (ab_compare.sh -c) builds and runs: the library against itself
cc -O2 -std=c11 -D_POSIX_C_SOURCE=200809L -Wall -Wextra -Werror -Iinclude \
  bench/ab_calls/ab_calls.c -ldl -lm -o build/ab_calls
build/ab_calls "$PWD/build/libtilegrad.so" "$PWD/build/libtilegrad.so" 2 bf16 1 '1,2,1,64,32,1' >/dev/null
build/ab_calls "$PWD/build/libtilegrad.so" "$PWD/build/libtilegrad.so" 3 exact bits '1,3,1,70,64,1;1,4,2,200,64,1,48' >/dev/null

stage consumers "install: find_package and pkg-config consumers"
bash tests/consumer/check.sh

stage aarch64 "aarch64: cross build, the C suites under qemu (neon, neonbf16; portable: its own)"
bash scripts/test_aarch64.sh

stage asan "build (ASan + UBSan) and ctest"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DTG_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs" >/dev/null
# TG_TEST_SHORT=1 (as under qemu): the sanitizers look for memory errors, and
# the cases it leaves out add only size (L = 4096 accuracy targets, the
# longer random variant runs) or repeat a problem on every ISA x threads x
# run mode (the attention suites take a covering subset: attn_runs_of),
# which the Release run above covers. The attention engine's suites (1086 of the
# stage's 1245 CPU seconds on a 2-core Xeon, 663 of them on its other
# tables) run on the table this CPU picks only (on the 2-core EPYC of family
# 25, avx2, the portable table's took 200 CPU seconds more: the engine code
# is the same, its tiles the table's; the Release run has them all); the
# other tables' ISA code runs under ASan in every other suite, test_micro's
# row ops and microkernels with their tails among them.
auto_isa=$(build-asan/tilegrad --version | sed -n 's/^isa: //p')
others=$(cd build-asan && ctest -N | sed -n 's/.* test_micro\.\([a-z0-9]*\)$/\1/p' |
         grep -vx -e "$auto_isa" | paste -sd'|')
heavy='test_(attention|attn_ext|attn_variants|attn_step|causal_attention|big_offsets|hardening)'
(cd build-asan && TG_TEST_SHORT=1 ASAN_OPTIONS=detect_leaks=1 ctest -j"$jobs" --output-on-failure \
   ${others:+-E "^$heavy\\.($others)\$"})

stage pytest-1.13 "PyTorch oracle and Python package (pytest, Debian's torch 1.13)"
# OpenMP threads sleep between calls, as in the ctest suites: the suites'
# many small torch ops between tilegrad calls ran 5-20x slower on this
# 2-core VM with libgomp's default spinning (threads of one pool waiting
# on the other's cores). No test reads the wait policy.
export OMP_WAIT_POLICY=passive
TILEGRAD_LIB="$PWD/build/libtilegrad.so" /usr/bin/python3 -m pytest tests/python -q

# the venv installed in the background at the start (above)
stage pytest-2.9 "torch front on PyTorch 2.9.1 and transformers 5.17.0 (pytest in a venv)"
if [ -n "$venv_pid" ]; then
  wait "$venv_pid" && torch_venv_ok ||
    { cat "$venv_log" >&2; echo "the torch 2.9.1 venv ($tv) could not be installed" >&2; exit 1; }
  rm -f "$venv_log"
fi
TILEGRAD_LIB="$PWD/build/libtilegrad.so" TG_REQUIRE_CUSTOM_OPS=1 TG_REQUIRE_TRANSFORMERS=1 \
  "$tv/bin/python" -m pytest tests/python -q
# eager calls skip the dispatcher (tilegrad.torch._direct); the torch
# front's suites once more with them through the custom ops (not the ring's:
# ring_attention calls the kernels itself, so the run would repeat its 40 s)
TILEGRAD_LIB="$PWD/build/libtilegrad.so" TG_REQUIRE_CUSTOM_OPS=1 TG_TORCH_VIA_OPS=1 \
  "$tv/bin/python" -m pytest $(ls tests/python/test_torch_*.py | grep -v test_torch_ring.py) \
  tests/python/test_bwd_step.py \
  tests/python/test_linear_cross_entropy.py tests/python/test_step_kernels.py \
  tests/python/test_varlen_torch.py -q
# the bench/ tools behind cited figures (bench/README.md), on one tiny shape: seconds
TILEGRAD_LIB="$PWD/build/libtilegrad.so" TILEGRAD_CLI="$PWD/build/tilegrad" bash bench/users_grid.sh \
  --python "$tv/bin/python" --threads 1 --precisions bf16 --reps 1 --shapes '1,2,1,64,32,1' --out build/smoke >/dev/null
TILEGRAD_LIB="$PWD/build/libtilegrad.so" "$tv/bin/python" bench/op_overhead.py --threads 1 --pairs 1 --shapes '1,1,1,16,64,1' >/dev/null
for n in 1 2; do build/tilegrad bench --section attn --shapes '1,2,1,64,32,1' --reps 1 --threads $n >build/smoke/attn-$n.txt; done
python3 bench/scaling_ratio.py build/smoke/attn-1.txt build/smoke/attn-2.txt >/dev/null
python3 bench/head_dims.py --tilegrad build/tilegrad --threads 1 --rounds 1 --reps 1 --isa portable \
  --shape '1,1,1,32,{D},1' --dims 64-96:8 >/dev/null
TILEGRAD_LIB="$PWD/build/libtilegrad.so" "$tv/bin/python" bench/lce_bench.py --T 64 --hidden 32 \
  --vocab 1000 --runs 1 --steps 1 --threads 1 >/dev/null
TILEGRAD_LIB="$PWD/build/libtilegrad.so" "$tv/bin/python" bench/step_memory.py --config qwen2.5-0.5b \
  --layers 1 --seq 32 --threads 1 --backends sdpa,all >/dev/null
TILEGRAD_LIB="$PWD/build/libtilegrad.so" "$tv/bin/python" bench/train_model.py --quick --steps 3 \
  --threads 1 --profile-steps 1 --json build/smoke/train-quick.json >/dev/null

stage pip-install "pip install ./python in a fresh venv, then import it from elsewhere"
bash python/ci_install_check.sh --offline

stage fuzz "libFuzzer: replay fuzz/corpus, then 30 s of fuzzing (fuzz/README.md)"
bash fuzz/run.sh 30

stage race "race check: ThreadSanitizer + Archer over every accumulating kernel"
bash scripts/race_check.sh

stage clang "clang build: every table's microkernel suite (the row ops' bits under clang's pragmas)"
CC=clang cmake -S . -B build-clang -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build-clang -j"$jobs" --target test_micro >/dev/null
(cd build-clang && ctest -R '^test_micro\.' --output-on-failure)
stage multihost "ring attention, DDP, resume and dead peers across 4 hosts (network namespaces; tests/multihost)"
# exit 77: this machine cannot make namespaces (not root, no netns): a skip,
# printed with its reason, not a pass and not a failure
mh=0
PYTHON="$tv/bin/python" TILEGRAD_LIB="$PWD/build/libtilegrad.so" bash tests/multihost/run.sh || mh=$?
if [ "$mh" = 77 ]; then echo "== multihost: skipped (the reason is above)"; elif [ "$mh" != 0 ]; then exit "$mh"; fi
stage done "total $SECONDS s"
