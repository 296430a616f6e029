// reshard<NewSpec>(t): the typed entry point. Redistribution by assignment of a spec, as
// Elemental's DistMatrix does it; a partial is resolved on the way, and no reshard makes one.
#pragma once
#include <algorithm>
#include <string>
#include <type_traits>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/reshard/execute.hpp"
#include "tshard/reshard/redistribute.hpp"
#include "tshard/tensor/sharded_tensor.hpp"
#include "tshard/tensor/tape.hpp"

namespace tshard {
namespace detail::grad {
// The tag of a reshard on the tape: its rule sends the cotangent back unresolved (a partial sum
// becomes a reduce-scatter where the input is split: JAX's all_gather <-> reduce_scatter).
struct Reshard {
  static constexpr bool any_output = true;
};
}  // namespace detail::grad

namespace detail {
bool same_blocks(const SpecDesc& have, const SpecDesc& want, const MeshShape& mesh);
template <class NewSpec, class T, class M, class S, class P>
ShardedTensor<T, M, NewSpec> implicit_reshard(const ShardedTensor<T, M, S, P>& t, const char* op);
template <class T>
void record_reshard(const std::shared_ptr<MeshState>& mesh, const TensorBlock<T>& t, const SpecDesc& want,
                    TensorBlock<T>& out);
// reshard()'s moving path on blocks: out (allocated) = t laid out as `want`, recorded.
template <class T>
void moving_reshard_block(const std::shared_ptr<MeshState>& mesh, const TensorBlock<T>& t, const SpecDesc& have,
                          const SpecDesc& want, TensorBlock<T>& out) {
  execute_reshard(*mesh, have, want, TensorAccess::block_shape(t), TensorAccess::block_values(t),
                  TensorAccess::block_data(out));
  record_reshard(mesh, t, want, out);
}
}  // namespace detail

// A new tensor with the same global value laid out as NewSpec.
template <class NewSpec, class T, class M, class S, class P>
ShardedTensor<T, M, NewSpec> reshard(const ShardedTensor<T, M, S, P>& t) {
  static_assert(detail::is_spec<NewSpec>::value, "tshard: reshard<Spec>(t) takes a tshard::Spec<...>");
  static_assert(NewSpec::rank == S::rank, "tshard: the spec's rank differs from the tensor's rank");
  using Out = ShardedTensor<T, M, NewSpec>;
  if constexpr (NewSpec::rank != S::rank) {
    return detail::refused<Out>();
  } else {
    // Nothing to move (only axes of one rank differ): the new tensor shares t's buffer, which
    // either side copies before writing; the operator still shows in stats and traces. (A
    // released ZeRO-3 parameter takes the path below, and its clear error.)
    detail::OperatorScope scope("reshard");
    if (detail::TensorAccess::has_storage(t) &&
        detail::same_blocks(t.spec_desc, Out::spec_desc, detail::state_of(t.mesh())->shape()))
      return detail::implicit_reshard<NewSpec>(t, "reshard");
    Out out(t.mesh(), t.global_shape());
    detail::moving_reshard_block<T>(detail::state_of(t.mesh()), detail::TensorAccess::block(t), t.spec_desc,
                                    Out::spec_desc, detail::TensorAccess::block(out));
    return out;
  }
}

namespace detail {
// x itself where it is already laid out as NewSpec and whole (no partial sum pending), else
// reshard<NewSpec>(x): what a layer that pins a layout does with a tensor, with no copy and no
// tape node where nothing moves. An lvalue comes back as a reference, an rvalue moved.
template <class NewSpec, class X>
decltype(auto) laid_out_as(X&& x) {
  using Plain = std::remove_cvref_t<X>;
  if constexpr (std::is_same_v<typename Plain::SpecType, NewSpec> && !Plain::is_partial) {
    if constexpr (std::is_lvalue_reference_v<X>) return static_cast<const Plain&>(x);
    else return Plain(std::move(x));
  } else {
    return reshard<NewSpec>(x);
  }
}
}  // namespace detail

// dst = t laid out as dst's spec, in dst's existing storage (no allocation of the result).
template <class T, class M, class S2, class S, class P>
void reshard_into(ShardedTensor<T, M, S2>& dst, const ShardedTensor<T, M, S, P>& t) {
  static_assert(S2::rank == S::rank, "tshard: the spec's rank differs from the tensor's rank");
  detail::require_same_mesh(dst, t, "reshard_into");
  if (detail::extents_of(dst) != detail::extents_of(t))
    throw ShapeError("tshard::reshard_into: the shapes differ: source is " + t.describe() + ", destination is " +
                     dst.describe());
  detail::OperatorScope scope("reshard");
  detail::execute_reshard(*detail::state_of(t.mesh()), t.spec_desc, dst.spec_desc, detail::extents_of(t), t.data(),
                          dst.data());
  if (detail::recording(t))
    detail::record(dst, detail::grad::Reshard{}, detail::tape_node(t));
  else if (detail::tracked(dst))
    detail::TensorAccess::set_node(dst, nullptr);  // a new value, computed from untracked ones
}

// What reshard<NewSpec>(t) will send and receive on this rank, by its plan and the cost model
// of comm/cost.hpp (the bytes comm_stats() counts; with uneven shards the executor moves only
// valid elements, so it measures at most this), and the seconds that model gives it.
template <class NewSpec, class T, class M, class S, class P>
Traffic predict_reshard(const ShardedTensor<T, M, S, P>& t) {
  using Out = ShardedTensor<T, M, NewSpec>;
  return detail::reshard_traffic(detail::state_of(t.mesh())->shape(), t.spec_desc, Out::spec_desc,
                                 detail::extents_of(t), sizeof(T), t.mesh().rank());
}

namespace detail {
// The steps of the plan that moves blocks of `extents` (elements of `bytes`) from spec `from` to
// `to`, e.g. "all-gather {x, R} -> {R, R}": what the explain_ functions print.
template <class Extents>
std::string reshard_steps(MeshState& mesh, const SpecDesc& from, const SpecDesc& to, const Extents& extents,
                          std::size_t bytes) {
  return cached_plan(mesh, from, to, extents, bytes)->describe(mesh.shape());
}
}  // namespace detail

// The steps reshard<NewSpec>(t) would take, e.g. "all-gather {x, R} -> {R, R}".
template <class NewSpec, class T, class M, class S, class P>
std::string explain_reshard(const ShardedTensor<T, M, S, P>& t) {
  using Out = ShardedTensor<T, M, NewSpec>;
  return detail::reshard_steps(*detail::state_of(t.mesh()), t.spec_desc, Out::spec_desc, detail::extents_of(t), sizeof(T));
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

// SpecError where implicit communication is forbidden (the same on every rank).
inline void refuse_implicit(MeshState& mesh, const SpecDesc& have, const SpecDesc& want, const Extents& shape,
                            const char* op) {
  throw SpecError(std::string("tshard::") + op + ": would reshard " + shape_to_string(shape, have.rank) + " " +
                  have.to_string(mesh.shape()) + " to " + want.to_string(mesh.shape()) +
                  ", but implicit communication is forbidden");
}

// Forbid mode refuses only moves that communicate: local slices (R -> S) pass.
inline void require_implicit_allowed(MeshState& mesh, const SpecDesc& have, const SpecDesc& want, const Extents& shape,
                                     const char* op) {
  if (implicit_communication() != ImplicitCommunication::Forbid) return;
  // (A local-only plan costs nothing and wins for any element size: the size does not matter.)
  for (const ReshardStep& st : cached_plan(mesh, have, want, shape, sizeof(double))->steps)
    if (st.kind != StepKind::Local) refuse_implicit(mesh, have, want, shape, op);
}

// Whether two layouts place the same block, padded alike, on every rank: they differ only in
// mesh axes of one rank (a spec naming "context" on a mesh whose context axis has one rank, say).
// A split's blocks follow the mixed radix of its axes, in which an axis of one rank counts for
// nothing; so does a partial over one (its one value per group is already the total).
inline bool same_blocks(const SpecDesc& have, const SpecDesc& want, const MeshShape& mesh) {
  if (have.rank != want.rank) return false;
  auto wide = [&](std::uint32_t axes) {
    std::uint32_t w = 0;
    for (int a = 0; a < mesh.axes(); ++a)
      if ((axes & (1u << a)) && mesh.sizes[std::size_t(a)] != 1) w |= 1u << a;
    return w;
  };
  const std::uint32_t hp = wide(have.partial_axes), wp = wide(want.partial_axes);
  if (hp != wp || (hp && have.partial != want.partial)) return false;
  for (int d = 0; d < have.rank; ++d) {
    const DimSplit &x = have.dims[d], &y = want.dims[d];
    int i = 0, j = 0;
    for (;;) {
      while (i < x.count && mesh.sizes[std::size_t(x[i])] == 1) ++i;
      while (j < y.count && mesh.sizes[std::size_t(y[j])] == 1) ++j;
      if (i == x.count || j == y.count) {
        if (i != x.count || j != y.count) return false;
        break;
      }
      if (x[i++] != y[j++]) return false;
    }
  }
  return true;
}

// The one entry point for every reshard an operator inserts on its own: counted under
// "<op>/auto", refused with SpecError in Forbid mode where it would communicate.
template <class T>
AlignedOperand<T> implicit_reshard(MeshState& mesh, const SpecDesc& have, const SpecDesc& want, const Extents& shape,
                                   const T* data, const char* op) {
  if (have == want || same_blocks(have, want, mesh.shape()))
    return {data, nullptr};
  require_implicit_allowed(mesh, have, want, shape, op);
  OperatorScope outer(op), scope("auto");
  auto l = shard_layout(want, shape, mesh.shape(), mesh.coords());
  AlignedOperand<T> out;
  out.owned = pooled_array<T>(static_cast<std::size_t>(l.padded_size()));
  execute_reshard(mesh, have, want, shape, data, out.owned.get());
  out.data = out.owned.get();
  return out;
}

// The same entry point for the windows of shape operators (slice, pad, concat): dst[i] =
// src[i + shift] moved point to point, counted and refused like any implicit reshard.
template <class T>
void implicit_redistribute(MeshState& mesh, const SpecDesc& from, const Extents& from_shape, const T* src,
                           const SpecDesc& to, const Extents& to_shape, T* dst, const Extents& shift, const char* op) {
  if (implicit_communication() == ImplicitCommunication::Forbid &&
      redistribute_communicates(from, from_shape, to, to_shape, shift, mesh.shape()))
    refuse_implicit(mesh, from, to, from_shape, op);
  OperatorScope outer(op), scope("auto");
  redistribute(mesh, from, from_shape, src, to, to_shape, dst, shift);
}

// A reshard's node, where t is tracked: its rule sends the cotangent back as it lies.
template <class T>
void record_reshard(const std::shared_ptr<MeshState>& mesh, const TensorBlock<T>& t, const SpecDesc& want,
                    TensorBlock<T>& out) {
  const auto& node = TensorAccess::block_node(t);
  if (!node || !Tape::active() || Tape::paused()) return;
  TensorAccess::set_block_node(out, record_node<T, AnyOutput, grad::Reshard, TapeNode<T>>(
                                        mesh, TensorAccess::block_shape(t), want, grad::Reshard{}, TapeNode<T>{node}));
}

// The typed implicit_reshard's body on blocks, per element type: out (t's shape laid out as
// `want`, no buffer yet) takes t's value, moved where the blocks differ; an unevaluated `s * x`
// moves x's buffer and keeps the factor (a reshard, a partial's sum included, is linear), so
// `w -= lr * g` with g partial all-reduces g once and reads it once more in the update. Already
// laid out so, out shares t's buffer (either side copies it before writing).
template <class T>
void implicit_reshard_block(const std::shared_ptr<MeshState>& mesh, const TensorBlock<T>& t, const SpecDesc& have,
                            const SpecDesc& want, TensorBlock<T>& out, const char* op) {
  const ScaledBuffer<T> v = TensorAccess::block_buffer(t);
  auto a = implicit_reshard(*mesh, have, want, TensorAccess::block_shape(t), v.data, op);
  TensorAccess::share_block(t, out, std::move(a.owned));
  record_reshard(mesh, t, want, out);
}

// The typed form: a tensor resharded to NewSpec unless it already is.
template <class NewSpec, class T, class M, class S, class P>
ShardedTensor<T, M, NewSpec> implicit_reshard(const ShardedTensor<T, M, S, P>& t, const char* op) {
  using Out = ShardedTensor<T, M, NewSpec>;
  Out out(AdoptStorage{}, t.mesh(), t.global_shape(), nullptr);
  implicit_reshard_block<T>(state_of(t.mesh()), TensorAccess::block(t), t.spec_desc, Out::spec_desc,
                            TensorAccess::block(out), op);
  return out;
}

// Resolves a partial operand (an implicit all-reduce) or passes a plain one through.
template <class X>
decltype(auto) resolved(const X& x, const char* op) {
  if constexpr (X::is_partial)
    return implicit_reshard<typename X::SpecType>(x, op);
  else
    return (x);
}
}  // namespace detail

}  // namespace tshard

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T)                                                                                \
  TSHARD_KERNEL_INSTANCE(void implicit_reshard_block<T>(const std::shared_ptr<MeshState>&, const TensorBlock<T>&, \
                                                        const SpecDesc&, const SpecDesc&, TensorBlock<T>&, const char*)) \
  TSHARD_KERNEL_INSTANCE(void moving_reshard_block<T>(const std::shared_ptr<MeshState>&, const TensorBlock<T>&,   \
                                                      const SpecDesc&, const SpecDesc&, TensorBlock<T>&))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void implicit_redistribute<T>(MeshState&, const SpecDesc&, \
    const Extents&, const T*, const SpecDesc&, const Extents&, T*, const Extents&, const char*))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
