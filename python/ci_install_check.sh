#!/usr/bin/env bash
# CI check of the Python package's install path:
#   1. a fresh venv with --system-site-packages (Debian's python3 is
#      externally managed, PEP 668; the venv still sees Debian's numpy/torch),
#   2. the packages: an sdist (`setup.py sdist`), checked to carry the C
#      sources, and a wheel (`pip wheel ./python`), checked to be tagged
#      py3-none-<platform> (ctypes, no extension module: any CPython 3),
#   3. `pip install` of the sdist -- setup.py builds libtilegrad with CMake
#      from the sdist's csrc/, away from the repository, and bundles it,
#   4. from another directory, with an empty environment (no TILEGRAD_LIB,
#      nothing on PYTHONPATH), import tilegrad, check that the bundled
#      library is the one loaded, and run attention forward/backward through
#      the autograd wrapper against a float64 reference,
#   5. the wheel into a second fresh venv (nothing built: the library it
#      bundles) and the same smoke test from there.
#
# Usage: python/ci_install_check.sh [--offline]
#   --offline: pip install --no-build-isolation --no-index (uses the venv's
#              setuptools/wheel and Debian's numpy; no PyPI access needed)
# Needs (Debian): python3 python3-venv python3-numpy python3-torch cmake make gcc
# Environment: PYTHON (default /usr/bin/python3), KEEP_VENV=1 keeps the venv.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${PYTHON:-/usr/bin/python3}"
pip_args=(--disable-pip-version-check --no-cache-dir)
[ "${1:-}" = "--offline" ] && pip_args+=(--no-build-isolation --no-index)

work="$(mktemp -d /tmp/tilegrad-install-check.XXXXXX)"
[ "${KEEP_VENV:-0}" = 1 ] || trap 'rm -rf "$work"' EXIT
echo "== venv: $work/venv ($("$python" --version))"
"$python" -m venv --system-site-packages "$work/venv"

echo "== sdist and wheel"
(cd "$repo/python" && "$work/venv/bin/python" setup.py -q sdist -d "$work/dist" 2>/dev/null)
sdist=$(ls "$work"/dist/tilegrad-*.tar.gz)
tar tzf "$sdist" >"$work/sdist.txt"
for f in CMakeLists.txt include/tilegrad.h kernels/attention_bwd.c engine/context.c isa/isa.cmake isa/select.c; do
  grep -qx "tilegrad-[0-9.]*/csrc/$f" "$work/sdist.txt" || { echo "sdist lacks csrc/$f"; exit 1; }
done
(cd "$repo" && "$work/venv/bin/python" -m pip wheel "${pip_args[@]}" -q --no-deps -w "$work/dist" ./python)
wheel=$(basename "$(ls "$work"/dist/tilegrad-*.whl)")
echo "   $(basename "$sdist") ($(grep -c /csrc/ "$work/sdist.txt") C source entries), $wheel"
[[ "$wheel" =~ ^tilegrad-[0-9.]+-py3-none-linux_[a-z0-9_]+\.whl$ ]] ||
  { echo "wheel tag is not py3-none-<platform>: $wheel"; exit 1; }

echo "== pip install the sdist (builds from its csrc/, away from the repository)"
(cd "$work" && "$work/venv/bin/python" -m pip install "${pip_args[@]}" "$sdist")

# The smoke test, run from $work with an empty environment by each venv's
# python: the bundled library is the one loaded; FA-2 forward and backward
# through autograd against float64.
smoke() {
  (cd "$work" && env -i PATH=/usr/bin:/bin HOME="$work" "$1" - <<'PYEOF'
import os, torch, tilegrad, tilegrad.torch as tt
lib = tilegrad.library().path
print("tilegrad", tilegrad.__version__, "from", os.path.dirname(tilegrad.__file__), "| library", lib, "| isa", tilegrad.default_context().isa)
assert lib.startswith(os.path.dirname(tilegrad.__file__)), "the bundled library must be loaded"
torch.manual_seed(0)
q, k, v = (torch.randn(1, h, 48, 64).to(torch.bfloat16).requires_grad_() for h in (4, 2, 2))
o = tt.attention(q, k, v, causal=True)                 # FA-2 forward (GQA 4:2)
o.float().square().sum().backward()                    # FA-2 backward through autograd
Q, K, V = (t.detach().double().requires_grad_() for t in (q, k, v))
S = Q @ K.repeat_interleave(2, 1).transpose(-1, -2) / 8
O = torch.softmax(S.masked_fill(~torch.ones(48, 48, dtype=torch.bool).tril(), float("-inf")), -1) @ V.repeat_interleave(2, 1)
O.square().sum().backward()
for name, a, b in (("O", o, O), ("dq", q.grad, Q.grad), ("dk", k.grad, K.grad), ("dv", v.grad, V.grad)):
    err = float((a.double() - b).norm() / b.norm())
    print(f"  {name}: relative error {err:.2e}")
    assert err < 2 ** -6, name
print("install check OK")
PYEOF
  )
}

echo "== smoke test of the sdist install, from $work, empty environment"
smoke "$work/venv/bin/python"

echo "== the wheel into a second fresh venv (no build: the bundled library), smoke test"
"$python" -m venv --system-site-packages "$work/venv-wheel"
"$work/venv-wheel/bin/python" -m pip install "${pip_args[@]}" -q "$work/dist/$wheel"
smoke "$work/venv-wheel/bin/python"
