"""CSR segment sum as a PyTorch custom op, with CPU, CUDA/ROCm and Triton kernels.

>>> import torch, segment_ops
>>> segment_ops.segment_sum(torch.ones(5, 2), torch.tensor([0, 2, 2, 5]))
tensor([[2., 2.],
        [0., 0.],
        [3., 3.]])
"""

import torch  # noqa: F401  (libtorch must be loaded before our library)

from ._compat import build_info, check_torch_compat, load_library

# Order matters: compare build facts with the running torch first, so a wrong
# wheel fails with a sentence rather than an undefined symbol.
check_torch_compat()
load_library()

from .ops import segment_gather, segment_sum  # noqa: E402

__all__ = ["build_info", "segment_gather", "segment_sum"]
