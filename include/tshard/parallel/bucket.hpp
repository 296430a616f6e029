// A bucket: the parameters data parallelism reduces together (the own parameters of one module,
// or of several consecutive modules up to the optimizer's bucket_bytes, or one bare parameter), with the data axis' communicator (one group over all of them where the optimizer
// names several data axes; "the data axis" below means that group). Their gradients' sum over the data axis (an
// all-reduce, or a reduce-scatter under ZeRO-2 and -3, in two levels where the data ranks span
// nodes), started non-blocking as soon as its modules' backward ends (PyTorch DDP's overlap) or
// blocking from step(); the all-gathers of
// updated chunks (ZeRO-1 and -2 after the update, ZeRO-3 before each use, prefetched or not);
// the optimizer state's chunks, read and written whole for checkpoints.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>

#include "tshard/comm/clock.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/nonblocking.hpp"
#include "tshard/comm/point_to_point.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/simulated_timing.hpp"
#include "tshard/parallel/slot.hpp"

namespace tshard::parallel {

// How gradients were reduced in the last step: seconds this rank spent inside MPI for them
// (blocking calls, and tests and waits of those started during backward: the part not hidden
// by computation) and the number of buckets.
struct GradientReductionStats {
  double blocked_seconds = 0;
  int buckets = 0;  // reduced at step() (not started during backward)
};

namespace detail {

// A group of parameters reduced together (one layer), with its data-axis communicator.
class BucketBase {
 public:
  virtual ~BucketBase() = default;
  virtual void start_reduction(bool nonblocking) = 0;
  virtual void test() = 0;
  virtual double finish_reduction() = 0;  // seconds blocked
  // Every gradient of the bucket whole and reduced, to be read (seconds blocked): the reduction
  // completed where gradients arrived since the last one, and under ZeRO-2 and -3 the reduced
  // chunks all-gathered into the gradients (which hold their memory again until zero_grad()).
  virtual double complete_gradients() = 0;
  virtual void zero_grad() = 0;
  virtual double squared_norm() = 0;      // this rank's share of the squared gradient norm
  virtual void scale_gradients(double s) = 0;
  // All-gather of the updated chunks: of the streamed parameters (stage 3, before use; this
  // completes a prefetch in flight) or of the others (stages 1 and 2, after the update).
  virtual void gather_parameters(bool streamed) = 0;
  virtual void release_parameters() = 0;  // stage 3
  // Stage 3's prefetch: the streamed parameters' gather started, non-blocking, into a staging
  // buffer while another layer computes; false when there is nothing to gather or one is in
  // flight already. drop_prefetch() completes one and discards it (the chunks are about to
  // change: an update or a load).
  virtual bool prefetch_parameters() = 0;
  virtual bool prefetching() const = 0;
  virtual void drop_prefetch() = 0;
  virtual OptimizerMemory memory() const = 0;
  // Checkpoints: state k of slot i as the parameter's whole local block (ZeRO chunks gathered
  // over the data axis: collective over it), and back (each rank keeps its chunk).
  virtual int slot_count() const = 0;
  virtual void read_state(int slot, int k, void* block) = 0;
  virtual void write_state(int slot, int k, const void* block) = 0;
  // Stage 3: the master chunks taken again from the (gathered) parameters, after a load.
  virtual void reload_parameters() = 0;
  // The modules whose gradients this bucket reduces together (DDP's buckets: consecutive
  // modules coalesced up to a size, so that small layers do not each pay a collective's
  // latency). Its reduction starts during backward once every member has reported its gradients
  // ready since the last start, step() or zero_grad().
  int add_member() {
    ready_.push_back(false);
    return int(ready_.size()) - 1;
  }
  int members() const { return int(ready_.size()); }
  // Member k's gradients are ready; true when all members' are (the count then starts afresh:
  // each micro-batch's backward reports every member again).
  bool member_ready(int k) {
    if (!ready_[std::size_t(k)]) {
      ready_[std::size_t(k)] = true;
      ++ready_count_;
    }
    if (ready_count_ < int(ready_.size())) return false;
    forget_ready();
    return true;
  }
  // A new step: nothing started, no member ready.
  void new_round() {
    started = false;
    forget_ready();
  }
  bool started = false;
  bool dirty = false;  // gradients arrived since the last reduction (a backward reported them ready)
  bool kept = false;  // stage 3: left present after a use because this bucket is used next too
  bool updating = false;  // its parameters' update is registered with the optimizer

 private:
  void forget_ready() {
    std::fill(ready_.begin(), ready_.end(), false);
    ready_count_ = 0;
  }
  std::vector<bool> ready_;
  int ready_count_ = 0;
};

template <class T>
class Bucket : public BucketBase {
 public:
  Bucket(MPI_Comm data, std::shared_ptr<const tshard::detail::NodeGroups> nodes, int n, int c, int stage)
      : data_(data), nodes_(std::move(nodes)), n_(n), c_(c), stage_(stage) {}
  std::vector<Slot<T>> slots;

  int data_coord() const { return c_; }
  int data_ranks() const { return n_; }
  int stage() const { return stage_; }

  // Starts the data-parallel reduction of the gradients: non-blocking when a layer's backward
  // has just ended (the rest of backward overlaps it), blocking from step() (nothing left to
  // overlap; MPI's blocking collectives are faster). All-reduce: large gradients in place, one
  // request each, small ones packed into one; reduce-scatter: all packed, block j holding every
  // gradient's chunk j, so that rank j receives its chunks together.
  void start_reduction(bool nonblocking) override {
    if (started) return;
    started = true;
    if (n_ == 1) return;
    tshard::detail::OperatorScope scope("gradient_reduction");
    scatter_ = stage_ >= 2;
    auto in_place = [&](const Slot<T>& s) { return !scatter_ && s.size >= kInPlace; };
    Index total = 0;
    for (auto& s : slots)
      if (s.deferred && !in_place(s)) total += scatter_ ? s.chunk : s.size;
    for (auto& s : slots)
      if (s.deferred && in_place(s)) reduce(nonblocking, s.grad(), nullptr, s.size);
    if (total == 0) return;
    send_ = tshard::detail::pooled_array<T>(static_cast<std::size_t>(total * (scatter_ ? n_ : 1)));
    T* out = send_.get();
    for (int j = 0; j < (scatter_ ? n_ : 1); ++j)
      for (auto& s : slots) {
        if (!s.deferred || in_place(s)) continue;
        const Index b = scatter_ ? Index(j) * s.chunk : 0, len = scatter_ ? s.chunk : s.size;
        const Index have = std::max<Index>(0, std::min(len, s.size - b));
        const T* g = s.grad();
        std::copy(g + b, g + b + have, out);
        std::fill(out + have, out + len, T(0));
        out += len;
      }
    if (scatter_) recv_ = tshard::detail::pooled_array<T>(static_cast<std::size_t>(total));
    reduce(nonblocking, send_.get(), scatter_ ? recv_.get() : nullptr, total);
  }

  void test() override {
    for (auto& p : pending_)
      if (p->in_flight()) p->test();
    if (prefetch_ && prefetch_->in_flight()) prefetch_->test();
  }

  double finish_reduction() override {
    dirty = false;
    start_reduction(false);
    double blocked = blocking_seconds_;
    blocking_seconds_ = 0;
    for (auto& p : pending_) blocked += p->wait();
    pending_.clear();
    if (!send_) return blocked;
    const T* in = scatter_ ? recv_.get() : send_.get();
    for (auto& s : slots) {
      if (!s.deferred || (!scatter_ && s.size >= kInPlace)) continue;
      if (scatter_) {
        s.reduced = tshard::detail::pooled_array<T>(static_cast<std::size_t>(std::max<Index>(s.chunk, 1)));
        std::copy(in, in + s.chunk, s.reduced.get());
        in += s.chunk;
        s.release_grad();  // the full gradient is not needed any more
      } else {
        std::copy(in, in + s.size, s.grad());
        in += s.size;
      }
    }
    send_.reset();
    recv_.reset();
    return blocked;
  }

  double complete_gradients() override {
    double blocked = 0;
    if (dirty) blocked = finish_reduction();
    Index total = 0;
    for (auto& s : slots)
      if (s.reduced && !s.grad_present()) total += s.chunk;
    if (total == 0) return blocked;
    tshard::detail::OperatorScope scope("gradient_gather");
    auto mine = tshard::detail::pooled_array<T>(static_cast<std::size_t>(total));
    T* out = mine.get();
    for (auto& s : slots)
      if (s.reduced && !s.grad_present()) out = std::copy(s.reduced.get(), s.reduced.get() + s.chunk, out);
    auto all = tshard::detail::pooled_array<T>(static_cast<std::size_t>(total * n_));
    tshard::detail::all_gather(data_, mine.get(), total, all.get());
    Index at = 0;
    for (auto& s : slots) {
      if (!s.reduced || s.grad_present()) continue;
      T* g = s.grad();
      for (int j = 0; j < n_; ++j) {
        const Index b = std::min(s.size, Index(j) * s.chunk), e = std::min(s.size, Index(j + 1) * s.chunk);
        const T* in = all.get() + Index(j) * total + at;
        std::copy(in, in + (e - b), g + b);
      }
      at += s.chunk;
    }
    return blocked;
  }

  void zero_grad() override {
    new_round();
    for (auto& s : slots) {
      s.reduced.reset();
      if (s.deferred) {
        // As PyTorch's zero_grad(set_to_none=True): the memory goes back to the pool and the
        // first contribution of the next backward is written, not added to zeros.
        s.release_grad();
      } else {
        T* g = s.grad();
        std::fill(g, g + s.size, T(0));
      }
    }
  }

  // The gradient this rank updates with, from local index i of the block on (i in the owned
  // range): a reduced chunk holds the owned range alone, so its index is relative to the chunk.
  T* gradient_at(Slot<T>& s, Index i) { return s.reduced ? s.reduced.get() + (i - s.owned_begin(c_)) : s.grad() + i; }

  double squared_norm() override {
    double sum = 0;
    for (auto& s : slots) {
      // Each element once: the first replica along every axis the parameter is replicated
      // over, except the data axis where the chunks partition it.
      std::uint32_t axes = s.replica_axes & ~(s.sharded ? data_mask : 0u);
      bool counted = !s.norm_elsewhere;
      for (int a = 0; a < tshard::detail::kMaxAxes; ++a)
        if ((axes & (1u << a)) && coords[a] != 0) counted = false;
      if (!counted) continue;
      tshard::detail::sampled("squared gradient norm", [&] {
        s.for_each_run_in(s.owned_begin(c_), s.owned_end(c_), [&](Index off, Index n) {
          const T* g = gradient_at(s, off);
          for (Index i = 0; i < n; ++i) sum += double(g[i]) * double(g[i]);
        });
      }, s.size, s.owned_end(c_) - s.owned_begin(c_));
    }
    return sum;
  }

  void scale_gradients(double f) override {
    for (auto& s : slots) {
      if (s.reduced && s.grad_present()) {  // a gradient gathered to be read: scaled whole, as its chunks
        T* g = s.grad();
        for (Index i = 0; i < s.size; ++i) g[i] = T(g[i] * f);
      }
      tshard::detail::sampled("gradient scaling", [&] {
        s.for_each_run_in(s.owned_begin(c_), s.owned_end(c_), [&](Index off, Index n) {
          T* g = gradient_at(s, off);
          for (Index i = 0; i < n; ++i) g[i] = T(g[i] * f);
        });
      }, s.size, s.owned_end(c_) - s.owned_begin(c_));
    }
  }

  // A tied parameter (one copy here, its twin on rank `peer` of `comm`, laid out alike): the
  // range this rank updates, reduced over the data axis already, becomes the sum of both copies'
  // gradients. Both ranks add mine + theirs, which rounds alike either way round, so the twins
  // keep taking the same update. Returns the seconds blocked.
  double add_twin_gradient(int slot, MPI_Comm comm, int peer) {
    Slot<T>& s = slots[std::size_t(slot)];
    const Index begin = s.owned_begin(c_), end = s.owned_end(c_);
    Index n = 0;
    s.for_each_run_in(begin, end, [&](Index, Index len) { n += len; });
    tshard::detail::OperatorScope scope("tied_gradient_sum");
    auto mine = tshard::detail::pooled_array<T>(static_cast<std::size_t>(std::max<Index>(n, 1)));
    auto theirs = tshard::detail::pooled_array<T>(static_cast<std::size_t>(std::max<Index>(n, 1)));
    T* out = mine.get();
    s.for_each_run_in(begin, end, [&](Index off, Index len) { out = std::copy(gradient_at(s, off), gradient_at(s, off) + len, out); });
    auto sent = tshard::detail::PendingMessage::send(comm, peer, mine.get(), n, kTieTag);
    auto received = tshard::detail::PendingMessage::receive(comm, peer, theirs.get(), n, kTieTag);
    const double blocked = tshard::detail::wait_all({&sent, &received});
    const T* in = theirs.get();
    s.for_each_run_in(begin, end, [&](Index off, Index len) {
      T* g = gradient_at(s, off);
      for (Index i = 0; i < len; ++i) g[i] = T(g[i] + in[i]);
      in += len;
    });
    return blocked;
  }

  // The parameter this rank updates, from local index i of the block on (i in the owned range):
  // a streamed parameter's master copy holds the owned range alone.
  T* parameter_at(Slot<T>& s, Index i) { return s.streamed ? s.master.get() + (i - s.owned_begin(c_)) : s.param() + i; }

  void gather_parameters(bool streamed) override {
    if (streamed && prefetch_) {
      prefetch_->wait();
      unpack_chunks(true, prefetch_recv_.get(), prefetch_total_);
      drop_prefetch();
      return;
    }
    const Index total = gathered_elements(streamed);
    if (total == 0) return;
    tshard::detail::OperatorScope scope("parameter_gather");
    auto mine = pack_owned_chunks(streamed, total);
    auto all = tshard::detail::pooled_array<T>(static_cast<std::size_t>(total * n_));
    tshard::detail::all_gather(data_, mine.get(), total, all.get());
    unpack_chunks(streamed, all.get(), total);
  }

  bool prefetch_parameters() override {
    const Index total = gathered_elements(true);
    if (prefetch_ || total == 0) return false;
    tshard::detail::OperatorScope scope("parameter_gather");
    prefetch_total_ = total;
    prefetch_send_ = pack_owned_chunks(true, total);
    prefetch_recv_ = tshard::detail::pooled_array<T>(static_cast<std::size_t>(total * n_));
    prefetch_ = std::make_unique<tshard::detail::PendingCollective<T>>();
    prefetch_->start_all_gather(data_, prefetch_send_.get(), total, prefetch_recv_.get());
    return true;
  }
  bool prefetching() const override { return prefetch_ != nullptr; }
  void drop_prefetch() override {
    if (prefetch_) prefetch_->wait();
    prefetch_.reset();
    prefetch_send_.reset();
    prefetch_recv_.reset();
  }

  // A released parameter keeps the way back to its values: a writer of files (io::save_npy,
  // checkpoints, safetensors) gathers the chunks, collectively over the data axis, and writes
  // the true values; gather() and local() keep saying it holds none.
  void release_parameters() override {
    for (auto& s : slots) {
      if (!s.streamed) continue;
      s.release_param(std::make_shared<const tshard::detail::RestoreValues<T>>(
          [master = s.master, chunk = s.chunk, size = s.size, n = n_, comm = data_, mesh = s.mesh](T* block) {
            tshard::detail::OperatorScope scope("parameter_gather");
            auto all = tshard::detail::pooled_array<T>(static_cast<std::size_t>(chunk * n));
            tshard::detail::all_gather(comm, master.get(), chunk, all.get());
            std::copy(all.get(), all.get() + size, block);
          }));
    }
  }

  int slot_count() const override { return int(slots.size()); }
  void read_state(int i, int k, void* block) override {
    Slot<T>& s = slots[std::size_t(i)];
    using State = typename Slot<T>::State;
    State* out = static_cast<State*>(block);
    const State* st = s.state[std::size_t(k)].get();
    if (!s.sharded) {
      std::copy(st, st + s.size, out);
      return;
    }
    tshard::detail::OperatorScope scope("optimizer_state_gather");
    auto all = tshard::detail::pooled_array<State>(static_cast<std::size_t>(s.chunk * n_));
    tshard::detail::all_gather(data_, st, s.chunk, all.get());
    std::copy(all.get(), all.get() + s.size, out);
  }
  void write_state(int i, int k, const void* block) override {
    Slot<T>& s = slots[std::size_t(i)];
    using State = typename Slot<T>::State;
    const State* in = static_cast<const State*>(block);
    State* st = s.state[std::size_t(k)].get();
    const Index b = s.owned_begin(c_), e = s.owned_end(c_);
    std::copy(in + b, in + e, st);
    std::fill(st + (e - b), st + s.state_size(), State(0));
  }
  void reload_parameters() override {
    for (auto& s : slots) {
      const Index b = s.owned_begin(c_), e = s.owned_end(c_);
      if (s.streamed) std::copy(s.param() + b, s.param() + e, s.master.get());
      if (s.master32) take_master_copy(s);
    }
  }
  // The float master copy of the owned range, from the parameter (at registration, after a load).
  void take_master_copy(Slot<T>& s) {
    const Index b = s.owned_begin(c_), e = s.owned_end(c_);
    for (Index i = b; i < e; ++i) s.master32.get()[i - b] = typename Slot<T>::State(*parameter_at(s, i));
  }

  OptimizerMemory memory() const override {
    OptimizerMemory m;
    for (auto& s : slots) {
      const std::uint64_t b = sizeof(T);
      m.model_elements += std::uint64_t(s.size);
      if (n_ > 1 && (s.replica_axes & data_mask) != data_mask) m.data_split_elements += std::uint64_t(s.size);
      m.parameters += (s.param_present() ? std::uint64_t(s.size) * b : 0) + (s.master ? std::uint64_t(s.chunk) * b : 0);
      m.gradients += (s.grad_present() ? std::uint64_t(s.size) * b : 0) + (s.reduced ? std::uint64_t(s.chunk) * b : 0);
      m.state += (std::uint64_t(s.state.size()) + (s.master32 ? 1 : 0)) * std::uint64_t(s.state_size()) *
                 sizeof(typename Slot<T>::State);
    }
    return m;
  }

  std::uint32_t data_mask = 0;
  std::array<int, tshard::detail::kMaxAxes> coords{};

 private:
  MPI_Comm data_;
  std::shared_ptr<const tshard::detail::NodeGroups> nodes_;  // the data axis by node, for two levels
  int n_ = 1, c_ = 0, stage_ = 0;
  bool scatter_ = false;
  std::shared_ptr<T> send_, recv_;
  std::vector<std::unique_ptr<tshard::detail::PendingSequence<T>>> pending_;
  double blocking_seconds_ = 0;
  std::shared_ptr<T> prefetch_send_, prefetch_recv_;  // (declared first: they outlive prefetch_'s wait)
  Index prefetch_total_ = 0;  // elements of each rank's packed chunks in the prefetch
  std::unique_ptr<tshard::detail::PendingCollective<T>> prefetch_;  // stage 3: a gather in flight
  static constexpr Index kInPlace = Index(1) << 16;  // elements: reduced alone, without packing
  static constexpr int kTieTag = 0x7e1d;  // the tied gradients' messages (apart from a pipeline's)

  // The parameters an all-gather of chunks moves: the streamed ones (stage 3) or the others.
  bool gathers(const Slot<T>& s, bool streamed) const { return s.sharded && s.streamed == streamed; }
  Index gathered_elements(bool streamed) const {
    Index total = 0;
    for (auto& s : slots)
      if (gathers(s, streamed)) total += s.chunk;
    return total;
  }
  // This rank's chunks of them, packed (each padded to its chunk size).
  std::shared_ptr<T> pack_owned_chunks(bool streamed, Index total) {
    auto mine = tshard::detail::pooled_array<T>(static_cast<std::size_t>(total));
    T* out = mine.get();
    for (auto& s : slots) {
      if (!gathers(s, streamed)) continue;
      const Index b = s.owned_begin(c_), e = s.owned_end(c_);
      const T* p = s.streamed ? s.master.get() : s.param() + b;
      std::copy(p, p + (e - b), out);
      std::fill(out + (e - b), out + s.chunk, T(0));
      out += s.chunk;
    }
    return mine;
  }
  // Every rank's packed chunks (rank j's at j * total) back into the parameters.
  void unpack_chunks(bool streamed, const T* all, Index total) {
    for (int j = 0; j < n_; ++j) {
      const T* in = all + Index(j) * total;
      for (auto& s : slots) {
        if (!gathers(s, streamed)) continue;
        const Index b = std::min(s.size, Index(j) * s.chunk), e = std::min(s.size, Index(j + 1) * s.chunk);
        std::copy(in, in + (e - b), s.param() + b);
        in += s.chunk;
      }
    }
  }

  // One reduction over the data axis: all-reduce in place (recv null) or reduce-scatter.
  void reduce(bool nonblocking, T* send, T* recv, Index n) {
    if (!nonblocking) {
      const auto t0 = Clock::now();
      struct Timed {
        Clock::time_point t0;
        double& into;
        ~Timed() { into += std::chrono::duration<double>(Clock::now() - t0).count(); }
      } timed{t0, blocking_seconds_};
      // tshard's own exchanges (comm/all_reduce.hpp: pipelined, in two levels over nodes);
      // MPI's all-reduce for small buffers.
      if (recv)
        tshard::detail::two_level_reduce_scatter(data_, *nodes_, send, recv, n);
      else if (tshard::detail::bytes_of<T>(n) >= tshard::detail::own_all_reduce_bytes())
        tshard::detail::two_level_all_reduce(data_, *nodes_, send, n);
      else
        tshard::detail::all_reduce(data_, send, send, n, ReduceOp::Sum);
      return;
    }
    // In flight: the same sums as the blocking forms (two levels where the nodes allow), as
    // sequences of non-blocking steps that test() and wait() move along.
    using tshard::detail::PendingSequence;
    if (recv) {
      pending_.push_back(tshard::detail::start_two_level_reduce_scatter(data_, nodes_, send, recv, n));
    } else if (tshard::detail::bytes_of<T>(n) >= tshard::detail::own_all_reduce_bytes()) {
      pending_.push_back(tshard::detail::start_two_level_all_reduce(data_, nodes_, send, n));
    } else {
      using Step = typename PendingSequence<T>::Step;
      MPI_Comm comm = data_;
      pending_.push_back(std::make_unique<PendingSequence<T>>(
          std::vector<Step>{[=](tshard::detail::PendingCollective<T>& c) { c.start_all_reduce(comm, send, n); }}));
    }
  }
};

}  // namespace detail
}  // namespace tshard::parallel

namespace tshard::nn {
using parallel::GradientReductionStats;
}  // namespace tshard::nn

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::parallel::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(class Bucket<T>)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::parallel::detail
