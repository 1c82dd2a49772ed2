import cmake_op
import torch


def test_clamp_unit():
    x = torch.tensor([-1.0, 0.25, 2.0])
    assert cmake_op.clamp_unit(x).tolist() == [0.0, 0.25, 1.0]
