// The hot kernels' instruction-set levels (core/dispatch.hpp): the level that runs is the one
// TSHARD_CPU_CAPABILITY names, else the CPU's highest; every level tshard::kernels holds is
// registered, and each computes what the running level computes, to rounding (double). The suite
// also runs the operator, layer and attention tests with each level forced (tests/CMakeLists.txt).
#include "test_support.hpp"

#include <cstdlib>
#include <random>

#include "tshard/core/dispatch.hpp"

namespace ts = tshard;
using namespace tshard_test;
using tshard::detail::Extents;
using tshard::detail::Index;
using tshard::detail::IsaEntries;

namespace {

// Whether this build holds per-ISA objects (TSHARD_TEST_DISPATCH: x86-64 with GCC or Clang).
#if defined(TSHARD_TEST_DISPATCH) && TSHARD_TEST_DISPATCH
constexpr bool kLevelsBuilt = true;
#else
constexpr bool kLevelsBuilt = false;
#endif

std::vector<double> random_values(std::size_t n, unsigned seed, double lo = -2, double hi = 2) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(gen);
  return v;
}

double largest_relative_difference(const std::vector<double>& a, const std::vector<double>& b) {
  double worst = a.size() == b.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    const double scale = std::max({1.0, std::abs(a[i]), std::abs(b[i])});
    worst = std::max(worst, std::abs(a[i] - b[i]) / scale);
  }
  return worst;
}

// run(kernel) calls a kernel of Kernel's type on fixed inputs and returns its outputs. Each level
// above baseline is registered where the build holds it, and each the CPU runs, called directly,
// gives what Kernel (the level that runs) gives.
template <auto Kernel, class Run>
void check_every_level(const char* name, Run&& run) {
  const std::vector<double> want = run(Kernel);
  for (int level = 1; level < ts::kCpuCapabilities; ++level) {
    const auto entry = IsaEntries<Kernel>::entry[level];
    INFO(name << " at " << ts::to_string(ts::CpuCapability(level)));
    if (kLevelsBuilt) CHECK(entry != nullptr);
    if (!entry || level > int(ts::detected_cpu_capability())) continue;
    CHECK(largest_relative_difference(run(entry), want) <= 1e-12);
  }
}

Extents extents(std::initializer_list<Index> e) {
  Extents x{};
  int d = 0;
  for (const Index v : e) x[d++] = v;
  return x;
}

}  // namespace

TEST_CASE("tshard::kernels runs the level TSHARD_CPU_CAPABILITY names, else the CPU's highest", "[dispatch]") {
  ts::CpuCapability want = kLevelsBuilt ? ts::detected_cpu_capability() : ts::compiled_cpu_capability();
  const char* forced = std::getenv("TSHARD_CPU_CAPABILITY");
  if (kLevelsBuilt && forced && *forced) want = *ts::detail::parse_cpu_capability(forced);
  INFO("TSHARD_CPU_CAPABILITY=" << (forced ? forced : "(unset)") << "; " << ts::kernels_report());
  CHECK(ts::cpu_capability() == want);
  CHECK(ts::cpu_capability_report().rfind(std::string("cpu capability: ") + ts::to_string(want) + " (", 0) == 0);
}

TEST_CASE("every level of the elementwise, reduction and optimizer kernels computes what the running level does",
          "[dispatch]") {
  using namespace tshard::detail;
  const Index n = 1000;
  const auto a = random_values(static_cast<std::size_t>(n), 1), b = random_values(static_cast<std::size_t>(n), 2), c = random_values(97, 3);
  using Binary = void (*)(BinaryKind, double*, const Extents&, const double*, const Extents&, double, const double*,
                          const Extents&, double, int);
  for (const BinaryKind k : {BinaryKind::Add, BinaryKind::Sub, BinaryKind::Mul, BinaryKind::Div})
    check_every_level<&binary_kernel<double>>("binary_kernel", [&](Binary f) {
      // [97, 10] (op) a [97, 10] broadcast against c [97, 1], scaled operands
      std::vector<double> out(970);
      f(k, out.data(), extents({97, 10}), a.data(), extents({97, 10}), 0.5, c.data(), extents({97, 1}), 2.0, 2);
      return out;
    });
  using Unary = void (*)(UnaryKind, const double*, double*, Index);
  for (const UnaryKind k : {UnaryKind::Exp, UnaryKind::Tanh, UnaryKind::Sigmoid, UnaryKind::Relu, UnaryKind::Square,
                            UnaryKind::Abs})
    check_every_level<&unary_kernel<double>>("unary_kernel", [&](Unary f) {
      std::vector<double> out(static_cast<std::size_t>(n));
      f(k, a.data(), out.data(), n);
      return out;
    });
  using Scalar = void (*)(BinaryKind, bool, const double*, double, double*, Index);
  check_every_level<&scalar_kernel<double>>("scalar_kernel", [&](Scalar f) {
    std::vector<double> out(static_cast<std::size_t>(3 * n));
    f(BinaryKind::Add, false, a.data(), 0.25, out.data(), n);
    f(BinaryKind::Sub, true, a.data(), 0.25, out.data() + n, n);
    f(BinaryKind::Div, true, b.data(), 3.0, out.data() + 2 * n, n);
    return out;
  });
  using Reduce = void (*)(ts::ReduceOp, const double*, const ShardLayout&, const std::array<bool, kMaxRank>&, double*,
                          const Extents&, int);
  for (const ts::ReduceOp op : {ts::ReduceOp::Sum, ts::ReduceOp::Max})
    check_every_level<&reduce_kernel<double>>("reduce_kernel", [&](Reduce f) {
      // [20, 50] valid [17, 43] of a padded block, over dim 0 and over dim 1
      ShardLayout l;
      l.rank = 2;
      l.padded = extents({20, 50});
      l.valid = extents({17, 43});
      std::vector<double> out(20 + 50);
      f(op, a.data(), l, {true, false}, out.data(), extents({50}), 1);
      f(op, a.data(), l, {false, true}, out.data() + 50, extents({20}), 1);
      out.erase(out.begin() + 43, out.begin() + 50);  // (the output's padding)
      out.resize(43 + 17);
      return out;
    });
  using Adam = void (*)(const ts::optim::AdamWCoefficients&, double*, const double*, double*, double*, Index);
  check_every_level<&ts::optim::adamw_kernel<double>>("adamw_kernel", [&](Adam f) {
    std::vector<double> p = a, m(static_cast<std::size_t>(n), 0.1), v(static_cast<std::size_t>(n), 0.2);
    f({0.9, 0.999, 1e-8, 1 - 1e-5, 1e-3 / (1 - 0.9), std::sqrt(1 - 0.999)}, p.data(), b.data(), m.data(), v.data(), n);
    p.insert(p.end(), m.begin(), m.end());
    p.insert(p.end(), v.begin(), v.end());
    return p;
  });
  using Where = void (*)(double*, const Extents&, const unsigned char*, const Extents&, const double*, const Extents&,
                         const double*, const Extents&, int);
  check_every_level<&where_kernel<double>>("where_kernel", [&](Where f) {
    std::vector<unsigned char> mask(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < mask.size(); ++i) mask[i] = a[i] > 0;
    std::vector<double> out(static_cast<std::size_t>(n));
    f(out.data(), extents({n}), mask.data(), extents({n}), a.data(), extents({n}), b.data(), extents({n}), 1);
    return out;
  });
}

TEST_CASE("every level of gelu, layer norm and fused attention computes what the running level does", "[dispatch]") {
  using namespace tshard::nn::detail;
  const Index n = 777;
  const auto x = random_values(static_cast<std::size_t>(n), 4), g = random_values(static_cast<std::size_t>(n), 5);
  using Gelu = void (*)(double*, const double*, Index);
  check_every_level<&gelu_run<double>>("gelu_run", [&](Gelu f) {
    std::vector<double> out(static_cast<std::size_t>(n));
    f(out.data(), x.data(), n);
    return out;
  });
  using GeluBack = void (*)(double*, const double*, const double*, Index);
  check_every_level<&gelu_backward_run<double>>("gelu_backward_run", [&](GeluBack f) {
    std::vector<double> out(static_cast<std::size_t>(n));
    f(out.data(), x.data(), g.data(), n);
    return out;
  });
  const Index rows = 37, h = 21;  // x [rows, h], column-major
  const auto gamma = random_values(static_cast<std::size_t>(h), 6), beta = random_values(static_cast<std::size_t>(h), 7);
  using Norm = void (*)(const double*, Index, Index, double, const double*, const double*, double*);
  check_every_level<&layer_norm_rows<double, double>>("layer_norm_rows", [&](Norm f) {
    std::vector<double> out(static_cast<std::size_t>(rows * h));
    f(x.data(), rows, h, 1e-5, gamma.data(), beta.data(), out.data());
    return out;
  });
  using NormBack = void (*)(const double*, Index, Index, Index, double, const double*, const double*, const double*,
                            double*, double*, double*);
  check_every_level<&layer_norm_backward_rows<double, double>>("layer_norm_backward_rows", [&](NormBack f) {
    std::vector<double> counted(static_cast<std::size_t>(rows), 1.0), out(static_cast<std::size_t>(rows * h + 2 * h));
    counted[3] = 0;  // a padding row
    f(x.data(), rows, h, h, 1e-5, gamma.data(), g.data(), counted.data(), out.data(), out.data() + rows * h,
      out.data() + rows * h + h);
    return out;
  });
  // One head of 2 query groups: T 150 queries over S 150 keys (blocks of 64 x 128 and their
  // tails), head dim 19 (packets and columns past them), causal with a window, and bidirectional.
  const Index T = 150, S = 150, D = 19, G = 2;
  const auto q = random_values(static_cast<std::size_t>(G * T * D), 8), k = random_values(static_cast<std::size_t>(S * D), 9),
             v = random_values(static_cast<std::size_t>(S * D), 10), dout = random_values(static_cast<std::size_t>(G * T * D), 11);
  for (const bool causal : {true, false}) {
    AttentionGeometry geo{T, S, causal, causal ? 40 : 0, causal ? S - T : 0, 0};
    using Forward = void (*)(const double*, const double*, const double*, Index, Index, const AttentionGeometry&, double,
                             double*, double*);
    std::vector<double> o(static_cast<std::size_t>(G * T * D)), lse(static_cast<std::size_t>(G * T));
    attention_forward_head_kernel<double>(q.data(), k.data(), v.data(), D, G, geo, 0.3, o.data(), lse.data());
    check_every_level<&attention_forward_head_kernel<double>>("attention_forward_head_kernel", [&](Forward f) {
      std::vector<double> out(static_cast<std::size_t>(G * T * D + G * T));
      f(q.data(), k.data(), v.data(), D, G, geo, 0.3, out.data(), out.data() + G * T * D);
      return out;
    });
    using Backward = void (*)(const double*, const double*, const double*, const double*, const double*,
                              const double*, Index, Index, const AttentionGeometry&, double, double*, double*, double*);
    check_every_level<&attention_backward_head_kernel<double>>("attention_backward_head_kernel", [&](Backward f) {
      std::vector<double> out(static_cast<std::size_t>(G * T * D + 2 * S * D));
      f(q.data(), k.data(), v.data(), o.data(), dout.data(), lse.data(), D, G, geo, 0.3, out.data(),
        out.data() + G * T * D, out.data() + G * T * D + S * D);
      return out;
    });
  }
}
