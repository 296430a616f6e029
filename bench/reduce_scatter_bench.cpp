// Reduce-scatter, as ZeRO-2 and -3 reduce their gradients: tshard's (comm/collectives.hpp: an
// exchange in p - 1 rounds, each rank sending every other rank its contribution to that rank's
// block and adding what it gets at once, in a ring's order) against Open MPI's MPI_Reduce_scatter_block,
// against the MPI_Allreduce that ZeRO-0 and -1 use instead, and against two hand-written
// alternatives:
//  - ring: p - 1 neighbour exchanges of one block each, every rank adding its own block to the
//    partial sum it receives (bandwidth-optimal, p - 1 latencies, each step waiting on the last);
//  - all at once: the exchange with every message posted at once (as tshard's non-blocking form,
//    comm/nonblocking.hpp, does), summed at the end, in segments so that the staging stays at
//    `--segment` floats per peer.
// Side by side on the same buffers; per-rank block sizes in floats. Every variant's result is
// checked against the exact sum. The ratios are MPI_Reduce_scatter_block's time over each one's.
//   bash bench/run_reduce_scatter.sh [--max 4194304] [--reps 9] [--segment 262144]
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tshard/tshard.hpp>
#include <vector>

#include "bench_support.hpp"

using tshard_bench::all_ranks;
using tshard_bench::interleaved;
using tshard_bench::world_rank;
using tshard_bench::world_size;

namespace {

// Ring: at step s rank r passes the partial sum of block (r - s - 1) to r + 1 and receives that
// of block (r - s - 2) from r - 1, adding its own; after p - 1 steps block r is complete.
void ring_reduce_scatter(const float* send, float* recv, long n, std::vector<float>& partial,
                         std::vector<float>& incoming) {
  int p = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  const int right = (r + 1) % p, left = (r + p - 1) % p;
  partial.resize(std::size_t(n));
  incoming.resize(std::size_t(n));
  for (int s = 0; s + 1 < p; ++s) {
    const int out_block = (r - s - 1 + 2 * p) % p, in_block = (r - s - 2 + 2 * p) % p;
    const float* out = s == 0 ? send + long(out_block) * n : partial.data();
    MPI_Sendrecv(out, int(n), MPI_FLOAT, right, 7, incoming.data(), int(n), MPI_FLOAT, left, 7, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    const float* mine = send + long(in_block) * n;
    float* sum = s + 2 == p ? recv : partial.data();
    for (long i = 0; i < n; ++i) sum[i] = incoming[std::size_t(i)] + mine[i];
  }
}

// All at once: block j goes to rank j; the p contributions to block r are summed in rank order.
void all_at_once_reduce_scatter(const float* send, float* recv, long n, long segment, std::vector<float>& staging) {
  int p = 0, r = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &p);
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  const long seg = std::min(n, segment);
  staging.resize(std::size_t(seg) * std::size_t(p));
  std::vector<MPI_Request> reqs(2 * std::size_t(p));
  for (long off = 0; off < n; off += seg) {
    const long c = std::min(seg, n - off);
    int k = 0;
    for (int d = 1; d < p; ++d) {  // peers in a rotating order, so no rank is everyone's first
      const int from = (r - d + p) % p, to = (r + d) % p;
      MPI_Irecv(staging.data() + long(from) * c, int(c), MPI_FLOAT, from, 8, MPI_COMM_WORLD, &reqs[std::size_t(k++)]);
      MPI_Isend(send + long(to) * n + off, int(c), MPI_FLOAT, to, 8, MPI_COMM_WORLD, &reqs[std::size_t(k++)]);
    }
    MPI_Waitall(k, reqs.data(), MPI_STATUSES_IGNORE);
    std::copy_n(send + long(r) * n + off, c, staging.data() + long(r) * c);
    float* out = recv + off;
    std::copy_n(staging.data(), c, out);
    for (int q = 1; q < p; ++q) {
      const float* b = staging.data() + long(q) * c;
      for (long i = 0; i < c; ++i) out[i] += b[i];
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  tshard::Environment env(argc, argv);
  long max = 1L << 22, segment = 1L << 18;
  int reps = 9;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--max") max = std::max(1L, std::atol(argv[i + 1]));
    if (a == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
    if (a == "--segment") segment = std::max(1L, std::atol(argv[i + 1]));
  }
  const int p = world_size(), r = world_rank();
  if (r == 0)
    std::printf("reduce-scatter of float blocks on %d ranks, medians of %d interleaved runs "
                "(all-reduce: the whole p-block buffer; all-at-once segments of %ld floats)\n",
                p, reps, segment);
  std::vector<float> partial, incoming, staging;
  for (long n = 1L << 16; n <= max; n *= 4) {
    const auto m = static_cast<std::size_t>(n);
    // Small integers: every sum order gives the exact sum, which each variant is checked against.
    std::vector<float> send(m * static_cast<std::size_t>(p)), recv(m), all(send.size());
    for (std::size_t i = 0; i < send.size(); ++i) send[i] = float((i + std::size_t(r) * 7) % 13);
    const auto check = [&](const char* name) {
      bool ok = true;
      for (std::size_t i = 0; i < m; ++i) {
        float want = 0;
        for (int q = 0; q < p; ++q) want += float((std::size_t(r) * m + i + std::size_t(q) * 7) % 13);
        ok = ok && recv[i] == want;
      }
      if (!all_ranks(ok) && r == 0) std::printf("WRONG RESULT: %s, block %ld\n", name, n);
      std::fill(recv.begin(), recv.end(), -1.f);
    };
    const auto tshard_rs = [&] {
      tshard::detail::reduce_scatter_block(MPI_COMM_WORLD, send.data(), recv.data(), n, tshard::ReduceOp::Sum);
    };
    const auto mpi_rs = [&] {
      MPI_Reduce_scatter_block(send.data(), recv.data(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    const auto ring = [&] { ring_reduce_scatter(send.data(), recv.data(), n, partial, incoming); };
    const auto all_at_once = [&] { all_at_once_reduce_scatter(send.data(), recv.data(), n, segment, staging); };
    tshard_rs();
    check("tshard");
    mpi_rs();
    check("MPI_Reduce_scatter_block");
    if (p > 1) {
      ring();
      check("ring");
    }
    all_at_once();
    check("all at once");
    const std::vector<double> t = interleaved(
        {tshard_rs, mpi_rs,
         [&] { MPI_Allreduce(send.data(), all.data(), int(send.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
         [&] {
           if (p > 1) ring();
         },
         all_at_once},
        reps);
    if (r == 0)
      std::printf("block %8ld floats: tshard %8.3f ms (%.2fx), MPI_Reduce_scatter_block %8.3f ms, MPI_Allreduce "
                  "%8.3f ms, ring %8.3f ms (%.2fx), all at once %8.3f ms (%.2fx)\n",
                  n, 1e3 * t[0], t[1] / t[0], 1e3 * t[1], 1e3 * t[2], 1e3 * t[3], t[1] / t[3], 1e3 * t[4],
                  t[1] / t[4]);
  }
  return 0;
}
