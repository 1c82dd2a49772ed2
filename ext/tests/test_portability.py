"""The ROCm build hipifies the CUDA kernels, so CUDA-only forms must sit behind
`#if !defined(__HIP_PLATFORM_AMD__)` (or in the `#else` of its opposite) next to a
form ROCm compiles. A CPU-only builder cannot compile for ROCm; this reads the
sources instead. HIP's *_sync warp functions, for one, take a 64-bit mask and
reject the 32-bit one CUDA code passes, at compile time."""

import os
import re
from pathlib import Path

import pytest

SOURCE_DIR = Path(os.environ.get("SEGMENT_OPS_SRC", Path(__file__).resolve().parents[1]))
# The classic build's and the stable build's: ROCm hipifies both.
CUDA_SOURCES = sorted([*(SOURCE_DIR / "csrc" / "cuda").glob("*.cu*"),
                       *(SOURCE_DIR / "csrc" / "stable").glob("*.cu")])
CUDA_ONLY = re.compile(r"\b\w+_sync\s*\(|\b__syncwarp\b|\basm\b|\b__pipeline_\w+")
HIP = r"defined\s*\(\s*__HIP_PLATFORM_AMD__\s*\)"
NOT_HIP = re.compile(r"#ifndef\s+__HIP_PLATFORM_AMD__\b|!\s*" + HIP)
ON_HIP = re.compile(r"#ifdef\s+__HIP_PLATFORM_AMD__\b|" + HIP)


def unguarded_cuda_only(text: str) -> list[tuple[int, str]]:
    """(line, text) of each CUDA-only form outside a CUDA-only preprocessor branch."""
    found, branches = [], []  # per open #if: "cuda", "hip" or "any"
    for number, line in enumerate(text.splitlines(), 1):
        directive = line.strip()
        if directive.startswith("#if"):
            if NOT_HIP.search(directive):
                branches.append("cuda")
            elif ON_HIP.search(directive):
                branches.append("hip")
            else:
                branches.append("any")
        elif directive.startswith(("#else", "#elif")):
            branches[-1] = {"cuda": "hip", "hip": "cuda"}.get(branches[-1], "any")
        elif directive.startswith("#endif"):
            branches.pop()
        elif "cuda" not in branches and CUDA_ONLY.search(line.split("//")[0]):
            found.append((number, line.strip()))
    return found


def test_the_cuda_sources_are_there():
    # Missing, the check below would run on nothing and pass.
    for folder in ("cuda", "stable"):
        where = SOURCE_DIR / "csrc" / folder
        assert any(p.parent == where for p in CUDA_SOURCES), (
            f"no CUDA sources under {where} (set SEGMENT_OPS_SRC)")


@pytest.mark.parametrize("path", CUDA_SOURCES, ids=lambda p: p.name)
def test_cuda_only_forms_are_guarded_for_rocm(path):
    assert unguarded_cuda_only(path.read_text()) == []


def test_the_check_finds_an_unguarded_form():
    text = (
        "#if defined(__HIP_PLATFORM_AMD__)\n  y = __shfl_xor(x, 1);\n"
        "#else\n  y = __shfl_xor_sync(0xffffffffu, x, 1);\n#endif\n"
        "  z = __shfl_xor_sync(0xffffffffu, x, 2);  // unguarded\n"
        "#ifndef __HIP_PLATFORM_AMD__\n  __syncwarp();\n#endif\n"
        "#ifdef __HIP_PLATFORM_AMD__\n  __syncwarp();  // on ROCm\n#endif\n"
    )
    assert [number for number, _ in unguarded_cuda_only(text)] == [6, 11]
