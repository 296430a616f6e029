// Halo and window geometry, without MPI: which boxes of a window around its shard each rank
// receives from which rank, and which it sends. Everything is a function of global facts (spec,
// shape, mesh shape, widths), so every rank computes its peers' side too and both ends of every
// message agree without communicating. comm/halo_transfer.hpp moves the boxes; the windowed
// operators (ops/halo.hpp, ops/stencil.hpp, nn/functional/conv.hpp) build on both.
//
// A "window" is a box of global indices [lo, hi) per dim that a rank wants, possibly reaching
// outside [0, N): a halo (the shard widened on both sides) or the input rows a "valid"
// convolution's output shard needs. Each dim of the window is cut into segments at shard
// boundaries and at multiples of N; the boxes are the products of the segments, so halos wider
// than a shard (data several ranks away), uneven and empty shards, several split dims, split
// dims over several mesh axes, corners and periodic wrap all come out of one rule.
#pragma once
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "tshard/core/box_iterator.hpp"
#include "tshard/core/mesh_shape.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/core/spec_descriptor.hpp"

namespace tshard {

// What lies beyond the global edges of a windowed operator's input.
enum class Boundary {
  Zero,      // zeros
  Periodic,  // the tensor wraps around: index i is index i mod N
};

// Halo widths of one dim: elements added before (lower indices) and after (higher indices).
struct Halo {
  std::ptrdiff_t before = 0;
  std::ptrdiff_t after = 0;
};

namespace detail {

// The global index range [lo, hi) per dim that one rank's window covers; empty when the rank
// wants nothing (its shard is empty).
struct WindowRequest {
  bool empty = true;
  Extents lo{}, hi{};
};

// One box of a window and where its data comes from.
struct HaloBox {
  Extents dst{};     // origin in the window buffer
  Extents extent{};  // extents of the box
  Extents src{};     // origin in the source rank's local block
  int source = -1;   // mesh rank holding the data; -1: zeros (outside a Zero boundary)
};

// The boxes travelling between this rank and one peer, in one message.
struct HaloMessage {
  int peer = 0;
  Index offset = 0;  // in the send or receive buffer, elements
  Index count = 0;
  std::vector<HaloBox> boxes;
};

// Everything one rank does in an exchange, independent of the element type.
struct HaloLayout {
  int rank = 0;                 // tensor rank
  Extents window{};             // extents of this rank's window buffer (all 0 when empty)
  std::vector<HaloBox> self;    // copies from this rank's own block
  std::vector<HaloBox> zeros;   // boxes to fill with zeros
  std::vector<HaloMessage> recvs, sends;
  Index recv_total = 0, send_total = 0;
};

// One dim of a window cut into pieces that each come from one shard (or are zeros).
struct WindowSegment {
  Index dst = 0;     // start in the window
  Index len = 0;
  Index shard = -1;  // shard coordinate along the dim; -1: zeros
  Index src = 0;     // start within that shard's block
};

inline Index floor_div(Index a, Index b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Cuts [lo, hi) of a dim of size n split into `parts` shards at the shard boundaries and, for a
// periodic boundary, at multiples of n (so a halo may wrap around several times).
inline void window_segments(Index lo, Index hi, Index n, Index parts, Boundary boundary,
                            std::vector<WindowSegment>& out) {
  out.clear();
  const Index block = padded_extent(n, parts);
  Index g = lo;
  while (g < hi) {
    WindowSegment s;
    s.dst = g - lo;
    if (g < 0 || g >= n) {
      if (boundary == Boundary::Zero || n == 0) {
        const Index end = g < 0 ? std::min<Index>(hi, 0) : hi;
        s.len = end - g;
        out.push_back(s);
        g = end;
        continue;
      }
    }
    const Index wraps = floor_div(g, n);  // 0 inside [0, n)
    const Index gw = g - wraps * n;       // in [0, n)
    const Index shard = parts <= 1 ? 0 : gw / block;
    const Index shard_end = parts <= 1 ? n : std::min(n, (shard + 1) * block);
    const Index end = std::min(hi, g + (shard_end - gw));
    s.len = end - g;
    s.shard = shard;
    s.src = gw - shard * block;
    out.push_back(s);
    g = end;
  }
}

// The window of a block widened by `before` and `after` elements per dim (negative widths narrow
// it); empty when the block holds nothing.
inline WindowRequest window_around(const ShardLayout& l, const Extents& before, const Extents& after) {
  WindowRequest q;
  q.empty = l.valid_size() == 0;
  for (int d = 0; d < l.rank; ++d) {
    q.lo[d] = l.offset[d] - before[d];
    q.hi[d] = l.offset[d] + l.valid[d] + after[d];
  }
  return q;
}

// Calls f(box) for every box of rank r's window, in a fixed order (dim 0 fastest), with the
// source rank resolved: r's own coordinates on axes the spec does not split (those ranks hold
// the same data), the shard's coordinates on the split axes.
template <class F>
void for_each_window_box(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh, int r,
                         const WindowRequest& q, Boundary boundary, std::vector<WindowSegment> (&segs)[kMaxRank],
                         F&& f) {
  if (q.empty) return;
  const int R = spec.rank;
  Extents counts{};
  for (int d = 0; d < R; ++d) {
    window_segments(q.lo[d], q.hi[d], shape[d], split_parts(spec.dims[d], mesh), boundary, segs[d]);
    counts[d] = Index(segs[d].size());
  }
  const std::array<int, kMaxAxes> base = mesh.coords_of(r);
  for_each_index(counts, 0, R, [&](const Extents& pick) {
    HaloBox b;
    bool zero = false;
    std::array<int, kMaxAxes> c = base;
    for (int d = 0; d < R; ++d) {
      const WindowSegment& s = segs[d][std::size_t(pick[d])];
      b.dst[d] = s.dst;
      b.extent[d] = s.len;
      b.src[d] = s.src;
      if (s.shard < 0)
        zero = true;
      else
        set_split_coord(spec.dims[d], mesh, s.shard, c);
    }
    b.source = zero ? -1 : mesh.rank_of(c);
    f(b);
  });
}

// The exchange of rank `me`: what it receives (its own window) and what it sends (the parts
// of other ranks' windows that it holds). Every rank evaluates the same function of the
// global facts for its peers, so both sides agree on every message without communicating.
inline HaloLayout plan_window(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh, int me,
                              const std::function<WindowRequest(int)>& request_of, Boundary boundary) {
  HaloLayout out;
  out.rank = spec.rank;
  std::vector<WindowSegment> segs[kMaxRank];
  const WindowRequest mine = request_of(me);
  if (!mine.empty)
    for (int d = 0; d < spec.rank; ++d) out.window[d] = mine.hi[d] - mine.lo[d];
  auto volume_of = [&](const HaloBox& b) { return volume(b.extent, spec.rank); };

  // Receives, grouped by peer in rank order.
  std::vector<std::vector<HaloBox>> from(std::size_t(mesh.size()));
  for_each_window_box(spec, shape, mesh, me, mine, boundary, segs, [&](const HaloBox& b) {
    if (b.source < 0)
      out.zeros.push_back(b);
    else if (b.source == me)
      out.self.push_back(b);
    else
      from[std::size_t(b.source)].push_back(b);
  });
  for (int p = 0; p < mesh.size(); ++p)
    if (!from[std::size_t(p)].empty()) {
      HaloMessage m;
      m.peer = p;
      m.offset = out.recv_total;
      for (auto& b : from[std::size_t(p)]) m.count += volume_of(b);
      m.boxes = std::move(from[std::size_t(p)]);
      out.recv_total += m.count;
      out.recvs.push_back(std::move(m));
    }

  // Sends: only ranks that share this rank's coordinates on the unsplit axes take data from it.
  for (int r = 0; r < mesh.size(); ++r) {
    if (r == me || !mesh.same_outside(r, me, spec.split_axes())) continue;
    HaloMessage m;
    m.peer = r;
    m.offset = out.send_total;
    for_each_window_box(spec, shape, mesh, r, request_of(r), boundary, segs, [&](const HaloBox& b) {
      if (b.source == me) {
        m.boxes.push_back(b);
        m.count += volume_of(b);
      }
    });
    if (m.boxes.empty()) continue;
    out.send_total += m.count;
    out.sends.push_back(std::move(m));
  }
  return out;
}

// The halo plan of one tensor: widths before/after per dim around every rank's shard.
inline HaloLayout plan_halo(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh, int me,
                            const Extents& before, const Extents& after, Boundary boundary) {
  return plan_window(
      spec, shape, mesh, me, [&](int r) { return window_around(shard_layout_of_rank(spec, shape, mesh, r), before, after); }, boundary);
}

}  // namespace detail
}  // namespace tshard
