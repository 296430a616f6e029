// Timing helpers shared by the benchmarks: one sample is the slowest rank's time after a barrier
// (what a step of an SPMD program costs), figures are medians of interleaved runs (A B A B ...,
// so drift from the other load on the machine hits every variant alike).
#pragma once
#include <mpi.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

namespace tshard_bench {

// Wall time of f on the slowest rank of comm, all ranks starting together.
inline double time_once(const std::function<void()>& f, MPI_Comm comm = MPI_COMM_WORLD) {
  MPI_Barrier(comm);
  const double t0 = MPI_Wtime();
  f();
  double t = MPI_Wtime() - t0, worst = 0;
  MPI_Allreduce(&t, &worst, 1, MPI_DOUBLE, MPI_MAX, comm);
  return worst;
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

}  // namespace tshard_bench
