"""Time segment_sum (forward and backward, native and Triton) against
torch.segment_reduce and a plain copy of the same bytes; write JSON.

    python benchmarks/bench.py --out results.json          # GPU if visible, else CPU
    python benchmarks/bench.py --device cpu --quick --out /tmp/b.json   # smoke test
    python benchmarks/render.py results.json --out docs/benchmarks.md

Cases: every dtype x inner width x segment-length law. On a GPU each case's
src holds --src-mib MiB (512 by default: rows = bytes / (inner * element size)),
far more than any L2 cache, so every op is timed at DRAM speed; --rows fixes
the row count instead.

    short   lengths uniform in [1, 16]
    long    lengths uniform in [512, 1536]
    power   Pareto, alpha 1.1: floor((1 - U) ** (-1 / alpha)) >= 1 (the longest
            is near 1e5 rows for 2^22 rows, 1e7 for 2^28)
    giant   one segment holding every row

Lengths are drawn (seeded) until they cover the rows; the last one is cut so
that they sum to exactly the rows. Where src and its companions would not fit
in GPU memory, the rows are halved until they do (``rows_requested`` in the
case says so).

Per case, measured side by side in one run (CUDA events, warm-up, median; the
GPU is kept busy while the host enqueues each op, so the host's own overhead
is not timed, and a run where it was is retried; the ops take turns over
TIMING_ROUNDS rounds, so a slow stretch does not land on one op alone; an op
whose run outlasts --budget is warmed up at most twice and timed once):

    native_forward           segment_ops.segment_sum(src, indptr)
    native_backward          segment_ops.segment_gather(grad_out, indptr, rows)
    triton_forward           segment_ops.segment_sum(src, indptr, backend="triton"),
                             tuned on the case's own segments
    segment_reduce_forward   torch.segment_reduce(src, "sum", offsets=indptr, axis=0)
    segment_reduce_backward  its backward through autograd
    copy                     dst.copy_(src)

Bytes moved: forward and backward both read or write rows*inner + segments*inner
elements and read indptr once; the copy moves 2 * src bytes. ``copy_fraction``
is an op's GB/s over the copy's GB/s, ``vs_segment_reduce`` is segment_reduce's
time over the op's (forward against forward, backward against backward; > 1 is
faster). An op that cannot run here (triton on CPU) is null. The header's
``sources`` is the digest of csrc/ and src/ beside this script (sources.py):
run it from the checkout the installed build came from.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import sources  # this folder's digest of the measured code
import torch

import segment_ops

LAWS = ("short", "long", "power", "giant")
INNERS = (1, 4, 32, 64, 256)
DTYPES = ("float32", "bfloat16")
OPS = (
    "native_forward",
    "native_backward",
    "triton_forward",
    "segment_reduce_forward",
    "segment_reduce_backward",
    "copy",
)
FORWARD_OPS = ("native_forward", "triton_forward", "segment_reduce_forward")
PARETO_ALPHA = 1.1
SPIN_CYCLES = 2_000_000  # about a millisecond: longer than dispatching any op here
TIMING_ROUNDS = 4  # rounds over a case's ops that share out its timed runs
HOST_RETRIES = 3  # tries per timed run whose dispatch outlasted the spin


def one_line(err: BaseException) -> str:
    """An error as the JSON keeps it: one line, at most 200 characters."""
    return " ".join(str(err).split())[:200]


def segment_lengths(law: str, rows: int, seed: int) -> np.ndarray:
    """Segment lengths (int64, all >= 1 except for rows == 0) summing to rows."""
    if rows == 0:
        return np.zeros(0, dtype=np.int64)
    if law == "giant":
        return np.array([rows], dtype=np.int64)
    rng = np.random.default_rng(seed)
    parts, total = [], 0
    while total < rows:
        # Draw in batches of about the rows still missing, at the law's mean length.
        mean = {"short": 8.5, "long": 1024.0, "power": 11.0}[law]
        count = max(16, int((rows - total) / mean * 1.1))
        if law == "short":
            batch = rng.integers(1, 16, size=count, endpoint=True)
        elif law == "long":
            batch = rng.integers(512, 1536, size=count, endpoint=True)
        elif law == "power":
            u = rng.random(count)
            batch = np.floor((1.0 - u) ** (-1.0 / PARETO_ALPHA))
            batch = np.minimum(batch, rows).astype(np.int64)  # (1-U)^-1/a can overflow
        else:
            raise ValueError(f"unknown law {law!r}")
        parts.append(batch.astype(np.int64))
        total += int(batch.sum())
    lengths = np.concatenate(parts)
    ends = np.cumsum(lengths)
    keep = int(np.searchsorted(ends, rows)) + 1  # first segment reaching `rows`
    lengths = lengths[:keep]
    lengths[-1] -= int(ends[keep - 1]) - rows
    return lengths


def make_indptr(lengths: np.ndarray, device: torch.device) -> torch.Tensor:
    indptr = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=indptr[1:])
    return torch.from_numpy(indptr).to(device)


class Timer:
    """Median wall time of a callable: CUDA events on GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device, warmup: int, repeat: int, budget_s: float):
        self.device, self.warmup, self.repeat, self.budget_s = device, warmup, repeat, budget_s
        self._spin_s: float | None = None

    def spin_seconds(self) -> float:
        """How long the device spins before each timed run (measured once)."""
        if self._spin_s is None:
            spins = []
            for _ in range(3):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                torch.cuda._sleep(SPIN_CYCLES)
                end.record()
                end.synchronize()
                spins.append(start.elapsed_time(end) / 1e3)
            self._spin_s = min(spins)
        return self._spin_s

    def timed(self, fn) -> tuple[float, bool]:
        """Seconds, and whether they may include host time: on the GPU, the
        device spins while Python dispatches the op, so the events bracket device
        work only, unless the dispatch outlasted the spin (a busy host)."""
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return time.perf_counter() - t0, False
        spin = self.spin_seconds()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        t0 = time.perf_counter()
        fn()
        dispatch = time.perf_counter() - t0
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3, dispatch >= spin

    def once(self, fn) -> tuple[float, bool]:
        """A timed run, retried while it kept host time (HOST_RETRIES tries);
        the flag says the last try still did."""
        for _ in range(HOST_RETRIES):
            seconds, with_host = self.timed(fn)
            if not with_host:
                break
        return seconds, with_host

    def median(self, fn) -> float:
        """Seconds; warm-up runs first (allocator, Triton compile and autotuning),
        then up to `repeat` timed runs, fewer when one run takes long."""
        self.warm(fn)
        first = self.once(fn)[0]
        return statistics.median([first] + [self.once(fn)[0] for _ in range(self.runs(first) - 1)])

    def warm(self, fn) -> None:
        """The untimed runs (allocator, Triton compile and autotuning), finished.
        They end early once a run after the first outlasts the budget: an op of
        seconds a run (segment_reduce over a giant segment) is warm by then,
        while a first run may be slow for Triton's tuning alone."""
        for done in range(self.warmup):
            seconds, _ = self.timed(fn)
            if done >= 1 and seconds > self.budget_s:
                break
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def runs(self, first: float) -> int:
        """Timed runs: one where a run outlasts the budget (segment_reduce's
        seconds over a power law, set against milliseconds: a median of three
        would only triple its share of a page run), else at least three."""
        if first > self.budget_s:
            return 1
        return max(3, min(self.repeat, int(self.budget_s / max(first, 1e-9))))

    def interleaved_medians(
        self, fns: dict[str, Callable[[], object]], rounds: int
    ) -> tuple[dict[str, float], dict[str, str], dict[str, int]]:
        """Seconds per op, why an op could not run, and how many of an op's runs
        kept host time in them after HOST_RETRIES tries. Each op is warmed up and
        timed once; its other timed runs go in `rounds` rounds that visit every
        op in turn, so a stretch of slow clocks or a busy host costs each op a
        few runs, not one op its whole median (a page run once timed one op at
        twice its time, and that op alone)."""
        errors: dict[str, str] = {}
        times: dict[str, list[float]] = {}
        planned: dict[str, int] = {}
        host_bound: dict[str, int] = {}

        def sample(op: str) -> float:
            seconds, with_host = self.once(fns[op])
            if with_host:
                host_bound[op] = host_bound.get(op, 0) + 1
            return seconds

        for op, fn in fns.items():
            try:
                self.warm(fn)
                times[op] = [sample(op)]
            except (RuntimeError, NotImplementedError) as err:
                errors[op] = one_line(err)
                continue
            planned[op] = self.runs(times[op][0])
        for done in range(1, rounds + 1):
            for op in list(times):
                target = -(-planned[op] * done // rounds)  # ceil: the last round reaches `planned`
                try:
                    while len(times[op]) < target:
                        times[op].append(sample(op))
                except (RuntimeError, NotImplementedError) as err:
                    errors[op] = one_line(err)
                    del times[op]
        medians = {op: statistics.median(t) for op, t in times.items()}
        return medians, errors, host_bound


def triton_available(device: torch.device) -> str | None:
    """Why the Triton backend cannot run here, or None if it can."""
    if device.type != "cuda":
        return f"backend='triton' needs a CUDA/ROCm device, not {device.type}"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def significant(value: float | None, digits: int = 5) -> float | None:
    """Rounded to `digits` significant digits: enough for timings, short JSON."""
    return None if value is None else float(f"{value:.{digits}g}")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def fits(rows: int, inner: int, elem: int, device: torch.device) -> bool:
    """Whether one case's tensors fit in free GPU memory, with room to spare.

    Alive at once: src, the copy's dst, the gather's output, segment_reduce's
    input gradient and autograd's saved state: about 5 src-sized tensors."""
    if device.type != "cuda":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return 5 * rows * inner * elem < 0.8 * free


def run_case(dtype_name, law, inner, rows_for, lengths_for, timer, device, no_triton):
    dtype = getattr(torch, dtype_name)
    elem = torch.empty((), dtype=dtype).element_size()
    rows = rows_requested = rows_for(inner, elem)
    while rows > 1024 and not fits(rows, inner, elem, device):
        rows //= 2
    indptr = make_indptr(lengths_for(law, rows), device)
    segments = indptr.numel() - 1

    gen = torch.Generator(device=device).manual_seed(rows * 1000 + inner)
    src = torch.randn(rows, inner, generator=gen, device=device, dtype=dtype)
    grad_out = torch.randn(segments, inner, generator=gen, device=device, dtype=dtype)
    dst = torch.empty_like(src)

    indptr_bytes = indptr.numel() * indptr.element_size()
    rows_bytes = rows * inner * elem
    segment_bytes = segments * inner * elem
    moved = {
        "forward": rows_bytes + segment_bytes + indptr_bytes,
        "backward": segment_bytes + rows_bytes + indptr_bytes,
        "copy": 2 * rows_bytes,
    }

    fns = {
        "native_forward": lambda: segment_ops.segment_sum(src, indptr),
        "native_backward": lambda: segment_ops.segment_gather(grad_out, indptr, rows),
        "triton_forward": lambda: segment_ops.segment_sum(src, indptr, backend="triton"),
        "segment_reduce_forward": lambda: torch.segment_reduce(src, "sum", offsets=indptr, axis=0),
        "copy": lambda: dst.copy_(src),
    }
    errors = {}
    if no_triton:
        fns.pop("triton_forward")
        errors["triton_forward"] = no_triton
    else:
        # Triton tunes its tile shapes once per shape class, and short and
        # power-law segments of one mean share a class: each case tunes on
        # its own segments, as a process that meets only that law would.
        from segment_ops import _triton

        _triton.forget_tuning()
    try:
        leaf = src.detach().requires_grad_()
        reduced = torch.segment_reduce(leaf, "sum", offsets=indptr, axis=0)
        fns["segment_reduce_backward"] = lambda: torch.autograd.grad(
            reduced, leaf, grad_out, retain_graph=True
        )
    except RuntimeError as err:
        errors["segment_reduce_backward"] = one_line(err)

    seconds, failed, host_bound = timer.interleaved_medians(
        {op: fns[op] for op in OPS if op in fns}, TIMING_ROUNDS
    )
    errors.update(failed)
    for op, count in host_bound.items():
        print(
            f"warning: {dtype_name} {law} x{inner} {op}: {count} timed run(s) kept host "
            f"time after {HOST_RETRIES} tries (the host dispatched slower than the "
            "device spun): a busy host; rerun on an idle one",
            file=sys.stderr,
        )

    # One sanity check per case: the Triton forward against the native one.
    check = None
    if "triton_forward" in seconds and "native_forward" in seconds:
        native = segment_ops.segment_sum(src, indptr).double()
        diff = (segment_ops.segment_sum(src, indptr, backend="triton").double() - native).abs()
        check = {
            "triton_vs_native_max_abs": significant(diff.max().item() if diff.numel() else 0.0),
            "native_max_abs": significant(native.abs().max().item() if native.numel() else 0.0),
        }
        del native, diff

    copy_gbps = moved["copy"] / seconds["copy"] / 1e9 if "copy" in seconds else None
    ms, gbps, copy_fraction, vs_reduce = {}, {}, {}, {}
    for op in OPS:
        s = seconds.get(op)
        ms[op] = significant(None if s is None else s * 1e3)
        kind = "copy" if op == "copy" else "backward" if op.endswith("backward") else "forward"
        op_gbps = None if s is None else moved[kind] / s / 1e9
        gbps[op] = significant(op_gbps)
        if op != "copy":
            fraction = None if op_gbps is None or not copy_gbps else op_gbps / copy_gbps
            copy_fraction[op] = significant(fraction)
            reference = seconds.get(f"segment_reduce_{kind}")
            if not op.startswith("segment_reduce"):
                ratio = None if s is None or reference is None else reference / s
                vs_reduce[op] = significant(ratio)

    lengths = indptr.diff()
    case = {
        "dtype": dtype_name,
        "law": law,
        "inner": inner,
        "rows": rows,
        "rows_requested": rows_requested,
        "segments": segments,
        "longest": int(lengths.max().item()) if segments else 0,
        "elem_bytes": elem,
        "bytes": moved,
        "ms": ms,
        "gbps": gbps,
        "copy_gbps": significant(copy_gbps),
        "copy_fraction": copy_fraction,
        "vs_segment_reduce": vs_reduce,
        "check": check,
    }
    if errors:
        case["errors"] = errors
    if host_bound:
        case["host_bound_runs"] = host_bound
    return case


def cell(value, spec: str, width: int, suffix: str = "") -> str:
    text = "-" if value is None else format(value, spec) + suffix
    return text.rjust(width)


# (title, width, getter) of the printed table's columns
COLUMNS = [
    ("dtype", 8, lambda c: c["dtype"]),
    ("law", 5, lambda c: c["law"]),
    ("inner", 5, lambda c: str(c["inner"])),
    ("rows", 9, lambda c: str(c["rows"]) + ("*" if c["rows"] != c["rows_requested"] else "")),
    ("segs", 8, lambda c: str(c["segments"])),
    ("fwd ms", 9, lambda c: cell(c["ms"]["native_forward"], ".3f", 9)),
    ("copy", 5, lambda c: cell(c["copy_fraction"]["native_forward"], ".0%", 5)),
    ("vs red", 7, lambda c: cell(c["vs_segment_reduce"]["native_forward"], ".2f", 7, "x")),
    ("bwd ms", 9, lambda c: cell(c["ms"]["native_backward"], ".3f", 9)),
    ("copy", 5, lambda c: cell(c["copy_fraction"]["native_backward"], ".0%", 5)),
    ("vs red", 7, lambda c: cell(c["vs_segment_reduce"]["native_backward"], ".2f", 7, "x")),
    ("triton ms", 9, lambda c: cell(c["ms"]["triton_forward"], ".3f", 9)),
    ("copy", 5, lambda c: cell(c["copy_fraction"]["triton_forward"], ".0%", 5)),
    ("vs red", 7, lambda c: cell(c["vs_segment_reduce"]["triton_forward"], ".2f", 7, "x")),
    ("red fwd", 9, lambda c: cell(c["ms"]["segment_reduce_forward"], ".3f", 9)),
    ("red bwd", 9, lambda c: cell(c["ms"]["segment_reduce_backward"], ".3f", 9)),
    ("copy GB/s", 9, lambda c: cell(c["copy_gbps"], ".1f", 9)),
]


def table_line(values) -> str:
    return " ".join(
        v.rjust(w) if i > 1 else v.ljust(w)
        for i, (v, (_, w, _)) in enumerate(zip(values, COLUMNS, strict=True))
    )


def recorded_command(argv: list[str]) -> str:
    """The command line as the page shows it, for a reader to rerun: --out's
    folder is left out (it is the measuring machine's, say a scratch folder
    the results were copied from), its file name kept."""
    words = ["python", *argv]
    for i, word in enumerate(words):
        if word == "--out" and i + 1 < len(words):
            words[i + 1] = os.path.basename(words[i + 1])
        elif word.startswith("--out="):
            words[i] = "--out=" + os.path.basename(word.split("=", 1)[1])
    return " ".join(shlex.quote(w) for w in words)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated")
    parser.add_argument("--inners", default=",".join(map(str, INNERS)), help="comma-separated")
    parser.add_argument("--laws", default=",".join(LAWS), help=f"comma-separated of {LAWS}")
    parser.add_argument(
        "--rows", type=int, help="rows per case (default on CPU 2^16, 2^12 quick)"
    )
    parser.add_argument(
        "--src-mib", type=int, default=512, help="src size per case on a GPU, unless --rows"
    )
    parser.add_argument("--repeat", type=int, help="timed runs per op, median (default 20)")
    parser.add_argument("--warmup", type=int, help="untimed runs first (default 3)")
    parser.add_argument("--budget", type=float, default=2.0, help="seconds per op, about")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few runs: smoke test")
    parser.add_argument("--out", help="write the results here as JSON")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if args.rows or args.quick or device.type != "cuda":
        fixed = args.rows or (1 << 12 if args.quick else 1 << 16)

        def rows_for(inner, elem):
            return fixed
    else:
        fixed = None

        def rows_for(inner, elem):
            return max(1024, (args.src_mib << 20) // (inner * elem))
    repeat = args.repeat or (3 if args.quick else 20)
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    budget = min(args.budget, 0.2) if args.quick else args.budget
    dtypes = [d for d in args.dtypes.split(",") if d]
    inners = [int(i) for i in args.inners.split(",") if i]
    laws = [law for law in args.laws.split(",") if law]
    for law in laws:
        if law not in LAWS:
            parser.error(f"unknown law {law!r}; choose from {LAWS}")

    cached = {}

    def lengths_for(law, n):
        if (law, n) not in cached:
            cached[(law, n)] = segment_lengths(law, n, args.seed)
        return cached[(law, n)]

    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    no_triton = triton_available(device)
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    build = segment_ops.build_info() if hasattr(segment_ops, "build_info") else {}
    header = {
        "device_type": device.type,
        "device": device_name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": torch.version.hip,
        "triton": triton_version,
        "python": platform.python_version(),
        "segment_ops": build,
        # The code beside this script: run it from the checkout the build came from.
        "sources": sources.digest(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": recorded_command(sys.argv),
        "settings": {
            "rows": fixed,
            "src_mib": None if fixed else args.src_mib,
            "dtypes": dtypes,
            "inners": inners,
            "laws": laws,
            "pareto_alpha": PARETO_ALPHA,
            "seed": args.seed,
            "warmup": warmup,
            "repeat": repeat,
            "budget_s": budget,
            "quick": args.quick,
            "timer": "cuda events" if device.type == "cuda" else "perf_counter",
            "triton_tuning": "per case",
            "statistic": "median",
            "rounds": TIMING_ROUNDS,
            "once_over_budget": True,  # see Timer.warm and Timer.runs
        },
    }
    print(
        f"{device_name} | torch {torch.__version__} | CUDA {torch.version.cuda} | "
        f"segment_ops {build.get('version')} ({build.get('label')}) | triton {triton_version}"
    )
    print(
        "ms: median milliseconds; copy: GB/s as a fraction of a plain copy's;\n"
        "vs red: segment_reduce's time / this time; rows*: scaled down to fit in memory"
    )
    titles = table_line([title for title, _, _ in COLUMNS])
    print(titles)
    print("-" * len(titles))

    timer = Timer(device, warmup, repeat, budget)
    cases = []
    for dtype_name in dtypes:
        for law in laws:
            for inner in inners:
                case = run_case(dtype_name, law, inner, rows_for, lengths_for, timer, device,
                                no_triton)
                cases.append(case)
                print(table_line([get(case) for _, _, get in COLUMNS]), flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()

    scaled = [
        f"{c['dtype']}/{c['law']}/{c['inner']}: {c['rows']} rows"
        for c in cases
        if c["rows"] != c["rows_requested"]
    ]
    header["scaled_down"] = scaled  # cases run on fewer rows than requested (memory)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"schema": 1, "header": header, "cases": cases}, f, indent=1)
            f.write("\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
