// The 3-D Poisson equation -laplace(u) = f on an nx x ny x nz grid (zero beyond it), solved by
// conjugate gradients with the 7-point operator as a ts::stencil, the grid split over a 3-D mesh.
// The solver and its scalars are the library's (ts::solvers::cg, ts::dot); the program is what a
// user of PETSc's DMDA and KSPCG writes.
//
//   mpirun -np 4 ./poisson_cg --n 64 [--mesh x=2,y=2,z=1] [--solver cg|bicgstab|gmres] [--jacobi] [--check]
//
// --check (on by default up to 40^3) has rank 0 solve the same system with a plain serial CG
// over loops and compare the iteration count and the solution; the program exits non-zero when
// they differ.
#include <tshard/hpc.hpp>
#include <tshard/train/flags.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace ts = tshard;

namespace {

using M = ts::Mesh<"x", "y", "z">;
using Grid = ts::Spec<ts::S<"x">, ts::S<"y">, ts::S<"z">>;
using Field = ts::ShardedTensor<double, M, Grid>;
using Index = Eigen::Index;

struct Options {
  Index nx = 48, ny = 40, nz = 36;
  double rtol = 1e-8;
  int max_iterations = 2000;
  std::string solver = "cg";
  bool jacobi = false, check = false, no_check = false;
  ts::train::MeshSizes<M> mesh;
};

// The source: a smooth bump, a function of the global index only.
double source(Index i, Index j, Index k, const Options& o) {
  const double x = (double(i) + 1) / double(o.nx + 1), y = (double(j) + 1) / double(o.ny + 1),
               z = (double(k) + 1) / double(o.nz + 1);
  return std::sin(M_PI * x) * std::sin(2 * M_PI * y) * (1 + z);
}

// The 7-point negative Laplacian at one point.
// A lambda rather than a function: ts::stencil gets its type and inlines it into the loop over the
// points, where a function's name would be called through its address at every point (2x slower).
constexpr auto laplacian = [](const ts::StencilView<double, 3>& v) {
  return 6 * v(0, 0, 0) - v(-1, 0, 0) - v(1, 0, 0) - v(0, -1, 0) - v(0, 1, 0) - v(0, 0, -1) - v(0, 0, 1);
};

// The same solve on one rank with plain loops over a zero-ghosted array: the serial reference.
struct SerialSolve {
  std::vector<double> x;
  int iterations = 0;
};
SerialSolve serial_cg(const Options& o) {
  const Index sx = o.nx + 2, sy = o.ny + 2, n = sx * sy * (o.nz + 2);
  auto at = [&](Index i, Index j, Index k) { return (i + 1) + sx * ((j + 1) + sy * (k + 1)); };
  std::vector<double> x(std::size_t(n), 0.0), r(std::size_t(n), 0.0), p(std::size_t(n), 0.0), q(std::size_t(n), 0.0);
  auto each = [&](auto&& f) {
    for (Index k = 0; k < o.nz; ++k)
      for (Index j = 0; j < o.ny; ++j)
        for (Index i = 0; i < o.nx; ++i) f(at(i, j, k), i, j, k);
  };
  double rr = 0, bb = 0;
  each([&](Index c, Index i, Index j, Index k) {
    r[std::size_t(c)] = p[std::size_t(c)] = source(i, j, k, o);
    rr += r[std::size_t(c)] * r[std::size_t(c)];
  });
  bb = rr;
  SerialSolve s;
  while (std::sqrt(rr) > o.rtol * std::sqrt(bb) && s.iterations < o.max_iterations) {
    double pq = 0;
    each([&](Index c, Index, Index, Index) {
      const std::size_t u = std::size_t(c);
      q[u] = 6 * p[u] - p[u - 1] - p[u + 1] - p[u - std::size_t(sx)] - p[u + std::size_t(sx)] -
             p[u - std::size_t(sx * sy)] - p[u + std::size_t(sx * sy)];
      pq += p[u] * q[u];
    });
    const double alpha = rr / pq;
    double next = 0;
    each([&](Index c, Index, Index, Index) {
      x[std::size_t(c)] += alpha * p[std::size_t(c)];
      r[std::size_t(c)] -= alpha * q[std::size_t(c)];
      next += r[std::size_t(c)] * r[std::size_t(c)];
    });
    each([&](Index c, Index, Index, Index) { p[std::size_t(c)] = r[std::size_t(c)] + next / rr * p[std::size_t(c)]; });
    rr = next;
    ++s.iterations;
  }
  s.x.resize(std::size_t(o.nx * o.ny * o.nz));
  each([&](Index c, Index i, Index j, Index k) { s.x[std::size_t(i + o.nx * (j + o.ny * k))] = x[std::size_t(c)]; });
  return s;
}

int run(const Options& o) {
  // Without --mesh, the ranks are spread over the three dims as evenly as they factor.
  const M mesh = o.mesh.given ? M(o.mesh.resolve("poisson_cg", ts::Environment::world_size())) : M({-1, -1, -1});
  const Field f = ts::from_function<double, Grid>(mesh, {o.nx, o.ny, o.nz}, [&](auto i) { return source(i[0], i[1], i[2], o); });
  Field u = ts::zeros<double, Grid>(mesh, {o.nx, o.ny, o.nz});
  auto A = [](const Field& v) { return ts::stencil(v, {1, 1, 1}, ts::Boundary::Zero, laplacian); };

  ts::solvers::Options so;
  so.rtol = o.rtol;
  so.max_iterations = o.max_iterations;
  const bool root = mesh.rank() == 0;
  so.monitor = [&](int it, double r) {
    if (root && it % 50 == 0) std::printf("iteration %d residual %.6e\n", it, r);
  };
  const auto t0 = ts::Clock::now();
  ts::solvers::Result res;
  const Field diagonal = ts::from_function<double, Grid>(mesh, {o.nx, o.ny, o.nz}, [](auto) { return 6.0; });
  auto solve = [&](auto&& pre) {
    if (o.solver == "cg") return ts::solvers::cg(A, f, u, so, pre);
    if (o.solver == "bicgstab") return ts::solvers::bicgstab(A, f, u, so, pre);
    return ts::solvers::gmres(A, f, u, so, pre);
  };
  res = o.jacobi ? solve(ts::solvers::jacobi(diagonal)) : solve(ts::solvers::Identity{});
  const double seconds = std::chrono::duration<double>(ts::Clock::now() - t0).count();
  if (root)
    std::printf("poisson_cg %ldx%ldx%ld on %dx%dx%d ranks: %s%s, %d iterations, residual %.6e (%s), %.3f ms/iteration\n",
                long(o.nx), long(o.ny), long(o.nz), mesh.size<"x">(), mesh.size<"y">(), mesh.size<"z">(), o.solver.c_str(), o.jacobi ? "+jacobi" : "",
                res.iterations, res.residual, res.reason.c_str(), 1e3 * seconds / std::max(1, res.iterations));

  const Eigen::Tensor<double, 3> x = u.gather(0);
  bool ok = res.converged;
  const bool check = o.check || (!o.no_check && o.nx * o.ny * o.nz <= 40 * 40 * 40);
  if (root && check && o.solver == "cg" && !o.jacobi) {
    const SerialSolve serial = serial_cg(o);
    double diff = 0, scale = 0;
    for (Index n = 0; n < x.size(); ++n) {
      diff = std::max(diff, std::abs(x.data()[n] - serial.x[std::size_t(n)]));
      scale = std::max(scale, std::abs(serial.x[std::size_t(n)]));
    }
    const bool same = serial.iterations == res.iterations && diff <= 1e-9 * scale;
    std::printf("serial check: %s (serial CG %d iterations, max |u - u_serial| %.3e of max |u| %.3e)\n",
                same ? "equal" : "DIFFERENT", serial.iterations, diff, scale);
    ok = ok && same;
  }
  return ts::agree(ok) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Options o;
  try {
    Index n = 0;
    ts::train::Flags flags("poisson_cg", argc, argv);
    flags.value("--n", n).value("--nx", o.nx).value("--ny", o.ny).value("--nz", o.nz).value("--rtol", o.rtol);
    flags.value("--max-iterations", o.max_iterations).value("--solver", o.solver).flag("--jacobi", o.jacobi);
    flags.flag("--check", o.check).flag("--no-check", o.no_check).mesh<M>("--mesh", o.mesh).parse();
    if (n > 0) o.nx = o.ny = o.nz = n;
    if (o.solver != "cg" && o.solver != "bicgstab" && o.solver != "gmres")
      throw ts::train::UsageError("poisson_cg: --solver is cg, bicgstab or gmres, not " + o.solver);
  } catch (const ts::train::UsageError& e) {
    return ts::train::Flags::report(e);
  }
  return run(o);
}
