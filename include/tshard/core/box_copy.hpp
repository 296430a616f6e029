// Copy of an N-D box between two column-major buffers of different extents: the one local
// data-movement kernel that slicing, packing and unpacking share.
#pragma once
#include <algorithm>
#include <cstring>

#include "tshard/core/shard.hpp"

namespace tshard::detail {

// Copies `extent` elements per dim from src (extents src_dims, box origin src_start) to dst.
// Leading dims that are whole in both buffers are merged so memcpy runs are as long as possible.
template <class T>
void copy_box(const T* src, const Extents& src_dims, const Extents& src_start, T* dst,
              const Extents& dst_dims, const Extents& dst_start, const Extents& extent, int rank) {
  for (int d = 0; d < rank; ++d)
    if (extent[d] <= 0) return;
  if (rank == 0) {
    *dst = *src;
    return;
  }
  // Linear offsets of the box origins and strides.
  Extents ss{}, ds{};
  Index so = 0, dof = 0, s = 1, t = 1;
  for (int d = 0; d < rank; ++d) {
    ss[d] = s;
    ds[d] = t;
    so += src_start[d] * s;
    dof += dst_start[d] * t;
    s *= src_dims[d];
    t *= dst_dims[d];
  }
  // Merge leading dims while the box covers them whole in both buffers.
  Index run = extent[0];
  int first = 1;
  while (first < rank && extent[first - 1] == src_dims[first - 1] && extent[first - 1] == dst_dims[first - 1]) {
    run *= extent[first];
    ++first;
  }
  Extents idx{};
  const T* sp = src + so;
  T* dp = dst + dof;
  for (;;) {
    Index soff = 0, doff = 0;
    for (int d = first; d < rank; ++d) {
      soff += idx[d] * ss[d];
      doff += idx[d] * ds[d];
    }
    std::memcpy(dp + doff, sp + soff, static_cast<std::size_t>(run) * sizeof(T));
    int d = first;
    for (; d < rank; ++d) {
      if (++idx[d] < extent[d]) break;
      idx[d] = 0;
    }
    if (d == rank) return;
  }
}

// Sets the box [start, start + extent) of a column-major buffer of extents `dims` to `value`.
template <class T>
void fill_box(T* buf, const Extents& dims, const Extents& start, const Extents& extent, int rank, const T& value) {
  for (int d = 0; d < rank; ++d)
    if (extent[d] <= 0) return;
  Extents stride{}, i{};
  Index s = 1, base = 0;
  for (int d = 0; d < rank; ++d) {
    stride[d] = s;
    base += start[d] * s;
    s *= dims[d];
  }
  for (;;) {
    Index off = base;
    for (int d = 1; d < rank; ++d) off += i[d] * stride[d];
    std::fill(buf + off, buf + off + extent[0], value);
    int d = 1;
    for (; d < rank; ++d) {
      if (++i[d] < extent[d]) break;
      i[d] = 0;
    }
    if (d >= rank) return;
  }
}

// Calls f(offset, length) for every contiguous run of a block's valid elements in its padded
// buffer (column-major), leading dims merged where no padding interrupts them.
template <class F>
void for_each_valid_run(const ShardLayout& l, F&& f) {
  if (l.valid_size() == 0) return;
  if (l.rank == 0) return f(Index(0), Index(1));
  Extents stride{}, i{};
  for (Index d = 0, s = 1; d < l.rank; ++d) {
    stride[d] = s;
    s *= l.padded[d];
  }
  Index run = l.valid[0];
  int first = 1;
  while (first < l.rank && l.valid[first - 1] == l.padded[first - 1]) run *= l.valid[first++];
  for (;;) {
    Index off = 0;
    for (int d = first; d < l.rank; ++d) off += i[d] * stride[d];
    f(off, run);
    int d = first;
    for (; d < l.rank; ++d) {
      if (++i[d] < l.valid[d]) break;
      i[d] = 0;
    }
    if (d >= l.rank) return;
  }
}

// Copies the overlap of two blocks' valid boxes (global coordinates) from one buffer to the other.
template <class T>
void copy_overlap(const T* src, const ShardLayout& sl, T* dst, const ShardLayout& dl) {
  Extents ss{}, ds{}, ext{};
  for (int d = 0; d < sl.rank; ++d) {
    Index lo = std::max(sl.offset[d], dl.offset[d]);
    Index hi = std::min(sl.offset[d] + sl.valid[d], dl.offset[d] + dl.valid[d]);
    if (hi <= lo) return;
    ss[d] = lo - sl.offset[d];
    ds[d] = lo - dl.offset[d];
    ext[d] = hi - lo;
  }
  copy_box(src, sl.padded, ss, dst, dl.padded, ds, ext, sl.rank);
}

// The overlap of two valid boxes as a dense block of its own.
inline ShardLayout overlap_block(const ShardLayout& a, const ShardLayout& b) {
  ShardLayout o;
  o.rank = a.rank;
  for (int d = 0; d < a.rank; ++d) {
    Index lo = std::max(a.offset[d], b.offset[d]);
    Index hi = std::min(a.offset[d] + a.valid[d], b.offset[d] + b.valid[d]);
    o.offset[d] = lo;
    o.valid[d] = o.padded[d] = std::max<Index>(0, hi - lo);
  }
  return o;
}

// The same block seen at other global coordinates (offsets moved by `shift`).
inline ShardLayout shifted(ShardLayout l, const Extents& shift) {
  for (int d = 0; d < l.rank; ++d) l.offset[d] += shift[d];
  return l;
}

}  // namespace tshard::detail
