// Parallel HDF5 through the typed API (the component tshard::hdf5) on every 2-D mesh: a dataset
// written with one spec reads back bitwise with another on any mesh and rank count, for every
// element type; datasets are added, replaced and nested in groups; the spec, mesh and dtype are
// attributes; h5py reads f[name][i, j] == x(i, j) (f[name][j, i] in column-major order) where it
// is installed; bad files and datasets are IoErrors on every rank.
#include "io_support.hpp"

#include <tshard/io/hdf5.hpp>

#include <fstream>

namespace ts = tshard;
using namespace tshard_test;

namespace {

std::string string_attribute(const std::string& file, const std::string& dataset, const char* name) {
  hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  hid_t a = H5Aopen(d, name, H5P_DEFAULT);
  hid_t t = H5Aget_type(a);
  std::string value(H5Tget_size(t), '\0');
  H5Aread(a, t, value.data());
  H5Tclose(t);
  H5Aclose(a);
  H5Dclose(d);
  H5Fclose(f);
  return value;
}

}  // namespace

TEST_CASE("io::save and io::load round-trip bitwise across specs, meshes and element types", "[hdf5]") {
  const std::string path = scratch_file("roundtrip.h5");
  remove_on_rank0(path);
  auto check = [&]<class T>(T*) {
    const Eigen::Tensor<T, 2> want = typed_values<T>(7, 5, 3);
    on_every_mesh([&](M2& mesh, auto sizes) {
      for_each_pair(Specs2{}, Specs2{}, [&]<class A, class B>(A*, B*) {
        for (const auto order : {ts::io::Order::row_major, ts::io::Order::column_major}) {
          INFO("mesh " << sizes[0] << "x" << sizes[1] << " " << spec_name<A>(mesh) << " -> " << spec_name<B>(mesh) << " "
                       << ts::io::detail::order_name(order));
          ts::io::save(path, "x", ts::distribute<A>(mesh, want), order);
          TS_REQUIRE_ALL(bitwise_equal<T>(ts::io::load<T, B>(mesh, path, "x").gather(), want));
        }
      });
    });
  };
  check(static_cast<float*>(nullptr));
  check(static_cast<double*>(nullptr));
  check(static_cast<std::complex<double>*>(nullptr));
  check(static_cast<std::int32_t*>(nullptr));
  check(static_cast<std::int64_t*>(nullptr));
  // Several datasets, one replaced by another shape, one in nested groups; a rank-3 tensor read
  // by one rank alone; a partial resolved before it is written.
  M2 world({world_size(), 1});
  const auto a = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(world, values(4, 3, 1));
  ts::io::save(path, "a", a);
  ts::io::save(path, "model/layer0/w", a);
  ts::io::save(path, "a", ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(world, values(2, 9, 2)));
  Eigen::Tensor<double, 3> cube(3, 4, 5);
  for (Eigen::Index i = 0; i < cube.size(); ++i) cube.data()[i] = double(i) - 7;
  ts::io::save(path, "cube", ts::distribute<ts::Spec<ts::R, ts::R, ts::S<"x">>>(world, cube));
  ts::io::save(path, "sum", ts::sum<0>(a));
  ts::io::save(path, "cube_f", ts::distribute<ts::Spec<ts::S<"x">, ts::R, ts::R>>(world, cube), ts::io::Order::column_major);
  ts::io::save(path, "sum_f", ts::sum<0>(a), ts::io::Order::column_major);
  // An empty tensor, and one with fewer rows than ranks (ranks without a block take part).
  ts::io::save(path, "empty", ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(world, values(0, 3, 1)), ts::io::Order::column_major);
  ts::io::save(path, "empty_c", ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(world, values(3, 0, 1)));
  TS_REQUIRE_ALL(ts::io::load<double, ts::Spec<ts::S<"x">, ts::R>>(world, path, "empty_c").global_shape()[1] == 0);
  ts::io::save(path, "thin", ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(world, values(1, 3, 1)), ts::io::Order::column_major);
  TS_REQUIRE_ALL(ts::io::load<double, ts::Spec<ts::R, ts::S<"x">>>(world, path, "empty").global_shape()[0] == 0);
  TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::R, ts::S<"x">>>(world, path, "thin").gather(), values(1, 3, 1)) == "");
  TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::R, ts::S<"x">, ts::R>>(world, path, "cube_f").gather(), cube) == "");
  TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::R, ts::R>>(world, path, "a").gather(), values(2, 9, 2)) == "");
  TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::R, ts::S<"x">>>(world, path, "model/layer0/w").gather(),
                         values(4, 3, 1)) == "");
  const Eigen::Tensor<double, 1> sum = values(4, 3, 1).sum(Eigen::array<int, 1>{0});
  TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::S<"x">>>(world, path, "sum").gather(), sum, 1e-12) == "");
  TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::R>>(world, path, "sum_f").gather(), sum, 1e-12) == "");
  M2 self(MPI_COMM_SELF, {1, 1});
  TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::S<"x">, ts::R, ts::R>>(self, path, "cube").gather(), cube) == "");
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    CHECK(string_attribute(path, "model/layer0/w", "tshard_spec") == "{x, R}");
    CHECK(string_attribute(path, "model/layer0/w", "tshard_mesh") == "{x: " + std::to_string(world_size()) + ", y: 1}");
    CHECK(string_attribute(path, "cube", "tshard_dtype") == "float64");
    CHECK(string_attribute(path, "cube", "tshard_order") == "row_major");
    CHECK(string_attribute(path, "cube_f", "tshard_order") == "column_major");
  }
  remove_on_rank0(path);
}

TEST_CASE("io::save writes a ZeRO-3 parameter's true values between its uses", "[hdf5][zero]") {
  const std::string path = scratch_file("released.h5");
  remove_on_rank0(path);
  on_every_mesh([&](M2& mesh, auto sizes) {
    INFO("mesh " << sizes[0] << "x" << sizes[1]);
    ts::nn::Linear<double, M2, ts::Spec<ts::R, ts::S<"y">>> lin(mesh, 5, 7, 1);
    ts::nn::AdamW opt({.lr = 1e-2, .zero_stage = 3, .data_axis = "x"});
    opt.add(lin);
    const auto x = ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, values(6, 5, 2));
    ts::ad::backward(lin, [&] { return ts::sum<0, 1>(lin(x)); });
    opt.step();  // released where the data axis has more than one rank
    ts::io::save(path, "w", lin.weight());
    opt.gather_parameters();
    const Eigen::Tensor<double, 2> w = lin.weight().gather();
    TS_REQUIRE_ALL(compare(ts::io::load<double, ts::Spec<ts::S<"x">, ts::R>>(mesh, path, "w").gather(), w) == "");
  });
  remove_on_rank0(path);
}

TEST_CASE("h5py reads what io::save writes: f[name][i, j] == x(i, j), or f[name][j, i] in column-major order", "[hdf5]") {
  const std::string python = world_rank() == 0 ? python_with("h5py") : "";
  int have = python.empty() ? 0 : 1;
  MPI_Bcast(&have, 1, MPI_INT, 0, MPI_COMM_WORLD);
  if (!have) {
    WARN("python3-h5py is not installed: h5py's reading is not checked");
    return;
  }
  const std::string path = scratch_file("h5py.h5");
  M2 mesh({world_size(), 1});
  const Eigen::Tensor<double, 2> x = values(5, 3, 4);
  ts::io::save(path, "group/x", ts::distribute<ts::Spec<ts::S<"x">, ts::R>>(mesh, x));
  Eigen::Tensor<std::complex<float>, 2> z(2, 3);
  for (Eigen::Index i = 0; i < z.size(); ++i) z.data()[i] = {float(i), -float(i)};
  ts::io::save(path, "z", ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, z));
  ts::io::save(path, "xf", ts::distribute<ts::Spec<ts::R, ts::S<"x">>>(mesh, x), ts::io::Order::column_major);
  int ok = 1;
  if (world_rank() == 0) {
    const std::string expect = python_list(x);
    const std::string cmd = python + " -c \"import h5py, numpy as np, sys; f = h5py.File('" + path +
                            "', 'r'); a = f['group/x'][()]; z = f['z'][()]; b = np.array(" + expect +
                            "); af = f['xf'][()]; sys.exit(0 if a.shape == (5, 3) and np.allclose(a, b, rtol=0, atol=1e-6) and "
                            "af.shape == (3, 5) and np.allclose(af.T, b, rtol=0, atol=1e-6) and z[1, 2] == "
                            "complex(" + std::to_string(z(1, 2).real()) + ", " + std::to_string(z(1, 2).imag()) +
                            ") and f['group/x'].attrs['tshard_dtype'] == b'float64' else 1)\"";
    ok = std::system(cmd.c_str()) == 0 ? 1 : 0;
  }
  MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
  TS_REQUIRE_ALL(ok == 1);
  remove_on_rank0(path);
}

TEST_CASE("a missing file or dataset, a file that is not HDF5, another dtype or rank, a truncated file: IoError on every rank",
          "[hdf5]") {
  M2 mesh({world_size(), 1});
  using S = ts::Spec<ts::S<"x">, ts::R>;
  const std::string good = scratch_file("good.h5"), bad = scratch_file("bad.h5");
  remove_on_rank0(good);
  ts::io::save(good, "w", ts::distribute<S>(mesh, values(6, 4, 2)));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load<double, S>(mesh, scratch_file("missing.h5"), "w"); }, "missing"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load<double, S>(mesh, good, "nothing"); }, "has no dataset 'nothing'"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load<float, S>(mesh, good, "w"); }, "holds float64, not the float32"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::load<double, ts::Spec<ts::S<"x">>>(mesh, good, "w"); }, "rank 2"));
  ts::io::save(good, "odd", ts::distribute<S>(mesh, values(6, 4, 2)));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) {
    hid_t f = H5Fopen(good.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t d = H5Dopen2(f, "odd", H5P_DEFAULT);
    ts::io::detail::write_string_attribute(d, "tshard_order", "diagonal");
    H5Dclose(d);
    H5Fclose(f);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  TS_REQUIRE_ALL(io_error([&] { ts::io::load<double, S>(mesh, good, "odd"); }, "neither row_major nor column_major"));
  std::string whole;
  {
    std::ifstream f(good, std::ios::binary);
    whole.assign(std::istreambuf_iterator<char>(f), {});
  }
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::ofstream(bad, std::ios::binary) << "this is not HDF5";
  MPI_Barrier(MPI_COMM_WORLD);
  TS_REQUIRE_ALL(io_error([&] { ts::io::load<double, S>(mesh, bad, "w"); }, "not an HDF5 file"));
  TS_REQUIRE_ALL(io_error([&] { ts::io::save(bad, "w", ts::distribute<S>(mesh, values(6, 4, 2))); }, "not an HDF5 file"));
  MPI_Barrier(MPI_COMM_WORLD);
  if (world_rank() == 0) std::ofstream(bad, std::ios::binary).write(whole.data(), std::streamsize(whole.size() / 2));
  MPI_Barrier(MPI_COMM_WORLD);
  TS_REQUIRE_ALL(io_error([&] { ts::io::load<double, S>(mesh, bad, "w"); }, "'" + bad + "'"));
  remove_on_rank0(good);
  remove_on_rank0(bad);
}
