from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Extensions under tests/extensions/ are built and tested by the engine, in cell
# environments: their own test suites do not belong to this one.
collect_ignore_glob = ["extensions/*"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite golden files from the current output instead of comparing")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """Compare text with tests/golden/NAME, or rewrite it under --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str) -> None:
        path = ROOT / "tests" / "golden" / name
        if update:
            path.write_text(text)
        assert path.is_file(), f"{path} missing: run pytest --update-golden"
        assert text == path.read_text(), f"{name} changed: review, then pytest --update-golden"

    return check
