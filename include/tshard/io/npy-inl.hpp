// The definitions of npy.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tshard/io/npy.hpp"

namespace tshard::io::detail {

TSHARD_FUNC NpyHeader read_npy_header(tshard::detail::ParallelFile& file, const std::string& path) {
  const MPI_Offset size = file.size();
  const std::vector<char> head = file.read_everywhere(0, Index(std::min<MPI_Offset>(size, 1 << 20)));
  NpyHeader h = parse_npy_header(head.data(), head.size(), path);
  if (h.data_offset + h.data_bytes() > std::int64_t(size))
    throw IoError("tshard::io: '" + path + "' is truncated: its shape needs " + std::to_string(h.data_bytes()) +
                  " bytes of data, the file holds " + std::to_string(std::int64_t(size) - h.data_offset));
  return h;
}

}  // namespace tshard::io::detail
