#pragma once
// Torch-free CUDA kernels for CSR segment sums, shared by the TORCH_LIBRARY
// binding and the stable-ABI binding:
//
//   segment_sum:    out[s, :] = sum of src[r, :] over r in [indptr[s], indptr[s+1])
//                   (an empty segment gives zeros)
//   segment_gather: out[r, :] = src[s, :] for the segment s that holds row r
//                   (the backward of segment_sum; rows outside every segment get 0)
//
// Both are memory-bound: the goal is copy bandwidth whatever the segment
// lengths, so rows, not segments, are the unit of work, and a giant segment is
// spread over every SM as evenly as a million tiny ones. Three designs share
// that goal; segment_sum and segment_gather (at the end of this file) pick one
// by row width, alignment and mean segment length:
//
// * Team kernels (long segments, rows of up to 256 bytes; the sum also takes
//   short segments in rows of 128 bytes). A team of 32 threads (a cub logical
//   warp; half a wavefront on ROCm) owns a row range and reads (sum) or writes
//   (gather) it 512 contiguous bytes at a time, as a copy would; the sum's lanes
//   add up across the team only where a segment ends.
//
// * Tile kernels (short segments, rows of 16 bytes or less). A block takes
//   contiguous tiles of 16 KB through shared memory with the segment starts that
//   fall in them, marks the rows where segments start and combines per-thread
//   runs of rows with block scans; a tile inside a long segment skips all that.
//   Relatives: the label gather (wider rows, every length the team gather does
//   not take), the lane sum (rows of 4 to 16 bytes: a thread per short segment,
//   teams and the block for longer ones; on rows of up to 4 bytes a sample of
//   indptr picks it or the tile sum: TailGate) and the fill gather (rows of
//   exactly 16 bytes: a thread per segment fills its rows of a shared tile).
//
// * Stream kernels (the rest: the sum over short segments of wider rows, rows
//   wider than 256 bytes or of other widths; the gather of rows that are not
//   whole 16-byte units). The rows are cut into equal contiguous ranges, one per
//   group of threads (a thread per 8-byte piece of a row for the sum, per
//   16-byte piece for the gather), as many groups as fit on the GPU at once. A
//   group finds the segment open at its first row with one search and streams
//   its rows in order, several loads in flight per thread, writing each total
//   when the segment's last row has gone by. No thread waits for another in the
//   loop.
//
// The tile and lane sums, and the team sum over short segments, give each block
// an equal share of rows and segment starts together (balanced_rows); the others
// give each block equal rows. Segments that cross a block boundary are finished
// by a small fix-up kernel from per-block partials in the caller's workspace.
// Partials are always added in the same order: results are deterministic.
//
// ROCm builds hipify this header, so it keeps to the CUDA runtime, the fp16/bf16
// headers and cub block and warp primitives (hipcub), with no assumption about
// the warp size for correctness (a 32-thread team is a cub logical warp). Where
// CUDA has a faster form (cp.async, warp barriers and shuffles, inline PTX), it
// sits under `#if !defined(__HIP_PLATFORM_AMD__)` next to a plain one that ROCm
// builds: the lane sum's staging of 16-byte rows and the tile gather's stores
// and label walk (the label gather holds no segment values in shared memory on
// ROCm: kLabelValueUnits). Nothing here synchronizes with the host or allocates:
// the ops can be captured in a CUDA graph.
//
// indptr is never validated (that would need a device-to-host copy). Every value
// read from it is clamped into [0, rows]; a malformed indptr gives meaningless
// results but never an out-of-bounds access.
//
// Why each choice was made, with its measurements and the variants that lost:
// docs/kernel-notes.md, under the constant's or function's name. Read the entry
// before re-trying a variant.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// The headers hipify maps to hipcub (it knows no cub/warp/ header).
#include <cub/block/block_reduce.cuh>  // brings cub::WarpReduce
#include <cub/block/block_scan.cuh>
#if !defined(__HIP_PLATFORM_AMD__)
#include <cuda_pipeline_primitives.h>  // cp.async: staged lane sum, label gather (copy_unit)
#endif

#include <atomic>
#include <climits>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace segment_ops::cuda {
namespace detail {

constexpr int kThreads = 256;                     // every kernel; a multiple of any warp size
constexpr int kMaxBlocksPerSm = 2048 / kThreads;  // no GPU keeps more than 2048 threads per SM
// Resident blocks per SM the kernels' registers are budgeted for: resident
// blocks are what keeps bytes in flight.
constexpr int kTileBlocksPerSm = 4;
// The tile sum holds the next tile in registers, 16 KB in flight per block even
// at 3 blocks per SM (80 registers); at 4 (64 registers) it spilled and lost.
// fp32 rows of 1 column over short segments run 4 blocks with the register cuts
// of kLeanTileSum (tile_sum_block, rake_scan), which fit 64 registers with no
// spill; bf16 lost at 4 even so, and keeps 3 blocks and the code before the
// cuts, as ROCm does (the register counts are sm_90's).
// Measurements: docs/kernel-notes.md, "kTileSumBlocksPerSm".
template <typename T, int W, bool kShort>
#if defined(__HIP_PLATFORM_AMD__)
constexpr int kTileSumBlocksPerSm = 3;
#else
constexpr int kTileSumBlocksPerSm = W == 1 && kShort && sizeof(T) == 4 ? 4 : 3;
#endif
// The tile sums that take the register cuts: those budgeted 64 registers.
template <typename T, int W, bool kShort>
constexpr bool kLeanTileSum = kTileSumBlocksPerSm<T, W, kShort> > 3;
constexpr int kStreamBlocksPerSm = 4;
// Tile and lane sums: blocks start on 8 rows, 16 bytes or more.
constexpr int64_t kSplitQuantum = 8;
// What a segment costs a block beyond its rows, in bytes, when the tile and lane
// sums share rows between blocks (balanced_rows): its indptr entry for the tile
// sum (8), several times that for the lane sum (96, 192 on rows of 16 bytes),
// where a segment is a lane's loop and a store. The tile sums that skip the walk
// on tiles without a start (kQuietTiles, tile_sum_block) weigh a start 24: such
// tiles got cheap, and at 8 the blocks in a power law's long segments ended
// early while the kernel waited on the others.
// Measurements: docs/kernel-notes.md, "kTileSegmentCost, kLaneSegmentCost".
#if defined(__HIP_PLATFORM_AMD__)
template <typename T, int W, bool kShort>
constexpr bool kQuietTiles = false;  // its fold rides on rake_scan, which ROCm does not take
#else
template <typename T, int W, bool kShort>
constexpr bool kQuietTiles = kShort && W == 1 && sizeof(T) <= 4;
#endif
template <typename T, int W, bool kShort>
constexpr int64_t kTileSegmentCost = kQuietTiles<T, W, kShort> ? 24 : 8;
// The lane sum: 96 bytes a segment, 192 on rows of 16 bytes (both kept against
// 48 to 288).
// Measurements: docs/kernel-notes.md, "kTileSegmentCost, kLaneSegmentCost".
template <typename T, int W>
constexpr int64_t kLaneSegmentCost = W * sizeof(T) == 16 ? 192 : 96;
constexpr int kThreadBytes = 64;     // tile kernels: src bytes per thread and tile (16 KB tiles)
constexpr int kWindow = 2048;        // tile kernels: segment starts per tile kept in shared memory
constexpr int kWindowSteps = 4;      // tile kernels: indptr entries per thread and round
constexpr int kPrefetchSteps = 2;    // tile kernels: the same, for the round read a tile ahead
// Runs of up to 32 rows per thread, though 32 rows of 2 bytes unroll into large
// code: shorter runs, smaller code, lost.
// Measurements: docs/kernel-notes.md, "kMaxRunRows".
constexpr int kMaxRunRows = 32;      // tile kernels: rows per thread and tile, at most
constexpr int kShortSegmentRows = 64;  // tile sum: mean segment length (rows) that is short
constexpr int kValueBytes = 8192;    // tile gather: segment values per tile in shared memory
constexpr int kLabelGatherRows = 64; // team-shaped gathers: mean segment length that is short
constexpr int kBatch = 4;            // stream kernels: loads per thread in flight
constexpr int kMinGroupRows = 32;    // stream kernels: small inputs get fewer, fuller groups
constexpr int kTeam = 32;            // team kernels, stream gather: threads on contiguous rows
constexpr int kTeams = kThreads / kTeam;  // team kernels: teams per block
// How the stream sum keeps rows in flight (kRows rows a batch per thread):
// * 4- and 8-byte types load the next batch while they add the current one
//   (kReadAhead): twice the bytes in flight for the registers of
//   kStreamBlocksPerSm blocks per SM.
// * 2-byte types, whose adds take more instructions, lost with that read-ahead:
//   in rows of fewer than kWideHalfLanes packs (kNarrow) they load 2 * kBatch
//   rows after the adds instead, the same registers; wider rows (kWide) read 6
//   rows ahead at 3 blocks per SM, whose registers that takes.
// * kDeep: devices whose memory feeds each SM faster than an H100's by a margin
//   (kDeepBytesPerSm) want more rows in flight: 16 rows where a thread loads at
//   most 4 bytes a row of a 2-byte type (64 bytes in flight, no spill), and 8
//   rows ahead for fp32 single elements. Other devices keep 8 rows there, where
//   12 had lost.
// More rows per batch spilled or lost, and neither L2 prefetches nor rings in
// shared memory (cp.async, bulk copies) beat rows held in registers.
// Measurements: docs/kernel-notes.md, "StreamRows, StreamSumRows".
enum class StreamRows { kNarrow, kDeep, kWide };
template <typename T, StreamRows kShape>
struct StreamSumRows {
  static constexpr bool kReadAhead = sizeof(T) >= 4 || kShape == StreamRows::kWide;
  static constexpr int kRows = sizeof(T) >= 4 ? (kShape == StreamRows::kDeep ? 2 * kBatch : kBatch)
                              : kShape == StreamRows::kWide ? 6
                              : kShape == StreamRows::kDeep ? 4 * kBatch
                                                            : 2 * kBatch;
  static constexpr int kBlocksPerSm =
      sizeof(T) >= 4 || kShape != StreamRows::kWide ? kStreamBlocksPerSm : 3;
};
// Peak memory bandwidth per SM (bytes/s, from the device's attributes) from
// which the stream sum takes StreamRows::kDeep: an H100 (SXM) has 25e9, an
// H200 36e9.
constexpr double kDeepBytesPerSm = 30e9;
constexpr int kWideHalfLanes = 16;  // stream sum: packs per row from which half types read ahead
constexpr int64_t kPairRowBytes = 64;  // stream sum: rows of 2-byte types it sums in pairs
// The gathers launch several waves of blocks of equal rows, so that blocks that
// finish early are followed by more: with one wave, blocks finished so unevenly
// that a quarter of the warp slots sat idle. More waves cost each block's start
// (a search of indptr, a first read not ahead), so each gather has the count
// that measured best: the tile and team gathers 4, the fill and label gathers 16
// (8 for the narrow label gather), the stream gather 8. The sums keep one wave:
// with more, more segments cross blocks, and none gained. Blocks of equal cost
// (balanced_rows) in fewer waves lost on the gathers: the later waves are what
// evens out the SMs' ends, not equal shares.
// Measurements: docs/kernel-notes.md, "kTileGatherWaves and the other gather waves".
constexpr int kTileGatherWaves = 4;
constexpr int kFillGatherWaves = 16;
constexpr int kTeamGatherWaves = 4;
constexpr int kLabelGatherWaves = 16;
constexpr int kNarrowLabelGatherWaves = 8;  // rows of at most kNarrowLabelBytes
constexpr int64_t kNarrowLabelBytes = 64;
// The narrow label gather's blocks find their first segment with
// warp_lower_bound, 64 probes a round; the tile, wide label and team gathers
// keep block_lower_bound, where the warp search lost or tied.
// Measurements: docs/kernel-notes.md, "kNarrowLabelSearchProbes".
constexpr int kNarrowLabelSearchProbes = 64;
// Rows the label gather takes as narrow: its waves and its search.
__host__ __device__ constexpr bool narrow_label_rows(int64_t inner, int64_t elem_size) {
  return inner * elem_size <= kNarrowLabelBytes;
}
constexpr int kStreamGatherWaves = 8;
constexpr int kFixupCols = 16;       // fix-up: columns per block, at least, over long segments
constexpr int kFixupParts = 32;      // fix-up: threads per column, at most
constexpr int64_t kFixupBlocks = 16384;  // fix-up grid size to aim at (most blocks exit at once)
constexpr int64_t kMaxGridY = 65535;
constexpr int kMaxDevices = 64;
constexpr int64_t kNever = INT64_MAX;  // the end of the virtual segment after the last one

__host__ __device__ constexpr int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ constexpr int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }
__host__ __device__ constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A sum is one kernel, or two or three on one stream (a fix-up after it; the
// gated sums' second kernel before that), and each used to wait for the one
// before it to end before it launched. On sm_90 and later the kernel after
// launches early (programmatic dependent launch, launch_after): a sum that a
// kernel of ours follows lets it start at its top (allow_dependents), and that
// kernel waits for the kernels before it to end, their writes visible, before it
// reads what they wrote (wait_for_prerequisites). Every block of a kernel
// launched early waits before it returns, on every path: the fix-up reaches what
// the lane sum wrote, and what follows the op on the stream finds it done, only
// through those waits. A kernel launched the usual way finds nothing to wait
// for. Compiled for an older architecture, both are no-ops, and the host must
// not launch early: a kernel that runs from sm_80 PTX on an sm_90 device has no
// wait (early_launch).
// A sum that no kernel of ours follows does not let the next one start: a kernel
// of another library launched early could write, before its own wait, into
// memory that this one still reads (the caching allocator's reuse).
// Measurements: docs/kernel-notes.md, "allow_dependents, wait_for_prerequisites".
__device__ __forceinline__ void allow_dependents(bool followed) {
#if !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (followed) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void wait_for_prerequisites() {
#if !defined(__HIP_PLATFORM_AMD__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

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

// A pack as 32-bit words, for packs of whole words. Loads and adds by words
// read the half types two elements at a time: a half-type Pack is kept one
// element per register, and costs a register move per element and row.
template <typename T, int W>
constexpr bool kWholeWords = W * sizeof(T) % 4 == 0;

template <typename T, int W>
struct alignas(sizeof(T) * W) Words {
  uint32_t w[W * sizeof(T) / 4];
};

template <typename T, int W>
using RawPack = std::conditional_t<kWholeWords<T, W>, Words<T, W>, Pack<T, W>>;

template <typename T, int W>
__device__ __forceinline__ RawPack<T, W> load_raw(const T* p) {
  return *reinterpret_cast<const RawPack<T, W>*>(p);
}

// Element e of T values packed in 32-bit words, in the accumulation type: a
// half type is converted straight from its word, not first moved into a
// register of its own.
template <typename T>
__device__ __forceinline__ typename Num<T>::acc word_elem(const uint32_t* w, int e) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    // A bf16 is the high half of the float it stands for.
    return __uint_as_float(e % 2 ? w[e / 2] & 0xffff0000u : w[e / 2] << 16);
  } else if constexpr (std::is_same_v<T, __half>) {
    __half2 h;
    memcpy(&h, &w[e / 2], sizeof(h));
    return e % 2 ? __high2float(h) : __low2float(h);
  } else if constexpr (std::is_same_v<T, float>) {
    return __uint_as_float(w[e]);
  } else {
    return __hiloint2double(static_cast<int>(w[2 * e + 1]), static_cast<int>(w[2 * e]));
  }
}

// acc[e % W] += element e of the N elements in d.
template <typename T, int W, int N = W>
__device__ __forceinline__ void add_raw(typename Num<T>::acc (&acc)[W], const RawPack<T, N>& d) {
  static_assert(N % W == 0, "whole rows");
#pragma unroll
  for (int e = 0; e < N; ++e) {
    if constexpr (kWholeWords<T, N>)
      acc[e % W] += word_elem<T>(d.w, e);
    else
      acc[e % W] += Num<T>::to_acc(d.v[e]);
  }
}

// Stores W accumulators as the W elements at p: the half types in pairs, so
// the store stays one vector store.
template <typename T, int W>
__device__ __forceinline__ void store_sum(T* p, const typename Num<T>::acc (&v)[W]) {
  if constexpr (sizeof(T) == 2 && W % 2 == 0) {
    Words<T, W> o;
#pragma unroll
    for (int i = 0; i < W / 2; ++i) {
      if constexpr (std::is_same_v<T, __nv_bfloat16>) {
        const __nv_bfloat162 h = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        memcpy(&o.w[i], &h, sizeof(h));
      } else {
        const __half2 h = __floats2half2_rn(v[2 * i], v[2 * i + 1]);
        memcpy(&o.w[i], &h, sizeof(h));
      }
    }
    *reinterpret_cast<Words<T, W>*>(p) = o;
  } else {
    Pack<T, W> o;
#pragma unroll
    for (int k = 0; k < W; ++k) o.v[k] = Num<T>::from_acc(v[k]);
    store_pack(p, o);
  }
}

template <typename T, int W>
__device__ __forceinline__ Pack<T, W> zero_pack() {
  Pack<T, W> z;
#pragma unroll
  for (int k = 0; k < W; ++k) z.v[k] = Num<T>::from_acc(0);
  return z;
}

// Where segments that cross a block boundary meet: per block, the segment
// open at its first row that began earlier (head) and the one open after its
// last row that began in it (tail), each with its partial row. All null when
// one block covers every row.
template <typename Acc>
struct Crossing {
  int64_t* head_key = nullptr;
  int64_t* tail_key = nullptr;
  Acc* head_val = nullptr;
  Acc* tail_val = nullptr;
  int* picked = nullptr;  // gated sums: 1 when the tile sum ran, 0 when the lane sum did
};

__device__ __forceinline__ int64_t clamp_row(int64_t v, int64_t rows) {
  return v < 0 ? 0 : (v > rows ? rows : v);
}

// Start row of segment s, clamped into [0, rows].
__device__ __forceinline__ int64_t start_of(const int64_t* __restrict__ indptr, int64_t s,
                                            int64_t rows) {
  return clamp_row(indptr[s], rows);
}

// For each e < N, the first x in [lo[e], hi[e]] with !below(e, x), for a `below`
// that holds up to some x and fails from there (x = hi[e] is never probed); the
// same answers in every thread. Each step probes kThreads evenly spaced entries
// at once, so 3 dependent loads cover 16M entries where a binary search would
// wait on 24, and the N searches wait on memory together. Wider rounds (4 or 8
// probes a thread) lost badly in the gathers' block starts; fewer probes, by one
// warp (warp_lower_bound), paid in the fill and narrow label gathers
// (kFillSearchProbes, kNarrowLabelSearchProbes).
// Measurements: docs/kernel-notes.md, "block_partitions, round_step".
// A round of a search that probes `probes` evenly spaced entries of [lo, hi] at
// once: probe i (from 0) lies at lo + (i + 1) * step - 1, and where the first n
// probes are below the answer (and the rest not), it lies in [lo + n * step, lo
// + (n + 1) * step - 1].
__device__ __forceinline__ int64_t round_step(int64_t lo, int64_t hi, int64_t probes) {
  return ceil_div(hi - lo, probes);
}
__device__ __forceinline__ int64_t round_probe(int64_t lo, int64_t step, int64_t i) {
  return lo + (i + 1) * step - 1;
}
__device__ __forceinline__ void round_narrow(int64_t& lo, int64_t& hi, int64_t step, int64_t n) {
  lo += n * step;
  hi = imin(hi, lo + step - 1);
}

template <int N, typename Below>
__device__ __forceinline__ void block_partitions(int64_t (&lo)[N], int64_t (&hi)[N],
                                                 Below&& below) {
  for (;;) {
    bool open = false, in[N];
    int64_t step[N];
#pragma unroll
    for (int e = 0; e < N; ++e) {
      step[e] = lo[e] < hi[e] ? round_step(lo[e], hi[e], kThreads) : 0;
      open |= step[e] > 0;
      const int64_t probe = round_probe(lo[e], step[e], threadIdx.x);
      in[e] = step[e] > 0 && probe < hi[e] && below(e, probe);
    }
    if (!open) return;
#pragma unroll
    for (int e = 0; e < N; ++e) {
      const int64_t n = __syncthreads_count(in[e]);
      if (step[e] > 0) round_narrow(lo[e], hi[e], step[e], n);
    }
  }
}

// First s in [0, segments + 1] with start_of(s) >= x[e], for each e; the same
// answers in every thread. Through block_partitions, the N searches wait on
// memory together: the stream and team kernels find both ends of their block's
// segments in one search.
// Measurements: docs/kernel-notes.md, "block_lower_bounds".
template <int N>
__device__ __forceinline__ void block_lower_bounds(const int64_t* __restrict__ indptr,
                                                   int64_t segments, int64_t rows,
                                                   const int64_t (&x)[N], int64_t (&s)[N]) {
  int64_t hi[N];
#pragma unroll
  for (int e = 0; e < N; ++e) {
    s[e] = 0;
    hi[e] = segments + 1;
  }
  block_partitions(s, hi, [&](int e, int64_t k) { return start_of(indptr, k, rows) < x[e]; });
}

__device__ inline int64_t block_lower_bound(const int64_t* __restrict__ indptr, int64_t segments,
                                            int64_t rows, int64_t x) {
  int64_t s[1];
  block_lower_bounds<1>(indptr, segments, rows, {x}, s);
  return s[0];
}

// How the tile and lane sums weigh the rows a block owns: rows * row + the
// segments that start in them * segment, in bytes: a row's, and a segment's
// output row plus what its end costs the kernel (kTileSegmentCost,
// kLaneSegmentCost). Power-law lengths leave some blocks of equal rows with
// twice the segments of others, and one wave of blocks ends with its slowest.
// The stream sum keeps equal rows for its blocks and its groups: shared by cost,
// it lost or gained nothing.
// Measurements: docs/kernel-notes.md, "Costs".
struct Costs {
  int64_t row, segment;
};

// k * total / parts without overflow (total up to 2^62, parts up to 2^31).
__host__ __device__ constexpr int64_t share_of(int64_t total, int64_t k, int64_t parts) {
  return total / parts * k + total % parts * k / parts;
}

// Block `block` of `blocks`: its rows [r0, r1) and the first segment starting
// at or after r0, for blocks of equal cost. The block's first row is where the
// cost of the rows and segment starts before it reaches its share, rounded
// down to a multiple of `quantum` rows; the last block ends at `rows`. Every
// block finds both of its ends the same way, so neighbours agree. A malformed
// indptr gives meaningless ranges, but each lies in [0, rows].
struct BlockRows {
  int64_t r0, r1, first, next;  // next: the first segment starting at or after r1
};

__device__ inline BlockRows balanced_rows(const int64_t* __restrict__ indptr, int64_t segments,
                                          int64_t rows, int64_t block, int64_t blocks,
                                          Costs cost, int64_t quantum) {
  const int64_t total = cost.row * rows + cost.segment * segments;
  const int64_t share[2] = {share_of(total, block, blocks), share_of(total, block + 1, blocks)};
  // past[e]: the first segment s whose rows and segments before it cost more
  // than share[e]; the share ends inside segment s - 1 (or before the first).
  int64_t past[2] = {0, 0}, end[2] = {segments + 1, segments + 1};
  block_partitions(past, end, [&](int e, int64_t s) {
    return cost.row * start_of(indptr, s, rows) + cost.segment * s <= share[e];
  });
  int64_t at[2];
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    const int64_t s = past[e] - 1;
    const int64_t a = s >= 0 ? start_of(indptr, s, rows) : 0;
    const int64_t spent = s >= 0 ? cost.row * a + cost.segment * s : 0;
    const int64_t b = past[e] <= segments ? start_of(indptr, past[e], rows) : rows;
    at[e] = imin(a + (share[e] - spent) / cost.row, b) / quantum * quantum;
  }
  BlockRows r;
  r.r0 = block == 0 ? 0 : imin(at[0], rows);
  r.r1 = block + 1 >= blocks ? rows : imax(r.r0, imin(at[1], rows));
  // Both lower bounds lie at or below past[e] (r0 <= start_of(past[0])): one
  // step over the kThreads entries below, and the full search only where they
  // all start at r0 or later (a crowd of empty segments).
  int64_t lo[2] = {imax(0, past[0] - kThreads), imax(0, past[1] - kThreads)};
  int64_t hi[2] = {past[0], past[1]};
  const int64_t x[2] = {r.r0, r.r1};
  auto starts_below = [&](int e, int64_t s) { return start_of(indptr, s, rows) < x[e]; };
  const int64_t near[2] = {lo[0], lo[1]};
  block_partitions(lo, hi, starts_below);
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (lo[e] == near[e] && near[e] > 0) {
      hi[e] = near[e];
      lo[e] = 0;
    } else {
      hi[e] = lo[e];
    }
  }
  block_partitions(lo, hi, starts_below);  // nothing to do unless crowded
  r.first = lo[0];
  r.next = r.r1 == rows ? segments + 1 : lo[1];
  return r;
}

// The last s in [lo, hi] with start_of(s) <= x, or lo - 1 when there is none.
__device__ __forceinline__ int64_t last_start_at(const int64_t* __restrict__ indptr,
                                                 int64_t rows, int64_t x, int64_t lo,
                                                 int64_t hi) {
  int64_t a = lo - 1, b = hi;
  while (a < b) {
    const int64_t mid = a + (b - a + 1) / 2;
    if (start_of(indptr, mid, rows) <= x) a = mid;
    else b = mid - 1;
  }
  return a;
}

// The segment that holds row x (-1 before indptr[0], `segments` from
// indptr[segments] on), searched among [lo, hi], which the caller knows holds
// it. Empty segments starting at x come before it.
__device__ __forceinline__ int64_t segment_at(const int64_t* __restrict__ indptr, int64_t segments,
                                              int64_t rows, int64_t x, int64_t lo, int64_t hi) {
  return last_start_at(indptr, rows, x, imax(lo, 0), imin(hi, segments));
}

__device__ __forceinline__ int64_t end_of(const int64_t* __restrict__ indptr, int64_t segments,
                                          int64_t rows, int64_t s) {
  return s < segments ? start_of(indptr, s + 1, rows) : kNever;
}

// The segment open at a block's first row r0 that began in an earlier block
// (its head), or -1; `first` is the first segment starting at or after r0.
__device__ __forceinline__ int64_t head_segment(const int64_t* __restrict__ indptr,
                                                int64_t segments, int64_t rows, int64_t r0,
                                                int64_t first) {
  return first >= 1 && first <= segments && start_of(indptr, first, rows) > r0 ? first - 1 : -1;
}

// ---------------------------------------------------------------------------
// Tile kernels (rows of at most 16 bytes)

// Tile shape for rows of W elements T: each thread takes a run of kRunRows
// consecutive rows, kThreadBytes per tile.
template <typename T, int W, int kMaxRun = kMaxRunRows>
struct Geometry {
  static constexpr int kRowBytes = W * static_cast<int>(sizeof(T));
  static constexpr int kRunRows =
      kThreadBytes / kRowBytes < kMaxRun ? kThreadBytes / kRowBytes : kMaxRun;
  static constexpr int kTileRows = kThreads * kRunRows;
  // Rows go through shared memory as 16-byte units.
  static constexpr int kStageUnits = kRunRows * kRowBytes / 16;  // 16-byte loads per thread
  // indptr entries per thread the tile sum over long segments reads a tile
  // ahead: enough for a tile of 8-row segments in one round (2-byte rows make
  // tiles of 8192 rows). Over short segments it reads low words instead,
  // imax(kWindowSteps, kTileRows / (4 * kThreads)) steps: 8 for 2-byte rows
  // (tile_sum_block). Reading further ahead as 64-bit entries lost.
  // Measurements: docs/kernel-notes.md, "Geometry::kPrefetch".
  static constexpr int kPrefetch = kTileRows / 8 > kPrefetchSteps * kThreads ? kWindowSteps
                                                                              : kPrefetchSteps;
};

// The segment starts that fall inside a tile, as tile-relative rows: entry i
// is the start of segment `first + i`, where `first` is the first segment
// starting at or after the tile's first row. A tile of short segments holds a
// few hundred; starts past kWindow (only a crowd of empty or one-row segments
// has that many: 0.1 % of the power law's tiles of 8192 rows) are read from
// indptr when needed.
struct Window {
  int64_t first;  // first segment starting in the tile
  int64_t n;      // segments starting in the tile
};

// Starts of the segments from, from + 1, ... read kThreads * steps at a time
// (this thread's: from + k * kThreads + tid); past the last segment, kNever (~0u
// for low words).
// Issued a tile ahead so the window's first round does not wait on memory, and
// kept as read: load_window clamps them (clamped here, the thread waited on the
// loads at once). A tile that holds more starts than were read ahead waits on a
// second round; reading further ahead without registers (cp.async into shared
// memory, pulls toward the SM) did not pay, and L1 is not short of room here.
// Measurements: docs/kernel-notes.md, "fetch_starts, low_words_exact".
// The tile sum reads ahead only the low 32-bit words of the entries (Raw =
// uint32_t; ~0u past the last segment): the word at the lower address, GPUs
// being little-endian. Below 2^32 rows they give a sorted indptr's starts in the
// tile exactly (load_window), in half the registers, so it reads twice as many
// entries ahead as 64-bit ones would (tile_sum_block). The tile gather reads
// them as deep as before, on rows of 2 and 4 bytes (kTileGatherLow), for the
// registers and 32-bit arithmetic alone.
// Low words give the starts exactly only below 2^32 rows: from there the tile
// sum reads nothing ahead, and the tile gather, whose low words are its only
// read-ahead on rows of 2 and 4 bytes, leaves such inputs to the team gather.
__host__ __device__ constexpr bool low_words_exact(int64_t rows) {
  return rows <= int64_t{UINT32_MAX};
}

template <int kSteps, typename Raw>
__device__ __forceinline__ void fetch_starts(const int64_t* __restrict__ indptr, int64_t segments,
                                             int64_t from, int steps, Raw (&raw)[kSteps]) {
  static_assert(std::is_same_v<Raw, int64_t> || std::is_same_v<Raw, uint32_t>,
                "entries or their low words");
  // One pointer and one 32-bit bound: k * kThreads <= last exactly when k <
  // steps and s = own + k * kThreads <= segments (last >= -1 whatever from is).
  const int64_t own = from + threadIdx.x;
  const int last =
      static_cast<int>(imax(imin(segments - own, int64_t{steps} * kThreads - 1), int64_t{-1}));
  // Low words lie 2 apart; past the last segment, kNever or its low word, ~0u.
  constexpr int kStride = static_cast<int>(sizeof(int64_t) / sizeof(Raw));
  constexpr Raw kPast = static_cast<Raw>(kNever);
  const Raw* at = reinterpret_cast<const Raw*>(indptr + own);
#pragma unroll
  for (int k = 0; k < kSteps; ++k)
    raw[k] = k * kThreads <= last ? at[kStride * k * kThreads] : kPast;
}

// Fills `window` for the tile of `nrows` rows at t0 whose first start is segment
// `first`, and returns the number of starts in the tile. The first round takes
// `steps` entries per thread from `raw` (fetch_starts), or none where the tile
// sum read nothing ahead (steps 0: it reads indptr); further rounds, only when a
// round is full, read kWindowSteps entries per thread. counts[3] are block
// words, used in rotation by `round` (the same in every thread) so a round needs
// one barrier; the atomic counts need them zeroed. How a round's count reaches
// every thread differs by kernel (WindowCount), each the fastest measured there:
// * kWarpAtomic (tile sum): each warp sums its count and adds it to the block's.
// * kInBarrier (tile gather, held to 64 registers, where the warp sum lost): the
//   barrier itself counts, with no atomics and hardly a register.
// * kThreadAtomic (label gather): an atomic per thread.
// Rounds past the first larger than kWindowSteps lost wherever a tile has more
// starts than the first round holds, as did the gather reading each round's
// values alongside its starts.
// Measurements: docs/kernel-notes.md, "WindowCount, load_window".
enum class WindowCount { kThreadAtomic, kWarpAtomic, kInBarrier };

template <WindowCount kCount, int kSteps, typename Raw>
__device__ __forceinline__ int64_t load_window(const int64_t* __restrict__ indptr,
                                               int64_t segments, int64_t rows, int64_t t0,
                                               int nrows, int64_t first, int steps,
                                               const Raw (&raw)[kSteps],
                                               int* window, int* counts, int& round) {
  const int tid = threadIdx.x;
  int64_t n = 0;
  // The tile gather's prefetched round of 64-bit entries (rows of 8 bytes;
  // narrower rows read low words, below): raw[k] is kNever for k >= steps
  // (fetch_starts with the same steps), which gives nrows like the clamp, so
  // neither the clamp to [0, rows] nor steps is applied: a negative start gives
  // -t0 (what clamping it to 0 gives), one at or past the tile's end nrows (rows
  // - t0 >= nrows). 32-bit where it can be.
  // Further rounds of the tile gather take the same lean form, the entries of a
  // round addressed from one pointer and bounded by one 32-bit room (as its
  // prefetch): k * kThreads <= room exactly when s <= segments.
  // The tile sum (kWarpAtomic) takes the lean form too; its prefetched round now
  // reads low words (kLow, below).
  // Measurements: docs/kernel-notes.md, "load_window: the lean form".
  constexpr bool kLeanFirst = kCount != WindowCount::kThreadAtomic;
  const int below_tile = static_cast<int>(-t0);
  auto lean = [&](int64_t v) {
    const uint64_t d = static_cast<uint64_t>(v) - static_cast<uint64_t>(t0);
    return v < 0 ? below_tile : (v - t0 >= nrows ? nrows : static_cast<int>(d));
  };
  // The same value in the tile sum, from the tile's end t1: past it, nrows;
  // below 0, 0 - t0; else v - t0, the 32-bit difference of the low words.
  const int64_t t1 = t0 + nrows;
  const int t0_low = static_cast<int>(t0);
  auto lean_sum = [&](int64_t v) {
    const int low = v < 0 ? 0 : static_cast<int>(v);
    // Unsigned: past 2^31 rows the difference of the low words wraps.
    return v >= t1 ? nrows
                   : static_cast<int>(static_cast<unsigned>(low) - static_cast<unsigned>(t0_low));
  };
  auto lean_rel = [&](int64_t v) {
    if constexpr (kCount == WindowCount::kWarpAtomic) return lean_sum(v);
    else return lean(v);
  };
  // The low words (rows < 2^32; the tile sum's fetch_starts, and the tile
  // gather's prefetch on rows of at most 4 bytes): the unsigned difference
  // of the low words is a sorted indptr's start in the tile exactly, taken
  // where it is below nrows: every entry read lies at or past t0 and at most
  // rows, and the ~0u past the last segment at least nrows past t0 (t0 +
  // nrows <= rows < 2^32). Any other value gives a row of the tile or nrows.
  // steps == 0 (the tile sum at 2^32 rows or more; the gather sends those to
  // the team gather): nothing was read ahead, and the first round reads
  // indptr.
  constexpr bool kLow = std::is_same_v<Raw, uint32_t>;
  static_assert(!kLow || kCount != WindowCount::kThreadAtomic, "low words: the tile kernels'");
  auto low_rel = [&](uint32_t v) {
    const unsigned d = v - static_cast<unsigned>(t0);
    return d < static_cast<unsigned>(nrows) ? static_cast<int>(d) : nrows;
  };
  // A read-ahead entry's row in the tile, in the lean forms (kLow is one).
  auto rel_of = [&](Raw v) {
    if constexpr (kLow) return low_rel(v);
    else return lean_rel(v);
  };
  bool prefetched = !kLow || steps > 0;
  if (!prefetched) steps = kWindowSteps;
  // A round's entries per thread: the read-ahead's may be more than later
  // rounds' (kWindowSteps), whose entries past those are nrows.
  constexpr int kWidth = kSteps > kWindowSteps ? kSteps : kWindowSteps;
  for (;; prefetched = false) {
    int rel[kWidth];
    if (kLeanFirst && !prefetched) {
      const int64_t own = first + n + tid;
      // At least -kWindowSteps * kThreads: the rounds stop past segments.
      const int room = static_cast<int>(imin(segments - own, INT_MAX));
      const int64_t* at = indptr + own;
      int64_t v[kWindowSteps];
#pragma unroll
      for (int k = 0; k < kWindowSteps; ++k)  // issue every load before using any
        v[k] = k * kThreads <= room ? at[k * kThreads] : kNever;
#pragma unroll
      for (int k = 0; k < kWidth; ++k) rel[k] = k < kWindowSteps ? lean_rel(v[k]) : nrows;
    } else {
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {  // issue every load before using any
        const int64_t s = first + n + k * kThreads + tid;
        if constexpr (kLeanFirst) {
          rel[k] = k < kSteps ? rel_of(raw[k]) : nrows;
          continue;
        }
        int64_t v = kNever;
        if (prefetched) {
          if (k < kSteps) v = clamp_row(raw[k], rows);  // kNever gives rows: not taken
        } else if (s <= segments) {
          v = clamp_row(indptr[s], rows);
        }
        rel[k] = k < steps ? static_cast<int>(imin(v - t0, nrows)) : nrows;
      }
    }
    int taken = 0;
    if constexpr (kLeanFirst) {
      // The window's entries from n on, in 32 bits: none fits once n reaches kWindow.
      const int at_window = static_cast<int>(imin(n, kWindow));
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        const bool in = rel[k] < nrows;  // sorted starts: the taken entries are a prefix
        taken += in;
        const int i = at_window + k * kThreads + tid;
        if (in && i < kWindow) window[i] = rel[k];
      }
    } else {
#pragma unroll
      for (int k = 0; k < kWidth; ++k) {
        if (rel[k] < nrows) {  // sorted starts: the taken entries are a prefix
          ++taken;
          const int64_t i = n + k * kThreads + tid;
          if (i < kWindow) window[i] = rel[k];
        }
      }
    }
    // round in {0, 1, 2}: the word in use, rotated without a division.
    int* count = counts + round;
    const int next = round == 2 ? 0 : round + 1;
    std::conditional_t<kLeanFirst, int, int64_t> got;  // in [0, 1280] in the tile gather
    if constexpr (kCount == WindowCount::kInBarrier) {
      // Sorted starts make the entries taken a prefix of the round: every
      // thread took q (the last thread's count) or q + 1, and the barrier
      // counts those with q + 1, by parity.
      if (tid == kThreads - 1) *count = taken;  // read after the barrier, rewritten 3 rounds on
      round = next;
      const int odd = __syncthreads_count(taken & 1);
      const int q = *count;  // in [0, kWindowSteps]: got fits 32 bits
      got = q * kThreads + (q & 1 ? kThreads - odd : odd);
    } else {
      if constexpr (kCount == WindowCount::kWarpAtomic) {
        using WarpCount = cub::WarpReduce<int, 32>;
        __shared__ typename WarpCount::TempStorage warp_count[kThreads / 32];
        const int warp_taken = WarpCount(warp_count[tid / 32]).Sum(taken);
        if (tid % 32 == 0 && warp_taken) atomicAdd(count, warp_taken);
      } else if (taken) {
        atomicAdd(count, taken);
      }
      if (tid == 0) counts[next] = 0;  // last read two rounds ago
      round = next;
      __syncthreads();
      got = *count;
    }
    n += got;
    // Unsorted starts (an unchecked indptr) break the prefix; n still stops at
    // the last segment.
    if (got < steps * kThreads) return imin(n, segments + 1 - first);
    steps = kWindowSteps;
  }
}

// Start (tile-relative) of the window's entry i.
__device__ __forceinline__ int window_start(const int* window, const int64_t* __restrict__ indptr,
                                            int64_t rows, int64_t t0, const Window& w,
                                            int64_t i) {
  return i < kWindow ? window[i]
                     : static_cast<int>(clamp_row(indptr[w.first + i], rows) - t0);
}

// Number of the window's starts at or before row x (binary search).
__device__ __forceinline__ int64_t starts_through(const int* window,
                                                  const int64_t* __restrict__ indptr,
                                                  int64_t rows, int64_t t0, const Window& w,
                                                  int x) {
  int64_t lo = 0, hi = w.n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (window_start(window, indptr, rows, t0, w, mid) <= x) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

// Segment starts in the tile before row a, the first of this thread's run, whose
// own starts are `marks`. Counted from the marks over the block when each marked
// row starts one segment (`by_marks`, the same in every thread); else by binary
// search of the window. The search everywhere, for no block scan and its
// barrier, lost.
// Measurements: docs/kernel-notes.md, "starts_before".
template <typename CountScan>
__device__ __forceinline__ int64_t starts_before(int a, uint32_t marks, bool by_marks,
                                                 typename CountScan::TempStorage& storage,
                                                 const int* window,
                                                 const int64_t* __restrict__ indptr,
                                                 int64_t rows, int64_t t0, const Window& w) {
  if (!by_marks) return starts_through(window, indptr, rows, t0, w, a - 1);
  int before_a;
  CountScan(storage).ExclusiveSum(__popc(marks), before_a);
  return before_a;
}

// Marks the rows of the tile (`nrows` rows) where its window's `n` segments
// start, one bit per row in `starts`. A start that the next one shares is a
// segment without rows: on_empty(i) runs for its entry i and the tile is crowded
// (some row then starts several segments). A thread takes four consecutive
// entries, read from the window (16-byte aligned) at once, and ORs the bits that
// fall in one mask word together: short segments put several starts in a word,
// and with one atomic per entry a warp's atomics waited on each other there.
// Measurements: docs/kernel-notes.md, "mark_starts".
// Zeroes a tile's kWords mark words with the block's kThreads threads, one
// unrolled store per thread and pass: a loop over tid, not knowing tid <
// kThreads, kept its bounds and its control (about 20 instructions).
template <int kWords>
__device__ __forceinline__ void clear_marks(uint32_t* starts) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i0 = 0; i0 < kWords; i0 += kThreads)
    if (kWords % kThreads == 0 || i0 + tid < kWords) starts[i0 + tid] = 0;
}

// Four window entries by one 16-byte read (`at` 16-byte aligned).
__device__ __forceinline__ void read_quad(const int* at, int* r) {
  const int4 v = *reinterpret_cast<const int4*>(at);
  r[0] = v.x;
  r[1] = v.y;
  r[2] = v.z;
  r[3] = v.w;
}

template <typename Start, typename OnEmpty>
__device__ __forceinline__ void mark_starts(int64_t n, int nrows, const int* window,
                                            Start&& start, uint32_t* starts, int& crowded,
                                            OnEmpty&& on_empty) {
  constexpr int kPer = 4;
  const int64_t in_window = imin(n, kWindow);
  for (int64_t i0 = kPer * static_cast<int64_t>(threadIdx.x); i0 < n; i0 += kPer * kThreads) {
    int r[kPer + 1];
    if (i0 + kPer <= in_window) {
      read_quad(window + i0, r);
    } else {
#pragma unroll
      for (int k = 0; k < kPer; ++k) r[k] = i0 + k < n ? start(i0 + k) : nrows;
    }
    r[kPer] = start(i0 + kPer);
    // The word's bits are kept in registers and flushed (an atomic) when an
    // entry falls in another word; taken entries are tested unsigned (r < 0
    // wraps) and empty segments, rare but for a crowd, handled after.
    uint32_t bits = 0;
    int word = -1;
    bool empty = false;
    auto taken = [&](int k) { return static_cast<unsigned>(r[k]) < static_cast<unsigned>(nrows); };
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      if (!taken(k)) continue;  // past n, or an unsorted indptr
      const int at = r[k] >> 5;  // r[k] / 32
      if (at != word) {
        if (word >= 0) atomicOr(&starts[word], bits);
        word = at;
        bits = 0;
      }
      bits |= 1u << (r[k] & 31);
      empty |= r[k + 1] == r[k];
    }
    if (word >= 0) atomicOr(&starts[word], bits);
    if (empty) {
      crowded = 1;
#pragma unroll
      for (int k = 0; k < kPer; ++k)
        if (taken(k) && r[k + 1] == r[k]) on_empty(i0 + k);
    }
  }
}

// indptr entries per thread for a block's first tile, expected to hold
// `expected` starts. The tiles after it read the most entries (max_steps), not
// as many as the tile before held: a tile that holds more starts than were read
// ahead waits on a further round of indptr reads, and power-law tiles differ
// widely.
// Measurements: docs/kernel-notes.md, "walk_steps".
__device__ __forceinline__ int walk_steps(int64_t expected, int max_steps) {
  return static_cast<int>(
      imin(max_steps, imax(1, ceil_div(expected + expected / 4 + 2, kThreads))));
}

// Segment starts expected in a tile, from the mean segment length.
__device__ __forceinline__ int64_t starts_per_tile(int64_t segments, int64_t rows, int tile_rows) {
  const double per_row = static_cast<double>(segments + 1) / static_cast<double>(rows);
  return static_cast<int64_t>(per_row * tile_rows < 1e9 ? per_row * tile_rows : 1e9);
}

// ---------------------------------------------------------------------------
// Narrow rows (at most 16 bytes) are staged through shared memory. In the
// tile sum a warp loads 512 contiguous bytes per instruction, then each
// thread reads its run of rows back with 16-byte loads; a unit of padding
// after every 8 units (stage_unit) puts the 8 threads of a 16-byte shared
// access on distinct banks both ways (store_stage, read_run). The tile gather
// goes the other way, each thread writing its run and each warp storing its
// own runs' units: runs kUnits apart, swizzled (write_run, store_warp_units).

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

// The 16-byte units [0, bytes) of a tile starting at `base` (16-byte aligned);
// unit k * kThreads + tid goes to this thread's staged[k], zeros past the end.
template <int kUnits, typename T>
__device__ __forceinline__ void load_stage(uint4 (&staged)[kUnits], const T* base, int bytes) {
  // A whole tile (every tile of a block but at most its last): every unit whole,
  // no bound to test, as in store_warp_units: the four loads go out back to
  // back, where the per-unit tests and their branches were about a third of the
  // instructions at the tile's top. Cache hints on these loads tied.
  // Measurements: docs/kernel-notes.md, "load_stage".
  if (bytes == kUnits * kThreads * 16) {
    const uint4* from = reinterpret_cast<const uint4*>(base) + threadIdx.x;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) staged[k] = from[k * kThreads];
    return;
  }
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

// The tile sum's stage: unit u of the tile at u + u / 8, a unit of padding after
// every 128 bytes. The 8 threads of each of store_stage's 16-byte stores write 8
// consecutive units of the stage, and read_run's 8 threads (unit k of runs t to
// t + 7, at 4t + t / 2 + k) meet 8 distinct bank groups too (runs of 4 units: 0,
// 4, 1, 5, 2, 6, 3, 7). Each thread's units lie at one base plus constants both
// ways. Padded per run instead, every store took 8 wavefronts a warp, not 4; the
// gather's swizzle (stage_swizzle) took more instructions here.
// Measurements: docs/kernel-notes.md, "stage_unit".
template <int kUnits>
__host__ __device__ constexpr int stage_unit(int u) {
  static_assert(kUnits == 4, "runs of 4 units: 2 per 8-unit group of banks");
  return u + u / 8;
}

template <int kUnits>
constexpr int kStageSize = stage_unit<kUnits>(kThreads * kUnits - 1) + 1;

template <int kUnits>
__device__ __forceinline__ void store_stage(uint4* stage, const uint4 (&staged)[kUnits]) {
  // Unit k * kThreads + tid: k * kThreads is a multiple of 8, so the padding
  // before it is k * kThreads / 8 + tid / 8.
  static_assert(kThreads % 8 == 0, "k * kThreads / 8 exact");
  const int tid = static_cast<int>(threadIdx.x);
  uint4* to = stage + stage_unit<kUnits>(tid);
#pragma unroll
  for (int k = 0; k < kUnits; ++k) to[stage_unit<kUnits>(k * kThreads)] = staged[k];
}

// This thread's run, as kUnits * 16 bytes of consecutive rows (stage_unit:
// 4 units at tid * 4 + tid / 2, never across the padding).
template <int kUnits>
__device__ __forceinline__ void read_run(const uint4* stage, uint4 (&run)[kUnits]) {
  const int tid = static_cast<int>(threadIdx.x);
  const uint4* from = stage + stage_unit<kUnits>(tid * kUnits);
#pragma unroll
  for (int k = 0; k < kUnits; ++k) run[k] = from[k];
}

// The tile gather's stage holds runs unpadded, kUnits units apart, with unit k
// of run t at k ^ stage_swizzle(t) within it. With the swizzle both the writes
// (8 threads: runs t..t+7, the same k) and store_warp_units' reads (8 lanes: two
// runs, each whole) hit 8 distinct bank groups, and the stage takes 4 KB less;
// the padded stage (runs kUnits + 1 units apart) served the writes but put each
// of those reads on 8 wavefronts, not 4.
// Measurements: docs/kernel-notes.md, "stage_swizzle".
template <int kUnits>
__device__ __forceinline__ int stage_swizzle(int run) {
  static_assert(kUnits == 4, "runs of 4 units: two per 128 bytes of banks");
  return (run >> 1) & (kUnits - 1);
}

// This thread's run into its place in the tile gather's stage (stage_swizzle).
template <int kUnits>
__device__ __forceinline__ void write_run(uint4* stage, const uint4 (&run)[kUnits]) {
  const int t = static_cast<int>(threadIdx.x);
  const int s = stage_swizzle<kUnits>(t);
#pragma unroll
  for (int k = 0; k < kUnits; ++k) stage[t * kUnits + (k ^ s)] = run[k];
}

// The stage's 16-byte units [0, bytes) to `base`, each warp storing those of
// its own threads' runs: unit k * 32 + lane of the warp's 32 * kUnits, so a
// warp stores 512 contiguous bytes per instruction, as a copy does. A warp
// reads back only what its own lanes wrote to the stage (write_run), so a
// warp barrier, not a block one, orders the two (tile_gather_block).
template <int kUnits, typename T>
__device__ __forceinline__ void store_warp_units(T* base, const uint4* stage, int bytes) {
  constexpr int kWarp = 32;
  static_assert(kWarp % kUnits == 0 && kThreads % kWarp == 0,
                "a warp's step of units starts a run");
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp;
  // The warp's unit k * kWarp + lane lies in its run tid - lane + (k * kWarp
  // + lane) / kUnits, as unit lane % kUnits of it.
  const int unit = (tid - lane) * kUnits + lane;
  // Its swizzle (write_run) is the same for every k: runs k * kWarp / kUnits
  // apart share (run >> 1) & 3. Those runs lie k * kWarp units further on in
  // the unpadded stage, as the units do in out.
  const int run = tid - lane + lane / kUnits;
  const uint4* from = stage + run * kUnits + (lane % kUnits ^ stage_swizzle<kUnits>(run));
  static_assert(kWarp / kUnits % 8 == 0, "a step keeps the swizzle");
  if (bytes == kUnits * kThreads * 16) {  // a whole tile: every unit whole, no bound to test
    uint4* to = reinterpret_cast<uint4*>(base) + unit;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) to[k * kWarp] = from[k * kWarp];
    return;
  }
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int offset = (unit + k * kWarp) * 16;
    if (offset >= bytes) continue;
    const uint4 w = from[k * kWarp];
    T* p = reinterpret_cast<T*>(reinterpret_cast<char*>(base) + offset);
    if (offset + 16 <= bytes) {
      *reinterpret_cast<uint4*>(p) = w;
    } else {  // only the very end of out
      constexpr int kVec = 16 / static_cast<int>(sizeof(T));
      Pack<T, kVec> u16;
      memcpy(&u16, &w, 16);
      const int count = (bytes - offset) / static_cast<int>(sizeof(T));
#pragma unroll
      for (int i = 0; i < kVec; ++i)
        if (i < count) p[i] = u16.v[i];
    }
  }
}

// segment_sum

// W column sums.
template <typename Acc, int W>
struct Partial {
  Acc v[W];
};

template <typename Acc, int W>
struct AddPartials {
  __device__ __forceinline__ Partial<Acc, W> operator()(const Partial<Acc, W>& a,
                                                        const Partial<Acc, W>& b) const {
    Partial<Acc, W> r;
#pragma unroll
    for (int k = 0; k < W; ++k) r.v[k] = a.v[k] + b.v[k];
    return r;
  }
};

// A run's open partial: the sum of its rows after its last segment start, or of
// all its rows when none starts in it (closed = 0). Combining restarts at a
// closed right operand, so a segmented sum is a plain scan. `closed` counts the
// starts (or is 1 for any): combined, the counts add, so the storeless walk's
// exclusive scan also gives each run the starts before it, and that walk needs
// no count scan of its own. The sums are those of a flag: the order of the
// additions is unchanged.
// Measurements: docs/kernel-notes.md, "RunSum".
template <typename Acc, int W>
struct RunSum {
  int closed;
  Partial<Acc, W> sum;
};

template <typename Acc, int W>
struct RunSumOp {
  __device__ __forceinline__ RunSum<Acc, W> operator()(const RunSum<Acc, W>& a,
                                                       const RunSum<Acc, W>& b) const {
    if (b.closed) return {a.closed + b.closed, b.sum};
    return {a.closed, AddPartials<Acc, W>()(a.sum, b.sum)};
  }
};

// cub's raking BlockScan (the default algorithm) of kThreads items, exclusive
// with an initial value, written out so that the warps it leaves idle can
// work between its two barriers: the same combines of the same operands in
// the same order (cub 3.0, BlockScanRaking::ExclusiveScan with an initial
// value: BlockRakingLayout, WarpScanShfl, ThreadScanExclusive), so the sums
// are bit for bit cub's. The caller places each thread's item at
// rake_slot(tid), waits on a barrier, runs rake_scan in warp 0 (threads 0 to
// 31), waits on a second barrier and reads its exclusive result back from its
// slot.
constexpr int kRakeLength = kThreads / 32;  // items per raking thread
// cub pads each raking thread's items by one when their count is even and
// above 2 (bank conflicts); kept, so the layout is cub's.
constexpr int kRakePad = kRakeLength % 2 == 0 && kRakeLength > 2 ? 1 : 0;
constexpr int kRakeItems = 32 * (kRakeLength + kRakePad);
static_assert(kThreads % 32 == 0 && kThreads > 32, "whole raking segments, several warps");

__device__ __forceinline__ int rake_slot(int tid) { return tid + tid / kRakeLength * kRakePad; }

// x from the lane d below (its own below lane d), a 4-byte word at a time, as
// cub's ShuffleUp; only lanes 0 to 31 call it.
template <typename Item>
__device__ __forceinline__ Item shuffle_up(const Item& x, int d) {
  static_assert(sizeof(Item) % 4 == 0, "whole words");
  uint32_t w[sizeof(Item) / 4];
  memcpy(w, &x, sizeof(Item));
#pragma unroll
  for (int k = 0; k < static_cast<int>(sizeof(Item) / 4); ++k) {
#if defined(__HIP_PLATFORM_AMD__)
    w[k] = __shfl_up(w[k], d, 32);
#else
    w[k] = __shfl_up_sync(0xffffffffu, w[k], d);
#endif
  }
  Item y;
  memcpy(&y, w, sizeof(Item));
  return y;
}

template <bool kReread, typename Item, typename Op>
__device__ __forceinline__ void rake_scan(Item* grid, const Item& initial, Op op) {
  const int lane = threadIdx.x;  // < 32
  Item* const seg = grid + lane * (kRakeLength + kRakePad);
  const Item first = initial;  // read with the items, off the chain below
  Item cached[kRakeLength];
  // Upsweep: this lane's items, reduced left to right.
#pragma unroll
  for (int i = 0; i < kRakeLength; ++i) cached[i] = seg[i];
  Item inclusive = cached[0];
#pragma unroll
  for (int i = 1; i < kRakeLength; ++i) inclusive = op(inclusive, cached[i]);
  // The warp's inclusive scan (Kogge-Stone, the lower lanes' partial on the
  // left), the initial value combined on the left, then shifted up a lane.
#pragma unroll
  for (int d = 1; d < 32; d *= 2) {
    const Item lower = shuffle_up(inclusive, d);
    const Item sum = op(lower, inclusive);
    if (lane >= d) inclusive = sum;
  }
  inclusive = op(first, inclusive);
  Item prefix = shuffle_up(inclusive, 1);
  if (lane == 0) prefix = first;
  // Downsweep: the exclusive scan of the lane's items after its prefix. With
  // kReread the items are read again (no other thread writes them between the
  // barriers) rather than held through the warp scan: 16 registers fewer at
  // warp 0's peak, which set the tile sum's at 64 registers (bf16, 1 column:
  // 40 bytes spilled with them held; SASS, sm_90).
#pragma unroll
  for (int i = 0; i < kRakeLength; ++i) {
    const Item next = op(prefix, kReread ? seg[i] : cached[i]);
    seg[i] = prefix;
    prefix = next;
  }
}

// Runs of one column take the storeless walk (tile_sum_block), runs of 2 the
// walk that stores as it goes: the storeless one spilled there and lost
// (bf16, 2 columns, power law 69.6 -> 66.4 % of copy bandwidth, H100).
template <int W>
constexpr bool kStorelessWalk = W == 1;

template <typename T, int W, bool kLean = false>
struct TileSumShared {
  using Acc = typename Num<T>::acc;
  // A run's sum of one float scans with cub's default, raking scan, wider ones
  // with warp scans (the raking scan lost on 2 columns). (hipify maps neither
  // the raking enumerator nor the algorithm's type: the default names it.)
  // Measurements: docs/kernel-notes.md, "TileSumShared::Scan".
  using Scan =
      std::conditional_t<sizeof(RunSum<Acc, W>) <= 8, cub::BlockScan<RunSum<Acc, W>, kThreads>,
                         cub::BlockScan<RunSum<Acc, W>, kThreads, cub::BLOCK_SCAN_WARP_SCANS>>;
  using CountScan = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  // Runs of one float scan with rake_scan instead, in the same storage, so
  // that store_closed (tile_sum_block) runs between its barriers.
  // ROCm keeps its library scan (its own combine order, and so its sums).
#if defined(__HIP_PLATFORM_AMD__)
  static constexpr bool kSplitScan = false;
#else
  static constexpr bool kSplitScan = kStorelessWalk<W> && sizeof(RunSum<Acc, W>) <= 8;
#endif
  union {
    typename Scan::TempStorage scan;
    std::conditional_t<kSplitScan, RunSum<Acc, W>[kRakeItems], char[1]> rake;  // no larger
  };
#if !defined(__HIP_PLATFORM_AMD__)
  // rake_scan copies cub's raking layout: a CCCL that changes it stops the
  // build here instead of changing the sums. Scan is then cub's raking scan,
  // whose storage holds that layout, so the union does not grow.
  static_assert(cub::BlockRakingLayout<RunSum<Acc, W>, kThreads>::GRID_ELEMENTS == kRakeItems,
                "rake_scan's layout is cub's");
  static_assert(!kSplitScan ||
                    sizeof(RunSum<Acc, W>[kRakeItems]) <= sizeof(typename Scan::TempStorage),
                "rake_scan's items fit in the scan's storage");
#endif
  typename CountScan::TempStorage count_scan;  // its own: no barrier between the two scans
  using G = Geometry<T, W>;
  static_assert(G::kRunRows <= 32 && 32 % G::kRunRows == 0, "a run's starts fit one mask word");
  int counts[3];
  Acc quiet_sums[kThreads / 32];  // a warp's rows of quiet tiles (tile_sum_block)
  int crowded;           // some row of the tile starts several segments
  // tile_sum_block's first owned segment and head (or -1), written by thread
  // 0 before the first barrier and read where they are needed: in registers
  // through the storeless walk, the kernel's register peak, they cost a spill
  // at 64 registers (bf16, 1 column; SASS, sm_90). Kept beside the carry,
  // only where 64 registers are the budget (kLean); other kernels keep them
  // in registers and this layout unchanged.
  struct CarryOwn : RunSum<Acc, W> {
    using RunSum<Acc, W>::operator=;
    int64_t own, head;
  };
  // the segment open at the tile's start: its sum so far
  std::conditional_t<kLean, CarryOwn, RunSum<Acc, W>> carry;
  uint32_t starts[G::kTileRows / 32];  // bit r: a segment starts at row r
  alignas(16) int window[kWindow];
  // The storeless walk's per-row sums, over the stage once every run is read
  // from it: a run's kRunRows * W floats, then a group of padding, so that the
  // threads of one store's phase (8 for 16-byte stores, 16 for 8-byte ones) meet
  // no bank twice. Groups of 4 floats, one 16-byte store each, where pairs had
  // taken twice the store instructions (bf16, 1 column: 48,520 bytes of static
  // shared memory, of 49,152). Lean kernels (fp32, 1 column, short segments, 4
  // blocks per SM) keep pairs: not timed with groups of 4.
  // Measurements: docs/kernel-notes.md, "TileSumShared::kSumsGroup".
  static constexpr int kSumsGroup = !kLean && sizeof(Acc) == 4 ? 4 : 2;
  static constexpr int kSumsStride = G::kRunRows * W + kSumsGroup;
  static constexpr int kSums = kStorelessWalk<W> ? kThreads * kSumsStride : kSumsGroup;
  struct alignas(kSumsGroup * sizeof(Acc)) AccGroup {
    Acc v[kSumsGroup];
  };
  union {
    uint4 stage[kStageSize<G::kStageUnits>];  // a unit of padding per 8 (stage_unit)
    AccGroup sums[kSums / kSumsGroup];
  };
};

// tile_sum_block's own and head segments, read from shared memory in lean
// kernels (TileSumShared::CarryOwn), from their registers in the others.
// (Lambdas in their place changed the other kernels' SASS.)
template <bool kLean, typename Carry>
__device__ __forceinline__ int64_t block_own(const Carry& carry, int64_t own) {
  if constexpr (kLean) {
    return carry.own;
  } else {
    return own;
  }
}

template <bool kLean, typename Carry>
__device__ __forceinline__ int64_t block_head(const Carry& carry, int64_t head) {
  if constexpr (kLean) {
    return carry.head;
  } else {
    return head;
  }
}

// One block's row range, tile by tile. A tile is loaded with coalesced 16-byte
// loads into shared memory, with its segment starts beside it. Thread g sums its
// run of kRunRows consecutive rows in one pass: the rows before its first start
// (the head) wait for a segmented scan over the runs, which gives the sum of the
// earlier rows of that segment; the segments that start and end inside the run
// are written at once (the walk that stores as it goes, rows of 2 columns), or
// after the scan, each by a thread of its own, from the rows' segmented sums
// that the walk leaves in shared memory (the storeless walk, rows of 1 column).
// The tile is bound by instruction issue: the walk's instructions per row are
// what it had to lose, which the storeless walk did. Dropped: staging with
// cp.async, a split chain of adds, plain sums of tiles without a start (before
// kTileSegmentCost made quiet tiles pay), blocks of one warp, summing by segment
// (a thread, warp or block each), and a design of bit-marked starts with
// per-thread resets.
// Measurements: docs/kernel-notes.md, "tile_sum_block".
template <typename T, int W, bool kShort>
__device__ __forceinline__ void tile_sum_block(
    const T* __restrict__ src, const int64_t* __restrict__ indptr, T* __restrict__ out,
    int64_t rows, int64_t segments, int64_t inner, const BlockRows& range,
    const Crossing<typename Num<T>::acc>& cross,
    TileSumShared<T, W, kLeanTileSum<T, W, kShort>>& sm) {
  using Acc = typename Num<T>::acc;
  using G = Geometry<T, W>;
  using Item = RunSum<Acc, W>;
  using Shared = TileSumShared<T, W, kLeanTileSum<T, W, kShort>>;
  using Scan = typename Shared::Scan;
  using CountScan = typename Shared::CountScan;
  // The register cuts that fit 64 registers (kTileSumBlocksPerSm): where 3
  // blocks per SM leave 80, the code before them runs.
  constexpr bool kLean = kLeanTileSum<T, W, kShort>;
  constexpr int kRun = G::kRunRows;
  const int tid = threadIdx.x;
  // Blocks of kThreads threads (the launch): drops the tests of k * kThreads
  // + tid against kWindow and the like.
  __builtin_assume(tid >= 0 && tid < kThreads);
  const int64_t block = blockIdx.x;
  const int64_t r0 = range.r0, r1 = range.r1;

  uint4 staged[G::kStageUnits];
  auto load_tile = [&](int64_t t0) {
    const int64_t t1 = imin(r1, t0 + G::kTileRows);
    load_stage(staged, src + t0 * W, static_cast<int>(t1 - t0) * G::kRowBytes);
  };
  load_tile(r0);
  if (tid < 3) sm.counts[tid] = 0;
  clear_marks<G::kTileRows / 32>(sm.starts);
  if (tid == 0) {
    sm.carry.closed = 0;
#pragma unroll
    for (int k = 0; k < W; ++k) sm.carry.sum.v[k] = 0;
  }

  int64_t first = range.first;
  // The segment open at r0 that began in an earlier block: its partial sum
  // goes to the workspace (head); the fix-up kernel adds it to the owner's.
  const int64_t head = head_segment(indptr, segments, rows, r0, first);
  if (tid == 0 && cross.head_key != nullptr) cross.head_key[block] = head;
  // Segments before this one were finished by earlier blocks.
  const int64_t own = head >= 0 ? head : first;
  if constexpr (kLean) {
    if (tid == 0) {
      sm.carry.own = own;
      sm.carry.head = head;
    }
  }

  auto flush = [&](int64_t s, const Acc (&v)[W]) {
    if (s < block_own<kLean>(sm.carry, own) || s >= segments) return;
    if (s == block_head<kLean>(sm.carry, head)) {
      Acc* dst = cross.head_val + block * inner;
#pragma unroll
      for (int k = 0; k < W; ++k) dst[k] = v[k];
    } else {
      store_sum<T, W>(out + s * W, v);
    }
  };
  auto zero = [&](int64_t s) {
    if (s >= block_own<kLean>(sm.carry, own) && s < segments)
      store_pack(out + s * W, zero_pack<T, W>());
  };

  int round = 0;
  // Starts read a tile ahead, in entries per thread. Over short segments a tile
  // of 4-byte rows (4096 rows) reads 4 too, not 2: on the power law it holds up
  // to 1100 starts, which 2 left to a second round that waited on memory. Tiles
  // of 2-byte rows of 1 column (8192 rows) read 8, 2048 entries, as low words
  // (fetch_starts), in the registers that 4 entries of 64 bits took: their
  // power-law tiles hold up to 2200 starts. Over long segments a tile holds few
  // starts: they keep G::kPrefetch. Low words are exact below 2^32 rows only:
  // from there nothing is read ahead (steps 0).
  // Measurements: docs/kernel-notes.md, "tile_sum_block: kAhead".
  constexpr int kAhead =
      kShort ? imax(kWindowSteps, G::kTileRows / (4 * kThreads)) : G::kPrefetch;
  const bool read_ahead = low_words_exact(rows);
  int steps =
      read_ahead ? walk_steps(starts_per_tile(segments, rows, G::kTileRows), kAhead) : 0;
  uint32_t raw[kAhead];
  fetch_starts(indptr, segments, first, steps, raw);
  // Quiet tiles (no segment starts in them: on the power law, those inside its
  // long segments) need neither marks, walk nor scan: every row adds to the
  // segment open at the carry. Each thread adds its run to quiet_sum, and the
  // warps' totals join the carry, in a fixed order, before the next scan reads
  // it (or at the block's end): two barriers a quiet tile (the tile's first and
  // the window's count) where there were five. kTileSegmentCost says how that
  // changed the blocks' shares. Skipping the stage and window too, for the quiet
  // tiles after a quiet one, gained nothing.
  // Measurements: docs/kernel-notes.md, "tile_sum_block: quiet tiles".
  constexpr bool kQuiet = kQuietTiles<T, W, kShort>;
  static_assert(!kQuiet || Shared::kSplitScan, "the fold goes before rake_scan reads the carry");
  Acc quiet_sum = 0;
  bool quiet_since_scan = false;  // the same in every thread
  auto post_quiet = [&] {  // before a barrier that fold_quiet follows
    Acc warp_sum = quiet_sum;
#if !defined(__HIP_PLATFORM_AMD__)  // (kQuietTiles: never called on ROCm)
#pragma unroll
    for (int d = 16; d > 0; d /= 2) warp_sum += __shfl_down_sync(0xffffffffu, warp_sum, d);
#endif
    if (tid % 32 == 0) sm.quiet_sums[tid / 32] = warp_sum;
    quiet_sum = 0;
  };
  auto fold_quiet = [&] {  // thread 0
    Acc total = 0;
#pragma unroll
    for (int k = 0; k < kThreads / 32; ++k) total += sm.quiet_sums[k];
    sm.carry.sum.v[0] += total;
  };
  for (int64_t t0 = r0; t0 < r1; t0 += G::kTileRows) {
    const int nrows = static_cast<int>(imin(r1, t0 + G::kTileRows) - t0);
    __syncthreads();  // the previous tile's window, stage and carry are read
    store_stage(sm.stage, staged);
    if (tid == 0) sm.crowded = 0;
    const bool more = t0 + G::kTileRows < r1;
    // The next tile's rows go out as soon as staged is free, before the window:
    // they need nothing from it, and the window's rounds wait on a barrier each
    // (and on indptr where a tile holds more starts than were read ahead) with
    // no src bytes of this block in flight. The starts read ahead wait for the
    // window's count.
    // Measurements: docs/kernel-notes.md, "tile_sum_block: early loads".
    if (more) load_tile(t0 + G::kTileRows);
    const Window w{first, load_window<WindowCount::kWarpAtomic>(indptr, segments, rows, t0, nrows,
                                                                first, steps, raw, sm.window,
                                                                sm.counts, round)};
    // A quiet tile leaves first, so the entries read ahead are those the next
    // tile wants, unless this was the first tile, which may have read fewer
    // steps. Read again, they cost fp32, 1 column, power law 0.5 points.
    const bool same_entries = kQuiet && w.n == 0 && steps == (read_ahead ? kAhead : 0);
    if (more && !same_entries) {  // raw is free again
      steps = read_ahead ? kAhead : 0;
      fetch_starts(indptr, segments, first + w.n, steps, raw);
    }
    if constexpr (kQuiet) {
      if (w.n == 0) {  // the stage is whole (the window's barrier)
        uint4 run[G::kStageUnits];
        read_run(sm.stage, run);
        uint32_t v[sizeof(run) / 4];
        memcpy(v, run, sizeof(v));
#pragma unroll
        for (int q = 0; q < kRun; ++q) quiet_sum += word_elem<T>(v, q);
        quiet_since_scan = true;
        continue;  // no marks set, none to clear; first stays
      }
      if (quiet_since_scan) post_quiet();  // the marks' barrier comes before fold_quiet
    }
    // This thread's run of the stage, read here: the window's barrier made the
    // stage whole, and the marks' barrier below then lets the storeless walk
    // write its sums over it, with no barrier of its own (one barrier a tile
    // fewer). Lean kernels read it after mark_starts, not before: its 16
    // registers live through it were the kernel's register peak.
    // Measurements: docs/kernel-notes.md, "tile_sum_block: reading the run".
    uint4 run[G::kStageUnits];
    if constexpr (!kLean) read_run(sm.stage, run);
    auto start = [&](int64_t i) {
      return i < w.n ? window_start(sm.window, indptr, rows, t0, w, i) : INT_MAX;
    };
    // Segments without rows are zeroed here.
    mark_starts(w.n, nrows, sm.window, start, sm.starts, sm.crowded,
                [&](int64_t i) { zero(first + i); });
    if constexpr (kLean) read_run(sm.stage, run);
    __syncthreads();

    // This run's rows [a, a + kRun), segment first - 1 + j being the one open
    // at row a.
    const int a = tid * kRun;
    constexpr uint32_t kRunMask = kRun == 32 ? ~0u : (1u << kRun) - 1;
    const uint32_t marks = sm.starts[a / 32] >> (a % 32) & kRunMask;
    // Few starts (long segments): a warp rarely meets one at a given row, and
    // a branch there costs less than the predicated walk below and its scan.
    // The storeless walk is cheaper still: every uncrowded tile takes it.
    const bool predicated = kShort && !sm.crowded && (kStorelessWalk<W> || w.n > kThreads / 4);
    // The storeless walk takes the starts before its run from the run scan
    // (RunSum), and needs no count scan; in lean kernels the other walk then
    // searches the window inside its branch, where, over short segments, the
    // run is not live (below).
    constexpr bool kCountInScan = kStorelessWalk<W>;
    constexpr bool kSearchInWalk = kLean && kCountInScan;
    auto search_before = [&] {
      return starts_before<CountScan>(a, marks, predicated, sm.count_scan, sm.window, indptr,
                                      rows, t0, w);
    };
    int64_t j = 0;
    if constexpr (!kSearchInWalk) j = kCountInScan && predicated ? 0 : search_before();
    uint32_t v[sizeof(run) / 4];  // the rows' elements, read by word_elem
    memcpy(v, run, sizeof(v));
    int64_t closed = -1;  // the segment that ends first in this run
    Acc head_sum[W], acc[W];
#pragma unroll
    for (int k = 0; k < W; ++k) head_sum[k] = acc[k] = 0;
    if (predicated) {
      // The first start closes the segment open at a, which may have begun
      // in an earlier run: its sum waits for the scan. Every later start
      // closes one that began in this run, complete: it is written at once.
      // A segment ends in some lane of a warp at nearly every row, so the
      // loop is kept to predicated bit tests rather than branches.
      const uint32_t first_mark = marks & (0u - marks);
      if constexpr (kStorelessWalk<W>) {
        // Each row's segmented sum goes to shared memory and the walk stores
        // nothing: the segments that a later mark of the run closes are
        // stored after the scan, by a thread per segment, coalesced; the
        // head's sum is read back here.
        using AccGroup = typename Shared::AccGroup;
        constexpr int kGroup = Shared::kSumsGroup;
        static_assert(kRun * W % kGroup == 0, "sums go out in whole groups");
        AccGroup* mine = sm.sums + tid * (Shared::kSumsStride / kGroup);
        Acc sums[kRun * W];
#pragma unroll
        for (int q = 0; q < kRun; ++q) {
#pragma unroll
          for (int k = 0; k < W; ++k) {
            acc[k] = (marks >> q) & 1u ? Acc(0) : acc[k];
            acc[k] += word_elem<T>(v, q * W + k);
            sums[q * W + k] = acc[k];
          }
        }
#pragma unroll
        for (int u = 0; u < kRun * W / kGroup; ++u) {
          AccGroup group;
#pragma unroll
          for (int i = 0; i < kGroup; ++i) group.v[i] = sums[kGroup * u + i];
          mine[u] = group;
        }
        if (first_mark > 1u) {  // rows before the first mark: the head's
          const int p = __ffs(static_cast<int>(first_mark)) - 1;
          const Acc* row = mine[0].v + (p - 1) * W;
#pragma unroll
          for (int k = 0; k < W; ++k) head_sum[k] = row[k];
        }
      } else {
        const uint32_t later_marks = marks ^ first_mark;
        // Stores stay below `segments` even for an unsorted indptr: the window
        // holds only entries s <= segments (first + w.n <= segments + 1), and
        // the tile marks at most w.n rows, so the last written is first + j +
        // popc(marks) - 2 <= segments - 1.
        T* dst = out + (first + j) * W;  // the segment begun at the first mark
#pragma unroll
        for (int q = 0; q < kRun; ++q) {
          if ((later_marks >> q) & 1u) {
            store_sum<T, W>(dst, acc);
            dst += W;
          }
#pragma unroll
          for (int k = 0; k < W; ++k) {
            head_sum[k] = (first_mark >> q) & 1u ? acc[k] : head_sum[k];
            acc[k] = (marks >> q) & 1u ? Acc(0) : acc[k];
            acc[k] += word_elem<T>(v, q * W + k);
          }
        }
      }
      if (marks) closed = kCountInScan ? 0 : first - 1 + j;  // storeless: after the scan
    } else {
      if constexpr (kSearchInWalk) j = search_before();  // no barrier: predicated is false
      // A segment's total is written when the row after it starts another:
      // the first such total waits for the scan (it may have begun in an
      // earlier run); the others began in this run and are complete.
      auto end_segment = [&](int64_t s) {
        if (closed < 0) {
          closed = s;
#pragma unroll
          for (int k = 0; k < W; ++k) head_sum[k] = acc[k];
        } else if (s < segments) {  // always, unless indptr is unsorted
          store_sum<T, W>(out + s * W, acc);
        }
#pragma unroll
        for (int k = 0; k < W; ++k) acc[k] = 0;
      };
      // Over short segments, rows of 1 column come here on crowded tiles
      // alone (predicated is !sm.crowded): lean kernels keep the loop below.
      constexpr bool kCrowdedOnly = kLean && kShort && kStorelessWalk<W>;
      if (!kCrowdedOnly && !sm.crowded) {  // one start per marked row
#pragma unroll
        for (int q = 0; q < kRun; ++q) {
          if ((marks >> q) & 1u) end_segment(first - 1 + j++);
#pragma unroll
          for (int k = 0; k < W; ++k) acc[k] += word_elem<T>(v, q * W + k);
        }
      } else {
        // Lean kernels read the rows from the stage, not from v: predicated
        // is the same in every thread and false here, so no storeless walk
        // writes its sums over the stage before the next tile's first
        // barrier. With v live through this loop and its search, this rarely
        // run branch (crowded tiles: only segments without rows make them)
        // held the kernel's register peak (SASS, sm_90, bf16, 1 column, at 64
        // registers: 84 -> 64 bytes spilled, and 0 with the other cuts; same
        // values, same order of adds).
        const uint32_t* row_words =
            kLean ? reinterpret_cast<const uint32_t*>(
                        sm.stage + stage_unit<G::kStageUnits>(tid * G::kStageUnits))
                  : v;
        int next = start(j);
#pragma unroll
        for (int q = 0; q < kRun; ++q) {
          const int r = a + q;
          if (r == next) {
            end_segment(first - 1 + j);
            do next = start(++j);
            while (next == r);  // rows without segments, zeroed above
          }
#pragma unroll
          for (int k = 0; k < W; ++k) acc[k] += word_elem<T>(row_words, q * W + k);
        }
      }
    }

    Item item, before;
    item.closed = kCountInScan && predicated ? __popc(marks) : closed >= 0;
#pragma unroll
    for (int k = 0; k < W; ++k) item.sum.v[k] = acc[k];
    // The storeless walk's segments closed in their run, stored by threads c
    // = 0, 1, ... of kClosers, once every run's sums are in place (a barrier).
    auto store_all_closed = [&](int c, auto closers) {
      constexpr int kClosers = decltype(closers)::value;
      // Segment i is closed in its run when the next start falls in the same
      // run; its sum is then the row's before that start. Kept lean, window
      // entries alone in the loop: with start(i) and 64-bit indices it took 56
      // instructions a segment, and most of the walk's gain was lost.
      // Measurements: docs/kernel-notes.md, "tile_sum_block: store_all_closed".
      // The checks keep a malformed indptr's rows inside the tile's sums: s0 in
      // the tile, s1 - 1 in s0's run. Testing s0 >= 0 alone let a start past the
      // tile (a later round's entry, or one no round wrote) read shared memory
      // hundreds of KB past the sums.
      constexpr int kStride = Shared::kSumsStride;
      const Acc* sums = sm.sums[0].v;
      auto closed_in_run = [](int s0, int s1) {
        return static_cast<unsigned>(s0) < static_cast<unsigned>(G::kTileRows) && s1 > s0 &&
               ((s0 ^ s1) & -kRun) == 0;
      };
      // Row x of run x / kRun is at x * W + x / kRun * (kStride - kRun * W);
      // 32-bit and unsigned (s1 > s0 >= 0 once closed_in_run passes, so the
      // row s1 - 1 is too). The row s1 - 1 lies in s0's run (s0 <= s1 - 1 <
      // s1, s0 and s1 in one run), so its run is s0 / kRun, known as soon as
      // s0 is: one instruction fewer a segment (20 -> 19, SASS, sm_90, bf16,
      // 1 column) and one fewer between the window's loads and the sum's
      // (timed with the whole-tile loads, see load_stage).
      auto sum_before = [&](int s0, int s1) {  // the row before s1
        const unsigned x = static_cast<unsigned>(s1 - 1);
        const unsigned run = static_cast<unsigned>(s0) / kRun;
        return sums + (x * W + run * (kStride - kRun * W));
      };
      auto store_closed = [&](int s0, int s1, T* dst) {
        if (!closed_in_run(s0, s1)) return;
        Acc total[W];
        const Acc* row = sum_before(s0, s1);
#pragma unroll
        for (int k = 0; k < W; ++k) total[k] = row[k];
        store_sum<T, W>(dst, total);
      };
      // Per entry: two window reads, the test, the row's sum and the store, with
      // 32-bit indices. Four entries a step, each read issued before the first
      // test, lost.
      // Measurements: docs/kernel-notes.md, "tile_sum_block: store_all_closed".
      const int in_window = static_cast<int>(imin(w.n, kWindow));
      T* dst = out + (first + c) * W;  // segment first + i
      const int* at = sm.window + c;
      const int* const end = sm.window + in_window - 1;
#pragma unroll 2
      for (; at < end; at += kClosers, dst += kClosers * W) store_closed(at[0], at[1], dst);
      for (int64_t i = in_window - 1 + c; i + 1 < w.n; i += kClosers)  // past the window
        store_closed(start(i), start(i + 1), out + (first + i) * W);
    };
    auto flush_head = [&](const Item& before) {
      if (kCountInScan && predicated && closed >= 0) closed = first - 1 + before.closed;
      if (closed >= 0) {
#pragma unroll
        for (int k = 0; k < W; ++k) head_sum[k] += before.sum.v[k];
        flush(closed, head_sum);
      }
    };
    if constexpr (Shared::kSplitScan) {
      // The run scan is cub's raking scan (rake_scan): between its barriers warp
      // 0 alone rakes the 256 items (one dependent chain), and the other 7 warps
      // waited at its second barrier. They store the closed segments there
      // instead, which need only its first barrier; the same sums go to the same
      // rows.
      // Measurements: docs/kernel-notes.md, "tile_sum_block: split scan".
      if constexpr (kQuiet) {
        if (quiet_since_scan) {
          if (tid == 0) fold_quiet();  // the carry, before the barrier rake_scan reads it after
          quiet_since_scan = false;
        }
      }
      Item* const slot = sm.rake + rake_slot(tid);
      *slot = item;
      __syncthreads();  // the items, and every run's sums, in place
      if (tid < 32)
        rake_scan<kLean>(sm.rake, static_cast<const Item&>(sm.carry), RunSumOp<Acc, W>());
      else if (predicated)
        store_all_closed(tid - 32, std::integral_constant<int, kThreads - 32>());
      __syncthreads();
      before = *slot;
      flush_head(before);
    } else {
      const Item carry = sm.carry;
      Scan(sm.scan).ExclusiveScan(item, before, carry, RunSumOp<Acc, W>());
      flush_head(before);
      if constexpr (kStorelessWalk<W>) {  // the scan's barrier put every run's sums in place
        if (predicated) store_all_closed(tid, std::integral_constant<int, kThreads>());
      }
    }
    if (tid == kThreads - 1) {
      sm.carry = RunSumOp<Acc, W>()(before, item);
      sm.carry.closed = 0;  // counts start again with the tile (read as a count alone)
    }
    clear_marks<G::kTileRows / 32>(sm.starts);  // read before the scan
    first += w.n;
  }
  if constexpr (kQuiet) {
    if (quiet_since_scan) post_quiet();
  }
  __syncthreads();
  if constexpr (kQuiet) {
    if (quiet_since_scan && tid == 0) fold_quiet();  // thread 0 alone reads the carry below
  }

  // The segment open at r1: complete here, or a partial for the fix-up.
  const int64_t open = first - 1;
  const bool crossing = open >= 0 && open < segments && start_of(indptr, open + 1, rows) > r1;
  const int64_t head_at_end = block_head<kLean>(sm.carry, head);
  if (tid == 0 && open >= 0 && open < segments) {
    if (crossing && open != head_at_end) {
      Acc* dst = cross.tail_val + block * inner;
#pragma unroll
      for (int k = 0; k < W; ++k) dst[k] = sm.carry.sum.v[k];
    } else {
      flush(open, sm.carry.sum.v);
    }
  }
  if (tid == 0 && cross.tail_key != nullptr)
    cross.tail_key[block] = crossing && open != head_at_end ? open : -1;
  if (r1 == rows)  // segments that start at the last row's end have none
    for (int64_t s = imax(open + 1, 0) + tid; s < segments; s += kThreads) zero(s);
}

// Rows of up to 4 bytes have two sums for short segments, and which one is
// faster depends on how the lengths spread, not on their mean. The lane sum (a
// thread per segment, below) wins while the segments stay short, but a warp of
// lanes runs as long as its longest segment; the tile sum pays the same for
// every row, except that rows starting several segments (empty ones) take its
// slow path. The host cannot look at indptr without waiting for the device, so
// it launches both kernels, each with a gate: a sample of indptr (gated_out)
// picks one, which does the work; the other one's blocks return at once, and one
// fix-up follows both. Inputs under kGateMinBytes skip the gate and keep the
// tile sum: the second kernel and its fix-up would cost more than the better
// kernel saves.
// Measurements: docs/kernel-notes.md, "TailGate, kGateMinBytes".
enum class TailGate { kAny, kShortTail, kLongTail };
constexpr int64_t kGateMinBytes = int64_t{32} << 20;
// Lane sum: segments over this many rows go to its teams. Handing them over from
// 16 or 64 rows, or summing 9- to 256-row segments by sub-teams of 8 or 16
// lanes, lost.
// Measurements: docs/kernel-notes.md, "kLaneRows".
constexpr int kLaneRows = 32;
// Segments sampled per thread, the same ones in every block: 1024 in all, taken
// as 32 runs of 32 consecutive segments (long_tailed), where scattered samples
// were a request to L2 each. Fewer samples were a little faster but are not
// taken: on a Pareto law of alpha 1.1, 256 samples misjudge the tail 6 % of the
// time and 512 1 %, which sends such an input to the lane sum, 12 to 15 % slower
// there; 1024 do so 0.06 % of the time. Where lengths cluster, a wrong pick
// costs speed, never the sums.
// Measurements: docs/kernel-notes.md, "kTailSamples".
constexpr int kTailSamples = 4;

// Whether the sample picks the tile sum: 1 in 40 of the segments or more are
// longer than kLaneRows / 2, and fewer than 1 in 10 are empty. The same
// answer in every block (barriers).
__device__ __forceinline__ bool long_tailed(const int64_t* __restrict__ indptr, int64_t segments,
                                            int64_t rows) {
  constexpr int kSamples = kThreads * kTailSamples;
  __shared__ int tally[2];  // long, empty
  if (threadIdx.x == 0) tally[0] = tally[1] = 0;
  __syncthreads();
  int longs = 0, empties = 0;
  // Runs of 32 consecutive segments, spread evenly: a warp reads a run's starts
  // as one or two lines and takes each next start from the lane after it.
  constexpr int kRuns = kSamples / 32;
  const int lane = static_cast<int>(threadIdx.x % 32), warp = static_cast<int>(threadIdx.x / 32);
  int64_t at[kTailSamples], start[kTailSamples];
#pragma unroll
  for (int k = 0; k < kTailSamples; ++k) {  // every load before any use
    at[k] = segments * (k * (kThreads / 32) + warp) / kRuns + lane;
    start[k] = start_of(indptr, imin(at[k], segments - 1), rows);
  }
#pragma unroll
  for (int k = 0; k < kTailSamples; ++k) {
    const int64_t next = cub::ShuffleDown<32>(start[k], 1, 31, 0xffffffffu);
    // Lane 31, and a lane whose next one was clamped to the last segment,
    // read their end themselves.
    const int64_t s = imin(at[k], segments - 1);
    const bool own = lane == 31 || at[k] + 1 >= segments;
    const int64_t len = (own ? start_of(indptr, s + 1, rows) : next) - start[k];
    longs += len > kLaneRows / 2;
    empties += len == 0;
  }
  if (longs > 0) atomicAdd(&tally[0], longs);
  if (empties > 0) atomicAdd(&tally[1], empties);
  __syncthreads();
  return tally[0] * 40 >= kSamples && tally[1] * 10 < kSamples;
}

// Whether this block's kernel is gated out. The lane sum, launched first,
// samples indptr, and its block 0 records the answer (for the tile sum, and for
// the fix-up both share); the tile sum's blocks, which wait for the lane sum to
// end (launch_after), read it instead of sampling again. Without a workspace (a
// single block) both sample. The gate costs its sample, a few us a call, and
// little more. Dropped: the tile sum's blocks finding their rows before they
// wait (a trade, not a gain), one shared memory carveout for both kernels, and
// the gate the other way round (the tile sum first).
// Measurements: docs/kernel-notes.md, "gated_out".
template <typename Acc>
__device__ __forceinline__ bool gated_out(TailGate gate, const int64_t* __restrict__ indptr,
                                          int64_t segments, int64_t rows,
                                          const Crossing<Acc>& cross) {
  if (gate == TailGate::kAny) return false;
  if (gate == TailGate::kLongTail) {
    // Launched after the lane sum (launch_after): every block waits for it,
    // so that nothing after this kernel on the stream overtakes it.
    wait_for_prerequisites();
    if (cross.picked != nullptr)
      return *static_cast<volatile const int*>(cross.picked) == 0;  // written by the lane sum
  }
  const bool long_tail = long_tailed(indptr, segments, rows);
  if (gate == TailGate::kShortTail && blockIdx.x == 0 && threadIdx.x == 0 &&
      cross.picked != nullptr)
    *cross.picked = long_tail;
  return long_tail != (gate == TailGate::kLongTail);
}

// Grid: x = row ranges (one per block, of equal cost, as many as fit on the
// GPU at once). kShort: the segments are short on average, and tiles with many
// starts take the predicated walk; without it, the kernel keeps to the
// branches that cost less when starts are rare.
template <typename T, int W, bool kShort>
__global__ void __launch_bounds__(kThreads, kTileSumBlocksPerSm<T, W, kShort>)
    tile_sum_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                    T* __restrict__ out, int64_t rows, int64_t segments, int64_t inner,
                    Costs cost, Crossing<typename Num<T>::acc> cross, TailGate gate) {
  __shared__ TileSumShared<T, W, kLeanTileSum<T, W, kShort>> sm;
  allow_dependents(cross.head_key != nullptr);  // a fix-up follows
  if (gated_out(gate, indptr, segments, rows, cross)) return;
  const BlockRows range =
      balanced_rows(indptr, segments, rows, blockIdx.x, gridDim.x, cost, kSplitQuantum);
  tile_sum_block<T, W, kShort>(src, indptr, out, rows, segments, inner, range, cross, sm);
}

// Lane sum (rows of 16 bytes or less, short segments): one thread per segment. A
// block owns a range of rows of equal cost, as in the tile sum, and the segments
// that start in it. Its teams claim those in stripes of kLaneStripe consecutive
// segments from a block counter, so a team that met long segments takes fewer
// stripes; a lane takes kLaneRound segments kTeam apart. A lane adds each
// segment's rows in registers, a load per row (2-byte rows of one column: two
// per 32-bit word, word_lane_sums), so a segment end costs one store (no marks,
// no scan, no staging). A team sums its segments longer than kLaneRows together,
// 16 bytes per lane and load; those longer than the block's big_rows are summed
// by the whole block at the end, as are the segment open at the block's first
// row (head) and the one open after its last row (tail), which the fix-up kernel
// finishes. Which path sums a segment depends on indptr alone, and every path
// adds in a fixed order: the results are deterministic.
// Two segments per lane and stripe, and a team's long segments read 8 loads
// deep: both beat 4, and one segment per lane lost up to 16 points on rows of 1
// and 2 fp32 columns. Rows instead of segments as the unit (a scan sum, on
// 8-byte rows) lost badly.
// Measurements: docs/kernel-notes.md, "kLaneRound, kLaneStripe".
constexpr int kLaneRound = 2;
constexpr int kLaneStripe = kTeam * kLaneRound;
constexpr int kLaneUnroll = 8;
// A lane reads kLaneSteps rows of each of kLaneSide of its segments per step: up
// to 16 bytes of rows per step and segment side by side. More would lose the
// lines of a segment from L1 before its next rows are read. A 16-byte row goes
// one segment at a time, so it takes 8 rows per step, not 4; narrower rows lost
// with 8. Past the team's shorter segments, rows of 8 bytes of a 2-byte type
// read 8 rows of the one longer segment a step (kLaneTail).
// Measurements: docs/kernel-notes.md, "kLaneSteps, kLaneSide".
template <typename T, int W>
constexpr int kLaneSteps = W * sizeof(T) == 16 ? 8 : 4;
template <typename T, int W>
constexpr int kLaneSide = 16 / (W * static_cast<int>(sizeof(T))) < kLaneRound
                              ? 16 / (W * static_cast<int>(sizeof(T)))
                              : kLaneRound;
constexpr int kTeamRows = 2048;  // a team sums segments of up to this many rows, at least
// A team sums its stripe's long segments alone; those over the block's big_rows
// (kTeamRows at least) wait for the whole block at the end, up to kBigSlots of
// them. Where long segments come in runs, one team holds a stripe of them while
// the block's other warps wait at the barrier after the stripes; sharing them
// with the block (listed in shared memory, taken by the teams after or during
// the stripes) paid there but lost on the benchmark's laws, as did the block
// taking them from 512 rows, so none is kept.
// Measurements: docs/kernel-notes.md, "kTeamRows, kBigSlots".
constexpr int kBigSlots = 64;    // segments a block sums at the end, at most

// Rows of 16 bytes: a stripe whose segments are all short is staged first. Its
// lanes' loads, one row each at 32 scattered places, kept the lane sum waiting
// on memory, each row of a warp's load its own request to the L1 cache. Instead
// the team copies the rows its segments span into shared memory with cp.async,
// kLaneStageBytes at a time (a warp moves 512 contiguous bytes per instruction),
// and the lanes add their rows from there in the same order. A stripe spanning
// more than kLaneStageChunks stages, or holding a segment the team or block
// sums, is read as before: the staged rows would be rows of the long segment,
// read twice. Staging every stripe, narrower rows, other stage sizes and a stage
// in two halves all lost.
// ROCm keeps the lane loads (no cp.async, and a team is half a wavefront).
// Measurements: docs/kernel-notes.md, "kStagedLaneSum, kLaneStageBytes".
#if defined(__HIP_PLATFORM_AMD__)
constexpr bool kStagedLaneSum = false;
#else
constexpr bool kStagedLaneSum = true;
#endif
constexpr int kLaneStageBytes = 4096;  // per team
constexpr int kLaneStageChunks = 4;
template <typename T, int W>
constexpr int kLaneStageRows =
    kStagedLaneSum && W * sizeof(T) == 16 ? kLaneStageBytes / 16 : 0;

template <typename T, int W>
struct LaneSumShared {
  using Acc = typename Num<T>::acc;
  using Reduce = cub::BlockReduce<Partial<Acc, W>, kThreads>;
  using TeamReduce = cub::WarpReduce<Partial<Acc, W>, kTeam>;
  typename Reduce::TempStorage reduce;
  typename TeamReduce::TempStorage team[kTeams];
  using TeamSpan = cub::WarpReduce<int64_t, kTeam>;
  typename TeamSpan::TempStorage span[kTeams];
  uint4 stage[kTeams][kLaneStageRows<T, W> > 0 ? kLaneStageRows<T, W> : 1];
  unsigned nbig;
  unsigned next_stripe;
  // The block's rows, read where needed: held in registers, they left the
  // loop over 16-byte rows 3 loads in flight instead of 5 (H100, fp32, 4
  // columns, short segments: 78.4 against 80.7 % of copy bandwidth).
  int64_t r0, r1;
  int64_t big_rows;  // a block's rows hold at most kBigSlots segments longer than this
  int64_t big[kBigSlots];
};

// One round of a thread's share of items [.., end) (rows, or 16-byte units
// of kVec elements, item i at src + i * kItem): items r, r + stride, ...,
// kDepth of them, those at or past end read as zeros; added in that order.
template <typename T, int W, int kVec, int kItem, int kDepth>
__device__ __forceinline__ void share_round(const T* __restrict__ src, int64_t r, int64_t end,
                                            int stride, typename Num<T>::acc (&acc)[W]) {
  RawPack<T, kVec> p[kDepth];
#pragma unroll
  for (int u = 0; u < kDepth; ++u) {
    const int64_t ru = r + static_cast<int64_t>(u) * stride;
    p[u] = ru < end ? load_raw<T, kVec>(src + ru * kItem) : RawPack<T, kVec>{};
  }
#pragma unroll
  for (int u = 0; u < kDepth; ++u) add_raw<T, W, kVec>(acc, p[u]);
}

// A thread's share of items [first, end): items at, at + stride, ... from first,
// kLaneUnroll per round. kShallow: a round whose items all lie within 1, 2 or 4
// strides of its first item reads only that deep. The loads it leaves out are
// all past end, zeros the full round would add to sums that are never -0.0 (they
// start at +0.0, and x + (+0.0) is x bit for bit, a NaN included: it is already
// what an add returns; no flush to zero, which the build does not ask for), so
// the sums are the same. A team's segments (over 32 rows, most under 130 on rows
// of 8 bytes) mostly take one round with one or two loads in use, where the full
// round issued 8 loads and their adds.
// Measurements: docs/kernel-notes.md, "strided_share".
template <typename T, int W, int kVec, int kItem, bool kShallow>
__device__ __forceinline__ void strided_share(const T* __restrict__ src, int64_t first,
                                              int64_t end, int at, int stride,
                                              typename Num<T>::acc (&acc)[W]) {
  for (int64_t r = first + at; r < end; r += static_cast<int64_t>(stride) * kLaneUnroll) {
    if constexpr (kShallow) {
      // Items from the round's first on: the same in every thread (r - at).
      const int64_t left = end - (r - at);
      if (left <= stride) {
        share_round<T, W, kVec, kItem, 1>(src, r, end, stride, acc);
        continue;
      }
      if (left <= 2 * static_cast<int64_t>(stride)) {
        share_round<T, W, kVec, kItem, 2>(src, r, end, stride, acc);
        continue;
      }
      if (left <= 4 * static_cast<int64_t>(stride)) {
        share_round<T, W, kVec, kItem, 4>(src, r, end, stride, acc);
        continue;
      }
    }
    share_round<T, W, kVec, kItem, kLaneUnroll>(src, r, end, stride, acc);
  }
}

// This thread's share of the sum of rows [a, b): rows at, at + stride, ...
template <typename T, int W, bool kShallow = false>
__device__ __forceinline__ void rows_share(const T* __restrict__ src, int64_t a, int64_t b,
                                           int at, int stride,
                                           typename Num<T>::acc (&acc)[W]) {
  strided_share<T, W, W, W, kShallow>(src, a, b, at, stride, acc);
}

// The same for a team or block (stride threads): rows narrower than 16 bytes
// are read as the 16-byte units that lie wholly inside [a, b), so a warp's load
// moves 512 bytes whatever the row width, and only the few rows on either side
// one by one. src is 16-byte aligned.
template <typename T, int W, bool kShallow = false>
__device__ __forceinline__ void units_share(const T* __restrict__ src, int64_t a, int64_t b,
                                            int at, int stride,
                                            typename Num<T>::acc (&acc)[W]) {
  constexpr int kUnitRows = 16 / (W * static_cast<int>(sizeof(T)));
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  // A team or block has threads enough for both sides' rows at once.
  static_assert(2 * (kUnitRows - 1) <= kTeam, "one row at most per thread beside the units");
  if constexpr (kUnitRows == 1) {
    rows_share<T, W, kShallow>(src, a, b, at, stride, acc);
  } else {
    const int64_t qa = ceil_div(a, kUnitRows), qb = b / kUnitRows;  // whole units [qa, qb)
    if (qa >= qb) {  // (fewer than 2 * kUnitRows - 1 rows: never a team's segment)
      rows_share<T, W>(src, a, b, at, stride, acc);
      return;
    }
    const int64_t head = qa * kUnitRows - a, tail = b - qb * kUnitRows;
    if (at < head) {
      add_raw<T, W>(acc, load_raw<T, W>(src + (a + at) * W));
    } else if (at - head < tail) {
      add_raw<T, W>(acc, load_raw<T, W>(src + (qb * kUnitRows + at - head) * W));
    }
    strided_share<T, W, kVec, kUnitRows * W, kShallow>(src, qa, qb, at, stride, acc);
  }
}

// Rows [a, b) pulled into L2 (prefetch.global.L2) ahead of their loads: the
// team's lanes on consecutive 128-byte lines from a's, kSteps lines a lane at
// most. A hint: no register waits on it, and on ROCm it is left out.
template <typename T, int W, int kSteps>
__device__ __forceinline__ void pull_into_l2(const T* __restrict__ src, int64_t a, int64_t b,
                                             int lane) {
#if !defined(__HIP_PLATFORM_AMD__)
  const uintptr_t first = reinterpret_cast<uintptr_t>(src + a * W) & ~uintptr_t{127};
  const uintptr_t end = reinterpret_cast<uintptr_t>(src + b * W);
#pragma unroll
  for (int k = 0; k < kSteps; ++k) {
    const uintptr_t line = first + static_cast<uintptr_t>(k * kTeam + lane) * 128u;
    if (line < end) asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
  }
#else
  (void)src, (void)a, (void)b, (void)lane;
#endif
}

// Sum of rows [a, b) over the block, in thread 0's `total`.
template <typename T, int W>
__device__ __forceinline__ void block_rows_sum(const T* __restrict__ src, int64_t a, int64_t b,
                                               LaneSumShared<T, W>& sm,
                                               typename Num<T>::acc (&total)[W]) {
  using Acc = typename Num<T>::acc;
  using Reduce = typename LaneSumShared<T, W>::Reduce;
  Partial<Acc, W> acc;
#pragma unroll
  for (int k = 0; k < W; ++k) acc.v[k] = 0;
  units_share<T, W>(src, a, b, threadIdx.x, kThreads, acc.v);
  const Partial<Acc, W> sum = Reduce(sm.reduce).Reduce(acc, AddPartials<Acc, W>());
  if (threadIdx.x == 0) {
#pragma unroll
    for (int k = 0; k < W; ++k) total[k] = sum.v[k];
  }
  __syncthreads();  // the temp storage is reused
}

struct MinOf {
  __device__ __forceinline__ int64_t operator()(int64_t x, int64_t y) const { return imin(x, y); }
};
struct MaxOf {
  __device__ __forceinline__ int64_t operator()(int64_t x, int64_t y) const { return imax(x, y); }
};

// The staged lane sum of a stripe (kLaneStageRows says when and why): sums and
// stores this lane's segments `mine`, rows [a[i], e[i]), and returns true; or
// returns false, having done nothing, when the team's segments are not all
// short (`uneven` in some lane) or span too many rows. Rows of 16 bytes.
template <typename T, int W>
__device__ __forceinline__ bool staged_lane_sums(const T* __restrict__ src, T* __restrict__ out,
                                                 int64_t base, unsigned mine, bool uneven,
                                                 const int64_t (&a)[kLaneRound],
                                                 const int64_t (&e)[kLaneRound],
                                                 LaneSumShared<T, W>& sm) {
#if defined(__HIP_PLATFORM_AMD__)
  return false;
#else
  using Acc = typename Num<T>::acc;
  using TeamSpan = typename LaneSumShared<T, W>::TeamSpan;
  constexpr int kRows = kLaneStageRows<T, W>;
  static_assert(W * sizeof(T) == 16 && kRows % kTeam == 0, "16-byte rows, whole rows per lane");
  const int t = threadIdx.x / kTeam, lane = threadIdx.x % kTeam;
  // The rows of the team's segments; a lane with a long segment votes against
  // staging with lo = INT64_MIN, which the team's minimum keeps.
  int64_t lo = uneven ? INT64_MIN : INT64_MAX, hi = 0;
#pragma unroll
  for (int i = 0; i < kLaneRound; ++i) {
    if (mine >> i & 1u) {
      lo = imin(lo, a[i]);
      hi = imax(hi, e[i]);
    }
  }
  lo = cub::ShuffleIndex<kTeam>(TeamSpan(sm.span[t]).Reduce(lo, MinOf()), 0, 0xffffffffu);
  hi = cub::ShuffleIndex<kTeam>(TeamSpan(sm.span[t]).Reduce(hi, MaxOf()), 0, 0xffffffffu);
  if (lo == INT64_MIN || lo >= hi || hi - lo > int64_t{kLaneStageChunks} * kRows) return false;
  Acc acc[kLaneRound][W];
#pragma unroll
  for (int i = 0; i < kLaneRound; ++i)
#pragma unroll
    for (int k = 0; k < W; ++k) acc[i][k] = 0;
  // The stages' bookkeeping in 32 bits, relative to lo (span <= kLaneStageChunks
  // * kRows), and one source pointer stepped a stage at a time: in 64 bits, each
  // copy built its own address and each bound took two 64-bit clamps (about
  // twice the instructions a stage). The bounds are the same: lo <= a[i] for
  // every segment of this lane's (lo is their minimum), so ra[i] is a[i] - lo,
  // or span where a[i] lies past hi, which every stage clamps to its n as it did
  // a[i] - c0; e[i] <= hi, and an e[i] below lo (a malformed indptr, e[i] <
  // a[i]) gives q1 = q0 either way. The same rows are copied, into the same
  // slots.
  // Measurements: docs/kernel-notes.md, "staged_lane_sums".
  const int span = static_cast<int>(hi - lo);
  int ra[kLaneRound], re[kLaneRound];
#pragma unroll
  for (int i = 0; i < kLaneRound; ++i) {
    const bool m = mine >> i & 1u;
    ra[i] = m ? static_cast<int>(imin(a[i] - lo, span)) : 0;
    re[i] = m ? static_cast<int>(imax(e[i] - lo, 0)) : 0;
  }
  uint4* stage = sm.stage[t];
  const T* from = src + (lo + lane) * W;  // row lo + c + lane at c rows on
  for (int c = 0; c < span; c += kRows, from += kRows * W) {
    const int n = span - c < kRows ? span - c : kRows;
    __syncwarp();  // the previous stage is read
#pragma unroll
    for (int k = 0; k < kRows / kTeam; ++k) {
      if (k * kTeam + lane < n)
        __pipeline_memcpy_async(stage + k * kTeam + lane, from + k * kTeam * W, 16);
    }
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncwarp();  // every lane's copies have landed
    int q0[kLaneRound], q1[kLaneRound], longest = 0;
#pragma unroll
    for (int i = 0; i < kLaneRound; ++i) {
      q0[i] = min(max(ra[i] - c, 0), n);
      q1[i] = min(max(re[i] - c, q0[i]), n);
      longest = q1[i] - q0[i] > longest ? q1[i] - q0[i] : longest;
    }
    for (int q = 0; q < longest; ++q) {
#pragma unroll
      for (int i = 0; i < kLaneRound; ++i)
        if (q0[i] + q < q1[i])
          add_raw<T, W>(acc[i], load_raw<T, W>(reinterpret_cast<const T*>(&stage[q0[i] + q])));
    }
  }
#pragma unroll
  for (int i = 0; i < kLaneRound; ++i)
    if (mine >> i & 1u) store_sum<T, W>(out + (base + i * kTeam + lane) * W, acc[i]);
  return true;
#endif
}

// Resident blocks of the lane sum: rows of one 4-byte element take 5 per SM (48
// registers), rows of one 2-byte element 6 (40 registers), the others 4, all
// without spills. Their stripes wait on memory (indptr, then the rows), so more
// resident warps move more bytes; wider rows lost at 5 (16-byte rows by 10 to 14
// points; 8-byte rows spill there). To fit 40 registers the block's head and
// tail segments wait in shared memory (ends) and a team segment's bounds are
// read again, so that the word loop still issues 6 loads before its first wait.
// ROCm keeps 5 (not measured there).
// Measurements: docs/kernel-notes.md, "kLaneBlocksPerSm".
#if defined(__HIP_PLATFORM_AMD__)
template <typename T, int W>
constexpr int kLaneBlocksPerSm = W == 1 && sizeof(T) <= 4 ? 5 : kTileBlocksPerSm;
#else
template <typename T, int W>
constexpr int kLaneBlocksPerSm = W == 1 && sizeof(T) == 2 ? 6
                                 : W == 1 && sizeof(T) <= 4 ? 5
                                                            : kTileBlocksPerSm;
#endif

// atomicAdd(counter, 1u) from one lane, as atomicInc, which wraps only at
// 2^32 - 1 (below 2^32 stripes, as the loop says): with the lane taken as
// threadIdx.x % kTeam (unsigned), ptxas turned atomicAdd into a
// warp-aggregated atomic (vote, leader, popc and a shuffle around it, 12
// instructions and a shuffle's latency more) although one lane calls it; it
// leaves atom.inc alone when the limit is not a constant. The limit is
// 2^32 - 1 only on a 1-D grid, which both launches of lane_sum_kernel are: a
// 2-D one would wrap the count early and claim stripes twice.
__device__ __forceinline__ unsigned claim_stripe(unsigned* counter) {
  return atomicInc(counter, 0xffffffffu >> (gridDim.y - 1));
}

// Rows of one 2-byte element: a lane reads its segments two rows per 32-bit word
// (kWordLanes), kWordSteps words (8 rows) of each per step, where the stepped
// loop below reads one row per 2-byte load, 4 rows per step. Short segments (1
// to 16 rows, 34 bytes at most) then take 1 or 2 steps, not 1 to 4, and each
// step is a wait on memory.
// The rows are added in the same order as one by one, from the same zero: the
// first word's low half, when the segment starts on an odd row, is masked to
// +0.0, and words past the segment are zeros; adding +0.0 leaves a sum that
// started at +0.0 unchanged (it is never -0.0), so the sums are bit for bit the
// same. A segment ending on an odd row count adds its last row alone after the
// words: a word there would hold the row after it, 2 bytes past src when the
// segment ends at the last row.
// Measurements: docs/kernel-notes.md, "kWordLanes".
template <typename T, int W>
constexpr bool kWordLanes = sizeof(T) == 2 && W == 1;
constexpr int kWordSteps = 4;

// This lane's segments `mine` (bit i: segment base + i * kTeam + lane, rows
// [a[i], e[i]), at most kLaneRows of them, e[i] - a[i] possibly negative for
// an unchecked indptr: no rows), summed side by side and stored.
template <typename T>
__device__ __forceinline__ void word_lane_sums(const T* __restrict__ src, T* __restrict__ out,
                                               int64_t base, int lane, unsigned mine,
                                               const int64_t (&a)[kLaneRound],
                                               const int64_t (&e)[kLaneRound]) {
  using Acc = typename Num<T>::acc;
  static_assert(sizeof(T) == 2, "two rows per word");
  Acc acc[kLaneRound];
  const uint32_t* at[kLaneRound];
  int words[kLaneRound], longest = 0;
  // Bit i: segment i is this lane's (mine); bit kLaneRound + i: its last row
  // is read alone (in one register with mine: one more held across the loop
  // and the compiler issued each load only after the adds before it).
  unsigned flags = mine;
#pragma unroll
  for (int i = 0; i < kLaneRound; ++i) {
    // In [0, kLaneRows]; a[i] >= 0 wherever len > 0 (a lane's rows lie in the
    // block's), and the words then cover rows 2 * (a[i] / 2) to e[i] - 1 or
    // e[i] - 2: in src, as is the last row read alone.
    const int len = mine >> i & 1u ? static_cast<int>(imax(e[i] - a[i], 0)) : 0;
    const int span = static_cast<int>(a[i] & 1) + len;  // halves from the first word on
    words[i] = span >> 1;
    if (len > 0 && (span & 1)) flags |= 1u << (kLaneRound + i);
    longest = words[i] > longest ? words[i] : longest;
    at[i] = reinterpret_cast<const uint32_t*>(src) + (a[i] >> 1);  // src is 16-byte aligned
    acc[i] = 0;
  }
  // The last row alone (see below), read before the loop: its load then waits
  // along with the first step's, where read after the loop it was one more wait
  // a stripe. a and e are dead in the loop (lane_sum_kernel's team sum reads its
  // bounds from indptr again), so a step's first loads hold both segments' first
  // words. (The flag implies the segment is this lane's and not empty: e[i] - 1
  // >= a[i] >= 0, e[i] <= rows.)
  // Measurements: docs/kernel-notes.md, "word_lane_sums".
  T last[kLaneRound];
#pragma unroll
  for (int i = 0; i < kLaneRound; ++i)
    last[i] = flags >> (kLaneRound + i) & 1u ? src[e[i] - 1] : T{};
#pragma unroll 1
  for (int q = 0; q < longest; q += kWordSteps) {
    uint32_t p[kLaneRound][kWordSteps];
#pragma unroll
    for (int i = 0; i < kLaneRound; ++i) {
#pragma unroll
      for (int u = 0; u < kWordSteps; ++u) p[i][u] = u < words[i] ? at[i][u] : 0u;
      // The row before the segment, in its first word: +0.0. (Derived from
      // a[i] and q at each step: a mask held across the loop left the
      // compiler too few registers to issue a step's loads together.)
      p[i][0] &= q == 0 && (a[i] & 1) ? 0xffff0000u : 0xffffffffu;
      at[i] += kWordSteps;
      words[i] -= kWordSteps;
    }
#pragma unroll
    for (int i = 0; i < kLaneRound; ++i)
#pragma unroll
      for (int u = 0; u < kWordSteps; ++u) {
        acc[i] += word_elem<T>(&p[i][u], 0);
        acc[i] += word_elem<T>(&p[i][u], 1);
      }
  }
#pragma unroll
  for (int i = 0; i < kLaneRound; ++i) {
    if (flags >> i & 1u) {
      // The last row alone, where a word would hold the row after it.
      Acc sum[1] = {acc[i]};
      if (flags >> (kLaneRound + i) & 1u) sum[0] += Num<T>::to_acc(last[i]);
      store_sum<T, 1>(out + base + i * kTeam + lane, sum);
    }
  }
}

// Lane q ^ d's v, in a slice (logical warp) of RS lanes. CUDA: a butterfly
// shuffle (SHFL.BFLY), the lanes cub::ShuffleIndex<RS> takes at q ^ d without
// the lane index computed for each shuffle. ROCm keeps cub's: HIP's *_sync
// shuffles take a 64-bit mask (a 32-bit one fails their static_assert).
template <int RS, typename V>
__device__ __forceinline__ V slice_xor(V v, int q, int d) {
#if defined(__HIP_PLATFORM_AMD__)
  return cub::ShuffleIndex<RS>(v, q ^ d, 0xffffffffu);
#else
  (void)q;
  return __shfl_xor_sync(0xffffffffu, v, d, RS);
#endif
}

// The bits of p over this thread's team of kTeam lanes, lane i's in bit i
// (every lane of the team takes part).
__device__ __forceinline__ unsigned team_ballot(bool p) {
#if defined(__HIP_PLATFORM_AMD__)
  const unsigned long long votes = __ballot(p);
  return static_cast<unsigned>(votes >> (threadIdx.x % warpSize / kTeam * kTeam));
#else
  static_assert(kTeam == 32, "a team is a warp");
  return __ballot_sync(0xffffffffu, p);
#endif
}

// The first s in [0, segments + 1] with start_of(s) >= x, the same answer in
// every thread, as block_lower_bound, but searched by the first warp alone,
// kProbes evenly spaced entries a round, with one barrier at the end instead
// of kThreads probes and a barrier a round: fewer requests to L2 for a round
// or so more of waiting (kFillSearchProbes says where it pays). Call it once
// per kernel: nothing keeps a second call's write of `found` from racing the
// first call's readers.
template <int kProbes>
__device__ inline int64_t warp_lower_bound(const int64_t* __restrict__ indptr, int64_t segments,
                                           int64_t rows, int64_t x) {
  constexpr int kPerLane = kProbes / kTeam;
  static_assert(kPerLane * kTeam == kProbes, "whole probes a lane");
  __shared__ int64_t found;
  if (threadIdx.x < kTeam) {  // a team: the first warp (half a wavefront on ROCm)
    const int lane = static_cast<int>(threadIdx.x);
    int64_t lo = 0, hi = segments + 1;
    while (lo < hi) {
      const int64_t step = round_step(lo, hi, kProbes);
      bool below[kPerLane];
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) {
        const int64_t probe = round_probe(lo, step, lane * kPerLane + j);
        below[j] = probe < hi && start_of(indptr, probe, rows) < x;
      }
      int n = 0;  // `below` holds up to some probe and fails from there
#pragma unroll
      for (int j = 0; j < kPerLane; ++j) n += __popc(team_ballot(below[j]));
      round_narrow(lo, hi, step, n);
    }
    if (lane == 0) found = lo;
  }
  __syncthreads();
  return found;
}

// Rows of 8 bytes of a 2-byte type (bf16 or fp16, 4 columns): a lane's loop
// reads both its segments kLaneSteps rows a step only while the team's shorter
// segments last (their longest, rounded up to whole steps), then the rest of a
// longer one 2 * kLaneSteps rows a step (8 loads a step, as many as a step of
// both; 8 rows of each of both lost, see kLaneSteps). The loop used to run for
// the team's longest lane segment, both segments a step, though the lane's other
// segment had mostly ended: on the power law this saves about a third of a
// stripe's steps, each a wait on memory. Pairs of rows per load, and longer or
// one-round rests, lost.
// The rows go into the same sums in the same order: each segment's rows one by
// one from +0.0, rows past its end read as +0.0, which leaves a sum that is
// never -0.0 unchanged (see strided_share); only the count of such zeros
// changes.
// Measurements: docs/kernel-notes.md, "kLaneTail".
#if defined(__HIP_PLATFORM_AMD__)
template <typename T, int W>
constexpr bool kLaneTail = false;  // (not measured on ROCm, where a team is half a wavefront)
#else
template <typename T, int W>
constexpr bool kLaneTail = sizeof(T) == 2 && W == 4 && kLaneRound == 2;
#endif

// The largest v over this thread's team (every lane of the team takes part).
__device__ __forceinline__ unsigned team_max(unsigned v) {
#if !defined(__HIP_PLATFORM_AMD__) && (!defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800)
  return __reduce_max_sync(0xffffffffu, v);  // one REDUX, its result in a uniform register
#else
  const int q = static_cast<int>(threadIdx.x % kTeam);
  for (int d = kTeam / 2; d > 0; d /= 2) {
    const unsigned other = slice_xor<kTeam>(v, q, d);
    v = other > v ? other : v;
  }
  return v;
#endif
}

// Grid: x = row ranges of equal cost (balanced_rows), as many as fit on the
// GPU at once. A thread sums a short segment in registers (a store per
// segment, no marks or scans), a team a longer one, the block the longest and
// the segments open at its ends, which the fix-up kernel finishes. Why, and
// how the teams claim their segments: the paragraph "Lane sum" just after
// tile_sum_kernel.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads, kLaneBlocksPerSm<T, W>)
    lane_sum_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                    T* __restrict__ out, int64_t rows, int64_t segments, Costs cost,
                    Crossing<typename Num<T>::acc> cross, TailGate gate) {
  using Acc = typename Num<T>::acc;
  using Part = Partial<Acc, W>;
  using Shared = LaneSumShared<T, W>;
  static_assert(kTeam <= 32, "a team's lanes are bits of an unsigned");
  __shared__ Shared sm;
  // kWordLanes: the block's head and tail segments, read back after the
  // stripes (see kLaneBlocksPerSm). Not part of Shared, whose layout the other
  // instantiations keep (this array is left out of their kernels).
  __shared__ int64_t ends[2];
  // The gated tile sum follows, and a fix-up where there are several blocks.
  allow_dependents(gate == TailGate::kShortTail || cross.head_key != nullptr);
  if (gated_out(gate, indptr, segments, rows, cross)) return;
  const int tid = threadIdx.x, t = tid / kTeam;
  const int lane = static_cast<int>(threadIdx.x % kTeam);  // unsigned: no sign fix-up
  const int64_t block = blockIdx.x;
  if (tid == 0) {
    sm.nbig = 0u;
    sm.next_stripe = 0u;
  }
  const BlockRows range =  // (barriers)
      balanced_rows(indptr, segments, rows, block, gridDim.x, cost, kSplitQuantum);
  const int64_t first = range.first;
  if (tid == 0) {
    sm.r0 = range.r0;
    sm.r1 = range.r1;
    sm.big_rows = imax(kTeamRows, ceil_div(range.r1 - range.r0, kBigSlots));
  }
  __syncthreads();
  // Segments starting at r1 belong to the next block, except past the last
  // row, where the trailing empty ones are zeroed here.
  const int64_t last = imin(range.next, segments);
  int64_t head = head_segment(indptr, segments, rows, range.r0, first);
  int64_t tail =
      last > first && end_of(indptr, segments, rows, last - 1) > range.r1 ? last - 1 : -1;
  if (tid == 0 && cross.head_key != nullptr) {
    cross.head_key[block] = head;
    cross.tail_key[block] = tail;
  }
  if constexpr (kWordLanes<T, W>) {
    if (tid == 0) {  // (read after the barrier that follows the stripes)
      ends[0] = head;
      ends[1] = tail;
    }
  }
  // The segments the lanes and teams sum: [first, lim). The tail, when there
  // is one, is last - 1, the block's last segment: the bound that leaves it
  // out replaces both tests (s < last, s != tail), and a stripe from lim on
  // holds nothing to sum.
  const int64_t lim = tail >= 0 ? tail : last;
  // This bound, the clamps below, big_rows in shared memory, the ballot and the
  // stripe claim (claim_stripe) each took work out of the stripe loop. A team
  // reads its stripe's starts when it claims it: claiming stripes ahead (their
  // starts copied into shared memory, pulled into L2, or held in registers) lost
  // or traded. The registers held across the stripe are the ones its row loads
  // kept in flight (see kLaneBlocksPerSm).
  // Measurements: docs/kernel-notes.md, "lane_sum_kernel: the stripe loop".
  for (;;) {  // (2^32 stripes would take an indptr of 4 TiB)
    unsigned stripe = 0;
    if (lane == 0) stripe = claim_stripe(&sm.next_stripe);
    stripe = cub::ShuffleIndex<kTeam>(stripe, 0, 0xffffffffu);
    const int64_t base = first + static_cast<int64_t>(stripe) * kLaneStripe;
    if (base >= lim) break;
    int64_t a[kLaneRound], e[kLaneRound];
    unsigned mine = 0, longs = 0;  // bit i: segment i is summed by this lane, by the team
    bool uneven = false;  // some segment of this lane's is summed by the team or block
    const int64_t r0 = sm.r0, r1 = sm.r1;
#pragma unroll
    for (int i = 0; i < kLaneRound; ++i) {
      const int64_t s = base + i * kTeam + lane;
      const bool in = s < lim;
      // Into the block's rows (as the block's own sums below): no change for a
      // valid indptr, and a malformed one cannot hand a lane, team or block
      // more than the block's rows per segment. Clamped to [r0, r1] directly
      // (0 <= r0 <= r1 <= rows), the start from below only: wherever e > a,
      // these are the bounds start_of then [r0, r1] gives, and elsewhere both
      // leave the segment empty (len <= 0, a lane's zero sum); e - a cannot
      // overflow (e in [r0, r1], a >= r0 >= 0).
      a[i] = in ? imax(indptr[s], r0) : 0;
      e[i] = in ? imin(imax(indptr[s + 1], r0), r1) : 0;
      const int64_t len = e[i] - a[i];
      if (len > kLaneRows) {
        uneven = true;
        if (len > sm.big_rows) {
          const unsigned slot = atomicAdd(&sm.nbig, 1u);
          if (slot < kBigSlots) sm.big[slot] = s;
          else longs |= 1u << i;  // only an unsorted indptr gets here
        } else {
          longs |= 1u << i;
        }
      } else if (in) {
        mine |= 1u << i;
      }
    }
    // kLaneSide of the lane's segments at a time, kLaneSteps rows of each per
    // step (on rows of 8 bytes of a 2-byte type, past the team's shorter
    // segments, 2 * kLaneSteps rows of the longer one: kLaneTail): a lane's
    // few bytes per row would leave it waiting on one load after another.
    constexpr int kSide = kLaneSide<T, W>;
    constexpr int kSteps = kLaneSteps<T, W>;
    // Rows of 4 bytes or less step a pointer and a count per segment instead of
    // recomputing 64-bit addresses, which took most of the loop's instructions;
    // 16- and 8-byte rows lost with it. (Written as kSide == 4, the test had
    // gone false for every row once kLaneRound became 2.) The loop is not
    // unrolled (unroll 1 below): a warp's lanes end after different step counts,
    // so the unrolled loop ran its pair of steps and then its remainder step,
    // nearly the union of both.
    // Measurements: docs/kernel-notes.md, "lane_sum_kernel: kStepped".
    constexpr bool kStepped = kSide >= 2 && W * sizeof(T) <= 4;
    bool staged = false;
    if constexpr (kLaneStageRows<T, W> > 0) {
      staged = staged_lane_sums<T, W>(src, out, base, mine, uneven, a, e, sm);
      // A staged stripe holds no segment of the team's (uneven nowhere, so
      // longs is 0 in every lane): the team part below would do nothing.
      // Skipping it also ends a and e before the stages: live across them
      // (with the stage bounds in 32 bits), the adds' loop had one register
      // set for both segments' loads, each load then waiting on the adds
      // before it (sm_90 SASS). bf16, 8 columns, which takes the same path,
      // spilled 16 bytes before and spills none now.
      if (staged) continue;
    }
    if constexpr (kWordLanes<T, W>) {  // (the loop below is then left out)
      word_lane_sums<T>(src, out, base, lane, mine, a, e);
      staged = true;
    }
    // A warp's loop runs for its longest lane segment, most lanes idle; setting
    // a stripe's longer lane segments aside in a ring in shared memory, to sum
    // them 32 at a time, lost.
    // Measurements: docs/kernel-notes.md, "lane_sum_kernel: lane segments".
#pragma unroll
    for (int i0 = 0; i0 < kLaneRound && !staged; i0 += kSide) {
      Acc acc[kSide][W];
      const T* at[kSide];
      int len[kSide], longest = 0;
#pragma unroll
      for (int j = 0; j < kSide; ++j) {
        // A lane's segments span at most kLaneRows; a malformed indptr's can
        // be far below zero (a is clamped from below only), and its int
        // would wrap to a positive count: no rows, as the old clamp gave.
        len[j] = mine >> (i0 + j) & 1u ? static_cast<int>(imax(e[i0 + j] - a[i0 + j], 0)) : 0;
        longest = len[j] > longest ? len[j] : longest;
        at[j] = src + a[i0 + j] * W;
#pragma unroll
        for (int k = 0; k < W; ++k) acc[j][k] = 0;
      }
      // kLaneTail: the loop reads `upto` rows of each segment, the rest of a
      // longer one follows below.
      int upto = longest;
      bool second = false;  // kLaneTail: the segment with rows past upto is segment i0 + 1
      if constexpr (kLaneTail<T, W>) {
        static_assert(kSide == 2, "a lane's two segments side by side");
        // Every lane's shorter segment ends within the team's longest shorter
        // one, rounded up to whole steps: past that, only longer segments have
        // rows left.
        constexpr unsigned kStep = kSteps;
        static_assert((kStep & (kStep - 1)) == 0, "steps of a power of two rows");
        const unsigned shorter = static_cast<unsigned>(len[0] < len[1] ? len[0] : len[1]);
        const int both = static_cast<int>((team_max(shorter) + kStep - 1) & ~(kStep - 1));
        upto = longest < both ? longest : both;
        second = len[1] > len[0];
      }
#pragma unroll 1
      for (int q = 0; q < upto; q += kSteps) {
        RawPack<T, W> p[kSide][kSteps];
#pragma unroll
        for (int j = 0; j < kSide; ++j) {
#pragma unroll
          for (int u = 0; u < kSteps; ++u) {
            if constexpr (kStepped)
              p[j][u] = u < len[j] ? load_raw<T, W>(at[j] + u * W) : RawPack<T, W>{};
            else
              p[j][u] = q + u < len[j] ? load_raw<T, W>(src + (a[i0 + j] + q + u) * W)
                                       : RawPack<T, W>{};
          }
          if constexpr (kStepped) {
            at[j] += kSteps * W;
            len[j] -= kSteps;
          }
        }
#pragma unroll
        for (int j = 0; j < kSide; ++j)
#pragma unroll
          for (int u = 0; u < kSteps; ++u) add_raw<T, W>(acc[j], p[j][u]);
      }
      if constexpr (kLaneTail<T, W>) {
        // Past upto only the longer segment has rows left: 2 * kSteps of them
        // a step, added to its sum in order after its first upto rows.
        const int rest = longest - upto;
        if (team_ballot(rest > 0) != 0) {
          Acc sum[W];
#pragma unroll
          for (int k = 0; k < W; ++k) sum[k] = second ? acc[1][k] : acc[0][k];
          const T* from = src + ((second ? a[i0 + 1] : a[i0]) + upto) * W;
#pragma unroll 1
          for (int left = rest; left > 0; left -= 2 * kSteps) {
            RawPack<T, W> p[2 * kSteps];
#pragma unroll
            for (int u = 0; u < 2 * kSteps; ++u)
              p[u] = u < left ? load_raw<T, W>(from + u * W) : RawPack<T, W>{};
            from += 2 * kSteps * W;
#pragma unroll
            for (int u = 0; u < 2 * kSteps; ++u) add_raw<T, W>(sum, p[u]);
          }
#pragma unroll
          for (int k = 0; k < W; ++k) {
            acc[0][k] = second ? acc[0][k] : sum[k];
            acc[1][k] = second ? sum[k] : acc[1][k];
          }
        }
      }
#pragma unroll
      for (int j = 0; j < kSide; ++j)
        if (mine >> (i0 + j) & 1u)
          store_sum<T, W>(out + (base + (i0 + j) * kTeam + lane) * W, acc[j]);
    }
    // The team's long segments, one after another. Their loads wait on memory
    // one segment at a time (a 64-row segment of 8-byte rows is one load a
    // lane), so while the team sums one, it pulls the next one's first 8 KB into
    // L2 (pull_into_l2). The next one is known ahead by walking them in (i,
    // lane) order, the bits of one 64-bit queue (bit 32 * i + lane: the lanes'
    // ballots per i); its bounds come from the lane holding it. That gained most
    // where mid-length segments come in runs; deeper or per-lane pulls, and
    // summing 2 or 4 segments at once, lost.
    // On rows of 4 bytes or less the walk is (lane, i) and nothing is pulled:
    // the queue's bounds held beside the lanes' spilled there and lost.
    // (A ballot: one vote, where a warp sum (REDUX) and a shuffle to share it
    // took 8 instructions per stripe and a shuffle's latency; lanes' bits are
    // distinct, so their sum is their union.)
    // Measurements: docs/kernel-notes.md, "lane_sum_kernel: a team's long segments".
    if constexpr (W * sizeof(T) <= 4) {
      unsigned holders = team_ballot(longs != 0);
      while (holders != 0) {
        const int from = __ffs(holders) - 1;
        holders &= holders - 1;
        unsigned pending = cub::ShuffleIndex<kTeam>(longs, from, 0xffffffffu);
        while (pending != 0) {
          const int i = __ffs(pending) - 1;
          pending &= pending - 1;
          int64_t sa, sb;
          if constexpr (kWordLanes<T, W>) {
            // The holder's bounds read again (one address for the whole team)
            // and clamped as above: the same values (s < lim, as the holder
            // found). Shuffled from the holder, a and e stayed live across
            // word_lane_sums' loop, whose loads then lacked registers (see
            // there).
            // The block's rows read again too, through volatile: with r0 and
            // r1 reused, they were held across that loop (4 registers), which
            // at 6 blocks per SM left it 3 loads before its first wait (see
            // kLaneBlocksPerSm). The same values.
            const int64_t s = base + i * kTeam + from;
            const int64_t b0 = *static_cast<const volatile int64_t*>(&sm.r0);
            const int64_t b1 = *static_cast<const volatile int64_t*>(&sm.r1);
            sa = imax(indptr[s], b0);
            sb = imin(imax(indptr[s + 1], b0), b1);
          } else {
            int64_t ha = 0, hb = 0;
#pragma unroll
            for (int k = 0; k < kLaneRound; ++k) {  // a[i] without indexing registers at run time
              ha = k == i ? a[k] : ha;
              hb = k == i ? e[k] : hb;
            }
            sa = cub::ShuffleIndex<kTeam>(ha, from, 0xffffffffu);
            sb = cub::ShuffleIndex<kTeam>(hb, from, 0xffffffffu);
          }
          Part acc;
#pragma unroll
          for (int k = 0; k < W; ++k) acc.v[k] = 0;
          units_share<T, W, true>(src, sa, sb, lane, kTeam, acc.v);
          const Part sum =
              typename Shared::TeamReduce(sm.team[t]).Reduce(acc, AddPartials<Acc, W>());
          if (lane == 0) store_sum<T, W>(out + (base + i * kTeam + from) * W, sum.v);
        }
      }
    } else {
      static_assert(kLaneRound <= 2, "a stripe's long segments fit a 64-bit queue");
      unsigned long long queue = 0;
#pragma unroll
      for (int i = 0; i < kLaneRound; ++i)
        queue |= static_cast<unsigned long long>(team_ballot(longs >> i & 1u)) << (32 * i);
      // Segment `at` of the queue (bit 32 * i + lane): its bounds, shuffled
      // from the lane holding it.
      const auto bounds_of = [&](int at, int64_t& sa, int64_t& sb) {
        const int i = at >> 5, from = at & 31;
        int64_t ha = 0, hb = 0;
#pragma unroll
        for (int k = 0; k < kLaneRound; ++k) {  // a[i] without indexing registers at run time
          ha = k == i ? a[k] : ha;
          hb = k == i ? e[k] : hb;
        }
        sa = cub::ShuffleIndex<kTeam>(ha, from, 0xffffffffu);
        sb = cub::ShuffleIndex<kTeam>(hb, from, 0xffffffffu);
      };
      int at = -1;
      int64_t sa = 0, sb = 0;
      if (queue != 0) {
        at = __ffsll(static_cast<long long>(queue)) - 1;
        queue &= queue - 1;
        bounds_of(at, sa, sb);
      }
      while (at >= 0) {
        int next = -1;
        int64_t na = 0, nb = 0;
        if (queue != 0) {
          next = __ffsll(static_cast<long long>(queue)) - 1;
          queue &= queue - 1;
          bounds_of(next, na, nb);
          pull_into_l2<T, W, 2>(src, na, nb, lane);
        }
        Part acc;
#pragma unroll
        for (int k = 0; k < W; ++k) acc.v[k] = 0;
        units_share<T, W, true>(src, sa, sb, lane, kTeam, acc.v);
        const Part sum =
            typename Shared::TeamReduce(sm.team[t]).Reduce(acc, AddPartials<Acc, W>());
        if (lane == 0)
          store_sum<T, W>(out + (base + (at >> 5) * kTeam + (at & 31)) * W, sum.v);
        at = next;
        sa = na;
        sb = nb;
      }
    }
  }
  __syncthreads();  // the big list is complete
  const int64_t r0 = sm.r0, r1 = sm.r1;
  Acc total[W];
  if constexpr (kWordLanes<T, W>) {
    head = ends[0];
    tail = ends[1];
  }
  if (head >= 0) {
    block_rows_sum<T, W>(src, r0, imin(end_of(indptr, segments, rows, head), r1), sm, total);
    if (tid == 0) {
#pragma unroll
      for (int k = 0; k < W; ++k) cross.head_val[block * W + k] = total[k];
    }
  }
  if (tail >= 0) {
    block_rows_sum<T, W>(src, imax(start_of(indptr, tail, rows), r0), r1, sm, total);
    if (tid == 0) {
#pragma unroll
      for (int k = 0; k < W; ++k) cross.tail_val[block * W + k] = total[k];
    }
  }
  const int nbig = sm.nbig < unsigned{kBigSlots} ? static_cast<int>(sm.nbig) : kBigSlots;
  for (int j = 0; j < nbig; ++j) {
    const int64_t s = sm.big[j];
    block_rows_sum<T, W>(src, imax(start_of(indptr, s, rows), r0),
                         imin(start_of(indptr, s + 1, rows), r1), sm, total);
    if (tid == 0) store_sum<T, W>(out + s * W, total);
  }
}

// segment_gather

// How far ahead the tile gather reads starts and values, in entries per thread,
// and the resident blocks its registers are budgeted for. A tile of 2-byte rows
// holds 8192 rows, about 1000 starts of short segments: read 4 deep, they mostly
// come in the round read ahead, where 2 deep left a further round to wait on.
// Rows of 4 bytes (tiles of 4096 rows) read as many as their mean segment length
// asks (kTileGatherAdapts), and 4 after a tile whose starts overflowed that (or
// was cut at the last start read ahead: `cut` in tile_gather_block). Rows of 8
// bytes read 2 deep: 4 deep lost there.
// Measurements: docs/kernel-notes.md, "kTileGatherAhead, kTileGatherAdapts".
template <typename T, int W>
constexpr int kTileGatherAhead = W * sizeof(T) <= 4 ? kWindowSteps : kPrefetchSteps;
template <typename T, int W>
constexpr bool kTileGatherAdapts = W * sizeof(T) == 4;
// Rows of 2 and 4 bytes read their starts ahead as the entries' low words, as
// the tile sum does (fetch_starts): half the registers, and load_window takes a
// start into the tile in 32-bit arithmetic (low_rel). Exact below 2^32 rows
// only: more rows go to the team gather (launch_narrow_gather). Rows of 8 bytes
// lost a little with them and keep 64-bit entries; reading deeper with the
// registers saved lost too.
// Measurements: docs/kernel-notes.md, "kTileGatherLow".
template <typename T, int W>
constexpr bool kTileGatherLow = W * sizeof(T) <= 4;
// Every row width takes 4 blocks per SM (64 registers). Rows of 2 bytes took 3
// while the label walk by search held its run in registers (16 words), the
// kernel's most registers live at once; with that walk writing its rows straight
// to the stage, bf16, 1 column fits 63 registers with no spill, and it gained at
// 4 blocks. 5 blocks per SM (48 registers) spilled and lost on every width and
// law.
// Measurements: docs/kernel-notes.md, "kTileGatherBlocksPerSm".
template <typename T, int W>
constexpr int kTileGatherBlocksPerSm = kTileBlocksPerSm;
// Window entries a thread marks per pass (mark_gather_starts). With passes of 4,
// a tile of few starts had a few warps marking while the rest waited at the
// barrier after the marks; so rows of 4 bytes (tiles of 4096 rows, ~470 starts
// of short segments) mark tiles of up to 2 * kThreads starts in passes of 2, and
// rows of 8 bytes (tiles of 2048 rows, ~241 starts) in passes of 1 up to
// kThreads starts (kTileGatherMarkSingles, taken before kTileGatherMarkPairs)
// and of 2 up to 2 * kThreads. Tiles of more starts keep passes of 4 (1024
// starts a pass). The marks, crowded flag and warp_first are the same at any
// pass width (sorted starts).
// Measurements: docs/kernel-notes.md, "kTileGatherMarkPairs, kTileGatherMarkSingles".
template <typename T, int W>
constexpr bool kTileGatherMarkPairs = W * sizeof(T) == 4 || W * sizeof(T) == 8;
template <typename T, int W>
constexpr bool kTileGatherMarkSingles = W * sizeof(T) == 8;

template <typename T, int W>
struct TileGatherShared {
  using G = Geometry<T, W>;
  using CountScan = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  // Values of the segments open in a tile, entry i being segment first - 1 + i;
  // a tile of one-row segments has more than fit, read from src when needed.
  static constexpr int kValues = kValueBytes / G::kRowBytes;
  static_assert(G::kRunRows <= 32 && 32 % G::kRunRows == 0, "a run's starts fit one mask word");
  int counts[3];
  // A tile's crowded flag and warp_first are written before load_window's
  // barrier, while warps still on the tile before may read theirs: two
  // copies, taken by turns (tile_gather_block).
  int crowded[2];
  // Entry of the window's first start at or after warp b's first row (or
  // INT_MAX: none), for the starts before a run (mark_gather_starts).
  int warp_first[2][kThreads / 32];
  uint32_t starts[G::kTileRows / 32];
  alignas(16) int window[kWindow];
  RawPack<T, W> values[kValues];
  uint4 stage[kThreads * G::kStageUnits];  // unpadded, swizzled (write_run)
};

// Row ranges (kTileGatherWaves times as many) and tiles as in tile_sum, the
// other way round (a tile with more starts than were read ahead ends at the last
// of them: `cut` in tile_gather_block). Per tile, the window of segment starts
// marks the rows where segments start, and the values of the segments open in
// the tile come to shared memory, both read coalesced a tile ahead. Thread g
// labels its run of kRunRows rows from the marks, writes their values to the
// stage, and each warp stores its runs as contiguous 16-byte units. Tiles
// without a start, half of them on the power law, are stored straight from their
// segment's value (tile_gather_block).
// Timed with parts cut out, the read side, one tile deep, is what holds short
// segments of narrow rows under 85 %; a deeper read-ahead through a ring of
// chunks lost, and so did each thread storing its own run without the stage.
// Measurements: docs/kernel-notes.md, "tile_gather_block: design".

// One step of an inclusive scan over 32 lanes, as cub's: on CUDA the shuffle's
// own predicate says whether a lane d below exists (no lane test).
template <int d>
__device__ __forceinline__ int warp_scan_step(int x) {
#if defined(__HIP_PLATFORM_AMD__)
  const int below = __shfl_up(x, d, 32);
  return (threadIdx.x & 31) >= d ? x + below : x;
#else
  int y;
  asm volatile(
      "{\n\t.reg .s32 r0;\n\t.reg .pred p;\n\t"
      "shfl.sync.up.b32 r0|p, %1, %2, 0, 0xffffffff;\n\t"
      "@p add.s32 r0, r0, %1;\n\tmov.s32 %0, r0;\n\t}"
      : "=r"(y)
      : "r"(x), "n"(d));
  return y;
#endif
}

// mark_starts for the tile gather, where no segment without rows needs
// telling apart: the same marks and crowded flag, the atomics ORed by mask
// word as there but without branches; and for a tile that is not crowded
// (sorted starts on distinct rows), the number of starts before each warp's
// rows: entry i records itself in warp_first[b] for each warp b whose first
// row lies in (start of i - 1, start of i]. A run then counts the starts
// before it from its warp's entry and a scan of its warp's marks
// (tile_gather_block), where a block scan of the marks took ~45 instructions
// and a barrier per thread and tile (SASS, sm_90, bf16, 1 column).
// n counts the window's entries to mark, at most nrows + 1 (tile_gather_block):
// 32-bit, as start(i), which gives INT_MAX from n on.
// kPer entries per thread and pass (the tile gather picks 1, 2 or 4 per tile).
template <int kWarpRowsLog2, int kPer, typename Start>
__device__ __forceinline__ void mark_gather_starts(int n, int nrows, const int* window,
                                                   Start&& start, uint32_t* starts, int& crowded,
                                                   int* warp_first) {
  static_assert(kPer == 1 || kPer == 2 || kPer == 4,
                "entries read as one 4-, 8- or 16-byte word");
  const int in_window = n < kWindow ? n : kWindow;
  for (int i0 = kPer * static_cast<int>(threadIdx.x); i0 < n; i0 += kPer * kThreads) {
    int r[kPer + 2];  // entries i0 - 1 to i0 + kPer
    // r[0] = 0 for entry 0, which needs no record: warp_first[0] is 0.
    if (i0 + kPer <= in_window) {
      r[0] = i0 > 0 ? window[i0 - 1] : 0;
      if constexpr (kPer == 4) {
        read_quad(window + i0, r + 1);
      } else if constexpr (kPer == 1) {
        r[1] = window[i0];
      } else {  // i0 even, window 16-byte aligned: one 8-byte read
        const int2 v = *reinterpret_cast<const int2*>(window + i0);
        r[1] = v.x;
        r[2] = v.y;
      }
    } else {
#pragma unroll
      for (int k = 0; k < kPer; ++k) r[k + 1] = i0 + k < n ? start(i0 + k) : nrows;
      r[0] = i0 > 0 ? start(i0 - 1) : 0;
    }
    r[kPer + 1] = start(i0 + kPer);
    bool ok[kPer], crowd = false;
    int word[kPer];
    uint32_t bits[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int x = r[k + 1];
      ok[k] = static_cast<unsigned>(x) < static_cast<unsigned>(nrows);  // else past n, or unsorted
      word[k] = x >> 5;
      bits[k] = ok[k] ? 1u << (x & 31) : 0u;
      crowd |= ok[k] && r[k + 2] == x;
    }
    // Warps whose first row lies in (r[0], r[kPer]]: mostly none (short
    // segments put a pass's starts well inside a warp's rows). Sorted starts
    // cross there only if they cross here; unsorted ones (indptr unchecked)
    // may leave warp_first depending on kPer, in bounds either way.
    if (r[0] >> kWarpRowsLog2 != r[kPer] >> kWarpRowsLog2) {
#pragma unroll
      for (int k = 0; k < kPer; ++k) {
        if (!ok[k]) continue;
        const int p = r[k] >> kWarpRowsLog2;
        const int entry = i0 + k;  // below n <= nrows + 1
#pragma unroll 1
        for (int b = p < 0 ? 0 : p + 1; b <= r[k + 1] >> kWarpRowsLog2; ++b) warp_first[b] = entry;
      }
    }
#pragma unroll
    for (int k = kPer - 2; k >= 0; --k) {  // a run of entries in one word: one atomic, its first's
      if (ok[k] && ok[k + 1] && word[k + 1] == word[k]) {
        bits[k] |= bits[k + 1];
        bits[k + 1] = 0;
      }
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k)
      if (bits[k]) atomicOr(&starts[word[k]], bits[k]);
    if (crowd) crowded = 1;
  }
}

// The tile gather's walk over a run's values in shared memory, at the 32-bit
// shared address `at`: one step of sizeof(P) bytes where `bit` is set, then a
// load. Written as PTX, a predicated add: ptxas sets the run's predicates from
// the mark word a few at a time (R2P) and the step costs one add; from C++ it
// shifted and masked the bit out of the word first (SASS, sm_90, bf16, 1
// column: 3 integer instructions per row besides the load, now 1). ROCm keeps
// the C++ form.
#if !defined(__HIP_PLATFORM_AMD__)
template <int kSize>
__device__ __forceinline__ uint32_t step_if(uint32_t at, uint32_t bit) {
  asm("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %1, 0;\n\t@p add.u32 %0, %0, %2;\n\t}"
      : "+r"(at)
      : "r"(bit), "n"(kSize));
  return at;
}

template <typename P>
__device__ __forceinline__ P load_shared_at(uint32_t at) {
  P v;
  if constexpr (sizeof(P) == 2) {
    unsigned short h;
    asm volatile("ld.shared.b16 %0, [%1];" : "=h"(h) : "r"(at) : "memory");
    memcpy(&v, &h, 2);
  } else if constexpr (sizeof(P) == 4) {
    uint32_t w;
    asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w) : "r"(at) : "memory");
    memcpy(&v, &w, 4);
  } else {
    static_assert(sizeof(P) == 8, "values of 2, 4 or 8 bytes");
    uint2 w;
    asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(w.x), "=r"(w.y) : "r"(at) : "memory");
    memcpy(&v, &w, 8);
  }
  return v;
}
#endif

template <typename T, int W>
__device__ __forceinline__ void tile_gather_block(const T* __restrict__ src,
                                                  const int64_t* __restrict__ indptr,
                                                  T* __restrict__ out, int64_t rows,
                                                  int64_t segments, int64_t rows_per_block,
                                                  TileGatherShared<T, W>& sm) {
  using G = Geometry<T, W>;
  // Values stay as they were loaded: in 32-bit words wherever a row holds whole
  // words (RawPack; a row of one half value has nothing to rearrange). Held as
  // Pack<T, W> of a half type, each value read ahead was rearranged into 16-bit
  // halves as soon as its load was issued, so the thread waited there for it.
  // Measurements: docs/kernel-notes.md, "tile_gather_block: values as words".
  using P = RawPack<T, W>;
  constexpr int kRun = G::kRunRows;
  constexpr int kValues = TileGatherShared<T, W>::kValues;
  const int tid = threadIdx.x;
  // Blocks of kThreads threads (the launch): tid's bound lets the compiler drop
  // the tests of i < kValues, i < kWindow and the like on k * kThreads + tid.
  // Measurements: docs/kernel-notes.md, "tile_gather_block: lean code".
  __builtin_assume(tid >= 0 && tid < kThreads);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  int64_t r1 = imin(rows, r0 + rows_per_block);
#if !defined(__HIP_PLATFORM_AMD__)
  // Opaque to the compiler, which otherwise rematerialized r1 from the
  // kernel's arguments twice per tile rather than keep it in registers (~20
  // uniform instructions per tile, SASS sm_90, bf16, 1 column).
  asm("" : "+l"(r1));
#endif

  if (tid < 3) sm.counts[tid] = 0;
  clear_marks<G::kTileRows / 32>(sm.starts);
  // Rows outside every segment (before indptr[0], past indptr[segments]) get zeros.
  auto value = [&](int64_t s) {
    return s >= 0 && s < segments ? load_raw<T, W>(src + s * W) : P{};
  };

  int64_t first = block_lower_bound(indptr, segments, rows, r0);
  int round = 0;
  const int64_t expected = starts_per_tile(segments, rows, G::kTileRows);
  // Starts, and the values of their segments, read a tile ahead: as many per
  // thread as kTileGatherAhead and kTileGatherAdapts say. Values go as deep as
  // starts, so a tile of short segments waits on no round of values after its
  // round of starts.
  // Measurements: docs/kernel-notes.md, "tile_gather_block: read-ahead".
  constexpr int kAhead = kTileGatherAhead<T, W>;
  int steps = walk_steps(expected, kAhead);
  const int usual_steps = kTileGatherAdapts<T, W> ? steps : kAhead;
  using Raw = std::conditional_t<kTileGatherLow<T, W>, uint32_t, int64_t>;
  Raw raw[kAhead];
  P raw_values[kAhead];
  // The starts from `from` (their low words: kTileGatherLow), the values from
  // from - 1, as fetch_starts and value would read them: entry s = from + k *
  // kThreads + tid exists (s <= segments) exactly when the value of segment s -
  // 1 does (s - 1 < segments), so one 32-bit bound, k * kThreads <= room, tests
  // both; s - 1 >= 0 fails only for k = 0 in thread 0 of a block from segment 0.
  // (from lies in [0, segments + 1].)
  // With them, the start of the last entry they read (`cut`): a tile holding
  // more starts than were read ahead ends there instead, so that it waits on no
  // further round of indptr (only past a quarter of a tile: denser tiles, a
  // crowd of empty segments, take their further rounds). The tile after it
  // starts where it ended. The cut is rounded down to 128 bytes of rows, so that
  // the tile after it starts on a line; a cut tile counts as one that overflowed
  // what was read ahead (rows of 4 bytes then read kAhead deep for the next),
  // and indptr[segments], the rows' end, cuts nothing. A malformed indptr gives
  // any cut: the tile still ends within its rows. Kept for the power law, though
  // short segments lose about a point to its code. Pulling the next round into
  // L2, or copying it into shared memory with bulk copies, lost everywhere.
  // Measurements: docs/kernel-notes.md, "tile_gather_block: prefetch and cut".
  int64_t cut = kNever;
  bool was_cut = false;
  auto prefetch = [&](int64_t from) {
    const int64_t last = from + steps * kThreads - 1;
    cut = last < segments ? indptr[last] : kNever;  // (the same address in every thread)
    const int64_t own = from + tid;
    const int room = static_cast<int>(imin(segments - own, INT_MAX));
    constexpr int kStride = static_cast<int>(sizeof(int64_t) / sizeof(Raw));  // as fetch_starts
    const Raw* starts_at = reinterpret_cast<const Raw*>(indptr + own);
    const T* values_at = src + (own - 1) * W;
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const bool there = k < steps && k * kThreads <= room;
      raw[k] = there ? starts_at[kStride * k * kThreads] : static_cast<Raw>(kNever);
      raw_values[k] = there && (k > 0 || own > 0) ? load_raw<T, W>(values_at + k * kThreads * W)
                                                 : P{};
    }
  };
  prefetch(first);
  // The value of segment first - 1, which a tile without a start gives every
  // row: read when first moves, a tile ahead of its use.
  P open_value = value(first - 1);
  int turn = 0;  // which copy of crowded and warp_first the tile takes
  for (int64_t t0 = r0, t1; t0 < r1; t0 = t1, turn ^= 1) {
    t1 = imin(r1, t0 + G::kTileRows);
    {
      constexpr int64_t kLineRows = 128 / G::kRowBytes;
      static_assert(128 % G::kRowBytes == 0 && kLineRows % 8 == 0,
                    "a line holds whole rows, a multiple of 8 of them, as r0");
      const int64_t c = cut & ~(kLineRows - 1);
      was_cut = c >= t0 + G::kTileRows / 4 && c < t1;
      if (was_cut) t1 = c;
    }
    const int nrows = static_cast<int>(t1 - t0);
    // Two block barriers per tile, load_window's and the one after the marks,
    // where there were four (one more per further window round, a third after
    // write_run when crowded or n >= cached; a tile without a start, one): no
    // barrier opens a tile, and each warp stores its own runs after a warp
    // barrier (store_warp_units). Warps may still be on the tile before while
    // one gets here, so until load_window's barrier, which no thread passes
    // before every thread is done with that tile, a tile writes only what that
    // tile no longer reads: its turn's copy of crowded and warp_first (the tile
    // before has the other), and the window, which the tile before read after
    // its marks only in the label walk by search, and then ended with a block
    // barrier. The values are written after load_window's barrier; marks are
    // cleared by the warp that read them, before it, and set after it; a warp's
    // stage is its own.
    int* const warp_first = sm.warp_first[turn];
    int& crowded_word = sm.crowded[turn];
    if (tid == 0) crowded_word = 0;
    // Written by mark_gather_starts after load_window's barrier; read before
    // the warp barrier after write_run.
    if (tid < kThreads / 32) warp_first[tid] = tid == 0 ? 0 : INT_MAX;
    const Window w{first, load_window<WindowCount::kInBarrier>(indptr, segments, rows, t0, nrows,
                                                               first, steps, raw, sm.window,
                                                               sm.counts, round)};
#pragma unroll
    for (int k = 0; k < kAhead; ++k) {
      const int i = k * kThreads + tid;
      if (k < steps && i < kValues) sm.values[i] = raw_values[k];
    }
    int cached = static_cast<int>(imin(steps * kThreads, kValues));
    // The tile's starts in 32 bits, for all but the crowded label walk: at most
    // nrows + 1. Sorted starts lie in [0, nrows), so a tile that holds more than
    // nrows has two equal ones among its first nrows + 1, which
    // mark_gather_starts finds (crowded), and a tile that is not crowded holds n
    // = w.n. Crowded tiles use neither marks nor warp_first. An unsorted indptr
    // gets wrong rows but stays in bounds as before.
    // Measurements: docs/kernel-notes.md, "tile_gather_block: 32-bit starts".
    const int n = static_cast<int>(imin(w.n, nrows + 1));
    // Values past the prefetched ones: a tile with more segments than the last.
    // kWindowSteps loads per thread go out before the first store: one at a
    // time, each store waited on its load.
    // As value(first - 1 + i) reads them, in 32 bits: i >= cached >= kThreads
    // here, so first - 1 + i >= 0, and first - 1 + i < segments exactly when i <
    // there (first <= segments + 1); one 64-bit pointer per pass.
    // Measurements: docs/kernel-notes.md, "tile_gather_block: extra values".
    const int wanted = n + 1 < kValues ? n + 1 : kValues;  // as w.n + 1 but in a crowded tile
    // The first pass of those loads goes out here and its values are stored
    // after the marks, just before the barrier that the walk waits on: the marks
    // no longer wait behind the loads (most power-law tiles with a start hold
    // more starts than the values read ahead). Further passes, only past
    // kWindowSteps * kThreads more values, stay after the marks as they were. A
    // tile without a start (wanted = 1 <= cached) loads none, so the lean tile's
    // `continue` below leaves none unstored.
    // Measurements: docs/kernel-notes.md, "tile_gather_block: extra values".
    const bool extra = cached < wanted;  // the same in every thread
    const int i_more = cached + tid;
    int there = 0, end = wanted;
    // One pass: this thread's values i0 + k * kThreads, loaded, then stored.
    auto load_values = [&](int i0, P (&v)[kWindowSteps]) {
      const T* at = src + (first - 1 + i0) * W;
#pragma unroll
      for (int k = 0; k < kWindowSteps; ++k)
        v[k] = i0 + k * kThreads < there ? load_raw<T, W>(at + k * kThreads * W) : P{};
    };
    auto store_values = [&](int i0, const P (&v)[kWindowSteps]) {
#pragma unroll
      for (int k = 0; k < kWindowSteps; ++k)
        if (i0 + k * kThreads < end) sm.values[i0 + k * kThreads] = v[k];
    };
    P more[kWindowSteps];
    if (extra) {
      there = static_cast<int>(imin(wanted, segments + 1 - first));
      // Opaque to the compiler, which otherwise derived the unrolled loop's
      // trip count from w.n in 64 bits (~15 more instructions, SASS sm_90).
#if !defined(__HIP_PLATFORM_AMD__)
      asm("" : "+r"(end));
#endif
      load_values(i_more, more);
    }
    cached = cached > wanted ? cached : wanted;
    if (t1 < r1) {  // raw and raw_values are free again
      steps = n >= steps * kThreads || was_cut ? kAhead : usual_steps;
      // (Pulling the tile's second window round into L2 here gained nothing.)
      // Measurements: docs/kernel-notes.md, "tile_gather_block: prefetch and cut".
      prefetch(first + w.n);
    }
    // No start in a whole tile: every row is segment first - 1, whose value
    // open_value holds, as the label walk would give each row. No mark was set,
    // so the marks stay clear. (sm.values[0] holds it too, but is written after
    // load_window's barrier, with no barrier before this.) On the power law
    // about half the rows lie in segments longer than a tile: those tiles skip
    // the marks, the label walk and the stage, and the barrier after the marks.
    // Knowing such tiles a tile ahead, or storing a run of them at once, lost:
    // the tiles with starts, issue-bound, set the pace.
    // Measurements: docs/kernel-notes.md, "tile_gather_block: tiles without a start".
    if (w.n == 0 && nrows == G::kTileRows) {
      // The value repeated over a 16-byte unit, built as words: a row of 2
      // bytes fills both halves of each, rows of 4 or 8 bytes are whole ones.
      static_assert(sizeof(P) == 2 || sizeof(P) == 4 || sizeof(P) == 8, "rows of 2 to 8 bytes");
      uint32_t word[sizeof(P) == 8 ? 2 : 1];
      if constexpr (sizeof(P) == 2) {
        uint16_t half;
        memcpy(&half, &open_value, 2);
        word[0] = half * 0x10001u;
      } else {
        memcpy(word, &open_value, sizeof(P));
      }
      const uint4 unit = make_uint4(word[0], word[sizeof(P) == 8], word[0], word[sizeof(P) == 8]);
      uint4* to = reinterpret_cast<uint4*>(out + t0 * W) + tid;
      static_assert(G::kStageUnits == 4 && kThreads == 256, "the offsets below");
#if defined(__HIP_PLATFORM_AMD__)
#pragma unroll
      for (int k = 0; k < G::kStageUnits; ++k) to[k * kThreads] = unit;
#else
      // As PTX: from C++, ptxas merged these stores with the stage's (one
      // set of registers for both: 59 -> 64, and 12 moves here).
      asm volatile(
          "st.global.v4.b32 [%0], {%1, %2, %3, %4};\n\t"
          "st.global.v4.b32 [%0+4096], {%1, %2, %3, %4};\n\t"
          "st.global.v4.b32 [%0+8192], {%1, %2, %3, %4};\n\t"
          "st.global.v4.b32 [%0+12288], {%1, %2, %3, %4};"
          :
          : "l"(to), "r"(unit.x), "r"(unit.y), "r"(unit.z), "r"(unit.w)
          : "memory");
#endif
      continue;  // first += w.n, which is 0
    }
    auto start = [&](int64_t i) {
      return i < w.n ? window_start(sm.window, indptr, rows, t0, w, i) : INT_MAX;
    };
    constexpr int kWarpRowsLog2 = __builtin_ctz(kRun * 32);  // kRun: a power of two
    const int64_t* tile_starts = indptr + first;  // entry i past kWindow: tile_starts[i]
    auto tile_start = [&](int i) {
      return i >= n        ? INT_MAX
             : i < kWindow ? sm.window[i]
                           : static_cast<int>(clamp_row(tile_starts[i], rows) - t0);
    };
    // n is the block's: every thread takes the same pass width.
    auto mark = [&](auto per) {
      mark_gather_starts<kWarpRowsLog2, decltype(per)::value>(
          n, nrows, sm.window, tile_start, sm.starts, crowded_word, warp_first);
    };
    if constexpr (kTileGatherMarkSingles<T, W>) {
      if (n <= kThreads)
        mark(std::integral_constant<int, 1>{});
      else if (n <= 2 * kThreads)
        mark(std::integral_constant<int, 2>{});
      else
        mark(std::integral_constant<int, 4>{});
    } else if constexpr (kTileGatherMarkPairs<T, W>) {
      if (n <= 2 * kThreads)
        mark(std::integral_constant<int, 2>{});
      else
        mark(std::integral_constant<int, 4>{});
    } else {
      mark(std::integral_constant<int, 4>{});
    }
    if (extra) {  // the values loaded before the marks, then any further passes
      store_values(i_more, more);
      for (int i0 = i_more + kWindowSteps * kThreads; i0 < end; i0 += kWindowSteps * kThreads) {
        P further[kWindowSteps];
        load_values(i0, further);
        store_values(i0, further);
      }
    }
    __syncthreads();

    // This run's rows [a, a + kRun); segment first - 1 + j is the one open at
    // row a, and each marked row starts the next.
    const int a = tid * kRun;
    constexpr uint32_t kRunMask = kRun == 32 ? ~0u : (1u << kRun) - 1;
    const uint32_t marks = sm.starts[a / 32] >> (a % 32) & kRunMask;
    const bool crowded = crowded_word;
    // Starts before row a: by the marks when each marked row starts one
    // segment, its warp's (warp_first) and its warp's marks before its run's;
    // else by binary search of the window.
    // 32-bit where not crowded (n = w.n there, warp_first below n or INT_MAX).
    int64_t j;
    int j32 = 0;
    if (!crowded) {
      const int count = __popc(marks);
      int through = count;  // inclusive scan over the warp
      through = warp_scan_step<1>(through);
      through = warp_scan_step<2>(through);
      through = warp_scan_step<4>(through);
      through = warp_scan_step<8>(through);
      through = warp_scan_step<16>(through);
      const int before = warp_first[tid / 32];
      j32 = (before < n ? before : n) + (through - count);
      j = j32;
    } else {
      j = starts_through(sm.window, indptr, rows, t0, w, a - 1);
    }
    // The run's rows, as they go to the stage.
    union {
      uint4 units[G::kStageUnits];
      T v[kRun * W];
    } run;
    auto label = [&](int q, const P& value_q) { memcpy(&run.v[q * W], &value_q, sizeof(P)); };
    if (!crowded && j32 + __popc(marks) < cached) {
#if defined(__HIP_PLATFORM_AMD__)
      int k = j32;
#pragma unroll
      for (int q = 0; q < kRun; ++q) {
        k += (marks >> q) & 1u;
        label(q, sm.values[k]);
      }
#else
      // sm.values[j], then one entry on at each marked row (step_if). Each step
      // waits on the load before it; a second chain, walking the run's second
      // half, gained nothing.
      // Measurements: docs/kernel-notes.md, "tile_gather_block: label walk".
      uint32_t at = static_cast<uint32_t>(__cvta_generic_to_shared(&sm.values[j32]));
#pragma unroll
      for (int q = 0; q < kRun; ++q) {
        at = step_if<sizeof(P)>(at, marks & (1u << q));
        label(q, load_shared_at<P>(at));
      }
#endif
      write_run(sm.stage, run.units);
    } else {
      // Each row straight to its place in the stage (write_run's, row q at byte
      // q * sizeof(P) of the run's units), not held in the run's 16 registers:
      // this walk was where the kernel held the most registers (bf16, 1 column:
      // 76 -> 63 without it; kTileGatherBlocksPerSm). Rare: a crowded tile, or
      // more starts than the cached values.
      int next = start(j);
      const int swizzle = stage_swizzle<G::kStageUnits>(tid);
      char* const to = reinterpret_cast<char*>(sm.stage + tid * G::kStageUnits);
#pragma unroll
      for (int q = 0; q < kRun; ++q) {
        while (next <= a + q) next = start(++j);  // skips segments without rows
        const P v = j < cached ? sm.values[j] : value(first - 1 + j);
        const int at = q * static_cast<int>(sizeof(P));  // a constant once unrolled
        *reinterpret_cast<P*>(to + ((at / 16) ^ swizzle) * 16 + at % 16) = v;
      }
    }
    // Each warp stores the units of its own runs (store_warp_units), so its
    // lanes' writes to the stage are all it waits for: a warp barrier where a
    // block one was. The label walk by search reads the window, which the
    // next tile writes before load_window's barrier: a tile where some run
    // may have taken it (crowded, or a run past the cached values, which only
    // a tile of n >= cached starts has) waits for the block. Both are rare: a
    // segment without rows, more segments in a tile than kValues.
#if defined(__HIP_PLATFORM_AMD__)
    __syncthreads();  // no warp barrier assumed on ROCm (a wavefront may hold 64 threads)
#else
    if (crowded || n >= cached)
      __syncthreads();
    else
      __syncwarp();
#endif
    // The marks of rows [a, a + 32) were read by threads of this warp alone
    // (32 / kRun runs): the one whose run starts them clears them, after the
    // warp barrier. The next tile sets marks only after load_window's barrier.
    if (a % 32 == 0) sm.starts[a / 32] = 0;
    store_warp_units<G::kStageUnits>(out + t0 * W, sm.stage, nrows * G::kRowBytes);
    first += w.n;
    open_value = value(first - 1);
  }
}

// Grid: x = kTileGatherWaves times as many equal row ranges as fit on the GPU
// at once, so that blocks that finish early take more. A block walks its
// range in tiles of 16 KB: it marks the rows where segments start (indptr and
// the segments' values read a tile ahead), each thread labels its run of
// rows with its segment's value from shared memory, and each warp stores its
// runs through the stage 512 contiguous bytes at a time, as a copy writes.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads, kTileGatherBlocksPerSm<T, W>)
    tile_gather_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                       T* __restrict__ out, int64_t rows, int64_t segments,
                       int64_t rows_per_block) {
  __shared__ TileGatherShared<T, W> sm;
  tile_gather_block<T, W>(src, indptr, out, rows, segments, rows_per_block, sm);
}

// ---------------------------------------------------------------------------
// Stream kernels (wider rows; gathers over long segments)

// Where a block of the stream sum and each of its groups work. A group has
// one lane per W-column pack of a row and owns an equal, contiguous row range.
struct Place {
  int lanes, groups, g, l;
  int slab_lanes;  // lanes with columns in this slab (fewer only in the last of several)
  bool active;
  int64_t col;     // first column of this thread's pack
  int64_t r0, r1;  // the block's rows
  int64_t g0, g1;  // this group's rows
};

// The group width is the same in every slab, so every slab cuts the same rows.
__device__ __forceinline__ Place place(int64_t rows, int64_t inner, int W, int64_t group_rows,
                                       int64_t slab) {
  Place p;
  const int tid = threadIdx.x;
  const int64_t packs = inner / W;
  p.lanes = static_cast<int>(imin(kThreads, packs));
  p.groups = kThreads / p.lanes;
  p.g = tid / p.lanes;
  p.l = tid - p.g * p.lanes;
  p.slab_lanes = static_cast<int>(imin(p.lanes, packs - slab * kThreads));
  p.active = p.g < p.groups && p.l < p.slab_lanes;
  p.col = (slab * kThreads + p.l) * W;
  const int64_t block_rows = group_rows * p.groups;
  p.r0 = imin(rows, static_cast<int64_t>(blockIdx.x) * block_rows);
  p.r1 = imin(rows, p.r0 + block_rows);
  p.g0 = imin(p.r1, p.r0 + p.g * group_rows);
  p.g1 = p.active ? imin(p.r1, p.g0 + group_rows) : p.g0;
  return p;
}

// The segment range the block's rows can touch, from one cooperative search per end.
struct SegmentRange {
  int64_t lo, hi;
};

__device__ __forceinline__ SegmentRange block_segments(const int64_t* __restrict__ indptr,
                                                       int64_t segments, int64_t rows,
                                                       int64_t r0, int64_t r1) {
  // Segment at r0 >= lower_bound(r0) - 1; segment at any row < r1 < lower_bound(r1).
  int64_t s[2];
  block_lower_bounds<2>(indptr, segments, rows, {r0, r1}, s);
  return {s[0] - 1, s[1]};
}

// segment_sum

// The end of a stream block: `items` partials, in row order, of the segments
// that cross a group boundary (item_key[i] the segment or -1; item_val[c *
// items + i] for column col0 + c). Each run of items of one segment is summed,
// in group order, by the thread of its first item; the segment goes to out
// when it lies within the block's rows [r0, r1), else to the workspace for the
// fix-up kernel. Needs a barrier after the items are written.
template <typename T>
__device__ __forceinline__ void finish_items(const int64_t* item_key,
                                             const typename Num<T>::acc* item_val, int items,
                                             int cols, int64_t col0, int64_t r0, int64_t r1,
                                             bool keys, const int64_t* __restrict__ indptr,
                                             T* __restrict__ out, int64_t rows, int64_t inner,
                                             const Crossing<typename Num<T>::acc>& cross) {
  using Acc = typename Num<T>::acc;
  for (int e = threadIdx.x; e < cols * items; e += kThreads) {
    const int c = e / items, i = e - c * items;
    const int64_t key = item_key[i];
    if (key < 0) continue;
    int j = i - 1;
    while (j >= 0 && item_key[j] < 0) --j;
    if (j >= 0 && item_key[j] == key) continue;
    Acc total = 0;
    for (j = i; j < items; ++j) {
      const int64_t k = item_key[j];
      if (k == key) total += item_val[c * items + j];
      else if (k >= 0) break;
    }
    const int64_t start = start_of(indptr, key, rows), end = start_of(indptr, key + 1, rows);
    if (start >= r0 && end <= r1) out[key * inner + col0 + c] = Num<T>::from_acc(total);
    else if (start < r0) cross.head_val[blockIdx.x * inner + col0 + c] = total;
    else cross.tail_val[blockIdx.x * inner + col0 + c] = total;
  }
  if (keys && threadIdx.x == 0 && cross.head_key != nullptr) {
    int64_t first = -1, last = -1;
    for (int i = 0; i < items; ++i) {
      const int64_t k = item_key[i];
      if (k >= 0) {
        if (first < 0) first = k;
        last = k;
      }
    }
    cross.head_key[blockIdx.x] = first >= 0 && start_of(indptr, first, rows) < r0 ? first : -1;
    cross.tail_key[blockIdx.x] = last >= 0 && start_of(indptr, last, rows) >= r0 &&
                                   start_of(indptr, last + 1, rows) > r1
                               ? last
                               : -1;
  }
}

// The pairs' loop (rows of kPairRowBytes of a 2-byte type, no read-ahead) waited
// on each segment's end, read from indptr where the segment before it closed,
// and the rows streaming through L1 could evict its group's run of indptr. So
// the block first copies the ends of the segments its rows can reach, up to
// kStreamEnds of them, into shared memory, all loads at once, and the loop reads
// ends there; ends past the copy come from indptr as before. The values are
// indptr's own: the results are bit for bit the same. 4096 ends take all a block
// reaches on the benchmark's power law, and 4 blocks still fit an SM.
// ROCm keeps indptr reads there: 4 blocks of 41 KB (64-bit ends) would not fit a
// 64 KB LDS.
//
// The read-ahead loops of wide rows (kWide: 2-byte types, 16 packs a row or
// more; 8-byte packs of the 4- and 8-byte types) stage up to kStreamAheadEnds
// ends the same way, clamped into [0, rows] as end_of reads them (the values are
// end_of's own: the same results): the power law's groups meet very unequal
// numbers of ends, and the one wave ends with those that meet the most.
// Measurements: docs/kernel-notes.md, "kStreamEnds, kStreamAheadEnds".
#if defined(__HIP_PLATFORM_AMD__)
constexpr int kStreamEnds = 0;
constexpr int kStreamAheadEnds = 0;
#else
constexpr int kStreamEnds = 4096;
constexpr int kStreamAheadEnds = 2048;
#endif
// The pairs' loop keeps rows as 32-bit offsets within a block where it stages
// its ends (kRelEnds): inputs of up to kPairMaxRows rows (128 GiB in rows of
// 64 bytes); segment_sum sends larger ones to the other stream sums.
constexpr int64_t kPairMaxRows = kStreamEnds > 0 ? INT_MAX - 1 : INT64_MAX;
template <typename T, int W, StreamRows kShape, int64_t kInner>
constexpr int kStagedEnds =
    !StreamSumRows<T, kShape>::kReadAhead && kInner > 0 ? kStreamEnds
    : kShape == StreamRows::kWide || (kShape == StreamRows::kNarrow && sizeof(T) >= 4 &&
                                      W * sizeof(T) == 8)
        ? kStreamAheadEnds
        : 0;

// The loop without read-ahead (the pairs', kInner > 0) stages its ends as
// 32-bit offsets from the block's first row (stream_sum_block's kRelEnds says
// why); the read-ahead loops stage them as rows.
template <typename T, StreamRows kShape, int64_t kInner>
constexpr bool kRelEnds =
    !StreamSumRows<T, kShape>::kReadAhead && kInner > 0 && kStreamEnds > 0;

template <int kEnds, typename E>
struct StagedEnds {
  E end[kEnds];  // end[j]: the end of segment base + j, kNever (or its offset) past the last
};
template <typename E>
struct StagedEnds<0, E> {};

template <typename T, int W, int kEnds = 0, typename E = int64_t>
struct StreamSumShared : StagedEnds<kEnds, E> {
  using Acc = typename Num<T>::acc;
  // Partials of segments that cross a group boundary: two per group (the one
  // open at its first row, the one open after its last), column-major.
  int64_t item_key[2 * kThreads];
  Acc item_val[2 * kThreads * W];
};
template <typename T, int W, StreamRows kShape, int64_t kInner>
using StreamSumSharedOf =
    StreamSumShared<T, W, kStagedEnds<T, W, kShape, kInner>,
                    std::conditional_t<kRelEnds<T, kShape, kInner>, int, int64_t>>;

// kInner > 0: rows are known to hold kInner elements (inner is ignored), so
// every row address is a constant offset from the group's pointer: on the pairs'
// 16-row batches a runtime width cost a 64-bit add per load.
// Measurements: docs/kernel-notes.md, "stream_sum_block: kInner".
template <typename T, int W, StreamRows kShape, int64_t kInner = 0, bool kIntRows = false>
__device__ __forceinline__ void stream_sum_block(const T* __restrict__ src,
                                                 const int64_t* __restrict__ indptr,
                                                 T* __restrict__ out, int64_t rows,
                                                 int64_t segments, int64_t row_elements,
                                                 int64_t group_rows, int64_t slab,
                                                 const Crossing<typename Num<T>::acc>& cross,
                                                 StreamSumSharedOf<T, W, kShape, kInner>& sm) {
  using Acc = typename Num<T>::acc;
  using Batch = StreamSumRows<T, kShape>;
  constexpr int kEnds = kStagedEnds<T, W, kShape, kInner>;
  constexpr int kRows = Batch::kRows;
  const int64_t inner = kInner > 0 ? kInner : row_elements;
  constexpr int kCols = W;  // columns each thread sums
  const Place p = place(rows, inner, W, group_rows, slab);
  const SegmentRange range = block_segments(indptr, segments, rows, p.r0, p.r1);
  const int items = 2 * p.groups;
  const int cols = p.slab_lanes * kCols;
  // The staged ends (kStreamEnds): those of segments [ends_base, ends_base +
  // ends_n), which hold every end the loop reads on a valid indptr (segments
  // range.lo + 2 to range.hi) when they fit. Every thread takes part (a
  // barrier). A previous slab's readers are past the kernel's barrier.
  int64_t ends_base = 0;
  int ends_n = 0;
  // kRel: the loop without read-ahead keeps its ends as 32-bit offsets from
  // the block's first row (rel_end), staged ends included (see that loop).
  constexpr bool kRel = kRelEnds<T, kShape, kInner>;
  auto rel_end = [&](int64_t x) {  // x clamped into [r0 - 1, r1 + 1], less r0
    return static_cast<int>(imin(imax(x, p.r0 - 1), p.r1 + 1) - p.r0);
  };
  if constexpr (kEnds > 0) {
    ends_base = imax(range.lo + 1, 0);
    ends_n = static_cast<int>(imax(0, imin(kEnds, range.hi + 2 - ends_base)));
    if (ends_n > 0) {  // the same in every thread
      // Every load goes out before the first store: entries past ends_n read
      // the last one again (no branch around a load), and past the last
      // segment indptr[segments], kept as kNever.
      // kRel: each end becomes its offset as it comes (a value of 32 bits to
      // hold to the stores).
      std::conditional_t<kRel, int, int64_t> v[kEnds / kThreads];
#pragma unroll
      for (int i = 0; i < kEnds / kThreads; ++i) {
        const int j = i * kThreads + static_cast<int>(threadIdx.x);
        const int64_t k = ends_base + (j < ends_n ? j : ends_n - 1);
        int64_t e = indptr[imin(k, segments - 1) + 1];
        if constexpr (Batch::kReadAhead) e = clamp_row(e, rows);  // as end_of reads it
        e = k < segments ? e : kNever;
        if constexpr (kRel) v[i] = rel_end(e);
        else v[i] = e;
      }
#pragma unroll
      for (int i = 0; i < kEnds / kThreads; ++i) {
        const int j = i * kThreads + static_cast<int>(threadIdx.x);
        if (j < ends_n) sm.end[j] = v[i];
      }
    }
    __syncthreads();
  }

  int64_t head = -1, tail = -1;
  Acc acc[kCols];
#pragma unroll
  for (int k = 0; k < kCols; ++k) acc[k] = 0;
  // The head's partial goes straight to shared memory: registers bound the
  // resident blocks, and with them the bytes in flight.
  auto keep_head = [&](int64_t s) {
    head = s;
#pragma unroll
    for (int k = 0; k < kCols; ++k) sm.item_val[(p.l * kCols + k) * items + 2 * p.g] = acc[k];
  };

  if (p.g0 < p.g1) {
    int64_t s = segment_at(indptr, segments, rows, p.g0, range.lo, range.hi);
    // Empty segments starting at g0 are this group's to fill.
    for (int64_t e = s - 1; e >= 0 && start_of(indptr, e, rows) == p.g0; --e)
      store_pack(out + e * inner + p.col, zero_pack<T, kCols>());
    bool started = s >= 0 && s < segments && start_of(indptr, s, rows) == p.g0;
    int64_t end = end_of(indptr, segments, rows, s);
    // The end of the segment after s, read a segment ahead: read where s ends,
    // the group would wait on it with no rows in flight (H100, fp32, 8
    // columns: short segments 71.5 % of copy bandwidth against 68.8, power law
    // 63.1 against 60.6).
    int64_t end_after = end_of(indptr, segments, rows, s + 1);
    // Rows are reached by stepping a pointer: no 64-bit multiply per row.
    const T* at = src + p.g0 * inner + p.col;
    // Segment k's end from the staged ends where they hold it, else unstaged(k).
    auto staged_end = [&](int64_t k, auto&& unstaged) -> int64_t {
      if constexpr (kEnds > 0) {  // an unsigned test covers k < base
        const uint64_t j = static_cast<uint64_t>(k - ends_base);
        if (j < static_cast<uint64_t>(ends_n)) return sm.end[j];
      }
      return unstaged(k);
    };

    if constexpr (kIntRows) {
      // The read-ahead loop of 8-byte packs (kIntRowsOf) on 32-bit rows:
      // launch_stream_sum runs it for rows <= kIntRowsMax only. Rows, the
      // batch's bounds and segment ends are uint32_t. An end as end_of reads
      // it (clamped into [0, rows]) keeps its value; kNever becomes its low
      // word, UINT32_MAX, still past every row, so the test for empty
      // segments needs no s < segments beside it. At a segment end s <
      // segments holds (end is kNever's past that), and started implies s >=
      // 0, so the 64-bit tests there go too. The total's address o steps with
      // s, where out + s * inner took a 64-bit multiply at each end, and j,
      // the staged index of segment s + 1's end, counts in 32 bits (a 64-bit
      // subtraction and two tests before). The same rows, adds and stores as
      // the loop below: sums bit for bit the same. SASS counts: kIntRowsOf.
      using U = uint32_t;
      const U g1 = static_cast<U>(p.g1);
      U end32 = static_cast<U>(end), after32 = static_cast<U>(end_after);
      static_assert(kEnds > 0 && kWholeWords<T, W>, "kIntRowsOf: staged ends, 8-byte packs");
      // s is ends_base - 1 + j, j = s + 1 - ends_base in [-segments - 1,
      // segments + 1] (s in [-1, segments]: s < segments at every end, as
      // above), an int for segments <= kIntRowsMax: the index among the
      // staged ends of segment s + 1's end. The loop steps j and o alone.
      int j = static_cast<int>(s + 1 - ends_base);
      T* o = out + s * inner + p.col;  // where segment s's total goes
      auto next_end = [&]() -> U {  // the end of segment s + 1
        if (static_cast<unsigned>(j) < static_cast<unsigned>(ends_n))
          return static_cast<U>(sm.end[j]);
        return static_cast<U>(end_of(indptr, segments, rows, ends_base + j));
      };
      auto next_segment = [&]() {
        ++j;
        o += inner;
      };
      auto load_batch = [&](RawPack<T, W>(&d)[kRows], const T* q, int n) {
#pragma unroll
        for (int b = 0; b < kRows; ++b)
          d[b] = b < n ? load_raw<T, W>(q + b * inner) : RawPack<T, W>{};
      };
      auto batch_rows = [&](U r) {  // r <= g1 + kRows - 1: no wrap below
        return max(0, min(static_cast<int>(g1 - r), kRows));
      };
      RawPack<T, W> d[kRows], next[kRows];
      load_batch(d, at, batch_rows(static_cast<U>(p.g0)));
      for (U r = static_cast<U>(p.g0); r < g1; r += kRows, at += kRows * inner) {
        const int n = batch_rows(r);
        load_batch(next, at + kRows * inner, batch_rows(r + kRows));
#pragma unroll
        for (int b = 0; b < kRows; ++b) {
          if (b >= n) break;
          const U row = r + b;
          if (row == end32) {  // the segment before this row is complete
            if (started) {
              store_sum<T, kCols>(o, acc);
            } else if (s >= 0) {  // it began in an earlier group (the first
              keep_head(s);         // end: s has not moved)
            }
            next_segment();
            for (; after32 <= row; next_segment()) {  // UINT32_MAX past the last
              // Without rows: whole words of zero bits, zero_pack's bytes, in
              // one store (a Pack of bf16 at o took four).
              *reinterpret_cast<Words<T, W>*>(o) = Words<T, W>{};
              after32 = next_end();
            }
            end32 = after32;
            after32 = next_end();
            started = true;
#pragma unroll
            for (int k = 0; k < kCols; ++k) acc[k] = 0;
          }
          add_raw<T, W>(acc, d[b]);
        }
#pragma unroll
        for (int b = 0; b < kRows; ++b) d[b] = next[b];
      }
      s = ends_base - 1 + j;
      end = end32;  // as the test below reads it: a real end, or not g1
    } else if constexpr (Batch::kReadAhead) {
      // end_of(k), from the staged ends where they hold it (kStreamAheadEnds).
      auto end_of_staged = [&](int64_t k) {
        return staged_end(k, [&](int64_t e) { return end_of(indptr, segments, rows, e); });
      };
      // Rows past the group's last are not loaded. A prefetched batch is
      // zero-filled there instead: a skipped load would keep the registers'
      // old values alive across the copy to d (fp32 was up to 6.6 points of
      // copy bandwidth slower on an H100).
      auto load_batch = [&](RawPack<T, W>(&d)[kRows], const T* q, int n) {
#pragma unroll
        for (int b = 0; b < kRows; ++b)
          d[b] = b < n ? load_raw<T, W>(q + b * inner) : RawPack<T, W>{};
      };
      auto batch_rows = [&](int64_t r) {
        return static_cast<int>(imax(0, imin(p.g1 - r, kRows)));
      };
      RawPack<T, W> d[kRows], next[kRows];
      load_batch(d, at, batch_rows(p.g0));
      for (int64_t r = p.g0; r < p.g1; r += kRows, at += kRows * inner) {
        const int n = batch_rows(r);
        load_batch(next, at + kRows * inner, batch_rows(r + kRows));
#pragma unroll
        for (int b = 0; b < kRows; ++b) {
          if (b >= n) break;
          const int64_t row = r + b;
          if (row == end) {  // the segment before this row is complete
            if (s >= 0 && s < segments) {
              if (started) {
                store_sum<T, kCols>(out + s * inner + p.col, acc);
              } else {  // it began in an earlier group
                keep_head(s);
              }
            }
            for (++s; s < segments && end_after <= row; end_after = end_of_staged(++s))
              store_pack(out + s * inner + p.col, zero_pack<T, kCols>());  // without rows
            end = end_after;
            end_after = end_of_staged(s + 1);
            started = true;
#pragma unroll
            for (int k = 0; k < kCols; ++k) acc[k] = 0;
          }
          add_raw<T, W>(acc, d[b]);
        }
#pragma unroll
        for (int b = 0; b < kRows; ++b) d[b] = next[b];
      }
    } else {
      // A warp runs the code at a segment end whenever any of its groups meets
      // one: with 8-lane groups and 8-row segments, every other row. So the
      // check per row is one 32-bit compare with a constant, and the code at an
      // end steps an output offset and compares ends as read: the clamp is not
      // needed there, as no row or segment index is derived from an end (a
      // malformed indptr still reads and writes in bounds). Rows with reads
      // ahead lost with these checks, so they keep theirs.
      // Measurements: docs/kernel-notes.md, "stream_sum_block: checks at segment ends".
      auto end_of_raw = [&](int64_t k) {  // staged where kStreamEnds are
        return staged_end(k, [&](int64_t e) { return e < segments ? indptr[e + 1] : kNever; });
      };
      // kRel (the pairs' loop): rows and ends as 32-bit offsets from the block's
      // first row r0 (Row), an end clamped into [-1, r1 - r0 + 1] (rel_end).
      // Every test below sets an end against a row of [r0, r1] (a row of a
      // batch, the batch's first row r, g1), and the clamp keeps each answer: an
      // end under r0 (-1) is under every such row, one past r1 (r1 - r0 + 1;
      // kNever among them) past every such row and unequal to g1, and end - r
      // stays negative for an end before r (a malformed indptr), a large
      // unsigned value as the 64-bit difference was. The offsets fit in 32 bits:
      // segment_sum sends only inputs of up to kPairMaxRows rows here. The
      // staged ends are such offsets (16 KB where rows took 32), and j, the
      // index among them of the next end close reads (segment s + 1's), counts
      // in 32 bits, held at ends_n once past them. Short segments close every
      // few rows, and the integer work at a close is most of what this loop
      // spends besides its adds.
      // Measurements: docs/kernel-notes.md, "stream_sum_block: kRel".
      static_assert(!kRel || kWholeWords<T, W>, "the pairs' zero store below");
      using Row = std::conditional_t<kRel, int, int64_t>;
      auto row_at = [&](int64_t x) -> Row {  // x: a row of [r0, r1]
        if constexpr (kRel) return static_cast<int>(x - p.r0);
        else return x;
      };
      Row end_r, after_r;
      if constexpr (kRel) {
        end_r = rel_end(end);
        after_r = rel_end(end_after);
      } else {
        end_r = end;
        after_r = end_after;
      }
      [[maybe_unused]] int j = 0;
      if constexpr (kRel) j = static_cast<int>(imax(-1, imin(s + 1 - ends_base, ends_n)));
      // Where segment s's total goes: s_at, or for kRel its address o, from
      // which s is read back where needed (segment_of: past the staged ends,
      // and after the loop) instead of counted at every end, as o steps
      // anyway. Before the first close, the only one that can find
      // started false, s has not moved.
      int64_t s_at = s * inner + p.col;
      [[maybe_unused]] T* o = out + s_at;
      auto segment_of = [&](const T* q) { return (q - out - p.col) / inner; };
      auto next_end = [&]() -> Row {  // the end of segment s + 1
        if constexpr (kRel) {
          if (static_cast<unsigned>(j) < static_cast<unsigned>(ends_n)) return sm.end[j];
          const int64_t e = segment_of(o) + 1;
          return rel_end(e < segments ? indptr[e + 1] : kNever);
        } else {
          return end_of_raw(s + 1);
        }
      };
      auto total_at = [&]() {
        if constexpr (kRel) return o;
        else return out + s_at;
      };
      auto next_segment = [&]() {
        if constexpr (kRel) {
          o += inner;
          j = min(j + 1, ends_n);
        } else {
          ++s;
          s_at += inner;
        }
      };
      auto close = [&](Row row) {
        // kRel: the common close first, under one branch: a started segment, the
        // next one not empty and its end among the staged ones. It leaves o, j,
        // end_r, after_r, started and acc as the general close below would
        // (there next_segment's min(j + 1, ends_n) is j + 1, the loop over empty
        // segments does not run, and next_end reads sm.end[j + 1]), with the
        // same store: sums bit for bit the same. The general close tests these
        // one branch at a time, and a warp's issue waits on each branch's
        // predicate; on the power law the warps in a crowd of short segments,
        // which close at most rows, end the one wave.
        // Measurements: docs/kernel-notes.md, "stream_sum_block: the common close".
        if constexpr (kRel) {
          const int jn = j + 1;
          if (started && after_r > row &&
              static_cast<unsigned>(jn) < static_cast<unsigned>(ends_n)) {
            const Row next = sm.end[jn];  // segment s + 2's end
            store_sum<T, kCols>(o, acc);
            o += inner;
            j = jn;
            end_r = after_r;
#pragma unroll
            for (int k = 0; k < kCols; ++k) acc[k] = 0;
            after_r = next;
            return;
          }
        }
        // (the common close above repeats this case for kRel: keep them in step)
        if (started) {
          store_sum<T, kCols>(total_at(), acc);
        } else if (s >= 0) {  // it began in an earlier group (kRel: the first
          keep_head(s);         // close, so s has not moved)
        }
        next_segment();
        for (; after_r <= row; next_segment()) {  // kNever past the last segment
          if constexpr (kRel) {  // whole words, zero bits: one store (a Pack took two)
            *reinterpret_cast<Words<T, W>*>(o) = Words<T, W>{};
          } else {
            store_pack(total_at(), zero_pack<T, kCols>());  // without rows
          }
          after_r = next_end();
        }
        end_r = after_r;
        after_r = next_end();
        started = true;
#pragma unroll
        for (int k = 0; k < kCols; ++k) acc[k] = 0;
      };
      // Rows of the batch at r before segment s ends; an end before r (only
      // a malformed indptr has one) wraps to a large unsigned value.
      auto rows_before_end = [&](Row r) {
        using U = std::make_unsigned_t<Row>;
        const U left = static_cast<U>(end_r - r);
        return left < kRows ? static_cast<int>(left) : kRows;
      };
      // Whole batches, then the rest row by row: groups own a multiple of
      // kRows rows, so only the input's last group has a rest.
      const Row batched_end = row_at(p.g0 + (p.g1 - p.g0) / kRows * kRows);
      auto load_batch = [&](RawPack<T, W>(&d)[kRows], const T* q) {
#pragma unroll
        for (int b = 0; b < kRows; ++b) d[b] = load_raw<T, W>(q + b * inner);
      };
      RawPack<T, W> d[kRows];
      Row r = row_at(p.g0);
      if (r < batched_end) load_batch(d, at);
      for (; r < batched_end; r += kRows, at += kRows * inner) {
        int until = rows_before_end(r);
#pragma unroll
        for (int b = 0; b < kRows; ++b) {
          if (b == until) {  // the segment before this row is complete
            close(r + b);
            until = rows_before_end(r);
          }
          add_raw<T, W>(acc, d[b]);
        }
        if (r + kRows < batched_end) load_batch(d, at + kRows * inner);
      }
      const Row g1 = row_at(p.g1);
#pragma unroll 1
      for (; r < g1; ++r, at += inner) {
        if (r == end_r) close(r);
        add_raw<T, W>(acc, load_raw<T, W>(at));
      }
      // The test below, end == g1, on the offset (see kRel).
      if constexpr (kRel) {
        end = end_r == g1 ? p.g1 : kNever;
        s = segment_of(o);
      } else {
        end = end_r;
      }
    }
    // The segment open after the last row.
    if (s >= 0 && s < segments) {
      if (started && end == p.g1) {
        store_sum<T, kCols>(out + s * inner + p.col, acc);
      } else if (started) {
        tail = s;
      } else {
        keep_head(s);
      }
    }
    if (p.g1 == rows)  // empty segments at the very end
      for (++s; s < segments; ++s) store_pack(out + s * inner + p.col, zero_pack<T, kCols>());
  }

  if (p.active) {
#pragma unroll
    for (int k = 0; k < kCols; ++k) sm.item_val[(p.l * kCols + k) * items + 2 * p.g + 1] = acc[k];
    if (p.l == 0) {
      sm.item_key[2 * p.g] = head;
      sm.item_key[2 * p.g + 1] = tail;
    }
  }
  __syncthreads();
  finish_items<T>(sm.item_key, sm.item_val, items, cols, slab * kThreads * W, p.r0, p.r1,
                  slab == 0, indptr, out, rows, inner, cross);
}

// The read-ahead loop of 8-byte packs (fp32 pairs, 2-byte types in fours on
// kWide) runs on 32-bit rows (stream_sum_block's kIntRows) for inputs of up to
// kIntRowsMax rows; larger ones keep 64-bit rows, the same sums. Those rows
// (fp32, 64 columns; bf16, 256 columns) are one warp or more per group, so a
// warp runs each segment end whole, and on short segments the integer work at
// the ends and around each batch is much of what it issues. ROCm keeps 64-bit
// rows (not measured there).
// Measurements: docs/kernel-notes.md, "kIntRowsOf".
template <typename T, int W, StreamRows kShape>
constexpr bool kIntRowsOf = StreamSumRows<T, kShape>::kReadAhead && W * sizeof(T) == 8 &&
                            sizeof(T) <= 4 && kStreamAheadEnds > 0;
constexpr int64_t kIntRowsMax = INT_MAX - 1;  // rows and segments

// Grid: x = row ranges (one per block, equal sizes, as many as fit on the GPU
// at once), y = column slabs of kThreads packs (only rows wider than
// kThreads * W elements have more than one).
template <typename T, int W, StreamRows kShape, int64_t kInner = 0, bool kIntRows = false>
__global__ void __launch_bounds__(kThreads, StreamSumRows<T, kShape>::kBlocksPerSm)
    stream_sum_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                      T* __restrict__ out, int64_t rows, int64_t segments, int64_t inner,
                      int64_t group_rows, int64_t slabs, Crossing<typename Num<T>::acc> cross) {
  __shared__ StreamSumSharedOf<T, W, kShape, kInner> sm;
  allow_dependents(cross.head_key != nullptr);  // a fix-up follows
  for (int64_t slab = blockIdx.y; slab < slabs; slab += gridDim.y) {
    stream_sum_block<T, W, kShape, kInner, kIntRows>(src, indptr, out, rows, segments, inner,
                                                     group_rows, slab, cross, sm);
    __syncthreads();
  }
}

// Long segments, rows of at most kTeam / 2 16-byte units. A team of kTeam
// threads owns a contiguous row range and reads it as a copy would, 512
// contiguous bytes per step, kBatch steps in flight (kShortTeamBatch over
// short segments). Lanes split a step by unit: with U units per row, the RS =
// kTeam / U lanes of slice c take unit c of the step's rows (R rows per unit
// when a row is narrower than a unit). Each lane sums its rows of the current
// segment; where a segment ends, each slice adds its lanes' sums by shuffles
// (slice_total); over short segments by a reduce-scatter, each lane storing
// kOwn columns (slice_part). The caller picks this kernel for long segments on
// average, so most steps meet no end at all. Segments that cross a team's ends
// meet as in stream_sum.
template <typename T, int kCols, int U>
struct TeamShape {
  static constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  static_assert(U == 1 || kCols == kVec, "a unit is part of one row, or whole rows");
  static constexpr int R = kVec / kCols;  // rows per unit
  static constexpr int kInner = kCols * U;
  static constexpr int RS = kTeam / U;    // lanes per slice
  // A power of two: a slice reduces by shuffles within its lanes (team_sum).
  static_assert(RS >= 2 && (RS & (RS - 1)) == 0, "a slice is a logical warp");
  static constexpr int kStepRows = RS * R;
};

// Where a thread of a team kernel works: team t of the block, lane l of the
// team, lane q of slice c; the block's rows [r0, r1) and the team's [a0, a1).
struct TeamPlace {
  int t, l, c, q;
  int64_t r0, r1, a0, a1;
};

template <int RS>
__device__ __forceinline__ TeamPlace team_place(int64_t rows, int64_t team_rows) {
  TeamPlace p;
  p.t = threadIdx.x / kTeam;
  p.l = threadIdx.x % kTeam;
  p.c = p.l / RS;
  p.q = p.l % RS;
  p.r0 = imin(rows, static_cast<int64_t>(blockIdx.x) * kTeams * team_rows);
  p.r1 = imin(rows, p.r0 + kTeams * team_rows);
  p.a0 = imin(p.r1, p.r0 + p.t * team_rows);
  p.a1 = imin(p.r1, p.a0 + team_rows);
  return p;
}

struct CostCuts {  // split_by_cost's
  int64_t probe[kThreads];
  int64_t bound[kTeams + 1];
};
struct NoCuts {};

template <typename T, int kCols, int U, bool kShort>
struct TeamSumShared {
  using Acc = typename Num<T>::acc;
  int64_t item_key[2 * kTeams];  // as in StreamSumShared, one group per team
  Acc item_val[2 * kTeams * kCols * U];
  std::conditional_t<kShort, CostCuts, NoCuts> cuts;  // only the cost split needs them
};

// Short segments in rows of 128 bytes (kShort below): on the power law, teams of
// equal rows meet very unequal numbers of segment ends, so blocks and teams
// split rows by cost, a segment start weighing kTeamSegmentCost rows: 6 in rows
// of a 2-byte type, whose segment's 64 columns are converted, reduced and stored
// where fp32's row holds 32, and 4 in fp32. The cost split costs uniform laws
// about 3 points (its searches come before the first load); rows of 64 and 256
// bytes lost with it, and picking a split by a sample of indptr cost as much as
// it saved.
// Measurements: docs/kernel-notes.md, "kTeamSegmentCost".
template <typename T>
constexpr int64_t kTeamSegmentCost = sizeof(T) == 2 ? 6 : 4;

// The team sum on short segments keeps rows as 32-bit offsets within a team
// (team_sum_kernel's Row): inputs of up to kShortTeamMaxRows rows (128 GiB in
// rows of 128 bytes); larger ones take the stream sum (short_team_rows).
constexpr int64_t kShortTeamMaxRows = int64_t{1} << 30;

// The team sum on short segments loads twice kBatch steps a batch, at 3 blocks
// per SM (80 registers; sm_90 SASS: no spills in fp32, bf16 and fp64, 12 bytes
// in fp16): at 4 steps its loop waited on each batch's first load with nothing
// else in flight, and a batch of 8 steps holds 4 KB of a warp's rows in flight
// where 4 held 2. The gain is the batch, not the blocks; deeper batches spilled
// or lost. The sums differ from 4 blocks' in their last bits: fewer blocks,
// other ranges. (ROCm keeps kBatch at 4 blocks: not measured there.)
// Measurements: docs/kernel-notes.md, "kShortTeamBatch".
#if defined(__HIP_PLATFORM_AMD__)
constexpr int kShortTeamBatch = kBatch;
constexpr int kShortTeamBlocksPerSm = kStreamBlocksPerSm;
#else
constexpr int kShortTeamBatch = 2 * kBatch;
constexpr int kShortTeamBlocksPerSm = 3;
#endif
template <bool kShort>
constexpr int kTeamSumBatch = kShort ? kShortTeamBatch : kBatch;
template <bool kShort>
constexpr int kTeamSumBlocksPerSm = kShort ? kShortTeamBlocksPerSm : kStreamBlocksPerSm;

// The block's rows [r0, r1), whose segment starts are [first, last), cut into
// kTeams ranges of equal cost (a row costs 1, a segment start `per_start`): team
// t's range is [bound[t], bound[t + 1]). kThreads probes of indptr go out at
// once, then each cut is searched between two probes. All threads call it
// (barriers). Every cut lies in [r0, r1), whatever indptr holds. The kTeams - 1
// cuts searched together through block_partitions instead spilled and lost.
// Measurements: docs/kernel-notes.md, "split_by_cost".
__device__ __forceinline__ void split_by_cost(const int64_t* __restrict__ indptr, int64_t rows,
                                              int64_t r0, int64_t r1, int64_t first,
                                              int64_t last, int64_t per_start, int64_t* probe,
                                              int64_t* bound) {
  const int64_t n = imax(0, last - first);
  const int64_t step = imax(1, ceil_div(n, kThreads));
  auto cost_before = [&](int64_t s) {  // of the rows and starts before segment s starts
    return (start_of(indptr, s, rows) - r0) + per_start * (s - first);
  };
  const int tid = threadIdx.x;
  const int64_t k = first + tid * step;
  probe[tid] = k < last ? cost_before(k) : kNever;
  __syncthreads();
  if (tid <= kTeams) {
    int64_t x = tid == 0 ? r0 : r1;
    if (tid > 0 && tid < kTeams) {
      const int64_t share = share_of((r1 - r0) + per_start * n, tid, kTeams);
      int lo = -1, hi = kThreads - 1;  // the last probe costing at most `share`
      while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (probe[mid] <= share) lo = mid;
        else hi = mid - 1;
      }
      int64_t a = first - 1;  // the last start costing at most `share`
      if (lo >= 0) {
        a = first + lo * step;
        int64_t b = imin(last - 1, a + step - 1);
        while (a < b) {
          const int64_t mid = a + (b - a + 1) / 2;
          if (cost_before(mid) <= share) a = mid;
          else b = mid - 1;
        }
      }
      // The cut falls in segment a's rows, where its rows reach the share.
      x = a < first ? r0 + share
                    : start_of(indptr, a, rows) + imax(0, share - cost_before(a) - per_start);
      const int64_t next = a + 1 < last ? start_of(indptr, a + 1, rows) : r1;
      x = imax(r0, imin(x, imin(next, r1)));
    }
    bound[tid] = x;
  }
  __syncthreads();
}

// Grid: x = row ranges, as many as fit on the GPU at once (of equal cost on
// short segments, balanced_rows; of equal rows on long ones). Rows of 2 to 16
// 16-byte units: each team of 32 lanes owns a contiguous share of its block's
// rows and reads them 512 bytes a step, as a copy does, each lane summing its
// units; the team adds across lanes only where a segment ends, and the segments
// open at a block's ends go to the fix-up kernel.
// kShort: short segments (launch_team_sum), where the team reads segment ends
// ahead and blocks and teams split rows by cost; long segments keep the code
// that leaves them the registers they had. (Storing a one-row segment's sum
// straight from its lane timed no faster.)
// Measurements: docs/kernel-notes.md, "team_sum_kernel".
template <typename T, int kCols, int U, bool kShort>
__global__ void __launch_bounds__(kThreads, kTeamSumBlocksPerSm<kShort>)
    team_sum_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                    T* __restrict__ out, int64_t rows, int64_t segments, int64_t team_rows,
                    Crossing<typename Num<T>::acc> cross) {
  using Acc = typename Num<T>::acc;
  using Shape = TeamShape<T, kCols, U>;
  using Shared = TeamSumShared<T, kCols, U, kShort>;
  using Part = Partial<Acc, kCols>;
  constexpr int R = Shape::R, RS = Shape::RS, kInner = Shape::kInner;
  constexpr int kStepRows = Shape::kStepRows;
  constexpr int kSteps = kTeamSumBatch<kShort>;  // loads per lane in flight
  constexpr int kBatchRows = kSteps * kStepRows;  // rows one batch of loads covers
  constexpr int kItems = 2 * kTeams;
  __shared__ Shared sm;
  allow_dependents(cross.head_key != nullptr);  // a fix-up follows
  TeamPlace at = team_place<RS>(rows, team_rows);
  SegmentRange range;
  if constexpr (kShort) {  // blocks, then teams, of equal cost
    const BlockRows b = balanced_rows(indptr, segments, rows, blockIdx.x, gridDim.x,
                                      Costs{1, kTeamSegmentCost<T>}, 1);
    split_by_cost(indptr, rows, b.r0, b.r1, b.first, imin(b.next, segments),
                  kTeamSegmentCost<T>, sm.cuts.probe, sm.cuts.bound);
    at.r0 = b.r0;
    at.r1 = b.r1;
    at.a0 = sm.cuts.bound[at.t];
    at.a1 = sm.cuts.bound[at.t + 1];
    range = {b.first - 1, b.next};
  } else {
    range = block_segments(indptr, segments, rows, at.r0, at.r1);
  }
  const int t = at.t, l = at.l, c = at.c, q = at.q;
  const int64_t r0 = at.r0, r1 = at.r1, a0 = at.a0, a1 = at.a1;

  int64_t head = -1, tail = -1;
  Part acc;
#pragma unroll
  for (int k = 0; k < kCols; ++k) acc.v[k] = 0;
  // A slice's total, the same in every lane, by shuffles of lane q ^ d: lane 0
  // adds in the order cub::WarpReduce did, so sums are bit for bit the same,
  // without cub's convergence check and guard on every shuffle. slice_total
  // serves long segments, and short ones in fp64 rows; other short segments take
  // the reduce-scatter below. Both shuffle through slice_xor.
  // Measurements: docs/kernel-notes.md, "team_sum_kernel: slice_total".
  auto slice_total = [&] {
    Part total = acc;
#pragma unroll
    for (int d = 1; d < RS; d *= 2) {
#pragma unroll
      for (int k = 0; k < kCols; ++k)
        total.v[k] += slice_xor<RS>(total.v[k], q, d);
    }
    return total;
  };
  // Short segments (kShort, rows of 128 bytes): a reduce-scatter instead. At
  // each round, lane q keeps half of the columns it holds (the upper half where
  // bit d of q is set) and sends the other half to lane q ^ d, which adds it to
  // its own: after the rounds, lane q holds kOwn columns of the total, from
  // column own0 on, and the slice's lanes store the row's 16 bytes together. A
  // column's total is the same sum as slice_total's, pair by pair in the same
  // rounds (d = 1 first), only added as other + own in some lanes where
  // slice_total added own + other: float addition commutes bit for bit, so the
  // sums are the same. Fewer shuffles and adds per segment end, and one store
  // per lane.
  // Measurements: docs/kernel-notes.md, "team_sum_kernel: reduce-scatter".
  constexpr bool kScatter = kShort && kCols % RS == 0;
  constexpr int kOwn = kScatter ? kCols / RS : kCols;
  using Own = Partial<Acc, kOwn>;
  int own0 = 0;  // this lane's first column of the slice's kCols
  if constexpr (kScatter)
#pragma unroll
    for (int d = 1, m = kCols / 2; d < RS; d *= 2, m /= 2) own0 += q & d ? m : 0;
  auto slice_part = [&] {  // this lane's kOwn columns of the slice's total
    if constexpr (kScatter) {
      Acc v[kCols];
#pragma unroll
      for (int k = 0; k < kCols; ++k) v[k] = acc.v[k];
#pragma unroll
      for (int d = 1, m = kCols / 2; d < RS; d *= 2, m /= 2) {
        const bool upper = q & d;
#pragma unroll
        for (int i = 0; i < m; ++i) {
          const Acc send = upper ? v[i] : v[i + m];
          const Acc own = upper ? v[i + m] : v[i];
          v[i] = own + slice_xor<RS>(send, q, d);
        }
      }
      Own part;
#pragma unroll
      for (int k = 0; k < kOwn; ++k) part.v[k] = v[k];
      return part;
    } else {
      static_assert(std::is_same_v<Own, Part>, "every column");
      return slice_total();
    }
  };
  // Whether this lane stores (or keeps) its part of a total.
  const bool owner = kScatter || q == 0;
  auto keep = [&](int item, const Own& part) {
    if (owner)
#pragma unroll
      for (int k = 0; k < kOwn; ++k)
        sm.item_val[(c * kCols + own0 + k) * kItems + item] = part.v[k];
  };
  auto zero = [&](int64_t e) {  // this slice's part of segment e
    store_pack(out + e * kInner + c * kCols, zero_pack<T, kCols>());
  };
  auto add_unit = [&](const uint4& unit) {  // every row of a unit, into acc
    uint32_t v[sizeof(unit) / 4];
    memcpy(v, &unit, sizeof(v));
#pragma unroll
    for (int i = 0; i < R * kCols; ++i) acc.v[i % kCols] += word_elem<T>(v, i);
  };

  if (a0 < a1) {
    // The segment state is the same in every lane: the team's branches agree.
    int64_t s = segment_at(indptr, segments, rows, a0, range.lo, range.hi);
    if (q == 0)  // empty segments starting at a0 are this team's to fill
      for (int64_t e = s - 1; e >= 0 && start_of(indptr, e, rows) == a0; --e) zero(e);
    bool started = s >= 0 && s < segments && start_of(indptr, s, rows) == a0;
    // Short segments keep rows (segment ends, the batch's steps) as 32-bit
    // offsets from a0 (Row), an end clamped into [-1, a1 - a0 + 1]: every test
    // below sets an end against a row of [a0, a1] (a step's bound, a lane's row,
    // a1) or against an earlier end under a1 (lo), and the clamp keeps each
    // answer but one: lo < end < a0 (only where indptr decreases or the segment
    // search was given too narrow a range), where both clamp to -1 and that
    // segment takes zero() where it took store_sum of an acc no row reached: the
    // same zero bytes. The offsets fit in 32 bits: this kernel runs only for
    // rows <= kShortTeamMaxRows (launch_team_sum). Short segments end in most
    // steps of 4 rows, and the integer work around each end bound these kernels.
    // Measurements: docs/kernel-notes.md, "team_sum_kernel: 32-bit rows".
    using Row = std::conditional_t<kShort, int, int64_t>;
    // from_b below sets a Row against the absolute b, and only rows of one
    // unit (U == 1) take it: short segments come in rows of 8 units alone.
    static_assert(!kShort || U == 8, "short segments: rows of 128 bytes (launch_team_sum)");
    auto row_of = [&](int64_t x) -> Row {
      if constexpr (kShort) return static_cast<int>(imax(imin(x - a0, a1 - a0 + 1), -1));
      else return x;
    };
    // Short segments: lane l holds the end of the l-th of the next kTeam
    // segments (ends) and of the kTeam after them (ends_ahead, read ahead), so
    // an end costs a shuffle, not a dependent indptr load. end_at is called for
    // s, then s + 1, s + 2, ...: `next` counts the calls since the last refill
    // in 32 bits, where a 64-bit base of the held ends took a 64-bit subtraction
    // and test per end. (A stepped output pointer, s worked out only at refills,
    // was within a point.)
    // Measurements: docs/kernel-notes.md, "team_sum_kernel: ends read ahead".
    int next = 0;
    Row ends = kShort ? row_of(end_of(indptr, segments, rows, s + l)) : 0;
    Row ends_ahead = kShort ? row_of(end_of(indptr, segments, rows, s + kTeam + l)) : 0;
    auto end_at = [&](int64_t x) -> Row {  // x: s, then one more each call
      if constexpr (!kShort) return end_of(indptr, segments, rows, x);
      if (next >= kTeam) {  // x is ends0 + kTeam: the read-ahead ends serve
        next = 0;
        ends = ends_ahead;
        ends_ahead = row_of(end_of(indptr, segments, rows, x + kTeam + l));
      }
      return cub::ShuffleIndex<kTeam>(ends, next++, 0xffffffffu);
    };
    Row end = end_at(s);

    for (int64_t b = a0; b < a1; b += kBatchRows) {
      // Batches that no segment end falls in add every row into acc, in a loop
      // of their own: the general batch rebuilds each address from the team's
      // bounds (about 130 instructions per batch of four 16-byte loads against
      // 76). Short segments never fill a batch: they leave the loop out.
      // Measurements: docs/kernel-notes.md, "team_sum_kernel: full batches".
      if constexpr (!kShort) {
        const int64_t full = (imin(end, a1) - b) / kBatchRows;
        if (full > 0) {
          constexpr int64_t kStepUnits = kStepRows * kInner * sizeof(T) / 16;
          const uint4* p = reinterpret_cast<const uint4*>(src + (b + q * R) * kInner + c * kCols);
          for (int64_t i = 0; i < full; ++i, p += kSteps * kStepUnits) {
            uint4 f[kSteps];
#pragma unroll
            for (int k = 0; k < kSteps; ++k) f[k] = p[k * kStepUnits];
#pragma unroll
            for (int k = 0; k < kSteps; ++k) add_unit(f[k]);
          }
          b += full * kBatchRows;
          if (b >= a1) break;
        }
      }
      // The batch's bookkeeping in 32 bits, relative to b: the load guards and
      // step bounds (`left`, the team's rows from b as far as the batch
      // reaches), on rows of one unit the test for a step that no segment end
      // falls in (`end_b`), and on rows of one 2-byte column (8 rows a unit)
      // add_rows's row tests, where each was a 64-bit test: long segments of 1
      // bf16 column were bound by integer instructions. On units of 4 rows the
      // 32-bit row tests lost, so they stay on units of 8. Same rows, same adds:
      // the sums are bit for bit the same.
      // Short segments: b's row and a1's as offsets from a0 (32-bit, see Row),
      // so that `left` takes two 32-bit instructions where the compiler, short
      // of registers, rebuilt it from 64-bit a1 - b after each end.
      // Measurements: docs/kernel-notes.md, "team_sum_kernel: 32-bit batch bookkeeping".
      const Row b_row = kShort ? static_cast<Row>(b - a0) : static_cast<Row>(b);  // b in [a0, a1)
      const int left = kShort ? min(static_cast<int>(a1 - a0) - static_cast<int>(b_row), kBatchRows)
                              : static_cast<int>(imin(a1 - b, int64_t{kBatchRows}));
      // At 4 steps a batch the loop waited on these loads (kShortTeamBatch took
      // 8 steps); reloading d[k] with the next batch's unit as soon as unit k is
      // added, and a ring in shared memory (see StreamRows), lost.
      // Measurements: docs/kernel-notes.md, "team_sum_kernel: loads".
      uint4 d[kSteps];
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {  // all loads first
        const int r = k * kStepRows + q * R;  // this lane's first row, from b
        const T* p = src + (b + r) * kInner + c * kCols;
        if (r + R <= left)
          d[k] = *reinterpret_cast<const uint4*>(p);
        else if (r < left)  // only the very end of src
          d[k] = load_tail_unit(p, (left - r) * kCols);
        else
          d[k] = make_uint4(0, 0, 0, 0);
      }
      // x - b clamped into [-1, kBatchRows + 1]: as far as the
      // batch's steps can tell, where x falls.
      auto from_b = [&](Row x) {
        return static_cast<int>(imax(imin(x - b, int64_t{kBatchRows} + 1), -1));
      };
      [[maybe_unused]] int end_b = 0;
      if constexpr (U == 1) end_b = from_b(end);
#pragma unroll
      for (int k = 0; k < kSteps; ++k) {
        if (k * kStepRows >= left) break;
        const int step1_b = (k + 1) * kStepRows < left ? (k + 1) * kStepRows : left;
        if constexpr (U == 1) {  // (wider rows: the test below)
          if (end_b >= step1_b) {  // the common case: no segment ends in this step
            add_unit(d[k]);
            continue;
          }
        }
        const Row step0 = b_row + k * kStepRows;
        const Row step1 = b_row + step1_b;
        const Row u0 = step0 + q * R;
        uint32_t v[sizeof(d[k]) / 4];  // the unit's elements, read by word_elem
        memcpy(v, &d[k], sizeof(v));
        auto add_rows = [&](Row lo, Row hi) {  // this lane's rows in [lo, hi)
          if constexpr (R >= 8) {
            // Row u0 + i is in [lo, hi) when first <= i + q * R < past, the
            // bounds' offsets from step0 clamped into [-1, kStepRows + 1]
            // (i + q * R lies in [0, kStepRows)). Two loops, not one over
            // either test: folded, the 64-bit one compiled differently in
            // four long-segment kernels (sm_90 SASS), and it was not retimed.
            const int first = static_cast<int>(imax(imin(lo - step0, int64_t{kStepRows} + 1), -1));
            const int past = static_cast<int>(imax(imin(hi - step0, int64_t{kStepRows} + 1), -1));
#pragma unroll
            for (int i = 0; i < R; ++i)
              if (i + q * R >= first && i + q * R < past)
#pragma unroll
                for (int j = 0; j < kCols; ++j) acc.v[j] += word_elem<T>(v, i * kCols + j);
          } else {
#pragma unroll
            for (int i = 0; i < R; ++i)
              if (u0 + i >= lo && u0 + i < hi)
#pragma unroll
                for (int j = 0; j < kCols; ++j) acc.v[j] += word_elem<T>(v, i * kCols + j);
          }
        };
        if constexpr (U != 1) {
          if (end >= step1) {  // the common case: no segment ends in this step
            add_unit(d[k]);
            continue;
          }
        }
        Row lo = step0;
        while (end < step1) {  // segment s ends at row end - 1
          add_rows(lo, end);
          const Own total = slice_part();
          // Short segments: s < segments here, as end_at(segments) gives
          // row_of(kNever) = a1 - a0 + 1, past every step1.
          if (s >= 0 && (kShort || s < segments)) {
            if (started) {
              if (owner) store_sum<T, kOwn>(out + s * kInner + c * kCols + own0, total.v);
            } else {  // it began before the team's rows
              head = s;
              keep(2 * t, total);
            }
          }
          lo = end;
          // One end_at per segment: it shuffles on short segments, and calling
          // it again for the segment the loop stopped at cost 2 to 5 points.
          // Measurements: docs/kernel-notes.md, "team_sum_kernel: one end_at per segment".
          for (++s;; ++s) {
            end = end_at(s);
            // Short segments: end <= lo only for s < segments (row_of(kNever)
            // is past lo, which lies under a1).
            if (!((kShort || s < segments) && end <= lo)) break;
            if (q == 0) zero(s);
          }
          started = true;
#pragma unroll
          for (int j = 0; j < kCols; ++j) acc.v[j] = 0;
        }
        add_rows(lo, step1);
        if constexpr (U == 1) end_b = from_b(end);
      }
    }
    // The segment open after the last row.
    const Own total = slice_part();
    if (s >= 0 && s < segments) {
      if (started && end == row_of(a1)) {
        if (owner) store_sum<T, kOwn>(out + s * kInner + c * kCols + own0, total.v);
      } else if (started) {
        tail = s;
        keep(2 * t + 1, total);
      } else {
        head = s;
        keep(2 * t, total);
      }
    }
    if (a1 == rows)  // empty segments at the very end
      for (int64_t e = s + 1 + q; e < segments; e += RS) zero(e);
  }
  if (l == 0) {
    sm.item_key[2 * t] = head;
    sm.item_key[2 * t + 1] = tail;
  }
  __syncthreads();
  finish_items<T>(sm.item_key, sm.item_val, kItems, kInner, 0, r0, r1, true, indptr, out, rows,
                  kInner, cross);
}

// segment_gather

// The segment that holds `row`, at or after s (which held an earlier row and
// ends at `end` <= row): a galloping search from s, so a step over k segments
// costs about 2 log2(k) loads, all from the indptr lines the warp just read.
__device__ __forceinline__ int64_t seek(const int64_t* __restrict__ indptr, int64_t segments,
                                        int64_t rows, int64_t s, int64_t row) {
  int64_t lo = s + 1;  // start_of(lo) <= row
  int64_t step = 1;
  while (lo + step <= segments && start_of(indptr, lo + step, rows) <= row) {
    lo += step;
    step *= 2;
  }
  return last_start_at(indptr, rows, row, lo + 1, imin(lo + step - 1, segments));
}

// Stores are what the gather moves, and stores want every warp on contiguous
// memory. So a team of kTeam threads (or one group, if wider) owns a
// contiguous row range, and its groups take its rows in turn: consecutive
// groups write consecutive rows. Each thread keeps the current segment's pack
// in registers, stores it to every row of the segment, and seeks forward when
// a row leaves it. src is read about once per segment and team, so this is a
// copy's traffic.
template <typename T, int W>
__global__ void __launch_bounds__(kThreads, kStreamBlocksPerSm)
    stream_gather_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                         T* __restrict__ out, int64_t rows, int64_t segments, int64_t inner,
                         int64_t team_rows, int64_t slabs) {
  const int tid = threadIdx.x;
  const int64_t packs = inner / W;
  const int lanes = static_cast<int>(imin(kThreads, packs));
  const int team = lanes >= kTeam ? lanes : kTeam / lanes * lanes;
  const int teams = kThreads / team;
  const int t = tid / team, in_team = tid - t * team;
  const int groups = team / lanes, g = in_team / lanes, l = in_team - g * lanes;
  const int64_t a0 = imin(rows, (static_cast<int64_t>(blockIdx.x) * teams + t) * team_rows);
  const int64_t a1 = t < teams ? imin(rows, a0 + team_rows) : a0;
  const int64_t r0 = imin(rows, static_cast<int64_t>(blockIdx.x) * teams * team_rows);
  const SegmentRange range =
      block_segments(indptr, segments, rows, r0, imin(rows, r0 + teams * team_rows));
  for (int64_t slab = blockIdx.y; slab < slabs; slab += gridDim.y) {
    if (slab * kThreads + l >= packs) continue;
    const int64_t col = (slab * kThreads + l) * W;
    const int64_t first = a0 + g;
    if (first >= a1) continue;
    int64_t s = segment_at(indptr, segments, rows, first, range.lo, range.hi);
    int64_t end = end_of(indptr, segments, rows, s);
    auto value = [&](int64_t seg) {
      return seg >= 0 && seg < segments ? load_pack<T, W>(src + seg * inner + col)
                                        : zero_pack<T, W>();
    };
    Pack<T, W> v = value(s);
    for (int64_t row = first; row < a1; row += groups) {
      if (row >= end) {
        s = seek(indptr, segments, rows, s, row);
        end = end_of(indptr, segments, rows, s);
        v = value(s);
      }
      store_pack(out + row * inner + col, v);
    }
  }
}

// Rows of whole 16-byte units wider than 16 bytes. The stream gather's seek is a
// chain of dependent loads at every segment; here no load waits on another. A
// block labels a tile of kLabelTileRows rows with their segments (kLabelRows per
// thread, from the tile's window of segment starts read a tile ahead, as in the
// tile kernels), then copies the tile as 16-byte units, each thread with kBatch
// loads of segment values in flight before its stores.
//
// A tile's labelling costs barriers and a scan whatever the row width, so narrow
// rows want tiles of many rows: 4 rows per thread (1 was far slower on narrow
// rows, 8 lost 1 to 2 points, 2 lost on rows of 64 bytes). More loads in flight
// per thread lost.
// Measurements: docs/kernel-notes.md, "kLabelRows".
constexpr int kLabelRows = 4;
constexpr int kLabelTileRows = kThreads * kLabelRows;
// A tile's segment values, as many as fit kLabelValueUnits 16-byte units (16
// KB), are copied into shared memory with cp.async while the tile is marked and
// labelled, and its units are read from there. Read from src in the copy, short
// segments put a segment's first row in nearly every warp's batch of loads, so
// each batch waited on DRAM before its stores; in shared memory a tile's values
// wait on DRAM once, behind the marks, the scan and the labels. 16 KB holds a
// tile of short segments in rows of up to 128 bytes and half of one in rows of
// 256; the rest is read from src as before. It takes 16 KB from the L1 cache per
// block.
// ROCm reads every value from src, as before the copy: with the values a block
// takes about 33 KB of shared memory, so a 64 KB LDS holds 1 block where the 4
// of __launch_bounds__ were asked and 3 fitted at 16.6 KB (as kStreamEnds). A
// zero-size array being ill-formed, it keeps one unused unit (16 bytes).
// Measurements: docs/kernel-notes.md, "kLabelValueUnits".
#if defined(__HIP_PLATFORM_AMD__)
constexpr int kLabelValueUnits = 0;
#else
constexpr int kLabelValueUnits = 1024;
#endif
struct LabelGatherShared {
  using CountScan = cub::BlockScan<int, kThreads, cub::BLOCK_SCAN_WARP_SCANS>;
  typename CountScan::TempStorage count_scan;
  int counts[3];
  int crowded;
  uint32_t starts[kLabelTileRows / 32];
  alignas(16) int window[kWindow];
  const uint4* label[kLabelTileRows];  // where each row's value lies (label_of)
  // Entry i * units + c: unit c of segment first - 1 + i.
  uint4 values[kLabelValueUnits > 0 ? kLabelValueUnits : 1];
};

// A 16-byte unit from global to shared memory, asynchronously where the
// device can (waited for by wait_copied_units); a plain copy on ROCm, where
// kLabelValueUnits = 0 leaves it no unit to copy.
__device__ __forceinline__ void copy_unit(uint4* to, const uint4* from) {
#if defined(__HIP_PLATFORM_AMD__)
  *to = *from;
#else
  __pipeline_memcpy_async(to, from, 16);
#endif
}

__device__ __forceinline__ void wait_copied_units() {
#if !defined(__HIP_PLATFORM_AMD__)
  __pipeline_commit();
  __pipeline_wait_prior(0);
#endif
}

// Grid: x = equal row ranges, kLabelGatherWaves times as many as fit on the
// GPU at once (kNarrowLabelGatherWaves on rows of at most kNarrowLabelBytes).
// Rows wider than 16 bytes, in whole 16-byte units: a block takes tiles of
// kLabelTileRows rows, labels each row once with where its segment's value
// lies (shared memory, where the tile's values were copied, or src), then
// its threads copy the tile unit by unit, consecutive threads on consecutive
// units, so the stores are a copy's.
template <typename T>
__global__ void __launch_bounds__(kThreads, kStreamBlocksPerSm)
    label_gather_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                        T* __restrict__ out, int64_t rows, int64_t segments, int64_t inner,
                        int64_t rows_per_block) {
  using CountScan = LabelGatherShared::CountScan;
  constexpr int kVec = 16 / static_cast<int>(sizeof(T));
  __shared__ LabelGatherShared sm;
  const int tid = threadIdx.x;
  const int units = static_cast<int>(inner / kVec);  // per row
  const int row0 = tid / units, col0 = tid % units;
  const int row_step = kThreads / units, col_step = kThreads % units;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = imin(rows, r0 + rows_per_block);

  if (tid < 3) sm.counts[tid] = 0;
  clear_marks<kLabelTileRows / 32>(sm.starts);
  int64_t first = narrow_label_rows(inner, sizeof(T))
                      ? warp_lower_bound<kNarrowLabelSearchProbes>(indptr, segments, rows, r0)
                      : block_lower_bound(indptr, segments, rows, r0);
  // A row's label is where its segment's value lies, worked out once per row,
  // not once per 16-byte unit, with the stores through a pointer that steps with
  // the unit.
  // Measurements: docs/kernel-notes.md, "label_gather_kernel: labels".
  // The label is a generic address: the copy reads a unit with one load, from
  // shared memory or global, as its row's value lies. Segment first - 1 + i (i
  // >= 0) of a tile that holds `cached` values: its first unit in sm.values for
  // i < cached, else in src; null for no segment (zeros).
  auto label_of = [&](int64_t i, int cached) -> const uint4* {
    const int64_t s = first - 1 + i;
    return s < 0 || s >= segments ? nullptr
           : i < cached           ? &sm.values[i * units]
                                  : reinterpret_cast<const uint4*>(src + s * inner);
  };
  int round = 0;
  int steps = walk_steps(starts_per_tile(segments, rows, kLabelTileRows), kPrefetchSteps);
  int64_t raw[kPrefetchSteps];
  fetch_starts(indptr, segments, first, steps, raw);
  for (int64_t t0 = r0; t0 < r1; t0 += kLabelTileRows) {
    const int nrows = static_cast<int>(imin(r1, t0 + kLabelTileRows) - t0);
    __syncthreads();  // the previous tile's window, labels and values are read
    if (tid == 0) sm.crowded = 0;
    const Window w{first, load_window<WindowCount::kThreadAtomic>(indptr, segments, rows, t0,
                                                                  nrows, first, steps, raw,
                                                                  sm.window, sm.counts, round)};
    if (t0 + kLabelTileRows < r1) {
      steps = kPrefetchSteps;
      fetch_starts(indptr, segments, first + w.n, steps, raw);
    }
    // The values of the segments the tile's rows can be in, first - 1 + i for
    // i <= w.n, as many as fit; issued before the marks so that their wait
    // (before the barrier after the labels) overlaps the marks and the scan.
    // Unit e = i * units + c is thread e % kThreads's, stepped as in the copy.
    const int cached = static_cast<int>(imin(w.n + 1, kLabelValueUnits / units));
    {
      const int cached_units = cached * units;  // at most kLabelValueUnits
      int i = row0, c = col0;
      // Not unrolled: the copies need no registers to stay in flight, and
      // unrolled (4 deep, with the remainder) they took 400 instructions.
#pragma unroll 1
      for (int e = tid; e < cached_units; e += kThreads) {
        const int64_t s = first - 1 + i;  // no copy, and no label to read it, outside [0, segments)
        if (s >= 0 && s < segments)
          copy_unit(&sm.values[e], reinterpret_cast<const uint4*>(src + s * inner) + c);
        i += row_step;
        c += col_step;
        if (c >= units) {
          c -= units;
          ++i;
        }
      }
    }
    auto start = [&](int64_t i) {
      return i < w.n ? window_start(sm.window, indptr, rows, t0, w, i) : INT_MAX;
    };
    mark_starts(w.n, nrows, sm.window, start, sm.starts, sm.crowded, [](int64_t) {});
    __syncthreads();

    // Row r of the tile lies in segment first - 1 + (the starts at or before
    // it); this thread labels rows tid * kLabelRows and on.
    const int a = tid * kLabelRows;
    constexpr uint32_t kRunMask = (1u << kLabelRows) - 1;
    const uint32_t marks = sm.starts[a / 32] >> (a % 32) & kRunMask;
    if (!sm.crowded) {
      // (Labels worked out in 32 bits against bounds taken once a tile did not
      // pay.)
      // Measurements: docs/kernel-notes.md, "label_gather_kernel: labels".
      int before;
      CountScan(sm.count_scan).ExclusiveSum(__popc(marks), before);
#pragma unroll
      for (int j = 0; j < kLabelRows; ++j) {
        before += static_cast<int>(marks >> j & 1u);
        sm.label[a + j] = label_of(before, cached);
      }
    } else {
#pragma unroll
      for (int j = 0; j < kLabelRows; ++j)
        sm.label[a + j] =
            label_of(starts_through(sm.window, indptr, rows, t0, w, a + j), cached);
    }
    wait_copied_units();  // this thread's: the barrier makes every thread's visible
    __syncthreads();
    clear_marks<kLabelTileRows / 32>(sm.starts);  // the marks were read

    // Unit u of the tile is unit `col` of row `row`, stepped kThreads units
    // at a time without a division; moved as 32-bit words, which a half-type
    // Pack would take apart and put back together element by element.
    // The tile's rows are contiguous in out, so unit u of the tile is unit u
    // of the tile's part of out.
    const int total = nrows * units;
    uint4* unit_out = reinterpret_cast<uint4*>(out + t0 * inner) + tid;
    int row = row0, col = col0;
    for (int u0 = 0; u0 < total; u0 += kBatch * kThreads, unit_out += kBatch * kThreads) {
      uint4 v[kBatch];
#pragma unroll
      for (int b = 0; b < kBatch; ++b) {  // all loads first
        const bool in = u0 + b * kThreads + tid < total;
        // One generic load, shared or global: as two loads (an LDS and an
        // LDG), ptxas made each a branch, and a warp with units of both kinds
        // took both in turn. A held value's units lie inside sm.values
        // (label_of: i * units + col < cached * units <= kLabelValueUnits).
        const uint4* at = in ? sm.label[row] : nullptr;
        v[b] = at != nullptr ? at[col] : make_uint4(0, 0, 0, 0);
        row += row_step;
        col += col_step;
        if (col >= units) {
          col -= units;
          ++row;
        }
      }
#pragma unroll
      for (int b = 0; b < kBatch; ++b)
        if (u0 + b * kThreads + tid < total) unit_out[b * kThreads] = v[b];
    }
    first += w.n;
  }
}

// Long segments, rows of at most kTeam / 2 16-byte units: the team sum's
// split, the other way round. A team writes its row range 512 contiguous bytes
// per step, each lane its unit of the step: the current segment's value (its
// slice of it) over the unit's rows. The segment state is the same in every
// lane; where segments end inside a step, the team takes the next one, read
// ahead, or seeks past empty segments together.
template <typename T, int kCols, int U>
__global__ void __launch_bounds__(kThreads, kStreamBlocksPerSm)
    team_gather_kernel(const T* __restrict__ src, const int64_t* __restrict__ indptr,
                       T* __restrict__ out, int64_t rows, int64_t segments, int64_t team_rows) {
  using Shape = TeamShape<T, kCols, U>;
  using P = Pack<T, kCols>;
  constexpr int R = Shape::R, RS = Shape::RS, kInner = Shape::kInner;
  constexpr int kStepRows = Shape::kStepRows;
  const TeamPlace at = team_place<RS>(rows, team_rows);
  const int c = at.c, q = at.q;
  const int64_t a0 = at.a0, a1 = at.a1;
  const SegmentRange range = block_segments(indptr, segments, rows, at.r0, at.r1);
  if (a0 >= a1) return;
  auto value = [&](int64_t seg) {  // rows outside every segment get zeros
    return seg >= 0 && seg < segments ? load_pack<T, kCols>(src + seg * kInner + c * kCols)
                                      : zero_pack<T, kCols>();
  };

  int64_t s = segment_at(indptr, segments, rows, a0, range.lo, range.hi);
  int64_t end = end_of(indptr, segments, rows, s);
  P v = value(s);
  // The next segment's end and value are read while this one's rows are written:
  // at an end, the team had waited on indptr, then on src (the seek, then the
  // value). Two segments ahead lost on fp32.
  // Measurements: docs/kernel-notes.md, "team_gather_kernel".
  int64_t next_end = end_of(indptr, segments, rows, s + 1);
  P next_v = value(s + 1);
  for (int64_t step0 = a0; step0 < a1; step0 += kStepRows) {
    // Steps that no segment end falls in store the segment's value in a loop of
    // their own: the general step rebuilds each address from the team's bounds
    // (SASS, sm_90: about 70 instructions per 16-byte store against 3).
    // Measurements: docs/kernel-notes.md, "team_gather_kernel".
    const int64_t full = (imin(end, a1) - step0) / kStepRows;
    if (full > 0) {
      P same[R];
#pragma unroll
      for (int i = 0; i < R; ++i) same[i] = v;
      uint4 w;
      memcpy(&w, same, 16);
      uint4* p = reinterpret_cast<uint4*>(out + (step0 + q * R) * kInner + c * kCols);
      constexpr int64_t kStepUnits = kStepRows * kInner * sizeof(T) / 16;
      for (int64_t i = 0; i < full; ++i) p[i * kStepUnits] = w;
      step0 += full * kStepRows;
      if (step0 >= a1) break;
    }
    const int64_t step1 = imin(step0 + kStepRows, a1);
    const int64_t u0 = step0 + q * R;  // this lane's first row
    P unit[R];
#pragma unroll
    for (int i = 0; i < R; ++i) unit[i] = v;
    while (end < step1) {  // the rows from `end` on lie in later segments
      const int64_t from = end;
      if (next_end > from) {  // segment s + 1 starts at `from` and holds it
        ++s;
        end = next_end;
        v = next_v;
      } else {  // empty segments (or an unsorted indptr) in between
        // Past s even if indptr is unsorted, so the loop ends.
        s = imax(seek(indptr, segments, rows, s, from), s + 1);
        end = end_of(indptr, segments, rows, s);
        v = value(s);
      }
      next_end = end_of(indptr, segments, rows, s + 1);
      next_v = value(s + 1);
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (u0 + i >= from) unit[i] = v;
    }
    T* dst = out + u0 * kInner + c * kCols;
    if (u0 + R <= a1) {
      uint4 w;
      memcpy(&w, unit, 16);
      *reinterpret_cast<uint4*>(dst) = w;
    } else {  // only the very end of out
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (u0 + i < a1) store_pack(dst + i * kInner, unit[i]);
    }
  }
}

// ---------------------------------------------------------------------------
// Crossing segments, for both designs

// Finishes the segments that cross block boundaries. Block (x, y) handles the
// segment whose last partial block x holds (its tail), for the y-th share of the
// columns, up to kThreads columns per pass: it adds the heads of the following
// blocks the segment spans, with the threads left over per column (up to
// kFixupParts), reduced in a fixed order. A giant segment thus costs one read of
// blocks x inner partials, spread over the y blocks (launch_fixup asks for one
// per kThreads columns, and more only where segments span several blocks: two
// per block spanned). kGated: after the gated sums, the blocks are the tile
// sum's where cross.picked says it ran. It is a template flag so that the other
// sums' fix-up keeps its code: with the choice in it, a giant segment's forward
// lost 2-3 points of copy bandwidth.
// Held to 64 registers (4 blocks per SM, not the 3 that its 80 allowed), so more
// of its blocks run at once, and with the first kThreads heads' keys read beside
// the tail's, so a block waits on memory twice before it adds, not three times.
// The fix-up's time all adds to the op's: with one y block it reads the first
// pass's partials and the gated sums' pick with the keys, so a segment crossing
// one boundary waits on memory once before its store; with several, the blocks
// that find no segment return at once (reading early in each of them lost).
// Measurements: docs/kernel-notes.md, "kFixupBlocksPerSm".
constexpr int kFixupBlocksPerSm = 4;

// Grid: x = the sum's blocks (one per block boundary a segment may cross), y
// = shares of the columns. Launched early after the sum, it waits for it,
// then adds to each crossing segment's tail partial the heads of the blocks
// it spans, in block order (the comment above kFixupBlocksPerSm).
template <typename T, bool kGated>
__global__ void __launch_bounds__(kThreads, kFixupBlocksPerSm)
    segment_sum_fixup_kernel(T* __restrict__ out, int64_t segments, int64_t inner, int64_t blocks,
                             Crossing<typename Num<T>::acc> cross, int64_t tile_blocks) {
  using Acc = typename Num<T>::acc;
  __shared__ Acc part[kThreads];
  const int64_t b = blockIdx.x;
  const int tid = threadIdx.x;
  // Blocks whose partials the workspace holds: the sum's, or the larger of
  // the gated sums' block counts (launch_gated_sum carves it for both).
  const int64_t carved = gridDim.x;
  const int64_t first_head = b + 1 + tid;
  // With one y block (every block's columns in one), the first pass's tail
  // and first head are read with the keys (the comment above
  // kFixupBlocksPerSm). With several, most blocks find no segment to finish
  // (over a giant segment, one x block of all finds one), and those return
  // having read the keys alone, before any other work.
  const bool early = gridDim.y == 1;
  const bool first_col = early && tid < imin(inner, kThreads);
  const bool first_head_there = first_col && b + 1 < carved;
  wait_for_prerequisites();  // the sum's partials (launch_after)
  const Acc tail_first = first_col ? cross.tail_val[b * inner + tid] : Acc(0);
  const Acc head_first = first_head_there ? cross.head_val[(b + 1) * inner + tid] : Acc(0);
  const int64_t key_first = first_head_there ? cross.head_key[b + 1] : -1;
  const int64_t s = cross.tail_key[b];
  const int64_t first_key = first_head < carved ? cross.head_key[first_head] : -1;
  if constexpr (kGated) {
    if (*cross.picked != 0) blocks = tile_blocks;
    if (b >= blocks) return;
  }
  if (s < 0 || s >= segments) return;
  // The blocks after b that hold part of s have it as their head, one after
  // another: counted kThreads at a time, whatever rows each block owns.
  int64_t n = __syncthreads_count(first_head < blocks && first_key == s);
  for (int got = static_cast<int>(n); got == kThreads; n += got) {
    const int64_t bb = b + 1 + n + threadIdx.x;
    got = __syncthreads_count(bb < blocks && cross.head_key[bb] == s);
  }
  const int64_t share = ceil_div(inner, static_cast<int64_t>(gridDim.y));
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * share, k1 = imin(inner, k0 + share);
  const int cols = static_cast<int>(imin(share, kThreads));
  const int parts = static_cast<int>(imin(kThreads / cols, kFixupParts));
  const int c = tid % cols, j = tid / cols;  // early: thread c < cols read column c's first pass
  for (int64_t c0 = k0; c0 < k1; c0 += cols) {
    const int64_t k = c0 + c;
    Acc acc = 0;
    if (j < parts && k < k1) {
      int64_t i = j;
      if (early && c0 == k0 && j == 0 && n > 0) {
        acc += key_first == s ? head_first : Acc(0);
        i = parts;
      }
#pragma unroll 4
      for (; i < n; i += parts) {
        // Key and value issued together (a head's value is in the workspace
        // whether or not it is s's): one wait on memory per load, not two.
        const int64_t bb = b + 1 + i;
        const Acc v = cross.head_val[bb * inner + k];
        acc += cross.head_key[bb] == s ? v : Acc(0);
      }
    }
    part[tid] = acc;
    __syncthreads();
    if (tid < cols && k < k1) {
      Acc total = early && c0 == k0 ? tail_first : cross.tail_val[b * inner + k];
      for (int q = 0; q < parts; ++q) total += part[q * cols + tid];
      out[s * inner + k] = Num<T>::from_acc(total);
    }
    __syncthreads();
  }
}

// ---------------------------------------------------------------------------
// Host side: launch shapes. No call here waits for the device.

// A fact about the current device, found by ask(device, &value) once per
// device (a positive value; 0 in `cache` means not asked yet). The launches
// ask on every call, so the answers are kept; a failed ask is not.
template <typename Ask>
inline cudaError_t per_device(std::atomic<int> (&cache)[kMaxDevices], int* value, Ask ask) {
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  const bool cached = dev >= 0 && dev < kMaxDevices;
  int v = cached ? cache[dev].load(std::memory_order_relaxed) : 0;
  if (v == 0) {
    err = ask(dev, &v);
    if (err != cudaSuccess) return err;
    if (cached) cache[dev].store(v, std::memory_order_relaxed);
  }
  *value = v;
  return cudaSuccess;
}

inline cudaError_t sm_count(int* sms) {
  static std::atomic<int> cache[kMaxDevices];
  return per_device(cache, sms, [](int dev, int* n) {
    const cudaError_t err = cudaDeviceGetAttribute(n, cudaDevAttrMultiProcessorCount, dev);
    *n = *n > 0 ? *n : 1;
    return err;
  });
}

// Whether the device's peak memory bandwidth per SM reaches kDeepBytesPerSm.
inline cudaError_t deep_memory(bool* deep) {
  static std::atomic<int> cache[kMaxDevices];
  int answer = 0;  // 1: no, 2: yes
  const cudaError_t err = per_device(cache, &answer, [](int dev, int* yes) {
    int sms = 0, clock_khz = 0, bus_bits = 0;
    cudaError_t e = sm_count(&sms);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&clock_khz, cudaDevAttrMemoryClockRate, dev);
    if (e == cudaSuccess)
      e = cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev);
    // Two transfers per clock (DDR), bus_bits / 8 bytes each.
    const double bytes_per_sm = 2.0 * clock_khz * 1e3 * (bus_bits / 8.0) / (sms > 0 ? sms : 1);
    *yes = bytes_per_sm >= kDeepBytesPerSm ? 2 : 1;
    return e;
  });
  *deep = answer == 2;
  return err;
}

// Blocks of kKernel that fit on the whole GPU at once.
template <auto kKernel>
inline cudaError_t resident_blocks(int64_t* blocks) {
  static std::atomic<int> cache[kMaxDevices];
  int sms = 0, per_sm = 0;
  cudaError_t err = sm_count(&sms);
  if (err == cudaSuccess)
    err = per_device(cache, &per_sm, [](int, int* n) {
      const cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(n, kKernel, kThreads, 0);
      *n = *n < 1 ? 1 : (*n > kMaxBlocksPerSm ? kMaxBlocksPerSm : *n);
      return e;
    });
  if (err != cudaSuccess) return err;
  *blocks = static_cast<int64_t>(sms) * per_sm;
  return cudaSuccess;
}

// Upper bound on segment_sum's blocks, whichever kernel runs: both use at
// most one wave and at least 8 rows per block.
inline int64_t max_sum_blocks(int64_t rows, int sms) {
  return imax(1, imin(ceil_div(rows, 8), static_cast<int64_t>(sms) * kMaxBlocksPerSm));
}

// Workspace: which gated sum ran (an int, in 256 bytes), head/tail segment
// ids (int64) per block, then head/tail partial rows (accumulation type) per
// block.
constexpr int64_t kPickedBytes = 256;
inline int64_t sum_workspace_size(int64_t blocks, int64_t inner, int64_t acc_size) {
  return kPickedBytes + ceil_div(2 * blocks * 8, 256) * 256 + 2 * blocks * inner * acc_size;
}

// Carves the workspace for `blocks` blocks; only several blocks can have a
// segment cross between them.
template <typename Acc>
inline cudaError_t crossing(void* workspace, int64_t blocks, int64_t inner, Crossing<Acc>* c) {
  if (blocks <= 1) return cudaSuccess;
  if (workspace == nullptr) return cudaErrorInvalidValue;
  char* ws = static_cast<char*>(workspace) + kPickedBytes;
  c->head_key = reinterpret_cast<int64_t*>(ws);
  c->tail_key = c->head_key + blocks;
  c->head_val = reinterpret_cast<Acc*>(ws + ceil_div(2 * blocks * 8, 256) * 256);
  c->tail_val = c->head_val + blocks * inner;
  return cudaSuccess;
}

// Whether kKernel may launch before the kernel before it on the stream ends
// (allow_dependents): on sm_90 and later, with a runtime and a driver whose
// stream capture keeps such launches (12.3), and only where the code that
// runs is compiled for sm_90 or later, so that it waits (a build for
// 8.0+PTX runs sm_80 PTX there, without the wait).
template <auto kKernel>
inline cudaError_t early_launch(bool* yes) {
#if defined(__HIP_PLATFORM_AMD__) || CUDART_VERSION < 12030
  *yes = false;
  return cudaSuccess;
#else
  static std::atomic<int> cache[kMaxDevices];
  int answer = 0;  // 1: no, 2: yes
  const cudaError_t err = per_device(cache, &answer, [](int dev, int* v) {
    int major = 0, driver = 0;
    cudaFuncAttributes attributes = {};
    cudaError_t e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (e == cudaSuccess) e = cudaDriverGetVersion(&driver);
    if (e == cudaSuccess) e = cudaFuncGetAttributes(&attributes, kKernel);
    *v = major >= 9 && driver >= 12030 && attributes.ptxVersion >= 90 ? 2 : 1;
    return e;
  });
  *yes = answer == 2;
  return err;
#endif
}

// kKernel<<<grid, kThreads, 0, stream>>>(args...), launched early where it
// may be (early_launch); it waits for the kernels before it
// (wait_for_prerequisites) before it reads what they wrote.
template <auto kKernel, typename... Args>
cudaError_t launch_after(dim3 grid, cudaStream_t stream, Args... args) {
  bool early = false;
  cudaError_t err = early_launch<kKernel>(&early);
  if (err != cudaSuccess) return err;
#if !defined(__HIP_PLATFORM_AMD__) && CUDART_VERSION >= 12030
  if (early) {
    cudaLaunchConfig_t config = {};
    config.gridDim = grid;
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = 0;
    config.stream = stream;
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &attribute;
    config.numAttrs = 1;
    err = cudaLaunchKernelEx(&config, kKernel, args...);
    // The launch's error, and none left behind for a later check to report,
    // as after the launch below.
    const cudaError_t last = cudaGetLastError();
    return err != cudaSuccess ? err : last;
  }
#endif
  kKernel<<<grid, kThreads, 0, stream>>>(args...);
  return cudaGetLastError();
}

template <typename T>
inline cudaError_t launch_fixup(T* out, int64_t rows, int64_t segments, int64_t inner,
                                int64_t block_rows, int64_t blocks,
                                const Crossing<typename Num<T>::acc>& c, cudaStream_t stream,
                                int64_t tile_blocks = 0) {
  // A tail has a head or two to add unless a mean segment spans two blocks or
  // more: a y block per kThreads columns adds them in one pass, and more would
  // be blocks that mostly find nothing to add, and take waves of them. Where
  // segments span more, two y blocks per block spanned, of kFixupCols columns at
  // least, share their heads. (block_rows: the mean.)
  // Measurements: docs/kernel-notes.md, "launch_fixup".
  const int64_t spans = rows / segments / block_rows;
  const int64_t passes = ceil_div(inner, kThreads);
  const int64_t wanted =
      spans >= 2 ? imax(passes, imin(ceil_div(inner, kFixupCols), 2 * spans)) : passes;
  const int64_t fixup_y = imin(imin(wanted, kMaxGridY), imax(1, kFixupBlocks / blocks));
  // x: exactly the blocks the workspace was carved for (launch_gated_sum
  // carves for the larger count): the fix-up reads partials up to gridDim.x.
  const dim3 grid(static_cast<unsigned>(imax(blocks, tile_blocks)),
                  static_cast<unsigned>(fixup_y));
  if (c.picked != nullptr)
    return launch_after<&segment_sum_fixup_kernel<T, true>>(grid, stream, out, segments, inner,
                                                            blocks, c, tile_blocks);
  return launch_after<&segment_sum_fixup_kernel<T, false>>(grid, stream, out, segments, inner,
                                                           blocks, c, int64_t{0});
}

// Tile kernels: blocks of about equal rows, a multiple of 8 rows each (tiles
// then start on 16 bytes), for at most `capacity` blocks. (The sums share
// rows by cost on the device: balanced_rows.)
struct TileSplit {
  int64_t rows_per_block;
  int64_t blocks;
};

inline TileSplit tile_split(int64_t rows, int64_t capacity, int64_t tile_rows) {
  const int64_t min_rows = imax(8, tile_rows / 4);  // tiny inputs: fewer, fuller blocks
  const int64_t blocks = imax(1, imin(capacity, ceil_div(rows, min_rows)));
  const int64_t rows_per_block = ceil_div(ceil_div(rows, blocks), 8) * 8;
  return {rows_per_block, ceil_div(rows, rows_per_block)};
}

// How the tile and lane sums weigh rows against segments (balanced_rows).
template <typename T, int W, int64_t kSegment>
constexpr Costs kSplitCosts{W * static_cast<int64_t>(sizeof(T)),
                            kSegment + W * static_cast<int64_t>(sizeof(T))};

// The tile and lane sums: row ranges of equal cost over the blocks of kKernel
// that fit on the GPU at once, and the fix-up for the segments that cross
// between them. The kernels take different arguments, so `launch(blocks,
// crossing)` enqueues kKernel, by name as every launch here is written (the
// form hipify turns into hipLaunchKernelGGL).
template <auto kKernel, typename T, int W, typename Launch>
cudaError_t launch_split_sum(const int64_t* indptr, T* out, int64_t rows, int64_t segments,
                             int64_t tile_rows, void* workspace, cudaStream_t stream,
                             const Launch& launch) {
  int64_t capacity = 0;
  cudaError_t err = resident_blocks<kKernel>(&capacity);
  if (err != cudaSuccess) return err;
  const TileSplit split = tile_split(rows, capacity, tile_rows);
  Crossing<typename Num<T>::acc> c;
  err = crossing(workspace, split.blocks, W, &c);
  if (err != cudaSuccess) return err;
  launch(static_cast<unsigned>(split.blocks), c);
  err = cudaGetLastError();
  if (err != cudaSuccess || split.blocks == 1) return err;
  return launch_fixup<T>(out, rows, segments, W, split.rows_per_block, split.blocks, c, stream);
}

template <typename T, int W, bool kShort>
cudaError_t launch_tile_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                            int64_t segments, void* workspace, cudaStream_t stream) {
  return launch_split_sum<&tile_sum_kernel<T, W, kShort>, T, W>(
      indptr, out, rows, segments, Geometry<T, W>::kTileRows, workspace, stream,
      [&](unsigned blocks, const Crossing<typename Num<T>::acc>& c) {
        tile_sum_kernel<T, W, kShort><<<blocks, kThreads, 0, stream>>>(
            src, indptr, out, rows, segments, W,
            kSplitCosts<T, W, kTileSegmentCost<T, W, kShort>>, c,
            TailGate::kAny);
      });
}

template <typename T, int W>
cudaError_t launch_lane_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                            int64_t segments, void* workspace, cudaStream_t stream) {
  return launch_split_sum<&lane_sum_kernel<T, W>, T, W>(
      indptr, out, rows, segments, kThreads * 8, workspace, stream,
      [&](unsigned blocks, const Crossing<typename Num<T>::acc>& c) {
        lane_sum_kernel<T, W><<<blocks, kThreads, 0, stream>>>(
            src, indptr, out, rows, segments, kSplitCosts<T, W, kLaneSegmentCost<T, W>>, c,
            TailGate::kAny);
      });
}

// The lane and the tile sum behind their gates, and one fix-up for whichever
// ran: both carve the workspace for the larger of their block counts. The
// lane sum goes first: it samples indptr and records the pick there, for the
// tile sum after it and for the fix-up (gated_out).
template <typename T, int W>
cudaError_t launch_gated_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                             int64_t segments, void* workspace, cudaStream_t stream) {
  using Acc = typename Num<T>::acc;
  int64_t lane_capacity = 0, tile_capacity = 0;
  cudaError_t err = resident_blocks<&lane_sum_kernel<T, W>>(&lane_capacity);
  if (err != cudaSuccess) return err;
  err = resident_blocks<&tile_sum_kernel<T, W, true>>(&tile_capacity);
  if (err != cudaSuccess) return err;
  const TileSplit lane = tile_split(rows, lane_capacity, kThreads * 8);
  const TileSplit tile = tile_split(rows, tile_capacity, Geometry<T, W>::kTileRows);
  const int64_t blocks = imax(lane.blocks, tile.blocks);
  Crossing<Acc> c;
  err = crossing(workspace, blocks, W, &c);
  if (err != cudaSuccess) return err;
  if (blocks > 1) c.picked = static_cast<int*>(workspace);
  lane_sum_kernel<T, W><<<static_cast<unsigned>(lane.blocks), kThreads, 0, stream>>>(
      src, indptr, out, rows, segments, kSplitCosts<T, W, kLaneSegmentCost<T, W>>, c,
      TailGate::kShortTail);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  err = launch_after<&tile_sum_kernel<T, W, true>>(
      dim3(static_cast<unsigned>(tile.blocks)), stream, src, indptr, out, rows, segments,
      int64_t{W}, kSplitCosts<T, W, kTileSegmentCost<T, W, true>>, c, TailGate::kLongTail);
  if (err != cudaSuccess || blocks == 1) return err;
  return launch_fixup<T>(out, rows, segments, W, lane.rows_per_block, lane.blocks, c, stream,
                         tile.blocks);
}

template <typename T, int W>
cudaError_t launch_tile_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                               int64_t segments, cudaStream_t stream) {
  int64_t capacity = 0;
  const cudaError_t err = resident_blocks<&tile_gather_kernel<T, W>>(&capacity);
  if (err != cudaSuccess) return err;
  const TileSplit split =
      tile_split(rows, capacity * kTileGatherWaves, Geometry<T, W>::kTileRows);
  tile_gather_kernel<T, W><<<static_cast<unsigned>(split.blocks), kThreads, 0, stream>>>(
      src, indptr, out, rows, segments, split.rows_per_block);
  return cudaGetLastError();
}

// Stream kernels: threads per group (lanes), groups per block, column slabs.
template <int W>
struct StreamShape {
  int64_t packs, lanes, groups, slabs, grid_y;
  explicit StreamShape(int64_t inner)
      : packs(inner / W),
        lanes(imin(kThreads, packs)),
        groups(kThreads / lanes),
        slabs(ceil_div(packs, kThreads)),
        grid_y(imin(slabs, kMaxGridY)) {}
};

// Rows per unit (a sum group, or a gather team) for equal contiguous ranges
// over `units` units, a multiple of `step` rows.
inline int64_t unit_rows(int64_t rows, int64_t units, int64_t min_rows, int64_t step) {
  return ceil_div(imax(min_rows, ceil_div(rows, units)), step) * step;
}

template <typename T, int W, StreamRows kShape = StreamRows::kNarrow, int64_t kInner = 0,
          bool kIntRows = false>
cudaError_t launch_stream_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                              int64_t segments, int64_t inner, void* workspace,
                              cudaStream_t stream) {
  using Acc = typename Num<T>::acc;
  const StreamShape<W> shape(inner);
  // 2-byte types read ahead only in rows of kWideHalfLanes packs or more
  // (kWide); single elements and pairs of them keep the loop without
  // read-ahead (kNarrow, or kDeep below; pairs: see segment_sum). 4- and 8-byte
  // types always read ahead, fp32 single elements (odd widths, unaligned rows)
  // twice as far on kDeep devices.
  if constexpr (sizeof(T) == 2 && W > 2 && kShape == StreamRows::kNarrow) {
    if (shape.lanes >= kWideHalfLanes)
      return launch_stream_sum<T, W, StreamRows::kWide, kInner>(src, indptr, out, rows,
                                                                segments, inner, workspace,
                                                                stream);
  }
  if constexpr (W * sizeof(T) <= 4 && kShape == StreamRows::kNarrow) {
    bool deep = false;
    const cudaError_t err = deep_memory(&deep);
    if (err != cudaSuccess) return err;
    if (deep)
      return launch_stream_sum<T, W, StreamRows::kDeep, kInner>(src, indptr, out, rows,
                                                                segments, inner, workspace,
                                                                stream);
  }
  if constexpr (kIntRowsOf<T, W, kShape> && !kIntRows) {
    if (rows <= kIntRowsMax && segments <= kIntRowsMax)
      return launch_stream_sum<T, W, kShape, kInner, true>(src, indptr, out, rows, segments,
                                                           inner, workspace, stream);
  }
  int64_t capacity = 0;
  cudaError_t err =
      resident_blocks<&stream_sum_kernel<T, W, kShape, kInner, kIntRows>>(&capacity);
  if (err != cudaSuccess) return err;
  const int64_t units = imax(1, capacity / shape.grid_y) * shape.groups;
  // Rows that read ahead end each group with a partial batch if need be, in
  // groups of a multiple of kBatch rows (as measured); the others sum whole
  // batches of kRows, so only the input's last group sums rows one by one.
  using Batch = StreamSumRows<T, kShape>;
  const int64_t group_rows =
      unit_rows(rows, units, kMinGroupRows, Batch::kReadAhead ? kBatch : Batch::kRows);
  const int64_t block_rows = group_rows * shape.groups;
  const int64_t blocks = ceil_div(rows, block_rows);
  Crossing<Acc> c;
  err = crossing(workspace, blocks, inner, &c);
  if (err != cudaSuccess) return err;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(shape.grid_y));
  stream_sum_kernel<T, W, kShape, kInner, kIntRows><<<grid, kThreads, 0, stream>>>(
      src, indptr, out, rows, segments, inner, group_rows, shape.slabs, c);
  err = cudaGetLastError();
  if (err != cudaSuccess || blocks == 1) return err;
  return launch_fixup<T>(out, rows, segments, inner, block_rows, blocks, c, stream);
}

template <typename T, int kCols, int U>
cudaError_t launch_team_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                            int64_t segments, void* workspace, cudaStream_t stream,
                            bool short_segments = false) {
  using Acc = typename Num<T>::acc;
  using Shape = TeamShape<T, kCols, U>;
  // The kernel that runs, its batch, and one wave of it: the two differ in
  // blocks per SM.
  decltype(&team_sum_kernel<T, kCols, U, false>) kernel = nullptr;
  int batch = 0;
  int64_t capacity = 0;
  auto pick = [&](auto short_kernel) {
    constexpr bool kShort = decltype(short_kernel)::value;
    kernel = &team_sum_kernel<T, kCols, U, kShort>;
    batch = kTeamSumBatch<kShort>;
    return resident_blocks<&team_sum_kernel<T, kCols, U, kShort>>(&capacity);
  };
  cudaError_t err = cudaSuccess;
  if constexpr (U == 8) {  // rows of 128 bytes: the only ones with short segments here
    // rows <= kShortTeamMaxRows is short_team_rows' test again, kept here
    // because the kernel's 32-bit rows depend on it whatever the caller.
    err = short_segments && rows <= kShortTeamMaxRows ? pick(std::true_type{})
                                                      : pick(std::false_type{});
  } else if (short_segments) {
    return cudaErrorInvalidValue;  // not reached: see segment_sum
  } else {
    err = pick(std::false_type{});
  }
  if (err != cudaSuccess) return err;
  const int64_t team_rows =
      unit_rows(rows, capacity * kTeams, batch * Shape::kStepRows, Shape::kStepRows);
  const int64_t block_rows = team_rows * kTeams;
  const int64_t blocks = ceil_div(rows, block_rows);
  Crossing<Acc> c;
  err = crossing(workspace, blocks, Shape::kInner, &c);
  if (err != cudaSuccess) return err;
  kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(src, indptr, out, rows,
                                                                  segments, team_rows, c);
  err = cudaGetLastError();
  if (err != cudaSuccess || blocks == 1) return err;
  return launch_fixup<T>(out, rows, segments, Shape::kInner, block_rows, blocks, c,
                         stream);
}

// launch(std::integral_constant<int, U>()) for rows of U 16-byte units, U a
// power of two from 2 to kTeam / 2 (the caller checks).
template <typename T, int U = 2, typename Launch>
cudaError_t with_row_units(int64_t inner, Launch&& launch) {
  if constexpr (U > kTeam / 2) {
    return cudaErrorInvalidValue;  // not reached
  } else {
    if (inner != U * (16 / static_cast<int64_t>(sizeof(T))))
      return with_row_units<T, 2 * U>(inner, launch);
    return launch(std::integral_constant<int, U>());
  }
}

template <typename T, int kCols, int U>
cudaError_t launch_team_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                               int64_t segments, cudaStream_t stream) {
  using Shape = TeamShape<T, kCols, U>;
  int64_t capacity = 0;
  const cudaError_t err = resident_blocks<&team_gather_kernel<T, kCols, U>>(&capacity);
  if (err != cudaSuccess) return err;
  const int64_t team_rows =
      unit_rows(rows, capacity * kTeamGatherWaves * kTeams, kBatch * Shape::kStepRows,
                Shape::kStepRows);
  const int64_t blocks = ceil_div(rows, team_rows * kTeams);
  team_gather_kernel<T, kCols, U><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      src, indptr, out, rows, segments, team_rows);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_label_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                                int64_t segments, int64_t inner, cudaStream_t stream) {
  int64_t capacity = 0;
  const cudaError_t err = resident_blocks<&label_gather_kernel<T>>(&capacity);
  if (err != cudaSuccess) return err;
  const int64_t waves =
      narrow_label_rows(inner, sizeof(T)) ? kNarrowLabelGatherWaves : kLabelGatherWaves;
  const TileSplit split = tile_split(rows, capacity * waves, kThreads);
  label_gather_kernel<T><<<static_cast<unsigned>(split.blocks), kThreads, 0, stream>>>(
      src, indptr, out, rows, segments, inner, split.rows_per_block);
  return cudaGetLastError();
}

template <typename T, int W>
cudaError_t launch_stream_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                                 int64_t segments, int64_t inner, cudaStream_t stream) {
  int64_t capacity = 0;
  const cudaError_t err = resident_blocks<&stream_gather_kernel<T, W>>(&capacity);
  if (err != cudaSuccess) return err;
  const StreamShape<W> shape(inner);
  const int64_t team = shape.lanes >= kTeam ? shape.lanes : kTeam / shape.lanes * shape.lanes;
  const int64_t teams = kThreads / team, groups = team / shape.lanes;
  const int64_t units = imax(1, capacity * kStreamGatherWaves / shape.grid_y) * teams;
  const int64_t team_rows = unit_rows(rows, units, kMinGroupRows * groups, groups);
  const int64_t blocks = ceil_div(rows, team_rows * teams);
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(shape.grid_y));
  stream_gather_kernel<T, W><<<grid, kThreads, 0, stream>>>(src, indptr, out, rows, segments,
                                                             inner, team_rows, shape.slabs);
  return cudaGetLastError();
}

inline bool aligned(const void* p, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(bytes) == 0;
}

// Rows of at most 16 bytes with a power-of-two width, as a compile-time
// constant W: the tile kernels.
template <typename T, int W = 1>
cudaError_t launch_narrow_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                              int64_t segments, int64_t inner, void* workspace,
                              cudaStream_t stream) {
  if constexpr (W * sizeof(T) > 16) {
    return cudaErrorInvalidValue;  // not reached: the caller checks the width
  } else {
    if (inner == W) {
      const int64_t mean_rows = rows / segments;
      if (mean_rows >= TeamShape<T, W, 1>::kStepRows)  // the gather waits for two steps
        return launch_team_sum<T, W, 1>(src, indptr, out, rows, segments, workspace, stream);
      // Mean segments under 64 rows (under 32 on 16-byte rows: the team sum
      // above takes them from there): on rows of up to 4 bytes from
      // kGateMinBytes, the lane or the tile sum, as a sample of indptr decides
      // (TailGate); otherwise the lane sum on rows of 4 to 16 bytes of fp32 or 8
      // to 16 bytes of a 2-byte type, the tile sum on narrower ones. On those
      // wider rows the lane sum beat the tile sum on both laws, so no gate
      // there; nor does the team sum take these means where long segments lie in
      // runs (it ran them at 3 to 15 % of copy bandwidth).
      // Measurements: docs/kernel-notes.md, "launch_narrow_sum".
      if (mean_rows < kShortSegmentRows) {
        if constexpr (W * sizeof(T) <= 4) {
          if (rows * W * static_cast<int64_t>(sizeof(T)) >= kGateMinBytes)
            return launch_gated_sum<T, W>(src, indptr, out, rows, segments, workspace, stream);
        }
        if constexpr (sizeof(T) >= 4 || W >= 4)
          return launch_lane_sum<T, W>(src, indptr, out, rows, segments, workspace, stream);
        else
          return launch_tile_sum<T, W, true>(src, indptr, out, rows, segments, workspace, stream);
      }
      // Only rows under 8 bytes get here: from 8 bytes on, the team sum's step
      // (512 / row bytes rows) is at most kShortSegmentRows, so the team sum
      // above took every mean this far down. Left uninstantiated there, the
      // tile sum's register-spilling variants for long segments of 8- and
      // 16-byte rows stay out of the library.
      if constexpr (TeamShape<T, W, 1>::kStepRows > kShortSegmentRows)
        return launch_tile_sum<T, W, false>(src, indptr, out, rows, segments, workspace, stream);
      else
        return launch_team_sum<T, W, 1>(src, indptr, out, rows, segments, workspace, stream);
    }
    return launch_narrow_sum<T, 2 * W>(src, indptr, out, rows, segments, inner, workspace, stream);
  }
}

// Fill gather (rows of 16 bytes, segments shorter than two team steps on
// average): each row is one uint4, whatever its type. A block owns an equal
// range of rows, as in the tile gather, and builds its output a tile of
// kFillTileRows rows at a time in shared memory. In rounds of kThreads segments
// (those open in the tile), each thread writes its segment's value into the
// segment's rows of the tile; the few segments with more than kFillRows rows
// there are filled by the whole block after the round. The tile then goes out as
// a copy would write it. It beat the tile gather on rows of 16 bytes, and lost
// on narrower ones.
// The blocks find their first segment with warp_lower_bound, kFillSearchProbes
// probes a round: they hold one tile each (16 waves), so they search 4 times as
// often as the tile gather's, and every probe is a request to L2, where
// block_lower_bound's 256 probes and a barrier a round were slower; 16 and 8
// probes lost.
// Measurements: docs/kernel-notes.md, "fill_gather_kernel, kFillSearchProbes".
constexpr int kFillSearchProbes = 128;

constexpr int kFillTileRows = 1024;  // 16 KB of shared memory
constexpr int kFillRows = 32;        // the longest segment one thread fills alone
constexpr int kFillBlocksPerSm = 8;  // <= 32 registers; at 4 (64), power law 83.0 -> 77.8 %
constexpr int kFillAheadMargin = 32; // values read early past 1.25 x the last tile's starts
                                     // (the factor and the margin: the only ones timed)

template <typename Row>
struct FillGatherShared {
  // Segments with more than kFillRows rows in a tile: fewer than this many.
  static constexpr int kLongs = kFillTileRows / (kFillRows + 1) + 1;
  Row tile[kFillTileRows];
  int nlong;
  int long_lo[kLongs], long_hi[kLongs];
  Row long_value[kLongs];
};

// Rows [lo, hi) of a fill tile set to v by one thread, in the order of their
// bank group, not of the rows: at step k (0 to 7) it stores the run's rows t and
// t + 8, t = (tid - lo + k) mod 8, both in group r = tid + k (mod 8). A 16-byte
// store of a warp runs as quarter warps of 8 lanes over the 8 groups of 16 bytes
// of shared memory banks (rows r mod 8 of the tile), so the 8 lanes of a
// quarter, each at its own r mod 8, never share a group, where rows lo + k did
// (the short segments' starts fall at any r mod 8).
// Rows 16 on of a run (more than 16 rows: about 1 run in 40 on the power law,
// and the long ones of an unsorted indptr that do not fit the long slots) keep
// the row order.
// Measurements: docs/kernel-notes.md, "fill_run".
template <typename Row>
__device__ __forceinline__ void fill_run(Row* tile, int lo, int hi, const Row& v, int tid) {
  Row* const run = tile + lo;
  const int len = hi - lo;
#pragma unroll
  for (int k = 0; k < 8; ++k) {  // rows 0-15 of the run: t and t + 8 at step k
    const int t = (tid - lo + k) & 7;  // run[t]: in group (tid + k) % 8
    if (t < len) run[t] = v;
    if (t + 8 < len) run[t + 8] = v;
  }
  for (int r = lo + 16; r < hi; ++r) tile[r] = v;  // (power law: about 1 run in 40)
}

// Grid: x = equal row ranges, kFillGatherWaves times as many as fit on the
// GPU at once. Rows of exactly 16 bytes: a block takes tiles of kFillTileRows
// rows; a thread per segment writes its value into the segment's rows of a
// shared tile (segments longer than kFillRows are filled by the whole block),
// and the block stores the tile as a copy would.
template <typename Row>
__global__ void __launch_bounds__(kThreads, kFillBlocksPerSm)
    fill_gather_kernel(const Row* __restrict__ src, const int64_t* __restrict__ indptr,
                       Row* __restrict__ out, int64_t rows, int64_t segments,
                       int64_t rows_per_block) {
  using Shared = FillGatherShared<Row>;
  __shared__ Shared sm;
  const int tid = threadIdx.x;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t r1 = imin(rows, r0 + rows_per_block);
  if (tid == 0) sm.nlong = 0;
  int64_t first = warp_lower_bound<kFillSearchProbes>(indptr, segments, rows, r0);  // (a barrier)
  // Threads that read their segment's value with its start, in the same wait on
  // memory, not once the start puts the segment in the tile: the first round's,
  // then about 1.25 times the last tile's starts and a margin
  // (kFillAheadMargin). The others (segments not expected in the tile) read it
  // after the start, as all did before. Every thread reading its value and end
  // ahead lost a point. The wait saved is one of a tile's two on memory.
  // Measurements: docs/kernel-notes.md, "fill_gather_kernel, kFillSearchProbes".
  int ahead = kThreads;
  for (int64_t t0 = r0; t0 < r1; t0 += kFillTileRows) {
    const int64_t t1 = imin(r1, t0 + kFillTileRows);
    const int nrows = static_cast<int>(t1 - t0);
    // A row of indptr clamped into the tile [t0, t1], as an offset from t0:
    // what start_of's clamp into [0, rows] then the clamp into the tile gave
    // ([t0, t1] lies in [0, rows]), so an unsorted indptr stays in bounds (u
    // is v - t0 wherever it is used: v > t0 >= 0, no overflow). In 32 bits,
    // it keeps the value read ahead within the 32 registers of 8 blocks per
    // SM: with 64-bit clamps, sm_90 took 32 registers and spilled 16 bytes
    // (30 registers, no spills, this way; 32 and no spills with fill_run).
    auto tile_row = [&](int64_t v) -> int {
      const uint64_t u = static_cast<uint64_t>(v) - static_cast<uint64_t>(t0);
      return v <= t0 ? 0 : static_cast<int>(u < static_cast<uint32_t>(nrows) ? u : nrows);
    };
    // Segment s in [-1, segments] holds rows [start, end) (-1: those before
    // indptr[0], `segments`: those from indptr[segments] on, both zeros).
    // Round 0 starts with first - 1, the segment open at t0.
    int filled = 0;  // long ones
    int tile_starts = 0;
    for (int64_t s0 = first - 1;; s0 += kThreads) {
      const int64_t s = s0 + tid;
      bool in = false;
      int lo = 0, hi = 0;
      Row value{};
      if (s <= segments) {
        const bool early = tid < ahead;
        const bool real = s >= 0 && s < segments;
        // (The value's load first: with fill_run's stores below, sm_90 put
        // the start and the value in the same registers when the start came
        // first, and waited on the start before it issued the value.)
        if (early && real) value = src[s];
        const int64_t start = s < 0 ? 0 : indptr[s];
        lo = s < 0 ? 0 : tile_row(start);
        in = s < first || lo < nrows;  // lo < nrows: the start is under t1
        if (in) {
          if (!early && real) value = src[s];
          // (indptr[s + 1]: the next thread's start, usually in a line already read)
          hi = s < segments ? tile_row(indptr[s + 1]) : nrows;  // (end_of: kNever)
          hi = hi > lo ? hi : lo;
        }
      }
      int slot = -1;
      if (in && hi - lo > kFillRows) slot = atomicAdd(&sm.nlong, 1);
      if (slot >= 0 && slot < Shared::kLongs) {
        sm.long_lo[slot] = lo;
        sm.long_hi[slot] = hi;
        sm.long_value[slot] = value;
      } else if (in) {  // (only an unsorted indptr has more long ones than fit)
        fill_run(sm.tile, lo, hi, value, tid);
      }
      const int starts = __syncthreads_count(in && s >= first);
      const int nlong = min(sm.nlong, Shared::kLongs);
      for (int j = filled; j < nlong; ++j) {
        const int lo_j = sm.long_lo[j], hi_j = sm.long_hi[j];  // not re-read after each store
        const Row v = sm.long_value[j];
        for (int r = lo_j + tid; r < hi_j; r += kThreads) sm.tile[r] = v;
      }
      filled = nlong;
      __syncthreads();  // the long ones are filled
      // The segments of this round that start in the tile came first; when
      // some did not, the tile's starts are all counted.
      const int tried =
          static_cast<int>(imax(0, imin(s0 + kThreads, segments + 1) - imax(s0, first)));
      first += starts;
      tile_starts = min(tile_starts + starts, kThreads);  // (no more needed)
      ahead = kThreads;  // a tile's next round: all of them
      if (starts < tried || s0 + kThreads > segments) break;
    }
    ahead = min(kThreads, tile_starts + (tile_starts >> 2) + kFillAheadMargin);
    if (tid == 0) sm.nlong = 0;  // (read by every thread before the barrier above)
#pragma unroll 1
    for (int r = tid; r < nrows; r += kThreads) out[t0 + r] = sm.tile[r];
    __syncthreads();  // the tile is read
  }
}

template <typename T>
cudaError_t launch_fill_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                               int64_t segments, cudaStream_t stream) {
  int64_t capacity = 0;
  const cudaError_t err = resident_blocks<&fill_gather_kernel<uint4>>(&capacity);
  if (err != cudaSuccess) return err;
  const TileSplit split = tile_split(rows, capacity * kFillGatherWaves, kFillTileRows);
  fill_gather_kernel<uint4><<<static_cast<unsigned>(split.blocks), kThreads, 0, stream>>>(
      reinterpret_cast<const uint4*>(src), indptr, reinterpret_cast<uint4*>(out), rows, segments,
      split.rows_per_block);
  return cudaGetLastError();
}

// A narrow gather goes to the team kernel when its segments are long: two steps
// of 512 bytes then meet less than one segment start on average, and the team
// writes a copy's traffic; with shorter segments the tile kernel's shared labels
// (on rows of 16 bytes, the fill kernel's shared tile) cost less than the team
// seeking start after start (the threshold at two steps, not one).
// Measurements: docs/kernel-notes.md, "launch_narrow_gather".
template <typename T, int W = 1>
cudaError_t launch_narrow_gather(const T* src, const int64_t* indptr, T* out, int64_t rows,
                                 int64_t segments, int64_t inner, cudaStream_t stream) {
  if constexpr (W * sizeof(T) > 16) {
    return cudaErrorInvalidValue;  // not reached: the caller checks the width
  } else {
    if (inner != W)
      return launch_narrow_gather<T, 2 * W>(src, indptr, out, rows, segments, inner, stream);
    if (rows / segments < 2 * TeamShape<T, W, 1>::kStepRows) {
      // Narrower rows lost badly through the fill kernel: it pays per segment (a
      // thread each, a barrier per kThreads of them), and narrow rows hold more
      // segments per byte.
      // Measurements: docs/kernel-notes.md, "launch_narrow_gather".
      if constexpr (W * sizeof(T) == 16)
        return launch_fill_gather<T>(src, indptr, out, rows, segments, stream);
      else if (!kTileGatherLow<T, W> || low_words_exact(rows))
        return launch_tile_gather<T, W>(src, indptr, out, rows, segments, stream);
    }
    return launch_team_gather<T, W, 1>(src, indptr, out, rows, segments, stream);
  }
}

// The label gather counts a tile's 16-byte units in int.
inline bool label_tile_fits(int64_t row_units) {
  return row_units <= (INT_MAX - kBatch * kThreads) / kLabelTileRows;
}

inline bool narrow_rows(int64_t inner, int64_t elem_size) {
  return inner * elem_size <= 16 && (inner & (inner - 1)) == 0;
}

// Rows of 2 to kTeam / 2 16-byte units, a power of two: what the team kernels
// take. Wider rows stream: with one row per step (a slice of one lane) the team
// sum was slower than the stream sum (H100, bf16, 256 columns: 76-78% of copy
// bandwidth against 82-83%).
inline bool unit_rows_of_team(int64_t inner, int64_t elem_size) {
  const int64_t units = inner * elem_size / 16;
  return inner * elem_size % 16 == 0 && units >= 2 && units <= kTeam / 2 &&
         (units & (units - 1)) == 0;
}

// Short segments (a mean under kTeam rows) stream, except in rows of 128 bytes,
// from a mean of kShortTeamMinRows rows and kGateMinBytes: those take the team
// sum split by cost (kTeamSegmentCost says why). Smaller inputs and shorter
// means, not measured there, keep the stream sum. Other widths lost in the team
// sum.
// Measurements: docs/kernel-notes.md, "kShortTeamMinRows".
constexpr int64_t kShortTeamMinRows = 4;
inline bool short_team_rows(int64_t rows, int64_t inner, int64_t elem_size) {
  return inner * elem_size == 128 && rows * inner * elem_size >= kGateMinBytes &&
         rows <= kShortTeamMaxRows;
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
  const int64_t blocks = detail::max_sum_blocks(rows, sms);
  if (blocks <= 1) return 0;
  return detail::sum_workspace_size(blocks, inner, elem_size == 8 ? 8 : 4);
}

// out[segments, inner] = per-segment sums of src[rows, inner] (contiguous,
// row-major). Enqueues up to three kernels on `stream` (two sums gated by a
// sample of indptr and their shared fix-up, on rows of up to 4 bytes; one
// memset when rows == 0) and returns the launch error.
template <typename T>
cudaError_t segment_sum(const T* src, const int64_t* indptr, T* out, int64_t rows,
                        int64_t segments, int64_t inner, void* workspace, cudaStream_t stream) {
  static_assert(detail::kSupported<T>, "segment_sum: float, double, __half or __nv_bfloat16");
  if (rows < 0 || segments < 0 || inner < 0) return cudaErrorInvalidValue;
  if (segments == 0 || inner == 0) return cudaSuccess;
  if (rows == 0)
    return cudaMemsetAsync(out, 0, static_cast<size_t>(segments * inner) * sizeof(T), stream);
  if (detail::narrow_rows(inner, sizeof(T)) && detail::aligned(src, 16) &&
      detail::aligned(out, inner * sizeof(T)))
    return detail::launch_narrow_sum<T>(src, indptr, out, rows, segments, inner, workspace, stream);
  if (detail::unit_rows_of_team(inner, sizeof(T)) && detail::aligned(src, 16) &&
      detail::aligned(out, 16)) {
    const int64_t mean_rows = rows / segments;
    const bool short_segments = detail::short_team_rows(rows, inner, sizeof(T)) &&
                                mean_rows >= detail::kShortTeamMinRows &&
                                mean_rows < detail::kTeam;
    if (mean_rows >= detail::kTeam || short_segments)
      return detail::with_row_units<T>(inner, [&](auto units) {
        return detail::launch_team_sum<T, 16 / sizeof(T), decltype(units)::value>(
            src, indptr, out, rows, segments, workspace, stream, short_segments);
      });
  }
  // The sum loads 8 bytes per thread and row: more accumulators per thread would
  // cost the registers that keep blocks resident and loads in flight (16-byte
  // loads were slower). Rows of kPairRowBytes of a 2-byte type load 4 bytes, a
  // pair, per thread and row: twice the threads per row, so half the groups per
  // warp and fewer of a warp's lanes idle while one group closes a segment. They
  // keep the loop without read-ahead (launch_stream_sum sends 2-byte types to
  // the read-ahead only in packs of more than 4 bytes, though pairs make as many
  // lanes as kWideHalfLanes; on devices deep_memory picks, that loop holds 16
  // rows): with the read-ahead they lost. Pairs in other widths lost on the
  // power law or gained nothing.
  // Measurements: docs/kernel-notes.md, "segment_sum: pairs".
  if constexpr (sizeof(T) == 2) {
    if (inner * static_cast<int64_t>(sizeof(T)) == detail::kPairRowBytes &&
        rows <= detail::kPairMaxRows && detail::aligned(src, 4) && detail::aligned(out, 4))
      return detail::launch_stream_sum<T, 2, detail::StreamRows::kNarrow,
                                       detail::kPairRowBytes / sizeof(T)>(
          src, indptr, out, rows, segments, inner, workspace, stream);
  }
  constexpr int kSumVec = 8 / sizeof(T);
  if (inner % kSumVec == 0 && detail::aligned(src, 8) && detail::aligned(out, 8))
    return detail::launch_stream_sum<T, kSumVec>(src, indptr, out, rows, segments, inner,
                                                 workspace, stream);
  return detail::launch_stream_sum<T, 1>(src, indptr, out, rows, segments, inner, workspace,
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
  constexpr int kVec = 16 / sizeof(T);
  if (detail::narrow_rows(inner, sizeof(T)) && detail::aligned(out, 16) &&
      detail::aligned(src, inner * sizeof(T)))
    return detail::launch_narrow_gather<T>(src, indptr, out, rows, segments, inner, stream);
  if (inner % kVec == 0 && detail::aligned(src, 16) && detail::aligned(out, 16)) {
    // The label gather's cost is per tile, not per segment: it takes every
    // length but the long segments of rows the team gather fits (it beat the
    // stream gather on every length measured).
    // Measurements: docs/kernel-notes.md, "segment_gather: the label gather".
    const bool team = detail::unit_rows_of_team(inner, sizeof(T));
    if ((!team || rows / segments < detail::kLabelGatherRows) &&
        detail::label_tile_fits(inner / kVec))
      return detail::launch_label_gather<T>(src, indptr, out, rows, segments, inner, stream);
    if (team)
      return detail::with_row_units<T>(inner, [&](auto units) {
        return detail::launch_team_gather<T, kVec, decltype(units)::value>(src, indptr, out, rows,
                                                                           segments, stream);
      });
    return detail::launch_stream_gather<T, kVec>(src, indptr, out, rows, segments, inner,
                                                 stream);
  }
  return detail::launch_stream_gather<T, 1>(src, indptr, out, rows, segments, inner, stream);
}

}  // namespace segment_ops::cuda
