#!/usr/bin/env python3
"""bench/plot.py's file output (python3 stdlib only): the image goes to a
temporary next to -o and is renamed over it when complete; a failing or
interrupted savefig leaves the old file and no temporary; a bad -o location
fails before any JSON is read. matplotlib is replaced by a stub (the test is
about files, not drawing, and runs where matplotlib is not installed).

usage: python3 tests/cli_plot_check.py
"""
import importlib.util
import os
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_plot():
    mpl = types.ModuleType("matplotlib")
    mpl.use = lambda *a, **k: None
    mpl.pyplot = types.ModuleType("matplotlib.pyplot")
    sys.modules["matplotlib"] = mpl
    sys.modules["matplotlib.pyplot"] = mpl.pyplot
    spec = importlib.util.spec_from_file_location("plot", os.path.join(ROOT, "bench", "plot.py"))
    plot = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plot)
    return plot


class Fig:
    """savefig writes half an image, then raises `fail` if set."""
    def __init__(self, fail=None):
        self.fail = fail
        self.format = None

    def savefig(self, f, format=None, **kw):
        self.format = format
        f.write(b"\x89PNG half")
        if self.fail:
            raise self.fail
        f.write(b" rest")


def main():
    plot = load_plot()
    fails = []

    def check(cond, what):
        print(f"  {'ok  ' if cond else 'FAIL'}  {what}")
        if not cond:
            fails.append(what)

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "p.png")
        plot.save_atomic(Fig(), out, dpi=110)
        check(open(out, "rb").read() == b"\x89PNG half rest", "save_atomic writes the image")
        os.chmod(out, 0o640)
        for exc in (OSError(28, "No space left on device"), KeyboardInterrupt(), SystemExit(143)):
            try:
                plot.save_atomic(Fig(fail=exc), out)
                check(False, f"{type(exc).__name__} in savefig propagates")
            except BaseException as e:  # noqa: B036 - the test wants every kind
                check(type(e) is type(exc), f"{type(exc).__name__} in savefig propagates")
            check(open(out, "rb").read() == b"\x89PNG half rest",
                  f"{type(exc).__name__} in savefig: the old image stays")
            check(os.listdir(d) == ["p.png"], f"{type(exc).__name__}: no temporary left")
        plot.save_atomic(Fig(), out)
        check(os.stat(out).st_mode & 0o777 == 0o640, "an existing file's mode is kept")
        fig = Fig()
        plot.save_atomic(fig, os.path.join(d, "p.svg"))
        check(fig.format == "svg", "the format follows the extension")
        os.symlink("p.png", os.path.join(d, "link.png"))
        plot.save_atomic(Fig(), os.path.join(d, "link.png"))
        check(os.path.islink(os.path.join(d, "link.png")), "a symlink target stays a link")
        # A bad -o fails before the (missing) JSON is read or anything drawn.
        for bad, why in ((os.path.join(d, "no", "dir", "x.png"), "does not exist"),
                         (d, "is a directory")):
            sys.argv = ["plot.py", os.path.join(d, "missing.json"), "-o", bad]
            try:
                plot.main()
                check(False, f"-o {why}: refused")
            except SystemExit as e:
                check(why in str(e.code), f"-o {why}: refused before reading the JSON ({e.code})")
            except FileNotFoundError as e:
                check(False, f"-o {why}: refused before reading the JSON (got {e})")
    print(f"cli_plot_check: {'all passed' if not fails else f'{len(fails)} FAILED'}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
