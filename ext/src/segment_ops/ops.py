"""Python side of the ops: the public functions, fake (meta) kernels for
torch.compile, and autograd.

The C++ library defines the schemas and device kernels; everything torch
needs beyond that is registered here, per namespace, so a JIT or CMake build
registered under another namespace can reuse it (see tests/test_build_paths.py).
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

NAMESPACE = "segment_ops"
BACKENDS = ("native", "triton")
_FLOAT_TYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
# On GPUs the ops never read indptr's values on the host: that would wait for the
# device, block CUDA graph capture and cost more than small kernels. Set to check
# them anyway (a debugging aid); CPU kernels always check.
CHECK_INDPTR = os.environ.get("SEGMENT_OPS_CHECK_INDPTR", "").strip() not in ("", "0")


def segment_sum(src: Tensor, indptr: Tensor, *, backend: str = "native") -> Tensor:
    """Sum rows of ``src`` per CSR segment.

    Args:
        src: ``[N, *]`` float32, float64, float16 or bfloat16 (the half types
            accumulate in float32).
        indptr: int64 ``[B + 1]``, non-decreasing, ``indptr[0] == 0`` and
            ``indptr[-1] == N``; segment ``b`` is rows ``indptr[b]:indptr[b+1]``.
        backend: ``"native"`` (C++/CUDA/HIP kernels) or ``"triton"`` (CUDA/ROCm
            tensors only; needs triton).

    Returns:
        ``[B, *]``; an empty segment sums to zeros. Differentiable in ``src``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"segment_sum: backend must be one of {BACKENDS}, got {backend!r}")
    if CHECK_INDPTR and src.device.type != "cpu":
        check_metadata("segment_sum", "src", src, indptr)
        check_indptr_values("segment_sum", indptr, src.shape[0], "src.size(0)")
    if backend == "native":
        return getattr(torch.ops, NAMESPACE).segment_sum(src, indptr)
    if backend == "triton":
        # Imported on first use: CPU-only installs have no triton.
        from ._triton import segment_sum_triton

        return segment_sum_triton(src, indptr)


def segment_gather(src: Tensor, indptr: Tensor, rows: int) -> Tensor:
    """Inverse layout of segment_sum (and its backward): ``out[i] = src[segment of row i]``.

    ``src`` is ``[B, *]``, the result ``[rows, *]`` with ``rows == indptr[-1]``.
    """
    if CHECK_INDPTR and src.device.type != "cpu":
        check_metadata("segment_gather", "src", src, indptr)
        check_indptr_values("segment_gather", indptr, rows, "rows")
    return getattr(torch.ops, NAMESPACE).segment_gather(src, indptr, rows)


def check_indptr_values(op: str, indptr: Tensor, rows: int, rows_name: str) -> None:
    """The CPU kernels' value checks for a tensor on any device: one device-to-host copy."""
    first, last, decreasing = torch.stack(
        [indptr[0], indptr[-1], (indptr.diff() < 0).any().long()]
    ).tolist()
    if first != 0:
        raise RuntimeError(f"{op}: indptr[0] must be 0, got {first}")
    if last != rows:
        raise RuntimeError(f"{op}: indptr[-1] must equal {rows_name} ({rows}), got {last}")
    if decreasing:
        raise RuntimeError(f"{op}: indptr must be non-decreasing")


def check_metadata(op: str, data_name: str, data: Tensor, indptr: Tensor) -> None:
    """The C++ metadata checks, for fake tensors and the Triton path."""
    if indptr.device != data.device:
        raise RuntimeError(
            f"{op}: indptr must be on the same device as {data_name} ({data.device}), "
            f"got {indptr.device}"
        )
    if indptr.dtype != torch.int64:
        raise RuntimeError(f"{op}: indptr must be int64, got {indptr.dtype}")
    if indptr.dim() != 1 or indptr.shape[0] < 1:
        raise RuntimeError(
            f"{op}: indptr must be 1-D with at least one element, got shape {tuple(indptr.shape)}"
        )
    if data.dim() < 1:
        raise RuntimeError(f"{op}: {data_name} must have at least one dimension")
    if data.dtype not in _FLOAT_TYPES:
        raise RuntimeError(
            f"{op}: {data_name} must be float32, float64, float16 or bfloat16, got {data.dtype}"
        )


def save_sum_context(ctx, inputs, output):
    """What a segment sum's backward needs: indptr and the row count of src."""
    src, indptr = inputs
    ctx.save_for_backward(indptr)
    ctx.rows = src.shape[0]


def sum_backward(gather):
    """A segment sum's backward: `gather` the output gradient back onto the rows."""

    def backward(ctx, grad):
        (indptr,) = ctx.saved_tensors
        return gather(grad, indptr, ctx.rows), None

    return backward


def register_python_parts(namespace: str) -> None:
    """Register fake kernels and autograd for the ops of ``namespace``."""
    ops = getattr(torch.ops, namespace)

    @torch.library.register_fake(f"{namespace}::segment_sum")
    def _segment_sum_fake(src, indptr):
        check_metadata("segment_sum", "src", src, indptr)
        return src.new_empty((indptr.shape[0] - 1, *src.shape[1:]))

    @torch.library.register_fake(f"{namespace}::segment_gather")
    def _segment_gather_fake(src, indptr, rows):
        check_metadata("segment_gather", "src", src, indptr)
        return src.new_empty((rows, *src.shape[1:]))

    def gather_setup(ctx, inputs, output):
        _, indptr, _ = inputs
        ctx.save_for_backward(indptr)

    def gather_backward(ctx, grad):
        (indptr,) = ctx.saved_tensors
        return ops.segment_sum(grad, indptr), None, None

    # Each op's backward is the other op, so double backward works too.
    torch.library.register_autograd(
        f"{namespace}::segment_sum",
        sum_backward(ops.segment_gather),
        setup_context=save_sum_context,
    )
    torch.library.register_autograd(
        f"{namespace}::segment_gather", gather_backward, setup_context=gather_setup
    )


register_python_parts(NAMESPACE)
