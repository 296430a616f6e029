// Counter-based random bits: a value is a function of (seed, index) alone, so every rank draws
// the same one for the same global element whatever the layout (random tensors, dropout masks).
#pragma once
#include <cstdint>

namespace tshard::detail {

// SplitMix64 (Steele, Lea, Flood 2014).
inline std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
inline std::uint64_t random_bits(std::uint64_t seed, std::uint64_t index) {
  return splitmix64(splitmix64(seed) ^ (index * 0xD1B54A32D192ED03ull));
}

}  // namespace tshard::detail
