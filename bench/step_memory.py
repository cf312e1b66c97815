#!/usr/bin/env python3
"""Peak memory of one forward + backward of a real family's causal LM, no
optimizer: what the activations, the loss and the gradients cost, per
backend, each backend in a process of its own (its peak RSS is its own).

  sdpa   attn_implementation="sdpa"
  tg     attn_implementation="tilegrad"
  all    the same plus tilegrad.transformers.use_tilegrad_kernels(model)

The model comes from bench/train_model_parts.py's published configs (random
weights), bf16 autocast where the CPU has a bf16 unit (else float32), batch
1, labels = the input ids. Printed per backend: the peak RSS of the process,
the RSS once the model is built, and the difference (the step's own).

  TILEGRAD_LIB=build/libtilegrad.so PYTHONPATH=python python3 bench/step_memory.py \\
      --config qwen2.5-0.5b --seq 4096 --threads 16
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "python"))
from train_model_parts import (  # noqa: E402
    CONFIGS, build_model, cpu_has_bf16_unit, cpu_model, describe, layers_run)

BACKENDS = ("sdpa", "tg", "all")
#: the causal LMs (the loss is the model's own, labels = the input ids)
CAUSAL = sorted(n for n, c in CONFIGS.items() if c["family"] != "bert")


def _gib(kib):
    return kib / 2 ** 20          # ru_maxrss is in KiB on Linux


def worker(args):
    """One backend's step in this process -> a JSON line on stdout."""
    import torch
    torch.set_num_threads(args.threads)
    impl = "sdpa" if args.worker == "sdpa" else "tilegrad"
    if impl == "tilegrad":
        import tilegrad.transformers as tgtr
    model = build_model(args.config, layers_run(args.config, args.layers)[0], impl, seed=0)
    replaced = tgtr.use_tilegrad_kernels(model) if args.worker == "all" else {}
    ids = torch.randint(0, model.config.vocab_size, (1, args.seq))
    built = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.dtype == "bf16"):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"backend": args.worker, "peak_gib": _gib(peak), "built_gib": _gib(built),
                      "seconds": time.perf_counter() - t0, "loss": loss.item(),
                      "replaced": replaced}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="qwen2.5-0.5b", choices=CAUSAL)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=0,
                    help="layers (0: the config's own, reduced as train_model.py reduces it)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--backends", default="sdpa,all",
                    help=f"comma-separated, of {','.join(BACKENDS)} (default sdpa,all)")
    ap.add_argument("--dtype", choices=["auto", "bf16", "f32"], default="auto",
                    help="bf16 autocast or float32 (auto: bf16 where the CPU has a bf16 unit)")
    ap.add_argument("--json", help="also write the rows to this file")
    ap.add_argument("--worker", choices=BACKENDS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.dtype == "auto":
        args.dtype = "bf16" if cpu_has_bf16_unit() else "f32"
    if args.worker:
        return worker(args)
    backends = args.backends.split(",")
    for b in backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r}; of {BACKENDS}")
    print(describe(args.config, args.layers or None))
    print(f"CPU {cpu_model()}; {args.threads} threads; seq {args.seq}, batch 1; "
          f"{'bf16 autocast' if args.dtype == 'bf16' else 'float32'}; one forward + backward, "
          "no optimizer; each backend in its own process")
    rows = []
    for b in backends:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", b, "--config", args.config,
               "--seq", str(args.seq), "--layers", str(args.layers),
               "--threads", str(args.threads), "--dtype", args.dtype]
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
    base = next((r for r in rows if r["backend"] == "sdpa"), None)
    print(f"{'backend':8} {'peak RSS GiB':>12} {'built GiB':>10} {'step GiB':>9} "
          f"{'peak / sdpa':>11} {'seconds':>8}")
    for r in rows:
        ratio = f"{r['peak_gib'] / base['peak_gib']:.2f}x" if base else "-"
        print(f"{r['backend']:8} {r['peak_gib']:12.2f} {r['built_gib']:10.2f} "
              f"{r['peak_gib'] - r['built_gib']:9.2f} {ratio:>11} {r['seconds']:8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": args.config, "seq": args.seq, "threads": args.threads,
                       "dtype": args.dtype, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
