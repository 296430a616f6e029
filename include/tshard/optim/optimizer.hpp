// The optimizer over sharded parameters: each parameter is updated where it lives, in one pass
// over the valid elements this rank updates, with state (momentum, moments) laid out like its
// slice of the parameter, by an update rule (optim/adamw.hpp, optim/sgd.hpp). A gradient
// registered with add() is read when step() runs (kept by reference). add(model) takes every
// parameter a module registered: its gradients' data-parallel sums are then reduced by the
// optimizer's buckets (parallel/bucket.hpp), overlapped with the rest of backward, and
// weight-update sharding (ZeRO stages 1-3, parallel/slot.hpp) applies. The stage is an option,
// not another program. State is kept by parameter name (state_dict()).
#pragma once
#include <chrono>
#include <cmath>
#include <concepts>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <Eigen/Core>

#include "tshard/comm/clock.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/nn/parameter.hpp"
#include "tshard/nn/state.hpp"
#include "tshard/optim/param_groups.hpp"
#include "tshard/parallel/bucket.hpp"
#include "tshard/parallel/prefetch.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::optim {

using parallel::GradientReductionStats;
using parallel::OptimizerMemory;
using parallel::ParameterGatherStats;
using nn::StateDict;
using tshard::detail::Index;

// The registered parameters, their buckets and the update rule. A rule is a struct with
//   static constexpr int states;                       // state arrays per parameter
//   static constexpr const char* state_names[];        // their names in state_dict()
//   template <class T> static void update(const Options&, long step, T* p, const T* g, T* const* state, Index n);
// which updates n consecutive elements (AdamWRule, SGDRule). Options has lr, weight_decay,
// zero_stage, data_axis, overlap and prefetch.
template <class Options, class Rule>
class Optimizer {
  // (the data-parallel machinery under it, and the module system it takes parameters from)
  using BucketBase = parallel::detail::BucketBase;
  template <class T>
  using Bucket = parallel::detail::Bucket<T>;
  template <class T>
  using Slot = parallel::detail::Slot<T>;
  template <class T>
  using ParameterView = parallel::detail::ParameterView<T>;
  using Index = tshard::detail::Index;
  using Module = nn::Module;
  using LayerHooks = parallel::LayerHooks;

 public:
  explicit Optimizer(const Options& options) : options_(options) {
    if (options.zero_stage < 0 || options.zero_stage > 3)
      throw SpecError("tshard::optim: zero_stage " + std::to_string(options.zero_stage) + " is not 0, 1, 2 or 3");
    if constexpr (requires { options.bucket_bytes; })
      if (options.bucket_bytes < 0)
        throw SpecError("tshard::optim: bucket_bytes " + std::to_string(options.bucket_bytes) +
                        " is negative (0 reduces each module's gradients by themselves)");
  }
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // A parameter and its gradient (one spec, not partial), both kept by reference. The gradient
  // is complete when step() runs (the caller reduced it); ZeRO stages 1 and 2 shard the state.
  // `name` keys its state in state_dict() ("parameter<i>" where none is given).
  template <class T, class M, class S>
  void add(ShardedTensor<T, M, S>& param, ShardedTensor<T, M, S>& grad, std::string name = "") {
    static_assert(is_real_floating_v<T>, "tshard: optimizers update float, double or bfloat16 parameters");
    claim(&param, param.describe());
    auto& b = new_bucket<T>(param.mesh());
    b.add_member();
    register_slot(b, param, grad, /*owned by a module*/ false);
    name_slot(name.empty() ? "parameter" + std::to_string(names_.size()) : std::move(name));
    state_like_.push_back([&param]() -> std::pair<std::shared_ptr<nn::StateTensor>, void*> {
      return nn::detail::state_like(param);
    });
    finish_bucket(b);
  }

  // Every parameter a module registered, its submodules' included (a module written with
  // register_parameter / register_module). The gradients of consecutive modules that own
  // parameters are reduced together, up to the options' bucket_bytes (one module a bucket under
  // ZeRO-3, or with bucket_bytes 0): a bucket's reduction starts when ts::ad::backward has
  // collected all its modules' gradients. Under ZeRO-3 a layer's parameters are gathered only
  // around its own forward (the layers of nn/ bracket it); a user module's own parameters, read
  // anywhere in its forward, stay whole (ZeRO-2 for them). The data-parallel sums are deferred
  // to this optimizer through the whole tree. `group` picks each parameter's settings by its
  // name and shape (decay_matrices_only(wd) is nanoGPT's recipe); the optimizer keeps the
  // parameters' handles, so nothing dangles if the model goes first.
  template <class Mod>
    requires std::is_base_of_v<Module, Mod>
  void add(Mod& model, const std::function<ParameterGroup(const ParameterInfo&)>& group = {}) {
    std::uint32_t deferred = 0;
    bool any = false;
    OpenBucket open;  // the bucket the next module may join
    model.for_each_module([&](Module& m, const std::string& prefix) {
      if (!m.has_own_parameters()) return;
      any = true;
      ModuleBucket mine;
      m.for_each_own_slot([&](const std::string&, nn::detail::ParameterSlot& slot) { mine.elements += reduced_elements(slot); });
      m.for_each_own_slot([&](const std::string& name, nn::detail::ParameterSlot& slot) {
        add_module_slot(slot, prefix + name, group, m.streams_parameters(), mine, open, deferred);
      });
      m.attach_hooks(hooks_for(mine.bucket, mine.member));
      mine.finish();
    });
    if (any) model.defer_gradient_sums(deferred);
  }

  // A parameter held twice, this copy here and its twin on rank `peer` of `comm` with the same
  // shape, spec and data-parallel layout: a tied embedding and head on a pipeline's first and
  // last stages (Megatron's embedding group). After the data-parallel sums, each copy's
  // gradient becomes the sum of both, so the twins take the same update and stay equal;
  // clip_grad_norm counts the copy where `counted` is true, not its twin. Both ranks call it
  // after add(), with the other's rank.
  template <class T, class M, class S>
  void tie(const ShardedTensor<T, M, S>& param, MPI_Comm comm, int peer, bool counted) {
    for (auto& b : buckets_) {
      auto* typed = dynamic_cast<Bucket<T>*>(b.get());
      for (int j = 0; typed && j < typed->slot_count(); ++j) {
        auto& s = typed->slots[std::size_t(j)];
        if (s.identity != &param) continue;
        s.norm_elsewhere = !counted;
        ties_.push_back([typed, j, comm, peer] { return typed->add_twin_gradient(j, comm, peer); });
        return;
      }
    }
    throw SpecError("tshard::optim::Optimizer::tie: the parameter " + param.describe() + " was not added to this optimizer");
  }

  // Zeroes every registered gradient. A gradient of a module given whole goes back to the pool
  // instead (PyTorch's set_to_none): it holds no memory until the next backward writes it, so
  // read it only after a backward.
  void zero_grad() {
    for (auto& b : buckets_) b->zero_grad();
    ties_summed_ = false;
  }

  // While set, layers' gradients accumulate locally and are reduced by step() only (gradient
  // accumulation over micro-batches: reduce once, not once per micro-batch).
  void no_sync(bool on) { no_sync_ = on; }

  // Scales the gradients so that their global 2-norm is at most max_norm (PyTorch's
  // clip_grad_norm_); returns the norm before clipping. Every element counts once, whatever
  // its layout: a replicated parameter on one replica, a ZeRO-sharded gradient by its chunks.
  double clip_grad_norm(double max_norm) {
    finish_reductions();
    double local = 0;
    for (auto& b : buckets_) local += b->squared_norm();
    double total = local;
    if (world_ != MPI_COMM_NULL) {
      tshard::detail::OperatorScope scope("clip_grad_norm");
      tshard::detail::all_reduce(world_, &local, &total, 1, ReduceOp::Sum);
    }
    const double norm = std::sqrt(total);
    const double coef = max_norm / (norm + 1e-6);
    if (coef < 1)
      for (auto& b : buckets_) b->scale_gradients(coef);
    return norm;
  }

  // Parameters spread over more ranks than their own meshes (pipeline stages, each on its own
  // stage mesh): the global norm of clip_grad_norm sums over every rank of `mesh`.
  template <class M>
  void set_norm_mesh(const M& mesh) {
    world_ = mesh.comm();
    norm_mesh_ = tshard::detail::state_of(mesh);
    norm_mesh_set_ = true;
  }

  // One update of every registered parameter from its gradient's current values.
  void step() {
    finish_reductions();
    if (options_.zero_stage == 3) streaming_.end_step(buckets_);
    ++steps_;
    for (auto& u : updates_) u(options_, steps_);
    for (auto& b : buckets_) b->gather_parameters(false);
    for (auto& b : buckets_) b->new_round();
    ties_summed_ = false;
    reduction_ = this_step_;
    this_step_ = {};
  }

  // ZeRO-3: every parameter present again (to read, gather or save it); each layer releases
  // its own again after its next use, and step() releases them all (else they would be stale).
  void gather_parameters() {
    for (auto& b : buckets_) b->gather_parameters(true);
  }

  long steps() const { return steps_; }

  // ---- state by name ----
  // The state of every parameter as tensors of its shape and spec, named "<parameter>/<state>"
  // with PyTorch's state names (AdamW: exp_avg, exp_avg_sq; SGD: momentum_buffer); ZeRO's chunks
  // gathered (collective over the data axis). The step count is steps().
  StateDict state_dict() {
    require_distinct_names("state_dict");
    StateDict sd;
    for_each_slot([&](BucketBase& b, int j, std::size_t i) {
      for (int k = 0; k < Rule::states; ++k) {
        auto [t, block] = state_like_[i]();
        b.read_state(j, k, block);
        sd.add(names_[i] + "/" + Rule::state_names[k], std::move(t));
      }
    });
    return sd;
  }
  // Every parameter's state from `sd` by name (any spec, same shapes); each rank keeps its ZeRO
  // chunk. A missing entry is a SpecError naming it, before anything is written. `legacy`, where
  // given, names an entry when "<parameter>/<state>" is absent (e.g. an older file's names).
  void load_state_dict(const StateDict& sd,
                       const std::function<std::string(const std::string& name, int state)>& legacy = {}) {
    require_distinct_names("load_state_dict");
    auto key = [&](const std::string& name, int k) {
      std::string n = name + "/" + Rule::state_names[k];
      if (!sd.contains(n) && legacy && sd.contains(legacy(name, k))) n = legacy(name, k);
      return n;
    };
    std::vector<std::string> missing;
    for_each_slot([&](BucketBase&, int, std::size_t i) {
      const std::string& name = names_[i];
      for (int k = 0; k < Rule::states; ++k)
        if (!sd.contains(key(name, k))) missing.push_back(name + "/" + Rule::state_names[k]);
    });
    if (!missing.empty())
      throw SpecError("tshard::optim::Optimizer::load_state_dict: no state for " + nn::detail::name_list(missing));
    for_each_slot([&](BucketBase& b, int j, std::size_t i) {
      for (int k = 0; k < Rule::states; ++k) {
        auto [t, block] = state_like_[i]();
        t->assign(sd.at(key(names_[i], k)), key(names_[i], k));
        b.write_state(j, k, block);
      }
    });
  }
  // The names the parameters were added under, in registration order.
  const std::vector<std::string>& parameter_names() const { return names_; }

  // ---- checkpoints by index ----
  // Parameters in registration order (opt.add order, each module's parameter_names() order); per parameter,
  // state_count() arrays of its local block's size (AdamW: m and v).
  static constexpr int state_count() { return Rule::states; }
  int parameter_count() const {
    int n = 0;
    for (auto& b : buckets_) n += b->slot_count();
    return n;
  }
  // State k of parameter i as its whole local block (padded, like the parameter's buffer):
  // ZeRO's chunks are gathered over the data axis (collective over it).
  void read_state(int i, int k, void* block) {
    auto [b, j] = locate(i);
    b->read_state(j, k, block);
  }
  void write_state(int i, int k, const void* block) {
    auto [b, j] = locate(i);
    b->write_state(j, k, block);
  }
  // After parameters were loaded (with gather_parameters() before, under ZeRO-3): stage 3's
  // master chunks are taken from them again.
  void reload_parameters() {
    for (auto& b : buckets_) b->drop_prefetch();  // (it holds the chunks from before the load)
    for (auto& b : buckets_) b->reload_parameters();
  }
  // The number of updates done, for the bias correction; a resumed run sets it.
  void set_steps(long n) { steps_ = n; }
  Options& options() { return options_; }
  const Options& options() const { return options_; }
  int zero_stage() const { return options_.zero_stage; }
  // Bytes held now for parameters, gradients and state on this rank.
  OptimizerMemory memory() const {
    OptimizerMemory m;
    for (auto& b : buckets_) {
      const auto x = b->memory();
      m.parameters += x.parameters;
      m.gradients += x.gradients;
      m.state += x.state;
      m.model_elements += x.model_elements;
      m.data_split_elements += x.data_split_elements;
    }
    return m;
  }
  const GradientReductionStats& last_reduction() const { return reduction_; }
  const ParameterGatherStats& last_parameter_gathers() const { return streaming_.last_step(); }

 private:
  // f(bucket, slot index in it, parameter index) for every registered parameter, in registration order.
  template <class F>
  void for_each_slot(F&& f) {
    std::size_t i = 0;
    for (auto& b : buckets_)
      for (int j = 0; j < b->slot_count(); ++j) f(*b, j, i++);
  }
  void name_slot(std::string name) { names_.push_back(std::move(name)); }
  // State by name needs the names apart (modules added one by one may each have a "weight").
  void require_distinct_names(const char* op) const {
    std::set<std::string> seen;
    for (const auto& n : names_)
      if (!seen.insert(n).second)
        throw SpecError(std::string("tshard::optim::Optimizer::") + op + ": two parameters are named \"" + n +
                        "\": add their modules through one parent module (their names then differ by its prefixes)");
  }

  std::pair<BucketBase*, int> locate(int i) {
    for (auto& b : buckets_) {
      if (i < b->slot_count()) return {b.get(), i};
      i -= b->slot_count();
    }
    throw SpecError("tshard::optim::Optimizer: no parameter " + std::to_string(i) + " to read or write the state of");
  }

  template <class M>
  std::uint32_t data_mask(const M& mesh) const {
    return data_mask(*tshard::detail::state_of(mesh));
  }
  // The mesh axes named in data_axis ("data", or several: "data,context"); a name the mesh
  // lacks adds none.
  std::uint32_t data_mask(const tshard::detail::MeshState& mesh) const {
    const auto& names = mesh.shape().names;
    std::uint32_t mask = 0;
    std::string_view list(options_.data_axis);
    while (!list.empty()) {
      const auto comma = list.find(',');
      const std::string_view name = list.substr(0, comma);
      for (std::size_t a = 0; a < names.size(); ++a)
        if (names[a] == name) mask |= 1u << a;
      list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    }
    return mask;
  }

  template <class T, class M>
  Bucket<T>& new_bucket(const M& mesh) {
    return new_bucket<T>(*tshard::detail::state_of(mesh));
  }
  template <class T>
  Bucket<T>& new_bucket(tshard::detail::MeshState& state) {
    // The data-parallel group: every data axis, its rank the mixed radix of their coordinates
    // (the group's own rank order), so ZeRO's chunk j lives on the group's rank j.
    const std::uint32_t mask = data_mask(state);
    int n = 1, c = 0;
    for (int a = 0; a < state.shape().axes(); ++a)
      if (mask & (1u << a)) {
        n *= state.shape().sizes[a];
        c = c * state.shape().sizes[a] + state.coords()[a];
      }
    auto b = std::make_unique<Bucket<T>>(state.group_of_mask(mask), state.node_groups(mask), n, c, options_.zero_stage);
    b->data_mask = mask;
    b->coords = state.coords();
    if (!norm_mesh_set_) world_ = state.comm();
    auto* raw = b.get();
    buckets_.push_back(std::move(b));
    return *raw;
  }

  // What a module given whole calls: its bucket's reduction starts when the backward has ended
  // for every module of the bucket (with overlap), and under ZeRO-3 its parameters are present
  // only around its uses.
  LayerHooks hooks_for(BucketBase* bucket, int member) {
    LayerHooks hooks;
    hooks.gradients_ready = [this, bucket, member] {
      bucket->dirty = true;
      if (!bucket->member_ready(member) || !options_.overlap || no_sync_) return;
      bucket->start_reduction(true);
      test_in_flight();
    };
    // While a backward runs, MPI moves a non-blocking collective only inside MPI calls: between
    // tape nodes, at most every 100 us, the reductions in flight are tested (Horovod's and
    // DDP's progress without a thread: MPI_THREAD_MULTIPLE is not asked for).
    if (options_.overlap)
      hooks.progress = [this] {
        const auto now = Clock::now();
        if (now - last_progress_ < std::chrono::microseconds(100)) return;
        last_progress_ = now;
        test_in_flight();
      };
    hooks.gradients_read = [this, bucket] {
      if (bucket->dirty && no_sync_)
        throw SpecError("tshard::optim::Optimizer: a gradient read under no_sync(true) is this rank's share of the "
                        "data-parallel sum: read it after the last micro-batch's backward, with no_sync(false)");
      this_step_.blocked_seconds += bucket->complete_gradients();
    };
    if (options_.zero_stage == 3) {
      hooks.before_use = [this, bucket] { streaming_.before_use(bucket); };
      hooks.after_use = [this, bucket] { streaming_.after_use(bucket, buckets_); };
    }
    return hooks;
  }

  // Lets MPI progress every reduction and prefetch in flight.
  void test_in_flight() {
    for (auto& b : buckets_) b->test();
  }

  // A parameter is updated once: a second registration (the same tensor through two modules,
  // or a module added twice) is an error, not a double update.
  void claim(const void* param, const std::string& describe) {
    if (!claimed_.insert(param).second)
      throw SpecError("tshard::optim::Optimizer::add: the parameter " + describe +
                      " is registered twice (each parameter is added once)");
  }

  // The bucket a module's parameters go to, made or joined at its first parameter.
  struct ModuleBucket {
    Index elements = 0;  // the module's own parameters' local elements
    BucketBase* bucket = nullptr;
    int member = 0;
    std::function<void()> finish;
  };
  // The last bucket of an add(model), while more modules may join it.
  struct OpenBucket {
    BucketBase* bucket = nullptr;
    const tshard::detail::MeshState* mesh = nullptr;
    std::int64_t bytes = 0;
  };
  // The elements of a parameter's block the data-parallel sum reduces: none where it is split
  // over a data axis (experts). The same on every rank of a data group, so that all of them
  // group modules into buckets alike.
  Index reduced_elements(nn::detail::ParameterSlot& slot) {
    Index n = 0;
    auto visit = [&]<class T>(T*) {
      if (auto* typed = dynamic_cast<nn::detail::ElementParameterSlot<T>*>(&slot)) {
        const ParameterView<T> view = typed->view();
        if ((view.spec.split_axes() & data_mask(*view.mesh)) == 0) n = view.layout.padded_size();
      }
    };
    visit(static_cast<float*>(nullptr));
    visit(static_cast<double*>(nullptr));
    visit(static_cast<bfloat16*>(nullptr));
    return n;
  }
  // The options' bucket_bytes (an Options struct without one reduces module by module).
  std::int64_t bucket_cap() const {
    if constexpr (requires { options_.bucket_bytes; })
      return options_.zero_stage == 3 ? 0 : std::int64_t(options_.bucket_bytes);
    else
      return 0;
  }

  // One registered parameter of a module: its bucket (made or joined by the first parameter), its
  // group. Defined below the class, out of line: with the optimizers' instances in
  // tshard::kernels, a program compiles none of the bucket and update machinery under it.
  template <class ParamSlot>
  void add_module_slot(ParamSlot& slot, const std::string& name, const std::function<ParameterGroup(const ParameterInfo&)>& group,
                       bool streamable, ModuleBucket& mine, OpenBucket& open, std::uint32_t& deferred);
  template <class T, class Slot>
  void visit_slot(Slot& slot, const std::string& name, const ParameterGroup& settings, bool streamable, ModuleBucket& mine,
                  OpenBucket& open, std::uint32_t& deferred, bool& done) {
    auto* typed = dynamic_cast<nn::detail::ElementParameterSlot<T>*>(&slot);
    if (!typed || done) return;
    done = true;
    const ParameterView<T> view = typed->view();
    claim(view.identity, view.describe);
    if (!mine.bucket) {
      const std::int64_t bytes = std::int64_t(mine.elements) * std::int64_t(sizeof(T));
      // Joins the open bucket where it has room, the same element type and the same mesh.
      if (open.bucket && open.mesh == view.mesh.get() && dynamic_cast<Bucket<T>*>(open.bucket) &&
          open.bytes + bytes <= bucket_cap()) {
        open.bytes += bytes;
      } else {
        open = {&new_bucket<T>(*view.mesh), view.mesh.get(), bytes};
      }
      mine.bucket = open.bucket;
      mine.member = open.bucket->add_member();
      auto& b = *dynamic_cast<Bucket<T>*>(open.bucket);
      mine.finish = [this, &b] { finish_bucket(b); };
      deferred = data_mask(*view.mesh);
    }
    auto* b = dynamic_cast<Bucket<T>*>(mine.bucket);
    if (!b) throw SpecError("tshard::optim: a module's own parameters have one element type");
    register_slot(*b, view, true, streamable);
    name_slot(name);
    state_like_.push_back([typed, keep = view.keep]() -> std::pair<std::shared_ptr<nn::StateTensor>, void*> {
      return typed->state_like();
    });
    b->slots.back().lr = settings.lr;
    b->slots.back().weight_decay = settings.weight_decay;
  }

  template <class T, class M, class S>
  void register_slot(Bucket<T>& b, ShardedTensor<T, M, S>& param, ShardedTensor<T, M, S>& grad, bool module_owned) {
    register_slot(b, parallel::detail::view_of(param, grad, nullptr), module_owned);
  }
  template <class T>
  void register_slot(Bucket<T>& b, const ParameterView<T>& view, bool module_owned, bool streamable = true) {
    const std::uint32_t data = b.data_mask;
    const bool split_over_data = (view.spec.split_axes() & data) != 0;
    const int n = b.data_ranks();
    Slot<T> s;
    s.keep = view.keep;
    s.identity = view.identity;
    s.param = view.param;
    s.grad = view.grad;
    s.param_present = view.param_present;
    s.grad_present = view.grad_present;
    s.release_param = view.release_param;
    s.release_grad = view.release_grad;
    s.mesh = view.mesh;
    s.layout = view.layout;
    s.size = view.layout.padded_size();
    s.sharded = options_.zero_stage >= 1 && data && n > 1 && !split_over_data;
    s.deferred = module_owned && data && !split_over_data;
    s.streamed = options_.zero_stage == 3 && s.sharded && module_owned && streamable;
    s.chunk = (s.size + n - 1) / n;
    const std::uint32_t all = (1u << view.mesh->shape().axes()) - 1;
    s.replica_axes = all & ~view.spec.split_axes();
    using State = typename Slot<T>::State;
    for (int k = 0; k < Rule::states; ++k) s.state.push_back(parallel::detail::zeroed_array<State>(s.state_size()));
    if (s.streamed) {
      const Index begin = s.owned_begin(b.data_coord()), end = s.owned_end(b.data_coord());
      s.master = parallel::detail::zeroed_array<T>(s.chunk);
      const T* p = s.param();
      std::copy(p + begin, p + end, s.master.get());
    }
    if constexpr (!std::is_same_v<State, T>) {
      s.master32 = parallel::detail::zeroed_array<State>(s.state_size());
      b.take_master_copy(s);
    }
    b.slots.push_back(std::move(s));
  }

  // The bucket's update closure (registered once, whatever its members); stage-3 parameters
  // leave memory until their layer's next use.
  template <class B>
  void finish_bucket(B& b) {
    using T = std::remove_pointer_t<decltype(b.slots.front().param())>;
    auto* bucket = &b;
    if (b.updating) {
      b.release_parameters();
      return;
    }
    b.updating = true;
    updates_.push_back([bucket](const Options& o, long t) {
      const int c = bucket->data_coord();
      for (auto& s : bucket->slots) {
        const Index base = s.owned_begin(c);
        s.for_each_run_in(base, s.owned_end(c), [&](Index off, Index len) {
          using State = typename Slot<T>::State;
          State* st[Rule::states > 0 ? Rule::states : 1];
          for (int k = 0; k < Rule::states; ++k) st[k] = s.state[std::size_t(k)].get() + (off - base);
          Options own = o;
          if (s.lr) own.lr = *s.lr;  // a parameter group's own settings
          if (s.weight_decay) own.weight_decay = *s.weight_decay;
          if constexpr (std::is_same_v<State, T>) {
            Rule::template update<T>(own, t, bucket->parameter_at(s, off), bucket->gradient_at(s, off), st, len);
          } else {  // mixed precision: the float master copy updated, the parameter its rounding
            State* master = s.master32.get() + (off - base);
            const T* g = bucket->gradient_at(s, off);
            tshard::detail::Scratch<State> wide(static_cast<std::size_t>(len));
            for (Index i = 0; i < len; ++i) wide.data()[i] = State(g[i]);
            Rule::template update<State>(own, t, master, wide.data(), st, len);
            T* p = bucket->parameter_at(s, off);
            for (Index i = 0; i < len; ++i) p[i] = T(master[i]);
          }
        });
      }
    });
    b.release_parameters();
  }

  // Every bucket's data-parallel sum completed, then the tied twins' gradients summed (once a step).
  void finish_reductions() {
    for (auto& b : buckets_) {
      if (!b->started) ++this_step_.buckets;
      this_step_.blocked_seconds += b->finish_reduction();
    }
    if (ties_summed_) return;
    ties_summed_ = true;
    for (auto& tie : ties_) this_step_.blocked_seconds += tie();
  }

  Options options_;
  long steps_ = 0;
  bool no_sync_ = false;
  MPI_Comm world_ = MPI_COMM_NULL;
  bool norm_mesh_set_ = false;
  std::shared_ptr<void> norm_mesh_;  // keeps the communicator of set_norm_mesh alive
  std::vector<std::unique_ptr<BucketBase>> buckets_;
  std::set<const void*> claimed_;
  std::vector<std::string> names_;  // each registered parameter's, in registration order
  // Per registered parameter, a new tensor of its shape and spec (in the state's element type)
  // and its block, for a state array in state_dict().
  std::vector<std::function<std::pair<std::shared_ptr<nn::StateTensor>, void*>()>> state_like_;
  std::vector<std::function<void(const Options&, long)>> updates_;
  std::vector<std::function<double()>> ties_;  // each tied copy's gradient sum with its twin's
  Clock::time_point last_progress_{};  // the last test of reductions in flight
  bool ties_summed_ = false;                   // this step's (clip_grad_norm and step() both finish reductions)
  GradientReductionStats reduction_, this_step_;
  parallel::detail::ParameterStreaming streaming_{options_.prefetch};  // stage 3's gathers
};

template <class Options, class Rule>
template <class ParamSlot>
void Optimizer<Options, Rule>::add_module_slot(ParamSlot& slot, const std::string& name,
                                               const std::function<ParameterGroup(const ParameterInfo&)>& group,
                                               bool streamable, ModuleBucket& mine, OpenBucket& open,
                                               std::uint32_t& deferred) {
  ParameterGroup settings;
  if (group) settings = group(ParameterInfo{name, slot.rank(), slot.shape()});
  bool done = false;
  visit_slot<float>(slot, name, settings, streamable, mine, open, deferred, done);
  visit_slot<double>(slot, name, settings, streamable, mine, open, deferred, done);
  visit_slot<bfloat16>(slot, name, settings, streamable, mine, open, deferred, done);
  if (!done)
    throw SpecError("tshard::optim::Optimizer::add: the parameter " + name + " is not float, double or bfloat16");
}

}  // namespace tshard::optim
