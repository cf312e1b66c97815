#!/usr/bin/env python3
"""Writes the seed corpus fuzz/corpus_cli/ for fuzz_cli_args (fuzz_cli_args.c).

Input layout: byte 0 bit 0 picks the command (0 run, 1 bench), then the
arguments separated by NUL bytes. Each seed is a valid command line or a
classic refusal (bad numbers, unknown names, missing values); libFuzzer
mutates from there. Deterministic: re-running rewrites the same files.
"""
import os

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus_cli")

RUN = [
    ("fa_fwd", ["flash_attn_train_fwd_bf16", "--in", "Q=q.npy", "--in", "K=k.npy", "--in",
                "V=v.npy", "--out", "O=o.npy", "--param", "scale=0.125", "--param",
                "qL_off=-3", "--param", "causal=true", "--threads", "2", "--isa", "portable"]),
    ("fa_bwd", ["tg_flash_attn_train_bwd_bf16", "--in=Q=q.npy", "--out=dQ=dq.npy",
                "--param=softcapping=30.0", "--deterministic", "-q"]),
    ("octal", ["flash_attn_train_fwd_bf16", "--out", "O=o.npy", "--param", "qL_off=010"]),
    ("hex_float", ["flash_attn_train_fwd_bf16", "--out", "O=o.npy", "--param", "scale=0x1p-3"]),
    ("underflow", ["rms_norm_forward_f32", "--out", "y=y.npy", "--param", "eps=1e-50"]),
    ("subnormal", ["rms_norm_forward_f32", "--out", "y=y.npy", "--param", "eps=1e-40"]),
    ("exp_junk", ["rms_norm_forward_f32", "--out", "y=y.npy", "--param", "eps=1e"]),
    ("u32_range", ["cross_entropy_fwd_bwd", "--out", "grad=g.npy", "--param",
                   "pad_id=4294967296", "--param", "count=7"]),
    ("dup_param", ["embedding_backward", "--out", "grad_weight=g.npy", "--param",
                   "vocab_size=5", "--param", "vocab_size=6"]),
    ("no_out", ["transpose_2d", "--in", "input=x.npy"]),
    ("out_on_input", ["transpose_2d", "--out", "input=x.npy"]),
    ("threads", ["transpose_2d", "--out", "output=y.npy", "--threads", "4097"]),
    ("needs_value", ["transpose_2d", "--out"]),
    ("decode", ["flash_attn_vec_reduce", "--in", "htmp=h.npy", "--out", "dst=d.npy",
                "--param", "nrows=2", "--param", "head_dim=256", "--param", "nwg=3"]),
    ("help", ["fwht_sign_undo_f32", "--help"]),
    ("unknown", ["no_such_kernel"]),
]
BENCH = [
    ("bench_ok", ["--quick", "--threads", "2", "--reps=3", "--json", "x.json"]),
    ("bench_shapes", ["--shapes", "1,8,8,2048,128,1; 2,4,2,512,64,0;"]),
    ("bench_bad_shape", ["--shapes", "1,8,8,,0128,2"]),
    ("bench_octal", ["--reps", "010", "--triad-mib", "0x100"]),
    ("bench_help", ["--section", "peaks", "--help"]),
    ("bench_gqa", ["--shapes", "1,32,8,2048,128,1;1,8,3,512,64,0"]),
    ("bench_isa_section", ["--isa", "avx2", "--section=mem", "--triad-mib", "1048577"]),
    ("bench_unknown", ["--deterministic", "--bogus=1"]),
    ("bench_needs_value", ["--reps=2", "--threads"]),
    ("bench_flag_value", ["--quick=1"]),
]


def main():
    os.makedirs(OUT, exist_ok=True)
    for cmd, seeds in ((0, RUN), (1, BENCH)):
        for name, args in seeds:
            data = bytes([cmd]) + b"\0".join(a.encode() for a in args)
            with open(os.path.join(OUT, name), "wb") as f:
                f.write(data)
    print(f"wrote {len(RUN) + len(BENCH)} seeds to {OUT}")


if __name__ == "__main__":
    main()
