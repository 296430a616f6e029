// Must not compile: a spec of the wrong rank for the tensor
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  Eigen::Tensor<float, 2> g(4, 4);
  g.setZero();
  auto t = ts::distribute<ts::Spec<ts::S<"x">>>(mesh, g);
}
