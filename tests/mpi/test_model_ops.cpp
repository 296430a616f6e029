// The operators model code needs, through the typed API against serial Eigen values on every
// 2-D mesh of the world size, with shapes that do not divide: scalars with partials on both
// sides, in-place and fused updates, n-ary map, masks and where,
// numpy rank alignment, keep_dims, take / scatter_add, and where communication is implicit.
#include "test_support.hpp"

namespace ts = tshard;
namespace d = tshard::detail;
using namespace tshard_test;

namespace {

// Each rank's contribution to a partial over y (rows split over x): values shifted off zero.
Eigen::Tensor<double, 2> contribution(Eigen::Index r, Eigen::Index c, int y) {
  Eigen::Tensor<double, 2> v = values(r, c, 1 + y);
  return v + v.constant(3.0);
}

template <class P>
auto partial_over_y(M2& mesh, Eigen::Index r, Eigen::Index c) {
  using X = ts::Spec<ts::S<"x">, ts::R>;
  const auto mine = contribution(r, c, mesh.coord<"y">());
  const auto l = ts::padded_local_shape<X>(mesh, {r, c});
  Eigen::Tensor<double, 2> blk(l[0], l[1]);
  blk.setZero();
  const Eigen::Index off = std::min<Eigen::Index>(mesh.coord<"x">() * l[0], r);
  for (Eigen::Index i = 0; i < l[0] && off + i < r; ++i)
    for (Eigen::Index j = 0; j < c; ++j) blk(i, j) = mine(off + i, j);
  return ts::from_local<X, P>(mesh, {r, c}, std::move(blk));
}

// The resolved value of partial_over_y under op.
Eigen::Tensor<double, 2> combined(ts::ReduceOp op, Eigen::Index r, Eigen::Index c, int k) {
  Eigen::Tensor<double, 2> w = contribution(r, c, 0);
  for (int y = 1; y < k; ++y) {
    const auto v = contribution(r, c, y);
    if (op == ts::ReduceOp::Sum) w += v;
    if (op == ts::ReduceOp::Max) w = w.cwiseMax(v);
    if (op == ts::ReduceOp::Min) w = w.cwiseMin(v);
  }
  return w;
}

// A global tensor of the given shape with distinct, smooth values.
template <std::size_t R>
Eigen::Tensor<double, int(R)> smooth(const std::array<Eigen::Index, R>& shape, int salt) {
  Eigen::Tensor<double, int(R)> t(shape);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = std::cos(double(i * 3 + salt)) + 0.01 * salt;
  return t;
}

using Specs1 = TypeList<ts::Spec<ts::R>, ts::Spec<ts::S<"x">>, ts::Spec<ts::S<"y">>, ts::Spec<ts::S<"y", "x">>>;

}  // namespace

TEST_CASE("every scalar operator on either side of a partial sum, max or min equals the serial value", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const int k = sizes[1];
    const double s = 2.5;
    auto check = [&]<class P>(P*, ts::ReduceOp op) {
      auto p = partial_over_y<P>(mesh, 7, 3);
      const Eigen::Tensor<double, 2> w = combined(op, 7, 3, k);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", " << p.describe());
      TS_REQUIRE_ALL(compare((p + s).gather(), Eigen::Tensor<double, 2>(w + s), 1e-12) == "");
      TS_REQUIRE_ALL(compare((s + p).gather(), Eigen::Tensor<double, 2>(w + s), 1e-12) == "");
      TS_REQUIRE_ALL(compare((p - s).gather(), Eigen::Tensor<double, 2>(w - s), 1e-12) == "");
      TS_REQUIRE_ALL(compare((s - p).gather(), Eigen::Tensor<double, 2>(s - w), 1e-12) == "");
      TS_REQUIRE_ALL(compare((p * s).gather(), Eigen::Tensor<double, 2>(w * s), 1e-12) == "");
      TS_REQUIRE_ALL(compare((s * p).gather(), Eigen::Tensor<double, 2>(s * w), 1e-12) == "");
      TS_REQUIRE_ALL(compare((p / s).gather(), Eigen::Tensor<double, 2>(w / s), 1e-12) == "");
      TS_REQUIRE_ALL(compare((s / p).gather(), Eigen::Tensor<double, 2>(s / w), 1e-12) == "");
      TS_REQUIRE_ALL(compare((-p).gather(), Eigen::Tensor<double, 2>(-w), 1e-12) == "");
      // Only p * s, s * p and p / s keep a partial sum; everything else is resolved first.
      constexpr bool sum = std::is_same_v<P, ts::PartialSum<"y">>;
      static_assert(decltype(p * s)::is_partial == sum && decltype(s * p)::is_partial == sum);
      static_assert(decltype(p / s)::is_partial == sum && decltype(-p)::is_partial == sum);
      static_assert(!decltype(s / p)::is_partial && !decltype(s - p)::is_partial && !decltype(p + s)::is_partial);
      static_assert(!decltype(s + p)::is_partial && !decltype(p - s)::is_partial);
    };
    check(static_cast<ts::PartialSum<"y">*>(nullptr), ts::ReduceOp::Sum);
    check(static_cast<ts::PartialMax<"y">*>(nullptr), ts::ReduceOp::Max);
    check(static_cast<ts::PartialMin<"y">*>(nullptr), ts::ReduceOp::Min);
    // The review's case: 1 / sum over a split dim is 1 / (the whole sum), not the sum of 1 / parts.
    const auto g = values(6, 7, 2);
    auto x = ts::distribute<ts::Spec<ts::R, ts::S<"y">>>(mesh, g);
    Eigen::array<Eigen::Index, 1> cols{1};
    Eigen::Tensor<double, 1> ws = g.sum(cols), inv = ws.inverse();
    TS_REQUIRE_ALL(compare((1.0 / ts::sum<1>(x)).gather(), inv, 1e-12) == "");
    TS_REQUIRE_ALL(compare((2.0 - ts::sum<1>(x)).gather(), Eigen::Tensor<double, 1>(2.0 - ws), 1e-12) == "");
  });
}

TEST_CASE("in-place operators keep the left side's spec and buffer and equal the serial value", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const auto gy = values(7, 5, 1), gx = values(7, 5, 2);
    Eigen::Tensor<double, 1> bias = values(5, 1, 3).reshape(std::array<Eigen::Index, 1>{5});
    for_each_pair(Specs2{}, Specs2{}, [&]<class SY, class SX>(SY*, SX*) {
      auto y = ts::distribute<SY>(mesh, gy);
      auto x = ts::distribute<SX>(mesh, gx);
      const double* before = y.data();
      y += x;
      y -= 0.25 * x;
      y *= x;
      y /= 2.0;
      y -= 1.5;
      static_assert(std::is_same_v<typename decltype(y)::SpecType, SY>);
      Eigen::Tensor<double, 2> w = ((gy + gx - gx * 0.25) * gx) / 2.0 - 1.5;
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ": y " << y.describe() << ", x " << x.describe());
      TS_REQUIRE_ALL(y.data() == before);
      TS_REQUIRE_ALL(compare(y.gather(), w, 1e-12) == "");
      // numpy alignment: a rank-1 right side broadcasts along the rows.
      auto b = ts::distribute<ts::Spec<ts::S<"y">>>(mesh, bias);
      y += b;
      Eigen::Tensor<double, 2> wb = w + bias.reshape(std::array<Eigen::Index, 2>{1, 5}).broadcast(std::array<Eigen::Index, 2>{7, 1});
      TS_REQUIRE_ALL(compare(y.gather(), wb, 1e-12) == "");
    });
    // A partial sum on the right is resolved first (an all-reduce counted as the operator's own).
    auto y = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, values(7, 3, 4));
    auto p = partial_over_y<ts::PartialSum<"y">>(mesh, 7, 3);
    ts::reset_comm_stats();
    y += p;
    const auto update = ts::comm_stats().op("add/auto");
    y -= 0.5 * p;
    Eigen::Tensor<double, 2> wp = values(7, 3, 4) + combined(ts::ReduceOp::Sum, 7, 3, sizes[1]) * 0.5;
    TS_REQUIRE_ALL(compare(y.gather(), wp, 1e-12) == "");
    TS_REQUIRE_ALL(sizes[1] == 1 || update.calls("all_reduce") == 1);
    // An expiring partial owns its buffer: it is all-reduced there, not into a copy.
    const auto adopted = partial_over_y<ts::PartialSum<"y">>(mesh, 7, 3);
    auto q0 = adopted;  // a copy lives in pooled storage
    ts::reset_comm_stats();
    const auto pool_before = ts::pool_stats();
    y += 0.5 * std::move(q0);
    const auto pool_after = ts::pool_stats();
    wp += combined(ts::ReduceOp::Sum, 7, 3, sizes[1]) * 0.5;
    TS_REQUIRE_ALL(compare(y.gather(), wp, 1e-12) == "");
    TS_REQUIRE_ALL(pool_after.reuses == pool_before.reuses && pool_after.fresh_allocations == pool_before.fresh_allocations);
    TS_REQUIRE_ALL(sizes[1] == 1 || ts::comm_stats().op("add/auto").calls("all_reduce") == 1);
    // A user's own buffer (from_local) is never overwritten, even when the tensor expires.
    {
      const auto l = ts::padded_local_shape<ts::Spec<ts::S<"x">, ts::R>>(mesh, {7, 3});
      std::vector<double> mine(static_cast<std::size_t>(l[0] * l[1]), 1.0);
      y += 2.0 * ts::from_local<ts::Spec<ts::S<"x">, ts::R>, ts::PartialSum<"y">>(mesh, {7, 3}, mine.data());
      TS_REQUIRE_ALL(std::all_of(mine.begin(), mine.end(), [](double v) { return v == 1.0; }));
      wp += wp.constant(2.0 * sizes[1]);
      TS_REQUIRE_ALL(compare(y.gather(), wp, 1e-12) == "");
    }
    auto z = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, values(7, 3, 4));
    z *= p;  // other operators resolve the partial first
    Eigen::Tensor<double, 2> wz = values(7, 3, 4) * combined(ts::ReduceOp::Sum, 7, 3, sizes[1]);
    TS_REQUIRE_ALL(compare(z.gather(), wz, 1e-12) == "");
    // A partial left side takes a partial sum over the same axes, and stays partial.
    auto q = partial_over_y<ts::PartialSum<"y">>(mesh, 7, 3);
    q += p;
    q *= 0.5;
    Eigen::Tensor<double, 2> wq = combined(ts::ReduceOp::Sum, 7, 3, sizes[1]);
    TS_REQUIRE_ALL(compare(q.gather(), wq, 1e-12) == "");
    bool threw = false;
    try {
      auto z = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, values(7, 1, 1));
      z += ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, values(7, 5, 1));  // [7, 5] does not fit [7, 1]
    } catch (const ts::ShapeError& e) {
      threw = std::string(e.what()).find("[7, 1]") != std::string::npos;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("w -= lr * g reads w and g once: the scaled right side is never a buffer of its own", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto gw = values(9, 6, 1), gg = values(9, 6, 2);
    auto w = ts::distribute<ts::Spec<ts::R, ts::S<"y">>>(mesh, gw);
    auto g = ts::distribute<ts::Spec<ts::R, ts::S<"y">>>(mesh, gg);
    const float lr = 0.125f;
    w -= lr * g;  // warm: the pool has what it needs
    const auto before = ts::pool_stats();
    w -= lr * g;
    w += g * 0.5;
    const auto after = ts::pool_stats();
    TS_REQUIRE_ALL(after.fresh_allocations == before.fresh_allocations && after.reuses == before.reuses);
    Eigen::Tensor<double, 2> want = gw - gg * 0.125 - gg * 0.125 + gg * 0.5;
    TS_REQUIRE_ALL(compare(w.gather(), want, 1e-12) == "");
    // a + s * b and a - s * b are one pass too, and the value of s * b never changes once made.
    auto e = 2.0 * g;
    auto f = w - 3.0 * e;
    g += 1.0;  // g's old buffer stays e's
    Eigen::Tensor<double, 2> we = gg * 2.0;
    TS_REQUIRE_ALL(compare(e.gather(), we, 1e-12) == "");
    TS_REQUIRE_ALL(compare(f.gather(), Eigen::Tensor<double, 2>(want - we * 3.0), 1e-12) == "");
    TS_REQUIRE_ALL(compare(g.gather(), Eigen::Tensor<double, 2>(gg + 1.0), 1e-12) == "");
    w -= 0.5 * w;  // the right side shares w's buffer
    TS_REQUIRE_ALL(compare(w.gather(), Eigen::Tensor<double, 2>(want * 0.5), 1e-12) == "");
    auto copy = e;  // copies of an unevaluated tensor are deep, like any other
    copy.data()[0] += 0;
    TS_REQUIRE_ALL(compare(copy.gather(), we, 1e-12) == "" && compare((-e).gather(), Eigen::Tensor<double, 2>(-we), 1e-12) == "");
  });
}

TEST_CASE("n-ary map runs f once per valid element over inputs of any spec and type", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto ga = values(7, 5, 1), gb = values(7, 5, 2), gc = values(7, 5, 3);
    for_each_pair(Specs2{}, Specs2{}, [&]<class SA, class SB>(SA*, SB*) {
      auto a = ts::distribute<SA>(mesh, ga);
      auto b = ts::distribute<SB>(mesh, gb);
      auto c = ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, gc);
      long calls = 0;
      auto relu_back = ts::map([&](double h, double g) { return ++calls, h > 0 ? g : 0.0; }, a, b);
      static_assert(std::is_same_v<typename decltype(relu_back)::SpecType,
                                   typename d::elementwise_type<SA, SB, M2>::type>);
      TS_REQUIRE_ALL(calls == relu_back.local_shape()[0] * relu_back.local_shape()[1]);
      Eigen::Tensor<double, 2> w = (ga > 0.0).select(gb, gb.constant(0.0));
      TS_REQUIRE_ALL(compare(relu_back.gather(), w) == "");
      auto fma3 = ts::map([](double x, double y, double z) { return x * y + z; }, a, b, c);
      TS_REQUIRE_ALL(compare(fma3.gather(), Eigen::Tensor<double, 2>(ga * gb + gc), 1e-12) == "");
      auto mask = a > b;
      auto four = ts::map([](bool m, double x, double y, double z) { return std::int64_t(m ? x * 10 : y + z); }, mask, a, b, c);
      static_assert(std::is_same_v<typename decltype(four)::Scalar, std::int64_t>);
      Eigen::Tensor<std::int64_t, 2> w4 = (ga > gb).select(ga * 10.0, gb + gc).cast<std::int64_t>();
      TS_REQUIRE_ALL(compare(four.gather(), w4) == "");
    });
    bool threw = false;
    try {
      auto bad = ts::map([](double x, double y) { return x + y; }, ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, ga),
                         ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, values(5, 7, 1)));
    } catch (const ts::ShapeError&) {
      threw = true;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("comparisons give masks and where picks elementwise, broadcasting and with scalars", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto ga = values(7, 5, 1), gb = values(7, 5, 2);
    Eigen::Tensor<double, 1> row = values(5, 1, 4).reshape(std::array<Eigen::Index, 1>{5});
    Eigen::Tensor<double, 2> rows = row.reshape(std::array<Eigen::Index, 2>{1, 5}).broadcast(std::array<Eigen::Index, 2>{7, 1});
    for_each_pair(Specs2{}, Specs2{}, [&]<class SA, class SB>(SA*, SB*) {
      auto a = ts::distribute<SA>(mesh, ga);
      auto b = ts::distribute<SB>(mesh, gb);
      INFO(a.describe() << " vs " << b.describe());
      auto gt = a > b;
      static_assert(std::is_same_v<typename decltype(gt)::Scalar, bool>);
      TS_REQUIRE_ALL(compare(gt.gather(), Eigen::Tensor<bool, 2>(ga > gb)) == "");
      TS_REQUIRE_ALL(compare((a <= b).gather(), Eigen::Tensor<bool, 2>(ga <= gb)) == "");
      TS_REQUIRE_ALL(compare((a < 0.25).gather(), Eigen::Tensor<bool, 2>(ga < 0.25)) == "");
      TS_REQUIRE_ALL(compare((0.25 >= a).gather(), Eigen::Tensor<bool, 2>(ga <= 0.25)) == "");
      TS_REQUIRE_ALL(compare((a == a).gather(), Eigen::Tensor<bool, 2>(ga == ga)) == "");
      TS_REQUIRE_ALL(compare((a != b).gather(), Eigen::Tensor<bool, 2>(ga != gb)) == "");
      TS_REQUIRE_ALL(compare(ts::where(a > b, a, b).gather(), Eigen::Tensor<double, 2>(ga.cwiseMax(gb))) == "");
      TS_REQUIRE_ALL(compare(ts::where(a > 0.0, a, 0.0).gather(), Eigen::Tensor<double, 2>(ga.cwiseMax(0.0))) == "");
      TS_REQUIRE_ALL(compare(ts::where(b > a, -1.0, b).gather(), Eigen::Tensor<double, 2>((gb > ga).select(gb.constant(-1.0), gb))) == "");
      auto r = ts::distribute<ts::Spec<ts::S<"x">>>(mesh, row);
      TS_REQUIRE_ALL(compare(ts::where(a > r, r, a).gather(), Eigen::Tensor<double, 2>((ga > rows).select(rows, ga))) == "");
      TS_REQUIRE_ALL(compare((r < a).gather(), Eigen::Tensor<bool, 2>(rows < ga)) == "");
    });
  });
}

TEST_CASE("operands of different rank align at the last dim for every elementwise op", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(7, 5, 1);
    Eigen::Tensor<double, 1> h = values(5, 1, 2).reshape(std::array<Eigen::Index, 1>{5});
    Eigen::Tensor<double, 2> hb = h.reshape(std::array<Eigen::Index, 2>{1, 5}).broadcast(std::array<Eigen::Index, 2>{7, 1});
    for_each_pair(Specs2{}, Specs1{}, [&]<class S, class S1>(S*, S1*) {
      auto x = ts::distribute<S>(mesh, g);
      auto b = ts::distribute<S1>(mesh, h);
      INFO(x.describe() << " with " << b.describe());
      auto sum = x + b;
      static_assert(decltype(sum)::rank == 2);
      TS_REQUIRE_ALL(compare(sum.gather(), Eigen::Tensor<double, 2>(g + hb)) == "");
      TS_REQUIRE_ALL(compare((b - x).gather(), Eigen::Tensor<double, 2>(hb - g)) == "");
      TS_REQUIRE_ALL(compare((x * b).gather(), Eigen::Tensor<double, 2>(g * hb)) == "");
      TS_REQUIRE_ALL(compare((b / x).gather(), Eigen::Tensor<double, 2>(hb / g)) == "");
    });
    // [3, 7, 5] + [7, 5]
    const auto g3 = smooth<3>({3, 7, 5}, 1);
    Eigen::Tensor<double, 3> w3 = g3 + g.reshape(std::array<Eigen::Index, 3>{1, 7, 5}).broadcast(std::array<Eigen::Index, 3>{3, 1, 1});
    auto x3 = ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::S<"y">>>(mesh, g3);
    auto x2 = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, g);
    TS_REQUIRE_ALL(compare((x3 + x2).gather(), w3, 1e-12) == "");
  });
}

TEST_CASE("sum, max, min and mean with keep_dims keep the reduced dims at extent 1 and broadcast back", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(7, 5, 3);
    for_each_type(Specs2{}, [&]<class S>(S*) {
      auto x = ts::distribute<S>(mesh, g);
      INFO(x.describe());
      Eigen::array<Eigen::Index, 1> cols{1};
      const std::array<Eigen::Index, 2> kept{7, 1}, back{1, 5};
      Eigen::Tensor<double, 2> s = g.sum(cols).reshape(kept), m = g.maximum(cols).reshape(kept),
                               n = g.minimum(cols).reshape(kept), a = g.mean(cols).reshape(kept);
      auto ks = ts::sum<1>(x, ts::keep_dims);
      static_assert(decltype(ks)::rank == 2 && std::is_same_v<ts::detail::dim_at_t<typename decltype(ks)::SpecType, 1>, ts::R>);
      TS_REQUIRE_ALL(ks.global_shape()[1] == 1);
      TS_REQUIRE_ALL(compare(ks.gather(), s, 1e-12) == "");
      TS_REQUIRE_ALL(compare(ts::max<1>(x, ts::keep_dims).gather(), m) == "");
      TS_REQUIRE_ALL(compare(ts::min<1>(x, ts::keep_dims).gather(), n) == "");
      TS_REQUIRE_ALL(compare(ts::mean<1>(x, ts::keep_dims).gather(), a, 1e-12) == "");
      // softmax's shift: x - max over the row, broadcast back
      Eigen::Tensor<double, 2> shifted = g - m.broadcast(back);
      TS_REQUIRE_ALL(compare((x - ts::max<1>(x, ts::keep_dims)).gather(), shifted, 1e-12) == "");
      Eigen::array<Eigen::Index, 2> both{0, 1};
      Eigen::Tensor<double, 0> total = g.sum(both);
      auto all = ts::sum<0, 1>(x, ts::keep_dims);
      TS_REQUIRE_ALL(all.gather()(0, 0) == Approx(total()).epsilon(1e-12));
    });
  });
}

TEST_CASE("take looks rows up in a table split any way and scatter_add is its backward", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const Eigen::Index V = 11, D = 6, N = 9;
    const auto table = values(V, D, 5);
    Eigen::Tensor<std::int64_t, 1> ids(N);
    const std::int64_t pick[] = {3, 0, 10, 3, 7, 1, 10, 5, 3};
    for (Eigen::Index n = 0; n < N; ++n) ids(n) = pick[n];
    const auto rows = values(N, D, 6);
    Eigen::Tensor<double, 2> want(N, D), grad(V, D);
    grad.setZero();
    for (Eigen::Index n = 0; n < N; ++n)
      for (Eigen::Index j = 0; j < D; ++j) {
        want(n, j) = table(ids(n), j);
        grad(ids(n), j) += rows(n, j);
      }
    for_each_pair(Specs2{}, Specs1{}, [&]<class ST, class SI>(ST*, SI*) {
      auto t = ts::distribute<ST>(mesh, table);
      auto i64 = ts::distribute<SI>(mesh, ids);
      auto i32 = ts::map([](std::int64_t v) { return std::int32_t(v); }, i64);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ": table " << t.describe() << ", ids " << i64.describe());
      auto e = ts::take<0>(t, i64);
      static_assert(decltype(e)::is_partial == !std::is_same_v<ts::detail::dim_at_t<ST, 0>, ts::R>);
      TS_REQUIRE_ALL(compare(e.gather(), want) == "");
      TS_REQUIRE_ALL(compare(ts::take<0>(t, i32).gather(), want) == "");
      auto g = ts::zeros<double, ST>(mesh, {V, D});
      auto r = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, rows);
      ts::scatter_add<0>(g, i64, r);
      ts::scatter_add<0>(g, i32, r);
      TS_REQUIRE_ALL(compare(g.gather(), Eigen::Tensor<double, 2>(grad * 2.0), 1e-12) == "");
    });
    // Columns of a table: take<1>.
    auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, table);
    Eigen::Tensor<std::int64_t, 1> cols(3);
    cols.setValues({5, 0, 2});
    auto c = ts::take<1>(t, ts::distribute<ts::Spec<ts::R>>(mesh, cols));
    Eigen::Tensor<double, 2> wc(V, 3);
    for (int j = 0; j < 3; ++j) wc.chip(j, 1) = table.chip(cols(j), 1);
    TS_REQUIRE_ALL(compare(c.gather(), wc) == "");
    // An id out of range is an IndexError on every rank, wherever it sits.
    Eigen::Tensor<std::int64_t, 1> bad = ids;
    bad(N - 1) = V;
    bool threw = false;
    try {
      auto z = ts::take<0>(ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, table),
                           ts::distribute<ts::Spec<ts::S<"y", "x">>>(mesh, bad));
    } catch (const ts::IndexError& err) {
      threw = std::string(err.what()).find("outside [0, 11)") != std::string::npos;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("sigmoid, square, pow and local_valid equal the serial values", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(7, 5, 2);
    for_each_type(Specs2{}, [&]<class S>(S*) {
      auto x = ts::distribute<S>(mesh, g);
      Eigen::Tensor<double, 2> sig = (-g).exp().unaryExpr([](double v) { return 1.0 / (1.0 + v); });
      TS_REQUIRE_ALL(compare(ts::sigmoid(x).gather(), sig, 1e-14) == "");
      TS_REQUIRE_ALL(compare(ts::square(x).gather(), Eigen::Tensor<double, 2>(g * g), 1e-14) == "");
      TS_REQUIRE_ALL(compare(ts::pow(ts::abs(x), 1.5).gather(), Eigen::Tensor<double, 2>(g.abs().pow(1.5)), 1e-14) == "");
      // local_valid() never sees padding: the per-rank sums add up to the global sum once per replica.
      auto ones = ts::map([](double) { return 1.0; }, x);
      Eigen::Tensor<double, 0> mine = ones.local_valid().sum();
      TS_REQUIRE_ALL(mine() == double(x.local_shape()[0] * x.local_shape()[1]));
    });
  });
}

TEST_CASE("implicit moves are counted as <op>/auto, refused in Forbid mode only where they communicate", "[model-ops]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const int p = sizes[0] * sizes[1];
    auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, values(9, 4, 1));
    auto rep = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, values(9, 4, 2));
    // y - t with y partial: the all-reduce is "subtract/auto", once.
    auto y = partial_over_y<ts::PartialSum<"y">>(mesh, 9, 4);
    ts::reset_comm_stats();
    auto diff = y - x;
    TS_REQUIRE_ALL(ts::comm_stats().op("subtract/subtract/auto").total().calls == 0);
    TS_REQUIRE_ALL(sizes[1] == 1 || ts::comm_stats().op("subtract/auto").calls("all_reduce") == 1);
    // slice across shard borders moves data as "slice/auto"; reshape that is local moves nothing.
    ts::reset_comm_stats();
    auto s = ts::slice(x, {0, 0}, {5, 4});  // rows 0-4 re-split: they change owner where ceil(9/k) != ceil(5/k)
    const int k = sizes[0];
    const bool moves = k > 1 && (9 + k - 1) / k != (5 + k - 1) / k;  // k in 2..8; from 9 on, one row per rank stays
    std::uint64_t moved = ts::comm_stats().op("slice/auto").total().bytes_received, all_moved = 0;
    MPI_Allreduce(&moved, &all_moved, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);  // some rank may move nothing
    TS_REQUIRE_ALL(moves == (all_moved > 0));
    auto cols = ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, values(3, 4 * sizes[0], 1));
    ts::reset_comm_stats();
    auto flat = ts::reshape<ts::Spec<ts::S<"x">>>(cols, {12 * sizes[0]});
    TS_REQUIRE_ALL(ts::comm_stats().total().calls == 0);  // decided without any collective
    ts::implicit_communication() = ts::ImplicitCommunication::Forbid;
    bool local_ok = true, slice_refused = false, concat_refused = false, pinned_ok = true;
    try {
      auto z = x + rep;  // rep is sliced locally: no communication
    } catch (const ts::SpecError&) {
      local_ok = false;
    }
    try {
      auto z = ts::slice(x, {0, 0}, {5, 4});
    } catch (const ts::SpecError& e) {
      slice_refused = std::string(e.what()).find("forbidden") != std::string::npos;
    }
    try {
      auto z = ts::concat<0>(x, x);
    } catch (const ts::SpecError&) {
      concat_refused = true;
    }
    try {  // the user's own pinned output spec is not implicit
      auto w = ts::distribute<ts::Spec<ts::R, ts::S<"y">>>(mesh, values(4, 5, 3));
      auto c = ts::einsum<"ij,jk->ik", ts::Spec<ts::R, ts::R>>(x, w);
    } catch (const ts::SpecError&) {
      pinned_ok = false;
    }
    ts::implicit_communication() = ts::ImplicitCommunication::Allow;
    TS_REQUIRE_ALL(local_ok && pinned_ok);
    TS_REQUIRE_ALL(slice_refused == moves);
    TS_REQUIRE_ALL(concat_refused == (sizes[0] > 1));
    (void)p;
  });
}
