"""Build caching, measured side by side in one run, printed as ratios.

  cold      empty compiler cache, new build tree
  warm      the same cell again, nothing changed           goal: ≤ 5 % of cold
  touch     after touching one kernel source file          (ccache + ninja)
  env 1/2   a cell environment with an empty uv cache, then a second one with the same torch
                                                            goal: ≤ 10 % of the first

usage: python benchmarks/bench_build.py [--cell torch2.14-cu130] [--matrix matrix.yaml]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from extmatrix import envs
from extmatrix.backends import local
from extmatrix.cells import plan_file
from extmatrix.run import context
from extmatrix.steps import Steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="torch2.14-cu130")
    parser.add_argument("--matrix", default="matrix.yaml")
    args = parser.parse_args()
    plan = plan_file(args.matrix)
    cell = plan.cell(args.cell)

    with tempfile.TemporaryDirectory(prefix="extmatrix-bench-") as tmp:
        tmp = Path(tmp)
        os.environ["EXTMATRIX_WORK"] = str(tmp / "work")
        os.environ["CCACHE_DIR"] = str(tmp / "ccache")
        ctx = context(plan, dist=str(tmp / "dist"), parallel=1)

        def compile_seconds(label: str) -> float:
            report = local.build(cell, ctx)
            if report.build != "built":
                sys.exit(f"{label} build of {cell.id} failed: {report.reason}")
            print(f"  {label:<6} compile {report.timings['compile']:7.1f} s   "
                  f"ccache {report.ccache}", flush=True)
            return report.timings["compile"]

        print(f"cell {cell.id} (MAX_JOBS={ctx.max_jobs})", flush=True)
        cold = compile_seconds("cold")
        warm = compile_seconds("warm")
        kernel = next(iter(sorted(ctx.ext_dir.glob("csrc/**/*.cu")))
                      or sorted(ctx.ext_dir.glob("csrc/**/*.cpp")))
        os.utime(kernel)
        touched = compile_seconds("touch")

        first, second = env_seconds(cell, tmp)

    print()
    print(f"warm rebuild ÷ cold build:          {warm / cold:6.1%}   (goal ≤ 5 %)")
    print(f"rebuild after touching {kernel.name} ÷ cold: {touched / cold:6.1%}")
    print(f"second env ÷ first env (same torch): {second / first:6.1%}   (goal ≤ 10 %)")
    print(f"  first env {first:.1f} s (empty uv cache), second {second:.1f} s")


def env_seconds(cell, tmp: Path) -> tuple[float, float]:
    """Two environments with the cell's torch, sharing a uv cache that starts empty."""
    os.environ["UV_CACHE_DIR"] = str(tmp / "uv-cache")
    steps = Steps(tmp / "env.log")
    times = []
    for name in ("env-1", "env-2"):
        start = time.perf_counter()
        local.prepare_env(cell, tmp / name, ["pip"], steps)
        times.append(time.perf_counter() - start)
    steps.close()
    del os.environ["UV_CACHE_DIR"]
    envs.host_sources.cache_clear()
    return times[0], times[1]


if __name__ == "__main__":
    main()
