// What every layer shares: the hooks an optimizer attaches to a layer it was given whole, the
// data-parallel gradient sum a layer may leave to that optimizer, and activations saved for
// backward without their type.
//
// A layer adds its parameter gradients by accumulate_gradient(). Alone, a gradient is complete
// after backward: the sum over the data-parallel axes (the partial a weight gradient carries
// where the batch is split) is resolved at once. Once an optimizer owns the layer
// (opt.add(layer)), each rank adds only its own partial sum and the optimizer reduces it,
// bucketed and non-blocking as soon as the layer's backward ends (PyTorch DDP), or
// reduce-scattered under ZeRO-2 and -3.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "tshard/nn/micro_batch.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn {

// Set by an optimizer on a layer it owns; each may be empty.
struct LayerHooks {
  std::function<void()> before_use;       // ZeRO-3: gather the layer's parameters
  std::function<void()> after_use;        // ZeRO-3: release them again
  std::function<void()> gradients_ready;  // the layer's backward has ended: reduce its gradients
};

// The base of every layer: hooks and the deferred gradient axes.
class Module {
 public:
  void attach_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }
  // Mesh axes (a bit mask) whose gradient sums this layer leaves to its owner.
  void defer_gradient_sums(std::uint32_t axes) { deferred_ = axes; }
  std::uint32_t deferred_gradient_sums() const { return deferred_; }

 protected:
  // Brackets a forward or backward: parameters present inside (ZeRO-3), released after.
  class Use {
   public:
    explicit Use(const LayerHooks& h) : h_(h) {
      if (h_.before_use) h_.before_use();
    }
    ~Use() {
      if (h_.after_use) h_.after_use();
    }
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;

   private:
    const LayerHooks& h_;
  };
  Use use() const { return Use(hooks_); }
  void gradients_ready() const {
    if (hooks_.gradients_ready) hooks_.gradients_ready();
  }

  LayerHooks hooks_;
  std::uint32_t deferred_ = 0;
};

namespace detail {

using tshard::detail::Extents;
using tshard::detail::Index;
using tshard::detail::SpecDesc;

// grad (laid out as `gd`) += a contribution laid out as `cd` (maybe partial). Sums over the
// axes in `deferred` are left to the owner: a partial sum over exactly those axes is added
// locally, and a complete contribution is added on the first rank along them only (adding
// zeros elsewhere keeps the owner's sum exact). A gradient split over a deferred axis has
// nothing to defer.
template <class T>
void accumulate_gradient(tshard::detail::MeshState& mesh, T* grad, const SpecDesc& gd, const Extents& shape, const T* c,
                         const SpecDesc& cd, std::uint32_t deferred, const char* op) {
  const auto layout = tshard::detail::shard_layout(gd, shape, mesh.shape(), mesh.coords());
  auto add = [&](const T* src) {
    tshard::detail::for_each_valid_run(layout, [&](Index off, Index n) {
      for (Index i = off; i < off + n; ++i) grad[i] += src[i];
    });
  };
  if (deferred && !(gd.split_axes() & deferred)) {
    if (cd.partial == tshard::detail::PartialKind::Sum && cd.partial_axes == deferred && cd.without_partial() == gd)
      return add(c);
    const auto aligned = tshard::detail::implicit_reshard(mesh, cd, gd, shape, c, op);
    bool first = true;
    for (int a = 0; a < mesh.shape().axes(); ++a)
      if ((deferred & (1u << a)) && mesh.coords()[a] != 0) first = false;
    if (first) add(aligned.data);
    return;
  }
  const auto aligned = tshard::detail::implicit_reshard(mesh, cd, gd, shape, c, op);
  add(aligned.data);
}

// Zeroes a gradient in place (acquiring its memory where it was released).
template <class T, class M, class S>
void zero_fill(ShardedTensor<T, M, S>& g) {
  tshard::detail::TensorAccess::acquire_storage(g, false);
  std::fill(g.data(), g.data() + g.padded_size(), T(0));
}

// The typed form: grad += contribution, with the deferred axes' sums left to the owner. A
// gradient whose memory was released (ZeRO-2) is acquired again, zeroed, first.
template <class T, class M, class S, class C>
void accumulate_gradient(ShardedTensor<T, M, S>& grad, const C& contribution, std::uint32_t deferred, const char* op) {
  static_assert(std::is_same_v<typename C::Scalar, T>, "tshard: a gradient contribution has the gradient's element type");
  if (tshard::detail::extents_of(grad) != tshard::detail::extents_of(contribution))
    throw ShapeError(std::string("tshard::nn::") + op + ": the gradient contribution " + contribution.describe() +
                     " does not match the gradient " + grad.describe());
  using G = ShardedTensor<T, M, S>;
  constexpr SpecDesc cd = C::spec_desc;
  if (!tshard::detail::TensorAccess::has_storage(grad) && deferred && !(G::spec_desc.split_axes() & deferred) &&
      cd.partial == tshard::detail::PartialKind::Sum && cd.partial_axes == deferred && cd.without_partial() == G::spec_desc) {
    // The first contribution after the owner's zero_grad(): copied, not added to zeros.
    tshard::detail::TensorAccess::acquire_storage(grad, false);
    const typename C::Scalar* c = contribution.data();
    std::copy(c, c + grad.padded_size(), grad.data());
    return;
  }
  tshard::detail::TensorAccess::acquire_storage(grad, true);
  accumulate_gradient(*tshard::detail::state_of(grad.mesh()), grad.data(), grad.spec_desc,
                      tshard::detail::extents_of(grad), contribution.data(), C::spec_desc, deferred, op);
}

// An activation kept for backward by sharing its buffer (a later write to the original copies
// first), once per micro-batch, recovered with the spec backward needs: resharded through the
// implicit entry point where the gradient arrives in another layout than the forward's input had.
template <class T, class M>
class SavedActivation {
 public:
  template <class X>
  void save(const X& x) {
    static_assert(!X::is_partial, "tshard: resolve a partial before saving it");
    auto& e = slots_.current();
    e.storage = tshard::detail::TensorAccess::storage(x);
    e.desc = X::spec_desc;
    e.shape = tshard::detail::extents_of(x);
    e.rank = X::rank;
  }
  bool empty() { return !slots_.current().storage; }
  void clear() { slots_.current() = Entry{}; }
  const T* data() { return slots_.current().storage.get(); }
  const SpecDesc& desc() { return slots_.current().desc; }
  const Extents& extents() { return slots_.current().shape; }
  int rank() { return slots_.current().rank; }

  template <class SpecT>
  ShardedTensor<T, M, SpecT> as(const M& mesh, const char* op) {
    using Out = ShardedTensor<T, M, SpecT>;
    const auto& e = slots_.current();
    if (!e.storage) throw SpecError(std::string("tshard::nn::") + op + ": no forward to take the gradient of");
    if (e.rank != Out::rank)
      throw ShapeError(std::string("tshard::nn::") + op + ": the gradient has rank " + std::to_string(Out::rank) +
                       ", the forward's input had rank " + std::to_string(e.rank));
    auto shape = tshard::detail::to_array<Out::rank>(e.shape);
    auto a = tshard::detail::implicit_reshard(*tshard::detail::state_of(mesh), e.desc, Out::spec_desc, e.shape,
                                              e.storage.get(), op);
    return Out(tshard::detail::AdoptStorage{}, mesh, shape, a.owned ? std::move(a.owned) : e.storage);
  }

 private:
  struct Entry {
    std::shared_ptr<T> storage;
    SpecDesc desc{};
    Extents shape{};
    int rank = 0;
  };
  PerMicroBatch<Entry> slots_;
};

}  // namespace detail
}  // namespace tshard::nn
