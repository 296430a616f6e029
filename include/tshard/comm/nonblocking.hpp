// Non-blocking collectives left in flight while computation goes on (DDP's bucketed gradient
// all-reduce, ZeRO's reduce-scatter, ZeRO-3's prefetched parameter gather): start() posts the
// MPI call in chunks of the collective limit, test() lets MPI progress it, wait() completes it
// and records bytes and time under the operator that started it, with the time spent blocked
// in wait() apart.
#pragma once
#include "tshard/comm/clock.hpp"
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/all_reduce.hpp"
#include "tshard/comm/collectives.hpp"

namespace tshard::detail {

// A tag of its own for each non-blocking exchange all-reduce on a communicator: several are in
// flight at once and reach their second phase in any order, so their messages must not match
// one another's. The count lives on the communicator (an MPI attribute): every rank starts them
// in the same order, so every rank draws the same tag for the same one.
inline int delete_exchange_count(MPI_Comm, int, void* value, void*) {
  delete static_cast<unsigned*>(value);
  return MPI_SUCCESS;
}
inline int next_exchange_tag(MPI_Comm comm) {
  static const int key = [] {
    int k = MPI_KEYVAL_INVALID;
    MPI_Comm_create_keyval(MPI_COMM_NULL_COPY_FN, &delete_exchange_count, &k, nullptr);
    return k;
  }();
  void* value = nullptr;
  int found = 0;
  MPI_Comm_get_attr(comm, key, &value, &found);
  if (!found) {
    value = new unsigned(0);
    MPI_Comm_set_attr(comm, key, value);
  }
  auto& count = *static_cast<unsigned*>(value);
  return 0x6000 + int(count++ % 4096u);  // (below every other tag of tshard's, within MPI's 32767)
}

template <class T>
class PendingCollective {
 public:
  PendingCollective() = default;
  PendingCollective(const PendingCollective&) = delete;
  PendingCollective& operator=(const PendingCollective&) = delete;
  ~PendingCollective() {
    if (!reqs_.empty()) MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
  }

  // data = sum over the group of data, in place.
  void start_all_reduce(MPI_Comm comm, T* data, Index n) {
#if TSHARD_SIMULATE
    // SMPI 3.32's MPI_Iallreduce frees its copy of an in-place buffer before the reduction ends
    // (valgrind: its copy callback reads the freed block; 32 ranks on 2 nodes crashed): the
    // exchange below instead, which sums in its own order (rounding-level differences only).
    start_exchange_all_reduce(comm, data, n);
#else
    if (!begin("all_reduce", comm, data, data, n, 2 * bytes_of<T>(n) * (comm_size(comm) - 1) / comm_size(comm))) return;
    for (Index off = 0; off < n; off += collective_chunk_limit()) {
      const Index c = std::min(collective_chunk_limit(), n - off);
      reqs_.emplace_back();
      MPI_Iallreduce(MPI_IN_PLACE, data + off, int(c), mpi_datatype<T>(), mpi_op<T>(ReduceOp::Sum), comm, &reqs_.back());
    }
#endif
  }

  // send holds p blocks of n; group rank i receives the sum of block i into recv. The exchange
  // of collectives.hpp's reduce_scatter_exchange with every message in flight at once, summed
  // in the same order when it completes: the blocking form's bits. It stages the p - 1 other
  // ranks' contributions to this rank's block, (p - 1) n elements, until then.
  // `tag`: its own where others of the same communicator may start in another order on other
  // ranks (the steps of a PendingSequence).
  void start_reduce_scatter(MPI_Comm comm, const T* send, T* recv, Index n, int tag = kReductionTag) {
    const int p = comm_size(comm);
    if (!begin("reduce_scatter", comm, send, recv, n, bytes_of<T>(n) * std::uint64_t(p - 1))) return;
    const int me = comm_rank(comm);
    staged_ = pooled_array<T>(std::size_t(n) * std::size_t(p - 1));
    mine_ = send + Index(me) * n;
    out_ = recv;
    count_ = n;
    me_ = me;
    p_ = p;
    const Index limit = collective_chunk_limit();
    for (Index off = 0; off < n; off += limit) {
      const Index c = std::min(limit, n - off);
      for (int d = 1; d < p; ++d) {
        const int to = (me - d + p) % p, from = (me + d) % p;
        reqs_.emplace_back();
        MPI_Irecv(staged(from) + off, int(c), mpi_datatype<T>(), from, tag, comm, &reqs_.back());
        reqs_.emplace_back();
        MPI_Isend(send + Index(to) * n + off, int(c), mpi_datatype<T>(), to, tag, comm, &reqs_.back());
      }
    }
  }

  // data = sum over the group of data, in place, as all_reduce.hpp's exchange_all_reduce sums it
  // (the same bits), in two phases: every rank's share of every other block sent at once and
  // this block's shares staged (in pooled memory: no allocation a step, unlike MPI's
  // non-blocking all-reduce, whose fresh buffers cost page faults every time), then, once they
  // are in (test() or wait()), this block summed and sent to every rank while the others arrive.
  // Its tag is drawn here unless given (next_exchange_tag drawn earlier, in program order).
  // Its second phase starts only when this rank tests or waits for it: wait for several in one
  // order on every rank, or hold each in a PendingSequence, whose wait moves all of them.
  void start_exchange_all_reduce(MPI_Comm comm, T* data, Index n, int tag = -1) {
    const int p = comm_size(comm);
    const Blocks b(n, p);
    if (!begin("all_reduce", comm, data, data, n, 2 * bytes_of<T>(n) * std::uint64_t(p - 1) / std::uint64_t(p))) return;
    me_ = comm_rank(comm), p_ = p, comm_ = comm, data_ = data, total_ = n;
    tag_ = tag >= 0 ? tag : next_exchange_tag(comm);
    count_ = b.length(me_);
    staged_ = pooled_array<T>(std::size_t(std::max<Index>(1, count_ * (p - 1))));
    for (int d = 1; d < p; ++d) {
      const int to = (me_ - d + p) % p, from = (me_ + d) % p;
      post(from, staged(from), count_, true);
      post(to, data + b.begin(to), b.length(to), false);
    }
  }

  // recv[i*n .. (i+1)*n) = send of group rank i (send and recv kept by the caller until done).
  void start_all_gather(MPI_Comm comm, const T* send, Index n, T* recv) {
    if (!begin("all_gather", comm, send, recv, n, bytes_of<T>(n) * std::uint64_t(comm_size(comm) - 1))) return;
    const Index limit = collective_chunk_limit();
    for (Index off = 0; off < n; off += limit) {
      const Index c = std::min(limit, n - off);
      reqs_.emplace_back();
      if (c == n) {
        MPI_Iallgather(send, int(c), mpi_datatype<T>(), recv, int(c), mpi_datatype<T>(), comm, &reqs_.back());
      } else {  // chunk `off` of every rank's block; MPI keeps a freed datatype alive while in use
        StridedBlock<T> block(c, n);
        MPI_Iallgather(send + off, int(c), mpi_datatype<T>(), recv + off, 1, block.get(), comm, &reqs_.back());
      }
    }
  }

  // The all-gather above by point-to-point messages under `tag`: a step of a PendingSequence,
  // which may start on some ranks before another sequence's gather and after it on others
  // (MPI's collectives must start in one order everywhere; tagged messages need not).
  void start_tagged_all_gather(MPI_Comm comm, const T* send, Index n, T* recv, int tag) {
    const int p = comm_size(comm);
    if (!begin("all_gather", comm, send, recv, n, bytes_of<T>(n) * std::uint64_t(p - 1))) return;
    me_ = comm_rank(comm), p_ = p, comm_ = comm, tag_ = tag;
    std::copy(send, send + n, recv + Index(me_) * n);
    for (int q = 0; q < p; ++q) {
      if (q == me_) continue;
      post(q, recv + Index(q) * n, n, true);
      post(q, const_cast<T*>(send), n, false);
    }
  }

  // Lets MPI progress the collective; true once it is complete.
  // (Time spent inside counts as not hidden: MPI may do the whole transfer in here.)
  bool test() {
    if (reqs_.empty() && !data_) return true;
    const auto t0 = Clock::now();
    int done = 0;
    MPI_Testall(int(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE);
    if (done && data_) {  // the exchange all-reduce's first phase is in: on to the second
      gather_phase();
      MPI_Testall(int(reqs_.size()), reqs_.data(), &done, MPI_STATUSES_IGNORE);
    }
    blocked_ += std::chrono::duration<double>(Clock::now() - t0).count();
    if (done) finish(0.0);
    return done != 0;
  }

  // Completes the collective; returns the seconds spent inside MPI for it since start (in
  // test() and here): the part computation did not hide.
  double wait() {
    if (!reqs_.empty() || data_) {
      const auto t0 = Clock::now();
      {
        WatchedCall watched("non-blocking collective (wait)", [] { return current_operator(); });
        MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
        if (data_) {
          gather_phase();
          MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
        }
      }
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      blocked_ += waited;
      profile_wait(waited);
      finish(0.0);
    }
    const double b = blocked_;
    blocked_ = 0;
    return b;
  }
  bool in_flight() const { return !reqs_.empty() || data_; }
  // This collective's requests not yet complete, for a wait on whichever completes first.
  void pending(std::vector<MPI_Request*>& out) {
    for (auto& r : reqs_)
      if (r != MPI_REQUEST_NULL) out.push_back(&r);
  }

 private:
  // What every start shares: the label and clock of this collective, and, on one rank or with
  // nothing to move, the copy that is all of it. False when there is nothing to post.
  bool begin(const char* kind, MPI_Comm comm, const T* send, T* recv, Index n, std::uint64_t moved) {
    kind_ = kind;
    op_ = current_operator();
    start_ = Clock::now();
    blocked_ = 0;
    if (comm_size(comm) == 1 || n == 0) {
      moved_ = 0;
      if (n && send != recv) std::copy(send, send + n, recv);
      return false;
    }
    moved_ = moved;
    return true;
  }
  // One message of the exchange all-reduce, in chunks of the collective limit.
  void post(int peer, T* buf, Index n, bool receive) {
    for (Index off = 0; off < n; off += collective_chunk_limit()) {
      const int c = int(std::min(collective_chunk_limit(), n - off));
      reqs_.emplace_back();
      if (receive)
        MPI_Irecv(buf + off, c, mpi_datatype<T>(), peer, tag_, comm_, &reqs_.back());
      else
        MPI_Isend(buf + off, c, mpi_datatype<T>(), peer, tag_, comm_, &reqs_.back());
    }
  }
  // The exchange all-reduce's second phase: this rank's block summed in the ring's order (its
  // own share last), then sent to every rank, whose blocks arrive in place.
  void gather_phase() {
    reqs_.clear();
    using A = accumulator_t<T>;
    const Blocks b(total_, p_);
    T* own = data_ + b.begin(me_);
    auto acc = pooled_array<A>(std::size_t(std::max<Index>(1, count_)));
    for (int d = 1; d < p_; ++d) accumulate_round(ReduceOp::Sum, d, p_, acc.get(), staged((me_ + d) % p_), own, own, count_);
    staged_.reset();
    for (int q = 0; q < p_; ++q) {
      if (q == me_) continue;
      post(q, data_ + b.begin(q), b.length(q), true);
      post(q, own, count_, false);
    }
    data_ = nullptr;
  }
  // Rank q's contribution (q != me_): slot (q - me_) mod p - 1, the round it came in.
  T* staged(int q) const { return staged_.get() + Index((q - me_ + p_) % p_ - 1) * count_; }
  void finish(double) {
    reqs_.clear();
    if (out_) {  // a reduce-scatter: this rank's block, summed in the blocking form's order
      using A = accumulator_t<T>;
      std::shared_ptr<A> sums;
      A* acc;
      if constexpr (std::is_same_v<A, T>) {
        acc = out_;
      } else {  // bfloat16 on more than two ranks sums in float
        if (p_ > 2) sums = pooled_array<A>(std::size_t(count_));
        acc = sums.get();
      }
      for (int d = 1; d < p_; ++d) accumulate_round(ReduceOp::Sum, d, p_, acc, staged((me_ + d) % p_), mine_, out_, count_);
      out_ = nullptr;
      staged_.reset();
    }
    const double s = std::chrono::duration<double>(Clock::now() - start_).count();
    record_collective(op_, kind_, moved_, moved_, s);
  }

  std::vector<MPI_Request> reqs_;
  // A reduce-scatter's other ranks' contributions to this rank's block, this rank's own (in
  // the caller's send buffer) and where their sum goes.
  std::shared_ptr<T> staged_;
  T* data_ = nullptr;  // an exchange all-reduce in its first phase: the buffer
  Index total_ = 0;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int tag_ = 0;
  const T* mine_ = nullptr;
  T* out_ = nullptr;
  Index count_ = 0;
  int me_ = 0, p_ = 1;
  const char* kind_ = "";
  std::string op_;
  std::uint64_t moved_ = 0;
  double blocked_ = 0;
  Clock::time_point start_;
};

// Every PendingSequence in flight on this thread. A sequence's later steps start only when this
// rank tests or waits for it; ranks may wait for their sequences in different orders, so waiting
// for one moves all of them (else rank a could wait for x, whose next step rank b has yet to
// start, while b waits for y, whose next step a has yet to start).
class SequenceInFlight {
 public:
  virtual ~SequenceInFlight() = default;
  virtual bool test() = 0;
  virtual void pending(std::vector<MPI_Request*>& out) = 0;

 protected:
  static std::vector<SequenceInFlight*>& all() {
    thread_local std::vector<SequenceInFlight*> in_flight;
    return in_flight;
  }
  void enlist() { all().push_back(this); }
  void delist() {
    auto& v = all();
    v.erase(std::remove(v.begin(), v.end(), this), v.end());
  }
  // Tests every sequence in flight once; true when any moved on (a copy of the list: a test may
  // complete one, which leaves it).
  static bool test_all() {
    const auto in_flight = all();
    bool moved = false;
    for (auto* s : in_flight) moved |= s->test();
    return moved;
  }
  // Once no sequence can move on: wait until a message of any of them is in.
  static void idle() {
#if TSHARD_SIMULATE
    // Blocked in MPI, as a real rank's spinning is: SMPI charges every MPI_Test a host-chosen
    // time instead, so polling would put made-up time on the simulated clock.
    std::vector<MPI_Request*> where;
    for (auto* s : all()) s->pending(where);
    if (where.empty()) return;
    std::vector<MPI_Request> reqs(where.size());
    for (std::size_t i = 0; i < where.size(); ++i) reqs[i] = *where[i];
    int done = MPI_UNDEFINED;
    MPI_Waitany(int(reqs.size()), reqs.data(), &done, MPI_STATUS_IGNORE);
    if (done != MPI_UNDEFINED) *where[std::size_t(done)] = MPI_REQUEST_NULL;  // (freed by the wait)
#else
    std::this_thread::yield();  // (ranks may share cores)
#endif
  }
};

// Non-blocking collectives run one after another, each started once the one before is complete
// (in test() or wait()): the two levels of a gradient reduction in flight during backward. Each
// step starts its collective on the PendingCollective it is handed; `then_` runs at the end.
template <class T>
class PendingSequence : public SequenceInFlight {
 public:
  using Step = std::function<void(PendingCollective<T>&)>;
  PendingSequence(std::vector<Step> steps, std::function<void()> then = {})
      : steps_(std::move(steps)), then_(std::move(then)), label_(&operator_stack().top()) {
    enlist();
    advance();
  }
  PendingSequence(const PendingSequence&) = delete;
  PendingSequence& operator=(const PendingSequence&) = delete;
  ~PendingSequence() override {
    if (current_) wait();
    delist();
  }

  bool in_flight() const { return current_ != nullptr; }
  void pending(std::vector<MPI_Request*>& out) override {
    if (current_) current_->pending(out);
  }
  // Moves the sequence on as far as MPI allows; true once it is complete.
  bool test() override {
    while (current_) {
      if (!current_->test()) return false;
      blocked_ += current_->wait();
      advance();
    }
    return true;
  }
  // Completes every step, moving every other sequence in flight on meanwhile; the seconds spent
  // inside MPI for it (test() included).
  double wait() {
    if (current_) {
      const auto t0 = Clock::now();
      {
        WatchedCall watched("non-blocking collective (wait)", [] { return current_operator(); });
        while (current_) {
          if (test_all()) continue;
          const auto idle_from = Clock::now();
          idle();
          blocked_ += std::chrono::duration<double>(Clock::now() - idle_from).count();
        }
      }
      // (the time inside MPI is each test's, counted by the collectives tested, and the idle
      // time between them, counted here)
      profile_wait(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const double b = blocked_;
    blocked_ = 0;
    return b;
  }

 private:
  void advance() {
    current_.reset();
    if (next_ < steps_.size()) {
      OperatorScope scope(label_, "");  // every step counted under the operator that started the first
      current_ = std::make_unique<PendingCollective<T>>();
      steps_[next_++](*current_);
    } else {
      if (then_) then_();
      then_ = {};
      delist();
    }
  }
  std::vector<Step> steps_;
  std::function<void()> then_;
  std::size_t next_ = 0;
  OperatorLabel* label_;
  std::unique_ptr<PendingCollective<T>> current_;
  double blocked_ = 0;
};

// all_reduce.hpp's two_level_all_reduce in flight: the node's reduce-scatter, the exchange
// all-reduce of this rank's share among the nodes, the node's all-gather, in that order, the
// same sums (the same bits). Tags are drawn now, in program order, on every rank alike.
template <class T>
std::unique_ptr<PendingSequence<T>> start_two_level_all_reduce(MPI_Comm comm, std::shared_ptr<const NodeGroups> g, T* data,
                                                              Index n) {
  using Step = typename PendingSequence<T>::Step;
  if (!g->usable)
    return std::make_unique<PendingSequence<T>>(
        std::vector<Step>{[=](PendingCollective<T>& c) { c.start_exchange_all_reduce(comm, data, n); }});
  const int L = g->per_node;
  const Blocks b(n, L);
  const Index len = b.length(comm_rank(g->node));
  std::shared_ptr<T> share = pooled_array<T>(std::size_t(std::max<Index>(b.size, 1))), padded;
  if (b.size * L != n) {
    padded = pooled_array<T>(std::size_t(b.size * L));
    std::copy(data, data + n, padded.get());
    std::fill(padded.get() + n, padded.get() + b.size * L, T(0));
  }
  T* blocks = padded ? padded.get() : data;
  const int node_tag = next_exchange_tag(g->node), across_tag = next_exchange_tag(g->across),
            gather_tag = next_exchange_tag(g->node);
  return std::make_unique<PendingSequence<T>>(
      std::vector<Step>{
          [=](PendingCollective<T>& c) { c.start_reduce_scatter(g->node, blocks, share.get(), b.size, node_tag); },
          [=](PendingCollective<T>& c) { c.start_exchange_all_reduce(g->across, share.get(), len, across_tag); },
          [=](PendingCollective<T>& c) { c.start_tagged_all_gather(g->node, share.get(), b.size, blocks, gather_tag); }},
      [=] {
        if (padded) std::copy(padded.get(), padded.get() + n, data);
      });
}

// all_reduce.hpp's two_level_reduce_scatter in flight (send is copied now; recv is written at the end).
template <class T>
std::unique_ptr<PendingSequence<T>> start_two_level_reduce_scatter(MPI_Comm comm, std::shared_ptr<const NodeGroups> g,
                                                                  const T* send, T* recv, Index n) {
  using Step = typename PendingSequence<T>::Step;
  if (!g->usable)
    return std::make_unique<PendingSequence<T>>(
        std::vector<Step>{[=](PendingCollective<T>& c) { c.start_reduce_scatter(comm, send, recv, n); }});
  const int L = g->per_node, N = g->nodes;
  auto grouped = pooled_array<T>(std::size_t(n) * std::size_t(L * N));
  for (int slot = 0; slot < L * N; ++slot) {
    const T* block = send + Index(g->rank_at[std::size_t(slot)]) * n;
    std::copy(block, block + n, grouped.get() + Index(slot) * n);
  }
  auto mine = pooled_array<T>(std::size_t(std::max<Index>(n * N, 1)));
  const int node_tag = next_exchange_tag(g->node), across_tag = next_exchange_tag(g->across);
  return std::make_unique<PendingSequence<T>>(std::vector<Step>{
      [=](PendingCollective<T>& c) { c.start_reduce_scatter(g->node, grouped.get(), mine.get(), n * N, node_tag); },
      [=](PendingCollective<T>& c) { c.start_reduce_scatter(g->across, mine.get(), recv, n, across_tag); }});
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(std::unique_ptr<PendingSequence<T>> start_two_level_all_reduce<T>(MPI_Comm, \
    std::shared_ptr<const NodeGroups>, T*, Index))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(std::unique_ptr<PendingSequence<T>> start_two_level_reduce_scatter<T>(MPI_Comm, \
    std::shared_ptr<const NodeGroups>, const T*, T*, Index))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(class PendingCollective<T>)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(class PendingSequence<T>)
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
