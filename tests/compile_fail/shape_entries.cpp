// Must not compile: a braced shape with fewer entries than dims
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  Eigen::Tensor<float, 2> g(4, 4);
  g.setZero();
  auto t = ts::zeros<float, ts::Spec<ts::R, ts::S<"y">>>(mesh, {4});
}
