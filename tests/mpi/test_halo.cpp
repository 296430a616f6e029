// Windowed operators: halo exchange, convolution, stencils. Every result is checked
// against a serial computation on the gathered global tensor, on every mesh shape of the world.
#include <complex>
#include <sstream>
#include <type_traits>

#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;
using M3 = ts::Mesh<"x", "y", "z">;

namespace {

template <std::size_t R>
std::string shape_str(const std::array<Eigen::Index, R>& s) {
  std::ostringstream o;
  o << "[";
  for (std::size_t d = 0; d < R; ++d) o << (d ? ", " : "") << s[d];
  o << "]";
  return o.str();
}
template <std::size_t R>
std::string widths_str(const std::array<ts::Halo, R>& w) {
  std::ostringstream o;
  o << "[";
  for (std::size_t d = 0; d < R; ++d) o << (d ? ", " : "") << "(" << w[d].before << "," << w[d].after << ")";
  o << "]";
  return o.str();
}
const char* boundary_str(ts::Boundary b) { return b == ts::Boundary::Zero ? "Zero" : "Periodic"; }

// The global element that element i of an extended block shows, or -1 where it is zero.
inline Eigen::Index source_index(Eigen::Index g, Eigen::Index n, ts::Boundary b) {
  if (g >= 0 && g < n) return g;
  if (b == ts::Boundary::Zero) return -1;
  return ((g % n) + n) % n;
}

// The serial reference of with_halo: the valid block at `offset` of extents `valid` widened
// by `w`, read from the global tensor g; an empty block where the shard is empty.
template <class T, int R>
Eigen::Tensor<T, R> halo_reference(const Eigen::Tensor<T, R>& g, const std::array<Eigen::Index, R>& offset,
                                   const std::array<Eigen::Index, R>& valid, const std::array<ts::Halo, R>& w,
                                   ts::Boundary b) {
  bool empty = false;
  for (int d = 0; d < R; ++d) empty |= valid[d] == 0;
  std::array<Eigen::Index, R> ext{};
  if (!empty)
    for (int d = 0; d < R; ++d) ext[d] = valid[d] + w[d].before + w[d].after;
  Eigen::Tensor<T, R> out(ext);
  std::array<Eigen::Index, R> i{};
  for (Eigen::Index n = 0; n < out.size(); ++n) {
    std::array<Eigen::Index, R> src{};
    bool zero = false;
    for (int d = 0; d < R; ++d) {
      src[d] = source_index(offset[d] + i[d] - w[d].before, g.dimension(d), b);
      zero |= src[d] < 0;
    }
    out.data()[n] = zero ? T(0) : g(src);
    for (int d = 0; d < R; ++d) {
      if (++i[d] < ext[d]) break;
      i[d] = 0;
    }
  }
  return out;
}

// with_halo of a distributed iota tensor against the reference; "" or the first mismatch.
template <class SpecT, class M, int R>
std::string check_with_halo(const M& mesh, const std::array<Eigen::Index, R>& shape,
                            const std::array<ts::Halo, R>& w, ts::Boundary b) {
  Eigen::Tensor<double, R> g = iota_tensor<double, R>(shape);
  auto x = ts::distribute<SpecT>(mesh, g);
  ts::Halo widths[R];
  for (int d = 0; d < R; ++d) widths[d] = w[d];
  Eigen::Tensor<double, R> got = ts::with_halo(x, widths, b);
  std::string diff = compare(got, halo_reference<double, R>(g, x.local_offset(), x.local_shape(), w, b));
  if (diff.empty()) return "";
  return "shape " + shape_str(shape) + " spec " + x.describe() + " widths " + widths_str(w) + " boundary " +
         boundary_str(b) + " on mesh " + mesh.shape().describe() + ": " + diff;
}

template <int R>
std::vector<std::array<ts::Halo, R>> symmetric_widths(const std::vector<Eigen::Index>& values) {
  std::vector<std::array<ts::Halo, R>> out;
  std::array<std::size_t, R> pick{};
  for (;;) {
    std::array<ts::Halo, R> w{};
    for (int d = 0; d < R; ++d) w[d] = ts::Halo{values[pick[d]], values[pick[d]]};
    out.push_back(w);
    int d = 0;
    for (; d < R; ++d) {
      if (++pick[d] < values.size()) break;
      pick[d] = 0;
    }
    if (d == R) return out;
  }
}

// Serial "same" correlation, summed over the kernel in column-major order.
template <class T, int R>
Eigen::Tensor<T, R> convolve_reference(const Eigen::Tensor<T, R>& g, const Eigen::Tensor<T, R>& k, ts::Boundary b) {
  Eigen::Tensor<T, R> out(g.dimensions());
  std::array<Eigen::Index, R> i{};
  for (Eigen::Index n = 0; n < g.size(); ++n) {
    T s(0);
    std::array<Eigen::Index, R> j{};
    for (Eigen::Index m = 0; m < k.size(); ++m) {
      std::array<Eigen::Index, R> src{};
      bool zero = false;
      for (int d = 0; d < R; ++d) {
        src[d] = source_index(i[d] + j[d] - k.dimension(d) / 2, g.dimension(d), b);
        zero |= src[d] < 0;
      }
      if (!zero && k(j) != T(0)) s += k(j) * g(src);  // (a zero tap reads nothing)
      for (int d = 0; d < R; ++d) {
        if (++j[d] < k.dimension(d)) break;
        j[d] = 0;
      }
    }
    out.data()[n] = s;
    for (int d = 0; d < R; ++d) {
      if (++i[d] < g.dimension(d)) break;
      i[d] = 0;
    }
  }
  return out;
}

// Direct loops of a stride-1 NCHW convolution with zero padding (ph, pw).
template <class T>
Eigen::Tensor<T, 4> conv2d_reference(const Eigen::Tensor<T, 4>& x, const Eigen::Tensor<T, 4>& w, Eigen::Index ph,
                                     Eigen::Index pw) {
  const Eigen::Index N = x.dimension(0), C = x.dimension(1), H = x.dimension(2), W = x.dimension(3);
  const Eigen::Index O = w.dimension(0), kh = w.dimension(2), kw = w.dimension(3);
  const Eigen::Index Ho = H + 2 * ph - kh + 1, Wo = W + 2 * pw - kw + 1;
  Eigen::Tensor<T, 4> out(N, O, Ho, Wo);
  for (Eigen::Index n = 0; n < N; ++n)
    for (Eigen::Index o = 0; o < O; ++o)
      for (Eigen::Index i = 0; i < Ho; ++i)
        for (Eigen::Index j = 0; j < Wo; ++j) {
          T s(0);
          for (Eigen::Index c = 0; c < C; ++c)
            for (Eigen::Index a = 0; a < kh; ++a)
              for (Eigen::Index b = 0; b < kw; ++b) {
                const Eigen::Index r = i + a - ph, q = j + b - pw;
                if (r >= 0 && r < H && q >= 0 && q < W) s += w(o, c, a, b) * x(n, c, r, q);
              }
          out(n, o, i, j) = s;
        }
  return out;
}

template <class T, int R>
Eigen::Tensor<T, R> small_values(const std::array<Eigen::Index, R>& shape, int seed) {
  Eigen::Tensor<T, R> t(shape);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(-4, 4);
  for (Eigen::Index i = 0; i < t.size(); ++i) t.data()[i] = T(dist(gen));
  return t;
}

template <class T>
T five_point(const ts::StencilView<T, 2>& v) {
  return T(4) * v(0, 0) - v(-1, 0) - v(1, 0) - v(0, -1) - v(0, 1);
}

template <class T>
Eigen::Tensor<T, 2> five_point_reference(const Eigen::Tensor<T, 2>& g, ts::Boundary b) {
  Eigen::Tensor<T, 2> out(g.dimensions());
  auto at = [&](Eigen::Index i, Eigen::Index j) {
    const Eigen::Index si = source_index(i, g.dimension(0), b), sj = source_index(j, g.dimension(1), b);
    return si < 0 || sj < 0 ? T(0) : g(si, sj);
  };
  for (Eigen::Index j = 0; j < g.dimension(1); ++j)
    for (Eigen::Index i = 0; i < g.dimension(0); ++i)
      out(i, j) = T(4) * at(i, j) - at(i - 1, j) - at(i + 1, j) - at(i, j - 1) - at(i, j + 1);
  return out;
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ts::ShapeError& e) {
    return std::string("ShapeError: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("with_halo of a 1-D tensor equals the serial reference for widths 0..3, wider than a shard and wider "
          "than the tensor, both boundaries, on every mesh shape",
          "[halo]") {
  std::string fail;
  const auto widths = symmetric_widths<1>({0, 1, 2, 3, 5, 9, 14});
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (Eigen::Index n : {1, 2, 7, 13})
      for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
        for (auto& w : widths) {
          for (auto* r : {&check_with_halo<ts::Spec<ts::S<"x">>, M2, 1>, &check_with_halo<ts::Spec<ts::S<"y">>, M2, 1>,
                          &check_with_halo<ts::Spec<ts::S<"x", "y">>, M2, 1>,
                          &check_with_halo<ts::Spec<ts::S<"y", "x">>, M2, 1>, &check_with_halo<ts::Spec<ts::R>, M2, 1>}) {
            std::string e = r(mesh, {n}, w, b);
            if (fail.empty()) fail = e;
          }
        }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

TEST_CASE("with_halo of a 2-D tensor equals the serial reference on uneven grids, with corners, multi-axis splits and "
          "dims smaller than the axis size",
          "[halo]") {
  std::string fail;
  const auto widths = symmetric_widths<2>({0, 1, 2, 3, 6});
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto shape : std::vector<std::array<Eigen::Index, 2>>{{7, 5}, {2, 3}, {1, 13}, {0, 4}})
      for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
        for (auto& w : widths)
          for (auto* r : {&check_with_halo<ts::Spec<ts::S<"x">, ts::S<"y">>, M2, 2>,
                          &check_with_halo<ts::Spec<ts::S<"y">, ts::S<"x">>, M2, 2>,
                          &check_with_halo<ts::Spec<ts::S<"x", "y">, ts::R>, M2, 2>,
                          &check_with_halo<ts::Spec<ts::R, ts::S<"y", "x">>, M2, 2>,
                          &check_with_halo<ts::Spec<ts::R, ts::S<"x">>, M2, 2>}) {
            std::string e = r(mesh, shape, w, b);
            if (fail.empty()) fail = e;
          }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

TEST_CASE("with_halo of a 3-D tensor on a 3-axis mesh equals the serial reference", "[halo]") {
  std::string fail;
  const auto widths = symmetric_widths<3>({0, 1, 3});
  for (auto sizes : mesh_shapes(world_size(), 3)) {
    M3 mesh({sizes[0], sizes[1], sizes[2]});
    for (auto shape : std::vector<std::array<Eigen::Index, 3>>{{4, 3, 5}, {1, 2, 7}})
      for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
        for (auto& w : widths)
          for (auto* r : {&check_with_halo<ts::Spec<ts::S<"x">, ts::S<"y">, ts::S<"z">>, M3, 3>,
                          &check_with_halo<ts::Spec<ts::S<"z", "x">, ts::R, ts::S<"y">>, M3, 3>,
                          &check_with_halo<ts::Spec<ts::R, ts::S<"y", "z", "x">, ts::R>, M3, 3>}) {
            std::string e = r(mesh, shape, w, b);
            if (fail.empty()) fail = e;
          }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

TEST_CASE("with_halo takes asymmetric widths Halo{before, after} per dim", "[halo]") {
  std::string fail;
  const std::vector<std::array<ts::Halo, 2>> widths{
      {ts::Halo{0, 2}, ts::Halo{1, 0}}, {ts::Halo{3, 1}, ts::Halo{0, 0}}, {ts::Halo{0, 7}, ts::Halo{5, 2}},
      {ts::Halo{2, 0}, ts::Halo{0, 3}}};
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto shape : std::vector<std::array<Eigen::Index, 2>>{{7, 5}, {3, 2}})
      for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
        for (auto& w : widths)
          for (auto* r : {&check_with_halo<ts::Spec<ts::S<"x">, ts::S<"y">>, M2, 2>,
                          &check_with_halo<ts::Spec<ts::S<"y", "x">, ts::R>, M2, 2>}) {
            std::string e = r(mesh, shape, w, b);
            if (fail.empty()) fail = e;
          }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

// with_halo_transpose is with_halo's adjoint: for x and, on every rank, any block e of the
// extended shape, the sum over ranks of <with_halo(x), e> equals the sum over ranks of
// <x's block, with_halo_transpose(e)'s block>. Checked with random x and e.
template <class S, class M, int R>
std::string check_with_halo_transpose(M& mesh, const std::array<Eigen::Index, R>& shape, const std::array<ts::Halo, R>& w,
                                      ts::Boundary b) {
  Eigen::Index dims[R];
  std::copy(shape.begin(), shape.end(), dims);
  const auto x = ts::random<double, S>(mesh, dims, 17);
  ts::Halo widths[R];
  std::copy(w.begin(), w.end(), widths);
  const Eigen::Tensor<double, R> ext = ts::with_halo(x, widths, b);
  Eigen::Tensor<double, R> e(ext.dimensions());
  for (Eigen::Index i = 0; i < e.size(); ++i) e.data()[i] = std::sin(1.7 * double(i) + 0.3 * double(mesh.rank()) + 0.1);
  const auto y = ts::with_halo_transpose(x, e, widths, b);
  double sums[2] = {0, 0}, all[2];
  for (Eigen::Index i = 0; i < e.size(); ++i) sums[0] += ext.data()[i] * e.data()[i];
  const Eigen::Tensor<double, R> xl = x.local_valid(), yl = y.local_valid();
  for (Eigen::Index i = 0; i < xl.size(); ++i) sums[1] += xl.data()[i] * yl.data()[i];
  MPI_Allreduce(sums, all, 2, MPI_DOUBLE, MPI_SUM, mesh.comm());
  if (std::abs(all[0] - all[1]) <= 1e-12 * (1 + std::abs(all[0]))) return "";
  std::ostringstream o;
  o << "mesh " << mesh.shape().describe() << " spec " << x.describe() << " widths " << widths_str<R>(w)
    << (b == ts::Boundary::Zero ? " Zero" : " Periodic") << ": <with_halo(x), e> = " << all[0]
    << ", <x, with_halo_transpose(e)> = " << all[1];
  return o.str();
}

TEST_CASE("with_halo_transpose is with_halo's adjoint: halos wider than a shard, empty shards, both boundaries",
          "[halo]") {
  std::string fail;
  const std::vector<std::array<ts::Halo, 2>> widths{{ts::Halo{1, 1}, ts::Halo{1, 1}}, {ts::Halo{0, 2}, ts::Halo{3, 0}},
                                                    {ts::Halo{4, 5}, ts::Halo{2, 6}}, {ts::Halo{0, 0}, ts::Halo{1, 0}}};
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto shape : std::vector<std::array<Eigen::Index, 2>>{{7, 5}, {2, 3}, {1, 9}})
      for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
        for (auto& w : widths)
          for (auto* r : {&check_with_halo_transpose<ts::Spec<ts::S<"x">, ts::S<"y">>, M2, 2>,
                          &check_with_halo_transpose<ts::Spec<ts::S<"y", "x">, ts::R>, M2, 2>,
                          &check_with_halo_transpose<ts::Spec<ts::R, ts::S<"x">>, M2, 2>,
                          &check_with_halo_transpose<ts::Spec<ts::R, ts::R>, M2, 2>}) {
            std::string e = r(mesh, shape, w, b);
            if (fail.empty()) fail = e;
          }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

TEST_CASE("with_halo with a braced list of widths, every element type, and an empty block on an empty shard", "[halo]") {
  const int p = world_size();
  M2 mesh({p, 1});
  // 2 rows over p ranks: ranks 2.. hold nothing.
  Eigen::Tensor<std::complex<float>, 2> g = iota_tensor<std::complex<float>, 2>({2, 3}, 1);
  auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, g);
  Eigen::Tensor<std::complex<float>, 2> got = ts::with_halo(x, {1, 1}, ts::Boundary::Periodic);
  const std::array<ts::Halo, 2> w{ts::Halo{1, 1}, ts::Halo{1, 1}};
  TS_REQUIRE_ALL(compare(got, halo_reference<std::complex<float>, 2>(g, x.local_offset(), x.local_shape(), w,
                                                                      ts::Boundary::Periodic)) == "");
  TS_REQUIRE_ALL(mesh.rank() < 2 || got.size() == 0);
  Eigen::Tensor<std::int64_t, 2> gi = iota_tensor<std::int64_t, 2>({5, 4});
  auto xi = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, gi);
  Eigen::Tensor<std::int64_t, 2> goti = ts::with_halo(xi, {2, 0}, ts::Boundary::Zero);
  const std::array<ts::Halo, 2> wi{ts::Halo{2, 2}, ts::Halo{0, 0}};
  TS_REQUIRE_ALL(compare(goti, halo_reference<std::int64_t, 2>(gi, xi.local_offset(), xi.local_shape(), wi,
                                                               ts::Boundary::Zero)) == "");
}

TEST_CASE("with_halo resolves a partial sum first", "[halo]") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    // Each rank holds its rank number times the iota values: the sum over y is known.
    using Sp = ts::Spec<ts::S<"x">, ts::R>;
    Eigen::Tensor<double, 2> g = iota_tensor<double, 2>({7, 5});
    auto plain = ts::distribute<Sp>(mesh, g);
    Eigen::Tensor<double, 2> local(plain.padded_shape());
    local = plain.local() * double(mesh.coord<"y">() + 1);
    auto partial = ts::from_local<Sp, ts::PartialSum<"y">>(mesh, {7, 5}, std::move(local));
    const int ny = mesh.size<"y">();
    Eigen::Tensor<double, 2> want_global = g * double(ny * (ny + 1) / 2);
    Eigen::Tensor<double, 2> got = ts::with_halo(partial, {2, 1}, ts::Boundary::Zero);
    const std::array<ts::Halo, 2> w{ts::Halo{2, 2}, ts::Halo{1, 1}};
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    TS_REQUIRE_ALL(compare(got, halo_reference<double, 2>(want_global, plain.local_offset(), plain.local_shape(), w,
                                                          ts::Boundary::Zero)) == "");
  }
}

TEST_CASE("with_halo moves only the halo elements, point to point, counted as halo traffic", "[halo]") {
  const int p = world_size();
  ts::Mesh<"x"> line({p});
  auto x = ts::from_function<double, ts::Spec<ts::S<"x">>>(line, {12}, [](auto i) { return double(i[0]); });
  ts::reset_comm_stats();
  Eigen::Tensor<double, 1> got = ts::with_halo(x, {1}, ts::Boundary::Zero);
  const auto& halo = ts::comm_stats().op("with_halo").collectives;
  const int c = line.coord<"x">();
  // Neighbours that hold elements, where this rank does (past 6 ranks, 12 leaves the last empty).
  const auto holds = [&](int r) { return r >= 0 && r < p && std::min<int>(12, (r + 1) * ((12 + p - 1) / p)) > r * ((12 + p - 1) / p); };
  const std::uint64_t neighbours = holds(c) ? std::uint64_t(holds(c - 1)) + std::uint64_t(holds(c + 1)) : 0;
  const auto it = halo.find("halo");
  const std::uint64_t sent = it == halo.end() ? 0 : it->second.bytes_sent;
  const std::uint64_t received = it == halo.end() ? 0 : it->second.bytes_received;
  INFO("rank " << c << " sent " << sent << " received " << received);
  TS_REQUIRE_ALL(sent == neighbours * sizeof(double) && received == neighbours * sizeof(double));
  TS_REQUIRE_ALL(ts::comm_stats().op("with_halo").total().calls == (neighbours > 0 ? 1u : 0u));
}

TEST_CASE("stencil applies a user kernel over halo-extended views, equal to the serial loop", "[halo]") {
  std::string fail;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto shape : std::vector<std::array<Eigen::Index, 2>>{{7, 5}, {2, 9}, {1, 1}})
      for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic}) {
        Eigen::Tensor<double, 2> g = iota_tensor<double, 2>(shape);
        auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
        auto y = ts::stencil(x, {1, 1}, b, [](const auto& v) { return five_point<double>(v); });
        std::string e = compare(y.gather(), five_point_reference(g, b));
        if (fail.empty() && !e.empty()) fail = "mesh " + mesh.shape().describe() + " shape " + shape_str(shape) + ": " + e;
        // A kernel that also takes the global index, with an asymmetric window.
        auto z = ts::stencil(x, {ts::Halo{0, 1}, ts::Halo{2, 0}}, b, [](const auto& v, const auto& i) {
          return v(1, 0) + 10.0 * v(0, -2) + 100.0 * double(i[0] + 7 * i[1]);
        });
        Eigen::Tensor<double, 2> want(g.dimensions());
        for (Eigen::Index j = 0; j < shape[1]; ++j)
          for (Eigen::Index i = 0; i < shape[0]; ++i) {
            auto at = [&](Eigen::Index r, Eigen::Index c) {
              const Eigen::Index sr = source_index(r, shape[0], b), sc = source_index(c, shape[1], b);
              return sr < 0 || sc < 0 ? 0.0 : g(sr, sc);
            };
            want(i, j) = at(i + 1, j) + 10.0 * at(i, j - 2) + 100.0 * double(i + 7 * j);
          }
        e = compare(z.gather(), want);
        if (fail.empty() && !e.empty())
          fail = "indexed kernel, mesh " + mesh.shape().describe() + " shape " + shape_str(shape) + ": " + e;
      }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

TEST_CASE("convolve equals the serial correlation for 1-D to 3-D kernels, both boundaries", "[halo]") {
  std::string fail;
  auto note = [&](const std::string& what, const std::string& e) {
    if (fail.empty() && !e.empty()) fail = what + ": " + e;
  };
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    const std::string m = " on mesh " + mesh.shape().describe();
    for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic}) {
      {
        Eigen::Tensor<double, 1> g = small_values<double, 1>({11}, 1), k = small_values<double, 1>({5}, 2);
        auto x = ts::distribute<ts::Spec<ts::S<"y", "x">>>(mesh, g);
        note("1-D" + m, compare(ts::convolve(x, k, b).gather(), convolve_reference(g, k, b), 1e-12));
      }
      {
        Eigen::Tensor<double, 2> g = small_values<double, 2>({7, 5}, 3), k = small_values<double, 2>({3, 5}, 4);
        auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
        auto y = ts::convolve(x, k, b);
        static_assert(std::is_same_v<decltype(y), decltype(x)>, "output spec = input spec");
        note("2-D" + m, compare(y.gather(), convolve_reference(g, k, b), 1e-12));
      }
      {
        Eigen::Tensor<std::int32_t, 3> g = small_values<std::int32_t, 3>({4, 3, 6}, 5),
                                       k = small_values<std::int32_t, 3>({3, 1, 3}, 6);
        auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::S<"y">>>(mesh, g);
        note("3-D int" + m, compare(ts::convolve(x, k, b).gather(), convolve_reference(g, k, b)));
      }
      {
        Eigen::Tensor<std::complex<double>, 2> g = small_values<std::complex<double>, 2>({3, 8}, 7),
                                               k = small_values<std::complex<double>, 2>({7, 3}, 8);
        auto x = ts::distribute<ts::Spec<ts::R, ts::S<"x", "y">>>(mesh, g);
        note("2-D complex, kernel wider than the tensor" + m,
             compare(ts::convolve(x, k, b).gather(), convolve_reference(g, k, b), 1e-12));
      }
    }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

TEST_CASE("convolve and stencil read deep points from the shard itself and only the frame from halos: blocks large "
          "enough to have an inside, uneven, a 7-point Laplacian in its 3x3x3 box, an asymmetric window",
          "[halo]") {
  std::string fail;
  auto note = [&](const std::string& what, const std::string& e) {
    if (fail.empty() && !e.empty()) fail = what + ": " + e;
  };
  for (auto sizes : mesh_shapes(world_size(), 3)) {
    M3 mesh({sizes[0], sizes[1], sizes[2]});
    const std::string m = " on mesh " + mesh.shape().describe();
    Eigen::Tensor<double, 3> lap(3, 3, 3);
    lap.setZero();
    lap(1, 1, 1) = 6;
    for (int d = 0; d < 3; ++d)
      for (int s : {0, 2}) {
        std::array<Eigen::Index, 3> at{1, 1, 1};
        at[std::size_t(d)] = s;
        lap(at) = -1;
      }
    for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
      for (auto shape : std::vector<std::array<Eigen::Index, 3>>{{23, 17, 13}, {9, 31, 5}}) {
        const Eigen::Tensor<double, 3> g = small_values<double, 3>(shape, 9);
        auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">, ts::S<"z">>>(mesh, g);
        const std::string what = "shape " + shape_str(shape) + m;
        note("7-point Laplacian, " + what, compare(ts::convolve(x, lap, b).gather(), convolve_reference(g, lap, b), 1e-12));
        const Eigen::Tensor<double, 3> k = small_values<double, 3>({5, 3, 1}, 10);
        auto y = ts::distribute<ts::Spec<ts::S<"z">, ts::S<"x", "y">, ts::R>>(mesh, g);
        note("5x3x1 kernel, " + what, compare(ts::convolve(y, k, b).gather(), convolve_reference(g, k, b), 1e-12));
        // A user stencil with a window of two before and none after in dim 1.
        auto z = ts::stencil(x, {ts::Halo{1, 1}, ts::Halo{2, 0}, ts::Halo{0, 0}}, b,
                             [](const auto& v) { return v(-1, 0, 0) - 3.0 * v(1, -2, 0) + 0.5 * v(0, 0, 0); });
        Eigen::Tensor<double, 3> want(g.dimensions());
        auto at = [&](Eigen::Index i, Eigen::Index j, Eigen::Index l) {
          const Eigen::Index si = source_index(i, shape[0], b), sj = source_index(j, shape[1], b);
          return si < 0 || sj < 0 ? 0.0 : g(si, sj, l);
        };
        for (Eigen::Index l = 0; l < shape[2]; ++l)
          for (Eigen::Index j = 0; j < shape[1]; ++j)
            for (Eigen::Index i = 0; i < shape[0]; ++i)
              want(i, j, l) = at(i - 1, j, l) - 3.0 * at(i + 1, j - 2, l) + 0.5 * at(i, j, l);
        note("asymmetric stencil, " + what, compare(z.gather(), want, 1e-12));
        // In place through a plan (in and out the same tensor): every point reads the old values.
        auto w = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">, ts::S<"z">>>(mesh, g);
        ts::HaloExchange<double, 3> plan(w, {1, 1, 1}, b);
        auto seven = [](const ts::StencilView<double, 3>& v) {
          return 6 * v(0, 0, 0) - v(-1, 0, 0) - v(1, 0, 0) - v(0, -1, 0) - v(0, 1, 0) - v(0, 0, -1) - v(0, 0, 1);
        };
        plan.stencil(w, w, seven);
        note("in place, " + what, compare(w.gather(), convolve_reference(g, lap, b), 1e-12));
      }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

// Central differences of a serial function of a small tensor at every element.
template <int R, class F>
Eigen::Tensor<double, R> central_differences(const Eigen::Tensor<double, R>& x, F&& f) {
  Eigen::Tensor<double, R> d(x.dimensions());
  const double eps = 1e-6;
  for (Eigen::Index n = 0; n < x.size(); ++n) {
    Eigen::Tensor<double, R> up = x, down = x;
    up.data()[n] += eps;
    down.data()[n] -= eps;
    d.data()[n] = (f(up) - f(down)) / (2 * eps);
  }
  return d;
}

TEST_CASE("convolve's gradient under ts::ad equals central differences of the serial correlation at every element, "
          "both boundaries, kernels wider than a shard",
          "[halo][conv]") {
  std::string fail;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
      for (auto kshape : std::vector<std::array<Eigen::Index, 2>>{{3, 5}, {5, 1}}) {
        const Eigen::Tensor<double, 2> g = small_values<double, 2>({7, 5}, 3), k = small_values<double, 2>(kshape, 4);
        const Eigen::Tensor<double, 2> rg = small_values<double, 2>({7, 5}, 9);
        const auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
        const auto r = ts::distribute<ts::Spec<ts::S<"y">, ts::R>>(mesh, rg);
        auto [l, dx] = ts::ad::value_and_grad([&](const auto& xv) { return ts::sum<0, 1>(ts::convolve(xv, k, b) * r); }, x);
        const auto fd = central_differences<2>(g, [&](const Eigen::Tensor<double, 2>& xv) {
          const Eigen::Tensor<double, 0> v = (convolve_reference(xv, k, b) * rg).sum();
          return v();
        });
        std::string e = compare(dx.gather(), fd, 1e-5);
        if (fail.empty() && !e.empty())
          fail = "mesh " + mesh.shape().describe() + " kernel " + shape_str(kshape) +
                 (b == ts::Boundary::Zero ? " zero" : " periodic") + ": " + e;
      }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

namespace {
// A nonlinear stencil with an asymmetric window, its serial loop and its per-point derivative.
template <class V>
double curvy(const V& v) {
  return v(0, 0) * v(1, 0) + 0.5 * v(-1, 1) * v(-1, 1) + std::sin(v(0, -2));
}
Eigen::Tensor<double, 2> curvy_reference(const Eigen::Tensor<double, 2>& g, ts::Boundary b) {
  Eigen::Tensor<double, 2> out(g.dimensions());
  auto at = [&](Eigen::Index r, Eigen::Index c) {
    const Eigen::Index sr = source_index(r, g.dimension(0), b), sc = source_index(c, g.dimension(1), b);
    return sr < 0 || sc < 0 ? 0.0 : g(sr, sc);
  };
  for (Eigen::Index j = 0; j < g.dimension(1); ++j)
    for (Eigen::Index i = 0; i < g.dimension(0); ++i)
      out(i, j) = curvy([&](Eigen::Index a, Eigen::Index c) { return at(i + a, j + c); });
  return out;
}
}  // namespace

TEST_CASE("stencil_backward is the exact gradient of a nonlinear stencil, every element against central differences: "
          "halos wider than a shard, empty shards, both boundaries, and inside ts::ad::custom_vjp",
          "[halo][conv]") {
  std::string fail;
  const ts::Halo widths[2] = {ts::Halo{1, 1}, ts::Halo{2, 1}};
  auto backward_point = [](const auto& v, double dy, const auto& d) {
    d(0, 0) += v(1, 0) * dy;
    d(1, 0) += v(0, 0) * dy;
    d(-1, 1) += v(-1, 1) * dy;
    d(0, -2) += std::cos(v(0, -2)) * dy;
  };
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic})
      for (auto shape : std::vector<std::array<Eigen::Index, 2>>{{7, 5}, {2, 3}}) {
        const Eigen::Tensor<double, 2> g = small_values<double, 2>(shape, 3), rg = small_values<double, 2>(shape, 9);
        const auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
        const auto r = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, rg);
        const auto fd = central_differences<2>(g, [&](const Eigen::Tensor<double, 2>& xv) {
          const Eigen::Tensor<double, 0> v = (curvy_reference(xv, b) * rg).sum();
          return v();
        });
        const std::string what = "mesh " + mesh.shape().describe() + " shape " + shape_str(shape) +
                                 (b == ts::Boundary::Zero ? " zero: " : " periodic: ");
        std::string e = compare(ts::stencil(x, widths, b, [](const auto& v) { return curvy(v); }).gather(), curvy_reference(g, b), 1e-12);
        if (fail.empty() && !e.empty()) fail = what + "forward " + e;
        e = compare(ts::stencil_backward(x, r, widths, b, backward_point).gather(), fd, 1e-5);
        if (fail.empty() && !e.empty()) fail = what + "stencil_backward " + e;
        // The pairing a user writes to make the stencil differentiable.
        auto [l, dx] = ts::ad::value_and_grad(
            [&](const auto& xv) {
              auto y = ts::ad::custom_vjp(
                  [&](const auto& xi) { return ts::stencil(xi, widths, b, [](const auto& v) { return curvy(v); }); },
                  [&](const auto& dy, const auto&, const auto& xi) { return ts::stencil_backward(xi, dy, widths, b, backward_point); },
                  xv);
              return ts::sum<0, 1>(y * r);
            },
            x);
        e = compare(dx.gather(), fd, 1e-5);
        if (fail.empty() && !e.empty()) fail = what + "custom_vjp " + e;
      }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

TEST_CASE("conv2d on NCHW input split on batch and spatial dims equals direct serial loops, Same and Valid", "[halo]") {
  std::string fail;
  Eigen::Tensor<double, 4> g = small_values<double, 4>({3, 2, 7, 5}, 11);
  Eigen::Tensor<double, 4> w33 = small_values<double, 4>({4, 2, 3, 3}, 12);
  Eigen::Tensor<double, 4> w15 = small_values<double, 4>({2, 2, 1, 5}, 13);
  Eigen::Tensor<double, 4> w22 = small_values<double, 4>({3, 2, 2, 2}, 14);
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    using W = ts::Spec<ts::R, ts::R, ts::R, ts::R>;
    auto conv = [&](const auto& x, const Eigen::Tensor<double, 4>& w, ts::Padding padding) {
      return ts::nn::conv2d(x, ts::distribute<W>(mesh, w), {.padding = padding}).gather();
    };
    auto run = [&](const auto& x, const std::string& what) {
      auto note = [&](const std::string& k, const std::string& e) {
        if (fail.empty() && !e.empty()) fail = what + " " + k + " on mesh " + mesh.shape().describe() + ": " + e;
      };
      note("3x3 same", compare(conv(x, w33, ts::Padding::Same), conv2d_reference(g, w33, 1, 1), 1e-9));
      note("3x3 valid", compare(conv(x, w33, ts::Padding::Valid), conv2d_reference(g, w33, 0, 0), 1e-9));
      note("1x5 same", compare(conv(x, w15, ts::Padding::Same), conv2d_reference(g, w15, 0, 2), 1e-9));
      note("2x2 valid", compare(conv(x, w22, ts::Padding::Valid), conv2d_reference(g, w22, 0, 0), 1e-9));
    };
    run(ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::S<"y">, ts::R>>(mesh, g), "{x, R, y, R}");
    run(ts::distribute<ts::Spec<ts::R, ts::R, ts::S<"x">, ts::S<"y">>>(mesh, g), "{R, R, x, y}");
    run(ts::distribute<ts::Spec<ts::S<"x", "y">, ts::R, ts::R, ts::R>>(mesh, g), "{(x,y), R, R, R}");
    run(ts::distribute<ts::Spec<ts::R, ts::R, ts::R, ts::S<"y", "x">>>(mesh, g), "{R, R, R, (y,x)}");
    auto split_channels = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">, ts::R, ts::R>>(mesh, g);
    auto y = ts::nn::conv2d(split_channels, ts::distribute<W>(mesh, w33));
    static_assert(std::is_same_v<decltype(y)::SpecType, ts::Spec<ts::S<"x">, ts::R, ts::R, ts::R>>,
                  "conv2d's output is split like its input with channels whole");
    run(split_channels, "{x, y, R, R} (channels gathered first)");
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}


TEST_CASE("a HaloExchange reused for 1000 exchanges allocates nothing after the first and stays correct", "[halo]") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    Eigen::Tensor<float, 2> g = iota_tensor<float, 2>({7, 5});
    auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
    ts::HaloExchange<float, 2> plan(x, {ts::Halo{1, 2}, ts::Halo{3, 1}}, ts::Boundary::Periodic);
    Eigen::Tensor<float, 2> ext;
    plan.exchange(x, ext);  // the first exchange sizes ext
    Eigen::Tensor<float, 2> inplace = plan.make_extended();
    plan.load_interior(x, inplace);
    plan.exchange(inplace);
    const auto before = ts::pool_stats();
    for (int i = 0; i < 500; ++i) {
      plan.start(x, ext);
      plan.finish();
      plan.start(inplace);
      plan.finish();
    }
    const auto after = ts::pool_stats();
    INFO("mesh " << sizes[0] << "x" << sizes[1] << ": fresh allocations " << before.fresh_allocations << " -> "
                 << after.fresh_allocations << ", reuses " << before.reuses << " -> " << after.reuses);
    TS_REQUIRE_ALL(after.fresh_allocations == before.fresh_allocations && after.reuses == before.reuses);
    const std::array<ts::Halo, 2> w{ts::Halo{1, 2}, ts::Halo{3, 1}};
    Eigen::Tensor<float, 2> want =
        halo_reference<float, 2>(g, x.local_offset(), x.local_shape(), w, ts::Boundary::Periodic);
    TS_REQUIRE_ALL(compare(ext, want) == "");
    TS_REQUIRE_ALL(compare(inplace, want) == "");
  }
}

TEST_CASE("HaloExchange start/finish around apply_inner/apply_outer steps a field in place like the serial loop", "[halo]") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic}) {
      Eigen::Tensor<double, 2> g = small_values<double, 2>({9, 6}, 21);
      auto x = ts::distribute<ts::Spec<ts::S<"y">, ts::S<"x">>>(mesh, g);
      ts::HaloExchange<double, 2> plan(x, {1, 1}, b);
      Eigen::Tensor<double, 2> u = plan.make_extended(), v = plan.make_extended();
      plan.load_interior(x, u);
      Eigen::Tensor<double, 2> serial = g;
      auto kernel = [](const ts::StencilView<double, 2>& s) { return 0.5 * five_point<double>(s); };
      for (int step = 0; step < 5; ++step) {
        plan.start(u);
        plan.apply_inner(u, v, kernel);
        plan.finish();
        plan.apply_outer(u, v, kernel);
        std::swap(u, v);
        Eigen::Tensor<double, 2> next = five_point_reference(serial, b);
        serial = next * 0.5;
      }
      plan.store_interior(u, x);
      INFO("mesh " << sizes[0] << "x" << sizes[1] << " boundary " << boundary_str(b));
      TS_REQUIRE_ALL(compare(x.gather(), serial) == "");  // same arithmetic, bit for bit
      // The tensor-to-tensor form of one step.
      auto y = ts::zeros<double, ts::Spec<ts::S<"y">, ts::S<"x">>>(mesh, {9, 6});
      plan.stencil(x, y, kernel);
      Eigen::Tensor<double, 2> once = five_point_reference(serial, b);
      Eigen::Tensor<double, 2> half = once * 0.5;
      TS_REQUIRE_ALL(compare(y.gather(), half) == "");
    }
  }
}

TEST_CASE("windowed operators reject even kernels, negative widths and mismatched channels on every rank", "[halo]") {
  M2 mesh({world_size(), 1});
  auto x = ts::zeros<double, ts::Spec<ts::S<"x">, ts::R>>(mesh, {7, 5});
  Eigen::Tensor<double, 2> even(3, 2);
  even.setZero();
  const std::string e1 = error_of([&] { ts::convolve(x, even, ts::Boundary::Zero); });
  INFO(e1);
  TS_REQUIRE_ALL(e1.find("ShapeError: tshard::convolve") == 0 && e1.find("[3, 2]") != std::string::npos &&
                 e1.find("[7, 5] {x, R}") != std::string::npos);
  const std::string e2 = error_of([&] { (void)ts::with_halo(x, {1, -1}, ts::Boundary::Zero); });
  INFO(e2);
  TS_REQUIRE_ALL(e2.find("ShapeError: tshard::with_halo") == 0 && e2.find("[7, 5] {x, R}") != std::string::npos);
  const std::string e3 = error_of([&] { ts::HaloExchange<double, 2> plan(x, {ts::Halo{0, 1}, ts::Halo{-2, 0}}, ts::Boundary::Zero); });
  INFO(e3);
  TS_REQUIRE_ALL(e3.find("ShapeError: tshard::HaloExchange") == 0);
  const std::string e4 = error_of([&] { ts::stencil(x, {-1, 0}, ts::Boundary::Zero, [](const auto& v) { return v(0, 0); }); });
  TS_REQUIRE_ALL(e4.find("ShapeError: tshard::stencil") == 0);
  auto images = ts::zeros<float, ts::Spec<ts::S<"x">, ts::R, ts::R, ts::R>>(mesh, {2, 3, 5, 5});
  using W = ts::Spec<ts::R, ts::R, ts::R, ts::R>;
  auto w = ts::zeros<float, W>(mesh, {4, 2, 3, 3}), w_even = ts::zeros<float, W>(mesh, {4, 3, 2, 3});
  const std::string e5 = error_of([&] { ts::nn::conv2d(images, w); });
  INFO(e5);
  TS_REQUIRE_ALL(e5.find("ShapeError: tshard::nn::conv2d") == 0 && e5.find("[4, 2, 3, 3]") != std::string::npos);
  const std::string e6 = error_of([&] { ts::nn::conv2d(images, w_even, {.padding = ts::Padding::Same}); });
  TS_REQUIRE_ALL(e6.find("ShapeError: tshard::nn::conv2d: Same padding") == 0);
  const std::string e7 = error_of([&] { ts::nn::conv2d(images, w_even, {.padding = ts::Padding::Valid}); });
  TS_REQUIRE_ALL(e7 == "no error");
  // A plan used with a tensor of another mesh object: MeshError on every rank.
  M2 other({world_size(), 1});
  auto y = ts::zeros<double, ts::Spec<ts::S<"x">, ts::R>>(other, {7, 5});
  ts::HaloExchange<double, 2> plan(x, {ts::Halo{1, 1}, ts::Halo{0, 0}}, ts::Boundary::Zero);
  bool mesh_error = false;
  try {
    typename ts::HaloExchange<double, 2>::Extended ext;
    plan.load_interior(y, ext);
  } catch (const ts::MeshError&) {
    mesh_error = true;
  }
  TS_REQUIRE_ALL(mesh_error);
}

TEST_CASE("nn's windowed layers resolve a partial-sum input first, and reject bad settings on every rank", "[halo][conv]") {
  using ts::R;
  using ts::S;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    // Each rank holds (its y coordinate + 1) times the images: the sum over y is known.
    using Sp = ts::Spec<R, R, S<"x">, R>;
    const auto plain = ts::random<double, Sp>(mesh, {2, 3, 7, 5}, 12);
    Eigen::Tensor<double, 4> local(plain.padded_shape());
    local = plain.local() * double(mesh.coord<"y">() + 1);
    const auto partial = ts::from_local<Sp, ts::PartialSum<"y">>(mesh, {2, 3, 7, 5}, std::move(local));
    const int ny = mesh.size<"y">();
    const auto whole = plain * double(ny * (ny + 1) / 2);
    const auto w = ts::random<double, ts::Spec<R, R, R, R>>(mesh, {4, 3, 3, 3}, 13);
    const ts::nn::Conv strided{.stride = 2, .padding = ts::Padding::Same};
    INFO("mesh " << mesh.shape().describe());
    TS_REQUIRE_ALL(compare(ts::nn::conv2d(partial, w, strided).gather(), ts::nn::conv2d(whole, w, strided).gather(), 1e-12) == "");
    TS_REQUIRE_ALL(compare(ts::nn::max_pool2d(partial, 3, 2).gather(), ts::nn::max_pool2d(whole, 3, 2).gather(), 1e-12) == "");
    TS_REQUIRE_ALL(compare(ts::nn::avg_pool2d(partial, 2, 2).gather(), ts::nn::avg_pool2d(whole, 2, 2).gather(), 1e-12) == "");
    TS_REQUIRE_ALL(compare(ts::nn::upsample2d(partial, 2).gather(), ts::nn::upsample2d(whole, 2).gather(), 1e-12) == "");
  }
  // Bad settings: a ShapeError naming the layer and the tensors, thrown alike on every rank.
  M2 mesh({world_size(), 1});
  const auto x = ts::zeros<double, ts::Spec<S<"x">, R, R, R>>(mesh, {2, 3, 5, 5});
  const auto w = ts::zeros<double, ts::Spec<R, R, R, R>>(mesh, {4, 3, 3, 3});
  const auto w_channels = ts::zeros<double, ts::Spec<R, R, R, R>>(mesh, {4, 2, 3, 3});
  const auto w_big = ts::zeros<double, ts::Spec<R, R, R, R>>(mesh, {4, 3, 9, 3});
  const auto volume = ts::zeros<double, ts::Spec<S<"x">, R, R, R, R>>(mesh, {2, 3, 4, 5, 5});
  const auto w3 = ts::zeros<double, ts::Spec<R, R, R, R, R>>(mesh, {4, 3, 3, 2, 3});
  auto starts = [](const std::string& e, const std::string& with) { return e.find(with) == 0; };
  const std::string e1 = error_of([&] { (void)ts::nn::conv2d(x, w_channels); });
  INFO(e1);
  TS_REQUIRE_ALL(starts(e1, "ShapeError: tshard::nn::conv2d: the weights' input channels") &&
                 e1.find("[4, 2, 3, 3]") != std::string::npos && e1.find("[2, 3, 5, 5]") != std::string::npos);
  const std::string e2 = error_of([&] { (void)ts::nn::conv2d(x, w, ts::nn::Conv{.stride = 0}); });
  TS_REQUIRE_ALL(starts(e2, "ShapeError: tshard::nn::conv2d: the stride must be at least 1"));
  const std::string e3 = error_of([&] { (void)ts::nn::conv2d(x, w_big, ts::nn::Conv{.padding = ts::Padding::Valid}); });
  TS_REQUIRE_ALL(starts(e3, "ShapeError: tshard::nn::conv2d: the kernel does not fit"));
  const std::string e4 = error_of([&] { (void)ts::nn::conv2d(x, w, ts::nn::Conv{.pad_d = 1}); });
  TS_REQUIRE_ALL(starts(e4, "ShapeError: tshard::nn::conv2d: pad_d is conv3d's"));
  const std::string e5 = error_of([&] { (void)ts::nn::conv3d(volume, w3); });
  INFO(e5);
  TS_REQUIRE_ALL(starts(e5, "ShapeError: tshard::nn::conv3d: Same padding needs odd kernel extents"));
  const std::string e6 = error_of([&] { (void)ts::nn::conv3d(volume, w3, ts::nn::Conv{.padding = ts::Padding::Valid}); });
  TS_REQUIRE_ALL(e6 == "no error");
  const std::string e7 = error_of([&] { (void)ts::nn::max_pool2d(x, 7, 2); });
  INFO(e7);
  TS_REQUIRE_ALL(starts(e7, "ShapeError: tshard::nn::max_pool2d"));
  // Nothing is left in flight: the mesh still works.
  TS_REQUIRE_ALL(ts::nn::conv2d(x, w).gather().dimension(1) == 4);
}

TEST_CASE("halo messages longer than the chunk limit arrive whole", "[halo]") {
  std::string fail;
  ts::detail::set_collective_chunk_limit(3);
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto b : {ts::Boundary::Zero, ts::Boundary::Periodic}) {
      std::string e = check_with_halo<ts::Spec<ts::S<"x">, ts::S<"y">>, M2, 2>(
          mesh, {11, 9}, {ts::Halo{2, 3}, ts::Halo{4, 1}}, b);
      if (fail.empty()) fail = e;
    }
  }
  ts::detail::set_collective_chunk_limit(INT_MAX);
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

// ---- ts::nn::conv2d and its gradient ----

namespace {

struct ConvCase {
  Eigen::Index N, C, H, W, O, kh, kw;
  ts::nn::Conv conv;
};

// y, dx and dw of L = sum(conv2d(x, w) * r) by direct serial loops.
struct ConvReference {
  Eigen::Tensor<double, 4> y, dx, dw;
};
ConvReference conv_reference(const Eigen::Tensor<double, 4>& x, const Eigen::Tensor<double, 4>& w, const Eigen::Tensor<double, 4>& r,
                             const ConvCase& k, Eigen::Index ph, Eigen::Index pw) {
  const Eigen::Index s = k.conv.stride, Ho = r.dimension(2), Wo = r.dimension(3);
  ConvReference out{Eigen::Tensor<double, 4>(k.N, k.O, Ho, Wo), Eigen::Tensor<double, 4>(x.dimensions()),
                    Eigen::Tensor<double, 4>(w.dimensions())};
  out.y.setZero();
  out.dx.setZero();
  out.dw.setZero();
  for (Eigen::Index n = 0; n < k.N; ++n)
    for (Eigen::Index o = 0; o < k.O; ++o)
      for (Eigen::Index i = 0; i < Ho; ++i)
        for (Eigen::Index j = 0; j < Wo; ++j)
          for (Eigen::Index c = 0; c < k.C; ++c)
            for (Eigen::Index a = 0; a < k.kh; ++a)
              for (Eigen::Index b = 0; b < k.kw; ++b) {
                const Eigen::Index h = s * i + a - ph, v = s * j + b - pw;
                if (h < 0 || h >= k.H || v < 0 || v >= k.W) continue;
                out.y(n, o, i, j) += w(o, c, a, b) * x(n, c, h, v);
                out.dx(n, c, h, v) += w(o, c, a, b) * r(n, o, i, j);
                out.dw(o, c, a, b) += x(n, c, h, v) * r(n, o, i, j);
              }
  return out;
}

template <class XS, class WS>
std::string check_conv2d(M2& mesh, const ConvCase& k) {
  const Eigen::Index ph = k.conv.pad_h >= 0 ? k.conv.pad_h : (k.conv.padding == ts::Padding::Same ? (k.kh - 1) / 2 : 0);
  const Eigen::Index pw = k.conv.pad_w >= 0 ? k.conv.pad_w : (k.conv.padding == ts::Padding::Same ? (k.kw - 1) / 2 : 0);
  const Eigen::Index Ho = (k.H + 2 * ph - k.kh) / k.conv.stride + 1, Wo = (k.W + 2 * pw - k.kw) / k.conv.stride + 1;
  const auto x = ts::random<double, XS>(mesh, {k.N, k.C, k.H, k.W}, 3);
  const auto w = ts::random<double, WS>(mesh, {k.O, k.C, k.kh, k.kw}, 4);
  const auto r = ts::random<double, ts::Spec<ts::R, ts::R, ts::R, ts::R>>(mesh, {k.N, k.O, Ho, Wo}, 5);
  const auto want = conv_reference(x.gather(), w.gather(), r.gather(), k, ph, pw);
  std::ostringstream what;
  what << "mesh " << mesh.shape().describe() << " x " << x.describe() << " w " << w.describe() << " stride " << k.conv.stride
       << " pad (" << ph << ", " << pw << "): ";
  const auto y = ts::nn::conv2d(x, w, k.conv);
  if (std::string e = compare(y.gather(), want.y, 1e-12); !e.empty()) return what.str() + "y " + e;
  auto loss = [&](const auto& xv, const auto& wv) { return ts::sum<0, 1, 2, 3>(ts::nn::conv2d(xv, wv, k.conv) * r); };
  auto [l, dx, dw] = ts::ad::value_and_grad(loss, x, w);
  if (std::string e = compare(dx.gather(), want.dx, 1e-12); !e.empty()) return what.str() + "dx " + e;
  if (std::string e = compare(dw.gather(), want.dw, 1e-12); !e.empty()) return what.str() + "dw " + e;
  // Central differences in double at a few elements of x and w.
  const double eps = 1e-6;
  auto bumped = [&](auto t, Eigen::Index flat, double by) {
    Eigen::Tensor<double, 4> g = t.gather();
    g.data()[flat] += by;
    return ts::distribute<typename decltype(t)::SpecType>(mesh, g);
  };
  auto value = [](const auto& t) { return double(t.gather()()); };
  for (Eigen::Index flat : {Eigen::Index(0), want.dx.size() / 2, want.dx.size() - 1}) {
    const double fd = (value(loss(bumped(x, flat, eps), w)) - value(loss(bumped(x, flat, -eps), w))) / (2 * eps);
    if (std::abs(fd - want.dx.data()[flat]) > 1e-6 * (1 + std::abs(fd))) return what.str() + "dx differs from central differences";
  }
  for (Eigen::Index flat : {Eigen::Index(0), want.dw.size() - 1}) {
    const double fd = (value(loss(x, bumped(w, flat, eps))) - value(loss(x, bumped(w, flat, -eps)))) / (2 * eps);
    if (std::abs(fd - want.dw.data()[flat]) > 1e-6 * (1 + std::abs(fd))) return what.str() + "dw differs from central differences";
  }
  return "";
}

}  // namespace

TEST_CASE("nn::conv2d and its gradients equal serial loops and central differences: split N, H, W, O, strides 1 and 2, "
          "Same, Valid and explicit padding",
          "[halo][conv]") {
  using ts::R;
  using ts::S;
  const std::vector<ConvCase> cases{
      {3, 2, 7, 5, 3, 3, 3, {.stride = 1, .padding = ts::Padding::Same}},
      {2, 3, 9, 6, 2, 3, 3, {.stride = 2, .padding = ts::Padding::Same}},
      {3, 2, 7, 5, 2, 2, 3, {.stride = 1, .padding = ts::Padding::Valid}},
      {2, 2, 8, 7, 3, 3, 2, {.stride = 2, .padding = ts::Padding::Valid, .pad_h = 1, .pad_w = 0}},
      {2, 1, 5, 4, 2, 5, 3, {.stride = 1, .padding = ts::Padding::Same}},  // halos wider than a shard of H
  };
  std::string fail;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (const auto& k : cases)
      for (auto* f : {&check_conv2d<ts::Spec<S<"x">, R, S<"y">, R>, ts::Spec<R, R, R, R>>,
                      &check_conv2d<ts::Spec<R, R, S<"x">, S<"y">>, ts::Spec<R, R, R, R>>,
                      &check_conv2d<ts::Spec<R, R, R, S<"y", "x">>, ts::Spec<R, R, R, R>>,
                      &check_conv2d<ts::Spec<R, S<"x">, S<"y">, R>, ts::Spec<R, R, R, R>>,
                      &check_conv2d<ts::Spec<S<"x">, R, R, R>, ts::Spec<S<"y">, R, R, R>>}) {
        std::string e = f(mesh, k);
        if (fail.empty()) fail = e;
      }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

// ---- ts::nn::conv3d ----

namespace {

struct Conv3Case {
  Eigen::Index N, C, D, H, W, O, kd, kh, kw;
  ts::nn::Conv conv;
};

// y, dx and dw of L = sum(conv3d(x, w) * r) by direct serial loops, pads (pd, ph, pw).
struct Conv3Reference {
  Eigen::Tensor<double, 5> y, dx, dw;
};
Conv3Reference conv3d_reference(const Eigen::Tensor<double, 5>& x, const Eigen::Tensor<double, 5>& w,
                                const Eigen::Tensor<double, 5>& r, const Conv3Case& k, std::array<Eigen::Index, 3> p) {
  const Eigen::Index s = k.conv.stride;
  Conv3Reference out{Eigen::Tensor<double, 5>(r.dimensions()), Eigen::Tensor<double, 5>(x.dimensions()),
                     Eigen::Tensor<double, 5>(w.dimensions())};
  out.y.setZero();
  out.dx.setZero();
  out.dw.setZero();
  for (Eigen::Index n = 0; n < k.N; ++n)
    for (Eigen::Index o = 0; o < k.O; ++o)
      for (Eigen::Index i = 0; i < r.dimension(2); ++i)
        for (Eigen::Index j = 0; j < r.dimension(3); ++j)
          for (Eigen::Index l = 0; l < r.dimension(4); ++l)
            for (Eigen::Index c = 0; c < k.C; ++c)
              for (Eigen::Index a = 0; a < k.kd; ++a)
                for (Eigen::Index b = 0; b < k.kh; ++b)
                  for (Eigen::Index e = 0; e < k.kw; ++e) {
                    const Eigen::Index z = s * i + a - p[0], h = s * j + b - p[1], v = s * l + e - p[2];
                    if (z < 0 || z >= k.D || h < 0 || h >= k.H || v < 0 || v >= k.W) continue;
                    out.y(n, o, i, j, l) += w(o, c, a, b, e) * x(n, c, z, h, v);
                    out.dx(n, c, z, h, v) += w(o, c, a, b, e) * r(n, o, i, j, l);
                    out.dw(o, c, a, b, e) += x(n, c, z, h, v) * r(n, o, i, j, l);
                  }
  return out;
}

template <class XS, class WS>
std::string check_conv3d(M2& mesh, const Conv3Case& k) {
  const std::array<Eigen::Index, 3> kern{k.kd, k.kh, k.kw}, in{k.D, k.H, k.W},
      given{k.conv.pad_d, k.conv.pad_h, k.conv.pad_w};
  const bool any_explicit = given[0] >= 0 || given[1] >= 0 || given[2] >= 0;
  std::array<Eigen::Index, 3> p{}, out{};
  for (int d = 0; d < 3; ++d) {
    p[d] = any_explicit ? std::max<Eigen::Index>(given[d], 0) : (k.conv.padding == ts::Padding::Same ? (kern[d] - 1) / 2 : 0);
    out[d] = (in[d] + 2 * p[d] - kern[d]) / k.conv.stride + 1;
  }
  const auto x = ts::random<double, XS>(mesh, {k.N, k.C, k.D, k.H, k.W}, 3);
  const auto w = ts::random<double, WS>(mesh, {k.O, k.C, k.kd, k.kh, k.kw}, 4);
  const auto r = ts::random<double, ts::Spec<ts::R, ts::R, ts::R, ts::R, ts::R>>(mesh, {k.N, k.O, out[0], out[1], out[2]}, 5);
  const auto want = conv3d_reference(x.gather(), w.gather(), r.gather(), k, p);
  std::ostringstream what;
  what << "mesh " << mesh.shape().describe() << " x " << x.describe() << " w " << w.describe() << " stride " << k.conv.stride
       << " pad (" << p[0] << ", " << p[1] << ", " << p[2] << "): ";
  if (std::string e = compare(ts::nn::conv3d(x, w, k.conv).gather(), want.y, 1e-12); !e.empty()) return what.str() + "y " + e;
  auto loss = [&](const auto& xv, const auto& wv) { return ts::sum<0, 1, 2, 3, 4>(ts::nn::conv3d(xv, wv, k.conv) * r); };
  auto [l, dx, dw] = ts::ad::value_and_grad(loss, x, w);
  if (std::string e = compare(dx.gather(), want.dx, 1e-12); !e.empty()) return what.str() + "dx " + e;
  if (std::string e = compare(dw.gather(), want.dw, 1e-12); !e.empty()) return what.str() + "dw " + e;
  const double eps = 1e-6;
  auto bumped = [&](auto t, Eigen::Index flat, double by) {
    Eigen::Tensor<double, 5> g = t.gather();
    g.data()[flat] += by;
    return ts::distribute<typename decltype(t)::SpecType>(mesh, g);
  };
  auto value = [](const auto& t) { return double(t.gather()()); };
  for (Eigen::Index flat : {want.dx.size() / 3, want.dx.size() - 1}) {
    const double fd = (value(loss(bumped(x, flat, eps), w)) - value(loss(bumped(x, flat, -eps), w))) / (2 * eps);
    if (std::abs(fd - want.dx.data()[flat]) > 1e-6 * (1 + std::abs(fd))) return what.str() + "dx differs from central differences";
  }
  for (Eigen::Index flat : {Eigen::Index(0), want.dw.size() / 2}) {
    const double fd = (value(loss(x, bumped(w, flat, eps))) - value(loss(x, bumped(w, flat, -eps)))) / (2 * eps);
    if (std::abs(fd - want.dw.data()[flat]) > 1e-6 * (1 + std::abs(fd))) return what.str() + "dw differs from central differences";
  }
  return "";
}

}  // namespace

TEST_CASE("nn::conv3d and its gradients equal serial loops and central differences: volumes split over N, D, H, W and "
          "O, strides 1 and 2, Same, Valid and explicit padding",
          "[halo][conv]") {
  using ts::R;
  using ts::S;
  const std::vector<Conv3Case> cases{
      {2, 2, 5, 4, 3, 2, 3, 3, 3, {.stride = 1, .padding = ts::Padding::Same}},
      {1, 2, 7, 5, 6, 2, 3, 1, 3, {.stride = 2, .padding = ts::Padding::Same}},
      {2, 1, 4, 5, 4, 3, 2, 3, 2, {.stride = 1, .padding = ts::Padding::Valid}},
      {1, 2, 5, 6, 3, 2, 3, 2, 3, {.stride = 2, .padding = ts::Padding::Valid, .pad_h = 1, .pad_d = 2}},
      {1, 1, 3, 4, 3, 2, 5, 3, 3, {.stride = 1, .padding = ts::Padding::Same}},  // halos wider than a shard of D
  };
  std::string fail;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (const auto& k : cases)
      for (auto* f : {&check_conv3d<ts::Spec<S<"x">, R, S<"y">, R, R>, ts::Spec<R, R, R, R, R>>,
                      &check_conv3d<ts::Spec<R, R, S<"x">, R, S<"y">>, ts::Spec<R, R, R, R, R>>,
                      &check_conv3d<ts::Spec<R, R, R, S<"y", "x">, R>, ts::Spec<R, R, R, R, R>>,
                      &check_conv3d<ts::Spec<R, R, S<"y">, R, R>, ts::Spec<S<"x">, R, R, R, R>>}) {
        std::string e = f(mesh, k);
        if (fail.empty()) fail = e;
      }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

// ---- batch norm ----

namespace {
// (x - mean) / sqrt(var + eps) * g + b over every dim but 1 of an NCHW tensor, by serial loops.
Eigen::Tensor<double, 4> batch_norm_reference(const Eigen::Tensor<double, 4>& x, const Eigen::Tensor<double, 1>& g,
                                              const Eigen::Tensor<double, 1>& b, double eps) {
  Eigen::Tensor<double, 4> y(x.dimensions());
  const double count = double(x.size()) / double(x.dimension(1));
  for (Eigen::Index c = 0; c < x.dimension(1); ++c) {
    double mean = 0, var = 0;
    for (Eigen::Index n = 0; n < x.dimension(0); ++n)
      for (Eigen::Index h = 0; h < x.dimension(2); ++h)
        for (Eigen::Index w = 0; w < x.dimension(3); ++w) mean += x(n, c, h, w) / count;
    for (Eigen::Index n = 0; n < x.dimension(0); ++n)
      for (Eigen::Index h = 0; h < x.dimension(2); ++h)
        for (Eigen::Index w = 0; w < x.dimension(3); ++w) var += (x(n, c, h, w) - mean) * (x(n, c, h, w) - mean) / count;
    for (Eigen::Index n = 0; n < x.dimension(0); ++n)
      for (Eigen::Index h = 0; h < x.dimension(2); ++h)
        for (Eigen::Index w = 0; w < x.dimension(3); ++w) y(n, c, h, w) = (x(n, c, h, w) - mean) / std::sqrt(var + eps) * g(c) + b(c);
  }
  return y;
}

template <class XS>
std::string check_batch_norm(M2& mesh) {
  using Vec = ts::Spec<ts::R>;
  const auto x = ts::random<double, XS>(mesh, {5, 3, 7, 4}, 8);
  const auto g = ts::random<double, Vec>(mesh, {3}, 9) + 0.5;
  const auto b = ts::random<double, Vec>(mesh, {3}, 10);
  const auto r = ts::random<double, XS>(mesh, {5, 3, 7, 4}, 11);
  std::ostringstream what;
  what << "mesh " << mesh.shape().describe() << " x " << x.describe() << ": ";
  if (std::string e = compare(ts::nn::batch_norm<1>(x, g, b, 1e-5).gather(), batch_norm_reference(x.gather(), g.gather(), b.gather(), 1e-5), 1e-12);
      !e.empty())
    return what.str() + "y " + e;
  auto loss = [&](const auto& xv, const auto& gv, const auto& bv) { return ts::sum<0, 1, 2, 3>(ts::nn::batch_norm<1>(xv, gv, bv, 1e-5) * r); };
  auto [l, dx, dg, db] = ts::ad::value_and_grad(loss, x, g, b);
  // Central differences in double, with the serial reference as the function.
  const Eigen::Tensor<double, 4> xg = x.gather(), rg = r.gather();
  const Eigen::Tensor<double, 1> gg = g.gather(), bg = b.gather();
  auto serial = [&](const Eigen::Tensor<double, 4>& xv, const Eigen::Tensor<double, 1>& gv) {
    const Eigen::Tensor<double, 0> s = (batch_norm_reference(xv, gv, bg, 1e-5) * rg).sum();
    return s();
  };
  const Eigen::Tensor<double, 4> dxg = dx.gather();
  const Eigen::Tensor<double, 1> dgg = dg.gather();
  const double eps = 1e-6;
  for (Eigen::Index flat : {Eigen::Index(0), Eigen::Index(57), xg.size() - 1}) {
    Eigen::Tensor<double, 4> up = xg, down = xg;
    up.data()[flat] += eps;
    down.data()[flat] -= eps;
    const double fd = (serial(up, gg) - serial(down, gg)) / (2 * eps);
    if (std::abs(fd - dxg.data()[flat]) > 1e-6 * (1 + std::abs(fd))) return what.str() + "dx differs from central differences";
  }
  for (Eigen::Index c = 0; c < 3; ++c) {
    Eigen::Tensor<double, 1> up = gg, down = gg;
    up(c) += eps;
    down(c) -= eps;
    const double fd = (serial(xg, up) - serial(xg, down)) / (2 * eps);
    if (std::abs(fd - dgg(c)) > 1e-6 * (1 + std::abs(fd))) return what.str() + "dgamma differs from central differences";
  }
  const Eigen::Tensor<double, 1> dbg = db.gather();
  const Eigen::Tensor<double, 3> rsum = rg.sum(Eigen::array<int, 3>{0, 2, 3}).reshape(Eigen::array<Eigen::Index, 3>{3, 1, 1});
  for (Eigen::Index c = 0; c < 3; ++c)
    if (std::abs(dbg(c) - rsum(c, 0, 0)) > 1e-10 * (1 + std::abs(rsum(c, 0, 0)))) return what.str() + "dbeta is not sum(r)";
  // The module: running statistics after one training step, then evaluation with them.
  ts::nn::BatchNorm<double, M2> bn(mesh, 3, 0.1);
  (void)bn(x);
  bn.train(false);
  const Eigen::Tensor<double, 4> y_eval = bn(x).gather();
  Eigen::Tensor<double, 1> mean(3), var(3);
  const double count = double(xg.size()) / 3;
  for (Eigen::Index c = 0; c < 3; ++c) {
    double m = 0, v = 0;
    for (Eigen::Index n = 0; n < 5; ++n)
      for (Eigen::Index h = 0; h < 7; ++h)
        for (Eigen::Index w = 0; w < 4; ++w) m += xg(n, c, h, w) / count;
    for (Eigen::Index n = 0; n < 5; ++n)
      for (Eigen::Index h = 0; h < 7; ++h)
        for (Eigen::Index w = 0; w < 4; ++w) v += (xg(n, c, h, w) - m) * (xg(n, c, h, w) - m) / (count - 1);
    mean(c) = 0.1 * m;
    var(c) = 0.9 + 0.1 * v;
  }
  if (std::string e = compare(bn.running_mean().gather(), mean, 1e-12); !e.empty()) return what.str() + "running mean " + e;
  if (std::string e = compare(bn.running_var().gather(), var, 1e-12); !e.empty()) return what.str() + "running var " + e;
  Eigen::Tensor<double, 4> want(xg.dimensions());
  for (Eigen::Index i = 0; i < xg.size(); ++i) {
    const Eigen::Index c = (i / 5) % 3;
    want.data()[i] = (xg.data()[i] - mean(c)) / std::sqrt(var(c) + 1e-5);
  }
  if (std::string e = compare(y_eval, want, 1e-12); !e.empty()) return what.str() + "evaluation " + e;
  return "";
}
}  // namespace

TEST_CASE("batch_norm<1> normalises with the global batch's statistics on every split of N, H, W (cross-replica), "
          "with gradients equal to central differences, and BatchNorm keeps running statistics",
          "[halo][batch_norm]") {
  using ts::R;
  using ts::S;
  std::string fail;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto* f : {&check_batch_norm<ts::Spec<S<"x">, R, S<"y">, R>>, &check_batch_norm<ts::Spec<R, R, S<"x">, S<"y">>>,
                    &check_batch_norm<ts::Spec<S<"x", "y">, R, R, R>>, &check_batch_norm<ts::Spec<R, S<"x">, R, S<"y">>>}) {
      std::string e = f(mesh);
      if (fail.empty()) fail = e;
    }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}

// ---- pooling and upsampling ----

namespace {
enum class Pool { Max, Avg, Up };

// y and dx of L = sum(op(x) * r) by serial loops.
std::pair<Eigen::Tensor<double, 4>, Eigen::Tensor<double, 4>> pool_reference(const Eigen::Tensor<double, 4>& x, const Eigen::Tensor<double, 4>& r,
                                                                            Pool p, Eigen::Index k, Eigen::Index s) {
  const Eigen::Index N = x.dimension(0), C = x.dimension(1), H = x.dimension(2), W = x.dimension(3);
  const Eigen::Index Ho = r.dimension(2), Wo = r.dimension(3);
  Eigen::Tensor<double, 4> y(N, C, Ho, Wo), dx(x.dimensions());
  dx.setZero();
  for (Eigen::Index n = 0; n < N; ++n)
    for (Eigen::Index c = 0; c < C; ++c)
      for (Eigen::Index i = 0; i < Ho; ++i)
        for (Eigen::Index j = 0; j < Wo; ++j) {
          if (p == Pool::Up) {
            y(n, c, i, j) = x(n, c, i / k, j / k);
            dx(n, c, i / k, j / k) += r(n, c, i, j);
            continue;
          }
          double best = -1e300, sum = 0;
          Eigen::Index bh = 0, bw = 0;
          for (Eigen::Index a = 0; a < k; ++a)
            for (Eigen::Index b = 0; b < k; ++b) {
              const double v = x(n, c, s * i + a, s * j + b);
              sum += v;
              if (v > best) best = v, bh = s * i + a, bw = s * j + b;
            }
          y(n, c, i, j) = p == Pool::Max ? best : sum / double(k * k);
          if (p == Pool::Max) dx(n, c, bh, bw) += r(n, c, i, j);
          else
            for (Eigen::Index a = 0; a < k; ++a)
              for (Eigen::Index b = 0; b < k; ++b) dx(n, c, s * i + a, s * j + b) += r(n, c, i, j) / double(k * k);
        }
  (void)H;
  (void)W;
  return {y, dx};
}

template <class XS>
std::string check_pooling(M2& mesh, Pool p, Eigen::Index k, Eigen::Index s) {
  const Eigen::Index N = 2, C = 3, H = 9, W = 7;
  const Eigen::Index Ho = p == Pool::Up ? H * k : (H - k) / s + 1, Wo = p == Pool::Up ? W * k : (W - k) / s + 1;
  const auto x = ts::random<double, XS>(mesh, {N, C, H, W}, 21);
  const auto r = ts::random<double, XS>(mesh, {N, C, Ho, Wo}, 22);
  auto op = [&](const auto& v) {
    if (p == Pool::Max) return ts::nn::max_pool2d(v, k, s);
    if (p == Pool::Avg) return ts::nn::avg_pool2d(v, k, s);
    return ts::nn::upsample2d(v, k);
  };
  const auto [want_y, want_dx] = pool_reference(x.gather(), r.gather(), p, k, s);
  std::ostringstream what;
  what << "mesh " << mesh.shape().describe() << " x " << x.describe() << (p == Pool::Max ? " max" : p == Pool::Avg ? " avg" : " up")
       << " k " << k << " s " << s << ": ";
  if (std::string e = compare(op(x).gather(), want_y, 1e-12); !e.empty()) return what.str() + "y " + e;
  auto loss = [&](const auto& v) { return ts::sum<0, 1, 2, 3>(op(v) * r); };
  auto [l, dx] = ts::ad::value_and_grad(loss, x);
  if (std::string e = compare(dx.gather(), want_dx, 1e-12); !e.empty()) return what.str() + "dx " + e;
  const Eigen::Tensor<double, 4> xg = x.gather();
  const double eps = 1e-6;
  for (Eigen::Index flat : {Eigen::Index(0), Eigen::Index(61), xg.size() - 1}) {
    Eigen::Tensor<double, 4> up = xg, down = xg;
    up.data()[flat] += eps;
    down.data()[flat] -= eps;
    const double fd = (double(loss(ts::distribute<XS>(mesh, up)).gather()()) - double(loss(ts::distribute<XS>(mesh, down)).gather()())) / (2 * eps);
    if (std::abs(fd - want_dx.data()[flat]) > 1e-6 * (1 + std::abs(fd))) return what.str() + "dx differs from central differences";
  }
  return "";
}
}  // namespace

TEST_CASE("max_pool2d, avg_pool2d and upsample2d and their gradients equal serial loops and central differences, "
          "windows crossing shard borders, empty shards, every split of N, C, H, W",
          "[halo][pooling]") {
  using ts::R;
  using ts::S;
  std::string fail;
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    M2 mesh({sizes[0], sizes[1]});
    for (auto [p, k, s] : std::vector<std::tuple<Pool, Eigen::Index, Eigen::Index>>{
             {Pool::Max, 2, 2}, {Pool::Max, 3, 2}, {Pool::Avg, 2, 2}, {Pool::Avg, 3, 1}, {Pool::Up, 2, 2}, {Pool::Up, 3, 3}})
      for (auto* f : {&check_pooling<ts::Spec<S<"x">, R, S<"y">, R>>, &check_pooling<ts::Spec<R, R, S<"x">, S<"y">>>,
                      &check_pooling<ts::Spec<R, S<"x">, R, S<"y">>>, &check_pooling<ts::Spec<R, R, S<"y", "x">, R>>}) {
        std::string e = f(mesh, p, k, s);
        if (fail.empty()) fail = e;
      }
  }
  INFO(fail);
  TS_REQUIRE_ALL(fail.empty());
}
