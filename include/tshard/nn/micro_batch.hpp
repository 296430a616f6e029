// Which micro-batch a layer's forward or backward belongs to. A pipeline runs several
// micro-batches' forwards before their backwards, so a layer keeps what backward needs once per
// micro-batch (PerMicroBatch) instead of once, and what depends on the global position of a row
// (dropout masks, GShard's random routing) reads the micro-batch's row offset in the batch.
// Outside a pipeline the context is micro-batch 0 of 1 covering the whole tensor: nothing changes.
#pragma once
#include <Eigen/Core>

#include <algorithm>
#include <cstdint>
#include <set>
#include <vector>

namespace tshard::nn {

struct MicroBatch {
  int index = 0;                 // which micro-batch of the step
  int count = 1;                 // how many the step has
  Eigen::Index row_offset = 0;   // global index of its first row (dim 0) in the whole batch
  Eigen::Index rows_total = 0;   // rows of the whole batch; 0: the tensor's own dim 0
  bool recompute = false;        // a re-materialising forward: the same step, the same masks
  bool inference = false;        // an evaluation forward: no dropout, no random routing, no step
                                 // counted; what layers keep for backward is released after it
};

namespace detail {
inline MicroBatch& micro_batch_state() {
  static MicroBatch current;
  return current;
}
}  // namespace detail

inline const MicroBatch& current_micro_batch() { return detail::micro_batch_state(); }

// Sets the micro-batch context for a scope and restores the previous one after.
class MicroBatchScope {
 public:
  explicit MicroBatchScope(const MicroBatch& m) : saved_(detail::micro_batch_state()) { detail::micro_batch_state() = m; }
  ~MicroBatchScope() { detail::micro_batch_state() = saved_; }
  MicroBatchScope(const MicroBatchScope&) = delete;
  MicroBatchScope& operator=(const MicroBatchScope&) = delete;

 private:
  MicroBatch saved_;
};

namespace detail {

// Everything kept per micro-batch registers here, so a pipeline can free one micro-batch's saved
// activations in every layer at once when its backward is done (or its forward, under remat).
class MicroBatchStore {
 public:
  MicroBatchStore() { registry().insert(this); }
  MicroBatchStore(const MicroBatchStore&) { registry().insert(this); }
  MicroBatchStore& operator=(const MicroBatchStore&) = default;
  virtual ~MicroBatchStore() { registry().erase(this); }
  virtual void release(int index) = 0;

  static std::set<MicroBatchStore*>& registry() {
    static std::set<MicroBatchStore*> all;
    return all;
  }
};

// The slot of inference forwards, apart from the training micro-batches': an evaluation between
// a forward and its backward leaves what that backward needs alone.
inline constexpr int kInferenceSlot = -1;

// One State per micro-batch; current() is the current micro-batch's.
template <class State>
class PerMicroBatch : public MicroBatchStore {
 public:
  State& current() {
    if (current_micro_batch().inference) return inference_;
    const auto i = static_cast<std::size_t>(std::max(0, current_micro_batch().index));
    if (slots_.size() <= i) slots_.resize(i + 1);
    return slots_[i];
  }
  void release(int index) override {
    if (index == kInferenceSlot) inference_ = State{};
    else if (index >= 0 && std::size_t(index) < slots_.size()) slots_[std::size_t(index)] = State{};
  }

 private:
  std::vector<State> slots_;
  State inference_;
};

}  // namespace detail

// Frees what every layer keeps for backward of micro-batch `index` (its activations go back to
// the buffer pool). A pipeline calls it after the micro-batch's backward.
inline void release_micro_batch(int index) {
  for (auto* s : detail::MicroBatchStore::registry()) s->release(index);
}

// Evaluation outside a pipeline (PyTorch's eval() with no_grad()): forwards inside the scope
// use no dropout and no random routing, count no step, and keep nothing for backward once the
// scope ends; the training state of a step in progress is left as it is.
//   { ts::nn::InferenceScope eval; loss = ts::nn::cross_entropy(model.forward(x), labels); }
class InferenceScope {
 public:
  InferenceScope() : scope_(MicroBatch{.inference = true}) {}
  ~InferenceScope() { release_micro_batch(detail::kInferenceSlot); }
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;

 private:
  MicroBatchScope scope_;
};

}  // namespace tshard::nn
