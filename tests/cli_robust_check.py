#!/usr/bin/env python3
"""Bad input and faults against the `tilegrad` CLI (python3 stdlib + numpy).

The CLI's cases: outputs all-or-nothing (a failed or interrupted write
changes no target and leaves no temporary; two outputs on one file, or an
output over another buffer's input, are refused; output locations are checked
before anything is computed), decimal-only numbers, clear messages.

usage: python3 tests/cli_robust_check.py path/to/tilegrad [--only NAME] [--table]

Every case is one function below, registered with @case(class, outcome);
--table prints the rows of docs/ROBUSTNESS.md's CLI table, and the run fails
when a case is missing from that file, so the table stays current.
"""
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

BIN = None
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CASES = []  # (function, class of bad input or fault, expected outcome, before the fix)
FAILS = []
ENV = dict(os.environ, OMP_WAIT_POLICY="passive")


def case(klass, outcome, before="failed"):
    """Registers a case; `before`: what it gave on the CLI before the
    CLI's hardening ("failed", or "passed" for a guard of behaviour kept)."""
    def reg(fn):
        CASES.append((fn, klass, outcome, before))
        return fn
    return reg


class Fail(Exception):
    pass


def expect(cond, msg):
    if not cond:
        raise Fail(msg)


def tg(args, timeout=60, **kw):
    """Runs the CLI; returns the CompletedProcess (text mode)."""
    p = subprocess.run([BIN] + args, capture_output=True, text=True, env=ENV, timeout=timeout,
                       **kw)
    expect("Sanitizer" not in p.stderr and "runtime error:" not in p.stderr,
           f"sanitizer report: {p.stderr}")
    return p


def expect_usage_error(p, *words):
    """Exit 2, one message naming every word."""
    expect(p.returncode == 2, f"exit {p.returncode}, want 2; stderr {p.stderr.strip()!r}")
    for w in words:
        expect(w in p.stderr, f"message lacks {w!r}: {p.stderr.strip()!r}")


def leftovers(d, keep):
    """Files in d other than those in keep (temporaries included)."""
    return sorted(set(os.listdir(d)) - set(keep))


def bf16(a):
    """float32 array -> bf16 bits (uint16), round to nearest even."""
    u = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bwd_inputs(d, qL, kL, D=64):
    """Inputs of flash_attn_train_bwd_bf16 in d; returns the --in arguments."""
    rng = np.random.default_rng(1)
    arrs = {"Q": bf16(rng.standard_normal((1, 1, qL, D))),
            "K": bf16(rng.standard_normal((1, 1, kL, D))),
            "V": bf16(rng.standard_normal((1, 1, kL, D))),
            "L": np.full((1, 1, qL), 8.0, np.float32),
            "dO": bf16(rng.standard_normal((1, 1, qL, D))),
            "D_vec": np.zeros((1, 1, qL), np.float32)}
    args = []
    for n, a in arrs.items():
        path = os.path.join(d, f"in_{n}.npy")
        np.save(path, a)
        args += ["--in", f"{n}={path}"]
    return args


def small_input(d, name="x.npy", shape=(4, 6)):
    path = os.path.join(d, name)
    np.save(path, np.arange(np.prod(shape), dtype=np.float32).reshape(shape))
    return path


# --- atomic outputs -------------------------------------------------------------
@case("write fails (ulimit -f) over an earlier result",
      "exit 2 'File too large'; the earlier file unchanged; no temporary left")
def file_size_limit_keeps_old_result(d):
    x = small_input(d, shape=(256, 256))
    keep = os.path.join(d, "keep.npy")
    with open(keep, "wb") as f:
        f.write(b"earlier results")
    lim = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # noqa: E731
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={keep}"],
           preexec_fn=lim)
    expect_usage_error(p, "keep.npy", "File too large")
    expect(open(keep, "rb").read() == b"earlier results", "keep.npy was changed")
    expect(leftovers(d, ["x.npy", "keep.npy"]) == [], f"left: {leftovers(d, ['x.npy', 'keep.npy'])}")


@case("second of three outputs fails to write",
      "exit 2; the first output's earlier file unchanged (all or nothing)")
def second_output_fails_first_unchanged(d):
    ins = bwd_inputs(d, qL=1, kL=512)  # dQ 256 bytes of data, dK 128 KiB
    dq, dk, dv = (os.path.join(d, n) for n in ("dq.npy", "dk.npy", "dv.npy"))
    with open(dq, "wb") as f:
        f.write(b"old dQ")
    lim = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))  # noqa: E731
    p = tg(["run", "flash_attn_train_bwd_bf16"] + ins +
           ["--out", f"dQ={dq}", "--out", f"dK={dk}", "--out", f"dV={dv}"], preexec_fn=lim)
    expect_usage_error(p, "dk.npy", "File too large")
    expect(open(dq, "rb").read() == b"old dQ", "dq.npy was replaced though dK failed")
    expect(not os.path.exists(dk) and not os.path.exists(dv), "dk/dv created")
    left = [n for n in os.listdir(d) if ".tmp-" in n]
    expect(left == [], f"temporaries left: {left}")


@case("output is a symlink to a device that fails writes (/dev/full)",
      "exit 2 before computing; the symlink and the device untouched")
def symlink_to_device_not_removed(d):
    x = small_input(d)
    link = os.path.join(d, "full.npy")
    os.symlink("/dev/full", link)
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={link}"])
    expect_usage_error(p, "full.npy", "not a regular file")
    expect(os.path.islink(link), "the symlink was removed")
    expect(os.path.exists("/dev/full"), "/dev/full is gone")


@case("output is a symlink to a regular file",
      "the file it points to gets the result; the link stays a link",
      before="passed (guard)")
def symlink_to_file_written_through(d):
    x = small_input(d)
    real = os.path.join(d, "real.npy")
    link = os.path.join(d, "link.npy")
    with open(real, "wb") as f:
        f.write(b"old")
    os.symlink("real.npy", link)
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={link}", "-q"])
    expect(p.returncode == 0, f"exit {p.returncode}: {p.stderr}")
    expect(os.path.islink(link), "the link was replaced by a file")
    expect(np.load(real).shape == (6, 4), "real.npy does not hold the result")


@case("existing output file's permissions",
      "kept (0640 stays 0640); a new file gets 0666 less the umask",
      before="passed (guard)")
def output_mode_kept(d):
    x = small_input(d)
    out = os.path.join(d, "o.npy")
    with open(out, "wb") as f:
        f.write(b"old")
    os.chmod(out, 0o640)
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={out}", "-q"])
    expect(p.returncode == 0, f"exit {p.returncode}: {p.stderr}")
    expect(os.stat(out).st_mode & 0o777 == 0o640, f"mode {oct(os.stat(out).st_mode)}")
    new = os.path.join(d, "new.npy")
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={new}", "-q"],
           preexec_fn=lambda: os.umask(0o022))
    expect(os.stat(new).st_mode & 0o777 == 0o644, f"new mode {oct(os.stat(new).st_mode)}")


@case("two outputs name one file (same path, ./path, a symlink, a hard link)",
      "exit 2 naming both; nothing written")
def duplicate_outputs_refused(d):
    ins = bwd_inputs(d, qL=4, kL=4)
    same = os.path.join(d, "same.npy")
    variants = [(same, same), (same, os.path.join(d, ".", "same.npy"))]
    target = os.path.join(d, "t.npy")
    with open(target, "wb") as f:
        f.write(b"old")
    os.symlink("t.npy", os.path.join(d, "t_link.npy"))
    os.link(target, os.path.join(d, "t_hard.npy"))
    variants += [(target, os.path.join(d, "t_link.npy")), (target, os.path.join(d, "t_hard.npy"))]
    for a, b in variants:
        p = tg(["run", "flash_attn_train_bwd_bf16"] + ins + ["--out", f"dQ={a}", "--out", f"dK={b}"])
        expect_usage_error(p, "same file", "--out dQ", "--out dK")
        expect(not os.path.exists(same), f"{same} written")
        expect(open(target, "rb").read() == b"old", "t.npy changed")


@case("output names another buffer's input file",
      "exit 2 (the kernel is not in place there); the input untouched")
def output_over_input_refused(d):
    x = small_input(d)
    before = open(x, "rb").read()
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={x}"])
    expect_usage_error(p, "--out output", "--in input", "in place")
    expect(open(x, "rb").read() == before, "the input was changed")


@case("in place: --in data=f --out data=f (fwht_sign_undo_f32, inout) and "
      "--in/--out grad_weight=g (embedding_backward, acc)",
      "allowed: f and g hold the results",
      before="passed (guard)")
def in_place_allowed(d):
    f = os.path.join(d, "h.npy")
    np.save(f, np.ones((2, 256), np.float32))
    p = tg(["run", "fwht_sign_undo_f32", "--in", f"data={f}", "--out", f"data={f}", "-q"])
    expect(p.returncode == 0, f"exit {p.returncode}: {p.stderr}")
    expect(not np.array_equal(np.load(f), np.ones((2, 256), np.float32)), "f not updated")
    # an accumulating buffer updated in place: grad_weight += rows of grad_out
    g, go, ids = (os.path.join(d, n) for n in ("g.npy", "go.npy", "ids.npy"))
    np.save(g, np.ones((3, 4), np.float32))
    np.save(go, np.full((2, 4), 2.0, np.float32))
    np.save(ids, np.array([0, 2], np.uint32))
    p = tg(["run", "embedding_backward", "--in", f"grad_out={go}", "--in", f"ids={ids}",
            "--in", f"grad_weight={g}", "--out", f"grad_weight={g}", "-q"])
    expect(p.returncode == 0, f"acc in place: exit {p.returncode}: {p.stderr}")
    expect(np.array_equal(np.load(g)[:, 0], [3.0, 1.0, 3.0]), f"acc in place: {np.load(g)}")


@case("output directory missing / a file / output path is a directory",
      "exit 2 at once, before any input is read")
def bad_output_location_before_compute(d):
    x = small_input(d)
    afile = os.path.join(d, "afile")
    open(afile, "w").close()
    for out, word in ((os.path.join(d, "no", "dir", "y.npy"), "does not exist"),
                      (os.path.join(afile, "y.npy"), "not a directory"),
                      (d, "is a directory"), (d + "/", "is a directory")):
        # The input does not exist: a location checked first never gets to it.
        p = tg(["run", "transpose_2d", "--in", f"input={x}.missing", "--out", f"output={out}"])
        expect_usage_error(p, word)


@case("output directory not writable (run as an unprivileged user)",
      "exit 2 before computing, naming the directory")
def unwritable_directory(d):
    if os.geteuid() != 0:
        ro = os.path.join(d, "ro")
        os.mkdir(ro, 0o555)
        pre = None
    else:  # root writes anywhere: run the CLI as nobody in a root-owned 0755 dir
        ro = os.path.join(d, "ro")
        os.mkdir(ro, 0o755)
        os.chmod(d, 0o755)
        pre = lambda: (os.setgid(65534), os.setuid(65534))  # noqa: E731
    x = small_input(d)
    os.chmod(x, 0o644)
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={ro}/y.npy"],
           preexec_fn=pre)
    expect_usage_error(p, "cannot create a file in", "Permission denied")


@case("bench --json into a missing directory",
      "exit 2 at once (not after the whole bench)")
def bench_json_bad_dir_fails_at_once(d):
    t0 = time.time()
    try:
        p = tg(["bench", "--quick", "--json", os.path.join(d, "bad", "dir", "x.json")],
               timeout=20)
    except subprocess.TimeoutExpired:
        raise Fail("bench ran on with an unwritable --json (killed after 20 s)")
    expect_usage_error(p, "--json", "does not exist")
    expect(time.time() - t0 < 10, "took too long")


@case("a directory given as an input", "exit 2 'is a directory' (was: 'too short')")
def directory_input(d):
    p = tg(["run", "transpose_2d", "--in", f"input={d}", "--out", f"output={d}/y.npy"])
    expect_usage_error(p, "is a directory")
    expect("too short" not in p.stderr, p.stderr)


@case("run with no --out", "exit 2: the run would write nothing")
def run_without_out(d):
    x = small_input(d)
    p = tg(["run", "transpose_2d", "--in", f"input={x}"])
    expect_usage_error(p, "no --out", "output")
    h = tg(["run", "--help"]).stdout
    expect("at least one --out is required" in h and "decimal" in h,
           "run --help does not state the --out and number rules")


# --- numbers ----------------------------------------------------------------------
BAD_NUMBERS = [
    # (args after `run KERNEL ...` or `bench`, words the message must have)
    ("fa", ["--param", "qL_off=010"], ["qL_off=010", "leading zero"]),
    ("fa", ["--param", "qL_off=0x10"], ["qL_off=0x10", "hexadecimal"]),
    ("fa", ["--param", "scale=0x1p-3"], ["scale=0x1p-3", "hexadecimal"]),
    ("fa", ["--param", "scale=1e-50"], ["scale=1e-50", "underflows"]),
    ("fa", ["--param", "scale=1e-40"], ["scale=1e-40", "subnormal"]),
    ("fa", ["--param", "scale=1e39"], ["scale=1e39", "out of range"]),
    ("fa", ["--param", "scale=inf"], ["scale=inf", "finite"]),
    ("fa", ["--param", "scale=nan"], ["scale=nan", "finite"]),
    ("fa", ["--param", "scale="], ["scale"]),
    ("fa", ["--param", "scale=0.1x"], ["scale=0.1x"]),
    ("fa", ["--param", "scale= 0.1"], ["scale= 0.1", "blank"]),
    ("fa", ["--param", "softcapping=1e"], ["softcapping=1e"]),
    ("fa", ["--param", "causal=2"], ["causal=2", "out of range"]),
    ("fa", ["--param", "qL_off=2147483648"], ["qL_off=2147483648", "out of range"]),
    ("fa", ["--param", "qL_off=99999999999999999999"], ["qL_off=9999", "out of range"]),
    ("ce", ["--param", "pad_id=-1"], ["pad_id=-1", "out of range"]),
    ("ce", ["--param", "count=4294967296"], ["count=4294967296", "out of range"]),
    ("fa", ["--threads", "010"], ["--threads 010", "leading zero"]),
    ("fa", ["--threads", "2x"], ["--threads 2x"]),
    ("fa", ["--threads", ""], ["--threads", "empty"]),
    ("fa", ["--threads", "5000"], ["--threads 5000", "out of range"]),
    ("bench", ["--reps", "010"], ["--reps 010", "leading zero"]),
    ("bench", ["--reps", " 3"], ["--reps  3", "blank"]),
    ("bench", ["--threads", "+0"], ["--threads +0", "out of range"]),
    ("bench", ["--triad-mib", "1e3"], ["--triad-mib 1e3"]),
    ("bench", ["--triad-mib=0x100"], ["--triad-mib 0x100", "hexadecimal"]),
    ("bench", ["--shapes", "1,8,8,2048,0128,1"], ["field D=0128", "leading zero"]),
    ("bench", ["--shapes", "1,8,8,2048,128,2"], ["field causal=2", "out of range"]),
    ("bench", ["--shapes", "1,8,8,,128,1"], ["field L=", "empty"]),
]


@case("numbers: octal/hex/underflow/subnormal/out of range/junk/empty/blank "
      f"({len(BAD_NUMBERS)} cases over --param, --threads, bench options)",
      "exit 2 at once naming the parameter and the value")
def bad_numbers_refused(d):
    fa = ["run", "flash_attn_train_fwd_bf16"] + bwd_inputs(d, 4, 4)[:6] + \
         ["--out", f"O={d}/o.npy"]
    ce = ["run", "cross_entropy_fwd_bwd", "--in", f"logits={d}/l.npy", "--in",
          f"targets={d}/t.npy", "--out", f"grad={d}/g.npy"]
    np.save(f"{d}/l.npy", np.zeros((2, 3), np.float32))
    np.save(f"{d}/t.npy", np.zeros(2, np.uint32))
    bad = []
    for which, args, words in BAD_NUMBERS:
        base = {"fa": fa, "ce": ce, "bench": ["bench", "--quick"]}[which]
        try:
            p = tg(base + args, timeout=20)
        except subprocess.TimeoutExpired:
            bad.append(f"{args}: accepted (the bench ran; killed after 20 s)")
            continue
        if p.returncode != 2 or not all(w in p.stderr for w in words):
            bad.append(f"{args}: exit {p.returncode}, {p.stderr.strip()[:200]!r}")
    expect(not bad, "\n    ".join(bad))


BAD_BENCH_ARGS = [
    # (args after `bench --quick`, words the message must have)
    (["--bogus"], ["unknown option '--bogus'", "tilegrad bench --help"]),
    (["--threads"], ["--threads needs a value"]),
    (["--json"], ["--json needs a value"]),
    (["--quick=1"], ["--quick takes no value"]),
    (["--isa", "avx9"], ["--isa 'avx9'", "want one of auto, portable, avx2, avx512, avx512bf16, amx"]),
    (["--section=gpu"], ["--section 'gpu'", "attn, mem, window, peaks or all"]),
    (["--shapes", "1,8,3,512,64,0"], ["--shapes '1,8,3,512,64,0'", "H=8 is not a multiple of Hkv=3"]),
    (["--shapes", "1,8,8,512,64"], ["--shapes '1,8,8,512,64'", "want 6 fields"]),
    (["--shapes", " ; "], ["--shapes: no usable shape in ' ; '"]),
    (["--shapes", "1,8,8,512,64,1,-1"], ["--shapes '1,8,8,512,64,1,-1': field W=-1", "out of range"]),
    (["--shapes", "1,8,8,512,64,1,4,4"], ["--shapes '1,8,8,512,64,1,4,4'", "or 7 with a sliding window W"]),
    # the first error on the line is the one reported, before the --json location
    (["--json", "/nonexistent-dir/x.json", "--reps", "0"], ["--reps 0", "out of range"]),
]


@case(f"bench command line: unknown option, missing value, value given to a flag, "
      f"bad --isa/--section/--shapes ({len(BAD_BENCH_ARGS)} cases)",
      "exit 2 at once with one message naming the option (was: `--quick=1` ran the bench)")
def bad_bench_args_refused(d):
    bad = []
    for args, words in BAD_BENCH_ARGS:
        try:
            p = tg(["bench", "--quick"] + args, timeout=20)
        except subprocess.TimeoutExpired:
            bad.append(f"{args}: accepted (the bench ran; killed after 20 s)")
            continue
        if p.returncode != 2 or not all(w in p.stderr for w in words) or \
                len(p.stderr.strip().splitlines()) != 1:
            bad.append(f"{args}: exit {p.returncode}, {p.stderr.strip()[:200]!r}")
    expect(not bad, "\n    ".join(bad))
    h = tg(["bench", "--help"])
    expect(h.returncode == 0 and "--shapes LIST" in h.stdout and "decimal" in h.stdout,
           f"bench --help: exit {h.returncode}, {h.stdout[:200]!r}")


@case("numbers that must be accepted (-3, 0.125, 1e-3, +2, 0, true)",
      "exit 0",
      before="passed (guard)")
def good_numbers_accepted(d):
    ins = bwd_inputs(d, 4, 4)[:6]
    for args in (["--param", "qL_off=-3", "--param", "scale=0.125"],
                 ["--param", "scale=1e-3", "--param", "causal=true", "--threads", "+2"],
                 ["--param", "softcapping=1.0", "--param", "qL_off=0", "--threads", "0"],
                 ["--param", "scale=.5", "--param", "causal=0"]):
        p = tg(["run", "flash_attn_train_fwd_bf16"] + ins + ["--out", f"O={d}/o.npy", "-q"] + args)
        expect(p.returncode == 0, f"{args}: exit {p.returncode}: {p.stderr.strip()}")


# --- messages and limits ------------------------------------------------------------
@case("an error message about a 3900-byte path",
      "the reason is printed whole after the path (not cut at 512 bytes)")
def long_path_message_not_cut(d):
    x = small_input(d)
    deep = os.path.join(d, "n" * 200, *(["m" * 200] * 18), "y.npy")
    p = tg(["run", "transpose_2d", "--in", f"input={x}", "--out", f"output={deep}"])
    expect_usage_error(p, "does not exist")
    expect(p.stderr.rstrip().endswith("does not exist"), p.stderr[-200:])
    p = tg(["run", "transpose_2d", "--in", "input=" + "a" * 5000, "--out", f"output={d}/y.npy"])
    expect_usage_error(p, "longer than the system takes")
    expect(len(p.stderr) < 400, f"{len(p.stderr)}-byte message for a 5000-byte path")


def run_measured(args):
    """Runs the CLI; returns (exit code, stderr, peak RSS in MiB)."""
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen([BIN] + args, stdout=subprocess.DEVNULL, stderr=err, env=ENV)
        _, status, ru = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        return p.returncode, err.read().decode(errors="replace"), ru.ru_maxrss / 1024


@case("decode reduce: params imply a huge dst, htmp is short",
      "exit 2 naming htmp, before dst is allocated (peak RSS < 100 MiB; was 400 MB, or "
      "'cannot allocate' for 8 PB)")
def decode_checks_before_allocating(d):
    h = os.path.join(d, "htmp.npy")
    np.save(h, np.zeros(100, np.float32))
    for kernel in ("flash_attn_vec_reduce", "flash_attn_vec_reduce_tq_hb_undo"):
        for nrows, hd in ((100000, 1024), (2147483647, 1048576)):
            rc, err, rss = run_measured(["run", kernel, "--in", f"htmp={h}", "--out",
                                         f"dst={d}/o.npy" if kernel.endswith("reduce")
                                         else f"output={d}/o.npy",
                                         "--param", f"nrows={nrows}", "--param", f"head_dim={hd}"])
            expect(rc == 2 and "htmp" in err and "allocate" not in err,
                   f"{kernel} nrows={nrows} head_dim={hd}: exit {rc}: {err.strip()[:300]}")
            expect(rss < 100, f"{kernel} nrows={nrows}: peak RSS {rss:.0f} MiB")


# --- signals ------------------------------------------------------------------------
def interrupt_during_write(d, sig):
    """Starts a cast whose 64 MiB output takes a while to write, sends sig as
    soon as an output file (temporary or target) holds data; returns
    (exit code, files other than the input)."""
    src = os.path.join(d, "src.npy")
    if not os.path.exists(src):
        np.save(src, np.ones(1 << 25, np.float32))  # 128 MiB in, 64 MiB out
    out = os.path.join(d, "dst.npy")
    p = subprocess.Popen([BIN, "run", "f32_to_bf16_cast", "--in", f"src={src}", "--out",
                          f"dst={out}", "-q"], env=ENV, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    sent = False
    while time.time() < deadline and p.poll() is None:
        for n in os.listdir(d):
            if n != "src.npy":
                try:
                    if os.path.getsize(os.path.join(d, n)) > 0:
                        p.send_signal(sig)
                        sent = True
                except FileNotFoundError:
                    pass
            if sent:
                break
        if sent:
            break
    p.wait()
    p.stderr.close()
    return p.returncode, sent, leftovers(d, ["src.npy"])


@case("SIGINT / SIGTERM while `tilegrad run` writes its output",
      "the process dies of the signal; no partial output and no temporary left")
def signal_during_write(d):
    for sig in (signal.SIGINT, signal.SIGTERM):
        for attempt in range(3):
            rc, sent, left = interrupt_during_write(d, sig)
            if sent and rc == -sig:
                break
            for n in left:  # the write finished before the signal: try again
                os.remove(os.path.join(d, n))
        expect(sent and rc == -sig, f"{sig.name}: never caught the write (exit {rc})")
        expect(left == [], f"{sig.name}: left behind: {left}")


@case("bench --json write fails (ulimit -f) over an earlier JSON",
      "bench fails naming the file and 'File too large'; the earlier JSON unchanged; "
      "no temporary left")
def bench_json_write_fails_keeps_old(d):
    out = os.path.join(d, "b.json")
    with open(out, "w") as f:
        f.write('{"earlier": true}')
    lim = lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))  # noqa: E731
    p = tg(["bench", "--section", "peaks", "--triad-mib", "1", "--reps", "1", "--threads", "1",
            "--json", out], preexec_fn=lim, timeout=120)
    expect(p.returncode != 0 and "File too large" in p.stderr and "b.json" in p.stderr,
           f"exit {p.returncode}: {p.stderr.strip()[-300:]!r}")
    expect(open(out).read() == '{"earlier": true}', "the earlier JSON was changed")
    expect(os.listdir(d) == ["b.json"], f"left: {os.listdir(d)}")


@case("SIGTERM during `tilegrad bench --json`",
      "dies of SIGTERM; no JSON file and no temporary",
      before="passed (guard)")
def signal_during_bench(d):
    out = os.path.join(d, "b.json")
    p = subprocess.Popen([BIN, "bench", "--quick", "--section", "peaks", "--triad-mib", "1",
                          "--json", out], env=ENV, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    p.wait()
    expect(p.returncode == -signal.SIGTERM, f"exit {p.returncode}")
    expect(os.listdir(d) == [], f"left: {os.listdir(d)}")


def main():
    global BIN
    args = sys.argv[1:]
    if "--table" in args:
        print("| class of bad input or fault | test (tests/cli_robust_check.py) | outcome | "
              "before the fix |")
        print("| --- | --- | --- | --- |")
        for fn, klass, outcome, before in CASES:
            print(f"| {klass} | `{fn.__name__}` | {outcome} | {before} |")
        return 0
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    BIN = os.path.abspath(args[0])
    only = args[args.index("--only") + 1] if "--only" in args else None
    for fn, _, _, _ in CASES:
        if only and fn.__name__ != only:
            continue
        with tempfile.TemporaryDirectory(prefix="tg_robust_") as d:
            try:
                fn(d)
                print(f"  ok    {fn.__name__}")
            except (Fail, Exception) as e:  # one case's crash must not hide the others
                FAILS.append(fn.__name__)
                print(f"  FAIL  {fn.__name__}: {type(e).__name__}: {e}")
    doc = open(os.path.join(ROOT, "docs", "ROBUSTNESS.md")).read() \
        if os.path.exists(os.path.join(ROOT, "docs", "ROBUSTNESS.md")) else ""
    missing = [fn.__name__ for fn, _, _, _ in CASES if f"`{fn.__name__}`" not in doc]
    if missing and not only:
        print(f"  FAIL  docs/ROBUSTNESS.md lacks {missing} (regenerate with --table)")
        FAILS.append("docs")
    if FAILS:
        print(f"cli_robust_check: {len(FAILS)} FAILED")
        return 1
    print(f"cli_robust_check: all {len(CASES)} cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
