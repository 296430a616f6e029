// The bookkeeping around an operator on tensors so small that the work itself is nothing: an
// elementwise add, a broadcast add, a reshard (all-gather), an einsum that leaves a partial sum
// resolved by one all-reduce, each against the same work written by hand (an Eigen expression,
// MPI_Allgather, a GEMM + MPI_Allreduce) in the same run. What is left after subtracting the
// hand-written time is tshard's per-call overhead: plan lookups, label scopes, shape checks,
// allocation.
//   bash bench/run_overhead.sh [--n 16] [--calls 2000] [--reps 7]
#include <mpi.h>

#include <Eigen/Core>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <tshard/tshard.hpp>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using tshard_bench::interleaved;
using tshard_bench::world_rank;
using tshard_bench::world_size;

namespace {

using M = ts::Mesh<"x">;
using Rows = ts::Spec<ts::S<"x">, ts::R>;
using Cols = ts::Spec<ts::R, ts::S<"x">>;
using Whole = ts::Spec<ts::R, ts::R>;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic>;

struct Options {
  Eigen::Index n = 16;
  int calls = 2000, reps = 7;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (a == "--n") o.n = std::max(1L, v);
    if (a == "--calls") o.calls = int(std::max(1L, v));
    if (a == "--reps") o.reps = int(std::max(1L, v));
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  const Options o = parse(argc, argv);
  const int p = world_size();
  M mesh({p});
  const Eigen::Index n = o.n, rows = (n + p - 1) / p;
  auto a = ts::random<float, Rows>(mesh, {n, n}, 1), b = ts::random<float, Rows>(mesh, {n, n}, 2);
  auto c = ts::random<float, Cols>(mesh, {n, n}, 3);
  auto bias = ts::random<float, Whole>(mesh, {1, n}, 4);
  Mat la = Mat::Random(rows, n), lb = Mat::Random(rows, n), lbias = Mat::Random(1, n), lc = Mat::Random(n, rows),
      out(rows, n), whole(rows * p, n), product(n, n);
  float sink = 0;
  auto loop = [&](auto body) -> std::function<void()> {
    return [&o, body] {
      for (int i = 0; i < o.calls; ++i) body();
    };
  };
  struct Case {
    const char* what;
    std::function<void()> ours, hand;
  };
  const std::vector<Case> cases{
      {"x + y, rows split", loop([&] { sink += (a + b).local()(0, 0); }), loop([&] {
         out = la + lb;
         sink += out(0, 0);
       })},
      {"x + bias, broadcast [1, n]", loop([&] { sink += (a + bias).local()(0, 0); }), loop([&] {
         out = la.rowwise() + lbias.row(0);
         sink += out(0, 0);
       })},
      {"reshard {x, R} -> {R, R}", loop([&] { sink += ts::reshard<Whole>(a).local()(0, 0); }), loop([&] {
         MPI_Allgather(la.data(), int(la.size()), MPI_FLOAT, whole.data(), int(la.size()), MPI_FLOAT, MPI_COMM_WORLD);
         sink += whole(0, 0);
       })},
      {"einsum ij,jk->ik, j split, resolved",
       loop([&] { sink += ts::reshard<Whole>(ts::einsum<"ij,jk->ik">(c, a)).local()(0, 0); }), loop([&] {
         product.noalias() = lc * la;
         MPI_Allreduce(MPI_IN_PLACE, product.data(), int(product.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
         sink += product(0, 0);
       })},
  };
  std::vector<std::function<void()>> fs;
  for (auto& k : cases) {
    fs.push_back(k.ours);
    fs.push_back(k.hand);
  }
  const std::vector<double> t = interleaved(fs, o.reps, 1);
  if (world_rank() == 0) {
    std::printf("per-call overhead, %d ranks, float [%ld, %ld], %d calls per sample, median of %d\n", p, long(n),
                long(n), o.calls, o.reps);
    for (std::size_t k = 0; k < cases.size(); ++k) {
      const double ours = 1e6 * t[2 * k] / o.calls, hand = 1e6 * t[2 * k + 1] / o.calls;
      std::printf("%-38s tshard %7.2f us, by hand %7.2f us, overhead %7.2f us per call\n", cases[k].what, ours, hand,
                  ours - hand);
    }
  }
  return sink == 12345.f ? 1 : 0;  // keeps the loops' results alive
}
