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

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

try:  # grid dependency control: sm_90's early launch (programmatic dependent launch)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a triton without it: the kernels launch one after another
    gdc_launch_dependents = gdc_wait = None

from .ops import NAMESPACE, check_metadata, save_sum_context, segment_gather, sum_backward

# Workspace slots are indexed by (segment start) // SLOT_ROWS, SLOT_ROWS being
# the shortest chunk (CHUNK_ROWS below) the tuner may pick for the call
# (_slot_rows), at least _SLOT_ROWS. Every chunk is a multiple of it (powers
# of two), so at most one chunk-crossing segment starts in each slot and any
# config maps segments to the same slots.
_SLOT_ROWS = 256
_MAX_BLOCK_COLS = 256
_FANOUT = 32  # probes per step of the per-program search over indptr

# (elements per tile, tiles per chunk, warps). A segment end costs the kernel
# a reduction over its tile, so short segments want small tiles on one warp
# (no cross-warp step) and long ones big tiles on four; the autotuner picks
# per row width, dtype and mean segment length. The shapes are the ones that
# won on an H100 for some case of the benchmark, and one that won on an H200
# for long and giant segments (tiles of 4096 elements in chunks of 64).
# Measurements: docs/kernel-notes.md, "_TILE_SHAPES".
_TILE_SHAPES = [
    (32, 128, 1),
    (64, 128, 1),
    (128, 64, 1),
    (256, 64, 1),
    (512, 32, 1),
    (512, 32, 2),
    (1024, 16, 4),
    (2048, 16, 4),
    (4096, 8, 4),
    (4096, 64, 4),
]


def _configs(block_cols: int) -> list[triton.Config]:
    configs = []
    for elements, tiles, warps in _TILE_SHAPES:
        block_rows = max(elements // block_cols, 1)
        chunk_rows = max(block_rows * tiles, _SLOT_ROWS)  # powers of two: a multiple of both
        config = triton.Config(
            {"BLOCK_ROWS": block_rows, "CHUNK_ROWS": chunk_rows}, num_warps=warps
        )
        if config not in configs:  # wide blocks map several shapes to one
            configs.append(config)
    return configs


def _prune_configs(configs, named_args, **kwargs) -> list[triton.Config]:
    """Tiles of more than 4x the mean segment's elements lose on short segments
    (measured), so they are not tried there: fewer compilations and trials."""
    block_cols = _block_cols(named_args["inner"])
    limit = 4 << named_args["length_class"]
    kept = [c for c in configs if c.kwargs["BLOCK_ROWS"] * block_cols <= limit]
    return kept or configs[:1]


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
def _indptr_local(
    indptr_ptr, index, c0, mask, CHUNK_ROWS: tl.constexpr, ROWS32: tl.constexpr = False
):
    """indptr[index] - c0 as int32, clamped into [-1, CHUNK_ROWS + 1]: enough to
    compare with the rows of the chunk starting at c0. ROWS32 (fewer than 2^31
    rows): the difference of any well-formed value fits in int32, so it is
    taken and clamped in 32 bits, from the low words (a malformed value gives a
    wrong bound in the same range, so reads stay in the chunk)."""
    value = tl.load(indptr_ptr + index, mask=mask, other=0)
    if ROWS32:
        local = value.to(tl.int32) - c0.to(tl.int32)
        return tl.minimum(tl.maximum(local, -1), CHUNK_ROWS + 1)
    else:
        return tl.minimum(tl.maximum(value - c0, -1), CHUNK_ROWS + 1).to(tl.int32)


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
def _workspace(ws_ptr, slots, FLAG_WORDS: tl.constexpr):
    """The workspace's two parts: int64 flags (a slot's segment id + 1), then
    the slots' partial rows."""
    flag_ptr = ws_ptr.to(tl.pointer_type(tl.int64), bitcast=True)
    return flag_ptr, ws_ptr + tl.cast(slots, tl.int64) * FLAG_WORDS


@triton.jit
def _segments_starting_in(
    indptr_ptr, c0, rows, nseg, CHUNK_ROWS: tl.constexpr, FANOUT: tl.constexpr
):
    """[lo, hi): the segments starting in the chunk of rows at c0 (two searches at once).
    Both are at most nseg: an unsorted indptr whose last entry is below c0 would
    put lo at nseg + 1, and the walk would read indptr[lo] past its end."""
    bounds = _lower_bound(
        indptr_ptr, 0, nseg + 1, rows, c0 + tl.arange(0, 2).to(tl.int64) * CHUNK_ROWS, FANOUT
    )
    return tl.minimum(tl.min(bounds, axis=0), nseg), tl.minimum(tl.max(bounds, axis=0), nseg)


@triton.jit
def _zero_empty_segments(
    indptr_ptr, out_ptr, lo, hi, rows, inner, cols, col_mask, BLOCK: tl.constexpr
):
    """Zero the empty segments among [lo, hi): they own no row, so no walk over
    rows would write them."""
    zeros = tl.zeros([BLOCK, cols.shape[0]], dtype=out_ptr.dtype.element_ty)
    for s0 in range(lo, hi, BLOCK):
        seg = s0 + tl.arange(0, BLOCK).to(tl.int64)
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


@triton.jit
def _tile_mask(row_mask, col_mask, EVEN_COLS: tl.constexpr):
    """A tile's load mask. Triton vectorizes a masked load only where it can
    prove the mask constant along the vector; the column mask defeats that
    (2-byte loads for bf16 rows), so it is left out when columns divide evenly."""
    if EVEN_COLS:
        return row_mask[:, None]
    else:
        return row_mask[:, None] & col_mask[None, :]


# Source rows are read once, yet loading them evict_first lost everywhere.
# Measurements: docs/kernel-notes.md, "_lane_row: evict_first".
@triton.jit
def _lane_row(row_ptr, r, left, col_mask, INNER: tl.constexpr, EVEN_COLS: tl.constexpr):
    """Row r (a constant) from `row_ptr` (row k of each lane's segment); zeros
    past its rows (`left`: the lane's rows from row k on). The mask compares r
    with `left`, one ISETP against an immediate, where `k + r < steps` took a
    VIADD per row too (offline, sm_90, bf16, 1 column: 92 -> 87 instructions
    per lane-loop iteration; timed only with the lane kernel's other changes,
    see _LANE_MID_SHAPES)."""
    return tl.load(row_ptr + r * INNER, mask=_tile_mask(r < left, col_mask, EVEN_COLS), other=0.0)


@triton.jit
def _pack_bounds(start, end):
    """A lane's local bounds (in [-1, CHUNK_ROWS + 1], CHUNK_ROWS + 2 < 2^15)
    as one int32: start + 1 in the upper 15 bits, so that the sign bit stays
    clear and _unpack_bounds' arithmetic shift gives it back, end + 1 in the
    lower 16."""
    return ((start + 1) << 16) | (end + 1)


@triton.jit
def _unpack_bounds(word):
    return (word >> 16) - 1, (word & 0xFFFF) - 1


@triton.jit
def _take_lowest(pending, slot_lanes, BLOCK_SEGS: tl.constexpr):
    """The lowest lane slot set in `pending`, a mask of that slot alone, and
    `pending` without it."""
    pick = tl.min(tl.where(pending, slot_lanes, BLOCK_SEGS), axis=0)
    picked = slot_lanes == pick
    return pick, picked, pending & ~picked


@triton.jit
def _emit_partial(
    indptr_ptr,
    out_ptr,
    part_ptr,
    flag_ptr,
    seg,
    total,
    inside,
    rows,
    inner,
    cols,
    col_mask,
    SLOT_ROWS: tl.constexpr,
):
    """Write a segment's sum over this chunk's rows: to `out` when the segment
    lies inside the chunk, else into its workspace slot (other chunks add theirs)."""
    if inside:
        tl.store(out_ptr + seg * inner + cols, total.to(out_ptr.dtype.element_ty), mask=col_mask)
    else:
        slot = _indptr_at(indptr_ptr, seg, rows, True) // SLOT_ROWS
        tl.atomic_add(part_ptr + slot * inner + cols, total, mask=col_mask, sem="relaxed")
        tl.store(flag_ptr + slot, seg + 1)


@triton.jit
def _walk_inside(
    indptr_ptr,
    out_ptr,
    part_ptr,
    flag_ptr,
    chunk_src,
    chunk_len,
    seg,
    rows,
    inner,
    cols,
    col_mask,
    IS_FP64: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    FAST_TILES: tl.constexpr,
):
    """A chunk all of whose rows belong to segment `seg`, which started before
    it (giant segments), of rows of exactly BLOCK_COLS columns: a plain
    reduction over its elements, read as one flat run (column = element index
    modulo BLOCK_COLS), with no segment ends to look for and no row masks on
    whole steps, so every load is a 16-byte vector. A step is FAST_TILES
    tiles, read while the previous step is added; each step is folded over its
    tiles within the thread into a one-tile accumulator, so the registers grow
    with the loads in flight only."""
    # One step is read ahead: two steps in flight (two buffers taking turns)
    # gained a little on bf16 and lost more on fp32.
    # Measurements: docs/kernel-notes.md, "_walk_inside".
    acc_type = tl.float64 if IS_FP64 else tl.float32
    BLOCK_COLS: tl.constexpr = cols.shape[0]
    ELEMENTS: tl.constexpr = BLOCK_ROWS * BLOCK_COLS
    STEP: tl.constexpr = FAST_TILES * ELEMENTS
    tile = tl.arange(0, ELEMENTS)
    offsets = tl.arange(0, FAST_TILES)[:, None] * ELEMENTS + tile[None, :]  # int32: in the chunk
    count = chunk_len * inner
    steps = count // STEP
    acc = tl.zeros([ELEMENTS], dtype=acc_type)
    upcoming = tl.load(chunk_src + offsets, mask=steps > 0, other=0.0)
    for i in range(0, steps):
        current = upcoming
        # A scalar mask: the loads stay vectorized.
        upcoming = tl.load(chunk_src + ((i + 1) * STEP + offsets), mask=i + 1 < steps, other=0.0)
        acc += tl.sum(current.to(acc_type), axis=0)
    # The last chunk's elements past its whole steps, a tile at a time.
    for t0 in range(steps * STEP, count, ELEMENTS):
        local = t0 + tile
        acc += tl.load(chunk_src + local, mask=local < count, other=0.0).to(acc_type)
    _emit_partial(
        indptr_ptr,
        out_ptr,
        part_ptr,
        flag_ptr,
        seg,
        tl.sum(tl.reshape(acc, [BLOCK_ROWS, BLOCK_COLS]), axis=0),
        False,
        rows,
        inner,
        cols,
        col_mask,
        SLOT_ROWS,
    )


@triton.jit
def _walk_chunk(
    src_ptr,
    indptr_ptr,
    out_ptr,
    part_ptr,
    flag_ptr,
    c0,
    c1,
    lo,
    hi,
    nseg,
    rows,
    inner,
    cols,
    col_mask,
    IS_FP64: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
    EVEN_COLS: tl.constexpr,
    FAST_TILES: tl.constexpr,  # 0: no _walk_inside
    VEC_TILES: tl.constexpr = False,  # _walk_rows_vec instead of _walk_rows
):
    """The walk of _segment_sum_kernel (see the comment there) over the rows
    [c0, c1), given the segments [lo, hi) that start in them."""
    _zero_empty_segments(indptr_ptr, out_ptr, lo, hi, rows, inner, cols, col_mask, BLOCK_ROWS)
    chunk_src = src_ptr + c0 * inner
    chunk_len = (c1 - c0).to(tl.int32)
    # The walk starts at the segment before the first one starting in the
    # chunk: it holds row c0 unless it ends there. Positions are int32 and
    # relative to c0, clamped into [-1, CHUNK_ROWS + 1].
    seg = tl.maximum(lo - 1, 0)
    start = _indptr_local(indptr_ptr, seg, c0, True, CHUNK_ROWS)
    end = _indptr_local(indptr_ptr, seg + 1, c0, True, CHUNK_ROWS)
    if FAST_TILES > 0 and EVEN_COLS:
        # The chunk lies inside one segment that started before it (an empty
        # chunk, c0 == rows, is left to the walk, which writes nothing).
        inside = (start < 0) & (end >= chunk_len) & (chunk_len > 0)
    else:
        inside: tl.constexpr = False  # the test below is compiled out
    if inside:
        _walk_inside(
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            chunk_src,
            chunk_len,
            seg,
            rows,
            inner,
            cols,
            col_mask,
            IS_FP64,
            SLOT_ROWS,
            BLOCK_ROWS,
            FAST_TILES,
        )
    elif VEC_TILES:
        _walk_rows_vec(
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            chunk_src,
            chunk_len,
            c0,
            seg,
            start,
            end,
            nseg,
            rows,
            inner,
            cols,
            col_mask,
            IS_FP64,
            SLOT_ROWS,
            BLOCK_ROWS,
            CHUNK_ROWS,
        )
    else:
        _walk_rows(
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            chunk_src,
            chunk_len,
            c0,
            seg,
            start,
            end,
            nseg,
            rows,
            inner,
            cols,
            col_mask,
            IS_FP64,
            SLOT_ROWS,
            BLOCK_ROWS,
            CHUNK_ROWS,
            EVEN_COLS,
        )


@triton.jit
def _walk_rows(
    indptr_ptr,
    out_ptr,
    part_ptr,
    flag_ptr,
    chunk_src,
    chunk_len,
    c0,
    seg,
    start,
    end,
    nseg,
    rows,
    inner,
    cols,
    col_mask,
    IS_FP64: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
    EVEN_COLS: tl.constexpr,
):
    """_walk_chunk from its first segment `seg` ([start, end) relative to c0) on."""
    acc_type = tl.float64 if IS_FP64 else tl.float32
    tile_rows = tl.arange(0, BLOCK_ROWS)
    BLOCK_COLS: tl.constexpr = cols.shape[0]
    done = 0  # rows of the chunk before `done` are summed into finished segments
    acc = tl.zeros([BLOCK_ROWS, BLOCK_COLS], dtype=acc_type)
    upcoming = tl.load(
        chunk_src + tile_rows.to(tl.int64)[:, None] * inner + cols[None, :],
        mask=_tile_mask(tile_rows < chunk_len, col_mask, EVEN_COLS),
        other=0.0,
    )
    for t0 in range(0, chunk_len, BLOCK_ROWS):
        tile = upcoming.to(acc_type)
        local = t0 + tile_rows
        ahead = local + BLOCK_ROWS
        upcoming = tl.load(
            chunk_src + ahead.to(tl.int64)[:, None] * inner + cols[None, :],
            mask=_tile_mask(ahead < chunk_len, col_mask, EVEN_COLS),
            other=0.0,
        )
        t_end = tl.minimum(t0 + BLOCK_ROWS, chunk_len)
        while (end <= t_end) & (seg < nseg):
            if end > tl.maximum(start, 0):  # rows of this segment lie in the chunk
                rows_in = (local >= done) & (local < end)
                total = tl.sum(acc + tl.where(rows_in[:, None], tile, 0.0), axis=0)
                _emit_partial(
                    indptr_ptr,
                    out_ptr,
                    part_ptr,
                    flag_ptr,
                    seg,
                    total,
                    start >= 0,
                    rows,
                    inner,
                    cols,
                    col_mask,
                    SLOT_ROWS,
                )
                acc = tl.zeros([BLOCK_ROWS, BLOCK_COLS], dtype=acc_type)
            done = tl.maximum(done, end)
            seg += 1
            start = end
            end = _indptr_local(indptr_ptr, seg + 1, c0, seg < nseg, CHUNK_ROWS)
        if (done <= t0) & (t_end == t0 + BLOCK_ROWS):
            acc += tile  # the common case of long segments: no row masks
        else:
            acc += tl.where(((local >= done) & (local < t_end))[:, None], tile, 0.0)
    # The segment still open runs past the chunk: its part goes to its slot.
    if (seg < nseg) & (chunk_len > tl.maximum(start, 0)) & (chunk_len > done):
        _emit_partial(
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            seg,
            tl.sum(acc, axis=0),
            False,
            rows,
            inner,
            cols,
            col_mask,
            SLOT_ROWS,
        )


@triton.jit
def _walk_tile_vec(
    tile,
    t0,
    acc,
    seg,
    start,
    end,
    done,
    indptr_ptr,
    out_ptr,
    part_ptr,
    flag_ptr,
    chunk_src,
    chunk_len,
    c0,
    nseg,
    rows,
    inner,
    cols,
    col_mask,
    IS_FP64: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
):
    """One tile of _walk_rows_vec (rows t0 to t0 + BLOCK_ROWS of the chunk,
    `tile` loaded whole or zero): the segments ending in it, then what is left
    of it added to `acc`."""
    acc_type = tl.float64 if IS_FP64 else tl.float32
    tile_rows = tl.arange(0, BLOCK_ROWS)
    t_end = tl.minimum(t0 + BLOCK_ROWS, chunk_len)
    if t_end < t0 + BLOCK_ROWS:  # the chunk's last tile, partial (or past it): rows in the chunk
        tile = tl.load(
            (chunk_src + t0 * inner) + tile_rows[:, None] * inner + cols[None, :],
            mask=(tile_rows < chunk_len - t0)[:, None],
            other=0.0,
        ).to(acc_type)
    while (end <= t_end) & (seg < nseg):
        # Rows of the tile before `end`: those before `done` are zero already.
        below = (tile_rows < end - t0)[:, None]
        if end > tl.maximum(start, 0):  # rows of this segment lie in the chunk
            total = tl.sum(acc + tl.where(below, tile, 0.0), axis=0)
            _emit_partial(
                indptr_ptr,
                out_ptr,
                part_ptr,
                flag_ptr,
                seg,
                total,
                start >= 0,
                rows,
                inner,
                cols,
                col_mask,
                SLOT_ROWS,
            )
            acc = tl.zeros_like(acc)
        tile = tl.where(below, 0.0, tile)
        done = tl.maximum(done, end)
        seg += 1
        start = end
        end = _indptr_local(indptr_ptr, seg + 1, c0, seg < nseg, CHUNK_ROWS)
    return acc + tile, seg, start, end, done


@triton.jit
def _walk_rows_vec(
    indptr_ptr,
    out_ptr,
    part_ptr,
    flag_ptr,
    chunk_src,
    chunk_len,
    c0,
    seg,
    start,
    end,
    nseg,
    rows,
    inner,
    cols,
    col_mask,
    IS_FP64: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
):
    """_walk_rows for the lane kernel's rows of one column of a 2-byte type
    (inner is the constexpr 1). Offline, sm_90, bf16, chunks of 32768 rows,
    tiles of 256 rows on one warp, _walk_rows cost about 106 instructions per
    tile without a segment end and about 190 more per segment end: 8 masked
    2-byte loads per thread (the row mask `ahead < chunk_len` differs per row,
    so nothing is vectorized), each with its own 64-bit address, then 2
    compares and 2 selects per element for the rows of an ending segment and
    again for the masked add after it. And the loaded bf16 pairs are packed
    (PRMT) into the loop-carried tile at the end of the iteration, which waits
    for the load there: one tile (512 bytes a warp) in flight, and only while
    the iteration's instructions run. Here:
    - a tile's load is masked by one scalar (the whole tile lies in the
      chunk): one 16-byte load per thread off a scalar tile base, its four
      registers carried as loaded; the chunk's last tile, when partial (the
      last chunk only), is loaded again with a row mask;
    - a step is two tiles, both loaded at the top of the step before the
      previous step's two are summed: 1 KB a warp in flight;
    - a segment end zeroes its rows in the tile (1 compare and 2 selects per
      element, the compare shared with its sum), so what is left of the tile
      after its segment ends is added whole: no masked add, no `done` test.
    Same adds per accumulator element in the same order as _walk_rows; the
    reduction over the tile at a segment end follows the load layout (8
    consecutive rows per thread), so a sum's last bits may differ from
    _walk_rows'. Counted the same way here: 53 instructions a tile and 120 an
    end, at 72 registers (62 before). H200 (tri.py, Triton over CUDA forward
    speed, two runs), bf16, 1 column: long segments 0.783 -> 0.952 and 0.781
    -> 0.952; short segments 0.870 -> 0.909; the power law, fp32 and 4
    columns within 0.006."""
    acc_type = tl.float64 if IS_FP64 else tl.float32
    tile_rows = tl.arange(0, BLOCK_ROWS)
    BLOCK_COLS: tl.constexpr = cols.shape[0]
    STEP: tl.constexpr = 2 * BLOCK_ROWS
    tile_off = tile_rows[:, None] * inner + cols[None, :]  # int32, constexpr inner
    done = 0  # rows of the chunk before `done` are summed into finished segments
    acc = tl.zeros([BLOCK_ROWS, BLOCK_COLS], dtype=acc_type)
    # Scalar masks: the loads stay vectorized.
    upcoming0 = tl.load(chunk_src + tile_off, mask=chunk_len >= BLOCK_ROWS, other=0.0)
    upcoming1 = tl.load(
        (chunk_src + BLOCK_ROWS * inner) + tile_off, mask=chunk_len >= STEP, other=0.0
    )
    for t0 in range(0, chunk_len, STEP):
        tile0 = upcoming0.to(acc_type)
        tile1 = upcoming1.to(acc_type)
        ahead = t0 + STEP
        upcoming0 = tl.load(
            (chunk_src + ahead * inner) + tile_off, mask=ahead + BLOCK_ROWS <= chunk_len, other=0.0
        )
        upcoming1 = tl.load(
            (chunk_src + (ahead + BLOCK_ROWS) * inner) + tile_off,
            mask=ahead + STEP <= chunk_len,
            other=0.0,
        )
        acc, seg, start, end, done = _walk_tile_vec(
            tile0,
            t0,
            acc,
            seg,
            start,
            end,
            done,
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            chunk_src,
            chunk_len,
            c0,
            nseg,
            rows,
            inner,
            cols,
            col_mask,
            IS_FP64,
            SLOT_ROWS,
            BLOCK_ROWS,
            CHUNK_ROWS,
        )
        acc, seg, start, end, done = _walk_tile_vec(
            tile1,
            t0 + BLOCK_ROWS,
            acc,
            seg,
            start,
            end,
            done,
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            chunk_src,
            chunk_len,
            c0,
            nseg,
            rows,
            inner,
            cols,
            col_mask,
            IS_FP64,
            SLOT_ROWS,
            BLOCK_ROWS,
            CHUNK_ROWS,
        )
    # The segment still open runs past the chunk: its part goes to its slot.
    if (seg < nseg) & (chunk_len > tl.maximum(start, 0)) & (chunk_len > done):
        _emit_partial(
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            seg,
            tl.sum(acc, axis=0),
            False,
            rows,
            inner,
            cols,
            col_mask,
            SLOT_ROWS,
        )


# How the work is split, and why: one program per (chunk of CHUNK_ROWS rows,
# block of BLOCK_COLS columns), whatever the segment lengths. Splitting by
# rows gives every program the same bytes to read for any length law: one
# program per segment would idle most of the GPU on one giant segment.
#
# A program finds the segments starting in its chunk ([lo, hi), two
# FANOUT-ary searches over indptr), zeroes the empty ones among them (they
# own no row, so no walk would write them), then walks its rows one tile at a
# time, the next tile's load in flight while it adds the current one into a
# tile-shaped accumulator: until a segment ends, a tile costs what a copy
# does, with no per-row search and no scan. Where a segment ends, the
# accumulator and the tile's rows up to the end are reduced over rows (the one
# cross-thread step), and the walk reads the next segment's end. A segment
# lying inside the chunk is stored to `out`; one crossing a chunk boundary
# (at most two per chunk) is added with tl.atomic_add into a zeroed fp32
# (fp64) workspace slot flagged with the segment id, and _finish_kernel
# converts the flagged slots. Every element of src is read once. Sums of
# segments crossing chunks are combined in arbitrary order (atomics), so
# their last bits may differ from run to run.
# The next segment's end is read when the current one closes: reading it one
# segment ahead lost. Short segments of 256 bf16 columns found no tile much
# better than the tuned one either.
# Measurements: docs/kernel-notes.md, "_segment_sum_kernel".
@triton.jit(do_not_specialize=["segments", "slots", "length_class"])
def _segment_sum_kernel(
    src_ptr,
    indptr_ptr,
    out_ptr,
    ws_ptr,
    rows,
    segments,
    inner,
    slots,
    length_class,  # autotuning key only: log2 of the mean segment's elements
    IS_FP64: tl.constexpr,
    FLAG_WORDS: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    FANOUT: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    BLOCK_ROWS: tl.constexpr,
    CHUNK_ROWS: tl.constexpr,
    EVEN_COLS: tl.constexpr,  # inner is a multiple of BLOCK_COLS
    PDL: tl.constexpr,  # the finish kernel launches early (_launch)
):
    if PDL:
        gdc_launch_dependents()
    flag_ptr, part_ptr = _workspace(ws_ptr, slots, FLAG_WORDS)
    nseg = tl.cast(segments, tl.int64)
    c0 = tl.program_id(0).to(tl.int64) * CHUNK_ROWS
    c1 = tl.minimum(c0 + CHUNK_ROWS, rows)
    # Only rows of more than 256 (_MAX_BLOCK_COLS) columns have several column
    # blocks, all of 256, so the block's first column is program_id(1) * 256
    # whatever BLOCK_COLS is. Written so, it is a known multiple of 16 and the
    # loads of narrow rows stay vectorized (program_id(1) * 1 would not be).
    cols = tl.program_id(1) * 256 + tl.arange(0, BLOCK_COLS)
    col_mask = cols < inner

    lo, hi = _segments_starting_in(indptr_ptr, c0, rows, nseg, CHUNK_ROWS, FANOUT)
    _walk_chunk(
        src_ptr,
        indptr_ptr,
        out_ptr,
        part_ptr,
        flag_ptr,
        c0,
        c1,
        lo,
        hi,
        nseg,
        rows,
        inner,
        cols,
        col_mask,
        IS_FP64,
        SLOT_ROWS,
        BLOCK_ROWS,
        CHUNK_ROWS,
        EVEN_COLS,
        0,
    )


# Rows of up to _LANE_MAX_COLS columns, and short segments of rows of up to
# _WIDE_LANE_MAX_BYTES (_wide_lane_shape). The walk above reduces a whole tile
# at every segment end: with short segments of such narrow rows that is more
# work than the rows' few bytes allow (it ran at 11-42 % of copy bandwidth on
# an H100; bf16, 8 to 32 columns, 22-52 % on an H200). Here one lane owns one
# segment instead and adds its rows in a loop, so a segment end costs a store;
# neighbouring lanes read neighbouring bytes, so a warp's loads fall on a few
# cache lines. A program owns a chunk of rows as in the walk. Where few
# segments start in it (WALK_ROWS rows or more each, on average) it walks.
# Otherwise it takes the segments BLOCK_SEGS at a time: those inside the chunk
# and of at most LANE_ROWS rows go one per lane (the loop runs as long as the
# block's longest), the others (long ones, and those crossing the chunk's
# edges) one after another, each summed over its rows in the chunk by the
# whole program a tile at a time and written as in the walk (crossing parts
# into the workspace). The row width is a constexpr, so a lane reads a whole
# row with one load.
# On the power law the lanes' loop and the rest segments' loop cost about
# the same, and in a step of the lanes' loop few of a warp's threads load. The ways tried
# around that (prefix sums and tl.gather, segments cut into pieces of 8 rows,
# 16-byte lane reads, queued segments, tiles of lanes) lost or tied.
# Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel".
@triton.jit(do_not_specialize=["segments", "slots", "length_class"])
def _segment_sum_lanes_kernel(
    src_ptr,
    indptr_ptr,
    out_ptr,
    ws_ptr,
    rows,
    segments,
    slots,
    length_class,  # autotuning key only: log2 of the mean segment's elements
    INNER: tl.constexpr,
    IS_FP64: tl.constexpr,
    FLAG_WORDS: tl.constexpr,
    SLOT_ROWS: tl.constexpr,
    FANOUT: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    BLOCK_SEGS: tl.constexpr,
    LANE_ROWS: tl.constexpr,
    LANE_STEP: tl.constexpr,  # rows per lane and iteration
    ROW_ELEMENTS: tl.constexpr,  # elements per tile of the walk and of long segments
    CHUNK_ROWS: tl.constexpr,
    WALK_ROWS: tl.constexpr,  # mean segment length (rows) in a chunk from which it walks
    WALK_ONLY: tl.constexpr,  # every chunk walks: the lanes are compiled out
    FAST_TILES: tl.constexpr,  # tiles per step of _walk_inside (0: none)
    # No defaults: torch.compile's wrapper of a user kernel passes only the
    # arguments given, so a default works eagerly and fails compiled.
    MID_FROM: tl.constexpr,  # lanes sum segments of up to this many rows (0: no mid path)
    MID_ROWS: tl.constexpr,  # longest mid segment, rows (a power of two)
    ROWS32: tl.constexpr,  # fewer than 2^31 rows: lane bounds in 32 bits
    SEGS32: tl.constexpr,  # fewer than 2^31 segments
    PDL: tl.constexpr,  # the finish kernel launches early (_launch)
):
    if PDL:
        gdc_launch_dependents()
    BLOCK_ROWS: tl.constexpr = ROW_ELEMENTS // BLOCK_COLS
    # A lane keeps its segment's two local bounds as one int32 for the rest
    # and mid paths (_pack_bounds), where they fit: chunks of 32768 rows would
    # set the sign bit.
    PACK_BOUNDS: tl.constexpr = CHUNK_ROWS + 2 < 32768
    MID: tl.constexpr = MID_FROM > 0 and PACK_BOUNDS
    lane_rows: tl.constexpr = MID_FROM if MID else LANE_ROWS
    # Mid lanes keyed by sign | slot << 23 | first << 8 | rows (the mid loop
    # below): slots below 256, first rows below 2^15 (PACK_BOUNDS), up to 255
    # rows; one column only (the shapes the tuner gives the mid path).
    MID_KEYS: tl.constexpr = MID and BLOCK_SEGS <= 256 and MID_ROWS < 256 and BLOCK_COLS == 1
    acc_type = tl.float64 if IS_FP64 else tl.float32
    flag_ptr, part_ptr = _workspace(ws_ptr, slots, FLAG_WORDS)
    nseg = tl.cast(segments, tl.int64)
    # Programs take chunks in order: many waves of chunks balance themselves, and
    # neither interleaving them in strands nor chunks of equal cost (as the CUDA
    # lane sum's, whose grid is one wave) paid.
    # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: chunk order".
    c0 = tl.program_id(0).to(tl.int64) * CHUNK_ROWS
    c1 = tl.minimum(c0 + CHUNK_ROWS, rows)
    cols = tl.arange(0, BLOCK_COLS)
    col_mask = cols < INNER
    even_cols: tl.constexpr = INNER == BLOCK_COLS
    tile_rows = tl.arange(0, BLOCK_ROWS)
    mid_rows = tl.arange(0, MID_ROWS if MID_ROWS > 0 else 16)

    lo, hi = _segments_starting_in(indptr_ptr, c0, rows, nseg, CHUNK_ROWS, FANOUT)
    if WALK_ONLY or (hi - lo) * WALK_ROWS <= c1 - c0:
        # Few segments start here (inside a long one, or a few long ones):
        # the walk streams through them faster than lanes would.
        _walk_chunk(
            src_ptr,
            indptr_ptr,
            out_ptr,
            part_ptr,
            flag_ptr,
            c0,
            c1,
            lo,
            hi,
            nseg,
            rows,
            INNER,
            cols,
            col_mask,
            IS_FP64,
            SLOT_ROWS,
            BLOCK_ROWS,
            CHUNK_ROWS,
            even_cols,
            FAST_TILES,
            # Only the long-segment shapes (one warp, 256-element tiles, chunks of
            # 32768 rows or more: the tuner takes them for long segments alone): the
            # vector walk takes the lane kernel from 62-64 to 72 registers, which the
            # lane paths of short segments and the power law would pay in occupancy.
            # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: vector walk".
            BLOCK_COLS == 1
            and src_ptr.dtype.element_ty.primitive_bitwidth == 16
            and ROW_ELEMENTS == 256
            and CHUNK_ROWS >= 32768
            and not WALK_ONLY,
        )
        return
    # From the segment before the first one starting in the chunk: it holds
    # row c0 unless it ends there.
    # (Loops count from 0: with another lower bound, triton loses what it knows
    # about the alignment of addresses computed in the loop, and the loads are
    # no longer vectorized.)
    # The next block's bounds are read while this block's rows are summed: read
    # at its top, a block waited on indptr before its first row load could go
    # out. The rest segments below read their tiles one at a time.
    # Bounds are int32 and relative to c0, clamped into [-1, CHUNK_ROWS + 1]
    # (_indptr_local): every test below (inside the chunk, lane or rest, rows
    # in the chunk) gives what it gave on the absolute int64 bounds, at half
    # the integer instructions and fewer registers, and the rest segment to take
    # next is found by a 32-bit warp reduction over lane slots.
    # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: bounds".
    chunk_src = src_ptr + c0 * INNER
    chunk_len = (c1 - c0).to(tl.int32)
    slot_lanes = tl.arange(0, BLOCK_SEGS)
    base = tl.maximum(lo - 1, 0)
    # A block is its first segment `block` (an int64 scalar) and int32 lane
    # offsets: the per-lane index and address arithmetic is 32-bit. On rows
    # wider than 4 columns (the wide lanes) the block loop's counter and
    # segments left are int32 too, where fewer than 2^31 segments make that
    # exact (SEGS32); rows of 1 and 4 columns lost with it and keep int64.
    # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: 32-bit blocks".
    BLOCK_LOOP32: tl.constexpr = SEGS32 and BLOCK_COLS > 4
    block = base
    segs_left = hi - base  # segments from the block's first on
    if BLOCK_LOOP32:
        segs_left = segs_left.to(tl.int32)
    valid = slot_lanes < tl.minimum(segs_left, BLOCK_SEGS).to(tl.int32)
    start = _indptr_local(indptr_ptr + block, slot_lanes, c0, valid, CHUNK_ROWS, ROWS32)
    end = _indptr_local(indptr_ptr + block + 1, slot_lanes, c0, valid, CHUNK_ROWS, ROWS32)
    for _block in range(0, tl.cdiv(segs_left, BLOCK_SEGS)):
        next_block = block + BLOCK_SEGS
        if BLOCK_LOOP32:
            segs_left -= BLOCK_SEGS
            next_left = segs_left
        else:
            next_left = hi - next_block
        next_valid = slot_lanes < tl.minimum(tl.maximum(next_left, 0), BLOCK_SEGS).to(tl.int32)
        next_start = _indptr_local(
            indptr_ptr + next_block, slot_lanes, c0, next_valid, CHUNK_ROWS, ROWS32
        )
        next_end = _indptr_local(
            indptr_ptr + next_block + 1, slot_lanes, c0, next_valid, CHUNK_ROWS, ROWS32
        )
        first = tl.maximum(start, 0)
        last = tl.minimum(end, chunk_len)
        count = last - first  # rows of the segment in the chunk
        inside = (start >= 0) & (end <= chunk_len)
        lane = valid & inside & (count <= lane_rows)
        if MID:
            mid = valid & inside & (count > lane_rows) & (count <= MID_ROWS)
            rest = valid & ~lane & ~mid & (count > 0)
        else:
            rest = valid & ~lane & (count > 0)
        steps = tl.where(lane, count, 0)
        if PACK_BOUNDS:
            # The rest (and mid) segments' bounds, (start + 1) << 16 | end + 1,
            # computed before the lane loop so that start and end are not live
            # across it, and not read from indptr again (an L1 round trip and the
            # 64-bit clamps, one segment after another).
            # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: packed bounds".
            packed = tl.where(rest | mid if MID else rest, _pack_bounds(start, end), 0)
            if MID_KEYS:
                # A mid lane's word is its key instead: negative (the other
                # lanes' words are not), then slot, first row and rows, so one
                # REDUX.MIN picks the lowest mid lane and gives its bounds.
                packed = tl.where(mid, ((slot_lanes - 256) << 23) + (first << 8) + count, packed)
        if not MID:
            row_ptr = chunk_src + first[:, None] * INNER + cols[None, :]
        acc = tl.zeros([BLOCK_SEGS, BLOCK_COLS], dtype=acc_type)
        # LANE_STEP rows per lane and iteration (see _lane_step), in flight
        # together: the body is one basic block, and its loads go out before
        # its adds (sm_90 SASS).
        for k in range(0, tl.max(steps, axis=0), LANE_STEP):
            left = steps - k
            if MID:
                # Addresses from int32 row offsets and the chunk's base: no
                # 64-bit lane pointers live across the loop (offline, sm_90,
                # bf16, 1 column: 67 -> 64 registers with the mid path, +4
                # instructions per iteration).
                row_ptr_k = chunk_src + (first + k)[:, None] * INNER + cols[None, :]
            else:
                row_ptr_k = row_ptr + k * INNER
            # A load per row: bf16 rows of one column read as aligned 4-byte words,
            # two rows a load, lost.
            # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: lane loads".
            for r in tl.static_range(LANE_STEP):
                acc += _lane_row(row_ptr_k, r, left, col_mask, INNER, even_cols).to(acc_type)
        if not MID_KEYS:
            tl.store(
                (out_ptr + block * INNER) + slot_lanes[:, None] * INNER + cols[None, :],
                acc.to(out_ptr.dtype.element_ty),
                mask=_tile_mask(lane, col_mask, even_cols),
            )
        if MID_KEYS:
            # The mid loop below, with keys (the mid lanes' `packed`): a step
            # takes the smallest word, the lowest mid lane (slots are unique),
            # with one REDUX.MIN where it took a REDUX.MIN of slots and a
            # REDUX.SUM of the picked lane's bounds, clears that lane's word
            # and puts its sum into the lane's `acc`, stored with the lanes'
            # sums after the loop instead of a store a step. Same segments in
            # the same order, same rows and adds (bit-identical sums). Steps
            # = mid lanes, and only a mid lane's word is negative: every step
            # takes one, inside the chunk, for any indptr. Fewer instructions a
            # mid segment; bf16 gained, fp32 unchanged.
            # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: mid keys".
            stored = lane | mid
            for _ in range(tl.sum(mid.to(tl.int32), axis=0)):
                key = tl.min(packed, axis=0)
                hit = packed == key
                packed = tl.where(hit, 0, packed)
                m_first = (key >> 8) & 0x7FFF
                m_count = key & 0xFF
                tile = tl.load(
                    (chunk_src + m_first * INNER) + mid_rows[:, None] * INNER + cols[None, :],
                    mask=_tile_mask(mid_rows < m_count, col_mask, even_cols),
                    other=0.0,
                )
                acc = tl.where(hit[:, None], tl.sum(tile.to(acc_type), axis=0)[None, :], acc)
            tl.store(
                (out_ptr + block * INNER) + slot_lanes[:, None] * INNER + cols[None, :],
                acc.to(out_ptr.dtype.element_ty),
                mask=_tile_mask(stored, col_mask, even_cols),
            )
        elif MID:
            # Mid segments (inside the chunk, MID_FROM + 1 to MID_ROWS rows),
            # one after another on the whole warp: one tile of MID_ROWS rows
            # each, reduced over the warp. In lanes, a block's loop ran as long
            # as its longest lane, up to LANE_ROWS rows: on the bench's power
            # law (bf16, 1 column) 9.6 % of the lane load slots carried a row.
            # With lanes up to 16 rows the loop runs at most twice. Their
            # sums are added in another order than the lanes' or the rest
            # path's (a tree over the warp).
            # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: mid path".
            for _ in range(tl.sum(mid.to(tl.int32), axis=0)):
                pick, picked, mid = _take_lowest(mid, slot_lanes, BLOCK_SEGS)
                m_first, m_end = _unpack_bounds(tl.sum(tl.where(picked, packed, 0), axis=0))
                m_count = m_end - m_first
                tile = tl.load(
                    (chunk_src + m_first * INNER) + mid_rows[:, None] * INNER + cols[None, :],
                    mask=_tile_mask(mid_rows < m_count, col_mask, even_cols),
                    other=0.0,
                )
                tl.store(
                    (out_ptr + (block + pick) * INNER) + cols,
                    tl.sum(tile.to(acc_type), axis=0).to(out_ptr.dtype.element_ty),
                    mask=col_mask,
                )
        for _ in range(tl.sum(rest.to(tl.int32), axis=0)):
            pick, picked, rest = _take_lowest(rest, slot_lanes, BLOCK_SEGS)
            s = block + pick  # the block's first segment + its lane
            if PACK_BOUNDS:
                s_start, s_end = _unpack_bounds(tl.sum(tl.where(picked, packed, 0), axis=0))
            else:
                s_start = _indptr_local(indptr_ptr, s, c0, True, CHUNK_ROWS)
                s_end = _indptr_local(indptr_ptr, s + 1, c0, True, CHUNK_ROWS)
            a = tl.maximum(s_start, 0)
            b = tl.minimum(s_end, chunk_len)
            s_inside = (s_start >= 0) & (s_end <= chunk_len)
            # Tiles start at a multiple of 16 rows so their loads stay
            # vectorized (c0 is one too). Only the segment's rows are
            # loaded: loading the tile's other rows of the chunk and dropping
            # them cost.
            # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: rest tiles".
            a16 = a // 16 * 16
            total = tl.zeros([BLOCK_ROWS, BLOCK_COLS], dtype=acc_type)
            for t in range(0, tl.cdiv(b - a16, BLOCK_ROWS)):
                # The tile's base pointer is a scalar and the row mask compares
                # the rows' offsets in the tile with scalars: no 64-bit address
                # and no add per row (offline, sm_90, bf16, 1 column: 84 -> 71
                # instructions per tile; same rows, same order).
                t0 = a16 + t * BLOCK_ROWS
                # The mask below keeps these loads to one row each: whole 16-byte
                # vectors (the segment's rows kept with tl.where) lost.
                # Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: rest tiles".
                keep = (tile_rows >= a - t0) & (tile_rows < b - t0)
                tile = tl.load(
                    (chunk_src + t0 * INNER) + tile_rows[:, None] * INNER + cols[None, :],
                    mask=_tile_mask(keep, col_mask, even_cols),
                    other=0.0,
                )
                total += tile.to(acc_type)
            _emit_partial(
                indptr_ptr,
                out_ptr,
                part_ptr,
                flag_ptr,
                s,
                tl.sum(total, axis=0),
                s_inside,
                rows,
                INNER,
                cols,
                col_mask,
                SLOT_ROWS,
            )
        block = next_block
        valid = next_valid
        start = next_start
        end = next_end


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
    PDL: tl.constexpr,  # launched early: wait for the sum's workspace
):
    if PDL:
        gdc_wait()
    # Flagged workspace slots -> out rows of the segments that crossed chunks.
    flag_ptr, part_ptr = _workspace(ws_ptr, slots, FLAG_WORDS)
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
# key is `inner`, the accumulator flag and the mean segment length's class;
# triton also keys on the tensors' dtypes (fp16/bf16/fp32 read different bytes
# per row). The workspace is zeroed before each trial and after tuning, since
# the kernel adds into it.
_KERNELS = {
    cols: triton.autotune(
        configs=_configs(cols),
        key=["inner", "IS_FP64", "length_class"],
        prune_configs_by={"early_config_prune": _prune_configs},
        reset_to_zero=["ws_ptr"],
    )(_segment_sum_kernel)
    for cols in (1 << i for i in range(_MAX_BLOCK_COLS.bit_length()))
}


# Lane kernel: rows of at most _LANE_MAX_COLS columns, whatever the segment
# lengths. (segments per block, chunk rows, warps, elements per walk tile),
# autotuned per row width, dtype and mean segment length. On an H100, one warp
# was best or within 2 points of the best on every law but giant segments,
# where bigger tiles on more warps stream faster.
_LANE_MAX_COLS = 4
# Short segments of rows of 5 columns to 64 bytes (fp32, fp16, bf16) take lanes
# too, in blocks of _WIDE_LANE_BYTES per row (BLOCK_SEGS = that over the row's
# column block): one 16-byte load per thread and row on one warp, which won at
# every width against more segments or fewer. Segments of more than 16 rows go
# to the rest path. Wider rows, to _WIDE_LANE_MAX_BYTES, take blocks of
# _WIDE_ROW_SEGS segments, on one warp up to 256 bytes a row, two above; fp32
# stops at 128 bytes (rows of 512 bytes lost). Segments of a mean of _WALK_ROWS rows
# or more keep the walk: its multi-warp tiles stream long segments faster than
# one warp does.
# Measurements: docs/kernel-notes.md, "_WIDE_LANE_BYTES, _WIDE_ROW_SEGS".
_WIDE_LANE_BYTES = 512
_WIDE_LANE_MAX_BYTES = {4: 128, 2: 512}  # by element size
_NARROW_ROW_BYTES = _WIDE_LANE_BYTES // 8  # one 16-byte load per row and thread
_WIDE_ROW_SEGS = 4
_WIDE_REST_ROWS = 8
_ONE_WARP_ROW_BYTES = 256
_WIDE_LANE_ROWS = 16
# Chunks of the wide lanes that lie inside one segment take _walk_inside,
# FAST_TILES tiles a step, that step _WIDE_FAST_BYTES a warp or two tiles,
# whichever is more (a tile is ROW_ELEMENTS elements: 512 bytes a warp for
# rows of up to 64 bytes, 1 or 2 KB a warp for wider ones). _walk_rows waits
# on the load it issues at the top of its tile loop, one tile a warp in
# flight; _walk_inside keeps 2 KB a warp in flight, at a few registers.
# Measurements: docs/kernel-notes.md, "_WIDE_FAST_BYTES".
_WIDE_FAST_BYTES = 2048
# Longest segment a lane sums on its own; longer ones go to the whole program,
# one after another. Rows of one column are cheap enough per lane to take
# longer ones; rows of 4 columns lose with them.
# Measurements: docs/kernel-notes.md, "_LANE_ROWS, _LANE_ROWS_ONE_COLUMN".
_LANE_ROWS = 32
_LANE_ROWS_ONE_COLUMN = 48
# Mean segment length (rows) from which a chunk walks: from 32 it lost on
# the power law, from 128 it tied.
# Measurements: docs/kernel-notes.md, "_WALK_ROWS".
_WALK_ROWS = 64
# Chunks of 8192 rows (rows of one column) and blocks of 32 segments (rows of
# 4 columns) win on one law or both and lose at most 2 points on the other,
# which may share their shape class. The multi-warp shapes of 2048 to 8192
# elements are for giant segments, and chunks of 32768 and 65536 rows on one
# warp for long ones: fewer chunks, so fewer searches, first-tile waits and
# crossing segments. Most variants tried beside them (bigger blocks, other
# tiles, longer lanes, the walk reading further ahead) lost or tied.
# Measurements: docs/kernel-notes.md, "_LANE_SHAPES".
_LANE_SHAPES = [
    (32, 512, 1, 128),
    (64, 1024, 1, 128),
    (32, 4096, 1, 256),
    (64, 4096, 1, 256),
    (64, 8192, 1, 256),
    (64, 16384, 1, 256),
    (64, 32768, 1, 256),
    (64, 65536, 1, 256),
    (128, 4096, 2, 1024),
    (64, 8192, 4, 1024),
    (64, 16384, 2, 512),
    (64, 16384, 4, 1024),
    (64, 32768, 4, 2048),
    (64, 131072, 8, 2048),
    (64, 131072, 8, 8192),
    (64, 65536, 4, 4096),
]
# Shapes that only walk (WALK_ONLY), for giant segments: the lanes compiled
# out (bf16 rows of one column gained, not by occupancy; fp32 ties, and rows
# of 4 columns keep their shapes). Any chunk is summed right by the walk,
# only slower where many segments start in it. Their fifth field is
# FAST_TILES: chunks inside one segment take _walk_inside, FAST_TILES tiles
# per step, the tuner picking among 2, 4 and 8.
# Measurements: docs/kernel-notes.md, "_LANE_WALK_SHAPES".
_LANE_WALK_SHAPES = [
    (64, 131072, 8, 2048, 2),
    (64, 131072, 8, 2048, 4),
    (64, 131072, 8, 2048, 8),
    (64, 131072, 4, 1024, 4),
]
# From this mean segment length (elements, log2) on, the multi-warp shapes are
# tried too. Below it they gain little on long segments and lose up to half the
# bandwidth on a power law, which can have the same mean (its crowd of short
# segments), and the config tuned on one is reused for the other.
_LANE_GIANT_CLASS = 16
# Shapes with the mid path (MID_FROM, MID_ROWS of the lane kernel), for rows
# of one column only (pruned elsewhere): lanes sum segments of up to
# MID_FROM rows (_LANE_MID_FROMS), the warp one segment at a time those of
# up to _LANE_MID_ROWS rows inside the chunk, the rest path longer ones. The
# autotuner keeps the shapes above where the mid path does not pay (short
# segments: two more instructions per lane, four per lane-loop iteration).
# The power law takes lanes of 16 to 32 rows beside mid tiles of 128 rows.
# Measurements: docs/kernel-notes.md, "_LANE_MID_SHAPES".
_LANE_MID_SHAPES = [
    (64, 4096, 1, 256),
    (64, 8192, 1, 256),
]
_LANE_MID_FROMS = (16, 24, 32)
_LANE_MID_ROWS = 128

# The lane kernel on rows of one column: short segments run near L1's peak
# throughput; the power law is bound by neither L1 nor DRAM but by its warps
# waiting on few rows in flight. One-warp programs stop at 32 an SM (the
# block limit), and a persistent kernel to get past it lost everywhere.
# Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: profile".

# Scan tiles instead of lanes (running sums of a tile, a segment's sum the
# difference of two) lost on both laws, and the tuner took none of them.
# Measurements: docs/kernel-notes.md, "_segment_sum_lanes_kernel: scan tiles".


# The lane shapes walk chunks inside one segment with _walk_inside too,
# _LANE_FAST_TILES tiles per step: on a power law about half the chunks can
# lie inside one segment, where _walk_rows made 2-byte loads and a
# segment-end test per tile. Chunks where a segment starts keep _walk_rows.
# Two tiles a step leave the registers as they were; four cost registers and
# spilled on rows of 4 columns.
# Measurements: docs/kernel-notes.md, "_LANE_FAST_TILES".
_LANE_FAST_TILES = 2


def _lane_configs(max_registers: int | None = None) -> list[triton.Config]:
    shapes = [((*shape, _LANE_FAST_TILES), False, 0) for shape in _LANE_SHAPES]
    shapes += [(shape, True, 0) for shape in _LANE_WALK_SHAPES]
    shapes += [
        ((*shape, _LANE_FAST_TILES), False, mid_from)
        for shape in _LANE_MID_SHAPES
        for mid_from in _LANE_MID_FROMS
    ]
    return [
        triton.Config(
            {
                "BLOCK_SEGS": segs,
                "CHUNK_ROWS": chunk,
                "ROW_ELEMENTS": elements,
                "WALK_ONLY": walk_only,
                "FAST_TILES": fast_tiles,
                "MID_FROM": mid_from,
                "MID_ROWS": _LANE_MID_ROWS if mid_from else 0,
            },
            num_warps=warps,
            maxnreg=max_registers,
        )
        for (segs, chunk, warps, elements, fast_tiles), walk_only, mid_from in shapes
    ]


# Rows of one column take walk tiles of at least this many elements below the
# giant class. Smaller tiles lost on both laws, yet the autotuner once kept
# one for a power law.
# Measurements: docs/kernel-notes.md, "_LANE_ONE_COLUMN_ELEMENTS".
_LANE_ONE_COLUMN_ELEMENTS = 256


def _prune_lane_configs(configs, named_args, **kwargs) -> list[triton.Config]:
    one_column = kwargs.get("INNER", named_args.get("INNER")) == 1
    if not one_column:  # the mid path is for rows of one column only
        configs = [c for c in configs if not c.kwargs.get("MID_FROM", 0)]
    if named_args["length_class"] >= _LANE_GIANT_CLASS:
        return configs
    return [
        c
        for c in configs
        if c.num_warps == 1
        and (not one_column or c.kwargs["ROW_ELEMENTS"] >= _LANE_ONE_COLUMN_ELEMENTS)
    ]


# Rows per lane and iteration of the lane loop (_lane_step). More rows in
# flight pay where the registers allow: rows of one column take eight,
# uncapped; rows of 4 columns of 2- and 4-byte types take eight under a cap of
# 64 registers (uncapped, eight cost blocks per SM and lost). The cap spills
# on other widths, on fp64 and on the multi-warp shapes, which keep four rows.
# ROCm ignores the cap, and torch.compile drops it (Inductor rebuilds the
# configs of user kernels without maxnreg), so traced calls keep four rows
# too. The kernel has grown since, and the capped 64-segment shapes spill a
# little; four rows there, without spills, tied.
# Measurements: docs/kernel-notes.md, "_LANE_CAP_REGISTERS".
_LANE_CAP_REGISTERS = 64


def _lane_step(
    inner: int, element_size: int, length_class: int, *, can_cap: bool
) -> tuple[int, bool]:
    """(rows per lane and iteration, whether the register cap applies); can_cap
    is False where the cap would be dropped (traced calls)."""
    if inner == 1:
        return 8, False
    if can_cap and inner == 4 and element_size <= 4 and length_class < _LANE_GIANT_CLASS:
        return 8, True
    return 4, False


# maxnreg is a setting of each config, so the capped configs have a tuner of
# their own.
_LANE_KERNELS = {
    capped: triton.autotune(
        configs=_lane_configs(_LANE_CAP_REGISTERS if capped else None),
        key=["INNER", "IS_FP64", "length_class"],
        prune_configs_by={"early_config_prune": _prune_lane_configs},
        reset_to_zero=["ws_ptr"],
    )(_segment_sum_lanes_kernel)
    for capped in (False, True)
}


# The wide lanes' block is set by the row width, so their tuners try chunk
# sizes and rows per lane and iteration (4 and 8 each won on some width).
# num_warps is a setting of each config: one tuner per warp count. FAST_TILES
# is set by the row width too (_wide_lane_shape), so it is passed at launch.
# Measurements: docs/kernel-notes.md, "_WIDE_LANE_KERNELS".
_WIDE_LANE_KERNELS = {
    warps: triton.autotune(
        configs=[
            triton.Config(
                {
                    "CHUNK_ROWS": chunk,
                    "LANE_STEP": step,
                    "WALK_ONLY": False,
                    "MID_FROM": 0,
                    "MID_ROWS": 0,
                },
                num_warps=warps,
            )
            for chunk in (256, 512, 1024)
            for step in (4, 8)
        ],
        key=["INNER", "IS_FP64", "length_class"],
        reset_to_zero=["ws_ptr"],
    )(_segment_sum_lanes_kernel)
    for warps in (1, 2)
}


def _wide_lane_shape(
    rows: int, segments: int, inner: int, block_cols: int, element_size: int
) -> tuple[int, int, int, int] | None:
    """(segments per block, elements per rest tile, warps, tiles per step of
    _walk_inside; see _WIDE_FAST_BYTES) where rows wider than
    _LANE_MAX_COLS columns take the lane kernel, else None: fp32, fp16 and bf16
    rows of one column block (block_cols columns) up to _WIDE_LANE_MAX_BYTES,
    over segments of a mean under _WALK_ROWS rows (shapes only, so no sync;
    symbolic shapes count as short)."""
    if inner <= _LANE_MAX_COLS or inner > block_cols:
        return None
    row_bytes = block_cols * element_size
    if row_bytes > _WIDE_LANE_MAX_BYTES.get(element_size, 0):
        return None
    concrete = all(isinstance(v, int) for v in (rows, segments))
    if concrete and rows >= _WALK_ROWS * max(segments, 1):
        return None
    if row_bytes <= _NARROW_ROW_BYTES:
        segs, elements, warps = _WIDE_LANE_BYTES // row_bytes, _WIDE_LANE_BYTES // element_size, 1
    else:
        warps = 1 if row_bytes <= _ONE_WARP_ROW_BYTES else 2
        segs, elements = _WIDE_ROW_SEGS, _WIDE_REST_ROWS * block_cols
    fast_tiles = max(_WIDE_FAST_BYTES * warps // (elements * element_size), 2)
    return segs, elements, warps, fast_tiles


def forget_tuning() -> None:
    """Forget the tile shapes tuned so far: the next call of each shape class
    tunes again, on its own input."""
    for kernel in (*_KERNELS.values(), *_LANE_KERNELS.values(), *_WIDE_LANE_KERNELS.values()):
        kernel.cache.clear()


def _length_class(rows, segments, inner) -> int:
    """log2 of the mean segment's elements (in one column block): shapes only,
    so no sync. 0 while tracing with symbolic sizes."""
    if not all(isinstance(v, int) for v in (rows, segments, inner)):
        return 0
    elements = rows * min(inner, _MAX_BLOCK_COLS) // max(segments, 1)
    return max(elements, 1).bit_length() - 1


def _traced(*tensors: Tensor) -> bool:
    """Whether this call is being traced (torch.compile, make_fx, export, fake or
    functional tensors) rather than run eagerly on real tensors."""
    return (
        torch.compiler.is_compiling()
        or torch._C._len_torch_dispatch_stack() > 0
        or any(type(t) is not torch.Tensor for t in tensors)
    )


def _fits32(count) -> bool:
    """Whether a count of rows or segments is below 2^31 (shapes only; False
    for symbolic ones): with fewer rows, the lane kernel takes its segments'
    bounds relative to a chunk in 32 bits (ROWS32); with fewer segments, the
    wide lanes count their blocks in 32 bits (SEGS32). The 64-bit clamps of
    the next block's bounds cost about 30 instructions per block (offline,
    sm_90, bf16, 1 column, block overhead outside its loops: 141 -> 110, with
    the mid path 158 -> 126; timed only together with the lane kernel's other
    changes, see _LANE_MID_SHAPES)."""
    return isinstance(count, int) and count < 2**31 - 1


def _slot_rows(configs, traced: bool) -> int:
    """Rows per workspace slot: the largest that divides every chunk among
    `configs`, those the tuner may pick for this call (the chunks are powers
    of two: the shortest). The workspace is zeroed on every call and the
    finish kernel reads all of its flags, so it costs time in proportion to
    rows / SLOT_ROWS: rows of one column (chunks of 4096 rows or more below the
    giant class) take 16 times fewer slots than at _SLOT_ROWS. Traced calls
    keep _SLOT_ROWS, which divides every chunk: torch.compile prunes the
    configs of user kernels itself, with symbolic sizes seen as 0."""
    if traced or not configs:
        return _SLOT_ROWS
    return math.gcd(*(c.kwargs["CHUNK_ROWS"] for c in configs))


def _tuned_configs(kernel, named_args: dict, **kwargs) -> list[triton.Config]:
    """The configs `kernel`'s autotuner may run on a call: all of them after its
    own early pruning (the same function, on the same arguments), or its only
    one, which it runs unpruned."""
    prune = getattr(kernel, "early_config_prune", None)
    if len(kernel.configs) == 1 or prune is None:
        return kernel.configs
    return prune(kernel.configs, named_args, **kwargs)


def _early_launch(x: Tensor, traced: bool) -> bool:
    """Whether the finish kernel launches before the sum's kernel ends, to wait
    for it on the device (programmatic dependent launch: sm_90 and later, CUDA
    only). The CUDA sums do the same (csrc/cuda/segment_kernels.cuh, before
    allow_dependents), where a build may run older PTX without the wait;
    Triton compiles for the device it runs on, so its kernels have it there,
    unless TRITON_OVERRIDE_ARCH names another architecture. Launched as usual:
    traced calls (torch.compile rebuilds the launches of user kernels without
    Triton's launch options), the interpreter (it has no gdc), and calls under
    CUDA graph capture (which keeps such launches only from driver 12.3 on, a
    version not asked here)."""
    runtime = triton.knobs.runtime
    return (
        not traced
        and gdc_wait is not None
        and x.is_cuda
        and torch.version.hip is None
        and not runtime.interpret
        and not runtime.override_arch
        and not torch.cuda.is_current_stream_capturing()
        and _capability_major(x.device.index) >= 9
    )


@functools.cache
def _capability_major(index: int) -> int:
    """A device's compute capability major, asked once: every eager call asks, and
    get_device_capability took 6.5 us of the call's 170 us of host time (H200, Triton
    3.6, rows of 1 column), where the CUDA op's whole call takes 25."""
    return torch.cuda.get_device_capability(index)[0]


def _launch(x: Tensor, indptr: Tensor, out: Tensor) -> None:
    """Sum `x` ([rows, inner] contiguous) into `out` ([segments, inner], non-empty)."""
    rows, inner, segments = x.shape[0], x.shape[1], out.shape[0]
    is_fp64 = x.dtype == torch.float64
    flag_words = 1 if is_fp64 else 2  # int64 flags in an fp64 / fp32 buffer
    block_cols = _block_cols(inner)
    # wrap_triton shows the launches to tracers, at about 0.4 ms of host time per
    # call when run eagerly (more than the kernels take on 512 MiB of an H100),
    # so an eager call launches the kernels directly.
    traced = _traced(x, indptr, out)
    launcher = torch.library.wrap_triton if traced else lambda kernel: kernel
    length_class = _length_class(rows, segments, inner)
    # The kernel, its shape constants, and whether it takes `inner` as an argument
    # (the lane kernels take it as the constexpr INNER, which specializes traced
    # shapes on it).

    def lane_shape(**more: object) -> dict[str, object]:
        return dict(
            INNER=int(inner),
            ROWS32=_fits32(rows),
            SEGS32=_fits32(segments),
            WALK_ROWS=_WALK_ROWS,
            **more,
        )

    if inner <= _LANE_MAX_COLS:
        lane_step, capped = _lane_step(inner, x.element_size(), length_class, can_cap=not traced)
        kernel = _LANE_KERNELS[capped]
        shape = lane_shape(
            LANE_ROWS=_LANE_ROWS_ONE_COLUMN if inner == 1 else _LANE_ROWS,
            LANE_STEP=lane_step,
        )
        candidates = _tuned_configs(kernel, {"length_class": length_class}, INNER=inner)
    elif (
        wide := _wide_lane_shape(rows, segments, inner, block_cols, x.element_size())
    ) is not None:
        block_segs, row_elements, warps, fast_tiles = wide
        kernel = _WIDE_LANE_KERNELS[warps]
        shape = lane_shape(
            BLOCK_SEGS=block_segs,
            LANE_ROWS=_WIDE_LANE_ROWS,
            ROW_ELEMENTS=row_elements,
            FAST_TILES=fast_tiles,
        )
        candidates = _tuned_configs(kernel, {"length_class": length_class}, INNER=inner)
    else:
        kernel = _KERNELS[block_cols]
        candidates = _tuned_configs(kernel, {"inner": inner, "length_class": length_class})
        shape = dict(EVEN_COLS=inner % block_cols == 0)
    slot_rows = _slot_rows(candidates, traced)
    pdl = _early_launch(x, traced)
    slots = rows // slot_rows + 1
    ws = torch.zeros(
        slots * (flag_words + inner),
        dtype=torch.float64 if is_fp64 else torch.float32,
        device=x.device,
    )

    def grid(meta):
        return (rows // meta["CHUNK_ROWS"] + 1, triton.cdiv(inner, block_cols))

    constants = dict(
        IS_FP64=is_fp64,
        FLAG_WORDS=flag_words,
        SLOT_ROWS=slot_rows,
        FANOUT=_FANOUT,
        BLOCK_COLS=block_cols,
        PDL=pdl,
    )
    sizes = (rows, segments, slots) if "INNER" in shape else (rows, segments, inner, slots)
    launcher(kernel)[grid](x, indptr, out, ws, *sizes, length_class, **shape, **constants)
    finish_cols = min(block_cols, 32)
    early = dict(launch_pdl=True) if pdl else {}
    launcher(_finish_kernel)[(triton.cdiv(slots, 128),)](
        ws,
        out,
        segments,
        inner,
        slots,
        FLAG_WORDS=flag_words,
        BLOCK_SLOTS=128,
        BLOCK_COLS=finish_cols,
        PDL=pdl,
        num_warps=4,
        **early,
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
