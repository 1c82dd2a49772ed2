"""Render bench.py's JSON as the Markdown page docs/benchmarks.md.

    python benchmarks/render.py results.json > docs/benchmarks.md
    python benchmarks/render.py results.json --out docs/benchmarks.md

The output depends only on the JSON's contents and file name (no clock, no
paths, fixed number formats), so a test can re-render a checked-in JSON and
compare it byte for byte with the checked-in page.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import sys
import textwrap

COLUMNS = (
    # (title, value of a case)
    ("forward % of copy", lambda c: percent(c["copy_fraction"].get("native_forward"))),
    ("backward % of copy", lambda c: percent(c["copy_fraction"].get("native_backward"))),
    ("Triton forward % of copy", lambda c: percent(c["copy_fraction"].get("triton_forward"))),
    ("forward × vs segment_reduce", lambda c: times(c["vs_segment_reduce"].get("native_forward"))),
    (
        "backward × vs segment_reduce",
        lambda c: times(c["vs_segment_reduce"].get("native_backward")),
    ),
)
MISSING = "n/a"
# What the kernels aim at, each case measured against it (the page's
# "Against the targets"): forward and backward at 85 % of a copy's bandwidth
# or more, faster than torch.segment_reduce, and a Triton forward of at least
# 0.8x the CUDA forward's bandwidth.
COPY_TARGET = 0.85
TRITON_TARGET = 0.8


def percent(value) -> str:
    return MISSING if value is None else f"{value * 100:.1f}%"


def times(value) -> str:
    if value is None:
        return MISSING
    if value >= 100:
        return f"{value:.0f}×"
    if value >= 10:
        return f"{value:.1f}×"
    return f"{value:.2f}×"


def code(text) -> str:
    return f"`{text}`"


def unique(values):
    """Values in order of first appearance."""
    return list(dict.fromkeys(values))


def describe_build(build: dict) -> str:
    if not build:
        return "unknown (no build info: a source checkout?)"
    parts = [str(build.get("version", "?"))]
    details = [
        f"{key} {build[key]}"
        for key in ("label", "variant", "cuda", "hip", "arch_list")
        if build.get(key)
    ]
    if details:
        parts.append(f"({', '.join(details)})")
    return " ".join(parts)


def render_command(bench_command: str, source_name: str) -> str:
    """This script's command line for bench_command's output: bench.py's --out
    file (else the JSON's name) into docs/ beside bench.py's folder."""
    words = bench_command.split()
    script = next((w for w in words if w.endswith("bench.py")), "benchmarks/bench.py")
    results = source_name
    for i, word in enumerate(words):
        if word == "--out" and i + 1 < len(words):
            results = words[i + 1]
        elif word.startswith("--out="):
            results = word.split("=", 1)[1]
    folder = posixpath.dirname(script)  # .../benchmarks
    docs = posixpath.join(posixpath.dirname(folder), "docs", "benchmarks.md")
    return f"python {posixpath.join(folder, 'render.py')} {results} --out {docs}"


def size(settings: dict) -> str:
    if settings.get("rows"):
        return f"{settings['rows']} rows"
    if settings.get("src_mib"):
        return f"src of {settings['src_mib']} MiB (rows = that / (inner × element size))"
    return "?"


def rounds(settings: dict) -> str:
    count = settings.get("rounds")
    return f", in {count} rounds over each case's ops" if count else ""


def slow_ops(settings: dict) -> str:
    """How an op slower than the budget was timed, on pages that say so (older
    pages timed it like any other)."""
    if not settings.get("once_over_budget"):
        return ""
    warmup = settings.get("warmup")
    warmups = min(warmup, 2) if isinstance(warmup, int) else 2  # Timer.warm stops at 2
    return (
        f"; an op of over {settings.get('budget_s', '?')} s a run: one run after "
        f"{warmups} warm-up run(s)"
    )


def case_label(case: dict) -> str:
    return f"{case['dtype']} {case['law']} ×{case['inner']}"


def triton_ratio(case: dict):
    """The Triton forward's bandwidth over the CUDA forward's, if both ran."""
    fractions = case["copy_fraction"]
    native, triton = fractions.get("native_forward"), fractions.get("triton_forward")
    return triton / native if native and triton is not None else None


TARGETS = (
    # (target, value of a case, whether it meets it, how the value reads)
    (
        f"forward ≥ {COPY_TARGET:.0%} of copy",
        lambda c: c["copy_fraction"].get("native_forward"),
        lambda v: v >= COPY_TARGET,
        percent,
    ),
    (
        f"backward ≥ {COPY_TARGET:.0%} of copy",
        lambda c: c["copy_fraction"].get("native_backward"),
        lambda v: v >= COPY_TARGET,
        percent,
    ),
    (
        "forward faster than segment_reduce",
        lambda c: c["vs_segment_reduce"].get("native_forward"),
        lambda v: v > 1,
        times,
    ),
    (
        "backward faster than segment_reduce",
        lambda c: c["vs_segment_reduce"].get("native_backward"),
        lambda v: v > 1,
        times,
    ),
    (
        f"Triton forward ≥ {TRITON_TARGET}× the forward's bandwidth",
        triton_ratio,
        lambda v: v >= TRITON_TARGET,
        lambda v: f"{v:.2f}×",
    ),
)


def render_targets(cases: list[dict]) -> list[str]:
    """Per target: how many cases meet it, and the others, worst first."""
    lines = [
        "",
        "## Against the targets",
        "",
        "| target | cases that meet it | the others, worst first |",
        "|---|--:|---|",
    ]
    for target, value_of, meets, shown in TARGETS:
        measured = [(value_of(c), c) for c in cases if value_of(c) is not None]
        short = sorted((v, i) for i, (v, c) in enumerate(measured) if not meets(v))
        others = ", ".join(f"{case_label(measured[i][1])} {shown(v)}" for v, i in short)
        unmeasured = len(cases) - len(measured)
        count = f"{len(measured) - len(short)} of {len(measured)}"
        if unmeasured:
            count += f" ({unmeasured} not measured)"
        lines.append(f"| {target} | {count} | {others or 'none'} |")
    return lines


def render(data: dict, source_name: str) -> str:
    header, cases = data["header"], data["cases"]
    settings = header.get("settings", {})
    lines = [
        f"<!-- Generated by benchmarks/render.py from {source_name}; do not edit. "
        "Rerun benchmarks/bench.py and render.py instead. -->",
        "",
        "# segment_sum benchmarks",
        "",
    ]
    if header.get("placeholder"):
        lines += [
            f"> **Not measured yet.** {header['placeholder']}",
            "",
        ]
    build = describe_build(header.get("segment_ops") or {})
    if header.get("placeholder") and not header.get("segment_ops"):
        build = MISSING
    sources = code(header["sources"]) if header.get("sources") else MISSING
    device = header.get("device", "?")
    if header.get("device_type") and header["device_type"] != "cuda":
        device += f" ({header['device_type']})"
    lines += [
        "| | |",
        "|---|---|",
        f"| Device | {device} |",
        f"| torch | {header.get('torch', '?')} |",
        f"| CUDA | {header.get('cuda') or MISSING} |",
        f"| Triton | {header.get('triton') or MISSING} |",
        f"| segment_ops | {build} |",
        f"| Sources (csrc/, src/) | {sources} |",
        f"| Date (UTC) | {header.get('date', '?')} |",
        f"| Size per case | {size(settings)} |",
        f"| Timing | median of up to {settings.get('repeat', '?')} runs after "
        f"{settings.get('warmup', '?')} warm-up run(s){rounds(settings)} "
        f"({settings.get('timer', '?')}){slow_ops(settings)} |",
        "",
    ]
    lines += textwrap.wrap(
        "Each case sums `rows` rows of `inner` columns into segments whose lengths "
        "follow a law: `short` (uniform in [1, 16]), `long` (uniform in [512, 1536]), "
        f"`power` (Pareto, alpha {settings.get('pareto_alpha', 1.1)}, lengths >= 1) or "
        "`giant` (one segment of all rows). *% of copy* is the op's effective bandwidth "
        "(the bytes it must move: every row and every segment of the output read or "
        "written once, plus indptr) over the bandwidth of `dst.copy_(src)` measured in "
        "the same run, so 100% means as fast as the memory allows. *Forward* is "
        "`segment_ops.segment_sum`, *backward* `segment_ops.segment_gather` (what "
        'autograd runs), *Triton forward* `segment_sum(..., backend="triton")`'
        + (
            ", its tile shapes tuned on each case's own segments. "
            if settings.get("triton_tuning") == "per case"
            else ". "
        )
        + '*× vs segment_reduce* is the time of `torch.segment_reduce(src, "sum", '
        "offsets=indptr, axis=0)` over the forward's: above 1 is faster; likewise the "
        "backward against segment_reduce's backward through autograd. The JSON "
        "holds the raw times, bytes, GB/s and the comparisons left out here.",
        width=88,
        break_on_hyphens=False,
    )
    command = header.get("command", "python benchmarks/bench.py --out results.json")
    lines += [
        "",
        "To produce it:" if header.get("placeholder") else "Produced by:",
        "",
        "```sh",
        command,
        render_command(command, source_name),
        "```",
    ]
    if cases:
        lines += render_targets(cases)

    for dtype in unique(c["dtype"] for c in cases):
        rows = [c for c in cases if c["dtype"] == dtype]
        lines += [
            "",
            f"## {dtype}",
            "",
            "| law | inner | " + " | ".join(title for title, _ in COLUMNS) + " |",
            "|---|--:|" + "--:|" * len(COLUMNS),
        ]
        scaled = []
        for law in unique(c["law"] for c in rows):
            for case in (c for c in rows if c["law"] == law):
                mark = ""
                if case.get("rows") != case.get("rows_requested"):
                    mark = "\\*"
                    scaled.append(case)
                cells = [law, f"{case['inner']}{mark}"] + [value(case) for _, value in COLUMNS]
                lines.append("| " + " | ".join(cells) + " |")
        if scaled:
            lines.append("")
            lines += [
                f"\\* run on {c['rows']} rows instead of {c['rows_requested']} "
                f"({c['law']}, inner {c['inner']}) to fit in memory."
                for c in scaled
            ]
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", help="JSON written by benchmarks/bench.py --out")
    parser.add_argument("--out", help="write the page here instead of to stdout")
    args = parser.parse_args(argv)
    with open(args.results, encoding="utf-8") as f:
        data = json.load(f)
    page = render(data, os.path.basename(args.results))
    if args.out:
        with open(args.out, "w", encoding="utf-8", newline="\n") as f:
            f.write(page)
    else:
        sys.stdout.write(page)


if __name__ == "__main__":
    main()
