// Typed collectives on a communicator: every MPI call tshard makes goes through here, is
// counted (stats.hpp, with the bytes of cost.hpp's model) and is split into chunks when counts
// exceed the chunk limit (MPI counts are int; the limit is settable so tests exercise chunking
// with small buffers).
#pragma once
#include "tshard/comm/clock.hpp"
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <utility>
#include <memory>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/cost.hpp"
#include "tshard/comm/datatype.hpp"
#include "tshard/comm/stats.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::detail {

inline Index& collective_chunk_limit() {
  static Index limit = INT_MAX;
  return limit;
}
// Sets the largest element count one MPI call may carry (default INT_MAX).
inline void set_collective_chunk_limit(Index n) { collective_chunk_limit() = std::max<Index>(1, n); }

inline int comm_size(MPI_Comm c) {
  int s = 1;
  MPI_Comm_size(c, &s);
  return s;
}
inline int comm_rank(MPI_Comm c) {
  int r = 0;
  MPI_Comm_rank(c, &r);
  return r;
}

// A datatype of `count` elements whose extent is `stride` elements: block i of a chunked
// call then lands at i*stride, as the unchunked call would put it.
template <class T>
class StridedBlock {
 public:
  StridedBlock(Index count, Index stride) {
    MPI_Datatype tmp;
    MPI_Type_contiguous(int(count), mpi_datatype<T>(), &tmp);
    MPI_Type_create_resized(tmp, 0, MPI_Aint(stride * Index(sizeof(T))), &type_);
    MPI_Type_commit(&type_);
    MPI_Type_free(&tmp);
  }
  ~StridedBlock() { MPI_Type_free(&type_); }
  StridedBlock(const StridedBlock&) = delete;
  StridedBlock& operator=(const StridedBlock&) = delete;
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_;
};

template <class T>
std::uint64_t bytes_of(Index n) {
  return std::uint64_t(n) * sizeof(T);
}

// What every fixed-count collective shares: on one rank, or with nothing to move, it is a copy;
// otherwise f(p, offset, count) runs once per chunk of at most the chunk limit.
template <class T, class F>
void chunked_collective(MPI_Comm comm, const T* send, T* recv, Index n, F&& f) {
  const int p = comm_size(comm);
  if (p == 1 || n == 0) {
    if (send != recv && n) std::memcpy(recv, send, bytes_of<T>(n));
    return;
  }
  const Index limit = collective_chunk_limit();
  for (Index off = 0; off < n; off += limit) f(p, off, std::min(limit, n - off));
}

// MPI_Allgather of c contiguous elements a rank into recv, each rank's block placed by one of
// `placed` (a datatype whose extent is the step between blocks). Under SimGrid's SMPI (3.32) the
// Open MPI and MPICH algorithms it selects place such blocks wrongly, so there the blocks are
// gathered contiguously and then placed by a message to this rank, which moves the same bytes.
template <class T>
void all_gather_into(MPI_Comm comm, const T* send, Index c, T* recv, MPI_Datatype placed) {
#if TSHARD_SIMULATE
  const int p = comm_size(comm);
  std::unique_ptr<T[]> gathered(new T[static_cast<std::size_t>(c) * p]);  // (T may be bool)
  MPI_Allgather(send, int(c), mpi_datatype<T>(), gathered.get(), int(c), mpi_datatype<T>(), comm);
  MPI_Sendrecv(gathered.get(), int(c) * p, mpi_datatype<T>(), 0, 0, recv, p, placed, 0, 0, MPI_COMM_SELF,
               MPI_STATUS_IGNORE);
#else
  MPI_Allgather(send, int(c), mpi_datatype<T>(), recv, 1, placed, comm);
#endif
}

// recv[i*n .. (i+1)*n) = send of group rank i.
template <class T>
void all_gather(MPI_Comm comm, const T* send, Index n, T* recv) {
  chunked_collective(comm, send, recv, n, [&](int p, Index off, Index c) {
    const Traffic tr = all_gather_traffic(bytes_of<T>(c), p);
    CollectiveTimer t("all_gather", tr.bytes_sent, tr.bytes_received, comm);
    if (c == n) {
      MPI_Allgather(send, int(c), mpi_datatype<T>(), recv, int(c), mpi_datatype<T>(), comm);
    } else {
      StridedBlock<T> block(c, n);
      all_gather_into(comm, send + off, c, recv + off, block.get());
    }
  });
}

// recv = op over the group of send; send == recv reduces in place.
template <class T>
void all_reduce(MPI_Comm comm, const T* send, T* recv, Index n, ReduceOp op) {
  chunked_collective(comm, send, recv, n, [&](int p, Index off, Index c) {
    const Traffic tr = all_reduce_traffic(bytes_of<T>(c), p);
    CollectiveTimer t("all_reduce", tr.bytes_sent, tr.bytes_received, comm);
    MPI_Allreduce(send == recv ? MPI_IN_PLACE : static_cast<const void*>(send + off), recv + off, int(c),
                  mpi_datatype<T>(), mpi_op<T>(op), comm);
  });
}

// The tag of tshard's own point-to-point reductions (reduce_scatter_block), apart from the
// halo and redistribution messages on the same communicators. Every rank posts them in the same
// order, so MPI's non-overtaking rule matches each with its partner's.
inline constexpr int kReductionTag = 0x7e5d;

template <class T>
T reduce_two(ReduceOp op, T a, T b) {
  if constexpr (requires { a < b; }) {  // (complex values are only ever summed)
    if (op == ReduceOp::Max) return std::max(a, b);
    if (op == ReduceOp::Min) return std::min(a, b);
  }
  return a + b;
}

// The sum order of tshard's reduce-scatter: group rank r's block is
// ((s[r+1] op s[r+2]) op ... op s[r-1]) op s[r], ranks taken mod p: a ring reduce-scatter's order
// (each block's partial sum starts at the next rank and ends at its owner), so a ring and the
// exchange below give the same bits. bfloat16 accumulates in float and is rounded once (a
// pairwise MPI op rounds after every pair); A is the accumulator, T itself otherwise.
//   the first contribution (q = r + 1):  acc = x
template <class A, class T>
void accumulate_first(A* acc, const T* x, Index c) {
  for (Index i = 0; i < c; ++i) acc[i] = A(x[i]);
}
//   the next ones, r + 2 .. r - 1:        acc = acc op x
template <class A, class T>
void accumulate_next(ReduceOp op, A* acc, const T* x, Index c) {
  for (Index i = 0; i < c; ++i) acc[i] = reduce_two(op, acc[i], A(x[i]));
}
//   the last one, r - 1, and the owner's:  out = (acc op x) op own, or x op own on two ranks
//   (one pass; acc may be out)
template <class A, class T>
void accumulate_last(ReduceOp op, const A* acc, const T* x, const T* own, T* out, Index c) {
  if (!acc) {
    for (Index i = 0; i < c; ++i) out[i] = T(reduce_two(op, A(x[i]), A(own[i])));
    return;
  }
  for (Index i = 0; i < c; ++i) out[i] = T(reduce_two(op, reduce_two(op, acc[i], A(x[i])), A(own[i])));
}
// Round d = 1 .. p-1, which brings rank r + d's contribution x: the one schedule the blocking
// exchange and the non-blocking form's finish() both follow. acc is unused on two ranks.
template <class A, class T>
void accumulate_round(ReduceOp op, int d, int p, A* acc, const T* x, const T* own, T* out, Index c) {
  TSHARD_SAMPLED_KERNEL(op, d == 1, d + 1 == p, c);
  if (d + 1 == p)
    accumulate_last(op, d == 1 ? nullptr : acc, x, own, out, c);
  else if (d == 1)
    accumulate_first(acc, x, c);
  else
    accumulate_next(op, acc, x, c);
}

// Elements a reduce-scatter moves per message: a segment of a block. The non-blocking form
// (nonblocking.hpp) stages (p - 1) blocks; this one one segment, reused every round.
template <class T>
Index reduction_segment() {
  return Index(1 << 20) / Index(sizeof(T));  // 1 MiB
}

// tshard's reduce-scatter, for every group size: in round d = 1 .. p-1 each rank sends its
// contribution to rank r - d's block straight to it and receives rank r + d's contribution to
// its own, adding it at once. The bytes are a ring's ((p - 1) blocks each way) and so is the sum
// order, but no message waits for another rank's sum. Open MPI 4.1's MPI_Reduce_scatter_block
// reduces onto one rank and scatters: on a 16-core node it measured 1.9-3.6x slower than this
// exchange (summing at the end) on 2-16 ranks, slower than an all-reduce of the whole buffer
// (bench/run_reduce_scatter.sh). For two ranks a op b is b op a: the one exchange it always was.
// send and recv do not overlap.
template <class T>
void reduce_scatter_exchange(MPI_Comm comm, const T* send, T* recv, Index n, Index off, Index c, ReduceOp op) {
  using A = accumulator_t<T>;
  const int p = comm_size(comm), me = comm_rank(comm);
  const Index seg = std::min(c, reduction_segment<T>());
  auto incoming = pooled_array<T>(std::size_t(std::max<Index>(seg, 1)));
  std::shared_ptr<A> own_acc;  // bfloat16's float sums on more than two ranks (others sum in recv itself)
  if constexpr (!std::is_same_v<A, T>)
    if (p > 2) own_acc = pooled_array<A>(std::size_t(std::max<Index>(seg, 1)));
  for (Index so = off; so < off + c; so += seg) {
    const Index sc = std::min(seg, off + c - so);
    A* acc;
    if constexpr (std::is_same_v<A, T>)
      acc = recv + so;
    else
      acc = own_acc.get();
    for (int d = 1; d < p; ++d) {
      const int to = (me - d + p) % p, from = (me + d) % p;
      MPI_Sendrecv(send + Index(to) * n + so, int(sc), mpi_datatype<T>(), to, kReductionTag, incoming.get(), int(sc),
                   mpi_datatype<T>(), from, kReductionTag, comm, MPI_STATUS_IGNORE);
      accumulate_round(op, d, p, acc, incoming.get(), send + Index(me) * n + so, recv + so, sc);
    }
  }
}

// send holds p blocks of n; group rank i receives op over the group of block i (in the ring's order).
template <class T>
void reduce_scatter_block(MPI_Comm comm, const T* send, T* recv, Index n, ReduceOp op) {
  chunked_collective(comm, send, recv, n, [&](int p, Index off, Index c) {
    const Traffic tr = reduce_scatter_traffic(bytes_of<T>(c), p);
    CollectiveTimer t("reduce_scatter", tr.bytes_sent, tr.bytes_received, comm);
    reduce_scatter_exchange(comm, send, recv, n, off, c, op);
  });
}

// Block i of send (n elements) goes to group rank i; recv block j comes from group rank j.
template <class T>
void all_to_all(MPI_Comm comm, const T* send, T* recv, Index n) {
  chunked_collective(comm, send, recv, n, [&](int p, Index off, Index c) {
    const Traffic tr = all_to_all_traffic(bytes_of<T>(c), p);
    CollectiveTimer t("all_to_all", tr.bytes_sent, tr.bytes_received, comm);
    if (c == n) {
      MPI_Alltoall(send, int(c), mpi_datatype<T>(), recv, int(c), mpi_datatype<T>(), comm);
    } else {
      StridedBlock<T> block(c, n);
      MPI_Alltoall(send + off, 1, block.get(), recv + off, 1, block.get(), comm);
    }
  });
}

template <class T>
void broadcast(MPI_Comm comm, T* data, Index n, int root) {
  const int p = comm_size(comm);
  if (p == 1 || n == 0) return;
  const bool is_root = comm_rank(comm) == root;
  const Index limit = collective_chunk_limit();
  for (Index off = 0; off < n; off += limit) {
    const Index c = std::min(limit, n - off);
    const Traffic tr = broadcast_traffic(bytes_of<T>(c), p, is_root);
    CollectiveTimer t("broadcast", tr.bytes_sent, tr.bytes_received, comm);
    MPI_Bcast(data + off, int(c), mpi_datatype<T>(), root, comm);
  }
}

// One message of a point-to-point exchange: `count` elements at `data`, or, with a datatype,
// one instance of `type` (a box of a larger buffer) holding `count` elements, sent in place.
template <class T>
struct Message {
  int peer;
  T* data;
  Index count;
  MPI_Datatype type = MPI_DATATYPE_NULL;
};

// Posts the nonblocking receive of m into reqs: one call for a typed message (count 1 of
// m.type), chunks of the collective limit otherwise. Chunks of one message arrive in order
// (MPI's non-overtaking rule), so both sides only need to agree on the count.
template <class T>
void post_receive(std::vector<MPI_Request>& reqs, MPI_Comm comm, const Message<T>& m, int tag) {
  if (m.type != MPI_DATATYPE_NULL) {
    reqs.emplace_back();
    MPI_Irecv(m.data, 1, m.type, m.peer, tag, comm, &reqs.back());
    return;
  }
  const Index limit = collective_chunk_limit();
  for (Index off = 0; off < m.count; off += limit) {
    reqs.emplace_back();
    MPI_Irecv(m.data + off, int(std::min(limit, m.count - off)), mpi_datatype<T>(), m.peer, tag, comm, &reqs.back());
  }
}
// The nonblocking send of m, chunked like post_receive.
template <class T>
void post_send(std::vector<MPI_Request>& reqs, MPI_Comm comm, const Message<const T>& m, int tag) {
  T* data = const_cast<T*>(m.data);  // MPI-3 takes const buffers; older headers do not
  if (m.type != MPI_DATATYPE_NULL) {
    reqs.emplace_back();
    MPI_Isend(data, 1, m.type, m.peer, tag, comm, &reqs.back());
    return;
  }
  const Index limit = collective_chunk_limit();
  for (Index off = 0; off < m.count; off += limit) {
    reqs.emplace_back();
    MPI_Isend(data + off, int(std::min(limit, m.count - off)), mpi_datatype<T>(), m.peer, tag, comm, &reqs.back());
  }
}

// An MPI datatype for the box [start, start + extent) of a column-major buffer of extents
// `dims`, so that strided blocks travel without packing. With `stride` >= 0 its extent is
// resized to `stride` elements (consecutive instances then step by that much).
template <class T>
class BoxType {
 public:
  BoxType() = default;
  BoxType(int rank, const Extents& dims, const Extents& start, const Extents& extent, Index stride = -1) {
    int sizes[kMaxRank], sub[kMaxRank], starts[kMaxRank];
    for (int d = 0; d < rank; ++d) {
      sizes[d] = int(dims[d]);
      sub[d] = int(extent[d]);
      starts[d] = int(start[d]);
    }
    MPI_Datatype box;
    MPI_Type_create_subarray(rank, sizes, sub, starts, MPI_ORDER_FORTRAN, mpi_datatype<T>(), &box);
    if (stride >= 0) {
      MPI_Type_create_resized(box, 0, MPI_Aint(stride * Index(sizeof(T))), &type_);
      MPI_Type_free(&box);
    } else {
      type_ = box;
    }
    MPI_Type_commit(&type_);
  }
  BoxType(BoxType&& o) noexcept : type_(o.type_) { o.type_ = MPI_DATATYPE_NULL; }
  BoxType& operator=(BoxType&& o) noexcept {
    std::swap(type_, o.type_);
    return *this;
  }
  BoxType(const BoxType&) = delete;
  BoxType& operator=(const BoxType&) = delete;
  ~BoxType() {
    if (type_ != MPI_DATATYPE_NULL) MPI_Type_free(&type_);
  }
  MPI_Datatype get() const { return type_; }

 private:
  MPI_Datatype type_ = MPI_DATATYPE_NULL;
};

// The datatype of `box` (global coordinates) inside a buffer laid out as `block`.
template <class T>
BoxType<T> box_type(const ShardLayout& block, const ShardLayout& box) {
  Extents start{};
  for (int d = 0; d < block.rank; ++d) start[d] = box.offset[d] - block.offset[d];
  return BoxType<T>(block.rank, block.padded, start, box.valid);
}

// Whether a buffer of these extents can be described by MPI's int-sized datatypes.
inline bool fits_datatype(const Extents& dims, int rank) {
  Index n = 1;
  for (int d = 0; d < rank; ++d) {
    if (dims[d] > INT_MAX) return false;
    n *= std::max<Index>(dims[d], 1);
  }
  return n <= INT_MAX;
}

// All-gather of n contiguous elements per rank whose blocks land in recv as `placed` says
// (a datatype with its extent resized to the step between blocks): no unpacking.
template <class T>
void all_gather_placed(MPI_Comm comm, const T* send, Index n, T* recv, MPI_Datatype placed) {
  const int p = comm_size(comm);
  const Traffic tr = all_gather_traffic(bytes_of<T>(n), p);
  CollectiveTimer t("all_gather", tr.bytes_sent, tr.bytes_received, comm);
  all_gather_into(comm, send, n, recv, placed);
}

// All-gather of contiguous runs of different lengths: group rank g's counts[g] elements land
// at displs[g] in recv (MPI_Allgatherv).
template <class T>
void all_gather_counts(MPI_Comm comm, const T* send, T* recv, const std::vector<int>& counts,
                       const std::vector<int>& displs) {
  const int p = comm_size(comm), me = comm_rank(comm);
  std::uint64_t received = 0;
  for (int g = 0; g < p; ++g)
    if (g != me) received += bytes_of<T>(counts[g]);
  CollectiveTimer t("all_gather", bytes_of<T>(counts[me]) * (p - 1), received, comm);
  MPI_Allgatherv(send, counts[me], mpi_datatype<T>(), recv, counts.data(), displs.data(), mpi_datatype<T>(), comm);
}

// Reduce-scatter of consecutive chunks of different lengths: group rank g receives op over
// the group of the counts[g] elements of chunk g (MPI_Reduce_scatter).
template <class T>
void reduce_scatter_counts(MPI_Comm comm, const T* send, T* recv, const std::vector<Index>& counts, ReduceOp op) {
  const int p = comm_size(comm), me = comm_rank(comm);
  std::vector<int> c(p);
  std::uint64_t sent = 0;
  for (int g = 0; g < p; ++g) {
    c[g] = int(counts[g]);
    if (g != me) sent += bytes_of<T>(counts[g]);
  }
  CollectiveTimer t("reduce_scatter", sent, bytes_of<T>(counts[me]) * (p - 1), comm);
  MPI_Reduce_scatter(send, recv, c.data(), mpi_datatype<T>(), mpi_op<T>(op), comm);
}

// An all-to-all of one box per peer (MPI_Alltoallw): the part of the send buffer each group
// rank gets and the part of the receive buffer each one fills, as datatypes, so nothing is
// packed. Boxes are in global coordinates; empty ones are left out.
template <class T>
class BoxExchange {
 public:
  explicit BoxExchange(int peers)
      : stypes_(peers, mpi_datatype<T>()), rtypes_(peers, mpi_datatype<T>()), selems_(peers, 0), relems_(peers, 0) {
    types_.reserve(2 * static_cast<std::size_t>(peers));
  }
  // Group rank g gets `box` (its valid extent at its offset) of my send buffer, laid out as `block`.
  void send(int g, const ShardLayout& block, const ShardLayout& box) { add(g, block, box, stypes_, selems_); }
  // The same box to every group rank (an all-gather's contribution): one datatype for all.
  void send_to_all(const ShardLayout& block, const ShardLayout& box) {
    if (!box.valid_size()) return;
    types_.push_back(box_type<T>(block, box));
    std::fill(stypes_.begin(), stypes_.end(), types_.back().get());
    std::fill(selems_.begin(), selems_.end(), box.valid_size());
  }
  // Group rank g's data fills `box` of my receive buffer, laid out as `block`.
  void recv(int g, const ShardLayout& block, const ShardLayout& box) { add(g, block, box, rtypes_, relems_); }

  void run(MPI_Comm comm, const T* send, T* recv, const char* kind) {
    const int p = comm_size(comm), me = comm_rank(comm);
    std::uint64_t sent = 0, received = 0;
    std::vector<int> sc(p), rc(p), zero(p, 0);
    for (int g = 0; g < p; ++g) {
      sc[g] = selems_[g] ? 1 : 0;
      rc[g] = relems_[g] ? 1 : 0;
      if (g != me) {
        sent += bytes_of<T>(selems_[g]);
        received += bytes_of<T>(relems_[g]);
      }
    }
    CollectiveTimer t(kind, sent, received, comm);
    MPI_Alltoallw(send, sc.data(), zero.data(), stypes_.data(), recv, rc.data(), zero.data(), rtypes_.data(), comm);
  }

 private:
  void add(int g, const ShardLayout& block, const ShardLayout& box, std::vector<MPI_Datatype>& types,
           std::vector<Index>& elems) {
    if (!box.valid_size()) return;
    types_.push_back(box_type<T>(block, box));
    types[g] = types_.back().get();
    elems[g] = box.valid_size();
  }

  std::vector<BoxType<T>> types_;  // owns the datatypes (moves keep the handles)
  std::vector<MPI_Datatype> stypes_, rtypes_;
  std::vector<Index> selems_, relems_;
};

// Posts every receive, then every send, and waits: the general pattern behind permute,
// all-to-all-v, gather-v and scatter-v. Messages to self are copied, not sent. `kind` names
// the pattern in the stats. Chunked messages keep their order (MPI's non-overtaking rule).
template <class T>
void exchange(MPI_Comm comm, const std::vector<Message<const T>>& sends, const std::vector<Message<T>>& recvs,
              const char* kind, int tag = 7301) {
  const int me = comm_rank(comm);
  std::uint64_t sent = 0, received = 0;
  const T* self_src = nullptr;
  T* self_dst = nullptr;
  Index self_n = 0;
  for (auto& m : sends)
    if (m.peer == me) {
      self_src = m.data;
      self_n = m.count;
    } else {
      sent += bytes_of<T>(m.count);
    }
  for (auto& m : recvs)
    if (m.peer == me)
      self_dst = m.data;
    else
      received += bytes_of<T>(m.count);
  // (Self messages are plain contiguous copies; typed messages never go to self.)
  if (self_src && self_dst && self_n && self_src != self_dst) std::memcpy(self_dst, self_src, bytes_of<T>(self_n));
  if (sent == 0 && received == 0) return;
  CollectiveTimer t(kind, sent, received);  // (messages among some ranks: no arrival to wait for)
  std::vector<MPI_Request> reqs;
  for (auto& m : recvs)
    if (m.peer != me) post_receive(reqs, comm, m, tag);
  for (auto& m : sends)
    if (m.peer != me) post_send(reqs, comm, m, tag);
  MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE);
}

}  // namespace tshard::detail

namespace tshard::detail {

// A point-to-point exchange left in flight so that computation overlaps it (windowed einsum,
// ring rotations): start() posts every message, wait() completes them and records the stats.
template <class T>
class AsyncExchange {
 public:
  AsyncExchange() = default;
  AsyncExchange(const AsyncExchange&) = delete;
  AsyncExchange& operator=(const AsyncExchange&) = delete;
  ~AsyncExchange() {
    if (!reqs_.empty()) wait();
  }

  void start(MPI_Comm comm, const std::vector<Message<const T>>& sends, const std::vector<Message<T>>& recvs,
             const char* kind, int tag = 7302) {
    kind_ = kind;
    sent_ = received_ = 0;
    begin_ = Clock::now();
    const int me = comm_rank(comm);
    for (auto& m : recvs) {
      if (m.peer == me) continue;
      received_ += bytes_of<T>(m.count);
      post_receive(reqs_, comm, m, tag);
    }
    for (auto& m : sends) {
      if (m.peer == me) continue;
      sent_ += bytes_of<T>(m.count);
      post_send(reqs_, comm, m, tag);
    }
  }

  void wait() {
    if (reqs_.empty()) return;
    {
      WatchedCall watched(kind_, [] { return current_operator(); });
      MPI_Waitall(int(reqs_.size()), reqs_.data(), MPI_STATUSES_IGNORE);
    }
    reqs_.clear();
    const double s = std::chrono::duration<double>(Clock::now() - begin_).count();
    record_collective(current_operator(), kind_, sent_, received_, s);
  }

 private:
  std::vector<MPI_Request> reqs_;
  const char* kind_ = "";
  std::uint64_t sent_ = 0, received_ = 0;
  Clock::time_point begin_;
};

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void all_reduce<T>(MPI_Comm, const T*, T*, Index, ReduceOp))
TSHARD_FOR_EACH_NUMBER(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void reduce_scatter_block<T>(MPI_Comm, const T*, T*, Index, \
    ReduceOp))
TSHARD_FOR_EACH_NUMBER(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void broadcast<T>(MPI_Comm, T*, Index, int))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void all_gather_counts<T>(MPI_Comm, const T*, T*, \
    const std::vector<int>&, const std::vector<int>&))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void reduce_scatter_counts<T>(MPI_Comm, const T*, T*, \
    const std::vector<Index>&, ReduceOp))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
