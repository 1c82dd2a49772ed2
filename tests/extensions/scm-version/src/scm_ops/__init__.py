"""Doubles a tensor; the version comes from the git tag it was built at."""

from importlib.metadata import version

import torch

__version__ = version("scm-ops")


def double(x: torch.Tensor) -> torch.Tensor:
    return x + x
