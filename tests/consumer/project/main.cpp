// A consumer of tshard: the public API v0 (README) as a user writes it, checked against the
// serial values on whatever rank count it runs with.
#include <tshard/tshard.hpp>

#include <cmath>
#include <cstdio>
#include <string>

namespace ts = tshard;

#if defined(TSHARD_CONSUMER_EXPECT_KERNELS) && !defined(TSHARD_PRECOMPILED_KERNELS)
#error "linking tshard::kernels must give TSHARD_PRECOMPILED_KERNELS (the kernels' extern declarations)"
#endif

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  const int p = ts::Environment::world_size();
  using M = ts::Mesh<"data", "model">;
  M mesh({-1, p % 2 == 0 ? 2 : 1});
  bool ok = mesh.size<"data">() * mesh.size<"model">() == p && ts::axis_size<"data">(mesh) == mesh.size<"data">();
  ok &= mesh.coord<"data">() * mesh.size<"model">() + mesh.coord<"model">() == mesh.rank();

  const Eigen::Index M_ = 7, K = 5, N = 6;
  Eigen::Tensor<float, 2> global(M_, K);
  for (Eigen::Index i = 0; i < global.size(); ++i) global.data()[i] = float(i % 11) - 3.0f;
  using X = ts::Spec<ts::S<"data">, ts::R>;
  ts::ShardedTensor<float, M, X> x = ts::distribute<X>(mesh, global);
  auto w = ts::from_function<float, ts::Spec<ts::R, ts::S<"model">>>(
      mesh, {K, N}, [](std::array<Eigen::Index, 2> i) { return float(i[0] - i[1]); });
  auto z = ts::zeros<float, X>(mesh, {M_, K});

  auto y = ts::matmul(x, w);
  static_assert(std::is_same_v<decltype(y)::SpecType, ts::Spec<ts::S<"data">, ts::S<"model">>>);
  auto y2 = ts::einsum<"ij,jk->ik">(x, w);
  auto s = ts::sum<1>(y);
  auto r = ts::reshard<ts::Spec<ts::R>>(s);
  Eigen::Tensor<float, 1> g = r.gather();
  auto e = ts::exp(x) * 2.0f + x;
  auto t = ts::transpose<1, 0>(x);
  Eigen::Tensor<float, 2> kernel(3, 3);
  kernel.setConstant(1.0f);
  auto h = ts::convolve(x, kernel, ts::Boundary::Zero);
  Eigen::Tensor<float, 2> ext = ts::with_halo(x, {1, 1}, ts::Boundary::Periodic);

  // Serial references.
  Eigen::Tensor<float, 2> gw = w.gather(), gy = y.gather(), gy2 = y2.gather(), ge = e.gather(), gt = t.gather(),
                          gh = h.gather(), gz = z.gather();
  for (Eigen::Index i = 0; i < M_; ++i) {
    float row = 0;
    for (Eigen::Index k = 0; k < N; ++k) {
      float v = 0;
      for (Eigen::Index j = 0; j < K; ++j) v += global(i, j) * float(j - k);
      ok &= std::abs(gy(i, k) - v) < 1e-3f && std::abs(gy2(i, k) - v) < 1e-3f;
      row += v;
    }
    ok &= std::abs(g(i) - row) < 1e-3f;
    for (Eigen::Index j = 0; j < K; ++j) {
      ok &= std::abs(ge(i, j) - (std::exp(global(i, j)) * 2.0f + global(i, j))) < 1e-3f * std::exp(global(i, j));
      ok &= gt(j, i) == global(i, j) && gz(i, j) == 0.0f;
      float c = 0;
      for (int di = -1; di <= 1; ++di)
        for (int dj = -1; dj <= 1; ++dj)
          if (i + di >= 0 && i + di < M_ && j + dj >= 0 && j + dj < K) c += global(i + di, j + dj);
      ok &= std::abs(gh(i, j) - c) < 1e-4f;
    }
  }
  // The halo-extended local block, with periodic wrap.
  const auto off = x.local_offset(), shape = x.local_shape();
  ok &= x.global_shape()[0] == M_ && x.local().dimension(1) == K;
  if (shape[0] > 0) {
    ok &= ext.dimension(0) == shape[0] + 2 && ext.dimension(1) == K + 2;
    for (Eigen::Index i = 0; i < ext.dimension(0); ++i)
      for (Eigen::Index j = 0; j < ext.dimension(1); ++j)
        ok &= ext(i, j) == global((off[0] + i - 1 + M_) % M_, (j - 1 + K) % K);
  }
  ok = ts::agree(ok);
#ifdef TSHARD_USE_BLAS
  const char* blas = "with BLAS";
#else
  const char* blas = "without BLAS";
#endif
  if (mesh.rank() == 0)
    std::printf("tshard %s consumer (%s) on %d ranks: %s\n", TSHARD_VERSION_STRING, blas, p, ok ? "ok" : "WRONG");
  // BLAS by default where found at configure; TSHARD_USE_BLAS=OFF gives Eigen's GEMM.
  const bool backend_ok = std::string(ts::local_gemm_backend()) == TSHARD_CONSUMER_EXPECT_BACKEND;
  if (!backend_ok && mesh.rank() == 0)
    std::printf("local products run on %s, expected %s\n", ts::local_gemm_backend(), TSHARD_CONSUMER_EXPECT_BACKEND);
  ok &= backend_ok;
  return ok ? 0 : 1;
}
