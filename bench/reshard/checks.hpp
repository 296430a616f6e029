// The reshard benchmark's checks: the layout of one rank's block, the known values the source is
// filled with, and the comparisons every result passes once, before anything is timed.
#pragma once
#include <mpi.h>

#include <Eigen/Core>
#include <cinttypes>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>

#include "../bench_support.hpp"

namespace reshard_bench {

using Index = Eigen::Index;

// One rank's padded column-major block of a rows x cols tensor: the layout tshard's local block
// must have, and where the checks find each valid element's global index.
struct Block {
  Index ld = 0, ncols = 0;  // padded extents
  Index off0 = 0, off1 = 0, v0 = 0, v1 = 0;
  Index size() const { return ld * ncols; }
};

inline Block block_of(bool split0, bool split1, Index rows, Index cols, int p, int me) {
  const tshard_bench::Split a{rows, split0 ? p : 1}, b{cols, split1 ? p : 1};
  const int c0 = split0 ? me : 0, c1 = split1 ? me : 0;
  return {a.block(), b.block(), a.offset(c0), b.offset(c1), a.valid(c0), b.valid(c1)};
}

// Small integers: sums of partials are exact in any order, so the expected value is known.
inline float value_at(Index i, Index j) { return float((i * 7 + j * 13) % 1021); }

inline void fill_block(float* p, const Block& b, float add) {
  for (Index j = 0; j < b.ncols; ++j)
    for (Index i = 0; i < b.ld; ++i)
      p[i + j * b.ld] = (i < b.v0 && j < b.v1) ? value_at(b.off0 + i, b.off1 + j) + add : 0.0f;
}

// First valid element where `p` differs from mul * value + add, as "global (i, j) is x, expected y".
inline std::string check_values(const float* p, const Block& b, float mul, float add) {
  for (Index j = 0; j < b.v1; ++j)
    for (Index i = 0; i < b.v0; ++i) {
      const float want = mul * value_at(b.off0 + i, b.off1 + j) + add, got = p[i + j * b.ld];
      if (std::memcmp(&want, &got, sizeof(float)) != 0) {
        char s[160];
        std::snprintf(s, sizeof s, "global (%" PRId64 ", %" PRId64 ") is %g, expected %g", std::int64_t(b.off0 + i),
                      std::int64_t(b.off1 + j), double(got), double(want));
        return s;
      }
    }
  return "";
}

// Bitwise comparison of the valid parts of two blocks with the same layout.
inline std::string check_same(const float* x, const float* y, const Block& b) {
  for (Index j = 0; j < b.v1; ++j)
    if (std::memcmp(x + j * b.ld, y + j * b.ld, std::size_t(b.v0) * sizeof(float)) != 0)
      for (Index i = 0; i < b.v0; ++i)
        if (std::memcmp(x + j * b.ld + i, y + j * b.ld + i, sizeof(float)) != 0) {
          char s[160];
          std::snprintf(s, sizeof s, "global (%" PRId64 ", %" PRId64 "): %g vs %g", std::int64_t(b.off0 + i),
                        std::int64_t(b.off1 + j), double(x[j * b.ld + i]), double(y[j * b.ld + i]));
          return s;
        }
  return "";
}

// Every rank agrees on failure; the failing ranks say why; then the job ends.
inline void agree_or_abort(const std::string& problem, const std::string& what) {
  if (tshard_bench::all_ranks(problem.empty())) return;
  if (!problem.empty()) {
    std::fprintf(stderr, "tshard_bench_reshard: rank %d: %s: %s\n", tshard_bench::world_rank(), what.c_str(),
                 problem.c_str());
    std::fflush(stderr);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

}  // namespace reshard_bench
