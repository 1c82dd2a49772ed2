import pytest
import torch
import tri_kernels


def test_relu_cpu():
    x = torch.tensor([-2.0, 0.0, 3.0])
    assert tri_kernels.relu(x).tolist() == [0.0, 0.0, 3.0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_relu_triton():
    x = torch.randn(5000, device="cuda")
    assert torch.equal(tri_kernels.relu(x), torch.relu(x))
