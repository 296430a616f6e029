// Which x86-64 level the CPU runs and which one tshard's hot kernels run at. tshard::kernels holds
// them compiled for baseline x86-64 (SSE2), x86-64-v3 (AVX2 + FMA) and x86-64-v4 (AVX-512) and
// picks one once, at the first kernel call, from the CPU, as PyTorch's CPU_CAPABILITY and
// OpenBLAS's DYNAMIC_ARCH do: a plain build runs at -march=native speed on whichever node it
// lands. TSHARD_CPU_CAPABILITY=baseline|avx2|avx512 forces a lower level (PyTorch's
// ATEN_CPU_CAPABILITY); one above what the CPU runs is a ValueError. A header-only program has no
// choice to make: its own compile flags decided.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "tshard/core/kernel_instances.hpp"

namespace tshard {

enum class CpuCapability { Baseline = 0, Avx2 = 1, Avx512 = 2 };
inline constexpr int kCpuCapabilities = 3;

constexpr const char* to_string(CpuCapability c) {
  return c == CpuCapability::Avx512 ? "avx512" : c == CpuCapability::Avx2 ? "avx2" : "baseline";
}

// The level the compiler was allowed in this translation unit (its -march): x86-64-v4 needs the
// AVX-512 foundation, byte-word, double-quad, conflict-detection and vector-length extensions;
// x86-64-v3 AVX2, FMA, BMI2 and the rest of Haswell's set.
constexpr CpuCapability compiled_cpu_capability() {
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512CD__) && defined(__AVX512DQ__) && \
    defined(__AVX512VL__)
  return CpuCapability::Avx512;
#elif defined(__AVX2__) && defined(__FMA__) && defined(__BMI2__)
  return CpuCapability::Avx2;
#else
  return CpuCapability::Baseline;
#endif
}

// The highest level this CPU runs: its features (CPUID) and the operating system's saving of the
// wider registers (XCR0), as the x86-64 psABI's levels define them. Baseline off x86-64.
CpuCapability detected_cpu_capability();

// The level the dispatched kernels run at, chosen once: the highest one built that the CPU runs,
// or TSHARD_CPU_CAPABILITY's where it is set. Header-only, the program's compiled level. Throws
// ValueError where TSHARD_CPU_CAPABILITY names no level, one above the CPU's, or one below what
// the program was compiled for.
CpuCapability cpu_capability();

// For a program's first line: the level that runs, how it was chosen, and what the CPU runs, e.g.
// "cpu capability: avx512 (chosen at run time of baseline, avx2, avx512; this CPU: avx512)".
std::string cpu_capability_report();

namespace detail {

// What CPUID and XGETBV answered, as words: leaf 1's ECX, leaf 7's EBX, leaf 0x80000001's ECX,
// and XCR0 (0 where the OS does not enable XSAVE).
struct CpuidWords {
  std::uint32_t leaf1_ecx = 0, leaf7_ebx = 0, ext1_ecx = 0;
  std::uint64_t xcr0 = 0;
};
CpuidWords read_cpuid();
CpuCapability capability_from_cpuid(const CpuidWords& w);

// TSHARD_CPU_CAPABILITY's value as a level ("default" is PyTorch's name for baseline); none where
// the text names none.
std::optional<CpuCapability> parse_cpu_capability(const std::string& text);

// The levels a program can run: `floor` (what its portable code was compiled for) and above it
// those built[] marks (tshard::kernels' per-ISA objects).
struct CapabilityChoice {
  CpuCapability floor = CpuCapability::Baseline;
  bool built[kCpuCapabilities] = {true, false, false};
};
// The level to run: the highest available at or below the forced one (forced: the variable's text,
// null or empty where unset) and the CPU's. Throws ValueError as cpu_capability() says.
CpuCapability choose_cpu_capability(const CapabilityChoice& available, CpuCapability cpu, const char* forced);

// What this program can run (tshard::kernels' build, or header-only the compiled level).
CapabilityChoice available_cpu_capabilities();

}  // namespace detail
}  // namespace tshard

#if TSHARD_HEADER_BODIES
#include "tshard/core/cpu_capability-inl.hpp"
#endif
