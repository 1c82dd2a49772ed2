#pragma once
// Torch-free CUDA kernels for CSR segment sums, shared by the TORCH_LIBRARY
// binding and the stable-ABI binding:
//
//   segment_sum:    out[s, :] = sum of src[r, :] over r in [indptr[s], indptr[s+1])
//                   (an empty segment gives zeros)
//   segment_gather: out[r, :] = src[s, :] for the segment s that holds row r
//                   (the backward of segment_sum; rows outside every segment get 0)
//
// Both are memory-bound, so the design goal is copy bandwidth whatever the
// segment lengths. Each block owns one contiguous, equally sized range of rows
// (one wave of blocks fills the GPU) and streams it in tiles of a few KB. A
// block finds its first segment with one search of indptr and then walks the
// segment boundaries forward, tile by tile, so a giant segment is spread over
// every SM and a million tiny ones cost no more than their bytes. Sums of
// segments that cross a block boundary are finished by a small second kernel
// from per-block partials in the caller's workspace, always in the same order:
// results are deterministic.
//
// ROCm builds hipify this header, so it keeps to the CUDA runtime, the fp16/bf16
// headers and cub block primitives (hipcub): no warp intrinsics, no inline PTX,
// no assumption about the warp size. Nothing here synchronizes with the host or
// allocates: the ops can be captured in a CUDA graph.
//
// indptr is never validated (that would need a device-to-host copy). Every
// value read from it is clamped into [0, rows]; a malformed indptr gives
// meaningless results but never an out-of-bounds access.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace segment_ops::cuda {
namespace detail {

constexpr int kThreads = 256;               // every kernel; a multiple of any warp size
constexpr int kMaxBlocksPerSm = 2048 / kThreads;  // no GPU keeps more than 2048 threads per SM
constexpr int kThreadBytes = 64;            // src bytes per thread and tile: 16 KB tiles
constexpr int kMaxRunRows = 16;             // rows per thread and tile, at most
constexpr int kFixupCols = 16;              // columns per fix-up block
constexpr int64_t kFixupBlocks = 16384;     // fix-up grid size to aim at (most blocks exit at once)
constexpr int64_t kMaxGridY = 65535;
constexpr int kMaxDevices = 64;

__host__ __device__ constexpr int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ constexpr int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
// Shared-memory index with one word of padding per 32: threads that read
// consecutive runs of 4..16 words then hit distinct banks.
__host__ __device__ constexpr int padded(int i) { return i + (i >> 5); }

// Accumulation type and conversions: the half types accumulate in float.
template <typename T>
struct Num;
template <>
struct Num<float> {
  using acc = float;
  static __device__ __forceinline__ float to_acc(float v) { return v; }
  static __device__ __forceinline__ float from_acc(float v) { return v; }
};
template <>
struct Num<double> {
  using acc = double;
  static __device__ __forceinline__ double to_acc(double v) { return v; }
  static __device__ __forceinline__ double from_acc(double v) { return v; }
};
template <>
struct Num<__half> {
  using acc = float;
  static __device__ __forceinline__ float to_acc(__half v) { return __half2float(v); }
  static __device__ __forceinline__ __half from_acc(float v) { return __float2half(v); }
};
template <>
struct Num<__nv_bfloat16> {
  using acc = float;
  static __device__ __forceinline__ float to_acc(__nv_bfloat16 v) { return __bfloat162float(v); }
  static __device__ __forceinline__ __nv_bfloat16 from_acc(float v) { return __float2bfloat16(v); }
};

template <typename T>
constexpr bool kSupported = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                            std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;

// W consecutive elements moved as one aligned load or store (up to 16 bytes).
template <typename T, int W>
struct alignas(sizeof(T) * W) Pack {
  T v[W];
};

template <typename T, int W>
__device__ __forceinline__ Pack<T, W> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, W>*>(p);
}

template <typename T, int W>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, W>& v) {
  *reinterpret_cast<Pack<T, W>*>(p) = v;
}

template <typename T, int W>
__device__ __forceinline__ Pack<T, W> zero_pack() {
  Pack<T, W> z;
#pragma unroll
  for (int k = 0; k < W; ++k) z.v[k] = Num<T>::from_acc(0);
  return z;
}

// Tile shape for elements T read W at a time (W = the whole row for narrow rows):
// each thread takes a run of kRunRows consecutive rows, kThreadBytes per tile.
template <typename T, int W>
struct Geometry {
  static constexpr int kPackBytes = W * static_cast<int>(sizeof(T));
  static constexpr int kRunRows =
      kThreadBytes / kPackBytes < kMaxRunRows ? kThreadBytes / kPackBytes : kMaxRunRows;
  static constexpr int kMaxTileRows = kThreads * kRunRows;
  static constexpr int kMarks = padded(kMaxTileRows - 1) + 1;
  // indptr entries each thread reads per round of the walk: one round covers
  // a tile of segments of 3 rows or more, a few rounds one of length-1 segments.
  static constexpr int kWalkSteps = (kRunRows < 4 ? kRunRows : 4) + 2;
  // Narrow rows are staged through shared memory as 32-bit words.
  static constexpr int kStageUnits = kRunRows * kPackBytes / 16;  // 16-byte loads per thread
  static constexpr int kStageWords = padded(kMaxTileRows * kPackBytes / 4 - 1) + 1;
};

__device__ __forceinline__ int64_t clamp_row(int64_t v, int64_t rows) {
  return v < 0 ? 0 : (v > rows ? rows : v);
}

__device__ __forceinline__ int64_t row_at(const int64_t* __restrict__ indptr, int64_t s,
                                          int64_t rows) {
  return clamp_row(indptr[s], rows);
}

// First s in [0, segments] with indptr[s] >= x (segments + 1 if none); the
// same answer in every thread. Each step probes kThreads evenly spaced entries
// at once, so 3 dependent loads cover 16M segments where a binary search
// would wait on 24.
__device__ inline int64_t block_lower_bound(const int64_t* __restrict__ indptr, int64_t segments,
                                            int64_t rows, int64_t x) {
  int64_t lo = 0, hi = segments + 1;  // the answer lies in [lo, hi]
  while (lo < hi) {
    const int64_t step = ceil_div(hi - lo, kThreads);
    const int64_t probe = lo + (threadIdx.x + 1) * step - 1;
    const bool below = probe < hi && row_at(indptr, probe, rows) < x;
    lo += static_cast<int64_t>(__syncthreads_count(below)) * step;
    hi = imin(hi, lo + step - 1);
  }
  return lo;
}

// Walks the segment starts of the tile [t0, t1), beginning at segment `first`,
// and returns the first segment that starts after the tile. Each start marks
// its first row in `marks` (tile-relative, as s - first + 1) with atomicMax:
// where empty segments share a row, the last start there wins, which is the
// non-empty segment or the end sentinel s == segments. Then on_empty(s) runs,
// in every lane of the group, for each empty segment: one whose row mark is
// not its own. Starts are split over `groups` groups of threads, `steps` per
// group in the first round and kSteps in any further one (only a crowd of
// empty segments needs those). The last tile of the array (t1 == rows) also
// takes the starts equal to rows.
template <int kSteps, typename OnEmpty, typename ReduceStorage>
__device__ __forceinline__ int64_t walk_starts(const int64_t* __restrict__ indptr,
                                               int64_t segments, int64_t rows, int64_t t0,
                                               int64_t t1, int64_t first, int steps, int g,
                                               int groups, bool active, bool lead, int* marks,
                                               ReduceStorage& reduce, int& broadcast,
                                               OnEmpty&& on_empty) {
  using Reduce = cub::BlockReduce<int, kThreads>;
  const int nrows = static_cast<int>(t1 - t0);
  const int last = t1 == rows ? nrows : nrows - 1;  // last tile-relative start taken
  // Tile-relative row of a start: -1 before the tile, nrows + 1 past its end.
  auto relative = [&](int64_t v) {
    return static_cast<int>(imin(imax(clamp_row(v, rows) - t0, -1), nrows + 1));
  };
  int64_t next = first;
  for (int round = 0;; ++round) {
    if (round > 0) __syncthreads();  // the previous round's empty checks read marks
    // This round reads starts next + off; 32-bit offsets keep registers low.
    const int room = static_cast<int>(imin(segments - next, INT_MAX));  // off <= room: a start
    const int64_t key0 = next - first + 1;  // mark of offset 0
    const bool keys_fit = key0 + kSteps * kThreads < INT_MAX;
    auto mark = [&](int off, int pos) {
      if (keys_fit && pos >= 0 && pos < nrows)
        atomicMax(&marks[padded(pos)], static_cast<int>(key0) + off);
    };
    int pos[kSteps];
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {  // issue every load before using any
      const int off = g + k * groups;
      pos[k] = active && k < steps && off <= room ? relative(indptr[next + off]) : nrows + 1;
    }
    // The start after this round's last one also marks: an empty last start
    // then sees that it is not the last at its row.
    const int after = steps * groups;
    if (threadIdx.x == 0 && after <= room) mark(after, relative(indptr[next + after]));
    int taken = 0;
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      if (pos[k] <= last) {
        ++taken;
        if (lead) mark(g + k * groups, pos[k]);
      }
    }
    // With a sorted indptr the starts taken are a prefix of this round's.
    const int total = Reduce(reduce).Sum(lead ? taken : 0);
    if (threadIdx.x == 0) broadcast = total;
    __syncthreads();  // also publishes the marks
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      const int off = g + k * groups;
      if (pos[k] <= last && pos[k] >= 0 && off < room &&
          (pos[k] == nrows || !keys_fit || marks[padded(pos[k])] != static_cast<int>(key0) + off))
        on_empty(next + off);
    }
    const int n = broadcast;
    next += n;
    if (n < steps * groups || next > segments) return next;
    steps = kSteps;
  }
}

// Number of walk steps for a tile expected to hold `expected` starts.
__device__ __forceinline__ int walk_steps(int64_t expected, int groups, int max_steps) {
  return static_cast<int>(imin(max_steps, imax(1, ceil_div(expected + expected / 4 + 2, groups))));
}

__device__ __forceinline__ int64_t starts_per_tile(int64_t segments, int64_t rows, int tile_rows) {
  const double per_row = static_cast<double>(segments + 1) / static_cast<double>(rows);
  return static_cast<int64_t>(per_row * tile_rows < 1e9 ? per_row * tile_rows : 1e9);
}

// ---------------------------------------------------------------------------
// Narrow rows (at most 16 bytes) are staged through shared memory: a warp
// loads 512 contiguous bytes per instruction, then each thread reads its run
// of rows from the padded word array without bank conflicts.

template <typename T>
__device__ __forceinline__ uint4 load_tail_unit(const T* p, int count) {
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  Pack<T, kVec> u = zero_pack<T, kVec>();
#pragma unroll
  for (int i = 0; i < kVec; ++i)
    if (i < count) u.v[i] = p[i];
  uint4 w;
  memcpy(&w, &u, 16);
  return w;
}

// The 16-byte units [0, bytes) of a tile starting at `base` (16-byte aligned).
template <int kUnits, typename T>
__device__ __forceinline__ void load_stage(uint4 (&staged)[kUnits], const T* base, int bytes) {
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int offset = (k * kThreads + static_cast<int>(threadIdx.x)) * 16;
    const T* p = reinterpret_cast<const T*>(reinterpret_cast<const char*>(base) + offset);
    if (offset + 16 <= bytes)
      staged[k] = *reinterpret_cast<const uint4*>(p);
    else if (offset < bytes)  // only the very end of src
      staged[k] = load_tail_unit(p, (bytes - offset) / static_cast<int>(sizeof(T)));
    else
      staged[k] = make_uint4(0, 0, 0, 0);
  }
}

template <int kUnits>
__device__ __forceinline__ void store_stage(uint32_t* stage, const uint4 (&staged)[kUnits]) {
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int w = 4 * (k * kThreads + static_cast<int>(threadIdx.x));
    stage[padded(w)] = staged[k].x;
    stage[padded(w + 1)] = staged[k].y;
    stage[padded(w + 2)] = staged[k].z;
    stage[padded(w + 3)] = staged[k].w;
  }
}

// Element e of the staged tile.
template <typename T>
__device__ __forceinline__ T stage_element(const uint32_t* stage, int e) {
  T v;
  if constexpr (sizeof(T) == 4) {
    const uint32_t w = stage[padded(e)];
    memcpy(&v, &w, 4);
  } else if constexpr (sizeof(T) == 2) {
    const uint32_t w = stage[padded(e >> 1)];
    const uint16_t h = static_cast<uint16_t>((e & 1) ? (w >> 16) : w);
    memcpy(&v, &h, 2);
  } else {
    const uint64_t w = static_cast<uint64_t>(stage[padded(2 * e)]) |
                       (static_cast<uint64_t>(stage[padded(2 * e + 1)]) << 32);
    memcpy(&v, &w, 8);
  }
  return v;
}

// ---------------------------------------------------------------------------
// segment_sum

// A partial sum tagged with the tile-relative mark of the last segment start
// it has seen (-1: none; 0: the segment open when the tile began). Combining
// restarts at the right operand's start, so a segmented sum is a plain scan.
template <typename Acc>
struct KeyedSum {
  int key;
  Acc v;
};

template <typename Acc>
struct KeyedSumOp {
  __device__ __forceinline__ KeyedSum<Acc> operator()(const KeyedSum<Acc>& a,
                                                      const KeyedSum<Acc>& b) const {
    return b.key >= 0 ? b : KeyedSum<Acc>{a.key, a.v + b.v};
  }
};

template <typename T, int W, bool kNarrow>
struct SumShared {
  using Acc = typename Num<T>::acc;
  using G = Geometry<T, W>;
  using Scan = cub::BlockScan<KeyedSum<Acc>, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  using Reduce = cub::BlockReduce<int, kThreads>;
  union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } prim;
  int count;
  int marks[G::kMarks];
  // Run partials as one sequence per column: column c's run g is
  // run_val[c * groups + g] with key run_key[g]; carry_val[c] is what the
  // column carries in from the previous tile. After the scan they hold the
  // inclusive sums within segments (and run_key the matching marks).
  int run_key[kThreads];
  Acc run_val[kThreads * W];
  Acc carry_val[kThreads * W];
  uint32_t stage[kNarrow ? G::kStageWords : 1];
};

// One block's row range for the column slab `slab`. Threads form `groups` groups
// of `lanes` threads, one lane per W-column pack of the slab (narrow rows: one
// thread per group, the whole row). Within a tile, group g sums its run of
// kRunRows consecutive rows sequentially; a segmented scan over the runs then
// gives each run the sum of the earlier rows of its first segment, and every
// segment's total is written by the thread whose run holds its last row.
template <typename T, int W, bool kNarrow>
__device__ __forceinline__ void sum_block(const T* __restrict__ src,
                                          const int64_t* __restrict__ indptr, T* __restrict__ out,
                                          int64_t rows, int64_t segments, int64_t inner,
                                          int64_t rows_per_block, int64_t slab,
                                          int64_t* __restrict__ head_key,
                                          int64_t* __restrict__ tail_key,
                                          typename Num<T>::acc* __restrict__ head_val,
                                          typename Num<T>::acc* __restrict__ tail_val,
                                          SumShared<T, W, kNarrow>& sm) {
  using Acc = typename Num<T>::acc;
  using G = Geometry<T, W>;
  using Item = KeyedSum<Acc>;
  using Scan = typename SumShared<T, W, kNarrow>::Scan;
  constexpr int kRun = G::kRunRows;
  const int tid = threadIdx.x;

  const int lanes = kNarrow ? 1 : static_cast<int>(imin(kThreads, inner / W - slab * kThreads));
  const int groups = kThreads / lanes;
  const int tile_rows = groups * kRun;
  const int g = tid / lanes, l = tid - g * lanes;
  const bool active = g < groups, lead = active && l == 0;
  const int64_t row_len = kNarrow ? W : inner;
  const int64_t col = kNarrow ? 0 : (slab * kThreads + l) * W;
  const int64_t block = blockIdx.x;
  const int64_t r0 = block * rows_per_block, r1 = imin(rows, r0 + rows_per_block);
  const int scan_len = lanes * W * groups;  // run partials, <= kThreads * W

  uint4 staged[kNarrow ? G::kStageUnits : 1];
  Pack<T, W> data[kNarrow ? 1 : kRun];
  auto load_tile = [&](int64_t t0) {
    const int64_t t1 = imin(r1, t0 + tile_rows);
    if constexpr (kNarrow) {
      load_stage(staged, src + t0 * W, static_cast<int>(t1 - t0) * G::kPackBytes);
    } else {
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        const int64_t r = t0 + g * kRun + j;
        data[j] = active && r < t1 ? load_pack<T, W>(src + r * inner + col) : zero_pack<T, W>();
      }
    }
  };

  for (int i = tid; i < G::kMarks; i += kThreads) sm.marks[i] = 0;
  for (int c = tid; c < lanes * W; c += kThreads) sm.carry_val[c] = 0;
  load_tile(r0);  // in flight during the search

  const int64_t first = block_lower_bound(indptr, segments, rows, r0);
  // The segment open at r0 that began in an earlier block: its partial sum
  // goes to the workspace (head); the fix-up kernel adds it to the owner's.
  const int64_t head =
      first >= 1 && first <= segments && row_at(indptr, first, rows) > r0 ? first - 1 : -1;
  if (slab == 0 && tid == 0 && head_key != nullptr) head_key[block] = head;
  int64_t carry = head >= 0 ? head : segments;  // segment open at the tile start
  int64_t next = first;                         // first segment start not walked yet
  int64_t expected = starts_per_tile(segments, rows, tile_rows);

  auto flush = [&](int64_t s, const Acc (&v)[W]) {
    if (s >= segments) return;  // rows before indptr[0] or from indptr[segments] on
    if (s == head) {
      Acc* dst = head_val + block * inner + col;
#pragma unroll
      for (int k = 0; k < W; ++k) dst[k] = v[k];
    } else {
      Pack<T, W> p;
#pragma unroll
      for (int k = 0; k < W; ++k) p.v[k] = Num<T>::from_acc(v[k]);
      store_pack(out + s * row_len + col, p);
    }
  };

  for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const int64_t t1 = imin(r1, t0 + tile_rows);
    const int nrows = static_cast<int>(t1 - t0);
    if constexpr (kNarrow) store_stage(sm.stage, staged);
    const int64_t tile_first = next;
    next = walk_starts<G::kWalkSteps>(
        indptr, segments, rows, t0, t1, tile_first, walk_steps(expected, groups, G::kWalkSteps), g,
        groups, active, lead, sm.marks, sm.prim.reduce, sm.count,
        [&](int64_t s) { store_pack(out + s * row_len + col, zero_pack<T, W>()); });
    expected = next - tile_first;
    auto segment = [&](int key) { return key == 0 ? carry : tile_first + key - 1; };
    if constexpr (kNarrow) {
      if (t0 + tile_rows < r1) load_tile(t0 + tile_rows);  // staged is free again
    }

    // Run rows are read twice (sum, then flush) instead of being held:
    // registers bound the resident blocks, and with them the bytes in flight.
    // Wide rows keep their marks in registers, as the group's lanes share them.
    int held[kNarrow ? 1 : kRun];
    if constexpr (!kNarrow) {
#pragma unroll
      for (int j = 0; j < kRun; ++j) held[j] = active ? sm.marks[padded(g * kRun + j)] : 0;
    }
    auto mark_at = [&](int j) {
      if constexpr (kNarrow) return sm.marks[padded(g * kRun + j)];
      else return held[j];
    };
    auto value = [&](int j, int k) -> Acc {
      if constexpr (kNarrow) {
        const int r = g * kRun + j;
        return r < nrows ? Num<T>::to_acc(stage_element<T>(sm.stage, r * W + k)) : Acc(0);
      } else {
        return Num<T>::to_acc(data[j].v[k]);
      }
    };

    // This run's own part: the rows after its last segment start.
    if (active) {
      int key = -1;
      Acc v[W];
#pragma unroll
      for (int k = 0; k < W; ++k) v[k] = 0;
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        if (const int m = mark_at(j)) {
          key = m;
#pragma unroll
          for (int k = 0; k < W; ++k) v[k] = 0;
        }
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] += value(j, k);
      }
#pragma unroll
      for (int k = 0; k < W; ++k) sm.run_val[(l * W + k) * groups + g] = v[k];
      if (l == 0) sm.run_key[g] = key;
    }
    __syncthreads();

    // Segmented scan of all columns' sequences at once, W consecutive entries
    // per thread. A column's carry (key 0) enters at its first run, and ends
    // whatever the column before it left open.
    {
      Item item[W];
      const int e0 = tid * W;
      int c = e0 / groups, r = e0 - c * groups;
#pragma unroll
      for (int i = 0; i < W; ++i) {
        item[i] = Item{-1, Acc(0)};
        if (e0 + i < scan_len) {
          item[i] = Item{sm.run_key[r], sm.run_val[e0 + i]};
          if (r == 0) item[i] = KeyedSumOp<Acc>()(Item{0, sm.carry_val[c]}, item[i]);
        }
        if (++r == groups) r = 0, ++c;
      }
      Scan(sm.prim.scan).InclusiveScan(item, item, KeyedSumOp<Acc>());
#pragma unroll
      for (int i = 0; i < W; ++i) {
        if (e0 + i < scan_len) sm.run_val[e0 + i] = item[i].v;
        if (e0 + i < groups) sm.run_key[e0 + i] = item[i].key;  // the same in every column
      }
    }
    __syncthreads();

    if (active) {
      // What runs before this one leave open: the column's carry for run 0.
      int key = g == 0 ? 0 : sm.run_key[g - 1];
      Acc v[W];
#pragma unroll
      for (int k = 0; k < W; ++k) {
        const int c = l * W + k;
        v[k] = g == 0 ? sm.carry_val[c] : sm.run_val[c * groups + g - 1];
      }
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        if (const int m = mark_at(j)) {  // the segment before this row is complete
          flush(segment(key), v);
          key = m;
#pragma unroll
          for (int k = 0; k < W; ++k) v[k] = 0;
        }
#pragma unroll
        for (int k = 0; k < W; ++k) v[k] += value(j, k);
      }
      if (lead) {
#pragma unroll
        for (int j = 0; j < kRun; ++j) sm.marks[padded(g * kRun + j)] = 0;
      }
    }
    if constexpr (!kNarrow) {
      if (t0 + tile_rows < r1) load_tile(t0 + tile_rows);  // in flight during the next walk
    }
    __syncthreads();
    // The segment still open at the tile's end carries into the next tile.
    carry = segment(sm.run_key[groups - 1]);
    for (int c = tid; c < lanes * W; c += kThreads)
      sm.carry_val[c] = sm.run_val[c * groups + groups - 1];
  }
  __syncthreads();

  // The segment open at r1: complete here, or a partial for the fix-up.
  bool crossing = false;
  if (carry < segments) crossing = row_at(indptr, carry + 1, rows) > r1;
  if (tid < lanes && carry < segments) {  // thread tid is lane tid of group 0
    Acc v[W];
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = sm.carry_val[tid * W + k];
    if (crossing && carry != head) {
      Acc* dst = tail_val + block * inner + col;
#pragma unroll
      for (int k = 0; k < W; ++k) dst[k] = v[k];
    } else {
      flush(carry, v);
    }
  }
  if (slab == 0 && tid == 0 && tail_key != nullptr)
    tail_key[block] = carry < segments && crossing && carry != head ? carry : -1;
}

// Resident blocks per SM the kernels are compiled for: registers, not shared
// memory, limit them, and resident blocks are what keeps bytes in flight.
constexpr int kSumBlocksPerSm(bool narrow) { return narrow ? 4 : 3; }
constexpr int kGatherBlocksPerSm = 4;

// Grid: x = row ranges (one per block, equal sizes, as many as fit on the GPU
// at once), y = column slabs of kThreads packs (only rows wider than
// kThreads * W elements have more than one). Rows are the unit of balance, so
// every segment-length law costs the same per byte.
template <typename T, int W, bool kNarrow>
__global__ void __launch_bounds__(kThreads, kSumBlocksPerSm(kNarrow))
    segment_sum_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                       T* __restrict__ out, int64_t rows, int64_t segments, int64_t inner,
                       int64_t rows_per_block, int64_t slabs, int64_t* __restrict__ head_key,
                       int64_t* __restrict__ tail_key, typename Num<T>::acc* __restrict__ head_val,
                       typename Num<T>::acc* __restrict__ tail_val) {
  __shared__ SumShared<T, W, kNarrow> sm;
  for (int64_t slab = blockIdx.y; slab < slabs; slab += gridDim.y) {
    sum_block<T, W, kNarrow>(src, indptr, out, rows, segments, inner, rows_per_block, slab,
                             head_key, tail_key, head_val, tail_val, sm);
    __syncthreads();
  }
}

// Finishes the segments that cross block boundaries. Block x handles the
// segment whose last partial block x holds (its tail) for kFixupCols columns:
// it adds the heads of the following blocks the segment spans, split over
// kThreads / kFixupCols threads per column and reduced in a fixed order. A
// giant segment thus costs one read of blocks x inner partials, spread over
// inner / kFixupCols blocks.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    segment_sum_fixup_kernel(const int64_t* __restrict__ indptr, T* __restrict__ out,
                             int64_t rows, int64_t segments, int64_t inner,
                             int64_t rows_per_block, int64_t blocks,
                             const int64_t* __restrict__ head_key,
                             const int64_t* __restrict__ tail_key,
                             const typename Num<T>::acc* __restrict__ head_val,
                             const typename Num<T>::acc* __restrict__ tail_val) {
  using Acc = typename Num<T>::acc;
  __shared__ Acc part[kThreads];
  const int64_t b = blockIdx.x;
  const int64_t s = tail_key[b];
  if (s < 0 || s >= segments) return;
  const int64_t end = row_at(indptr, s + 1, rows);
  const int64_t last = imin(blocks - 1, (imax(end, 1) - 1) / rows_per_block);
  const int64_t n = imax(0, last - b);  // blocks after b that hold part of s
  const int cols = static_cast<int>(imin(kFixupCols, inner));
  const int parts = kThreads / cols;
  const int tid = threadIdx.x, c = tid % cols, j = tid / cols;
  for (int64_t c0 = static_cast<int64_t>(blockIdx.y) * kFixupCols; c0 < inner;
       c0 += static_cast<int64_t>(gridDim.y) * kFixupCols) {
    const int64_t k = c0 + c;
    Acc acc = 0;
    if (j < parts && k < inner) {
#pragma unroll 4
      for (int64_t i = j; i < n; i += parts) {
        const int64_t bb = b + 1 + i;
        if (head_key[bb] == s) acc += head_val[bb * inner + k];
      }
    }
    part[tid] = acc;
    __syncthreads();
    if (tid < cols && k < inner) {
      Acc total = tail_val[b * inner + k];
      for (int q = 0; q < parts; ++q) total += part[q * cols + tid];
      out[s * inner + k] = Num<T>::from_acc(total);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// segment_gather

template <typename T, int W>
struct GatherShared {
  using G = Geometry<T, W>;
  using Scan = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  using Reduce = cub::BlockReduce<int, kThreads>;
  union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } prim;
  int count;
  int marks[G::kMarks];
  int row_key[G::kMarks];  // tile row -> segment (0: the one open at the tile start)
};

struct LastMark {
  __device__ __forceinline__ int operator()(int a, int b) const { return b >= 0 ? b : a; }
};

// Same row ranges and walk as segment_sum. Each tile first labels its rows
// with their segment (run-local, then a block scan carries labels across
// runs), then copies: narrow rows as 16-byte units of the output, wider rows
// with one lane per W-column pack and consecutive rows in consecutive groups,
// so every warp writes contiguous memory. Source rows are re-read by many
// output rows and mostly come from cache.
template <typename T, int W, bool kNarrow>
__device__ __forceinline__ void gather_block(const T* __restrict__ src,
                                             const int64_t* __restrict__ indptr,
                                             T* __restrict__ out, int64_t rows, int64_t segments,
                                             int64_t inner, int64_t rows_per_block, int64_t slab,
                                             GatherShared<T, W>& sm) {
  using G = Geometry<T, W>;
  using Scan = typename GatherShared<T, W>::Scan;
  constexpr int kRun = G::kRunRows;
  const int tid = threadIdx.x;

  const int lanes = kNarrow ? 1 : static_cast<int>(imin(kThreads, inner / W - slab * kThreads));
  const int groups = kThreads / lanes;
  const int tile_rows = groups * kRun;
  const int g = tid / lanes, l = tid - g * lanes;
  const bool active = g < groups, lead = active && l == 0;
  const int64_t col = kNarrow ? 0 : (slab * kThreads + l) * W;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = imin(rows, r0 + rows_per_block);

  for (int i = tid; i < G::kMarks; i += kThreads) sm.marks[i] = 0;
  const int64_t first = block_lower_bound(indptr, segments, rows, r0);
  int64_t carry =
      first >= 1 && first <= segments && row_at(indptr, first, rows) > r0 ? first - 1 : segments;
  int64_t next = first;
  int64_t expected = starts_per_tile(segments, rows, tile_rows);

  for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
    const int64_t t1 = imin(r1, t0 + tile_rows);
    const int nrows = static_cast<int>(t1 - t0);
    const int64_t tile_first = next;
    next = walk_starts<G::kWalkSteps>(indptr, segments, rows, t0, t1, tile_first,
                                      walk_steps(expected, groups, G::kWalkSteps), g, groups,
                                      active, lead, sm.marks, sm.prim.reduce, sm.count,
                                      [](int64_t) {});
    expected = next - tile_first;
    auto segment = [&](int key) { return key == 0 ? carry : tile_first + key - 1; };

    // Label rows with segments: the last mark of each run, scanned across
    // runs, is the label entering the next run.
    int last = -1;
    if (lead) {
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        const int m = sm.marks[padded(g * kRun + j)];
        last = m ? m : last;
      }
    }
    int key;
    Scan(sm.prim.scan).ExclusiveScan(last, key, 0, LastMark());
    if (lead) {
#pragma unroll
      for (int j = 0; j < kRun; ++j) {
        const int m = sm.marks[padded(g * kRun + j)];
        if (m) {
          key = m;
          sm.marks[padded(g * kRun + j)] = 0;  // only this thread reads it
        }
        sm.row_key[padded(g * kRun + j)] = key;
      }
    }
    __syncthreads();

    if constexpr (kNarrow) {
      constexpr int kUnitRows = 16 / G::kPackBytes;
      constexpr int kVec = 16 / static_cast<int>(sizeof(T));
      const int units = (nrows + kUnitRows - 1) / kUnitRows;
      Pack<T, kVec> buf[G::kStageUnits];
#pragma unroll
      for (int k = 0; k < G::kStageUnits; ++k) {  // all loads first
        const int u = k * kThreads + tid;
#pragma unroll
        for (int q = 0; q < kUnitRows; ++q) {
          const int r = u * kUnitRows + q;
          Pack<T, W> v = zero_pack<T, W>();
          if (u < units && r < nrows) {
            const int64_t s = segment(sm.row_key[padded(r)]);
            if (s < segments) v = load_pack<T, W>(src + s * W);
          }
#pragma unroll
          for (int e = 0; e < W; ++e) buf[k].v[q * W + e] = v.v[e];
        }
      }
#pragma unroll
      for (int k = 0; k < G::kStageUnits; ++k) {
        const int u = k * kThreads + tid;
        if (u >= units) continue;
        T* dst = out + (t0 + static_cast<int64_t>(u) * kUnitRows) * W;
        if ((u + 1) * kUnitRows <= nrows) {
          store_pack(dst, buf[k]);
        } else {  // the array's last, partial unit
#pragma unroll
          for (int q = 0; q < kUnitRows; ++q) {
            if (u * kUnitRows + q < nrows) {
              Pack<T, W> v;
#pragma unroll
              for (int e = 0; e < W; ++e) v.v[e] = buf[k].v[q * W + e];
              store_pack(dst + q * W, v);
            }
          }
        }
      }
    } else if (active) {
      Pack<T, W> v[kRun];
#pragma unroll
      for (int i = 0; i < kRun; ++i) {
        const int r = g + i * groups;
        v[i] = zero_pack<T, W>();
        if (r < nrows) {
          const int64_t s = segment(sm.row_key[padded(r)]);
          if (s < segments) v[i] = load_pack<T, W>(src + s * inner + col);
        }
      }
#pragma unroll
      for (int i = 0; i < kRun; ++i) {
        const int r = g + i * groups;
        if (r < nrows) store_pack(out + (t0 + r) * inner + col, v[i]);
      }
    }
    carry = segment(sm.row_key[padded(nrows - 1)]);
  }
}

template <typename T, int W, bool kNarrow>
__global__ void __launch_bounds__(kThreads, kGatherBlocksPerSm)
    segment_gather_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                          T* __restrict__ out, int64_t rows, int64_t segments, int64_t inner,
                          int64_t rows_per_block, int64_t slabs) {
  __shared__ GatherShared<T, W> sm;
  for (int64_t slab = blockIdx.y; slab < slabs; slab += gridDim.y) {
    gather_block<T, W, kNarrow>(src, indptr, out, rows, segments, inner, rows_per_block, slab,
                                sm);
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// Host side: launch shapes. No call here waits for the device.

inline cudaError_t sm_count(int* sms) {
  static std::atomic<int> cache[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const bool cached = dev >= 0 && dev < kMaxDevices;
  int n = cached ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (n == 0) {
    err = cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    if (err != cudaSuccess) return err;
    n = n > 0 ? n : 1;
    if (cached) cache[dev].store(n, std::memory_order_relaxed);
  }
  *sms = n;
  return cudaSuccess;
}

// Blocks of kKernel that fit on the whole GPU at once.
template <auto kKernel>
inline cudaError_t resident_blocks(int64_t* blocks) {
  static std::atomic<int> cache[kMaxDevices];
  int sms = 0, dev = 0;
  cudaError_t err = sm_count(&sms);
  if (err == cudaSuccess) err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const bool cached = dev >= 0 && dev < kMaxDevices;
  int per_sm = cached ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (per_sm == 0) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kKernel, kThreads, 0);
    if (err != cudaSuccess) return err;
    per_sm = per_sm < 1 ? 1 : (per_sm > kMaxBlocksPerSm ? kMaxBlocksPerSm : per_sm);
    if (cached) cache[dev].store(per_sm, std::memory_order_relaxed);
  }
  *blocks = static_cast<int64_t>(sms) * per_sm;
  return cudaSuccess;
}

struct RowSplit {
  int64_t rows_per_block;
  int64_t blocks;
};

// Equal row ranges, a multiple of 8 rows each (narrow tiles then start on 16
// bytes), for at most `capacity` blocks per column slab.
inline RowSplit split_rows(int64_t rows, int64_t tile_rows, int64_t capacity) {
  const int64_t min_rows = imax(8, tile_rows / 4);  // tiny inputs: fewer, fuller blocks
  const int64_t blocks = imax(1, imin(capacity, ceil_div(rows, min_rows)));
  const int64_t rows_per_block = ceil_div(ceil_div(rows, blocks), 8) * 8;
  return {rows_per_block, ceil_div(rows, rows_per_block)};
}

// Elements per thread and row in segment_sum's wide kernel: 16 bytes, but 8
// for the half types (8 float accumulators would cost too many registers).
constexpr int sum_pack(int elem_size) { return elem_size == 2 ? 4 : 16 / elem_size; }

// Upper bound on segment_sum's blocks per slab, whichever kernel variant runs.
inline int64_t max_sum_blocks(int64_t rows, int64_t inner, int elem_size, int sms) {
  const int64_t slabs = imin(kMaxGridY, ceil_div(inner, kThreads * sum_pack(elem_size)));
  return imax(1, imin(ceil_div(rows, 8), static_cast<int64_t>(sms) * kMaxBlocksPerSm / slabs));
}

// Workspace: head/tail segment ids (int64) per block, then head/tail partial
// rows (accumulation type) per block.
inline int64_t sum_workspace_size(int64_t blocks, int64_t inner, int64_t acc_size) {
  return ceil_div(2 * blocks * 8, 256) * 256 + 2 * blocks * inner * acc_size;
}

template <typename T, int W, bool kNarrow>
cudaError_t launch_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                       int64_t segments, int64_t inner, void* workspace, cudaStream_t stream) {
  using Acc = typename Num<T>::acc;
  int64_t capacity = 0;
  int sms = 0;
  cudaError_t err = resident_blocks<&segment_sum_kernel<T, W, kNarrow>>(&capacity);
  if (err == cudaSuccess) err = sm_count(&sms);
  if (err != cudaSuccess) return err;
  const int64_t packs = kNarrow ? 1 : inner / W;
  const int64_t slabs = ceil_div(packs, kThreads);
  const int64_t grid_y = imin(slabs, kMaxGridY);
  const int64_t tile_rows = kThreads / imin(kThreads, packs) * Geometry<T, W>::kRunRows;
  capacity = imin(imax(1, capacity / grid_y), max_sum_blocks(rows, inner, sizeof(T), sms));
  const RowSplit split = split_rows(rows, tile_rows, capacity);

  int64_t *head_key = nullptr, *tail_key = nullptr;
  Acc *head_val = nullptr, *tail_val = nullptr;
  if (split.blocks > 1) {  // only then can a segment cross a block boundary
    if (workspace == nullptr) return cudaErrorInvalidValue;
    char* ws = static_cast<char*>(workspace);
    head_key = reinterpret_cast<int64_t*>(ws);
    tail_key = head_key + split.blocks;
    head_val = reinterpret_cast<Acc*>(ws + ceil_div(2 * split.blocks * 8, 256) * 256);
    tail_val = head_val + split.blocks * inner;
  }
  const dim3 grid(static_cast<unsigned>(split.blocks), static_cast<unsigned>(grid_y));
  segment_sum_kernel<T, W, kNarrow><<<grid, kThreads, 0, stream>>>(
      src, indptr, out, rows, segments, kNarrow ? W : inner, split.rows_per_block, slabs, head_key,
      tail_key, head_val, tail_val);
  err = cudaGetLastError();
  if (err != cudaSuccess || split.blocks == 1) return err;
  const int64_t fixup_y =
      imin(imin(ceil_div(inner, kFixupCols), kMaxGridY), imax(1, kFixupBlocks / split.blocks));
  const dim3 fixup_grid(static_cast<unsigned>(split.blocks), static_cast<unsigned>(fixup_y));
  segment_sum_fixup_kernel<T><<<fixup_grid, kThreads, 0, stream>>>(
      indptr, out, rows, segments, inner, split.rows_per_block, split.blocks, head_key, tail_key,
      head_val, tail_val);
  return cudaGetLastError();
}

template <typename T, int W, bool kNarrow>
cudaError_t launch_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                          int64_t segments, int64_t inner, cudaStream_t stream) {
  int64_t capacity = 0;
  const cudaError_t err = resident_blocks<&segment_gather_kernel<T, W, kNarrow>>(&capacity);
  if (err != cudaSuccess) return err;
  const int64_t packs = kNarrow ? 1 : inner / W;
  const int64_t slabs = ceil_div(packs, kThreads);
  const int64_t grid_y = imin(slabs, kMaxGridY);
  const int64_t tile_rows = kThreads / imin(kThreads, packs) * Geometry<T, W>::kRunRows;
  const RowSplit split = split_rows(rows, tile_rows, imax(1, capacity / grid_y));
  const dim3 grid(static_cast<unsigned>(split.blocks), static_cast<unsigned>(grid_y));
  segment_gather_kernel<T, W, kNarrow><<<grid, kThreads, 0, stream>>>(
      src, indptr, out, rows, segments, kNarrow ? W : inner, split.rows_per_block, slabs);
  return cudaGetLastError();
}

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Rows of at most 16 bytes with a power-of-two width: the narrow kernels,
// with the row width as a compile-time constant.
template <typename T, int W = 1>
cudaError_t launch_narrow_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                              int64_t segments, int64_t inner, void* workspace,
                              cudaStream_t stream) {
  if constexpr (W * sizeof(T) > 16) {
    return cudaErrorInvalidValue;  // not reached: the caller checks the width
  } else {
    if (inner == W)
      return launch_sum<T, W, true>(src, indptr, out, rows, segments, inner, workspace, stream);
    return launch_narrow_sum<T, 2 * W>(src, indptr, out, rows, segments, inner, workspace, stream);
  }
}

template <typename T, int W = 1>
cudaError_t launch_narrow_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                                 int64_t segments, int64_t inner, cudaStream_t stream) {
  if constexpr (W * sizeof(T) > 16) {
    return cudaErrorInvalidValue;  // not reached: the caller checks the width
  } else {
    if (inner == W) return launch_gather<T, W, true>(src, indptr, out, rows, segments, inner, stream);
    return launch_narrow_gather<T, 2 * W>(src, indptr, out, rows, segments, inner, stream);
  }
}

inline bool narrow_rows(int64_t inner, int64_t elem_size) {
  return inner * elem_size <= 16 && (inner & (inner - 1)) == 0;
}

}  // namespace detail

// Scratch bytes segment_sum needs for this shape (0 when it needs none). The
// caller allocates them (alignment >= 256) on the current device and passes
// them to segment_sum; the contents need no initialization.
inline int64_t segment_sum_workspace_bytes(int64_t rows, int64_t segments, int64_t inner,
                                           int elem_size) {
  if (rows <= 0 || segments <= 0 || inner <= 0 || elem_size <= 0) return 0;
  int sms = 0;
  if (detail::sm_count(&sms) != cudaSuccess) return 0;  // segment_sum reports the error
  const int64_t blocks = detail::max_sum_blocks(rows, inner, elem_size, sms);
  if (blocks <= 1) return 0;
  return detail::sum_workspace_size(blocks, inner, elem_size == 8 ? 8 : 4);
}

// out[segments, inner] = per-segment sums of src[rows, inner] (contiguous,
// row-major). Enqueues one or two kernels on `stream` (or one memset when
// rows == 0) and returns the launch error.
template <typename T>
cudaError_t segment_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                        int64_t segments, int64_t inner, void* workspace, cudaStream_t stream) {
  static_assert(detail::kSupported<T>, "segment_sum: float, double, __half or __nv_bfloat16");
  if (rows < 0 || segments < 0 || inner < 0) return cudaErrorInvalidValue;
  if (segments == 0 || inner == 0) return cudaSuccess;
  if (rows == 0)
    return cudaMemsetAsync(out, 0, static_cast<size_t>(segments * inner) * sizeof(T), stream);
  constexpr int kWide = detail::sum_pack(sizeof(T));
  constexpr int kWideBytes = kWide * sizeof(T);
  if (detail::narrow_rows(inner, sizeof(T)) && detail::aligned(src, 16) &&
      detail::aligned(out, inner * sizeof(T)))
    return detail::launch_narrow_sum<T>(src, indptr, out, rows, segments, inner, workspace, stream);
  if (inner % kWide == 0 && detail::aligned(src, kWideBytes) && detail::aligned(out, kWideBytes))
    return detail::launch_sum<T, kWide, false>(src, indptr, out, rows, segments, inner, workspace,
                                               stream);
  return detail::launch_sum<T, 1, false>(src, indptr, out, rows, segments, inner, workspace,
                                         stream);
}

// out[rows, inner] = src[segment of each row, :] for src[segments, inner].
// Enqueues one kernel on `stream` (or one memset when segments == 0) and
// returns the launch error.
template <typename T>
cudaError_t segment_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                           int64_t segments, int64_t inner, cudaStream_t stream) {
  static_assert(detail::kSupported<T>, "segment_gather: float, double, __half or __nv_bfloat16");
  if (rows < 0 || segments < 0 || inner < 0) return cudaErrorInvalidValue;
  if (rows == 0 || inner == 0) return cudaSuccess;
  if (segments == 0)
    return cudaMemsetAsync(out, 0, static_cast<size_t>(rows * inner) * sizeof(T), stream);
  constexpr int kWide = 16 / sizeof(T);
  if (detail::narrow_rows(inner, sizeof(T)) && detail::aligned(out, 16) &&
      detail::aligned(src, inner * sizeof(T)))
    return detail::launch_narrow_gather<T>(src, indptr, out, rows, segments, inner, stream);
  if (inner % kWide == 0 && detail::aligned(src, 16) && detail::aligned(out, 16))
    return detail::launch_gather<T, kWide, false>(src, indptr, out, rows, segments, inner, stream);
  return detail::launch_gather<T, 1, false>(src, indptr, out, rows, segments, inner, stream);
}

}  // namespace segment_ops::cuda
