// A user's program with the component hdf5: .npy and HDF5 round trips through the installed
// headers (tshard.hpp brings io/hdf5.hpp with tshard::hdf5). Exits non-zero on a mismatch.
#include <tshard/tshard.hpp>

#include <cstdio>

namespace ts = tshard;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  using M = ts::Mesh<"x">;
  M mesh({-1});
  auto x = ts::from_function<double, ts::Spec<ts::S<"x">, ts::R>>(mesh, {7, 3}, [](auto i) { return double(10 * i[0] + i[1]); });
  ts::io::save_npy("consumer_io.npy", x);
  ts::io::save("consumer_io.h5", "group/x", x);
  const auto a = ts::io::load_npy<double, ts::Spec<ts::R, ts::S<"x">>>(mesh, "consumer_io.npy").gather();
  const auto b = ts::io::load<double, ts::Spec<ts::R, ts::R>>(mesh, "consumer_io.h5", "group/x").gather();
  const auto want = x.gather();
  bool ok = true;
  for (Eigen::Index i = 0; i < want.size(); ++i) ok &= a.data()[i] == want.data()[i] && b.data()[i] == want.data()[i];
  ok = ts::agree(ok);
  if (mesh.rank() == 0) {
    std::printf("consumer_io: %s\n", ok ? "ok" : "MISMATCH");
    std::remove("consumer_io.npy");
    std::remove("consumer_io.h5");
  }
  return ok ? 0 : 1;
}
