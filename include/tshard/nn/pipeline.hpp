// Pipeline parallelism over a mesh axis (GPipe, arXiv 1811.06965; PipeDream-flush's 1F1B,
// arXiv 2104.04473): the model's layers are cut into K stages along the axis, the batch into M
// micro-batches, and each stage runs its micro-batches' forwards and backwards in the order of a
// schedule. Activations go to the next stage and gradients to the previous one point to point
// through comm/, counted like every collective. Sends stay in flight, so a stage only ever waits
// for an input it needs: any K and M >= 1 run without deadlock, fewer micro-batches than stages
// included.
//
// A stage is any object with
//   using Activation = ShardedTensor<...>;           // what crosses a stage boundary
//   Activation boundary(const MicroBatch&);           // an empty one of a micro-batch's shape
//   std::optional<Activation> forward(const MicroBatch&, const Activation* in);  // in: null on stage 0
//   std::optional<Activation> backward(const MicroBatch&, const Activation* dy); // dy: null on the last
// forward's result is sent on (ignored on the last stage) and backward's (ignored on stage 0)
// goes back. Layers keep what backward needs per micro-batch (nn/micro_batch.hpp); the pipeline
// frees it after each backward. Gradients add up over the micro-batches in the layers: sum
// them once (the optimizer's step), and weight each micro-batch's loss by its share of the batch.
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/comm/point_to_point.hpp"
#include "tshard/core/error.hpp"
#include "tshard/nn/micro_batch.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn {

enum class Schedule {
  GPipe,     // every forward, then every backward
  OneFOneB,  // PipeDream-flush: after K - s - 1 warm-up forwards, stage s alternates one forward, one backward
};

inline const char* to_string(Schedule s) { return s == Schedule::GPipe ? "gpipe" : "1f1b"; }

struct PipelineOptions {
  int microbatches = 1;
  Schedule schedule = Schedule::GPipe;
  bool remat = false;  // GPipe's re-materialisation: keep only the stage's inputs, recompute in backward
};

// One entry of a stage's order.
struct PipelineTask {
  bool forward;
  int microbatch;
  bool operator==(const PipelineTask&) const = default;
};

// The order in which stage `stage` of `stages` runs the forwards and backwards of `microbatches`
// micro-batches. Pure arithmetic, the same on every rank.
inline std::vector<PipelineTask> pipeline_order(Schedule schedule, int stages, int stage, int microbatches) {
  std::vector<PipelineTask> order;
  if (schedule == Schedule::GPipe) {
    for (int m = 0; m < microbatches; ++m) order.push_back({true, m});
    for (int m = 0; m < microbatches; ++m) order.push_back({false, m});
    return order;
  }
  const int warmup = std::min(stages - stage - 1, microbatches);
  int f = 0, b = 0;
  for (; f < warmup; ++f) order.push_back({true, f});
  while (f < microbatches) {
    order.push_back({true, f++});
    order.push_back({false, b++});
  }
  while (b < microbatches) order.push_back({false, b++});
  return order;
}

// What one step of a pipeline measured on this rank.
struct PipelineStats {
  double seconds = 0;           // the step's wall time on this stage
  double idle_seconds = 0;      // blocked waiting for another stage (receives, and sends at the end)
  double busy_seconds = 0;      // inside the stage's forwards and backwards
  std::uint64_t peak_activation_bytes = 0;   // the buffer pool's peak over the step, above its start
  std::uint64_t microbatch_activation_bytes = 0;  // kept after micro-batch 0's first forward (one micro-batch's activations)
  std::uint64_t boundary_bytes = 0;          // one stage input (a micro-batch's activation), this rank's block
  int in_flight = 0;                         // the most micro-batches holding activations at once
  double bubble() const { return seconds > 0 ? idle_seconds / seconds : 0; }
};

// The pipeline over the mesh axis StageAxis of a mesh M.
template <class M, FixedString StageAxis = "stage">
class Pipeline {
 public:
  Pipeline(const M& mesh, PipelineOptions o) : mesh_(mesh), o_(o) {
    constexpr int axis = M::template axis_index<StageAxis>();
    stage_comm_ = mesh.state()->group(std::vector<int>{axis});
    stages_ = mesh.template size<StageAxis>();
    stage_ = mesh.template coord<StageAxis>();
    if (o_.microbatches < 1)
      throw ShapeError("tshard::nn::Pipeline: " + std::to_string(o_.microbatches) + " micro-batches; at least 1 is needed");
  }

  int stages() const { return stages_; }
  int stage() const { return stage_; }
  bool first() const { return stage_ == 0; }
  bool last() const { return stage_ == stages_ - 1; }
  const PipelineOptions& options() const { return o_; }
  // The ranks of this rank's stage-axis line: one per stage, ordered by stage.
  MPI_Comm stage_comm() const { return stage_comm_; }

  // Which of `count` items (layers) stage s holds: [begin, end), as even as possible, the first
  // stages taking one more where they do not divide.
  static std::pair<int, int> partition(int count, int stages, int s) {
    const int base = count / stages, extra = count % stages;
    const int begin = s * base + std::min(s, extra);
    return {begin, begin + base + (s < extra ? 1 : 0)};
  }
  std::pair<int, int> partition(int count) const { return partition(count, stages_, stage_); }

  // One step over a batch of `rows` rows (dim 0 of the stage inputs) cut into M micro-batches.
  // Throws ShapeError on every rank alike where M does not divide the rows.
  template <class Stage>
  PipelineStats run(Stage& stage, Eigen::Index rows) {
    using Activation = typename Stage::Activation;
    using T = typename Activation::Scalar;
    const int mbs = o_.microbatches;
    if (rows % mbs != 0)
      throw ShapeError("tshard::nn::Pipeline: a batch of " + std::to_string(rows) + " rows does not divide into " +
                       std::to_string(mbs) + " micro-batches of equal size");
    const Eigen::Index b = rows / mbs;
    PipelineStats st;
    const auto start = std::chrono::steady_clock::now();
    const std::uint64_t base = pool_stats().bytes_in_use;
    reset_pool_peak();
    std::vector<std::optional<Activation>> inputs(static_cast<std::size_t>(mbs));  // kept for remat
    std::deque<std::pair<tshard::detail::PendingSend<T>, Activation>> sends;        // each with its buffer
    int live = 0;
    auto send = [&](Activation&& x, int peer, int tag) {
      const T* data = x.data();
      const auto n = x.local_size();
      sends.emplace_back(tshard::detail::PendingSend<T>(stage_comm_, peer, data, n, tag), std::move(x));
      while (!sends.empty() && sends.front().first.test()) sends.pop_front();
    };
    auto receive = [&](Activation& into, int peer, int tag) {
      st.idle_seconds += tshard::detail::receive(stage_comm_, peer, into.data(), into.local_size(), tag);
    };
    auto busy = [&](auto&& f) {
      const auto t0 = std::chrono::steady_clock::now();
      f();
      st.busy_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    };
    for (const PipelineTask& task : pipeline_order(o_.schedule, stages_, stage_, mbs)) {
      const int m = task.microbatch;
      const MicroBatch mb{.index = m, .count = mbs, .row_offset = m * b, .rows_total = rows, .recompute = false};
      if (task.forward) {
        const Activation* in = nullptr;
        if (!first()) {
          inputs[m] = stage.boundary(mb);
          receive(*inputs[m], stage_ - 1, tag(m, true));
          in = &*inputs[m];
          st.boundary_bytes = std::uint64_t(inputs[m]->local_size()) * sizeof(T);
        }
        std::optional<Activation> out;
        busy([&] {
          MicroBatchScope scope(mb);
          out = stage.forward(mb, in);
        });
        if (m == 0) st.microbatch_activation_bytes = pool_stats().bytes_in_use - base;
        if (o_.remat) release_micro_batch(m);  // only the stage input stays
        else inputs[m].reset();                 // the layers hold what they need
        st.in_flight = std::max(st.in_flight, ++live);
        if (!last()) {
          if (!out) throw SpecError("tshard::nn::Pipeline: a stage before the last returned no activation");
          send(std::move(*out), stage_ + 1, tag(m, true));
        }
      } else {
        std::optional<Activation> dy;
        if (!last()) {
          dy = stage.boundary(mb);
          receive(*dy, stage_ + 1, tag(m, false));
        }
        std::optional<Activation> dx;
        busy([&] {
          if (o_.remat) {
            MicroBatch again = mb;
            again.recompute = true;
            MicroBatchScope scope(again);
            (void)stage.forward(again, first() ? nullptr : &*inputs[m]);
          }
          MicroBatchScope scope(mb);
          dx = stage.backward(mb, dy ? &*dy : nullptr);
        });
        release_micro_batch(m);
        inputs[m].reset();
        --live;
        if (!first()) {
          if (!dx) throw SpecError("tshard::nn::Pipeline: a stage after the first returned no gradient");
          send(std::move(*dx), stage_ - 1, tag(m, false));
        }
      }
    }
    for (auto& s : sends) st.idle_seconds += s.first.wait();
    sends.clear();
    const auto stats = pool_stats();
    st.peak_activation_bytes = stats.peak_bytes_in_use > base ? stats.peak_bytes_in_use - base : 0;
    st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return st;
  }

 private:
  static int tag(int microbatch, bool forward) { return 8101 + 2 * microbatch + (forward ? 0 : 1); }

  M mesh_;
  PipelineOptions o_;
  MPI_Comm stage_comm_ = MPI_COMM_NULL;
  int stages_ = 1, stage_ = 0;
};

}  // namespace tshard::nn
