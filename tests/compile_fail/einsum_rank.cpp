// Must not compile: an einsum string whose operand rank differs from the tensor's
#include <tshard/tshard.hpp>
namespace ts = tshard;
int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto c = ts::einsum<"bij,jk->bik">(a, a);
}
