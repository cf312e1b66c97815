#!/usr/bin/env python3
"""The bf16 dot GEMM of one table (mm_bf16_pairs after pack_bf16_pairs)
against a float64 reference, through ctypes, for machines without cmocka
(bench/amx_check.sh runs it; tests/test_micro.c's test_bf16_dot_gemm is the
full check). Needs numpy.

    python3 bench/amx_kernel_check.py build/libtilegrad.so [amx]

Reads the table's function pointers from the exported tg_isa_ops_<isa>
(isa/ops.h: name, six ints, mm_nn, mm_tn_acc, mm_bf16_pairs,
bf16_dot_begin, bf16_dot_end, pack_bf16_pairs). Ragged sizes (16 x 16
tiles, 32 x 32 blocks, K % 32), A at an odd element offset with NaN row padding, Bp with NaN column
padding, C outside [M, N] NaN and then a finite value that must come back
bit for bit; |err| <= (K + 3) 2^-24 sum |a b| (+ |C|). Exit 1 on a failure.
"""
import ctypes as C
import sys

import numpy as np

lib = C.CDLL(sys.argv[1])
isa = sys.argv[2] if len(sys.argv) > 2 else "amx"
isa_id = C.c_int()
if lib.tg_isa_from_name(isa.encode(), C.byref(isa_id)) != 0:  # TG_OK is 0
    sys.exit(f"{isa}: not an ISA this library knows")
if not lib.tg_isa_available(isa_id):  # (for amx: also the Linux permission request)
    print(f"{isa}: not available on this CPU/OS/build")
    sys.exit(77)
table = C.addressof(C.c_char.in_dll(lib, "tg_isa_ops_" + isa))
fn = lambda off: C.c_void_p.from_address(table + off).value  # noqa: E731
I64, P = C.c_int64, C.c_void_p
mm = C.CFUNCTYPE(None, C.c_int, C.c_int, C.c_int, P, I64, P, I64, P, I64, C.c_int)(fn(48))
pack = C.CFUNCTYPE(None, I64, I64, P, I64, P, I64)(fn(72))


def to_bf16(x):  # truncation: any bf16 values will do
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


def widen(u):
    return (u.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


rng = np.random.default_rng(1)
sizes = [(1, 1, 2), (32, 32, 30), (16, 16, 32), (33, 47, 80), (31, 17, 2), (64, 96, 66),
         (40, 80, 128), (100, 37, 256), (47, 64, 34), (64, 64, 64), (64, 64, 128),
         (15, 31, 30), (0, 8, 32), (8, 0, 32), (6, 5, 0), (128, 64, 256), (64, 64, 512)]
fails = 0
for M, N, K in sizes:
    lda, ldx, ldb, ldc = K + 6, K + 2, N + 3, N + 5
    A = to_bf16(rng.uniform(-2, 2, (M, lda)))
    A[:, K:] = 0x7FC0
    X = to_bf16(rng.uniform(-2, 2, (N, ldx)))
    Abuf = np.zeros(M * lda + 1, np.uint16)
    Abuf[1:] = A.ravel()  # A at an odd element offset
    Bp = np.full((K // 2, ldb), 0x7FC07FC0, np.uint32)
    pack(N, K, X.ctypes.data, ldx, Bp.ctypes.data, ldb)
    ref = widen(A[:, :K]) @ widen(X[:, :K]).T
    mag = np.abs(widen(A[:, :K])) @ np.abs(widen(X[:, :K])).T
    c_in = rng.uniform(-1, 1, (M, N)).astype(np.float32)
    for acc, outside in ((0, np.nan), (1, np.nan), (0, 12345.0), (1, 12345.0)):
        C0 = np.full((M + 2, ldc), outside, np.float32)
        C0[:M, :N] = c_in
        Cm = C0.copy()
        mm(M, N, K, Abuf.ctypes.data + 2, lda, Bp.ctypes.data, ldb, Cm.ctypes.data, ldc, acc)
        want = ref + (c_in if acc else 0)
        bound = (K + 3) * 2.0**-24 * (mag + (np.abs(c_in) if acc else 0))
        err = np.abs(Cm[:M, :N] - want)
        inside_ok = bool(np.all(err <= bound))  # (a NaN fails)
        o, o0 = Cm.view(np.uint32).copy(), C0.view(np.uint32).copy()
        o[:M, :N] = o0[:M, :N] = 0
        outside_ok = np.array_equal(o, o0)
        if not (inside_ok and outside_ok):
            fails += 1
            ratio = np.nanmax(err / np.maximum(bound, 1e-300)) if M * N else 0
            print(f"FAIL {isa} M={M} N={N} K={K} accumulate={acc} outside={outside}: "
                  f"max err/bound {ratio:.3g}, outside unchanged: {outside_ok}")
print(f"{isa} mm_bf16_pairs: {len(sizes) * 4 - fails} of {len(sizes) * 4} runs passed")
sys.exit(1 if fails else 0)
