#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus/ for fuzz_entry (see fuzz/README.md).

Input layout (fuzz_entry.c): entry byte, flags byte, threads byte, 8 bytes of
data seed, then what the entry reads. Each seed is a small valid call or a
classic refusal of one entry point; libFuzzer mutates from there. Re-running
this script rewrites the same files (deterministic names and contents).
"""
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")

# entry numbers (fuzz_entry.c, LLVMFuzzerTestOneInput)
FWD, BWD, CD, RMS_F, RMS_INV, RMS_DX, RMS_DW, RMS_FUSED, SOFTMAX, CAST = range(10)
EMB, CE, TR, CAUSAL, DEC, DEC_UNDO, FWHT, PINIT, CTX = range(10, 19)
XFWD, XBWD, XCD = range(20, 23)  # tg_attn_train_* (dtype, options)

# flags: 1 det, 2 raw data, 4 portable ISA, 8 chain fwd->bwd, 16 NULL-ctx call,
# 32 ATOMIC FA-2 schedule, 128 causal flag -1
seeds = {}


def head(entry, flags=0, threads=2, seed=1):
    return bytes([entry, flags, threads - 1]) + struct.pack("<Q", seed)


def small(v):  # pick_u32 / pick_i32 "small" branch: 1 + byte % small
    return bytes([1, v - 1])


def zero():  # pick_u32 -> 0
    return bytes([0])


def edge_u32(i):  # pick_u32 edge table index
    return bytes([5, i])


def raw_u32(v):
    return bytes([6]) + struct.pack("<I", v)


def attn(mask=0, nmut=0, retile=0, B=1, Hk=1, g=1, qL=40, kL=40, Dsel=1, scale=None,
         softcap=None, qloff=None, layout=0, muts=b"", ptrsel=0, causal=0):
    mode = 1 | (mask << 2) | (nmut << 3) | (retile << 5)
    kb = kL - 1 if kL <= 140 else 224 + (kL - 440) // 8  # kL > 440: 440 + 8k
    b = bytes([mode, B - 1, Hk - 1, g - 1, qL - 1, Dsel, kb])
    b += bytes([0]) if scale is None else bytes([1]) + scale
    b += bytes([1]) if softcap is None else bytes([0]) + softcap
    b += bytes([1]) if qloff is None else bytes([0]) + qloff
    b += bytes([layout]) + muts + bytes([ptrsel, causal])
    return b


# attention: forward, backward (alone and chained from the forward), compute_d
seeds["fwd_plain"] = head(FWD) + attn()
seeds["fwd_mask_causal_gqa"] = head(FWD, 1, 3) + attn(mask=1, B=2, Hk=2, g=2, qL=70, kL=90,
                                                       causal=1, layout=3)
seeds["fwd_softcap"] = head(FWD, 4) + attn(softcap=bytes([1, 7]), qL=65, kL=17, Dsel=5)
seeds["bwd_plain"] = head(BWD, 8) + attn()
seeds["bwd_chain_det"] = head(BWD, 9, 3) + attn(mask=1, B=2, Hk=1, g=3, qL=100, kL=64, causal=1)
seeds["bwd_atomic"] = head(BWD, 8 | 32, 3) + attn(B=1, Hk=1, g=2, qL=130, kL=70, Dsel=3,
                                                 layout=6)
seeds["bwd_atomic_det"] = head(BWD, 1 | 8 | 32, 2) + attn(mask=1, B=1, Hk=2, g=2, qL=70, kL=60,
                                                          causal=1)
seeds["bwd_key_ranges"] = head(BWD, 8, 3) + attn(B=1, Hk=1, g=2, qL=40, kL=600, Dsel=1, causal=1)
seeds["bwd_key_ranges_det"] = head(BWD, 9, 2) + attn(mask=1, B=1, Hk=1, g=1, qL=30, kL=520)
seeds["bwd_qloff"] = head(BWD, 8, 2) + attn(qloff=bytes([0, 9]), qL=50, kL=30, causal=2)
# one mutation: Q_strides[0] (field 16) set to an edge value (INT64_MAX)
seeds["bwd_stride_overflow"] = head(BWD) + attn(nmut=1, muts=bytes([16, 4, 3]))
# one mutation: D (field 2) = 12 -> unsupported
seeds["bwd_bad_d"] = head(BWD, 16) + attn(nmut=1, muts=bytes([2, 0, 3]))
# one mutation: qL (field 3) = INT32_MAX, retiled
seeds["fwd_huge_ql_retile"] = head(FWD) + attn(nmut=1, retile=1, muts=bytes([3, 2, 21]))
seeds["bwd_null_buffer"] = head(BWD) + attn(ptrsel=3) + bytes([4])
seeds["bwd_mask_without_params"] = head(BWD) + attn(mask=1, ptrsel=0x0C)
seeds["fwd_raw_struct"] = head(FWD) + bytes([0]) + bytes(range(160)) + bytes(24)
seeds["compute_d"] = head(CD) + attn(B=2, Hk=2, g=1, qL=33, kL=5, Dsel=4)


def ext(f32=1, mode=0, extra=b"", var=None):
    """decode_ext's byte: bit 0 float32, bits 1-3 the options mode (0 NULL,
    1 p = 0, 2-3 dropout (then p byte, seed, offset), 4-7 bad options),
    bits 4-7 = 15: a bad dtype, 1-14: the variants' bytes follow (var)."""
    return bytes([f32 | mode << 1 | (0x10 if var is not None else 0)]) + extra + (var or b"")


def variants(window=None, sinks=0, d_sinks=0, vdim_sel=0, vdim=b""):
    """decode_variants: bit 0 window (bit 5: 1 + byte % 64, else any u32),
    bit 1 sinks, bit 2 d_sinks, bits 3-4 the value head dim (0 none, 1 = D,
    2 valid: byte % 5 of 8 16 64 128 512, 3 refused: odd byte, then byte % 6
    of 4 12 520 1 1024 2^32-1; even byte, then any odd u32)."""
    v = sinks << 1 | d_sinks << 2 | vdim_sel << 3
    w = b""
    if window is not None:
        v |= 1
        if window <= 64:
            v |= 32
            w = bytes([window - 1])
        else:
            w = struct.pack("<I", window)
    return bytes([v]) + w + vdim


DROP = bytes([77]) + struct.pack("<QQ", 0x1234_5678_9ABC_DEF0, 5)
seeds["xfwd_f32"] = head(XFWD) + ext() + attn(mask=1, causal=1, qL=50, kL=70)
seeds["xfwd_f32_dropout"] = head(XFWD, 1, 3) + ext(mode=2, extra=DROP) + attn(B=2, Hk=1, g=2)
seeds["xbwd_f32_chain_dropout"] = head(XBWD, 9, 3) + ext(mode=2, extra=DROP) + attn(mask=1)
seeds["xbwd_bf16_dropout_atomic"] = head(XBWD, 8 | 32, 2) + ext(0, 3, DROP) + attn(qL=70, kL=33)
seeds["xbwd_bad_p"] = head(XBWD) + ext(mode=4) + attn()
seeds["xfwd_bad_dtype"] = head(XFWD) + bytes([0xF0, 1]) + attn()
# the variants: window, sinks, d_sinks, value head dim (valid and refused)
seeds["xfwd_f32_variants"] = head(XFWD) + ext(var=variants(9, 1, 0, 2, bytes([2]))) \
    + attn(mask=1, causal=1, qL=50, kL=70)
seeds["xbwd_f32_variants_chain_det"] = head(XBWD, 9, 3) \
    + ext(var=variants(5, 1, 1, 2, bytes([0]))) + attn(mask=1, B=1, Hk=1, g=2)
seeds["xbwd_bf16_variants_atomic"] = head(XBWD, 8 | 32, 2) \
    + ext(0, 1, var=variants(0xFFFFFFFF, 1, 1, 1)) + attn(qL=70, kL=33, causal=1)
seeds["xbwd_window_key_ranges"] = head(XBWD, 9, 2) + ext(mode=2, extra=DROP,
                                                          var=variants(64, 1, 1)) \
    + attn(mask=1, B=1, Hk=1, g=1, qL=30, kL=520, causal=1)
seeds["xbwd_d_sinks_without_sinks"] = head(XBWD) + ext(var=variants(d_sinks=1)) + attn()
seeds["xfwd_bad_v_head_dim"] = head(XFWD) + ext(var=variants(vdim_sel=3, vdim=bytes([1, 2]))) \
    + attn()
seeds["xcompute_d_f32"] = head(XCD) + ext() + attn(B=2, Hk=2, g=1, qL=33, kL=5, Dsel=4)

# row kernels: rows, dim, eps choice, [eps], NULL selector
for name, e in [("rms_forward", RMS_F), ("rms_inv", RMS_INV), ("rms_dx", RMS_DX),
                ("rms_dw", RMS_DW), ("rms_fused", RMS_FUSED), ("softmax", SOFTMAX)]:
    seeds[name] = head(e) + small(20) + small(33) + bytes([0, 0])
    seeds[name + "_det3"] = head(e, 1, 3) + small(48) + bytes([7, 0x10, 0x02]) + bytes([0, 0])
    seeds[name + "_zero_rows"] = head(e) + zero() + small(8) + bytes([0, 0])
    seeds[name + "_overflow"] = head(e) + edge_u32(26) + edge_u32(26) + bytes([0, 0])
seeds["rms_fused_eps_nan"] = head(RMS_FUSED) + small(4) + small(9) + bytes([1, 1, 15, 0])
seeds["rms_forward_no_r"] = head(RMS_F) + small(5) + small(16) + bytes([0, 3, 3])

# cast: mode byte, n
seeds["cast"] = head(CAST) + bytes([0]) + small(100)
seeds["cast_overflow"] = head(CAST) + bytes([2 | (1 << 2)])
seeds["cast_zero"] = head(CAST) + bytes([0]) + zero()

# embedding: vocab, seq, dim, NULL selector, id mode
seeds["embedding"] = head(EMB) + small(30) + small(40) + small(64) + bytes([0, 0])
seeds["embedding_bad_id"] = head(EMB, 0, 3) + small(5) + small(50) + small(3) + bytes([0, 7])
seeds["embedding_big_vocab"] = head(EMB) + raw_u32(0xFFFFFFFF) + small(4) + small(8) + bytes([0, 7])

# cross-entropy: n_pos, vocab, mode byte (pad, count), [u32s], NULL selector, target mode
seeds["ce"] = head(CE) + small(20) + small(50) + bytes([1, 0, 0])
seeds["ce_pads"] = head(CE, 1, 3) + small(40) + small(90) + bytes([2 << 2 | 2, 0, 1])
seeds["ce_bad_target"] = head(CE) + small(30) + small(10) + bytes([2, 0, 2])
seeds["ce_count_zero"] = head(CE) + small(30) + small(10) + bytes([0x41, 0, 2])

seeds["transpose"] = head(TR) + small(33) + small(70) + bytes([0])
seeds["transpose_zero"] = head(TR) + small(3) + zero() + bytes([0])

seeds["causal"] = head(CAUSAL) + small(40) + small(4) + small(2) + small(16) + bytes([0])
seeds["causal_gqa_mismatch"] = head(CAUSAL) + small(5) + small(6) + small(4) + small(2) + bytes([0])

# decode: nrows, nwg, dim mode byte (even: table index << 1), NULL selector
seeds["vec_reduce"] = head(DEC) + small(3) + small(5) + bytes([5 << 1, 0])
seeds["vec_reduce_256"] = head(DEC) + small(2) + small(9) + bytes([0, 0])
seeds["vec_reduce_undo_512"] = head(DEC_UNDO) + small(2) + small(3) + bytes([1 << 1, 0])
seeds["vec_reduce_undo_bad_dim"] = head(DEC_UNDO) + small(2) + small(3) + bytes([6 << 1, 0])
seeds["fwht_256"] = head(FWHT) + small(4) + small(1) + bytes([0, 0])

# params init: six pick_i32 values, scale, null byte
seeds["params_init"] = head(PINIT) + small(2) + small(8) + small(2) + small(100) + small(130) \
    + small(64) + bytes([1, 4]) + bytes([1])
seeds["params_init_huge"] = head(PINIT) + bytes([2, 21]) * 6 + bytes([1, 2, 1])

seeds["ctx"] = head(CTX) + struct.pack("<iiiii", -1, 7, 1, 99, -5)


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    for name, data in sorted(seeds.items()):
        with open(os.path.join(OUT, name), "wb") as fh:
            fh.write(data)
    print(f"{len(seeds)} seeds in {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
