// Files through the typed API on every 2-D mesh: .npy written with one spec reads back bitwise
// with another on any mesh, for every element type; C-order files (numpy's default) read on
// any spec; numpy itself reads what we write where python3-numpy is installed; bad files are an
// IoError on every rank. Shapes do not divide the mesh (7 x 5, dims smaller than an axis).
#include "io_support.hpp"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tshard/io/safetensors_shards.hpp"
#include "tshard/train/data.hpp"
#include "tshard/train/hf_config.hpp"

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

TEST_CASE("a token file gives a batch's ids and next-token labels on any split of rows and positions", "[io][data]") {
  // 9 rows of 6 tokens (seq 5): batches of 4 rows, the last whole batch's rows cycled.
  const std::string path = scratch_file("tokens.npy");
  const Eigen::Index rows = 9, seq = 5, batch = 4;
  Eigen::Tensor<std::int32_t, 2> file(rows, seq + 1);
  for (Eigen::Index r = 0; r < rows; ++r)
    for (Eigen::Index t = 0; t <= seq; ++t) file(r, t) = std::int32_t(100 * r + t);
  {
    M2 world({world_size(), 1});
    ts::io::save_npy(path, ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(world, file));
  }
  on_every_mesh([&](M2& mesh, auto sizes) {
    // Positions over y (a label past a shard's last position is the next shard's first token).
    for_each_type(Specs2{}, [&]<class Rows>(Rows*) {
      INFO("mesh " << sizes[0] << "x" << sizes[1] << " rows " << spec_name<Rows>(mesh));
      ts::train::TokenFile tokens(mesh.comm(), path, seq, batch, "--data");
      for (long step : {0L, 1L, 2L})
        for (Eigen::Index first : {Eigen::Index(0), Eigen::Index(1)})
          for (Eigen::Index shift : {Eigen::Index(0), Eigen::Index(1)}) {
            const Eigen::Index count = batch - first;
            const Eigen::Tensor<std::int32_t, 2> got = tokens.batch_ids<Rows>(mesh, step, batch, first, count, shift).gather();
            Eigen::Tensor<std::int32_t, 2> want(count, seq);
            for (Eigen::Index b = 0; b < count; ++b)
              for (Eigen::Index t = 0; t < seq; ++t) want(b, t) = file((step % 2) * batch + first + b, t + shift);
            INFO("step " << step << " first row " << first << " shift " << shift);
            TS_REQUIRE_ALL(compare(got, want) == "");
          }
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

TEST_CASE("require_writable says before a run that an output cannot be written, on every rank, and leaves nothing", "[io]") {
  const std::string blocker = scratch_file("a_file"), folder = scratch_file("made_by_check");
  if (world_rank() == 0) std::ofstream(blocker) << "not a folder\n";
  MPI_Barrier(MPI_COMM_WORLD);
  // A path under a plain file: no folder can be made there.
  TS_REQUIRE_ALL(io_error([&] { ts::io::require_writable(MPI_COMM_WORLD, blocker + "/ckpt"); }, "cannot be written"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::require_writable(MPI_COMM_WORLD, {"", blocker + "/x.safetensors"}); }, blocker));
  // A writable one: its parent folders are made, no probe stays behind, and the path itself is not made.
  ts::io::require_writable(MPI_COMM_WORLD, {folder + "/sub/ckpt/", "", folder + "/w.safetensors"});
  MPI_Barrier(MPI_COMM_WORLD);
  TS_REQUIRE_ALL(std::filesystem::is_directory(folder + "/sub"));
  TS_REQUIRE_ALL(std::distance(std::filesystem::directory_iterator(folder + "/sub"), std::filesystem::directory_iterator()) == 0);
  TS_REQUIRE_ALL(std::filesystem::exists(folder + "/sub") && !std::filesystem::exists(folder + "/sub/ckpt") &&
                 !std::filesystem::exists(folder + "/w.safetensors"));
  // A folder to write into (--save-hf DIR): an existing plain file there is refused before the run;
  // an existing folder is probed inside and kept as it was; a missing one is not made.
  TS_REQUIRE_ALL(io_error([&] { ts::io::require_writable_directory(MPI_COMM_WORLD, blocker); }, "not a folder"));
  ts::io::require_writable_directory(MPI_COMM_WORLD, "");
  ts::io::require_writable_directory(MPI_COMM_WORLD, folder + "/sub/");
  ts::io::require_writable_directory(MPI_COMM_WORLD, folder + "/hf");
  MPI_Barrier(MPI_COMM_WORLD);
  TS_REQUIRE_ALL(std::distance(std::filesystem::directory_iterator(folder + "/sub"), std::filesystem::directory_iterator()) == 0);
  TS_REQUIRE_ALL(!std::filesystem::exists(folder + "/hf"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::require_writable_directory(MPI_COMM_WORLD, blocker + "/hf"); }, blocker));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::filesystem::remove_all(folder);
    std::filesystem::remove(blocker);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("every writer writes a ZeRO-3 parameter's true values between its uses; gather() still says it holds none",
          "[io][zero]") {
  // After step(), stage 3 keeps each rank's chunk and releases the parameter. What the writers
  // put in files must be its values (they once wrote zeros or crashed), on every mesh.
  const std::string npy = scratch_file("released.npy"), st = scratch_file("released.safetensors"),
                    dir = scratch_file("released_checkpoint");
  using Rows = ts::Spec<ts::S<"x">, ts::R>;
  using Weight = ts::Spec<ts::R, ts::S<"y">>;
  on_every_mesh([&](M2& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    ts::nn::Linear<double, M2, Weight> lin(mesh, 5, 7, 1);
    ts::nn::AdamW opt({.lr = 1e-2, .zero_stage = 3, .data_axis = "x"});
    opt.add(lin);
    const auto x = ts::distribute<Rows>(mesh, values(6, 5, 2));
    ts::ad::backward(lin, [&] { return ts::sum<0, 1>(lin(x)); });
    opt.step();
    const bool released = !ts::detail::TensorAccess::has_storage(lin.weight());
    TS_REQUIRE_ALL(released == (sizes[0] > 1));  // a data axis of 1 has nothing to shard
    if (released) {
      bool refused = false;
      try {
        (void)lin.weight().gather();
      } catch (const ts::SpecError& e) {
        refused = std::string(e.what()).find("opt.gather_parameters()") != std::string::npos;
      }
      TS_REQUIRE_ALL(refused);
    }
    ts::io::save_npy(npy, lin.weight());
    ts::io::save_safetensors(st, {{"weight", lin.weight()}, {"bias", lin.bias()}});
    const std::uint64_t sum = ts::io::checksum(lin.weight());
    {
      ts::io::CheckpointWriter ck(mesh.comm(), dir);
      ck.add("weight", lin.weight());
      ck.commit();
    }
    TS_REQUIRE_ALL(!ts::detail::TensorAccess::has_storage(lin.weight()) == released);  // still released
    opt.gather_parameters();
    const Eigen::Tensor<double, 2> w = lin.weight().gather();
    const Eigen::Tensor<double, 1> b = lin.bias().gather();
    double largest = 0;
    for (Eigen::Index i = 0; i < w.size(); ++i) largest = std::max(largest, std::abs(w.data()[i]));
    TS_REQUIRE_ALL(largest > 0.05);  // (no file of zeros passes below)
    TS_REQUIRE_ALL(compare(ts::io::load_npy<double, Rows>(mesh, npy).gather(), w) == "");
    ts::io::SafetensorsReader in(mesh.comm(), st);
    TS_REQUIRE_ALL(compare(in.load<double, Rows>(mesh, "weight").gather(), w) == "");
    TS_REQUIRE_ALL(compare(in.load<double, ts::Spec<ts::S<"y">>>(mesh, "bias").gather(), b) == "");
    TS_REQUIRE_ALL(compare(ts::io::CheckpointReader(mesh.comm(), dir).load<double, Rows>(mesh, "weight").gather(), w) == "");
    TS_REQUIRE_ALL(sum == ts::io::checksum(lin.weight()));
  });
  remove_on_rank0(npy);
  remove_on_rank0(st);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("every writer writes a partial sum's total: save_npy, safetensors, checkpoints and checksum", "[io]") {
  // Rows over x, a partial sum over y: each y rank holds (y coordinate + 1) x the values, 7 x 5
  // rows split unevenly; the files hold the total, (1 + ... + |y|) x the values.
  const std::string npy = scratch_file("partial.npy"), st = scratch_file("partial.safetensors"),
                    dir = scratch_file("partial_checkpoint");
  using Rows = ts::Spec<ts::S<"x">, ts::R>;
  using Partial = ts::ShardedTensor<double, M2, Rows, ts::PartialSum<"y">>;
  on_every_mesh([&](M2& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    const Eigen::Tensor<double, 2> g = values(7, 5, 3);
    const auto whole = ts::distribute<Rows>(mesh, g);
    const auto part = whole * double(mesh.coord<"y">() + 1);  // this y rank's part, laid out as Rows
    const Partial p(ts::detail::AdoptStorage{}, mesh, {7, 5}, ts::detail::TensorAccess::storage(part));
    const int k = sizes[1];
    const Eigen::Tensor<double, 2> want = p.gather();  // the total, summed as every resolution sums it
    const Eigen::Tensor<double, 2> formula = g * double(k * (k + 1) / 2);
    TS_REQUIRE_ALL(compare(want, formula, 1e-14) == "");
    const std::uint64_t sum = ts::io::checksum(p);
    TS_REQUIRE_ALL(sum == ts::io::checksum(ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, want)));
    ts::io::save_npy(npy, p);
    ts::io::save_safetensors(st, {{"p", p}, {"p16", p, "BF16"}});
    {
      ts::io::CheckpointWriter ck(mesh.comm(), dir);
      ck.add("p", p);
      ck.commit();
    }
    TS_REQUIRE_ALL(compare(ts::io::load_npy<double, Rows>(mesh, npy).gather(), want) == "");
    ts::io::SafetensorsReader in(mesh.comm(), st);
    TS_REQUIRE_ALL(compare(in.load<double, ts::Spec<ts::R, ts::S<"y">>>(mesh, "p").gather(), want) == "");
    const Eigen::Tensor<double, 2> rounded = in.load<double, Rows>(mesh, "p16").gather();
    double worst = 0;
    for (Eigen::Index i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(rounded.data()[i] - want.data()[i]) / (1e-30 + std::abs(want.data()[i])));
    TS_REQUIRE_ALL(worst <= 1.0 / 256);  // bfloat16's rounding of the total, not of one rank's part
    TS_REQUIRE_ALL(compare(ts::io::CheckpointReader(mesh.comm(), dir).load<double, Rows>(mesh, "p").gather(), want) == "");
  });
  remove_on_rank0(npy);
  remove_on_rank0(st);
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
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

// ---- safetensors ----

namespace {

// A safetensors file as another writer (numpy's tobytes, PyTorch) lays it out: the header, then
// each tensor's bytes in C order (the last index fastest), written by the first rank.
struct RawTensor {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};
void write_raw_safetensors(const std::string& path, const std::vector<RawTensor>& tensors) {
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    std::vector<ts::io::detail::SafetensorsEntry> entries;
    std::int64_t at = 0;
    for (const auto& t : tensors) {
      entries.push_back({t.name, t.dtype, t.shape, at, at + std::int64_t(t.bytes.size())});
      at += std::int64_t(t.bytes.size());
    }
    std::ofstream f(path, std::ios::binary);
    const std::string header = ts::io::detail::safetensors_header(entries, {{"format", "pt"}});
    f.write(header.data(), std::streamsize(header.size()));
    for (const auto& t : tensors) f.write(t.bytes.data(), std::streamsize(t.bytes.size()));
  }
  MPI_Barrier(MPI_COMM_WORLD);
}
// want's elements row after row, each converted by `encode` to the bytes of a file's dtype.
template <class F>
std::string c_order_bytes(const Eigen::Tensor<double, 2>& want, F encode) {
  std::string out;
  for (Eigen::Index i = 0; i < want.dimension(0); ++i)
    for (Eigen::Index j = 0; j < want.dimension(1); ++j) {
      const auto v = encode(want(i, j));
      out.append(reinterpret_cast<const char*>(&v), sizeof(v));
    }
  return out;
}
// Values every dtype holds exactly: multiples of 1/8 below 64 in magnitude.
Eigen::Tensor<double, 2> exact_values(Eigen::Index r, Eigen::Index c, int salt) {
  Eigen::Tensor<double, 2> v(r, c);
  for (Eigen::Index i = 0; i < v.size(); ++i) v.data()[i] = double(((i * 37 + salt * 11) % 509) - 254) / 8.0;
  return v;
}
std::uint16_t half_bits(double v) {  // v a multiple of 1/8 below 64: exact in binary16
  if (v == 0) return 0;
  const std::uint16_t sign = v < 0 ? 0x8000 : 0;
  int e = 0;
  const double m = std::frexp(std::abs(v), &e);  // |v| = m 2^e, m in [0.5, 1)
  return std::uint16_t(sign | std::uint16_t((e - 1 + 15) << 10) | std::uint16_t(std::lround((2 * m - 1) * 1024)));
}

}  // namespace

TEST_CASE("save_safetensors and load_safetensors round-trip bitwise across specs and meshes for every element type",
          "[io][safetensors]") {
  const std::string path = scratch_file("roundtrip.safetensors");
  auto check = [&]<class T>(T*) {
    const Eigen::Tensor<T, 2> want = typed_values<T>(7, 5, 3);
    on_every_mesh([&](M2& mesh, auto sizes) {
      for_each_pair(Specs2{}, Specs2{}, [&]<class A, class B>(A*, B*) {
        INFO("mesh " << sizes[0] << "x" << sizes[1] << " " << spec_name<A>(mesh) << " -> " << spec_name<B>(mesh));
        const auto x = ts::distribute<A>(mesh, want);
        ts::io::save_safetensors(path, {{"w", x}, {"w.t", ts::distribute<B>(mesh, Eigen::Tensor<T, 2>(want.shuffle(
                                                                                     Eigen::array<int, 2>{1, 0})))}});
        TS_REQUIRE_ALL(bitwise_equal<T>(ts::io::load_safetensors<T, B>(mesh, path, "w").gather(), want));
        ts::io::SafetensorsReader in(mesh.comm(), path);
        TS_REQUIRE_ALL((in.shape("w") == std::vector<std::int64_t>{7, 5} && in.shape("w.t") == std::vector<std::int64_t>{5, 7}));
        const Eigen::Tensor<T, 2> back = in.load<T, A>(mesh, "w.t", {5, 7}).gather();
        TS_REQUIRE_ALL(bitwise_equal<T>(Eigen::Tensor<T, 2>(back.shuffle(Eigen::array<int, 2>{1, 0})), want));
      });
    });
  };
  check(static_cast<float*>(nullptr));
  check(static_cast<double*>(nullptr));
  check(static_cast<std::int32_t*>(nullptr));
  check(static_cast<std::int64_t*>(nullptr));
  // The file is C order with the global shape, as PyTorch and numpy read it: a[i, j] == x(i, j).
  M2 world({world_size(), 1});
  const Eigen::Tensor<double, 2> x = values(4, 3, 2);
  ts::io::save_safetensors(path, {{"x", ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(world, x)}}, {{"format", "pt"}});
  int ok = 1;
  if (world_rank() == 0) {
    std::ifstream f(path, std::ios::binary);
    const std::string whole((std::istreambuf_iterator<char>(f)), {});
    const auto h = ts::io::detail::parse_safetensors_header(whole.data(), whole.size(), path);
    ok = h.tensors.size() == 1 && h.tensors[0].shape == std::vector<std::int64_t>{4, 3} && h.metadata.at("format") == "pt" &&
         h.data_offset % 8 == 0 && whole.size() == std::size_t(h.data_offset + 96) &&
         whole.substr(std::size_t(h.data_offset)) == c_order_bytes(x, [](double v) { return v; });
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  TS_REQUIRE_ALL(ok == 1);
  // A rank-3 tensor written on the world, read on one rank alone.
  Eigen::Tensor<float, 3> cube(4, 3, 5);
  for (Eigen::Index i = 0; i < cube.size(); ++i) cube.data()[i] = 0.25f * float(i) - 3;
  ts::io::save_safetensors(path, {{"cube", ts::distribute<ts::Spec<ts::R, ts::S<"x">, ts::R>>(world, cube)}});
  M2 self(MPI_COMM_SELF, {1, 1});
  const Eigen::Tensor<float, 3> alone =
      ts::io::load_safetensors<float, ts::Spec<ts::S<"x">, ts::R, ts::R>>(self, path, "cube").gather();
  TS_REQUIRE_ALL(std::memcmp(alone.data(), cube.data(), sizeof(float) * 60) == 0);
  remove_on_rank0(path);
}

TEST_CASE("ranks that hold different tensors (pipeline stages) write one safetensors file together", "[io][safetensors]") {
  const std::string path = scratch_file("stages.safetensors");
  // Each rank alone is a stage: it lists its own tensor on its own one-rank mesh, and rank 0 a
  // shared one too.
  M2 self(MPI_COMM_SELF, {1, 1});
  const Eigen::Tensor<double, 2> mine = values(3, world_rank() + 2, world_rank());
  const auto local = ts::distribute<ts::Spec<ts::R, ts::R>>(self, mine);
  ts::io::save_safetensors(MPI_COMM_WORLD, path, {{"stage" + std::to_string(world_rank()), local}});
  M2 world({1, world_size()});
  ts::io::SafetensorsReader in(MPI_COMM_WORLD, path);
  TS_REQUIRE_ALL(int(in.names().size()) == world_size());
  for (int r = 0; r < world_size(); ++r) {
    const auto back = in.load<double, ts::Spec<ts::R, ts::S<"y">>>(world, "stage" + std::to_string(r));
    TS_REQUIRE_ALL(compare(back.gather(), values(3, r + 2, r)) == "");
  }
  // Two ranks listing one name with two shapes is an error on every rank, and nothing is written.
  if (world_size() > 1) {
    TS_REQUIRE_ALL(io_error([&] { ts::io::save_safetensors(MPI_COMM_WORLD, path + "2", {{"same", local}}); },
                            "two shapes"));
    TS_REQUIRE_ALL(!std::filesystem::exists(path + "2"));
  }
  remove_on_rank0(path);
}

TEST_CASE("load_safetensors reads BF16, F16, F32 and F64 files as other writers lay them out, and models split over files",
          "[io][safetensors]") {
  const std::string path = scratch_file("typed.safetensors");
  const Eigen::Tensor<double, 2> want = exact_values(6, 5, 1);
  write_raw_safetensors(path, {{"bf16", "BF16", {6, 5}, c_order_bytes(want, [](double v) {
                                  return ts::io::detail::float_to_bfloat16(float(v)); })},
                               {"f16", "F16", {6, 5}, c_order_bytes(want, half_bits)},
                               {"f32", "F32", {6, 5}, c_order_bytes(want, [](double v) { return float(v); })},
                               {"f64", "F64", {6, 5}, c_order_bytes(want, [](double v) { return v; })},
                               {"ids", "I64", {6, 5}, c_order_bytes(want, [](double v) { return std::int64_t(8 * v); })}});
  on_every_mesh([&](M2& mesh, auto sizes) {
    ts::io::SafetensorsReader in(mesh.comm(), path);
    for_each_type(Specs2{}, [&]<class S>(S*) {
      for (const char* dtype : {"bf16", "f16", "f32", "f64"}) {
        INFO("mesh " << sizes[0] << "x" << sizes[1] << " " << spec_name<S>(mesh) << " " << dtype);
        TS_REQUIRE_ALL(compare(in.load<double, S>(mesh, dtype).gather(), want) == "");
        const Eigen::Tensor<float, 2> f = in.load<float, S>(mesh, dtype).gather();
        TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(f.cast<double>()), want) == "");
      }
      const Eigen::Tensor<std::int32_t, 2> ids = in.load<std::int32_t, S>(mesh, "ids").gather();
      TS_REQUIRE_ALL(compare(Eigen::Tensor<double, 2>(ids.cast<double>() / 8.0), want) == "");
    });
  });
  // Hugging Face's sharded layout: an index naming, per tensor, the file that holds it.
  const std::string dir = scratch_file("sharded_model");
  if (world_rank() == 0) std::filesystem::create_directories(dir);
  write_raw_safetensors(dir + "/part-1.safetensors", {{"a.weight", "F32", {6, 5}, c_order_bytes(want, [](double v) { return float(v); })}});
  write_raw_safetensors(dir + "/part-2.safetensors", {{"b.weight", "BF16", {6, 5}, c_order_bytes(want, [](double v) {
                                                         return ts::io::detail::float_to_bfloat16(float(-v)); })}});
  if (world_rank() == 0)
    std::ofstream(dir + "/model.safetensors.index.json")
        << "{\"metadata\": {\"total_size\": 180},\n \"weight_map\": {\"a.weight\": \"part-1.safetensors\", "
           "\"b.weight\": \"part-2.safetensors\"}}\n";
  MPI_Barrier(MPI_COMM_WORLD);
  M2 mesh({1, world_size()});
  for (const std::string& source : {dir, dir + "/model.safetensors.index.json"}) {
    ts::io::SafetensorsReader in(MPI_COMM_WORLD, source);
    TS_REQUIRE_ALL((in.names() == std::vector<std::string>{"a.weight", "b.weight"} && in.dtype("b.weight") == "BF16"));
    TS_REQUIRE_ALL(compare(in.load<double, ts::Spec<ts::R, ts::S<"y">>>(mesh, "a.weight").gather(), want) == "");
    TS_REQUIRE_ALL(compare(in.load<double, ts::Spec<ts::S<"y">, ts::R>>(mesh, "b.weight").gather(),
                           Eigen::Tensor<double, 2>(-want)) == "");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::filesystem::remove_all(dir);
  remove_on_rank0(path);
}

TEST_CASE("a missing, truncated or corrupt safetensors file, tensor, shape or dtype is an IoError on every rank",
          "[io][safetensors]") {
  M2 mesh({world_size(), 1});
  using S = ts::Spec<ts::S<"x">, ts::R>;
  const std::string good = scratch_file("good.safetensors"), bad = scratch_file("bad.safetensors");
  ts::io::save_safetensors(good, {{"w", ts::distribute<S>(mesh, values(4, 3, 2))}});
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<double, S>(mesh, scratch_file("missing.safetensors"), "w"); },
                          "cannot open"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<double, S>(mesh, good, "v"); }, "has no tensor \"v\""));
  TS_REQUIRE_ALL(io_error([&] { ts::io::SafetensorsReader(mesh.comm(), good).load<double, S>(mesh, "w", {3, 4}); },
                          "has shape [4, 3], not [3, 4]"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<double, ts::Spec<ts::S<"x">>>(mesh, good, "w"); }, "rank 2"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<std::int32_t, S>(mesh, good, "w"); }, "does not convert"));
  std::string whole;
  {
    std::ifstream f(good, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(f), {});
  }
  auto write_bad = [&](const std::string& bytes) {
    MPI_Barrier(MPI_COMM_WORLD);
    if (world_rank() == 0) std::ofstream(bad, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    MPI_Barrier(MPI_COMM_WORLD);
  };
  write_bad(whole.substr(0, whole.size() - 8));  // one element short
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<double, S>(mesh, bad, "w"); }, "truncated"));
  write_bad(whole.substr(0, 30));  // inside the header
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<double, S>(mesh, bad, "w"); }, "header"));
  std::string corrupt = whole;
  corrupt.replace(corrupt.find("\"shape\":[4,3]"), 13, "\"shape\":[4,4]");  // the offsets no longer fit the shape
  write_bad(corrupt);
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<double, S>(mesh, bad, "w"); }, "data_offsets"));
  write_bad(std::string("\x05\0\0\0\0\0\0\0{\"a\":", 13));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load_safetensors<double, S>(mesh, bad, "w"); }, "not valid JSON"));
  write_bad("{\"weight_map\": {\"w\": \"no-such-part.safetensors\"}}");
  TS_REQUIRE_ALL(io_error([&] { ts::io::SafetensorsReader(mesh.comm(), bad); }, "is not a valid safetensors file"));
  const std::string index = scratch_file("bad.index.json");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::ofstream(index) << "{\"weight_map\": {\"v\": \"" + good + "\"}}";
  MPI_Barrier(MPI_COMM_WORLD);
  TS_REQUIRE_ALL(io_error([&] { ts::io::SafetensorsReader(mesh.comm(), index); }, "does not hold it"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::save_safetensors("/proc/no/such/dir/x.safetensors", {{"w", ts::distribute<S>(mesh, values(4, 3, 2))}}); },
                          "cannot open"));
  remove_on_rank0(good);
  remove_on_rank0(bad);
  remove_on_rank0(index);
}

TEST_CASE("a safetensors file numpy writes (C order, float16 and float64) reads on every spec, and numpy reads ours",
          "[io][safetensors]") {
  const std::string python = world_rank() == 0 ? python_with("numpy") : "";
  int have = python.empty() ? 0 : 1;
  MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!have) {
    WARN("python3-numpy is not installed: numpy's files are not checked");
    return;
  }
  const std::string theirs = scratch_file("numpy.safetensors"), ours = scratch_file("ours.safetensors");
  const Eigen::Tensor<double, 2> want = exact_values(5, 7, 4);
  int ok = 1;
  if (world_rank() == 0) {  // the format by hand, as a user without the safetensors package writes it
    const std::string script =
        "import json, struct, numpy as np\n"
        "a = np.array(" + python_list(want) + ")\n"
        "parts = [('h', a.astype(np.float16)), ('d', a.astype(np.float64))]\n"
        "header, blobs, at = {}, [], 0\n"
        "for name, x in parts:\n"
        "    b = np.ascontiguousarray(x).tobytes()\n"
        "    header[name] = {'dtype': {'float16': 'F16', 'float64': 'F64'}[str(x.dtype)], 'shape': list(x.shape),"
        " 'data_offsets': [at, at + len(b)]}\n"
        "    blobs.append(b); at += len(b)\n"
        "j = json.dumps(header).encode()\n"
        "open('" + theirs + "', 'wb').write(struct.pack('<Q', len(j)) + j + b''.join(blobs))\n";
    ok = std::system((python + " -c \"" + script + "\"").c_str()) == 0 ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  TS_REQUIRE_ALL(ok == 1);
  on_every_mesh([&](M2& mesh, auto sizes) {
    ts::io::SafetensorsReader in(mesh.comm(), theirs);
    for_each_type(Specs2{}, [&]<class S>(S*) {
      INFO("mesh " << sizes[0] << "x" << sizes[1] << " " << spec_name<S>(mesh));
      TS_REQUIRE_ALL(compare(in.load<double, S>(mesh, "h").gather(), want) == "");
      TS_REQUIRE_ALL(compare(in.load<double, S>(mesh, "d").gather(), want) == "");
    });
  });
  M2 mesh({world_size(), 1});
  ts::io::save_safetensors(ours, {{"x", ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, want)}});
  if (world_rank() == 0) {
    const std::string script = "import json, struct, sys, numpy as np\n"
                               "b = open('" + ours + "', 'rb').read(); n = struct.unpack('<Q', b[:8])[0]\n"
                               "e = json.loads(b[8:8 + n])['x']; s, t = e['data_offsets']\n"
                               "a = np.frombuffer(b[8 + n + s:8 + n + t], dtype=np.float64).reshape(e['shape'])\n"
                               "sys.exit(0 if np.array_equal(a, np.array(" + python_list(want) + ")) else 1)\n";
    ok = std::system((python + " -c \"" + script + "\"").c_str()) == 0 ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  TS_REQUIRE_ALL(ok == 1);
  remove_on_rank0(theirs);
  remove_on_rank0(ours);
}

TEST_CASE("tensors are stored as F16, BF16 or F32 rounded to nearest even, listed by dtype then name", "[io][safetensors]") {
  const std::string path = scratch_file("stored.safetensors");
  M2 world({world_size(), 1});
  Eigen::Tensor<double, 2> x(7, 5);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = std::ldexp(1.0 + double(i) / 37.0, int(i % 23) - 11) * (i % 2 ? -1 : 1);
  const auto d = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(world, x);
  ts::io::save_safetensors(path, {{"z.half", d, "F16"}, {"b.brain", d, "BF16"}, {"a.single", d, "F32"}, {"c.same", d}});
  ts::io::SafetensorsReader in(MPI_COMM_WORLD, path);
  TS_REQUIRE_ALL(in.dtype("z.half") == "F16" && in.dtype("b.brain") == "BF16" && in.dtype("a.single") == "F32" && in.dtype("c.same") == "F64");
  const Eigen::Tensor<float, 2> half = in.load<float, ts::Spec<ts::R, ts::R>>(world, "z.half").gather();
  const Eigen::Tensor<float, 2> brain = in.load<float, ts::Spec<ts::R, ts::R>>(world, "b.brain").gather();
  const Eigen::Tensor<float, 2> single = in.load<float, ts::Spec<ts::R, ts::R>>(world, "a.single").gather();
  bool ok = true;
  for (Eigen::Index i = 0; i < x.size(); ++i) {  // (float to half by hand: the nearest, ties to even)
    const float f = float(x.data()[i]);
    ok &= single.data()[i] == f;
    ok &= brain.data()[i] == ts::io::detail::bfloat16_to_float(ts::io::detail::float_to_bfloat16(f));
    ok &= half.data()[i] == ts::io::detail::float16_to_float(ts::io::detail::float_to_float16(f));
  }
  TS_REQUIRE_ALL(ok);
  // The safetensors library's layout: widest dtype first, then by name (F64, F32, BF16, F16).
  std::ifstream f(path, std::ios::binary);
  std::vector<char> whole((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const auto h = ts::io::detail::parse_safetensors_header(whole.data(), whole.size(), path);
  std::vector<std::pair<std::int64_t, std::string>> by_offset;
  for (const auto& e : h.tensors) by_offset.emplace_back(e.begin, e.name);
  std::sort(by_offset.begin(), by_offset.end());
  TS_REQUIRE_ALL(by_offset.size() == 4 && by_offset[0].second == "c.same" && by_offset[1].second == "a.single" &&
                 by_offset[2].second == "b.brain" && by_offset[3].second == "z.half");
  TS_REQUIRE_ALL(io_error([&] { ts::io::NamedTensor("ids", ts::distribute<ts::Spec<ts::R, ts::R>>(world, Eigen::Tensor<std::int32_t, 2>(2, 2)), "F16"); },
                          "\"ids\" cannot be stored as F16 (its elements are I32)"));
  remove_on_rank0(path);
}

TEST_CASE("save_safetensors_shards writes shards and an index past the size, one file below it; the reader reads both", "[io][safetensors]") {
  const std::string dir = scratch_file("shards");
  M2 world({1, world_size()});
  std::vector<Eigen::Tensor<double, 2>> want;
  std::vector<ts::ShardedTensor<double, M2, ts::Spec<ts::R, ts::S<"y">>>> held;
  for (int k = 0; k < 5; ++k) want.push_back(values(3 + k, 4, k)), held.push_back(ts::distribute<ts::Spec<ts::R, ts::S<"y">>>(world, want.back()));
  std::vector<ts::io::NamedTensor> named;
  for (int k = 0; k < 5; ++k) named.emplace_back("t" + std::to_string(k), held[std::size_t(k)]);
  for (const std::int64_t max : {std::int64_t(1) << 30, std::int64_t(250)}) {  // one file; then shards of <= 250 bytes (or one tensor)
    const auto files = ts::io::save_safetensors_shards(MPI_COMM_WORLD, dir, named, max);
    const bool sharded = max < 1000;
    TS_REQUIRE_ALL(files.size() == (sharded ? 5u : 1u));  // 96+128 | 160 | 192 | 224 bytes, and the index
    TS_REQUIRE_ALL(std::filesystem::exists(dir + "/model.safetensors") == !sharded);
    TS_REQUIRE_ALL(std::filesystem::exists(dir + "/model.safetensors.index.json") == sharded);
    if (sharded) TS_REQUIRE_ALL(files[0] == "model-00001-of-00004.safetensors" && files[3] == "model-00004-of-00004.safetensors");
    ts::io::SafetensorsReader in(MPI_COMM_WORLD, dir);
    for (int k = 0; k < 5; ++k)
      TS_REQUIRE_ALL(compare(in.load<double, ts::Spec<ts::S<"y">, ts::R>>(world, "t" + std::to_string(k)).gather(), want[std::size_t(k)]) == "");
  }
  if (world_rank() == 0) std::filesystem::remove_all(dir);
}

TEST_CASE("LlamaConfig reads transformers 4 and 5 configs and names a field it does not implement", "[io][hf]") {
  using C = ts::train::LlamaConfig;
  const C v5 = C::parse(R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 24, "intermediate_size": 100, "num_hidden_layers": 3, "vocab_size": 300, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": true, "dtype": "bfloat16", "eos_token_id": [7, 9], "bos_token_id": 1,
    "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})", "v5");
  CHECK(v5.hidden_size == 64);
  CHECK(v5.kv_heads() == 1);
  CHECK(v5.head_size() == 24);
  CHECK(v5.rms_norm_eps == 1e-6);
  CHECK(v5.tie_word_embeddings);
  CHECK(v5.dtype == "bfloat16");
  CHECK(v5.eos_token_ids == std::vector<std::int32_t>{7, 9});
  CHECK(v5.bos_token_ids == std::vector<std::int32_t>{1});
  CHECK((v5.rope.llama3 && v5.rope.theta == 500000.0 && v5.rope.factor == 32.0));
  const C v4 = C::parse(R"({"hidden_size": 32, "num_attention_heads": 4, "rope_theta": 1000.0, "torch_dtype": "float16",
    "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 64}, "eos_token_id": 2})", "v4");
  CHECK((v4.rope.theta == 1000.0 && v4.rope.llama3 && v4.rope.original_max_position_embeddings == 64));
  CHECK((v4.kv_heads() == 4 && v4.head_size() == 8 && v4.dtype == "float16" && v4.rms_norm_eps == 1e-6));  // transformers' defaults
  CHECK((v4.bos_token_ids == std::vector<std::int32_t>{1} && v4.eos_token_ids == std::vector<std::int32_t>{2}));
  // Llama 3.1's rescaled frequencies: long wavelengths / factor, short ones kept, a smooth blend between.
  const ts::nn::Rope& r = v5.rope;
  const double f0 = r.inverse_frequency(0, 128), f_last = r.inverse_frequency(63, 128);
  CHECK(f0 == 1.0);                                                             // wavelength 2 pi: kept
  CHECK(f_last == Approx(std::pow(500000.0, -126.0 / 128) / 32).epsilon(1e-15));  // past 8192: divided
  // A config written back reads as itself.
  const C back = C::parse(v5.to_json("bfloat16"), "back");
  CHECK((back.hidden_size == 64 && back.head_size() == 24 && back.kv_heads() == 1 && back.rope.llama3 && back.rope.factor == 32.0 &&
         back.tie_word_embeddings && back.eos_token_ids == v5.eos_token_ids && back.rms_norm_eps == 1e-6));
  auto error = [](const std::string& json) {
    try {
      C::parse(json, "c.json");
    } catch (const ts::IoError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK_THAT(error(R"({"model_type": "qwen2"})"), Catch::Contains("c.json: \"model_type\" is \"qwen2\""));
  CHECK_THAT(error(R"({"rope_scaling": {"rope_type": "yarn"}})"), Catch::Contains("\"rope_scaling\" has rope type \"yarn\""));
  CHECK_THAT(error(R"({"mlp_bias": true})"), Catch::Contains("\"mlp_bias\" is true"));
  CHECK_THAT(error(R"({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}})"),
             Catch::Contains("\"rope_scaling\" with rope type \"llama3\" needs a positive \"low_freq_factor\""));
  CHECK_THAT(error(R"({"hidden_act": "gelu"})"), Catch::Contains("\"hidden_act\" is \"gelu\""));
  CHECK_THAT(error(R"({"hidden_size": -3})"), Catch::Contains("\"hidden_size\" is not a positive integer"));
  CHECK_THAT(error(R"({"num_attention_heads": 32, "num_key_value_heads": 5})"), Catch::Contains("does not divide"));
  CHECK_THAT(error(R"({"torch_dtype": "float64"})"), Catch::Contains("the dtype \"float64\""));
  CHECK_THAT(error("{"), Catch::Contains("c.json is not valid JSON"));
}
