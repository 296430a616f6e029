// Must not compile: asking a mesh for the size of an axis it lacks
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  Eigen::Tensor<float, 2> g(4, 4);
  g.setZero();
  return mesh.size<"z">();
}
