// libFuzzer target for the .npy header parser: any bytes either parse or throw tshard::IoError;
// anything else (another exception, a crash, an out-of-bounds read under ASan) is a finding.
// Built and run by scripts/fuzz.sh with clang -fsanitize=fuzzer,address,undefined.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tshard/io/npy_format.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto h = tshard::io::detail::parse_npy_header(reinterpret_cast<const char*>(data), size, "fuzz.npy");
    if (h.data_offset > std::int64_t(size) || h.itemsize <= 0) std::abort();  // the parser's own promises
  } catch (const tshard::IoError&) {
  }
  return 0;
}
