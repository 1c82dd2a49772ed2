"""Shared test setup. Tests import the *installed* segment_ops, never the
source tree (src layout; this folder has no __init__.py).

Markers:
    gpu    needs a CUDA/ROCm device; skipped without one, unless --require-gpu
           is given, which turns the skip into a failure so a GPU job that lost
           its GPU cannot pass green.
    build  compiles the sources (JIT, CMake); needs the source tree and tools.
"""

import pytest
import torch


def pytest_addoption(parser):
    parser.addoption(
        "--require-gpu",
        action="store_true",
        help="fail, instead of skip, the tests marked gpu when no GPU is visible",
    )


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA or ROCm device")
    config.addinivalue_line("markers", "build: compiles the extension sources (JIT / CMake)")


def gpu_available() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() > 0


def pytest_runtest_setup(item):
    if (
        item.get_closest_marker("gpu")
        and not gpu_available()
        and not item.config.getoption("--require-gpu")
    ):
        pytest.skip(f"no GPU visible to torch {torch.__version__}")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item):
    # In the call phase rather than setup, so it counts as FAILED, not ERROR.
    if item.get_closest_marker("gpu") and not gpu_available():
        pytest.fail(f"--require-gpu: no GPU visible to torch {torch.__version__}", pytrace=False)


@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return torch.device(request.param)


@pytest.fixture(autouse=True)
def _seed():
    # Random inputs, but the same ones on every run: a tolerance failure reproduces.
    torch.manual_seed(0)


@pytest.fixture
def fresh_dynamo():
    """torch.compile's caches as a new process has them. A parametrized test compiles the
    same code object in every case, and dynamo's recompile limit (8 per code object) counts
    them all: the ninth case would fail on the cases before it, not on its own."""
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
