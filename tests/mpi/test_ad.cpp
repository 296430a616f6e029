// Derived gradients (ts::ad) of every operator: on every 2-D mesh of the world size, with shapes
// that do not divide, each gradient is checked two ways. (1) Against central finite
// differences: the directional derivative <grad, v> along a random direction v, relative 1e-7
// in double. (2) Against the gradient of the same function on a one-rank mesh (each rank
// computes it alone on MPI_COMM_SELF), to 1e-12: the sharded program's gradient is the
// single-device one. Every gradient must also have its primal's exact type.
#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;

namespace {

using M = ts::Mesh<"x", "y">;

template <class R>
double value_of(const R& r) {
  if constexpr (ts::ad::is_scalar<R>::value)
    return double(r.value());
  else
    return double(Eigen::Tensor<typename R::Scalar, 0>(r.gather())());
}

// A global tensor of values in [-1, 1) from a seed: the same on every rank.
template <int Rank>
Eigen::Tensor<double, Rank> global_random(const std::array<Eigen::Index, Rank>& shape, unsigned seed,
                                          double lo = -1, double hi = 1) {
  Eigen::Tensor<double, Rank> t(shape);
  std::mt19937_64 gen(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = u(gen);
  return t;
}

template <class W>
W direction_like(const W& w, unsigned seed) {
  return ts::distribute<typename W::SpecType>(w.mesh(), global_random<W::rank>(w.global_shape(), seed));
}

template <class W>
double dot(const W& a, const W& b) {
  const auto x = a.gather(), y = b.gather();
  double s = 0;
  for (Eigen::Index i = 0; i < x.size(); ++i) s += double(x.data()[i]) * double(y.data()[i]);
  return s;
}

// value_and_grad of f at w..., checked against central differences along two random
// directions; returns the gathered gradients (for the comparison with one rank).
template <class F, class... W>
auto checked_gradients(const std::string& what, F&& f, const W&... w) {
  auto all = ts::ad::value_and_grad(f, w...);
  const double loss = std::get<0>(all);
  // Each gradient has its primal's exact type.
  [&]<std::size_t... I>(std::index_sequence<I...>) {
    static_assert((std::is_same_v<std::tuple_element_t<I + 1, decltype(all)>, W> && ...),
                  "a gradient has its primal's type");
  }(std::index_sequence_for<W...>{});
  TS_REQUIRE_ALL(std::abs(loss - value_of(f(w...))) <= 1e-12 * std::max(1.0, std::abs(loss)));
  for (unsigned trial = 0; trial < 2; ++trial) {
    const double h = 1e-5;
    auto dirs = std::make_tuple(direction_like(w, 1000 + 17 * trial + unsigned(W::rank))...);
    double analytic = 0;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((analytic += dot(std::get<I + 1>(all), std::get<I>(dirs))), ...);
    }(std::index_sequence_for<W...>{});
    auto shifted = [&](double s) {
      return [&]<std::size_t... I>(std::index_sequence<I...>) {
        return value_of(f(W(w + s * std::get<I>(dirs))...));
      }(std::index_sequence_for<W...>{});
    };
    const double numeric = (shifted(h) - shifted(-h)) / (2 * h);
    INFO(what << ": directional derivative " << analytic << " by the gradient, " << numeric
              << " by central differences (trial " << trial << ")");
    TS_REQUIRE_ALL(std::abs(analytic - numeric) <= 1e-7 * std::max(1.0, std::abs(numeric)));
  }
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    return std::make_tuple(std::get<I + 1>(all).gather()...);
  }(std::index_sequence_for<W...>{});
}

// Runs body(mesh) on every 2-D mesh of the world size and on a one-rank mesh, and requires the
// gathered gradients to agree to 1e-12.
template <class Body>
void on_every_mesh(const std::string& what, Body&& body) {
  const M single(MPI_COMM_SELF, {1, 1});
  const auto want = body(single);
  for (const auto& s : mesh_shapes(world_size(), 2)) {
    const M mesh({s[0], s[1]});
    INFO(what << " on mesh " << s[0] << "x" << s[1]);
    const auto got = body(mesh);
    std::string mismatch;
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      ((mismatch += compare(std::get<I>(got), std::get<I>(want), 1e-12)), ...);
    }(std::make_index_sequence<std::tuple_size_v<std::remove_cvref_t<decltype(want)>>>{});
    INFO("against one rank: " << mismatch);
    TS_REQUIRE_ALL(mismatch.empty());
  }
}

// w + 0.25: a second parameter value for a second forward.
struct W1Shift {
  template <class W>
  W operator()(const W& w) const {
    return W(w + 0.25);
  }
};
// [7, 6] -> [7, 6, 2] holding t and -0.5 t: summed over the last dim, 0.5 t (a cotangent that
// arrives as a partial sum once that dim is split).
struct Stack2 {
  Eigen::Tensor<double, 3> operator()(const Eigen::Tensor<double, 2>& t) const {
    Eigen::Tensor<double, 3> out(t.dimension(0), t.dimension(1), 2);
    for (Eigen::Index i = 0; i < t.dimension(0); ++i)
      for (Eigen::Index j = 0; j < t.dimension(1); ++j) {
        out(i, j, 0) = t(i, j);
        out(i, j, 1) = -0.5 * t(i, j);
      }
    return out;
  }
};

using XY = ts::Spec<ts::S<"x">, ts::S<"y">>;
using YX = ts::Spec<ts::S<"y">, ts::S<"x">>;
using XR = ts::Spec<ts::S<"x">, ts::R>;
using RY = ts::Spec<ts::R, ts::S<"y">>;
using RR = ts::Spec<ts::R, ts::R>;
using R1 = ts::Spec<ts::R>;
using Y1 = ts::Spec<ts::S<"y">>;

template <class X>
auto XRTensor(X&& x) {
  return ts::ShardedTensor<double, M, XR>(ts::reshard<XR>(std::forward<X>(x)));
}

}  // namespace

TEST_CASE("elementwise gradients with broadcasting and scalars on both sides equal finite differences and one rank",
          "[ad]") {
  const auto ga = global_random<2>({7, 5}, 1), gb = global_random<2>({7, 5}, 2, 0.5, 2.0);
  const auto gbias = global_random<1>({5}, 3);
  const auto gcol = global_random<2>({7, 1}, 4, 0.5, 2.0);
  on_every_mesh("binary and scalar ops", [&](const M& mesh) {
    auto a = ts::distribute<XY>(mesh, ga);
    auto b = ts::distribute<RY>(mesh, gb);
    auto bias = ts::distribute<Y1>(mesh, gbias);
    auto col = ts::distribute<XR>(mesh, gcol);
    auto f = [](const auto& a, const auto& b, const auto& bias, const auto& col) {
      auto y = a * b + bias - (a / col) + 2.0 * a - a * 0.5 + 1.5 / b - (3.0 - a) / 4.0 + (bias + 1.0);
      return ts::sum<0, 1>(y * y);
    };
    return checked_gradients("binary", f, a, b, bias, col);
  });
}

TEST_CASE("unary gradients equal finite differences and one rank", "[ad]") {
  const auto ga = global_random<2>({6, 9}, 5);
  on_every_mesh("unary ops", [&](const M& mesh) {
    auto a = ts::distribute<YX>(mesh, ga);
    auto f = [](const auto& a) {
      auto p = ts::exp(a) + ts::tanh(a) + ts::sigmoid(a) + ts::log(ts::square(a) + 1.0) +
               ts::sqrt(ts::abs(a) + 0.5) + ts::relu(a) * 3.0 - a + ts::pow(a, 3);
      return ts::sum<0, 1>(p * ts::abs(a));
    };
    return checked_gradients("unary", f, a);
  });
}

TEST_CASE("unary ops on an expiring tensor compute in its buffer, never in one a rule still reads", "[ad]") {
  const auto ga = global_random<2>({6, 9}, 7);
  on_every_mesh("expiring operands", [&](const M& mesh) {
    auto a = ts::distribute<YX>(mesh, ga);
    // Outside a gradient: exp(std::move(t)) takes t's buffer, with exp(t)'s values.
    auto t = a + 1.0;
    const Eigen::Tensor<double, 2> want = ts::exp(t).gather();
    const double* buffer = std::as_const(t).data();
    auto e = ts::exp(std::move(t));
    TS_REQUIRE_ALL(std::as_const(e).data() == buffer && compare(e.gather(), want) == "");
    // A tensor whose buffer another holds is left alone.
    auto u = a + 1.0;
    auto scaled = 2.0 * u;  // shares u's buffer, unevaluated
    (void)ts::log(std::move(u));
    TS_REQUIRE_ALL(compare(scaled.gather(), Eigen::Tensor<double, 2>(2.0 * (ga + 1.0))) == "");
    // Under a gradient: t is read by t * t's rule, so log(std::move(t)) must not overwrite it;
    // exp's rule reads only its output, so exp(std::move(s)) may take s's buffer.
    auto f = [](const auto& a) {
      auto t = ts::square(a) + 1.0;
      auto tt = t * t;
      auto s = a * 0.5;
      // log(square(a) + 2) of a temporary: log's own rule reads its operand, so no reuse either.
      return ts::sum<0, 1>(tt + ts::log(std::move(t)) + ts::exp(std::move(s)) + ts::tanh(a * 2.0) + ts::log(ts::square(a) + 2.0));
    };
    return checked_gradients("expiring", f, a);
  });
}

TEST_CASE("binary ops on an expiring operand of the result's layout compute in its buffer, never in one a rule, a "
          "broadcast or another tensor needs",
          "[ad]") {
  const auto ga = global_random<2>({6, 9}, 8), gb = global_random<2>({6, 9}, 9);
  const auto grow = global_random<1>({9}, 10);
  on_every_mesh("expiring binary operands", [&](const M& mesh) {
    const auto a = ts::distribute<YX>(mesh, ga), b = ts::distribute<YX>(mesh, gb);
    // Outside a gradient, each operator, either side: the result is in the expiring operand's buffer.
    auto each = [&](auto op) {
      auto t = a + 1.0, u = b + 1.0;
      const Eigen::Tensor<double, 2> left = op(t, b).gather(), right = op(a, u).gather();
      const double* tb = std::as_const(t).data();
      const double* ub = std::as_const(u).data();
      auto l = op(std::move(t), b);
      auto r = op(a, std::move(u));
      return std::as_const(l).data() == tb && std::as_const(r).data() == ub && compare(l.gather(), left) == "" &&
             compare(r.gather(), right) == "";
    };
    TS_REQUIRE_ALL(each([](auto&& x, auto&& y) { return std::forward<decltype(x)>(x) + std::forward<decltype(y)>(y); }));
    TS_REQUIRE_ALL(each([](auto&& x, auto&& y) { return std::forward<decltype(x)>(x) - std::forward<decltype(y)>(y); }));
    TS_REQUIRE_ALL(each([](auto&& x, auto&& y) { return std::forward<decltype(x)>(x) * std::forward<decltype(y)>(y); }));
    TS_REQUIRE_ALL(each([](auto&& x, auto&& y) { return std::forward<decltype(x)>(x) / std::forward<decltype(y)>(y); }));
    // A broadcast operand is not the result's shape; another spec is not its layout; a buffer
    // another tensor shares is left alone.
    auto row = ts::distribute<Y1>(mesh, grow) + 0.0;
    const auto sum_row = a + std::move(row);
    Eigen::Tensor<double, 2> want(6, 9);
    for (Eigen::Index i = 0; i < 6; ++i)
      for (Eigen::Index j = 0; j < 9; ++j) want(i, j) = ga(i, j) + grow(j);
    TS_REQUIRE_ALL(compare(sum_row.gather(), want) == "");
    auto other = ts::distribute<XY>(mesh, gb) + 0.0;
    const double* ob = std::as_const(other).data();
    const auto mixed = a * std::move(other);
    TS_REQUIRE_ALL(std::as_const(mixed).data() != ob && compare(mixed.gather(), Eigen::Tensor<double, 2>(ga * gb)) == "");
    auto v = a + 1.0;
    const auto scaled = 2.0 * v;  // shares v's buffer, unevaluated
    (void)(std::move(v) - b);
    TS_REQUIRE_ALL(compare(scaled.gather(), Eigen::Tensor<double, 2>(2.0 * (ga + 1.0))) == "");
    // Under a gradient: t is read by t * t's rule, so std::move(t) + a must not overwrite it;
    // a product's rule keeps both operands, so std::move(s) * a takes no buffer; a sum keeps
    // none, so (a + 1) - a * 3 computes in the left operand's.
    auto f = [](const auto& a) {
      auto t = a * 2.0 + 1.0;
      auto tt = t * t;
      auto s = ts::square(a) + 0.5;
      auto q = std::move(s) * a;
      auto r = std::move(t) + a;
      auto w = (a + 1.0) - a * 3.0;
      auto rw = std::move(r) * w;
      auto z = std::move(w) / (a * a + 1.0);
      return ts::sum<0, 1>(std::move(tt) + std::move(q) + std::move(rw) + std::move(z));
    };
    return checked_gradients("expiring binary", f, ts::distribute<YX>(mesh, ga));
  });
}

TEST_CASE("reduction gradients (sum, mean, max, min, keep_dims, partial results) equal finite differences and one rank",
          "[ad]") {
  const auto ga = global_random<2>({9, 7}, 6);
  on_every_mesh("reductions", [&](const M& mesh) {
    auto a = ts::distribute<XY>(mesh, ga);
    auto f = [](const auto& a) {
      auto rows = ts::sum<1>(a);                 // partial over y
      auto cols = ts::mean<0>(a * a);            // partial over x
      auto top = ts::max<1>(a, ts::keep_dims);   // [9, 1], broadcast back
      auto low = ts::min<0>(a);
      auto centred = a - ts::mean<1>(a, ts::keep_dims);
      return ts::sum<0>(rows * rows) + ts::sum<0>(cols) * 0.5 + ts::sum<0, 1>(centred * centred * top) +
             ts::sum<0>(low) * 2.0;
    };
    return checked_gradients("reductions", f, a);
  });
}

TEST_CASE("einsum gradients under every strategy choose their own strategies and equal one rank", "[ad]") {
  const auto gx = global_random<2>({7, 6}, 7), gw = global_random<2>({6, 5}, 8), gv = global_random<2>({5, 4}, 9);
  for (auto strategy : {ts::EinsumStrategy::Auto, ts::EinsumStrategy::GatherRight, ts::EinsumStrategy::GatherLeft,
                        ts::EinsumStrategy::Windowed}) {
    on_every_mesh("einsum strategy " + std::to_string(int(strategy)), [&](const M& mesh) {
      auto x = ts::distribute<XR>(mesh, gx);
      auto w = ts::distribute<RY>(mesh, gw);
      auto v = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, gv);
      auto f = [strategy](const auto& x, const auto& w, const auto& v) {
        auto h = ts::tanh(ts::einsum<"bd,dh->bh">(x, w, strategy));  // {x, y}
        auto o = ts::einsum<"bh,ho->bo">(h, v);                        // contracts y: partial
        return ts::sum<0, 1>(o * o);
      };
      return checked_gradients("einsum", f, x, w, v);
    });
  }
  const auto ga = global_random<3>({3, 5, 4}, 10), gb = global_random<3>({3, 4, 6}, 11);
  on_every_mesh("batched einsum", [&](const M& mesh) {
    auto a = ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::S<"y">>>(mesh, ga);
    auto b = ts::distribute<ts::Spec<ts::R, ts::S<"y">, ts::R>>(mesh, gb);
    auto f = [](const auto& a, const auto& b) {
      return ts::sum<0, 1, 2>(ts::square(ts::einsum<"bij,bjk->bik", ts::Spec<ts::R, ts::S<"x">, ts::R>>(a, b)));
    };
    return checked_gradients("batched einsum", f, a, b);
  });
  // An index summed inside one operand alone: its gradient is broadcast back over that index.
  const auto gp = global_random<2>({5, 7}, 14), gq = global_random<2>({7, 4}, 15), gr = global_random<2>({4, 7}, 16);
  on_every_mesh("einsum summing an index inside one operand", [&](const M& mesh) {
    auto p = ts::distribute<XY>(mesh, gp);
    auto q = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, gq);
    auto r = ts::distribute<RY>(mesh, gr);
    auto f = [](const auto& p, const auto& q, const auto& r) {
      auto left = ts::einsum<"ij,jk->k">(p, q);   // i summed inside p
      auto right = ts::einsum<"ij,kj->i">(p, r);  // k summed inside r
      return ts::sum<0>(ts::square(left)) + ts::sum<0>(ts::tanh(right));
    };
    return checked_gradients("einsum ij,jk->k and ij,kj->i", f, p, q, r);
  });
}

TEST_CASE("reshard gradients go back by the transpose rule: no gather, partial sums resolved once", "[ad]") {
  const auto ga = global_random<2>({7, 6}, 12), gc = global_random<2>({7, 6}, 13);
  on_every_mesh("reshard", [&](const M& mesh) {
    auto a = ts::distribute<XY>(mesh, ga);
    auto c = ts::distribute<RR>(mesh, gc);
    auto f = [&](const auto& a) {
      auto r = ts::reshard<RR>(a);           // all-gather: its transpose is a reduce-scatter
      auto s = ts::reshard<YX>(r * c);       // a local slice
      auto t = ts::reshard<ts::Spec<ts::R, ts::S<"x">>>(ts::sum<1>(s * a, ts::keep_dims));
      return ts::sum<0, 1>(s * s) + ts::sum<0, 1>(t);
    };
    return checked_gradients("reshard", f, a);
  });
}

TEST_CASE("shape operator gradients: transpose, slice, pad, concat, reshape, take, where", "[ad]") {
  const auto ga = global_random<2>({7, 5}, 14), gb = global_random<2>({3, 5}, 15), gt = global_random<2>({11, 4}, 16);
  Eigen::Tensor<std::int32_t, 1> gids(6);
  gids.setValues({3, 0, 10, 3, 7, 1});
  on_every_mesh("shape ops", [&](const M& mesh) {
    auto a = ts::distribute<XY>(mesh, ga);
    auto b = ts::distribute<RY>(mesh, gb);
    auto table = ts::distribute<XR>(mesh, gt);
    auto ids = ts::distribute<ts::Spec<ts::S<"y">>>(mesh, gids);
    auto f = [&](const auto& a, const auto& b, const auto& table) {
      auto t = ts::transpose<1, 0>(a);                         // [5, 7]
      auto s = ts::slice(a, {1, 1}, {5, 3});                   // [5, 3]
      auto p = ts::pad(s, {1, 0}, {0, 2});                     // [6, 5]
      auto c = ts::concat<0>(a, b);                            // [10, 5]
      auto r = ts::reshape<ts::Spec<ts::S<"x">, ts::R>>(c, {5, 10});
      auto e = ts::take<0>(table, ids);                        // [6, 4]
      auto w = ts::where(a > 0.0, a * 3.0, 2.0 - a);           // [7, 5]
      return ts::sum<0, 1>(t * t) + ts::sum<0, 1>(ts::exp(p)) + ts::sum<0, 1>(r * r * 0.5) +
             ts::sum<0, 1>(e * e) + ts::sum<0, 1>(ts::where(a < 0.2, w, 1.0));
    };
    return checked_gradients("shape ops", f, a, b, table);
  });
}

TEST_CASE("nn function gradients (custom VJPs) equal finite differences and one rank", "[ad]") {
  const auto gz = global_random<2>({7, 9}, 17, -2, 2);
  const auto gg = global_random<1>({9}, 18, 0.5, 1.5);
  const auto gbeta = global_random<1>({9}, 19);
  Eigen::Tensor<std::int32_t, 1> glabels(7);
  glabels.setValues({0, 8, 3, 3, 5, 1, 7});
  on_every_mesh("nn", [&](const M& mesh) {
    auto z = ts::distribute<XY>(mesh, gz);
    auto gamma = ts::distribute<Y1>(mesh, gg);
    auto beta = ts::distribute<R1>(mesh, gbeta);
    auto labels = ts::distribute<ts::Spec<ts::S<"x">>>(mesh, glabels);
    auto f = [&](const auto& z, const auto& gamma, const auto& beta) {
      auto n = ts::nn::layer_norm<1>(z, gamma, beta, 1e-5);
      auto h = ts::nn::gelu(n) + ts::nn::softmax<1>(z) * 2.0 + ts::nn::log_softmax<0>(z) * 0.1;
      auto d = ts::nn::dropout(h, 0.25, 99);
      return ts::nn::cross_entropy(d, labels) + 0.5 * ts::nn::cross_entropy(z * 2.0, labels);
    };
    return checked_gradients("nn", f, z, gamma, beta);
  });
}

TEST_CASE("in-place operators under a gradient record the new value and keep the old one for the rule", "[ad]") {
  const auto ga = global_random<2>({5, 6}, 20);
  const auto gb = global_random<1>({6}, 21);
  on_every_mesh("in-place", [&](const M& mesh) {
    auto a = ts::distribute<XY>(mesh, ga);
    auto b = ts::distribute<Y1>(mesh, gb);
    auto f = [](const auto& a, const auto& b) {
      auto y = a * a;
      y += b;      // broadcast
      y *= a;      // the old y is what the rule reads
      y -= 0.5;
      y /= 2.0;
      return ts::sum<0, 1>(y);
    };
    return checked_gradients("in-place", f, a, b);
  });
}

TEST_CASE("in-place += and -= of partial sums keep every gradient: an expiring partial on the right, a partial on "
          "the left",
          "[ad]") {
  // h += einsum(a, b) with the contracted dim split makes the right side a partial sum that owns
  // its buffer (once resolved in place, off the tape: a lost gradient); a partial left side once
  // took a partial right side with no record at all.
  const auto ga = global_random<2>({5, 6}, 40), gb = global_random<2>({6, 4}, 41), gc = global_random<2>({5, 4}, 42);
  on_every_mesh("partial in-place", [&](const M& mesh) {
    auto a = ts::distribute<RY>(mesh, ga);
    auto b = ts::distribute<YX>(mesh, gb);
    auto c = ts::distribute<XR>(mesh, gc);
    auto f = [](const auto& a, const auto& b, const auto& c) {
      auto h = XRTensor(c * c);
      h += ts::einsum<"ij,jk->ik">(a, b);   // an expiring partial sum over y
      h -= ts::einsum<"ij,jk->ik">(a * a, b) * 0.5;
      auto p = ts::sum<1>(a);               // a partial sum over y, updated in place by another
      p += ts::sum<1>(a * a);
      p -= ts::sum<1>(ts::exp(a)) * 0.25;
      return ts::sum<0, 1>(ts::square(h)) + ts::sum<0>(ts::square(p));
    };
    return checked_gradients("partial in-place", f, a, b, c);
  });
}

TEST_CASE("operators without a derivative rule refuse a tracked input on every rank, saying what to use instead",
          "[ad]") {
  const M mesh({world_size(), 1});
  auto a = ts::distribute<XR>(mesh, global_random<2>({6, 5}, 43));
  auto refused = [&](const std::string& op, auto&& f) {
    std::string said;
    try {
      (void)ts::ad::grad(f, a);
    } catch (const ts::SpecError& e) {
      said = e.what();
    }
    INFO(op << ": " << said);
    TS_REQUIRE_ALL(said.find("tshard::" + op + ": ") == 0 && said.find(" is tracked by a gradient, and ") != std::string::npos &&
                   said.find("has no derivative rule: ") != std::string::npos);
  };
  using Ids = ts::Spec<ts::R>;
  const auto ids = ts::from_function<std::int32_t, Ids>(mesh, {3}, [](const auto& i) { return std::int32_t(i[0] * 2); });
  refused("stencil", [](const auto& x) {
    return ts::sum<0, 1>(ts::stencil(x, {1, 0}, ts::Boundary::Zero, [](const auto& v) { return v(0, 0) * v(1, 0); }));
  });
  refused("stencil_backward", [](const auto& x) {
    auto dx = ts::stencil_backward(x, ts::zeros<double, XR>(x.mesh(), {6, 5}), {1, 0}, ts::Boundary::Zero,
                                   [](const auto&, double dy, const auto& dv) { dv(0, 0) += dy; });
    return ts::sum<0, 1>(dx);
  });
  refused("with_halo", [](const auto& x) {
    (void)ts::with_halo(x, {1, 0}, ts::Boundary::Zero);
    return ts::sum<0, 1>(x);
  });
  refused("HaloExchange::start", [](const auto& x) {
    ts::HaloExchange<double, 2> exchange(x, {1, 0}, ts::Boundary::Periodic);
    auto ext = exchange.make_extended();
    exchange.start(x, ext);
    exchange.finish();
    return ts::sum<0, 1>(x);
  });
  refused("scatter_add", [&](const auto& x) {
    auto g = ts::zeros<double, XR>(x.mesh(), {6, 5});
    ts::scatter_add<0>(g, ids, ts::take<0>(x, ids));
    return ts::sum<0, 1>(x);
  });
  refused("nn::gelu_backward", [](const auto& x) { return ts::sum<0, 1>(ts::nn::gelu_backward(x, x)); });
  refused("nn::relu_backward", [](const auto& x) { return ts::sum<0, 1>(ts::nn::relu_backward(x, x)); });
  refused("nn::layer_norm_backward", [](const auto& x) {
    auto gamma = ts::zeros<double, R1>(x.mesh(), {5}) + 1.0;
    return ts::sum<0, 1>(std::get<0>(ts::nn::layer_norm_backward<1>(x, gamma, x, 1e-5)));
  });
}

TEST_CASE("causal_attention's probabilities under a gradient (fused kernel off) give the serial gradients on every mesh",
          "[ad]") {
  // With T whole, causal_attention runs a fused softmax kernel that overwrites its scores: under
  // a gradient it runs the recorded operators instead.
  const auto gq = global_random<4>({5, 3, 2, 4}, 44), gk = global_random<4>({5, 3, 2, 4}, 45);
  const auto gv = global_random<4>({5, 3, 2, 4}, 46);
  on_every_mesh("causal_attention", [&](const M& mesh) {
    using QS = ts::Spec<ts::R, ts::S<"x">, ts::R, ts::S<"y">>;
    auto q = ts::distribute<QS>(mesh, gq);
    auto k = ts::distribute<QS>(mesh, gk);
    auto v = ts::distribute<QS>(mesh, gv);
    auto f = [](const auto& q, const auto& k, const auto& v) {
      auto [context, p] = ts::nn::causal_attention(q, k, v);
      return ts::sum<0, 1, 2, 3>(ts::square(context)) + ts::sum<0, 1, 2, 3>(p * p);
    };
    return checked_gradients("causal_attention", f, q, k, v);
  });
}

TEST_CASE("a partial input's gradient: partial sums added, scaled and negated keep their partial", "[ad]") {
  const auto ga = global_random<2>({6, 7}, 22);
  on_every_mesh("partials", [&](const M& mesh) {
    auto a = ts::distribute<XY>(mesh, ga);
    auto f = [](const auto& a) {
      auto p = ts::sum<1>(a);                       // partial sum over y
      auto q = ts::sum<1>(a * a);
      auto r = (p + q) * 2.0 - (-p) / 4.0;          // still partial
      return ts::sum<0>(ts::exp(r * 0.1));
    };
    return checked_gradients("partials", f, a);
  });
}

TEST_CASE("untracked code records nothing; a gradient of a value the loss ignores is zero; nesting is refused",
          "[ad]") {
  const M mesh({world_size(), 1});
  auto a = ts::distribute<XR>(mesh, global_random<2>({5, 3}, 23));
  auto b = ts::distribute<XR>(mesh, global_random<2>({5, 3}, 24));
  // Plain code outside a gradient: no node on any result.
  auto c = ts::exp(a) * b + 1.0;
  TS_REQUIRE_ALL(!ts::detail::tracked(c));
  auto [loss, da, db] = ts::ad::value_and_grad([](const auto& a, const auto&) { return ts::sum<0, 1>(a * a); }, a, b);
  const Eigen::Tensor<double, 2> zero = db.gather();
  TS_REQUIRE_ALL(compare(zero, Eigen::Tensor<double, 2>(zero.constant(0.0)), 0) == "");
  TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(da.gather()), Eigen::Tensor<double, 2>(a.gather() * 2.0), 1e-15) == "");
  bool refused = false;
  try {
    (void)ts::ad::grad([&](const auto& a) { return ts::sum<0, 1>(std::get<0>(ts::ad::grad([](const auto& v) { return ts::sum<0, 1>(v); }, a))); }, a);
  } catch (const ts::SpecError&) {
    refused = true;
  }
  TS_REQUIRE_ALL(refused);
  bool map_refused = false;
  try {
    (void)ts::ad::grad([](const auto& a) { return ts::sum<0, 1>(ts::map(a, [](double v) { return v * v; })); }, a);
  } catch (const ts::SpecError&) {
    map_refused = true;
  }
  TS_REQUIRE_ALL(map_refused);
  (void)loss;
}

TEST_CASE("a residual split over y plus a row-parallel product (partial over y) differentiates through the "
          "reduce-scatter: its transpose is an all-gather",
          "[ad]") {
  const auto gx = global_random<2>({7, 5}, 61), gw = global_random<2>({5, 6}, 62), gr = global_random<2>({7, 6}, 63);
  on_every_mesh("sequence-parallel residual", [&](const M& mesh) {
    auto x = ts::distribute<ts::Spec<ts::R, ts::S<"y">>>(mesh, gx);   // contracted dim over y: a partial product
    auto w = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, gw);
    auto r = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, gr);   // the residual's rows over y
    auto f = [](const auto& x, const auto& w, const auto& r) {
      auto y = r + ts::einsum<"ij,jk->ik">(x, w);
      static_assert(std::is_same_v<typename decltype(y)::SpecType, ts::Spec<ts::S<"y">, ts::R>>);
      return ts::sum<0, 1>(ts::square(y));
    };
    return checked_gradients("residual", f, x, w, r);
  });
}

TEST_CASE("a user's custom VJP is used in place of the derived one", "[ad]") {
  const auto ga = global_random<2>({6, 5}, 25);
  on_every_mesh("custom_vjp", [&](const M& mesh) {
    auto a = ts::distribute<XY>(mesh, ga);
    // softplus with its own derivative: sigmoid(x) dy.
    auto softplus = [](const auto& x) {
      return ts::ad::custom_vjp([](const auto& v) { return ts::log(ts::exp(v) + 1.0); },
                                [](const auto& dy, const auto&, const auto& v) { return dy * ts::sigmoid(v); }, x);
    };
    auto f = [&](const auto& a) { return ts::sum<0, 1>(softplus(a) * a); };
    return checked_gradients("custom_vjp", f, a);
  });
}

TEST_CASE("causal attention's custom VJP (the fused backward) equals finite differences and one rank", "[ad]") {
  const auto gq = global_random<4>({5, 3, 2, 4}, 26), gk = global_random<4>({5, 3, 2, 4}, 27);
  const auto gv = global_random<4>({5, 3, 2, 4}, 28);
  on_every_mesh("attention", [&](const M& mesh) {
    using QS = ts::Spec<ts::R, ts::S<"x">, ts::R, ts::S<"y">>;
    auto q = ts::distribute<QS>(mesh, gq);
    auto k = ts::distribute<QS>(mesh, gk);
    auto v = ts::distribute<QS>(mesh, gv);
    auto f = [](const auto& q, const auto& k, const auto& v) {
      return ts::sum<0, 1, 2, 3>(ts::square(ts::nn::attention(q, k, v)));
    };
    return checked_gradients("attention", f, q, k, v);
  });
}

namespace {
using QS5 = ts::Spec<ts::S<"x">, ts::R, ts::R, ts::R, ts::S<"y">>;  // [B, T, Dh, G, KV]: batch over x, heads over y
using KS4 = ts::Spec<ts::S<"x">, ts::R, ts::R, ts::S<"y">>;         // [B, S, Dh, KV] (and [B, T, Dh, H])
using SeqQS5 = ts::Spec<ts::R, ts::S<"x">, ts::R, ts::R, ts::S<"y">>;  // the sequence over x, heads over y
using SeqKS4 = ts::Spec<ts::R, ts::S<"x">, ts::R, ts::S<"y">>;

// The attention scaled_dot_product_attention replaces, written out: scores (soft-capped), ALiBi's
// bias, an additive mask, softmax over the keys, values. Its own statement of the mask. A query
// that sees no key (a bidirectional window past the keys' end) attends to nothing: its output and
// gradients are 0.
template <class Q, class K, class V>
auto written_out_attention(const Q& q, const K& k, const V& v, const ts::nn::AttentionOptions& o) {
  const Eigen::Index T = q.global_shape()[1], S = k.global_shape()[1];
  const double scale = o.scale > 0 ? o.scale : 1 / std::sqrt(double(q.global_shape()[2]));
  // (packed documents: the document of position p in row b, as the number of starts at or before it)
  auto document = [&o](Eigen::Index b, Eigen::Index p) {
    const auto& row = o.document_starts[std::size_t(b)];
    return std::upper_bound(row.begin(), row.end(), p) - row.begin();
  };
  // (keys packed apart: query t and key s as positions in their pair of documents, or -1 where
  // they are of different pairs; otherwise query t's position among the keys and s)
  auto positions = [&](Eigen::Index b, Eigen::Index t, Eigen::Index s) -> std::pair<Eigen::Index, Eigen::Index> {
    if (o.key_document_starts.empty()) return {t + (o.causal ? S - T : 0), s};  // causal: the last T of S positions
    const std::vector<Eigen::Index> whole{0};
    const auto& qrow = o.document_starts.empty() ? whole : o.document_starts[std::size_t(b)];
    const auto& krow = o.key_document_starts[std::size_t(b)];
    const auto j = std::upper_bound(qrow.begin(), qrow.end(), t) - qrow.begin() - 1;
    const auto js = std::upper_bound(krow.begin(), krow.end(), s) - krow.begin() - 1;
    if (j != js) return {-1, -1};
    const Eigen::Index tq = (std::size_t(j + 1) < qrow.size() ? qrow[std::size_t(j + 1)] : T) - qrow[std::size_t(j)];
    const Eigen::Index sk = (std::size_t(j + 1) < krow.size() ? krow[std::size_t(j + 1)] : S) - krow[std::size_t(j)];
    return {t - qrow[std::size_t(j)] + (o.causal ? sk - tq : 0), s - krow[std::size_t(j)]};
  };
  auto visible = [&](Eigen::Index b, Eigen::Index t, Eigen::Index s) {
    if (o.key_document_starts.empty() && !o.document_starts.empty() && document(b, t) != document(b, s)) return false;
    const auto [p, r] = positions(b, t, s);
    if (r < 0 || (o.causal && r > p)) return false;
    const Eigen::Index distance = o.causal ? p - r : std::abs(p - r);
    return o.window == 0 || distance < o.window;
  };
  const double inf = std::numeric_limits<double>::infinity();
  const Eigen::Index rows =  // (a mask per row where they differ)
      o.document_starts.empty() && o.key_document_starts.empty() ? 1 : q.global_shape()[0];
  std::vector<char> seeing(std::size_t(rows * T), 0);
  for (Eigen::Index b = 0; b < rows; ++b)
    for (Eigen::Index t = 0; t < T; ++t)
      for (Eigen::Index s = 0; s < S && !seeing[std::size_t(b * T + t)]; ++s) seeing[std::size_t(b * T + t)] = visible(b, t, s);
  auto sees = [&](Eigen::Index b, Eigen::Index t) { return seeing[std::size_t(b * T + t)] != 0; };
  // (-inf where hidden, but 0 along a row that sees nothing, whose probabilities seen() zeroes)
  auto mask_at = [&](Eigen::Index b, Eigen::Index t, Eigen::Index s) { return visible(b, t, s) || !sees(b, t) ? 0.0 : -inf; };
  // Attention dropout: the probabilities times the multipliers of (row, key-value head, group,
  // global query position, key position) that the kernels draw.
  auto kept = [&, shift = o.causal ? S - T : 0](Eigen::Index b, Eigen::Index t, Eigen::Index s, Eigen::Index g,
                                                Eigen::Index h) {
    return ts::nn::detail::dropout_multiplier_at(o.dropout, b, h, g, t + shift, s);
  };
  // (scores -> cap tanh(scores / cap); ALiBi: -slope of query head h * G + g times the distance)
  auto capped = [&o](const auto& scores) {
    using X = std::remove_cvref_t<decltype(scores)>;
    return o.softcap > 0 ? X(ts::tanh(scores * (1 / o.softcap)) * o.softcap) : scores;
  };
  const Eigen::Index G = Q::rank == 5 ? q.global_shape()[3] : 1;
  // (positions as the mask's: causal, query t of T at S - T + t; bidirectional, at t; within a pair
  // of documents where the keys are packed apart)
  auto alibi = [&](Eigen::Index b, Eigen::Index t, Eigen::Index s, Eigen::Index g, Eigen::Index h) {
    const auto [p, r] = positions(b, t, s);
    return o.alibi_slopes.empty() || r < 0 ? 0.0 : -o.alibi_slopes[std::size_t(h * G + g)] * double(std::abs(p - r));
  };
  if constexpr (Q::rank == 5) {
    const auto& qs = q.global_shape();
    auto mask = ts::from_function<double, ts::Replicated<5>>(q.mesh(), {rows, T, S, 1, 1},
                                                             [&](const auto& i) { return mask_at(i[0], i[1], i[2]); });
    auto seen = ts::from_function<double, ts::Replicated<5>>(q.mesh(), {rows, T, 1, 1, 1},
                                                             [&](const auto& i) { return sees(i[0], i[1]) ? 1.0 : 0.0; });
    auto bias = ts::from_function<double, ts::Replicated<5>>(
        q.mesh(), {rows, T, S, qs[3], qs[4]}, [&](const auto& i) { return alibi(i[0], i[1], i[2], i[3], i[4]); });
    auto p = ts::nn::softmax<2>(capped(ts::einsum<"btkgv,bskv->btsgv">(q, k) * scale) + bias + mask) * seen;
    if (o.dropout.p == 0) return ts::einsum<"btsgv,bskv->btkgv">(p, v);
    auto z = ts::from_function<double, ts::Replicated<5>>(
        q.mesh(), {qs[0], T, S, qs[3], qs[4]}, [&](const auto& i) { return kept(i[0], i[1], i[2], i[3], i[4]); });
    return ts::einsum<"btsgv,bskv->btkgv">(p * z, v);
  } else {
    auto mask = ts::from_function<double, ts::Replicated<4>>(q.mesh(), {rows, T, S, 1},
                                                             [&](const auto& i) { return mask_at(i[0], i[1], i[2]); });
    auto seen = ts::from_function<double, ts::Replicated<4>>(q.mesh(), {rows, T, 1, 1},
                                                             [&](const auto& i) { return sees(i[0], i[1]) ? 1.0 : 0.0; });
    auto bias = ts::from_function<double, ts::Replicated<4>>(
        q.mesh(), {rows, T, S, q.global_shape()[3]}, [&](const auto& i) { return alibi(i[0], i[1], i[2], 0, i[3]); });
    auto p = ts::nn::softmax<2>(capped(ts::einsum<"btkh,bskh->btsh">(q, k) * scale) + bias + mask) * seen;
    if (o.dropout.p == 0) return ts::einsum<"btsh,bskh->btkh">(p, v);
    auto z = ts::from_function<double, ts::Replicated<4>>(
        q.mesh(), {q.global_shape()[0], T, S, q.global_shape()[3]}, [&](const auto& i) { return kept(i[0], i[1], i[2], 0, i[3]); });
    return ts::einsum<"btsh,bskh->btkh">(p * z, v);
  }
}

// On every mesh: the fused attention's value is the written-out one's, its gradients equal
// finite differences (unless `differences` is false: the sweep's many draws), the written-out
// gradients and one rank's.
template <class QSpec, int QRank, class KSpec = KS4>
void check_attention(const std::string& what, const std::array<Eigen::Index, QRank>& qshape,
                     const std::array<Eigen::Index, 4>& kshape, const ts::nn::AttentionOptions& o, unsigned seed = 40,
                     bool differences = true) {
  const auto gq = global_random<QRank>(qshape, seed);
  const auto gk = global_random<4>(kshape, seed + 1), gv = global_random<4>(kshape, seed + 2);
  on_every_mesh(what, [&](const M& mesh) {
    auto q = ts::distribute<QSpec>(mesh, gq);
    auto k = ts::distribute<KSpec>(mesh, gk);
    auto v = ts::distribute<KSpec>(mesh, gv);
    const auto fused = ts::nn::scaled_dot_product_attention(q, k, v, o);
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(fused)>, decltype(q)>, "the output is laid out as the queries");
    INFO(what << ": forward against the written-out attention");
    TS_REQUIRE_ALL(compare(fused.gather(), written_out_attention(q, k, v, o).gather(), 1e-12) == "");
    auto loss = [&](auto attend) {
      return [attend](const auto& q, const auto& k, const auto& v) {
        if constexpr (QRank == 5) return ts::sum<0, 1, 2, 3, 4>(ts::square(attend(q, k, v)));
        else return ts::sum<0, 1, 2, 3>(ts::square(attend(q, k, v)));
      };
    };
    const auto fused_loss = loss([o](const auto& q, const auto& k, const auto& v) {
      return ts::nn::scaled_dot_product_attention(q, k, v, o);
    });
    const auto got = differences ? checked_gradients(what, fused_loss, q, k, v) : [&] {
      const auto all = ts::ad::value_and_grad(fused_loss, q, k, v);
      return std::make_tuple(std::get<1>(all).gather(), std::get<2>(all).gather(), std::get<3>(all).gather());
    }();
    const auto want = ts::ad::value_and_grad(loss([o](const auto& q, const auto& k, const auto& v) {
                                               return written_out_attention(q, k, v, o);
                                             }),
                                             q, k, v);
    INFO(what << ": gradients against the written-out attention's");
    // (1e-12 of the largest element's size, at least 1: a key that many queries see only, as a
    // key document of one, sums them into a gradient of hundreds)
    auto near = [](const auto& got, const auto& want) {
      const double size = std::max(1.0, double(Eigen::Tensor<double, 0>(want.abs().maximum())()));
      return compare(got, want, 1e-12 * size);
    };
    const std::string dq = near(std::get<0>(got), std::get<1>(want).gather());
    const std::string dk = near(std::get<1>(got), std::get<2>(want).gather());
    const std::string dv = near(std::get<2>(got), std::get<3>(want).gather());
    INFO("dq: " << dq << "; dk: " << dk << "; dv: " << dv);
    TS_REQUIRE_ALL(dq.empty() && dk.empty() && dv.empty());
    return got;
  });
}
}  // namespace

TEST_CASE("scaled_dot_product_attention equals the written-out attention, finite differences and one rank: causal, "
          "bidirectional, cross, sliding windows, grouped-query and multi-head, uneven splits",
          "[ad][attention]") {
  // [B, T, Dh, G, KV] = [3, 7, 4, 2, 3]: 3 rows over x and 3 key-value heads over y split unevenly.
  check_attention<QS5, 5>("causal", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {});
  check_attention<QS5, 5>("bidirectional cross-attention", {3, 7, 4, 2, 3}, {3, 5, 4, 3}, {.causal = false});
  check_attention<QS5, 5>("causal, 3 queries after 4 cached keys", {3, 3, 4, 2, 3}, {3, 7, 4, 3}, {});
  check_attention<QS5, 5>("causal, window 3, 3 queries after 4 cached keys", {3, 3, 4, 2, 3}, {3, 7, 4, 3}, {.window = 3});
  check_attention<QS5, 5>("causal, window 3", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {.window = 3});
  check_attention<QS5, 5>("bidirectional, window 2", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {.causal = false, .window = 2});
  check_attention<QS5, 5>("scale 0.3", {2, 6, 3, 3, 2}, {2, 6, 3, 2}, {.scale = 0.3});
  check_attention<KS4, 4>("multi-head", {3, 7, 4, 5}, {3, 7, 4, 5}, {});
  // Longer than a block (64 queries, 128 keys): blocks skipped, masked on the diagonal and whole.
  check_attention<QS5, 5>("causal, 150 positions", {1, 150, 2, 2, 2}, {1, 150, 2, 2}, {});
  check_attention<QS5, 5>("causal, window 70 of 150", {1, 150, 2, 1, 2}, {1, 150, 2, 2}, {.window = 70});
  // The block products take head dims in runs of four, two and one packets, then narrower
  // packets, then a remainder: dims 8, 11 and 20 cover each (dims 2-4 above the rest).
  check_attention<QS5, 5>("head dim 8, 130 positions", {1, 130, 8, 2, 2}, {1, 130, 8, 2}, {});
  check_attention<QS5, 5>("head dim 11, bidirectional", {2, 9, 11, 1, 2}, {2, 9, 11, 2}, {.causal = false});
  check_attention<KS4, 4>("head dim 20, multi-head", {2, 7, 20, 3}, {2, 7, 20, 3}, {});
  // ALiBi's slopes by query head h * G + g, and soft-capped scores (a cap small enough to bend).
  const std::vector<double> slopes{0.5, 0.25, 0.125, 0.0625, 1.5, -0.3};
  check_attention<QS5, 5>("ALiBi, causal", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {.alibi_slopes = slopes});
  check_attention<QS5, 5>("ALiBi, bidirectional cross-attention", {3, 7, 4, 2, 3}, {3, 5, 4, 3},
                          {.causal = false, .alibi_slopes = slopes});
  check_attention<QS5, 5>("ALiBi, 3 queries after 4 cached keys, window 3", {3, 3, 4, 2, 3}, {3, 7, 4, 3},
                          {.window = 3, .alibi_slopes = slopes});
  check_attention<QS5, 5>("softcap 0.4, bidirectional", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {.causal = false, .softcap = 0.4});
  check_attention<KS4, 4>("softcap and ALiBi, multi-head, 150 positions", {1, 150, 4, 3}, {1, 150, 4, 3},
                          {.window = 90, .alibi_slopes = {0.02, 0.1, 0.3}, .softcap = 0.5});
  // 512 keys of 8 bytes: rows 4 KiB apart, which the transposed keys and values are padded off.
  check_attention<QS5, 5>("causal, 512 positions", {1, 512, 2, 1, 1}, {1, 512, 2, 1}, {.window = 200});
  // The sequence split (context parallelism's layout): resharded to whole sequences, the heads
  // split over its axis too, and back; 7 positions over up to 6 ranks, 3 heads.
  using TQ = SeqQS5;
  using TK = SeqKS4;
  check_attention<TQ, 5, TK>("sequence over x, heads over y", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {});
  check_attention<ts::Spec<ts::S<"y">, ts::S<"x">, ts::R, ts::R, ts::R>, 5, ts::Spec<ts::R, ts::S<"x", "y">, ts::R, ts::R>>(
      "sequence over x, batch over y; keys' sequence over both", {3, 9, 4, 2, 1}, {3, 9, 4, 1}, {.window = 4});
  check_attention<ts::Spec<ts::R, ts::S<"y", "x">, ts::R, ts::R>, 4, ts::Spec<ts::R, ts::S<"y", "x">, ts::R, ts::R>>(
      "multi-head, sequence over both axes, 2 heads", {2, 13, 4, 2}, {2, 13, 4, 2}, {});
}

TEST_CASE("ring attention over a split sequence equals the written-out attention, finite differences and one rank: "
          "causal, bidirectional, windows, fewer key-value heads than ranks, sequences shorter than 2P chunks",
          "[ad][attention][ring]") {
  using ts::nn::ContextParallel;
  using TQ = SeqQS5;
  using TK = SeqKS4;
  const ts::nn::AttentionOptions ring{.context = ContextParallel::Ring};
  check_attention<TQ, 5, TK>("ring: sequence over x, heads over y", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, ring);
  check_attention<TQ, 5, TK>("ring: bidirectional", {2, 11, 3, 2, 3}, {2, 11, 3, 3},
                             {.causal = false, .context = ContextParallel::Ring});
  check_attention<TQ, 5, TK>("ring: causal window 3", {2, 11, 3, 2, 2}, {2, 11, 3, 2},
                             {.window = 3, .context = ContextParallel::Ring});
  check_attention<TQ, 5, TK>("ring: bidirectional window 2", {2, 9, 3, 1, 2}, {2, 9, 3, 2},
                             {.causal = false, .window = 2, .context = ContextParallel::Ring});
  // One key-value head (MQA) for 3 query heads, the sequence over both axes: every rank attends.
  check_attention<ts::Spec<ts::R, ts::S<"x", "y">, ts::R, ts::R, ts::R>, 5, ts::Spec<ts::R, ts::S<"x", "y">, ts::R, ts::R>>(
      "ring: one key-value head, sequence over both axes", {2, 13, 4, 3, 1}, {2, 13, 4, 1}, ring);
  // Batch over y, the keys' sequence split otherwise (resharded to the queries' split first).
  check_attention<ts::Spec<ts::S<"y">, ts::S<"x">, ts::R, ts::R, ts::R>, 5, ts::Spec<ts::R, ts::S<"x", "y">, ts::R, ts::R>>(
      "ring: batch over y, keys' sequence over both", {3, 9, 4, 2, 1}, {3, 9, 4, 1}, ring);
  check_attention<ts::Spec<ts::R, ts::S<"y", "x">, ts::R, ts::R>, 4, ts::Spec<ts::R, ts::S<"y", "x">, ts::R, ts::R>>(
      "ring: multi-head, sequence over both axes (y major)", {2, 13, 4, 2}, {2, 13, 4, 2}, ring);
  // Several query and key blocks per chunk.
  check_attention<TQ, 5, TK>("ring: 150 positions", {1, 150, 2, 1, 2}, {1, 150, 2, 2}, ring);
  // Where the ring cannot go (fewer queries than keys) the all-to-all takes over; and asked for.
  check_attention<TQ, 5, TK>("ring asked, cross-attention", {3, 5, 4, 2, 3}, {3, 7, 4, 3},
                             {.causal = false, .context = ContextParallel::Ring});
  check_attention<TQ, 5, TK>("all-to-all asked", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {.context = ContextParallel::AllToAll});
  // ALiBi's distances are global positions (the ring's zigzag chunks included), its slopes global heads.
  const std::vector<double> slopes{0.5, 0.25, 0.125, 0.0625, 1.5, -0.3};
  check_attention<TQ, 5, TK>("ring: ALiBi and softcap", {3, 11, 4, 2, 3}, {3, 11, 4, 3},
                             {.context = ContextParallel::Ring, .alibi_slopes = slopes, .softcap = 0.4});
  check_attention<TQ, 5, TK>("ring: bidirectional ALiBi, 150 positions", {1, 150, 2, 1, 2}, {1, 150, 2, 2},
                             {.causal = false, .context = ContextParallel::Ring, .alibi_slopes = ts::nn::alibi_slopes(2)});
  check_attention<TQ, 5, TK>("all-to-all: ALiBi and softcap", {3, 11, 4, 2, 3}, {3, 11, 4, 3},
                             {.context = ContextParallel::AllToAll, .alibi_slopes = slopes, .softcap = 0.4});
  // Which way ran: the ring's messages under its own operator, only where it was asked for
  // (or chosen: one key-value head over more ranks than that).
  const auto gq = global_random<5>({2, 9, 4, 2, 1}, 43);
  const auto gk = global_random<4>({2, 9, 4, 1}, 44);
  on_every_mesh("ring chosen", [&](const M& mesh) {
    auto q = ts::distribute<TQ>(mesh, gq);
    auto k = ts::distribute<TK>(mesh, gk);
    auto ring_calls = [&] {
      std::uint64_t calls = 0;
      for (auto& [name, op] : ts::comm_stats().operators())
        if (name.find("ring_attention") != std::string::npos) calls += op.total().calls;
      return calls;
    };
    auto ring_bytes = [&](const ts::nn::AttentionOptions& o) {
      ts::reset_comm_stats();
      (void)ts::nn::scaled_dot_product_attention(q, k, k, o);
      std::uint64_t bytes = 0;
      for (auto& [name, op] : ts::comm_stats().operators())
        if (name.find("ring_attention") != std::string::npos) bytes += op.total().bytes_sent;
      return bytes;
    };
    const bool split = mesh.size<"x">() > 1;
    TS_REQUIRE_ALL((ring_bytes(ring) > 0) == split);
    // A sequence axis of one rank: no ring, forward or backward (nothing sent to oneself).
    ts::reset_comm_stats();
    (void)ts::ad::value_and_grad([&](const auto& qq, const auto& kk) {
      return ts::sum<0, 1, 2, 3, 4>(ts::square(ts::nn::scaled_dot_product_attention(qq, kk, kk, ring)));
    }, q, k);
    TS_REQUIRE_ALL((ring_calls() > 0) == split);
    TS_REQUIRE_ALL(ring_bytes({.context = ContextParallel::AllToAll}) == 0);
    TS_REQUIRE_ALL((ring_bytes({}) > 0) == (split && mesh.size() > 1));  // one head: Ulysses would idle ranks
    // explain_attention names the way that ran, and why.
    auto says = [&](const ts::nn::AttentionOptions& o, const std::string& text) {
      const std::string way = ts::nn::explain_attention(q, k, k, o);
      INFO(way);
      TS_REQUIRE_ALL(way.find(text) != std::string::npos);
    };
    says(ring, split ? "ring attention over the " + std::to_string(mesh.size<"x">()) + " ranks of the sequence's split"
                     : "the local kernel: the sequence's split has one rank, so nothing goes round; q: stays; k: stays; "
                       "v: stays; output: stays");
    if (split) says(ring, "because .context = Ring");
    says({.context = ContextParallel::AllToAll}, "all-to-all (Ulysses): the split moves from the sequence to the "
                                                 "key-value heads and back, because .context = AllToAll");
    says({.context = ContextParallel::AllToAll}, "; q: ");
    if (mesh.size() > 1)  // one key-value head: the all-to-all leaves all ranks but one idle
      says({.context = ContextParallel::AllToAll}, "(key-value heads on only 1 of the " + std::to_string(mesh.size()) +
                                                   " ranks, at most 1 each)");
    if (split && mesh.size() > 1)
      says({}, "because Auto: the 1 key-value head does not divide evenly over the " + std::to_string(mesh.size()) +
                   " ranks the all-to-all would spread them over");
    auto q5 = ts::distribute<TQ>(mesh, global_random<5>({2, 5, 4, 2, 1}, 45));
    if (split) {
      const std::string cross = ts::nn::explain_attention(q5, k, k, {.causal = false, .context = ContextParallel::Ring});
      INFO(cross);
      TS_REQUIRE_ALL(cross.rfind("bidirectional cross-attention (5 queries, 9 keys); all-to-all (Ulysses)", 0) == 0);
      TS_REQUIRE_ALL(cross.find("the ring needs as many queries as keys (5 queries, 9 keys) (.context = Ring cannot be "
                                "taken)") != std::string::npos);
    }
    // In the kernel's own layout nothing moves; bad options are the attention's errors.
    auto qk = ts::distribute<QS5>(mesh, gq);
    auto kk = ts::distribute<KS4>(mesh, gk);
    TS_REQUIRE_ALL(ts::nn::explain_attention(qk, kk, kk).rfind("causal; in place: each rank attends its own", 0) == 0);
    TS_REQUIRE_ALL(error_text([&] { (void)ts::nn::explain_attention(q, k, k, {.window = -1}); })
                       .find("tshard::nn::explain_attention: a window of -1 keys") != std::string::npos);
    return std::tuple<>{};
  });
  // The 2P chunks even out causal work: with T a multiple of 2P every ring rank's queries see
  // the same number of keys (chunks i and 2P-1-i: (i + 1) + (2P - i) chunks' worth).
  for (int P = 1; P <= 6; ++P) {
    const ts::nn::detail::ZigzagChunks z(2 * P * 5, P);
    std::vector<Eigen::Index> work(std::size_t(P), 0);
    for (Eigen::Index t = 0; t < z.T; ++t) work[std::size_t(z.owner(t))] += t + 1;
    CHECK(std::all_of(work.begin(), work.end(), [&](Eigen::Index w) { return w == work[0]; }));
  }
}

TEST_CASE("packed documents: a query attends its own document only, on the local kernel, the ring and the "
          "all-to-all, equal to the written-out attention, finite differences and one rank",
          "[ad][attention][documents]") {
  using ts::nn::ContextParallel;
  const std::vector<std::vector<Eigen::Index>> three{{0, 3}, {0}, {0, 1, 5}};
  check_attention<QS5, 5>("documents, causal", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {.document_starts = three});
  check_attention<QS5, 5>("documents, bidirectional", {3, 7, 4, 2, 3}, {3, 7, 4, 3},
                          {.causal = false, .document_starts = three});
  check_attention<QS5, 5>("documents, causal window 2", {3, 7, 4, 2, 3}, {3, 7, 4, 3},
                          {.window = 2, .document_starts = three});
  check_attention<KS4, 4>("documents, multi-head", {3, 7, 4, 5}, {3, 7, 4, 5}, {.document_starts = three});
  // The sequence split: documents that cross the ring's chunks and ranks.
  const std::vector<std::vector<Eigen::Index>> two{{0, 4, 9}, {0, 6}};
  check_attention<SeqQS5, 5, SeqKS4>("documents, ring", {2, 11, 3, 2, 3}, {2, 11, 3, 3},
                             {.context = ContextParallel::Ring, .document_starts = two});
  check_attention<SeqQS5, 5, SeqKS4>("documents, ring, bidirectional window 3", {2, 11, 3, 1, 2}, {2, 11, 3, 2},
                             {.causal = false, .window = 3, .context = ContextParallel::Ring, .document_starts = two});
  check_attention<SeqQS5, 5, SeqKS4>("documents, all-to-all", {2, 11, 3, 2, 3}, {2, 11, 3, 3},
                             {.context = ContextParallel::AllToAll, .document_starts = two});
  check_attention<ts::Spec<ts::S<"y">, ts::S<"x">, ts::R, ts::R, ts::R>, 5, ts::Spec<ts::R, ts::S<"x", "y">, ts::R, ts::R>>(
      "documents, ring, batch over y", {2, 9, 4, 2, 1}, {2, 9, 4, 1},
      {.context = ContextParallel::Ring, .document_starts = {{0, 4, 8}, {0, 6}}});
  // Several key blocks: whole blocks outside a query block's documents are skipped.
  check_attention<SeqQS5, 5, SeqKS4>("documents, 300 positions", {1, 300, 2, 1, 2}, {1, 300, 2, 2},
                             {.context = ContextParallel::Ring, .document_starts = {{0, 7, 130, 131, 290}}});
  check_attention<QS5, 5>("documents, 300 positions, local", {1, 300, 2, 1, 1}, {1, 300, 2, 1},
                          {.causal = false, .document_starts = {{0, 7, 130, 131, 290}}});

  // Bad starts: one clear error on every rank.
  const M mesh({world_size(), 1});
  auto q = ts::distribute<QS5>(mesh, global_random<5>({2, 9, 4, 1, 1}, 70));
  auto k = ts::distribute<KS4>(mesh, global_random<4>({2, 9, 4, 1}, 71));
  auto k12 = ts::distribute<KS4>(mesh, global_random<4>({2, 12, 4, 1}, 72));
  auto says = [&](const std::vector<std::vector<Eigen::Index>>& starts, const std::string& text, bool cross = false) {
    std::string what;
    try {
      if (cross) (void)ts::nn::scaled_dot_product_attention(q, k12, k12, {.document_starts = starts});
      else (void)ts::nn::scaled_dot_product_attention(q, k, k, {.document_starts = starts});
    } catch (const ts::Error& e) {
      what = e.what();
    }
    INFO(what);
    TS_REQUIRE_ALL(what.find(text) != std::string::npos);
  };
  says({{0}}, "document_starts has 1 rows for a batch of 2");
  says({{0}, {0, 5, 5}}, "document_starts[1] must ascend from 0 below the sequence length 9 (or end with it), and has 5 after 5");
  says({{1}, {0}}, "document_starts[0] must ascend from 0 below the sequence length 9 (or end with it), and has 1 first");
  says({{0, 10}, {0}}, "and has 10 after 0");
  says({{0, 9, 9}, {0}}, "document_starts[0] must ascend from 0 below the sequence length 9 (or end with it), and has 9 "
                         "after 0");
  check_attention<QS5, 5>("documents, a last start at the row's end (cu_seqlens' total)", {2, 7, 4, 1, 2}, {2, 7, 4, 2},
                          {.document_starts = {{0, 3, 7}, {0, 7}}});
  check_attention<SeqQS5, 5, SeqKS4>("documents, ring, a last start at the row's end", {2, 11, 3, 1, 2}, {2, 11, 3, 2},
                                     {.context = ts::nn::ContextParallel::Ring, .document_starts = {{0, 4, 11}, {0, 11}}});
  says({{0}, {}}, "document_starts[1] is empty ({0}: the row is one document)");
  says({{0}, {0}}, "packed documents are self-attention: 9 queries, 12 keys here", true);

  // The starts from token ids [B, T] (a document ends at each eod token; one that ends a row starts
  // nothing), the same on every rank whatever splits the ids.
  const Eigen::Index B = 3, T = 7, eod = 2;
  const std::int32_t rows[B][T] = {{2, 0, 1, 2, 2, 1, 2}, {1, 1, 1, 1, 1, 1, 1}, {0, 1, 2, 3, 4, 5, 6}};
  const std::vector<std::vector<Eigen::Index>> want{{0, 1, 4, 5}, {0}, {0, 3}};
  auto id = [&](const auto& i) { return rows[i[0]][i[1]]; };
  TS_REQUIRE_ALL(ts::nn::document_starts(ts::from_function<std::int32_t, ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, {B, T}, id), eod) == want);
  TS_REQUIRE_ALL(ts::nn::document_starts(ts::from_function<std::int32_t, ts::Spec<ts::R, ts::S<"x">>>(mesh, {B, T}, id), eod) == want);
  // Positions counted from each document's start (Megatron's --reset-position-ids).
  std::vector<Eigen::Index> restarted;
  for (Eigen::Index p = 0; p < T; ++p) restarted.push_back(ts::nn::position_in_document(want[0], p));
  TS_REQUIRE_ALL(restarted == std::vector<Eigen::Index>{0, 0, 1, 2, 0, 0, 1});
}

TEST_CASE("keys packed apart (key_document_starts): query document j sees key document j, positions within the pair; "
          "cross-attention, key padding, causal pairs, a split sequence; equal to the written-out attention, finite "
          "differences and one rank",
          "[ad][attention][documents]") {
  using ts::nn::ContextParallel;
  // Encoder-decoder pairs: row 0 two of each, row 1 one query document over the first 4 of 11 keys
  // (key padding), row 2 three of each.
  const ts::nn::AttentionOptions pairs{.causal = false,
                                       .document_starts = {{0, 3}, {0}, {0, 2, 5}},
                                       .key_document_starts = {{0, 6}, {0, 4}, {0, 1, 7}}};
  check_attention<QS5, 5>("key documents, cross-attention", {3, 7, 4, 2, 3}, {3, 11, 4, 3}, pairs);
  // BERT's key padding mask: one query document, the keys past each row's length hidden; ALiBi
  // measured within the pair.
  const std::vector<double> slopes{0.5, 0.25, 0.125, 0.0625, 1.5, -0.3};
  // (row 1 not padded, {0, S}; row 2 padded whole, {0, 0}: its queries see no key)
  check_attention<QS5, 5>("key padding, bidirectional, ALiBi", {3, 7, 4, 2, 3}, {3, 7, 4, 3},
                          {.causal = false, .alibi_slopes = slopes, .key_document_starts = {{0, 5}, {0, 7}, {0, 0}}});
  // More query documents than key documents (row 0's second sees none), and empty key documents.
  check_attention<QS5, 5>("key documents, some query documents without keys", {3, 7, 4, 2, 3}, {3, 5, 4, 3},
                          {.causal = false, .document_starts = {{0, 2}, {0, 3, 5}, {0}},
                           .key_document_starts = {{0}, {0, 0, 4}, {0, 5}}});
  // Causal with more queries than keys: each pair bottom-right, its first queries seeing none.
  check_attention<QS5, 5>("key documents, causal, more queries than keys", {2, 9, 3, 1, 2}, {2, 7, 3, 2},
                          {.document_starts = {{0, 5}, {0}}, .key_document_starts = {{0, 3}, {0, 7}}});
  // Causal pairs, bottom-right within each (row 2: 7 queries over 2 keys, the first 5 see none),
  // a window, and a key document no query document reads (row 1's third).
  check_attention<QS5, 5>("key documents, causal, window 3", {3, 7, 4, 2, 3}, {3, 11, 4, 3},
                          {.window = 3, .document_starts = {{0, 4}, {0, 2}, {0}}, .alibi_slopes = slopes,
                           .key_document_starts = {{0, 6}, {0, 3, 9}, {0, 2}}});
  check_attention<KS4, 4>("key documents, multi-head, softcap", {3, 7, 4, 5}, {3, 9, 4, 5},
                          {.causal = false, .document_starts = {{0, 3}, {0}, {0, 1, 5}}, .softcap = 0.4,
                           .key_document_starts = {{0, 2}, {0, 8}, {0, 4, 5}}});
  // A split sequence: the all-to-all attends (the ring asked for or not), with dropout.
  check_attention<SeqQS5, 5, SeqKS4>("key documents, all-to-all, ring asked", {3, 7, 4, 2, 3}, {3, 11, 4, 3},
                                     {.causal = false, .context = ContextParallel::Ring,
                                      .document_starts = pairs.document_starts,
                                      .dropout = {.p = 0.3, .seed = 5},
                                      .key_document_starts = pairs.key_document_starts});
  check_attention<SeqQS5, 5, SeqKS4>("key padding, self-attention over a split sequence", {2, 9, 3, 1, 2}, {2, 9, 3, 2},
                                     {.causal = false, .context = ContextParallel::Ring,
                                      .key_document_starts = {{0, 6}, {0}}});
  // Several blocks of each: query blocks that cross pairs, key blocks no query of a block sees.
  check_attention<QS5, 5>("key documents, 150 queries over 300 keys", {1, 150, 2, 1, 2}, {1, 300, 2, 2},
                          {.document_starts = {{0, 70, 71}}, .key_document_starts = {{0, 140, 141, 290}}});
  check_attention<QS5, 5>("key documents, 150 queries over 300 keys, the last query documents without keys",
                          {1, 150, 2, 1, 2}, {1, 300, 2, 2},
                          {.document_starts = {{0, 70, 71}}, .key_document_starts = {{0, 140}}});
  check_attention<QS5, 5>("key documents, bidirectional, a block across a pair and one without keys",
                          {1, 150, 2, 1, 1}, {1, 300, 2, 1},
                          {.causal = false, .document_starts = {{0, 100}}, .key_document_starts = {{0}}});

  // What explain_attention says of them, and bad starts: one clear error on every rank.
  const M mesh({world_size(), 1});
  auto q = ts::distribute<SeqQS5>(mesh, global_random<5>({2, 9, 4, 1, 1}, 70));
  auto k = ts::distribute<SeqKS4>(mesh, global_random<4>({2, 12, 4, 1}, 71));
  const std::string said = ts::nn::explain_attention(q, k, k, {.causal = false, .key_document_starts = {{0, 5}, {0}}});
  INFO(said);
  TS_REQUIRE_ALL(said.rfind("bidirectional, keys packed apart (9 queries, 12 keys; query document j sees key document j)",
                            0) == 0);
  if (world_size() > 1) {
    TS_REQUIRE_ALL(said.find("the ring needs as many queries as keys") != std::string::npos);
    auto k9 = ts::distribute<SeqKS4>(mesh, global_random<4>({2, 9, 4, 1}, 73));
    const std::string self = ts::nn::explain_attention(q, k9, k9, {.key_document_starts = {{0, 5}, {0}}});
    INFO(self);
    TS_REQUIRE_ALL(self.find("because the ring takes the queries' documents for the keys' (key_document_starts packs "
                             "them apart)") != std::string::npos);
  }
  auto says = [&](const ts::nn::AttentionOptions& o, const std::string& text) {
    const std::string what = error_text([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, o); });
    INFO(what);
    TS_REQUIRE_ALL(what.find(text) != std::string::npos);
  };
  says({.causal = false, .key_document_starts = {{0}}}, "key_document_starts has 1 rows for a batch of 2");
  says({.causal = false, .key_document_starts = {{0}, {0, 13}}},
       "key_document_starts[1] must rise from 0 to at most the key count 12, and has 13 after 0");
  says({.causal = false, .key_document_starts = {{0, 5, 3}, {0}}},
       "key_document_starts[0] must rise from 0 to at most the key count 12, and has 3 after 5");
  says({.causal = false, .document_starts = {{0}, {0, 10}}, .key_document_starts = {{0}, {0}}},
       "document_starts[1] must ascend from 0 below the query count 9 (or end with it), and has 10 after 0");
  says({.causal = false, .key_document_starts = {{0}, {}}}, "key_document_starts[1] is empty");
  says({.causal = false, .document_starts = {{0}, {0}}}, "(key_document_starts packs the keys apart, as flash-attn's "
                                                         "cu_seqlens_k)");
}

TEST_CASE("attention dropout: the fused kernels drop what the written-out attention's mask drops, on the local "
          "kernel, the ring and the all-to-all, with gradients equal to finite differences and one rank",
          "[ad][attention][dropout]") {
  using ts::nn::ContextParallel;
  const ts::nn::AttentionDropout drop{.p = 0.3, .seed = 17};
  check_attention<QS5, 5>("dropout, causal", {3, 7, 4, 2, 3}, {3, 7, 4, 3}, {.dropout = drop});
  check_attention<QS5, 5>("dropout, bidirectional cross-attention", {3, 7, 4, 2, 3}, {3, 5, 4, 3},
                          {.causal = false, .dropout = drop});
  check_attention<QS5, 5>("dropout, 3 queries after 4 cached keys, window 3", {3, 3, 4, 2, 3}, {3, 7, 4, 3},
                          {.window = 3, .dropout = drop});
  check_attention<KS4, 4>("dropout, multi-head, rows 5.. of a larger batch", {3, 7, 4, 5}, {3, 7, 4, 5},
                          {.dropout = {.p = 0.5, .seed = 3, .row_offset = 5}});
  check_attention<QS5, 5>("dropout, 150 positions (several blocks)", {1, 150, 2, 2, 2}, {1, 150, 2, 2},
                          {.dropout = drop});
  check_attention<QS5, 5>("dropout, documents", {3, 7, 4, 2, 3}, {3, 7, 4, 3},
                          {.document_starts = {{0, 3}, {0}, {0, 1, 5}}, .dropout = drop});
  // The sequence split: the ring's chunks and the all-to-all's heads draw the global masks.
  check_attention<SeqQS5, 5, SeqKS4>("dropout, ring", {2, 11, 3, 2, 3}, {2, 11, 3, 3},
                                     {.context = ContextParallel::Ring, .dropout = drop});
  check_attention<SeqQS5, 5, SeqKS4>("dropout, ring, bidirectional, documents", {2, 11, 3, 1, 2}, {2, 11, 3, 2},
                                     {.causal = false, .context = ContextParallel::Ring,
                                      .document_starts = {{0, 4, 9}, {0, 6}}, .dropout = drop});
  check_attention<SeqQS5, 5, SeqKS4>("dropout, all-to-all", {2, 11, 3, 2, 3}, {2, 11, 3, 3},
                                     {.context = ContextParallel::AllToAll, .dropout = drop});
  check_attention<SeqQS5, 5, SeqKS4>("dropout, ring, 150 positions", {1, 150, 2, 1, 2}, {1, 150, 2, 2},
                                     {.context = ContextParallel::Ring, .dropout = drop});

  // The mask keeps 1 - p of the probabilities, independently of position, head and seed.
  for (const double p : {0.1, 0.5}) {
    const ts::nn::AttentionDropout d{.p = p, .seed = 5};
    double dropped = 0, same_as_next_seed = 0, n = 0, neither = 0;
    for (Eigen::Index b = 0; b < 4; ++b)
      for (Eigen::Index h = 0; h < 4; ++h)
        for (Eigen::Index t = 0; t < 100; ++t)
          for (Eigen::Index s2 = 0; s2 < 150; ++s2, ++n) {
            const double z = ts::nn::detail::dropout_multiplier_at(d, b, h, 0, t, s2);
            neither += z != 0 && std::abs(z - 1 / (1 - p)) > 1e-15;
            dropped += z == 0;
            same_as_next_seed += z == ts::nn::detail::dropout_multiplier_at({.p = p, .seed = 6}, b, h, 0, t, s2);
          }
    INFO("p " << p << ": dropped " << dropped / n << ", the same as seed 6's " << same_as_next_seed / n);
    CHECK(neither == 0);
    CHECK(std::abs(dropped / n - p) < 4 * std::sqrt(p * (1 - p) / n));
    CHECK(std::abs(same_as_next_seed / n - (p * p + (1 - p) * (1 - p))) < 4 * std::sqrt(0.25 / n));
  }

  // It drops something, differently for another seed, and a probability outside [0, 1) is refused
  // on every rank.
  const M mesh({world_size(), 1});
  auto q = ts::distribute<QS5>(mesh, global_random<5>({2, 9, 4, 1, 1}, 80));
  auto k = ts::distribute<KS4>(mesh, global_random<4>({2, 9, 4, 1}, 81));
  const auto plain = ts::nn::scaled_dot_product_attention(q, k, k).gather();
  const auto seed17 = ts::nn::scaled_dot_product_attention(q, k, k, {.dropout = drop}).gather();
  const auto seed18 = ts::nn::scaled_dot_product_attention(q, k, k, {.dropout = {.p = 0.3, .seed = 18}}).gather();
  TS_REQUIRE_ALL(compare(plain, seed17, 1e-3) != "");
  TS_REQUIRE_ALL(compare(seed17, seed18, 1e-3) != "");
  for (const double p : {1.0, -0.1}) {
    std::string what;
    try {
      (void)ts::nn::scaled_dot_product_attention(q, k, k, {.dropout = {.p = p}});
    } catch (const ts::SpecError& e) {
      what = e.what();
    }
    INFO(what);
    TS_REQUIRE_ALL(what.find("attention dropout drops with a probability in [0, 1)") != std::string::npos);
  }
}

// What the cases above combine a few at a time, drawn together from a seed: batch, sequence
// lengths (1 to 200; keys as many, or without documents more or fewer), head dim, groups,
// key-value heads, causal or not, windows, packed documents (the keys' apart too), dropout and its row offset, the way
// a split sequence goes, and three layouts (batch and heads split; the sequence over x; over both
// axes), each on every mesh. TSHARD_ATTENTION_SWEEP draws more than 24, TSHARD_ATTENTION_SWEEP_SEED
// other ones.
TEST_CASE("a seeded sweep of attention's shapes, options and layouts equals the written-out attention and one rank",
          "[ad][attention][sweep]") {
  long draws = 24;
  if (const char* n = std::getenv("TSHARD_ATTENTION_SWEEP")) draws = std::atol(n);
  std::uint64_t seed = 2026;
  if (const char* n = std::getenv("TSHARD_ATTENTION_SWEEP_SEED")) seed = std::strtoull(n, nullptr, 10);
  std::mt19937_64 gen(seed);
  auto pick = [&](Eigen::Index lo, Eigen::Index hi) { return std::uniform_int_distribution<Eigen::Index>(lo, hi)(gen); };
  for (long d = 0; d < draws; ++d) {
    const Eigen::Index B = pick(1, 3), T = pick(0, 3) == 0 ? pick(41, 200) : pick(1, 40);
    const Eigen::Index Dh = pick(1, 9), G = pick(1, 3), KV = pick(1, 4);
    ts::nn::AttentionOptions o;
    o.causal = pick(0, 2) != 0;
    const bool packed = pick(0, 2) == 0;
    Eigen::Index S = T;
    if (!packed && pick(0, 3) == 0) S = o.causal ? T + pick(0, 5) : pick(1, 40);
    if (pick(0, 2) == 0) o.window = pick(1, std::max(T, S));
    if (packed) {
      o.document_starts.assign(std::size_t(B), {0});
      for (auto& row : o.document_starts)
        for (Eigen::Index p = 1; p < T; ++p)
          if (pick(0, 5) == 0) row.push_back(p);
    }
    if (pick(0, 3) == 0) o.dropout = {.p = 0.25, .seed = gen(), .row_offset = pick(0, 3)};
    o.context = ts::nn::ContextParallel(pick(0, 2));
    const int layout = int(pick(0, 2));
    if (pick(0, 2) == 0)
      for (Eigen::Index h = 0; h < G * KV; ++h) o.alibi_slopes.push_back(std::ldexp(1.0, -int(pick(0, 8))));
    if (pick(0, 3) == 0) o.softcap = 0.25 * double(pick(1, 8));
    if (pick(0, 3) == 0) {  // keys packed apart: as many keys or more (causal), any number (bidirectional)
      S = o.causal ? T + pick(0, 30) : pick(1, 200);
      o.window = std::min(o.window, std::max(T, S));
      o.key_document_starts.assign(std::size_t(B), {0});
      for (auto& row : o.key_document_starts)
        for (Eigen::Index p = 1; p < S; ++p)
          if (pick(0, 5) == 0) row.push_back(p);
    }
    std::ostringstream what;
    what << "draw " << d << ": q [" << B << ", " << T << ", " << Dh << ", " << G << ", " << KV << "], S " << S
         << (o.causal ? ", causal" : ", bidirectional") << ", window " << o.window << (packed ? ", documents" : "")
         << ", dropout " << o.dropout.p << " (row offset " << o.dropout.row_offset << "), context "
         << int(o.context) << ", layout " << layout << (o.alibi_slopes.empty() ? "" : ", ALiBi") << ", softcap "
         << o.softcap << (o.key_document_starts.empty() ? "" : ", keys packed apart");
    const std::array<Eigen::Index, 5> qshape{B, T, Dh, G, KV};
    const std::array<Eigen::Index, 4> kshape{B, S, Dh, KV};
    const unsigned values = 300 + 3 * unsigned(d);
    if (layout == 0)
      check_attention<QS5, 5>(what.str(), qshape, kshape, o, values, false);
    else if (layout == 1)
      check_attention<SeqQS5, 5, SeqKS4>(what.str(), qshape, kshape, o, values, false);
    else
      check_attention<ts::Spec<ts::R, ts::S<"x", "y">, ts::R, ts::R, ts::R>, 5, ts::Spec<ts::R, ts::S<"x", "y">, ts::R, ts::R>>(
          what.str(), qshape, kshape, o, values, false);
  }
}

TEST_CASE("alibi_slopes are the ALiBi paper's: geometric for a power of two heads, then every other slope of the "
          "next power for the heads left over", "[attention]") {
  // (the paper's get_slopes, in Python, printed with repr)
  CHECK(ts::nn::alibi_slopes(1) == std::vector<double>{0.00390625});
  CHECK(ts::nn::alibi_slopes(8) ==
        std::vector<double>{0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625});
  CHECK(ts::nn::alibi_slopes(6) == std::vector<double>{0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125});
  const std::vector<double> twelve{0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
                                   0.7071067811865476, 0.35355339059327384, 0.17677669529663692, 0.08838834764831849};
  const auto got = ts::nn::alibi_slopes(12);
  REQUIRE(got.size() == twelve.size());
  for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(twelve[i]).epsilon(1e-15));
  REQUIRE_THROWS_AS(ts::nn::alibi_slopes(0), ts::ShapeError);
}

TEST_CASE("fused attention in float equals it in double to float's rounding: causal, "
          "bidirectional, windows, cross-attention, rows that see no key, lengths off the vector width, ALiBi, softcap",
          "[attention]") {
  const M mesh({world_size(), 1});
  struct Case {
    std::array<Eigen::Index, 5> q;
    Eigen::Index S;
    ts::nn::AttentionOptions o;
  };
  const Case cases[] = {{{2, 37, 8, 2, 1}, 37, {}},
                        {{2, 37, 8, 2, 1}, 37, {.causal = false}},
                        {{1, 150, 5, 1, 2}, 150, {.window = 5}},
                        {{1, 150, 5, 1, 2}, 150, {.causal = false, .window = 17}},
                        {{2, 19, 8, 1, 1}, 150, {}},                            // 19 queries after 131 cached keys
                        {{2, 40, 4, 1, 1}, 9, {.causal = false, .window = 3}},   // queries past 11 see no key
                        {{2, 37, 8, 2, 1}, 37, {.alibi_slopes = {0.5, 0.03}, .softcap = 2}}};
  unsigned seed = 60;
  for (const auto& c : cases) {
    const auto gq = global_random<5>(c.q, seed++, -3, 3);
    const auto gk = global_random<4>({c.q[0], c.S, c.q[2], c.q[4]}, seed++, -3, 3);
    const auto gv = global_random<4>({c.q[0], c.S, c.q[2], c.q[4]}, seed++);
    const auto gw = global_random<5>(c.q, seed++);  // the loss's weights: a cotangent of every sign
    auto run = [&](auto zero) {
      using T = decltype(zero);
      auto q = ts::distribute<QS5>(mesh, Eigen::Tensor<T, 5>(gq.cast<T>()));
      auto k = ts::distribute<KS4>(mesh, Eigen::Tensor<T, 4>(gk.cast<T>()));
      auto v = ts::distribute<KS4>(mesh, Eigen::Tensor<T, 4>(gv.cast<T>()));
      const auto w = ts::distribute<QS5>(mesh, Eigen::Tensor<T, 5>(gw.cast<T>()));
      const auto [out, lse] = ts::nn::scaled_dot_product_attention_forward(q, k, v, c.o);
      const auto [loss, dq, dk, dv] = ts::ad::value_and_grad(
          [&](const auto& q, const auto& k, const auto& v) {
            return ts::sum<0, 1, 2, 3, 4>(ts::nn::scaled_dot_product_attention(q, k, v, c.o) * w);
          },
          q, k, v);
      (void)loss;
      return std::tuple{Eigen::Tensor<double, 5>(out.gather().template cast<double>()),
                        Eigen::Tensor<double, 4>(lse.gather().template cast<double>()),
                        Eigen::Tensor<double, 5>(dq.gather().template cast<double>()),
                        Eigen::Tensor<double, 4>(dk.gather().template cast<double>()),
                        Eigen::Tensor<double, 4>(dv.gather().template cast<double>())};
    };
    const auto f = run(0.0f);
    const auto d = run(0.0);
    // Each relative to its tensor's largest element (rows that see no key are 0 and -inf in both).
    auto agree = [](const auto& got, const auto& want, const char* what) {
      double top = 0, worst = 0;
      bool same_masked = true;
      for (Eigen::Index i = 0; i < want.size(); ++i) {
        if (std::isinf(want.data()[i])) {
          same_masked = same_masked && got.data()[i] == want.data()[i];
          continue;
        }
        top = std::max(top, std::abs(want.data()[i]));
        worst = std::max(worst, std::abs(got.data()[i] - want.data()[i]));
      }
      INFO(what << ": largest difference " << worst << " of a largest element " << top);
      TS_REQUIRE_ALL(same_masked);
      TS_REQUIRE_ALL(worst <= 1e-5 * std::max(top, 1.0));
    };
    INFO("T " << c.q[1] << ", S " << c.S << ", causal " << c.o.causal << ", window " << c.o.window);
    agree(std::get<0>(f), std::get<0>(d), "output");
    agree(std::get<1>(f), std::get<1>(d), "log-sum-exp");
    agree(std::get<2>(f), std::get<2>(d), "dq");
    agree(std::get<3>(f), std::get<3>(d), "dk");
    agree(std::get<4>(f), std::get<4>(d), "dv");
  }
}

TEST_CASE("scaled_dot_product_attention holds no T x T tensor, and refuses bad options on every rank", "[attention]") {
  const M mesh({world_size(), 1});
  const Eigen::Index T = 256;
  auto q = ts::distribute<QS5>(mesh, global_random<5>({2, T, 4, 1, 1}, 50));
  auto k = ts::distribute<KS4>(mesh, global_random<4>({2, T, 4, 1}, 51));
  auto v = ts::distribute<KS4>(mesh, global_random<4>({2, T, 4, 1}, 54));
  ts::reset_pool_peak();
  const auto before = ts::pool_stats().bytes_in_use;
  auto [loss, dq, dk, dv] = ts::ad::value_and_grad(
      [](const auto& q, const auto& k, const auto& v) {
        return ts::sum<0, 1, 2, 3, 4>(ts::square(ts::nn::scaled_dot_product_attention(q, k, v)));
      },
      q, k, v);
  const auto peak = ts::pool_stats().peak_bytes_in_use - before;
  INFO("pool peak " << peak << " bytes; one T x T score matrix is " << T * T * 8);
  TS_REQUIRE_ALL(peak < std::uint64_t(T * T * 8 / 4));

  auto says = [&](auto&& f, const std::string& text) {
    const std::string what = error_text(f);
    INFO(what);
    TS_REQUIRE_ALL(what.find(text) != std::string::npos);
  };
  auto k5 = ts::distribute<KS4>(mesh, global_random<4>({2, 5, 4, 1}, 52));
  auto k3 = ts::distribute<KS4>(mesh, global_random<4>({2, T, 3, 1}, 53));
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.window = T + 1}); }, "a window of 257 keys");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k5, k5); }, "at least as many keys as queries");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.window = T + 1}); }, "for 256 queries over 256 keys");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k3, k3, {.causal = false}); },
       "the queries' head dim 4 differs from the keys' 3");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.scale = -1}); },
       "the scale must be finite and at least 0 (0 for 1 / sqrt(Dh)), not -1");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.dropout = {.p = 1.0000001}}); },
       "in [0, 1), not 1.0000001");
  const double inf = std::numeric_limits<double>::infinity();
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.softcap = -2}); },
       "the softcap must be finite and at least 0 (0 for none), not -2");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.softcap = inf}); }, "not inf");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.alibi_slopes = {0.5, 0.25}}); },
       "ALiBi takes one slope per query head: the queries have 1, alibi_slopes 2");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k, {.alibi_slopes = {-inf}}); },
       "alibi_slopes[0] is -inf, not a finite number");
  // Keys and values that differ, named as such; PyTorch's [B, T, Dh, H] queries with fewer
  // key-value heads: pointed to the grouped form.
  says([&] { (void)ts::nn::scaled_dot_product_attention(q, k, k5, {.causal = false}); }, "and values [2, 5, 4, 1] differ");
  auto q4 = ts::distribute<KS4>(mesh, global_random<4>({2, T, 4, 6}, 55));
  auto k2 = ts::distribute<KS4>(mesh, global_random<4>({2, T, 4, 2}, 56));
  says([&] { (void)ts::nn::scaled_dot_product_attention(q4, k2, k2); }, "the queries have 6 heads, the keys 2");
  says([&] { (void)ts::nn::scaled_dot_product_attention(q4, k2, k2); }, "{B, T, Dh, 3, 2}) puts query head h on key-value head h / G");
  // Grouped: 3 query heads on each of 2 key-value heads, 6 slopes wanted.
  auto qg = ts::distribute<QS5>(mesh, global_random<5>({2, T, 4, 3, 2}, 59));
  says([&] { (void)ts::nn::scaled_dot_product_attention(qg, k2, k2, {.alibi_slopes = {0.5, 0.25}}); },
       "the queries have 6, alibi_slopes 2 (query head g of key-value head h takes alibi_slopes[h * G + g])");
  // A sequence split is resharded for the kernel: the error names the caller's layout, not that.
  using SeqQ = ts::Spec<ts::R, ts::S<"x">, ts::R, ts::R, ts::R>;
  using SeqK = ts::Spec<ts::R, ts::S<"x">, ts::R, ts::R>;
  auto qs = ts::distribute<SeqQ>(mesh, global_random<5>({2, T, 4, 1, 1}, 57));
  auto ks = ts::distribute<SeqK>(mesh, global_random<4>({2, T, 3, 1}, 58));
  says([&] { (void)ts::nn::scaled_dot_product_attention(qs, ks, ks); }, "queries " + qs.describe() + ", keys " + ks.describe());
}

TEST_CASE("an in-place update of a parameter under a gradient is refused; of a copy it is differentiated", "[ad]") {
  const M mesh({world_size(), 1});
  struct Scaled : ts::nn::Module {
    ts::ShardedTensor<double, M, XR>& w;
    explicit Scaled(const M& mesh) : w(register_parameter("w", ts::random<double, XR>(mesh, {5, 3}, 30))) {}
  } model(mesh);
  bool refused = false;
  try {
    ts::ad::backward(model, [&] {
      model.w *= 2.0;
      return ts::sum<0, 1>(model.w);
    });
  } catch (const ts::SpecError&) {
    refused = true;
  }
  TS_REQUIRE_ALL(refused);
  model.zero_grad();
  ts::ad::backward(model, [&] {
    auto copy = model.w;
    copy *= 3.0;
    copy += model.w;
    return ts::sum<0, 1>(copy);
  });
  const Eigen::Tensor<double, 2> g = model.gradient_of(model.w).gather();
  TS_REQUIRE_ALL(compare(g, Eigen::Tensor<double, 2>(g.constant(4.0)), 1e-15) == "");
}

TEST_CASE("vjp: the pullback of any cotangent spec gives value_and_grad's gradients of <y, dy>; pending pullbacks keep apart",
          "[ad][vjp]") {
  const auto gx = global_random<2>({7, 5}, 91), gw1 = global_random<2>({5, 6}, 92);
  const auto gw2 = global_random<1>({6}, 93);
  const auto gdy = global_random<2>({7, 6}, 94), gdy2 = global_random<2>({7, 6}, 95);
  on_every_mesh("vjp", [&](const M& mesh) {
    const auto x = ts::distribute<XR>(mesh, gx);
    const auto w1 = ts::distribute<RY>(mesh, gw1);
    const auto w2 = ts::distribute<R1>(mesh, gw2);
    auto f = [&](const auto& a, const auto& b) { return ts::nn::gelu(ts::einsum<"bd,dh->bh">(x, a)) * b; };
    // Two forwards recorded before either pullback runs, as a pipeline's micro-batches are.
    auto [y, pullback] = ts::ad::vjp(f, w1, w2);
    auto [y2, pullback2] = ts::ad::vjp(f, W1Shift{}(w1), w2);
    static_assert(std::is_same_v<decltype(y), decltype(f(w1, w2))>, "vjp returns f's own result");
    TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(y.gather()), Eigen::Tensor<double, 2>(f(w1, w2).gather()), 0) == "");
    TS_REQUIRE_ALL(!ts::detail::tracked(y));  // the result is detached: the pullback holds its node
    // The cotangents come in other layouts than y's: a split one and a partial sum.
    const auto dy = ts::distribute<YX>(mesh, gdy);
    const auto dy2 = ts::sum<2>(ts::distribute<ts::Spec<ts::R, ts::R, ts::S<"x">>>(mesh, Stack2{}(gdy2)));
    auto [dw1b, dw2b] = pullback2(dy2);  // the later forward's pullback first
    auto [dw1, dw2] = pullback(dy);
    static_assert(std::is_same_v<decltype(dw1), std::remove_cvref_t<decltype(w1)>>, "a gradient has its primal's type");
    REQUIRE_THROWS_AS(pullback(dy), ts::SpecError);  // each pullback runs once
    // value_and_grad of <f(w), dy> is the reference.
    const auto dyr = ts::distribute<RR>(mesh, gdy);
    const auto dy2r = ts::distribute<RR>(mesh, Eigen::Tensor<double, 2>(gdy2 * 0.5));  // what dy2 sums to
    auto [l1, r1, r2] = ts::ad::value_and_grad([&](const auto& a, const auto& b) { return ts::sum<0, 1>(f(a, b) * dyr); }, w1, w2);
    auto [l2, s1, s2] = ts::ad::value_and_grad(
        [&](const auto& a, const auto& b) { return ts::sum<0, 1>(f(a, b) * dy2r); }, W1Shift{}(w1), w2);
    (void)l1;
    (void)l2;
    const std::string mismatch =
        compare(Eigen::Tensor<double, 2>(dw1.gather()), Eigen::Tensor<double, 2>(r1.gather()), 1e-12) +
        compare(Eigen::Tensor<double, 1>(dw2.gather()), Eigen::Tensor<double, 1>(r2.gather()), 1e-12) +
        compare(Eigen::Tensor<double, 2>(dw1b.gather()), Eigen::Tensor<double, 2>(s1.gather()), 1e-12) +
        compare(Eigen::Tensor<double, 1>(dw2b.gather()), Eigen::Tensor<double, 1>(s2.gather()), 1e-12);
    INFO(mismatch);
    TS_REQUIRE_ALL(mismatch.empty());
    // A scalar output is seeded with a number: d(3 loss) = 3 d loss.
    auto g = [&](const auto& a) { return ts::sum<0, 1>(ts::square(ts::einsum<"bd,dh->bh">(x, a))); };
    auto [loss, pb] = ts::ad::vjp(g, w1);
    auto [d3] = pb(3.0);
    auto [l3, d1] = ts::ad::value_and_grad(g, w1);
    TS_REQUIRE_ALL(std::abs(value_of(loss) - l3) <= 1e-12 * std::abs(l3));
    TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(d3.gather()), Eigen::Tensor<double, 2>((d1 * 3.0).gather()), 1e-12) == "");
    // A cotangent of another shape is a ShapeError on every rank.
    auto [y3, pb3] = ts::ad::vjp(f, w1, w2);
    REQUIRE_THROWS_AS(pb3(ts::distribute<RR>(mesh, global_random<2>({6, 7}, 96))), ts::ShapeError);
    return std::make_tuple(dw1.gather(), dw2.gather(), dw1b.gather());
  });
}

namespace {
// Two residual blocks h + (gelu(g) sigmoid(0.7 g)) w2 with g = h w1 (w1 column-, w2 row-parallel:
// its product a partial sum),
// each checkpointed under `policy` (or not, with none), the weights captured by reference and
// the input passed as the argument. Also reports the pool bytes in use once the forward is done
// (what the tape keeps for the backward, with the inputs).
template <class Mesh>
struct CheckpointedBlocks {
  std::optional<ts::ad::Recompute> policy;
  std::size_t* kept_bytes = nullptr;
  template <class X, class W1, class W2>
  auto operator()(const X& x, const W1& w1, const W2& w2) const {
    auto block = [&](const auto& h) {
      const auto g = ts::einsum<"bd,dh->bh">(h, w1);
      return X(h + ts::einsum<"bh,hd->bd">(ts::nn::gelu(g) * ts::sigmoid(g * 0.7), w2));
    };
    auto step = [&](const X& h) {
      if (!policy) return block(h);
      if (*policy == ts::ad::Recompute::Everything) return ts::ad::checkpoint(block, h);
      return ts::ad::checkpoint<ts::ad::Recompute::AllButProducts>(block, h);
    };
    const X y = step(step(x * x));
    auto loss = ts::sum<0, 1>(y * y);
    if (kept_bytes) *kept_bytes = ts::pool_stats().bytes_in_use;
    return loss;
  }
};
}  // namespace

TEST_CASE("checkpoint: recomputed gradients are the kept ones (inputs, captured weights, both policies); the forward "
          "keeps less",
          "[ad][checkpoint]") {
  using W1Spec = ts::Spec<ts::R, ts::S<"y">>;
  using W2Spec = ts::Spec<ts::S<"y">, ts::R>;
  const std::optional<ts::ad::Recompute> policies[] = {std::nullopt, ts::ad::Recompute::Everything,
                                                        ts::ad::Recompute::AllButProducts};
  for (const auto& policy : policies) {
    const std::string what = !policy ? "unchecked" : *policy == ts::ad::Recompute::Everything ? "full" : "selective";
    on_every_mesh("checkpointed blocks, " + what, [&](const M& mesh) {
      const auto x = ts::distribute<XR>(mesh, global_random<2>({9, 7}, 71));
      const auto w1 = ts::distribute<W1Spec>(mesh, global_random<2>({7, 11}, 72));
      const auto w2 = ts::distribute<W2Spec>(mesh, global_random<2>({11, 7}, 73));
      return checked_gradients(what, CheckpointedBlocks<M>{policy}, x, w1, w2);
    });
  }
  // Equal to the unchecked gradients to rounding, and what the forward leaves for the backward
  // shrinks: full < selective (its einsum outputs kept) < unchecked.
  const M mesh({world_size(), 1});
  const auto x = ts::distribute<XR>(mesh, global_random<2>({64, 24}, 71));
  const auto w1 = ts::distribute<RY>(mesh, global_random<2>({24, 96}, 72));
  const auto w2 = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, global_random<2>({96, 24}, 73));
  std::size_t kept[3] = {};
  std::vector<Eigen::Tensor<double, 2>> grads[3];
  for (int p = 0; p < 3; ++p) {
    const std::size_t before = ts::pool_stats().bytes_in_use;
    auto [loss, dx, dw1, dw2] = ts::ad::value_and_grad(CheckpointedBlocks<M>{policies[p], &kept[p]}, x, w1, w2);
    kept[p] -= before;
    grads[p] = {dx.gather(), dw1.gather(), dw2.gather()};
    (void)loss;
  }
  for (int p = 1; p < 3; ++p)
    for (int k = 0; k < 3; ++k) TS_REQUIRE_ALL(compare(grads[p][std::size_t(k)], grads[0][std::size_t(k)], 1e-14) == "");
  INFO("bytes kept after the forward: unchecked " << kept[0] << ", full " << kept[1] << ", selective " << kept[2]);
  TS_REQUIRE_ALL(kept[1] < kept[2]);
  TS_REQUIRE_ALL(kept[2] < kept[0]);
}

TEST_CASE("checkpoint: nested checkpoints, an output that is an input, and no gradient taken at all", "[ad][checkpoint]") {
  const M mesh({world_size(), 1});
  const auto a = ts::distribute<XR>(mesh, global_random<2>({7, 5}, 81));
  auto inner = [](const auto& v) { return ts::exp(v * 0.3) * v; };
  auto f_plain = [&](const auto& v) { return ts::sum<0, 1>(inner(inner(v)) * v); };
  auto f_nested = [&](const auto& v) {
    auto outer = [&](const auto& u) { return ts::ad::checkpoint(inner, ts::ad::checkpoint(inner, u)); };
    return ts::sum<0, 1>(ts::ad::checkpoint(outer, v) * ts::ad::checkpoint([](const auto& u) { return u; }, v));
  };
  auto [l0, g0] = ts::ad::value_and_grad(f_plain, a);
  auto [l1, g1] = ts::ad::value_and_grad(f_nested, a);
  TS_REQUIRE_ALL(std::abs(l0 - l1) <= 1e-15 * std::abs(l0));
  TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(g1.gather()), Eigen::Tensor<double, 2>(g0.gather()), 1e-14) == "");
  // Outside a gradient it is the function, and records nothing.
  auto y = ts::ad::checkpoint(inner, a);
  TS_REQUIRE_ALL(!ts::detail::tracked(y));
  TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(y.gather()), Eigen::Tensor<double, 2>(inner(a).gather()), 0) == "");
}
