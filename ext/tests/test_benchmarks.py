"""The benchmark's timer, on the CPU: what it times, in which order, and what it
does with a run that kept host time in it or outlasted the budget; what the page
says of it; and ab.py's command line."""

import gzip
import importlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

SOURCE_DIR = Path(os.environ.get("SEGMENT_OPS_SRC", Path(__file__).resolve().parents[1]))
BENCHMARKS = SOURCE_DIR / "benchmarks"


@pytest.fixture
def bench(monkeypatch):
    if not (BENCHMARKS / "bench.py").exists():
        pytest.fail(f"benchmarks not found at {BENCHMARKS} (set SEGMENT_OPS_SRC)")
    return fresh_module(monkeypatch, "bench")


def test_timer_interleaves_ops_and_names_the_one_that_fails(bench):
    calls = []

    def op(name):
        return lambda: calls.append(name)

    def broken():
        raise RuntimeError("no kernel\nfor this")

    timer = bench.Timer(torch.device("cpu"), warmup=1, repeat=8, budget_s=60.0)
    seconds, errors, host_bound = timer.interleaved_medians(
        {"a": op("a"), "b": op("b"), "c": broken}, 4
    )
    assert sorted(seconds) == ["a", "b"] and errors == {"c": "no kernel for this"}
    assert host_bound == {}
    # Each op's warm-up and first run, then its 7 other runs shared out over 4
    # rounds (2, 4, 6, 8 runs done), each round visiting a, then b.
    assert calls[:4] == ["a", "a", "b", "b"]
    assert calls[4:] == ["a", "b"] + ["a", "a", "b", "b"] * 3


def test_timer_retries_a_run_that_kept_host_time_and_counts_those_that_still_do(
    bench, monkeypatch
):
    tries = {"a": 0, "b": 0}
    timer = bench.Timer(torch.device("cpu"), warmup=0, repeat=5, budget_s=60.0)

    def timed(fn):
        name = fn()
        tries[name] += 1
        # a: the first try of every run kept host time, the retry did not; b: every try
        return 1.0, name == "b" or tries[name] % 2 == 1

    monkeypatch.setattr(timer, "timed", timed)
    seconds, errors, host_bound = timer.interleaved_medians({"a": lambda: "a", "b": lambda: "b"}, 2)
    assert seconds == {"a": 1.0, "b": 1.0} and errors == {}
    assert host_bound == {"b": 5}
    assert tries == {"a": 2 * 5, "b": bench.HOST_RETRIES * 5}


def test_timer_warms_an_op_slower_than_its_budget_twice_and_times_it_once(bench, monkeypatch):
    timer = bench.Timer(torch.device("cpu"), warmup=3, repeat=20, budget_s=1.0)
    calls = {"slow": 0, "tuned": 0}
    # slow: every run 5 s; tuned: its first run 5 s (Triton's tuning), then 0.1 s
    durations = {"slow": lambda n: 5.0, "tuned": lambda n: 5.0 if n == 1 else 0.1}

    def op(name):
        def run():
            calls[name] += 1
            return name

        return run

    def timed(fn):
        name = fn()
        return durations[name](calls[name]), False

    monkeypatch.setattr(timer, "timed", timed)
    seconds, errors, _ = timer.interleaved_medians({"slow": op("slow"), "tuned": op("tuned")}, 4)
    assert seconds == {"slow": 5.0, "tuned": 0.1} and errors == {}
    # slow: two warm-ups and one timed run; tuned: all three warm-ups, then
    # as many runs as the budget holds (10, the first included)
    assert calls == {"slow": 3, "tuned": 3 + 10}


def fresh_render(monkeypatch):
    """benchmarks/render.py, imported anew from the sources under test."""
    if not (BENCHMARKS / "render.py").exists():
        pytest.fail(f"benchmarks not found at {BENCHMARKS} (set SEGMENT_OPS_SRC)")
    return fresh_module(monkeypatch, "render")


def test_page_says_how_it_timed_an_op_slower_than_the_budget_only_if_it_did(monkeypatch):
    render = fresh_render(monkeypatch)

    def timing(settings):
        page = render.render({"header": {"settings": settings}, "cases": []}, "x.json")
        return next(line for line in page.splitlines() if line.startswith("| Timing"))

    assert "an op of over" not in timing({"budget_s": 0.5, "warmup": 3})  # an older page
    assert timing({"budget_s": 0.5, "warmup": 3, "once_over_budget": True}).endswith(
        "; an op of over 0.5 s a run: one run after 2 warm-up run(s) |"
    )
    # --quick warms up once: so does a slow op
    assert timing({"budget_s": 0.2, "warmup": 1, "once_over_budget": True}).endswith(
        "; an op of over 0.2 s a run: one run after 1 warm-up run(s) |"
    )


def test_page_counts_the_cases_short_of_each_target_worst_first(monkeypatch):
    render = fresh_render(monkeypatch)

    def case(law, fwd, bwd, triton, vs_fwd, vs_bwd):
        fractions = {"native_forward": fwd, "native_backward": bwd, "triton_forward": triton}
        vs = {"native_forward": vs_fwd, "native_backward": vs_bwd}
        return {"dtype": "bfloat16", "law": law, "inner": 1, "rows": 8, "rows_requested": 8,
                "copy_fraction": fractions, "vs_segment_reduce": vs}

    cases = [
        case("short", 0.90, 0.84, 0.90, 1.5, 0.9),  # backward short of 85 % and slower
        case("long", 0.80, 0.95, 0.60, 2.0, 3.0),  # forward and Triton short
        case("power", 0.70, 0.95, None, 50.0, 9.0),  # forward shorter still; no Triton run
        case("giant", 0.85, 0.85, 0.68, 9.0, 9.0),  # exactly at 85 % and 0.8x meet them
    ]
    page = render.render({"header": {}, "cases": cases}, "x.json")
    rows = {line.split(" | ")[0].lstrip("| "): line for line in page.splitlines()
            if line.startswith("| ") and " of " in line.split(" | ")[1]}
    assert rows["forward ≥ 85% of copy"].endswith(
        "| 2 of 4 | bfloat16 power ×1 70.0%, bfloat16 long ×1 80.0% |")
    assert rows["backward ≥ 85% of copy"].endswith("| 3 of 4 | bfloat16 short ×1 84.0% |")
    assert rows["forward faster than segment_reduce"].endswith("| 4 of 4 | none |")
    assert rows["backward faster than segment_reduce"].endswith(
        "| 3 of 4 | bfloat16 short ×1 0.90× |")
    assert rows["Triton forward ≥ 0.8× the forward's bandwidth"].endswith(
        "| 2 of 3 (1 not measured) | bfloat16 long ×1 0.75× |")
    # A page with no cases (not measured yet) has no such section.
    assert "Against the targets" not in render.render({"header": {}, "cases": []}, "x.json")


def fresh_ab(monkeypatch):
    """benchmarks/ab.py, imported anew: it binds `bench` (or its absence) at import."""
    if not (BENCHMARKS / "ab.py").exists():
        pytest.fail(f"benchmarks not found at {BENCHMARKS} (set SEGMENT_OPS_SRC)")
    return fresh_module(monkeypatch, "ab")


def fresh_module(monkeypatch, name):
    """benchmarks/NAME.py imported anew, and gone from sys.modules again after the test: a
    module bound to this test's stand-ins (ab with `bench` None) must not be the one a
    later test in the same process imports."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    monkeypatch.delitem(sys.modules, name, raising=False)  # undone last: what was there
    monkeypatch.setitem(sys.modules, name, None)  # undone first: the name leaves again
    del sys.modules[name]
    return importlib.import_module(name)


def test_page_command_names_the_results_file_not_the_measuring_machines_folder(bench):
    argv = ["benchmarks/bench.py", "--budget", "0.5", "--out", "/scratch/run 7/benchmarks.json"]
    assert bench.recorded_command(argv) == (
        "python benchmarks/bench.py --budget 0.5 --out benchmarks.json"
    )
    assert bench.recorded_command(["benchmarks/bench.py", "--out=/tmp/r.json", "--quick"]) == (
        "python benchmarks/bench.py --out=r.json --quick"
    )
    assert bench.recorded_command(["benchmarks/bench.py", "--quick"]) == (
        "python benchmarks/bench.py --quick"
    )


def test_ab_builds_without_the_benchmark_and_says_in_one_line_why_it_cannot_run(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(sys.modules, "bench", None)  # as when numpy or segment_ops is missing
    ab = fresh_ab(monkeypatch)

    # build gets past the import to its own check of the variant
    assert ab.main(["build", "--out", str(tmp_path), f"x={tmp_path / 'none.cuh'}"]) == 2
    assert "variant x: no file" in capsys.readouterr().err

    assert ab.main(["run", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ab.py: run needs what benchmarks/bench.py imports:")
    assert err.count("\n") == 1


def test_ab_times_only_the_ops_asked_for_and_refuses_others_in_one_line(
    bench, monkeypatch, tmp_path, capsys
):
    ab = fresh_ab(monkeypatch)

    class GatherOnly:  # a variant whose sum must not be timed
        @staticmethod
        def segment_sum(src, indptr):
            raise AssertionError("the sum was run though only bwd was asked for")

        @staticmethod
        def segment_gather(grad, indptr, rows):
            return grad.new_zeros(rows, grad.shape[1])

    cpu = torch.device("cpu")
    timer = bench.Timer(cpu, warmup=0, repeat=2, budget_s=1.0)
    kinds = ab.parse_ops("bwd,bwd")
    case = ab.run_case({"only": GatherOnly}, timer, "float32", "short", 1, cpu, 64, 1, kinds)
    assert list(case["variants"]["only"]) == ["bwd"]

    assert ab.main(["run", str(tmp_path), "--ops", "fwd,grad"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ab.py: --ops 'fwd,grad': expected") and err.count("\n") == 1


def test_ab_profile_calls_one_op_of_one_variant_and_refuses_others_in_one_line(
    bench, monkeypatch, tmp_path, capsys
):
    ab = fresh_ab(monkeypatch)
    calls = []

    class Recorded:
        def __init__(self, name):
            self.name = name

        def segment_sum(self, src, indptr):
            calls.append((self.name, "fwd", tuple(src.shape)))

        def segment_gather(self, grad, indptr, rows):
            calls.append((self.name, "bwd", (rows, grad.shape[1])))

    monkeypatch.setattr(ab, "load", lambda directory: {"a": Recorded("a"), "b": Recorded("b")})
    base = ["profile", str(tmp_path), "--device", "cpu", "--rows", "300"]
    args = ["--case", "float32:power:4", "--op", "bwd", "--variant", "b", "--calls", "3"]
    assert ab.main([*base, *args]) == 0
    assert calls == [("b", "bwd", (300, 4))] * (2 + 3)  # warm-up calls, then the recorded ones
    calls.clear()
    assert ab.main([*base, *args, "--warmup", "0"]) == 0
    assert calls == [("b", "bwd", (300, 4))] * 3
    calls.clear()
    assert ab.main([*base, "--case", "bfloat16:short:2"]) == 0  # the first variant's sum
    assert calls == [("a", "fwd", (300, 2))] * (2 + 5)
    calls.clear()

    for bad, message in [
        (["--case", "float32:short:1", "--variant", "c"], "--variant 'c': not built here"),
        (["--case", "float32:short:1", "--op", "grad"], "--op 'grad': expected"),
        (["--case", "float32:short:1", "--calls", "0"], "--calls 0: expected at least 1"),
        (["--case", "float32:short:1", "--warmup", "-1"], "--warmup -1: expected 0 or more"),
        (["--case", "float32:flat:1"], "case 'float32:flat:1': expected"),
    ]:
        assert ab.main([*base, *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"ab.py: {message}") and err.count("\n") == 1, err
    assert calls == []


def test_ab_build_keeps_the_library_and_how_it_was_built_not_the_build_tree(
    monkeypatch, tmp_path
):
    """`build --out DIR` leaves DIR small enough to copy to a GPU machine whole: the
    CMake tree (objects of every kernel) goes once the library and the CMake cache
    are copied out of it."""
    ab = fresh_ab(monkeypatch)
    monkeypatch.setattr(ab, "find_cmake", lambda: "cmake")
    monkeypatch.setattr(ab, "cuda_args", lambda: [])

    def cmake(step, stdout, stderr):  # configure, then build: a library among objects
        if step[1] == "-S":
            tree = Path(step[step.index("-B") + 1])
            tree.mkdir(exist_ok=True)
            (tree / "CMakeCache.txt").write_text("CMAKE_CXX_FLAGS:STRING=\n")
        else:
            tree = Path(step[2])
            (tree / "kernels.o").write_bytes(bytes(4096))
            (tree / "libsegment_ops.so").write_bytes(b"library")
        return subprocess.CompletedProcess(step, 0)

    monkeypatch.setattr(ab.subprocess, "run", cmake)
    header = tmp_path / "try.cuh"
    header.write_text("// the variant's kernels\n")
    out = tmp_path / "ab"
    assert ab.main(["build", "--out", str(out), f"x={header}"]) == 0
    assert sorted(p.name for p in (out / "x").iterdir()) == [
        "CMakeCache.txt",
        "build.log",
        "libsegment_ops.so",
        "src",
    ]
    assert (out / "x" / "libsegment_ops.so").read_bytes() == b"library"
    built = out / "x" / "src" / "csrc" / "cuda" / "segment_kernels.cuh"
    assert built.read_text() == "// the variant's kernels\n"


def test_ab_cut_keeps_the_rows_and_leaves_no_segment_longer(bench, monkeypatch, tmp_path, capsys):
    import numpy as np

    ab = fresh_ab(monkeypatch)
    lengths = np.array([0, 1, 9, 4, 13, 0], dtype=np.int64)
    assert ab.cut_lengths(lengths, 4).tolist() == [0, 1, 4, 4, 1, 4, 4, 4, 4, 1, 0]
    power = bench.segment_lengths("power", 1 << 16, 0)
    cut = ab.cut_lengths(power, 64)
    assert power.max() > 64 and cut.max() == 64 and cut.sum() == power.sum()

    longest = []

    class Recorded:
        def segment_sum(self, src, indptr):
            longest.append(int((indptr[1:] - indptr[:-1]).max()))

    monkeypatch.setattr(ab, "load", lambda directory: {"a": Recorded()})
    base = ["profile", str(tmp_path), "--device", "cpu", "--rows", "4096", "--calls", "1"]
    base += ["--warmup", "0"]
    assert ab.main([*base, "--case", "float32:giant:1", "--cut", "100"]) == 0
    assert capsys.readouterr().out.startswith("float32 giant<=100 x1 fwd a:")
    assert ab.main([*base, "--case", "float32:giant:1"]) == 0
    assert capsys.readouterr().out.startswith("float32 giant x1 fwd a:")
    assert longest == [100, 4096]

    assert ab.main([*base, "--case", "float32:giant:1", "--cut", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ab.py: --cut 0: expected at least 1") and err.count("\n") == 1


def test_ab_times_a_triton_module_variant_forward_only_beside_a_cuda_one(
    bench, monkeypatch, tmp_path, capsys
):
    """A variant file ending in .py is a Triton module: copied, not built, and
    imported under its own namespace beside the installed segment_ops, whose
    own op stays as it was. It has no gather, so only its forward is timed,
    against the first variant that has one, and each case tunes it afresh."""
    pytest.importorskip("triton")
    import segment_ops.ops

    ab = fresh_ab(monkeypatch)
    monkeypatch.setattr(ab, "find_cmake", lambda: pytest.fail("a Triton variant needs no build"))
    # The installed one: the matrix runs these tests with no sources beside them.
    module = Path(segment_ops.ops.__file__).with_name("_triton.py")
    out = tmp_path / "ab"
    assert ab.main(["build", "--out", str(out), f"tri_{os.getpid()}={module}"]) == 0
    (variant,) = ab.load(out).values()
    assert segment_ops.ops.NAMESPACE == "segment_ops"
    assert hasattr(getattr(torch.ops, f"segment_ops_ab_tri_{os.getpid()}"), "segment_sum_triton")
    assert hasattr(variant, "segment_sum") and not hasattr(variant, "segment_gather")

    class Native:
        segment_sum = staticmethod(lambda src, indptr: src[: indptr.numel() - 1])
        segment_gather = staticmethod(lambda grad, indptr, rows: grad.new_zeros(rows, 1))

    sums_before_tuning_forgotten = []

    class TritonLike:
        triton = True
        calls = 0

        @staticmethod
        def segment_sum(src, indptr):
            TritonLike.calls += 1
            return Native.segment_sum(src, indptr)

        @staticmethod
        def forget_tuning():
            sums_before_tuning_forgotten.append(TritonLike.calls)

    cpu = torch.device("cpu")
    timer = bench.Timer(cpu, warmup=0, repeat=2, budget_s=1.0)
    ops = {"tri": TritonLike, "cuda": Native}
    case = ab.run_case(ops, timer, "float32", "short", 1, cpu, 64, 1)
    case = ab.run_case(ops, timer, "float32", "power", 1, cpu, 64, 1)
    # Each case tunes on its own segments: tuning forgotten before its first call.
    assert len(sums_before_tuning_forgotten) == 2
    assert sums_before_tuning_forgotten[0] == 0
    assert sums_before_tuning_forgotten[1] > sums_before_tuning_forgotten[0]
    assert variant.forget_tuning.__name__ == "forget_tuning"  # the module's own
    assert list(case["variants"]["tri"]) == ["fwd"]
    assert list(case["variants"]["cuda"]) == ["fwd", "bwd"]
    assert case["variants"]["cuda"]["bwd"]["speedup"] == 1.0  # its own reference

    class Uncompilable(TritonLike):
        @staticmethod
        def segment_sum(src, indptr):
            raise RuntimeError("at 170:4:\n    for _block in range(...):")

    with pytest.raises(ab.UsageError, match=r"^variant bad: RuntimeError: at 170:4:$"):
        ab.run_case({"bad": Uncompilable}, timer, "float32", "short", 1, cpu, 64, 1)
    # triton's own error: its reason, not the source it starts with
    assert ab.one_line(type("CompilationError", (Exception,), {})("at 170:4:\n  src")) == (
        "CompilationError: at 170:4:"
    )
    reason = "Loop-carried variable last changes type"
    failed = type("CompilationError", (Exception,), {"error_message": reason})
    assert ab.one_line(failed("at 170:4:\n  src")) == (
        "CompilationError: Loop-carried variable last changes type"
    )


def test_ab_refuses_what_a_triton_variant_cannot_do_in_one_line(
    bench, monkeypatch, tmp_path, capsys
):
    ab = fresh_ab(monkeypatch)
    module = SOURCE_DIR / "src" / "segment_ops" / "_triton.py"
    broken = tmp_path / "broken.py"
    broken.write_text("import torch\n\ndef segment_sum_triton(:\n")
    nameless = tmp_path / "nameless.py"
    nameless.write_text("SEGMENTS = 1\n")
    triton_sum = SimpleNamespace(segment_sum=lambda src, indptr: src, triton=True)
    native = SimpleNamespace(segment_sum=lambda s, i: s, segment_gather=lambda g, i, r: g)
    monkeypatch.setattr(ab, "load", lambda directory: {"tri": triton_sum, "cuda": native})
    run = ["run", str(tmp_path), "--rows", "64", "--cases", "float32:short:1"]
    profile = ["profile", str(tmp_path), "--rows", "64", "--case", "float32:short:1"]
    for argv, message in [
        (["build", "--out", str(tmp_path / "b"), f"t={module}:FAST=1"], "variant t: a Triton"),
        (["build", "--out", str(tmp_path / "b"), f"t={broken}"], f"variant t: {broken}:3:"),
        ([*run, "--device", "cpu"], "--device cpu: Triton variants (tri) need CUDA"),
        ([*profile, "--device", "cpu", "--variant", "tri"], "--device cpu: Triton variants"),
        ([*profile, "--device", "cpu", "--variant", "tri", "--op", "bwd"], "--op bwd: variant tri"),
    ]:
        assert ab.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"ab.py: {message}") and err.count("\n") == 1, err
    monkeypatch.setattr(ab, "load", lambda directory: {"tri": triton_sum})
    assert ab.main([*run, "--device", "cuda", "--ops", "bwd"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ab.py: --ops bwd: no variant has it") and err.count("\n") == 1

    pytest.importorskip("triton")
    with pytest.raises(ab.UsageError, match="nameless.py: AttributeError"):
        ab.load_triton(nameless, f"segment_ops_ab_nameless_{os.getpid()}")


# The kernels' namespace as the C++ compiler mangles it (length, then name): renaming
# the extension renames it.
NS = f"_ZN{len('segment_ops')}segment_ops"
RES_USAGE = """
Fatbin elf code:
================
arch = sm_90
code version = [1,8]

Resource usage:
 Common:
  GLOBAL:28 CONSTANT[4]:224
 Function {NS}4cuda6detail15tile_sum_kernelIfLi1ELb0EEEvPKT_:
  REG:79 STACK:0 SHARED:30600 LOCAL:0 CONSTANT[0]:592 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function {NS}4cuda6detail15lane_sum_kernelIfLi4EEEvPKT_:
  REG:{lane_regs} STACK:0 SHARED:1880 LOCAL:{lane_local} CONSTANT[0]:592 TEXTURE:0
"""


def test_ab_resources_lists_kernels_side_by_side_and_marks_those_that_changed(
    monkeypatch, tmp_path, capsys
):
    ab = fresh_ab(monkeypatch)
    dump = RES_USAGE.replace("{lane_regs}", "63").replace("{lane_local}", "0").replace(
        "{NS}", NS)
    assert ab.kernel_resources(dump) == {
        ("sm_90", f"{NS}4cuda6detail15tile_sum_kernelIfLi1ELb0EEEvPKT_"): {
            "REG": 79, "STACK": 0, "SHARED": 30600, "LOCAL": 0
        },
        ("sm_90", f"{NS}4cuda6detail15lane_sum_kernelIfLi4EEEvPKT_"): {
            "REG": 63, "STACK": 0, "SHARED": 1880, "LOCAL": 0
        },
    }
    tile = f"{NS}4cuda6detail15tile_sum_kernelIfLi1ELb0EEEvPKT_"
    expected = "tile_sum_kernel<float, 1, false>" if shutil.which("c++filt") else tile
    assert ab.short_names([tile]) == {tile: expected}
    manifest = {
        "base": {"namespace": "a", "lib": "base/lib.so"},
        "try": {"namespace": "b", "lib": "try/lib.so"},
    }
    (tmp_path / "variants.json").write_text(json.dumps(manifest))
    monkeypatch.setattr(ab, "find_cuobjdump", lambda: "cuobjdump")
    spilled = RES_USAGE.replace("{lane_regs}", "64").replace("{lane_local}", "24").replace(
        "{NS}", NS)

    def cuobjdump(argv, **kwargs):
        text = spilled if argv[-1].endswith("try/lib.so") else dump
        return subprocess.CompletedProcess(argv, 0, stdout=text, stderr="")

    monkeypatch.setattr(ab.subprocess, "run", cuobjdump)
    monkeypatch.setattr(ab, "short_names", lambda kernels: {k: k[27:42] for k in kernels})
    assert ab.main(["resources", str(tmp_path), "--changed"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["arch", "base", "try"]
    assert len(rows) == 1 and rows[0].endswith("*")
    assert "63r 1880s 0l 0k" in rows[0] and "64r 1880s 24l 0k" in rows[0]
    assert ab.main(["resources", str(tmp_path), "--arch", "sm_80"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ab.py: --arch sm_80: no kernel") and err.count("\n") == 1


TOY_TRITON = """
import torch
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    value = tl.load(x_ptr + i, mask=i < n)
    tl.store(y_ptr + i, SCALED, mask=i < n)


def _small(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK"] <= named_args["n"]]


_tuned = triton.autotune(
    configs=[
        triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 1), (1024, 4), (1 << 30, 8))
    ],
    key=["n"],
    prune_configs_by={"early_config_prune": _small},
)(_scale)


def _launch(x, indptr, out):
    _tuned[(1,)](x, out, x.numel())
    _scale[(1,)](x, out, x.numel(), BLOCK=256, num_warps=2)


def segment_sum_triton(src, indptr):
    raise NotImplementedError


def forget_tuning():
    _tuned.cache.clear()
"""


def test_ab_resources_compiles_a_triton_variants_launches_here_side_by_side(
    monkeypatch, tmp_path, capsys
):
    """A Triton variant's kernels are compiled on this machine for the launches
    its _launch would make on a case, each autotuner config kept after pruning
    one row, so two variants compare without a GPU."""
    pytest.importorskip("triton")
    ab = fresh_ab(monkeypatch)
    same, wide = tmp_path / "same.py", tmp_path / "wide.py"
    same.write_text(TOY_TRITON.replace("SCALED", "value * 2"))
    # fp64 math: more registers for the same launches
    wide.write_text(TOY_TRITON.replace("SCALED", "tl.sqrt(value.to(tl.float64)) * 3"))
    out = tmp_path / "ab"
    pid = os.getpid()
    assert ab.main(["build", "--out", str(out), f"same_{pid}={same}", f"wide_{pid}={wide}"]) == 0
    capsys.readouterr()
    assert ab.main(["resources", str(out), "--cases", "float32:short:1"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["case", f"same_{pid}", f"wide_{pid}"]
    labels = [re.search(r"k  (\S.*?)(  \*)?$", row).group(1) for row in rows]
    # the config too big for the case was pruned, as the autotuner would
    assert sorted(labels) == [
        "_scale BLOCK=1024 num_warps=4",
        "_scale BLOCK=128 num_warps=1",
        "_scale BLOCK=256 num_warps=2",
    ]
    assert all(row.startswith("float32:short:1") and row.endswith("*") for row in rows), rows
    # a variant that does not compile: one line naming it and the launch
    broken = tmp_path / "broken.py"
    broken.write_text(TOY_TRITON.replace("SCALED", "undefined_name"))
    assert ab.main(["build", "--out", str(out), f"broken_{pid}={broken}"]) == 0
    capsys.readouterr()
    assert ab.main(["resources", str(out), "--cases", "float32:short:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ab.py: {out / 'broken_'}") and err.count("\n") == 1, err
    assert "_scale BLOCK=" in err
    # a _launch that fails before any kernel: one line too
    failing = TOY_TRITON.replace("SCALED", "value")
    failing = failing.replace("    _tuned[(1,)]", "    gone()\n    _tuned[(1,)]")
    (out / f"broken_{pid}" / "_triton.py").write_text(failing)
    assert ab.main(["resources", str(out), "--cases", "float32:short:1"]) == 2
    err = capsys.readouterr().err
    assert ": _launch: NameError" in err and err.count("\n") == 1, err
    assert ab.main(["resources", str(out), "--arch", "ampere"]) == 2
    assert capsys.readouterr().err.startswith("ab.py: --arch ampere: expected sm_XY")


def test_ab_compiles_a_triton_launch_specialized_as_a_real_launch_would_be(monkeypatch):
    """Pointers aligned; an integer of 1 a constant, a multiple of 16 marked
    so, unless the kernel says not to specialize it; floats and bools typed."""
    triton = pytest.importorskip("triton")
    import triton.language as tl

    ab = fresh_ab(monkeypatch)

    @triton.jit(do_not_specialize=["skipped"])
    def kernel(x_ptr, one, sixteen, odd, skipped, scale, flag, BLOCK: tl.constexpr):
        pass

    seen = {}

    def compile(source, target, options):
        seen.update(source=source, capability=target.arch, options=options)
        return SimpleNamespace(asm={"cubin": b""})

    monkeypatch.setattr(triton, "compile", compile)
    x = torch.empty(4, device="meta")
    ab.compile_offline(kernel, (x, 1, 32, 17, 48, 0.5, True), {"BLOCK": 64, "num_warps": 2}, 90)
    source = seen["source"]
    assert source.signature == {
        "x_ptr": "*fp32",
        "one": "constexpr",
        "sixteen": "i32",
        "odd": "i32",
        "skipped": "i32",
        "scale": "fp32",
        "flag": "i1",
        "BLOCK": "constexpr",
    }
    assert {k[0]: v for k, v in source.constants.items()} == {1: 1, 7: 64}
    assert sorted(k[0] for k in source.attrs) == [0, 2]  # x_ptr and sixteen
    assert seen["capability"] == 90 and seen["options"]["num_warps"] == 2


def test_ab_kernels_counts_overlapping_kernels_once_and_the_gaps_between_them(
    bench, monkeypatch, capsys, tmp_path
):
    ab = fresh_ab(monkeypatch)
    assert ab.kernel_name("void ns::detail::tile_sum_kernel<float, 1, true>(float const*)") == (
        "tile_sum_kernel"
    )
    assert ab.kernel_name("_finish_kernel") == "_finish_kernel"
    # Two calls (us): a gated kernel, the main one, and a fix-up launched early
    # that overlaps the main one's end; the second call also waits 2 us
    # between its first two kernels.
    calls = [
        [("void a::lane<x>(int)", 0, 5), ("void a::tile<y>(int)", 5, 105), ("fix", 100, 110)],
        [("void a::lane<x>(int)", 0, 5), ("void a::tile<y>(int)", 7, 107), ("fix", 102, 112)],
    ]
    summary = ab.kernel_summary(calls)
    assert summary["kernels_us"] == {"tile": 100.0, "fix": 10.0, "lane": 5.0}
    assert summary["span_us"] == 111.0
    assert summary["idle_us"] == 1.0  # 0 in the first call, 2 in the second
    assert ab.kernel_summary([]) == {"kernels_us": {}, "span_us": 0.0, "idle_us": 0.0}
    # The same two calls queued back to back in one recording (the second
    # shifted by 112 us): per call the same kernels, and 2 us idle between
    # the calls, half a call's worth each.
    queued = calls[0] + [(name, start + 112, end + 112) for name, start, end in calls[0]]
    summary = ab.kernel_summary([queued], calls_per_recording=2)
    assert summary["kernels_us"] == {"tile": 100.0, "fix": 10.0, "lane": 5.0}
    assert summary["span_us"] == 111.0
    assert summary["idle_us"] == 1.0

    assert ab.main(["run", str(tmp_path), "--kernels", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err == "ab.py: --kernels needs a CUDA device, not 'cpu'\n"


def nsight_source_page(kernels):
    """Nsight Compute's source page as CSV: per kernel, its name row, the
    header, then one row per instruction (samples, then reasons)."""
    lines = []
    for name, instructions in kernels:
        lines.append(f'"Kernel Name","{name}",')
        lines.append(
            '"Address","Source","Warp Stall Sampling (All Samples)",'
            '"Warp Stall Sampling (Not-issued Samples)","stall_barrier","stall_long_sb",'
            '"stall_wait","stall_long_sb (Not Issued)"'
        )
        for k, (source, barrier, long_sb, wait) in enumerate(instructions):
            total = barrier + long_sb + wait
            lines.append(
                f'"0x{k:x}","{source}","{total}","{total}","{barrier}","{long_sb}","{wait}","9999"'
            )
    return "\n".join(lines) + "\n"


def test_ab_stalls_names_the_instructions_a_kernel_waits_on_most_and_why(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(sys.modules, "bench", None)  # reading a report needs no benchmark
    ab = fresh_ab(monkeypatch)
    page = nsight_source_page(
        [
            (
                "void ns::team_sum_kernel<float, 4>(const float *)",
                [
                    ("LDG.E.128   R16, desc[UR6][R24.64]", 0, 0, 2),
                    ("@P0   FADD R57, R57, R16", 0, 60, 4),
                    ("BAR.SYNC.DEFER_BLOCKING 0x0", 20, 0, 0),
                    ("EXIT", 0, 0, 0),
                ],
            ),
            ("void tile_sum_kernel(const float *)", [("NOP", 0, 0, 0)]),
        ]
    )
    plain = tmp_path / "page.csv"
    plain.write_text(page)
    packed = tmp_path / "page.csv.gz"
    packed.write_bytes(gzip.compress(page.encode()))
    for path in (plain, packed):
        assert ab.main(["stalls", str(path), "--top", "4"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert out[0] == "team_sum_kernel: 86 stall samples over 4 instructions"
        # reasons over the kernel, largest first; the not-issued columns are not reasons
        assert out[1] == "  reasons: long_sb 69.8%, barrier 23.3%, wait 7.0%"
        # the instructions holding samples, most first, with their reasons; EXIT held none
        assert "#1" in out[2] and "@P0 FADD R57, R57, R16" in out[2]
        assert out[2].split()[:2] == ["74.4%", "64"] and out[2].endswith("long_sb 60 wait 4")
        assert "#2" in out[3] and out[3].endswith("barrier 20")
        assert "#0" in out[4] and out[4].endswith("wait 2")
        assert out[5] == "tile_sum_kernel: 0 stall samples over 1 instructions"
        assert len(out) == 6
    # --top keeps the instructions holding the most
    assert ab.main(["stalls", str(plain), "--top", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4 and "#1" in out[2] and out[3].startswith("tile_sum_kernel:")
    # another ncu's layout: data rows ending in a comma, no kernel name row
    lines = [line + "," if line.startswith('"0x') else line for line in page.splitlines()]
    bare = tmp_path / "bare.csv"
    bare.write_text("\n".join(line for line in lines[:6] if not line.startswith('"Kernel')))
    assert ab.main(["stalls", str(bare), "--top", "1"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "?: 86 stall samples over 4 instructions" and "#1" in out[2]


def test_ab_stalls_refuses_a_file_that_is_not_a_source_page_in_one_line(
    monkeypatch, tmp_path, capsys
):
    monkeypatch.setitem(sys.modules, "bench", None)
    ab = fresh_ab(monkeypatch)
    details = tmp_path / "details.csv"  # another page of a report: no per-instruction samples
    details.write_text('"Kernel Name","k",\n"Section Name","Metric Name","Metric Value"\n')
    page = nsight_source_page([("k", [("NOP", 1, 2, 3)])])
    good = tmp_path / "page.csv"
    good.write_text(page)
    torn = tmp_path / "torn.csv"  # a row short of its header's cells
    torn.write_text(page.rsplit(",", 2)[0] + "\n")
    uncounted = tmp_path / "uncounted.csv"
    uncounted.write_text(page.replace('"NOP","6"', '"NOP","n/a"'))
    broken = tmp_path / "broken.csv.gz"  # a gzip header, then no valid deflate stream
    broken.write_bytes(gzip.compress(page.encode())[:10] + b"\xff" * 40)
    for args, says in (
        ([str(details)], "no 'Warp Stall Sampling (All Samples)' column"),
        ([str(tmp_path / "missing.csv")], "cannot read it"),
        ([str(good), "--top", "0"], "--top 0: expected at least 1"),
        ([str(torn)], "row 3 has 6 cells where its header has 8"),
        ([str(uncounted)], "'n/a' at 'NOP'; expected a count"),
        ([str(broken)], "cannot read it"),
    ):
        assert ab.main(["stalls", *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("ab.py: ") and says in err and err.count("\n") == 1
