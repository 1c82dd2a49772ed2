import torch

import scm_ops


def test_double():
    assert torch.equal(scm_ops.double(torch.arange(3.0)), torch.tensor([0.0, 2.0, 4.0]))


def test_version_is_the_tags():
    assert scm_ops.__version__.startswith("0.4.1.dev1+")


def test_the_jit_sources_ship_with_the_package():
    # Package data that only git lists (no MANIFEST.in): setuptools-scm's file finder.
    from importlib.resources import files

    assert "double_kernel" in (files(scm_ops) / "kernels" / "double.cu").read_text()
