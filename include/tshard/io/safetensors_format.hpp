// Hugging Face's safetensors format (github.com/huggingface/safetensors, "Format"), MPI-free:
// an 8-byte little-endian header length N, N bytes of JSON mapping each tensor's name to
// {"dtype", "shape", "data_offsets": [begin, end]} (relative to the data, which follows the
// header; C order) plus an optional "__metadata__" of strings. The parser takes any bytes (it is
// fuzzed): a malformed or inconsistent header is an IoError naming the file and what is wrong.
// Also the element conversions of the dtypes read (BF16 and F16 to float) and Hugging Face's
// index of a model split over files (model.safetensors.index.json: {"weight_map": {name: file}}).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/io/json.hpp"

namespace tshard::io::detail {

// The header may not be larger than this (the reference implementation's limit: 100 MB).
inline constexpr std::int64_t kMaxSafetensorsHeader = 100'000'000;

struct SafetensorsEntry {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::int64_t begin = 0, end = 0;  // bytes, relative to the start of the data
  std::int64_t elements() const;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> tensors;  // in the order of the file's JSON
  std::map<std::string, std::string> metadata;
  std::int64_t data_offset = 0;  // 8 + the header's length
  std::int64_t data_bytes = 0;   // the largest end offset: what the file must hold after the header
  const SafetensorsEntry* find(const std::string& name) const;
};

// Bytes per element of a dtype, 0 for one tshard does not know.
std::int64_t safetensors_itemsize(const std::string& dtype);

// Element types this MPI-free header does not know (bfloat16: io/safetensors.hpp) name their
// dtype here.
template <class T>
inline constexpr const char* other_safetensors_dtype = nullptr;

// The dtype tshard writes for an element type.
template <class T>
constexpr const char* safetensors_dtype() {
  if constexpr (std::is_same_v<T, float>) return "F32";
  else if constexpr (std::is_same_v<T, double>) return "F64";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "I32";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "I64";
  else if constexpr (other_safetensors_dtype<T> != nullptr) return other_safetensors_dtype<T>;
  else static_assert(!sizeof(T), "tshard: safetensors files hold float, double, bfloat16, int32_t or int64_t tensors here");
}

// A dtype's place in the safetensors library's Dtype enumeration (by alignment, then declaration):
// files list tensors by it, widest first.
int safetensors_dtype_order(const std::string& dtype);

// IEEE binary16 and bfloat16 bits to float (exact: every value of both is a float).
inline float bfloat16_to_float(std::uint16_t bits) {
  const std::uint32_t u = std::uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float float16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, u;
  if (exponent == 0x1f) {
    u = sign | 0x7f800000u | (mantissa << 13);  // inf, nan
  } else if (exponent != 0) {
    u = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    u = sign;  // zero
  } else {     // subnormal: normalise
    exponent = 113;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      --exponent;
    }
    u = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// float to bfloat16 bits, rounded to nearest even (nan stays nan): how PyTorch converts.
inline std::uint16_t float_to_bfloat16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return std::uint16_t(u >> 16);
}

// float to IEEE binary16 bits, rounded to nearest even (overflow to inf, tiny values to subnormals
// or zero, nan stays nan): how PyTorch converts.
inline std::uint16_t float_to_float16(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  const auto sign = std::uint16_t((u >> 16) & 0x8000u);
  u &= 0x7fffffffu;
  if (u > 0x7f800000u) return std::uint16_t(sign | 0x7e00u | ((u >> 13) & 0x3ffu));  // nan, quiet
  if (u >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);                       // 65520 and up: inf
  if (u >= 0x38800000u) {                                                           // a normal half
    std::uint32_t r = u - (112u << 23);                                             // exponent rebiased 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return std::uint16_t(sign | (r >> 13));
  }
  if (u <= 0x33000000u) return sign;  // 2^-25 and below: zero (2^-25 ties to the even zero)
  const std::uint32_t exponent = u >> 23, mantissa = (u & 0x7fffffu) | 0x800000u;
  const int shift = int(126 - exponent);  // a subnormal half: mantissa * 2^(exponent - 126) units of 2^-24
  std::uint32_t r = mantissa >> shift;
  const std::uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (r & 1u))) ++r;
  return std::uint16_t(sign | r);
}

// Parses a file's first bytes (at least the 8-byte length and the header where it fits); an
// IoError names the file and what is wrong.
SafetensorsHeader parse_safetensors_header(const char* bytes, std::size_t size, const std::string& path);

// The 8-byte length and the JSON header of these entries (offsets as given), padded with spaces
// to a multiple of 8 bytes so the data that follows is aligned, as the reference writer does.
std::string safetensors_header(const std::vector<SafetensorsEntry>& tensors,
                               const std::map<std::string, std::string>& metadata);

// Hugging Face's index of a model split over files: tensor name -> file (relative to the index).
std::map<std::string, std::string> parse_safetensors_index(const char* text, std::size_t size,
                                                           const std::string& path);

}  // namespace tshard::io::detail

#if TSHARD_HEADER_BODIES
#include "tshard/io/safetensors_format-inl.hpp"
#endif
