// CG benchmark: unpreconditioned conjugate gradients on the 7-point Laplacian of an n^3 double
// grid (zero beyond it), a fixed number of iterations, the grid split over a px x py x pz grid of
// ranks, for
//   written  tshard as a newcomer writes it today: q = ts::stencil(p, {1, 1, 1}, Zero, f),
//            ts::sum<0, 1, 2>(a * b).gather()() for each dot, x += a * p, r -= a * q,
//            p = r + b * p, under ImplicitCommunication::Forbid;
//   library  ts::solvers::cg (ts::dot, ts::update: x and r in one pass, p in another), same
//            operator, rtol 0 so that it runs the iterations asked for;
//   hand     hand-written MPI: ghosted arrays allocated once, MPI_Cart_create, the six faces by
//            MPI_Sendrecv of subarray types (MPI_PROC_NULL at the edges), one loop for q and p.q,
//            one for x, r and r.r, one for p, each dot one MPI_Allreduce: how one writes it by hand.
// Variants run interleaved, the order rotating; a sample is the slowest rank's time for the
// iterations; the figure is the median of --rounds samples, per iteration. All three must end at
// the same residual (1e-9 relative), or the program exits non-zero.
// Goals: written <= 1.03x hand, library <= 1.0x PETSc's KSPCG (not compared here yet).
//
//   mpirun -np 2 build/bench/tshard_bench_cg --n 128 --iters 40 --rounds 5 [--mesh 1,1,2]
#include <mpi.h>

#include <tshard/hpc.hpp>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using Index = Eigen::Index;

namespace {

using M = ts::Mesh<"x", "y", "z">;
using Grid = ts::Spec<ts::S<"x">, ts::S<"y">, ts::S<"z">>;
using Field = ts::ShardedTensor<double, M, Grid>;

double source(Index i, Index j, Index k, Index n) {
  const double x = (double(i) + 1) / double(n + 1), y = (double(j) + 1) / double(n + 1), z = (double(k) + 1) / double(n + 1);
  return std::sin(M_PI * x) * std::sin(2 * M_PI * y) * (1 + z) + 0.1 * std::cos(7 * x + 3 * y * z);
}

// A lambda rather than a function: ts::stencil gets its type and inlines it into the loop over the
// points, where a function's name would be called through its address at every point (2x slower).
constexpr auto laplacian = [](const ts::StencilView<double, 3>& v) {
  return 6 * v(0, 0, 0) - v(-1, 0, 0) - v(1, 0, 0) - v(0, -1, 0) - v(0, 1, 0) - v(0, 0, -1) - v(0, 0, 1);
};

// ---- tshard, as written and through the library's solver ----
struct TshardCg {
  M mesh;
  Field b, x;
  Index n;
  int iterations;
  double residual = 0;
  TshardCg(const std::array<int, 3>& dims, Index n_, int iters)
      : mesh(dims),
        b(ts::from_function<double, Grid>(mesh, {n_, n_, n_}, [n_](auto i) { return source(i[0], i[1], i[2], n_); })),
        x(ts::zeros<double, Grid>(mesh, {n_, n_, n_})),
        n(n_),
        iterations(iters) {}

  void written() {
    auto dot = [](const Field& a, const Field& c) { return ts::sum<0, 1, 2>(a * c).gather()(); };
    x = ts::zeros<double, Grid>(mesh, {n, n, n});
    Field r = b, p = b;
    double rr = dot(r, r);
    for (int it = 0; it < iterations; ++it) {
      const Field q = ts::stencil(p, {1, 1, 1}, ts::Boundary::Zero, laplacian);
      const double alpha = rr / dot(p, q);
      x += alpha * p;
      r -= alpha * q;
      const double next = dot(r, r);
      p = r + (next / rr) * p;
      rr = next;
    }
    residual = std::sqrt(rr);
  }

  void library() {
    x = ts::zeros<double, Grid>(mesh, {n, n, n});
    ts::solvers::Options o;
    o.rtol = 0;
    o.max_iterations = iterations;
    auto A = [](const Field& v) { return ts::stencil(v, {1, 1, 1}, ts::Boundary::Zero, laplacian); };
    residual = ts::solvers::cg(A, b, x, o).residual;
  }
};

// ---- hand-written MPI ----
struct HandCg {
  MPI_Comm cart = MPI_COMM_NULL;
  std::array<Index, 3> local{}, offset{}, ext{};  // owned points, where they start, ghosted extents
  std::array<int, 3> low{}, high{};               // neighbours (MPI_PROC_NULL at the edges)
  std::array<MPI_Datatype, 3> send_low{MPI_DATATYPE_NULL, MPI_DATATYPE_NULL, MPI_DATATYPE_NULL}, send_high = send_low,
                              recv_low = send_low, recv_high = send_low;
  std::vector<double> x, r, p, q, b;
  int iterations;
  double residual = 0;

  HandCg(const std::array<int, 3>& dims, Index n, int iters) : iterations(iters) {
    int d[3] = {dims[0], dims[1], dims[2]}, periods[3] = {0, 0, 0}, coords[3];
    MPI_Cart_create(MPI_COMM_WORLD, 3, d, periods, 0, &cart);
    int me = 0;
    MPI_Comm_rank(cart, &me);
    MPI_Cart_coords(cart, me, 3, coords);
    for (int a = 0; a < 3; ++a) {
      const tshard_bench::Split s{n, dims[std::size_t(a)]};
      local[std::size_t(a)] = s.valid(coords[a]);
      offset[std::size_t(a)] = s.offset(coords[a]);
      ext[std::size_t(a)] = local[std::size_t(a)] + 2;
      MPI_Cart_shift(cart, a, 1, &low[std::size_t(a)], &high[std::size_t(a)]);
      // A neighbour with an empty block (the last ones, where n does not divide) sends nothing.
      if (s.valid(coords[a] + 1) == 0) high[std::size_t(a)] = MPI_PROC_NULL;
    }
    // A face of the ghosted block as a subarray type (C order: the dims reversed, x fastest).
    auto face = [&](int a, Index at) {
      int sizes[3], sub[3], start[3];
      for (int k = 0; k < 3; ++k) {
        const int c = 2 - k;  // C's dim k is our dim 2 - k
        sizes[k] = int(ext[std::size_t(c)]);
        sub[k] = c == a ? 1 : int(local[std::size_t(c)]);
        start[k] = c == a ? int(at) : 1;
      }
      MPI_Datatype t;
      MPI_Type_create_subarray(3, sizes, sub, start, MPI_ORDER_C, MPI_DOUBLE, &t);
      MPI_Type_commit(&t);
      return t;
    };
    for (int a = 0; a < 3 && !empty(); ++a) {
      const Index l = local[std::size_t(a)];
      send_low[std::size_t(a)] = face(a, 1);
      send_high[std::size_t(a)] = face(a, l);
      recv_low[std::size_t(a)] = face(a, 0);
      recv_high[std::size_t(a)] = face(a, l + 1);
    }
    const std::size_t size = std::size_t(ext[0] * ext[1] * ext[2]);
    for (auto* v : {&x, &r, &p, &q, &b}) v->assign(size, 0.0);
    each([&](std::size_t c, Index i, Index j, Index k) {
      b[c] = source(offset[0] + i, offset[1] + j, offset[2] + k, n);
    });
  }
  ~HandCg() {
    for (auto* types : {&send_low, &send_high, &recv_low, &recv_high})
      for (auto& t : *types)
        if (t != MPI_DATATYPE_NULL) MPI_Type_free(&t);
    MPI_Comm_free(&cart);
  }
  bool empty() const { return local[0] == 0 || local[1] == 0 || local[2] == 0; }

  // f(linear index, i, j, k) over the owned points, x fastest.
  template <class F>
  void each(F&& f) const {
    for (Index k = 0; k < local[2]; ++k)
      for (Index j = 0; j < local[1]; ++j) {
        const std::size_t row = std::size_t(1 + ext[0] * ((j + 1) + ext[1] * (k + 1)));
        for (Index i = 0; i < local[0]; ++i) f(row + std::size_t(i), i, j, k);
      }
  }
  double all_sum(double v) const {
    double s = 0;
    MPI_Allreduce(&v, &s, 1, MPI_DOUBLE, MPI_SUM, cart);
    return s;
  }
  void exchange(std::vector<double>& v) {
    if (empty()) return;  // (an empty block sends nothing; its neighbours' ghosts stay zero)
    for (int a = 0; a < 3; ++a) {
      MPI_Sendrecv(v.data(), 1, send_high[std::size_t(a)], high[std::size_t(a)], a, v.data(), 1, recv_low[std::size_t(a)],
                   low[std::size_t(a)], a, cart, MPI_STATUS_IGNORE);
      MPI_Sendrecv(v.data(), 1, send_low[std::size_t(a)], low[std::size_t(a)], 3 + a, v.data(), 1,
                   recv_high[std::size_t(a)], high[std::size_t(a)], 3 + a, cart, MPI_STATUS_IGNORE);
    }
  }

  void run() {
    std::fill(x.begin(), x.end(), 0.0);
    double rr = 0;
    each([&](std::size_t c, Index, Index, Index) {
      r[c] = p[c] = b[c];
      rr += r[c] * r[c];
    });
    rr = all_sum(rr);
    const std::size_t sx = std::size_t(ext[0]), sxy = std::size_t(ext[0] * ext[1]);
    for (int it = 0; it < iterations; ++it) {
      exchange(p);
      double pq = 0;
      each([&](std::size_t c, Index, Index, Index) {
        q[c] = 6 * p[c] - p[c - 1] - p[c + 1] - p[c - sx] - p[c + sx] - p[c - sxy] - p[c + sxy];
        pq += p[c] * q[c];
      });
      const double alpha = rr / all_sum(pq);
      double next = 0;
      each([&](std::size_t c, Index, Index, Index) {
        x[c] += alpha * p[c];
        r[c] -= alpha * q[c];
        next += r[c] * r[c];
      });
      next = all_sum(next);
      const double beta = next / rr;
      each([&](std::size_t c, Index, Index, Index) { p[c] = r[c] + beta * p[c]; });
      rr = next;
    }
    residual = std::sqrt(rr);
  }
};

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  const int ranks = tshard_bench::world_size(), rank = tshard_bench::world_rank();
  using tshard_bench::arg;
  const Index n = arg(argc, argv, "--n", 128);
  const int iters = int(arg(argc, argv, "--iters", 40)), rounds = int(arg(argc, argv, "--rounds", 5));
  std::array<int, 3> dims{0, 0, 0};
  for (int a = 1; a + 1 < argc; ++a)
    if (std::strcmp(argv[a], "--mesh") == 0 && std::sscanf(argv[a + 1], "%d,%d,%d", &dims[0], &dims[1], &dims[2]) != 3) {
      if (rank == 0) std::fprintf(stderr, "tshard_bench_cg: --mesh is px,py,pz (e.g. 1,1,2)\n");
      return 2;
    }
  const bool given = dims[0] > 0 && dims[1] > 0 && dims[2] > 0;
  if (!given) MPI_Dims_create(ranks, 3, dims.data());
  if (dims[0] * dims[1] * dims[2] != ranks) {
    if (rank == 0) std::fprintf(stderr, "tshard_bench_cg: --mesh %d,%d,%d is not %d ranks\n", dims[0], dims[1], dims[2], ranks);
    return 2;
  }

  ts::implicit_communication() = ts::ImplicitCommunication::Forbid;
  TshardCg tshard_cg(dims, n, iters);
  HandCg hand(dims, n, iters);
  const std::vector<double> t =
      tshard_bench::interleaved({[&] { tshard_cg.written(); }, [&] { hand.run(); }, [&] { tshard_cg.library(); }}, rounds, 1);
  // The residuals of the last runs: one rank's numbers up to the order of summation.
  tshard_cg.written();
  const double written = tshard_cg.residual;
  tshard_cg.library();
  const double library = tshard_cg.residual, by_hand = hand.residual;
  auto close = [&](double a) { return std::abs(a - by_hand) <= 1e-9 * std::abs(by_hand); };
  const bool ok = close(written) && close(library);

  if (rank == 0) {
    std::printf("CG on the 7-point Laplacian, %ld^3 doubles over %dx%dx%d ranks, %d iterations, median of %d: %s\n",
                long(n), dims[0], dims[1], dims[2], iters, rounds, ts::kernels_report().c_str());
    const double h = t[1] / iters;
    std::printf("  hand-written MPI   %8.3f ms/iteration\n", 1e3 * h);
    std::printf("  tshard as written  %8.3f ms/iteration  %.2fx hand\n", 1e3 * t[0] / iters, t[0] / t[1]);
    std::printf("  ts::solvers::cg    %8.3f ms/iteration  %.2fx hand\n", 1e3 * t[2] / iters, t[2] / t[1]);
    std::printf("residual after %d iterations: hand %.12e, written %.12e, cg %.12e: %s\n", iters, by_hand, written,
                library, ok ? "equal to 1e-9" : "DIFFERENT");
  }
  return tshard_bench::all_ranks(ok) ? 0 : 1;
}
