// This machine's sgemm rate in flop/s (n = 384, one core, the best of 20 products, by the host's
// clock): what scripts/simulate.sh gives SMPI as smpi/host-speed, so that a computation that takes
// t seconds here is t x this rate flops on the simulated machine, and a core of the platform that
// runs sgemm at F flop/s takes t x this rate / F simulated seconds for it. It is the rate the
// examples' MFU divides by (ts::train::gemm_rate, the same product), so a simulated example's
// peak comes out as the platform core's.
#include <tshard/tshard.hpp>

#include <chrono>
#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  tshard::Environment env(argc, argv);
  const int n = 384;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int i = 0; i < n * n; ++i) a[i] = float(i % 7) / 7, b[i] = float(i % 5) / 5;
  double best = 1e30;
  for (int r = 0; r < 20; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    tshard::detail::gemm<float>(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::printf("%.6g\n", 2.0 * n * n * n / best);
}
