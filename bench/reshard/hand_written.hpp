// The hand-written side of the reshard benchmark: each reshard kind as a tuned HPC code writes it
// with raw MPI (the shard rule's arithmetic of its own, buffers allocated once, pack/unpack around
// the collective, or MPI vector datatypes with --hand datatype), the baseline tshard is held to.
#pragma once
#include <mpi.h>

#include <Eigen/Core>
#include <algorithm>
#include <cinttypes>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "../bench_support.hpp"

namespace reshard_bench {

using Index = Eigen::Index;
using tshard_bench::Split;

// A 64-byte-aligned float buffer, touched once when made (first touch is not what is timed).
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(Index count) : n_(std::max<Index>(count, 1)) {
    const std::size_t bytes = (std::size_t(n_) * sizeof(float) + 63) / 64 * 64;
    p_ = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!p_) throw std::bad_alloc();
    std::fill(p_, p_ + n_, 0.0f);
  }
  ~Buffer() { std::free(p_); }
  Buffer(Buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() const { return p_; }

 private:
  float* p_ = nullptr;
  Index n_ = 0;
};

inline int count_of(Index n) {
  if (n > INT_MAX) {
    std::fprintf(stderr, "tshard_bench_reshard: a count of %" PRId64 " does not fit an MPI int\n", std::int64_t(n));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return int(n);
}

// A hand-written reshard: buffers made once, run() reads the source block and fills dst.
struct Hand {
  std::vector<Buffer> buffers;
  std::vector<std::shared_ptr<MPI_Datatype>> types;
  float* dst = nullptr;
  std::function<void(const float*)> run;
  std::string note;  // how it moves the data, where that differs from the plain pack/unpack
};

struct HandArgs {
  MPI_Comm comm;
  Index rows, cols;
  int p, me;
  bool datatypes;  // --hand datatype: strided blocks through MPI vector types instead of pack/unpack
};

inline constexpr std::size_t kF = sizeof(float);

// `count` runs of `run` floats `stride` apart, with an extent of `run` floats, so that block g
// of a collective starts `g * run` floats in: the g-th row block of a column-major matrix.
inline MPI_Datatype row_block_type(Hand& h, Index count, Index run, Index stride) {
  MPI_Datatype v, t;
  MPI_Type_vector(count_of(count), count_of(run), count_of(stride), MPI_FLOAT, &v);
  MPI_Type_create_resized(v, 0, MPI_Aint(run * Index(kF)), &t);
  MPI_Type_commit(&t);
  MPI_Type_free(&v);
  h.types.push_back(std::shared_ptr<MPI_Datatype>(new MPI_Datatype(t), [](MPI_Datatype* q) {
    int down = 0;
    MPI_Finalized(&down);
    if (!down) MPI_Type_free(q);
    delete q;
  }));
  return t;
}

// S(dim 0) -> R: all-gather of the padded blocks into scratch, unpacked into the full tensor;
// or (datatypes, even split) received straight into the tensor through a row-block type.
inline Hand hand_gather_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p};
  const Index c0 = a.block(), blk = c0 * x.cols, rows = x.rows, cols = x.cols;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(rows * cols);
  float* dst = h.dst = h.buffers[0].data();
  if (x.datatypes && a.even()) {
    const MPI_Datatype block = row_block_type(h, cols, c0, rows);
    h.note = "datatype";
    h.run = [=](const float* src) { MPI_Allgather(src, count_of(blk), MPI_FLOAT, dst, 1, block, comm); };
    return h;
  }
  h.buffers.emplace_back(blk * p);
  float* all = h.buffers[1].data();
  h.run = [=](const float* src) {
    MPI_Allgather(src, count_of(blk), MPI_FLOAT, all, count_of(blk), MPI_FLOAT, comm);
    for (Index j = 0; j < cols; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g)) std::memcpy(dst + a.offset(g) + j * rows, all + g * blk + j * c0, std::size_t(a.valid(g)) * kF);
  };
  return h;
}

// S(dim 1) -> R: the blocks are whole columns back to back: all-gather straight into dst
// (made p * ceil(cols/p) columns long, so an uneven split needs no copy either).
inline Hand hand_gather_cols(const HandArgs& x) {
  Hand h;
  const Split b{x.cols, x.p};
  const Index blk = x.rows * b.block();
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(blk * x.p);
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) { MPI_Allgather(src, count_of(blk), MPI_FLOAT, dst, count_of(blk), MPI_FLOAT, comm); };
  return h;
}

// R -> S(dim 0): my rows of every column.
inline Hand hand_slice_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p};
  const Index c0 = a.block(), off = a.offset(x.me), v = a.valid(x.me), rows = x.rows, cols = x.cols;
  h.buffers.emplace_back(c0 * cols);
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) {
    if (v)
      for (Index j = 0; j < cols; ++j) std::memcpy(dst + j * c0, src + off + j * rows, std::size_t(v) * kF);
  };
  return h;
}

// R -> S(dim 1): my columns, one contiguous run.
inline Hand hand_slice_cols(const HandArgs& x) {
  Hand h;
  const Split b{x.cols, x.p};
  const Index off = b.offset(x.me), v = b.valid(x.me), rows = x.rows;
  h.buffers.emplace_back(rows * b.block());
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) {
    if (v) std::memcpy(dst, src + off * rows, std::size_t(rows * v) * kF);
  };
  return h;
}

// S(dim 0) -> S(dim 1): what rank g needs of my block is its columns, already contiguous, so
// the source is sent as it is; received [g's rows x my cols] blocks are unpacked, or (datatypes,
// even split) received straight into place through a row-block type.
inline Hand hand_rows_to_cols(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p}, b{x.cols, x.p};
  const Index c0 = a.block(), c1 = b.block(), chunk = c0 * c1, v1 = b.valid(x.me), rows = x.rows;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  const bool even = a.even() && b.even();
  h.buffers.emplace_back(rows * c1);
  float* dst = h.dst = h.buffers[0].data();
  if (x.datatypes && even) {
    const MPI_Datatype block = row_block_type(h, c1, c0, rows);
    h.note = "datatype";
    h.run = [=](const float* src) { MPI_Alltoall(src, count_of(chunk), MPI_FLOAT, dst, 1, block, comm); };
    return h;
  }
  h.buffers.emplace_back(chunk * p);
  float* recv = h.buffers[1].data();
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  for (int g = 0; g < p; ++g) {
    sc[g] = count_of(c0 * b.valid(g));
    sd[g] = count_of(c0 * b.offset(g));
    rc[g] = count_of(c0 * v1);
    rd[g] = count_of(g * chunk);
  }
  h.run = [=](const float* src) {
    if (even)
      MPI_Alltoall(src, count_of(chunk), MPI_FLOAT, recv, count_of(chunk), MPI_FLOAT, comm);
    else
      MPI_Alltoallv(src, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, comm);
    for (Index j = 0; j < v1; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g))
          std::memcpy(dst + a.offset(g) + j * rows, recv + g * chunk + j * c0, std::size_t(a.valid(g)) * kF);
  };
  return h;
}

// S(dim 1) -> S(dim 0): g's rows of my columns are packed (or, datatypes and even split, sent
// through a row-block type); what arrives from g is g's columns of my rows, which is exactly a
// column range of the destination: received in place.
inline Hand hand_cols_to_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p}, b{x.cols, x.p};
  const Index c0 = a.block(), c1 = b.block(), chunk = c0 * c1, v1 = b.valid(x.me), rows = x.rows;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  const bool even = a.even() && b.even();
  h.buffers.emplace_back(c0 * x.cols);
  float* dst = h.dst = h.buffers[0].data();
  if (x.datatypes && even) {
    const MPI_Datatype block = row_block_type(h, c1, c0, rows);
    h.note = "datatype";
    h.run = [=](const float* src) { MPI_Alltoall(src, 1, block, dst, count_of(chunk), MPI_FLOAT, comm); };
    return h;
  }
  h.buffers.emplace_back(chunk * p);
  float* send = h.buffers[1].data();
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  for (int g = 0; g < p; ++g) {
    sc[g] = count_of(c0 * v1);
    sd[g] = count_of(g * chunk);
    rc[g] = count_of(c0 * b.valid(g));
    rd[g] = count_of(c0 * b.offset(g));
  }
  h.run = [=](const float* src) {
    for (Index j = 0; j < v1; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g))
          std::memcpy(send + g * chunk + j * c0, src + a.offset(g) + j * rows, std::size_t(a.valid(g)) * kF);
    if (even)
      MPI_Alltoall(send, count_of(chunk), MPI_FLOAT, dst, count_of(chunk), MPI_FLOAT, comm);
    else
      MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, dst, rc.data(), rd.data(), MPI_FLOAT, comm);
  };
  return h;
}

// partial -> R: one all-reduce.
inline Hand hand_all_reduce(const HandArgs& x) {
  Hand h;
  const Index n = x.rows * x.cols;
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(n);
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) { MPI_Allreduce(src, dst, count_of(n), MPI_FLOAT, MPI_SUM, comm); };
  return h;
}

// partial -> S(dim 0): rows of g packed into block g (padding rows zeroed once, never
// written again), then one reduce-scatter. (MPI's predefined reductions are only defined on
// predefined datatypes, so there is no datatype variant.)
inline Hand hand_reduce_scatter_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p};
  const Index c0 = a.block(), blk = c0 * x.cols, rows = x.rows, cols = x.cols;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(blk);
  h.buffers.emplace_back(blk * p);
  float* dst = h.dst = h.buffers[0].data();
  float* send = h.buffers[1].data();
  h.run = [=](const float* src) {
    for (Index j = 0; j < cols; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g)) std::memcpy(send + g * blk + j * c0, src + a.offset(g) + j * rows, std::size_t(a.valid(g)) * kF);
    MPI_Reduce_scatter_block(send, dst, count_of(blk), MPI_FLOAT, MPI_SUM, comm);
  };
  return h;
}

// partial -> S(dim 1): the column blocks are contiguous: reduce-scatter straight from the
// source (with per-rank counts when the split is uneven).
inline Hand hand_reduce_scatter_cols(const HandArgs& x) {
  Hand h;
  const Split b{x.cols, x.p};
  const Index blk = x.rows * b.block();
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(blk);
  float* dst = h.dst = h.buffers[0].data();
  std::vector<int> counts(x.p);
  for (int g = 0; g < x.p; ++g) counts[g] = count_of(x.rows * b.valid(g));
  const bool even = b.even();
  h.run = [=](const float* src) {
    if (even)
      MPI_Reduce_scatter_block(src, dst, count_of(blk), MPI_FLOAT, MPI_SUM, comm);
    else
      MPI_Reduce_scatter(src, dst, counts.data(), MPI_FLOAT, MPI_SUM, comm);
  };
  return h;
}

}  // namespace reshard_bench
