// CPU kernels shared by the classic (TORCH_LIBRARY) and the stable-ABI builds.
// Raw pointers in, no torch types: each binding layer checks its tensors, then
// hands these its own parallel_for (at::parallel_for or torch::stable's).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace segment_ops::cpu {

// float16/bfloat16 accumulate in float; float and double in themselves.
template <typename T>
using acc_t = std::conditional_t<std::is_floating_point_v<T>, T, float>;

// What the value checks need: CPU indptr is read in place, one pass.
struct IndptrFacts {
  int64_t first;
  int64_t last;
  bool decreasing;
};

inline IndptrFacts indptr_facts(const int64_t* indptr, int64_t n) {
  bool decreasing = false;
  for (int64_t i = 1; i < n; ++i) decreasing |= indptr[i] < indptr[i - 1];
  return {indptr[0], indptr[n - 1], decreasing};
}

// Segments differ in length, so hand parallel_for chunks of about as many
// elements as ATen's own kernels do (32768) rather than a fixed segment count.
inline int64_t grain(int64_t segments, int64_t elements) {
  constexpr int64_t kGrainElements = 32768;
  const int64_t per_segment = std::max<int64_t>(1, elements / std::max<int64_t>(1, segments));
  return std::max<int64_t>(1, kGrainElements / per_segment);
}

// out[s] = sum of rows indptr[s] .. indptr[s+1] of `in` ([rows, inner], row-major).
// indptr must already be checked: starts at 0, non-decreasing, ends at rows.
template <typename T, typename ParallelFor>
void segment_sum(const T* in, const int64_t* indptr, T* out, int64_t segments, int64_t inner,
                 const ParallelFor& parallel_for) {
  using acc = acc_t<T>;
  const int64_t elements = indptr[segments] * inner;
  parallel_for(0, segments, grain(segments, elements), [&](int64_t begin, int64_t end) {
    std::vector<acc> sums(static_cast<size_t>(inner));
    for (int64_t s = begin; s < end; ++s) {
      if (inner == 1) {  // 1-D src: keep the sum in a register
        acc sum = 0;
        for (int64_t r = indptr[s]; r < indptr[s + 1]; ++r) sum += static_cast<acc>(in[r]);
        out[s] = static_cast<T>(sum);
        continue;
      }
      std::fill(sums.begin(), sums.end(), acc(0));
      for (int64_t r = indptr[s]; r < indptr[s + 1]; ++r) {
        const T* row = in + r * inner;
        for (int64_t k = 0; k < inner; ++k) sums[k] += static_cast<acc>(row[k]);
      }
      for (int64_t k = 0; k < inner; ++k) out[s * inner + k] = static_cast<T>(sums[k]);
    }
  });
}

// Backward of segment_sum: row r of `out` is row "segment of r" of `in`. A row
// copy needs no arithmetic, so it copies bytes whatever the dtype.
template <typename ParallelFor>
void segment_gather(const char* in, const int64_t* indptr, char* out, int64_t segments,
                    int64_t row_bytes, const ParallelFor& parallel_for) {
  const int64_t rows = indptr[segments];
  parallel_for(0, segments, grain(segments, rows * row_bytes), [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      for (int64_t r = indptr[s]; r < indptr[s + 1]; ++r) {
        std::memcpy(out + r * row_bytes, in + s * row_bytes, row_bytes);
      }
    }
  });
}

}  // namespace segment_ops::cpu
