// The explicit 2-D heat equation, u += r * (5-point Laplacian of u), zero outside the grid, on a
// grid split over a 2-D mesh of ranks. The fields live in extended blocks (ghost cells), and a
// HaloExchange exchanges their halos in place while the inner points are updated (start / finish).
// The final checksum is summed in global column-major order, so it equals the single-rank
// run's bit for bit: every point, inner or outer, goes through the one kernel heat_point.
//
//   mpirun -np 4 ./heat2d --nx 512 --ny 512 --steps 200 [--check]
//
// --check (on by default up to 256 x 256) has rank 0 recompute the run serially and compare
// the fields bit for bit; the program exits non-zero when they differ.
#include <tshard/tshard.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace ts = tshard;

namespace {

constexpr double kRate = 0.2;  // r = alpha * dt / h^2; stable below 0.25

// The one kernel of the whole program: the new value of a point from its 5-point window.
inline double heat_point(const ts::StencilView<double, 2>& v) {
  return v(0, 0) + kRate * (v(-1, 0) + v(1, 0) + v(0, -1) + v(0, 1) - 4.0 * v(0, 0));
}

// A hot disc and a cold stripe on a lukewarm grid: a function of the global index only.
double initial(Eigen::Index i, Eigen::Index j, Eigen::Index nx, Eigen::Index ny) {
  const double x = (double(i) + 0.5) / double(nx), y = (double(j) + 0.5) / double(ny);
  const double r2 = (x - 0.35) * (x - 0.35) + (y - 0.6) * (y - 0.6);
  double u = 0.25;
  if (r2 < 0.04) u = 1.0;
  if (x > 0.7 && x < 0.8) u = 0.0;
  return u;
}

// The sum of the global field in column-major order (a fixed order: the same on any mesh).
double checksum(const Eigen::Tensor<double, 2>& g) {
  double s = 0;
  for (Eigen::Index k = 0; k < g.size(); ++k) s += g.data()[k];
  return s;
}

// The same run on one rank: a ghosted (nx+2) x (ny+2) array with zero ghosts, the same kernel.
Eigen::Tensor<double, 2> serial_run(Eigen::Index nx, Eigen::Index ny, int steps) {
  Eigen::Tensor<double, 2> u(nx + 2, ny + 2), v(nx + 2, ny + 2);
  u.setZero();
  v.setZero();
  for (Eigen::Index j = 0; j < ny; ++j)
    for (Eigen::Index i = 0; i < nx; ++i) u(i + 1, j + 1) = initial(i, j, nx, ny);
  const std::array<Eigen::Index, 2> strides{1, nx + 2};
  for (int s = 0; s < steps; ++s) {
    for (Eigen::Index j = 1; j <= ny; ++j)
      for (Eigen::Index i = 1; i <= nx; ++i) v(i, j) = heat_point(ts::StencilView<double, 2>(&u(i, j), strides));
    std::swap(u, v);
  }
  Eigen::Tensor<double, 2> out(nx, ny);
  for (Eigen::Index j = 0; j < ny; ++j)
    for (Eigen::Index i = 0; i < nx; ++i) out(i, j) = u(i + 1, j + 1);
  return out;
}

long arg(int argc, char** argv, const char* name, long fallback) {
  for (int a = 1; a + 1 < argc; ++a)
    if (std::strcmp(argv[a], name) == 0) return std::atol(argv[a + 1]);
  return fallback;
}
bool flag(int argc, char** argv, const char* name) {
  for (int a = 1; a < argc; ++a)
    if (std::strcmp(argv[a], name) == 0) return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  const Eigen::Index n = arg(argc, argv, "--n", 128);
  const Eigen::Index nx = arg(argc, argv, "--nx", n), ny = arg(argc, argv, "--ny", n);
  const int steps = int(arg(argc, argv, "--steps", 100));
  const bool check = flag(argc, argv, "--check") || (nx * ny <= 256 * 256 && !flag(argc, argv, "--no-check"));

  // A near-square mesh: the larger factor on y, the dim whose halos are contiguous columns.
  const int p = ts::Environment::world_size();
  int px = 1;
  for (int d = 1; d * d <= p; ++d)
    if (p % d == 0) px = d;
  using M = ts::Mesh<"x", "y">;
  M mesh({px, p / px});
  if (mesh.rank() == 0) std::printf("%s\n", ts::kernels_report().c_str());  // which kernels run
  using Grid = ts::Spec<ts::S<"x">, ts::S<"y">>;

  auto u0 = ts::from_function<double, Grid>(mesh, {nx, ny}, [&](auto i) { return initial(i[0], i[1], nx, ny); });
  ts::HaloExchange<double, 2> plan(u0, {1, 1}, ts::Boundary::Zero);
  Eigen::Tensor<double, 2> u = plan.make_extended(), v = plan.make_extended();
  plan.load_interior(u0, u);

  // A lambda, not the function's address, so the kernel inlines into the point loops.
  const auto kernel = [](const ts::StencilView<double, 2>& w) { return heat_point(w); };
  const auto t0 = ts::Clock::now();
  const int report = std::max(1, steps / 5);
  for (int s = 1; s <= steps; ++s) {
    plan.start(u);                         // halos of u in flight...
    plan.apply_inner(u, v, kernel);    // ...while the points that need none are updated
    plan.finish();
    plan.apply_outer(u, v, kernel);    // then the points next to the halo
    std::swap(u, v);
    if (mesh.rank() == 0 && (s % report == 0 || s == steps)) {
      const double sec = std::chrono::duration<double>(ts::Clock::now() - t0).count();
      std::printf("step %d/%d  %.3f ms/step\n", s, steps, 1e3 * sec / s);
      std::fflush(stdout);
    }
  }

  plan.store_interior(u, u0);
  const Eigen::Tensor<double, 2> field = u0.gather(0);  // the global field on rank 0
  bool ok = true;
  if (mesh.rank() == 0) {
    const double sum = checksum(field);
    std::uint64_t bits = 0;
    std::memcpy(&bits, &sum, sizeof bits);
    std::printf("heat2d %ldx%ld, %d steps on %dx%d ranks: checksum %.17g (bits %016llx)\n", long(nx), long(ny), steps,
                px, p / px, sum, (unsigned long long)bits);
    if (check) {
      const Eigen::Tensor<double, 2> serial = serial_run(nx, ny, steps);
      const double serial_sum = checksum(serial);
      ok = std::memcmp(serial.data(), field.data(), sizeof(double) * std::size_t(field.size())) == 0 &&
           std::memcmp(&serial_sum, &sum, sizeof sum) == 0;
      std::printf("serial check: %s (serial checksum %.17g)\n", ok ? "bit-identical" : "DIFFERENT", serial_sum);
    }
  }
  ok = ts::agree(ok);
  return ok ? 0 : 1;
}
