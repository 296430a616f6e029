// Must not compile: an axis both split and partial
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  Eigen::Tensor<float, 2> g(4, 4);
  g.setZero();
  ts::ShardedTensor<float, ts::Mesh<"x", "y">, ts::Spec<ts::S<"x">, ts::R>, ts::PartialSum<"x">>* p = nullptr;
  return p->mesh().rank();
}
