"""The benchmark's timer, on the CPU: what it times and in which order."""

import os
import sys
from pathlib import Path

import pytest
import torch

SOURCE_DIR = Path(os.environ.get("SEGMENT_OPS_SRC", Path(__file__).resolve().parents[1]))
BENCHMARKS = SOURCE_DIR / "benchmarks"


def test_timer_interleaves_ops_and_names_the_one_that_fails(monkeypatch):
    if not (BENCHMARKS / "bench.py").exists():
        pytest.skip(f"benchmarks not found at {BENCHMARKS} (set SEGMENT_OPS_SRC)")
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, "bench", raising=False)
    import bench

    calls = []

    def op(name):
        return lambda: calls.append(name)

    def broken():
        raise RuntimeError("no kernel\nfor this")

    timer = bench.Timer(torch.device("cpu"), warmup=1, repeat=8, budget_s=60.0)
    seconds, errors = timer.interleaved_medians({"a": op("a"), "b": op("b"), "c": broken}, 4)
    assert sorted(seconds) == ["a", "b"] and errors == {"c": "no kernel for this"}
    # Each op's warm-up and first run, then its 7 other runs shared out over 4
    # rounds (2, 4, 6, 8 runs done), each round visiting a, then b.
    assert calls[:4] == ["a", "a", "b", "b"]
    assert calls[4:] == ["a", "b"] + ["a", "a", "b", "b"] * 3
