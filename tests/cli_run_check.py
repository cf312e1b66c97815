#!/usr/bin/env python3
"""End-to-end check of `tilegrad run` (python3 stdlib + numpy only).

Writes small random .npy inputs, runs every kernel through the CLI and
compares the outputs with a float64 numpy reference computed from the very
same (bf16-rounded) inputs. Also checks the error paths: exit status 1 with
the library's message for a kernel error, 2 with the file name for bad files.

usage: python3 tests/cli_run_check.py path/to/tilegrad [--seed N] [--keep]

Tolerance: every float output element must satisfy
    |got - ref| <= RTOL * mag + ATOL,   RTOL = 3e-5, ATOL = 1e-6,
where `mag` is the reference formula evaluated with absolute values of every
term (the scale of f32 rounding error for that element). Exact kernels
(cast, transpose) must match bit for bit.
"""
import os
import re
import subprocess
import sys
import tempfile

import numpy as np

RTOL = 3e-5
ATOL = 1e-6

BIN = None
TMP = None
FAILS = []
WORST = {}


# --- helpers -----------------------------------------------------------------
def f32_to_bf16(x):
    """Round-to-nearest-even f32 -> bf16 bits (uint16); NaN -> 0x7FC0."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    r[np.isnan(x)] = 0x7FC0
    return r


def bf16_to_f64(b):
    return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def rand_bf16(rng, shape, lo=-1.0, hi=1.0):
    return f32_to_bf16(rng.uniform(lo, hi, size=shape).astype(np.float32))


def rand_f32(rng, shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def run(kernel, ins, outs, params=None, extra=(), expect_rc=0, what=None):
    """Runs `tilegrad run kernel`; returns (outputs dict, stderr)."""
    tag = what or kernel
    args = [BIN, "run", kernel, "--quiet"]
    for name, arr in ins.items():
        path = os.path.join(TMP, f"{tag}.in.{name}.npy")
        if isinstance(arr, str):  # a prepared file
            path = arr
        else:
            np.save(path, arr)
        args += ["--in", f"{name}={path}"]
    out_paths = {}
    for name in outs:
        out_paths[name] = os.path.join(TMP, f"{tag}.out.{name}.npy")
        if os.path.exists(out_paths[name]):
            os.remove(out_paths[name])
        args += ["--out", f"{name}={out_paths[name]}"]
    for k, v in (params or {}).items():
        args += ["--param", f"{k}={v}"]
    args += list(extra)
    env = dict(os.environ, OMP_WAIT_POLICY="passive")
    p = subprocess.run(args, capture_output=True, text=True, env=env)
    if "Sanitizer" in p.stderr or "runtime error:" in p.stderr:
        fail(f"{tag}: sanitizer report\n  cmd: {' '.join(args)}\n  stderr: {p.stderr}")
        return None, p.stderr
    if p.returncode != expect_rc:
        fail(f"{tag}: exit {p.returncode}, want {expect_rc}\n  cmd: {' '.join(args)}\n"
             f"  stderr: {p.stderr.strip()}")
        return None, p.stderr
    if expect_rc != 0:
        return None, p.stderr
    return {n: np.load(path) for n, path in out_paths.items()}, p.stderr


def fail(msg):
    FAILS.append(msg)
    print("FAIL:", msg)


def check(what, got, ref, mag):
    """|got - ref| <= RTOL*mag + ATOL elementwise (got is float32)."""
    if got is None:
        return
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        fail(f"{what}: shape {got.shape}, want {ref.shape}")
        return
    if got.dtype != np.float32:
        fail(f"{what}: dtype {got.dtype}, want float32")
        return
    g = got.astype(np.float64)
    bound = RTOL * np.asarray(mag, dtype=np.float64) + ATOL
    err = np.abs(g - ref)
    bad = ~(err <= bound)  # also catches NaN
    ratio = float(np.max(err / bound)) if err.size else 0.0
    WORST[what] = ratio
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, np.inf, err / bound)), err.shape)
        fail(f"{what}: {int(bad.sum())} of {err.size} elements out of bound; worst at {i}: "
             f"got {g[i]!r} want {ref[i]!r} bound {bound[i]!r}")


def check_exact(what, got, ref):
    if got is None:
        return
    if got.shape != ref.shape or got.dtype != ref.dtype or not np.array_equal(
            got.view(np.uint8), np.ascontiguousarray(ref).view(np.uint8)):
        fail(f"{what}: not bitwise equal (got {got.dtype}{got.shape}, "
             f"want {ref.dtype}{ref.shape})")
    else:
        WORST[what] = 0.0


# --- kernels 1-3: attention backward and cast --------------------------------
def hidden_keys(qL, kL, causal, qL_off, window):
    """[qL, kL] True where key k is masked for query i: past the causal
    diagonal (k > i + qL_off) or outside the window (k <= i + qL_off - W)."""
    i = np.arange(qL)[:, None]
    k = np.arange(kL)[None, :]
    hidden = np.zeros((qL, kL), bool)
    if causal:
        hidden |= k > i + qL_off
    if window:
        hidden |= k <= i + qL_off - window
    return hidden


def attention_reference(Q, K, V, dO, Dv, L, scale, causal, qL_off, mask, softcap, window=0):
    """float64 FA-2 backward from bf16 bits / f32 arrays; returns refs and mags.
    V and dO may have Dv != D columns; L includes any sink (the key gradients
    need nothing else from it)."""
    Qf, Kf, Vf, dOf = (bf16_to_f64(a) for a in (Q, K, V, dO))
    B, H, qL, D = Qf.shape
    H_kv, kL = Kf.shape[1], Kf.shape[2]
    g = H // H_kv
    Kh, Vh = np.repeat(Kf, g, axis=1), np.repeat(Vf, g, axis=1)
    s = scale * np.einsum("bhid,bhkd->bhik", Qf, Kh)
    if softcap != 1.0:
        t = np.tanh(s / softcap)
        S = softcap * t
        dcap = 1.0 - t * t
    else:
        S, dcap = s, np.ones_like(s)
    S = np.where(hidden_keys(qL, kL, causal, qL_off, window), -np.inf, S)
    if mask is not None:
        m = bf16_to_f64(mask)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
        S = np.where(m == -np.inf, -np.inf, S + m)
    Lf = L.astype(np.float64)[..., None]
    with np.errstate(invalid="ignore"):
        P = np.where(S == -np.inf, 0.0, np.exp(S - Lf))
    dP = np.einsum("bhid,bhkd->bhik", dOf, Vh)
    dPa = np.einsum("bhid,bhkd->bhik", np.abs(dOf), np.abs(Vh))
    Dd = Dv.astype(np.float64)[..., None]
    dS = P * (dP - Dd) * dcap
    dSa = P * (dPa + np.abs(Dd)) * dcap
    dQ = scale * np.einsum("bhik,bhkd->bhid", dS, Kh)
    dQm = scale * np.einsum("bhik,bhkd->bhid", dSa, np.abs(Kh))
    red = lambda x: x.reshape(B, H_kv, g, kL, x.shape[-1]).sum(axis=2)
    dK = red(scale * np.einsum("bhik,bhid->bhkd", dS, Qf))
    dKm = red(scale * np.einsum("bhik,bhid->bhkd", dSa, np.abs(Qf)))
    dV = red(np.einsum("bhik,bhid->bhkd", P, dOf))
    dVm = red(np.einsum("bhik,bhid->bhkd", P, np.abs(dOf)))
    # magnitudes of P's own error: P ~ exp(S - L) is computed from |S|, |L|
    return (dQ, dQm), (dK, dKm), (dV, dVm)


def forward_lse_and_D(Q, K, V, dO, scale, causal, qL_off, mask, softcap, window=0,
                      sinks=None):
    """What the forward would hand the backward: L (f32) and D = rowsum(O*dO),
    and O (bf16 bits). A sink s_h joins each row's denominator:
    L = log(sum_k e^S + e^s_h); a row that sees no key has O = 0, L = s_h."""
    Qf, Kf, Vf, dOf = (bf16_to_f64(a) for a in (Q, K, V, dO))
    B, H, qL, D = Qf.shape
    g = H // Kf.shape[1]
    kL = Kf.shape[2]
    Kh, Vh = np.repeat(Kf, g, axis=1), np.repeat(Vf, g, axis=1)
    S = scale * np.einsum("bhid,bhkd->bhik", Qf, Kh)
    if softcap != 1.0:
        S = softcap * np.tanh(S / softcap)
    S = np.where(hidden_keys(qL, kL, causal, qL_off, window), -np.inf, S)
    if mask is not None:
        m = bf16_to_f64(mask)
        m = m.reshape((1,) * (4 - m.ndim) + m.shape)
        S = np.where(m == -np.inf, -np.inf, S + m)
    sink = np.full((1, H, 1, 1), -np.inf)
    if sinks is not None:
        sink[0, :, 0, 0] = sinks.astype(np.float64)
    Mx = np.maximum(np.max(S, axis=-1, keepdims=True), sink)
    Mx_safe = np.where(np.isfinite(Mx), Mx, 0.0)
    E = np.exp(S - Mx_safe)
    sumE = E.sum(-1, keepdims=True) + np.exp(sink - Mx_safe)
    with np.errstate(divide="ignore", invalid="ignore"):
        L = np.where(sumE > 0, Mx_safe + np.log(sumE), -np.inf)[..., 0]
        P = np.where(sumE > 0, E / sumE, 0.0)
    O = f32_to_bf16(np.einsum("bhik,bhkd->bhid", P, Vh).astype(np.float32))
    Dv = (bf16_to_f64(O) * dOf).sum(-1)
    return L.astype(np.float32), Dv.astype(np.float32), O


def test_cast(rng):
    x = rand_f32(rng, (3, 5, 7), -100, 100)
    x.flat[:8] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 3.4e38, 1e-40, 1.00390625]
    out, _ = run("f32_to_bf16_cast", {"src": x}, ["dst"])
    if out:
        check_exact("cast dst", out["dst"], f32_to_bf16(x))


def test_compute_d(rng):
    B, H, qL, D = 2, 3, 37, 64
    O, dO = rand_bf16(rng, (B, H, qL, D)), rand_bf16(rng, (B, H, qL, D))
    out, _ = run("flash_attn_train_bwd_compute_d_bf16", {"O": O, "dO": dO}, ["D_out"])
    if out:
        prod = bf16_to_f64(O) * bf16_to_f64(dO)
        check("compute_d D_out", out["D_out"], prod.sum(-1), np.abs(prod).sum(-1))


def attention_case(rng, tag, B, H, H_kv, qL, kL, D, causal, mask_shape, softcap,
                   qL_off=None, dk_start=False, extra=()):
    scale = 1.0 / np.sqrt(D)
    off = kL - qL if qL_off is None else qL_off
    Q = rand_bf16(rng, (B, H, qL, D))
    K = rand_bf16(rng, (B, H_kv, kL, D))
    V = rand_bf16(rng, (B, H_kv, kL, D))
    dO = rand_bf16(rng, (B, H, qL, D))
    mask = None
    if mask_shape is not None:
        m = rng.uniform(-2, 2, size=mask_shape).astype(np.float32)
        m[rng.uniform(size=mask_shape) < 0.2] = -np.inf
        m[..., 1, :] = -np.inf  # a fully masked query row: must give zeros, no NaN
        mask = f32_to_bf16(m)
    L, Dv, _ = forward_lse_and_D(Q, K, V, dO, scale, causal, off, mask, softcap)
    ins = {"Q": Q, "K": K, "V": V, "L": L, "dO": dO, "D_vec": Dv}
    if mask is not None:
        ins["mask"] = mask
    start_K = start_V = 0.0
    if dk_start:
        start_K = rand_f32(rng, (B, H_kv, kL, D))
        start_V = rand_f32(rng, (B, H_kv, kL, D))
        ins["dK"], ins["dV"] = start_K, start_V
    params = {"causal": int(causal)}
    if softcap != 1.0:
        params["softcapping"] = softcap
    if qL_off is not None:
        params["qL_off"] = qL_off
    out, _ = run("flash_attn_train_bwd_bf16", ins, ["dQ", "dK", "dV"], params, extra,
                 what=f"attn_{tag}")
    if not out:
        return None
    (dQ, dQm), (dK, dKm), (dV, dVm) = attention_reference(
        Q, K, V, dO, Dv, L, scale, causal, off, mask, softcap)
    check(f"attn {tag} dQ", out["dQ"], dQ, dQm)
    check(f"attn {tag} dK", out["dK"], dK + start_K, dKm + np.abs(start_K))
    check(f"attn {tag} dV", out["dV"], dV + start_V, dVm + np.abs(start_V))
    return out


def test_attention(rng):
    attention_case(rng, "plain", 1, 2, 2, 40, 40, 64, False, None, 1.0)
    attention_case(rng, "gqa_causal_mask", 2, 4, 2, 33, 50, 64, True, (1, 4, 33, 50), 1.0)
    attention_case(rng, "mask2d_acc", 1, 4, 1, 20, 24, 32, False, (20, 24), 1.0,
                   dk_start=True)
    attention_case(rng, "softcap_qloff0", 2, 2, 1, 24, 40, 16, True, None, 30.0, qL_off=0)
    attention_case(rng, "bcast_batch_mask", 2, 2, 2, 16, 16, 128, False, (1, 2, 16, 16), 1.0)
    # determinism across thread counts (bitwise)
    seed = int(rng.integers(1 << 30))
    a = attention_case(np.random.default_rng(seed), "det1", 2, 4, 2, 45, 70, 64, True, None,
                       1.0, extra=["--deterministic", "--threads", "1"])
    b = attention_case(np.random.default_rng(seed), "det3", 2, 4, 2, 45, 70, 64, True, None,
                       1.0, extra=["--deterministic", "--threads", "3"])
    if a and b:
        for n in ("dQ", "dK", "dV"):
            check_exact(f"attn deterministic {n} threads 1 vs 3", b[n], a[n])


def test_attention_pipeline(rng):
    """compute_d output fed to the backward through files, as a user would."""
    B, H, qL, kL, D = 1, 2, 32, 48, 64
    Q, dO = rand_bf16(rng, (B, H, qL, D)), rand_bf16(rng, (B, H, qL, D))
    K, V = rand_bf16(rng, (B, H, kL, D)), rand_bf16(rng, (B, H, kL, D))
    scale = 1.0 / np.sqrt(D)
    L, Dv, O = forward_lse_and_D(Q, K, V, dO, scale, True, kL - qL, None, 1.0)
    out, _ = run("flash_attn_train_bwd_compute_d_bf16", {"O": O, "dO": dO}, ["D_out"],
                 what="pipe_d")
    if not out:
        return
    out2, _ = run("flash_attn_train_bwd_bf16",
                  {"Q": Q, "K": K, "V": V, "L": L, "dO": dO,
                   "D_vec": os.path.join(TMP, "pipe_d.out.D_out.npy")},
                  ["dQ", "dK", "dV"], {"causal": 1}, what="pipe_bwd")
    if out2:
        (dQ, dQm), _, _ = attention_reference(Q, K, V, dO, out["D_out"], L, scale, True,
                                              kL - qL, None, 1.0)
        check("pipeline dQ", out2["dQ"], dQ, dQm)


# --- kernels 4-11 ---------------------------------------------------------------
def test_rmsnorm(rng):
    rows, dim, eps = 7, 96, 1e-5
    x, w, dy = rand_f32(rng, (rows, dim)), rand_f32(rng, (dim,)), rand_f32(rng, (rows, dim))
    X, W, DY = (a.astype(np.float64) for a in (x, w, dy))
    r = 1.0 / np.sqrt((X * X).mean(-1) + eps)
    out, _ = run("rms_norm_compute_rms_inv_f32", {"x": x}, ["r_out"], {"eps": eps})
    if out:
        check("rms_inv r_out", out["r_out"], r, r)
    r32 = r.astype(np.float32)
    R = r32.astype(np.float64)
    s = (DY * X * W).sum(-1, keepdims=True)
    sa = np.abs(DY * X * W).sum(-1, keepdims=True)
    dx = R[:, None] * (DY * W - X * s * R[:, None] ** 2 / dim)
    dxm = R[:, None] * (np.abs(DY * W) + np.abs(X) * sa * R[:, None] ** 2 / dim)
    out, _ = run("rms_norm_backward_dx_f32", {"x": x, "w": w, "dy": dy, "r": r32}, ["dx"])
    if out:
        check("rms dx", out["dx"], dx, dxm)
    dw = (DY * X * R[:, None]).sum(0)
    dwm = np.abs(DY * X * R[:, None]).sum(0)
    out, _ = run("rms_norm_backward_dw_f32", {"x": x, "dy": dy, "r": r32}, ["dw"])
    if out:
        check("rms dw", out["dw"], dw, dwm)
    # fused: r recomputed inside; grad_weight accumulates onto a start value
    g0 = rand_f32(rng, (dim,))
    s = (DY * X * W).sum(-1, keepdims=True)
    dx = r[:, None] * (DY * W - X * s * r[:, None] ** 2 / dim)
    dxm = r[:, None] * (np.abs(DY * W) + np.abs(X) * sa * r[:, None] ** 2 / dim) * 4
    dw = (DY * X * r[:, None]).sum(0)
    out, _ = run("rms_norm_backward", {"input": x, "weight": w, "grad_out": dy,
                                       "grad_weight": g0},
                 ["grad_input", "grad_weight"], {"eps": eps})
    if out:
        check("rms fused grad_input", out["grad_input"], dx, dxm)
        check("rms fused grad_weight", out["grad_weight"], dw + g0, 4 * dwm + np.abs(g0))


def test_forward(rng):
    """Training forward (O, L) and RMSNorm forward against float64."""
    B, H, H_kv, qL, kL, D = 2, 4, 2, 37, 50, 24
    Q, K, V = (rand_bf16(rng, s) for s in ((B, H, qL, D), (B, H_kv, kL, D), (B, H_kv, kL, D)))
    scale = 1.0 / np.sqrt(D)
    L, _, _ = forward_lse_and_D(Q, K, V, np.zeros_like(Q), scale, True, kL - qL, None, 1.0)
    Qf, Kf, Vf = (bf16_to_f64(a) for a in (Q, K, V))
    Kh, Vh = np.repeat(Kf, H // H_kv, axis=1), np.repeat(Vf, H // H_kv, axis=1)
    S = scale * np.einsum("bhid,bhkd->bhik", Qf, Kh)
    S = np.where(np.arange(kL)[None, :] > np.arange(qL)[:, None] + kL - qL, -np.inf, S)
    P = np.exp(S - L.astype(np.float64)[..., None])
    O = np.einsum("bhik,bhkd->bhid", P, Vh)
    Om = np.einsum("bhik,bhkd->bhid", P, np.abs(Vh))
    out, _ = run("flash_attn_train_fwd_bf16", {"Q": Q, "K": K, "V": V}, ["O", "L"],
                 {"causal": 1})
    if out:
        # O is bf16: rounding adds up to 2^-8 |O| (expressed in units of RTOL)
        check("fwd O", bf16_to_f64(out["O"]).astype(np.float32), O,
              Om + np.abs(O) * 2.0 ** -8 / RTOL)
        check("fwd L", out["L"], L.astype(np.float64), np.abs(L) + 1.0)
    rows, dim, eps = 5, 70, 1e-6
    x, w = rand_f32(rng, (rows, dim)), rand_f32(rng, (dim,))
    X, W = x.astype(np.float64), w.astype(np.float64)
    r = 1.0 / np.sqrt((X * X).mean(-1) + eps)
    out, _ = run("rms_norm_forward_f32", {"x": x, "w": w}, ["y", "r_out"], {"eps": eps})
    if out:
        check("rms fwd y", out["y"], X * r[:, None] * W, np.abs(X * r[:, None] * W))
        check("rms fwd r_out", out["r_out"], r, r)


def test_softmax_backward(rng):
    n, m = 9, 130
    z = rng.normal(size=(n, m))
    sm = (np.exp(z) / np.exp(z).sum(-1, keepdims=True)).astype(np.float32)
    go = rand_f32(rng, (n, m))
    S, G = sm.astype(np.float64), go.astype(np.float64)
    dot = (S * G).sum(-1, keepdims=True)
    ref = S * (G - dot)
    mag = S * (np.abs(G) + np.abs(S * G).sum(-1, keepdims=True))
    out, _ = run("softmax_backward", {"sm": sm, "grad_out": go}, ["grad_in"])
    if out:
        check("softmax grad_in", out["grad_in"], ref, mag)


def test_embedding(rng):
    seq, dim, vocab = 40, 24, 11
    go = rand_f32(rng, (seq, dim))
    ids = rng.integers(0, vocab, size=seq).astype(np.int32)  # int32 accepted
    ref = np.zeros((vocab, dim))
    mag = np.zeros((vocab, dim))
    for t in range(seq):
        ref[ids[t]] += go[t]
        mag[ids[t]] += np.abs(go[t])
    out, _ = run("embedding_backward", {"grad_out": go, "ids": ids}, ["grad_weight"],
                 {"vocab_size": vocab})
    if out:
        check("embedding grad_weight", out["grad_weight"], ref, mag)
    g0 = rand_f32(rng, (vocab, dim))
    out, _ = run("embedding_backward", {"grad_out": go, "ids": ids.astype(np.uint32),
                                        "grad_weight": g0}, ["grad_weight"],
                 what="embedding_acc")
    if out:
        check("embedding grad_weight (acc)", out["grad_weight"], ref + g0, mag + np.abs(g0))
    bad = ids.copy()
    bad[5] = vocab
    _, err = run("embedding_backward", {"grad_out": go, "ids": bad}, ["grad_weight"],
                 {"vocab_size": vocab}, expect_rc=1, what="embedding_badid")
    if "index" not in err.lower():
        fail(f"embedding bad id: stderr lacks the status text: {err.strip()}")
    neg = ids.copy()
    neg[3] = -1
    _, err = run("embedding_backward", {"grad_out": go, "ids": neg}, ["grad_weight"],
                 {"vocab_size": vocab}, expect_rc=2, what="embedding_negid")
    if "negative" not in err or "embedding_negid.in.ids.npy" not in err:
        fail(f"embedding negative id: unexpected message: {err.strip()}")


def test_cross_entropy(rng):
    n, vocab, pad = 12, 50, 3
    logits = rand_f32(rng, (n, vocab), -5, 5)
    targets = rng.integers(0, vocab, size=n).astype(np.uint32)
    targets[[2, 7]] = pad
    targets[targets == pad] = pad
    keep = targets != pad
    count = int(keep.sum())
    X = logits.astype(np.float64)
    mx = X.max(-1, keepdims=True)
    lse = mx[:, 0] + np.log(np.exp(X - mx).sum(-1))
    sm = np.exp(X - lse[:, None])
    onehot = np.zeros_like(X)
    onehot[np.arange(n), targets] = 1
    grad = np.where(keep[:, None], (sm - onehot) / count, 0.0)
    loss = (lse - X[np.arange(n), targets])[keep].sum() / count
    loss0 = np.array([0.25], dtype=np.float32)
    out, _ = run("cross_entropy_fwd_bwd", {"logits": logits, "targets": targets,
                                           "loss_out": loss0},
                 ["grad", "loss_out"], {"pad_id": pad})
    if out:
        check("xent grad", out["grad"], grad, (sm + onehot) / count)
        check("xent loss_out", out["loss_out"], [loss + 0.25],
              [np.abs(lse).sum() * 10 / count + 0.25])


def test_transpose(rng):
    x = rand_f32(rng, (17, 33))
    out, _ = run("transpose_2d", {"input": x}, ["output"])
    if out:
        check_exact("transpose output", out["output"], np.ascontiguousarray(x.T))


def test_causal_attention(rng):
    seq, nh, nkv, hd = 19, 4, 2, 16
    Q, K, V, G = (rand_f32(rng, (seq, c * hd)) for c in (nh, nkv, nkv, nh))
    Qh = Q.astype(np.float64).reshape(seq, nh, hd).transpose(1, 0, 2)
    Kh = K.astype(np.float64).reshape(seq, nkv, hd).transpose(1, 0, 2)
    Vh = V.astype(np.float64).reshape(seq, nkv, hd).transpose(1, 0, 2)
    Gh = G.astype(np.float64).reshape(seq, nh, hd).transpose(1, 0, 2)
    g = nh // nkv
    Kr, Vr = np.repeat(Kh, g, axis=0), np.repeat(Vh, g, axis=0)
    sc = 1.0 / np.sqrt(hd)
    S = sc * Qh @ Kr.transpose(0, 2, 1)
    S = np.where(np.triu(np.ones((seq, seq), bool), 1), -np.inf, S)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    dP = Gh @ Vr.transpose(0, 2, 1)
    dPa = np.abs(Gh) @ np.abs(Vr).transpose(0, 2, 1)
    Dd = (P * dP).sum(-1, keepdims=True)
    dS = P * (dP - Dd)
    dSa = P * (dPa + (P * dPa).sum(-1, keepdims=True))
    tok = lambda x, c: x.transpose(1, 0, 2).reshape(seq, c * hd)
    red = lambda x: x.reshape(nkv, g, seq, hd).sum(1)
    dQ, dQm = sc * dS @ Kr, sc * dSa @ np.abs(Kr)
    dK = red(sc * dS.transpose(0, 2, 1) @ Qh)
    dKm = red(sc * dSa.transpose(0, 2, 1) @ np.abs(Qh))
    dV, dVm = red(P.transpose(0, 2, 1) @ Gh), red(P.transpose(0, 2, 1) @ np.abs(Gh))
    out, _ = run("causal_attention_backward", {"grad_out": G, "Q": Q, "K": K, "V": V},
                 ["grad_Q", "grad_K", "grad_V"], {"head_dim": hd})
    if out:
        # the kernel recomputes the softmax: allow its own rounding on top
        check("causal grad_Q", out["grad_Q"], tok(dQ, nh), 4 * tok(dQm, nh))
        check("causal grad_K", out["grad_K"], tok(dK, nkv), 4 * tok(dKm, nkv))
        check("causal grad_V", out["grad_V"], tok(dV, nkv), 4 * tok(dVm, nkv))


D1_SIGNS = bytes.fromhex(
    "a73b91f46dc2580eb37f24d68945ea1c63afd852970be13d76c419fe4a852cdb"
    "d34ea8179c5be63172b90df5438a6ec7582f94e1b63d0a7cc561d84fa3971e85")


def hadamard_undo(x):
    Dd = x.shape[-1]
    Hm = np.array([[1.0]])
    while Hm.shape[0] < Dd:
        Hm = np.block([[Hm, Hm], [Hm, -Hm]])
    sign = np.array([-1.0 if (D1_SIGNS[j >> 3] >> (j & 7)) & 1 else 1.0 for j in range(Dd)])
    return (x @ Hm.T) / np.sqrt(Dd) * sign, (np.abs(x) @ np.abs(Hm.T)) / np.sqrt(Dd)


def test_decode(rng):
    nrows, dv, nwg = 3, 256, 5
    part = rng.uniform(-1, 1, size=(nrows, nwg, dv))
    Sv = rng.uniform(0.5, 2, size=(nrows, nwg))
    Mv = rng.uniform(-3, 3, size=(nrows, nwg))
    Mv[1, 2] = -np.inf  # an empty workgroup
    Sv[1, 2] = 0.0
    # interleave partials in fours: part[r,w,4c+k] at ((r*(dv/4)+c)*nwg+w)*4+k
    pi = part.reshape(nrows, nwg, dv // 4, 4).transpose(0, 2, 1, 3).reshape(-1)
    sm = np.stack([Sv, Mv], -1).reshape(-1)
    htmp = np.concatenate([pi, sm]).astype(np.float32)
    P, S_, M_ = (a.astype(np.float32).astype(np.float64) for a in (part, Sv, Mv))
    Mg = M_.max(1, keepdims=True)
    a = np.exp(M_ - Mg)
    St = (S_ * a).sum(1)
    ref = (P * a[..., None]).sum(1) / St[:, None]
    mag = (np.abs(P) * a[..., None]).sum(1) / St[:, None] * 4
    out, _ = run("flash_attn_vec_reduce", {"htmp": htmp}, ["dst"],
                 {"nrows": nrows, "head_dim": dv})
    if out:
        check("decode reduce dst", out["dst"], ref, mag)
    href, hmag = hadamard_undo(ref)
    out, _ = run("flash_attn_vec_reduce_tq_hb_undo", {"htmp": htmp}, ["output"],
                 {"nrows": nrows, "head_dim": dv, "nwg": nwg})
    if out:
        check("decode tq_hb_undo output", out["output"], href, hadamard_undo(mag)[1] * 4)
    data = rand_f32(rng, (2, 512))
    dref, dmag = hadamard_undo(data.astype(np.float64))
    out, _ = run("fwht_sign_undo_f32", {"data": data}, ["data"])
    if out:
        check("fwht_sign_undo data", out["data"], dref, 4 * dmag)
    _, err = run("flash_attn_vec_reduce", {"htmp": htmp[:-1]}, ["dst"],
                 {"nrows": nrows, "head_dim": dv}, expect_rc=2, what="decode_badlen")
    if "htmp" not in err:
        fail(f"decode bad length: unexpected message: {err.strip()}")


# --- attention variants: window, sinks, value head dim ---------------------------
def sinks_reference(sinks, L, Dvec):
    """d_sinks[h] = -sum_{b,i} e^{s_h - L[b,h,i]} D_vec[b,h,i], and its
    magnitude (the exponent's f32 rounding scales with |s_h| + |L|)."""
    s = sinks.astype(np.float64)[None, :, None]
    Lf, Df = L.astype(np.float64), Dvec.astype(np.float64)
    with np.errstate(invalid="ignore"):
        p = np.where(s == -np.inf, 0.0, np.exp(s - Lf))
    mag = np.where(p > 0, p * np.abs(Df) * (1 + np.abs(s) + np.abs(Lf)), 0.0)
    return -(p * Df).sum(axis=(0, 2)), mag.sum(axis=(0, 2))


def variant_forward_case(rng, tag, B, H, H_kv, qL, kL, D, Dv, causal, window, qL_off,
                         with_sinks):
    """The forward with --window / --sinks / --v-head-dim against float64."""
    Q = rand_bf16(rng, (B, H, qL, D))
    K = rand_bf16(rng, (B, H_kv, kL, D))
    V = rand_bf16(rng, (B, H_kv, kL, Dv))
    scale = 1.0 / np.sqrt(D)
    off = kL - qL if qL_off is None else qL_off
    sinks = None
    ins = {"Q": Q, "K": K, "V": V}
    extra = ["--window", str(window)]
    if with_sinks:
        sinks = rand_f32(rng, (H,), -1.0, 2.0)
        sinks[0] = -np.inf  # -inf: that head has no sink
        ins["sinks"] = sinks
    if Dv != D:
        extra += ["--v-head-dim", str(Dv)]
    params = {"causal": int(causal)}
    if qL_off is not None:
        params["qL_off"] = qL_off
    out, _ = run("flash_attn_train_fwd_bf16", ins, ["O", "L"], params, extra,
                 what=f"variant_fwd_{tag}")
    if not out:
        return
    L, _, _ = forward_lse_and_D(Q, K, V, np.zeros((B, H, qL, Dv), np.uint16), scale, causal,
                                off, None, 1.0, window, sinks)
    Qf, Kf, Vf = (bf16_to_f64(a) for a in (Q, K, V))
    Kh, Vh = np.repeat(Kf, H // H_kv, axis=1), np.repeat(Vf, H // H_kv, axis=1)
    S = scale * np.einsum("bhid,bhkd->bhik", Qf, Kh)
    S = np.where(hidden_keys(qL, kL, causal, off, window), -np.inf, S)
    with np.errstate(invalid="ignore"):
        P = np.where(S == -np.inf, 0.0, np.exp(S - L.astype(np.float64)[..., None]))
    O = np.einsum("bhik,bhkd->bhid", P, Vh)
    Om = np.einsum("bhik,bhkd->bhid", P, np.abs(Vh))
    # O is bf16: rounding adds up to 2^-8 |O| (expressed in units of RTOL)
    check(f"variant fwd {tag} O", bf16_to_f64(out["O"]).astype(np.float32), O,
          Om + np.abs(O) * 2.0 ** -8 / RTOL)
    Lref = L.astype(np.float64)
    if not np.isfinite(Lref).all():  # rows that see no key and no sink: -inf both
        same = (out["L"] == Lref) | (np.isfinite(Lref) & np.isfinite(out["L"]))
        if not same.all():
            fail(f"variant fwd {tag} L: -inf rows differ")
        Lref = np.where(np.isfinite(Lref), Lref, 0.0)
        out["L"] = np.where(np.isfinite(out["L"]), out["L"], 0.0).astype(np.float32)
    check(f"variant fwd {tag} L", out["L"], Lref, np.abs(Lref) + 1.0)


def test_variant_forward(rng):
    # GQA, causal window, sinks (one -inf), Dv < D, qL_off -3: rows 0-2 see
    # no key (O = 0, L = s_h)
    variant_forward_case(rng, "causal_w9_sinks_dv16", 2, 4, 2, 37, 50, 32, 16, True, 9, -3,
                         True)
    # not causal: key k visible iff k > i + qL_off - W; Dv > D
    variant_forward_case(rng, "full_w7_dv64", 1, 2, 2, 24, 40, 32, 64, False, 7, None, False)


def test_variant_pipeline(rng):
    """forward -> compute_d -> backward through files, every variant at once:
    window, sinks with d_sinks accumulated onto a start, Dv != D, GQA."""
    B, H, H_kv, qL, kL, D, Dv, W = 2, 4, 2, 33, 45, 32, 24, 10
    Q = rand_bf16(rng, (B, H, qL, D))
    K = rand_bf16(rng, (B, H_kv, kL, D))
    V = rand_bf16(rng, (B, H_kv, kL, Dv))
    dO = rand_bf16(rng, (B, H, qL, Dv))
    sinks = rand_f32(rng, (H,), -1.0, 2.0)
    scale = 1.0 / np.sqrt(D)
    var = ["--window", str(W), "--v-head-dim", str(Dv)]
    fwd, _ = run("flash_attn_train_fwd_bf16", {"Q": Q, "K": K, "V": V, "sinks": sinks},
                 ["O", "L"], {"causal": 1}, var, what="vpipe_fwd")
    if not fwd:
        return
    d, _ = run("flash_attn_train_bwd_compute_d_bf16", {"O": fwd["O"], "dO": dO}, ["D_out"],
               what="vpipe_d")
    if not d:
        return
    ds0 = rand_f32(rng, (H,))
    dK0 = rand_f32(rng, (B, H_kv, kL, D))
    # --sinks FILE and --param window=W: the option and the param are one
    bwd, _ = run("flash_attn_train_bwd_bf16",
                 {"Q": Q, "K": K, "V": V, "L": fwd["L"], "dO": dO, "D_vec": d["D_out"],
                  "dK": dK0, "d_sinks": ds0},
                 ["dQ", "dK", "dV", "d_sinks"], {"causal": 1, "window": W},
                 ["--sinks", os.path.join(TMP, "vpipe_fwd.in.sinks.npy"), "--v-head-dim",
                  str(Dv)], what="vpipe_bwd")
    if not bwd:
        return
    (dQ, dQm), (dK, dKm), (dV, dVm) = attention_reference(
        Q, K, V, dO, d["D_out"], fwd["L"], scale, True, kL - qL, None, 1.0, W)
    check("variant pipeline dQ", bwd["dQ"], dQ, dQm)
    check("variant pipeline dK", bwd["dK"], dK + dK0, dKm + np.abs(dK0))
    check("variant pipeline dV", bwd["dV"], dV, dVm)
    dsk, dskm = sinks_reference(sinks, fwd["L"], d["D_out"])
    check("variant pipeline d_sinks", bwd["d_sinks"], dsk + ds0, dskm + np.abs(ds0))
    # the forward's L against float64 (with the sink), as a cross-check of the chain
    L, _, _ = forward_lse_and_D(Q, K, V, dO, scale, True, kL - qL, None, 1.0, W, sinks)
    check("variant pipeline fwd L", fwd["L"], L.astype(np.float64), np.abs(L) + 1.0)


def test_variant_errors(rng):
    """The variants' usage errors: exit 2, one message that says what to do."""
    B, H, qL, D = 1, 2, 8, 16
    Q = rand_bf16(rng, (B, H, qL, D))
    V32 = rand_bf16(rng, (B, H, qL, 32))
    rows = np.zeros((B, H, qL), np.float32)
    fwd = {"Q": Q, "K": Q, "V": Q}
    bwd = {"Q": Q, "K": Q, "V": Q, "L": rows, "dO": Q, "D_vec": rows}
    cases = [
        # (tag, kernel, inputs, outputs, extra args, words the message must have)
        ("dv_not_mult8", "flash_attn_train_fwd_bf16", {"Q": Q, "K": Q, "V": V32}, ["O"],
         ["--v-head-dim", "12"], ["--v-head-dim 12", "multiple of 8"]),
        ("dv_too_big", "flash_attn_train_fwd_bf16", fwd, ["O"], ["--v-head-dim", "520"],
         ["--v-head-dim 520", "at most 512"]),
        ("dv_vs_V", "flash_attn_train_fwd_bf16", {"Q": Q, "K": Q, "V": V32}, ["O"],
         ["--v-head-dim", "64"], ["--v-head-dim 64", "has 32 columns"]),
        ("dv_missing", "flash_attn_train_fwd_bf16", {"Q": Q, "K": Q, "V": V32}, ["O"], [],
         ["32 columns", "D = 16", "needs --v-head-dim 32"]),
        ("dO_vs_V", "flash_attn_train_bwd_bf16", dict(bwd, V=V32), ["dQ"],
         ["--v-head-dim", "32"], ["size Dv is 32", "16 from dO"]),
        ("d_sinks_no_sinks", "flash_attn_train_bwd_bf16", bwd, ["dQ", "d_sinks"], [],
         ["d_sinks", "needs --sinks"]),
        ("sinks_shape", "flash_attn_train_fwd_bf16", dict(fwd, sinks=np.zeros(H + 1, np.float32)),
         ["O"], [], ["size H is 2", "3 from sinks"]),
        ("sinks_dtype", "flash_attn_train_fwd_bf16", dict(fwd, sinks=np.zeros(H, np.uint16)),
         ["O"], [], ["sinks must be float32"]),
        ("window_negative", "flash_attn_train_fwd_bf16", fwd, ["O"], ["--window", "-1"],
         ["--window -1"]),
        ("window_text", "flash_attn_train_fwd_bf16", fwd, ["O"], ["--window=1k"],
         ["--window 1k"]),
        ("window_twice", "flash_attn_train_fwd_bf16", fwd, ["O"],
         ["--window", "4", "--param", "window=4"], ["--window given twice", "--param window"]),
        ("window_empty", "flash_attn_train_fwd_bf16", fwd, ["O"], ["--window="],
         ["--window needs a value"]),
        ("window_other_kernel", "flash_attn_train_bwd_compute_d_bf16", {"O": Q, "dO": Q},
         ["D_out"], ["--window", "4"], ["--window", "has no sliding window"]),
        ("sinks_other_kernel", "transpose_2d", {"input": rows[0]}, ["output"],
         ["--sinks", "x.npy"], ["--sinks", "transpose_2d has no attention sinks"]),
    ]
    for tag, kernel, ins, outs, extra, words in cases:
        _, err = run(kernel, ins, outs, None, extra, expect_rc=2, what=f"verr_{tag}")
        if err and not all(w in err for w in words):
            fail(f"variant error {tag}: message lacks {words}: {err.strip()}")
    # help: the options and the new buffers are listed
    p = subprocess.run([BIN, "run", "--help"], capture_output=True, text=True)
    for w in ("--window W", "--sinks FILE", "--v-head-dim Dv", "d_sinks"):
        if w not in p.stdout:
            fail(f"run --help does not mention {w}")


# --- error paths -----------------------------------------------------------------
def write_raw_npy(path, header, payload):
    h = header.encode()
    pad = (64 - (10 + len(h) + 1) % 64) % 64
    h = h + b" " * pad + b"\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(h).to_bytes(2, "little") + h + payload)


def test_varlen(rng):
    """attn_varlen_fwd / _bwd_step on packed [total, heads, D] documents: each
    document's O, L bitwise the dense forward's on its rows; the step, fed
    the f64 reference's O and L (as test_attention_pipeline feeds its D),
    against the f64 reference per document; bad offsets refused."""
    H, H_kv, D = 4, 2, 32
    lens = [7, 0, 1, 33]
    cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(cu[-1])
    Q, K, V, dO = (rand_bf16(rng, (T, h, D)) for h in (H, H_kv, H_kv, H))
    ins = {"Q": Q, "K": K, "V": V, "cu_seqlens_q": cu, "cu_seqlens_k": cu}
    fwd, _ = run("attn_varlen_fwd", ins, ["O", "L"], {"causal": 1}, what="varlen_fwd")
    if not fwd:
        return
    scale = 1.0 / np.sqrt(D)
    O_ref = np.zeros((T, H, D), np.uint16)
    L_ref = np.zeros((H, T), np.float32)
    refs = {}
    for d, n in enumerate(lens):
        if n == 0:
            continue
        rows = slice(int(cu[d]), int(cu[d + 1]))
        q, k, v, do = (np.ascontiguousarray(a[rows].transpose(1, 0, 2)[None])
                       for a in (Q, K, V, dO))
        dense, _ = run("flash_attn_train_fwd_bf16", {"Q": q, "K": k, "V": v}, ["O", "L"],
                       {"causal": 1}, what=f"varlen_dense{d}")
        if dense:
            check_exact(f"varlen doc {d} O", np.ascontiguousarray(
                fwd["O"][rows].transpose(1, 0, 2)[None]), dense["O"])
            check_exact(f"varlen doc {d} L", np.ascontiguousarray(fwd["L"][:, rows][None]),
                        dense["L"])
        L, Dvec, O = forward_lse_and_D(q, k, v, do, scale, True, 0, None, 1.0)
        O_ref[rows] = O[0].transpose(1, 0, 2)
        L_ref[:, rows] = L[0]
        refs[d] = (rows, attention_reference(q, k, v, do, Dvec, L, scale, True, 0, None, 1.0))
    bwd, _ = run("attn_varlen_bwd_step", dict(ins, O=O_ref, L=L_ref, dO=dO),
                 ["dQ", "dK", "dV"], {"causal": 1}, what="varlen_bwd")
    if not bwd:
        return
    for d, (rows, ref) in refs.items():
        for name, (want, mag) in zip(("dQ", "dK", "dV"), ref):
            got = np.ascontiguousarray(bwd[name][rows].transpose(1, 0, 2)[None])
            check(f"varlen doc {d} {name}", got, want, mag)
    bad = cu.copy()
    bad[2] = bad[1] - 1 if bad[1] > 0 else 5
    _, err = run("attn_varlen_fwd", dict(ins, cu_seqlens_q=bad), ["O", "L"], {"causal": 1},
                 expect_rc=1, what="varlen_bad")
    if "must not decrease" not in err:
        fail(f"varlen with decreasing offsets: {err.strip()}")


def test_isa_help(rng):
    """Every --isa help names every table of the public tg_isa enum and says
    which this build has and which this CPU runs (cli/isa_names.c)."""
    tables = ["portable", "avx2", "avx512", "avx512bf16", "amx", "neon", "neonbf16"]
    for args in (["--help"], ["bench", "--help"], ["run", "--help"]):
        p = subprocess.run([BIN] + args, capture_output=True, text=True)
        text = " ".join((p.stdout + p.stderr).split())
        lst = r"((?:[a-z0-9]+, )*[a-z0-9]+)"
        m = re.search(r"tables: " + lst + r"; this build has " + lst +
                      r"(?: \(not " + lst + r": another architecture's\))?; this CPU runs " + lst,
                      text)
        if p.returncode != 0 or not m:
            fail(f"tilegrad {' '.join(args)}: rc {p.returncode}, no --isa tables line")
            continue
        names = lambda g: [w.strip() for w in (g or "").split(",") if w.strip()]
        listed, built, other = names(m.group(1)), names(m.group(2)), names(m.group(3))
        if sorted(listed) != sorted(tables):
            fail(f"tilegrad {' '.join(args)}: tables {listed}, want {tables}")
        if sorted(built + other) != sorted(tables) or set(built) & set(other):
            fail(f"tilegrad {' '.join(args)}: built {built} + not built {other} != {tables}")
        runs = names(m.group(4))
        if "portable" not in built or not set(runs) <= set(built) or "portable" not in runs:
            fail(f"tilegrad {' '.join(args)}: runs {runs} not within built {built} with portable")
    WORST["isa help: every table named"] = 0.0


def test_errors(rng):
    # a head dim the kernel does not take: library error, exit 1, status + detail
    B, H, qL, D = 1, 1, 8, 12
    Q = rand_bf16(rng, (B, H, qL, D))
    ins = {"Q": Q, "K": Q, "V": Q, "L": np.zeros((B, H, qL), np.float32), "dO": Q,
           "D_vec": np.zeros((B, H, qL), np.float32)}
    _, err = run("flash_attn_train_bwd_bf16", ins, ["dQ"], expect_rc=1, what="err_d12")
    if "kernel error" not in err or len(err.strip().splitlines()) < 2:
        fail(f"unsupported D: expected status and last error, got: {err.strip()}")
    # fortran order
    x = rand_f32(rng, (4, 6))
    fpath = os.path.join(TMP, "fortran.npy")
    np.save(fpath, np.asfortranarray(x))
    _, err = run("transpose_2d", {"input": fpath}, ["output"], expect_rc=2, what="err_f")
    if "fortran.npy" not in err or "fortran_order" not in err:
        fail(f"fortran order: unexpected message: {err.strip()}")
    # truncated data
    tpath = os.path.join(TMP, "trunc.npy")
    write_raw_npy(tpath, "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 6), }",
                  b"\0" * 90)
    _, err = run("transpose_2d", {"input": tpath}, ["output"], expect_rc=2, what="err_t")
    if "trunc.npy" not in err or "truncated" not in err:
        fail(f"truncated: unexpected message: {err.strip()}")
    # shape disagreement between K and V
    ins2 = dict(ins)
    ins2["V"] = rand_bf16(rng, (B, H, qL + 1, D))
    _, err = run("flash_attn_train_bwd_bf16", ins2, ["dQ"], expect_rc=2, what="err_shape")
    if "kL" not in err:
        fail(f"shape mismatch: unexpected message: {err.strip()}")
    # wrong dtype: f32 where bf16 bits are expected
    ins3 = dict(ins)
    ins3["Q"] = Q.astype(np.float32)
    _, err = run("flash_attn_train_bwd_bf16", ins3, ["dQ"], expect_rc=2, what="err_dtype")
    if "bfloat16" not in err:
        fail(f"dtype: unexpected message: {err.strip()}")
    # unknown kernel / buffer / param
    for args in (["run", "no_such_kernel"], ["run", "transpose_2d", "--in", "bogus=x.npy"],
                 ["run", "transpose_2d", "--param", "eps=1"]):
        p = subprocess.run([BIN] + args, capture_output=True, text=True)
        if p.returncode != 2 or not p.stderr.strip():
            fail(f"{' '.join(args)}: exit {p.returncode}, stderr {p.stderr.strip()!r}")
    # help texts
    for args in (["--help"], ["run", "--help"], ["run", "flash_attn_train_bwd_bf16", "--help"],
                 ["--version"]):
        p = subprocess.run([BIN] + args, capture_output=True, text=True)
        if p.returncode != 0 or not p.stdout.strip():
            fail(f"{' '.join(args)}: exit {p.returncode}")
    p = subprocess.run([BIN, "run", "--help"], capture_output=True, text=True)
    if "D_vec" not in p.stdout or "flash_attn_train_bwd_compute_d_bf16" not in p.stdout:
        fail("run --help does not list the kernels and their buffers")


def main():
    global BIN, TMP
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    BIN = os.path.abspath(args[0])
    seed = int.from_bytes(os.urandom(4), "little")
    if "--seed" in args:
        seed = int(args[args.index("--seed") + 1])
    print(f"cli_run_check: seed {seed} (replay with --seed {seed})")
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="tg_cli_check_") as d:
        TMP = d
        tests = [test_cast, test_compute_d, test_attention, test_attention_pipeline, test_forward,
                 test_variant_forward, test_variant_pipeline, test_variant_errors,
                 test_rmsnorm, test_softmax_backward, test_embedding, test_cross_entropy,
                 test_transpose, test_causal_attention, test_decode, test_varlen, test_errors,
                 test_isa_help]
        for t in tests:
            try:
                t(rng)
            except Exception as e:  # a crash in one test should not hide the others
                fail(f"{t.__name__}: {type(e).__name__}: {e}")
        if "--keep" in args:
            import shutil
            keep = tempfile.mkdtemp(prefix="tg_cli_kept_")
            shutil.copytree(d, keep, dirs_exist_ok=True)
            print("inputs/outputs kept in", keep)
    for what, r in sorted(WORST.items()):
        print(f"  {what:45s} worst err/bound {r:.3g}")
    if FAILS:
        print(f"cli_run_check: {len(FAILS)} FAILED")
        return 1
    print(f"cli_run_check: all {len(WORST)} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
