// Must not compile: halo widths with fewer entries than the tensor has dims
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  auto t = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto h = ts::with_halo(t, {1}, ts::Boundary::Zero);
}
