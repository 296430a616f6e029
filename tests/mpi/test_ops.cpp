// Sharded operators against serial references computed with Eigen on the gathered inputs, on
// every 2-D mesh of the world size, for a representative set of input specs (every per-dim case
// of the propagation rules), with uneven shapes.
#include <algorithm>
#include <complex>
#include <map>
#include <numeric>

#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;


TEST_CASE("binary elementwise ops equal the serial result for every pair of input specs", "[ops]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const auto ga = values(7, 5, 1), gb = values(7, 5, 2);
    for_each_type(Specs2{}, [&]<class SA>(SA*) {
      for_each_type(Specs2{}, [&]<class SB>(SB*) {
        auto a = ts::distribute<SA>(mesh, ga);
        auto b = ts::distribute<SB>(mesh, gb);
        const auto sum = (a + b).gather(), diff = (a - b).gather(), prod = (a * b).gather(), quot = (a / b).gather();
        Eigen::Tensor<double, 2> ws = ga + gb, wd = ga - gb, wp = ga * gb, wq = ga / gb;
        INFO("mesh " << sizes[0] << "x" << sizes[1] << ": a " << a.describe() << ", b " << b.describe());
        TS_REQUIRE_ALL(compare(sum, ws) == "" && compare(diff, wd) == "");
        TS_REQUIRE_ALL(compare(prod, wp) == "" && compare(quot, wq) == "");
      });
    });
  });
}

TEST_CASE("elementwise output specs follow the elementwise rule: R with S gives S, the left split wins", "[ops]") {
  using X = ts::Spec<ts::S<"x">, ts::R>;
  using Y = ts::Spec<ts::R, ts::S<"y">>;
  using Yx = ts::Spec<ts::R, ts::S<"x">>;
  using AB = ts::ShardedTensor<float, M2, X>;
  static_assert(std::is_same_v<decltype(std::declval<AB>() + std::declval<ts::ShardedTensor<float, M2, Y>>())::SpecType,
                               ts::Spec<ts::S<"x">, ts::S<"y">>>);
  // The right operand's split would reuse x: it is dropped (resharded), not duplicated.
  static_assert(std::is_same_v<decltype(std::declval<AB>() * std::declval<ts::ShardedTensor<float, M2, Yx>>())::SpecType,
                               X>);
  static_assert(std::is_same_v<decltype(std::declval<ts::ShardedTensor<float, M2, ts::Spec<ts::S<"y">, ts::R>>>() +
                                        std::declval<AB>())::SpecType,
                               ts::Spec<ts::S<"y">, ts::R>>);
  SUCCEED();
}

TEST_CASE("size-1 dims broadcast, and shapes that do not broadcast are a ShapeError on every rank", "[ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto ga = values(7, 5, 3), col = values(7, 1, 4), row = values(1, 5, 5);
    auto a = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, ga);
    auto c = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, col);
    auto r = ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, row);
    Eigen::array<Eigen::Index, 2> bc{1, 5}, br{7, 1};
    Eigen::Tensor<double, 2> want_c = ga + col.broadcast(bc), want_r = ga * row.broadcast(br);
    TS_REQUIRE_ALL(compare((a + c).gather(), want_c) == "");
    TS_REQUIRE_ALL(compare((a * r).gather(), want_r) == "");
    Eigen::Tensor<double, 2> want_cr = col.broadcast(bc) - row.broadcast(br);
    TS_REQUIRE_ALL(compare((c - r).gather(), want_cr) == "");
    auto bad = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, values(6, 5, 1));
    bool threw = false;
    try {
      auto z = a + bad;
    } catch (const ts::ShapeError& e) {
      threw = std::string(e.what()).find("[7, 5]") != std::string::npos;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("scalars, unary functions and map equal the serial result", "[ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(9, 4, 6);
    for_each_type(Specs2{}, [&]<class S>(S*) {
      auto xd = ts::distribute<S>(mesh, g);
      auto x = ts::map(xd, [](double v) { return float(v); });
      Eigen::Tensor<float, 2> gf = g.cast<float>();
      auto e = ts::exp(x) * 2.0f + x;  // README's example
      Eigen::Tensor<float, 2> we = gf.exp() * 2.0f + gf;
      TS_REQUIRE_ALL(compare(e.gather(), we, 1e-6) == "");
      Eigen::Tensor<float, 2> wr = gf.cwiseMax(0.0f), wa = gf.abs(), wn = -gf, ws = (gf.abs() + 1.0f).sqrt(),
                              wl = (gf.abs() + 1.0f).log(), wt = gf.tanh(), wsub = 1.0f - gf, wdiv = gf / 4.0f;
      TS_REQUIRE_ALL(compare(ts::relu(x).gather(), wr) == "" && compare(ts::abs(x).gather(), wa) == "");
      TS_REQUIRE_ALL(compare((-x).gather(), wn) == "" && compare(ts::sqrt(ts::abs(x) + 1.0f).gather(), ws, 1e-6) == "");
      TS_REQUIRE_ALL(compare(ts::log(ts::abs(x) + 1.0f).gather(), wl, 1e-6) == "" &&
                     compare(ts::tanh(x).gather(), wt, 1e-6) == "");
      TS_REQUIRE_ALL(compare((1.0f - x).gather(), wsub) == "" && compare((x / 4.0f).gather(), wdiv) == "");
      long calls = 0;
      auto m = ts::map(x, [&](float v) {
        ++calls;
        return std::int64_t(v * 100);
      });
      static_assert(std::is_same_v<typename decltype(m)::Scalar, std::int64_t>);
      TS_REQUIRE_ALL(calls == x.local_shape()[0] * x.local_shape()[1]);
      Eigen::Tensor<std::int64_t, 2> wm = (gf * 100.0f).cast<std::int64_t>();
      TS_REQUIRE_ALL(compare(m.gather(), wm) == "");
    });
  });
}

TEST_CASE("complex tensors take exp, log, tanh, sqrt, sigmoid and square, as std:: computes them", "[ops]") {
  using C = std::complex<double>;
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(9, 4, 6);
    auto to_c = [](double v) { return C(v, 0.5 * v + 0.25); };
    Eigen::Tensor<C, 2> want(9, 4);
    for (Eigen::Index i = 0; i < 9; ++i)
      for (Eigen::Index j = 0; j < 4; ++j) {
        const C c = to_c(g(i, j));
        want(i, j) = std::exp(c) + std::log(c) + std::tanh(c) + std::sqrt(c) + c * c + C(1) / (C(1) + std::exp(-c));
      }
    for_each_type(Specs2{}, [&]<class S>(S*) {
      auto z = ts::map(ts::distribute<S>(mesh, g), to_c);
      auto y = ts::exp(z) + ts::log(z) + ts::tanh(z) + ts::sqrt(z) + ts::square(z) + ts::sigmoid(z);
      TS_REQUIRE_ALL(compare(y.gather(), want, 1e-9) == "");
    });
  });
}

TEST_CASE("partial sums stay partial under +, -, scalar * and negation, and resolve otherwise", "[ops]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const int k = sizes[1];
    Eigen::Tensor<double, 2> mine = values(5, 3, 1 + mesh.coord<"y">());
    Eigen::Tensor<double, 2> want(5, 3);
    want.setZero();
    for (int c = 0; c < k; ++c) want += values(5, 3, 1 + c);
    using P = ts::PartialSum<"y">;
    auto p = ts::from_local<ts::Spec<ts::S<"x">, ts::R>, P>(mesh, {5, 3}, [&] {
      // Each rank's block of its own contribution (rows split over x).
      auto l = ts::padded_local_shape<ts::Spec<ts::S<"x">, ts::R>>(mesh, {5, 3});
      Eigen::Tensor<double, 2> blk(l[0], l[1]);
      blk.setZero();
      const Eigen::Index off = std::min<Eigen::Index>(mesh.coord<"x">() * l[0], 5);
      for (Eigen::Index i = 0; i < l[0] && off + i < 5; ++i)
        for (int j = 0; j < 3; ++j) blk(i, j) = mine(off + i, j);
      return blk;
    }());
    auto q = p + p;
    auto s = p * 3.0;
    auto n = -p;
    static_assert(decltype(q)::is_partial && decltype(s)::is_partial && decltype(n)::is_partial);
    auto plain = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, want);
    auto mixed = p + plain;
    static_assert(!decltype(mixed)::is_partial);
    Eigen::Tensor<double, 2> w2 = want * 2.0, w3 = want * 3.0, wn = -want;
    TS_REQUIRE_ALL(compare(q.gather(), w2, 1e-12) == "" && compare(s.gather(), w3, 1e-12) == "");
    TS_REQUIRE_ALL(compare(n.gather(), wn, 1e-12) == "" && compare(mixed.gather(), w2, 1e-12) == "");
    auto e = ts::exp(p);
    static_assert(!decltype(e)::is_partial);
    Eigen::Tensor<double, 2> we = want.exp();
    const Eigen::Tensor<double, 0> largest = we.abs().maximum();  // sums over many ranks: exp of ~20
    TS_REQUIRE_ALL(compare(e.gather(), we, 1e-13 * std::max(1.0, largest())) == "");
  });
}

TEST_CASE("a partial sum meeting an operand split over its axes resolves by reduce-scatter into that split", "[ops]") {
  // Megatron's sequence-parallel residual: x split over y on a dim the partial has whole.
  on_every_mesh([](M2& mesh, auto sizes) {
    const int k = sizes[1];
    Eigen::Tensor<double, 2> want(7, 5);
    want.setZero();
    for (int c = 0; c < k; ++c) want += values(7, 5, 3 + c);
    using P = ts::PartialSum<"y">;
    auto p = ts::from_local<ts::Spec<ts::S<"x">, ts::R>, P>(mesh, {7, 5}, [&] {
      auto l = ts::padded_local_shape<ts::Spec<ts::S<"x">, ts::R>>(mesh, {7, 5});
      const Eigen::Tensor<double, 2> mine = values(7, 5, 3 + mesh.coord<"y">());
      Eigen::Tensor<double, 2> blk(l[0], l[1]);
      blk.setZero();
      const Eigen::Index off = std::min<Eigen::Index>(mesh.coord<"x">() * l[0], 7);
      for (Eigen::Index i = 0; i < l[0] && off + i < 7; ++i)
        for (int j = 0; j < 5; ++j) blk(i, j) = mine(off + i, j);
      return blk;
    }());
    const Eigen::Tensor<double, 2> gx = values(7, 5, 11);
    auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, gx);
    ts::reset_comm_stats();
    auto sum = x + p;
    auto product = p * x;  // either side, any operator
    static_assert(std::is_same_v<typename decltype(sum)::SpecType, ts::Spec<ts::S<"x">, ts::S<"y">>> && !decltype(sum)::is_partial);
    std::uint64_t scattered = 0, all_reduced = 0, bytes = 0;
    for (auto& [name, op] : ts::comm_stats().operators()) {
      scattered += op.calls("reduce_scatter");
      all_reduced += op.calls("all_reduce");
      bytes += op.total().bytes_sent;
    }
    // Two reduce-scatters (one per operator), no all-reduce: each rank sends every other rank of
    // its y line that rank's block of its rows (a ring's bytes, half an all-reduce's): at least
    // the valid elements, at most the padded blocks.
    const Eigen::Index rows = ts::detail::shard_valid(7, sizes[0], mesh.coord<"x">());
    std::uint64_t others = 0;
    for (int q = 0; q < k; ++q)
      if (q != mesh.coord<"y">()) others += std::uint64_t(rows * ts::detail::shard_valid(5, k, q));
    const std::uint64_t padded = std::uint64_t((7 + sizes[0] - 1) / sizes[0]) * std::uint64_t((5 + k - 1) / k) * std::uint64_t(k - 1);
    TS_REQUIRE_ALL(all_reduced == 0 && scattered == (k > 1 ? 2u : 0u));
    TS_REQUIRE_ALL(bytes >= 2 * others * sizeof(double) && bytes <= 2 * padded * sizeof(double));
    Eigen::Tensor<double, 2> ws = gx + want, wp = want * gx;
    TS_REQUIRE_ALL(compare(sum.gather(), ws, 1e-12) == "" && compare(product.gather(), wp, 1e-12) == "");
    // A broadcast dim (x of one row) keeps the all-reduce.
    auto row = ts::distribute<ts::Spec<ts::R, ts::S<"y">>>(mesh, Eigen::Tensor<double, 2>(gx.slice(std::array<Eigen::Index, 2>{0, 0}, std::array<Eigen::Index, 2>{1, 5})));
    auto broadcast = p + row;
    Eigen::Tensor<double, 2> wb = want;
    for (Eigen::Index i = 0; i < 7; ++i)
      for (Eigen::Index j = 0; j < 5; ++j) wb(i, j) += gx(0, j);
    TS_REQUIRE_ALL(compare(broadcast.gather(), wb, 1e-12) == "");
  });
}

TEST_CASE("a partial sum over two axes resolved into a partial over one sums over the other only", "[ops]") {
  // What a gradient left to a data-parallel owner takes: a sum over {x, y} kept partial over x.
  on_every_mesh([](M2& mesh, auto sizes) {
    const int kx = sizes[0], ky = sizes[1];
    using Rows = ts::Spec<ts::R, ts::S<"y">>;  // y splits too: the sum over y is a reduce-scatter
    Eigen::Tensor<double, 2> want(7, 5);
    want.setZero();
    for (int c = 0; c < kx * ky; ++c) want += values(7, 5, 3 + c);
    auto mine = [&] { return values(7, 5, 3 + mesh.coord<"x">() * ky + mesh.coord<"y">()); };
    auto p = ts::from_local<ts::Spec<ts::R, ts::R>, ts::PartialSum<"x", "y">>(mesh, {7, 5}, mine());
    auto& state = *ts::detail::state_of(mesh);
    using Kept = ts::ShardedTensor<double, M2, ts::Spec<ts::R, ts::R>, ts::PartialSum<"x">>;
    using KeptRows = ts::ShardedTensor<double, M2, Rows, ts::PartialSum<"x">>;
    ts::reset_comm_stats();
    auto kept = ts::detail::implicit_reshard(state, p.spec_desc, Kept::spec_desc, ts::detail::extents_of(p), p.data(), "test");
    auto rows = ts::detail::implicit_reshard(state, p.spec_desc, KeptRows::spec_desc, ts::detail::extents_of(p), p.data(), "test");
    std::uint64_t all_reduced = 0, scattered = 0, bytes = 0;
    for (auto& [name, op] : ts::comm_stats().operators()) {
      all_reduced += op.calls("all_reduce");
      scattered += op.calls("reduce_scatter");
      bytes += op.total().bytes_sent;
    }
    // One all-reduce and one reduce-scatter over y's ky ranks, nothing over x: with y of one rank
    // nothing moves; else at most an all-reduce's and a reduce-scatter's bytes over y.
    TS_REQUIRE_ALL(all_reduced == (ky > 1 ? 1u : 0u) && scattered == (ky > 1 ? 1u : 0u));
    const std::uint64_t block = (5 + ky - 1) / ky;
    TS_REQUIRE_ALL(ky > 1 ? bytes > 0 && bytes <= (2 * 35 + 7 * block * (ky - 1)) * sizeof(double) : bytes == 0);
    // Summed over x, both are the whole sum.
    Eigen::Tensor<double, 2> a(7, 5);
    std::copy(kept.data, kept.data + 35, a.data());
    auto resolved = ts::reshard<ts::Spec<ts::R, ts::R>>(ts::from_local<ts::Spec<ts::R, ts::R>, ts::PartialSum<"x">>(mesh, {7, 5}, std::move(a)));
    TS_REQUIRE_ALL(compare(resolved.gather(), want, 1e-12) == "");
    const auto l = ts::padded_local_shape<Rows>(mesh, {7, 5});
    Eigen::Tensor<double, 2> b(l[0], l[1]);
    std::copy(rows.data, rows.data + b.size(), b.data());
    auto resolved_rows = ts::reshard<Rows>(ts::from_local<Rows, ts::PartialSum<"x">>(mesh, {7, 5}, std::move(b)));
    TS_REQUIRE_ALL(compare(resolved_rows.gather(), want, 1e-12) == "");
  });
}

TEST_CASE("a partial sum over two axes kept partial over one lands in a split over a third", "[ops]") {
  // The gradient of a weight split over z whose contribution sums over x and y, x left to an
  // owner: an all-reduce over y and a local slice over z (the slice once went missing).
  using M3 = ts::Mesh<"x", "y", "z">;
  for (auto sizes : mesh_shapes(world_size(), 3)) {
    M3 mesh({sizes[0], sizes[1], sizes[2]});
    INFO("mesh " << sizes[0] << "x" << sizes[1] << "x" << sizes[2]);
    const int ky = sizes[1];
    Eigen::Tensor<double, 2> want(7, 5);
    want.setZero();
    for (int c = 0; c < sizes[0] * ky; ++c) want += values(7, 5, 3 + c);
    auto p = ts::from_local<ts::Spec<ts::R, ts::R>, ts::PartialSum<"x", "y">>(
        mesh, {7, 5}, values(7, 5, 3 + mesh.coord<"x">() * ky + mesh.coord<"y">()));
    using Kept = ts::ShardedTensor<double, M3, ts::Spec<ts::S<"z">, ts::R>, ts::PartialSum<"x">>;
    auto kept = ts::detail::implicit_reshard(*ts::detail::state_of(mesh), p.spec_desc, Kept::spec_desc,
                                             ts::detail::extents_of(p), p.data(), "test");
    const auto l = ts::padded_local_shape<ts::Spec<ts::S<"z">, ts::R>>(mesh, {7, 5});
    Eigen::Tensor<double, 2> block(l[0], l[1]);
    std::copy(kept.data, kept.data + block.size(), block.data());
    auto resolved = ts::reshard<ts::Spec<ts::S<"z">, ts::R>>(
        ts::from_local<ts::Spec<ts::S<"z">, ts::R>, ts::PartialSum<"x">>(mesh, {7, 5}, std::move(block)));
    TS_REQUIRE_ALL(compare(resolved.gather(), want, 1e-12) == "");
  }
}

TEST_CASE("sum, max, min and mean over split dims give partials that resolve to the serial value", "[ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(7, 5, 8);
    for_each_type(Specs2{}, [&]<class S>(S*) {
      auto x = ts::distribute<S>(mesh, g);
      Eigen::array<Eigen::Index, 1> d0{0}, d1{1};
      Eigen::Tensor<double, 1> s0 = g.sum(d0), s1 = g.sum(d1), m0 = g.maximum(d0), n1 = g.minimum(d1), a1 = g.mean(d1);
      Eigen::Tensor<double, 0> all = g.sum();
      auto r0 = ts::sum<0>(x);
      static_assert(decltype(r0)::rank == 1);
      static_assert(decltype(r0)::is_partial == (S::rank == 2 && !std::is_same_v<ts::detail::dim_at_t<S, 0>, ts::R>));
      INFO(x.describe());
      TS_REQUIRE_ALL(compare(r0.gather(), s0, 1e-12) == "" && compare(ts::sum<1>(x).gather(), s1, 1e-12) == "");
      TS_REQUIRE_ALL(compare(ts::max<0>(x).gather(), m0) == "" && compare(ts::min<1>(x).gather(), n1) == "");
      TS_REQUIRE_ALL(compare(ts::mean<1>(x).gather(), a1, 1e-12) == "");
      auto total = ts::sum<0, 1>(x);
      static_assert(decltype(total)::rank == 0);
      TS_REQUIRE_ALL(compare(total.gather(), all, 1e-12) == "");
      TS_REQUIRE_ALL(compare(ts::reshard<ts::Spec<ts::R>>(ts::sum<1>(x)).gather(), s1, 1e-12) == "");
    });
  });
}

TEST_CASE("rank-3 broadcasts, keep-dims reductions and 4-D batched einsums equal the serial result", "[ops]") {
  // RMSNorm's, rotary's and attention's shapes ([B, T, D] against [B, T, 1], [1, 1, D], [1, T, D],
  // a scalar and a partial), where the local kernels merge leading dims into long runs; uneven
  // on every mesh, split and broadcast operands on either side.
  on_every_mesh([](M2& mesh, auto sizes) {
    auto filled = [](std::array<Eigen::Index, 3> e, double phase) {
      Eigen::Tensor<double, 3> t(e[0], e[1], e[2]);
      for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = std::cos(0.37 * double(i) + phase);
      return t;
    };
    const auto gx = filled({5, 7, 6}, 0), gr = filled({5, 7, 1}, 1), gw = filled({1, 1, 6}, 2), gm = filled({1, 7, 6}, 3);
    auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::S<"y">>>(mesh, gx);
    auto r = ts::distribute<ts::Spec<ts::S<"y">, ts::S<"x">, ts::R>>(mesh, gr);
    auto w = ts::distribute<ts::Spec<ts::R, ts::R, ts::S<"x">>>(mesh, gw);
    auto m = ts::distribute<ts::Spec<ts::R, ts::S<"y">, ts::R>>(mesh, gm);
    const Eigen::array<Eigen::Index, 3> over_d{1, 1, 6}, over_bt{5, 7, 1}, over_b{5, 1, 1};
    const Eigen::Tensor<double, 3> br = gr.broadcast(over_d), bw = gw.broadcast(over_bt), bm = gm.broadcast(over_b);
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    Eigen::Tensor<double, 3> want_xr = gx * br, want_wx = bw * gx, want_xm = gx + bm, want_rw = br - bw,
                             want_scaled = gx * 2.0 + bm;
    TS_REQUIRE_ALL(compare((x * r).gather(), want_xr) == "" && compare((w * x).gather(), want_wx) == "");
    TS_REQUIRE_ALL(compare((x + m).gather(), want_xm) == "" && compare((r - w).gather(), want_rw) == "");
    TS_REQUIRE_ALL(compare((x * 2.0 + m).gather(), want_scaled) == "");
    // A keep-dims sum over D, partial where D is split, on either side of a broadcast product.
    const Eigen::array<Eigen::Index, 1> d2{2};
    const Eigen::array<Eigen::Index, 3> kept{5, 7, 1};
    const Eigen::Tensor<double, 3> gs = gx.sum(d2).reshape(kept), gmean = gx.mean(d2).reshape(kept),
                                   gmax = gx.maximum(d2).reshape(kept);
    auto s = ts::sum<2>(x, ts::keep_dims);
    static_assert(decltype(s)::is_partial);
    Eigen::Tensor<double, 3> want_xs = gx * gs.broadcast(over_d);
    TS_REQUIRE_ALL(compare((x * s).gather(), want_xs, 1e-12) == "" && compare((s * x).gather(), want_xs, 1e-12) == "");
    TS_REQUIRE_ALL(compare(ts::mean<2>(x, ts::keep_dims).gather(), gmean, 1e-12) == "");
    TS_REQUIRE_ALL(compare(ts::max<2>(x, ts::keep_dims).gather(), gmax) == "");
    auto xr = ts::reshard<ts::Spec<ts::S<"x">, ts::S<"y">, ts::R>>(x);  // D whole: the kept B T runs are local
    TS_REQUIRE_ALL(compare(ts::sum<2>(xr, ts::keep_dims).gather(), gs, 1e-12) == "");
    // Attention's scores, q [B, T, K, V] and k [B, S, K, V]: b and v are batch labels.
    Eigen::Tensor<double, 4> gq(3, 5, 4, 2), gk(3, 6, 4, 2), want(3, 5, 6, 2);
    for (Eigen::Index i = 0; i < gq.size(); ++i) gq.data()[i] = std::sin(0.3 * double(i));
    for (Eigen::Index i = 0; i < gk.size(); ++i) gk.data()[i] = std::cos(0.7 * double(i));
    for (int b = 0; b < 3; ++b)
      for (int t = 0; t < 5; ++t)
        for (int u = 0; u < 6; ++u)
          for (int v = 0; v < 2; ++v) {
            double acc = 0;
            for (int k = 0; k < 4; ++k) acc += gq(b, t, k, v) * gk(b, u, k, v);
            want(b, t, u, v) = acc;
          }
    auto q = ts::distribute<ts::Spec<ts::R, ts::S<"x">, ts::R, ts::S<"y">>>(mesh, gq);
    auto k = ts::distribute<ts::Spec<ts::S<"y">, ts::R, ts::R, ts::R>>(mesh, gk);
    TS_REQUIRE_ALL(compare(ts::einsum<"btkv,bskv->btsv">(q, k).gather(), want, 1e-12) == "");
    // Past the GEMM packing's 16 x 16 tiles in b, t and s (packs that transpose, b first), a
    // scalar on either side: scores partial over x (k split alike), then read as the context's
    // left operand.
    Eigen::Tensor<double, 4> hq(19, 37, 4, 2), hk(19, 35, 4, 2), scores(19, 37, 35, 2), context(19, 37, 4, 2);
    for (Eigen::Index i = 0; i < hq.size(); ++i) hq.data()[i] = std::sin(0.11 * double(i));
    for (Eigen::Index i = 0; i < hk.size(); ++i) hk.data()[i] = std::cos(0.13 * double(i));
    scores.setZero();
    context.setZero();
    for (int v = 0; v < 2; ++v)
      for (int b = 0; b < 19; ++b)
        for (int t = 0; t < 37; ++t)
          for (int u = 0; u < 35; ++u) {
            for (int c = 0; c < 4; ++c) scores(b, t, u, v) += 0.5 * hq(b, t, c, v) * hk(b, u, c, v);
            for (int c = 0; c < 4; ++c) context(b, t, c, v) += scores(b, t, u, v) * 2.0 * hk(b, u, c, v);
          }
    auto tq = ts::distribute<ts::Spec<ts::S<"y">, ts::R, ts::S<"x">, ts::R>>(mesh, hq);
    auto tk = ts::distribute<ts::Spec<ts::R, ts::R, ts::S<"x">, ts::R>>(mesh, hk);
    auto tv = ts::distribute<ts::Spec<ts::R, ts::S<"y">, ts::R, ts::S<"x">>>(mesh, hk);
    auto ts_scores = ts::einsum<"btkv,bskv->btsv">(0.5 * tq, tk);
    static_assert(decltype(ts_scores)::is_partial);
    TS_REQUIRE_ALL(compare(ts_scores.gather(), scores, 1e-12) == "");
    TS_REQUIRE_ALL(compare(ts::einsum<"btsv,bskv->btkv">(ts_scores, tv * 2.0).gather(), context, 1e-11) == "");
  });
}

TEST_CASE("argmax returns global indices: ties to the lowest, NaN wins, never partial", "[ops]") {
  on_every_mesh([](M2& mesh, auto) {
    Eigen::Tensor<double, 2> g(7, 3);
    for (int i = 0; i < 7; ++i) {
      g(i, 0) = (i == 2 || i == 5) ? 9.0 : double(i % 3);  // tie: 2 wins
      g(i, 1) = i == 6 ? NAN : double(i);                    // NaN wins
      g(i, 2) = -double(i);                                  // first
    }
    for_each_type(Specs2{}, [&]<class S>(S*) {
      auto x = ts::distribute<S>(mesh, g);
      auto a = ts::argmax<0>(x);
      static_assert(std::is_same_v<typename decltype(a)::Scalar, std::int64_t> && !decltype(a)::is_partial);
      Eigen::Tensor<std::int64_t, 1> got = a.gather();
      TS_REQUIRE_ALL(got(0) == 2 && got(1) == 6 && got(2) == 0);
      Eigen::Tensor<std::int64_t, 1> rows = ts::argmax<1>(x).gather();
      bool ok = true;
      for (int i = 0; i < 7; ++i) {
        std::int64_t want = 0;
        for (int j = 1; j < 3; ++j)
          if ((std::isnan(g(i, j)) && !std::isnan(g(i, want))) || g(i, j) > g(i, want)) want = j;
        ok &= rows(i) == want;
      }
      TS_REQUIRE_ALL(ok);
    });
  });
}

TEST_CASE("matmul equals the serial product for every pair of operand specs", "[ops][matmul]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const auto ga = values(7, 5, 1), gb = values(5, 6, 2);
    Eigen::array<Eigen::IndexPair<int>, 1> contract{Eigen::IndexPair<int>(1, 0)};
    Eigen::Tensor<double, 2> want = ga.contract(gb, contract);
    for_each_type(Specs2{}, [&]<class SA>(SA*) {
      for_each_type(Specs2{}, [&]<class SB>(SB*) {
        auto a = ts::distribute<SA>(mesh, ga);
        auto b = ts::distribute<SB>(mesh, gb);
        auto c = ts::matmul(a, b);
        INFO("mesh " << sizes[0] << "x" << sizes[1] << ": a " << a.describe() << ", b " << b.describe() << " -> "
                     << c.describe());
        TS_REQUIRE_ALL(compare(c.gather(), want, 1e-12) == "");
        auto pinned = ts::einsum<"ij,jk->ik", ts::Spec<ts::S<"y">, ts::R>>(a, b);
        TS_REQUIRE_ALL(compare(pinned.gather(), want, 1e-12) == "");
      });
    });
  });
}

TEST_CASE("matmul deduces GSPMD's output specs", "[ops][matmul]") {
  using X = ts::ShardedTensor<float, M2, ts::Spec<ts::S<"x">, ts::R>>;
  using W = ts::ShardedTensor<float, M2, ts::Spec<ts::R, ts::S<"y">>>;
  using K = ts::ShardedTensor<float, M2, ts::Spec<ts::R, ts::S<"y">>>;
  using KT = ts::ShardedTensor<float, M2, ts::Spec<ts::S<"y">, ts::R>>;
  using Y = decltype(ts::matmul(std::declval<X>(), std::declval<W>()));
  static_assert(std::is_same_v<Y::SpecType, ts::Spec<ts::S<"x">, ts::S<"y">>> && !Y::is_partial);
  using C = decltype(ts::matmul(std::declval<K>(), std::declval<KT>()));  // contracting dim split on y
  static_assert(std::is_same_v<C::SpecType, ts::Spec<ts::R, ts::R>> &&
                std::is_same_v<C::PartialType, ts::PartialSum<"y">>);
  SUCCEED();
}

TEST_CASE("batched einsum and other index layouts equal Eigen's contraction", "[ops][matmul]") {
  on_every_mesh([](M2& mesh, auto) {
    Eigen::Tensor<double, 3> ga(3, 4, 5), gb(3, 5, 2);
    for (Eigen::Index i = 0; i < ga.size(); ++i) ga.data()[i] = std::cos(double(i));
    for (Eigen::Index i = 0; i < gb.size(); ++i) gb.data()[i] = std::sin(double(i));
    Eigen::Tensor<double, 3> want(3, 4, 2);
    for (int b = 0; b < 3; ++b)
      for (int i = 0; i < 4; ++i)
        for (int k = 0; k < 2; ++k) {
          double s = 0;
          for (int j = 0; j < 5; ++j) s += ga(b, i, j) * gb(b, j, k);
          want(b, i, k) = s;
        }
    auto a = ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::S<"y">>>(mesh, ga);
    auto b = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">, ts::R>>(mesh, gb);
    auto c = ts::einsum<"bij,bjk->bik">(a, b);
    static_assert(decltype(c)::is_partial);
    TS_REQUIRE_ALL(compare(c.gather(), want, 1e-12) == "");
    auto b2 = ts::distribute<ts::Spec<ts::R, ts::R, ts::S<"x">>>(mesh, gb);
    auto c2 = ts::einsum<"bij,bjk->ikb">(a, b2);
    Eigen::array<int, 3> perm{1, 2, 0};
    Eigen::Tensor<double, 3> want2 = want.shuffle(perm);
    TS_REQUIRE_ALL(compare(c2.gather(), want2, 1e-12) == "");
    // Outer product and vector dot.
    auto v = ts::distribute<ts::Spec<ts::S<"y">>>(mesh, Eigen::Tensor<double, 1>(ga.chip(0, 0).chip(0, 0)));
    auto w = ts::distribute<ts::Spec<ts::S<"x">>>(mesh, Eigen::Tensor<double, 1>(gb.chip(0, 0).chip(0, 1)));
    Eigen::Tensor<double, 1> gv = ga.chip(0, 0).chip(0, 0), gw = gb.chip(0, 0).chip(0, 1);
    Eigen::array<Eigen::IndexPair<int>, 0> none{};
    Eigen::Tensor<double, 2> outer = gv.contract(gw, none);
    TS_REQUIRE_ALL(compare(ts::einsum<"i,k->ik">(v, w).gather(), outer, 1e-12) == "");
    Eigen::array<Eigen::IndexPair<int>, 1> dot{Eigen::IndexPair<int>(0, 0)};
    Eigen::Tensor<double, 0> wd = gv.contract(gv, dot);
    TS_REQUIRE_ALL(compare(ts::einsum<"i,i->">(v, v).gather(), wd, 1e-12) == "");
  });
}

TEST_CASE("contracting dims of different sizes are a ShapeError on every rank", "[ops][matmul]") {
  on_every_mesh([](M2& mesh, auto) {
    auto a = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {7, 5});
    auto b = ts::zeros<float, ts::Spec<ts::R, ts::S<"y">>>(mesh, {6, 3});
    bool threw = false;
    try {
      auto c = ts::matmul(a, b);
    } catch (const ts::ShapeError& e) {
      threw = std::string(e.what()).find("[7, 5] {x, R}") != std::string::npos;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("transpose permutes dims and spec without communication", "[ops]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(7, 5, 9);
    auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
    ts::reset_comm_stats();
    auto t = ts::transpose<1, 0>(x);
    const auto moved = ts::comm_stats().total().bytes_sent;
    static_assert(std::is_same_v<decltype(t)::SpecType, ts::Spec<ts::S<"y">, ts::S<"x">>>);
    Eigen::array<int, 2> p{1, 0};
    Eigen::Tensor<double, 2> want = g.shuffle(p);
    TS_REQUIRE_ALL(moved == 0);
    TS_REQUIRE_ALL(compare(t.gather(), want) == "");
  });
}

TEST_CASE("free dims split by one axis in both operands: every strategy gives the product", "[ops][matmul]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const auto ga = values(9, 5, 1), gb = values(5, 11, 2);
    Eigen::array<Eigen::IndexPair<int>, 1> contract{Eigen::IndexPair<int>(1, 0)};
    Eigen::Tensor<double, 2> want = ga.contract(gb, contract);
    auto a = ts::distribute<ts::Spec<ts::S<"x", "y">, ts::R>>(mesh, ga);
    auto b = ts::distribute<ts::Spec<ts::R, ts::S<"x", "y">>>(mesh, gb);
    for (auto s : {ts::EinsumStrategy::Auto, ts::EinsumStrategy::GatherRight, ts::EinsumStrategy::GatherLeft,
                   ts::EinsumStrategy::Windowed}) {
      ts::reset_comm_stats();
      auto c = ts::matmul(a, b, s);
      static_assert(std::is_same_v<typename decltype(c)::SpecType, ts::Spec<ts::S<"x", "y">, ts::R>>);
      const auto stats = ts::comm_stats();
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", strategy " << int(s) << ": " << ts::explain_einsum<"ij,jk->ik">(a, b, s)
                   << "\n" << stats.report());
      TS_REQUIRE_ALL(compare(c.gather(), want, 1e-12) == "");
      const int p = world_size();
      if (s == ts::EinsumStrategy::Windowed && p > 1) {
        // k - 1 rotations of one padded block of b (5 x ceil(11/p)) each.
        const std::uint64_t block = 5 * ((11 + p - 1) / p) * sizeof(double);
        const auto ring = stats.collective("ring_shift");
        TS_REQUIRE_ALL(ring.calls == std::uint64_t(p - 1) && ring.bytes_received == block * (p - 1));
      }
      if (s == ts::EinsumStrategy::GatherLeft && p > 1) {
        // a's other rows (9 split p ways), then the product's move {R, (x,y)} -> {(x,y), R}:
        // my rows of every other rank's columns (11 split p ways).
        auto part = [&](std::int64_t n, std::int64_t c) {
          const std::int64_t b = (n + p - 1) / p;
          return std::clamp<std::int64_t>(n - c * b, 0, b);
        };
        const std::int64_t me = mesh.rank(), rows = part(9, me);
        std::int64_t moved = 5 * (9 - rows);
        for (int g = 0; g < p; ++g)
          if (g != me) moved += rows * part(11, g);
        TS_REQUIRE_ALL(stats.total().bytes_received == std::uint64_t(moved) * sizeof(double));
      }
      if (s == ts::EinsumStrategy::GatherRight && p > 1) {
        // Every other rank's valid columns of b (11 split p ways over (x, y), my block is mine).
        const std::int64_t b = (11 + p - 1) / p, mine = std::clamp<std::int64_t>(11 - mesh.rank() * b, 0, b);
        TS_REQUIRE_ALL(stats.collective("all_gather").bytes_received == std::uint64_t(5 * (11 - mine)) * sizeof(double));
      }
    }
    const std::string why = ts::explain_einsum<"ij,jk->ik">(a, b, ts::EinsumStrategy::Windowed);
    TS_REQUIRE_ALL(world_size() == 1 || why.find("windowed") != std::string::npos);
  });
}

TEST_CASE("a contracting dim split alike in both operands moves nothing and leaves a partial sum", "[ops][matmul]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto ga = values(6, 7, 1), gb = values(7, 4, 2);
    auto a = ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, ga);
    auto b = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, gb);
    ts::reset_comm_stats();
    auto c = ts::matmul(a, b);
    const auto moved = ts::comm_stats().total().bytes_received;
    static_assert(std::is_same_v<typename decltype(c)::PartialType, ts::PartialSum<"x">>);
    TS_REQUIRE_ALL(moved == 0);
    // Resolving it to a split is a reduce-scatter of the 6 x 4 product.
    ts::reset_comm_stats();
    auto r = ts::reshard<ts::Spec<ts::S<"x">, ts::R>>(c);
    const int k = mesh.size<"x">();
    const std::uint64_t chunk = ((6 + k - 1) / k) * 4 * sizeof(double);
    TS_REQUIRE_ALL(ts::comm_stats().collective("reduce_scatter").bytes_received == chunk * (k - 1));
    Eigen::array<Eigen::IndexPair<int>, 1> contract{Eigen::IndexPair<int>(1, 0)};
    Eigen::Tensor<double, 2> want = ga.contract(gb, contract);
    TS_REQUIRE_ALL(compare(r.gather(), want, 1e-12) == "");
  });
}

TEST_CASE("slice, pad and concat equal Eigen's on every spec, windows crossing shard borders", "[ops][shape]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto g = values(9, 7, 4), h = values(9, 3, 5);
    for_each_type(Specs2{}, [&]<class S>(S*) {
      auto x = ts::distribute<S>(mesh, g);
      INFO(x.describe());
      Eigen::array<Eigen::Index, 2> off{2, 1}, ext{6, 5};
      Eigen::Tensor<double, 2> ws = g.slice(off, ext);
      TS_REQUIRE_ALL(compare(ts::slice(x, {2, 1}, {6, 5}).gather(), ws) == "");
      Eigen::Tensor<double, 2> empty(0, 7);
      TS_REQUIRE_ALL(compare(ts::slice(x, {9, 0}, {0, 7}).gather(), empty) == "");
      Eigen::array<std::pair<Eigen::Index, Eigen::Index>, 2> pads{std::pair<Eigen::Index, Eigen::Index>{1, 3},
                                                                  std::pair<Eigen::Index, Eigen::Index>{0, 2}};
      Eigen::Tensor<double, 2> wp = g.pad(pads, 7.5);
      TS_REQUIRE_ALL(compare(ts::pad(x, {1, 0}, {3, 2}, 7.5).gather(), wp) == "");
      auto y = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, h);
      Eigen::Tensor<double, 2> wc = g.concatenate(h, 1);
      TS_REQUIRE_ALL(compare(ts::concat<1>(x, y).gather(), wc) == "");
      Eigen::Tensor<double, 2> wr = g.concatenate(g, 0);
      TS_REQUIRE_ALL(compare(ts::concat<0>(x, x).gather(), wr) == "");
    });
    bool threw = false;
    try {
      auto s = ts::slice(ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, g), {5, 0}, {5, 7});
    } catch (const ts::ShapeError&) {
      threw = true;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("reshape follows column-major order; a split on the slowest dim that divides is free", "[ops][shape]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    const int k = sizes[0];
    Eigen::Tensor<double, 2> g = values(3, 4 * k, 6);
    auto x = ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, g);
    ts::reset_comm_stats();
    auto merged = ts::reshape<ts::Spec<ts::S<"x">>>(x, {12 * k});
    const auto free_bytes = ts::comm_stats().op("reshape/auto").total().bytes_received;
    Eigen::array<Eigen::Index, 1> flat{12 * k};
    Eigen::Tensor<double, 1> wm = g.reshape(flat);
    TS_REQUIRE_ALL(compare(merged.gather(), wm) == "");
    TS_REQUIRE_ALL(free_bytes == 0);
    // Uneven: 7 x 5 split on rows cannot stay local; the fallback gathers and says so.
    Eigen::Tensor<double, 2> u = values(7, 5, 7);
    auto ux = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, u);
    auto r = ts::reshape<ts::Spec<ts::R, ts::S<"y">, ts::R>>(ux, {5, 7, 1});
    Eigen::array<Eigen::Index, 3> dims{5, 7, 1};
    Eigen::Tensor<double, 3> wr = u.reshape(dims);
    TS_REQUIRE_ALL(compare(r.gather(), wr) == "");
    bool threw = false;
    try {
      auto bad = ts::reshape<ts::Spec<ts::R>>(ux, {34});
    } catch (const ts::ShapeError&) {
      threw = true;
    }
    TS_REQUIRE_ALL(threw);
  });
}

TEST_CASE("einsum sums indices that appear in one operand alone, split or not", "[ops][matmul]") {
  on_every_mesh([](M2& mesh, auto) {
    const auto ga = values(7, 5, 1), gb = values(5, 6, 2);
    // out(k) = sum_i sum_j a(i, j) b(j, k)
    Eigen::array<Eigen::IndexPair<int>, 1> contract{Eigen::IndexPair<int>(1, 0)};
    Eigen::array<Eigen::Index, 1> rows{0};
    Eigen::Tensor<double, 1> want = ga.contract(gb, contract).sum(rows);
    auto a = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, ga);
    auto b = ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, gb);
    auto c = ts::einsum<"ij,jk->k">(a, b);
    static_assert(decltype(c)::is_partial);
    TS_REQUIRE_ALL(compare(c.gather(), want, 1e-12) == "");
    // out(j, l) = sum_i a(i, j) * sum_k b(k, l): each operand summed on its own.
    Eigen::array<Eigen::Index, 1> first{0};
    Eigen::Tensor<double, 1> sa = ga.sum(first), sb = gb.sum(first);
    Eigen::array<Eigen::IndexPair<int>, 0> none{};
    Eigen::Tensor<double, 2> outer = sa.contract(sb, none);
    TS_REQUIRE_ALL(compare(ts::einsum<"ij,kl->jl">(a, b).gather(), outer, 1e-12) == "");
  });
}

// ---- every spec combination, through descriptors (one instantiation per element type) ----

namespace {
namespace d = tshard::detail;

std::vector<double> serial_values(d::Index n, int salt) {
  std::vector<double> v(static_cast<std::size_t>(n));
  for (d::Index i = 0; i < n; ++i) v[i] = std::sin(double(i * 7 + salt)) + 0.1 * salt;
  return v;
}

std::string first_difference(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  for (std::size_t i = 0; i < want.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= tol))
      return "element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", want " + std::to_string(want[i]);
  return "";
}
}  // namespace

TEST_CASE("elementwise ops for every pair of rank-2 specs on every 2-D mesh, broadcasting included", "[ops][all-specs]") {
  const auto specs = all_specs(2, 2);
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    auto& st = *tshard::detail::state_of(mesh);
    for (d::Extents sb : {d::Extents{7, 5}, d::Extents{7, 1}, d::Extents{1, 5}}) {
      const d::Extents sa{7, 5}, so{7, 5};
      const auto ga = serial_values(35, 1), gb = serial_values(d::volume(sb, 2), 2);
      for (const auto& da : specs)
        for (const auto& db : specs) {
          const d::SpecDesc dout = d::elementwise_desc(da, db);
          const auto la = local_block(st, da, sa, ga.data()), lb = local_block(st, db, sb, gb.data());
          const auto lo = d::shard_layout(dout, so, st.shape(), st.coords());
          std::vector<double> out(static_cast<std::size_t>(std::max<d::Index>(lo.padded_size(), 1)));
          d::binary_run<double>(st, d::BinaryKind::Sub, da, sa, la.data(), db, sb, lb.data(), dout, so, out.data(), "t");
          std::vector<double> want(35);
          for (int j = 0; j < 5; ++j)
            for (int i = 0; i < 7; ++i) want[i + 7 * j] = ga[i + 7 * j] - gb[(sb[0] == 1 ? 0 : i) + sb[0] * (sb[1] == 1 ? 0 : j)];
          const std::string err = first_difference(global_of(st, dout, so, out.data()), want, 0);
          INFO("a " << da.to_string(st.shape()) << " - b " << d::shape_to_string(sb, 2) << " " << db.to_string(st.shape())
                    << " -> " << dout.to_string(st.shape()) << " on " << st.shape().describe() << ": " << err);
          TS_REQUIRE_ALL(err.empty());
        }
    }
  }
}

TEST_CASE("einsum for every pair of operand specs: rank-2 matmul and rank-3 batched, every strategy", "[ops][all-specs]") {
  struct Form {
    d::EinsumLabels e;
    d::Extents sa, sb, so;
  };
  const Form forms[] = {
      {d::parse_einsum(ts::FixedString("ij,jk->ik")), {7, 5}, {5, 6}, {7, 6}},
      {d::parse_einsum(ts::FixedString("bij,bjk->bik")), {3, 4, 5}, {3, 5, 2}, {3, 4, 2}},
      {d::parse_einsum(ts::FixedString("ij,jk->k")), {5, 3}, {3, 4}, {4}},
  };
  const ts::EinsumStrategy strategies[] = {ts::EinsumStrategy::Auto, ts::EinsumStrategy::GatherLeft,
                                           ts::EinsumStrategy::Windowed};
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    auto& st = *tshard::detail::state_of(mesh);
    for (const auto& f : forms) {
      const auto ga = serial_values(d::volume(f.sa, f.e.na), 3), gb = serial_values(d::volume(f.sb, f.e.nb), 4);
      const auto want = serial_einsum(f.e, f.sa, ga, f.sb, gb, f.so);
      const auto specs_a = all_specs(f.e.na, 2), specs_b = all_specs(f.e.nb, 2);
      int n = 0;
      for (const auto& da : specs_a)
        for (const auto& db : specs_b) {
          const auto decision = d::decide_einsum(f.e, da, db);
          const d::SpecDesc dout = d::einsum_output_desc(f.e, decision, da, db);
          const auto la = local_block(st, da, f.sa, ga.data()), lb = local_block(st, db, f.sb, gb.data());
          const auto lo = d::shard_layout(dout, f.so, st.shape(), st.coords());
          const auto strategy = strategies[n++ % 3];
          std::vector<double> out(static_cast<std::size_t>(std::max<d::Index>(lo.padded_size(), 1)));
          d::einsum_run<double>(st, f.e, decision, da, f.sa, la.data(), db, f.sb, lb.data(), dout, f.so, out.data(),
                                strategy);
          const std::string err = first_difference(global_of(st, dout, f.so, out.data()), want, 1e-12);
          INFO("a " << da.to_string(st.shape()) << ", b " << db.to_string(st.shape()) << " -> "
                    << dout.to_string(st.shape()) << " on " << st.shape().describe() << ", strategy "
                    << int(strategy) << ": " << err);
          TS_REQUIRE_ALL(err.empty());
        }
    }
  }
}

TEST_CASE("forbidding implicit communication makes a misaligned operator a SpecError on every rank", "[ops]") {
  on_every_mesh([](M2& mesh, auto sizes) {
    auto a = ts::zeros<double, ts::Spec<ts::S<"x">, ts::R>>(mesh, {6, 4});
    auto aligned = ts::zeros<double, ts::Spec<ts::R, ts::S<"y">>>(mesh, {4, 5});
    auto sliced = ts::zeros<double, ts::Spec<ts::S<"y">, ts::R>>(mesh, {4, 5});
    auto misaligned = ts::zeros<double, ts::Spec<ts::R, ts::S<"x">>>(mesh, {4, 5});
    ts::implicit_communication() = ts::ImplicitCommunication::Forbid;
    bool aligned_ok = true, sliced_ok = true, refused = false;
    try {
      auto c = ts::matmul(a, aligned);  // {x, y}: nothing to move
    } catch (const ts::SpecError&) {
      aligned_ok = false;
    }
    try {
      auto c = ts::matmul(a, sliced);  // a's contracting dim takes y: a local slice, no communication
    } catch (const ts::SpecError&) {
      sliced_ok = false;
    }
    try {
      auto c = ts::matmul(a, misaligned);  // b's columns would reuse x: b must be all-gathered
    } catch (const ts::SpecError& e) {
      refused = std::string(e.what()).find("implicit communication is forbidden") != std::string::npos;
    }
    ts::implicit_communication() = ts::ImplicitCommunication::Allow;
    TS_REQUIRE_ALL(aligned_ok && sliced_ok);
    TS_REQUIRE_ALL(refused || sizes[0] == 1);
  });
}

// The local kernels walk their blocks in runs as long as the layouts allow (leading dims merged);
// each element must still be read from, and written to, where a per-element walk puts it.
namespace {
using tshard::detail::Extents;
using tshard::detail::Index;

Index column_major_offset(const Extents& i, const Extents& dims, int rank) {
  Index o = 0;
  for (int d = rank - 1; d >= 0; --d) o = o * dims[d] + i[d];
  return o;
}

template <class F>
void for_every_index(const Extents& dims, int rank, F&& f) {
  Extents i{};
  for (Index n = tshard::detail::volume(dims, rank), k = 0; k < n; ++k) {
    f(i);
    for (int d = 0; d < rank && ++i[d] == dims[d]; ++d) i[d] = 0;
  }
}

// permuted_copy packs l's valid block in `order` and unpacks it back: both equal a per-element
// walk, and the unpack writes no padding.
bool packs_and_unpacks(const tshard::detail::ShardLayout& l, const std::array<int, tshard::detail::kMaxRank>& order,
                       const std::vector<float>& in) {
  namespace td = tshard::detail;
  const int rank = l.rank;
  std::vector<float> packed(static_cast<std::size_t>(l.valid_size())), back(in.size(), 0.f);
  td::permuted_copy<true>(l, order, rank, in.data(), packed.data());
  td::permuted_copy<false>(l, order, rank, packed.data(), back.data());
  Extents pe{};
  for (int k = 0; k < rank; ++k) pe[k] = l.valid[order[k]];
  bool same = true;
  for_every_index(pe, rank, [&](const Extents& p) {
    Extents i{};
    for (int k = 0; k < rank; ++k) i[order[k]] = p[k];
    same &= packed[std::size_t(column_major_offset(p, pe, rank))] == in[std::size_t(column_major_offset(i, l.padded, rank))];
  });
  for_every_index(l.padded, rank, [&](const Extents& i) {
    bool valid = true;
    for (int d = 0; d < rank; ++d) valid &= i[d] < l.valid[d];
    const auto at = std::size_t(column_major_offset(i, l.padded, rank));
    same &= back[at] == (valid ? in[at] : 0.f);  // padding is never written
  });
  return same;
}

}  // namespace

TEST_CASE("local kernels in merged runs: broadcasts, reductions and GEMM packing equal a per-element walk", "[ops]") {
  namespace td = tshard::detail;
  std::mt19937 rng(2026);
  auto pick = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  auto values = [&](Index n) {  // small integers: every sum is exact in any order
    std::vector<float> v(static_cast<std::size_t>(n));
    for (auto& x : v) x = float(pick(-8, 8));
    return v;
  };
  int broadcasts = 0, merged_reductions = 0, merged_packs = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int rank = pick(1, 5);
    Extents out{}, ae{}, be{};
    for (int d = 0; d < rank; ++d) {
      out[d] = pick(1, 4);
      ae[d] = pick(0, 2) == 0 ? 1 : out[d];  // [B, T, D] against [B, T, 1], [1, 1, D], ...
      be[d] = pick(0, 2) == 0 ? 1 : out[d];
    }
    const auto a = values(td::volume(ae, rank)), b = values(td::volume(be, rank));
    std::vector<float> got(static_cast<std::size_t>(td::volume(out, rank)));
    const auto kind = static_cast<td::BinaryKind>(pick(0, 2));
    td::binary_kernel<float>(kind, got.data(), out, a.data(), ae, 1.f, b.data(), be, 2.f, rank);
    bool same = true;
    for_every_index(out, rank, [&](const Extents& i) {
      Extents ia{}, ib{};
      for (int d = 0; d < rank; ++d) ia[d] = ae[d] == 1 ? 0 : i[d], ib[d] = be[d] == 1 ? 0 : i[d];
      const float x = a[std::size_t(column_major_offset(ia, ae, rank))], y = 2.f * b[std::size_t(column_major_offset(ib, be, rank))];
      const float want = kind == td::BinaryKind::Add ? x + y : kind == td::BinaryKind::Sub ? x - y : x * y;
      same &= got[std::size_t(column_major_offset(i, out, rank))] == want;
    });
    broadcasts += ae != out || be != out;
    REQUIRE(same);

    // A padded block reduced over some dims into an output whose kept dims may be padded too.
    td::ShardLayout l;
    l.rank = rank;
    std::array<bool, td::kMaxRank> reduced{};
    Extents op_ext{};
    int out_rank = 0;
    for (int d = 0; d < rank; ++d) {
      l.valid[d] = pick(1, 4);
      l.padded[d] = l.valid[d] + (pick(0, 3) == 0 ? 1 : 0);
      reduced[d] = pick(0, 1) == 1;
      if (!reduced[d]) op_ext[out_rank++] = l.valid[d] + (pick(0, 3) == 0 ? 1 : 0);
    }
    const auto in = values(l.padded_size());
    const auto op = pick(0, 1) == 0 ? ts::ReduceOp::Sum : ts::ReduceOp::Max;
    std::vector<float> sums(static_cast<std::size_t>(td::volume(op_ext, out_rank)), -1.f);
    td::reduce_into<float, float>(op, in.data(), l, reduced, sums.data(), op_ext, out_rank);
    std::vector<float> want(sums.size(), td::reduce_identity<float>(op));
    for_every_index(l.valid, rank, [&](const Extents& i) {
      Extents o{};
      for (int d = 0, k = 0; d < rank; ++d)
        if (!reduced[d]) o[k++] = i[d];
      auto& w = want[std::size_t(column_major_offset(o, op_ext, out_rank))];
      w = td::combine(op, w, in[std::size_t(column_major_offset(i, l.padded, rank))]);
    });
    merged_reductions += rank > 1 && !reduced[0] && !reduced[1] && l.valid[0] == l.padded[0] && l.valid[0] == op_ext[0];
    REQUIRE(sums == want);

    // GEMM packing in a random dim order, and back: adjacent dims in order merge.
    std::array<int, td::kMaxRank> order{};
    std::iota(order.begin(), order.begin() + rank, 0);
    if (pick(0, 1)) std::shuffle(order.begin(), order.begin() + rank, rng);
    REQUIRE(packs_and_unpacks(l, order, in));
    merged_packs += rank > 1 && order[1] == order[0] + 1 && l.valid[order[0]] == l.padded[order[0]];
  }
  CHECK(broadcasts > 100);  // the cases the merging is for came up
  CHECK(merged_reductions > 20);
  CHECK(merged_packs > 20);
}

// Attention's packs are transposes (b, the buffer's contiguous dim, is a batch label), which
// permuted_copy walks in tiles: extents past a tile and not multiples of one, with padding.
TEST_CASE("GEMM packing that transposes, in tiles, equals a per-element walk", "[ops]") {
  namespace td = tshard::detail;
  std::mt19937 rng(2611);
  auto pick = [&](int lo, int hi) { return int(std::uniform_int_distribution<int>(lo, hi)(rng)); };
  int transposes = 0;
  for (int trial = 0; trial < 120; ++trial) {
    td::ShardLayout l;
    l.rank = pick(2, 4);
    for (int d = 0; d < l.rank; ++d) {
      l.valid[d] = d < 2 ? pick(1, 40) : pick(1, 5);
      l.padded[d] = l.valid[d] + (pick(0, 2) == 0 ? pick(1, 3) : 0);
    }
    std::array<int, td::kMaxRank> order{};
    std::iota(order.begin(), order.begin() + l.rank, 0);
    std::shuffle(order.begin(), order.begin() + l.rank, rng);
    std::vector<float> in(static_cast<std::size_t>(l.padded_size()));
    std::iota(in.begin(), in.end(), 1.f);
    REQUIRE(packs_and_unpacks(l, order, in));
    transposes += order[0] != 0 && l.valid[0] > 16 && l.valid[order[0]] > 16;
  }
  CHECK(transposes > 5);  // tiles were split along both dims
}
