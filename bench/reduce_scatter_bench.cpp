// Reduce-scatter, as ZeRO-2 and -3 reduce their gradients: tshard's (comm/collectives.hpp: one
// exchange between two ranks, MPI's own call on other group sizes) against Open MPI's
// MPI_Reduce_scatter_block and against the MPI_Allreduce that ZeRO-0 and -1 use instead, side by
// side on the same buffers. Per-rank block sizes in floats.
//   bash bench/run_reduce_scatter.sh [--max 4194304] [--reps 9]
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <tshard/tshard.hpp>
#include <vector>

#include "bench_support.hpp"

using tshard_bench::interleaved;
using tshard_bench::world_rank;
using tshard_bench::world_size;

int main(int argc, char** argv) {
  tshard::Environment env(argc, argv);
  long max = 1L << 22;
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--max") max = std::max(1L, std::atol(argv[i + 1]));
    if (a == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
  }
  const int p = world_size(), r = world_rank();
  if (r == 0)
    std::printf("reduce-scatter of float blocks on %d ranks, medians of %d interleaved runs "
                "(all-reduce: the whole p-block buffer)\n", p, reps);
  for (long n = 1L << 16; n <= max; n *= 4) {
    const auto m = static_cast<std::size_t>(n);
    std::vector<float> send(m * static_cast<std::size_t>(p), 1.f + float(r)), recv(m), all(send.size());
    const std::vector<double> t = interleaved(
        {[&] { tshard::detail::reduce_scatter_block(MPI_COMM_WORLD, send.data(), recv.data(), n, tshard::ReduceOp::Sum); },
         [&] { MPI_Reduce_scatter_block(send.data(), recv.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
         [&] { MPI_Allreduce(send.data(), all.data(), int(send.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); }},
        reps);
    if (r == 0)
      std::printf("block %8ld floats: tshard %8.3f ms, MPI_Reduce_scatter_block %8.3f ms (%.2fx), MPI_Allreduce %8.3f ms\n",
                  n, 1e3 * t[0], 1e3 * t[1], t[1] / t[0], 1e3 * t[2]);
  }
  return 0;
}
