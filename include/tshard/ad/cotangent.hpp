// Cotangents on the tape: how a rule reads the cotangent of its output and adds contributions
// to its inputs'. A contribution is kept in the layout it came in, a partial sum included; two
// in one layout add locally, two in different layouts meet in the value's own layout. So a
// replicated value used by split consumers sums their partials once, when its cotangent is
// read (a reduce-scatter where the value is split: the transpose of its all-gather), and no
// gradient is gathered or all-reduced defensively.
#pragma once
#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/simulated_timing.hpp"
#include "tshard/ops/reduce_kernel.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/tape.hpp"

namespace tshard::detail {

template <class T>
std::shared_ptr<T> copy_of_buffer(const T* src, Index n) {
  auto out = pooled_array<T>(static_cast<std::size_t>(std::max<Index>(n, 1)));
  if (n) std::memcpy(static_cast<void*>(out.get()), src, sizeof(T) * static_cast<std::size_t>(n));
  return out;
}

// node.cotangent += the contribution `c` laid out as `cd` (node's shape).
template <class T>
void add_cotangent(TypedGradNode<T>& node, const SpecDesc& cd, std::shared_ptr<T> c) {
  if (!node.cotangent) {
    node.cotangent = std::move(c);
    node.cotangent_desc = cd;
    return;
  }
  MeshState& mesh = *node.mesh;
  if (cd == node.cotangent_desc) {  // one layout: padded buffers add elementwise
    const Index n = shard_layout(cd, node.shape, mesh.shape(), mesh.coords()).padded_size();
    if (node.cotangent.use_count() > 1) node.cotangent = copy_of_buffer(node.cotangent.get(), n);
    T* acc = node.cotangent.get();
    const T* add = c.get();
    sampled("cotangent sum", [&] { for (Index i = 0; i < n; ++i) acc[i] += add[i]; }, n);
    return;
  }
  // Two layouts: both to the value's own (the lazily kept partial sums resolved here, once).
  const Index n = shard_layout(node.primal, node.shape, mesh.shape(), mesh.coords()).padded_size();
  auto a = implicit_reshard(mesh, node.cotangent_desc, node.primal, node.shape, node.cotangent.get(), "backward");
  auto b = implicit_reshard(mesh, cd, node.primal, node.shape, c.get(), "backward");
  std::shared_ptr<T> sum = a.owned ? std::move(a.owned) : copy_of_buffer(a.data, n);
  T* acc = sum.get();
  sampled("cotangent sum", [&] { for (Index i = 0; i < n; ++i) acc[i] += b.data[i]; }, n);
  node.cotangent = std::move(sum);
  node.cotangent_desc = node.primal;
}

template <class X>
TypedGradNode<typename X::Scalar>* node_of(const X& x) {
  return static_cast<TypedGradNode<typename X::Scalar>*>(TensorAccess::node(x).get());
}
template <class T>
TypedGradNode<T>* node_of(const TapeNode<T>& x) {
  return static_cast<TypedGradNode<T>*>(x.node.get());
}

// A value in a rule on descriptors: a buffer laid out as `spec` over `shape`.
template <class T>
struct BlockValue {
  std::shared_ptr<T> data;
  SpecDesc spec{};
  Extents shape{};
};

template <class T>
TypedGradNode<T>* node_of(const TapeValue<T>& x) {
  return static_cast<TypedGradNode<T>*>(x.node.get());
}

// The descriptor form of accumulate: node += the contribution c (laid out as cd over shape sc).
template <class T>
void accumulate_block(TypedGradNode<T>& node, const SpecDesc& cd, const Extents& sc, std::shared_ptr<T> c) {
  if (sc != node.shape)
    throw ShapeError("tshard::ad: internal: a cotangent contribution of shape " + shape_to_string(sc, cd.rank) +
                     " does not match its value's " + shape_to_string(node.shape, node.primal.rank));
  add_cotangent(node, cd, std::move(c));
}

// x's node += the cotangent contribution c (a tensor of x's shape, any spec, maybe a partial sum).
template <class X, class C>
void accumulate(const X& x, const C& c) {
  static_assert(std::is_same_v<typename X::Scalar, typename C::Scalar>,
                "tshard: internal: a cotangent contribution has its value's element type");
  auto* node = node_of(x);
  if (!node) return;
  if (extents_of(c) != node->shape)
    throw ShapeError("tshard::ad: internal: a cotangent contribution " + c.describe() + " does not match its value " +
                     x.describe());
  static_assert(!C::is_partial || partial_kind<typename C::PartialType>() == PartialKind::Sum,
                "tshard: internal: cotangent contributions are partial sums or complete");
  add_cotangent(*node, C::spec_desc, TensorAccess::storage(c));
}

// The cotangent of a rule's output as a tensor of Out's spec (its partial, if any, dropped: the
// cotangent is that of the resolved value), read once: the node lets go of it.
template <class Out, class M>
auto cotangent(std::type_identity<Out>, TypedGradNode<typename Out::Scalar>& self, const M& mesh) {
  using T = typename Out::Scalar;
  using G = ShardedTensor<T, M, typename Out::SpecType>;
  auto a = implicit_reshard(*self.mesh, self.cotangent_desc, G::spec_desc, self.shape, self.cotangent.get(), "backward");
  G g(AdoptStorage{}, mesh, to_array<G::rank>(self.shape), a.owned ? std::move(a.owned) : self.cotangent);
  self.cotangent.reset();
  return g;
}

// The descriptor form: the cotangent of a rule's output laid out as the output (self.primal).
template <class T>
std::shared_ptr<T> read_cotangent(TypedGradNode<T>& self) {
  auto a = implicit_reshard(*self.mesh, self.cotangent_desc, self.primal, self.shape, self.cotangent.get(), "backward");
  std::shared_ptr<T> g = a.owned ? std::move(a.owned) : self.cotangent;
  self.cotangent.reset();
  return g;
}

// The contribution of an output's cotangent `g` (laid out as dg, rank `rank`, maybe a partial
// sum) to an operand of shape sx and rank rx that was broadcast into it (numpy: aligned at the
// last dim): g summed over the leading dims the operand lacks and the dims where it has extent 1,
// a partial sum over the axes that split them. Added into the operand's node.
template <class T>
void add_unbroadcast(TypedGradNode<T>& node, const SpecDesc& dg, const Extents& sg, int rank, std::shared_ptr<T> g,
                     T factor = T(1)) {
  MeshState& mesh = *node.mesh;
  const int rx = node.primal.rank, lead = rank - rx;
  std::array<bool, kMaxRank> reduced{};
  bool any = false;
  for (int d = 0; d < rank; ++d) {
    reduced[d] = d < lead || (node.shape[d - lead] == 1 && sg[d] != 1);
    any = any || reduced[d];
  }
  SpecDesc out{};
  std::shared_ptr<T> buffer;
  if (!any) {
    out = dg;
    buffer = std::move(g);
  } else {
    out.rank = rx;
    std::uint32_t summed = dg.partial == PartialKind::Sum ? dg.partial_axes : 0;
    for (int d = 0; d < rank; ++d) {
      if (reduced[d]) summed |= dg.dims[d].mask();
      else out.dims[d - lead] = dg.dims[d];
    }
    out.partial = summed ? PartialKind::Sum : PartialKind::None;
    out.partial_axes = summed;
    const auto lg = shard_layout(dg.without_partial(), sg, mesh.shape(), mesh.coords());
    const auto lo = shard_layout(out.without_partial(), node.shape, mesh.shape(), mesh.coords());
    Extents kept{};  // the output's padded extents over the dims kept by the kernel
    for (int d = 0, k = 0; d < rank; ++d)
      if (!reduced[d]) kept[k++] = lo.padded[d - lead];
    int kept_rank = 0;
    for (int d = 0; d < rank; ++d) kept_rank += reduced[d] ? 0 : 1;
    buffer = pooled_array<T>(static_cast<std::size_t>(std::max<Index>(lo.padded_size(), 1)));
    // Extent-1 dims dropped by the kernel move no element in column-major order: the kernel's
    // output is the operand's padded buffer.
    reduce_kernel<T>(ReduceOp::Sum, g.get(), lg, reduced, buffer.get(), kept, kept_rank);
  }
  if (factor != T(1)) {
    const Index n = shard_layout(out, node.shape, mesh.shape(), mesh.coords()).padded_size();
    if (buffer.use_count() > 1) buffer = copy_of_buffer(buffer.get(), n);
    for (Index i = 0; i < n; ++i) buffer.get()[i] *= factor;
  }
  add_cotangent(node, out, std::move(buffer));
}

// The typed form: x's node += c summed down to x's shape.
template <class X, class C>
void accumulate_unbroadcast(const X& x, const C& c, typename X::Scalar factor = typename X::Scalar(1)) {
  auto* node = node_of(x);
  if (!node) return;
  static_assert(!C::is_partial || partial_kind<typename C::PartialType>() == PartialKind::Sum,
                "tshard: internal: cotangent contributions are partial sums or complete");
  add_unbroadcast(*node, C::spec_desc, extents_of(c), C::rank, TensorAccess::storage(c), factor);
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void add_cotangent<T>(TypedGradNode<T>&, const SpecDesc&, \
    std::shared_ptr<T>))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void add_unbroadcast<T>(TypedGradNode<T>&, const SpecDesc&, \
    const Extents&, int, std::shared_ptr<T>, T))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(std::shared_ptr<T> read_cotangent<T>(TypedGradNode<T>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void accumulate_block<T>(TypedGradNode<T>&, const SpecDesc&, \
    const Extents&, std::shared_ptr<T>))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
