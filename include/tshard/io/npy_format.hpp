// numpy's .npy format (numpy/lib/format.py, versions 1.0-3.0): the preamble tshard writes and
// a parser for the ones it reads, MPI-free. The parser takes any bytes (it is fuzzed): every
// malformed, truncated or unsupported header is an IoError naming the file and what is wrong.
#pragma once
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"

namespace tshard::io {
namespace detail {

struct NpyHeader {
  std::string descr;                 // e.g. "<f4"
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
  std::int64_t data_offset = 0;      // bytes before the data
  std::int64_t itemsize = 0;
  std::int64_t data_bytes() const;
};

// The descr of an element type, little-endian.
template <class T>
constexpr const char* npy_descr() {
  if constexpr (std::is_same_v<T, float>) return "<f4";
  else if constexpr (std::is_same_v<T, double>) return "<f8";
  else if constexpr (std::is_same_v<T, std::complex<float>>) return "<c8";
  else if constexpr (std::is_same_v<T, std::complex<double>>) return "<c16";
  else if constexpr (std::is_same_v<T, std::int32_t>) return "<i4";
  else if constexpr (std::is_same_v<T, std::int64_t>) return "<i8";
  else static_assert(!sizeof(T), "tshard: .npy files hold float, double, complex<float/double>, int32_t or int64_t");
}

// The preamble (magic, version, header padded to a multiple of 64 bytes) of an array.
std::string npy_preamble(const std::string& descr, bool fortran_order, const std::vector<std::int64_t>& shape);

// Parses the first bytes of a .npy file; an IoError names the file and what is wrong.
NpyHeader parse_npy_header(const char* data, std::size_t size, const std::string& path);

// The descr with '=' or '|' read as '<' (this machine is little-endian), for comparison.
std::string little_endian_descr(std::string d);

}  // namespace detail
}  // namespace tshard::io

#if TSHARD_HEADER_BODIES
#include "tshard/io/npy_format-inl.hpp"
#endif
