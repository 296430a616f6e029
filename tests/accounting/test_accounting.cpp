// The bytes tshard says it moved are the bytes that reached MPI (a PMPI interposer counts
// them independently), and each kind of reshard moves its analytic amount.
#include "pmpi_counter.hpp"
#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;

namespace {

struct Moved {
  std::uint64_t tshard_sent, tshard_received, mpi_sent, mpi_received;
};

// Runs f with both counters reset and returns what each saw (no collective check inside).
template <class F>
Moved measure(F&& f) {
  ts::reset_comm_stats();
  pmpi::reset();
  f();
  const auto t = ts::comm_stats().total();
  const auto p = pmpi::counts();
  return {t.bytes_sent, t.bytes_received, p.bytes_sent, p.bytes_received};
}

std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

void require_moved(const Moved& m, std::uint64_t sent, std::uint64_t received, const std::string& what) {
  INFO(what << ": tshard counted " << m.tshard_sent << "/" << m.tshard_received << " B, MPI saw " << m.mpi_sent << "/"
            << m.mpi_received << " B, analytic " << sent << "/" << received << " B (sent/received)");
  TS_REQUIRE_ALL(m.tshard_sent == sent && m.tshard_received == received);
  TS_REQUIRE_ALL(m.mpi_sent == sent && m.mpi_received == received);
}

}  // namespace

// Valid rows of shard c when n rows are split p ways (the shard rule of docs/architecture.md, computed here).
std::uint64_t rows_of(std::uint64_t n, std::uint64_t p, std::uint64_t c) {
  const std::uint64_t b = ceil_div(n, p);
  return c * b >= n ? 0 : std::min(b, n - c * b);
}

TEST_CASE("S->R reshard sends every rank's valid shard to the others once, by one all-gather") {
  const std::uint64_t p = world_size(), me = world_rank(), n0 = 13, n1 = 5;
  ts::Mesh<"x"> mesh({-1});
  auto x = ts::random<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {13, 5}, 1);
  const auto m = measure([&] { auto r = ts::reshard<ts::Spec<ts::R, ts::R>>(x); });
  const std::uint64_t mine = rows_of(n0, p, me) * n1 * sizeof(float), all = n0 * n1 * sizeof(float);
  require_moved(m, mine * (p - 1), all - mine, "S->R");
  TS_REQUIRE_ALL(ts::comm_stats().op("reshard").calls("all_gather") == (p > 1 ? 1u : 0u));
}

TEST_CASE("R->S reshard is a local slice and moves nothing") {
  ts::Mesh<"x"> mesh({-1});
  auto x = ts::random<double, ts::Spec<ts::R, ts::R>>(mesh, {13, 5}, 2);
  const auto m = measure([&] { auto r = ts::reshard<ts::Spec<ts::R, ts::S<"x">>>(x); });
  require_moved(m, 0, 0, "R->S");
}

TEST_CASE("a split moving between dims is one all-to-all of the blocks each rank keeps") {
  const std::uint64_t p = world_size(), me = world_rank();
  ts::Mesh<"x"> mesh({-1});
  auto x = ts::random<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {13, 7}, 3);
  const auto m = measure([&] { auto r = ts::reshard<ts::Spec<ts::R, ts::S<"x">>>(x); });
  // I send my rows x rank g's columns to every g; I receive rank g's rows x my columns.
  std::uint64_t sent = 0, received = 0;
  for (std::uint64_t g = 0; g < p; ++g)
    if (g != me) {
      sent += rows_of(13, p, me) * rows_of(7, p, g) * sizeof(float);
      received += rows_of(13, p, g) * rows_of(7, p, me) * sizeof(float);
    }
  require_moved(m, sent, received, "S(0)->S(1)");
}

TEST_CASE("partial -> R is one all-reduce, partial -> S one reduce-scatter") {
  const std::uint64_t p = world_size();
  ts::Mesh<"x"> mesh({-1});
  Eigen::Tensor<double, 2> mine(13, 5);
  mine.setConstant(1.0);
  auto part = ts::from_local<ts::Spec<ts::R, ts::R>, ts::PartialSum<"x">>(mesh, {13, 5}, std::move(mine));
  const auto a = measure([&] { auto r = ts::reshard<ts::Spec<ts::R, ts::R>>(part); });
  const std::uint64_t n = 13 * 5 * sizeof(double);
  require_moved(a, 2 * n * (p - 1) / p, 2 * n * (p - 1) / p, "partial->R");
  const auto b = measure([&] { auto r = ts::reshard<ts::Spec<ts::S<"x">, ts::R>>(part); });
  // Rows split over dim 0 are strided in memory: packed into equal padded chunks of ceil(13/p) rows.
  const std::uint64_t chunk = ceil_div(13, p) * 5 * sizeof(double);
  require_moved(b, chunk * (p - 1), chunk * (p - 1), "partial->S");
  // Split over the last dim, uneven chunks are back to back and go as they are.
  const auto c = measure([&] { auto r = ts::reshard<ts::Spec<ts::R, ts::S<"x">>>(part); });
  const std::uint64_t me = world_rank(), col = 13 * sizeof(double);
  require_moved(c, (5 - rows_of(5, p, me)) * col, rows_of(5, p, me) * col * (p - 1), "partial->S(last dim)");
}

TEST_CASE("an axis-order swap is a permute: each rank sends its block to one partner") {
  for (auto sizes : mesh_shapes(world_size(), 2)) {
    ts::Mesh<"x", "y"> mesh({sizes[0], sizes[1]});
    auto x = ts::random<float, ts::Spec<ts::S<"x", "y">, ts::R>>(mesh, {23, 3}, 4);
    const auto m = measure([&] { auto r = ts::reshard<ts::Spec<ts::S<"y", "x">, ts::R>>(x); });
    // Serially: my old block index cx*b + cy; the block I need is cy*a + cx.
    const int a = sizes[0], b = sizes[1], cx = mesh.coord<"x">(), cy = mesh.coord<"y">();
    const std::int64_t k = a * b, have = cx * b + cy, need = cy * a + cx;
    auto valid = [&](std::int64_t c) { return std::uint64_t(ts::detail::shard_valid(23, k, c)) * 3 * sizeof(float); };
    // Who needs my block: the rank whose needed index equals mine.
    const std::uint64_t sent = have == need ? 0 : valid(have), received = have == need ? 0 : valid(need);
    require_moved(m, sent, received, "S<x,y>->S<y,x> on " + std::to_string(a) + "x" + std::to_string(b));
  }
}

TEST_CASE("every byte tshard counts reached MPI, chunked calls included") {
  for (ts::detail::Index limit : {ts::detail::Index(INT_MAX), ts::detail::Index(5)}) {
    ts::detail::set_collective_chunk_limit(limit);
    for (auto sizes : mesh_shapes(world_size(), 2)) {
      ts::Mesh<"x", "y"> mesh({sizes[0], sizes[1]});
      Eigen::Tensor<double, 2> g = iota_tensor<double, 2>({9, 7});
      const auto m = measure([&] {
        auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::S<"y">>>(mesh, g);
        auto a = ts::reshard<ts::Spec<ts::S<"y">, ts::S<"x">>>(x);
        auto b = ts::reshard<ts::Spec<ts::R, ts::S<"x", "y">>>(a);
        auto c = ts::reshard<ts::Spec<ts::S<"x", "y">, ts::R>>(b);
        auto s = ts::scatter<ts::Spec<ts::S<"x">, ts::R>>(mesh, g, 0);
        Eigen::Tensor<double, 2> all = c.gather(), root = s.gather(0);
        (void)ts::agree(true);
      });
      const auto calls = ts::comm_stats().total().calls;
      INFO("limit " << limit << ", mesh " << sizes[0] << "x" << sizes[1] << ": tshard " << m.tshard_sent << "/"
                    << m.tshard_received << " B, MPI " << m.mpi_sent << "/" << m.mpi_received << " B");
      TS_REQUIRE_ALL(m.tshard_sent == m.mpi_sent && m.tshard_received == m.mpi_received);
      TS_REQUIRE_ALL(calls > 0 || world_size() == 1);
    }
  }
  ts::detail::set_collective_chunk_limit(INT_MAX);
}

TEST_CASE("stats name the operator and time each collective") {
  ts::Mesh<"x"> mesh({-1});
  auto x = ts::random<float, ts::Spec<ts::S<"x">>>(mesh, {1000}, 5);
  ts::reset_comm_stats();
  auto r = ts::reshard<ts::Spec<ts::R>>(x);
  const auto& op = ts::comm_stats().op("reshard");
  const bool ok = world_size() == 1 ? op.total().calls == 0 : (op.calls("all_gather") == 1 && op.total().seconds > 0);
  TS_REQUIRE_ALL(ok);
  TS_REQUIRE_ALL(ts::comm_stats().report().find(world_size() == 1 ? "" : "reshard all_gather") != std::string::npos);
}
