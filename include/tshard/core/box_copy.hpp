// Copy and fill of an N-D box of column-major buffers of different extents: the local
// data-movement kernels that slicing, packing, unpacking and halos share. Copies run in memcpy
// runs (the C library picks its own vector width at run time); the adding loop is dispatched per
// instruction-set level (core/dispatch.hpp).
#pragma once
#include <algorithm>
#include <cstring>

#include "tshard/core/box_iterator.hpp"
#include "tshard/core/dispatch.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::detail {

// Copies `extent` elements per dim from src (extents src_dims, box origin src_start) to dst,
// in memcpy runs as long as the two buffers allow.
template <class T>
void copy_box(const T* src, const Extents& src_dims, const Extents& src_start, T* dst,
              const Extents& dst_dims, const Extents& dst_start, const Extents& extent, int rank) {
  if (empty_box(extent, rank)) return;
  const Extents ss = strides_of(src_dims, rank), ds = strides_of(dst_dims, rank);
  const T* sp = src + offset_of(src_start, ss, 0, rank);
  T* dp = dst + offset_of(dst_start, ds, 0, rank);
  const int first = first_outer_dim(extent, rank, src_dims, dst_dims);
  const std::size_t run = static_cast<std::size_t>(volume(extent, first)) * sizeof(T);
  for_each_index(extent, first, rank, [&](const Extents& i) {
    std::memcpy(dp + offset_of(i, ds, first, rank), sp + offset_of(i, ss, first, rank), run);
  });
}

// dst's box += src's box: the same walk as copy_box, adding (the transpose of a copy, for
// gradients of halo exchanges).
template <class T>
void add_box(const T* src, const Extents& src_dims, const Extents& src_start, T* dst, const Extents& dst_dims,
             const Extents& dst_start, const Extents& extent, int rank) {
  TSHARD_DISPATCH((add_box<T>), src, src_dims, src_start, dst, dst_dims, dst_start, extent, rank);
  if (empty_box(extent, rank)) return;
  const Extents ss = strides_of(src_dims, rank), ds = strides_of(dst_dims, rank);
  const T* sp = src + offset_of(src_start, ss, 0, rank);
  T* dp = dst + offset_of(dst_start, ds, 0, rank);
  const int first = first_outer_dim(extent, rank, src_dims, dst_dims);
  const Index run = volume(extent, first);
  for_each_index(extent, first, rank, [&](const Extents& i) {
    T* d = dp + offset_of(i, ds, first, rank);
    const T* s = sp + offset_of(i, ss, first, rank);
    for (Index k = 0; k < run; ++k) d[k] += s[k];
  });
}

// Sets the box [start, start + extent) of a column-major buffer of extents `dims` to `value`.
template <class T>
void fill_box(T* buf, const Extents& dims, const Extents& start, const Extents& extent, int rank, const T& value) {
  if (empty_box(extent, rank)) return;
  const Extents s = strides_of(dims, rank);
  T* base = buf + offset_of(start, s, 0, rank);
  const int first = first_outer_dim(extent, rank, dims);
  const Index run = volume(extent, first);
  for_each_index(extent, first, rank, [&](const Extents& i) {
    T* p = base + offset_of(i, s, first, rank);
    std::fill(p, p + run, value);
  });
}

// Calls f(offset, length) for every contiguous run of a block's valid elements in its padded
// buffer (column-major), leading dims merged where no padding interrupts them.
template <class F>
void for_each_valid_run(const ShardLayout& l, F&& f) {
  if (l.valid_size() == 0) return;
  const Extents s = strides_of(l.padded, l.rank);
  const int first = first_outer_dim(l.valid, l.rank, l.padded);
  const Index run = volume(l.valid, first);
  for_each_index(l.valid, first, l.rank, [&](const Extents& i) { f(offset_of(i, s, first, l.rank), run); });
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

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void copy_box<T>(const T*, const Extents&, const Extents&, T*, \
    const Extents&, const Extents&, const Extents&, int))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void fill_box<T>(T*, const Extents&, const Extents&, \
    const Extents&, int, const T&))
TSHARD_FOR_EACH_ELEMENT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
// (float and double, also per instruction-set level)
#define TSHARD_INSTANCE(T) TSHARD_DISPATCHED_KERNEL(void, (add_box<T>), const T*, const Extents&, const Extents&, T*, \
    const Extents&, const Extents&, const Extents&, int)
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
