import torch

import scm_ops


def test_double():
    assert torch.equal(scm_ops.double(torch.arange(3.0)), torch.tensor([0.0, 2.0, 4.0]))


def test_version_is_the_tags():
    assert scm_ops.__version__.startswith("0.4.1.dev1+")
