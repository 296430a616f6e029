// Making sharded tensors and getting their global value back, on every mesh shape that fits.
#include <boost/mpi/communicator.hpp>

#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;
using M2 = ts::Mesh<"x", "y">;

TEMPLATE_TEST_CASE("distribute then gather returns the global tensor bit for bit, for every element type", "",
                   float, double, std::complex<float>, std::complex<double>, std::int32_t, std::int64_t) {
  using T = TestType;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto shape : std::vector<std::array<Eigen::Index, 2>>{{7, 5}, {1, 13}, {2, 3}, {0, 4}, {6, 0}}) {
      INFO("mesh " << sizes[0] << "x" << sizes[1] << ", shape [" << shape[0] << ", " << shape[1] << "]");
      Eigen::Tensor<T, 2> g = iota_tensor<T, 2>(shape);
      auto a = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
      auto b = ts::distribute<ts::Spec<ts::S<"y", "x">, ts::R>>(mesh, g);
      auto c = ts::distribute<ts::Spec<ts::R, ts::R>>(mesh, g);
      TS_REQUIRE_ALL(compare(a.gather(), g) == "");
      TS_REQUIRE_ALL(compare(b.gather(), g) == "");
      TS_REQUIRE_ALL(compare(c.gather(), g) == "");
    }
  }
}

TEST_CASE("local shape, offset and padded shape follow the shard rule on every rank") {
  const int p = world_size();
  M2 mesh({1, p});
  auto t = ts::zeros<float, ts::Spec<ts::R, ts::S<"y">>>(mesh, {3, 10});
  const Eigen::Index b = (10 + p - 1) / p, c = mesh.coord<"y">();
  TS_REQUIRE_ALL(t.padded_shape()[1] == b && t.padded_shape()[0] == 3);
  TS_REQUIRE_ALL(t.local_offset()[1] == std::min<Eigen::Index>(c * b, 10));
  TS_REQUIRE_ALL(t.local_shape()[1] == std::clamp<Eigen::Index>(10 - c * b, 0, b));
  TS_REQUIRE_ALL(t.local().dimension(1) == b);
  TS_REQUIRE_ALL(t.global_shape() == (std::array<Eigen::Index, 2>{3, 10}));
}

TEST_CASE("from_function calls its function on valid elements only, with global indices") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    long calls = 0;
    auto t = ts::from_function<double, ts::Spec<ts::S<"x", "y">, ts::R>>(mesh, {5, 3}, [&](auto i) {
      ++calls;
      return double(10 * i[0] + i[1]);
    });
    TS_REQUIRE_ALL(calls == t.local_shape()[0] * t.local_shape()[1]);
    Eigen::Tensor<double, 2> g = t.gather();
    bool ok = true;
    for (int i = 0; i < 5; ++i)
      for (int j = 0; j < 3; ++j) ok &= g(i, j) == 10 * i + j;
    TS_REQUIRE_ALL(ok);
  }
}

TEST_CASE("random values depend only on seed and global index, not on mesh or spec") {
  ts::Mesh<"x"> line({-1});
  auto a = ts::random<double, ts::Spec<ts::S<"x">, ts::R, ts::R>>(line, {4, 7, 3}, 42);
  auto b = ts::random<double, ts::Spec<ts::R, ts::R, ts::S<"x">>>(line, {4, 7, 3}, 42);
  auto c = ts::random<double, ts::Spec<ts::R, ts::R, ts::S<"x">>>(line, {4, 7, 3}, 43);
  Eigen::Tensor<double, 3> ga = a.gather(), gb = b.gather(), gc = c.gather();
  TS_REQUIRE_ALL(compare(ga, gb) == "");
  TS_REQUIRE_ALL(compare(ga, gc) != "");
  bool in_range = true;
  for (Eigen::Index i = 0; i < ga.size(); ++i) in_range &= ga.data()[i] >= 0 && ga.data()[i] < 1;
  TS_REQUIRE_ALL(in_range);
  // The documented generator, evaluated serially.
  TS_REQUIRE_ALL(ga(1, 2, 0) == ts::detail::random_value<double>(42, 1 + 4 * 2));
  auto ints = ts::random<std::int32_t, ts::Spec<ts::S<"x">>>(line, {100}, 7).gather();
  bool int_range = true;
  for (int i = 0; i < 100; ++i) int_range &= ints(i) >= -1000 && ints(i) <= 1000;
  TS_REQUIRE_ALL(int_range);
}

TEST_CASE("scatter from a root gives the same shards as distribute") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    const int root = mesh.size() - 1;
    Eigen::Tensor<float, 2> g = iota_tensor<float, 2>({9, 4});
    Eigen::Tensor<float, 2> on_root = mesh.rank() == root ? g : Eigen::Tensor<float, 2>(0, 0);
    auto s = ts::scatter<ts::Spec<ts::S<"y">, ts::S<"x">>>(mesh, on_root, root);
    TS_REQUIRE_ALL(compare(s.gather(), g) == "");
    TS_REQUIRE_ALL(s.global_shape() == (std::array<Eigen::Index, 2>{9, 4}));
  }
}

TEST_CASE("gather to a root fills the root only; gather_into reuses the caller's tensor") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    Eigen::Tensor<double, 2> g = iota_tensor<double, 2>({5, 7});
    auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
    for (int root = 0; root < mesh.size(); root += std::max(1, mesh.size() - 1)) {
      Eigen::Tensor<double, 2> r = t.gather(root);
      TS_REQUIRE_ALL(mesh.rank() == root ? compare(r, g) == "" : r.size() == 0);
    }
    Eigen::Tensor<double, 2> into(5, 7);
    const double* before = into.data();
    t.gather_into(into);
    TS_REQUIRE_ALL(into.data() == before && compare(into, g) == "");
  }
}

TEST_CASE("from_local wraps existing shards without copying, padded or valid-sized") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    using X = ts::Spec<ts::S<"x">, ts::S<"y">>;
    Eigen::Tensor<double, 2> g = iota_tensor<double, 2>({7, 5});
    auto ref = ts::distribute<X>(mesh, g);
    // Zero-copy over a raw buffer of the padded local shape.
    auto padded = ts::padded_local_shape<X>(mesh, {7, 5});
    std::vector<double> buf(static_cast<std::size_t>(padded[0] * padded[1]));
    std::copy(ref.data(), ref.data() + ref.padded_size(), buf.begin());
    auto w = ts::from_local<X>(mesh, {7, 5}, buf.data());
    TS_REQUIRE_ALL(w.data() == buf.data());
    TS_REQUIRE_ALL(compare(w.gather(), g) == "");
    // Owning, from an Eigen tensor of the valid local shape.
    auto vs = ref.local_shape();
    Eigen::Tensor<double, 2> mine(vs[0], vs[1]);
    for (Eigen::Index i = 0; i < vs[0]; ++i)
      for (Eigen::Index j = 0; j < vs[1]; ++j) mine(i, j) = g(ref.local_offset()[0] + i, ref.local_offset()[1] + j);
    auto o = ts::from_local<X>(mesh, {7, 5}, std::move(mine));
    TS_REQUIRE_ALL(compare(o.gather(), g) == "");
  }
}

TEST_CASE("from_local with the buffer's size checks it: too small on one rank is a ShapeError on every rank") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    using X = ts::Spec<ts::S<"x">, ts::R>;
    Eigen::Tensor<double, 2> g = iota_tensor<double, 2>({7, 5});
    auto ref = ts::distribute<X>(mesh, g);
    auto padded = ts::padded_local_shape<X>(mesh, {7, 5});
    std::vector<double> buf(static_cast<std::size_t>(padded[0] * padded[1]));
    std::copy(ref.data(), ref.data() + ref.padded_size(), buf.begin());
    auto w = ts::from_local<X>(mesh, {7, 5}, std::span(buf));
    TS_REQUIRE_ALL(w.data() == buf.data() && compare(w.gather(), g) == "");
    auto p = ts::from_local<X>(mesh, {7, 5}, buf.data(), buf.size());
    TS_REQUIRE_ALL(compare(p.gather(), g) == "");
    // One element short on the last rank only: every rank throws, none reads past the end.
    const bool last = mesh.rank() == mesh.size() - 1;
    std::string what;
    try {
      (void)ts::from_local<X>(mesh, {7, 5}, buf.data(), buf.size() - (last ? 1 : 0));
    } catch (const ts::ShapeError& e) {
      what = e.what();
    }
    TS_REQUIRE_ALL(!what.empty());
    TS_REQUIRE_ALL(!last || what.find("needs " + std::to_string(buf.size())) != std::string::npos);
  }
}

TEST_CASE("from_local with a partial marker builds a partial sum resolved by gather") {
  const int p = world_size();
  M2 mesh({1, p});
  using P = ts::PartialSum<"y">;
  Eigen::Tensor<std::int64_t, 2> mine(3, 4);
  for (Eigen::Index i = 0; i < mine.size(); ++i) mine.data()[i] = i * (mesh.coord<"y">() + 1);
  auto t = ts::from_local<ts::Spec<ts::R, ts::R>, P>(mesh, {3, 4}, std::move(mine));
  static_assert(decltype(t)::is_partial);
  Eigen::Tensor<std::int64_t, 2> g = t.gather();
  bool ok = true;
  for (Eigen::Index i = 0; i < g.size(); ++i) ok &= g.data()[i] == i * p * (p + 1) / 2;
  TS_REQUIRE_ALL(ok);
}

TEST_CASE("copies are deep and moves keep the storage") {
  ts::Mesh<"x"> mesh({-1});
  auto a = ts::from_function<float, ts::Spec<ts::S<"x">>>(mesh, {9}, [](auto i) { return float(i[0]); });
  auto b = a;
  TS_REQUIRE_ALL(b.data() != a.data() || a.padded_size() == 0);
  if (b.padded_size()) b.data()[0] = -1;
  TS_REQUIRE_ALL(a.padded_size() == 0 || a.data()[0] != -1);
  const float* storage = a.data();
  auto c = std::move(a);
  TS_REQUIRE_ALL(c.data() == storage);
}

TEST_CASE("a global tensor whose shape differs between ranks is a ShapeError on every rank") {
  ts::Mesh<"x"> mesh({-1});
  Eigen::Tensor<float, 2> g(4, 3 + (world_rank() == 0 && world_size() > 1 ? 1 : 0));
  g.setZero();
  bool threw = false;
  std::string what;
  try {
    auto t = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, g);
  } catch (const ts::ShapeError& e) {
    threw = true;
    what = e.what();
  }
  TS_REQUIRE_ALL(threw == (world_size() > 1));
  if (world_size() > 1) TS_REQUIRE_ALL(what.find("tshard::distribute") != std::string::npos && what.find("{x, R}") != std::string::npos);
}

TEST_CASE("a local block of the wrong size on one rank is a ShapeError on every rank") {
  ts::Mesh<"x"> mesh({-1});
  auto padded = ts::padded_local_shape<ts::Spec<ts::S<"x">>>(mesh, {10});
  Eigen::Tensor<double, 1> mine(padded[0] + (world_rank() == 0 ? 5 : 0));
  mine.setZero();
  bool threw = false;
  try {
    auto t = ts::from_local<ts::Spec<ts::S<"x">>>(mesh, {10}, std::move(mine));
  } catch (const ts::ShapeError&) {
    threw = true;
  }
  TS_REQUIRE_ALL(threw);
}

TEST_CASE("tensors of two different meshes never mix") {
  ts::Mesh<"x"> m1({-1}), m2({-1});
  auto a = ts::zeros<float, ts::Spec<ts::S<"x">>>(m1, {6});
  auto b = ts::zeros<float, ts::Spec<ts::R>>(m2, {6});
  bool threw = false;
  try {
    ts::reshard_into(b, a);
  } catch (const ts::MeshError& e) {
    threw = std::string(e.what()).find("different meshes") != std::string::npos;
  }
  TS_REQUIRE_ALL(threw);
  // Two meshes that describe alike: the error says why they still differ.
  std::string text;
  try {
    (void)(a + ts::zeros<float, ts::Spec<ts::S<"x">>>(m2, {6}));
  } catch (const ts::MeshError& e) {
    text = e.what();
  }
  TS_REQUIRE_ALL(text.find("two Mesh objects constructed separately are two meshes") != std::string::npos);
}

TEST_CASE("negative extents are a ShapeError on every rank") {
  ts::Mesh<"x"> mesh({-1});
  bool threw = false;
  try {
    auto t = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {4, -1});
  } catch (const ts::ShapeError&) {
    threw = true;
  }
  TS_REQUIRE_ALL(threw);
}

TEST_CASE("visualize shows which ranks hold which block") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    auto t = ts::zeros<float, ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, {7, 5});
    std::ostringstream os;
    std::string pic = ts::visualize(t, os);
    TS_REQUIRE_ALL(pic.find("{x, y}") != std::string::npos);
    TS_REQUIRE_ALL(pic.find("ranks " + std::to_string(mesh.size() - 1)) != std::string::npos);
    TS_REQUIRE_ALL((mesh.rank() == 0) == !os.str().empty());
    auto r = ts::zeros<float, ts::Spec<ts::R>>(mesh, {4});
    std::string line = ts::visualize(r, os);
    std::string all = "ranks 0";
    for (int i = 1; i < mesh.size(); ++i) all += "," + std::to_string(i);
    TS_REQUIRE_ALL(line.find(all) != std::string::npos);
  }
}

TEST_CASE("visualize_svg draws each block to scale with its ranks, and lists empty blocks") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    auto t = ts::zeros<float, ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, {7, 2});
    const std::string svg = ts::visualize_svg(t);
    TS_REQUIRE_ALL(svg.rfind("<svg xmlns=\"http://www.w3.org/2000/svg\"", 0) == 0);
    TS_REQUIRE_ALL(svg.find("</svg>") != std::string::npos);
    // Every rank appears, in a block or among the empty ones (2 columns over y > 2 leaves some).
    for (int r = 0; r < mesh.size(); ++r) TS_REQUIRE_ALL(svg.find("ranks " + std::to_string(r)) != std::string::npos);
    std::size_t rects = 0;
    for (std::size_t at = svg.find("<rect"); at != std::string::npos; at = svg.find("<rect", at + 1)) ++rects;
    // Shards of ceil(n / k) elements: ceil(n / ceil(n / k)) of them are not empty.
    auto filled = [](int n, int k) { return (n + (n + k - 1) / k - 1) / ((n + k - 1) / k); };
    const int blocks = filled(7, sizes[0]) * filled(2, sizes[1]);
    TS_REQUIRE_ALL(rects == std::size_t(blocks));
    TS_REQUIRE_ALL((svg.find("empty blocks") != std::string::npos) == (blocks < sizes[0] * sizes[1]));
  }
}

TEST_CASE("complex partial sums resolve exactly like real ones") {
  const int p = world_size();
  M2 mesh({p, 1});
  using C = std::complex<double>;
  Eigen::Tensor<C, 1> mine(4);
  for (int i = 0; i < 4; ++i) mine(i) = C(i, mesh.coord<"x">());
  auto t = ts::from_local<ts::Spec<ts::R>, ts::PartialSum<"x">>(mesh, {4}, std::move(mine));
  auto s = ts::reshard<ts::Spec<ts::S<"x">>>(t);
  Eigen::Tensor<C, 1> g = s.gather();
  bool ok = true;
  for (int i = 0; i < 4; ++i) ok &= g(i) == C(double(i) * p, p * (p - 1) / 2.0);
  TS_REQUIRE_ALL(ok);
}

TEST_CASE("a mesh accepts a Boost.MPI communicator") {
  boost::mpi::communicator world;
  ts::Mesh<"x"> mesh(world, {-1});
  TS_REQUIRE_ALL(mesh.size<"x">() == world.size() && mesh.rank() == world.rank());
}
