// Must not compile: a RowMajor global tensor
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  Eigen::Tensor<float, 2> g(4, 4);
  g.setZero();
  Eigen::Tensor<float, 2, Eigen::RowMajor> rm(4, 4);
  auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, rm);
}
