// Every reshard transition against the serial truth: exhaustively for rank-2 tensors on every
// 2-D mesh that fits, randomly for rank 1-3 tensors on 1-3 axis meshes, through run-time
// descriptors (types check, descriptors do: docs/architecture.md), plus the typed API on a representative set.
#include "test_support.hpp"

namespace ts = tshard;
namespace d = tshard::detail;
using namespace tshard_test;

namespace {

d::SpecDesc random_spec(std::mt19937_64& rng, int rank, int axes) {
  d::SpecDesc s;
  s.rank = rank;
  std::vector<int> order(axes);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (int a : order) {
    int dim = int(rng() % (rank + 1));
    if (dim < rank) s.dims[dim].push(a);
  }
  return s;
}

// The contribution of partial-group member c to element i, such that combining all members
// with the partial's op gives exactly global[i] (int64: exact).
std::int64_t contribution(d::PartialKind kind, std::int64_t g, std::int64_t i, int c, int k) {
  auto h = [](std::int64_t i, int c) { return (i * 7 + c * 13) % 11 - 5; };
  switch (kind) {
    case d::PartialKind::Sum: {
      if (c != 0) return h(i, c);
      std::int64_t rest = 0;
      for (int o = 1; o < k; ++o) rest += h(i, o);
      return g - rest;
    }
    case d::PartialKind::Max: return c == i % k ? g : g - 1 - (i + c) % 5;
    case d::PartialKind::Min: return c == i % k ? g : g + 1 + (i + c) % 5;
    default: return g;
  }
}

struct Case {
  d::SpecDesc src, dst;
  d::Extents shape{};
};

std::string describe(const Case& c, const d::MeshShape& m) {
  return "reshard " + d::shape_to_string(c.shape, c.src.rank) + " " + c.src.to_string(m) + " -> " +
         c.dst.to_string(m) + " on mesh " + m.describe();
}

// Runs one reshard on every rank and returns "" when every element of the result (the local
// block, and the gathered tensor) equals the serial value; the first mismatch otherwise.
std::string check_reshard(d::MeshState& mesh, const Case& c) {
  const d::MeshShape& m = mesh.shape();
  const int rank = c.src.rank;
  const d::Index n = d::volume(c.shape, rank);
  std::vector<std::int64_t> global(static_cast<std::size_t>(n));
  for (d::Index i = 0; i < n; ++i) global[i] = (i * 2654435761LL) % 1000003 - 500000;
  // This rank's source block, built from the global truth (or its partial contributions).
  const d::ShardLayout sl = d::shard_layout(c.src, c.shape, m, mesh.coords());
  std::vector<std::int64_t> src(static_cast<std::size_t>(sl.padded_size()), -777);
  std::vector<std::int64_t> values = global;
  if (c.src.partial != d::PartialKind::None) {
    std::vector<int> pax = d::axes_of_mask(c.src.partial_axes, m.axes());
    int k = 1, coord = 0;
    for (int a : pax) {
      k *= m.sizes[a];
      coord = coord * m.sizes[a] + mesh.coords()[a];
    }
    for (d::Index i = 0; i < n; ++i) values[i] = contribution(c.src.partial, global[i], i, coord, k);
  }
  const d::Extents zero{};
  d::copy_box(values.data(), c.shape, sl.offset, src.data(), sl.padded, zero, sl.valid, rank);

  const d::ShardLayout dl = d::shard_layout(c.dst, c.shape, m, mesh.coords());
  std::vector<std::int64_t> dst(static_cast<std::size_t>(dl.padded_size()), -999);
  d::execute_reshard(mesh, c.src, c.dst, c.shape, src.data(), dst.data());

  std::vector<std::int64_t> want(static_cast<std::size_t>(dl.padded_size()), -999), got(static_cast<std::size_t>(dl.padded_size()), -999);
  d::copy_box(global.data(), c.shape, dl.offset, want.data(), dl.padded, zero, dl.valid, rank);
  d::copy_box(dst.data(), dl.padded, zero, got.data(), dl.padded, zero, dl.valid, rank);
  for (std::size_t i = 0; i < want.size(); ++i)
    if (want[i] != got[i])
      return "local element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", want " +
             std::to_string(want[i]);
  std::vector<std::int64_t> gathered(static_cast<std::size_t>(n), -1);
  d::gather_to_all(mesh, c.dst, c.shape, dst.data(), gathered.data());
  for (d::Index i = 0; i < n; ++i)
    if (gathered[i] != global[i]) return "gathered element " + std::to_string(i) + " differs";
  return "";
}

}  // namespace

// One transition checked against the serial value on every rank, its plan named on failure.
static void require_reshard_matches(d::MeshState& st, const Case& c) {
  const std::string err = check_reshard(st, c);
  INFO(describe(c, st.shape()) << ": " << err << " (plan: "
                              << d::cached_plan(st, c.src, c.dst, c.shape, sizeof(double))->describe(st.shape()) << ")");
  TS_REQUIRE_ALL(err.empty());
}

TEST_CASE("every rank-2 transition on every 2-D mesh equals the serial value, uneven shapes included") {
  const auto specs = tshard_test::all_specs(2, 2);
  REQUIRE(specs.size() == 11);
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    ts::Mesh<"x", "y"> mesh({sizes[0], sizes[1]});
    auto& st = *tshard::detail::state_of(mesh);
    for (d::Extents shape : {d::Extents{7, 5}, d::Extents{2, 3}, d::Extents{0, 4}, d::Extents{12, 6}})
      for (const auto& src : specs)
        for (const auto& dst : specs) {
          require_reshard_matches(st, Case{src, dst, shape});
        }
  }
}

TEST_CASE("partial sums, maxima and minima resolve to R or S on every 2-D mesh") {
  const auto specs = tshard_test::all_specs(2, 2);
  const d::PartialKind kinds[] = {d::PartialKind::Sum, d::PartialKind::Max, d::PartialKind::Min};
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    ts::Mesh<"x", "y"> mesh({sizes[0], sizes[1]});
    auto& st = *tshard::detail::state_of(mesh);
    int kind = 0;
    for (d::Extents shape : {d::Extents{7, 5}, d::Extents{3, 2}})
      for (d::SpecDesc src : specs) {
        const std::uint32_t free_axes = 3u & ~src.split_axes();
        for (std::uint32_t pmask = 1; pmask <= 3; ++pmask) {
          if ((pmask & free_axes) != pmask) continue;
          src.partial = kinds[kind++ % 3];
          src.partial_axes = pmask;
          for (const auto& dst : specs) {
            require_reshard_matches(st, Case{src, dst, shape});
          }
        }
      }
  }
}

TEST_CASE("random transitions of rank 1-3 tensors on 1-3 axis meshes equal the serial value") {
  const std::uint64_t seed = 20261122;
  std::mt19937_64 rng(seed);
  const d::Index extents[] = {0, 1, 2, 3, 5, 7, 11, 13};
  for (int axes = 1; axes <= 3; ++axes)
    for (auto sizes : mesh_shapes(world_size(), axes)) {
      std::unique_ptr<d::MeshState> owner;
      std::vector<std::string> names{"a", "b", "c"};
      names.resize(static_cast<std::size_t>(axes));
      auto st = std::make_shared<d::MeshState>(MPI_COMM_WORLD, names, sizes);
      for (int trial = 0; trial < 40; ++trial) {
        Case c;
        const int rank = 1 + int(rng() % 3);
        for (int dd = 0; dd < rank; ++dd) c.shape[dd] = extents[rng() % 8];
        c.src = random_spec(rng, rank, axes);
        c.dst = random_spec(rng, rank, axes);
        const std::uint32_t free_axes = ((1u << axes) - 1) & ~c.src.split_axes();
        if (free_axes && rng() % 2) {
          c.src.partial = d::PartialKind(1 + rng() % 3);
          c.src.partial_axes = std::uint32_t(rng()) & free_axes;
          if (!c.src.partial_axes) c.src.partial = d::PartialKind::None;
        }
        const std::string err = check_reshard(*st, c);
        INFO("seed " << seed << " trial " << trial << ": " << describe(c, st->shape()) << ": " << err);
        TS_REQUIRE_ALL(err.empty());
      }
    }
}

TEST_CASE("collectives split into chunks give the same results as unchunked ones") {
  d::set_collective_chunk_limit(3);
  const auto specs = tshard_test::all_specs(2, 2);
  auto sizes = mesh_shapes(world_size(), 2).back();
  ts::Mesh<"x", "y"> mesh({sizes[0], sizes[1]});
  auto& st = *tshard::detail::state_of(mesh);
  std::string first_error;
  for (const auto& src : specs)
    for (const auto& dst : specs) {
      d::SpecDesc psrc = src;
      if (!(psrc.split_axes() & 2u)) {
        psrc.partial = d::PartialKind::Sum;
        psrc.partial_axes = 2u;
      }
      for (const auto& s : {src, psrc}) {
        Case c{s, dst, d::Extents{9, 7}};
        std::string err = check_reshard(st, c);
        if (!err.empty() && first_error.empty()) first_error = describe(c, st.shape()) + ": " + err;
      }
    }
  d::set_collective_chunk_limit(INT_MAX);
  INFO(first_error);
  TS_REQUIRE_ALL(first_error.empty());
}

TEST_CASE("typed reshards deduce nothing and move data exactly") {
  using M = ts::Mesh<"data", "model">;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M mesh({sizes[0], sizes[1]});
    Eigen::Tensor<float, 2> g = iota_tensor<float, 2>({11, 6}, 3);
    using X = ts::Spec<ts::S<"data">, ts::R>;
    auto x = ts::distribute<X>(mesh, g);
    auto a = ts::reshard<ts::Spec<ts::R, ts::S<"model">>>(x);
    auto b = ts::reshard<ts::Spec<ts::S<"model", "data">, ts::R>>(a);
    auto c = ts::reshard<ts::Spec<ts::R, ts::S<"data", "model">>>(b);
    auto r = ts::reshard<ts::Spec<ts::R, ts::R>>(c);
    static_assert(std::is_same_v<decltype(a)::SpecType, ts::Spec<ts::R, ts::S<"model">>>);
    TS_REQUIRE_ALL(compare(a.gather(), g) == "" && compare(b.gather(), g) == "");
    TS_REQUIRE_ALL(compare(c.gather(), g) == "" && compare(r.gather(), g) == "");
    // Replicated values are bitwise identical on every rank: compare with rank 0's copy.
    Eigen::Tensor<float, 2> local = r.local();
    Eigen::Tensor<float, 2> root = local;
    MPI_Bcast(root.data(), int(root.size()), MPI_FLOAT, 0, MPI_COMM_WORLD);
    TS_REQUIRE_ALL(std::memcmp(root.data(), local.data(), sizeof(float) * static_cast<std::size_t>(root.size())) == 0);
    // reshard_into writes into existing storage.
    auto dst = ts::zeros<float, ts::Spec<ts::S<"model">, ts::S<"data">>>(mesh, {11, 6});
    const float* storage = dst.data();
    ts::reshard_into(dst, x);
    TS_REQUIRE_ALL(dst.data() == storage && compare(dst.gather(), g) == "");
  }
}

TEST_CASE("a reshard between layouts that differ only in axes of one rank shares the buffer, copies before a write "
          "and differentiates") {
  // {data, context, model} with context of one rank (a model written for context parallelism run
  // without it): naming context, or not, places the same blocks.
  using M = ts::Mesh<"data", "context", "model">;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M mesh({sizes[0], 1, sizes[1]});
    const Eigen::Tensor<double, 3> g = iota_tensor<double, 3>({5, 7, 3}, 2);
    using WithContext = ts::Spec<ts::S<"data">, ts::S<"context">, ts::S<"model">>;
    using Without = ts::Spec<ts::S<"data">, ts::R, ts::S<"model">>;
    using Merged = ts::Spec<ts::S<"context", "data">, ts::R, ts::S<"model">>;
    using Inner = ts::Spec<ts::S<"data">, ts::R, ts::S<"model", "context">>;
    auto x = ts::distribute<WithContext>(mesh, g);
    ts::reset_comm_stats();
    auto y = ts::reshard<Without>(x);
    auto z = ts::reshard<Merged>(y);
    auto u = ts::reshard<Inner>(z);
    const auto calls = ts::comm_stats().total().calls;  // (before the checks' own collectives)
    TS_REQUIRE_ALL(std::as_const(y).data() == std::as_const(x).data());
    TS_REQUIRE_ALL(std::as_const(z).data() == std::as_const(x).data());
    TS_REQUIRE_ALL(std::as_const(u).data() == std::as_const(x).data());
    TS_REQUIRE_ALL(compare(y.gather(), g) == "" && compare(z.gather(), g) == "");
    TS_REQUIRE_ALL(calls == 0);
    // A write to one copies it first; the other keeps its values.
    if (y.local().size() > 0) y.local().data()[0] = -1;
    TS_REQUIRE_ALL(compare(x.gather(), g) == "" && compare(z.gather(), g) == "");
    // Where the data axis has ranks, the same move is a real one (and a new buffer).
    if (sizes[0] > 1) {
      auto w = ts::reshard<ts::Spec<ts::R, ts::S<"context">, ts::S<"model">>>(x);
      TS_REQUIRE_ALL(std::as_const(w).data() != std::as_const(x).data() && compare(w.gather(), g) == "");
    }
    // Under a gradient the shared reshard is recorded: d/dx sum(reshard(x)^2) = 2x.
    auto [value, dx] = ts::ad::value_and_grad([](const auto& v) { return ts::sum<0, 1, 2>(ts::square(ts::reshard<Merged>(v))); }, x);
    const Eigen::Tensor<double, 3> twice = 2.0 * g;
    TS_REQUIRE_ALL(compare(dx.gather(), twice, 1e-12) == "");
    (void)value;
    // A partial sum over context alone is already its total: resolving it, by reshard or inside an
    // operator, moves nothing.
    const Eigen::Tensor<double, 2> h = iota_tensor<double, 2>({5, 3}, 4);
    auto p = ts::from_local<ts::Spec<ts::R, ts::R>, ts::PartialSum<"context">>(mesh, {5, 3}, Eigen::Tensor<double, 2>(h));
    const auto q = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, h);
    ts::reset_comm_stats();
    auto r = ts::reshard<ts::Spec<ts::R, ts::R>>(p);
    auto sum = p + q;
    TS_REQUIRE_ALL(ts::comm_stats().total().calls == 0);
    TS_REQUIRE_ALL(std::as_const(r).data() == std::as_const(p).data());
    const Eigen::Tensor<double, 2> twice_h = 2.0 * h;
    TS_REQUIRE_ALL(compare(r.gather(), h) == "" && compare(sum.gather(), twice_h, 1e-12) == "");
  }
}

TEST_CASE("a typed partial sum resolves by reshard to R and by reshard to S") {
  using M = ts::Mesh<"data", "model">;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M mesh({sizes[0], sizes[1]});
    const int k = sizes[1];
    Eigen::Tensor<double, 2> mine(5, 3);
    for (Eigen::Index i = 0; i < mine.size(); ++i) mine.data()[i] = double(i + mesh.coord<"model">());
    auto p = ts::from_local<ts::Spec<ts::R, ts::R>, ts::PartialSum<"model">>(mesh, {5, 3}, std::move(mine));
    auto r = ts::reshard<ts::Spec<ts::R, ts::R>>(p);
    auto s = ts::reshard<ts::Spec<ts::S<"model">, ts::R>>(p);
    Eigen::Tensor<double, 2> want(5, 3);
    for (Eigen::Index i = 0; i < want.size(); ++i) want.data()[i] = double(k * i + k * (k - 1) / 2);
    TS_REQUIRE_ALL(compare(r.gather(), want) == "" && compare(s.gather(), want) == "");
    if (k > 1)
      TS_REQUIRE_ALL(ts::explain_reshard<ts::Spec<ts::S<"model">, ts::R>>(p).find("reduce-scatter") != std::string::npos);
  }
}

namespace {
// "" where what comm_stats() measured since the last reset is what was predicted (or, with
// uneven shards, at most that), else both.
std::string traffic_matches(const ts::Traffic& want, bool even) {
  const auto got = ts::comm_stats().total();
  const bool ok = even ? got.bytes_sent == want.bytes_sent && got.bytes_received == want.bytes_received
                       : got.bytes_sent <= want.bytes_sent && got.bytes_received <= want.bytes_received;
  if (ok) return "";
  return "measured " + std::to_string(got.bytes_sent) + " sent, " + std::to_string(got.bytes_received) + " received; predicted " +
         std::to_string(want.bytes_sent) + ", " + std::to_string(want.bytes_received);
}
}  // namespace

TEST_CASE("the cost model predicts the bytes comm_stats measures for every reshard kind and einsum strategy") {
  using M = ts::Mesh<"x", "y">;
  using R2 = ts::Spec<ts::R, ts::R>;
  using X0 = ts::Spec<ts::S<"x">, ts::R>;
  using X1 = ts::Spec<ts::R, ts::S<"x">>;
  using XY = ts::Spec<ts::S<"x">, ts::S<"y">>;
  using XY0 = ts::Spec<ts::S<"x", "y">, ts::R>;
  using YX0 = ts::Spec<ts::S<"y", "x">, ts::R>;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M mesh({sizes[0], sizes[1]});
    // 2p divides by every axis and pair of axes of a p-rank mesh (every block even); 7 x 5
    // leaves uneven blocks.
    for (const bool even : {true, false}) {
      const Eigen::Index n0 = even ? 2 * world_size() : 7, n1 = even ? 2 * world_size() : 5;
      const Eigen::Tensor<double, 2> v = values(n0, n1, 3);
      auto check = [&](const char* what, const ts::Traffic& want, auto&& run) {
        ts::reset_comm_stats();
        run();
        INFO("mesh " << sizes[0] << "x" << sizes[1] << ", " << n0 << " x " << n1 << ": " << what);
        TS_REQUIRE_ALL(traffic_matches(want, even) == "");
      };
      const auto x0 = ts::distribute<X0>(mesh, v);
      const auto r2 = ts::distribute<R2>(mesh, v);
      const auto xy0 = ts::distribute<XY0>(mesh, v);
      check("all-gather", ts::predict_reshard<R2>(x0), [&] { (void)ts::reshard<R2>(x0); });
      check("all-to-all", ts::predict_reshard<X1>(x0), [&] { (void)ts::reshard<X1>(x0); });
      check("local slice", ts::predict_reshard<XY>(r2), [&] { (void)ts::reshard<XY>(r2); });
      check("direct", ts::predict_reshard<YX0>(xy0), [&] { (void)ts::reshard<YX0>(xy0); });
      Eigen::Tensor<double, 2> mine = v;
      auto partial = ts::from_local<R2, ts::PartialSum<"x">>(mesh, {n0, n1}, std::move(mine));
      check("reduce-scatter", ts::predict_reshard<X0>(partial), [&] { (void)ts::reshard<X0>(partial); });
      check("all-reduce", ts::predict_reshard<R2>(partial), [&] { (void)ts::reshard<R2>(partial); });
      // Einsums whose operands both split a free dim by x, in every strategy; and one whose
      // contracted dim is split (a partial product, nothing moved).
      const auto b = ts::distribute<X1>(mesh, values(n1, n0, 4));
      for (auto st : {ts::EinsumStrategy::Auto, ts::EinsumStrategy::GatherRight, ts::EinsumStrategy::GatherLeft,
                      ts::EinsumStrategy::Windowed})
        check("einsum ij,jk->ik", ts::predict_einsum<"ij,jk->ik">(x0, b, st),
              [&] { (void)ts::einsum<"ij,jk->ik">(x0, b, st); });
      const auto bx = ts::distribute<X0>(mesh, values(n1, n0, 4));
      const auto ax = ts::distribute<X1>(mesh, v);
      check("einsum with a split contraction", ts::predict_einsum<"ij,jk->ik">(ax, bx), [&] { (void)ts::einsum<"ij,jk->ik">(ax, bx); });
    }
  }
}

TEST_CASE("repeated reshards reuse pooled buffers: no fresh allocation after the first round") {
  ts::Mesh<"x"> mesh({-1});
  auto x = ts::random<double, ts::Spec<ts::S<"x">, ts::R>>(mesh, {301, 17}, 1);
  for (int i = 0; i < 2; ++i) {
    auto r = ts::reshard<ts::Spec<ts::R, ts::S<"x">>>(x);
    auto g = ts::reshard<ts::Spec<ts::R, ts::R>>(r);
  }
  const auto before = ts::pool_stats();
  for (int i = 0; i < 50; ++i) {
    auto r = ts::reshard<ts::Spec<ts::R, ts::S<"x">>>(x);
    auto g = ts::reshard<ts::Spec<ts::R, ts::R>>(r);
  }
  const auto after = ts::pool_stats();
  INFO("fresh allocations " << before.fresh_allocations << " -> " << after.fresh_allocations);
  TS_REQUIRE_ALL(after.fresh_allocations == before.fresh_allocations);
}
