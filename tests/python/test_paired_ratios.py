"""bench/paired_ratios.py: the parse of a paired log and its per-round ratios
(a small log written here, with a drift between rounds the ratios cancel)."""
import importlib.util
import os
import sys

_SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "paired_ratios.py")
_spec = importlib.util.spec_from_file_location("paired_ratios", _SCRIPT)
paired_ratios = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(paired_ratios)

ROW = "1   1,8,8,1024,64,full   5.37   {ms:.2f}   {ms:.2f}   259.7   87.1   13.0\n"


def test_per_round_ratios_cancel_drift(tmp_path, capsys, monkeypatch):
    log = tmp_path / "paired.txt"
    with open(log, "w") as f:
        for r, speed in ((1, 1.0), (2, 2.0), (3, 1.5)):  # the machine drifts 2x
            for cfg, ms in (("c64", 10.0), ("c128", 9.0)):
                f.write(f"== r{r} t2 bf16 {cfg}\n" + ROW.format(ms=ms * speed))
            f.write(f"== r{r} t16 bf16 c64\n" + ROW.format(ms=2.0))
    times, configs = paired_ratios.read(str(log))
    assert configs == ["c64", "c128"]
    assert times[("t2 bf16", "bwd", "1,8,8,1024,64,full")][(2, "c128")] == 18.0
    monkeypatch.setattr(sys, "argv", ["paired_ratios.py", str(log), "--base", "c64"])
    paired_ratios.main()
    out = capsys.readouterr().out
    assert "c128    13.50 0.900 [0.90-0.90] n=3" in out  # median ms 13.5, every ratio 0.9
    assert "t16 bf16   bwd 1,8,8,1024,64,full       c64     2.00\n" in out  # c64 alone
