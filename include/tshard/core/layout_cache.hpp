// One cache for the answers that depend on a layout question alone (a reshard's plan, a rank's
// peers in a redistribution, whether a reshape moves data): keyed by a plain struct of the mesh's
// sizes, two spec descriptors, their extents, a shift, an element size and a rank, hashed
// field by field. A lookup builds no string and takes no lock: each thread keeps its own table
// (MPI programs call from one thread; a second thread plans once more, never races).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <unordered_map>

#include "tshard/core/mesh_shape.hpp"
#include "tshard/core/spec_descriptor.hpp"

namespace tshard::detail {

// A layout question. Axis names do not enter: specs refer to axes by index, and the layout
// arithmetic reads sizes only. Unused fields stay zero.
struct LayoutKey {
  int rank = -1;                      // the asking rank, where the answer is one rank's
  int axes = 0;
  std::array<int, kMaxAxes> sizes{};  // the mesh's axis sizes
  SpecDesc from{}, to{};
  Extents from_shape{}, to_shape{}, shift{};
  std::size_t element_bytes = 0;

  explicit LayoutKey(const MeshShape& mesh) : axes(mesh.axes()) {
    for (int a = 0; a < axes && a < kMaxAxes; ++a) sizes[std::size_t(a)] = mesh.sizes[std::size_t(a)];
  }
  bool operator==(const LayoutKey& o) const {
    if (rank != o.rank || axes != o.axes || element_bytes != o.element_bytes) return false;
    if (!(from == o.from) || !(to == o.to)) return false;
    for (int a = 0; a < axes; ++a)
      if (sizes[std::size_t(a)] != o.sizes[std::size_t(a)]) return false;
    return from_shape == o.from_shape && to_shape == o.to_shape && shift == o.shift;
  }
};

struct LayoutKeyHash {
  static void mix(std::uint64_t& h, std::uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  }
  // Only what operator== compares: a spec's dims up to its rank, each split's axes up to its count.
  static void mix(std::uint64_t& h, const SpecDesc& s) {
    mix(h, std::uint64_t(s.rank) | std::uint64_t(s.partial) << 8 | std::uint64_t(s.partial_axes) << 16);
    for (int d = 0; d < s.rank; ++d) {
      std::uint64_t v = std::uint64_t(s.dims[std::size_t(d)].count);
      for (int i = 0; i < s.dims[std::size_t(d)].count; ++i) v = v << 8 | std::uint8_t(s.dims[std::size_t(d)].axes[std::size_t(i)]);
      mix(h, v);
    }
  }
  std::size_t operator()(const LayoutKey& k) const {
    std::uint64_t h = std::uint32_t(k.rank);
    mix(h, k.element_bytes);
    for (int a = 0; a < k.axes; ++a) mix(h, std::uint64_t(k.sizes[std::size_t(a)]));
    mix(h, k.from);
    mix(h, k.to);
    for (const Extents* e : {&k.from_shape, &k.to_shape, &k.shift})
      for (Index v : *e) mix(h, std::uint64_t(v));
    return std::size_t(h);
  }
};

// answer(key, make): the cached answer, or make()'s, kept. Bounded: a program that cycles
// through more than kLimit layouts starts over rather than growing without end.
template <class Value>
class LayoutCache {
 public:
  static constexpr std::size_t kLimit = 4096;
  template <class Make>
  Value answer(const LayoutKey& key, Make&& make) {
    if (auto it = table_.find(key); it != table_.end()) return it->second;
    if (table_.size() >= kLimit) table_.clear();
    return table_.emplace(key, make()).first->second;
  }
  std::size_t size() const { return table_.size(); }

 private:
  std::unordered_map<LayoutKey, Value, LayoutKeyHash> table_;
};

// The calling thread's cache for answers of type Value to questions of kind Tag.
template <class Tag, class Value>
LayoutCache<Value>& layout_cache() {
  thread_local LayoutCache<Value> cache;
  return cache;
}

}  // namespace tshard::detail
