// Cross-entropy of logits [B, V] against integer labels [B], and its gradient. V may be split:
// the max, the sum of exponentials and the labels' logits are partials over V's axes, resolved
// over B values each (Megatron's vocab-parallel cross-entropy): O(B) moves, never O(B V).
#pragma once
#include <cstdint>
#include <string>
#include <type_traits>

#include "tshard/nn/softmax.hpp"
#include "tshard/ops/take.hpp"

namespace tshard::nn {
namespace detail {

template <class X>
inline constexpr bool is_label_tensor_v =
    X::rank == 1 && (std::is_same_v<typename X::Scalar, std::int32_t> || std::is_same_v<typename X::Scalar, std::int64_t>);

// The labels laid out like the logits' rows (an implicit reshard where they are not), checked
// against [0, V): IndexError on every rank.
template <class L, class Labels>
auto aligned_labels(const L& logits, const Labels& labels, const char* op) {
  using M = typename L::MeshT;
  using RowSpec = Spec<tshard::detail::dim_at_t<typename L::SpecType, 0>>;
  if (labels.extents()[0] != logits.extents()[0])
    throw ShapeError(std::string("tshard::nn::") + op + ": labels " + labels.describe() + " do not match the rows of logits " +
                     logits.describe());
  tshard::detail::require_same_mesh(logits, labels, op);
  auto aligned = tshard::detail::implicit_reshard<RowSpec>(tshard::detail::resolved(labels, op), op);
  constexpr tshard::detail::SpecDesc rows = tshard::detail::make_desc<RowSpec, NoPartial>(M::axis_names);
  tshard::detail::check_ids(*logits.mesh().state(), std::as_const(aligned).data(), aligned.local_shape()[0],
                            rows.dims[0].count > 0, logits.extents()[1], op, logits.describe(), labels.describe());
  return aligned;
}

// out[b] = z[b, labels[b]] where this rank holds that column, else 0: a partial sum over V's axes.
template <class Z, class Labels>
auto pick_labelled(const Z& z, const Labels& labels) {
  using T = typename Z::Scalar;
  using M = typename Z::MeshT;
  using VAxes = typename tshard::detail::dim_axes<tshard::detail::dim_at_t<typename Z::SpecType, 1>>::type;
  using Out = ShardedTensor<T, M, Spec<tshard::detail::dim_at_t<typename Z::SpecType, 0>>,
                            typename tshard::detail::partial_of<ReduceOp::Sum, VAxes>::type>;
  Out out(z.mesh(), {z.global_shape()[0]});
  const auto& l = z.layout();
  const T* zd = z.data();
  const auto* ld = labels.data();
  T* o = out.data();
  for (tshard::detail::Index b = 0; b < l.valid[0]; ++b) {
    const tshard::detail::Index v = tshard::detail::Index(ld[b]) - l.offset[1];
    o[b] = v >= 0 && v < l.valid[1] ? zd[b + v * l.padded[0]] : T(0);
  }
  return out;
}

}  // namespace detail

// mean over b of -log softmax(logits)[b, labels[b]]; the same value on every rank.
template <tshard::detail::FloatingTensor L, ShardedTensorType Labels>
typename L::Scalar cross_entropy(const L& logits_in, const Labels& labels) {
  static_assert(L::rank == 2, "tshard: cross_entropy takes logits [B, V]");
  static_assert(detail::is_label_tensor_v<Labels>, "tshard: cross_entropy's labels are a rank-1 int32 or int64 tensor [B]");
  using T = typename L::Scalar;
  tshard::detail::OperatorScope scope("cross_entropy");
  const auto& logits = tshard::detail::resolved(logits_in, "cross_entropy");
  const auto lab = detail::aligned_labels(logits, labels, "cross_entropy");
  auto z = logits - max<1>(logits, keep_dims);
  auto nll = log(sum<1>(exp(z))) - detail::pick_labelled(z, lab);  // log-sum-exp minus the label's logit
  const Eigen::Tensor<T, 0> total = sum<0>(nll).gather();
  return total() / T(logits.extents()[0]);
}

// d cross_entropy / d logits = (softmax(logits) - onehot(labels)) / B, with the logits' spec.
template <tshard::detail::FloatingTensor L, ShardedTensorType Labels>
auto cross_entropy_backward(const L& logits_in, const Labels& labels) {
  static_assert(L::rank == 2, "tshard: cross_entropy takes logits [B, V]");
  static_assert(detail::is_label_tensor_v<Labels>, "tshard: cross_entropy's labels are a rank-1 int32 or int64 tensor [B]");
  using T = typename L::Scalar;
  tshard::detail::OperatorScope scope("cross_entropy_backward");
  const auto& logits = tshard::detail::resolved(logits_in, "cross_entropy_backward");
  const auto lab = detail::aligned_labels(logits, labels, "cross_entropy_backward");
  auto p = softmax<1>(logits);
  const auto& l = p.layout();
  T* pd = p.data();
  const auto* ld = std::as_const(lab).data();
  for (tshard::detail::Index b = 0; b < l.valid[0]; ++b) {
    const tshard::detail::Index v = tshard::detail::Index(ld[b]) - l.offset[1];
    if (v >= 0 && v < l.valid[1]) pd[b + v * l.padded[0]] -= T(1);
  }
  return std::move(p) * (T(1) / T(logits.extents()[0]));
}

}  // namespace tshard::nn
