"""Planning speed: expand a 1,000+ cell matrix, next to a bare YAML parse of the same file.

Prints the time of each step and the ratios, measured in this one run. The goal:
a full plan in well under a second (ratio to a 1 s budget printed last).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import yaml

from extmatrix.cells import plan_file
from extmatrix.compat import BUILTIN

MATRIX = """
compat: compat.yaml
extension: {name: demo, import: demo, abi3: false}
axes:
  torch: ["2.5", "2.6", "2.7", "2.8", "2.9", "2.10", "2.11", "2.12", "2.13", "2.14", "2.15"]
  flavor: [cpu, cu118, cu121, cu124, cu126, cu128, cu129, cu130, cu132,
           rocm6.1, rocm6.2, rocm6.3, rocm6.4, rocm7.0, rocm7.1, rocm7.2, rocm7.14]
  python: ["3.9", "3.10", "3.11", "3.12", "3.13", "3.14", "3.15"]
  platform: [x86_64, aarch64]
platforms:
  x86_64: {runner: ubuntu-24.04}
  aarch64: {runner: ubuntu-24.04-arm}
defaults:
  cuda: {archs: ["8.0", "9.0"], ptx: ["9.0"], index: "https://download.pytorch.org/whl/{flavor}"}
  rocm: {archs: [gfx90a, gfx942]}
flavors: {FLAVORS}
"""


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times), statistics.median(times)


def synthetic_compat() -> str:
    """The real facts, widened so that every release ships every toolkit and Python."""
    facts = yaml.safe_load(BUILTIN.read_text())
    for release in facts["torch"].values():
        release.update(cuda=list(facts["cuda"]), rocm=list(facts["rocm"]),
                       python={"min": "3.9", "max": "3.15"})
    return yaml.safe_dump(facts)


def main() -> None:
    flavors = yaml.safe_load(MATRIX.replace("{FLAVORS}", "{}"))["axes"]["flavor"]
    text = MATRIX.replace("{FLAVORS}", "{" + ", ".join(f"{f}: {{}}" for f in flavors) + "}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matrix.yaml"
        path.write_text(text)
        # The plan checks that the extension it names is a Python project with tests.
        (Path(tmp) / "ext" / "tests").mkdir(parents=True)
        (Path(tmp) / "ext" / "pyproject.toml").write_text("")
        (Path(tmp) / "compat.yaml").write_text(synthetic_compat())
        cells = len(plan_file(path).cells)
        parse_best, parse_med = best_of(20, lambda: yaml.safe_load(path.read_text()))
        plan_best, plan_med = best_of(20, lambda: plan_file(path))
    print(f"cells planned:            {cells}")
    print(f"bare YAML parse:          {parse_best * 1e3:7.1f} ms (median {parse_med * 1e3:.1f})")
    print(f"full plan:                {plan_best * 1e3:7.1f} ms (median {plan_med * 1e3:.1f})"
          "  (load the matrix and the facts, validate, expand)")
    print(f"plan ÷ bare parse:        {plan_best / parse_best:7.1f}x")
    print(f"plan ÷ 1 s budget:        {plan_med:7.3f}")
    if cells < 1000:
        raise SystemExit(f"benchmark matrix has only {cells} cells; it must have at least 1000")


if __name__ == "__main__":
    main()
