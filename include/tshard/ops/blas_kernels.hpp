// Which kernels the BLAS of local products runs: BLIS given the kernels of the CPU's level (or of
// TSHARD_CPU_CAPABILITY's), and the line that says which library and kernels run. Needs no MPI:
// the GEMM benchmark of the BLAS libraries uses it alone.
#pragma once
#include <algorithm>
#include <cstdlib>
#include <string>

#ifdef TSHARD_USE_BLAS
#include <cblas.h>
#endif
#include "tshard/core/cpu_capability.hpp"
#include "tshard/core/simulated_timing.hpp"

#if defined(TSHARD_USE_BLAS) && defined(TSHARD_BLAS_BLIS)
// (BLIS's own declarations; blis.h itself is a large header)
extern "C" void bli_init(void);
extern "C" int bli_arch_query_id(void);
extern "C" const char* bli_arch_string(int id);
extern "C" long bli_info_get_simd_size(void);
extern "C" const char* bli_info_get_version_str(void);
#endif

namespace tshard {
namespace detail {

// BLIS's kernels for a level (its BLIS_ARCH_TYPE), or null for BLIS's own choice. Debian 12's
// BLIS 0.9 reads the CPU's features but counts a Xeon's FMA units from its model name, and on a
// name it does not parse it runs its AVX2 kernels where AVX-512 ones run 1.9x faster (sgemm 65
// against 122 GFLOP/s on one core here): AVX-512 gets skx. Where TSHARD_CPU_CAPABILITY pins a
// level, BLIS is pinned with it (haswell: AVX2 and FMA; generic: portable C), so that every rank
// of a job over different CPUs rounds its products alike.
inline const char* blis_kernels_for(CpuCapability level, bool pinned) {
  if (level == CpuCapability::Avx512) return "skx";
  if (!pinned) return nullptr;
  return level == CpuCapability::Avx2 ? "haswell" : "generic";
}

#if defined(TSHARD_USE_BLAS) && defined(TSHARD_BLAS_BLIS)
// Before BLIS's first product: its kernels from the CPU's level, or TSHARD_CPU_CAPABILITY's; a
// BLIS_ARCH_TYPE of the user's wins. BLIS reads BLIS_ARCH_TYPE when it first asks which kernels
// run, as the number of a configuration it was built with (0.9 reads only numbers; the names run
// up to "generic", the last), and aborts on one it lacks. Which it has is not exported: a build
// whose widest vectors are 64 bytes is a configuration family (Debian's x86_64: skx, haswell,
// zen3, generic and more) or an AVX-512 machine's own; narrower builds keep BLIS's own choice.
inline void choose_blis_kernels() {
  static const bool chosen = [] {
    if (const char* own = std::getenv("BLIS_ARCH_TYPE"); own && *own) return true;
    const char* forced = std::getenv("TSHARD_CPU_CAPABILITY");
    const bool pinned = forced && *forced && parse_cpu_capability(forced);
    const CpuCapability level = pinned ? std::min(*parse_cpu_capability(forced), detected_cpu_capability())
                                       : detected_cpu_capability();
    const char* arch = blis_kernels_for(level, pinned);
    if (!arch || bli_info_get_simd_size() < 64) return true;
    for (int id = 0; id < 64; ++id) {
      const std::string name = bli_arch_string(id);
      if (name == arch) setenv("BLIS_ARCH_TYPE", std::to_string(id).c_str(), 0);
      if (name == arch || name == "generic") break;
    }
    return true;
  }();
  (void)chosen;
}
#else
inline void choose_blis_kernels() {}
#endif

}  // namespace detail

// Which library multiplies local matrices and with which kernels, e.g. "local products: BLIS
// 0.9.0, skx kernels" (for a program's first line, beside cpu_capability_report()).
inline std::string blas_report() {
#if defined(TSHARD_USE_BLAS) && defined(TSHARD_BLAS_BLIS)
  detail::choose_blis_kernels();
  bli_init();  // (its configurations registered before it is asked which runs)
  return std::string("local products: BLIS ") + bli_info_get_version_str() + ", " +
         bli_arch_string(bli_arch_query_id()) + " kernels";
#elif defined(TSHARD_USE_BLAS) && defined(TSHARD_BLAS_OPENBLAS)
  const std::string core = openblas_get_corename();
  std::string line = "local products: OpenBLAS, " + core + " kernels";
  if (detected_cpu_capability() == CpuCapability::Avx512 && core.find("kylake") == std::string::npos &&
      core.find("ooperlake") == std::string::npos && core.find("apphire") == std::string::npos)
    line += " (this CPU runs AVX-512: OPENBLAS_CORETYPE=SkylakeX, or BLIS, runs it)";
  return line;
#elif defined(TSHARD_USE_BLAS)
  return "local products: CBLAS";
#else
  return "local products: Eigen's GEMM";
#endif
}

// The line the examples print first: the kernels' level and the local products' library.
inline std::string kernels_report() {
  std::string line = cpu_capability_report() + "; " + blas_report();
  if (simulated_timing_mode())  // (a program's first line: what its values are worth)
    line += "; simulation timing mode: tensors shared by all ranks, repeated kernels sampled, values meaningless";
  return line;
}

}  // namespace tshard
