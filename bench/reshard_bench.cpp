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
//
// The parts: reshard/options.hpp (the command line), reshard/hand_written.hpp (the hand-written
// MPI reshards), reshard/checks.hpp (block layout, known values, checks); this file runs and times
// them and prints the table.
#include <mpi.h>

#include <tshard/tshard.hpp>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "reshard/checks.hpp"
#include "reshard/hand_written.hpp"
#include "reshard/options.hpp"

namespace ts = tshard;

namespace reshard_bench {
namespace {

// The 1-minute load average: another job on these 2 cores shows up here, and in the figures.
double load_average() {
  double l = -1;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1;
    std::fclose(f);
  }
  return l;
}

using tshard_bench::max_over_ranks;
using tshard_bench::median;

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
    (void)ts::detail::cached_plan(*tshard::detail::state_of(mesh), Src::spec_desc, Dst::spec_desc,
                                  tshard::detail::extents_of(x), sizeof(float));
  auto t1 = std::chrono::steady_clock::now();
  (void)ts::detail::plan_reshard(Src::spec_desc, Dst::spec_desc, tshard::detail::extents_of(x), mesh.shape(),
                                 sizeof(float));
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
}  // namespace reshard_bench

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  const int rank = ts::Environment::world_rank(), p = ts::Environment::world_size();
  const reshard_bench::Options o = reshard_bench::parse(argc, argv, rank);
  const double load_at_start = reshard_bench::load_average();
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
      reshard_bench::bench_mesh("1d", mesh, comm, o);
    } else if (m == "1xP") {
      ts::Mesh<"y", "x"> mesh({1, p});
      reshard_bench::bench_mesh("1xP", mesh, comm, o);
    } else {
      ts::Mesh<"x", "y"> mesh({p, 1});
      reshard_bench::bench_mesh("Px1", mesh, comm, o);
    }
  }
  if (rank == 0)
    std::printf("# 1-minute load average: %.2f at start, %.2f at end (this run adds up to %d; more means another job\n"
                "# shared the cores and the figures are not to be trusted)\n",
                load_at_start, reshard_bench::load_average(), p);
  MPI_Comm_free(&comm);
  return 0;
}
