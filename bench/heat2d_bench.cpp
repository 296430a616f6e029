// Heat-equation benchmark: one explicit 5-point step of an n x n double grid split by columns
// over the ranks, per iteration, for
//   tshard  HaloExchange on extended blocks: start(u), apply_inner, finish(), apply_outer, swap;
//   hand    ghosted arrays allocated once, MPI_Sendrecv of the two contiguous ghost columns
//           (MPI_PROC_NULL at the edges), then the update loop: how one writes it by hand;
//   petsc   (only where PETSc was found at configure time) DMDA, DMDA_STENCIL_BOX of width 1,
//           DM_BOUNDARY_GHOSTED with zero ghosts, DMGlobalToLocalBegin/End around the inner
//           update, DMDAVecGetArray loops: PETSc's standard way.
// Variants run interleaved, alternating which goes first; a sample is the slowest rank's time
// per iteration over --iters iterations after a barrier; the figure is the median of --rounds
// samples. Goal: tshard <= 1.03x hand.
//
//   mpirun -np 2 build/bench/tshard_bench_heat2d --n 4096 --iters 20 --rounds 7
#include <mpi.h>

#include <tshard/tshard.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.hpp"

#ifdef TSHARD_BENCH_WITH_PETSC
#include <petscdmda.h>
#endif

namespace ts = tshard;
using Index = Eigen::Index;

namespace {

constexpr double kRate = 0.2;

double initial(Index i, Index j, Index n) {
  const double x = (double(i) + 0.5) / double(n), y = (double(j) + 0.5) / double(n);
  return (x - 0.35) * (x - 0.35) + (y - 0.6) * (y - 0.6) < 0.04 ? 1.0 : 0.25;
}

using tshard_bench::arg;
using tshard_bench::max_over_ranks;
using tshard_bench::median;

// ---- tshard ----
struct TshardHeat {
  using M = ts::Mesh<"x", "y">;
  using Grid = ts::Spec<ts::S<"x">, ts::S<"y">>;
  M mesh;
  ts::ShardedTensor<double, M, Grid> field;
  ts::HaloExchange<double, 2> plan;
  Eigen::Tensor<double, 2> u, v;

  TshardHeat(int p, Index n)
      : mesh({1, p}),
        field(ts::from_function<double, Grid>(mesh, {n, n}, [n](auto i) { return initial(i[0], i[1], n); })),
        plan(field, {1, 1}, ts::Boundary::Zero) {
    u = plan.make_extended();
    v = plan.make_extended();
    plan.load_interior(field, u);
  }
  void step() {
    auto kernel = [](const ts::StencilView<double, 2>& w) {
      return w(0, 0) + kRate * (w(-1, 0) + w(1, 0) + w(0, -1) + w(0, 1) - 4.0 * w(0, 0));
    };
    plan.start(u);
    plan.apply_inner(u, v, kernel);
    plan.finish();
    plan.apply_outer(u, v, kernel);
    std::swap(u, v);
  }
  // The valid block, column-major nx x nyl.
  std::vector<double> block() {
    plan.store_interior(u, field);
    const auto s = field.local_shape(), pad = field.padded_shape();
    std::vector<double> out(std::size_t(s[0] * s[1]));
    for (Index j = 0; j < s[1]; ++j)
      for (Index i = 0; i < s[0]; ++i) out[std::size_t(i + s[0] * j)] = field.data()[i + pad[0] * j];
    return out;
  }
};

// ---- hand-written MPI ----
struct HandHeat {
  Index nx, nyl, ld;
  std::vector<double> u, v;
  int left, right;
  MPI_Comm comm;

  HandHeat(MPI_Comm c, Index n) : comm(c) {
    int p, r;
    MPI_Comm_size(comm, &p);
    MPI_Comm_rank(comm, &r);
    // The same column split as tshard's (ceil(n/p) per rank, the last ones shorter).
    const tshard_bench::Split split{n, p};
    nx = n;
    nyl = split.valid(r);
    const Index off = split.offset(r);
    ld = nx + 2;
    u.assign(std::size_t(ld * (nyl + 2)), 0.0);
    v = u;
    for (Index j = 0; j < nyl; ++j)
      for (Index i = 0; i < nx; ++i) u[std::size_t(i + 1 + ld * (j + 1))] = initial(i, off + j, n);
    left = r > 0 && nyl > 0 ? r - 1 : MPI_PROC_NULL;
    right = r + 1 < p && split.valid(r + 1) > 0 && nyl > 0 ? r + 1 : MPI_PROC_NULL;
  }
  void step() {
    double* a = u.data();
    MPI_Sendrecv(a + ld * 1, int(ld), MPI_DOUBLE, left, 0, a + ld * (nyl + 1), int(ld), MPI_DOUBLE, right, 0, comm,
                 MPI_STATUS_IGNORE);
    MPI_Sendrecv(a + ld * nyl, int(ld), MPI_DOUBLE, right, 1, a, int(ld), MPI_DOUBLE, left, 1, comm, MPI_STATUS_IGNORE);
    double* b = v.data();
    for (Index j = 1; j <= nyl; ++j) {
      const double* c = a + ld * j;
      double* o = b + ld * j;
      for (Index i = 1; i <= nx; ++i)
        o[i] = c[i] + kRate * (c[i - 1] + c[i + 1] + c[i - ld] + c[i + ld] - 4.0 * c[i]);
    }
    std::swap(u, v);
  }
  std::vector<double> block() const {
    std::vector<double> out(std::size_t(nx * nyl));
    for (Index j = 0; j < nyl; ++j)
      for (Index i = 0; i < nx; ++i) out[std::size_t(i + nx * j)] = u[std::size_t(i + 1 + ld * (j + 1))];
    return out;
  }
};

#ifdef TSHARD_BENCH_WITH_PETSC
// ---- PETSc DMDA ----
struct PetscHeat {
  DM da;
  Vec g, gnew, l;
  PetscInt xs, ys, xm, ym;

  PetscHeat(Index n, int p) {
    // x is PETSc's fastest index, as dim 0 is tshard's; split the y (column) direction only.
    DMDACreate2d(PETSC_COMM_WORLD, DM_BOUNDARY_GHOSTED, DM_BOUNDARY_GHOSTED, DMDA_STENCIL_BOX, PetscInt(n),
                 PetscInt(n), 1, p, 1, 1, nullptr, nullptr, &da);
    DMSetUp(da);
    DMCreateGlobalVector(da, &g);
    VecDuplicate(g, &gnew);
    DMCreateLocalVector(da, &l);
    VecSet(l, 0.0);  // ghosts outside the domain stay zero: Boundary::Zero
    DMDAGetCorners(da, &xs, &ys, nullptr, &xm, &ym, nullptr);
    PetscScalar** a;
    DMDAVecGetArray(da, g, &a);
    for (PetscInt j = ys; j < ys + ym; ++j)
      for (PetscInt i = xs; i < xs + xm; ++i) a[j][i] = initial(i, j, n);
    DMDAVecRestoreArray(da, g, &a);
  }
  ~PetscHeat() {
    VecDestroy(&l);
    VecDestroy(&gnew);
    VecDestroy(&g);
    DMDestroy(&da);
  }
  static double point(const PetscScalar* const* u, PetscInt j, PetscInt i) {
    return u[j][i] + kRate * (u[j][i - 1] + u[j][i + 1] + u[j - 1][i] + u[j + 1][i] - 4.0 * u[j][i]);
  }
  void step() {
    PetscScalar** w;
    DMDAVecGetArray(da, gnew, &w);
    // The points whose neighbours are all owned, from the global vector, while the ghosts move.
    DMGlobalToLocalBegin(da, g, INSERT_VALUES, l);
    const PetscScalar** ug;
    DMDAVecGetArrayRead(da, g, &ug);
    for (PetscInt j = ys + 1; j < ys + ym - 1; ++j)
      for (PetscInt i = xs + 1; i < xs + xm - 1; ++i) w[j][i] = point(ug, j, i);
    DMDAVecRestoreArrayRead(da, g, &ug);
    DMGlobalToLocalEnd(da, g, INSERT_VALUES, l);
    // The rim of the block, from the local (ghosted) vector.
    const PetscScalar** u;
    DMDAVecGetArrayRead(da, l, &u);
    for (PetscInt j = ys; j < ys + ym; ++j) {
      const bool edge = j == ys || j == ys + ym - 1;
      for (PetscInt i = xs; i < xs + xm; i += (edge || xm < 2) ? 1 : xm - 1) w[j][i] = point(u, j, i);
    }
    DMDAVecRestoreArrayRead(da, l, &u);
    DMDAVecRestoreArray(da, gnew, &w);
    std::swap(g, gnew);  // the handles, not the values
  }
  std::vector<double> block() {
    std::vector<double> out(std::size_t(xm * ym));
    const PetscScalar** a;
    DMDAVecGetArrayRead(da, g, &a);
    for (PetscInt j = 0; j < ym; ++j)
      for (PetscInt i = 0; i < xm; ++i) out[std::size_t(i + xm * j)] = a[ys + j][xs + i];
    DMDAVecRestoreArrayRead(da, g, &a);
    return out;
  }
};
#endif

// Slowest rank's seconds per iteration over `iters` steps.
template <class F>
double time_iters(F&& step, int iters) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  for (int k = 0; k < iters; ++k) step();
  return max_over_ranks((MPI_Wtime() - t0) / iters);
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (std::size_t k = 0; k < a.size(); ++k) m = std::max(m, std::abs(a[k] - b[k]));
  return max_over_ranks(m);
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
#ifdef TSHARD_BENCH_WITH_PETSC
  PetscInitialize(&argc, &argv, nullptr, nullptr);
#endif
  const Index n = arg(argc, argv, "--n", 4096);
  const int iters = int(arg(argc, argv, "--iters", 20));
  const int rounds = int(arg(argc, argv, "--rounds", 7));
  const int p = ts::Environment::world_size(), rank = ts::Environment::world_rank();

  {
    TshardHeat tshard_run(p, n);
    HandHeat hand_run(MPI_COMM_WORLD, n);
#ifdef TSHARD_BENCH_WITH_PETSC
    PetscHeat petsc_run(n, p);
#endif
    // Warm-up: first touch of every buffer and MPI's connection set-up.
    time_iters([&] { tshard_run.step(); }, 2);
    time_iters([&] { hand_run.step(); }, 2);
#ifdef TSHARD_BENCH_WITH_PETSC
    time_iters([&] { petsc_run.step(); }, 2);
#endif
    std::vector<double> t_tshard, t_hand, t_petsc;
    for (int r = 0; r < rounds; ++r) {
      auto one = [&](int which) {
        if (which == 0) t_tshard.push_back(time_iters([&] { tshard_run.step(); }, iters));
        if (which == 1) t_hand.push_back(time_iters([&] { hand_run.step(); }, iters));
#ifdef TSHARD_BENCH_WITH_PETSC
        if (which == 2) t_petsc.push_back(time_iters([&] { petsc_run.step(); }, iters));
#endif
      };
      for (int k = 0; k < 3; ++k) one((r + k) % 3);  // rotate which variant goes first
    }
    // Every variant took the same steps from the same start: the fields must agree.
    const double diff = max_diff(tshard_run.block(), hand_run.block());
    const double th = median(t_tshard), hh = median(t_hand);
    if (rank == 0) {
      std::printf("heat2d %ldx%ld doubles, %d ranks (columns split), %d rounds x %d iterations, median per iteration\n",
                  long(n), long(n), p, rounds, iters);
      std::printf("  tshard HaloExchange %8.3f ms\n", 1e3 * th);
      std::printf("  hand MPI_Sendrecv   %8.3f ms\n", 1e3 * hh);
#ifdef TSHARD_BENCH_WITH_PETSC
      std::printf("  PETSc DMDA          %8.3f ms\n", 1e3 * median(t_petsc));
#else
      std::printf("  PETSc DMDA          (not built: PETSc was not found at configure time)\n");
#endif
      std::printf("  ratio tshard / hand  = %.3f  (goal <= 1.03)\n", th / hh);
#ifdef TSHARD_BENCH_WITH_PETSC
      std::printf("  ratio PETSc / tshard = %.3f\n", median(t_petsc) / th);
#endif
      std::printf("  fields agree: max |tshard - hand| = %.3g\n", diff);
      std::printf("  reproduce: mpirun -np %d %s --n %ld --iters %d --rounds %d\n", p, argv[0], long(n), iters, rounds);
    }
#ifdef TSHARD_BENCH_WITH_PETSC
    const double pdiff = max_diff(tshard_run.block(), petsc_run.block());
    if (rank == 0) std::printf("  fields agree: max |tshard - PETSc| = %.3g\n", pdiff);
#endif
  }
#ifdef TSHARD_BENCH_WITH_PETSC
  PetscFinalize();
#endif
  return 0;
}
