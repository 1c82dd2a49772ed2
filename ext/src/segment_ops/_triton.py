"""Triton forward of segment_sum, used by ``segment_sum(..., backend="triton")``.

This module must import on a host without a GPU (builders and CPU test jobs
install triton with CUDA torch): nothing here queries torch.cuda or triton's
driver until a kernel is launched, and the autotune configs are plain data.

Registered with ``torch.library.triton_op`` so torch.compile sees through it;
the backward reuses the native gather op. The op never reads a tensor value on
the host (no synchronisation, capturable in a CUDA graph), so indptr values
are not validated here; a bad indptr gives wrong sums, never an out-of-bounds
access (indptr values are clamped into [0, rows] before use as addresses).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from .ops import NAMESPACE, check_metadata, save_sum_context, segment_gather, sum_backward

# Workspace slots are indexed by (segment start) // _SLOT_ROWS. Every chunk
# (CHUNK_ROWS below) is a multiple of it, so at most one chunk-crossing
# segment starts in each slot and any config maps segments to the same slots.
_SLOT_ROWS = 256
_MAX_BLOCK_COLS = 256
_FANOUT = 32  # probes per step of the per-program search over indptr

# (elements per tile, tiles per chunk, warps). A program owns a chunk of rows
# and walks it one tile (BLOCK_ROWS x BLOCK_COLS) at a time; small chunks give
# parallelism on small inputs, long ones amortise the program's set-up.
_TILE_SHAPES = [
    (512, 8, 4),
    (1024, 4, 4),
    (1024, 16, 4),
    (2048, 8, 8),
    (4096, 8, 16),
]


def _configs(block_cols: int) -> list[triton.Config]:
    configs = []
    for elements, tiles, warps in _TILE_SHAPES:
        block_rows = elements // block_cols
        chunk_rows = max(block_rows * tiles, _SLOT_ROWS)  # powers of two: a multiple of both
        config = triton.Config(
            {"BLOCK_ROWS": block_rows, "CHUNK_ROWS": chunk_rows}, num_warps=warps
        )
        if config not in configs:  # wide blocks map several shapes to one
            configs.append(config)
    return configs


def _block_cols(inner) -> int:
    """Columns per program: the next power of two >= inner, at most 256."""
    cols = 1
    while cols < inner and cols < _MAX_BLOCK_COLS:
        cols *= 2
    return cols


@triton.jit
def _indptr_at(indptr_ptr, index, rows, mask):
    """indptr[index] clamped into [0, rows], so that it is always a valid row bound."""
    value = tl.load(indptr_ptr + index, mask=mask, other=0)
    return tl.minimum(tl.maximum(value, 0), rows)


@triton.jit
def _indptr_local(indptr_ptr, index, c0, mask, CHUNK_ROWS: tl.constexpr):
    """indptr[index] - c0 as int32, clamped into [-1, CHUNK_ROWS + 1]: enough to
    compare with the rows of the chunk starting at c0."""
    value = tl.load(indptr_ptr + index, mask=mask, other=0) - c0
    return tl.minimum(tl.maximum(value, -1), CHUNK_ROWS + 1).to(tl.int32)


@triton.jit
def _lower_bound(indptr_ptr, begin, count, rows, target, FANOUT: tl.constexpr):
    """For each lane of ``target``: the first i in [begin, begin + count) with
    indptr[i] >= target (begin + count if none). FANOUT-ary: log_FANOUT(count)
    dependent loads instead of log2(count)."""
    lo = tl.zeros_like(target) + begin
    end = lo + count
    n = count
    blocks = tl.arange(0, FANOUT).to(tl.int64) + 1
    while n > 1:
        # Split [lo, end) into FANOUT blocks of `step`; count the blocks whose
        # last element is below the target (a prefix, indptr being sorted).
        step = (n + FANOUT - 1) // FANOUT
        probe = lo[:, None] + step * blocks[None, :] - 1
        valid = probe < end[:, None]
        below = valid & (_indptr_at(indptr_ptr, probe, rows, valid) < target[:, None])
        lo = tl.minimum(lo + step * tl.sum(below.to(tl.int64), axis=1), end)
        end = tl.minimum(lo + step, end)
        n = step
    left = lo < end
    return lo + (left & (_indptr_at(indptr_ptr, lo, rows, left) < target)).to(tl.int64)


@triton.jit
def _segmented_add(head_a, sum_a, head_b, sum_b):
    # Segmented-scan operator: a run restarts at a row flagged as a segment head.
    return head_a | head_b, tl.where(head_b != 0, sum_b, sum_a + sum_b)


# How the work is split, and why: one program per (chunk of CHUNK_ROWS rows,
# block of BLOCK_COLS columns), whatever the segment lengths. One program per
# segment (the old kernel) idles most of the GPU on one giant segment and
# drowns in launch/tail overhead on millions of tiny ones; splitting by rows
# gives every program the same number of bytes to read, for any length law.
#
# A program first finds the segments that start inside its chunk ([lo, hi),
# two FANOUT-ary searches), writes zeros for the empty ones among them (they
# own no row, so nobody else would), then walks its rows one tile at a time:
#   * each row's segment, once per row and shared by all the tile's columns:
#     one FANOUT-ary search finds the window of segments the tile touches,
#     then every row bisects that window only (log2 of the segments in the
#     tile, not in the input: 0-1 steps for long segments) and keeps the
#     bracketing indptr values as its segment's start and end;
#   * a segmented inclusive scan down the tile (heads: rows where a segment
#     starts), plus the running sum carried from the previous tile for the
#     segment that continues into this one;
#   * at the last row of a segment within the chunk: a segment that lies
#     wholly inside the chunk is stored to `out` directly (the common case);
#     one that crosses a chunk boundary (at most two per chunk) is added with
#     tl.atomic_add into a zeroed fp32 (fp64) workspace slot, and the slot is
#     flagged with the segment id. _finish_kernel then converts those slots.
# Every element of src is read once; out is written once per segment.
# Sums of segments crossing chunks are combined in arbitrary order (atomics),
# so their last bits may differ from run to run.
@triton.jit(do_not_specialize=["rows", "segments", "slots"])
def _segment_sum_kernel(
    src_ptr,
    indptr_ptr,
    out_ptr,
    ws_ptr,  # [slots] int64 flags (segment id + 1), then [slots, inner] partial sums
    rows,
    segments,
    inner,
    slots,
    IS_FP64: tl.constexpr,
    FLAG_WORDS: tl.constexpr,  # workspace elements per int64 flag
    SLOT_ROWS: tl.constexpr,
    FANOUT: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
):
    acc_type = tl.float64 if IS_FP64 else tl.float32
    out_type = out_ptr.dtype.element_ty
    flag_ptr = ws_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    # tl.cast, not .to(): inside torch.compile an int argument equal to 1 arrives as a
    # plain constant, which has no .to().
    part_ptr = ws_ptr + tl.cast(slots, tl.int64) * FLAG_WORDS

    nseg = tl.cast(segments, tl.int64)
    c0 = tl.program_id(0).to(tl.int64) * CHUNK_ROWS
    c1 = tl.minimum(c0 + CHUNK_ROWS, rows)
    cols = tl.program_id(1) * BLOCK_COLS + tl.arange(0, BLOCK_COLS)
    col_mask = cols < inner
    tile_rows = tl.arange(0, BLOCK_ROWS)

    # Segments starting in [c0, c0 + CHUNK_ROWS): [lo, hi). An empty segment
    # starting at `rows` belongs to the last program (the grid has one more).
    bounds = _lower_bound(
        indptr_ptr, 0, nseg + 1, rows, c0 + tl.arange(0, 2).to(tl.int64) * CHUNK_ROWS, FANOUT
    )
    lo = tl.min(bounds, axis=0)
    hi = tl.minimum(tl.max(bounds, axis=0), nseg)

    zeros = tl.zeros([BLOCK_ROWS, BLOCK_COLS], dtype=out_type)
    for s0 in range(lo, hi, BLOCK_ROWS):
        seg = s0 + tl.arange(0, BLOCK_ROWS).to(tl.int64)
        in_range = seg < hi
        empty = in_range & (
            _indptr_at(indptr_ptr, seg + 1, rows, in_range)
            <= _indptr_at(indptr_ptr, seg, rows, in_range)
        )
        tl.store(
            out_ptr + seg[:, None] * inner + cols[None, :],
            zeros,
            mask=empty[:, None] & col_mask[None, :],
        )

    # Every row of the chunk lies in a segment of [first, hi]: the last one
    # with indptr <= row. Clamped, so that a bad indptr stays in bounds.
    seg_lo = tl.minimum(tl.maximum(lo - 1, 0), nseg - 1)
    # Row positions from here on are int32 and relative to c0 (registers).
    chunk_src = src_ptr + c0 * inner
    chunk_len = (c1 - c0).to(tl.int32)
    always = chunk_len >= 0
    carry = tl.zeros([BLOCK_COLS], dtype=acc_type)
    for t0 in range(0, chunk_len, BLOCK_ROWS):
        local = t0 + tile_rows
        row_mask = local < chunk_len
        tile = tl.load(
            chunk_src + local.to(tl.int64)[:, None] * inner + cols[None, :],
            mask=row_mask[:, None] & col_mask[None, :],
            other=0.0,
        ).to(acc_type)

        # The tile's rows lie in segments [seg_lo, seg_hi): seg_hi is the first
        # segment starting after the tile's last row. Each row then searches
        # only that window, and keeps the indptr values bracketing it, which
        # are its segment's start and end.
        t_last = tl.minimum(t0 + BLOCK_ROWS, chunk_len) - 1
        seg_hi = _lower_bound(
            indptr_ptr,
            seg_lo + 1,
            hi - seg_lo,
            rows,
            c0 + t_last + 1 + tl.zeros([1], dtype=tl.int64),
            FANOUT,
        )
        seg_hi = tl.minimum(tl.max(seg_hi, axis=0), nseg)
        seg = seg_lo + tl.zeros([BLOCK_ROWS], dtype=tl.int64)
        above = seg_hi + tl.zeros([BLOCK_ROWS], dtype=tl.int64)
        start = _indptr_local(indptr_ptr, seg_lo, c0, always, CHUNK_ROWS) + tl.zeros_like(local)
        end = _indptr_local(indptr_ptr, seg_hi, c0, always, CHUNK_ROWS) + tl.zeros_like(local)
        n = seg_hi - seg_lo
        while n > 1:
            active = row_mask & (above - seg > 1)
            mid = (seg + above) // 2
            value = _indptr_local(indptr_ptr, mid, c0, active, CHUNK_ROWS)
            right = active & (value <= local)
            left = active & ~right
            seg = tl.where(right, mid, seg)
            start = tl.where(right, value, start)
            above = tl.where(left, mid, above)
            end = tl.where(left, value, end)
            n = (n + 1) // 2
        seg_lo = seg_hi - 1

        head = tl.broadcast_to((local == start)[:, None], [BLOCK_ROWS, BLOCK_COLS]).to(tl.int32)
        _, part = tl.associative_scan((head, tile), 0, _segmented_add)
        # Rows of a segment that began before this tile continue the carried sum.
        part += tl.where((start < t0)[:, None], carry[None, :], 0.0)
        carry = tl.sum(tl.where((tile_rows == BLOCK_ROWS - 1)[:, None], part, 0.0), axis=0)

        last = row_mask & (local == tl.minimum(end, chunk_len) - 1)
        inside = last & (start >= 0) & (end <= chunk_len)
        crossing = last & ~inside
        tl.store(
            out_ptr + seg[:, None] * inner + cols[None, :],
            part.to(out_type),
            mask=inside[:, None] & col_mask[None, :],
        )
        slot = _indptr_at(indptr_ptr, seg, rows, crossing) // SLOT_ROWS
        tl.atomic_add(
            part_ptr + slot[:, None] * inner + cols[None, :],
            part,
            mask=crossing[:, None] & col_mask[None, :],
            sem="relaxed",
        )
        tl.store(flag_ptr + slot, seg + 1, mask=crossing)


@triton.jit(do_not_specialize=["segments", "slots"])
def _finish_kernel(
    ws_ptr,
    out_ptr,
    segments,
    inner,
    slots,
    FLAG_WORDS: tl.constexpr,
    BLOCK_SLOTS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    # Flagged workspace slots -> out rows of the segments that crossed chunks.
    flag_ptr = ws_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    part_ptr = ws_ptr + tl.cast(slots, tl.int64) * FLAG_WORDS
    slot = tl.program_id(0).to(tl.int64) * BLOCK_SLOTS + tl.arange(0, BLOCK_SLOTS)
    flag = tl.load(flag_ptr + slot, mask=slot < slots, other=0)
    used = flag > 0
    seg = tl.minimum(tl.maximum(flag - 1, 0), tl.cast(segments, tl.int64) - 1)
    for c0 in range(0, inner, BLOCK_COLS):
        cols = c0 + tl.arange(0, BLOCK_COLS)
        mask = used[:, None] & (cols < inner)[None, :]
        total = tl.load(part_ptr + slot[:, None] * inner + cols[None, :], mask=mask)
        tl.store(
            out_ptr + seg[:, None] * inner + cols[None, :],
            total.to(out_ptr.dtype.element_ty),
            mask=mask,
        )


# One autotuner per column-block width, each over the tile shapes above. The
# key is `inner` and the accumulator flag; triton also keys on the tensors'
# dtypes (fp16/bf16/fp32 read different bytes per row). The workspace is
# zeroed before each trial and after tuning, since the kernel adds into it.
_KERNELS = {
    cols: triton.autotune(
        configs=_configs(cols), key=["inner", "IS_FP64"], reset_to_zero=["ws_ptr"]
    )(_segment_sum_kernel)
    for cols in (1 << i for i in range(_MAX_BLOCK_COLS.bit_length()))
}


def _launch(x: Tensor, indptr: Tensor, out: Tensor) -> None:
    """Sum `x` ([rows, inner] contiguous) into `out` ([segments, inner], non-empty)."""
    rows, inner, segments = x.shape[0], x.shape[1], out.shape[0]
    is_fp64 = x.dtype == torch.float64
    flag_words = 1 if is_fp64 else 2  # int64 flags in an fp64 / fp32 buffer
    slots = rows // _SLOT_ROWS + 1
    ws = torch.zeros(
        slots * (flag_words + inner),
        dtype=torch.float64 if is_fp64 else torch.float32,
        device=x.device,
    )
    block_cols = _block_cols(inner)

    def grid(meta):
        return (rows // meta["CHUNK_ROWS"] + 1, triton.cdiv(inner, block_cols))

    torch.library.wrap_triton(_KERNELS[block_cols])[grid](
        x,
        indptr,
        out,
        ws,
        rows,
        segments,
        inner,
        slots,
        IS_FP64=is_fp64,
        FLAG_WORDS=flag_words,
        SLOT_ROWS=_SLOT_ROWS,
        FANOUT=_FANOUT,
        BLOCK_COLS=block_cols,
    )
    finish_cols = min(block_cols, 32)
    torch.library.wrap_triton(_finish_kernel)[(triton.cdiv(slots, 128),)](
        ws,
        out,
        segments,
        inner,
        slots,
        FLAG_WORDS=flag_words,
        BLOCK_SLOTS=128,
        BLOCK_COLS=finish_cols,
        num_warps=4,
    )


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
    if out.numel() == 0:
        return out
    _launch(x.view(x.shape[0], math.prod(x.shape[1:])), indptr.contiguous(), out)
    return out


torch.library.register_autograd(
    f"{NAMESPACE}::segment_sum_triton",
    sum_backward(segment_gather),
    setup_context=save_sum_context,
)


def segment_sum_triton(src: Tensor, indptr: Tensor) -> Tensor:
    # Metadata only: checking indptr values would cost a device-to-host copy.
    check_metadata("segment_sum", "src", src, indptr)
    return getattr(torch.ops, NAMESPACE).segment_sum_triton(src, indptr)
