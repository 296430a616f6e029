// ShardedTensor<T, Mesh, Spec, Partial>: a global tensor split over a mesh as its type says.
// Each rank holds one padded, column-major block in pooled storage; copies are deep, moves cheap.
#pragma once
#include <unsupported/Eigen/CXX11/Tensor>

#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/datatype.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/core/spec.hpp"
#include "tshard/core/spec_descriptor.hpp"
#include "tshard/tensor/gather_kernels.hpp"

namespace tshard {

namespace detail {
struct AdoptStorage {};  // tag: construct around existing storage

template <int Rank>
std::array<Eigen::Index, Rank> to_array(const Extents& e) {
  std::array<Eigen::Index, Rank> a{};
  for (int d = 0; d < Rank; ++d) a[d] = e[d];
  return a;
}
template <std::size_t N>
Extents to_extents(const std::array<Eigen::Index, N>& a) {
  Extents e{};
  for (std::size_t d = 0; d < N; ++d) e[d] = a[d];
  return e;
}
}  // namespace detail

template <class T, class M, class SpecT, class P = NoPartial>
class ShardedTensor {
  static_assert(Element<T>, "tshard: element types are float, double, std::complex<float/double>, int32_t and int64_t");
  static_assert(MeshType<M>, "tshard: the second argument of ShardedTensor is a tshard::Mesh<...>");
  static_assert(detail::is_spec<SpecT>::value, "tshard: the third argument of ShardedTensor is a tshard::Spec<...>");
  static_assert(detail::is_partial_marker<P>::value,
                "tshard: the fourth argument of ShardedTensor is NoPartial or a Partial<...> marker");
  static_assert(detail::spec_traits<SpecT>::axes_known(M::axis_names),
                "tshard: a spec names an axis that is not an axis of this mesh");
  static_assert(detail::names_unique(detail::spec_traits<SpecT>::all_names()),
                "tshard: a spec uses the same mesh axis twice");
  static_assert(detail::names_known(M::axis_names, P::names),
                "tshard: a partial marker names an axis that is not an axis of this mesh");
  static_assert(detail::names_unique(P::names), "tshard: a partial marker names the same axis twice");
  static_assert(detail::names_disjoint(detail::spec_traits<SpecT>::all_names(), P::names),
                "tshard: a mesh axis is never both split and partial in one tensor");
  static_assert(SpecT::rank <= detail::kMaxRank, "tshard: tensors have at most 8 dims");
  static_assert(!(is_complex_v<T> && P::is_partial && detail::partial_kind<P>() != detail::PartialKind::Sum),
                "tshard: complex values have no max or min: only partial sums exist for them");

 public:
  static constexpr int rank = SpecT::rank;
  using Scalar = T;
  using MeshT = M;
  using SpecType = SpecT;
  using PartialType = P;
  using Shape = std::array<Eigen::Index, rank>;
  using LocalMap = Eigen::TensorMap<Eigen::Tensor<T, rank>>;
  using ConstLocalMap = Eigen::TensorMap<const Eigen::Tensor<T, rank>>;
  static constexpr bool is_partial = P::is_partial;
  // The run-time descriptor every planner and kernel works on.
  static constexpr detail::SpecDesc spec_desc = detail::make_desc<SpecT, P>(M::axis_names);

  // A tensor of the given global shape; its contents are unspecified (see zeros()).
  ShardedTensor(const M& mesh, const Shape& global_shape) : mesh_(mesh), shape_(detail::to_extents(global_shape)) {
    layout_ = detail::shard_layout(spec_desc, shape_, mesh_.shape(), mesh_.state()->coords());
    data_ = detail::pooled_array<T>(static_cast<std::size_t>(layout_.padded_size()));
  }
  // Around existing storage of at least the padded local size (from_local, factories).
  ShardedTensor(detail::AdoptStorage, const M& mesh, const Shape& global_shape, std::shared_ptr<T> storage)
      : mesh_(mesh), shape_(detail::to_extents(global_shape)), data_(std::move(storage)) {
    layout_ = detail::shard_layout(spec_desc, shape_, mesh_.shape(), mesh_.state()->coords());
  }

  ShardedTensor(const ShardedTensor& o) : mesh_(o.mesh_), shape_(o.shape_), layout_(o.layout_) {
    data_ = detail::pooled_array<T>(static_cast<std::size_t>(layout_.padded_size()));
    if (layout_.padded_size()) std::memcpy(data_.get(), o.data_.get(), sizeof(T) * static_cast<std::size_t>(layout_.padded_size()));
  }
  ShardedTensor& operator=(const ShardedTensor& o) {
    if (this != &o) *this = ShardedTensor(o);
    return *this;
  }
  ShardedTensor(ShardedTensor&&) noexcept = default;
  ShardedTensor& operator=(ShardedTensor&&) noexcept = default;

  const M& mesh() const { return mesh_; }
  Shape global_shape() const { return detail::to_array<rank>(shape_); }
  // Valid extent of this rank's block (0 where the shard is empty).
  Shape local_shape() const { return detail::to_array<rank>(layout_.valid); }
  // Global index of this rank's first element.
  Shape local_offset() const { return detail::to_array<rank>(layout_.offset); }
  // Extent of the local buffer: ceil(N/k) along split dims, identical on every rank.
  Shape padded_shape() const { return detail::to_array<rank>(layout_.padded); }

  // The local (padded) buffer; elements beyond local_shape() are padding, unspecified.
  LocalMap local() { return LocalMap(data_.get(), padded_shape()); }
  ConstLocalMap local() const { return ConstLocalMap(data_.get(), padded_shape()); }
  T* data() { return data_.get(); }
  const T* data() const { return data_.get(); }
  Eigen::Index local_size() const { return layout_.padded_size(); }

  // The global value on every rank; a partial is resolved first.
  Eigen::Tensor<T, rank> gather() const {
    Eigen::Tensor<T, rank> out(global_shape());
    detail::OperatorScope scope("gather");
    detail::gather_to_all(*mesh_.state(), spec_desc, shape_, data_.get(), out.data());
    return out;
  }
  // The global value on mesh rank `root`; other ranks get an empty (all-zero extents) tensor.
  Eigen::Tensor<T, rank> gather(int root) const {
    Eigen::Tensor<T, rank> out;
    if (mesh_.rank() == root) out.resize(global_shape());
    detail::OperatorScope scope("gather");
    detail::gather_to_root(*mesh_.state(), spec_desc, shape_, data_.get(), out.data(), root);
    return out;
  }
  // Into an existing tensor of the global shape, on every rank (no allocation of the result).
  void gather_into(Eigen::Tensor<T, rank>& out) const {
    if (detail::to_extents(std::array<Eigen::Index, rank>(out.dimensions())) != shape_)
      out.resize(global_shape());
    detail::OperatorScope scope("gather");
    detail::gather_to_all(*mesh_.state(), spec_desc, shape_, data_.get(), out.data());
  }

  // "[7, 5] {x, R}": shape and spec, for error messages.
  std::string describe() const {
    return detail::shape_to_string(shape_, rank) + " " + spec_desc.to_string(mesh_.shape());
  }
  const detail::Extents& extents() const { return shape_; }
  const detail::ShardLayout& layout() const { return layout_; }

 private:
  M mesh_;
  detail::Extents shape_{};
  detail::ShardLayout layout_{};
  std::shared_ptr<T> data_;
};

namespace detail {
template <class X>
struct is_sharded_tensor : std::false_type {};
template <class T, class M, class S, class P>
struct is_sharded_tensor<ShardedTensor<T, M, S, P>> : std::true_type {};

// MeshError (on every rank alike) when two tensors live on different mesh objects.
template <class A, class B>
void require_same_mesh(const A& a, const B& b, const char* op) {
  if (!(a.mesh() == b.mesh()))
    throw MeshError(std::string("tshard::") + op + ": the tensors live on different meshes: a is " + a.describe() +
                    " on mesh " + a.mesh().shape().describe() + ", b is " + b.describe() + " on mesh " +
                    b.mesh().shape().describe());
}
}  // namespace detail

template <class X>
concept ShardedTensorType = detail::is_sharded_tensor<std::remove_cvref_t<X>>::value;

}  // namespace tshard
