// Must not compile: a spec using one axis on two dims
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  Eigen::Tensor<float, 2> g(4, 4);
  g.setZero();
  auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y", "x">>>(mesh, g);
}
