"""Triton forward of segment_sum, used by ``segment_sum(..., backend="triton")``.

This module must import on a host without a GPU (builders and CPU test jobs
install triton with CUDA torch): nothing here queries torch.cuda or triton's
driver until a kernel is launched, and the autotune configs are plain data.

Registered with ``torch.library.triton_op`` so torch.compile sees through it;
the backward reuses the native gather op.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .ops import NAMESPACE, check_metadata, save_sum_context, segment_gather, sum_backward

# (rows, columns, warps) per tile: tall tiles for few columns and long
# segments, wide ones for many columns, one-warp tiles for short segments.
_CONFIGS = [
    triton.Config({"BLOCK_ROWS": rows, "BLOCK_COLS": cols}, num_warps=warps)
    for rows, cols, warps in [
        (1024, 1, 4),
        (256, 4, 4),
        (64, 16, 4),
        (16, 64, 4),
        (4, 256, 4),
        (32, 1, 1),
        (8, 32, 1),
    ]
]


# The best tile depends on the columns and on how long segments are, so both
# are in the autotune key (segment length as a coarse bucket).
@triton.autotune(configs=_CONFIGS, key=["inner", "mean_rows"])
@triton.jit
def _segment_sum_kernel(
    src_ptr,
    indptr_ptr,
    out_ptr,
    inner,
    mean_rows,  # only read by the autotuner
    IS_FP64: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    # One program per (segment, block of columns), walking the segment's rows.
    segment = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_mask = cols < inner
    start = tl.load(indptr_ptr + segment)
    end = tl.load(indptr_ptr + segment + 1)
    acc_type = tl.float64 if IS_FP64 else tl.float32
    acc = tl.zeros((BLOCK_ROWS, BLOCK_COLS), dtype=acc_type)
    for first_row in range(start, end, BLOCK_ROWS):
        rows = first_row + tl.arange(0, BLOCK_ROWS)
        mask = (rows < end)[:, None] & col_mask[None, :]
        tile = tl.load(src_ptr + rows[:, None] * inner + cols[None, :], mask=mask, other=0.0)
        acc += tile.to(acc_type)
    total = tl.sum(acc, axis=0)
    tl.store(out_ptr + segment * inner + cols, total.to(out_ptr.dtype.element_ty), mask=col_mask)


@torch.library.triton_op(f"{NAMESPACE}::segment_sum_triton", mutates_args=())
def _segment_sum_triton_op(src: Tensor, indptr: Tensor) -> Tensor:
    check_metadata("segment_sum", "src", src, indptr)
    if src.device.type != "cuda":
        raise RuntimeError(
            f"segment_sum: backend='triton' needs CUDA/ROCm tensors, got {src.device}"
        )
    segments = indptr.shape[0] - 1
    x = src.contiguous()
    out = x.new_empty((segments, *x.shape[1:]))
    inner = math.prod(x.shape[1:])
    if out.numel() == 0:
        return out

    def grid(meta):
        return (segments, triton.cdiv(inner, meta["BLOCK_COLS"]))

    # Coarse buckets: comparisons keep shapes symbolic under torch.compile.
    mean = x.shape[0] // segments
    mean_rows = 8 if mean < 16 else 256 if mean < 1024 else 4096
    torch.library.wrap_triton(_segment_sum_kernel)[grid](
        x, indptr.contiguous(), out, inner, mean_rows, IS_FP64=x.dtype == torch.float64
    )
    return out


torch.library.register_autograd(
    f"{NAMESPACE}::segment_sum_triton",
    sum_backward(segment_gather),
    setup_context=save_sum_context,
)


def _check_indptr_values(indptr: Tensor, rows: int) -> None:
    # The native kernels check values in C++; here one small device-to-host copy does it.
    if indptr.shape[0] > 1:
        decreasing = (indptr[1:] < indptr[:-1]).any()
    else:
        decreasing = torch.zeros((), dtype=torch.bool, device=indptr.device)
    first, last, bad = torch.stack([indptr[0], indptr[-1], decreasing.long()]).tolist()
    if first != 0:
        raise RuntimeError(f"segment_sum: indptr[0] must be 0, got {first}")
    if last != rows:
        raise RuntimeError(f"segment_sum: indptr[-1] must equal src.size(0) ({rows}), got {last}")
    if bad:
        raise RuntimeError("segment_sum: indptr must be non-decreasing")


def segment_sum_triton(src: Tensor, indptr: Tensor) -> Tensor:
    check_metadata("segment_sum", "src", src, indptr)
    # Values are data: under torch.compile reading them would break the graph.
    if not torch.compiler.is_compiling():
        _check_indptr_values(indptr, src.shape[0])
    return getattr(torch.ops, NAMESPACE).segment_sum_triton(src, indptr)
