// What every layer and model shares. A Module registers its parameters and submodules by name
// (libtorch's register_parameter / register_module) and gets, for free and recursively:
// parameter_names(), zero_grad(), train()/eval(), the optimizer's view of its parameters
// (opt.add(model)), and their tracking by ts::ad::backward(model, loss). Deferring the
// data-parallel gradient sums to an optimizer is the base class's job too: it reaches every
// registered submodule, so a composite cannot forget to pass it on.
//
// ts::ad::backward adds each parameter's gradient (detail::accumulate_gradient). Alone, a gradient
// is complete after backward: the sum over the data-parallel axes (the partial a weight gradient
// carries where the batch is split) is resolved at once. Once an optimizer owns the module
// (opt.add(model)), each rank adds only its own partial sum and the optimizer reduces it,
// bucketed and non-blocking as soon as the module's backward ends (PyTorch DDP), or
// reduce-scattered under ZeRO-2 and -3.
//
// Modules move but do not copy. Parameters live in shared slots (an optimizer holds their
// handles), so a move leaves nothing dangling; a moved composite re-points its registered
// submodules (members move with it), and a moved submodule tells its parent where it went.
#pragma once
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/parallel/hooks.hpp"
#include "tshard/parallel/micro_batch.hpp"
#include "tshard/nn/parameter.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn {

// The leaves one forward's parameters got on its tape, in for_each_module order.
using ParameterLeaves = std::vector<std::shared_ptr<tshard::detail::GradNode>>;

class Module {
 public:
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&& o) noexcept;
  Module& operator=(Module&&) = delete;
  virtual ~Module() = default;

  // A parameter of this module, held by it; the reference stays valid as long as the module.
  // Its gradient starts at zero. A name is registered once.
  template <class T, class M, class S>
  ShardedTensor<T, M, S>& register_parameter(const std::string& name, ShardedTensor<T, M, S> value) {
    static_assert(is_real_floating_v<T>, "tshard: parameters are float, double or bfloat16 tensors");
    auto slot = std::make_shared<detail::TypedParameterSlot<T, M, S>>(std::move(value));
    auto& v = slot->value();
    add_parameter(name, std::move(slot));
    return v;
  }
  // A buffer: state of the module that is saved and loaded with it (state_dict) but is not a
  // parameter (no gradient, no optimizer): BatchNorm's running statistics, a step counter. Any
  // element type; the reference stays valid as long as the module.
  template <class T, class M, class S>
  ShardedTensor<T, M, S>& register_buffer(const std::string& name, ShardedTensor<T, M, S> value) {
    check_name(name);
    auto tensor = std::make_shared<ShardedTensor<T, M, S>>(std::move(value));
    auto& v = *tensor;
    buffers_.push_back({name, detail::state_of_tensor(std::move(tensor))});
    return v;
  }

  // A submodule (a member of this one, or owned elsewhere and outliving it); its parameters are
  // this module's under "name.". Returns the child.
  template <class Child>
  Child& register_module(const std::string& name, Child& child) {
    static_assert(std::is_base_of_v<Module, Child>, "tshard: register_module takes a ts::nn::Module");
    add_module(name, child);
    child.defer_gradient_sums(deferred_);
    return child;
  }

  // The gradient of a parameter of this module or of any submodule (scale -> its gradient, as
  // p.grad). Once an optimizer owns the module, it first completes the gradient's data-parallel
  // sum (and, under ZeRO-2 and -3, gathers the reduced chunks): collective over the data axis, so
  // every rank reads it, as every rank gathers a tensor.
  template <class T, class M, class S>
  ShardedTensor<T, M, S>& gradient_of(const ShardedTensor<T, M, S>& value) {
    Module* owner = nullptr;
    for_each_module([&](Module& m, const std::string&) {
      if (!owner && m.holds(&value)) owner = &m;
    });
    if (!owner)
      throw SpecError("tshard::nn::Module::gradient_of: " + value.describe() +
                      " is not a parameter of this module or of its submodules");
    auto& g = owner->gradient_slot(value).grad();
    if (owner->hooks_.gradients_read) owner->hooks_.gradients_read();
    return g;
  }

  // Every parameter's name, submodules' first (in registration order, prefixed "name."), then
  // this module's own in registration order.
  std::vector<std::string> parameter_names() const;
  // Every parameter's name with its global shape, in parameter_names() order.
  std::vector<std::pair<std::string, std::vector<Eigen::Index>>> parameter_shapes() const;
  // Every buffer's name, in the order of parameter_names() (submodules' first).
  std::vector<std::string> buffer_names() const;
  // f(name, entry) for every registered buffer, submodules' first.
  template <class F>
  void for_each_buffer(F&& f, const std::string& prefix = "") const {
    for (const auto& c : children_) c.module->for_each_buffer(f, prefix + c.name + ".");
    for (const auto& b : buffers_) f(prefix + b.name, b.state);
  }
  // f(name, entry, is_buffer) for every parameter and buffer: submodules' first, then this
  // module's parameters, then its buffers (state_dict's order).
  template <class F>
  void for_each_state(F&& f, const std::string& prefix = "") const {
    for (const auto& c : children_) c.module->for_each_state(f, prefix + c.name + ".");
    for (const auto& p : parameters_) f(prefix + p.name, p.slot->value_state(), false);
    for (const auto& b : buffers_) f(prefix + b.name, b.state, true);
  }
  // f(name, slot, owning module) for every registered parameter, in parameter_names() order.
  template <class F>
  void for_each_slot(F&& f, const std::string& prefix = "") const {
    for (const auto& c : children_) c.module->for_each_slot(f, prefix + c.name + ".");
    for (const auto& p : parameters_) f(prefix + p.name, *p.slot, *this);
  }
  // The handle of a registered parameter by its full name (SpecError if there is none).
  std::shared_ptr<detail::ParameterSlot> parameter_slot(const std::string& name) const;
  // f(module, prefix) for this module and every submodule, parents first.
  template <class F>
  void for_each_module(F&& f, const std::string& prefix = "") const {
    f(*this, prefix);
    for (const auto& c : children_) c.module->for_each_module(f, prefix + c.name + ".");
  }
  template <class F>
  void for_each_module(F&& f, const std::string& prefix = "") {
    f(*this, prefix);
    for (auto& c : children_) c.module->for_each_module(f, prefix + c.name + ".");
  }
  bool has_own_parameters() const { return !parameters_.empty(); }
  // f(name, slot) for this module's own parameters (not its submodules'), in registration order.
  template <class F>
  void for_each_own_slot(F&& f) const {
    for (const auto& p : parameters_) f(p.name, *p.slot);
  }
  // Whether every use of this module's own parameters is bracketed by use() (ZeRO-3 may then
  // keep them sharded outside): the layers of nn/ do; a user's module need not.
  bool streams_parameters() const { return streams_parameters_; }

  // Zeroes every registered gradient (this module's and its submodules').
  void zero_grad();
  // Training or evaluation mode, for this module and every submodule (PyTorch's train()/eval()).
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }

  // Which micro-batch this module's forward belongs to: where its rows sit in the whole batch
  // (dropout masks and expert routing depend on it), whether it is an evaluation's or a
  // recomputation's. Its owner (a pipeline) sets it through the whole tree; by default the
  // forward is the whole batch, micro-batch 0 of 1. Each model has its own: nothing
  // process-wide is read by a forward written for ts::ad.
  const MicroBatch& micro_batch() const { return micro_batch_; }
  void set_micro_batch(const MicroBatch& mb);

  // ---- what ts::ad::backward(model, loss) and ts::ad::vjp(model, ...) call ----
  // Every registered parameter becomes a fresh leaf of the active tape; the leaves come back in
  // for_each_module_children_first order, for gradient_collector once that forward's backward runs.
  ParameterLeaves track_parameters();
  void untrack_parameters();
  // Adds each leaf's cotangent into its parameter's gradient (its data-parallel sum left to an
  // owning optimizer) and reports each module ready to its owner once its submodules' and its
  // own gradients are in. ts::ad drives it while the backward runs: advance(order) as nodes
  // finish, so a layer an optimizer took whole starts reducing as its backward ends (DDP's
  // overlap), finish() at the end.
  class GradientCollector {
   public:
    GradientCollector(Module& root, ParameterLeaves leaves) : root_(&root), leaves_(std::move(leaves)) {}
    // Every node of creation order >= `order` has run.
    void advance(std::uint64_t order);
    void finish();

   private:
    // The order in which modules become final, read once the forward has recorded its nodes
    // (each leaf's oldest consumer is known then).
    void plan();
    struct Entry {
      std::uint64_t threshold;
      Module* module;
      std::size_t first, count;  // its own parameters' leaves
    };
    void fire(const Entry& e);
    Module* root_;
    ParameterLeaves leaves_;
    std::vector<Entry> entries_;
    std::size_t next_ = 0;
    bool planned_ = false;
    const std::function<void()>* progress_ = nullptr;  // an owner's (the optimizer's), where one is set
  };
  GradientCollector gradient_collector(ParameterLeaves leaves) { return GradientCollector(*this, std::move(leaves)); }

  // f(module) for every submodule before its parent (post-order).
  template <class F>
  void for_each_module_children_first(F&& f) {
    for (auto& c : children_) c.module->for_each_module_children_first(f);
    f(*this);
  }

  // ---- what an optimizer sets ----
  void attach_hooks(LayerHooks hooks) { hooks_ = std::move(hooks); }
  // Mesh axes (a bit mask) whose gradient sums this module and its submodules leave to their owner.
  void defer_gradient_sums(std::uint32_t axes);
  std::uint32_t deferred_gradient_sums() const { return deferred_; }

 protected:
  // Whether one of this module's own slots holds the tensor at `identity`.
  bool holds(const void* identity) const {
    for (const auto& p : parameters_)
      if (p.slot->identity() == identity) return true;
    for (const auto& s : spare_)
      if (s->identity() == identity) return true;
    return false;
  }
  template <class T, class M, class S>
  detail::TypedParameterSlot<T, M, S>& gradient_slot(const ShardedTensor<T, M, S>& value) {
    for (const auto& p : parameters_)
      if (p.slot->identity() == &value) return static_cast<detail::TypedParameterSlot<T, M, S>&>(*p.slot);
    for (const auto& s : spare_)
      if (s->identity() == &value) return static_cast<detail::TypedParameterSlot<T, M, S>&>(*s);
    throw SpecError("tshard::nn::Module::gradient_of: " + value.describe() + " is not a parameter of this module");
  }

  // A layer's parameter, held in a slot like register_parameter's; an empty name keeps it
  // unregistered (a switched-off bias: used, never updated).
  template <class T, class M, class S>
  ShardedTensor<T, M, S>& own_parameter(const std::string& name, ShardedTensor<T, M, S> value) {
    if (!name.empty()) return register_parameter(name, std::move(value));
    auto slot = std::make_shared<detail::TypedParameterSlot<T, M, S>>(std::move(value));
    auto& v = slot->value();
    spare_.push_back(std::move(slot));
    return v;
  }

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
  bool streams_parameters_ = false;  // set by the layers whose every forward and backward call use()

 private:
  struct NamedParameter {
    std::string name;
    std::shared_ptr<detail::ParameterSlot> slot;
  };
  struct NamedChild {
    std::string name;
    Module* module;
  };
  struct NamedBuffer {
    std::string name;
    std::shared_ptr<StateTensor> state;
  };
  void check_name(const std::string& name) const;
  void add_parameter(const std::string& name, std::shared_ptr<detail::ParameterSlot> slot);
  // register_module's checks and links, alike for every type of child.
  void add_module(const std::string& name, Module& child);

  std::vector<NamedParameter> parameters_;
  std::vector<NamedBuffer> buffers_;
  std::vector<std::shared_ptr<detail::ParameterSlot>> spare_;  // unregistered (own_parameter(""))
  std::vector<NamedChild> children_;
  bool training_ = true;
  MicroBatch micro_batch_;
  Module* parent_ = nullptr;  // the module this one is registered in, if any
};

}  // namespace tshard::nn

#if TSHARD_HEADER_BODIES
#include "tshard/nn/module-inl.hpp"
#endif
