// nn functions against serial Eigen references on every 2-D mesh of the world size, with the
// normalised dim split or not and shapes that do not divide; backward functions against
// central finite differences in double; vocab-split cross-entropy moves O(B) values.
#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;

namespace {

using T2 = Eigen::Tensor<double, 2>;
using T1 = Eigen::Tensor<double, 1>;

T2 serial_softmax_rows(const T2& x) {
  T2 p(x.dimension(0), x.dimension(1));
  for (Eigen::Index i = 0; i < x.dimension(0); ++i) {
    double m = -INFINITY, s = 0;
    for (Eigen::Index j = 0; j < x.dimension(1); ++j) m = std::max(m, x(i, j));
    for (Eigen::Index j = 0; j < x.dimension(1); ++j) s += std::exp(x(i, j) - m);
    for (Eigen::Index j = 0; j < x.dimension(1); ++j) p(i, j) = std::exp(x(i, j) - m) / s;
  }
  return p;
}

T2 serial_layer_norm(const T2& x, const T1& g, const T1& b, double eps) {
  T2 y(x.dimension(0), x.dimension(1));
  const double h = double(x.dimension(1));
  for (Eigen::Index i = 0; i < x.dimension(0); ++i) {
    double mu = 0, var = 0;
    for (Eigen::Index j = 0; j < x.dimension(1); ++j) mu += x(i, j) / h;
    for (Eigen::Index j = 0; j < x.dimension(1); ++j) var += (x(i, j) - mu) * (x(i, j) - mu) / h;
    for (Eigen::Index j = 0; j < x.dimension(1); ++j) y(i, j) = (x(i, j) - mu) / std::sqrt(var + eps) * g(j) + b(j);
  }
  return y;
}

double serial_cross_entropy(const T2& z, const Eigen::Tensor<std::int32_t, 1>& labels) {
  const T2 p = serial_softmax_rows(z);
  double l = 0;
  for (Eigen::Index i = 0; i < z.dimension(0); ++i) l -= std::log(p(i, labels(i)));
  return l / double(z.dimension(0));
}

// Central differences of f (a scalar function of a global tensor) at every element.
template <int R, class F>
Eigen::Tensor<double, R> finite_differences(Eigen::Tensor<double, R> x, F&& f, double h = 1e-6) {
  Eigen::Tensor<double, R> g(x.dimensions());
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    const double keep = x.data()[i];
    x.data()[i] = keep + h;
    const double up = f(x);
    x.data()[i] = keep - h;
    const double down = f(x);
    x.data()[i] = keep;
    g.data()[i] = (up - down) / (2 * h);
  }
  return g;
}

// sum(w * y) on every rank: the scalar whose gradient with respect to y is w.
template <class Y>
double weighted_sum(const Y& y, const T2& w) {
  const T2 g = y.gather();
  const Eigen::Tensor<double, 0> s = (g * w).sum();
  return s();
}

using Rows = ts::Spec<ts::S<"x">, ts::R>;
using Cols = ts::Spec<ts::R, ts::S<"y">>;
using Both = ts::Spec<ts::S<"x">, ts::S<"y">>;
using SpecsNN = TypeList<ts::Spec<ts::R, ts::R>, Rows, Cols, ts::Spec<ts::S<"y">, ts::S<"x">>, ts::Spec<ts::R, ts::S<"x", "y">>>;

}  // namespace

TEST_CASE("softmax and log_softmax over a split or whole dim equal the serial values", "[nn]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const T2 g = values(7, 5, 3) * 3.0;
    const T2 p = serial_softmax_rows(g);
    const T2 lp = p.log();
    Eigen::array<int, 2> swap{1, 0};
    const T2 pt = serial_softmax_rows(T2(g.shuffle(swap))).shuffle(swap);  // over dim 0
    for_each_type(SpecsNN{}, [&]<class S>(S*) {
      auto x = ts::distribute<S>(mesh, g);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", x " << x.describe());
      auto sm = ts::nn::softmax<1>(x);
      static_assert(std::is_same_v<typename decltype(sm)::SpecType, S>);
      TS_REQUIRE_ALL(compare(sm.gather(), p, 1e-14) == "");
      TS_REQUIRE_ALL(compare(ts::nn::log_softmax<1>(x).gather(), lp, 1e-13) == "");
      TS_REQUIRE_ALL(compare(ts::nn::softmax<0>(x).gather(), pt, 1e-14) == "");
      // Backward: dx = p (dp - sum(p dp)) and dlp - p sum(dlp).
      const T2 dp = values(7, 5, 9);
      auto d = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, dp);
      T2 want(7, 5), want_log(7, 5);
      for (int i = 0; i < 7; ++i) {
        double s = 0, t = 0;
        for (int j = 0; j < 5; ++j) s += p(i, j) * dp(i, j), t += dp(i, j);
        for (int j = 0; j < 5; ++j) want(i, j) = p(i, j) * (dp(i, j) - s), want_log(i, j) = dp(i, j) - p(i, j) * t;
      }
      TS_REQUIRE_ALL(compare(ts::nn::softmax_backward<1>(sm, d).gather(), want, 1e-14) == "");
      TS_REQUIRE_ALL(compare(ts::nn::log_softmax_backward<1>(ts::nn::log_softmax<1>(x), d).gather(), want_log, 1e-13) == "");
    });
  });
}

TEST_CASE("softmax, gelu and layer_norm backward equal central finite differences", "[nn]") {
  on_every_mesh([](M2& mesh, auto) {
    const T2 g = values(5, 7, 1), w = values(5, 7, 2);
    auto wt = ts::distribute<Both>(mesh, w);
    auto x = ts::distribute<Both>(mesh, g);
    // softmax
    const T2 fd_sm = finite_differences<2>(g, [&](const T2& v) { return weighted_sum(ts::nn::softmax<1>(ts::distribute<Both>(mesh, v)), w); });
    TS_REQUIRE_ALL(compare(ts::nn::softmax_backward<1>(ts::nn::softmax<1>(x), wt).gather(), fd_sm, 1e-8) == "");
    // gelu
    const T2 fd_gelu = finite_differences<2>(g, [&](const T2& v) { return weighted_sum(ts::nn::gelu(ts::distribute<Both>(mesh, v)), w); });
    TS_REQUIRE_ALL(compare(ts::nn::gelu_backward(x, wt).gather(), fd_gelu, 1e-8) == "");
    // relu: away from 0 the slope is 0 or 1
    T2 wr = (g > 0.0).select(w, w.constant(0.0));
    TS_REQUIRE_ALL(compare(ts::nn::relu_backward(x, wt).gather(), wr) == "");
    // layer_norm: dx, dgamma, dbeta, gamma and beta split like x's last dim or not
    const T1 gamma = values(7, 1, 3).reshape(std::array<Eigen::Index, 1>{7}) + 1.0;
    const T1 beta = values(7, 1, 4).reshape(std::array<Eigen::Index, 1>{7});
    const double eps = 1e-5;
    auto gm = ts::distribute<ts::Spec<ts::S<"y">>>(mesh, gamma);
    auto bt = ts::distribute<ts::Spec<ts::R>>(mesh, beta);
    TS_REQUIRE_ALL(compare(ts::nn::layer_norm<1>(x, gm, bt, eps).gather(), serial_layer_norm(g, gamma, beta, eps), 1e-12) == "");
    auto loss = [&](const T2& v, const T1& ga, const T1& be) {
      return weighted_sum(ts::nn::layer_norm<1>(ts::distribute<Both>(mesh, v), ts::distribute<ts::Spec<ts::S<"y">>>(mesh, ga),
                                                ts::distribute<ts::Spec<ts::R>>(mesh, be), eps),
                          w);
    };
    const T2 fd_x = finite_differences<2>(g, [&](const T2& v) { return loss(v, gamma, beta); });
    const T1 fd_g = finite_differences<1>(gamma, [&](const T1& v) { return loss(g, v, beta); });
    const T1 fd_b = finite_differences<1>(beta, [&](const T1& v) { return loss(g, gamma, v); });
    auto [dx, dgamma, dbeta] = ts::nn::layer_norm_backward<1>(x, gm, wt, eps);
    TS_REQUIRE_ALL(compare(dx.gather(), fd_x, 1e-7) == "");
    TS_REQUIRE_ALL(compare(dgamma.gather(), fd_g, 1e-7) == "" && compare(dbeta.gather(), fd_b, 1e-7) == "");
  });
}

TEST_CASE("cross_entropy over a vocabulary split any way equals the serial loss and moves O(B) values", "[nn]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const Eigen::Index B = 7, V = 301;
    const T2 z = values(B, V, 5) * 4.0;
    Eigen::Tensor<std::int32_t, 1> labels(B);
    for (Eigen::Index b = 0; b < B; ++b) labels(b) = std::int32_t((b * 97 + 13) % V);
    const double want = serial_cross_entropy(z, labels);
    T2 grad = serial_softmax_rows(z);
    for (Eigen::Index b = 0; b < B; ++b) grad(b, labels(b)) -= 1;
    grad = grad / double(B);
    for_each_type(SpecsNN{}, [&]<class S>(S*) {
      auto logits = ts::distribute<S>(mesh, z);
      auto lab = ts::distribute<ts::Spec<ts::S<"y">>>(mesh, labels);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", logits " << logits.describe());
      ts::reset_comm_stats();
      const double l = ts::nn::cross_entropy(logits, lab);
      const auto moved = ts::comm_stats().total();
      TS_REQUIRE_ALL(std::abs(l - want) < 1e-12 * std::abs(want));
      // Gathering V would move B * V * 8 = 16856 bytes; the statistics move a few B.
      TS_REQUIRE_ALL(moved.bytes_received <= std::uint64_t(8 * B * sizeof(double) * 4));
      auto dz = ts::nn::cross_entropy_backward(logits, lab);
      static_assert(std::is_same_v<typename decltype(dz)::SpecType, S>);
      TS_REQUIRE_ALL(compare(dz.gather(), grad, 1e-14) == "");
    });
    // A label outside [0, V) is an IndexError on every rank.
    Eigen::Tensor<std::int64_t, 1> bad(B);
    bad.setConstant(3);
    bad(B - 1) = V;
    bool threw = false;
    try {
      (void)ts::nn::cross_entropy(ts::distribute<Cols>(mesh, z), ts::distribute<ts::Spec<ts::S<"x">>>(mesh, bad));
    } catch (const ts::IndexError&) {
      threw = true;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("accuracy over a vocabulary split any way equals the serial fraction of argmax hits, ties to the lowest index",
          "[nn]") {
  const Eigen::Index B = 11, V = 23;
  T2 z = values(B, V, 6);
  for (Eigen::Index v = 0; v < V; ++v) z(4, v) = 1.0;  // a row of ties: argmax 0
  z(7, 5) = z(7, 17) = 50.0;                          // a tie across blocks: 5
  Eigen::Tensor<std::int32_t, 1> labels(B);
  for (Eigen::Index b = 0; b < B; ++b) {
    Eigen::Index best = 0;
    for (Eigen::Index v = 1; v < V; ++v)
      if (z(b, v) > z(b, best)) best = v;
    labels(b) = std::int32_t(b % 3 == 0 ? (best + 1) % V : best);  // every third row wrong
  }
  labels(4) = 0;
  labels(7) = 5;
  double want = 0;
  for (Eigen::Index b = 0; b < B; ++b) {
    Eigen::Index best = 0;
    for (Eigen::Index v = 1; v < V; ++v)
      if (z(b, v) > z(b, best)) best = v;
    want += best == labels(b) ? 1.0 / double(B) : 0.0;
  }
  REQUIRE(want > 0.5);
  REQUIRE(want < 1.0);
  const Eigen::Tensor<std::int64_t, 1> labels64 = labels.cast<std::int64_t>();
  on_every_mesh([&](M2& mesh, auto sizes) {
    for_each_type(SpecsNN{}, [&]<class S>(S*) {
      auto logits = ts::distribute<S>(mesh, z);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", logits " << logits.describe());
      TS_REQUIRE_ALL(std::abs(ts::nn::accuracy(logits, ts::distribute<ts::Spec<ts::S<"y">>>(mesh, labels)) - want) < 1e-15);
      TS_REQUIRE_ALL(std::abs(ts::nn::accuracy(logits, ts::distribute<ts::Spec<ts::R>>(mesh, labels64)) - want) < 1e-15);
    });
    // A label outside [0, V) is an IndexError on every rank, as for cross_entropy.
    Eigen::Tensor<std::int32_t, 1> bad = labels;
    bad(2) = -1;
    bool threw = false;
    try {
      (void)ts::nn::accuracy(ts::distribute<Cols>(mesh, z), ts::distribute<ts::Spec<ts::S<"x">>>(mesh, bad));
    } catch (const ts::IndexError&) {
      threw = true;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("cross_entropy's gradient equals finite differences of the loss", "[nn]") {
  on_every_mesh([](M2& mesh, auto) {
    const T2 z = values(4, 9, 6);
    Eigen::Tensor<std::int32_t, 1> labels(4);
    labels.setValues({3, 0, 8, 5});
    auto lab = ts::distribute<ts::Spec<ts::R>>(mesh, labels);
    const T2 fd = finite_differences<2>(z, [&](const T2& v) { return ts::nn::cross_entropy(ts::distribute<Both>(mesh, v), lab); });
    TS_REQUIRE_ALL(compare(ts::nn::cross_entropy_backward(ts::distribute<Both>(mesh, z), lab).gather(), fd, 1e-8) == "");
  });
}

TEST_CASE("dropout drops the same elements on every mesh and spec, and its backward uses that mask", "[nn]") {
  on_every_mesh([](M2& mesh, auto) {
    const T2 g = values(9, 6, 2) + 3.0;
    const double p = 0.3;
    T2 want(9, 6);
    for (Eigen::Index i = 0; i < g.size(); ++i)
      want.data()[i] = ts::detail::random_value<double>(42, std::uint64_t(i)) >= p ? g.data()[i] / (1 - p) : 0.0;
    for_each_type(SpecsNN{}, [&]<class S>(S*) {
      auto x = ts::distribute<S>(mesh, g);
      TS_REQUIRE_ALL(compare(ts::nn::dropout(x, p, 42).gather(), want, 1e-14) == "");
      TS_REQUIRE_ALL(compare(ts::nn::dropout_backward(x, p, 42).gather(), want, 1e-14) == "");
    });
    long kept = 0;
    for (Eigen::Index i = 0; i < want.size(); ++i) kept += want.data()[i] != 0;
    TS_REQUIRE_ALL(kept > 20 && kept < 54);  // about 70 % of 54
  });
}

namespace {
T2 matmul_serial(const T2& a, const T2& b) {
  Eigen::array<Eigen::IndexPair<int>, 1> c{Eigen::IndexPair<int>(1, 0)};
  return a.contract(b, c);
}
T2 transposed(const T2& a) {
  Eigen::array<int, 2> s{1, 0};
  return a.shuffle(s);
}
}  // namespace

TEST_CASE("Linear is data-, column- or row-parallel by its weight spec and equals the serial layer", "[nn]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const Eigen::Index B = 9, IN = 5, OUT = 7;
    const T2 gx = values(B, IN, 1), gdy = values(B, OUT, 2);
    ts::nn::Linear<double, M2, ts::Spec<ts::R, ts::R>> reference(mesh, IN, OUT, 7);
    const T2 W = reference.weight().gather();
    const T1 b = reference.bias().gather();
    const T2 bias_rows = b.reshape(std::array<Eigen::Index, 2>{1, OUT}).broadcast(std::array<Eigen::Index, 2>{B, 1});
    const T2 want_y = matmul_serial(gx, W) + bias_rows;
    const T2 want_dx = matmul_serial(gdy, transposed(W));
    const T2 want_dw = matmul_serial(transposed(gx), gdy) * 2.0;
    Eigen::array<Eigen::Index, 1> rows{0};
    const T1 want_db = gdy.sum(rows) * 2.0;
    auto check = [&]<class WS, class XS>(WS*, XS*) {
      ts::nn::Linear<double, M2, WS> fc(mesh, IN, OUT, 7);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", weight " << fc.weight().describe());
      TS_REQUIRE_ALL(compare(fc.weight().gather(), W) == "" && compare(fc.bias().gather(), b) == "");  // seed, not mesh
      auto x = ts::distribute<XS>(mesh, gx);
      auto forward = [&](const auto& v) { return fc(v); };
      auto [y, pullback] = ts::ad::vjp(fc, forward, x);
      TS_REQUIRE_ALL(compare(y.gather(), want_y, 1e-12) == "");
      auto dy = ts::distribute<Rows>(mesh, gdy);
      auto [dx] = pullback(dy);
      std::get<1>(ts::ad::vjp(fc, forward, x))(dy);  // gradients add up
      TS_REQUIRE_ALL(compare(dx.gather(), want_dx, 1e-12) == "");
      TS_REQUIRE_ALL(compare(fc.weight_grad().gather(), want_dw, 1e-12) == "");
      TS_REQUIRE_ALL(compare(fc.bias_grad().gather(), want_db, 1e-12) == "");
      fc.zero_grad();
      TS_REQUIRE_ALL(compare(fc.weight_grad().gather(), T2(want_dw.constant(0.0))) == "");
    };
    check(static_cast<ts::Spec<ts::R, ts::R>*>(nullptr), static_cast<Rows*>(nullptr));                 // data-parallel
    check(static_cast<ts::Spec<ts::R, ts::S<"y">>*>(nullptr), static_cast<Rows*>(nullptr));            // column-parallel
    check(static_cast<ts::Spec<ts::S<"y">, ts::R>*>(nullptr), static_cast<Both*>(nullptr));            // row-parallel
    check(static_cast<ts::Spec<ts::S<"x">, ts::S<"y">>*>(nullptr), static_cast<ts::Spec<ts::R, ts::R>*>(nullptr));
    // [B, T, in] inputs.
    ts::nn::Linear<double, M2, ts::Spec<ts::R, ts::S<"y">>> fc(mesh, IN, OUT, 7);
    Eigen::Tensor<double, 3> x3(3, 4, IN);
    for (Eigen::Index i = 0; i < x3.size(); ++i) x3.data()[i] = std::sin(double(i));
    auto y3 = fc(ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::R>>(mesh, x3));
    const T2 flat = x3.reshape(std::array<Eigen::Index, 2>{12, IN});
    const T2 want3 = matmul_serial(flat, W) + b.reshape(std::array<Eigen::Index, 2>{1, OUT}).broadcast(std::array<Eigen::Index, 2>{12, 1});
    const Eigen::Tensor<double, 3> got3 = y3.gather();
    TS_REQUIRE_ALL(compare(T2(got3.reshape(std::array<Eigen::Index, 2>{12, OUT})), want3, 1e-12) == "");
  });
}

TEST_CASE("AdamW and SGD with momentum update sharded parameters as PyTorch's formulas do serially", "[nn]") {
  on_every_mesh([](M2& mesh, auto) {
    const T2 p0 = values(7, 5, 1);
    const ts::nn::AdamWOptions ao{.lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.99f, .eps = 1e-8f, .weight_decay = 0.1f};
    const ts::nn::SGDOptions so{.lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.01f};
    // Serial references in double with the float settings' values.
    T2 pa = p0, m = p0.constant(0.0), v = p0.constant(0.0), ps = p0, buf = p0.constant(0.0);
    std::vector<T2> grads;
    for (int t = 1; t <= 3; ++t) {
      const T2 g = values(7, 5, 10 + t);
      grads.push_back(g);
      const double lr = ao.lr, b1 = ao.beta1, b2 = ao.beta2;
      pa = pa * (1 - lr * double(ao.weight_decay));
      m = m * b1 + g * (1 - b1);
      v = v * b2 + g * g * (1 - b2);
      const double step = lr / (1 - std::pow(b1, t)), root = std::sqrt(1 - std::pow(b2, t));
      pa = pa - (m * step) / (v.sqrt() / root + double(ao.eps));
      const T2 d = g + ps * double(so.weight_decay);
      buf = t == 1 ? d : T2(buf * double(so.momentum) + d);
      ps = ps - buf * double(so.lr);
    }
    for_each_type(SpecsNN{}, [&]<class S>(S*) {
      auto pa_t = ts::distribute<S>(mesh, p0), ps_t = ts::distribute<S>(mesh, p0);
      auto g = ts::zeros<double, S>(mesh, {7, 5});
      ts::nn::AdamW adam(ao);
      ts::nn::SGD sgd(so);
      adam.add(pa_t, g);
      sgd.add(ps_t, g);
      for (const T2& gv : grads) {
        g = ts::distribute<S>(mesh, gv);  // the optimizers read the gradient's current values
        adam.step();
        sgd.step();
      }
      INFO(pa_t.describe());
      TS_REQUIRE_ALL(compare(pa_t.gather(), pa, 1e-12) == "");
      TS_REQUIRE_ALL(compare(ps_t.gather(), ps, 1e-12) == "");
    });
  });
}
