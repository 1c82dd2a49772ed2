import classic_ops
import pytest
import torch


def test_scale_cpu():
    x = torch.arange(6, dtype=torch.float32)
    assert torch.equal(classic_ops.scale(x, 2.0), x * 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
def test_scale_cuda():
    x = torch.arange(6, dtype=torch.float32, device="cuda")
    assert torch.equal(classic_ops.scale(x, 3.0), x * 3)
