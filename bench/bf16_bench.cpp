// bfloat16 against float, side by side on the same values (interleaved, medians): a model-parallel
// MLP training step (column- then row-parallel product, tanh, the squared output summed; derived
// gradients; AdamW, float master weights for bfloat16), its bytes sent per step, an all-gather,
// and the local GEMM (which kernel a bfloat16 product runs here).
//   bash bench/run_bf16.sh [--B 256] [--D 1024] [--H 4096] [--n 1024] [--reps 7]
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tshard/tshard.hpp>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using tshard_bench::interleaved;
using M = ts::Mesh<"data", "model">;

template <class T>
struct MlpStep {
  ts::ShardedTensor<T, M, ts::Spec<ts::R, ts::R>> x;
  ts::ShardedTensor<T, M, ts::Spec<ts::R, ts::S<"model">>> w1, g1;
  ts::ShardedTensor<T, M, ts::Spec<ts::S<"model">, ts::R>> w2, g2;
  ts::nn::AdamW opt{{.lr = 1e-4}};
  MlpStep(const M& mesh, Eigen::Index b, Eigen::Index d, Eigen::Index h)
      : x(ts::random<T, ts::Spec<ts::R, ts::R>>(mesh, {b, d}, 1)),
        w1(ts::random<T, ts::Spec<ts::R, ts::S<"model">>>(mesh, {d, h}, 2)), g1(w1),
        w2(ts::random<T, ts::Spec<ts::S<"model">, ts::R>>(mesh, {h, d}, 3)), g2(w2) {
    opt.add(w1, g1);
    opt.add(w2, g2);
  }
  void run() {
    auto [loss, d1, d2] = ts::ad::value_and_grad(
        [&](const auto& a, const auto& b) {
          const auto y = ts::einsum<"bh,hd->bd">(ts::tanh(ts::einsum<"bd,dh->bh">(x, a)), b);
          return ts::sum<0, 1>(y * y);
        },
        w1, w2);
    g1 = d1;
    g2 = d2;
    opt.step();
  }
};

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Eigen::Index B = 256, D = 1024, H = 4096, n = 1024;
  int reps = 7;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const long v = std::atol(argv[i + 1]);
    if (a == "--B") B = v;
    else if (a == "--D") D = v;
    else if (a == "--H") H = v;
    else if (a == "--n") n = v;
    else if (a == "--reps") reps = int(std::max(1L, v));
  }
  const int p = tshard_bench::world_size(), r = tshard_bench::world_rank();
  const M mesh({1, p});
  if (r == 0)
    std::printf("bfloat16 against float on %d ranks, medians of %d interleaved runs; bfloat16 products: %s (%s)\n", p,
                reps, ts::detail::bf16_gemm_kernel(), tshard_bench::blas_kernels());
  {  // the MLP step: bytes per step, then time
    MlpStep<float> f(mesh, B, D, H);
    MlpStep<ts::bfloat16> h(mesh, B, D, H);
    ts::reset_comm_stats();
    f.run();
    const double bytes_f = double(ts::comm_stats().total().bytes_sent);
    ts::reset_comm_stats();
    h.run();
    const double bytes_h = double(ts::comm_stats().total().bytes_sent);
    const auto t = interleaved({[&] { f.run(); }, [&] { h.run(); }}, reps);
    const auto mf = f.opt.memory(), mh = h.opt.memory();
    if (r == 0) {
      std::printf("MLP step [%ld, %ld] x [%ld, %ld] (model=%d): float %.2f ms, bfloat16 %.2f ms (%.2fx); "
                  "bytes sent per rank %.0f and %.0f (%.2fx)\n",
                  long(B), long(D), long(D), long(H), p, 1e3 * t[0], 1e3 * t[1], t[0] / t[1], bytes_f / p, bytes_h / p,
                  bytes_h / bytes_f);
      std::printf("  memory per rank: parameters %.0f and %.0f KiB, gradients %.0f and %.0f KiB, optimizer state %.0f "
                  "and %.0f KiB (bfloat16's holds float master weights)\n",
                  mf.parameters / 1024.0, mh.parameters / 1024.0, mf.gradients / 1024.0, mh.gradients / 1024.0,
                  mf.state / 1024.0, mh.state / 1024.0);
    }
  }
  {  // an all-gather of a split vector
    const Eigen::Index len = B * D;
    auto af = ts::random<float, ts::Spec<ts::S<"model">>>(mesh, {len}, 4);
    auto ah = ts::random<ts::bfloat16, ts::Spec<ts::S<"model">>>(mesh, {len}, 4);
    const auto t = interleaved({[&] { (void)ts::reshard<ts::Spec<ts::R>>(af); },
                                [&] { (void)ts::reshard<ts::Spec<ts::R>>(ah); }},
                               reps);
    if (r == 0)
      std::printf("all-gather of %ld elements: float %.3f ms, bfloat16 %.3f ms (%.2fx)\n", long(len), 1e3 * t[0],
                  1e3 * t[1], t[0] / t[1]);
  }
  {  // the local GEMM, n x n x n
    std::vector<float> a(std::size_t(n * n), 0.5f), b(a), c(a);
    std::vector<ts::bfloat16> ah(a.size(), ts::bfloat16(0.5f)), bh(ah), ch(ah);
    const auto t = interleaved(
        {[&] { ts::detail::gemm<float>(false, false, n, n, n, a.data(), n, b.data(), n, c.data(), n); },
         [&] { ts::detail::gemm<ts::bfloat16>(false, false, n, n, n, ah.data(), n, bh.data(), n, ch.data(), n); }},
        reps);
    const double flops = 2.0 * double(n) * double(n) * double(n);
    if (r == 0)
      std::printf("GEMM %ld^3 on each rank: sgemm %.1f GFLOP/s, bfloat16 (%s) %.1f GFLOP/s\n", long(n),
                  flops / t[0] / 1e9, ts::detail::bf16_gemm_kernel(), flops / t[1] / 1e9);
  }
  return 0;
}
