// reshard<NewSpec>(t): the typed entry point. Redistribution by assignment of a spec, as
// Elemental's DistMatrix does it; a partial is resolved on the way, and no reshard makes one.
#pragma once
#include <algorithm>
#include <string>

#include "tshard/reshard/execute.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard {

// A new tensor with the same global value laid out as NewSpec.
template <class NewSpec, class T, class M, class S, class P>
ShardedTensor<T, M, NewSpec> reshard(const ShardedTensor<T, M, S, P>& t) {
  static_assert(detail::is_spec<NewSpec>::value, "tshard: reshard<Spec>(t) takes a tshard::Spec<...>");
  static_assert(NewSpec::rank == S::rank, "tshard: the spec's rank differs from the tensor's rank");
  using Out = ShardedTensor<T, M, NewSpec>;
  detail::OperatorScope scope("reshard");
  Out out(t.mesh(), t.global_shape());
  detail::execute_reshard(*t.mesh().state(), t.spec_desc, Out::spec_desc, t.extents(), t.data(), out.data());
  return out;
}

// dst = t laid out as dst's spec, in dst's existing storage (no allocation of the result).
template <class T, class M, class S2, class S, class P>
void reshard_into(ShardedTensor<T, M, S2>& dst, const ShardedTensor<T, M, S, P>& t) {
  static_assert(S2::rank == S::rank, "tshard: the spec's rank differs from the tensor's rank");
  detail::require_same_mesh(dst, t, "reshard_into");
  if (dst.extents() != t.extents())
    throw ShapeError("tshard::reshard_into: the shapes differ: source is " + t.describe() + ", destination is " +
                     dst.describe());
  detail::OperatorScope scope("reshard");
  detail::execute_reshard(*t.mesh().state(), t.spec_desc, dst.spec_desc, t.extents(), t.data(), dst.data());
}

// The steps reshard<NewSpec>(t) would take, e.g. "all-gather {x, R} -> {R, R}".
template <class NewSpec, class T, class M, class S, class P>
std::string explain_reshard(const ShardedTensor<T, M, S, P>& t) {
  using Out = ShardedTensor<T, M, NewSpec>;
  return detail::cached_plan(*t.mesh().state(), t.spec_desc, Out::spec_desc, t.extents())->describe(t.mesh().shape());
}

// Whether operators may insert communication the user did not write.
enum class ImplicitCommunication { Allow, Forbid };
inline ImplicitCommunication& implicit_communication() {
  static ImplicitCommunication mode = ImplicitCommunication::Allow;
  return mode;
}

namespace detail {

// An operand laid out as an operator needs it: the tensor's own buffer when it already is,
// else a pooled copy made by an implicit reshard.
template <class T>
struct AlignedOperand {
  const T* data = nullptr;
  std::shared_ptr<T> owned;
};

// The one entry point for every reshard an operator inserts on its own; counted under
// "<op>/auto" and refused with SpecError when implicit communication is forbidden.
// SpecError where implicit communication is forbidden (the same on every rank).
inline void require_implicit_allowed(MeshState& mesh, const SpecDesc& have, const SpecDesc& want, const Extents& shape,
                                     const char* op) {
  if (implicit_communication() == ImplicitCommunication::Forbid)
    throw SpecError(std::string("tshard::") + op + ": would reshard " + shape_to_string(shape, have.rank) + " " +
                    have.to_string(mesh.shape()) + " to " + want.to_string(mesh.shape()) +
                    ", but implicit communication is forbidden");
}

template <class T>
AlignedOperand<T> implicit_reshard(MeshState& mesh, const SpecDesc& have, const SpecDesc& want, const Extents& shape,
                                   const T* data, const char* op) {
  if (have == want) return {data, nullptr};
  require_implicit_allowed(mesh, have, want, shape, op);
  OperatorScope scope(std::string(op) + "/auto");
  auto l = shard_layout(want, shape, mesh.shape(), mesh.coords());
  AlignedOperand<T> out;
  out.owned = pooled_array<T>(static_cast<std::size_t>(l.padded_size()));
  execute_reshard(mesh, have, want, shape, data, out.owned.get());
  out.data = out.owned.get();
  return out;
}

// The typed form: a tensor resharded to NewSpec unless it already is.
template <class NewSpec, class T, class M, class S, class P>
ShardedTensor<T, M, NewSpec> implicit_reshard(const ShardedTensor<T, M, S, P>& t, const char* op) {
  using Out = ShardedTensor<T, M, NewSpec>;
  auto a = implicit_reshard(*t.mesh().state(), t.spec_desc, Out::spec_desc, t.extents(), t.data(), op);
  if (!a.owned) {  // already laid out so: a copy
    Out out(t.mesh(), t.global_shape());
    std::copy(t.data(), t.data() + t.local_size(), out.data());
    return out;
  }
  return Out(AdoptStorage{}, t.mesh(), t.global_shape(), std::move(a.owned));
}
}  // namespace detail

}  // namespace tshard
