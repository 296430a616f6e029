// The simulation build's timing mode (scripts/simulate.sh --timing; docs/simulation.md), in which
// a step of thousands of simulated ranks fits this machine. SMPI times each rank's computation by
// running it here, so 2048 ranks of a 3-second step would cost hours of wall time and every
// rank's tensors would have to fit in memory at once. In timing mode:
//   - world rank 0 runs as in a real run, in memory of its own, and every kernel it calls runs
//     for real: it is the measured rank;
//   - on every other rank, floating-point storage of 64 KiB and more (parameters, gradients,
//     optimizer states, activations: the buffer pool's) comes from blocks that all those ranks
//     share (SharedBlocks: a rank's own blocks are distinct, and one block is every rank's), so
//     that the memory of all ranks is about two ranks', and values are meaningless everywhere,
//     rank 0's too, once they have met in a collective. (Not SMPI's shared malloc: it maps every
//     allocation of every rank anew onto its file, in 1 MiB pieces, so each rank pays a page
//     fault per 4 KiB touched, and 2048 ranks need more mappings than Linux's 65530 allowed.)
//   - and kernels are sampled there. A kernel's cost is keyed by its arguments (the same shapes:
//     pointers and floating-point scalars do not count). A rank puts the median of rank 0's
//     latest TSHARD_SIM_SAMPLES runs of that key (5 by default, at most 8) on the simulated clock
//     instead of running it. Rank 0 keeps those runs current, so that a step's sampled times
//     are its own step's: the first step's page faults and cold caches stay in the first step,
//     as in a real run, and the median keeps out one run the host preempted. A key rank 0 never
//     runs (another pipeline stage's) is measured on the first ranks that run it, 5 times.
// It is on where TSHARD_SIM_TIMING is set (simulate.sh --timing sets it); nothing here exists
// outside the simulation build.
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

// smpicxx force-includes smpi_helpers.h into every translation unit: a simulation build is
// recognised without <mpi.h>.
#if defined(SMPI_HELPERS_H) || defined(SMPI_H) || (defined(TSHARD_SIMULATE) && TSHARD_SIMULATE)
#define TSHARD_DETAIL_SIMULATED 1
#include <chrono>

#include <smpi/smpi.h>
#else
#define TSHARD_DETAIL_SIMULATED 0
#endif

namespace tshard {

// Whether this run is a simulation in timing mode, whose tensor values are meaningless (always
// false outside the simulation build).
inline bool simulated_timing_mode() {
#if TSHARD_DETAIL_SIMULATED
  static const bool on = [] {
    const char* v = std::getenv("TSHARD_SIM_TIMING");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
#else
  return false;
#endif
}

#if TSHARD_DETAIL_SIMULATED
namespace detail {

// What identifies a kernel's cost: its name (with its template arguments) and the values of its
// integral arguments. Pointers count as null or not; floating-point values not at all (a
// learning rate or a scale does not change the work); a struct by its bytes, a shard's layout by
// its extents only (its offset differs from rank to rank, its work does not).
class SampleKey {
 public:
  explicit SampleKey(std::uint64_t name_hash) : h_(name_hash) {}
  static std::uint64_t hash_name(const char* s) {
    std::uint64_t h = 1469598103934665603ull;
    for (; *s; ++s) h = (h ^ std::uint8_t(*s)) * 1099511628211ull;
    return h;
  }
  template <class T>
  void add(const T& v) {
    if constexpr (std::is_pointer_v<T> || std::is_null_pointer_v<T>) {
      bytes(v != nullptr);
    } else if constexpr (std::is_floating_point_v<T>) {
    } else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) {
      bytes(v);
    } else if constexpr (requires { v.padded; v.valid; v.rank; }) {
      bytes(v.rank);
      bytes(v.padded);
      bytes(v.valid);
    } else if constexpr (std::is_trivially_copyable_v<T>) {
      bytes(v);
    }
  }
  std::uint64_t value() const { return h_ ? h_ : 1; }

 private:
  template <class T>
  void bytes(const T& v) {
    unsigned char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    for (unsigned char c : b) h_ = (h_ ^ c) * 1099511628211ull;
  }
  std::uint64_t h_;
};

// The runs measured so far, one table for all simulated ranks (SMPI's store of shared calls holds
// it; each rank's copy of the program finds it there).
struct KernelSamples {
  static constexpr std::size_t kSlots = std::size_t(1) << 15;
  static constexpr int kMaxRuns = 8;
  struct Slot {
    std::uint64_t key;
    std::int32_t runs;          // measured so far (rank 0's only, once it has measured one)
    bool by_rank0;              // whether they are rank 0's
    double median;              // of the latest runs (host seconds)
    double seconds[kMaxRuns];   // the latest runs', oldest overwritten first
  };
  int runs_wanted;  // the runs a median is taken over
  double host_flops;  // this machine's rate, which SMPI scales host seconds by
  Slot slots[kSlots];

  // The key's slot, or null where the table is full (that kernel then always runs).
  Slot* find(std::uint64_t key) {
    for (std::size_t i = key & (kSlots - 1), probes = 0; probes < kSlots; i = (i + 1) & (kSlots - 1), ++probes) {
      if (slots[i].key == key) return &slots[i];
      if (slots[i].key == 0) {
        slots[i].key = key;
        return &slots[i];
      }
    }
    return nullptr;
  }
};

inline KernelSamples& kernel_samples() {
  static KernelSamples* const table = [] {
    if (smpi_shared_known_call("tshard", "kernel_samples"))
      return static_cast<KernelSamples*>(smpi_shared_get_call("tshard", "kernel_samples"));
    auto* t = static_cast<KernelSamples*>(std::calloc(1, sizeof(KernelSamples)));
    const char* runs = std::getenv("TSHARD_SIM_SAMPLES");
    t->runs_wanted = runs && *runs ? std::atoi(runs) : 5;
    t->runs_wanted = t->runs_wanted < 1 ? 1 : t->runs_wanted > KernelSamples::kMaxRuns ? KernelSamples::kMaxRuns : t->runs_wanted;
    const char* flops = std::getenv("TSHARD_SIM_HOST_FLOPS");
    t->host_flops = flops && *flops ? std::atof(flops) : 0;
    smpi_shared_set_call("tshard", "kernel_samples", t);
    return t;
  }();
  return *table;
}

// This rank's world rank between MPI_Init and MPI_Finalize (SMPI's clock runs for a rank there),
// -1 before MPI_Init.
inline int simulated_world_rank() {
  static int rank = -1;
  if (rank < 0) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized) MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  }
  return rank;
}
// 0 for world rank 0 (the measured rank), 1 for the others, -1 before MPI_Init.
inline int simulated_rank_role() {
  const int rank = simulated_world_rank();
  return rank < 0 ? -1 : rank == 0 ? 0 : 1;
}

// In timing mode, floating-point blocks from this size on are shared by the simulated ranks
// (all but world rank 0), and their messages are not copied.
inline constexpr std::size_t kSimulatedSharedFrom = std::size_t(64) << 10;

// Timing mode's floating-point blocks of kSimulatedSharedFrom and more, every rank's (the shared
// ones, and rank 0's own): a message whose bytes lie in one of them is a tensor's, whose values are
// meaningless in timing mode, so SMPI need not copy it (see skip_floating_payloads). One store for
// all simulated ranks.
class FloatingRegions {
 public:
  static FloatingRegions& instance() {
    static FloatingRegions* const store = [] {
      if (smpi_shared_known_call("tshard", "floating_regions"))
        return static_cast<FloatingRegions*>(smpi_shared_get_call("tshard", "floating_regions"));
      return static_cast<FloatingRegions*>(smpi_shared_set_call("tshard", "floating_regions", new FloatingRegions));
    }();
    return *store;
  }
  void add(const void* p, std::size_t bytes) { ends_[address(p)] = address(p) + bytes; }
  void remove(const void* p) { ends_.erase(address(p)); }
  // Whether [p, p + bytes) lies inside one region.
  bool holds(const void* p, std::size_t bytes) const {
    auto it = ends_.upper_bound(address(p));
    if (it == ends_.begin()) return false;
    --it;
    return address(p) + bytes <= it->second;
  }

 private:
  static std::uintptr_t address(const void* p) { return reinterpret_cast<std::uintptr_t>(p); }
  std::map<std::uintptr_t, std::uintptr_t> ends_;  // a region's first byte -> one past its last
};

// SMPI copies every message's payload from sender to receiver, at memcpy speed (its transfer time
// is the flow model's: the copy is wall time only). In timing mode a tensor's values are
// meaningless, so messages from those blocks are not copied: thousands of simulated ranks would
// otherwise copy every gradient bucket for real. Smaller messages, and any outside them (counts,
// token ids, flags, what the program's control follows), are copied as always.
inline void copy_unless_floating(smx_activity_t comm, void* source, std::size_t bytes) {
  if (bytes >= kSimulatedSharedFrom && FloatingRegions::instance().holds(source, bytes)) return;
  smpi_comm_copy_buffer_callback(reinterpret_cast<simgrid::kernel::activity::CommImpl*>(comm), source, bytes);
}
inline void skip_floating_payloads() {
  if (simulated_timing_mode()) smpi_comm_set_copy_data_callback(&copy_unless_floating);
}

// Timing mode's blocks of the ranks other than 0: a block may be held by any number of ranks at
// once but by each rank once, so a rank's own blocks never overlap. One store for all simulated
// ranks (SMPI's store of shared calls holds it), whose blocks are never freed.
class SharedBlocks {
 public:
  static SharedBlocks& instance() {
    static SharedBlocks* const store = [] {
      if (smpi_shared_known_call("tshard", "shared_blocks"))
        return static_cast<SharedBlocks*>(smpi_shared_get_call("tshard", "shared_blocks"));
      return static_cast<SharedBlocks*>(smpi_shared_set_call("tshard", "shared_blocks", new SharedBlocks));
    }();
    return *store;
  }
  void* acquire(std::size_t bytes, int rank) {
    std::vector<Block>& blocks = by_size_[bytes];
    for (Block& b : blocks)
      if (!b.held(rank)) {
        b.hold(rank, true);
        return b.data;
      }
    void* p = std::aligned_alloc(64, bytes);
    if (!p) return nullptr;
    FloatingRegions::instance().add(p, bytes);
    blocks.push_back(Block{p, {}});
    blocks.back().hold(rank, true);
    return p;
  }
  // Whether p was one of the store's (it is then this rank's no longer).
  bool release(void* p, std::size_t bytes, int rank) {
    auto it = by_size_.find(bytes);
    if (it == by_size_.end()) return false;
    for (Block& b : it->second)
      if (b.data == p) {
        b.hold(rank, false);
        return true;
      }
    return false;
  }

 private:
  struct Block {
    void* data;
    std::vector<std::uint64_t> holders;  // a bit per rank
    bool held(int rank) const {
      const std::size_t w = std::size_t(rank) / 64;
      return w < holders.size() && (holders[w] >> (rank % 64) & 1);
    }
    void hold(int rank, bool on) {
      const std::size_t w = std::size_t(rank) / 64;
      if (w >= holders.size()) holders.resize(w + 1, 0);
      const std::uint64_t bit = std::uint64_t(1) << (rank % 64);
      holders[w] = on ? holders[w] | bit : holders[w] & ~bit;
    }
  };
  std::unordered_map<std::size_t, std::vector<Block>> by_size_;
};

// One call of a sampled kernel (TSHARD_SAMPLED_KERNEL): measured, or skipped with the median of
// the measured runs put on the simulated clock. A kernel called inside a sampled one runs as its
// caller does (its time is its caller's).
class KernelSample {
 public:
  template <class... Args>
  KernelSample(std::uint64_t name_hash, const Args&... args) {
    if (!simulated_timing_mode() || depth() > 0) return;
    const int role = simulated_rank_role();
    if (role < 0) return;
    SampleKey key(name_hash);
    (key.add(args), ...);
    KernelSamples& table = kernel_samples();
    KernelSamples::Slot* slot = table.find(key.value());
    if (!slot) return;
    if (role > 0 && (slot->by_rank0 || slot->runs >= table.runs_wanted)) {
      skip_ = true;
      const double seconds = slot->median;
      // (the computation since the last MPI call is SMPI's to time; then this kernel's median)
      smpi_bench_end();
      if (table.host_flops > 0)
        smpi_execute_flops(seconds * table.host_flops);
      else
        smpi_execute(seconds);
      smpi_bench_begin();
      return;
    }
    if (role == 0 && !slot->by_rank0) {  // rank 0's runs replace the others'
      slot->by_rank0 = true;
      slot->runs = 0;
    }
    slot_ = slot;
    ++depth();
    start_ = std::chrono::steady_clock::now();
  }
  ~KernelSample() {
    if (!slot_) return;
    const int wanted = kernel_samples().runs_wanted;
    slot_->seconds[slot_->runs++ % wanted] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    const int n = std::min<int>(slot_->runs, wanted);
    double s[KernelSamples::kMaxRuns];
    std::copy(slot_->seconds, slot_->seconds + n, s);
    std::nth_element(s, s + (n - 1) / 2, s + n);
    slot_->median = s[(n - 1) / 2];  // (the lower one of an even count: of 2, the warm run)
    --depth();
  }
  KernelSample(const KernelSample&) = delete;
  KernelSample& operator=(const KernelSample&) = delete;
  bool skip() const { return skip_; }

 private:
  static int& depth() {
    static int d = 0;
    return d;
  }
  KernelSamples::Slot* slot_ = nullptr;
  bool skip_ = false;
  std::chrono::steady_clock::time_point start_{};
};

}  // namespace detail

// Opens the body of a kernel (a void function of pointers, sizes and plain structs, that calls no
// MPI) whose calls timing mode may sample: what it writes is then left as it was.
#define TSHARD_SAMPLED_KERNEL(...)                                                                           \
  static const std::uint64_t tshard_kernel_name_hash = ::tshard::detail::SampleKey::hash_name(__PRETTY_FUNCTION__); \
  const ::tshard::detail::KernelSample tshard_kernel_sample(tshard_kernel_name_hash __VA_OPT__(, ) __VA_ARGS__); \
  if (tshard_kernel_sample.skip()) return
#else
#define TSHARD_SAMPLED_KERNEL(...)
#endif

namespace detail {

#if !TSHARD_DETAIL_SIMULATED
inline void skip_floating_payloads() {}
#endif

// Runs f(), a part of an operator whose work is a kernel's (no MPI inside; its cost set by `what`
// and the key's values, as TSHARD_SAMPLED_KERNEL's arguments), as a sampled kernel.
template <class F, class... Key>
void sampled(const char* what, F&& f, const Key&... key) {
#if TSHARD_DETAIL_SIMULATED
  if (simulated_timing_mode()) {
    static const std::uint64_t name = SampleKey::hash_name(__PRETTY_FUNCTION__);
    const KernelSample sample(name ^ SampleKey::hash_name(what), key...);
    if (sample.skip()) return;
    f();
    return;
  }
#endif
  (void)what;
  ((void)key, ...);
  f();
}

}  // namespace detail

}  // namespace tshard
