// libFuzzer target for the safetensors header parser (and the JSON reader under it): any bytes
// either parse or throw tshard::IoError; anything else (another exception, a crash, an
// out-of-bounds read under ASan) is a finding. Built and run by scripts/fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "tshard/io/safetensors_format.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto h = tshard::io::detail::parse_safetensors_header(reinterpret_cast<const char*>(data), size, "fuzz.safetensors");
    if (h.data_offset > std::int64_t(size)) std::abort();  // the parser's own promises
    for (const auto& t : h.tensors)
      if (t.begin > t.end || t.end > h.data_bytes) std::abort();
  } catch (const tshard::IoError&) {
  }
  return 0;
}
