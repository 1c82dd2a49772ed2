import pytest


@pytest.fixture
def expected():
    from .utils import EXPECTED

    return EXPECTED
