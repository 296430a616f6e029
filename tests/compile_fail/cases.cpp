// Programs that must not compile, one per CASE_<name> macro (tests/compile_fail/CMakeLists.txt
// builds each alone and checks that the compiler prints the static_assert sentence).
#include <tshard/tshard.hpp>
namespace ts = tshard;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  ts::Mesh<"x", "y"> mesh({1, -1});
  Eigen::Tensor<float, 2> g(4, 4);
  g.setZero();
#if defined(CASE_axis_twice)  // a spec using one axis on two dims
  auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y", "x">>>(mesh, g);
#elif defined(CASE_einsum_output)  // an einsum output index that is in neither operand
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto c = ts::einsum<"ij,jk->iz">(a, a);
#elif defined(CASE_einsum_rank)  // an einsum string whose operand rank differs from the tensor's
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto c = ts::einsum<"bij,jk->bik">(a, a);
#elif defined(CASE_einsum_repeat)  // an einsum operand that repeats an index
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto c = ts::einsum<"ii,ij->j">(a, a);
#elif defined(CASE_halo_widths)  // halo widths with fewer entries than the tensor has dims
  auto t = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto h = ts::with_halo(t, {1}, ts::Boundary::Zero);
#elif defined(CASE_matmul_rank)  // matmul of a rank-1 tensor
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto v = ts::zeros<float, ts::Spec<ts::R>>(mesh, {4});
  auto c = ts::matmul(a, v);
#elif defined(CASE_mask_arithmetic)  // arithmetic on a mask (a bool tensor)
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto m = (a > a) + 1.0f;
#elif defined(CASE_partial_inplace)  // an in-place operator on a partial max
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto p = ts::max<0>(a);
  p += ts::zeros<float, ts::Spec<ts::R>>(mesh, {4});
#elif defined(CASE_take_ids)  // take with floating-point ids
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto e = ts::take<0>(a, ts::zeros<float, ts::Spec<ts::R>>(mesh, {4}));
#elif defined(CASE_mesh_sizes)  // a mesh given fewer sizes than axes
  ts::Mesh<"a", "b"> m2({4});
#elif defined(CASE_reshard_rank)  // a reshard to a spec of another rank
  auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, g);
  auto r = ts::reshard<ts::Spec<ts::R>>(t);
#elif defined(CASE_row_major)  // a RowMajor global tensor
  Eigen::Tensor<float, 2, Eigen::RowMajor> rm(4, 4);
  auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, rm);
#elif defined(CASE_shape_entries)  // a braced shape with fewer entries than dims
  auto t = ts::zeros<float, ts::Spec<ts::R, ts::S<"y">>>(mesh, {4});
#elif defined(CASE_spec_rank)  // a spec of the wrong rank for the tensor
  auto t = ts::distribute<ts::Spec<ts::S<"x">>>(mesh, g);
#elif defined(CASE_split_and_partial)  // an axis both split and partial
  ts::ShardedTensor<float, ts::Mesh<"x", "y">, ts::Spec<ts::S<"x">, ts::R>, ts::PartialSum<"x">>* p = nullptr;
  return p->mesh().rank();
#elif defined(CASE_grad_not_scalar)  // a gradient of a function that returns a matrix
  auto w = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto r = ts::ad::value_and_grad([](const auto& v) { return v * 2.0f; }, w);
#elif defined(CASE_grad_of_ints)  // a gradient with respect to an integer tensor
  auto w = ts::zeros<std::int32_t, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto r = ts::ad::grad([](const auto& v) { return ts::sum<0, 1>(v); }, w);
#elif defined(CASE_spec_conversion)  // a tensor initialised from one of another spec
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, {4, 4});
  ts::ShardedTensor<float, ts::Mesh<"x", "y">, ts::Spec<ts::S<"x">, ts::R>> b = a;
#elif defined(CASE_spec_assignment)  // a loop whose body changes the spec of its variable
  auto x = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  for (int i = 0; i < 2; ++i) x = ts::transpose<1, 0>(x);
#elif defined(CASE_partial_assignment)  // a variable declared from a partial sum, given a resolved value
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, {4, 4});
  auto w = ts::zeros<float, ts::Spec<ts::S<"y">, ts::R>>(mesh, {4, 4});
  auto x = ts::einsum<"ab,bc->ac">(a, w);  // {x, R}, partial over y
  x = ts::reshard<ts::Spec<ts::S<"x">, ts::R>>(x);
#elif defined(CASE_softmax_dim)  // softmax over a dim the tensor lacks, then used
  auto x = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto p = ts::nn::softmax<2>(x);
  auto q = ts::sum<0>(p * x);
#elif defined(CASE_layer_mesh_axis)  // a layer whose default specs split over "model", on a mesh without it
  ts::nn::Attention<float, decltype(mesh)> attention(mesh, 8, 2, 1);
#elif defined(CASE_item_conversion)  // a full reduction assigned to a double
  auto u = ts::zeros<double, ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, {4, 4});
  double s = ts::sum<0, 1>(u);
  return int(s);
#elif defined(CASE_mixed_element_types)  // float plus double
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto b = ts::zeros<double, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto c = a + b;
#elif defined(CASE_mixed_meshes)  // tensors of two mesh types in one update
  ts::Mesh<"rows"> line({-1});
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, 4});
  auto b = ts::zeros<float, ts::Spec<ts::S<"rows">, ts::R>>(line, {4, 4});
  a -= b;
#elif defined(CASE_unknown_axis)  // a spec naming an axis the mesh lacks
  auto t = ts::distribute<ts::Spec<ts::S<"z">, ts::R>>(mesh, g);
#elif defined(CASE_unknown_axis_size)  // asking a mesh for the size of an axis it lacks
  return mesh.size<"z">();
#endif
}
