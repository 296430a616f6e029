// The definitions of cpu_capability.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <cctype>
#include <cstdlib>
#include <string>

#include "tshard/core/cpu_capability.hpp"
#include "tshard/core/error.hpp"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#define TSHARD_DETAIL_HAS_CPUID 1
#endif

// tshard::kernels' per-ISA objects (cmake/tshardDependencies.cmake), each named by one symbol:
// referencing it makes the linker take the object, whose registrations then fill the kernels'
// entries before main.
#if defined(TSHARD_KERNELS_INSTANTIATE) && TSHARD_KERNELS_WITH_AVX2
extern "C" const int tshard_kernels_isa_avx2;
#endif
#if defined(TSHARD_KERNELS_INSTANTIATE) && TSHARD_KERNELS_WITH_AVX512
extern "C" const int tshard_kernels_isa_avx512;
#endif

namespace tshard {
namespace detail {

TSHARD_FUNC CpuidWords read_cpuid() {
  CpuidWords w;
#if defined(TSHARD_DETAIL_HAS_CPUID)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d)) w.leaf1_ecx = c;
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) w.leaf7_ebx = b;
  if (__get_cpuid(0x80000001u, &a, &b, &c, &d)) w.ext1_ecx = c;
  if (w.leaf1_ecx & (1u << 27)) {  // OSXSAVE: XGETBV may be executed
    unsigned lo = 0, hi = 0;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    w.xcr0 = (std::uint64_t(hi) << 32) | lo;
  }
#endif
  return w;
}

TSHARD_FUNC CpuCapability capability_from_cpuid(const CpuidWords& w) {
  auto all = [](std::uint64_t word, std::initializer_list<int> bits) {
    for (const int b : bits)
      if (!((word >> b) & 1u)) return false;
    return true;
  };
  // x86-64-v2's SSE3, SSSE3, CX16, SSE4.1, SSE4.2, POPCNT and LAHF, then v3's FMA, MOVBE, OSXSAVE,
  // AVX, F16C; BMI1, AVX2, BMI2; LZCNT; and the XMM and YMM state enabled by the OS.
  const bool v3 = all(w.leaf1_ecx, {0, 9, 13, 19, 20, 23, 12, 22, 27, 28, 29}) && all(w.leaf7_ebx, {3, 5, 8}) &&
                  all(w.ext1_ecx, {0, 5}) && all(w.xcr0, {1, 2});
  if (!v3) return CpuCapability::Baseline;
  // x86-64-v4: AVX512F, DQ, CD, BW, VL, and the opmask and ZMM state enabled by the OS.
  const bool v4 = all(w.leaf7_ebx, {16, 17, 28, 30, 31}) && all(w.xcr0, {5, 6, 7});
  return v4 ? CpuCapability::Avx512 : CpuCapability::Avx2;
}

TSHARD_FUNC std::optional<CpuCapability> parse_cpu_capability(const std::string& text) {
  std::string t;
  for (const char ch : text) t += char(std::tolower(static_cast<unsigned char>(ch)));
  if (t == "baseline" || t == "default") return CpuCapability::Baseline;
  if (t == "avx2") return CpuCapability::Avx2;
  if (t == "avx512") return CpuCapability::Avx512;
  return std::nullopt;
}

TSHARD_FUNC CpuCapability choose_cpu_capability(const CapabilityChoice& available, CpuCapability cpu,
                                                const char* forced) {
  CpuCapability ceiling = cpu;
  if (forced && *forced) {
    const auto asked = parse_cpu_capability(forced);
    const std::string var = std::string("TSHARD_CPU_CAPABILITY=") + forced;
    if (!asked) throw ValueError("tshard: " + var + " names no level: baseline, avx2 or avx512");
    if (int(*asked) > int(cpu))
      throw ValueError("tshard: " + var + " asks for more than this CPU runs (" + to_string(cpu) +
                       "): use that or a lower level, or unset it");
    if (int(*asked) < int(available.floor))
      throw ValueError("tshard: " + var + " is below the level this program was compiled for (" +
                       to_string(available.floor) + ", its -march): build without -march to run lower");
    ceiling = *asked;
  }
  CpuCapability chosen = available.floor;
  for (int c = int(available.floor) + 1; c <= int(ceiling); ++c)
    if (available.built[c]) chosen = CpuCapability(c);
  return chosen;
}

TSHARD_FUNC CapabilityChoice available_cpu_capabilities() {
  CapabilityChoice a;
  a.floor = compiled_cpu_capability();
#if defined(TSHARD_KERNELS_INSTANTIATE) && TSHARD_KERNELS_WITH_AVX2
  a.built[int(CpuCapability::Avx2)] = tshard_kernels_isa_avx2 != 0;
#endif
#if defined(TSHARD_KERNELS_INSTANTIATE) && TSHARD_KERNELS_WITH_AVX512
  a.built[int(CpuCapability::Avx512)] = tshard_kernels_isa_avx512 != 0;
#endif
  return a;
}

}  // namespace detail

TSHARD_FUNC CpuCapability detected_cpu_capability() {
  static const CpuCapability c = detail::capability_from_cpuid(detail::read_cpuid());
  return c;
}

TSHARD_FUNC CpuCapability cpu_capability() {
  static const CpuCapability c = detail::choose_cpu_capability(detail::available_cpu_capabilities(),
                                                               detected_cpu_capability(),
                                                               std::getenv("TSHARD_CPU_CAPABILITY"));
  return c;
}

TSHARD_FUNC std::string cpu_capability_report() {
  const CpuCapability c = cpu_capability();
  const detail::CapabilityChoice a = detail::available_cpu_capabilities();
  std::string levels;
  for (int k = int(a.floor); k < kCpuCapabilities; ++k)
    if (k == int(a.floor) || a.built[k]) levels += std::string(levels.empty() ? "" : ", ") + to_string(CpuCapability(k));
  const char* forced = std::getenv("TSHARD_CPU_CAPABILITY");
  std::string how;
#if defined(TSHARD_KERNELS_INSTANTIATE)
  how = forced && *forced ? std::string("TSHARD_CPU_CAPABILITY=") + forced + " of " + levels
                          : "chosen at run time of " + levels;
#else
  (void)forced;
  how = "header-only: the program's compile flags";
#endif
  return std::string("cpu capability: ") + to_string(c) + " (" + how + "; this CPU: " +
         to_string(detected_cpu_capability()) + ")";
}

}  // namespace tshard

#undef TSHARD_DETAIL_HAS_CPUID
