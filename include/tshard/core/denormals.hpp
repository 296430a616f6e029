// Denormal floats make x86 arithmetic 10-100x slower: softmax probabilities near 1e-40 and the
// products of backward reach them in float, and one GEMM over such values took 35x longer
// here. flush_denormals() sets the calling thread's FTZ and DAZ bits (MXCSR), as PyTorch's
// torch.set_flush_denormal(True) does: values below 1.2e-38 (float) become 0. Results stay
// identical on every mesh (the flush is per element); they differ from IEEE only below that
// scale. Returns whether flushing was on before; a no-op off x86.
#pragma once
#if defined(__x86_64__) || defined(__SSE2__)
#include <xmmintrin.h>
#endif

namespace tshard {

inline bool flush_denormals(bool on = true) {
#if defined(__x86_64__) || defined(__SSE2__)
  constexpr unsigned bits = 0x8040;  // FTZ (bit 15) and DAZ (bit 6)
  const unsigned csr = _mm_getcsr();
  _mm_setcsr(on ? (csr | bits) : (csr & ~bits));
  return (csr & bits) == bits;
#else
  (void)on;
  return false;
#endif
}

}  // namespace tshard

namespace tshard::nn {
using tshard::flush_denormals;
}  // namespace tshard::nn
