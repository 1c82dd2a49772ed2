"""The Triton forward's kernels under Triton's interpreter, on the CPU: each
path (lanes, mid segments, the walk, the vector walk, walk-only shapes, wide
lanes, column blocks) on one of its tile shapes, with chunks that segments
cross, against float64 sums. The GPU tests check every shape on a device;
these check the kernels' logic where there is none."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# (kernel family, config fields to match, dtype, inner, law, rows): rows span
# a few of the config's chunks (three or more where a chunk must lie inside
# one segment: the walk inside it, giant).
CASES = [
    ("lanes", {"CHUNK_ROWS": 512}, "float32", 1, "mixed", 3000),
    ("lanes", {"CHUNK_ROWS": 512}, "bfloat16", 4, "mixed", 3000),
    ("lanes", {"CHUNK_ROWS": 1024}, "float32", 3, "short", 3000),
    ("lanes", {"MID_FROM": 16, "CHUNK_ROWS": 4096}, "bfloat16", 1, "mixed", 9000),
    ("lanes", {"MID_FROM": 16, "CHUNK_ROWS": 4096}, "float32", 1, "power", 9000),
    ("lanes", {"MID_FROM": 32, "CHUNK_ROWS": 8192}, "bfloat16", 1, "mixed", 20000),
    ("lanes", {"CHUNK_ROWS": 32768, "ROW_ELEMENTS": 256}, "bfloat16", 1, "long", 70000),
    ("lanes", {"CHUNK_ROWS": 512}, "float32", 4, "giant", 3000),
    ("lanes", {"WALK_ONLY": True}, "float32", 2, "giant", 300000),
    ("wide", {"CHUNK_ROWS": 256}, "bfloat16", 32, "mixed", 2000),
    ("wide", {"CHUNK_ROWS": 256}, "float32", 8, "short", 2000),
    ("blocks", {"BLOCK_ROWS": 8}, "float32", 300, "mixed", 600),
]


@pytest.fixture(scope="module")
def results():
    """Every case in one process: TRITON_INTERPRET must be set before triton
    is first imported (see triton_interpreted.py)."""
    # Here, not at import: a run that deselects these tests skips nothing.
    pytest.importorskip("triton")
    pytest.importorskip("numpy")  # the interpreter's arrays
    script = Path(__file__).with_name("triton_interpreted.py")
    try:
        run = subprocess.run(
            [sys.executable, str(script), json.dumps(CASES)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the interpreted cases took over 600 s", pytrace=False)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.splitlines()[-1])


def case_id(index: int) -> str:
    family, _, dtype, inner, law, _ = CASES[index]
    return f"{family}-{dtype}-x{inner}-{law}"


@pytest.mark.parametrize("index", range(len(CASES)), ids=case_id)
def test_interpreted_kernels_sum_right(results, index):
    family, fields, *_ = CASES[index]
    result = results[index]
    assert "error" not in result, result.get("error")
    assert result["unwritten"] == 0, f"{family} {fields}: {result['unwritten']} sums unwritten"
    assert result["worst"] <= 1, f"{family} {fields}: {result}"  # error / what dtype allows
