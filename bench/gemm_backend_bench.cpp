// One core's GEMM through the CBLAS it is linked with (BLIS or OpenBLAS: bench/CMakeLists.txt
// builds one binary each), float and double, on the shapes the examples' layers run: the figures
// behind TSHARD_BLAS's default (bench/run_gemm_backends.sh runs both libraries side by side).
//   tshard_bench_gemm_<library> [--tshard-kernels] [--reps 5] [--tiny]
// --tshard-kernels gives BLIS the kernels tshard gives it (ops/blas_kernels.hpp); without it the
// library chooses alone. Prints "<m> <n> <k>  sgemm <GFLOP/s>  dgemm <GFLOP/s>" per shape, the best
// of --reps timed calls after one untimed.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tshard/ops/blas_kernels.hpp"

namespace {

void product(int m, int n, int k, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0f, a, m, b, k, 0.0f, c, m);
}
void product(int m, int n, int k, const double* a, const double* b, double* c) {
  cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, a, m, b, k, 0.0, c, m);
}

template <class T>
double rate(int m, int n, int k, int reps) {
  std::vector<T> a(std::size_t(m) * k, T(0.5)), b(std::size_t(k) * n, T(0.25)), c(std::size_t(m) * n);
  product(m, n, k, a.data(), b.data(), c.data());
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    product(m, n, k, a.data(), b.data(), c.data());
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * m * n * k / best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  bool tshard_kernels = false, tiny = false;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--tshard-kernels")) tshard_kernels = true;
    else if (!std::strcmp(argv[i], "--tiny")) tiny = true;
    else if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) reps = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--tshard-kernels] [--reps 5] [--tiny]\n", argv[0]);
      return 2;
    }
  }
  if (tshard_kernels) tshard::detail::choose_blis_kernels();
  std::printf("%s\n", tshard::blas_report().c_str());
  // A square product, then the GPT's and the Llama's layers at the benchmarks' sizes: [rows, D] x
  // [D, 3D] (qkv), [rows, D] x [D, 4D] (MLP up), [rows, 4D] x [4D, D] (down), a weight gradient
  // [D, rows] x [rows, 4D], and D 256 at seq 2048.
  std::vector<std::array<int, 3>> shapes = {{2048, 2048, 2048}, {2048, 3072, 1024}, {2048, 4096, 1024},
                                            {2048, 1024, 4096}, {1024, 4096, 2048}, {2048, 768, 256},
                                            {2048, 256, 1024}};
  if (tiny) shapes = {{64, 48, 32}};
  for (const auto& s : shapes)
    std::printf("%5d %5d %5d  sgemm %6.1f  dgemm %6.1f\n", s[0], s[1], s[2], rate<float>(s[0], s[1], s[2], reps),
                rate<double>(s[0], s[1], s[2], reps));
  return 0;
}
