"""Build caching, measured side by side in one run, printed as ratios.

  cold      empty compiler cache, new build tree
  warm      the same cell again, nothing changed            goal: ≤ 5 % of cold
            (the engine sees unchanged inputs and reuses the wheel, after checking it again)
  forced    --rebuild with nothing changed: pip/setuptools/torch start-up, every object a
            ccache hit
  edit      one kernel source edited (a comment appended): that file goes through ccache again
  env 1/2   a cell environment with an empty uv cache, then a second one with the same torch
                                                            goal: ≤ 10 % of the first

The extension is copied to a scratch folder first, so the edit never touches your tree.

usage: python benchmarks/bench_build.py [--cell torch2.14-cu130] [--matrix matrix.yaml]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
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

    with tempfile.TemporaryDirectory(prefix="extmatrix-bench-") as tmp:
        tmp = Path(tmp)
        plan = copy_project(Path(args.matrix), tmp / "project")
        cell = plan.cell(args.cell)
        os.environ["EXTMATRIX_WORK"] = str(tmp / "work")
        os.environ["CCACHE_DIR"] = str(tmp / "ccache")
        ctx = context(plan, dist=str(tmp / "dist"), parallel=1)

        def build_seconds(label: str, rebuild: bool = False) -> float:
            report = local.build(cell, dataclasses.replace(ctx, rebuild=rebuild))
            if report.build != "built":
                sys.exit(f"{label} build of {cell.id} failed: {report.reason}")
            seconds = sum(report.timings.values())
            how = "reused the wheel" if report.reused else f"ccache {report.ccache}"
            print(f"  {label:<7} {seconds:7.1f} s   (compile {report.timings['compile']:.1f} s; "
                  f"{how})", flush=True)
            return seconds

        print(f"cell {cell.id} (MAX_JOBS={ctx.max_jobs}); whole build step of the cell:")
        cold = build_seconds("cold")
        warm = build_seconds("warm")
        forced = build_seconds("forced", rebuild=True)
        kernel = next(iter(sorted(ctx.ext_dir.glob("csrc/**/*.cu"))
                      or sorted(ctx.ext_dir.glob("csrc/**/*.cpp"))))
        with kernel.open("a") as fh:
            fh.write("// edited by the build benchmark\n")
        edited = build_seconds("edit")
        first, second = env_seconds(cell, tmp)

    print()
    print(f"warm rebuild, no change ÷ cold build:   {warm / cold:6.1%}   (goal ≤ 5 %)")
    print(f"forced rebuild, warm caches ÷ cold:     {forced / cold:6.1%}")
    print(f"rebuild after editing {kernel.name} ÷ cold: {edited / cold:6.1%}")
    print(f"second env ÷ first env (same torch):    {second / first:6.1%}   (goal ≤ 10 %)")
    print(f"  first env {first:.1f} s (empty uv cache), second {second:.1f} s")


def copy_project(matrix: Path, dest: Path):
    """matrix.yaml and the extension it names, in a scratch folder."""
    plan = plan_file(matrix)
    dest.mkdir(parents=True)
    shutil.copy2(matrix, dest / "matrix.yaml")
    ext = (matrix.parent / plan.matrix.extension.path).resolve()
    shutil.copytree(ext, dest / plan.matrix.extension.path, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "*.so"))
    return plan_file(dest / "matrix.yaml")


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
