// JAX's vjp: a forward run now with its tape kept, and a pullback that sends a cotangent of its
// output back to its inputs later, once the caller has one. value_and_grad in two halves: a
// pipeline stage runs a micro-batch's forward, sends the output on, and runs the pullback when
// the next stage's gradient comes back, with several micro-batches pending at once (each forward
// has its own tape and its own parameter leaves, so nothing of one is in another's way).
//
//   auto [y, pullback] = ts::ad::vjp(f, x1, x2);     // y = f(x1, x2), recorded
//   auto [dx1, dx2] = pullback(dy);                  // dy: y's shape, any spec (a partial sum too)
//   auto [loss, pb] = ts::ad::vjp(model, f, x);      // also the model's parameters: pb(dy) adds
//   auto [dx] = pb(0.25);                            // d/dp into their gradients (a scalar y is
//                                                    // seeded with a number, 1 by default)
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "tshard/ad/grad.hpp"

namespace tshard::detail {

// What ts::ad::vjp(model, ...) and ts::ad::backward(model, ...) need of a model: a Module's
// parameter tracking (nn/ is above this layer, so it is asked for by what it does).
template <class Model>
concept TrackedModel = requires(Model& m) {
  m.track_parameters();
  m.untrack_parameters();
  m.gradient_collector(m.track_parameters());
};

// A model's part in a pullback: advance(order) once every node of that order or newer has run
// (a module whose parameters are all final then has its gradients collected and reported
// ready), finish() at the end.
struct ModelGradients {
  std::function<void(std::uint64_t)> advance;
  std::function<void()> finish;
};

// The tensor whose node a forward's result carries (ad::Scalar: its rank-0 tensor).
template <class R>
const auto& result_tensor(const R& r) {
  if constexpr (is_loss_v<R>) return r.tensor();
  else return r;
}

// The result handed back to the caller without its node: the pullback holds the node, and a
// result used in later code must not tie that code to this forward's tape.
template <class R>
R detached(R r) {
  if constexpr (is_loss_v<R>) {
    return R(tape_output(r.tensor()));
  } else {
    TensorAccess::set_node(r, nullptr);
    return r;
  }
}

}  // namespace tshard::detail

namespace tshard::ad {

// The second half of vjp: called once, with the output's cotangent, it runs the recorded rules
// back to the inputs and returns their gradients (each of its input's exact type), and adds the
// parameters' into a model's gradients where vjp was given one.
template <class R, class... X>
class Pullback {
  using Y = std::remove_cvref_t<decltype(detail::result_tensor(std::declval<const R&>()))>;
  using T = typename Y::Scalar;
  static constexpr bool scalar_output = detail::is_loss_v<R> || Y::rank == 0;

 public:
  Pullback(std::shared_ptr<detail::Tape> tape, std::shared_ptr<detail::TypedGradNode<T>> output,
           std::tuple<X...> primals, std::tuple<std::shared_ptr<detail::TypedGradNode<typename X::Scalar>>...> leaves,
           detail::ModelGradients collect)
      : tape_(std::move(tape)),
        output_(std::move(output)),
        primals_(std::move(primals)),
        leaves_(std::move(leaves)),
        collect_(std::move(collect)) {}

  // The output's cotangent dy: a tensor of the output's shape and element type, in any spec
  // (a partial sum included: it is the cotangent of the sum it stands for).
  template <class DY>
    requires detail::is_sharded_tensor<DY>::value
  std::tuple<X...> operator()(const DY& dy) {
    static_assert(std::is_same_v<typename DY::Scalar, T>, "tshard: a cotangent has its output's element type");
    static_assert(DY::rank == Y::rank, "tshard: a cotangent has its output's rank");
    static_assert(!DY::is_partial || detail::partial_kind<typename DY::PartialType>() == detail::PartialKind::Sum,
                  "tshard: a cotangent may be a partial sum, never a partial max or min");
    begin();
    if (output_) {
      if (detail::extents_of(dy) != output_->shape)
        throw ShapeError("tshard::ad::vjp: the cotangent " + dy.describe() + " does not have the output's shape " +
                         detail::shape_to_string(output_->shape, Y::rank));
      detail::add_cotangent(*output_, DY::spec_desc, detail::TensorAccess::storage(dy));
    }
    return finish();
  }
  // A scalar output's cotangent: the number its gradient is scaled by (1: d output / d x).
  std::tuple<X...> operator()(double seed = 1.0)
    requires scalar_output
  {
    begin();
    if (output_) {
      auto one = detail::pooled_array<T>(1);
      one.get()[0] = T(seed);
      detail::add_cotangent(*output_, output_->primal, std::move(one));
    }
    return finish();
  }
  // Whether the pullback has run (it runs once: the rules drop what they saved as they go).
  bool done() const { return done_; }

 private:
  void begin() {
    if (done_)
      throw SpecError("tshard::ad::vjp: the pullback has run already; each forward's pullback runs once");
    done_ = true;
  }
  std::tuple<X...> finish() {
    detail::propagate_all(*tape_, [&](std::uint64_t order) {
      if (collect_.advance) collect_.advance(order);
    });
    output_.reset();
    if (collect_.finish) collect_.finish();
    collect_ = {};
    auto out = [&]<std::size_t... I>(std::index_sequence<I...>) {
      return std::tuple<X...>{detail::leaf_gradient(*std::get<I>(leaves_), std::get<I>(primals_))...};
    }(std::index_sequence_for<X...>{});
    tape_.reset();
    return out;
  }

  std::shared_ptr<detail::Tape> tape_;
  std::shared_ptr<detail::TypedGradNode<T>> output_;  // null where the output depends on no input
  std::tuple<X...> primals_;  // each input's shape and spec (no buffer): its gradient's type
  std::tuple<std::shared_ptr<detail::TypedGradNode<typename X::Scalar>>...> leaves_;
  detail::ModelGradients collect_;  // a model's: parameter cotangents into their gradients
  bool done_ = false;
};

namespace detail_vjp {

// A model's part in a forward: track() makes its parameters leaves of the active tape and returns
// what adds their cotangents into the gradients later; untrack() makes them plain again.
struct ModelTracking {
  std::function<tshard::detail::ModelGradients()> track;
  std::function<void()> untrack;
};

template <class F, class... X>
auto record_forward(F&& f, const ModelTracking& model, const X&... x) {
  (tshard::detail::require_differentiable<X>(), ...);
  using R = std::remove_cvref_t<std::invoke_result_t<F, const X&...>>;
  using Y = std::remove_cvref_t<decltype(tshard::detail::result_tensor(std::declval<const R&>()))>;
  static_assert(tshard::detail::is_sharded_tensor<Y>::value || tshard::detail::is_loss_v<R>,
                "tshard: the function given to ad::vjp returns a ShardedTensor or a scalar (cross_entropy's result)");
  auto tape = std::make_shared<tshard::detail::Tape>();
  std::tuple<X...> leaves{tshard::detail::tape_value(x)...};
  tshard::detail::ModelGradients collect;
  std::optional<R> result;
  std::tuple<std::shared_ptr<tshard::detail::TypedGradNode<typename X::Scalar>>...> nodes;
  {
    tshard::detail::ActiveTape active(*tape);
    nodes = tshard::detail::make_leaves(leaves);
    // The parameters are plain again as soon as the forward ends, throwing or not (the tape holds
    // what it needs of them), so the next forward tracks them afresh on its own tape.
    struct Untrack {
      const ModelTracking& m;
      bool armed = false;
      ~Untrack() {
        if (armed) m.untrack();
      }
    } untrack{model};
    if (model.track) {
      untrack.armed = true;
      collect = model.track();
    }
    result.emplace(std::apply(f, std::as_const(leaves)));
  }
  auto output = std::static_pointer_cast<tshard::detail::TypedGradNode<typename Y::Scalar>>(
      tshard::detail::TensorAccess::node(tshard::detail::result_tensor(*result)));  // null: no input reached it
  std::tuple<X...> primals{X(tshard::detail::AdoptStorage{}, x.mesh(), x.global_shape(), nullptr)...};
  R y = tshard::detail::detached(std::move(*result));
  return std::pair<R, Pullback<R, X...>>(
      std::move(y), Pullback<R, X...>(std::move(tape), std::move(output), std::move(primals), std::move(nodes),
                                      std::move(collect)));
}

}  // namespace detail_vjp

// y = f(x...), recorded, and the pullback that takes y's cotangent to the x's gradients.
template <class F, class... X>
  requires(detail::is_sharded_tensor<X>::value && ...)
auto vjp(F&& f, const X&... x) {
  return detail_vjp::record_forward(std::forward<F>(f), detail_vjp::ModelTracking{}, x...);
}

// The same for a forward through a model (a ts::nn::Module): the pullback also adds d/dp into
// the gradient of every registered parameter p (their data-parallel sum left to an owning
// optimizer, as backward(model, ...) does), then reports them ready to it.
template <class Model, class F, class... X>
  requires detail::TrackedModel<Model> && (detail::is_sharded_tensor<X>::value && ...)
auto vjp(Model& model, F&& f, const X&... x) {
  const detail_vjp::ModelTracking tracking{
      [&model]() -> detail::ModelGradients {
        auto collector = std::make_shared<detail::GradientCollectorOf<Model>>(
            model.gradient_collector(model.track_parameters()));
        return {[collector](std::uint64_t order) { collector->advance(order); }, [collector] { collector->finish(); }};
      },
      [&model] { model.untrack_parameters(); }};
  return detail_vjp::record_forward(std::forward<F>(f), tracking, x...);
}

}  // namespace tshard::ad
