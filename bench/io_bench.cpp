// File I/O: tshard's save_npy / load_npy, save_safetensors / load_safetensors and (with tshard::hdf5) io::save / io::load of a 1 GiB
// float tensor against writing and reading the same bytes with plain MPI_File_write_at_all /
// MPI_File_read_at_all, each rank its contiguous half, side by side (interleaved medians).
// Two layouts: columns split (each rank's block is contiguous in the column-major file) and rows
// split (each rank's block is strided: one run per column), which is also compared with its
// hand-written equivalent, MPI_File_write_all / read_all through a subarray file view. HDF5 in
// both orders: row-major (h5py's indices, a transposition per block) and column-major (none).
// The files go to --dir (default /tmp); the page cache is part of what is measured, as it is
// for users.
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
  // The hand-written strided case: each rank its rows of the column-major matrix through a
  // subarray file view (one run per column), what a rows-split block is in any file order.
  auto raw_rows = [&](bool write) {
    MPI_File f;
    MPI_File_open(MPI_COMM_WORLD, raw.c_str(), write ? (MPI_MODE_CREATE | MPI_MODE_WRONLY) : MPI_MODE_RDONLY, MPI_INFO_NULL, &f);
    const int sizes[2] = {int(n), int(n)}, sub[2] = {int(n), int(n / p)}, start[2] = {0, int(r * (n / p))};
    MPI_Datatype view;
    MPI_Type_create_subarray(2, sizes, sub, start, MPI_ORDER_C, MPI_FLOAT, &view);
    MPI_Type_commit(&view);
    MPI_File_set_view(f, 0, MPI_FLOAT, view, "native", MPI_INFO_NULL);
    if (write) MPI_File_write_all(f, buffer.data(), int(buffer.size()), MPI_FLOAT, MPI_STATUS_IGNORE);
    else MPI_File_read_all(f, buffer.data(), int(buffer.size()), MPI_FLOAT, MPI_STATUS_IGNORE);
    MPI_Type_free(&view);
    MPI_File_close(&f);
  };
  std::vector<std::string> names = {"MPI_File_write_at_all", "MPI_File_write_all, strided", "save_npy columns split",
                                    "save_npy rows split", "MPI_File_read_at_all", "MPI_File_read_all, strided",
                                    "load_npy columns split", "load_npy rows split"};
  std::vector<std::function<void()>> writes = {[&] { raw_io(true); }, [&] { raw_rows(true); },
                                               [&] { ts::io::save_npy(npy, cols); }, [&] { ts::io::save_npy(npy, rows); }};
  std::vector<std::function<void()>> reads = {
      [&] { raw_io(false); }, [&] { raw_rows(false); },
      [&] { (void)ts::io::load_npy<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, npy); },
      [&] { (void)ts::io::load_npy<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, npy); }};
  // safetensors: C order, so a rows-split block is contiguous in the file (a transposition per
  // block in memory) and a columns-split one strided; the save fsyncs and renames (atomic).
  const std::string st = dir + "/tshard_bench.safetensors";
  names.insert(names.begin() + 4, {"save_safetensors rows split", "save_safetensors columns split"});
  names.insert(names.end(), {"load_safetensors rows split", "load_safetensors columns split"});
  writes.push_back([&] { ts::io::save_safetensors(st, {{"x", rows}}); });
  writes.push_back([&] { ts::io::save_safetensors(st, {{"x", cols}}); });
  reads.push_back([&] { (void)ts::io::load_safetensors<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, st, "x"); });
  reads.push_back([&] { (void)ts::io::load_safetensors<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, st, "x"); });
#if defined(TSHARD_WITH_HDF5)
  // Row-major datasets (h5py's f["x"][i, j] == x(i, j)) transpose each block; column-major ones
  // (dims reversed) move it as it is.
  const std::string h5f = dir + "/tshard_bench_f.h5";
  names.insert(names.begin() + 6, {"io::save columns split", "io::save rows split", "io::save column-major, cols",
                                   "io::save column-major, rows"});
  names.insert(names.end(), {"io::load columns split", "io::load rows split", "io::load column-major, cols",
                             "io::load column-major, rows"});
  writes.push_back([&] { ts::io::save(h5, "x", cols); });
  writes.push_back([&] { ts::io::save(h5, "x", rows); });
  writes.push_back([&] { ts::io::save(h5f, "x", cols, ts::io::Order::column_major); });
  writes.push_back([&] { ts::io::save(h5f, "x", rows, ts::io::Order::column_major); });
  reads.push_back([&] { (void)ts::io::load<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, h5, "x"); });
  reads.push_back([&] { (void)ts::io::load<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, h5, "x"); });
  reads.push_back([&] { (void)ts::io::load<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, h5f, "x"); });
  reads.push_back([&] { (void)ts::io::load<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, h5f, "x"); });
#endif
  const auto w = tshard_bench::interleaved(writes, reps, 1);
  raw_io(true);
  ts::io::save_npy(npy, cols);
  ts::io::save_safetensors(st, {{"x", rows}});
#if defined(TSHARD_WITH_HDF5)
  ts::io::save(h5, "x", cols);
  ts::io::save(h5f, "x", cols, ts::io::Order::column_major);
#endif
  const auto rd = tshard_bench::interleaved(reads, reps, 1);
  std::vector<double> t = w;
  t.insert(t.end(), rd.begin(), rd.end());
  if (r == 0) {
    std::printf("%d ranks, %.2f GiB of float (%lld x %lld), medians of %d interleaved runs\n", p, gib, (long long)n,
                (long long)n, reps);
    const std::size_t nw = w.size();
    for (std::size_t i = 0; i < t.size(); ++i) {
      const double contiguous = i < nw ? t[0] : t[nw], strided = i < nw ? t[1] : t[nw + 1];
      std::printf("%-30s %8.3f s %7.2f GiB/s  ratio %.2f (%.2f against the strided one)\n", names[i].c_str(), t[i],
                  gib / t[i], t[i] / contiguous, t[i] / strided);
    }
    std::remove(raw.c_str());
    std::remove(npy.c_str());
    std::remove(st.c_str());
    std::remove(h5.c_str());
#if defined(TSHARD_WITH_HDF5)
    std::remove(h5f.c_str());
#endif
  }
  return 0;
}
