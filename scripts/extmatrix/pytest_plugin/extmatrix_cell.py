"""pytest plugin the engine loads into every cell's test run (`-p extmatrix_cell`).

It lives outside the extension, so that any test suite gets the same gating:
with EXTMATRIX_REQUIRE_GPU=1 the session stops at start when torch sees no GPU
(a GPU job that silently skipped every GPU test would look green), and every
run counts the tests skipped for lack of a GPU into EXTMATRIX_CELL_REPORT.
This module is imported in the cell's test environment, which has no extmatrix:
it uses nothing but the standard library, pytest and torch.
"""

from __future__ import annotations

import json
import os
import re

import pytest

_GPU_WORDS = re.compile(r"\b(gpus?|cuda|rocm|hip|device|devices|triton|sm_?\d+)\b", re.IGNORECASE)
_counts = {"gpu_skipped": 0, "no_gpu": False, "devices": 0}


def _write() -> None:
    path = os.environ.get("EXTMATRIX_CELL_REPORT")
    if path:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(_counts, fh)


def pytest_sessionstart(session: pytest.Session) -> None:
    try:
        import torch

        _counts["devices"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # noqa: BLE001 - the extension's own tests will say what is wrong
        _counts["devices"] = 0
    if os.environ.get("EXTMATRIX_REQUIRE_GPU") == "1" and not _counts["devices"]:
        _counts["no_gpu"] = True
        _write()
        pytest.exit("extmatrix: --require-gpu, but torch sees no GPU here "
                    "(torch.cuda.is_available() is False)", returncode=1)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not report.skipped:
        return
    reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if _GPU_WORDS.search(str(reason)):
        _counts["gpu_skipped"] += 1


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _write()
