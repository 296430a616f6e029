// Products in every orientation through the typed API against a serial einsum, on every 2-D
// mesh of the world size with uneven shapes, and the local GEMM's transpose flags.
#include "test_support.hpp"

namespace ts = tshard;
namespace d = tshard::detail;
using namespace tshard_test;

namespace {

// A global tensor of the given shape with distinct, smooth values.
template <std::size_t R>
Eigen::Tensor<double, int(R)> smooth(const std::array<Eigen::Index, R>& shape, int salt) {
  Eigen::Tensor<double, int(R)> t(shape);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = std::cos(double(i * 3 + salt)) + 0.01 * salt;
  return t;
}

template <class T, int R>
std::vector<double> as_vector(const Eigen::Tensor<T, R>& t) {
  return std::vector<double>(t.data(), t.data() + t.size());
}

template <ts::FixedString Eq, std::size_t RA, std::size_t RB, std::size_t RO, class SpecA, class SpecB>
void check_product(M2& mesh, const std::array<Eigen::Index, RA>& sa, const std::array<Eigen::Index, RB>& sb,
                   const std::array<Eigen::Index, RO>& so, bool in_place) {
  const auto ga = smooth<RA>(sa, 1), gb = smooth<RB>(sb, 2);
  constexpr auto e = d::parse_einsum(Eq);
  const auto want = serial_einsum(e, d::to_extents(sa), as_vector(ga), d::to_extents(sb), as_vector(gb), d::to_extents(so));
  auto a = ts::distribute<SpecA>(mesh, ga);
  auto b = ts::distribute<SpecB>(mesh, gb);
  auto c = ts::einsum<Eq>(a, b);
  const std::string why = ts::explain_einsum<Eq>(a, b);
  INFO(Eq.view() << ": a " << a.describe() << ", b " << b.describe() << ": " << why);
  const auto got = c.gather();
  TS_REQUIRE_ALL(as_vector(got).size() == want.size());
  double worst = 0;
  for (std::size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(got.data()[i] - want[i]));
  TS_REQUIRE_ALL(worst < 1e-10);
  // Replicated operands multiply where they lie: no operand copied where a flag expresses it.
  if constexpr (std::is_same_v<SpecA, ts::Replicated<int(RA)>> && std::is_same_v<SpecB, ts::Replicated<int(RB)>>)
    TS_REQUIRE_ALL((why.find("copied") == std::string::npos) == in_place);
}

using Specs3 = TypeList<ts::Replicated<3>, ts::Spec<ts::S<"x">, ts::R, ts::S<"y">>, ts::Spec<ts::R, ts::R, ts::S<"x", "y">>>;

template <ts::FixedString Eq, class SpecsA, class SpecsB, std::size_t RA, std::size_t RB, std::size_t RO>
void check_products(M2& mesh, std::array<Eigen::Index, RA> sa, std::array<Eigen::Index, RB> sb,
                    std::array<Eigen::Index, RO> so, bool in_place) {
  for_each_pair(SpecsA{}, SpecsB{}, [&]<class SA, class SB>(SA*, SB*) {
    check_product<Eq, RA, RB, RO, SA, SB>(mesh, sa, sb, so, in_place);
  });
}

using Specs1 = TypeList<ts::Spec<ts::R>, ts::Spec<ts::S<"x">>, ts::Spec<ts::S<"y">>, ts::Spec<ts::S<"y", "x">>>;

}  // namespace

TEST_CASE("products in every orientation equal the serial einsum, and read their operands in place", "[model-ops][matmul]") {
  on_every_mesh([](M2& mesh, auto) {
    using A2 = std::array<Eigen::Index, 2>;
    using A3 = std::array<Eigen::Index, 3>;
    check_products<"ij,jk->ik", Specs2, Specs2>(mesh, A2{7, 5}, A2{5, 6}, A2{7, 6}, true);
    check_products<"ij,kj->ik", Specs2, Specs2>(mesh, A2{7, 5}, A2{6, 5}, A2{7, 6}, true);
    check_products<"ji,jk->ik", Specs2, Specs2>(mesh, A2{5, 7}, A2{5, 6}, A2{7, 6}, true);
    check_products<"ji,kj->ik", Specs2, Specs2>(mesh, A2{5, 7}, A2{6, 5}, A2{7, 6}, true);
    check_products<"ij,jk->ki", Specs2, Specs2>(mesh, A2{7, 5}, A2{5, 6}, A2{6, 7}, true);
    check_products<"ijb,jkb->ikb", Specs3, Specs3>(mesh, A3{7, 5, 3}, A3{5, 6, 3}, A3{7, 6, 3}, true);
    // Column-major "bij": the batch dim is the fastest, so no matrix dim has unit stride.
    check_products<"bij,bjk->bik", Specs3, Specs3>(mesh, A3{3, 7, 5}, A3{3, 5, 6}, A3{3, 7, 6}, false);
    check_products<"ibj,jbk->ikb", Specs3, Specs3>(mesh, A3{7, 3, 5}, A3{5, 3, 6}, A3{7, 6, 3}, true);
    check_products<"ijk,jkl->il", Specs3, Specs3>(mesh, A3{7, 5, 3}, A3{5, 3, 4}, A2{7, 4}, true);
    check_products<"ibj,jbk->bki", Specs3, Specs3>(mesh, A3{7, 3, 5}, A3{5, 3, 6}, A3{3, 6, 7}, false);
    check_products<"ij,j->i", Specs2, Specs1>(mesh, A2{7, 5}, std::array<Eigen::Index, 1>{5},
                                              std::array<Eigen::Index, 1>{7}, true);
  });
}

TEST_CASE("local GEMMs with transpose flags equal a naive product for every flag pair", "[model-ops][matmul]") {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool acc : {false, true}) {
        const d::Index m = 5, n = 4, k = 3, lda = 9, ldb = 8, ldc = 7;
        std::vector<double> a(lda * 9), b(ldb * 9), c(ldc * n, 0.5), want = c;
        for (std::size_t i = 0; i < a.size(); ++i) a[i] = std::sin(double(i));
        for (std::size_t i = 0; i < b.size(); ++i) b[i] = std::cos(double(i));
        for (d::Index i = 0; i < m; ++i)
          for (d::Index j = 0; j < n; ++j) {
            double s = acc ? want[i + j * ldc] : 0;
            for (d::Index p = 0; p < k; ++p) s += a[ta ? p + i * lda : i + p * lda] * b[tb ? j + p * ldb : p + j * ldb];
            want[i + j * ldc] = s;
          }
        d::gemm<double>(ta, tb, m, n, k, a.data(), lda, b.data(), ldb, c.data(), ldc, acc);
        double worst = 0;
        for (std::size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::abs(c[i] - want[i]));
        INFO("trans_a " << ta << ", trans_b " << tb << ", accumulate " << acc << ", backend " << ts::local_gemm_backend());
        REQUIRE(worst < 1e-12);
      }
}

