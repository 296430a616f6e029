// Host scalars (dot, norm, item) against serial sums of the gathered values, fused updates against
// the serial loop, and the Krylov solvers against a dense direct solve and against their own
// one-rank run, on every 2-D mesh of the world size with shapes that do not divide.
#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <complex>
#include <limits>

#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;

namespace {

double value_at(Eigen::Index i, Eigen::Index j, int salt) { return std::sin(0.7 * double(i) + 1.3 * double(j) + salt) + 0.1 * salt; }

template <class Spec, class M>
auto field(const M& mesh, int salt) {
  return ts::from_function<double, Spec>(mesh, {7, 5}, [=](auto i) { return value_at(i[0], i[1], salt); });
}

double relative(double got, double want) { return std::abs(got - want) / std::max(1.0, std::abs(want)); }

}  // namespace

TEST_CASE("dot, norm and item equal the serial sums on every mesh and layout", "[solvers]") {
  using RR = ts::Spec<ts::R, ts::R>;
  using XR = ts::Spec<ts::S<"x">, ts::R>;
  using YX = ts::Spec<ts::S<"y">, ts::S<"x">>;
  using XY = ts::Spec<ts::S<"x", "y">, ts::R>;
  double ab = 0, aa = 0, a1 = 0, amax = 0;
  for (Eigen::Index j = 0; j < 5; ++j)
    for (Eigen::Index i = 0; i < 7; ++i) {
      const double a = value_at(i, j, 1), b = value_at(i, j, 2);
      ab += a * b;
      aa += a * a;
      a1 += std::abs(a);
      amax = std::max(amax, std::abs(a));
    }
  on_every_mesh([&](M2& mesh, const std::vector<int>&) {
    auto check = [&](auto a, auto b) {
      TS_REQUIRE_ALL(relative(ts::dot(a, b), ab) < 1e-13);
      TS_REQUIRE_ALL(relative(ts::dot(2.0 * a, b * 3.0), 6 * ab) < 1e-13);  // the factors read as they lie
      TS_REQUIRE_ALL(relative(ts::norm(a), std::sqrt(aa)) < 1e-13);
      TS_REQUIRE_ALL(relative(ts::norm(a, 1), a1) < 1e-13);
      TS_REQUIRE_ALL(ts::norm(-2.0 * a, ts::inf) == 2 * amax);
      TS_REQUIRE_ALL(relative(ts::sum<0, 1>(a * b).item(), ab) < 1e-13);  // a partial, summed by item()
      TS_REQUIRE_ALL(relative(ts::sum<0>(ts::sum<1>(a)).item(), ts::sum<0, 1>(a).item()) < 1e-13);
    };
    check(field<XR>(mesh, 1), field<XR>(mesh, 2));
    check(field<YX>(mesh, 1), field<XY>(mesh, 2));  // b aligned to a's layout
    check(field<RR>(mesh, 1), field<YX>(mesh, 2));
    check(field<XY>(mesh, 1), field<RR>(mesh, 2));

    // Partial sums on both sides (an einsum over a split contraction, times the identity) are
    // summed first, scalars and all.
    {
      auto eye = ts::from_function<double, ts::Spec<ts::S<"y">, ts::R>>(mesh, {5, 5}, [](auto i) { return double(i[0] == i[1]); });
      auto pa = ts::einsum<"ij,jk->ik">(field<XY>(mesh, 1), eye), pb = ts::einsum<"ij,jk->ik">(field<XY>(mesh, 2), eye);
      TS_REQUIRE_ALL(relative(ts::dot(pa, pb), ab) < 1e-13);
      TS_REQUIRE_ALL(relative(ts::dot(0.5 * pa, field<YX>(mesh, 2)), 0.5 * ab) < 1e-13);
      TS_REQUIRE_ALL(relative(ts::norm(pa), std::sqrt(aa)) < 1e-13);
    }

    // Complex: the inner product conjugates its left side.
    using C = std::complex<double>;
    auto za = ts::from_function<C, YX>(mesh, {7, 5}, [](auto i) { return C(value_at(i[0], i[1], 1), value_at(i[0], i[1], 3)); });
    auto zb = ts::from_function<C, XR>(mesh, {7, 5}, [](auto i) { return C(value_at(i[0], i[1], 2), -0.5); });
    C want = 0;
    for (Eigen::Index j = 0; j < 5; ++j)
      for (Eigen::Index i = 0; i < 7; ++i)
        want += std::conj(C(value_at(i, j, 1), value_at(i, j, 3))) * C(value_at(i, j, 2), -0.5);
    TS_REQUIRE_ALL(std::abs(ts::dot(za, zb) - want) < 1e-12);
    TS_REQUIRE_ALL(std::abs(ts::norm(za) - std::sqrt(std::real(ts::dot(za, za)))) < 1e-12);

    // Floats are summed in double: 8000 products of 1 + 2^-12, which a float sum loses past 4096
    // (its spacing there is 2^-11), add up exactly in double on any split.
    const float big = 1.0f + 0x1p-12f;
    auto fa = ts::from_function<float, YX>(mesh, {80, 100}, [=](auto) { return big; });
    auto fb = ts::from_function<float, XR>(mesh, {80, 100}, [](auto) { return 1.0f; });
    TS_REQUIRE_ALL(double(ts::dot(fa, fb)) == 8000.0 * double(big));

    // Under Forbid, a second operand already in place moves nothing; one that would move is refused.
    ts::implicit_communication() = ts::ImplicitCommunication::Forbid;
    const std::string aligned = error_text([&] { (void)ts::dot(field<XR>(mesh, 1), field<XR>(mesh, 2)); });
    const std::string moved = error_text([&] { (void)ts::dot(field<XR>(mesh, 1), field<YX>(mesh, 2)); });
    ts::implicit_communication() = ts::ImplicitCommunication::Allow;
    TS_REQUIRE_ALL(aligned.empty());
    TS_REQUIRE_ALL(moved.find("implicit communication is forbidden") != std::string::npos || mesh.size() == 1);

    // A tracked tensor is refused: a number carries no gradient.
    const std::string tracked = error_text([&] {
      (void)ts::ad::grad([](const auto& x) { return ts::sum<0, 1>(x * ts::dot(x, x)); }, field<XR>(mesh, 1));
    });
    TS_REQUIRE_ALL(tracked.find("tshard::dot: ") == 0 && tracked.find("cannot carry a gradient") != std::string::npos);

    // A NaN anywhere gives NaN for every norm on every rank (here the first element, which a
    // running max compared with < or <= would drop at the next one).
    const auto with_nan = ts::from_function<double, YX>(mesh, {7, 5}, [](auto i) {
      return i[0] == 0 && i[1] == 0 ? std::numeric_limits<double>::quiet_NaN() : 1.0;
    });
    TS_REQUIRE_ALL(std::isnan(ts::norm(with_nan, ts::inf)) && std::isnan(ts::norm(with_nan)) &&
                   std::isnan(ts::norm(with_nan, 1)));

    // Bad input: every rank gives the same sentence.
    auto a = field<XR>(mesh, 1);
    auto wide = ts::from_function<double, XR>(mesh, {8, 5}, [](auto) { return 1.0; });
    TS_REQUIRE_ALL(error_text([&] { (void)ts::dot(a, wide); }).find("shapes differ") != std::string::npos);
    TS_REQUIRE_ALL(error_text([&] { (void)ts::norm(a, 3); }).find("1, 2 or ts::inf") != std::string::npos);
  });
}

TEST_CASE("update writes several tensors in one pass as the serial loop does, on every mesh", "[solvers]") {
  using XR = ts::Spec<ts::S<"x">, ts::R>;
  using YX = ts::Spec<ts::S<"y">, ts::S<"x">>;
  using XY = ts::Spec<ts::S<"x", "y">, ts::R>;
  const double a = 0.37, beta = -1.25;
  on_every_mesh([&](M2& mesh, const std::vector<int>& sizes) {
    auto x = field<XR>(mesh, 1), r = field<XR>(mesh, 2);
    const auto p = field<YX>(mesh, 3);
    const auto q = field<XY>(mesh, 4);
    Eigen::Tensor<double, 2> xs = x.gather(), rs = r.gather(), ps = p.gather(), qs = q.gather();
    const double* before = x.data();

    // CG's two updates: x += a p, r -= a q, p and q aligned to x's layout first.
    ts::update<2>([a](double& xi, double& ri, double pi, double qi) { xi += a * pi; ri -= a * qi; }, x, r, p, q);
    Eigen::Tensor<double, 2> x_want = xs + a * ps, r_want = rs - a * qs;
    TS_REQUIRE_ALL(compare(x.gather(), x_want, 1e-15) == "");
    TS_REQUIRE_ALL(compare(r.gather(), r_want, 1e-15) == "");
    TS_REQUIRE_ALL(x.data() == before);  // in place: the output keeps its buffer

    // f returning a number: update sums it over the elements (r's squared norm in the pass that
    // writes r), once for an output split over the mesh and once for one every rank holds whole.
    {
      using RR = ts::Spec<ts::R, ts::R>;
      const Eigen::Tensor<double, 2> want = rs - 0.5 * qs;
      const Eigen::Tensor<double, 0> want_sum = want.square().sum();
      auto split = field<XR>(mesh, 2);
      auto whole = field<RR>(mesh, 2);
      auto step = [](double& ri, double qi) {
        ri -= 0.5 * qi;
        return ri * ri;
      };
      const double s_split = ts::update<1>(step, split, q), s_whole = ts::update<1>(step, whole, q);
      TS_REQUIRE_ALL(compare(split.gather(), want, 1e-15) == "" && compare(whole.gather(), want, 1e-15) == "");
      TS_REQUIRE_ALL(relative(s_split, want_sum()) < 1e-13 && relative(s_whole, want_sum()) < 1e-13);
    }

    // An integer return counts, summed in 64 bits.
    {
      auto y = field<XR>(mesh, 7);
      const int positive = ts::update<1>([](double&, double pi) { return pi > 0 ? 1 : 0; }, y, p);
      int want = 0;
      for (Eigen::Index n = 0; n < ps.size(); ++n) want += ps.data()[n] > 0;
      TS_REQUIRE_ALL(positive == want);
    }

    // An output read through its reference and an input of another layout: p = r + beta p.
    auto pp = field<XR>(mesh, 3);
    ts::update<1>([beta](double& pi, double ri) { pi = ri + beta * pi; }, pp, r);
    Eigen::Tensor<double, 2> p_want = r_want + beta * ps;
    TS_REQUIRE_ALL(compare(pp.gather(), p_want, 1e-15) == "");

    // map into an existing tensor, a partial input summed first.
    auto y = field<YX>(mesh, 5);
    auto partial = ts::einsum<"ij,jk->ik">(field<XY>(mesh, 6), ts::from_function<double, ts::Spec<ts::S<"y">, ts::R>>(
                                                                   mesh, {5, 5}, [](auto i) { return double(i[0] == i[1]); }));
    ts::map_into(y, [](double u, double v) { return u * v - 1; }, p, partial);
    Eigen::Tensor<double, 2> y_want = ps * field<XY>(mesh, 6).gather() - 1.0;
    TS_REQUIRE_ALL(compare(y.gather(), y_want, 1e-14) == "");

    // Inputs already laid out as the outputs move nothing, so Forbid lets them through; a
    // misaligned one is refused on every rank.
    ts::implicit_communication() = ts::ImplicitCommunication::Forbid;
    const std::string aligned = error_text([&] { ts::update<1>([](double& xi, double ri) { xi -= ri; }, x, r); });
    const std::string misaligned = error_text([&] { ts::update<1>([](double& xi, double pi) { xi -= pi; }, x, p); });
    ts::implicit_communication() = ts::ImplicitCommunication::Allow;
    TS_REQUIRE_ALL(aligned.empty());
    TS_REQUIRE_ALL(misaligned.find("implicit communication is forbidden") != std::string::npos ||
                   (sizes[0] == 1 && sizes[1] == 1));
    // (On one rank nothing moves, so the second update ran too; a refused one wrote nothing.)
    Eigen::Tensor<double, 2> x_now = x_want - r_want;
    if (misaligned.empty()) x_now -= ps;
    TS_REQUIRE_ALL(compare(x.gather(), x_now, 1e-15) == "");

    auto wide = ts::from_function<double, XR>(mesh, {8, 5}, [](auto) { return 1.0; });
    TS_REQUIRE_ALL(error_text([&] { ts::update<1>([](double& xi, double w) { xi += w; }, x, wide); })
                       .find("shapes differ") != std::string::npos);
  });
}

namespace {

using Vec = ts::ShardedTensor<double, M2, ts::Spec<ts::S<"x">, ts::S<"y">, ts::R>>;
constexpr Eigen::Index kNx = 9, kNy = 7, kNz = 5;

// A 7-point operator with a varying diagonal (so Jacobi does something) and, where `wind` is not
// zero, a centred first difference along x (nonsymmetric), zero beyond the grid.
double diagonal_at(const std::array<Eigen::Index, 3>& i) { return 6.5 + 0.5 * std::cos(double(i[0] + 2 * i[1] + 3 * i[2])); }

auto make_operator(double wind) {
  return [wind](const Vec& u) {
    return ts::stencil(u, {1, 1, 1}, ts::Boundary::Zero, [wind](const ts::StencilView<double, 3>& v, const std::array<Eigen::Index, 3>& i) {
      return diagonal_at(i) * v(0, 0, 0) - v(-1, 0, 0) - v(1, 0, 0) - v(0, -1, 0) - v(0, 1, 0) - v(0, 0, -1) -
             v(0, 0, 1) + wind * (v(1, 0, 0) - v(-1, 0, 0));
    });
  };
}

// The same operator as a dense matrix over the column-major unknowns, and its direct solution.
Eigen::VectorXd direct_solution(double wind, const Eigen::VectorXd& b) {
  const Eigen::Index n = kNx * kNy * kNz;
  Eigen::MatrixXd A = Eigen::MatrixXd::Zero(n, n);
  auto at = [](Eigen::Index i, Eigen::Index j, Eigen::Index k) { return i + kNx * (j + kNy * k); };
  for (Eigen::Index k = 0; k < kNz; ++k)
    for (Eigen::Index j = 0; j < kNy; ++j)
      for (Eigen::Index i = 0; i < kNx; ++i) {
        const Eigen::Index row = at(i, j, k);
        A(row, row) = diagonal_at({i, j, k});
        auto add = [&](Eigen::Index a, Eigen::Index bb, Eigen::Index c, double w) {
          if (a >= 0 && a < kNx && bb >= 0 && bb < kNy && c >= 0 && c < kNz) A(row, at(a, bb, c)) += w;
        };
        add(i - 1, j, k, -1 - wind);
        add(i + 1, j, k, -1 + wind);
        for (Eigen::Index o : {-1, 1}) {
          add(i, j + o, k, -1);
          add(i, j, k + o, -1);
        }
      }
  return A.partialPivLu().solve(b);
}

double rhs_at(Eigen::Index i, Eigen::Index j, Eigen::Index k) { return std::sin(double(i) + 0.5 * double(j)) + 0.1 * double(k); }

struct Run {
  ts::solvers::Result result;
  Eigen::Tensor<double, 3> x;
  int monitored = 0;
};

template <class Solve>
Run solve_on(const M2& mesh, Solve&& solve) {
  const Vec b = ts::from_function<double, Vec::SpecType>(mesh, {kNx, kNy, kNz}, [](auto i) { return rhs_at(i[0], i[1], i[2]); });
  Vec x = ts::zeros<double, Vec::SpecType>(mesh, {kNx, kNy, kNz});
  Run run;
  ts::solvers::Options o;
  o.rtol = 1e-11;
  o.restart = 8;
  o.monitor = [&](int it, double r) {
    if (it == run.monitored && r >= 0) ++run.monitored;
  };
  run.result = solve(b, x, o);
  run.x = x.gather();
  return run;
}

}  // namespace

TEST_CASE("CG, BiCGStab and GMRES give one rank's iterations and the direct solution on every mesh", "[solvers]") {
  Eigen::VectorXd rhs(kNx * kNy * kNz);
  for (Eigen::Index k = 0; k < kNz; ++k)
    for (Eigen::Index j = 0; j < kNy; ++j)
      for (Eigen::Index i = 0; i < kNx; ++i) rhs(i + kNx * (j + kNy * k)) = rhs_at(i, j, k);
  const Eigen::VectorXd symmetric = direct_solution(0, rhs), windy = direct_solution(0.8, rhs);

  using Solve = std::function<ts::solvers::Result(const Vec&, Vec&, const ts::solvers::Options&)>;
  auto jacobi_of = [](const Vec& like) {
    return ts::solvers::jacobi(ts::from_function<double, Vec::SpecType>(like.mesh(), {kNx, kNy, kNz}, [](auto i) {
      return diagonal_at({i[0], i[1], i[2]});
    }));
  };
  const std::vector<std::tuple<std::string, double, Solve>> cases = {
      {"cg", 0, [](const Vec& b, Vec& x, const auto& o) { return ts::solvers::cg(make_operator(0), b, x, o); }},
      {"cg+jacobi", 0, [&](const Vec& b, Vec& x, const auto& o) { return ts::solvers::cg(make_operator(0), b, x, o, jacobi_of(b)); }},
      {"bicgstab", 0.8, [](const Vec& b, Vec& x, const auto& o) { return ts::solvers::bicgstab(make_operator(0.8), b, x, o); }},
      {"bicgstab+jacobi", 0.8, [&](const Vec& b, Vec& x, const auto& o) { return ts::solvers::bicgstab(make_operator(0.8), b, x, o, jacobi_of(b)); }},
      {"gmres(8)", 0.8, [](const Vec& b, Vec& x, const auto& o) { return ts::solvers::gmres(make_operator(0.8), b, x, o); }},
      {"gmres(8)+jacobi", 0.8, [&](const Vec& b, Vec& x, const auto& o) { return ts::solvers::gmres(make_operator(0.8), b, x, o, jacobi_of(b)); }},
      {"gmres(8) symmetric", 0, [](const Vec& b, Vec& x, const auto& o) { return ts::solvers::gmres(make_operator(0), b, x, o); }},
  };
  const M2 one(MPI_COMM_SELF, {1, 1});
  for (const auto& [name, wind, solve] : cases) {
    INFO(name);
    const Run alone = solve_on(one, solve);
    const Eigen::VectorXd& direct = wind == 0 ? symmetric : windy;
    double error = 0;
    for (Eigen::Index n = 0; n < direct.size(); ++n) error = std::max(error, std::abs(alone.x.data()[n] - direct(n)));
    TS_REQUIRE_ALL(alone.result.converged);
    TS_REQUIRE_ALL(alone.result.reason == "converged");
    TS_REQUIRE_ALL(error < 1e-8 * direct.cwiseAbs().maxCoeff());
    TS_REQUIRE_ALL(alone.monitored == int(alone.result.residuals.size()));
    TS_REQUIRE_ALL(alone.result.iterations > 3);
    on_every_mesh([&](M2& mesh, const std::vector<int>& sizes) {
      INFO("mesh " << sizes[0] << "x" << sizes[1]);
      const Run run = solve_on(mesh, solve);
      TS_REQUIRE_ALL(run.result.iterations == alone.result.iterations);
      TS_REQUIRE_ALL(run.result.residuals.size() == alone.result.residuals.size());
      TS_REQUIRE_ALL(run.monitored == int(run.result.residuals.size()));
      TS_REQUIRE_ALL(compare(run.x, alone.x, 1e-9) == "");
    });
  }
}

TEST_CASE("the solvers stop at max_iterations and refuse bad options on every rank", "[solvers]") {
  on_every_mesh([&](M2& mesh, const std::vector<int>&) {
    const Vec b = ts::from_function<double, Vec::SpecType>(mesh, {kNx, kNy, kNz}, [](auto i) { return rhs_at(i[0], i[1], i[2]); });
    Vec x = ts::zeros<double, Vec::SpecType>(mesh, {kNx, kNy, kNz});
    ts::solvers::Options o;
    o.rtol = 1e-14;
    o.max_iterations = 3;
    const auto r = ts::solvers::cg(make_operator(0), b, x, o);
    TS_REQUIRE_ALL((!r.converged && r.iterations == 3 && r.reason == "iterations" && r.residuals.size() == 4));
    TS_REQUIRE_ALL(r.residuals.back() < r.residuals.front());
    o.restart = 0;
    TS_REQUIRE_ALL(error_text([&] { ts::solvers::gmres(make_operator(0), b, x, o); }).find("restart") != std::string::npos);
    using Other = ts::ShardedTensor<double, M2, ts::Spec<ts::S<"x">, ts::S<"y">, ts::R>>;
    Other small = ts::zeros<double, Vec::SpecType>(mesh, {kNx, kNy, kNz - 1});
    TS_REQUIRE_ALL(error_text([&] { ts::solvers::cg(make_operator(0), b, small); }).find("differ in shape") != std::string::npos);
  });
}

TEST_CASE("the solvers take complex vectors: each part of the solution is the direct solve of that part", "[solvers]") {
  using C = std::complex<double>;
  using CVec = ts::ShardedTensor<C, M2, Vec::SpecType>;
  auto imag_at = [](Eigen::Index i, Eigen::Index j, Eigen::Index k) { return 0.5 * std::cos(double(k) - 0.3 * double(i * j)); };
  Eigen::VectorXd re(kNx * kNy * kNz), im(kNx * kNy * kNz);
  for (Eigen::Index k = 0; k < kNz; ++k)
    for (Eigen::Index j = 0; j < kNy; ++j)
      for (Eigen::Index i = 0; i < kNx; ++i) {
        re(i + kNx * (j + kNy * k)) = rhs_at(i, j, k);
        im(i + kNx * (j + kNy * k)) = imag_at(i, j, k);
      }
  // A real operator on complex vectors: Hermitian where it is symmetric (wind 0), so CG applies.
  auto op = [](double wind) {
    return [wind](const CVec& u) {
      return ts::stencil(u, {1, 1, 1}, ts::Boundary::Zero, [wind](const ts::StencilView<C, 3>& v, const std::array<Eigen::Index, 3>& i) {
        return diagonal_at(i) * v(0, 0, 0) - v(-1, 0, 0) - v(1, 0, 0) - v(0, -1, 0) - v(0, 1, 0) - v(0, 0, -1) -
               v(0, 0, 1) + wind * (v(1, 0, 0) - v(-1, 0, 0));
      });
    };
  };
  on_every_mesh([&](M2& mesh, const std::vector<int>& sizes) {
    const CVec b = ts::from_function<C, Vec::SpecType>(mesh, {kNx, kNy, kNz}, [&](auto i) {
      return C(rhs_at(i[0], i[1], i[2]), imag_at(i[0], i[1], i[2]));
    });
    ts::solvers::Options o;
    o.rtol = 1e-11;
    o.restart = 8;
    for (const double wind : {0.0, 0.8}) {
      const Eigen::VectorXd want_re = direct_solution(wind, re), want_im = direct_solution(wind, im);
      for (const std::string name : {"cg", "bicgstab", "gmres"}) {
        if (name == "cg" && wind != 0) continue;
        CVec x = ts::zeros<C, Vec::SpecType>(mesh, {kNx, kNy, kNz});
        const auto r = name == "cg"         ? ts::solvers::cg(op(wind), b, x, o)
                       : name == "bicgstab" ? ts::solvers::bicgstab(op(wind), b, x, o)
                                            : ts::solvers::gmres(op(wind), b, x, o);
        const Eigen::Tensor<C, 3> got = x.gather();
        double error = 0;
        for (Eigen::Index n = 0; n < got.size(); ++n)
          error = std::max(error, std::abs(got.data()[n] - C(want_re(n), want_im(n))));
        INFO(name << " wind " << wind << " on mesh " << sizes[0] << "x" << sizes[1] << ": error " << error);
        TS_REQUIRE_ALL(r.converged && error < 1e-8);
      }
    }
  });
}
