import lltm_cpp
import torch


def test_twice():
    x = torch.arange(3.0)
    assert torch.equal(lltm_cpp.twice(x), x * 2)
