// The halo exchange: runs one HaloLayout (core/halo_geometry.hpp) with nonblocking point-to-
// point messages from buffers taken from the pool once, so repeated exchanges allocate nothing.
// Instantiated per element type only (types check, descriptors do: docs/architecture.md).
#pragma once
#include "tshard/comm/clock.hpp"
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/comm/stats.hpp"
#include "tshard/core/box_copy.hpp"
#include "tshard/core/halo_geometry.hpp"

namespace tshard::detail {

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
class HaloTransfer {
 public:
  HaloTransfer() = default;
  HaloTransfer(std::shared_ptr<MeshState> mesh, HaloLayout layout)
      : mesh_(std::move(mesh)), layout_(std::move(layout)) {
    send_ = pooled_array<T>(static_cast<std::size_t>(layout_.send_total));
    recv_ = pooled_array<T>(static_cast<std::size_t>(layout_.recv_total));
    reserve_requests();
    for (auto& m : layout_.sends) sent_bytes_ += bytes_of<T>(m.count);
    for (auto& m : layout_.recvs) received_bytes_ += bytes_of<T>(m.count);
  }
  HaloTransfer(HaloTransfer&& o) noexcept { *this = std::move(o); }
  HaloTransfer& operator=(HaloTransfer&& o) noexcept {
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
  HaloTransfer(const HaloTransfer&) = delete;
  HaloTransfer& operator=(const HaloTransfer&) = delete;
  ~HaloTransfer() { wait_quietly(); }

  const HaloLayout& layout() const { return layout_; }
  bool in_flight() const { return active_; }

  // Begins filling `window` (extents layout().window): the local copies (and zeros, unless
  // fill_zeros is false) now, the messages in flight until finish(). The source block is `src`
  // with extents `src_dims`, and block element i sits at src_shift + i there: (block, padded
  // extents, 0) for a tensor's shard, (window, window extents, widths before) when the
  // window's interior already holds the block, in which case only the halo boxes are written.
  //
  // Where `core` is given ([lo, hi) in window coordinates), the local copies leave that box out:
  // a stencil that reads the points deep inside the block from the block itself needs only the
  // frame around them in the window.
  void start(const T* src, const Extents& src_dims, const Extents& src_shift, T* window, bool fill_zeros = true,
             const std::pair<Extents, Extents>* core = nullptr) {
    const auto t0 = Clock::now();
    if (active_) finish();
    const int R = layout_.rank;
    const Extents zero{};
    auto shifted = [&](const Extents& e) { return shifted_by(e, src_shift, R); };
    // Pack and post first, so the messages travel while the local copies run.
    T* send = send_.get();
    for_each_packed(layout_.sends, R, [&](const HaloBox& b, Index at) {
      copy_box(src, src_dims, shifted(b.src), send + at, b.extent, zero, b.extent, R);
    });
    MPI_Comm comm = mesh_->comm();
    requests_.clear();
    for (auto& m : layout_.recvs) post_receive(requests_, comm, Message<T>{m.peer, recv_.get() + m.offset, m.count}, kHaloTag);
    for (auto& m : layout_.sends) post_send(requests_, comm, Message<const T>{m.peer, send + m.offset, m.count}, kHaloTag);
    for (auto& b : layout_.self) {
      const Extents from = shifted(b.src);
      if (src == window && from == b.dst) continue;  // the interior already in place
      if (core)
        copy_box_outside(src, src_dims, from, window, b.dst, b.extent, *core);
      else
        copy_box(src, src_dims, from, window, layout_.window, b.dst, b.extent, R);
    }
    if (fill_zeros) this->fill_zeros(window);
    window_ = window;
    active_ = true;
    seconds_ = std::chrono::duration<double>(Clock::now() - t0).count();
  }

  // Waits for the messages and unpacks them into the window given to start().
  void finish() {
    if (!active_) return;
    const auto t0 = Clock::now();
    {
      WatchedCall watched("halo exchange (wait)", [] { return current_operator(); });
      MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    }
    active_ = false;
    const int R = layout_.rank;
    const Extents zero{};
    for_each_packed(layout_.recvs, R, [&](const HaloBox& b, Index at) {
      copy_box(recv_.get() + at, b.extent, zero, window_, layout_.window, b.dst, b.extent, R);
    });
    seconds_ += std::chrono::duration<double>(Clock::now() - t0).count();
    if (sent_bytes_ || received_bytes_)
      record_collective(current_operator(), "halo", sent_bytes_, received_bytes_, seconds_);
  }

  // The transpose of an exchange (its adjoint, for gradients), blocking: every box of `window`
  // goes back to where start() took it from and is added there. The rank's own boxes are added
  // into `block` (extents block_dims, block element i at block_shift + i, as for start()), the
  // halo boxes travel back to the ranks they came from, which add them into theirs; the zero
  // boxes are dropped. `block` is added into, not overwritten.
  void add_back(const T* window, T* block, const Extents& block_dims, const Extents& block_shift) {
    const auto t0 = Clock::now();
    if (active_) finish();
    const int R = layout_.rank;
    const Extents zero{};
    auto shifted = [&](const Extents& e) { return shifted_by(e, block_shift, R); };
    // The buffers change roles: what was received goes back from recv_, what was sent comes
    // back into send_.
    T* back = recv_.get();
    for_each_packed(layout_.recvs, R, [&](const HaloBox& b, Index at) {
      copy_box(window, layout_.window, b.dst, back + at, b.extent, zero, b.extent, R);
    });
    MPI_Comm comm = mesh_->comm();
    requests_.clear();
    for (auto& m : layout_.sends) post_receive(requests_, comm, Message<T>{m.peer, send_.get() + m.offset, m.count}, kHaloTag);
    for (auto& m : layout_.recvs) post_send(requests_, comm, Message<const T>{m.peer, back + m.offset, m.count}, kHaloTag);
    for (auto& b : layout_.self) add_box(window, layout_.window, b.dst, block, block_dims, shifted(b.src), b.extent, R);
    {
      WatchedCall watched("halo exchange transpose (wait)", [] { return current_operator(); });
      MPI_Waitall(int(requests_.size()), requests_.data(), MPI_STATUSES_IGNORE);
    }
    for_each_packed(layout_.sends, R, [&](const HaloBox& b, Index at) {
      add_box(send_.get() + at, b.extent, zero, block, block_dims, shifted(b.src), b.extent, R);
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    if (sent_bytes_ || received_bytes_) record_collective(current_operator(), "halo", received_bytes_, sent_bytes_, seconds);
  }

  // Writes the zero boxes of `window` (outside a Zero boundary).
  void fill_zeros(T* window) const {
    for (auto& b : layout_.zeros) fill_box(window, layout_.window, b.dst, b.extent, layout_.rank, T(0));
  }

 private:
  static Extents shifted_by(Extents e, const Extents& by, int rank) {
    for (int d = 0; d < rank; ++d) e[d] += by[d];
    return e;
  }
  // copy_box of the part of the box at `dst` (window coordinates) outside core = [lo, hi), as
  // disjoint slabs: slab d is inside the core in dims < d and outside it in dim d.
  void copy_box_outside(const T* src, const Extents& src_dims, const Extents& from, T* window, const Extents& dst,
                        const Extents& extent, const std::pair<Extents, Extents>& core) const {
    const int R = layout_.rank;
    Extents lo = dst, hi{};
    for (int d = 0; d < R; ++d) hi[d] = dst[d] + extent[d];
    for (int d = 0; d < R; ++d) {
      const Index clo = std::clamp(core.first[d], lo[d], hi[d]), chi = std::clamp(core.second[d], clo, hi[d]);
      for (auto [a, b] : {std::pair{lo[d], clo}, std::pair{chi, hi[d]}}) {
        if (a >= b) continue;
        Extents at = lo, ext{};
        for (int k = 0; k < R; ++k) ext[k] = hi[k] - lo[k];
        at[d] = a;
        ext[d] = b - a;
        Extents sfrom{};
        for (int k = 0; k < R; ++k) sfrom[k] = from[k] + (at[k] - dst[k]);
        copy_box(src, src_dims, sfrom, window, layout_.window, at, ext, R);
      }
      lo[d] = clo;  // the rest of dim d lies inside the core
      hi[d] = chi;
      if (lo[d] >= hi[d]) return;
    }
  }

  // f(box, at) for every box of the messages, at its offset in their buffer.
  template <class F>
  static void for_each_packed(const std::vector<HaloMessage>& messages, int rank, F&& f) {
    for (auto& m : messages) {
      Index at = m.offset;
      for (auto& b : m.boxes) {
        f(b, at);
        at += volume(b.extent, rank);
      }
    }
  }

  void reserve_requests() {
    const Index limit = collective_chunk_limit();
    std::size_t n = 0;
    for (auto& m : layout_.recvs) n += std::size_t((m.count + limit - 1) / limit);
    for (auto& m : layout_.sends) n += std::size_t((m.count + limit - 1) / limit);
    requests_.reserve(n);
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

}  // namespace tshard::detail
