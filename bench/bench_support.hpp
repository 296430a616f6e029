// What the benchmarks share, so that each has one copy: timing (one sample is the slowest rank's
// time after a barrier, what a step of an SPMD program costs; figures are medians of interleaved
// runs, A B A B ..., so drift from the other load on the machine hits every variant alike), the
// agreement of all ranks on a figure or a check, and the shard rule the hand-written baselines
// split by.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "tshard/ops/blas_kernels.hpp"

namespace tshard_bench {

// Rank and size in MPI_COMM_WORLD (what tshard::Environment::world_rank / world_size return).
// The BLAS and the kernels it runs ("BLIS 0.9.0, skx kernels", "OpenBLAS, SkylakeX kernels"), or
// "Eigen's GEMM" where the benchmark was built without BLAS.
inline const char* blas_kernels() {
  static const std::string kernels = [] {
    const std::string line = tshard::blas_report(), prefix = "local products: ";
    return line.rfind(prefix, 0) == 0 ? line.substr(prefix.size()) : line;
  }();
  return kernels.c_str();
}

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}
inline int world_size() {
  int s = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &s);
  return s;
}

// The largest x over the ranks of comm: a figure as the slowest rank saw it.
inline double max_over_ranks(double x, MPI_Comm comm = MPI_COMM_WORLD) {
  double m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, comm);
  return m;
}

// Whether ok holds on every rank of comm: a check passes or fails on all ranks alike.
inline bool all_ranks(bool ok, MPI_Comm comm = MPI_COMM_WORLD) {
  int v = ok ? 1 : 0, all = 0;
  MPI_Allreduce(&v, &all, 1, MPI_INT, MPI_MIN, comm);
  return all == 1;
}

// Wall time of f on the slowest rank of comm, all ranks starting together.
inline double time_once(const std::function<void()>& f, MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Barrier(comm);
  const double t0 = MPI_Wtime();
  f();
  return max_over_ranks(MPI_Wtime() - t0, comm);
}

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Interleaved timing of several variants after `warmup` untimed runs of each (pools filled,
// pages touched); returns the median time of each variant. The order rotates from one rep to
// the next, so every variant runs in every position equally often: the first run after a
// switch was measured up to 10 % slower here, whichever variant it was.
inline std::vector<double> interleaved(const std::vector<std::function<void()>>& fs, int reps, int warmup = 2,
                                       MPI_Comm comm = MPI_COMM_WORLD) {
  for (auto& f : fs)
    for (int w = 0; w < warmup; ++w) f();
  std::vector<std::vector<double>> t(fs.size());
  for (int r = 0; r < reps; ++r)
    for (std::size_t k = 0; k < fs.size(); ++k) {
      const std::size_t i = (k + std::size_t(r)) % fs.size();
      t[i].push_back(time_once(fs[i], comm));
    }
  std::vector<double> m;
  for (auto& v : t) m.push_back(median(v));
  return m;
}

// The value of the last `name value` pair on the command line, or fallback (a script's defaults
// come first, so a later pair overrides them).
inline long arg(int argc, char** argv, const char* name, long fallback) {
  for (int a = 1; a + 1 < argc; ++a)
    if (std::strcmp(argv[a], name) == 0) fallback = std::atol(argv[a + 1]);
  return fallback;
}

// The hand-written baselines' own copy of tshard's shard rule (docs/architecture.md): n elements in
// `parts` blocks of ceil(n / parts), the last ones shorter or empty. Kept apart from tshard's
// code so that a baseline checks tshard's layout rather than sharing it.
struct Split {
  std::ptrdiff_t n = 0, parts = 1;  // std::ptrdiff_t is Eigen::Index, what the benchmarks index with
  std::ptrdiff_t block() const { return parts <= 1 ? n : (n + parts - 1) / parts; }
  std::ptrdiff_t offset(std::ptrdiff_t c) const { return std::min(c * block(), n); }
  std::ptrdiff_t valid(std::ptrdiff_t c) const { return std::clamp<std::ptrdiff_t>(n - c * block(), 0, block()); }
  bool even() const { return n % parts == 0; }
};

}  // namespace tshard_bench
