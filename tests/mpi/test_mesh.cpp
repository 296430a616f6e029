// Mesh construction, its communicators, failure agreement and the buffer pool.
#include <chrono>
#include <climits>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "tshard/comm/all_reduce.hpp"
#include "tshard/comm/nonblocking.hpp"
#include "tshard/comm/profile.hpp"
#include "test_support.hpp"

namespace ts = tshard;
using namespace tshard_test;

TEST_CASE("a mesh reports sizes and coordinates in row-major order") {
  const int p = world_size();
  for (auto sizes : mesh_shapes(p, 2)) {
    ts::Mesh<"data", "model"> mesh({sizes[0], sizes[1]});
    TS_REQUIRE_ALL(mesh.size<"data">() == sizes[0] && mesh.size<"model">() == sizes[1]);
    TS_REQUIRE_ALL(mesh.coord<"data">() * sizes[1] + mesh.coord<"model">() == mesh.rank());
    TS_REQUIRE_ALL(ts::axis_size<"model">(mesh) == sizes[1] && ts::axis_coord<"data">(mesh) == mesh.coord<"data">());
    TS_REQUIRE_ALL(mesh.size() == p);
    // Sizes from a std::array, on the world or on a communicator given.
    const std::array<int, 2> held{sizes[0], sizes[1]};
    const ts::Mesh<"data", "model"> from_array(held), on_comm(MPI_COMM_WORLD, held);
    TS_REQUIRE_ALL(from_array.size<"model">() == sizes[1] && on_comm.size<"data">() == sizes[0] && on_comm.rank() == mesh.rank());
  }
}

TEST_CASE("one mesh size may be -1 and is inferred from the communicator") {
  const int p = world_size();
  ts::Mesh<"data", "model"> mesh({-1, 1});
  TS_REQUIRE_ALL(mesh.size<"data">() == p);
  ts::Mesh<"a", "b", "c"> m3({1, -1, 1});
  TS_REQUIRE_ALL(m3.size<"b">() == p);
}

TEST_CASE("mesh sizes of -1 share the ranks as MPI_Dims_create does") {
  const int p = world_size();
  ts::Mesh<"x", "y", "z"> grid({-1, -1, -1});
  int dims[3] = {0, 0, 0};
  MPI_Dims_create(p, 3, dims);
  TS_REQUIRE_ALL(grid.size<"x">() == dims[0] && grid.size<"y">() == dims[1] && grid.size<"z">() == dims[2]);
  // The rule itself, up to the 71 ranks where Open MPI's greedy choice is also the most even one.
  bool same = true;
  for (int n = 1; n <= 71; ++n)
    for (int k = 1; k <= 4; ++k) {
      std::vector<int> want(std::size_t(k), 0);
      MPI_Dims_create(n, k, want.data());
      same = same && ts::detail::balanced_factors(n, k) == want;
    }
  TS_REQUIRE_ALL(same);
}

TEST_CASE("mesh sizes that do not fit the communicator throw MeshError on every rank") {
  const int p = world_size();
  bool threw = false;
  std::string what;
  try {
    ts::Mesh<"data", "model"> mesh({p + 1, 1});
  } catch (const ts::MeshError& e) {
    threw = true;
    what = e.what();
  }
  TS_REQUIRE_ALL(threw);
  TS_REQUIRE_ALL(what.find("data=" + std::to_string(p + 1)) != std::string::npos);
  threw = false;
  try {
    ts::Mesh<"x"> mesh({-2});
  } catch (const ts::MeshError&) {
    threw = true;
  }
  TS_REQUIRE_ALL(threw);
}

TEST_CASE("a mesh can live on a sub-communicator, and meshes can follow one another") {
  const int p = world_size();
  // Split the world into halves; each half builds its own 1-D mesh.
  MPI_Comm half;
  const int color = world_rank() < (p + 1) / 2 ? 0 : 1;
  MPI_Comm_split(MPI_COMM_WORLD, color, world_rank(), &half);
  int hs = 0;
  MPI_Comm_size(half, &hs);
  {
    ts::Mesh<"x"> mesh(half, {-1});
    TS_REQUIRE_ALL(mesh.size<"x">() == hs);
    auto t = ts::from_function<double, ts::Spec<ts::S<"x">>>(mesh, {5}, [](auto i) { return double(i[0]); });
    Eigen::Tensor<double, 1> g = t.gather();
    bool ok = true;
    for (int i = 0; i < 5; ++i) ok &= g(i) == i;
    TS_REQUIRE_ALL(ok);
  }
  MPI_Comm_free(&half);
  for (int round = 0; round < 3; ++round) {
    ts::Mesh<"x", "y"> mesh({1, p});
    TS_REQUIRE_ALL(mesh.size<"y">() == p);
  }
}

TEST_CASE("group communicators rank members by the mixed radix of the listed axes") {
  const int p = world_size();
  for (auto sizes : mesh_shapes(p, 2)) {
    ts::Mesh<"x", "y"> mesh({sizes[0], sizes[1]});
    auto& st = *tshard::detail::state_of(mesh);
    MPI_Comm yx = st.group(std::vector<int>{1, 0}), x = st.group(std::vector<int>{0});
    int r_yx = -1, r_x = -1;
    MPI_Comm_rank(yx, &r_yx);
    MPI_Comm_rank(x, &r_x);
    TS_REQUIRE_ALL(r_yx == mesh.coord<"y">() * sizes[0] + mesh.coord<"x">());
    TS_REQUIRE_ALL(r_x == mesh.coord<"x">());
    // The public form: mesh.comm<"y", "x">() is the same group, and its members the same ranks.
    MPI_Comm pub = mesh.comm<"y", "x">(), line = mesh.comm<"y">();
    int r_pub = -1, n_line = 0, r_line = -1;
    MPI_Comm_rank(pub, &r_pub);
    MPI_Comm_size(line, &n_line);
    MPI_Comm_rank(line, &r_line);
    TS_REQUIRE_ALL(r_pub == r_yx);
    TS_REQUIRE_ALL(n_line == mesh.size<"y">());
    TS_REQUIRE_ALL(r_line == mesh.coord<"y">());
  }
}

TEST_CASE("agree is true only when every rank says so") {
  TS_REQUIRE_ALL(ts::agree(true));
  const bool all = ts::agree(world_rank() != world_size() - 1);
  TS_REQUIRE_ALL(!all);
}

TEST_CASE("a rank-local failure agreed on becomes the same exception on every rank") {
  bool threw = false;
  try {
    ts::detail::throw_unless_all<ts::IoError>(world_rank() != 0, MPI_COMM_WORLD, "tshard::test: rank 0 failed");
  } catch (const ts::IoError& e) {
    threw = std::string(e.what()).find("rank 0 failed") != std::string::npos;
  }
  TS_REQUIRE_ALL(threw);
}

TEST_CASE("the buffer pool hands freed buffers out again instead of allocating") {
  auto& pool = ts::detail::buffer_pool();
  void* a = pool.acquire(1 << 20);
  pool.release(a);
  const auto before = ts::pool_stats();
  for (int i = 0; i < 100; ++i) {
    void* b = pool.acquire(1 << 20);
    pool.release(b);
  }
  const auto after = ts::pool_stats();
  TS_REQUIRE_ALL(after.fresh_allocations == before.fresh_allocations);
  TS_REQUIRE_ALL(after.reuses == before.reuses + 100);
}

namespace {
// f(group, p, r, limit) on groups of each size (ranks 0..size-1 in groups of `size`, the rest
// alone; p and r the group's size and this rank's place) under each collective chunk limit:
// whole, and 3 elements (several chunks, each a strided block).
template <class F>
void on_groups_and_chunk_limits(std::initializer_list<int> sizes, F&& f) {
  const int world = world_size(), me = world_rank();
  for (int size : sizes) {
    if (size > world) continue;
    MPI_Comm group;
    const int color = me < (world / size) * size ? me / size : world + me;
    MPI_Comm_split(MPI_COMM_WORLD, color, me, &group);
    for (ts::detail::Index limit : {ts::detail::Index(INT_MAX), ts::detail::Index(3)}) {
      ts::detail::set_collective_chunk_limit(limit);
      f(group, ts::detail::comm_size(group), ts::detail::comm_rank(group), limit);
    }
    ts::detail::set_collective_chunk_limit(INT_MAX);
    MPI_Comm_free(&group);
  }
}
}  // namespace

// tshard's own reduce-scatter sums the contributions to rank r's block in a ring's order,
// r+1, r+2, ..., r-1 and r last: on every group size the result is that serial sum to the bit,
// blocking or not, chunked or not, in one segment or several, and on pairs it is MPI's.
TEST_CASE("reduce-scatter, blocking and non-blocking, equals the serial sum in the ring's order to the bit on groups "
          "of every size, and MPI's on pairs", "[comm]") {
  on_groups_and_chunk_limits({1, 2, 3, 4}, [](MPI_Comm group, int p, int r, ts::detail::Index limit) {
    // 7 elements a block, and (unchunked) two segments and a bit
    for (ts::detail::Index n : {ts::detail::Index(7), 2 * ts::detail::reduction_segment<double>() + 5}) {
      if (n > 7 && limit != INT_MAX) continue;
      const auto m = static_cast<std::size_t>(n);
      const auto value = [&](int q, ts::detail::Index i) { return 0.1 * double(i) + 1.0 / double(3 + q) + 1e-3 * q * double(i); };
      std::vector<double> send(m * std::size_t(p)), want(m), max_want(m, -1e300);
      for (ts::detail::Index i = 0; i < n * p; ++i) send[std::size_t(i)] = value(r, i);
      for (int d = 1; d <= p; ++d) {
        const int q = (r + d) % p;  // r + 1 first, r itself last
        for (ts::detail::Index i = 0; i < n; ++i) {
          const double v = value(q, r * n + i);
          want[std::size_t(i)] = d == 1 ? v : want[std::size_t(i)] + v;
          max_want[std::size_t(i)] = std::max(max_want[std::size_t(i)], v);
        }
      }
      std::vector<double> got(m), got_max(m), mpi(m), later(m);
      ts::detail::reduce_scatter_block(group, send.data(), got.data(), n, ts::ReduceOp::Sum);
      ts::detail::reduce_scatter_block(group, send.data(), got_max.data(), n, ts::ReduceOp::Max);
      MPI_Reduce_scatter_block(send.data(), mpi.data(), int(n), MPI_DOUBLE, MPI_SUM, group);
      {
        ts::detail::PendingCollective<double> pending;
        pending.start_reduce_scatter(group, send.data(), later.data(), n);
        TS_REQUIRE_ALL(pending.in_flight() == (p > 1));
        while (!pending.test()) {
        }
        pending.wait();
      }
      INFO("group of " << p << ", block of " << n << ", chunk limit " << limit);
      TS_REQUIRE_ALL(got == want && later == want && got_max == max_want);
      // (every rank checks together: groups of other sizes run beside this one)
      TS_REQUIRE_ALL(p > 2 || got == mpi);  // a op b is b op a
      bool near_mpi = true;  // MPI's own order differs from this one at rounding level only
      for (std::size_t k = 0; k < m; ++k) near_mpi &= std::abs(mpi[k] - want[k]) <= 1e-12 * std::abs(want[k]);
      TS_REQUIRE_ALL(near_mpi);
    }
  });
}

// One rank holds 1 and the others 2^-8 each: rounded once, the bfloat16 sum is 1 + (p - 1) 2^-8
// to bfloat16's 8 bits. Rounded after every pair, as a pairwise MPI op does, it would depend on
// the order: 1 + 2^-8 rounds back to 1 (a tie, to even).
TEST_CASE("a bfloat16 reduce-scatter, blocking and non-blocking, sums in float and rounds once", "[comm]") {
  on_groups_and_chunk_limits({1, 2, 3, 4}, [](MPI_Comm group, int p, int r, ts::detail::Index limit) {
    const ts::detail::Index n = 5;
    const float tiny = 1.0f / 256;
    const std::vector<ts::bfloat16> send(std::size_t(n * p), ts::bfloat16(r == 0 ? 1.0f : tiny));
    std::vector<ts::bfloat16> got(static_cast<std::size_t>(n)), later(static_cast<std::size_t>(n));
    ts::detail::reduce_scatter_block(group, send.data(), got.data(), n, ts::ReduceOp::Sum);
    {
      ts::detail::PendingCollective<ts::bfloat16> pending;
      pending.start_reduce_scatter(group, send.data(), later.data(), n);
      pending.wait();
    }
    INFO("group of " << p << ", chunk limit " << limit);
    const ts::bfloat16 want(1.0f + float(p - 1) * tiny);
    bool ok = true;
    for (std::size_t i = 0; i < std::size_t(n); ++i) ok &= float(got[i]) == float(want) && float(later[i]) == float(want);
    TS_REQUIRE_ALL(ok);
    TS_REQUIRE_ALL(p < 3 || float(want) > 1.0f);  // the case where rounding once differs
  });
}

TEST_CASE("a non-blocking all-gather (ZeRO-3's prefetch) equals the blocking one on groups of every size, in chunks too",
          "[comm]") {
  on_groups_and_chunk_limits({1, 2, 3, 4}, [](MPI_Comm group, int p, int r, ts::detail::Index limit) {
    const ts::detail::Index n = 7;
    std::vector<double> send(static_cast<std::size_t>(n)), want(static_cast<std::size_t>(n * p));
    for (ts::detail::Index i = 0; i < n; ++i) send[std::size_t(i)] = 0.5 * double(i) + 100.0 * r + 1.0 / 3;
    for (int q = 0; q < p; ++q)
      for (ts::detail::Index i = 0; i < n; ++i) want[std::size_t(q * n + i)] = 0.5 * double(i) + 100.0 * q + 1.0 / 3;
    std::vector<double> blocking(want.size()), later(want.size(), -1.0);
    ts::detail::all_gather(group, send.data(), n, blocking.data());
    {
      ts::detail::PendingCollective<double> pending;
      pending.start_all_gather(group, send.data(), n, later.data());
      TS_REQUIRE_ALL(pending.in_flight() == (p > 1));
      pending.wait();
      TS_REQUIRE_ALL(!pending.in_flight());
    }
    INFO("group of " << p << ", chunk limit " << limit);
    TS_REQUIRE_ALL(blocking == want && later == want);
  });
}

// Run only on purpose (hidden tag): rank 1 fails a plain REQUIRE and leaves the others waiting in
// a barrier; the watchdog must end the job. Driven by tests/scripts/expect_quick_failure.cmake.
// tshard's all-reduce (the reduce-scatter exchange in place, each segment gathered as soon as it
// is summed): element i is the serial sum in its owner's ring order, r + 1, ..., r - 1, r last,
// to the bit and the same on every rank, for blocks that do not divide, fewer elements than
// ranks, one segment or many and chunked calls; on pairs it is MPI's.
TEST_CASE("the exchange all-reduce equals the serial sum in the ring's order to the bit on groups of every size, and "
          "MPI's on pairs", "[comm]") {
  using ts::detail::Index;
  on_groups_and_chunk_limits({1, 2, 3, 4}, [](MPI_Comm group, int p, int r, Index limit) {
    const auto value = [](int q, Index i) { return 0.1 * double(i) + 1.0 / double(3 + q) + 1e-3 * q * double(i); };
    for (Index n : {Index(0), Index(2), Index(23)})
      for (Index segment : {Index(0), Index(1), Index(4)}) {
        const ts::detail::Blocks blocks(n, p);
        const auto m = static_cast<std::size_t>(n);
        std::vector<double> data(m), want(m), mpi(m);
        for (Index i = 0; i < n; ++i) data[std::size_t(i)] = value(r, i);
        for (Index i = 0; i < n; ++i) {
          const int owner = int(i / blocks.size);
          for (int d = 1; d <= p; ++d)
            want[std::size_t(i)] = d == 1 ? value((owner + d) % p, i) : want[std::size_t(i)] + value((owner + d) % p, i);
        }
        MPI_Allreduce(data.data(), mpi.data(), int(n), MPI_DOUBLE, MPI_SUM, group);
        ts::detail::exchange_all_reduce(group, data.data(), n, segment);
        INFO("group of " << p << ", " << n << " elements, segment " << segment << ", chunk limit " << limit);
        TS_REQUIRE_ALL(data == want);
        TS_REQUIRE_ALL(p > 2 || data == mpi);
      }
  });
}

namespace {
// Whole numbers sum exactly in any order: the two-level all-reduce and reduce-scatter over g
// must give the flat ones to the bit, on every rank, blocks dividing or not.
bool two_levels_equal_flat(MPI_Comm comm, const ts::detail::NodeGroups& g) {
  using ts::detail::Index;
  const int p = ts::detail::comm_size(comm), r = ts::detail::comm_rank(comm);
  bool ok = true;
  for (Index n : {Index(1), Index(12), Index(37)}) {
    const auto m = static_cast<std::size_t>(n);
    std::vector<double> data(m), want(m), send(m * std::size_t(p)), got(m), flat(m);
    for (Index i = 0; i < n; ++i) data[std::size_t(i)] = double((r + 1) * (i + 3) % 17);
    for (Index i = 0; i < n * p; ++i) send[std::size_t(i)] = double((r + 2) * (i + 1) % 13);
    MPI_Allreduce(data.data(), want.data(), int(n), MPI_DOUBLE, MPI_SUM, comm);
    ts::detail::two_level_all_reduce(comm, g, data.data(), n);
    ts::detail::reduce_scatter_block(comm, send.data(), flat.data(), n, ts::ReduceOp::Sum);
    ts::detail::two_level_reduce_scatter(comm, g, send.data(), got.data(), n);
    ok = ok && data == want && got == flat;
    // In flight (the optimizer's overlapped buckets): two all-reduces and a reduce-scatter
    // started together, moved along in an order of each rank's own, give the blocking bits.
    std::vector<double> a(m), b(m), blocking_a(m), blocking_b(m), scattered(m), blocking_scattered(m);
    for (Index i = 0; i < n; ++i) {
      a[std::size_t(i)] = blocking_a[std::size_t(i)] = 1.0 / double(3 + r + i);
      b[std::size_t(i)] = blocking_b[std::size_t(i)] = 0.1 * double(i) - 1.0 / double(7 + r);
    }
    for (auto& v : send) v = v / 3.0 + 0.01 * r;
    ts::detail::two_level_all_reduce(comm, g, blocking_a.data(), n);
    ts::detail::two_level_all_reduce(comm, g, blocking_b.data(), n);
    ts::detail::two_level_reduce_scatter(comm, g, send.data(), blocking_scattered.data(), n);
    std::shared_ptr<const ts::detail::NodeGroups> groups(&g, [](const ts::detail::NodeGroups*) {});
    std::unique_ptr<ts::detail::PendingSequence<double>> pending[3] = {
        ts::detail::start_two_level_all_reduce(comm, groups, a.data(), n),
        ts::detail::start_two_level_reduce_scatter(comm, groups, send.data(), scattered.data(), n),
        ts::detail::start_two_level_all_reduce(comm, groups, b.data(), n)};
    for (int round = 0; round < 4; ++round)
      for (int k = 0; k < 3; ++k) pending[(k + r) % 3]->test();
    for (int k = 0; k < 3; ++k) pending[(3 - k + r) % 3]->wait();
    ok = ok && a == blocking_a && b == blocking_b && scattered == blocking_scattered;
  }
  return ok;
}
}  // namespace

// The non-blocking exchange all-reduce (the optimizer's overlapped buckets, each held in a
// PendingSequence): three in flight on one communicator, tested and completed in an order of
// each rank's own, give the blocking form's bits: their messages never match another's, and
// waiting for one moves the others (their second phases start only when tested).
TEST_CASE("non-blocking exchange all-reduces in flight together complete in any order with the blocking bits", "[comm]") {
  using ts::detail::Index;
  on_groups_and_chunk_limits({1, 2, 3, 4}, [](MPI_Comm group, int p, int r, Index limit) {
    const Index sizes[3] = {23, 2, 40};
    std::vector<std::vector<double>> got(3), want(3);
    for (int k = 0; k < 3; ++k) {
      for (Index i = 0; i < sizes[k]; ++i) got[std::size_t(k)].push_back(0.1 * double(i) + 1.0 / double(3 + r + k));
      want[std::size_t(k)] = got[std::size_t(k)];
      ts::detail::exchange_all_reduce(group, want[std::size_t(k)].data(), sizes[k]);
    }
    using Sequence = ts::detail::PendingSequence<double>;
    std::vector<std::unique_ptr<Sequence>> pending;
    for (int k = 0; k < 3; ++k)
      pending.push_back(std::make_unique<Sequence>(std::vector<Sequence::Step>{
          [&, k](ts::detail::PendingCollective<double>& c) { c.start_exchange_all_reduce(group, got[std::size_t(k)].data(), sizes[k]); }}));
    for (int round = 0; round < 3; ++round)  // each rank tests them in its own rotation
      for (int k = 0; k < 3; ++k) pending[std::size_t((k + r) % 3)]->test();
    for (int k = 0; k < 3; ++k) pending[std::size_t((3 - k + r) % 3)]->wait();
    INFO("group of " << p << ", chunk limit " << limit);
    TS_REQUIRE_ALL(got == want);
  });
}

// Two levels over nodes made by TSHARD_RANKS_PER_NODE on this one machine: where every node has
// the same number of ranks (more than one, on more than one node) the all-reduce and ZeRO's
// reduce-scatter run in two levels, with the communicator's ranks node by node or interleaved
// over the nodes (as a round-robin placement makes them).
TEST_CASE("two-level all-reduce and reduce-scatter over nodes of equal size equal the flat ones", "[comm]") {
  const int world = world_size(), me = world_rank();
  for (int per_node : {1, 2, 3})
    for (bool interleaved : {false, true}) {
      MPI_Comm comm;  // interleaved: the even world ranks first, then the odd ones
      MPI_Comm_split(MPI_COMM_WORLD, 0, interleaved ? (me % 2) * world + me : me, &comm);
      setenv("TSHARD_RANKS_PER_NODE", std::to_string(per_node).c_str(), 1);
      const auto g = ts::detail::split_by_node(comm);
      unsetenv("TSHARD_RANKS_PER_NODE");
      INFO(world << " ranks, " << per_node << " a node, interleaved " << interleaved);
      TS_REQUIRE_ALL(g->usable == (per_node > 1 && world > per_node && world % per_node == 0));
      TS_REQUIRE_ALL(two_levels_equal_flat(comm, *g));
      // The bytes each rank moves are the cost model's (blocks dividing evenly).
      std::vector<double> x(std::size_t(24 * world), 1.0);
      ts::reset_comm_stats();
      ts::detail::two_level_all_reduce(comm, *g, x.data(), ts::detail::Index(x.size()));
      const std::uint64_t bytes = x.size() * sizeof(double);  // (flat where the nodes are uneven)
      const auto want = g->usable ? ts::detail::two_level_all_reduce_traffic(bytes, g->nodes, g->per_node)
                                  : ts::detail::TwoLevelTraffic{{}, ts::detail::all_reduce_traffic(bytes, world)};
      const auto moved = ts::comm_stats().total();
      TS_REQUIRE_ALL(moved.bytes_sent == want.node.bytes_sent + want.network.bytes_sent &&
                     moved.bytes_received == want.node.bytes_received + want.network.bytes_received);
      MPI_Comm_free(&comm);
    }
}

// The nodes MPI sees (shared memory): one on this machine; scripts/two_hosts.sh runs this over
// two network namespaces with its ranks placed round-robin and says TSHARD_TEST_NODES=2.
TEST_CASE("the split by shared memory finds the nodes, and two levels over them equal the flat sums", "[comm][nodes]") {
  const auto g = ts::detail::split_by_node(MPI_COMM_WORLD);
  const char* nodes = std::getenv("TSHARD_TEST_NODES");
  INFO(g->nodes << " node(s) of " << g->per_node << " found");
  TS_REQUIRE_ALL(g->nodes == (nodes ? std::atoi(nodes) : 1));
  TS_REQUIRE_ALL(two_levels_equal_flat(MPI_COMM_WORLD, *g));
}

// The node communicator is a context of its own: a message on it and one on its parent, between
// the same two ranks under the same tag, each reach the receive posted on its own communicator,
// whichever is posted first. (SMPI's shared-memory communicators match any communicator's.)
TEST_CASE("messages of the node communicator and of its parent do not meet", "[comm][nodes]") {
  const auto g = ts::detail::split_by_node(MPI_COMM_WORLD);
  const int l = ts::detail::comm_size(g->node);
  if (l == 1) return;  // (one rank a node: no peer to send to)
  const int me = ts::detail::comm_rank(g->node), to = (me + 1) % l, from = (me + l - 1) % l;
  int to_world = 0, from_world = 0;
  MPI_Group node, world;
  MPI_Comm_group(g->node, &node);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  MPI_Group_translate_ranks(node, 1, &to, world, &to_world);
  MPI_Group_translate_ranks(node, 1, &from, world, &from_world);
  MPI_Group_free(&node);
  MPI_Group_free(&world);
  const int tag = 0x6000;
  std::vector<double> on_node(8, 1.0 + me), on_world(3, -1.0 - me), got_node(8), got_world(3);
  MPI_Request r[4];
  MPI_Isend(on_node.data(), 8, MPI_DOUBLE, to, tag, g->node, &r[0]);  // the node's first
  MPI_Isend(on_world.data(), 3, MPI_DOUBLE, to_world, tag, MPI_COMM_WORLD, &r[1]);
  MPI_Irecv(got_world.data(), 3, MPI_DOUBLE, from_world, tag, MPI_COMM_WORLD, &r[2]);  // the parent's first
  MPI_Irecv(got_node.data(), 8, MPI_DOUBLE, from, tag, g->node, &r[3]);
  MPI_Waitall(4, r, MPI_STATUSES_IGNORE);
  TS_REQUIRE_ALL(got_node == std::vector<double>(8, 1.0 + from) && got_world == std::vector<double>(3, -1.0 - from));
}

// Rank r computes (sleeps) 40 r ms, then every rank joins an all-reduce: by the arrival times,
// rank r waited about 40 (p - 1 - r) ms for the last one, which waited for nobody; the rest of
// the collective is moving bytes, and the three parts add up to the step. (Wide margins: the
// ranks share 2 cores.)
TEST_CASE("the step profiler tells computing, waiting for the slowest rank and moving bytes apart by arrival times",
          "[comm]") {
  const int p = world_size(), r = world_rank();
  ts::StepProfiler profile(MPI_COMM_WORLD);
  for (int step = 0; step < 2; ++step) {
    profile.begin_step();
    std::this_thread::sleep_for(std::chrono::milliseconds(40 * r));
    std::vector<double> x(1000, 1.0), y(1000);
    ts::detail::all_reduce(MPI_COMM_WORLD, x.data(), y.data(), 1000, ts::ReduceOp::Sum);
    const ts::StepTimes t = profile.end_step();
    const double wait = 0.040 * (p - 1 - r);
    INFO("rank " << r << ": compute " << t.mine.compute << " s, skew " << t.mine.skew << " s, transfer " << t.mine.transfer);
    TS_REQUIRE_ALL(std::abs(t.mine.skew - wait) < 0.025 && t.mine.compute > 0.040 * r - 0.005 && t.mine.transfer < 0.025);
    TS_REQUIRE_ALL(std::abs(t.mine.compute + t.mine.skew + t.mine.transfer - t.seconds) < 1e-9 && t.ranks == p);
    TS_REQUIRE_ALL(t.min.skew <= t.median.skew && t.median.skew <= t.max.skew && t.min.skew < 0.025);
  }
}

TEST_CASE("one rank fails while the others wait in a collective", "[.failure][watchdog]") {
  if (world_rank() == 1 % world_size()) REQUIRE(false);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Hidden: the same failure through a collective check ends at once on every rank.
TEST_CASE("one rank fails a collective check", "[.failure][agree]") {
  TS_REQUIRE_ALL(world_rank() != world_size() - 1);
  MPI_Barrier(MPI_COMM_WORLD);
}

// Hidden: an uncaught exception on one rank aborts the job through the terminate handler.
TEST_CASE("one rank throws outside any test framework", "[.failure][terminate]") {
  if (world_rank() == 0) {
    std::thread([] { throw std::runtime_error("deliberate failure on rank 0"); }).join();
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("host collectives combine a value or a span over the mesh or a line of it, and count their bytes",
          "[mesh][host]") {
  const int p = world_size(), me = world_rank();
  for (auto sizes : mesh_shapes(p, 2)) {
    ts::Mesh<"x", "y"> mesh({sizes[0], sizes[1]});
    CHECK(mesh.shape()[0] == sizes[0]);
    CHECK(mesh.shape()[1] == sizes[1]);
    CHECK_THROWS(mesh.shape()[2]);
    ts::reset_comm_stats();
    CHECK(ts::all_reduce(mesh, me + 1) == p * (p + 1) / 2);
    CHECK(ts::all_reduce(mesh, double(me), ts::ReduceOp::Max) == double(p - 1));
    const int cy = mesh.coord<"y">(), cx = mesh.coord<"x">();
    // Along "y": the ranks that share this rank's x coordinate.
    CHECK(ts::all_reduce<"y">(mesh, std::int64_t(cy)) == std::int64_t(sizes[1] * (sizes[1] - 1) / 2));
    std::vector<double> v{double(cx), 1.0, double(me)};
    ts::all_reduce<"x">(mesh, std::span<double>(v));
    CHECK(v[0] == double(sizes[0] * (sizes[0] - 1) / 2));
    CHECK(v[1] == double(sizes[0]));
    CHECK(ts::broadcast<"x">(mesh, cx * 10 + 7, 0) == 7);
    std::vector<float> b{float(me), float(me) + 0.5f};
    ts::broadcast(mesh, std::span<float>(b), p - 1);
    CHECK(b == std::vector<float>{float(p - 1), float(p - 1) + 0.5f});
    const auto all = ts::gather(mesh, me * 2);
    REQUIRE(int(all.size()) == p);
    for (int r = 0; r < p; ++r) CHECK(all[std::size_t(r)] == 2 * r);
    const std::vector<double> mine{double(cy), double(cy) * 3};
    const auto line = ts::gather<"y">(mesh, std::span<const double>(mine));  // two per rank, in line order
    REQUIRE(int(line.size()) == 2 * sizes[1]);
    for (int r = 0; r < sizes[1]; ++r) {
      CHECK(line[std::size_t(2 * r)] == double(r));
      CHECK(line[std::size_t(2 * r + 1)] == double(3 * r));
    }
    ts::barrier(mesh);
    if (p > 1) CHECK(ts::comm_stats().op("user").total().calls >= 5);  // counted, under the user's scope (those over the whole mesh)
  }
}

TEST_CASE("a span gather with unequal counts is an error on every rank, and a line's ranks exchange values",
          "[mesh][host]") {
  const int p = world_size(), me = world_rank();
  ts::Mesh<"stage"> mesh({p});
  const std::vector<int> mine(std::size_t(me == 0 ? 2 : 1), me);
  if (p > 1)
    CHECK_THROWS_WITH(ts::gather(mesh, std::span<const int>(mine)),
                      Catch::Contains("tshard::gather: every rank must give as many values"));
  // Each stage sends to the next one: what a pipeline's sampling does with a token.
  std::vector<std::int64_t> got(3, -1);
  const std::vector<std::int64_t> sent{me, 2 * me, 3 * me};
  if (me + 1 < p) ts::send<"stage">(mesh, std::span<const std::int64_t>(sent), me + 1);
  if (me > 0) {
    ts::receive<"stage">(mesh, std::span<std::int64_t>(got), me - 1);
    CHECK(got == std::vector<std::int64_t>{me - 1, 2 * (me - 1), 3 * (me - 1)});
  }
}
