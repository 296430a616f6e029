// Core arithmetic without MPI: rank <-> coordinates, size inference, shard arithmetic,
// descriptors, the box iterator, halo geometry, the reshard planner's choices, a tokenizer built
// without PCRE2, and the CPU's instruction-set level.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <algorithm>
#include <fstream>
#include <numeric>
#include <random>

#include "tshard/core/box_copy.hpp"
#include "tshard/core/cpu_capability.hpp"
#include "tshard/core/box_iterator.hpp"
#include "tshard/core/halo_geometry.hpp"
#include "tshard/core/layout_cache.hpp"
#include "tshard/core/mesh_shape.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/core/spec.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/core/spec_descriptor.hpp"
#include "tshard/io/npy_format.hpp"
#include "tshard/io/safetensors_format.hpp"
#include "tshard/reshard/plan.hpp"
#include "tshard/train/tokenizer.hpp"

using namespace tshard::detail;
namespace ts = tshard;

static MeshShape mesh_of(std::vector<int> sizes) {
  MeshShape m;
  m.sizes = sizes;
  const char* names[] = {"x", "y", "z", "w"};
  for (std::size_t a = 0; a < sizes.size(); ++a) m.names.push_back(names[a]);
  return m;
}

TEST_CASE("mesh coordinates are row-major with the last axis fastest") {
  MeshShape m = mesh_of({2, 3, 4});
  REQUIRE(m.size() == 24);
  auto c = m.coords_of(0 * 12 + 2 * 4 + 3);
  REQUIRE((c[0] == 0 && c[1] == 2 && c[2] == 3));
  for (int r = 0; r < m.size(); ++r) REQUIRE(m.rank_of(m.coords_of(r)) == r);
  c = m.coords_of(13);  // 1*12 + 0*4 + 1
  REQUIRE((c[0] == 1 && c[1] == 0 && c[2] == 1));
}

TEST_CASE("layout keys: equal questions hash alike, any differing field makes another question, and the cache "
          "answers each once") {
  constexpr std::array<std::string_view, 2> axes{"data", "model"};
  constexpr SpecDesc rows = make_desc<ts::Spec<ts::S<"data">, ts::R>, ts::NoPartial>(axes);
  constexpr SpecDesc cols = make_desc<ts::Spec<ts::R, ts::S<"model", "data">>, ts::NoPartial>(axes);
  constexpr SpecDesc partial = make_desc<ts::Spec<ts::S<"data">, ts::R>, ts::PartialSum<"model">>(axes);
  auto key = [&](std::vector<int> sizes) {
    LayoutKey k(mesh_of(sizes));
    k.from = rows;
    k.to = cols;
    k.from_shape = {7, 5};
    k.element_bytes = 4;
    return k;
  };
  const LayoutKey a = key({2, 3});
  LayoutKey renamed(mesh_of({2, 3}));
  renamed = a;  // the axis names never enter: specs name axes by index
  REQUIRE((a == renamed && LayoutKeyHash{}(a) == LayoutKeyHash{}(renamed)));
  std::vector<LayoutKey> others(8, a);
  others[0] = key({3, 2});
  others[1].to = partial;
  others[2].from = cols;
  others[3].from_shape = {5, 7};
  others[4].element_bytes = 8;
  others[5].rank = 1;
  others[6].shift = {1, 0};
  others[7].to_shape = {7, 5};
  for (const auto& o : others) REQUIRE_FALSE(o == a);
  // A spec's unused dims and a split's unused axes do not enter its hash or its equality.
  LayoutKey junk = a;
  junk.from.dims[5].axes[3] = 1;
  REQUIRE((junk == a && LayoutKeyHash{}(junk) == LayoutKeyHash{}(a)));
  LayoutCache<int> cache;
  int made = 0;
  for (int i = 0; i < 3; ++i) REQUIRE(cache.answer(a, [&] { return ++made; }) == 1);
  REQUIRE(cache.answer(others[3], [&] { return ++made; }) == 2);
  REQUIRE((made == 2 && cache.size() == 2));
  for (Index n = 0; n < Index(LayoutCache<int>::kLimit) + 10; ++n) {  // bounded: starts over
    LayoutKey k = a;
    k.from_shape[0] = 100 + n;
    cache.answer(k, [] { return 0; });
  }
  REQUIRE(cache.size() <= LayoutCache<int>::kLimit);
}

TEST_CASE("error text is made only when an error is thrown") {
  int made = 0;
  auto describe = [&] {
    ++made;
    return std::string("[7, 5] {x, R}");
  };
  auto check = [](bool ok, Text what) {
    if (!ok) throw ts::ShapeError("bad: " + what.str());
  };
  check(true, describe);
  REQUIRE(made == 0);
  REQUIRE_THROWS_WITH(check(false, describe), "bad: [7, 5] {x, R}");
  REQUIRE(made == 1);
  REQUIRE_THROWS_WITH(check(false, "plain"), "bad: plain");
  REQUIRE_THROWS_WITH(check(false, std::string("a ") + "string"), "bad: a string");
}

TEST_CASE("mesh sizes of -1 are inferred, balanced as MPI_Dims_create does, and sizes that do not fit throw MeshError") {
  std::vector<std::string> n{"data", "model"};
  REQUIRE(infer_mesh_sizes({-1, 2}, 6, n) == std::vector<int>{3, 2});
  REQUIRE(infer_mesh_sizes({3, -1}, 6, n) == std::vector<int>{3, 2});
  REQUIRE(infer_mesh_sizes({2, 3}, 6, n) == std::vector<int>{2, 3});
  REQUIRE_THROWS_AS(infer_mesh_sizes({2, 2}, 6, n), ts::MeshError);
  REQUIRE_THROWS_AS(infer_mesh_sizes({-1, 4}, 6, n), ts::MeshError);
  REQUIRE(infer_mesh_sizes({-1, -1}, 6, n) == std::vector<int>{3, 2});
  REQUIRE(infer_mesh_sizes({-1, -1}, 7, n) == std::vector<int>{7, 1});
  REQUIRE(infer_mesh_sizes({-1, 3, -1}, 12, {"a", "b", "c"}) == std::vector<int>{2, 3, 2});
  REQUIRE(ts::detail::balanced_factors(16, 3) == std::vector<int>{4, 2, 2});
  REQUIRE(ts::detail::balanced_factors(1024, 3) == std::vector<int>{16, 8, 8});
  REQUIRE(ts::detail::balanced_factors(1, 2) == std::vector<int>{1, 1});
  REQUIRE(ts::detail::balanced_factors(72, 2) == std::vector<int>{9, 8});  // Open MPI's greedy: 12 x 6
  for (int p = 1; p <= 1000; ++p) {  // over two axes: the largest divisor at or under sqrt(p)
    int d = 1;
    for (int f = 1; f * f <= p; ++f)
      if (p % f == 0) d = f;
    REQUIRE(ts::detail::balanced_factors(p, 2) == std::vector<int>{p / d, d});
  }
  REQUIRE_THROWS_AS(infer_mesh_sizes({-1, 4}, 6, n), ts::MeshError);
  REQUIRE_THROWS_AS(infer_mesh_sizes({0, 6}, 6, n), ts::MeshError);
  REQUIRE_THROWS_WITH(infer_mesh_sizes({2, 2}, 6, n), Catch::Contains("data=2") && Catch::Contains("6 ranks"));
}

TEST_CASE("shards follow ceil padding: offset min(c*b, N), valid clamp(N - c*b, 0, b)") {
  // N = 10 over 4: b = 3, shards 3,3,3,1.
  REQUIRE(padded_extent(10, 4) == 3);
  Index valid[] = {3, 3, 3, 1}, off[] = {0, 3, 6, 9};
  for (int c = 0; c < 4; ++c) {
    REQUIRE(shard_offset(10, 4, c) == off[c]);
    REQUIRE(shard_valid(10, 4, c) == valid[c]);
  }
  // N = 5 over 4: b = 2, shards 2,2,1,0 (the last is empty, its offset clamps to N).
  REQUIRE(shard_valid(5, 4, 3) == 0);
  REQUIRE(shard_offset(5, 4, 3) == 5);
  // Dims smaller than the split: N = 2 over 6 gives 1,1,0,0,0,0.
  for (int c = 0; c < 6; ++c) REQUIRE(shard_valid(2, 6, c) == (c < 2 ? 1 : 0));
  // N = 0: every shard empty, buffers of size 0.
  REQUIRE(padded_extent(0, 3) == 0);
  REQUIRE(shard_valid(0, 3, 1) == 0);
  // Unsplit: the whole dim.
  REQUIRE(padded_extent(7, 1) == 7);
}

TEST_CASE("shards tile every dim exactly once for all sizes and split counts") {
  for (Index n = 0; n <= 40; ++n)
    for (Index k = 1; k <= 12; ++k) {
      Index covered = 0;
      for (Index c = 0; c < k; ++c) {
        REQUIRE(shard_offset(n, k, c) == std::min(covered, n));
        covered += shard_valid(n, k, c);
        REQUIRE(shard_valid(n, k, c) <= padded_extent(n, k));
      }
      REQUIRE(covered == n);
    }
}

TEST_CASE("multi-axis splits use the mixed radix of the axes, first axis major") {
  MeshShape m = mesh_of({2, 3});
  DimSplit xy, yx;
  xy.push(0);
  xy.push(1);
  yx.push(1);
  yx.push(0);
  auto c = m.coords_of(4);  // x=1, y=1
  REQUIRE(split_coord(xy, m, c) == 1 * 3 + 1);
  REQUIRE(split_coord(yx, m, c) == 1 * 2 + 1);
  REQUIRE(split_parts(xy, m) == 6);
}

TEST_CASE("spec types become descriptors with readable names") {
  constexpr std::array<std::string_view, 2> axes{"data", "model"};
  using X = ts::Spec<ts::S<"data">, ts::R>;
  constexpr SpecDesc d = make_desc<X, ts::NoPartial>(axes);
  static_assert(d.rank == 2 && d.dims[0].count == 1 && d.dims[0][0] == 0 && d.dims[1].count == 0);
  MeshShape m = mesh_of({2, 2});
  m.names = {"data", "model"};
  REQUIRE(d.to_string(m) == "{data, R}");
  using Y = ts::Spec<ts::R, ts::S<"model", "data">>;
  constexpr SpecDesc f = make_desc<Y, ts::NoPartial>(axes);
  REQUIRE(f.to_string(m) == "{R, (model,data)}");
  constexpr SpecDesc g = make_desc<ts::Spec<ts::R>, ts::PartialMax<"data", "model">>(axes);
  REQUIRE(g.to_string(m) == "{R} partial-max(data,model)");
  static_assert(names_unique(spec_traits<Y>::all_names()));
  static_assert(!names_unique(spec_traits<ts::Spec<ts::S<"a">, ts::S<"a">>>::all_names()));
  static_assert(!spec_traits<ts::Spec<ts::S<"nope">>>::axes_known(axes));
}

TEST_CASE("a pinned layer's input layout keeps each leading dim's axes up to the first the weight splits") {
  // Linear's input for an output pinned to SpecT, beside a weight laid out as Avoid: a split's
  // first axis is major, so a prefix of its axes holds whole blocks of the full split.
  using ts::R, ts::S, ts::Spec, ts::detail::leading_dims_then_t;
  using Column = Spec<R, S<"model">>;
  static_assert(std::is_same_v<leading_dims_then_t<Spec<S<"data", "model">, R>, Column, R>, Spec<S<"data">, R>>);
  static_assert(std::is_same_v<leading_dims_then_t<Spec<S<"model", "data">, R>, Column, R>, Spec<R, R>>);
  static_assert(std::is_same_v<leading_dims_then_t<Spec<S<"a", "b", "model", "c">, R>, Column, R>, Spec<S<"a", "b">, R>>);
  static_assert(std::is_same_v<leading_dims_then_t<Spec<S<"data">, S<"model">, R>, Column, S<"x">>,
                               Spec<S<"data">, R, S<"x">>>);
  static_assert(std::is_same_v<leading_dims_then_t<Spec<R, R>, Column, R>, Spec<R, R>>);
  SUCCEED("checked at compile time");
}

TEST_CASE("copy_box moves an N-D box between buffers of different extents") {
  // 4x3x2 source, copy the box starting (1,1,0) of extent (2,2,2) into a 3x3x3 buffer at (0,1,1).
  std::vector<int> src(24), dst(27, -1);
  for (int i = 0; i < 24; ++i) src[i] = i;
  Extents sd{4, 3, 2}, ss{1, 1, 0}, dd{3, 3, 3}, ds{0, 1, 1}, ext{2, 2, 2};
  copy_box(src.data(), sd, ss, dst.data(), dd, ds, ext, 3);
  for (int k = 0; k < 2; ++k)
    for (int j = 0; j < 2; ++j)
      for (int i = 0; i < 2; ++i)
        REQUIRE(dst[(i + 0) + 3 * (j + 1) + 9 * (k + 1)] == src[(i + 1) + 4 * (j + 1) + 12 * k]);
  int untouched = 0;
  for (int v : dst) untouched += v == -1;
  REQUIRE(untouched == 27 - 8);
}

static SpecDesc spec(std::initializer_list<std::vector<int>> dims) {
  SpecDesc s;
  s.rank = int(dims.size());
  int d = 0;
  for (auto& axes : dims) {
    for (int a : axes) s.dims[d].push(a);
    ++d;
  }
  return s;
}

static std::vector<StepKind> kinds(const ReshardPlan& p) {
  std::vector<StepKind> k;
  for (auto& s : p.steps) k.push_back(s.kind);
  return k;
}

TEST_CASE("the planner picks GSPMD's collective for each kind of transition") {
  MeshShape m = mesh_of({2, 3});
  Extents shape{12, 18};
  using K = StepKind;
  // S -> R: all-gather; R -> S: local slice; a split moving dims: all-to-all.
  REQUIRE(kinds(plan_reshard(spec({{0}, {}}), spec({{}, {}}), shape, m, 8)) == std::vector<K>{K::AllGather});
  REQUIRE(kinds(plan_reshard(spec({{}, {}}), spec({{1}, {0}}), shape, m, 8)) == std::vector<K>{K::Local});
  REQUIRE(kinds(plan_reshard(spec({{0}, {}}), spec({{}, {0}}), shape, m, 8)) == std::vector<K>{K::AllToAll});
  // S<x,y> -> R gathers both axes in one all-gather.
  REQUIRE(kinds(plan_reshard(spec({{0, 1}, {}}), spec({{}, {}}), shape, m, 8)) == std::vector<K>{K::AllGather});
  // Refining S<x> to S<x,y> is local when sizes divide...
  REQUIRE(kinds(plan_reshard(spec({{0}, {}}), spec({{0, 1}, {}}), shape, m, 8)) == std::vector<K>{K::Local});
  // ...and moves data when they do not (N = 7: ceil(7/2) = 4 is not 3 * ceil(7/6) = 6).
  Extents uneven{7, 5};
  auto p = plan_reshard(spec({{0}, {}}), spec({{0, 1}, {}}), uneven, m, 8);
  REQUIRE(p.steps.size() >= 1);
  REQUIRE(p.steps[0].kind != K::Local);
  // Partial sum -> S: reduce-scatter; partial -> R: all-reduce.
  SpecDesc part = spec({{}, {}});
  part.partial = PartialKind::Sum;
  part.partial_axes = 1u << 1;
  REQUIRE(kinds(plan_reshard(part, spec({{}, {1}}), shape, m, 8)) == std::vector<K>{K::ReduceScatter});
  REQUIRE(kinds(plan_reshard(part, spec({{}, {}}), shape, m, 8)) == std::vector<K>{K::AllReduce});
  // Axis order swap S<x,y> -> S<y,x>: a permutation, one partner per rank.
  REQUIRE(kinds(plan_reshard(spec({{0, 1}, {}}), spec({{1, 0}, {}}), shape, m, 8)) == std::vector<K>{K::Direct});
}

namespace {
// The planner's per-rank questions asked the slow way, every rank against every other: the
// closed forms of reshard/plan-inl.hpp must answer alike.
ts::Traffic direct_traffic_by_pairs(const SpecDesc& from, const SpecDesc& to, const Extents& shape,
                                const MeshShape& m, int r) {
  const ShardLayout mine_from = shard_layout_of_rank(from, shape, m, r), mine_to = shard_layout_of_rank(to, shape, m, r);
  std::uint64_t sent = 0, received = 0;
  int sends = 0, receives = 0;
  for (int q = 0; q < m.size(); ++q) {
    if (q == r || !m.same_outside(q, r, from.split_axes())) continue;
    if (Index o = box_overlap(mine_from, shard_layout_of_rank(to, shape, m, q))) sent += std::uint64_t(o), ++sends;
    if (Index o = box_overlap(shard_layout_of_rank(from, shape, m, q), mine_to)) received += std::uint64_t(o), ++receives;
  }
  return messages_traffic(sent * 8, received * 8, sends, receives);
}

bool refines_by_ranks(const SpecDesc& from, const SpecDesc& to, const Extents& shape, const MeshShape& m, int d) {
  for (int r = 0; r < m.size(); ++r)
    if (!box_inside(shard_layout_of_rank(to, shape, m, r), shard_layout_of_rank(from, shape, m, r), d)) return false;
  return true;
}

bool gathers_by_ranks(const SpecDesc& from, const SpecDesc& to, const Extents& shape, const MeshShape& m, int d,
                      const std::vector<int>& axes) {
  for (int r = 0; r < m.size(); ++r) {
    const ShardLayout t = shard_layout_of_rank(to, shape, m, r);
    Index lo = shape[d], hi = 0;
    for (Index g = 0; g < group_size(m, axes); ++g) {
      const ShardLayout f = shard_layout(from, shape, m, group_member_coords(m, axes, g, m.coords_of(r)));
      if (f.valid[d] == 0) continue;
      if (f.offset[d] < t.offset[d] || f.offset[d] + f.valid[d] > t.offset[d] + t.padded[d]) return false;
      lo = std::min(lo, f.offset[d]);
      hi = std::max(hi, f.offset[d] + f.valid[d]);
    }
    if (t.valid[d] > 0 && (t.offset[d] < lo || t.offset[d] + t.valid[d] > hi)) return false;
  }
  return true;
}

// A seeded spec of rank 2 over m: each axis splits dim 0, dim 1 or neither, in a shuffled order.
SpecDesc seeded_spec(const MeshShape& m, std::mt19937& rng) {
  std::vector<int> order(std::size_t(m.axes()));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  SpecDesc s;
  s.rank = 2;
  for (int a : order)
    if (int d = int(rng() % 3); d < 2) s.dims[d].push(a);
  return s;
}
}  // namespace

TEST_CASE("the planner's closed forms answer as the walk over every pair of ranks does") {
  std::mt19937 rng(59);
  int compared = 0;
  for (const auto& sizes : std::vector<std::vector<int>>{{6}, {2, 3}, {3, 2, 2}, {4, 2}, {2, 2, 2}}) {
    const MeshShape m = mesh_of(sizes);
    for (const Extents& shape : {Extents{7, 5}, Extents{12, 18}, Extents{3, 13}, Extents{1, 6}, Extents{0, 4}}) {
      const Planner planner(shape, m, 8);
      for (int trial = 0; trial < 60; ++trial) {
        const SpecDesc from = seeded_spec(m, rng), to = seeded_spec(m, rng);
        for (int r = 0; r < m.size(); ++r) {
          const ts::Traffic fast = planner.direct_traffic(from, to, r), slow = direct_traffic_by_pairs(from, to, shape, m, r);
          INFO(from.to_string(m) << " -> " << to.to_string(m) << " over " << m.describe() << ", rank " << r);
          REQUIRE(fast.bytes_sent == slow.bytes_sent);
          REQUIRE(fast.bytes_received == slow.bytes_received);
          REQUIRE(fast.rounds == slow.rounds);
        }
        for (int d = 0; d < 2; ++d) {
          INFO(from.to_string(m) << " -> " << to.to_string(m) << " along " << d);
          REQUIRE(planner.refines(from, to, d) == refines_by_ranks(from, to, shape, m, d));
          // Gathering each suffix of from's axes along d, into `to` and into from without them.
          for (int first = 0; first < from.dims[d].count; ++first) {
            std::vector<int> axes;
            for (int i = first; i < from.dims[d].count; ++i) axes.push_back(from.dims[d][i]);
            SpecDesc dropped = from;
            dropped.dims[d].count = first;
            REQUIRE(planner.gathers(from, dropped, d, axes) == gathers_by_ranks(from, dropped, shape, m, d, axes));
            REQUIRE(planner.gathers(from, to, d, axes) == gathers_by_ranks(from, to, shape, m, d, axes));
          }
        }
        ++compared;
      }
    }
  }
  REQUIRE(compared == 5 * 5 * 60);
}

namespace {
// Seeded mutations of the seeds (1 to 4 edits each: a byte overwritten, one of `alphabet`
// inserted, bytes erased, the rest cut off, a bit flipped), each handed to parse, which either
// returns (checking what it parsed) or throws IoError; anything else fails the test. 200,000
// inputs; TSHARD_FUZZ_ITERATIONS for more. Returns how many parsed.
template <class Parse>
long fuzz_mutations(const std::vector<std::string>& seeds, std::string_view alphabet, std::uint64_t state, Parse parse) {
  long iterations = 200000;
  if (const char* n = std::getenv("TSHARD_FUZZ_ITERATIONS")) iterations = std::atol(n);
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return std::uint32_t(state >> 33);
  };
  long parsed = 0, rejected = 0;
  for (long i = 0; i < iterations; ++i) {
    std::string s = seeds[next() % seeds.size()];
    const int edits = 1 + int(next() % 4);
    for (int e = 0; e < edits && !s.empty(); ++e) {
      const std::size_t at = next() % s.size();
      switch (next() % 5) {
        case 0: s[at] = char(next()); break;
        case 1: s.insert(at, 1, alphabet[next() % alphabet.size()]); break;
        case 2: s.erase(at, 1 + next() % 8); break;
        case 3: s.resize(at); break;
        default: s[at] = char(s[at] ^ (1 << (next() % 8))); break;
      }
    }
    try {
      parse(s);
      ++parsed;
    } catch (const tshard::IoError&) {
      ++rejected;
    }
  }
  INFO(parsed << " parsed, " << rejected << " rejected");
  REQUIRE(parsed + rejected == iterations);
  return parsed;
}
}  // namespace

// The .npy header parser takes whatever a file holds: mutated valid preambles either parse or
// throw IoError, never read past the bytes given (under the sanitizers script) or throw anything
// else; scripts/fuzz.sh runs libFuzzer on it.
TEST_CASE("the .npy header parser survives mutated headers", "[npy]") {
  using tshard::io::detail::npy_preamble;
  const std::vector<std::string> seeds = {npy_preamble("<f8", false, {3, 4}), npy_preamble("<c16", true, {7}),
                                          npy_preamble("<i4", true, {}), npy_preamble("<f4", true, {2, 0, 5})};
  for (const auto& s : seeds) {
    const auto h = tshard::io::detail::parse_npy_header(s.data(), s.size(), "seed");
    REQUIRE(h.data_offset == std::int64_t(s.size()));
    REQUIRE(h.data_offset % 64 == 0);
  }
  fuzz_mutations(seeds, "(),:'\"0123456789 TF{}L", 12345, [](const std::string& s) {
    const auto h = tshard::io::detail::parse_npy_header(s.data(), s.size(), "mutant");
    REQUIRE(h.data_offset <= std::int64_t(s.size()));
  });
}

// The safetensors header parser (and the JSON reader under it) take whatever a file holds, as the
// .npy one: mutated valid headers either parse, with every tensor's bytes inside the data the
// header promises, or throw IoError.
TEST_CASE("the safetensors header parser survives mutated headers", "[safetensors]") {
  using tshard::io::detail::SafetensorsEntry;
  using tshard::io::detail::safetensors_header;
  const std::vector<std::string> seeds = {
      safetensors_header({SafetensorsEntry{"a.weight", "F32", {3, 4}, 0, 48}, SafetensorsEntry{"b", "BF16", {5}, 48, 58}},
                         {{"format", "pt"}}),
      safetensors_header({SafetensorsEntry{"x", "F64", {}, 0, 8}}, {}),
      safetensors_header({SafetensorsEntry{"\"q\\uote\"\n", "I64", {2, 0, 7}, 0, 0}}, {{"k", "v\tw"}}),
      [] {  // as another writer may lay it out: spaces, no padding to 8 bytes
        const std::string json = "{ \"t\" : {\"shape\": [2], \"dtype\": \"F16\", \"data_offsets\": [0, 4]}}";
        std::string len(8, '\0');
        len[0] = char(json.size());
        return len + json;
      }()};
  for (const auto& s : seeds) {
    const auto h = tshard::io::detail::parse_safetensors_header(s.data(), s.size(), "seed");
    REQUIRE(h.data_offset == std::int64_t(s.size()));
  }
  const auto h = tshard::io::detail::parse_safetensors_header(seeds[2].data(), seeds[2].size(), "seed");
  REQUIRE(h.tensors.at(0).name == "\"q\\uote\"\n");  // names and metadata round-trip through JSON escapes
  REQUIRE(h.metadata.at("k") == "v\tw");
  const long parsed = fuzz_mutations(seeds, "[]{},:\"\\u0123456789.eE-+ tfn", 6789, [](const std::string& s) {
    const auto m = tshard::io::detail::parse_safetensors_header(s.data(), s.size(), "mutant");
    REQUIRE(m.data_offset <= std::int64_t(s.size()));
    for (const auto& t : m.tensors) REQUIRE((t.begin <= t.end && t.end <= m.data_bytes));
  });
  REQUIRE(parsed > 0);
}

TEST_CASE("bfloat16 and float16 bits convert to the floats they stand for", "[safetensors]") {
  using namespace tshard::io::detail;
  REQUIRE(bfloat16_to_float(0x3f80) == 1.0f);
  REQUIRE(bfloat16_to_float(0xc040) == -3.0f);
  REQUIRE(float_to_bfloat16(1.0f + 1.0f / 256) == 0x3f80);  // a tie rounds to even
  REQUIRE(float_to_bfloat16(1.0f + 3.0f / 256) == 0x3f82);
  REQUIRE(float16_to_float(0x3c00) == 1.0f);
  REQUIRE(float16_to_float(0xc000) == -2.0f);
  REQUIRE(float16_to_float(0x7bff) == 65504.0f);               // the largest half
  REQUIRE(float16_to_float(0x0001) == std::ldexp(1.0f, -24));  // the smallest subnormal
  REQUIRE(float16_to_float(0x0200) == std::ldexp(1.0f, -15));
  REQUIRE(std::isinf(float16_to_float(0xfc00)));
  REQUIRE(std::isnan(float16_to_float(0x7e00)));
  REQUIRE(std::signbit(float16_to_float(0x8000)));
}

TEST_CASE("for_each_index walks a box column-major, merges whole leading dims, and stops on false") {
  const Extents e{3, 2, 4};
  std::vector<Index> seen;
  for_each_index(e, 0, 3, [&](const Extents& i) { seen.push_back(i[0] + 3 * i[1] + 6 * i[2]); });
  REQUIRE(seen.size() == 24);
  for (std::size_t k = 0; k < seen.size(); ++k) REQUIRE(seen[k] == Index(k));
  int calls = 0;
  for_each_index(e, 1, 3, [&](const Extents& i) { calls += i[0] == 0; });
  REQUIRE(calls == 8);  // dims 1 and 2 only
  calls = 0;
  for_each_index(e, 0, 0, [&](const Extents&) { ++calls; });
  REQUIRE(calls == 1);  // a rank-0 box is one element
  calls = 0;
  for_each_index(Extents{3, 0, 4}, 0, 3, [&](const Extents&) { ++calls; });
  REQUIRE(calls == 0);
  calls = 0;
  for_each_index(e, 0, 3, [&](const Extents&) { return ++calls < 5; });
  REQUIRE(calls == 5);
  // Dims 0 and 1 are whole in both buffers, so the box is one run of 12 elements.
  REQUIRE(first_outer_dim(Extents{3, 2, 2}, 3, Extents{3, 2, 4}, Extents{3, 2, 5}) == 3);
  // Dim 1 is not whole in the first buffer: runs of 6 (dims 0 and 1), one per index of dim 2.
  REQUIRE(first_outer_dim(Extents{3, 2, 2}, 3, Extents{3, 3, 4}, Extents{3, 2, 5}) == 2);
  REQUIRE(first_outer_dim(Extents{2, 2, 2}, 3, Extents{3, 2, 4}) == 1);
  std::vector<int> buf(24, 0);
  fill_box(buf.data(), e, Extents{1, 0, 1}, Extents{2, 2, 2}, 3, 7);
  int sevens = 0;
  for (int v : buf) sevens += v == 7;
  REQUIRE(sevens == 8);
  REQUIRE(buf[1 + 3 * 0 + 6 * 1] == 7);
  REQUIRE(buf[0 + 3 * 0 + 6 * 1] == 0);
}

// Every window element is written once, by the rank that holds it (or zero beyond a Zero
// boundary), and what rank a sends to rank b is exactly what b expects from a.
TEST_CASE("halo geometry: every window element comes from its owner once, and both ends agree on every message") {
  const Extents shape{7, 5};
  for (auto sizes : std::vector<std::vector<int>>{{1, 1}, {2, 1}, {1, 3}, {2, 2}, {3, 2}, {2, 3}, {4, 1}}) {
    const MeshShape m = mesh_of(sizes);
    for (auto sp : {spec({{0}, {1}}), spec({{1}, {0}}), spec({{0, 1}, {}}), spec({{}, {1, 0}}), spec({{}, {}})}) {
      for (auto boundary : {ts::Boundary::Zero, ts::Boundary::Periodic}) {
        for (Index w : {1, 3, 9}) {  // 9: wider than any shard, and than the tensor
          const Extents before{w, 1}, after{2, w};
          std::vector<HaloLayout> plans;
          for (int r = 0; r < m.size(); ++r) plans.push_back(plan_halo(sp, shape, m, r, before, after, boundary));
          for (int r = 0; r < m.size(); ++r) {
            const HaloLayout& h = plans[std::size_t(r)];
            const ShardLayout mine = shard_layout_of_rank(sp, shape, m, r);
            if (mine.valid_size() == 0) {
              REQUIRE(volume(h.window, 2) == 0);
              continue;
            }
            REQUIRE(h.window[0] == mine.valid[0] + w + 2);
            REQUIRE(h.window[1] == mine.valid[1] + 1 + w);
            // Where each window element comes from: its global index, or -1 for a zero.
            std::vector<Index> got(std::size_t(volume(h.window, 2)), -2);
            auto place = [&](const HaloBox& b, int source) {
              const ShardLayout sl = source >= 0 ? shard_layout_of_rank(sp, shape, m, source) : ShardLayout{};
              for_each_index(b.extent, 0, 2, [&](const Extents& i) {
                Index& slot = got[std::size_t(b.dst[0] + i[0] + h.window[0] * (b.dst[1] + i[1]))];
                REQUIRE(slot == -2);  // written once
                slot = source < 0 ? -1
                                  : (sl.offset[0] + b.src[0] + i[0]) + shape[0] * (sl.offset[1] + b.src[1] + i[1]);
                if (source >= 0) {
                  REQUIRE(b.src[0] + i[0] < sl.valid[0]);
                  REQUIRE(b.src[1] + i[1] < sl.valid[1]);
                }
              });
            };
            for (auto& b : h.self) place(b, r);
            for (auto& b : h.zeros) place(b, -1);
            for (auto& msg : h.recvs)
              for (auto& b : msg.boxes) place(b, msg.peer);
            for (Index j = 0; j < h.window[1]; ++j)
              for (Index i = 0; i < h.window[0]; ++i) {
                Index g[2] = {mine.offset[0] - before[0] + i, mine.offset[1] - before[1] + j};
                bool outside = false;
                for (int d = 0; d < 2; ++d) {
                  outside |= g[d] < 0 || g[d] >= shape[d];
                  g[d] = ((g[d] % shape[d]) + shape[d]) % shape[d];
                }
                const Index want = outside && boundary == ts::Boundary::Zero ? -1 : g[0] + shape[0] * g[1];
                REQUIRE(got[std::size_t(i + h.window[0] * j)] == want);
              }
            // Both ends of every message agree on its boxes.
            for (auto& msg : h.sends) {
              const HaloLayout& peer = plans[std::size_t(msg.peer)];
              auto it = std::find_if(peer.recvs.begin(), peer.recvs.end(), [&](auto& x) { return x.peer == r; });
              REQUIRE(it != peer.recvs.end());
              REQUIRE(it->count == msg.count);
              REQUIRE(it->boxes.size() == msg.boxes.size());
              for (std::size_t k = 0; k < msg.boxes.size(); ++k) {
                REQUIRE(it->boxes[k].src == msg.boxes[k].src);
                REQUIRE(it->boxes[k].extent == msg.boxes[k].extent);
              }
            }
            std::size_t expected_from = 0;
            for (int q = 0; q < m.size(); ++q)
              for (auto& msg : plans[std::size_t(q)].sends) expected_from += msg.peer == r;
            REQUIRE(h.recvs.size() == expected_from);
          }
        }
      }
    }
  }
}

// (This file is built without PCRE2: the component tshard::tokenizer is what brings it.)
TEST_CASE("without a Unicode regex engine, a tokenizer.json with a pattern is one error saying how to get one", "[tokenizer]") {
  STATIC_REQUIRE(!ts::train::has_unicode_regex);
  const std::string bpe = R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  CHECK_THROWS_WITH(ts::train::Tokenizer("{" + bpe + R"(, "pre_tokenizer": {"type": "ByteLevel", "use_regex": true}})", "t.json"),
                    Catch::Contains("needs a Unicode regex engine: this build of tshard has none (install libpcre2-dev"));
  // A file without patterns needs none.
  CHECK(ts::train::Tokenizer("{" + bpe + "}", "t.json").encode("aa") == std::vector<std::int32_t>{0, 0});
}

TEST_CASE("float to IEEE half rounds to nearest even: every half reads back as itself, ties go to even", "[safetensors]") {
  using ts::io::detail::float16_to_float;
  using ts::io::detail::float_to_float16;
  int wrong = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = float16_to_float(std::uint16_t(h));
    if (f == f && float_to_float16(f) != h) ++wrong;  // (nan aside)
  }
  CHECK(wrong == 0);
  CHECK(float_to_float16(1.0f + 0x1p-11f) == 0x3c00);          // halfway between 1 and its successor: the even one
  CHECK(float_to_float16(1.0f + 3 * 0x1p-11f) == 0x3c02);      // halfway between two: the even one, up
  CHECK(float_to_float16(65504.0f) == 0x7bff);                 // the largest half
  CHECK(float_to_float16(65520.0f) == 0x7c00);                 // halfway past it: infinity
  CHECK(float_to_float16(0x1p-25f) == 0x0000);                 // half the smallest subnormal: ties to zero
  CHECK(float_to_float16(0x1.8p-25f) == 0x0001);               // above half: the smallest subnormal
  CHECK(float_to_float16(-0x1p-24f) == 0x8001);
  CHECK((float_to_float16(std::numeric_limits<float>::quiet_NaN()) & 0x7e00) == 0x7e00);
}

namespace {
// CPUID words of a CPU with the features named (leaf 1 ECX, leaf 7 EBX, leaf 0x80000001 ECX) and
// the OS's XCR0.
CpuidWords cpu_words(std::initializer_list<int> leaf1, std::initializer_list<int> leaf7, std::initializer_list<int> ext1,
                     std::uint64_t xcr0) {
  CpuidWords w;
  for (const int b : leaf1) w.leaf1_ecx |= 1u << b;
  for (const int b : leaf7) w.leaf7_ebx |= 1u << b;
  for (const int b : ext1) w.ext1_ecx |= 1u << b;
  w.xcr0 = xcr0;
  return w;
}
// x86-64-v3's bits, and v4's on top (the psABI's levels).
const std::initializer_list<int> kV3Leaf1 = {0, 9, 12, 13, 19, 20, 22, 23, 26, 27, 28, 29};
const std::initializer_list<int> kV3Leaf7 = {3, 5, 8};
const std::initializer_list<int> kV3Ext1 = {0, 5};
const std::initializer_list<int> kV4Leaf7 = {3, 5, 8, 16, 17, 28, 30, 31};
}  // namespace

TEST_CASE("CPUID words give the psABI's level: AVX-512 needs all five extensions and the OS's ZMM state", "[cpu]") {
  using ts::CpuCapability;
  CHECK(capability_from_cpuid({}) == CpuCapability::Baseline);
  // Zen 3: AVX2, FMA, BMI2, no AVX-512.
  CHECK(capability_from_cpuid(cpu_words(kV3Leaf1, kV3Leaf7, kV3Ext1, 0x7)) == CpuCapability::Avx2);
  // Skylake-SP and later: AVX-512 F, DQ, CD, BW, VL with opmask and ZMM state enabled.
  CHECK(capability_from_cpuid(cpu_words(kV3Leaf1, kV4Leaf7, kV3Ext1, 0xe7)) == CpuCapability::Avx512);
  // The same CPU under an OS that saves only the YMM state: AVX-512 would fault.
  CHECK(capability_from_cpuid(cpu_words(kV3Leaf1, kV4Leaf7, kV3Ext1, 0x7)) == CpuCapability::Avx2);
  // Knights Landing's AVX-512F without BW, DQ and VL is not x86-64-v4.
  CHECK(capability_from_cpuid(cpu_words(kV3Leaf1, {3, 5, 8, 16, 28}, kV3Ext1, 0xe7)) == CpuCapability::Avx2);
  // No OS support for the YMM state at all, or no BMI2 (a Sandy Bridge-like set): baseline.
  CHECK(capability_from_cpuid(cpu_words(kV3Leaf1, kV4Leaf7, kV3Ext1, 0x3)) == CpuCapability::Baseline);
  CHECK(capability_from_cpuid(cpu_words(kV3Leaf1, {3, 5}, kV3Ext1, 0x7)) == CpuCapability::Baseline);
}

TEST_CASE("this CPU's detected level is the one its /proc/cpuinfo flags name", "[cpu]") {
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) {
      flags = " " + line.substr(line.find(':') + 1) + " ";
      break;
    }
  if (flags.empty()) return;  // (not Linux on x86-64: nothing to compare with)
  auto has = [&](std::initializer_list<const char*> names) {
    for (const char* n : names)
      if (flags.find(std::string(" ") + n + " ") == std::string::npos) return false;
    return true;
  };
  const bool v3 = has({"pni", "ssse3", "cx16", "sse4_1", "sse4_2", "popcnt", "lahf_lm", "avx", "avx2", "fma",
                        "bmi1", "bmi2", "f16c", "movbe", "abm", "xsave"});
  const bool v4 = v3 && has({"avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl"});
  INFO("flags:" << flags);
  CHECK(ts::detected_cpu_capability() ==
        (v4 ? ts::CpuCapability::Avx512 : v3 ? ts::CpuCapability::Avx2 : ts::CpuCapability::Baseline));
}

TEST_CASE("TSHARD_CPU_CAPABILITY forces a lower level and refuses one the CPU or the build cannot run", "[cpu]") {
  using ts::CpuCapability;
  const CapabilityChoice all{CpuCapability::Baseline, {true, true, true}};
  const CapabilityChoice only_avx2{CpuCapability::Baseline, {true, true, false}};
  CHECK(choose_cpu_capability(all, CpuCapability::Avx512, nullptr) == CpuCapability::Avx512);
  CHECK(choose_cpu_capability(all, CpuCapability::Avx512, "") == CpuCapability::Avx512);
  CHECK(choose_cpu_capability(all, CpuCapability::Avx2, nullptr) == CpuCapability::Avx2);
  CHECK(choose_cpu_capability(only_avx2, CpuCapability::Avx512, nullptr) == CpuCapability::Avx2);
  CHECK(choose_cpu_capability(all, CpuCapability::Avx512, "avx2") == CpuCapability::Avx2);
  CHECK(choose_cpu_capability(all, CpuCapability::Avx512, "AVX512") == CpuCapability::Avx512);
  CHECK(choose_cpu_capability(all, CpuCapability::Avx512, "default") == CpuCapability::Baseline);  // PyTorch's name
  // A level not built falls to the highest built below it.
  CHECK(choose_cpu_capability({CpuCapability::Baseline, {true, false, true}}, CpuCapability::Avx512, "avx2") ==
        CpuCapability::Baseline);
  // A program compiled with -march=x86-64-v3 runs at least that.
  CHECK(choose_cpu_capability({CpuCapability::Avx2, {true, false, true}}, CpuCapability::Avx512, nullptr) ==
        CpuCapability::Avx512);
  CHECK_THROWS_WITH(choose_cpu_capability(all, CpuCapability::Avx2, "avx512"),
                    "tshard: TSHARD_CPU_CAPABILITY=avx512 asks for more than this CPU runs (avx2): use that or a lower "
                    "level, or unset it");
  CHECK_THROWS_WITH(choose_cpu_capability(all, CpuCapability::Avx512, "sse4"),
                    "tshard: TSHARD_CPU_CAPABILITY=sse4 names no level: baseline, avx2 or avx512");
  CHECK_THROWS_WITH(choose_cpu_capability({CpuCapability::Avx2, {true, true, true}}, CpuCapability::Avx512, "baseline"),
                    "tshard: TSHARD_CPU_CAPABILITY=baseline is below the level this program was compiled for (avx2, its "
                    "-march): build without -march to run lower");
  CHECK_THROWS_AS(choose_cpu_capability(all, CpuCapability::Avx2, "avx512"), ts::ValueError);
  CHECK(*parse_cpu_capability("Baseline") == CpuCapability::Baseline);
  CHECK_FALSE(parse_cpu_capability("avx512f"));
}
