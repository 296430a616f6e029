// The tape of reverse-mode differentiation. While a gradient is taken (ts::ad), an operator
// whose input carries a node records a node for its output: the saved values and the rule that
// sends the output's cotangent back to the inputs' nodes. Tensors that carry no node are
// untracked, and an operator on them records nothing: the check is one pointer per operand.
//
// The rules are written in ad/, above the operators, and found by argument-dependent lookup on
// the operator's tag (`vjp(tag, ...)` in namespace detail::grad), as JAX keeps a primitive and
// its transpose rule apart. So the operators need nothing of ad/ to record.
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "tshard/comm/stats.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::detail {

class GradNode {
 public:
  virtual ~GradNode() = default;
  // Sends the cotangent back to the inputs (if one arrived), then drops what the rule saved.
  virtual void propagate() = 0;
  std::uint64_t order = 0;  // creation order: the reverse is a topological order
  // The oldest node whose rule adds into this one's cotangent: once the backward has run every
  // node down to it, this cotangent is final (a parameter's gradient can be reduced then).
  std::uint64_t first_consumer = std::numeric_limits<std::uint64_t>::max();
  const void* leaf_tensor = nullptr;  // the tensor a gradient is taken for (a parameter, an argument)
  // A leaf's: puts `node` on leaf_tensor and returns what it carried. A checkpoint's recomputation
  // gives a forward's leaves back to tensors untracked since (a pipeline stage's parameters).
  std::shared_ptr<GradNode> (*swap_leaf_node)(const void* tensor, std::shared_ptr<GradNode> node) = nullptr;
  // What a rule's collectives are counted under: the forward's operator path + "/backward"
  // ("transformer_block/moe/backward"), as a hand-written backward's are under its own name;
  // "backward" outside every operator. Interned (comm/stats.hpp): recording copies no string.
  OperatorLabel* label = nullptr;
};

// A node of a tensor of element type T. The cotangent is that of the *resolved* value (a partial
// output is differentiated as the sum it stands for), kept in whatever layout its contributions
// came in (a partial sum where they were: resolved once, where it is read).
template <class T>
class TypedGradNode;
// A node's rule with what it saved; run once, then dropped with what it keeps. (Move-only, so
// the saved tensors, whose copies are deep, are never copied, and no copy is compiled.) One
// virtual function per rule type, finish(), runs it where asked and frees it: a virtual run and a
// virtual destructor would compile three functions for each of the many rule types a model makes.
template <class T>
struct GradRule {
  virtual void finish(TypedGradNode<T>* self) = 0;  // runs on *self where not null; then `delete this`

 protected:
  ~GradRule() = default;
};
template <class T>
struct FinishRule {
  void operator()(GradRule<T>* r) const { r->finish(nullptr); }
};
// The rule vjp(tag, type of out, node, saved...), found in ad/ by argument-dependent lookup,
// with what it keeps (built in place: a saved tensor is moved once).
template <class T, class Out, class Tag, class... Saved>
struct GradRuleOf final : GradRule<T> {
  template <class... S>
  explicit GradRuleOf(Tag&& tag, S&&... s) : tag(std::move(tag)), saved(std::move(s)...) {}
  void finish(TypedGradNode<T>* self) override {
    const std::unique_ptr<GradRuleOf> freed(this);  // (also where the rule throws)
    if (self)
      std::apply([&](const Saved&... s) { vjp(std::as_const(tag), std::type_identity<Out>{}, *self, s...); }, saved);
  }
  Tag tag;
  std::tuple<Saved...> saved;
};

template <class T>
class TypedGradNode final : public GradNode {
 public:
  std::shared_ptr<MeshState> mesh;
  Extents shape{};
  SpecDesc primal{};  // the value's spec without its partial
  std::shared_ptr<T> cotangent;
  SpecDesc cotangent_desc{};
  std::unique_ptr<GradRule<T>, FinishRule<T>> rule;  // empty for a leaf (a value gradients are taken for)

  void propagate() override {
    if (!cotangent || !rule) return;
    OperatorScope scope(label, "backward");
    rule.release()->finish(this);
  }
};

// The nodes of one gradient computation, in creation order. Kept weakly: a value that nothing
// depends on any more frees its node, and what that node saved, at once.
//
// A tape may be nested in another for a scope (a checkpoint records its function on one of its
// own): its orders continue the outer tape's, and the outer nodes its rules add into (the
// function's inputs and the parameters it reads) are collected as foreign instead of noted as
// consumed: the checkpoint's own node, on the outer tape, is their consumer.
class Tape {
 public:
  Tape() = default;
  // A tape nested in another: its orders start at first_order (the outer tape's next_order(), or
  // above every order in use, where the outer tape is not at hand).
  explicit Tape(std::uint64_t first_order, bool nested) : first_order_(first_order), nested_(nested) {}
  Tape(const Tape&) = delete;
  Tape& operator=(const Tape&) = delete;

  static Tape*& active() {
    thread_local Tape* tape = nullptr;
    return tape;
  }
  static bool& paused() {
    thread_local bool p = false;
    return p;
  }
  void add(const std::shared_ptr<GradNode>& n) {
    n->order = next_order();
    nodes_.push_back(n);
  }
  // The order the next node added gets, and the first node's.
  std::uint64_t next_order() const { return first_order_ + nodes_.size(); }
  std::uint64_t first_order() const { return first_order_; }
  // A rule of this tape keeps `n`: n is foreign if this tape is nested and n older than it.
  bool note_foreign(const std::shared_ptr<GradNode>& n) {
    if (!nested_ || n->order >= first_order_) return false;
    if (std::find(foreign_.begin(), foreign_.end(), n) == foreign_.end()) foreign_.push_back(n);
    return true;
  }
  const std::vector<std::shared_ptr<GradNode>>& foreign() const { return foreign_; }
  // The nodes still alive, newest first.
  std::vector<std::shared_ptr<GradNode>> live_nodes_newest_first() const {
    std::vector<std::shared_ptr<GradNode>> out;
    for (auto it = nodes_.rbegin(); it != nodes_.rend(); ++it)
      if (auto n = it->lock()) out.push_back(std::move(n));
    return out;
  }
  std::size_t size() const { return nodes_.size(); }

 private:
  std::vector<std::weak_ptr<GradNode>> nodes_;
  std::uint64_t first_order_ = 0;
  bool nested_ = false;
  std::vector<std::shared_ptr<GradNode>> foreign_;  // outer nodes a nested tape's rules add into
};

// Selective recomputation: a checkpoint that keeps the products (einsum outputs, the GEMMs) and
// recomputes the rest. While its function first runs, each einsum's output buffer is kept here
// in call order; when the function runs again in the backward, each einsum takes its kept
// output instead of computing it (and records its node as before), so only the cheap
// elementwise ops run twice.
class KeptProducts {
 public:
  static KeptProducts*& active() {
    thread_local KeptProducts* k = nullptr;
    return k;
  }
  bool replaying() const { return replaying_; }
  void start_replay() {
    replaying_ = true;
    next_ = 0;
  }
  template <class T>
  void keep(const std::shared_ptr<T>& buffer, Index n) {
    kept_.push_back({std::static_pointer_cast<void>(std::const_pointer_cast<std::remove_const_t<T>>(buffer)), n});
    bytes_ += static_cast<std::size_t>(n) * sizeof(T);
  }
  // The next kept output, of n elements of T (let go of here: the value owns it again).
  template <class T>
  std::shared_ptr<T> take(Index n) {
    if (next_ >= kept_.size() || kept_[next_].elements != n)
      throw SpecError(
          "tshard::ad::checkpoint: the function computed other products when run again in the backward: a "
          "checkpointed function must compute the same values from the same inputs each time it runs");
    auto b = std::static_pointer_cast<T>(std::move(kept_[next_].buffer));
    bytes_ -= static_cast<std::size_t>(n) * sizeof(T);
    ++next_;
    return b;
  }
  std::size_t bytes() const { return bytes_; }  // what the kept outputs hold

 private:
  struct Kept {
    std::shared_ptr<void> buffer;
    Index elements;
  };
  std::vector<Kept> kept_;
  std::size_t next_ = 0, bytes_ = 0;
  bool replaying_ = false;
};

// Stops recording for a scope (a custom VJP's forward, every rule while backward runs).
class PauseRecording {
 public:
  PauseRecording() : was_(Tape::paused()) { Tape::paused() = true; }
  ~PauseRecording() { Tape::paused() = was_; }
  PauseRecording(const PauseRecording&) = delete;
  PauseRecording& operator=(const PauseRecording&) = delete;

 private:
  bool was_;
};

template <class X>
bool tracked(const X& x) {
  if constexpr (is_sharded_tensor<std::remove_cvref_t<X>>::value)
    return TensorAccess::node(x) != nullptr;
  else
    return false;
}

// Whether an operator on these operands records a node: a gradient is being taken, recording is
// not paused, and an operand is tracked.
template <class... X>
bool recording(const X&... x) {
  return Tape::active() && !Tape::paused() && (tracked(x) || ...);
}

// An operator with no derivative rule whose input is tracked would give a silent zero (or wrong)
// gradient: it is refused, on every rank alike, saying what to use instead.
[[noreturn, gnu::cold, gnu::noinline]] inline void throw_tracked(const char* op, const char* instead, const std::string& which) {
  throw SpecError(std::string("tshard::") + op + ": " + which + " is tracked by a gradient, and " + op +
                  " has no derivative rule: " + instead);
}
template <class... X>
void refuse_tracked(const char* op, const char* instead, const X&... x) {
  if (!recording(x...)) [[likely]] return;
  std::string which;
  ((which.empty() && tracked(x) ? void(which = x.describe()) : void()), ...);
  throw_tracked(op, instead, which);
}
inline constexpr const char* kNoSecondOrder = "gradients of gradients are not taken (run it outside ts::ad, or inside a "
                                              "custom_vjp rule)";

// An in-place update of the very tensor a gradient is taken for would replace it (PyTorch refuses
// it too); a copy of it may be updated.
template <class Y>
void refuse_in_place_on_leaf(const Y& y, const char* op) {
  if (tracked(y) && TensorAccess::node(y)->leaf_tensor == static_cast<const void*>(&y))
    throw SpecError(std::string("tshard::") + op + ": an in-place update of " + y.describe() +
                    ", a tensor the gradient is taken for: write y = y (op) x into a new tensor instead");
}

// What a rule keeps of an operand. tape_value: the value (its buffer shared: a later write to
// the operand copies first) and its node. tape_shape: shape, spec and node only, for rules that
// never read the value (linear operators keep no activation). tape_output: an output's value
// without its node (a node saving its own output would keep itself alive).
template <class X>
X tape_value(const X& x) {
  X a(AdoptStorage{}, x.mesh(), x.global_shape(), TensorAccess::storage(x));
  TensorAccess::set_node(a, TensorAccess::node(x));
  return a;
}
template <class X>
X tape_shape(const X& x) {
  X a(AdoptStorage{}, x.mesh(), x.global_shape(), nullptr);
  TensorAccess::set_node(a, TensorAccess::node(x));
  return a;
}
template <class X>
X tape_output(const X& x) {
  return X(AdoptStorage{}, x.mesh(), x.global_shape(), TensorAccess::storage(x));
}
// tape_node: the operand's node alone, for a linear rule: the node knows its shape and spec.
template <class T>
struct TapeNode {
  std::shared_ptr<GradNode> node;
};
template <class X>
TapeNode<typename X::Scalar> tape_node(const X& x) {
  return {TensorAccess::node(x)};
}
// tape_block: an operand as a rule on descriptors keeps it: its node, spec and shape, and its
// value (shared, as tape_value's) where the rule reads it. Such rules are compiled once per
// element type (ad/rules/), not once per operator instance with its typed tensors.
template <class T>
struct TapeValue {
  std::shared_ptr<GradNode> node;
  std::shared_ptr<T> value;  // null where the rule reads only where the operand lies
  SpecDesc spec{};
  Extents shape{};
};
template <class X>
TapeValue<typename X::Scalar> tape_block(const X& x, bool with_value = true) {
  return {TensorAccess::node(x), with_value ? TensorAccess::storage(x) : nullptr, X::spec_desc, extents_of(x)};
}
// An output's value without its node (see tape_output).
template <class X>
TapeValue<typename X::Scalar> tape_output_block(const X& x) {
  return {nullptr, TensorAccess::storage(x), X::spec_desc, extents_of(x)};
}
// (what note_consumer reads a node from)
template <class S>
struct is_tape_node : std::false_type {};
template <class T>
struct is_tape_node<TapeNode<T>> : std::true_type {};
template <class T>
struct is_tape_node<TapeValue<T>> : std::true_type {};

// A rule whose tag says `any_output` reads nothing of its output's type (the node's primal spec
// has its rank) and keeps only TapeNodes: it is recorded as a rule for AnyOutput, one rule type per
// element type instead of one per operator instance (the adds, subtractions, scalings and
// reshards of a model: about a third of its rules).
struct AnyOutput {};
template <class Tag>
concept OutputFreeRule = requires { requires Tag::any_output; };

// A rule that keeps `s` adds into s's node: note the rule's node (of creation order `order`) as
// one of its consumers.
template <class S>
void note_consumer(const S& s, std::uint64_t order) {
  auto note = [&](const std::shared_ptr<GradNode>& n) {
    if (n && !Tape::active()->note_foreign(n)) n->first_consumer = std::min(n->first_consumer, order);
  };
  if constexpr (is_sharded_tensor<S>::value) note(TensorAccess::node(s));
  if constexpr (is_tape_node<S>::value) note(s.node);
}

// A node for a value of this mesh, shape and spec, labelled under the operator that records it
// (its rule is set by the caller). Per element type: what record() compiles per operator is the rule.
template <class T>
[[gnu::noinline]] std::shared_ptr<TypedGradNode<T>> new_grad_node(const std::shared_ptr<MeshState>& mesh,
                                                                  const Extents& shape, const SpecDesc& spec) {
  auto node = std::make_shared<TypedGradNode<T>>();
  node->mesh = mesh;
  node->shape = shape;
  node->primal = spec.without_partial();
  if (auto& st = operator_stack(); !st.open.empty()) node->label = st.top().child("backward");
  return node;
}

// A node for a value of this mesh, shape and spec whose rule is vjp(tag, RuleOut, node, saved...),
// found in ad/, added to the active tape. Per rule type: an output-free rule's (RuleOut =
// AnyOutput) is shared by every operator instance that records it, and the common ones are
// compiled in tshard::kernels (their instances are listed at the end of ad/rules/).
template <class T, class RuleOut, class Tag, class... Saved>
[[gnu::noinline]] std::shared_ptr<GradNode> record_node(const std::shared_ptr<MeshState>& mesh, const Extents& shape,
                                                        const SpecDesc& spec, Tag&& tag, Saved&&... saved) {
  auto node = new_grad_node<T>(mesh, shape, spec);
  (note_consumer(saved, Tape::active()->next_order()), ...);  // (add() gives the node that order)
  node->rule.reset(new GradRuleOf<T, RuleOut, Tag, Saved...>(std::move(tag), std::move(saved)...));
  Tape::active()->add(node);
  return node;
}

// record_node's instance for an output-free rule keeping S1 (S1, S2; S1, S2, S3), compiled once
// in tshard::kernels (core/kernel_instances.hpp). The tag comes last: it may hold commas.
#define TSHARD_RULE_INSTANCE_1(T, S1, ...)                                                                  \
  TSHARD_KERNEL_INSTANCE(std::shared_ptr<GradNode> record_node<T, AnyOutput, __VA_ARGS__, S1>(              \
      const std::shared_ptr<MeshState>&, const Extents&, const SpecDesc&, __VA_ARGS__&&, S1&&))
#define TSHARD_RULE_INSTANCE_2(T, S1, S2, ...)                                                              \
  TSHARD_KERNEL_INSTANCE(std::shared_ptr<GradNode> record_node<T, AnyOutput, __VA_ARGS__, S1, S2>(          \
      const std::shared_ptr<MeshState>&, const Extents&, const SpecDesc&, __VA_ARGS__&&, S1&&, S2&&))
#define TSHARD_RULE_INSTANCE_3(T, S1, S2, S3, ...)                                                          \
  TSHARD_KERNEL_INSTANCE(std::shared_ptr<GradNode> record_node<T, AnyOutput, __VA_ARGS__, S1, S2, S3>(      \
      const std::shared_ptr<MeshState>&, const Extents&, const SpecDesc&, __VA_ARGS__&&, S1&&, S2&&, S3&&))

// Gives `out` a node whose rule is vjp(tag, type of out, node, saved...), found in ad/. What
// the rule keeps is moved in, never copied (a copy of a tensor is deep; what a rule keeps shares
// buffers): pass temporaries (tape_value(x), tape_block(x), ...) or std::move.
template <class Out, class Tag, class... Saved>
void record(Out& out, Tag tag, Saved&&... saved) {
  static_assert((!std::is_lvalue_reference_v<Saved> && ...), "tshard: internal: record() takes what a rule keeps by move");
  using RuleOut = std::conditional_t<OutputFreeRule<Tag>, AnyOutput, Out>;
  TensorAccess::set_node(out, record_node<typename Out::Scalar, RuleOut, Tag, std::remove_cvref_t<Saved>...>(
                                  state_of(out.mesh()), extents_of(out), Out::spec_desc, std::move(tag), std::move(saved)...));
}

}  // namespace tshard::detail
