// A consumer of tshard: the public names only, checked against the serial value.
#include <tshard/tshard.hpp>

#include <cstdio>

namespace ts = tshard;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  using M = ts::Mesh<"data", "model">;
  M mesh({-1, 1});
  Eigen::Tensor<double, 2> global(7, 5);
  for (Eigen::Index i = 0; i < global.size(); ++i) global.data()[i] = double(i);
  auto x = ts::distribute<ts::Spec<ts::S<"data">, ts::R>>(mesh, global);
  auto y = ts::reshard<ts::Spec<ts::R, ts::S<"data">>>(x);
  Eigen::Tensor<double, 2> back = y.gather();
  bool ok = true;
  for (Eigen::Index i = 0; i < global.size(); ++i) ok &= back.data()[i] == global.data()[i];
  ok = ts::agree(ok);
#ifdef TSHARD_USE_BLAS
  const char* blas = "with BLAS";
#else
  const char* blas = "without BLAS";
#endif
  if (mesh.rank() == 0) std::printf("tshard %s consumer (%s): %s\n", TSHARD_VERSION_STRING, blas, ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
