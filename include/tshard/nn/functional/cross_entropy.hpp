// Cross-entropy of logits [B, V] (or [B, T, V]) against integer labels [B] (or [B, T]), and its gradient. V may be split:
// the max, the sum of exponentials and the labels' logits are partials over V's axes, resolved
// over B values each (Megatron's vocab-parallel cross-entropy): O(B) moves, never O(B V).
// accuracy: the fraction of rows whose argmax is the label, with argmax's O(B) candidates.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "tshard/ad/custom_vjp.hpp"
#include "tshard/ad/scalar.hpp"
#include "tshard/nn/functional/softmax.hpp"
#include "tshard/ops/reduce.hpp"
#include "tshard/ops/take.hpp"

namespace tshard::nn {
namespace detail {

template <class L, class X>
inline constexpr bool is_label_tensor_v =
    X::rank == L::rank - 1 && (std::is_same_v<typename X::Scalar, std::int32_t> || std::is_same_v<typename X::Scalar, std::int64_t>);

// What the losses and metrics over logits take: logits [B, V] or [B, T, V], and integer labels
// of the logits' leading dims.
template <class L, class Labels>
constexpr void require_logits_and_labels() {
  static_assert(L::rank >= 2, "tshard: cross_entropy and accuracy take logits [B, V] or [B, T, V]");
  static_assert(is_label_tensor_v<L, Labels>,
                "tshard: the labels of cross_entropy and accuracy are an int32 or int64 tensor of the logits' leading "
                "dims ([B] or [B, T])");
}

// The labels laid out like the logits' rows (an implicit reshard where they are not), checked
// against [0, V): IndexError on every rank.
template <class L, class Labels>
auto aligned_labels(const L& logits, const Labels& labels, const char* op) {
  using M = typename L::MeshT;
  using RowSpec = typename tshard::detail::drop_dims<typename L::SpecType, L::rank - 1>::type;
  for (int d = 0; d < Labels::rank; ++d)
    if (tshard::detail::extents_of(labels)[d] != tshard::detail::extents_of(logits)[d])
      throw ShapeError(std::string("tshard::nn::") + op + ": labels " + labels.describe() + " do not match the rows of logits " +
                       logits.describe());
  tshard::detail::require_same_mesh(logits, labels, op);
  auto aligned = tshard::detail::implicit_reshard<RowSpec>(tshard::detail::resolved(labels, op), op);
  constexpr tshard::detail::SpecDesc rows = tshard::detail::make_desc<RowSpec, NoPartial>(M::axis_names);
  using I = typename Labels::Scalar;
  std::vector<I> valid;  // the valid labels, without the padding between runs
  const I* ld = std::as_const(aligned).data();
  tshard::detail::for_each_valid_run(
      tshard::detail::layout_of(aligned),
      [&](tshard::detail::Index off, tshard::detail::Index n) { valid.insert(valid.end(), ld + off, ld + off + n); });
  tshard::detail::check_ids(*tshard::detail::state_of(logits.mesh()), valid.data(), tshard::detail::Index(valid.size()),
                            rows.split_axes() != 0, tshard::detail::extents_of(logits)[L::rank - 1], op,
                            logits.describe(), labels.describe());
  return aligned;
}

// f(row, v) for every valid row of this rank whose label falls in its block of V: row the
// offset in the labels' padded buffer, v the local column.
template <class Z, class Labels, class F>
void for_each_labelled(const Z& z, const Labels& labels, F&& f) {
  const auto& l = tshard::detail::layout_of(z);
  const auto* ld = std::as_const(labels).data();
  tshard::detail::for_each_valid_run(
      tshard::detail::layout_of(labels), [&](tshard::detail::Index off, tshard::detail::Index n) {
        for (tshard::detail::Index r = off; r < off + n; ++r) {
          const tshard::detail::Index v = tshard::detail::Index(ld[r]) - l.offset[Z::rank - 1];
          if (v >= 0 && v < l.valid[Z::rank - 1]) f(r, v);
        }
      });
}

// out[row] = z[row, labels[row]] where this rank holds that column, else 0: a partial sum over
// V's axes.
template <class Z, class Labels>
auto pick_labelled(const Z& z, const Labels& labels) {
  using T = typename Z::Scalar;
  using M = typename Z::MeshT;
  using VAxes = typename tshard::detail::dim_axes<tshard::detail::dim_at_t<typename Z::SpecType, Z::rank - 1>>::type;
  using RowSpec = typename tshard::detail::drop_dims<typename Z::SpecType, Z::rank - 1>::type;
  using Out = ShardedTensor<T, M, RowSpec, typename tshard::detail::partial_of<ReduceOp::Sum, VAxes>::type>;
  std::array<Eigen::Index, Z::rank - 1> shape{};
  for (int d = 0; d + 1 < Z::rank; ++d) shape[d] = tshard::detail::extents_of(z)[d];
  Out out(z.mesh(), shape);
  T* o = out.data();
  std::fill(o, o + out.padded_size(), T(0));
  const T* zd = z.data();
  const tshard::detail::Index rows = labels.padded_size();  // the padded rows of z's block
  for_each_labelled(z, labels, [&](tshard::detail::Index r, tshard::detail::Index v) { o[r] = zd[r + v * rows]; });
  return out;
}

template <class X>
auto sum_all(const X& x) {
  return [&]<int... I>(std::integer_sequence<int, I...>) { return sum<I...>(x); }(std::make_integer_sequence<int, X::rank>{});
}

template <class X>
double rows_of(const X& logits) {
  double n = 1;
  for (int d = 0; d + 1 < X::rank; ++d) n *= double(tshard::detail::extents_of(logits)[d]);
  return n;
}

// (e / sum(e) - onehot(labels)) / rows over the last dim, given e = exp(logits - max), written
// in e's buffer: softmax's own expression (nn/functional/softmax.hpp), then the labels' ones taken off
// where this rank holds them, then the mean's scale (each step the arithmetic of the ops it
// replaces, in place).
template <class E, class Labels, class L>
E softmax_minus_labels(E e, const Labels& labels, const L& logits) {
  using T = typename L::Scalar;
  constexpr int V = L::rank - 1;
  e /= sum<V>(e, keep_dims);
  T* pd = e.data();
  const tshard::detail::Index rows = labels.padded_size();
  for_each_labelled(e, labels, [&](tshard::detail::Index r, tshard::detail::Index v) { pd[r + v * rows] -= T(1); });
  e *= T(1) / T(rows_of(logits));
  return e;
}

}  // namespace detail

namespace detail {

// The tape's node of a fused cross-entropy: the logits' gradient made in the forward pass,
// kept until the backward (the logits themselves are not), and scaled there by the loss's
// cotangent. Its rule, found by argument-dependent lookup, is below: one per element type.
template <class T>
struct FusedCrossEntropy {
  static constexpr bool any_output = true;
  std::shared_ptr<std::optional<tshard::detail::BlockValue<T>>> gradient;  // moved out by the rule: it runs once
};

template <class T>
void fused_cross_entropy_vjp(tshard::detail::TypedGradNode<T>& self, const tshard::detail::TapeValue<T>& logits,
                             std::optional<tshard::detail::BlockValue<T>>& kept) {
  const T scale = tshard::detail::read_cotangent(self).get()[0];
  tshard::detail::BlockValue<T> g = std::move(*kept);
  kept.reset();
  auto* node = tshard::detail::node_of(logits);
  if (!node) return;
  if (scale != T(1)) {  // (g * 1 is g, bit for bit)
    const auto& mesh = *self.mesh;
    const tshard::detail::Index n = shard_layout(g.spec, g.shape, mesh.shape(), mesh.coords()).padded_size();
    auto scaled = tshard::detail::pooled_array<T>(static_cast<std::size_t>(n));
    for (tshard::detail::Index i = 0; i < n; ++i) scaled.get()[i] = scale * g.data.get()[i];
    g.data = std::move(scaled);
  }
  tshard::detail::accumulate_block(*node, g.spec, g.shape, std::move(g.data));
}

template <class T>
void vjp(const FusedCrossEntropy<T>& tag, std::type_identity<tshard::detail::AnyOutput>,
         tshard::detail::TypedGradNode<T>& self, const tshard::detail::TapeValue<T>& logits) {
  fused_cross_entropy_vjp(self, logits, *tag.gradient);
}

}  // namespace detail

// mean over the rows of -log softmax(logits)[row, labels[row]], for logits [..., V] (V may be
// split) and integer labels [...]; the same value on every rank.
// The result is an ad::Scalar: it converts to the logits' element type (`float l =
// cross_entropy(...)`). Under a gradient the classifier is fused: the forward pass, which has
// exp(z) and its row sums at hand, also makes d loss / d logits = (softmax - onehot) / rows (the
// same arithmetic as cross_entropy_backward, bit for bit) and the tape keeps that instead of
// the logits, so the backward recomputes nothing and a [B, T, V] tensor is freed a pass earlier.
template <tshard::detail::FloatingTensor L, ShardedTensorType Labels>
auto cross_entropy_backward(const L& logits_in, const Labels& labels);

template <tshard::detail::FloatingTensor L, ShardedTensorType Labels>
auto cross_entropy(const L& logits_in, const Labels& labels) {
  detail::require_logits_and_labels<L, Labels>();
  using T = typename L::Scalar;
  using M = typename L::MeshT;
  using G = ShardedTensor<T, M, typename L::SpecType>;
  tshard::detail::OperatorScope scope("cross_entropy");
  const bool differentiate = tshard::detail::recording(logits_in);
  auto gradient = differentiate ? std::make_shared<std::optional<tshard::detail::BlockValue<T>>>() : nullptr;
  ShardedTensor<T, M, Spec<>> loss = [&] {
    tshard::detail::PauseRecording pause;
    const auto& logits = tshard::detail::resolved(logits_in, "cross_entropy");
    const auto lab = detail::aligned_labels(logits, labels, "cross_entropy");
    constexpr int V = L::rank - 1;
    auto z = logits - max<V>(logits, keep_dims);
    const auto picked = detail::pick_labelled(z, lab);  // the label's logit
    auto e = exp(std::move(z));                          // in z's buffer
    const Eigen::Tensor<T, 0> total = detail::sum_all(log(sum<V>(e)) - picked).gather();  // log-sum-exp minus it
    ShardedTensor<T, M, Spec<>> l(logits.mesh(), std::array<Eigen::Index, 0>{});
    l.data()[0] = total() / T(detail::rows_of(logits));
    if (differentiate) {
      const G g = detail::softmax_minus_labels(std::move(e), lab, logits);
      gradient->emplace(tshard::detail::BlockValue<T>{tshard::detail::TensorAccess::storage(g), G::spec_desc,
                                                      tshard::detail::extents_of(g)});
    }
    return l;
  }();
  if (differentiate)
    tshard::detail::record(loss, detail::FusedCrossEntropy<T>{std::move(gradient)},
                           tshard::detail::tape_block(logits_in, false));
  return ad::Scalar<T, M>(std::move(loss));
}

// The fraction of rows whose largest logit is the label's (argmax's ties go to the lowest index,
// as numpy's), for logits [..., V] (V may be split) and integer labels [...]: a sharded sum of
// hits, the same value on every rank. Times the rows, it adds up over batches.
template <tshard::detail::FloatingTensor L, ShardedTensorType Labels>
typename L::Scalar accuracy(const L& logits_in, const Labels& labels) {
  detail::require_logits_and_labels<L, Labels>();
  using T = typename L::Scalar;
  tshard::detail::OperatorScope scope("accuracy");
  const auto& logits = tshard::detail::resolved(logits_in, "accuracy");
  const auto lab = detail::aligned_labels(logits, labels, "accuracy");
  const auto predicted = argmax<L::rank - 1>(logits);  // laid out as the labels: the logits' rows
  using Hits = ShardedTensor<T, typename L::MeshT, typename decltype(predicted)::SpecType>;
  Hits hits(logits.mesh(), predicted.global_shape());
  T* h = hits.data();
  std::fill(h, h + hits.padded_size(), T(0));
  const auto* want = std::as_const(lab).data();
  const std::int64_t* got = predicted.data();
  tshard::detail::for_each_valid_run(tshard::detail::layout_of(hits),
                                     [&](tshard::detail::Index off, tshard::detail::Index n) {
                                       for (tshard::detail::Index r = off; r < off + n; ++r)
                                         h[r] = got[r] == std::int64_t(want[r]) ? T(1) : T(0);
                                     });
  const Eigen::Tensor<T, 0> total = detail::sum_all(hits).gather();
  return total() / T(detail::rows_of(logits));
}

// d cross_entropy / d logits = (softmax(logits) - onehot(labels)) / rows, with the logits' spec.
template <tshard::detail::FloatingTensor L, ShardedTensorType Labels>
auto cross_entropy_backward(const L& logits_in, const Labels& labels) {
  detail::require_logits_and_labels<L, Labels>();
  using T = typename L::Scalar;
  tshard::detail::OperatorScope scope("cross_entropy_backward");
  const auto& logits = tshard::detail::resolved(logits_in, "cross_entropy_backward");
  const auto lab = detail::aligned_labels(logits, labels, "cross_entropy_backward");
  constexpr int V = L::rank - 1;
  return detail::softmax_minus_labels(exp(logits - max<V>(logits, keep_dims)), lab, logits);
}

}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::nn::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void fused_cross_entropy_vjp<T>(tshard::detail::TypedGradNode<T>&, \
    const tshard::detail::TapeValue<T>&, std::optional<tshard::detail::BlockValue<T>>&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::nn::detail
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_RULE_INSTANCE_1(T, TapeValue<T>, nn::detail::FusedCrossEntropy<T>)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
