// What a training program reports besides its losses: the machine's GEMM rate (the basis of MFU),
// step times taken together on every rank, and memory: the process's resident set above a start
// and the buffer pool's bytes.
//
//   const double peak = ts::train::gemm_rate(mesh, 384);      // sgemm n=384 on every rank, summed
//   ts::train::MemoryMeter memory;  memory.start();           // before the model is built
//   ... memory.sample_pool();                                 // at the step's fullest moment
//   memory.print(mesh);                                       // "buffer pool on rank 0: ..." and
//                                                             // "resident memory: ..." lines
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "tshard/comm/clock.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/host_collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/ops/gemm.hpp"

namespace tshard::train {

// "{data, stage, model} = {2, 1, 2}": the mesh's axes and sizes, those named in `optional` left
// out where their size is 1 (named only where they are used).
template <MeshType M>
std::string mesh_sizes_text(const M& mesh, const std::vector<std::string>& optional = {}) {
  std::string names, sizes;
  for (std::size_t a = 0; a < M::axis_names.size(); ++a) {
    const std::string name(M::axis_names[a]);
    const int size = mesh.shape().sizes[a];
    if (size == 1 && std::find(optional.begin(), optional.end(), name) != optional.end()) continue;
    names += (names.empty() ? "" : ", ") + name, sizes += (sizes.empty() ? "" : ", ") + std::to_string(size);
  }
  return "{" + names + "} = {" + sizes + "}";
}

// The time of a moment every rank of the mesh reached (an uncounted barrier first), to time a
// step as its slowest rank sees it.
template <MeshType M>
Clock::time_point synchronized_now(const M& mesh) {
  tshard::detail::synchronize(mesh.comm());
  return Clock::now();
}
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// The machine's GEMM rate in FLOP/s: sgemm of n^3 on every rank at the same moment (best of 3),
// summed over ranks. What model FLOPs are measured against (MFU).
template <MeshType M>
double gemm_rate(const M& mesh, int n) {
  Eigen::MatrixXf a = Eigen::MatrixXf::Random(n, n), b = Eigen::MatrixXf::Random(n, n), c(n, n);
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const auto t0 = synchronized_now(mesh);
    tshard::detail::gemm<float>(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n);
    best = std::min(best, seconds_since(t0));
  }
  return all_reduce(mesh, 2.0 * n * n * n / best);
}

// This process's resident memory and its high-water mark, in bytes (Linux; 0 elsewhere).
struct Resident {
  double now = 0, peak = 0;
};
Resident resident_memory();
// Restarts the high-water mark from the resident memory now (Linux 4.0 and later).
void reset_resident_peak();

// A run's memory: the resident peak above the start, and the buffer pool at a sampled moment.
class MemoryMeter {
 public:
  // Before the model: the high-water mark restarts here (what ran before is not this run's).
  void start();
  // The buffer pool now: bytes in use and the peak since its last reset.
  void sample_pool();
  // The resident peak above the start, this rank's and the sum over the mesh (collective).
  template <MeshType M>
  void measure(const M& mesh) {
    growth_ = std::max(0.0, resident_memory().peak - before_);
#if TSHARD_SIMULATE
    growth_all_ = growth_;  // (simulated ranks share one process: its growth is all of theirs)
    (void)mesh;
#else
    growth_all_ = all_reduce(mesh, growth_);
#endif
  }
  double pool_now() const { return pool_now_; }
  double pool_peak() const { return pool_peak_; }
  double resident_growth() const { return growth_; }
  double resident_growth_all() const { return growth_all_; }
  // The two report lines, on mesh rank 0 (after measure()).
  template <MeshType M>
  void print(const M& mesh) const {
    if (mesh.rank() != 0) return;
    std::printf("buffer pool on rank 0: %.1f KiB in use there, peak %.1f KiB (activations included)\n", pool_now_ / 1024.0,
                pool_peak_ / 1024.0);
#if TSHARD_SIMULATE
    std::printf("resident memory: peak above that before the model %.1f MiB, the simulator's one process for all %d ranks\n",
                growth_ / 1048576, mesh.size());
#else
    std::printf("resident memory: peak above that before the model %.1f MiB on rank 0, %.1f MiB over all %d ranks\n",
                growth_ / 1048576, growth_all_ / 1048576, mesh.size());
#endif
  }

 private:
  double before_ = 0, pool_now_ = 0, pool_peak_ = 0, growth_ = 0, growth_all_ = 0;
};

// The largest relative difference between two loss curves (`got` may start later, at `first`).
double largest_relative_difference(const std::vector<double>& got, const std::vector<double>& want, std::size_t first = 0);

// What a training run produced: its report, and --check's comparison with the one-rank run.
struct RunLog {
  std::vector<double> losses;                 // one per step run
  std::vector<std::pair<int, double>> evals;  // (after step, held-out loss)
  std::vector<std::int32_t> sample;           // the generated tokens
  double seconds = 0, sampling_seconds = 0;   // the timed steps', the generation's
  int first_step = 0;                         // (a resumed run's)
  MemoryMeter memory;
};

// --check: a run against the same program's one-rank run: the largest relative difference of the
// losses and held-out losses, and (compare_sample: greedy) whether the samples are the same.
struct CurveCheck {
  double worst = 0;
  bool same_sample = true, ok = true;
  CurveCheck(const RunLog& run, const RunLog& serial, double tolerance, bool compare_sample);
  // "largest relative difference from the single-rank curve 1.2e-16", and what failed (`ok`: as
  // every rank agreed).
  void print(bool agreed_ok) const;
};

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/report-inl.hpp"
#endif
