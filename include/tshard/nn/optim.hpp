// Optimizers over sharded parameters: each parameter is updated where it lives, in one pass
// over its valid elements, with state (momentum, moments) laid out like the parameter. A
// gradient registered with add() is read when step() runs (kept by reference).
#pragma once
#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tshard/core/box_copy.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn {
namespace detail {

// The registered (parameter, gradient) pairs of an optimizer, each with its update closure
// owning its state, and the step count that bias corrections and first steps read.
template <class Options>
class ParameterUpdates {
 public:
  explicit ParameterUpdates(const Options& options) : options_(options) {}

  // One update of every registered parameter from its gradient's current values.
  void step() {
    ++steps_;
    for (auto& u : updates_) u(options_, steps_);
  }
  long steps() const { return steps_; }
  Options& options() { return options_; }

 protected:
  using Update = std::function<void(const Options&, long)>;
  template <class T, class M, class S>
  void check_pair(const ShardedTensor<T, M, S>& param, const ShardedTensor<T, M, S>& grad, const char* name) const {
    if (param.extents() != grad.extents() || !(param.mesh() == grad.mesh()))
      throw ShapeError(std::string("tshard::nn::") + name + "::add: the gradient " + grad.describe() +
                       " does not match the parameter " + param.describe());
  }
  void push(Update u) { updates_.push_back(std::move(u)); }

 private:
  Options options_;
  long steps_ = 0;
  std::vector<Update> updates_;
};

}  // namespace detail

// AdamW's settings, in this order (designated initializers: {.lr = 1e-3f, ...}).
struct AdamWOptions {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;
};

// Adam with decoupled weight decay (Loshchilov and Hutter 2019), PyTorch's formula:
//   p *= 1 - lr wd;  m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
//   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
class AdamW : public detail::ParameterUpdates<AdamWOptions> {
 public:
  using Options = AdamWOptions;
  explicit AdamW(const Options& options) : ParameterUpdates(options) {}

  // Registers a parameter and its gradient (one spec, not partial), both kept by reference.
  template <class T, class M, class S>
  void add(ShardedTensor<T, M, S>& param, ShardedTensor<T, M, S>& grad) {
    static_assert(std::is_floating_point_v<T>, "tshard: AdamW updates float or double parameters");
    check_pair(param, grad, "AdamW");
    auto m = std::make_shared<ShardedTensor<T, M, S>>(zeros_like(param));
    auto v = std::make_shared<ShardedTensor<T, M, S>>(zeros_like(param));
    push([&param, &grad, m, v](const Options& o, long t) {
      const T lr = T(o.lr), b1 = T(o.beta1), b2 = T(o.beta2), eps = T(o.eps);
      const T decay = T(1) - lr * T(o.weight_decay);
      const T step = lr / T(1 - std::pow(double(o.beta1), double(t)));
      const T root_bc2 = T(std::sqrt(1 - std::pow(double(o.beta2), double(t))));
      T* p = param.data();
      const T* g = std::as_const(grad).data();
      T* mm = m->data();
      T* vv = v->data();
      tshard::detail::for_each_valid_run(param.layout(), [&](tshard::detail::Index off, tshard::detail::Index n) {
        for (tshard::detail::Index i = off; i < off + n; ++i) {
          mm[i] = b1 * mm[i] + (T(1) - b1) * g[i];
          vv[i] = b2 * vv[i] + (T(1) - b2) * g[i] * g[i];
          p[i] = p[i] * decay - step * mm[i] / (std::sqrt(vv[i]) / root_bc2 + eps);
        }
      });
    });
  }

};

struct SGDOptions {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float weight_decay = 0.0f;
};

// SGD with momentum, PyTorch's formula: g += wd p; b = momentum b + g (b = g at the first
// step); p -= lr b (p -= lr g without momentum).
class SGD : public detail::ParameterUpdates<SGDOptions> {
 public:
  using Options = SGDOptions;
  explicit SGD(const Options& options) : ParameterUpdates(options) {}

  template <class T, class M, class S>
  void add(ShardedTensor<T, M, S>& param, ShardedTensor<T, M, S>& grad) {
    static_assert(std::is_floating_point_v<T>, "tshard: SGD updates float or double parameters");
    check_pair(param, grad, "SGD");
    auto b = std::make_shared<ShardedTensor<T, M, S>>(zeros_like(param));
    push([&param, &grad, b](const Options& o, long t) {
      const T lr = T(o.lr), mu = T(o.momentum), wd = T(o.weight_decay);
      T* p = param.data();
      const T* g = std::as_const(grad).data();
      T* buf = b->data();
      tshard::detail::for_each_valid_run(param.layout(), [&](tshard::detail::Index off, tshard::detail::Index n) {
        for (tshard::detail::Index i = off; i < off + n; ++i) {
          const T d = g[i] + wd * p[i];
          buf[i] = t == 1 ? d : mu * buf[i] + d;
          p[i] -= lr * (mu != T(0) ? buf[i] : d);
        }
      });
    });
  }

};

}  // namespace tshard::nn
