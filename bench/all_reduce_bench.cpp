// The gradient all-reduce: tshard's (comm/all_reduce.hpp: the reduce-scatter exchange in place,
// each segment all-gathered while the next is summed; in two levels where the ranks fill several
// nodes, or TSHARD_RANKS_PER_NODE says so) against Open MPI's MPI_Allreduce, its ring algorithm
// where it can be chosen (OMPI_MCA_coll_tuned_allreduce_algorithm=4 in a second run), and the
// node triad bound (2 (p - 1) / p of the buffer each way at --triad GB/s per rank, where given).
// Sizes in MB of float gradients, from --min to --max by doubling; medians of interleaved runs.
// Every result is checked against the exact sum (small whole numbers), except in the simulation's
// timing mode (scripts/simulate.sh --timing: docs/scaling.md), whose values are meaningless.
// --only picks variants (mpi, flat, two: a 2048-rank simulation runs the ones it compares).
//   bash bench/run_all_reduce.sh [--min 1] [--max 512] [--reps 5] [--segment 262144] [--only mpi,two]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tshard/comm/all_reduce.hpp>
#include <tshard/comm/buffer_pool.hpp>
#include <tshard/comm/environment.hpp>
#include <tshard/core/simulated_timing.hpp>
#include <vector>

#include "bench_support.hpp"

using tshard_bench::all_ranks;
using tshard_bench::interleaved;
using tshard_bench::world_rank;
using tshard_bench::world_size;

int main(int argc, char** argv) {
  tshard::Environment env(argc, argv);
  double min_mb = 1, max_mb = 512;
  long segment = 1L << 18;
  int reps = 5;
  std::string only = "mpi,flat,two";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--min") min_mb = std::max(1e-3, std::atof(argv[i + 1]));
    if (a == "--max") max_mb = std::max(1e-3, std::atof(argv[i + 1]));
    if (a == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
    if (a == "--segment") segment = std::max(1L, std::atol(argv[i + 1]));
    if (a == "--only") only = argv[i + 1];
  }
  const auto runs = [&](const char* variant) { return ("," + only + ",").find("," + std::string(variant) + ",") != std::string::npos; };
  const bool checked = !tshard::simulated_timing_mode();
  const int p = world_size(), r = world_rank();
  const auto nodes = tshard::detail::split_by_node(MPI_COMM_WORLD);
  if (r == 0)
    std::printf("all-reduce of float buffers on %d ranks (%d node(s) of %d), medians of %d interleaved runs, segments of %ld floats\n",
                p, nodes->nodes, nodes->per_node, reps, segment);
  for (double mb = min_mb; mb <= max_mb * 1.0001; mb *= 2) {
    const long n = std::max(1L, long(mb * 1e6 / sizeof(float)));
    const auto m = static_cast<std::size_t>(n);
    // (pooled: the simulation's timing mode shares them among its ranks)
    const auto data = tshard::detail::pooled_array<float>(m), fresh = tshard::detail::pooled_array<float>(m);
    if (checked)
      for (long i = 0; i < n; ++i) fresh.get()[i] = float((i + long(r) * 7) % 13);
    const auto check = [&](const char* name) {
      bool ok = true;
      for (long i = 0; i < n && ok && checked; i += 97) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += float((i + long(q) * 7) % 13);
        ok = data.get()[i] == want;
      }
      if (!all_ranks(ok) && r == 0) std::printf("WRONG RESULT: %s, %.1f MB\n", name, mb);
    };
    // (each run starts from the same values: the copy is timed alike for every variant)
    const auto copy = [&] {
      tshard::detail::sampled("copy", [&] { std::copy(fresh.get(), fresh.get() + n, data.get()); }, n);
    };
    const auto mpi = [&] {
      copy();
      MPI_Allreduce(MPI_IN_PLACE, data.get(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    const auto flat = [&] {
      copy();
      tshard::detail::exchange_all_reduce(MPI_COMM_WORLD, data.get(), n, segment);
    };
    const auto two = [&] {
      copy();
      tshard::detail::two_level_all_reduce(MPI_COMM_WORLD, *nodes, data.get(), n);
    };
    // (a variant not run is timed as nothing)
    const auto chosen = [&](const char* variant, const char* name, std::function<void()> f) -> std::function<void()> {
      if (!runs(variant)) return [] {};
      f(), check(name);
      return f;
    };
    const std::vector<double> t = interleaved(
        {chosen("mpi", "MPI_Allreduce", mpi), chosen("flat", "tshard", flat), chosen("two", "tshard two-level", two), copy},
        reps, 1);
    const double bytes = double(n) * sizeof(float), moved = 2.0 * bytes * (p - 1) / p;
    const double ms[3] = {1e3 * (t[0] - t[3]), 1e3 * (t[1] - t[3]), 1e3 * (t[2] - t[3])};  // (less the copy)
    if (r == 0 && !(runs("mpi") && runs("flat") && runs("two"))) {  // (some: each with its ratio to MPI's)
      std::printf("%8.2f MB:", mb);
      const char* names[3] = {"MPI_Allreduce", "tshard", "two levels"};
      const char* keys[3] = {"mpi", "flat", "two"};
      const char* sep = "";
      for (int v = 0; v < 3; ++v) {
        if (!runs(keys[v]) || (v == 2 && !nodes->usable)) continue;
        std::printf("%s %s %9.3f ms", sep, names[v], ms[v]);
        if (v > 0 && runs("mpi")) std::printf(" (%.2fx)", ms[0] / std::max(1e-6, ms[v]));
        sep = ",";
      }
      std::printf("\n");
    } else if (r == 0) {
      std::printf("%8.2f MB: MPI_Allreduce %9.3f ms, tshard %9.3f ms (%.2fx, %.2f GB/s each way per rank)", mb, ms[0], ms[1],
                  ms[0] / std::max(1e-6, ms[1]), moved / std::max(1e-6, ms[1]) / 1e6);
      if (nodes->usable) std::printf(", two levels %9.3f ms (%.2fx)", ms[2], ms[0] / std::max(1e-6, ms[2]));
      std::printf("\n");
    }
  }
  return 0;
}
