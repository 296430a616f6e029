// Halo point-to-point: which boxes of a window around its shard each rank receives from which
// rank, and the nonblocking exchange that fills them from preallocated pooled buffers. Works on
// run-time descriptors, so it is instantiated per element type only (DESIGN: types check,
// descriptors do); the windowed operators in ops/windowed.hpp build on it.
//
// A "window" is a box of global indices [lo, hi) per dim that a rank wants, possibly reaching
// outside [0, N): a halo (the shard widened on both sides) or the input rows a "valid"
// convolution's output shard needs. Each dim of the window is cut into segments at shard
// boundaries and at multiples of N; the boxes are the products of the segments, so halos wider
// than a shard (data several ranks away), uneven and empty shards, several split dims, split
// dims over several mesh axes, corners and periodic wrap all come out of one rule.
#pragma once
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/comm/stats.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/shard.hpp"

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

// The window a halo of widths (before, after) asks for around rank r's shard.
inline WindowRequest halo_request(const SpecDesc& spec, const Extents& shape, const MeshShape& mesh, int r,
                                  const Extents& before, const Extents& after) {
  const ShardLayout l = shard_layout_of_rank(spec, shape, mesh, r);
  WindowRequest q;
  q.empty = l.valid_size() == 0;
  for (int d = 0; d < spec.rank; ++d) {
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
  for (int d = 0; d < R; ++d) {
    window_segments(q.lo[d], q.hi[d], shape[d], split_parts(spec.dims[d], mesh), boundary, segs[d]);
    if (segs[d].empty()) return;  // a window of zero extent
  }
  const std::array<int, kMaxAxes> base = mesh.coords_of(r);
  std::array<std::size_t, kMaxRank> pick{};
  for (;;) {
    HaloBox b;
    bool zero = false;
    std::array<int, kMaxAxes> c = base;
    for (int d = 0; d < R; ++d) {
      const WindowSegment& s = segs[d][pick[d]];
      b.dst[d] = s.dst;
      b.extent[d] = s.len;
      b.src[d] = s.src;
      if (s.shard < 0) {
        zero = true;
        continue;
      }
      Index k = s.shard;  // mixed radix over the split's axes, first major
      const DimSplit& split = spec.dims[d];
      for (int i = split.count - 1; i >= 0; --i) {
        c[split[i]] = int(k % mesh.sizes[split[i]]);
        k /= mesh.sizes[split[i]];
      }
    }
    b.source = zero ? -1 : mesh.rank_of(c);
    f(b);
    int d = 0;
    for (; d < R; ++d) {
      if (++pick[d] < segs[d].size()) break;
      pick[d] = 0;
    }
    if (d == R) return;
  }
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
  const std::uint32_t split = spec.split_axes();
  const std::array<int, kMaxAxes> my_coords = mesh.coords_of(me);
  for (int r = 0; r < mesh.size(); ++r) {
    if (r == me) continue;
    const std::array<int, kMaxAxes> c = mesh.coords_of(r);
    bool same = true;
    for (int a = 0; a < mesh.axes(); ++a)
      if (!(split & (1u << a)) && c[a] != my_coords[a]) same = false;
    if (!same) continue;
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
      spec, shape, mesh, me, [&](int r) { return halo_request(spec, shape, mesh, r, before, after); }, boundary);
}

// The tag of halo messages: distinct from exchange()'s (7301) and AsyncExchange's (7302), so a
// halo in flight never matches another operation's messages. Several halos in flight at once
// on one mesh must be started in the same order on every rank (MPI's non-overtaking rule then
// pairs them up).
inline constexpr int kHaloTag = 7311;

// Runs one HaloLayout again and again: buffers are taken from the pool once, at construction,
// so repeated exchanges allocate nothing. start() packs and posts nonblocking sends and
// receives and does the local copies; finish() waits and unpacks. Bytes and time (of start and
// finish, not of the work between them) are counted as one "halo" call of the current operator.
template <class T>
class HaloExchange {
 public:
  HaloExchange() = default;
  HaloExchange(std::shared_ptr<MeshState> mesh, HaloLayout layout)
      : mesh_(std::move(mesh)), layout_(std::move(layout)) {
    send_ = pooled_array<T>(static_cast<std::size_t>(layout_.send_total));
    recv_ = pooled_array<T>(static_cast<std::size_t>(layout_.recv_total));
    reserve_requests();
    for (auto& m : layout_.sends) sent_bytes_ += bytes_of<T>(m.count);
    for (auto& m : layout_.recvs) received_bytes_ += bytes_of<T>(m.count);
  }
  HaloExchange(HaloExchange&& o) noexcept { *this = std::move(o); }
  HaloExchange& operator=(HaloExchange&& o) noexcept {
    if (this != &o) {
      wait_quietly();
      mesh_ = std::move(o.mesh_);
      layout_ = std::move(o.layout_);
      send_ = std::move(o.send_);
      recv_ = std::move(o.recv_);
      requests_ = std::move(o.requests_);
      window_ = o.window_;
      active_ = o.active_;
      seconds_ = o.seconds_;
      sent_bytes_ = o.sent_bytes_;
      received_bytes_ = o.received_bytes_;
      o.active_ = false;
    }
    return *this;
  }
  HaloExchange(const HaloExchange&) = delete;
  HaloExchange& operator=(const HaloExchange&) = delete;
  ~HaloExchange() { wait_quietly(); }

  const HaloLayout& layout() const { return layout_; }
  bool in_flight() const { return active_; }

  // Begins filling `window` (extents layout().window): the local copies (and zeros, unless
  // fill_zeros is false) now, the messages in flight until finish(). The source block is `src`
  // with extents `src_dims`, and block element i sits at src_shift + i there: (block, padded
  // extents, 0) for a tensor's shard, (window, window extents, widths before) when the
  // window's interior already holds the block, in which case only the halo boxes are written.
  void start(const T* src, const Extents& src_dims, const Extents& src_shift, T* window, bool fill_zeros = true) {
    const auto t0 = std::chrono::steady_clock::now();
    if (active_) finish();
    const int R = layout_.rank;
    const Extents zero{};
    auto shifted = [&](const Extents& e) {
      Extents s = e;
      for (int d = 0; d < R; ++d) s[d] += src_shift[d];
      return s;
    };
    // Pack and post first, so the messages travel while the local copies run.
    T* send = send_.get();
    for (auto& m : layout_.sends) {
      Index at = m.offset;
      for (auto& b : m.boxes) {
        copy_box(src, src_dims, shifted(b.src), send + at, b.extent, zero, b.extent, R);
        at += volume(b.extent, R);
      }
    }
    MPI_Comm comm = mesh_->comm();
    const Index limit = collective_chunk_limit();
    requests_.clear();
    for (auto& m : layout_.recvs)
      for (Index off = 0; off < m.count; off += limit) {
        requests_.emplace_back();
        MPI_Irecv(recv_.get() + m.offset + off, int(std::min(limit, m.count - off)), mpi_datatype<T>(), m.peer,
                  kHaloTag, comm, &requests_.back());
      }
    for (auto& m : layout_.sends)
      for (Index off = 0; off < m.count; off += limit) {
        requests_.emplace_back();
        MPI_Isend(send + m.offset + off, int(std::min(limit, m.count - off)), mpi_datatype<T>(), m.peer, kHaloTag,
                  comm, &requests_.back());
      }
    for (auto& b : layout_.self) {
      const Extents from = shifted(b.src);
      if (src == window && from == b.dst) continue;  // the interior already in place
      copy_box(src, src_dims, from, window, layout_.window, b.dst, b.extent, R);
    }
    if (fill_zeros) this->fill_zeros(window);
    window_ = window;
    active_ = true;
    seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  // Waits for the messages and unpacks them into the window given to start().
  void finish() {
    if (!active_) return;
    const auto t0 = std::chrono::steady_clock::now();
    {
      WatchedCall watched("halo exchange (wait)", [] { return current_operator(); });
      MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    }
    active_ = false;
    const int R = layout_.rank;
    const Extents zero{};
    for (auto& m : layout_.recvs) {
      Index at = m.offset;
      for (auto& b : m.boxes) {
        copy_box(recv_.get() + at, b.extent, zero, window_, layout_.window, b.dst, b.extent, R);
        at += volume(b.extent, R);
      }
    }
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (sent_bytes_ || received_bytes_)
      comm_stats().record(current_operator(), "halo", sent_bytes_, received_bytes_, seconds_);
  }

  // Writes the zero boxes of `window` (outside a Zero boundary).
  void fill_zeros(T* window) const {
    for (auto& b : layout_.zeros) fill_box(window, b);
  }

 private:
  void reserve_requests() {
    const Index limit = collective_chunk_limit();
    std::size_t n = 0;
    for (auto& m : layout_.recvs) n += std::size_t((m.count + limit - 1) / limit);
    for (auto& m : layout_.sends) n += std::size_t((m.count + limit - 1) / limit);
    requests_.reserve(n);
  }

  void fill_box(T* window, const HaloBox& b) const {
    const int R = layout_.rank;
    for (int d = 0; d < R; ++d)
      if (b.extent[d] <= 0) return;
    // Runs along dim 0, odometer over the rest.
    Extents idx{};
    for (;;) {
      Index lin = 0, stride = 1;
      for (int d = 0; d < R; ++d) {
        lin += (b.dst[d] + (d ? idx[d] : 0)) * stride;
        stride *= layout_.window[d];
      }
      std::fill(window + lin, window + lin + b.extent[0], T(0));
      int d = 1;
      for (; d < R; ++d) {
        if (++idx[d] < b.extent[d]) break;
        idx[d] = 0;
      }
      if (d >= R) return;
    }
  }

  // A plan destroyed or replaced mid-exchange still completes its messages (MPI owns the
  // buffers until then); nothing is unpacked.
  void wait_quietly() {
    if (!active_) return;
    active_ = false;
    int down = 0;
    MPI_Finalized(&down);
    if (!down) MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
  }

  std::shared_ptr<MeshState> mesh_;
  HaloLayout layout_;
  std::shared_ptr<T> send_, recv_;
  std::vector<MPI_Request> requests_;
  T* window_ = nullptr;
  bool active_ = false;
  double seconds_ = 0;
  std::uint64_t sent_bytes_ = 0, received_bytes_ = 0;
};

}  // namespace detail
}  // namespace tshard
