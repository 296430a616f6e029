// File I/O: tshard's save_npy / load_npy and (with tshard::hdf5) io::save / io::load of a 1 GiB
// float tensor against writing and reading the same bytes with plain MPI_File_write_at_all /
// MPI_File_read_at_all, each rank its contiguous half, side by side (interleaved medians).
// Two layouts: columns split (each rank's block is contiguous in the column-major file) and rows
// split (each rank's block is strided: one run per column). The files go to --dir (default
// /tmp); the page cache is part of what is measured, as it is for users.
//   mpirun -np 2 ./tshard_bench_io [--n 16384] [--reps 5] [--dir /tmp]
#include <tshard/tshard.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace ts = tshard;
using M = ts::Mesh<"x">;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  Eigen::Index n = 16384;
  int reps = 5;
  std::string dir = "/tmp";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--n") n = std::atol(argv[i + 1]);
    else if (a == "--reps") reps = std::atoi(argv[i + 1]);
    else if (a == "--dir") dir = argv[i + 1];
  }
  M mesh({-1});
  const int p = mesh.size(), r = mesh.rank();
  const std::string raw = dir + "/tshard_bench_raw.bin", npy = dir + "/tshard_bench.npy", h5 = dir + "/tshard_bench.h5";
  auto cols = ts::from_function<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, {n, n}, [](auto i) { return float(i[0] - i[1]); });
  auto rows = ts::from_function<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, {n, n}, [](auto i) { return float(i[0] - i[1]); });
  const double gib = double(n) * double(n) * sizeof(float) / double(1 << 30);
  // The hand-written baseline: each rank its contiguous share of the same bytes.
  const MPI_Offset share = MPI_Offset(n) * n * MPI_Offset(sizeof(float)) / p;
  std::vector<float> buffer(std::size_t(share / MPI_Offset(sizeof(float))), 1.0f);
  auto raw_io = [&](bool write) {
    MPI_File f;
    MPI_File_open(MPI_COMM_WORLD, raw.c_str(), write ? (MPI_MODE_CREATE | MPI_MODE_WRONLY) : MPI_MODE_RDONLY, MPI_INFO_NULL, &f);
    const std::size_t chunk = std::size_t(1) << 28;  // int counts: 1 GiB per call at most
    for (std::size_t off = 0; off < buffer.size(); off += chunk) {
      const int c = int(std::min(chunk, buffer.size() - off));
      const MPI_Offset at = MPI_Offset(r) * share + MPI_Offset(off * sizeof(float));
      if (write) MPI_File_write_at_all(f, at, buffer.data() + off, c, MPI_FLOAT, MPI_STATUS_IGNORE);
      else MPI_File_read_at_all(f, at, buffer.data() + off, c, MPI_FLOAT, MPI_STATUS_IGNORE);
    }
    MPI_File_close(&f);
  };
  std::vector<std::string> names = {"MPI_File_write_at_all", "save_npy columns split", "save_npy rows split",
                                    "MPI_File_read_at_all", "load_npy columns split", "load_npy rows split"};
  std::vector<std::function<void()>> writes = {[&] { raw_io(true); }, [&] { ts::io::save_npy(npy, cols); },
                                               [&] { ts::io::save_npy(npy, rows); }};
  std::vector<std::function<void()>> reads = {
      [&] { raw_io(false); }, [&] { (void)ts::io::load_npy<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, npy); },
      [&] { (void)ts::io::load_npy<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, npy); }};
#if defined(TSHARD_WITH_HDF5)
  names.insert(names.begin() + 3, {"io::save columns split", "io::save rows split"});
  names.insert(names.end(), {"io::load columns split", "io::load rows split"});
  writes.push_back([&] { ts::io::save(h5, "x", cols); });
  writes.push_back([&] { ts::io::save(h5, "x", rows); });
  reads.push_back([&] { (void)ts::io::load<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, h5, "x"); });
  reads.push_back([&] { (void)ts::io::load<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, h5, "x"); });
#endif
  const auto w = tshard_bench::interleaved(writes, reps, 1);
  raw_io(true);
  ts::io::save_npy(npy, cols);
#if defined(TSHARD_WITH_HDF5)
  ts::io::save(h5, "x", cols);
#endif
  const auto rd = tshard_bench::interleaved(reads, reps, 1);
  std::vector<double> t = w;
  t.insert(t.end(), rd.begin(), rd.end());
  if (r == 0) {
    std::printf("%d ranks, %.2f GiB of float (%lld x %lld), medians of %d interleaved runs\n", p, gib, (long long)n,
                (long long)n, reps);
    const std::size_t nw = w.size();
    for (std::size_t i = 0; i < t.size(); ++i) {
      const double base = i < nw ? t[0] : t[nw];
      std::printf("%-26s %8.3f s %7.2f GiB/s  ratio %.2f\n", names[i].c_str(), t[i], gib / t[i], t[i] / base);
    }
    std::remove(raw.c_str());
    std::remove(npy.c_str());
    std::remove(h5.c_str());
  }
  return 0;
}
