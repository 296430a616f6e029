// Reshard benchmark: every reshard kind of a 2-D float tensor, tshard against a hand-written
// MPI + Eigen-layout code that produces the same padded column-major local blocks from buffers
// it allocates once, as a tuned HPC code would. Goal: tshard / hand-written <= 1.03.
//
//   bench/run_reshard.sh [--n N | --rows N0 --cols N1] [--reps R] [--warmup W]
//                        [--mesh 1d,1xP,Px1|all] [--kind S0R,PS1,...] [--hand pack|datatype]
//
// Each kind runs three variants, interleaved and rotated so none always goes first:
//   reshard  `auto r = ts::reshard<NewSpec>(x);` as users write it (storage from the pool),
//   into     `ts::reshard_into(dst, x);` into a tensor allocated once,
//   hand     raw MPI on buffers allocated once (MPI_Allgather straight into the destination
//            where the layout allows, pack/unpack around MPI_Alltoall(v) otherwise,
//            MPI_Allreduce, MPI_Reduce_scatter(_block)).
// Every timed call follows an MPI_Barrier; a sample is the slowest rank's MPI_Wtime interval;
// the figure is the median over reps. Results are checked bitwise against each other and
// against the known global values once, before timing.
#include <mpi.h>

#include <tshard/tshard.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using Index = Eigen::Index;

namespace {

// ---------------------------------------------------------------------------------------------
// Options

struct Options {
  Index rows = 4096, cols = 4096;
  int reps = 9, warmup = 2;
  bool hand_datatypes = false;  // --hand datatype
  std::vector<std::string> meshes{"1d"};
  std::vector<std::string> kinds;  // empty: all
  std::string args;                // as given, for the reproduction line
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) v.push_back(item);
  return v;
}

// "S0->R", "S0-R" and "S0R" name the same kind ('>' is awkward on a shell command line).
std::string kind_key(const std::string& k) {
  std::string s;
  for (char c : k)
    if (c != '-' && c != '>') s += c;
  return s;
}

[[noreturn]] void usage_and_exit(int rank, int code) {
  if (rank == 0)
    std::printf(
        "usage: tshard_bench_reshard [--n N] [--rows N0] [--cols N1] [--reps R>=5] [--warmup W>=2]\n"
        "                            [--mesh 1d,1xP,Px1|all] [--kind K1,K2,...] [--hand pack|datatype]\n"
        "kinds: S0->R S1->R R->S0 R->S1 S0->S1 S1->S0 P->R P->S0 P->S1 (default: all), also\n"
        "       written without '->' (--kind S0R,PS1) so that the shell leaves them alone\n"
        "a float tensor of rows x cols (default 4096 x 4096 = 64 MiB), split over mesh axis x\n"
        "--hand datatype: the hand-written S0->R, S0->S1 and S1->S0 move strided row blocks through\n"
        "                 MPI vector datatypes instead of packing them (even splits only)\n");
  MPI_Finalize();
  std::exit(code);
}

Options parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") usage_and_exit(rank, 0);
    if (i + 1 >= argc) usage_and_exit(rank, 2);
    std::string v = argv[++i];
    o.args += " " + a + " " + v;
    if (a == "--n") {
      o.rows = o.cols = std::atol(v.c_str());
    } else if (a == "--rows") {
      o.rows = std::atol(v.c_str());
    } else if (a == "--cols") {
      o.cols = std::atol(v.c_str());
    } else if (a == "--reps") {
      o.reps = std::atoi(v.c_str());
    } else if (a == "--warmup") {
      o.warmup = std::atoi(v.c_str());
    } else if (a == "--mesh") {
      o.meshes = v == "all" ? std::vector<std::string>{"1d", "1xP", "Px1"} : split_list(v);
    } else if (a == "--hand") {
      if (v != "pack" && v != "datatype") usage_and_exit(rank, 2);
      o.hand_datatypes = v == "datatype";
    } else if (a == "--kind") {
      for (auto& k : split_list(v)) o.kinds.push_back(kind_key(k));
    } else {
      if (rank == 0) std::printf("unknown option %s\n", a.c_str());
      usage_and_exit(rank, 2);
    }
  }
  if (o.rows < 1 || o.cols < 1) usage_and_exit(rank, 2);
  if (o.reps < 5) {
    if (rank == 0) std::printf("# --reps %d raised to 5, the least a median is read from\n", o.reps);
    o.reps = 5;
  }
  o.warmup = std::max(o.warmup, 2);
  const std::vector<std::string> known{"S0R", "S1R", "RS0", "RS1", "S0S1", "S1S0", "PR", "PS0", "PS1"};
  for (auto& k : o.kinds)
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      if (rank == 0) std::printf("unknown kind %s\n", k.c_str());
      usage_and_exit(rank, 2);
    }
  for (auto& m : o.meshes)
    if (m != "1d" && m != "1xP" && m != "Px1") {
      if (rank == 0) std::printf("unknown mesh %s\n", m.c_str());
      usage_and_exit(rank, 2);
    }
  return o;
}

// ---------------------------------------------------------------------------------------------
// The hand-written side: its own shard arithmetic (DESIGN "Shards": ceil blocks, clamped).

struct Split {
  Index n = 0, parts = 1;
  Index block() const { return parts <= 1 ? n : (n + parts - 1) / parts; }
  Index offset(Index c) const { return std::min(c * block(), n); }
  Index valid(Index c) const { return std::clamp<Index>(n - c * block(), 0, block()); }
  bool even() const { return n % parts == 0; }
};

// One rank's padded column-major block of a rows x cols tensor.
struct Block {
  Index ld = 0, ncols = 0;  // padded extents
  Index off0 = 0, off1 = 0, v0 = 0, v1 = 0;
  Index size() const { return ld * ncols; }
};

Block block_of(bool split0, bool split1, Index rows, Index cols, int p, int me) {
  Split a{rows, split0 ? p : 1}, b{cols, split1 ? p : 1};
  const int c0 = split0 ? me : 0, c1 = split1 ? me : 0;
  return {a.block(), b.block(), a.offset(c0), b.offset(c1), a.valid(c0), b.valid(c1)};
}

// A 64-byte-aligned float buffer, touched once when made (first touch is not what is timed).
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(Index count) : n_(std::max<Index>(count, 1)) {
    const std::size_t bytes = (std::size_t(n_) * sizeof(float) + 63) / 64 * 64;
    p_ = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!p_) throw std::bad_alloc();
    std::fill(p_, p_ + n_, 0.0f);
  }
  ~Buffer() { std::free(p_); }
  Buffer(Buffer&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr; }
  Buffer& operator=(Buffer&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() const { return p_; }

 private:
  float* p_ = nullptr;
  Index n_ = 0;
};

int count_of(Index n) {
  if (n > INT_MAX) {
    std::fprintf(stderr, "tshard_bench_reshard: a count of %" PRId64 " does not fit an MPI int\n", std::int64_t(n));
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return int(n);
}

// A hand-written reshard: buffers made once, run() reads the source block and fills dst.
struct Hand {
  std::vector<Buffer> buffers;
  std::vector<std::shared_ptr<MPI_Datatype>> types;
  float* dst = nullptr;
  std::function<void(const float*)> run;
  std::string note;  // how it moves the data, where that differs from the plain pack/unpack
};

struct HandArgs {
  MPI_Comm comm;
  Index rows, cols;
  int p, me;
  bool datatypes;  // --hand datatype: strided blocks through MPI vector types instead of pack/unpack
};

constexpr std::size_t kF = sizeof(float);

// `count` runs of `run` floats `stride` apart, with an extent of `run` floats, so that block g
// of a collective starts `g * run` floats in: the g-th row block of a column-major matrix.
MPI_Datatype row_block_type(Hand& h, Index count, Index run, Index stride) {
  MPI_Datatype v, t;
  MPI_Type_vector(count_of(count), count_of(run), count_of(stride), MPI_FLOAT, &v);
  MPI_Type_create_resized(v, 0, MPI_Aint(run * Index(kF)), &t);
  MPI_Type_commit(&t);
  MPI_Type_free(&v);
  h.types.push_back(std::shared_ptr<MPI_Datatype>(new MPI_Datatype(t), [](MPI_Datatype* q) {
    int down = 0;
    MPI_Finalized(&down);
    if (!down) MPI_Type_free(q);
    delete q;
  }));
  return t;
}

// S(dim 0) -> R: all-gather of the padded blocks into scratch, unpacked into the full tensor;
// or (datatypes, even split) received straight into the tensor through a row-block type.
Hand hand_gather_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p};
  const Index c0 = a.block(), blk = c0 * x.cols, rows = x.rows, cols = x.cols;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(rows * cols);
  float* dst = h.dst = h.buffers[0].data();
  if (x.datatypes && a.even()) {
    const MPI_Datatype block = row_block_type(h, cols, c0, rows);
    h.note = "datatype";
    h.run = [=](const float* src) { MPI_Allgather(src, count_of(blk), MPI_FLOAT, dst, 1, block, comm); };
    return h;
  }
  h.buffers.emplace_back(blk * p);
  float* all = h.buffers[1].data();
  h.run = [=](const float* src) {
    MPI_Allgather(src, count_of(blk), MPI_FLOAT, all, count_of(blk), MPI_FLOAT, comm);
    for (Index j = 0; j < cols; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g)) std::memcpy(dst + a.offset(g) + j * rows, all + g * blk + j * c0, std::size_t(a.valid(g)) * kF);
  };
  return h;
}

// S(dim 1) -> R: the blocks are whole columns back to back: all-gather straight into dst
// (made p * ceil(cols/p) columns long, so an uneven split needs no copy either).
Hand hand_gather_cols(const HandArgs& x) {
  Hand h;
  const Split b{x.cols, x.p};
  const Index blk = x.rows * b.block();
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(blk * x.p);
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) { MPI_Allgather(src, count_of(blk), MPI_FLOAT, dst, count_of(blk), MPI_FLOAT, comm); };
  return h;
}

// R -> S(dim 0): my rows of every column.
Hand hand_slice_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p};
  const Index c0 = a.block(), off = a.offset(x.me), v = a.valid(x.me), rows = x.rows, cols = x.cols;
  h.buffers.emplace_back(c0 * cols);
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) {
    if (v)
      for (Index j = 0; j < cols; ++j) std::memcpy(dst + j * c0, src + off + j * rows, std::size_t(v) * kF);
  };
  return h;
}

// R -> S(dim 1): my columns, one contiguous run.
Hand hand_slice_cols(const HandArgs& x) {
  Hand h;
  const Split b{x.cols, x.p};
  const Index off = b.offset(x.me), v = b.valid(x.me), rows = x.rows;
  h.buffers.emplace_back(rows * b.block());
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) {
    if (v) std::memcpy(dst, src + off * rows, std::size_t(rows * v) * kF);
  };
  return h;
}

// S(dim 0) -> S(dim 1): what rank g needs of my block is its columns, already contiguous, so
// the source is sent as it is; received [g's rows x my cols] blocks are unpacked, or (datatypes,
// even split) received straight into place through a row-block type.
Hand hand_rows_to_cols(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p}, b{x.cols, x.p};
  const Index c0 = a.block(), c1 = b.block(), chunk = c0 * c1, v1 = b.valid(x.me), rows = x.rows;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  const bool even = a.even() && b.even();
  h.buffers.emplace_back(rows * c1);
  float* dst = h.dst = h.buffers[0].data();
  if (x.datatypes && even) {
    const MPI_Datatype block = row_block_type(h, c1, c0, rows);
    h.note = "datatype";
    h.run = [=](const float* src) { MPI_Alltoall(src, count_of(chunk), MPI_FLOAT, dst, 1, block, comm); };
    return h;
  }
  h.buffers.emplace_back(chunk * p);
  float* recv = h.buffers[1].data();
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  for (int g = 0; g < p; ++g) {
    sc[g] = count_of(c0 * b.valid(g));
    sd[g] = count_of(c0 * b.offset(g));
    rc[g] = count_of(c0 * v1);
    rd[g] = count_of(g * chunk);
  }
  h.run = [=](const float* src) {
    if (even)
      MPI_Alltoall(src, count_of(chunk), MPI_FLOAT, recv, count_of(chunk), MPI_FLOAT, comm);
    else
      MPI_Alltoallv(src, sc.data(), sd.data(), MPI_FLOAT, recv, rc.data(), rd.data(), MPI_FLOAT, comm);
    for (Index j = 0; j < v1; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g))
          std::memcpy(dst + a.offset(g) + j * rows, recv + g * chunk + j * c0, std::size_t(a.valid(g)) * kF);
  };
  return h;
}

// S(dim 1) -> S(dim 0): g's rows of my columns are packed (or, datatypes and even split, sent
// through a row-block type); what arrives from g is g's columns of my rows, which is exactly a
// column range of the destination: received in place.
Hand hand_cols_to_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p}, b{x.cols, x.p};
  const Index c0 = a.block(), c1 = b.block(), chunk = c0 * c1, v1 = b.valid(x.me), rows = x.rows;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  const bool even = a.even() && b.even();
  h.buffers.emplace_back(c0 * x.cols);
  float* dst = h.dst = h.buffers[0].data();
  if (x.datatypes && even) {
    const MPI_Datatype block = row_block_type(h, c1, c0, rows);
    h.note = "datatype";
    h.run = [=](const float* src) { MPI_Alltoall(src, 1, block, dst, count_of(chunk), MPI_FLOAT, comm); };
    return h;
  }
  h.buffers.emplace_back(chunk * p);
  float* send = h.buffers[1].data();
  std::vector<int> sc(p), sd(p), rc(p), rd(p);
  for (int g = 0; g < p; ++g) {
    sc[g] = count_of(c0 * v1);
    sd[g] = count_of(g * chunk);
    rc[g] = count_of(c0 * b.valid(g));
    rd[g] = count_of(c0 * b.offset(g));
  }
  h.run = [=](const float* src) {
    for (Index j = 0; j < v1; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g))
          std::memcpy(send + g * chunk + j * c0, src + a.offset(g) + j * rows, std::size_t(a.valid(g)) * kF);
    if (even)
      MPI_Alltoall(send, count_of(chunk), MPI_FLOAT, dst, count_of(chunk), MPI_FLOAT, comm);
    else
      MPI_Alltoallv(send, sc.data(), sd.data(), MPI_FLOAT, dst, rc.data(), rd.data(), MPI_FLOAT, comm);
  };
  return h;
}

// partial -> R: one all-reduce.
Hand hand_all_reduce(const HandArgs& x) {
  Hand h;
  const Index n = x.rows * x.cols;
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(n);
  float* dst = h.dst = h.buffers[0].data();
  h.run = [=](const float* src) { MPI_Allreduce(src, dst, count_of(n), MPI_FLOAT, MPI_SUM, comm); };
  return h;
}

// partial -> S(dim 0): rows of g packed into block g (padding rows zeroed once, never
// written again), then one reduce-scatter. (MPI's predefined reductions are only defined on
// predefined datatypes, so there is no datatype variant.)
Hand hand_reduce_scatter_rows(const HandArgs& x) {
  Hand h;
  const Split a{x.rows, x.p};
  const Index c0 = a.block(), blk = c0 * x.cols, rows = x.rows, cols = x.cols;
  const int p = x.p;
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(blk);
  h.buffers.emplace_back(blk * p);
  float* dst = h.dst = h.buffers[0].data();
  float* send = h.buffers[1].data();
  h.run = [=](const float* src) {
    for (Index j = 0; j < cols; ++j)
      for (int g = 0; g < p; ++g)
        if (a.valid(g)) std::memcpy(send + g * blk + j * c0, src + a.offset(g) + j * rows, std::size_t(a.valid(g)) * kF);
    MPI_Reduce_scatter_block(send, dst, count_of(blk), MPI_FLOAT, MPI_SUM, comm);
  };
  return h;
}

// partial -> S(dim 1): the column blocks are contiguous: reduce-scatter straight from the
// source (with per-rank counts when the split is uneven).
Hand hand_reduce_scatter_cols(const HandArgs& x) {
  Hand h;
  const Split b{x.cols, x.p};
  const Index blk = x.rows * b.block();
  const MPI_Comm comm = x.comm;
  h.buffers.emplace_back(blk);
  float* dst = h.dst = h.buffers[0].data();
  std::vector<int> counts(x.p);
  for (int g = 0; g < x.p; ++g) counts[g] = count_of(x.rows * b.valid(g));
  const bool even = b.even();
  h.run = [=](const float* src) {
    if (even)
      MPI_Reduce_scatter_block(src, dst, count_of(blk), MPI_FLOAT, MPI_SUM, comm);
    else
      MPI_Reduce_scatter(src, dst, counts.data(), MPI_FLOAT, MPI_SUM, comm);
  };
  return h;
}

// ---------------------------------------------------------------------------------------------
// Values and checks

// Small integers: sums of partials are exact in any order, so the expected value is known.
inline float value_at(Index i, Index j) { return float((i * 7 + j * 13) % 1021); }

void fill_block(float* p, const Block& b, float add) {
  for (Index j = 0; j < b.ncols; ++j)
    for (Index i = 0; i < b.ld; ++i)
      p[i + j * b.ld] = (i < b.v0 && j < b.v1) ? value_at(b.off0 + i, b.off1 + j) + add : 0.0f;
}

// First valid element where `p` differs from mul * value + add, as "(i, j) got x want y".
std::string check_values(const float* p, const Block& b, float mul, float add) {
  for (Index j = 0; j < b.v1; ++j)
    for (Index i = 0; i < b.v0; ++i) {
      const float want = mul * value_at(b.off0 + i, b.off1 + j) + add, got = p[i + j * b.ld];
      if (std::memcmp(&want, &got, kF) != 0) {
        char s[160];
        std::snprintf(s, sizeof s, "global (%" PRId64 ", %" PRId64 ") is %g, expected %g", std::int64_t(b.off0 + i),
                      std::int64_t(b.off1 + j), double(got), double(want));
        return s;
      }
    }
  return "";
}

// Bitwise comparison of the valid parts of two blocks with the same layout.
std::string check_same(const float* x, const float* y, const Block& b) {
  for (Index j = 0; j < b.v1; ++j)
    if (std::memcmp(x + j * b.ld, y + j * b.ld, std::size_t(b.v0) * kF) != 0)
      for (Index i = 0; i < b.v0; ++i)
        if (std::memcmp(x + j * b.ld + i, y + j * b.ld + i, kF) != 0) {
          char s[160];
          std::snprintf(s, sizeof s, "global (%" PRId64 ", %" PRId64 "): %g vs %g", std::int64_t(b.off0 + i),
                        std::int64_t(b.off1 + j), double(x[j * b.ld + i]), double(y[j * b.ld + i]));
          return s;
        }
  return "";
}

// Every rank agrees on failure; the failing ranks say why; then the job ends.
void agree_or_abort(const std::string& problem, const std::string& what) {
  int bad = problem.empty() ? 0 : 1, any = 0;
  MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (!any) return;
  if (bad) {
    std::fprintf(stderr, "tshard_bench_reshard: rank %d: %s: %s\n", ts::Environment::world_rank(), what.c_str(),
                 problem.c_str());
    std::fflush(stderr);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

// The 1-minute load average: another job on these 2 cores shows up here, and in the figures.
double load_average() {
  double l = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

using tshard_bench::median;

double max_over_ranks(double x) {
  double m = 0;
  MPI_Allreduce(&x, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

// ---------------------------------------------------------------------------------------------
// One kind: check once, then time the three variants.

using HandMaker = Hand (*)(const HandArgs&);

template <class SrcSpec, class Part, class DstSpec, class M>
void bench_kind(const char* kind, const std::string& mesh_name, const M& mesh, MPI_Comm comm, HandMaker make_hand,
                const Options& o) {
  if (!o.kinds.empty() && std::find(o.kinds.begin(), o.kinds.end(), kind_key(kind)) == o.kinds.end()) return;
  using Src = ts::ShardedTensor<float, M, SrcSpec, Part>;
  using Dst = ts::ShardedTensor<float, M, DstSpec>;
  const int p = mesh.template size<"x">(), me = mesh.template coord<"x">();
  const Index rows = o.rows, cols = o.cols;
  constexpr bool partial = Part::is_partial;
  const bool src0 = Src::spec_desc.dims[0].count > 0, src1 = Src::spec_desc.dims[1].count > 0;
  const bool dst0 = Dst::spec_desc.dims[0].count > 0, dst1 = Dst::spec_desc.dims[1].count > 0;
  const Block sb = block_of(src0, src1, rows, cols, p, me), db = block_of(dst0, dst1, rows, cols, p, me);
  const std::string what = std::string(kind) + " on mesh " + mesh_name + " [" + std::to_string(rows) + ", " +
                           std::to_string(cols) + "]";

  // The source: one buffer both sides read, wrapped by tshard without a copy.
  Buffer src(sb.size());
  fill_block(src.data(), sb, partial ? float(me) : 0.0f);
  auto x = ts::from_local<SrcSpec, Part>(mesh, {rows, cols}, src.data());
  Dst into(mesh, {rows, cols});
  Hand hand = make_hand(HandArgs{comm, rows, cols, p, me, o.hand_datatypes});
  {
    const auto ps = x.padded_shape();
    const auto pd = into.padded_shape();
    agree_or_abort(ps[0] == sb.ld && ps[1] == sb.ncols && pd[0] == db.ld && pd[1] == db.ncols
                       ? ""
                       : "tshard's padded local shape differs from the hand-written one",
                   what);
  }

  // Correctness, once: hand-written against the known values, tshard against hand-written.
  hand.run(src.data());
  std::string problem;
  {
    auto r = ts::reshard<DstSpec>(x);
    ts::reshard_into(into, x);
    const float mul = partial ? float(p) : 1.0f, add = partial ? float(p) * float(p - 1) / 2 : 0.0f;
    problem = check_values(hand.dst, db, mul, add);
    if (!problem.empty()) problem = "hand-written result is wrong: " + problem;
    if (problem.empty()) {
      problem = check_same(r.data(), hand.dst, db);
      if (!problem.empty()) problem = "ts::reshard differs from hand-written (tshard vs hand) at " + problem;
    }
    if (problem.empty()) {
      problem = check_same(into.data(), hand.dst, db);
      if (!problem.empty()) problem = "ts::reshard_into differs from hand-written (tshard vs hand) at " + problem;
    }
  }
  agree_or_abort(problem, what);

  // Bytes one tshard call moves, and the plan it runs.
  ts::reset_comm_stats();
  { auto r = ts::reshard<DstSpec>(x); }
  const ts::CollectiveStats one = ts::comm_stats().op("reshard").total();
  const double sent_mib = max_over_ranks(double(one.bytes_sent) / (1 << 20));
  const double recv_mib = max_over_ranks(double(one.bytes_received) / (1 << 20));
  const std::string path = ts::explain_reshard<DstSpec>(x);

  // Host-side cost of finding the plan: the cache lookup every call pays, and a fresh plan.
  constexpr int kLookups = 2000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kLookups; ++i)
    (void)ts::detail::cached_plan(*mesh.state(), Src::spec_desc, Dst::spec_desc, x.extents(), sizeof(float));
  auto t1 = std::chrono::steady_clock::now();
  (void)ts::detail::plan_reshard(Src::spec_desc, Dst::spec_desc, x.extents(), mesh.shape(), sizeof(float));
  auto t2 = std::chrono::steady_clock::now();
  const double lookup_us = max_over_ranks(std::chrono::duration<double, std::micro>(t1 - t0).count() / kLookups);
  const double plan_us = max_over_ranks(std::chrono::duration<double, std::micro>(t2 - t1).count());

  // Timing. Variant 0: reshard, 1: hand-written, 2: reshard_into; rep k runs them starting
  // at variant k % 3, so the order rotates (A B C, B C A, C A B, ...).
  auto call = [&](int v) {
    if (v == 0) {
      auto r = ts::reshard<DstSpec>(x);  // storage back to the pool at the end of the scope
    } else if (v == 1) {
      hand.run(src.data());
    } else {
      ts::reshard_into(into, x);
    }
  };
  for (int w = 0; w < o.warmup; ++w)
    for (int s = 0; s < 3; ++s) call((w + s) % 3);
  // samples[v][k]: wall time of variant v in rep k; samples[3][k]: time tshard's reshard (v 0)
  // spent inside MPI in rep k, from comm_stats (read outside the timed interval).
  std::vector<double> samples(4 * std::size_t(o.reps));
  auto at = [&](int v, int k) -> double& { return samples[std::size_t(v) * o.reps + k]; };
  const ts::PoolStats pool0 = ts::pool_stats();
  ts::reset_comm_stats();
  for (int k = 0; k < o.reps; ++k)
    for (int s = 0; s < 3; ++s) {
      const int v = (k + s) % 3;
      const double in_mpi = ts::comm_stats().op("reshard").total().seconds;
      MPI_Barrier(comm);
      const double start = MPI_Wtime();
      call(v);
      at(v, k) = MPI_Wtime() - start;
      if (v == 0) at(3, k) = ts::comm_stats().op("reshard").total().seconds - in_mpi;
    }
  const ts::PoolStats pool1 = ts::pool_stats();
  std::vector<double> slowest(samples.size());
  MPI_Allreduce(samples.data(), slowest.data(), int(samples.size()), MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  auto med = [&](int v) {
    return 1e3 * median(std::vector<double>(slowest.begin() + std::ptrdiff_t(v) * o.reps,
                                            slowest.begin() + std::ptrdiff_t(v + 1) * o.reps));
  };
  const double t_reshard = med(0), t_hand = med(1), t_into = med(2), mpi_ms = med(3);
  const double fresh = max_over_ranks(double(pool1.fresh_allocations - pool0.fresh_allocations));

  if (mesh.rank() == 0) {
    std::printf("%-7s %-4s %5" PRId64 "x%-5" PRId64 " %9.3f %9.3f %9.3f %7.3f %7.3f %8.1f %8.1f %8.3f %7.2f %8.1f %5.0f  %s\n",
                kind, mesh_name.c_str(), std::int64_t(rows), std::int64_t(cols), t_reshard, t_into, t_hand,
                t_reshard / t_hand, t_into / t_hand, sent_mib, recv_mib, mpi_ms, lookup_us, plan_us, fresh,
                (path + (hand.note.empty() ? "" : "  [hand: " + hand.note + "]")).c_str());
    std::fflush(stdout);
  }
}

template <class M>
void bench_mesh(const std::string& mesh_name, const M& mesh, MPI_Comm comm, const Options& o) {
  using ts::R;
  using X = ts::S<"x">;
  using PS = ts::PartialSum<"x">;
  using ts::NoPartial;
  using ts::Spec;
  bench_kind<Spec<X, R>, NoPartial, Spec<R, R>>("S0->R", mesh_name, mesh, comm, hand_gather_rows, o);
  bench_kind<Spec<R, X>, NoPartial, Spec<R, R>>("S1->R", mesh_name, mesh, comm, hand_gather_cols, o);
  bench_kind<Spec<R, R>, NoPartial, Spec<X, R>>("R->S0", mesh_name, mesh, comm, hand_slice_rows, o);
  bench_kind<Spec<R, R>, NoPartial, Spec<R, X>>("R->S1", mesh_name, mesh, comm, hand_slice_cols, o);
  bench_kind<Spec<X, R>, NoPartial, Spec<R, X>>("S0->S1", mesh_name, mesh, comm, hand_rows_to_cols, o);
  bench_kind<Spec<R, X>, NoPartial, Spec<X, R>>("S1->S0", mesh_name, mesh, comm, hand_cols_to_rows, o);
  bench_kind<Spec<R, R>, PS, Spec<R, R>>("P->R", mesh_name, mesh, comm, hand_all_reduce, o);
  bench_kind<Spec<R, R>, PS, Spec<X, R>>("P->S0", mesh_name, mesh, comm, hand_reduce_scatter_rows, o);
  bench_kind<Spec<R, R>, PS, Spec<R, X>>("P->S1", mesh_name, mesh, comm, hand_reduce_scatter_cols, o);
}

}  // namespace

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  const int rank = ts::Environment::world_rank(), p = ts::Environment::world_size();
  const Options o = parse(argc, argv, rank);
  const double load_at_start = load_average();
  // The hand-written side gets its own communicator, as tshard's mesh does.
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);

  if (rank == 0) {
    const char* single_copy = std::getenv("OMPI_MCA_btl_vader_single_copy_mechanism");
    std::printf("# tshard %s reshard benchmark: float [%" PRId64 ", %" PRId64 "] (%.1f MiB), %d ranks, %d reps after %d warm-ups\n",
                TSHARD_VERSION_STRING, std::int64_t(o.rows), std::int64_t(o.cols),
                double(o.rows) * double(o.cols) * 4 / (1 << 20), p, o.reps, o.warmup);
    std::printf("# reproduce: NP=%d bench/run_reshard.sh%s\n", p, o.args.c_str());
    std::printf("#   i.e. OMPI_MCA_btl_vader_single_copy_mechanism=%s OPENBLAS_NUM_THREADS=1 mpirun -np %d --oversubscribe %s%s\n",
                single_copy ? single_copy : "<unset>", p, argv[0], o.args.c_str());
    std::printf("# hand-written: %s\n", o.hand_datatypes
                                              ? "strided row blocks through MPI vector datatypes where the split is even"
                                              : "pack/unpack around the collective where the layout needs it");
    std::printf("# ms: median over reps of the slowest rank; ratio: tshard / hand-written (goal <= 1.03)\n");
    std::printf("# MiB: sent / received per rank by one ts::reshard (comm_stats); mpi_ms: median time of ts::reshard inside MPI;\n");
    std::printf("# lookup_us: plan-cache lookup per call; plan_us: planning one uncached plan; fresh: pool allocations in the timed loop\n");
    std::printf("%-7s %-4s %11s %9s %9s %9s %7s %7s %8s %8s %8s %7s %8s %5s  %s\n", "kind", "mesh", "shape",
                "reshard", "into", "hand", "ratio", "r_into", "sentMiB", "recvMiB", "mpi_ms", "lookup", "plan_us",
                "fresh", "plan");
    std::fflush(stdout);
  }

  for (const std::string& m : o.meshes) {
    if (m == "1d") {
      ts::Mesh<"x"> mesh({p});
      bench_mesh("1d", mesh, comm, o);
    } else if (m == "1xP") {
      ts::Mesh<"y", "x"> mesh({1, p});
      bench_mesh("1xP", mesh, comm, o);
    } else {
      ts::Mesh<"x", "y"> mesh({p, 1});
      bench_mesh("Px1", mesh, comm, o);
    }
  }
  if (rank == 0)
    std::printf("# 1-minute load average: %.2f at start, %.2f at end (this run adds up to %d; more means another job\n"
                "# shared the cores and the figures are not to be trusted)\n",
                load_at_start, load_average(), p);
  MPI_Comm_free(&comm);
  return 0;
}
