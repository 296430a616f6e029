// Files through the typed API on every 2-D mesh: .npy written with one spec reads back bitwise
// with another on any mesh, for every element type; C-order files (numpy's default) read on
// any spec; numpy itself reads what we write where python3-numpy is installed; bad files are an
// IoError on every rank. Shapes do not divide the mesh (7 x 5, dims smaller than an axis).
#include "io_support.hpp"

#include <complex>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace ts = tshard;
using namespace tshard_test;

TEST_CASE("save_npy and load_npy round-trip bitwise across specs and meshes for every element type", "[io]") {
  const std::string path = scratch_file("roundtrip.npy");
  for (Eigen::Index rows : {Eigen::Index(7), Eigen::Index(1)}) {
    auto check = [&]<class T>(T*) {
      const Eigen::Tensor<T, 2> want = typed_values<T>(rows, 5, 3);
      on_every_mesh([&](M2& mesh, auto sizes) {
        for_each_pair(Specs2{}, Specs2{}, [&]<class A, class B>(A*, B*) {
          INFO("mesh " << sizes[0] << "x" << sizes[1] << " " << spec_name<A>(mesh) << " -> "
                       << spec_name<B>(mesh) << " rows " << rows);
          ts::io::save_npy(path, ts::distribute<A>(mesh, want));
          const auto back = ts::io::load_npy<T, B>(mesh, path);
          TS_REQUIRE_ALL(bitwise_equal<T>(back.gather(), want));
        });
      });
    };
    check(static_cast<float*>(nullptr));
    check(static_cast<double*>(nullptr));
    check(static_cast<std::complex<float>*>(nullptr));
    check(static_cast<std::complex<double>*>(nullptr));
    check(static_cast<std::int32_t*>(nullptr));
    check(static_cast<std::int64_t*>(nullptr));
  }
  // Written on the whole world, read on one rank alone (another rank count), and a rank-3 tensor.
  M2 world({world_size(), 1});
  Eigen::Tensor<double, 3> cube(4, 3, 5);
  for (Eigen::Index i = 0; i < cube.size(); ++i) cube.data()[i] = 0.5 * double(i) - 3;
  ts::io::save_npy(path, ts::distribute<ts::Spec<ts::R, ts::S<"x">, ts::R>>(world, cube));
  M2 self(MPI_COMM_SELF, {1, 1});
  const Eigen::Tensor<double, 3> alone = ts::io::load_npy<double, ts::Spec<ts::S<"x">, ts::R, ts::R>>(self, path).gather();
  TS_REQUIRE_ALL(compare(alone, cube) == "");
  // A partial is resolved before it is written.
  const auto x = ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(world, values(3, 7, 1));
  ts::io::save_npy(path, ts::sum<1>(x));
  const Eigen::Tensor<double, 1> sums = ts::io::load_npy<double, ts::Spec<ts::R>>(world, path).gather();
  const Eigen::Tensor<double, 1> want = values(3, 7, 1).sum(Eigen::array<int, 1>{1});
  TS_REQUIRE_ALL(compare(sums, want, 1e-12) == "");
  remove_on_rank0(path);
}

TEST_CASE("load_npy reads C-order files, numpy's default, on any spec", "[io]") {
  const std::string path = scratch_file("c_order.npy");
  const Eigen::Index r = 6, c = 5;
  const Eigen::Tensor<double, 2> want = values(r, c, 9);
  if (world_rank() == 0) {  // as numpy.save writes a C-contiguous array: row after row
    std::ofstream f(path, std::ios::binary);
    const std::string pre = ts::io::detail::npy_preamble("<f8", false, {r, c});
    f.write(pre.data(), std::streamsize(pre.size()));
    for (Eigen::Index i = 0; i < r; ++i)
      for (Eigen::Index j = 0; j < c; ++j) f.write(reinterpret_cast<const char*>(&want(i, j)), sizeof(double));
  }
  MPI_Barrier(MPI_COMM_WORLD);
  on_every_mesh([&](M2& mesh, auto sizes) {
    for_each_type(Specs2{}, [&]<class S>(S*) {
      INFO("mesh " << sizes[0] << "x" << sizes[1] << " " << spec_name<S>(mesh));
      TS_REQUIRE_ALL(compare(ts::io::load_npy<double, S>(mesh, path).gather(), want) == "");
    });
  });
  remove_on_rank0(path);
}

TEST_CASE("numpy reads what save_npy writes: a[i, j] == x(i, j)", "[io]") {
  const std::string python = world_rank() == 0 ? python_with("numpy") : "";
  int have = python.empty() ? 0 : 1;
  MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!have) {
    WARN("python3-numpy is not installed: numpy's reading is not checked");
    return;
  }
  const std::string path = scratch_file("numpy.npy");
  M2 mesh({world_size(), 1});
  const Eigen::Tensor<double, 2> x = values(5, 3, 4);
  ts::io::save_npy(path, ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, x));
  int ok = 1;
  if (world_rank() == 0) {
    const std::string expect = python_list(x);
    const std::string cmd = python + " -c \"import numpy as np, sys; a = np.load('" + path + "'); b = np.array(" + expect +
                            "); sys.exit(0 if a.shape == (5, 3) and np.allclose(a, b, rtol=0, atol=1e-6) else 1)\"";
    ok = std::system(cmd.c_str()) == 0 ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  TS_REQUIRE_ALL(ok == 1);
  remove_on_rank0(path);
}

TEST_CASE("a missing, truncated, corrupt, mistyped or misshaped .npy file is an IoError on every rank", "[io]") {
  M2 mesh({world_size(), 1});
  using S = ts::Spec<ts::S<"x">, ts::R>;
  const std::string good = scratch_file("good.npy"), bad = scratch_file("bad.npy");
  ts::io::save_npy(good, ts::distribute<S>(mesh, values(4, 3, 2)));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_npy<double, S>(mesh, scratch_file("missing.npy")); }, "cannot open"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_npy<float, S>(mesh, good); }, "holds dtype '<f8'"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_npy<double, ts::Spec<ts::S<"x">>>(mesh, good); }, "rank 2"));
  auto write_bad = [&](const std::string& bytes) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::ofstream(bad, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    MPI_Barrier(MPI_COMM_WORLD);
  };
  std::string whole;
  {
    std::ifstream f(good, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(f), {});
  }
  write_bad(whole.substr(0, whole.size() - 8));  // one element short
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_npy<double, S>(mesh, bad); }, "truncated"));
  write_bad(whole.substr(0, 30));  // inside the header
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_npy<double, S>(mesh, bad); }, "header"));
  write_bad("PK\x03\x04 not numpy at all");
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_npy<double, S>(mesh, bad); }, "not a .npy file"));
  std::string big_endian = whole;
  big_endian.replace(big_endian.find("<f8"), 3, ">f8");
  write_bad(big_endian);
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_npy<double, S>(mesh, bad); }, "big-endian"));
  // A directory where a file should be written.
  TS_REQUIRE_ALL(io_error([&] { ts::io::save_npy("/proc/no/such/dir/x.npy", ts::distribute<S>(mesh, values(4, 3, 2))); },
                          "cannot open"));
  remove_on_rank0(good);
  remove_on_rank0(bad);
}

TEST_CASE("a checkpoint reloads with other specs and meshes, verifies checksums, and is all or nothing", "[io]") {
  const std::string dir = scratch_file("checkpoint");
  using A = ts::Spec<ts::S<"x">, ts::R>;
  using B = ts::Spec<ts::R, ts::S<"y">>;
  on_every_mesh([&](M2& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    const Eigen::Tensor<double, 2> w = values(5, 7, 1);
    const Eigen::Tensor<std::int64_t, 2> ids = typed_values<std::int64_t>(3, 2, 2);
    {
      ts::io::CheckpointWriter ck(mesh.comm(), dir);
      ck.add("layer/w", ts::distribute<A>(mesh, w));
      ck.add("ids", ts::distribute<B>(mesh, ids));
      ck.set("step", "42");
      ck.commit();
    }
    M2 self(MPI_COMM_SELF, {1, 1});
    ts::io::CheckpointReader in(mesh.comm(), dir);
    TS_REQUIRE_ALL(in.get("step") == "42");
    TS_REQUIRE_ALL(compare(in.load<double, B>(mesh, "layer/w").gather(), w) == "");
    TS_REQUIRE_ALL(bitwise_equal<std::int64_t>(in.load<std::int64_t, A>(mesh, "ids").gather(), ids));
    TS_REQUIRE_ALL(io_error([&] { in.load<double, A>(mesh, "missing"); }, "has no tensor 'missing'"));
    TS_REQUIRE_ALL(io_error([&] { (void)in.get("seed"); }, "has no 'seed'"));
    // The checksum does not depend on the layout.
    TS_REQUIRE_ALL(ts::io::checksum(ts::distribute<A>(mesh, w)) == ts::io::checksum(ts::distribute<B>(mesh, w)));
    // An unfinished save (no commit) leaves the last checkpoint as it was.
    {
      ts::io::CheckpointWriter ck(mesh.comm(), dir);
      ck.add("layer/w", ts::distribute<A>(mesh, values(5, 7, 9)));
    }
    ts::io::CheckpointReader again(mesh.comm(), dir);
    TS_REQUIRE_ALL(compare(again.load<double, A>(mesh, "layer/w").gather(), w) == "");
  });
  TS_REQUIRE_ALL(io_error([&] { ts::io::CheckpointReader(MPI_COMM_WORLD, scratch_file("no_checkpoint")); }, "no manifest"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::filesystem::remove_all(dir);
    std::filesystem::remove_all(dir + ".tmp");
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("a trace holds every rank's operators and collectives as Chrome trace JSON", "[io]") {
  const std::string path = scratch_file("trace.json");
  M2 mesh({world_size(), 1});
  auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, values(6, 5, 1));
  ts::start_trace();
  auto y = ts::reshard<ts::Spec<ts::R, ts::R>>(x);
  ts::write_trace(path);
  int ok = 1;
  if (world_rank() == 0) {
    std::ifstream f(path);
    const std::string text((std::istreambuf_iterator<char>(f)), {});
    ok = text.rfind("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[", 0) == 0 && text.find("\"name\":\"reshard\"") != std::string::npos &&
         text.find("\"pid\":" + std::to_string(world_size() - 1)) != std::string::npos &&
         (world_size() == 1 || text.find("\"cat\":\"collective\"") != std::string::npos);
    const std::string python = python_with("json");
    if (ok && !python.empty()) ok = std::system((python + " -c \"import json; json.load(open('" + path + "'))\"").c_str()) == 0;
    std::remove(path.c_str());
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  TS_REQUIRE_ALL(ok == 1);
}
