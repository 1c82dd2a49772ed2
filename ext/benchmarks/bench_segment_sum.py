"""Time segment_sum next to torch.segment_reduce and a plain copy of the same bytes.

    python benchmarks/bench_segment_sum.py                # GPU if visible, else CPU
    python benchmarks/bench_segment_sum.py --device cpu --dtype float16

For each layout it prints the median time, the effective bandwidth (bytes read
plus written, divided by time) and two ratios measured in the same run:
``vs reduce`` (torch.segment_reduce time / this time, >1 is faster) and
``vs copy`` (this bandwidth / the bandwidth of copying src, i.e. how close to
the memory limit). The native GPU path includes its indptr validation, one
small device-to-host copy per call.
"""

import argparse
import statistics
import time
from functools import partial

import torch

import segment_ops

# name, rows (GPU size; CPU uses 1/64), columns, mean segment length
CASES = [
    ("1 col, segments ~8", 1 << 26, 1, 8),
    ("1 col, segments ~1000", 1 << 26, 1, 1000),
    ("1 col, one segment", 1 << 26, 1, None),
    ("4 cols, segments ~500", 1 << 24, 4, 500),
    ("32 cols, segments ~16", 1 << 22, 32, 16),
    ("256 cols, segments ~4", 1 << 19, 256, 4),
]


def random_indptr(rows, mean_length, device, generator):
    if mean_length is None:
        return torch.tensor([0, rows], device=device)
    # Lengths uniform in [0, 2 * mean]: realistic spread, empty segments included.
    lengths = torch.randint(
        0, 2 * mean_length + 1, (2 * rows // mean_length + 1,), generator=generator
    )
    ends = lengths.cumsum(0).clamp_(max=rows)
    ends = ends[: int(torch.searchsorted(ends, rows)) + 1]
    ends[-1] = rows
    return torch.cat([torch.zeros(1, dtype=torch.int64), ends]).to(device)


def seconds_once(fn, device):
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def median_seconds(fn, device, max_repeat, budget_s=1.0):
    """Median of up to max_repeat runs, fewer for slow ones (about budget_s each)."""
    fn()  # warm-up: allocator, Triton compile and autotuning
    first = seconds_once(fn, device)
    repeat = max(3, min(max_repeat, int(budget_s / max(first, 1e-9))))
    return statistics.median([first] + [seconds_once(fn, device) for _ in range(repeat - 1)])


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "float64", "float16", "bfloat16"]
    )
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    scale = 1 if device.type == "cuda" else 64
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    version = segment_ops.build_info().get("version")
    print(f"segment_ops {version} | torch {torch.__version__} | {name} | {args.dtype}")

    backends = ["native"]
    if device.type == "cuda":
        try:
            import triton  # noqa: F401

            backends.append("triton")
        except ImportError:
            pass

    generator = torch.Generator().manual_seed(0)
    header = f"{'layout':24} {'impl':20} {'ms':>9} {'GB/s':>8} {'vs reduce':>10} {'vs copy':>8}"
    print(header)
    print("-" * len(header))
    for label, rows, cols, mean_length in CASES:
        rows //= scale
        src = torch.randn(rows, cols, device=device, dtype=dtype)
        indptr = random_indptr(rows, mean_length, device, generator)
        segments = indptr.numel() - 1
        moved = src.nbytes + indptr.nbytes + segments * cols * src.element_size()

        copy_dst = torch.empty_like(src)
        copy_s = median_seconds(partial(copy_dst.copy_, src), device, args.repeat)
        copy_bw = 2 * src.nbytes / copy_s
        reduce = partial(torch.segment_reduce, src, "sum", offsets=indptr, axis=0)
        reduce_s = median_seconds(reduce, device, args.repeat)
        rows_out = [("segment_reduce", reduce_s)]
        for backend in backends:
            op = partial(segment_ops.segment_sum, src, indptr, backend=backend)
            seconds = median_seconds(op, device, args.repeat)
            rows_out.append((f"segment_sum/{backend}", seconds))
        for impl, seconds in rows_out:
            bw = moved / seconds
            ratios = f"{reduce_s / seconds:9.2f}x {bw / copy_bw:7.0%}"
            print(f"{label:24} {impl:20} {seconds * 1e3:9.3f} {bw / 1e9:8.1f} {ratios}")
        copy_row = f"{copy_s * 1e3:9.3f} {copy_bw / 1e9:8.1f} {'':>10} {'100%':>8}"
        print(f"{label:24} {'copy (src)':20} {copy_row}")


if __name__ == "__main__":
    main()
