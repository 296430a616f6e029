// The gradient all-reduce: tshard's (comm/all_reduce.hpp: the reduce-scatter exchange in place,
// each segment all-gathered while the next is summed; in two levels where the ranks fill several
// nodes, or TSHARD_RANKS_PER_NODE says so) against Open MPI's MPI_Allreduce, its ring algorithm
// where it can be chosen (OMPI_MCA_coll_tuned_allreduce_algorithm=4 in a second run), and the
// node triad bound (2 (p - 1) / p of the buffer each way at --triad GB/s per rank, where given).
// Sizes in MB of float gradients, from --min to --max by doubling; medians of interleaved runs.
// Every result is checked against the exact sum (small whole numbers).
//   bash bench/run_all_reduce.sh [--min 1] [--max 512] [--reps 5] [--segment 262144]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tshard/comm/all_reduce.hpp>
#include <tshard/comm/environment.hpp>
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
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--min") min_mb = std::max(1e-3, std::atof(argv[i + 1]));
    if (a == "--max") max_mb = std::max(1e-3, std::atof(argv[i + 1]));
    if (a == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
    if (a == "--segment") segment = std::max(1L, std::atol(argv[i + 1]));
  }
  const int p = world_size(), r = world_rank();
  const auto nodes = tshard::detail::split_by_node(MPI_COMM_WORLD);
  if (r == 0)
    std::printf("all-reduce of float buffers on %d ranks (%d node(s) of %d), medians of %d interleaved runs, segments of %ld floats\n",
                p, nodes->nodes, nodes->per_node, reps, segment);
  for (double mb = min_mb; mb <= max_mb * 1.0001; mb *= 2) {
    const long n = std::max(1L, long(mb * 1e6 / sizeof(float)));
    const auto m = static_cast<std::size_t>(n);
    std::vector<float> data(m), fresh(m);
    for (long i = 0; i < n; ++i) fresh[std::size_t(i)] = float((i + long(r) * 7) % 13);
    const auto check = [&](const char* name) {
      bool ok = true;
      for (long i = 0; i < n && ok; i += 97) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += float((i + long(q) * 7) % 13);
        ok = data[std::size_t(i)] == want;
      }
      if (!all_ranks(ok) && r == 0) std::printf("WRONG RESULT: %s, %.1f MB\n", name, mb);
    };
    // (each run starts from the same values: the copy is timed alike for every variant)
    const auto mpi = [&] {
      data = fresh;
      MPI_Allreduce(MPI_IN_PLACE, data.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    const auto flat = [&] {
      data = fresh;
      tshard::detail::exchange_all_reduce(MPI_COMM_WORLD, data.data(), n, segment);
    };
    const auto two = [&] {
      data = fresh;
      tshard::detail::two_level_all_reduce(MPI_COMM_WORLD, *nodes, data.data(), n);
    };
    const auto copy = [&] { data = fresh; };
    mpi(), check("MPI_Allreduce");
    flat(), check("tshard");
    two(), check("tshard two-level");
    const std::vector<double> t = interleaved({mpi, flat, two, copy}, reps, 1);
    const double bytes = double(n) * sizeof(float), moved = 2.0 * bytes * (p - 1) / p;
    const double ms[3] = {1e3 * (t[0] - t[3]), 1e3 * (t[1] - t[3]), 1e3 * (t[2] - t[3])};  // (less the copy)
    if (r == 0) {
      std::printf("%8.2f MB: MPI_Allreduce %9.3f ms, tshard %9.3f ms (%.2fx, %.2f GB/s each way per rank)", mb, ms[0], ms[1],
                  ms[0] / std::max(1e-6, ms[1]), moved / std::max(1e-6, ms[1]) / 1e6);
      if (nodes->usable) std::printf(", two levels %9.3f ms (%.2fx)", ms[2], ms[0] / std::max(1e-6, ms[2]));
      std::printf("\n");
    }
  }
  return 0;
}
