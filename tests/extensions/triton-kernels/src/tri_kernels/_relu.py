import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs of torch come without triton
    triton = None

if triton is not None:

    @triton.autotune(
        configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"]
    )
    @triton.jit
    def _relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, tl.maximum(x, 0.0), mask=mask)


def relu(x: torch.Tensor) -> torch.Tensor:
    if triton is None or not x.is_cuda:
        return torch.relu(x)
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    _relu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n)
    return out
