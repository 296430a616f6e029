// Shape operators. transpose permutes dims and the spec with them: no communication.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include "tshard/core/spec_algebra.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

// Output dim i is input dim Perm[i]; the spec permutes alike, a partial stays partial.
template <int... Perm, ShardedTensorType X>
auto transpose(const X& x) {
  static_assert(int(sizeof...(Perm)) == X::rank, "tshard: transpose takes one dim index per tensor dim");
  static_assert(detail::dims_valid<X::rank, Perm...>(), "tshard: transpose's dims must be a permutation of the tensor's");
  using T = typename X::Scalar;
  using OutSpec = typename detail::permute_dims<typename X::SpecType, Perm...>::type;
  using Out = ShardedTensor<T, typename X::MeshT, OutSpec, typename X::PartialType>;
  constexpr std::array<int, sizeof...(Perm)> perm{Perm...};
  std::array<Eigen::Index, X::rank> shape{};
  for (int d = 0; d < X::rank; ++d) shape[d] = x.extents()[perm[d]];
  Out out(x.mesh(), shape);
  if (out.local_size()) out.local() = x.local().shuffle(perm);
  return out;
}

}  // namespace tshard
