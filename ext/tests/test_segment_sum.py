"""Kernel tests, run on CPU and (marked gpu) on CUDA/ROCm."""

import math

import pytest
import torch
from torch.library import opcheck

import segment_ops

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
# (rtol, atol) against a float64 reference computed from the same inputs: the
# half types accumulate in float32, so beyond accumulation error (allowed for
# in assert_matches) only the final rounding to the output dtype shows.
TOLERANCE = {
    torch.float64: (1e-12, 1e-12),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}
# name -> segment lengths
LAYOUTS = {
    "mixed": [3, 0, 1, 7, 0, 0, 2],
    "empty_ends": [0, 4, 0],
    "all_empty": [0, 0, 0],
    "one_huge": [1 << 17],
    "many_tiny": [1] * 5000 + [0, 2] * 500,
    "no_rows": [0],
    "no_segments": [],
}


def triton_or_skip():
    """segment_ops._triton where triton is installed, else a skip; an ImportError of the
    module's own (a name gone from .ops, say) fails the test instead of skipping it."""
    pytest.importorskip("triton")
    from segment_ops import _triton

    return _triton


def make_indptr(lengths, device="cpu"):
    return torch.tensor([0, *lengths], dtype=torch.int64, device=device).cumsum(0)


def reference(src, indptr):
    """Plain float64 segment sum: index_add of each row into its segment."""
    segments = indptr.numel() - 1
    ids = torch.repeat_interleave(torch.arange(segments, device=indptr.device), indptr.diff())
    out = torch.zeros((segments, *src.shape[1:]), dtype=torch.float64, device=src.device)
    return out.index_add_(0, ids, src.double())


def assert_matches(out, src, indptr):
    assert out.dtype == src.dtype and out.device == src.device
    assert out.shape == (indptr.numel() - 1, *src.shape[1:])
    rtol, atol = TOLERANCE[src.dtype]
    # Summing L terms in [-1, 1] one by one drifts by roughly eps * L / 8 (a
    # random walk of rounding errors); allow 2 * eps * L.
    longest = int(indptr.diff().max()) if indptr.numel() > 1 else 0
    eps = torch.finfo(torch.float64 if src.dtype == torch.float64 else torch.float32).eps
    atol += 2 * eps * longest
    torch.testing.assert_close(out.double(), reference(src, indptr), rtol=rtol, atol=atol)


def random_src(rows, trailing, dtype, device):
    return (
        torch.rand((rows, *trailing), dtype=torch.float64, device=device).mul_(2).sub_(1).to(dtype)
    )


def assert_sum(indptr, trailing, dtype):
    """segment_sum of random rows in [-1, 1] against the float64 reference."""
    src = random_src(int(indptr[-1]), trailing, dtype, indptr.device)
    assert_matches(segment_ops.segment_sum(src, indptr), src, indptr)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layouts_and_dtypes(device, layout, dtype):
    assert_sum(make_indptr(LAYOUTS[layout], device), (3,), dtype)


@pytest.mark.parametrize("trailing", [(), (1,), (5,), (4, 3), (2, 0), (64,), (300,)])
def test_trailing_shapes(device, trailing):
    assert_sum(make_indptr([2, 0, 300, 1], device), trailing, torch.float32)


@pytest.mark.parametrize("inner", [1, 2, 3, 16, 256])
def test_long_segments(device, inner):
    # Long segments with few columns take the GPU's block-per-segment path.
    assert_sum(make_indptr([5000, 0, 700, 1], device), (inner,), torch.float32)


def test_non_contiguous(device):
    indptr = make_indptr([4, 0, 6], device)
    base = random_src(20, (8,), torch.float32, device)
    for src in (base[::2], base[:10].t().contiguous().t(), base[:10, ::3], base[:1].expand(10, 8)):
        assert not src.is_contiguous()
        assert_matches(segment_ops.segment_sum(src, indptr), src, indptr)
    strided_indptr = torch.stack([indptr, indptr], 1)[:, 0]
    assert not strided_indptr.is_contiguous()
    assert_matches(segment_ops.segment_sum(base[:10], strided_indptr), base[:10], indptr)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_torch_segment_reduce(device, dtype):
    indptr = make_indptr(LAYOUTS["mixed"], device)
    src = random_src(int(indptr[-1]), (4,), dtype, device)
    expected = torch.segment_reduce(src, "sum", offsets=indptr, axis=0)
    torch.testing.assert_close(segment_ops.segment_sum(src, indptr), expected)


def power_law(rows, alpha=1.1, seed=0):
    """Pareto segment lengths (>= 1) summing to `rows`: a few huge, most length 1."""
    g = torch.Generator().manual_seed(seed)
    lengths = (1 - torch.rand(rows, generator=g, dtype=torch.float64)).pow(-1 / alpha).floor()
    lengths = lengths.long().clamp(max=rows)
    ends = lengths.cumsum(0)
    keep = lengths[ends <= rows].tolist()
    return keep + ([rows - sum(keep)] if sum(keep) < rows else [])


# Lengths that stress how the GPU kernels split work: many short, long, a power law, long
# on average but mostly short (several segments end inside one read of the long-segment
# kernels), one segment longer than any block's share, each with empty segments inside,
# and a crowd of empty segments a few rows before a long segment ends. The sums give each
# block an equal share of rows and segments, so the crowd holds most blocks' ends: they
# own no rows, and the long segment's partials cross them.
LAWS = {
    "short": [1 + (i * 7) % 16 for i in range(3000)] + [0, 0],
    "long": [0, *(512 + (i * 331) % 1025 for i in range(40)), 0],
    "power": power_law(1 << 16),
    "lumpy": [3000 + (i * 977) % 5000 if i % 10 == 0 else i % 5 for i in range(200)],
    "giant": [0, 1 << 18, 0],
    "crowd": [5003, *[0] * 200_000, 4997],
}


# The GPU kernels pick a strategy per width and law: all of them (40 columns: rows of
# whole 16-byte units, but not a power of two of them; 33: rows of single elements, which
# the stream sum reads further ahead on some GPUs). The CPU kernel has one strategy, and
# the narrower cases cover it.
LAW_CASES = [
    pytest.param(device, law, inner, id=f"{device}-{law}-{inner}",
                 marks=[pytest.mark.gpu] if device == "cuda" else [])
    for device in ("cpu", "cuda")
    for law in LAWS
    for inner in (1, 3, 4, 32, 33, 40, 64, 256)
    if device == "cuda" or (inner <= 32 and law != "giant")
]


def assert_sum_and_gather(indptr, inner, dtype):
    """segment_sum against the reference, segment_gather against repeat_interleave."""
    assert_sum(indptr, (inner,), dtype)
    rows = int(indptr[-1])
    grad = random_src(indptr.numel() - 1, (inner,), dtype, indptr.device)
    expected = grad.repeat_interleave(indptr.diff(), dim=0, output_size=rows)
    assert torch.equal(segment_ops.segment_gather(grad, indptr, rows), expected)


@pytest.mark.parametrize(("device_name", "law", "inner"), LAW_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_laws_and_widths(device_name, law, inner, dtype):
    assert_sum_and_gather(make_indptr(LAWS[law], torch.device(device_name)), inner, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize(("dtype", "inner"), [(torch.float32, 64), (torch.bfloat16, 32)])
def test_misaligned_views(dtype, inner):
    """Vector loads need aligned rows. Views that start 0, 1 or 2 elements into
    their storage (contiguous, so only the pointer's alignment differs): 1 element
    leaves bf16 rows 2-byte aligned (no pairs) and fp32 rows 4-byte aligned (no
    8-byte packs), so the sum must fall back to single elements; 0 and 2 keep the
    vector loads those rows take."""
    indptr = make_indptr([3, 0, 5, 9], "cuda")
    rows = int(indptr[-1])
    flat = random_src(rows * inner + 2, (), dtype, "cuda")
    for offset in (0, 1, 2):
        x = flat[offset : offset + rows * inner].view(rows, inner)
        assert_matches(segment_ops.segment_sum(x, indptr), x, indptr)


def test_gather_is_the_backward_layout(device):
    indptr = make_indptr([2, 0, 3], device)
    grad = torch.arange(6.0, device=device).reshape(3, 2)
    out = segment_ops.segment_gather(grad, indptr, 5)
    expected = grad[torch.tensor([0, 0, 2, 2, 2], device=device)]
    torch.testing.assert_close(out, expected)


@pytest.mark.parametrize(
    "make_args, message",
    [
        (
            lambda d: (
                torch.ones(3, 2, device=d),
                torch.tensor([0, 3], dtype=torch.int32, device=d),
            ),
            "indptr must be int64",
        ),
        (
            lambda d: (torch.ones(3, 2, device=d), torch.tensor([0, 2, 1, 3], device=d)),
            "indptr must be non-decreasing",
        ),
        (
            lambda d: (torch.ones(3, 2, device=d), torch.tensor([1, 3], device=d)),
            r"indptr\[0\] must be 0",
        ),
        (
            lambda d: (torch.ones(3, 2, device=d), torch.tensor([0, 2], device=d)),
            r"indptr\[-1\] must equal src.size\(0\) \(3\), got 2",
        ),
        (
            lambda d: (torch.ones(3, 2, device=d), torch.tensor([[0, 3]], device=d)),
            "indptr must be 1-D",
        ),
        (
            lambda d: (torch.ones(3, 2, device=d), torch.tensor([], dtype=torch.int64, device=d)),
            "indptr must be 1-D with at least one element",
        ),
        (
            lambda d: (
                torch.ones(3, 2, dtype=torch.int32, device=d),
                torch.tensor([0, 3], device=d),
            ),
            "src must be float32, float64, float16 or bfloat16",
        ),
        (
            lambda d: (torch.tensor(1.0, device=d), torch.tensor([0, 1], device=d)),
            "src must have at least one dimension",
        ),
    ],
)
def test_bad_input(device, make_args, message, monkeypatch):
    # On GPUs indptr's values are checked only on request (a device-to-host copy).
    monkeypatch.setattr(segment_ops.ops, "CHECK_INDPTR", True)
    src, indptr = make_args(device)
    with pytest.raises(RuntimeError, match=message):
        segment_ops.segment_sum(src, indptr)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "offsets",
    [
        [0, 5, 3, 8],
        [-7, 2, 8],
        [0, 4, 1 << 40],
        [3, 3, 3],
        [0, -(1 << 40), 8],
        # Thousands of starts in one tile, none repeated next to another: the
        # gather counts them per warp instead of checking that they are sorted.
        pytest.param([0, 5] * 3000 + [8], id="alternating"),
        # A start 2^32 rows past its end: a 32-bit length would wrap positive.
        pytest.param([10 * i if i != 5 else (1 << 32) - 10 for i in range(101)], id="wrap32"),
    ],
)
@pytest.mark.parametrize("inner", [1, 4, 64])
@pytest.mark.parametrize("backend", segment_ops.ops.BACKENDS)
def test_unchecked_bad_indptr_stays_in_bounds(offsets, inner, backend):
    """Without the checks a bad indptr gives wrong sums, never an illegal memory access
    (which would poison the CUDA context: the synchronize below would raise)."""
    if backend == "triton":
        pytest.importorskip("triton")
    indptr = torch.tensor(offsets, device="cuda")
    src = torch.ones(max(8, indptr.numel() - 1), inner, device="cuda")
    segment_ops.segment_sum(src, indptr, backend=backend)
    segment_ops.segment_gather(src[: indptr.numel() - 1], indptr, 8)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inner", [1, 4])
def test_unchecked_start_past_its_tile_stays_in_bounds(dtype, inner):
    """A tile's starts mostly 0 and 1, then one round that takes a start far past
    the tile before the entries return to it: the tile sum, which finds a closed
    segment's sum in shared memory at its next start, must not look there for a
    start outside the tile (it once read hundreds of KB past its sums)."""
    rows, segments = 200_000, 27_000
    head = [i & 1 for i in range(2048)] + [100_000, 100_001, 0, 1, 0]
    tail = torch.linspace(100_002, rows, segments + 1 - len(head)).long()
    indptr = torch.cat([torch.tensor(head), tail]).to("cuda")
    src = torch.ones(rows, inner, device="cuda", dtype=dtype)
    segment_ops.segment_sum(src, indptr)
    segment_ops.segment_gather(src[:segments], indptr, rows)
    torch.cuda.synchronize()


def spiky(segments):
    """Short segments and a long one every 100th (33 to 4032 rows): a short mean, and
    on 2^17 segments some of each kind the CUDA lane sum tells apart (summed by a
    lane, by a team, by the block)."""
    return [33 + (i * 389) % 4000 if i % 100 == 99 else 1 + (i * 7) % 16 for i in range(segments)]


# name -> segment lengths, built when a test asks: the large ones would otherwise be
# built at every collection, CPU-only ones included.
LANE_SUM_LAYOUTS = {
    "short": lambda: LAWS["short"],
    "power": lambda: LAWS["power"],
    "spiky": lambda: spiky(1 << 17),
    "big_power": lambda: power_law(1 << 21, seed=1),
    "mixed": lambda: LAYOUTS["mixed"],
    "many_tiny": lambda: LAYOUTS["many_tiny"],
    "empty_ends": lambda: LAYOUTS["empty_ends"],
}


# (dtype, columns): every row width of 4 to 16 bytes each dtype can make.
LANE_SUM_ROWS = [
    (dtype, row_bytes // dtype.itemsize)
    for dtype in DTYPES
    for row_bytes in (4, 8, 16)
    if row_bytes >= dtype.itemsize
]


def row_ids(rows):
    """Test ids for (dtype, columns) pairs: "bfloat16-4cols"."""
    return [f"{d}-{i}cols".replace("torch.", "") for d, i in rows]


def lengths_over(rows, pattern):
    """`pattern` repeated until it covers at least `rows` rows."""
    out, total = [], 0
    while total < rows:
        out += pattern
        total += sum(pattern)
    return out


# name -> segment lengths over at least 2^24 rows, enough bytes on rows of up to 4 bytes
# (1 or 2 columns of a 2-byte type, 1 of fp32) for the CUDA sum to sample indptr and pick
# the lane or the tile sum: short segments and a power law with every third segment empty
# take the lane sum, the power law the tile sum.
GATED_LAWS = {
    "short": lambda: lengths_over(1 << 24, [1 + (i * 7) % 16 for i in range(4096)]),
    "power": lambda: power_law(1 << 24, seed=2),
    "power_with_empties": lambda: [
        0 if i % 3 == 0 else n for i, n in enumerate(power_law(1 << 24, seed=3))
    ],
}


# name -> segment lengths over about `rows` rows, with starts where the GPU's
# narrow-row kernels cut their work.
EDGE_LAYOUTS = {
    # Crowds of empty segments at one row, more than a lane-sum stripe of segments.
    "crowds": lambda rows: lengths_over(rows, [0] * 300 + [1] + [0] * 70 + [5, 2] + [4] * 200),
    # Starts on tile, warp and block boundaries.
    "tile_aligned": lambda rows: lengths_over(rows, [512] * 7 + [256, 128, 64, 32, 16, 8, 8]),
    # One segment over many warps and blocks, short ones around it.
    "spanning": lambda rows: [2] * 2000 + [rows // 2 + 7] + [3] * (rows // 6) + [0, 0],
    # Short segments ending mid-tile, not on a multiple of 8 rows, then empty ones.
    "ragged": lambda rows: lengths_over(rows, [1 + (i * 7) % 16 for i in range(1000)])
    + [3, 0, 0],
    # Tiles of more one-row segments than threads in a block, with segments of over 32
    # rows among them (those a whole block fills in the gather of 16-byte rows).
    "rounds": lambda rows: lengths_over(rows, [1] * 300 + [33, 0, 40, 1] * 10 + [2] * 100),
}


NARROW_ROWS = [(torch.float32, 1), (torch.float32, 4), (torch.bfloat16, 1),
               (torch.bfloat16, 2), (torch.bfloat16, 4), (torch.bfloat16, 8)]


@pytest.mark.parametrize("layout", EDGE_LAYOUTS)
@pytest.mark.parametrize(
    "dtype, inner",
    NARROW_ROWS,
    ids=row_ids(NARROW_ROWS),
)
def test_narrow_rows_at_tile_and_block_edges(device, layout, dtype, inner):
    """Rows of 2 to 16 bytes, summed and gathered. On the GPU, 2^22 rows give the
    narrow kernels many tiles and blocks and spread the long segment over blocks."""
    rows = 1 << 22 if device.type == "cuda" else 1 << 18
    assert_sum_and_gather(make_indptr(EDGE_LAYOUTS[layout](rows), device), inner, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("law", GATED_LAWS)
@pytest.mark.parametrize(
    "dtype, inner",
    [(torch.bfloat16, 1), (torch.bfloat16, 2), (torch.float16, 1), (torch.float32, 1)],
)
def test_gated_narrow_sums(law, dtype, inner):
    assert_sum(make_indptr(GATED_LAWS[law](), "cuda"), (inner,), dtype)


# name -> segment lengths over at least 2^18 rows: enough bytes in rows of 128 bytes for
# the CUDA sum to take the team sum, its rows split by cost, on short segments: uniform,
# a power law, and a power law with a crowd of empty segments at one row.
SHORT_TEAM_LAWS = {
    "short": lambda: lengths_over(1 << 18, [1 + (i * 7) % 16 for i in range(4096)]),
    "power": lambda: power_law(1 << 18, seed=4),
    "power_and_crowd": lambda: power_law(1 << 17, seed=5) + [0] * 2000
    + power_law(1 << 17, seed=6) + [0, 0],
}


@pytest.mark.gpu
@pytest.mark.parametrize("law", SHORT_TEAM_LAWS)
@pytest.mark.parametrize(
    "dtype, inner", [(torch.float32, 32), (torch.bfloat16, 64), (torch.float64, 16)]
)
def test_short_team_sums(law, dtype, inner):
    assert_sum(make_indptr(SHORT_TEAM_LAWS[law](), "cuda"), (inner,), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LANE_SUM_LAYOUTS)
@pytest.mark.parametrize(
    "dtype, inner",
    LANE_SUM_ROWS,
    ids=row_ids(LANE_SUM_ROWS),
)
def test_lane_sum_rows(layout, dtype, inner):
    """Rows of 4 to 16 bytes over short segments take the CUDA lane sum (half types:
    rows of 4 columns or more; under 32 MiB their 2-column rows take the tile sum; fp32
    rows of 1 column under 32 MiB, as here: from there a sample of indptr picks, see
    test_gated_narrow_sums); rows under 16 bytes are read there both row by row (lanes)
    and as 16-byte units (teams, blocks). On CUDA, rows of 16 bytes are first copied into
    shared memory by the team wherever a stripe's segments are all short: every stripe
    of the short, many_tiny, mixed and empty_ends layouts (three copies per stripe on
    short), the stripes of spiky and power that hold no long segment."""
    assert_sum(make_indptr(LANE_SUM_LAYOUTS[layout](), "cuda"), (inner,), dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("inner", [1, 4, 64])
@pytest.mark.parametrize("mean_rows", [4, 512])  # the kernels for short and for long segments
@pytest.mark.parametrize("backend", segment_ops.ops.BACKENDS)
def test_unchecked_shuffled_indptr_stays_in_bounds(dtype, inner, mean_rows, backend):
    """The same over many tiles and blocks: shuffled offsets, some out of range, so
    the kernels see starts out of order, repeated and past the rows."""
    if backend == "triton":
        pytest.importorskip("triton")
    rows = 1 << 17
    generator = torch.Generator().manual_seed(inner)
    offsets = torch.randint(-8, rows + 8, (rows // mean_rows,), generator=generator)
    indptr = offsets.to("cuda")
    src = torch.ones(rows, inner, device="cuda", dtype=dtype)
    segment_ops.segment_sum(src, indptr, backend=backend)
    segment_ops.segment_gather(src[: indptr.numel() - 1], indptr, rows)
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.parametrize("backend", segment_ops.ops.BACKENDS)
def test_no_host_sync_and_cuda_graph_capture(backend):
    if backend == "triton":
        pytest.importorskip("triton")
    indptr = make_indptr([3, 0, 1, 700, 2, 0, 5000, 4], "cuda")
    src = random_src(int(indptr[-1]), (32,), torch.float32, "cuda")
    grad = random_src(indptr.numel() - 1, (32,), torch.float32, "cuda")
    segment_ops.segment_sum(src, indptr, backend=backend)  # compile / autotune outside capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any device-to-host sync raises
    try:
        segment_ops.segment_sum(src, indptr, backend=backend)
        segment_ops.segment_gather(grad, indptr, src.shape[0])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        summed = segment_ops.segment_sum(src, indptr, backend=backend)
        gathered = segment_ops.segment_gather(grad, indptr, src.shape[0])
    src.copy_(random_src(src.shape[0], (32,), torch.float32, "cuda"))
    graph.replay()
    assert_matches(summed, src, indptr)
    torch.testing.assert_close(gathered, grad.repeat_interleave(indptr.diff(), dim=0))


@pytest.mark.gpu
def test_compile_reduce_overhead(fresh_dynamo):
    def pooled(x, indptr):
        return segment_ops.segment_sum(x * 2, indptr).sum(dim=-1)

    compiled = torch.compile(pooled, mode="reduce-overhead", fullgraph=True)
    indptr = make_indptr([5, 0, 300, 7], "cuda")
    for _ in range(3):  # warm-up runs, then replays of the recorded graph
        x = torch.randn(int(indptr[-1]), 16, device="cuda")
        torch.testing.assert_close(compiled(x, indptr), pooled(x, indptr))


@pytest.mark.gpu
def test_mismatched_devices():
    src, indptr = torch.ones(3, 2, device="cuda"), torch.tensor([0, 3])
    with pytest.raises(RuntimeError, match="indptr must be on the same device as src"):
        segment_ops.segment_sum(src, indptr)
    with pytest.raises(RuntimeError, match="indptr must be on the same device as src"):
        segment_ops.segment_sum(src.cpu(), indptr.cuda())


def test_unknown_backend():
    with pytest.raises(ValueError, match="backend must be one of"):
        segment_ops.segment_sum(torch.ones(1), torch.tensor([0, 1]), backend="cupy")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layout", ["mixed", "no_rows", "no_segments"])
def test_opcheck(device, dtype, layout):
    indptr = make_indptr(LAYOUTS[layout], device)
    src = random_src(int(indptr[-1]), (3,), dtype, device).requires_grad_()
    opcheck(torch.ops.segment_ops.segment_sum.default, (src, indptr))
    grad = random_src(indptr.numel() - 1, (3,), dtype, device).requires_grad_()
    opcheck(torch.ops.segment_ops.segment_gather.default, (grad, indptr, src.shape[0]))


def test_gradcheck(device):
    indptr = make_indptr([2, 0, 3, 1], device)
    src = torch.randn(6, 2, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(segment_ops.segment_sum, (src, indptr))
    assert torch.autograd.gradgradcheck(segment_ops.segment_sum, (src, indptr))


def test_compile_fullgraph(device, fresh_dynamo):
    def pooled_norm(x, indptr):
        return segment_ops.segment_sum(x.relu(), indptr).norm(dim=-1)

    compiled = torch.compile(pooled_norm, fullgraph=True, dynamic=True)
    for lengths in ([2, 0, 3], [5, 1, 1, 4]):
        indptr = make_indptr(lengths, device)
        x = torch.randn(int(indptr[-1]), 4, device=device, requires_grad=True)
        out = compiled(x, indptr)
        torch.testing.assert_close(out, pooled_norm(x, indptr))
        out.sum().backward()
        assert x.grad is not None and x.grad.shape == x.shape


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["mixed", "one_huge", "many_tiny", "all_empty", "no_segments"])
# 2: the lane kernel (rows of up to 4 columns); 5 and 24: the walk, except
# where segments are short (mixed, many_tiny, all_empty) in rows of up to 64
# bytes (5 of fp32, both of the half types): the wide lanes (columns masked).
@pytest.mark.parametrize("inner", [2, 5, 24])
@pytest.mark.parametrize("dtype", DTYPES)
def test_triton_backend(layout, inner, dtype):
    pytest.importorskip("triton")
    indptr = make_indptr(LAYOUTS[layout], "cuda")
    src = random_src(int(indptr[-1]), (inner,), dtype, "cuda")
    assert_matches(segment_ops.segment_sum(src, indptr, backend="triton"), src, indptr)


@pytest.mark.gpu
@pytest.mark.parametrize("law", LAWS)
@pytest.mark.parametrize("inner", [1, 3, 4, 8, 20, 32, 64, 72, 200, 256, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_laws_and_widths(law, inner, dtype):
    # The Triton kernels are tuned per mean segment length: each law gets its own
    # tiles. Rows of up to 4 columns take the lane kernel (3: a masked column), and
    # so do rows of 8 columns to 64 bytes over short segments (bf16, 20: masked
    # columns; the short and power laws, and the crowd's empty segments around two
    # long ones that take the rest path), and wider rows in blocks of four segments
    # (fp32 32 columns; bf16 64 to 256: 72 masked on one warp, 200 masked on two).
    pytest.importorskip("triton")
    indptr = make_indptr(LAWS[law], "cuda")
    src = random_src(int(indptr[-1]), (inner,), dtype, "cuda")
    assert_matches(segment_ops.segment_sum(src, indptr, backend="triton"), src, indptr)


def test_triton_one_column_rows_skip_tiles_that_lost():
    # A power law shares its shape class (the mean segment length) with short
    # segments, so the autotuner may keep for one the tile that won on the
    # other: rows of one column only try the tiles that won on both.
    triton_module = triton_or_skip()
    configs = triton_module._lane_configs()
    prune = triton_module._prune_lane_configs
    kept = prune(configs, {"length_class": 3}, INNER=1)
    assert kept
    assert all(c.num_warps == 1 and c.kwargs["ROW_ELEMENTS"] >= 256 for c in kept)
    assert any(c.kwargs["ROW_ELEMENTS"] < 256 for c in prune(configs, {"length_class": 3}, INNER=4))
    assert prune(configs, {"length_class": triton_module._LANE_GIANT_CLASS}, INNER=1) == configs


def test_triton_walk_only_shapes_only_for_giant_segments():
    # A walk-only shape sums a chunk where many segments start far slower than
    # the lanes do, so only giant segments try it.
    triton_module = triton_or_skip()
    configs = triton_module._lane_configs()
    prune = triton_module._prune_lane_configs
    assert any(c.kwargs["WALK_ONLY"] for c in configs)
    for inner in (1, 4):
        below = prune(configs, {"length_class": triton_module._LANE_GIANT_CLASS - 1}, INNER=inner)
        assert below and not any(c.kwargs["WALK_ONLY"] for c in below)


def assert_each_shape_sums_right(monkeypatch, kernel, configs, src, indptr):
    """The tuner runs one shape per class, whichever wins on the GPU at hand:
    each of `configs` is made the kernel's only one, in turn, so all are checked."""
    assert configs
    for config in configs:
        monkeypatch.setattr(kernel, "configs", [config])
        monkeypatch.setattr(kernel, "cache", {})
        assert_matches(segment_ops.segment_sum(src, indptr, backend="triton"), src, indptr)


# Giant segments: chunks of 131072 rows that lie inside one segment (summed as
# a flat run, with a tail of fewer elements than a step: 73043 rows) and ones
# where a segment ends, or empty segments sit, among others.
WALK_INSIDE = [3, 2 * 131072 + 4099, 0, 7, 200_003]


@pytest.mark.gpu
@pytest.mark.parametrize("inner", [1, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_every_walk_only_shape_sums_right(monkeypatch, inner, dtype):
    triton_module = triton_or_skip()
    kernel = triton_module._LANE_KERNELS[False]
    indptr = make_indptr(WALK_INSIDE, "cuda")
    src = random_src(int(indptr[-1]), (inner,), dtype, "cuda")
    assert triton_module._length_class(src.shape[0], len(WALK_INSIDE), inner) >= (
        triton_module._LANE_GIANT_CLASS
    )
    walk_only = [c for c in kernel.configs if c.kwargs["WALK_ONLY"]]
    assert_each_shape_sums_right(monkeypatch, kernel, walk_only, src, indptr)


# Rows of one column for the mid path: lanes of up to MID_FROM rows, mid
# segments of up to MID_ROWS, longer and empty ones among them, at a mean
# segment length (35 rows) under which chunks take the lanes.
MID_MIX = ([1] * 10 + [2, 3, 5, 8, 13, 17, 20, 25, 33, 40, 70, 100, 128, 129, 300, 0]) * 400


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_every_mid_shape_sums_right(monkeypatch, dtype):
    triton_module = triton_or_skip()
    kernel = triton_module._LANE_KERNELS[False]
    indptr = make_indptr(MID_MIX, "cuda")
    src = random_src(int(indptr[-1]), (1,), dtype, "cuda")
    mid = [c for c in kernel.configs if c.kwargs["MID_FROM"]]
    assert_each_shape_sums_right(monkeypatch, kernel, mid, src, indptr)


class LaunchRecorder:
    """Stands in for a Triton kernel: `kernel[grid](...)` records (name, kwargs)
    into `launches` instead of launching. Standing in for an autotuned kernel
    (`like`), it offers that tuner's configs and pruning, which the launch reads
    to size the workspace's slots."""

    def __init__(self, name, launches, like=None):
        self.name, self.launches = name, launches
        if like is not None:
            self.configs = like.configs
            self.early_config_prune = getattr(like, "early_config_prune", None)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.args = args
            self.launches.append((self.name, kwargs))

        return launch


def test_triton_lane_register_cap_only_where_eight_rows_fit_under_it(monkeypatch):
    # Eight rows per lane on 4-column rows pay only under a 64-register cap,
    # which spills on other widths, fp64 and the multi-warp giant shapes, and
    # which torch.compile drops. The kernels are stand-ins: what is checked is
    # which tuner and LANE_STEP the launch picks, so no GPU is needed.
    triton_module = triton_or_skip()
    capped, uncapped = triton_module._LANE_KERNELS[True], triton_module._LANE_KERNELS[False]
    assert {c.maxnreg for c in capped.configs} == {triton_module._LANE_CAP_REGISTERS}
    assert {c.maxnreg for c in uncapped.configs} == {None}

    launches = []

    def recorder(name, like=None):
        return LaunchRecorder(name, launches, like)

    lane_kernels = {False: recorder("uncapped", uncapped), True: recorder("capped", capped)}
    monkeypatch.setattr(triton_module, "_LANE_KERNELS", lane_kernels)
    monkeypatch.setattr(triton_module, "_finish_kernel", recorder("finish"))
    monkeypatch.setattr(torch.library, "wrap_triton", lambda kernel: kernel)

    def lane_launch(dtype, inner, rows=64, traced=False):
        monkeypatch.setattr(triton_module, "_traced", lambda *tensors: traced)
        launches.clear()
        x = torch.zeros(rows, inner, dtype=dtype)
        triton_module._launch(x, torch.tensor([0, rows // 2, rows]), x.new_empty(2, inner))
        name, kwargs = launches[0]
        return name, kwargs["LANE_STEP"]

    assert lane_launch(torch.bfloat16, 4) == lane_launch(torch.float32, 4) == ("capped", 8)
    assert lane_launch(torch.bfloat16, 1) == lane_launch(torch.float32, 1) == ("uncapped", 8)
    assert lane_launch(torch.float64, 4) == lane_launch(torch.bfloat16, 3) == ("uncapped", 4)
    assert lane_launch(torch.bfloat16, 4, rows=1 << 16) == ("uncapped", 4)  # giant class
    assert lane_launch(torch.bfloat16, 4, traced=True) == ("uncapped", 4)


def test_triton_wide_lanes_only_for_short_segments_of_narrow_enough_rows(monkeypatch):
    # Rows of 5 columns to 64 bytes (fp32, fp16, bf16) take lanes over short
    # segments, blocks of 512 bytes a row (one 16-byte load per thread and row on
    # one warp); rows to 128 bytes (fp32) or 512 bytes (fp16, bf16) take blocks of
    # four segments, on two warps above 256 bytes. Wider rows, fp64 and long
    # segments keep the walk. Chunks inside one segment walk 2 KB a warp a step
    # (FAST_TILES tiles), at least two tiles. Stand-in kernels: no GPU needed.
    triton_module = triton_or_skip()
    launches = []

    def recorder(name, like=None):
        return LaunchRecorder(name, launches, like)

    walk_tuners = triton_module._KERNELS
    walks = {cols: recorder(f"walk {cols}", tuner) for cols, tuner in walk_tuners.items()}
    monkeypatch.setattr(triton_module, "_KERNELS", walks)
    lane_tuners = triton_module._LANE_KERNELS
    lanes = {capped: recorder("lanes", lane_tuners[capped]) for capped in (False, True)}
    monkeypatch.setattr(triton_module, "_LANE_KERNELS", lanes)
    wide_tuners = triton_module._WIDE_LANE_KERNELS
    wide = {1: recorder("wide", wide_tuners[1]), 2: recorder("wide, 2 warps", wide_tuners[2])}
    monkeypatch.setattr(triton_module, "_WIDE_LANE_KERNELS", wide)
    monkeypatch.setattr(triton_module, "_finish_kernel", recorder("finish"))
    monkeypatch.setattr(triton_module, "_traced", lambda *tensors: False)

    def picked(dtype, inner, mean_rows):
        launches.clear()
        rows = 64 * mean_rows
        x = torch.zeros(rows, inner, dtype=dtype)
        indptr = torch.arange(0, rows + 1, mean_rows)
        triton_module._launch(x, indptr, x.new_empty(64, inner))
        name, kwargs = launches[0]
        if name.startswith("walk"):
            assert name == f"walk {kwargs['BLOCK_COLS']}"  # the tuner of the launched block
            return "walk"
        if not name.startswith("wide"):
            return name
        shape = kwargs["BLOCK_SEGS"], kwargs["ROW_ELEMENTS"], kwargs["LANE_ROWS"]
        return name, *shape, kwargs["FAST_TILES"]

    assert picked(torch.bfloat16, 32, 8) == picked(torch.float16, 32, 63) == ("wide", 8, 256, 16, 4)
    assert picked(torch.bfloat16, 20, 8) == ("wide", 8, 256, 16, 4)  # a block of 32 columns
    assert picked(torch.bfloat16, 8, 8) == picked(torch.bfloat16, 5, 8) == ("wide", 32, 256, 16, 4)
    assert picked(torch.float32, 16, 8) == picked(torch.float32, 9, 8) == ("wide", 8, 128, 16, 4)
    assert picked(torch.float32, 8, 8) == ("wide", 16, 128, 16, 4)
    assert picked(torch.bfloat16, 64, 8) == picked(torch.bfloat16, 33, 8) == ("wide", 4, 512, 16, 2)
    assert picked(torch.float32, 32, 8) == picked(torch.float32, 17, 8) == ("wide", 4, 256, 16, 2)
    assert picked(torch.bfloat16, 128, 8) == ("wide", 4, 1024, 16, 2)
    assert picked(torch.float16, 256, 8) == picked(torch.bfloat16, 200, 8) == (
        "wide, 2 warps", 4, 2048, 16, 2)
    assert picked(torch.bfloat16, 4, 8) == picked(torch.float32, 4, 8) == "lanes"
    assert picked(torch.bfloat16, 32, 64) == picked(torch.float32, 16, 64) == "walk"
    assert picked(torch.bfloat16, 256, 64) == "walk"
    assert picked(torch.float32, 33, 8) == picked(torch.float32, 64, 8) == "walk"
    assert picked(torch.bfloat16, 257, 8) == picked(torch.bfloat16, 300, 8) == "walk"
    assert picked(torch.float64, 8, 8) == "walk"


def test_triton_workspace_slots_divide_every_chunk_the_tuner_may_run(monkeypatch):
    # A chunk-crossing segment's partial goes to the slot of its start, so every
    # chunk the autotuner may run must be a whole number of slots; the slot is
    # as long as that allows (the workspace is zeroed and scanned per slot).
    # The oracle is triton's own pruning (Autotuner.prune_configs, with the
    # launch's positional and keyword arguments, as Autotuner.run calls it).
    triton_module = triton_or_skip()
    launches = []
    recorders = []

    def recorder(name, like):
        stand_in = LaunchRecorder(name, launches, like)
        recorders.append((stand_in, like))
        return stand_in

    for table in ("_KERNELS", "_LANE_KERNELS", "_WIDE_LANE_KERNELS"):
        tuners = getattr(triton_module, table)
        stand_ins = {key: recorder(f"{table} {key}", tuner) for key, tuner in tuners.items()}
        monkeypatch.setattr(triton_module, table, stand_ins)
    monkeypatch.setattr(triton_module, "_finish_kernel", LaunchRecorder("finish", launches))
    monkeypatch.setattr(torch.library, "wrap_triton", lambda kernel: kernel)

    def slot_and_chunks(dtype, inner, rows, segments, traced=False):
        monkeypatch.setattr(triton_module, "_traced", lambda *tensors: traced)
        launches.clear()
        x = torch.zeros(rows, inner, dtype=dtype)
        indptr = torch.linspace(0, rows, segments + 1).round().long()
        triton_module._launch(x, indptr, x.new_empty(segments, inner))
        name, kwargs = launches[0]
        stand_in, tuner = next((r, t) for r, t in recorders if r.name == name)
        if len(tuner.configs) > 1:
            # As Autotuner.run: the positional arguments name the first params.
            tuner.nargs = dict(zip(tuner.arg_names, stand_in.args, strict=False))
            try:
                pruned = tuner.prune_configs(kwargs)
            finally:
                tuner.nargs = None
        else:
            pruned = tuner.configs
        return kwargs["SLOT_ROWS"], {c.kwargs["CHUNK_ROWS"] for c in pruned}

    shapes = [  # dtype, inner, rows, segments
        (torch.bfloat16, 1, 1 << 16, (1 << 16) // 11),  # power-law mean
        (torch.float32, 1, 1 << 16, (1 << 16) // 8),
        (torch.bfloat16, 1, 1 << 16, 1),  # giant
        (torch.bfloat16, 4, 1 << 14, 1),
        (torch.float32, 4, 1 << 14, (1 << 14) // 8),
        (torch.float32, 32, 1 << 12, (1 << 12) // 8),
        (torch.bfloat16, 64, 1 << 12, 4),
        (torch.float32, 256, 1 << 10, 1),
        (torch.float64, 8, 1 << 12, (1 << 12) // 16),
    ]
    seen = {}
    for dtype, inner, rows, segments in shapes:
        slot, chunks = slot_and_chunks(dtype, inner, rows, segments)
        assert slot >= triton_module._SLOT_ROWS and all(c % slot == 0 for c in chunks), (
            dtype, inner, slot, chunks)
        assert slot == math.gcd(*chunks), (dtype, inner, slot, chunks)  # no shorter than needed
        seen[(dtype, inner, segments > 1)] = slot
        traced_slot, _ = slot_and_chunks(dtype, inner, rows, segments, traced=True)
        assert traced_slot == triton_module._SLOT_ROWS  # torch.compile prunes on its own
    # What the slots buy, as measured on the bench's shapes (4ec6b9c): rows of one
    # column take 4096-row slots, 4 columns of a giant segment 512, 32 columns 256.
    assert seen[(torch.bfloat16, 1, True)] == seen[(torch.float32, 1, True)] == 4096
    assert seen[(torch.bfloat16, 4, False)] == 512
    assert seen[(torch.float32, 32, True)] == 256


@pytest.mark.gpu
def test_triton_eager_call_launches_directly(monkeypatch):
    # wrap_triton costs about 0.4 ms of host time per eager call; only tracing needs it.
    pytest.importorskip("triton")

    def traced_only(kernel):
        raise AssertionError("wrap_triton used in an eager call")

    monkeypatch.setattr(torch.library, "wrap_triton", traced_only)
    indptr = make_indptr(LAYOUTS["mixed"], "cuda")
    src = random_src(int(indptr[-1]), (5,), torch.float32, "cuda")
    assert_matches(segment_ops.segment_sum(src, indptr, backend="triton"), src, indptr)


@pytest.mark.gpu
@pytest.mark.parametrize("inner", [4, 8, 64])  # the lane kernel, the wide lanes, the walk
@pytest.mark.parametrize("dynamic", [False, True])
def test_triton_backend_autograd_and_compile(inner, dynamic, fresh_dynamo):
    pytest.importorskip("triton")
    indptr = make_indptr([3, 0, 2], "cuda")
    src = torch.randn(5, inner, device="cuda", requires_grad=True)
    segment_ops.segment_sum(src, indptr, backend="triton").sum().backward()
    torch.testing.assert_close(src.grad, torch.ones_like(src))
    compiled = torch.compile(
        lambda x, i: segment_ops.segment_sum(x, i, backend="triton"),
        fullgraph=True,
        dynamic=dynamic,
    )
    torch.testing.assert_close(compiled(src, indptr), segment_ops.segment_sum(src, indptr))
    longer = make_indptr([3, 0, 2, 4], "cuda")
    more = torch.randn(9, inner, device="cuda")
    torch.testing.assert_close(compiled(more, longer), segment_ops.segment_sum(more, longer))


@pytest.mark.gpu
def test_triton_backend_bad_input(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(segment_ops.ops, "CHECK_INDPTR", True)
    with pytest.raises(RuntimeError, match="indptr must be non-decreasing"):
        segment_ops.segment_sum(
            torch.ones(3, device="cuda"),
            torch.tensor([0, 2, 1, 3], device="cuda"),
            backend="triton",
        )
