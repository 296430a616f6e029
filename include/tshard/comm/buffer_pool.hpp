// A pool of aligned buffers for tensor storage and scratch. Fresh memory costs ~2 us per 4 KiB
// page on first touch here (33-41 ms per 64 MiB), more than many collectives, so freed buffers are kept
// and handed out again instead of going back to the allocator.
#pragma once
#include <algorithm>
#include <complex>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <type_traits>
#include <utility>

#include "tshard/core/simulated_timing.hpp"

namespace tshard {

struct PoolStats {
  std::uint64_t fresh_allocations = 0;  // buffers obtained from the system allocator
  std::uint64_t reuses = 0;             // requests served from cached buffers
  std::uint64_t bytes_cached = 0;       // bytes held for reuse right now
  std::uint64_t bytes_in_use = 0;       // bytes handed out and not yet returned
  std::uint64_t peak_bytes_in_use = 0;  // the most bytes_in_use has been
};

namespace detail {

class BufferPool {
 public:
  static constexpr std::size_t kAlign = 64;
  // (In the simulation build's timing mode only floating-point blocks are shared, from
  // kSimulatedSharedFrom on: integers (token ids, counts, indices) stay real, so that what a rank
  // computes from them stays in bounds.)

  // `shareable`: the block holds floating-point values only.
  void* acquire(std::size_t bytes, bool shareable = false) {
    if (bytes == 0) return nullptr;
    bytes = round_up(bytes);
    std::lock_guard<std::mutex> lock(mutex_);
    // Take the smallest cached block that fits, unless it would waste more than half.
    auto it = free_.lower_bound(bytes);
    if (it != free_.end() && it->first <= 2 * bytes) {
      void* p = it->second;
      std::size_t size = it->first;
      free_.erase(it);
      stats_.bytes_cached -= size;
      stats_.bytes_in_use += size;
      stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
      sizes_[p] = size;
      ++stats_.reuses;
      return p;
    }
    void* p = allocate(bytes, shareable);
    sizes_[p] = bytes;
    ++stats_.fresh_allocations;
    stats_.bytes_in_use += bytes;
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    return p;
  }

  // Starts a new peak from what is in use now (to measure one phase's peak).
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mutex_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }

  void release(void* p) {
    if (!p) return;
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = sizes_.find(p);
    std::size_t size = it->second;
    sizes_.erase(it);
    stats_.bytes_in_use -= size;
    if (stats_.bytes_cached + size > cache_limit_) {
      deallocate(p, size);
      return;
    }
    free_.emplace(size, p);
    stats_.bytes_cached += size;
  }

  // Gives every cached buffer back to the system.
  void trim() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& [size, p] : free_) deallocate(p, size);
    free_.clear();
    stats_.bytes_cached = 0;
  }

  void set_cache_limit(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cache_limit_ = bytes;
    }
    trim();
  }

  PoolStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

 private:
  static std::size_t round_up(std::size_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

  void* allocate(std::size_t bytes, bool shareable) {
#if TSHARD_DETAIL_SIMULATED
    const bool floating = shareable && bytes >= kSimulatedSharedFrom && simulated_timing_mode();
    if (floating && simulated_rank_role() > 0) {
      void* p = SharedBlocks::instance().acquire(bytes, simulated_world_rank());
      if (!p) throw std::bad_alloc();
      shared_.insert(p);
      return p;
    }
#endif
    (void)shareable;
    void* p = std::aligned_alloc(kAlign, bytes);
    if (!p) throw std::bad_alloc();
#if TSHARD_DETAIL_SIMULATED
    if (floating) FloatingRegions::instance().add(p, bytes);  // (rank 0's: as meaningless once sent)
#endif
    return p;
  }
  void deallocate(void* p, std::size_t bytes) {
#if TSHARD_DETAIL_SIMULATED
    if (shared_.erase(p)) {
      SharedBlocks::instance().release(p, bytes, simulated_world_rank());
      return;
    }
    if (simulated_timing_mode()) FloatingRegions::instance().remove(p);
#endif
    (void)bytes;
    std::free(p);
  }

  mutable std::mutex mutex_;
  std::multimap<std::size_t, void*> free_;
  std::map<void*, std::size_t> sizes_;
  std::set<void*> shared_;  // blocks of the simulation's SharedBlocks (timing mode)
  std::size_t cache_limit_ = static_cast<std::size_t>(4) << 30;
  PoolStats stats_;
};

// Never destroyed: tensors in static storage may return buffers after other statics are gone.
inline BufferPool& buffer_pool() {
  static BufferPool* pool = new BufferPool;
  return *pool;
}

// Returns a pooled buffer to the pool; named so that storage can tell pooled from adopted memory.
struct PoolDeleter {
  void operator()(void* q) const { buffer_pool().release(q); }
};

// Whether a block of T holds floating-point values only (timing mode may share it).
template <class T>
inline constexpr bool kFloatingBlock = std::is_floating_point_v<T>;
template <class T>
inline constexpr bool kFloatingBlock<std::complex<T>> = std::is_floating_point_v<T>;

// A pooled array of T, shared by the owners of a tensor's storage.
template <class T>
std::shared_ptr<T> pooled_array(std::size_t count) {
  T* p = static_cast<T*>(buffer_pool().acquire(count * sizeof(T), kFloatingBlock<T>));
  return std::shared_ptr<T>(p, PoolDeleter{});
}

// Scratch space from the pool, for packing and unpacking inside one operation (or kept between
// an operation and its backward): counted in the pool's bytes and peak like a tensor. Movable,
// so staging buffers can be swapped and kept. Elements (arithmetic types: nothing is constructed
// or destroyed) start unspecified unless a fill value is given.
template <class T>
class Scratch {
 public:
  Scratch() = default;
  explicit Scratch(std::size_t count)
      : data_(static_cast<T*>(buffer_pool().acquire(count * sizeof(T), kFloatingBlock<T>))), size_(count) {}
  Scratch(std::size_t count, T fill) : Scratch(count) { std::fill_n(data_, count, fill); }
  ~Scratch() { buffer_pool().release(data_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  Scratch(Scratch&& o) noexcept : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
  Scratch& operator=(Scratch&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(size_, o.size_);
    return *this;
  }
  T* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T& operator[](std::size_t i) const { return data_[i]; }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }

 private:
  T* data_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace detail

// Allocation counters of the pool behind every tensor and scratch buffer.
inline PoolStats pool_stats() { return detail::buffer_pool().stats(); }
// Restarts peak_bytes_in_use from bytes_in_use, to measure the peak of what follows.
inline void reset_pool_peak() { detail::buffer_pool().reset_peak(); }
// Gives cached buffers back to the system (they are otherwise kept for reuse).
inline void trim_buffer_pool() { detail::buffer_pool().trim(); }

}  // namespace tshard
