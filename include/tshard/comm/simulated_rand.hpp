// The simulation build's rand() and srand(): glibc's generator, one per simulated rank.
// Under SMPI every simulated rank runs in one process, so libc's rand() state is shared: each rank
// drew the next values, and a program that fills a tensor with Eigen's setRandom() (std::rand) on
// every rank, expecting the same values everywhere as under mpirun, saw different ones. These
// definitions take libc's place in each rank's copy of the program (the build links it with
// -Bsymbolic, so the program's calls bind to them), with glibc's own algorithm: the values are
// those of a real rank, rand() after srand(s) included.
#pragma once
#include <cstdint>
#include <cstdlib>

namespace tshard::detail {

// glibc's random() of TYPE_3, which its rand() returns: x[i] = x[i-3] + x[i-31] (mod 2^32) over 34
// words seeded by a multiplicative generator, the first 310 words dropped, each shifted right by one.
class LibcRandom {
 public:
  explicit LibcRandom(unsigned seed = 1) { reseed(seed); }
  void reseed(unsigned seed) {
    std::int64_t x = std::int32_t(seed == 0 ? 1 : seed);
    r_[0] = std::uint32_t(x);
    for (int i = 1; i < 31; ++i) {
      x = (16807 * x) % 2147483647;
      if (x < 0) x += 2147483647;
      r_[i] = std::uint32_t(x);
    }
    for (int i = 31; i < 34; ++i) r_[i] = r_[i - 31];
    k_ = 0;
    for (int i = 0; i < 310; ++i) next_word();
  }
  int next() { return int(next_word() >> 1); }

 private:
  std::uint32_t next_word() {  // (k + 3 is k - 31 and k + 31 is k - 3 in the ring of 34)
    const std::uint32_t v = r_[(k_ + 3) % 34] + r_[(k_ + 31) % 34];
    r_[k_] = v;
    k_ = (k_ + 1) % 34;
    return v;
  }
  std::uint32_t r_[34];
  unsigned k_ = 0;
};

inline LibcRandom& simulated_rank_random() {
  static LibcRandom g;  // (one per rank: the simulation build has no GNU unique symbols)
  return g;
}

}  // namespace tshard::detail

extern "C" inline int rand() noexcept { return tshard::detail::simulated_rank_random().next(); }
extern "C" inline void srand(unsigned seed) noexcept { tshard::detail::simulated_rank_random().reseed(seed); }
