// Parallel HDF5 (the component tshard::hdf5: find_package(tshard COMPONENTS hdf5), Debian's
// libhdf5-openmpi-dev): each rank writes and reads its own hyperslab, collectively.
//
//   ts::io::save("ckpt.h5", "w1", w1);    // creates the file if missing, adds or replaces "w1"
//   auto w = ts::io::load<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, "ckpt.h5", "w1");
//
// A dataset of the same dtype and shape is overwritten in place, another is replaced.
// By default a dataset holds the global tensor in HDF5's C order with the tensor's dims as they
// are, so h5py reads f["w1"][i, j] == w1(i, j); each rank transposes its block on the way.
// io::Order::column_major stores the dims reversed, as HDF5's Fortran API does: h5py then reads
// f["w1"][j, i] == w1(i, j), and every rank moves its block straight from its buffer, no copy
// (the fast order for checkpoints: at file-system speed, see bench/run_io.sh). load reads
// either, from the attribute tshard_order. Complex values are h5py's compound {r, i}. The spec,
// the mesh's shape and the dtype go in as string attributes (tshard_spec, tshard_mesh,
// tshard_dtype); load reads with any spec on any mesh and rank count. Dataset names may hold
// groups ("model/layer0/w"). A missing file or dataset, a file that is not HDF5, another dtype or
// rank is an IoError on every rank naming the file, the dataset and what is wrong.
#pragma once
#include <hdf5.h>

#include <complex>
#include <cstdio>
#include <cstdint>
#include <string>
#include <vector>

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/failure.hpp"
#include "tshard/comm/stats.hpp"
#include "tshard/io/blocks.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::io {

// How a dataset lays out the global tensor's elements.
enum class Order {
  row_major,     // HDF5's C order over the tensor's dims: f[name][i, j] == x(i, j) in h5py
  column_major,  // the dims reversed (HDF5's Fortran convention): f[name][j, i] == x(i, j); no transposition
};

namespace detail {

// An HDF5 handle closed by the right function at scope exit.
class H5Handle {
 public:
  H5Handle() = default;
  H5Handle(hid_t id, herr_t (*close)(hid_t)) : id_(id), close_(close) {}
  H5Handle(H5Handle&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = -1; }
  H5Handle& operator=(H5Handle&& o) noexcept {
    std::swap(id_, o.id_);
    std::swap(close_, o.close_);
    return *this;
  }
  H5Handle(const H5Handle&) = delete;
  H5Handle& operator=(const H5Handle&) = delete;
  ~H5Handle() {
    if (id_ >= 0 && close_) close_(id_);
  }
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_ = -1;
  herr_t (*close_)(hid_t) = nullptr;
};

// HDF5 prints its own error stack by default; ours are IoErrors.
inline void quiet_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

template <class T>
struct H5Element;
template <>
struct H5Element<float> {
  static H5Handle type() { return {H5Tcopy(H5T_NATIVE_FLOAT), H5Tclose}; }
  static constexpr const char* name = "float32";
};
template <>
struct H5Element<double> {
  static H5Handle type() { return {H5Tcopy(H5T_NATIVE_DOUBLE), H5Tclose}; }
  static constexpr const char* name = "float64";
};
template <>
struct H5Element<std::int32_t> {
  static H5Handle type() { return {H5Tcopy(H5T_NATIVE_INT32), H5Tclose}; }
  static constexpr const char* name = "int32";
};
template <>
struct H5Element<std::int64_t> {
  static H5Handle type() { return {H5Tcopy(H5T_NATIVE_INT64), H5Tclose}; }
  static constexpr const char* name = "int64";
};
template <class R>
struct H5Complex {
  static H5Handle type() {
    H5Handle t(H5Tcreate(H5T_COMPOUND, sizeof(std::complex<R>)), H5Tclose);
    const hid_t part = std::is_same_v<R, float> ? H5T_NATIVE_FLOAT : H5T_NATIVE_DOUBLE;
    H5Tinsert(t.get(), "r", 0, part);
    H5Tinsert(t.get(), "i", sizeof(R), part);
    return t;
  }
};
template <>
struct H5Element<std::complex<float>> : H5Complex<float> {
  static constexpr const char* name = "complex64";
};
template <>
struct H5Element<std::complex<double>> : H5Complex<double> {
  static constexpr const char* name = "complex128";
};

// The dtype of a dataset in our words (for messages), and whether it is T's.
inline std::string h5_type_name(hid_t type) {
  const H5T_class_t c = H5Tget_class(type);
  const std::size_t size = H5Tget_size(type);
  if (c == H5T_FLOAT) return "float" + std::to_string(8 * size);
  if (c == H5T_INTEGER) return std::string(H5Tget_sign(type) == H5T_SGN_NONE ? "uint" : "int") + std::to_string(8 * size);
  if (c == H5T_COMPOUND) return "compound of " + std::to_string(size) + " bytes";
  if (c == H5T_STRING) return "string";
  return "HDF5 class " + std::to_string(int(c));
}
template <class T>
bool h5_type_is(hid_t type) {
  const H5Handle want = H5Element<T>::type();
  return H5Tequal(type, want.get()) > 0;
}

inline H5Handle open_file(MPI_Comm comm, const std::string& path, bool write, const std::string& op) {
  quiet_hdf5();
  H5Handle fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose);
  H5Pset_fapl_mpio(fapl.get(), comm, MPI_INFO_NULL);
  // What is at the path is decided on one rank (alone: no MPI-IO), so every rank takes the same
  // branch: 0 nothing, 1 an HDF5 file, 2 something else.
  int state = 0;
  if (tshard::detail::comm_rank(comm) == 0) {
    if (std::FILE* probe = std::fopen(path.c_str(), "rb")) {
      std::fclose(probe);
      state = H5Fis_hdf5(path.c_str()) > 0 ? 1 : 2;  // (H5Fis_accessible from HDF5 1.12)
    }
  }
  tshard::detail::broadcast(comm, &state, 1, 0);
  if (state == 2) throw IoError(op + ": '" + path + "' is not an HDF5 file");
  if (state == 0 && !write) throw IoError(op + ": cannot open '" + path + "': it is missing");
  H5Handle file;
  if (state == 1) file = H5Handle(H5Fopen(path.c_str(), write ? H5F_ACC_RDWR : H5F_ACC_RDONLY, fapl.get()), H5Fclose);
  else file = H5Handle(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, fapl.get()), H5Fclose);
  const bool ok = file.ok();
  if (!agree(ok, comm))
    throw IoError(op + ": HDF5 cannot open '" + path + "'" + (write ? " for writing" : "") + (ok ? " (on another rank)" : ""));
  return file;
}

inline void write_string_attribute(hid_t object, const char* name, const std::string& value) {
  H5Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<std::size_t>(1, value.size()));
  H5Handle space(H5Screate(H5S_SCALAR), H5Sclose);
  if (H5Aexists(object, name) > 0) H5Adelete(object, name);
  H5Handle attr(H5Acreate2(object, name, type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  H5Awrite(attr.get(), type.get(), value.c_str());
}

// Selects this rank's box in the dataset's space and returns the memory space it moves from or to
// (a rank without a box selects nothing, and still takes part in the collective transfer).
// row_major: the memory is a contiguous C-order scratch of the box. column_major: the file's dims
// are ours reversed, and the memory is the rank's own padded buffer, seen in reversed dims, with
// the valid box selected in it.
inline H5Handle select_box(hid_t file_space, const tshard::detail::ShardLayout& layout, bool mine, Order order) {
  const int r = layout.rank;
  hsize_t start[tshard::detail::kMaxRank], count[tshard::detail::kMaxRank], padded[tshard::detail::kMaxRank];
  for (int d = 0; d < r; ++d) {
    const int f = order == Order::column_major ? r - 1 - d : d;
    start[f] = hsize_t(layout.offset[d]);
    count[f] = hsize_t(layout.valid[d]);
    padded[f] = hsize_t(std::max<tshard::detail::Index>(layout.padded[d], 1));
  }
  H5Handle memory(H5Screate_simple(r, order == Order::column_major ? padded : count, nullptr), H5Sclose);
  if (mine) {
    H5Sselect_hyperslab(file_space, H5S_SELECT_SET, start, nullptr, count, nullptr);
    if (order == Order::column_major) {
      const hsize_t zero[tshard::detail::kMaxRank] = {};
      H5Sselect_hyperslab(memory.get(), H5S_SELECT_SET, zero, nullptr, count, nullptr);
    }
  } else {
    H5Sselect_none(file_space);
    H5Sselect_none(memory.get());
  }
  return memory;
}

inline hsize_t element_count(const hsize_t* dims, int rank) {
  hsize_t n = 1;
  for (int d = 0; d < rank; ++d) n *= dims[d];
  return n;
}

inline const char* order_name(Order order) { return order == Order::column_major ? "column_major" : "row_major"; }

// A dataset's order from its attribute tshard_order; datasets without it (written by others) are
// row-major.
inline bool read_order(hid_t set, Order& order) {
  order = Order::row_major;
  if (H5Aexists(set, "tshard_order") <= 0) return true;
  H5Handle attr(H5Aopen(set, "tshard_order", H5P_DEFAULT), H5Aclose);
  H5Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (!attr.ok() || !type.ok() || H5Tget_class(type.get()) != H5T_STRING) return false;
  std::string value(H5Tget_size(type.get()), '\0');
  if (H5Aread(attr.get(), type.get(), value.data()) < 0) return false;
  value = value.c_str();
  if (value == "column_major") order = Order::column_major;
  return value == "column_major" || value == "row_major";
}

inline std::string mesh_string(const tshard::detail::MeshShape& mesh) {
  std::string s = "{";
  for (int a = 0; a < mesh.axes(); ++a) s += (a ? ", " : "") + mesh.names[a] + ": " + std::to_string(mesh.sizes[a]);
  return s + "}";
}

}  // namespace detail

// Writes the global tensor x (a partial is resolved first) as `dataset` of `file`, each rank its
// hyperslab; creates the file where missing and replaces a dataset of that name.
template <ShardedTensorType X>
void save(const std::string& file, const std::string& dataset, const X& x_in, Order order = Order::row_major) {
  using T = typename X::Scalar;
  static_assert(X::rank >= 1, "tshard: io::save writes tensors of rank 1 or more");
  const std::string op = "tshard::io::save";
  tshard::detail::OperatorScope scope("io::save");
  const auto& resolved = tshard::detail::resolved(x_in, "io::save");
  const tshard::detail::Readable values(resolved, "io::save");  // a released ZeRO-3 parameter: gathered back
  const auto& x = *values;
  auto& mesh = *tshard::detail::state_of(x.mesh());
  const MPI_Comm comm = mesh.comm();
  const auto& layout = tshard::detail::layout_of(x);
  detail::H5Handle f = detail::open_file(comm, file, true, op);
  bool ok = true;
  hsize_t dims[tshard::detail::kMaxRank];
  for (int d = 0; d < X::rank; ++d)
    dims[order == Order::column_major ? X::rank - 1 - d : d] = hsize_t(tshard::detail::extents_of(x)[d]);
  detail::H5Handle space(H5Screate_simple(X::rank, dims, nullptr), H5Sclose);
  const detail::H5Handle type = detail::H5Element<T>::type();
  detail::H5Handle set;
  if (H5Lexists(f.get(), dataset.c_str(), H5P_DEFAULT) > 0) {
    // A dataset of the same dtype and shape is overwritten in place (HDF5 does not reuse the
    // space of a deleted one: the file would grow by the tensor at every save); else replaced.
    set = detail::H5Handle(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT), H5Dclose);
    bool same = set.ok();
    if (same) {
      const detail::H5Handle old_type(H5Dget_type(set.get()), H5Tclose);
      const detail::H5Handle old_space(H5Dget_space(set.get()), H5Sclose);
      same = H5Tequal(old_type.get(), type.get()) > 0 && H5Sextent_equal(old_space.get(), space.get()) > 0;
    }
    if (!same) {
      set = detail::H5Handle();
      ok &= H5Ldelete(f.get(), dataset.c_str(), H5P_DEFAULT) >= 0;
    }
  }
  if (!set.ok()) {
    detail::H5Handle lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl.get(), 1);
    // Every element is written next: no fill values first (parallel HDF5 allocates early and
    // would write the whole dataset twice).
    detail::H5Handle dcpl(H5Pcreate(H5P_DATASET_CREATE), H5Pclose);
    H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER);
    set = detail::H5Handle(H5Dcreate2(f.get(), dataset.c_str(), type.get(), space.get(), lcpl.get(), dcpl.get(), H5P_DEFAULT),
                           H5Dclose);
  }
  if (!tshard::agree(set.ok(), comm))
    throw IoError(op + ": cannot create the dataset '" + dataset + "' in '" + file + "'");
  const bool mine = detail::first_replica(mesh, X::spec_desc, layout);
  const detail::H5Handle memory = detail::select_box(space.get(), layout, mine, order);
  const bool transpose = order == Order::row_major && X::rank > 1;
  tshard::detail::Scratch<T> box(transpose ? static_cast<std::size_t>(std::max<tshard::detail::Index>(layout.valid_size(), 1)) : 0);
  if (mine && transpose) detail::pack_c_order(x.data(), layout, box.data());
  detail::H5Handle xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(xfer.get(), H5FD_MPIO_COLLECTIVE);
  {
    tshard::detail::CollectiveTimer t("file_write", mine ? std::uint64_t(layout.valid_size()) * sizeof(T) : 0, 0);
    const T spare{};  // HDF5 wants a buffer where nothing is selected too
    const T* from = transpose ? box.data() : x.data();
    // (An empty dataset has no address, and HDF5 1.10 fails a collective write to it.)
    if (detail::element_count(dims, X::rank) > 0) ok &= H5Dwrite(set.get(), type.get(), memory.get(), space.get(), xfer.get(), from ? from : &spare) >= 0;
  }
  detail::write_string_attribute(set.get(), "tshard_spec", X::spec_desc.to_string(mesh.shape()));
  detail::write_string_attribute(set.get(), "tshard_mesh", detail::mesh_string(mesh.shape()));
  detail::write_string_attribute(set.get(), "tshard_dtype", detail::H5Element<T>::name);
  detail::write_string_attribute(set.get(), "tshard_order", detail::order_name(order));
  set = detail::H5Handle();  // (no fsync: durability is the checkpoint's business, as for MPI-IO)
  tshard::detail::throw_unless_all<IoError>(ok, comm, op + ": writing the dataset '" + dataset + "' of '" + file + "' failed");
}

// Reads `dataset` of `file` as a tensor with the given spec on `mesh`, each rank its hyperslab.
template <class T, class SpecT, MeshType M>
ShardedTensor<T, M, SpecT> load(const M& mesh, const std::string& file, const std::string& dataset) {
  using Out = ShardedTensor<T, M, SpecT>;
  static_assert(Out::rank >= 1, "tshard: io::load reads tensors of rank 1 or more");
  const std::string op = "tshard::io::load";
  tshard::detail::OperatorScope scope("io::load");
  const MPI_Comm comm = mesh.comm();
  detail::H5Handle f = detail::open_file(comm, file, false, op);
  const bool present = H5Lexists(f.get(), dataset.c_str(), H5P_DEFAULT) > 0;
  detail::H5Handle set;
  if (present) set = detail::H5Handle(H5Dopen2(f.get(), dataset.c_str(), H5P_DEFAULT), H5Dclose);
  if (!tshard::agree(set.ok(), comm))
    throw IoError(op + ": '" + file + "' has no dataset '" + dataset + "'" + (present ? " that HDF5 can open" : ""));
  detail::H5Handle type(H5Dget_type(set.get()), H5Tclose);
  if (!detail::h5_type_is<T>(type.get()))
    throw IoError(op + ": the dataset '" + dataset + "' of '" + file + "' holds " + detail::h5_type_name(type.get()) +
                  ", not the " + detail::H5Element<T>::name + " asked for");
  detail::H5Handle space(H5Dget_space(set.get()), H5Sclose);
  const int ndims = H5Sget_simple_extent_ndims(space.get());
  if (ndims != Out::rank)
    throw IoError(op + ": the dataset '" + dataset + "' of '" + file + "' has rank " + std::to_string(ndims) +
                  ", not the rank " + std::to_string(Out::rank) + " asked for");
  Order order;
  if (!detail::read_order(set.get(), order))
    throw IoError(op + ": the dataset '" + dataset + "' of '" + file + "' has a tshard_order attribute that is neither row_major nor column_major");
  hsize_t dims[tshard::detail::kMaxRank];
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  std::array<Eigen::Index, Out::rank> shape{};
  for (int d = 0; d < Out::rank; ++d) shape[std::size_t(d)] = Eigen::Index(dims[order == Order::column_major ? Out::rank - 1 - d : d]);
  Out out(mesh, shape);
  const auto& layout = tshard::detail::layout_of(out);
  const bool mine = layout.valid_size() > 0;
  const detail::H5Handle memory = detail::select_box(space.get(), layout, mine, order);
  const bool transpose = order == Order::row_major && Out::rank > 1;
  tshard::detail::Scratch<T> box(transpose ? static_cast<std::size_t>(std::max<tshard::detail::Index>(layout.valid_size(), 1)) : 0);
  detail::H5Handle xfer(H5Pcreate(H5P_DATASET_XFER), H5Pclose);
  H5Pset_dxpl_mpio(xfer.get(), H5FD_MPIO_COLLECTIVE);
  bool ok = true;
  {
    tshard::detail::CollectiveTimer t("file_read", 0, mine ? std::uint64_t(layout.valid_size()) * sizeof(T) : 0);
    T spare{};
    T* to = transpose ? box.data() : out.data();
    if (detail::element_count(dims, Out::rank) > 0) ok = H5Dread(set.get(), type.get(), memory.get(), space.get(), xfer.get(), to ? to : &spare) >= 0;
  }
  tshard::detail::throw_unless_all<IoError>(ok, comm,
                                            op + ": reading the dataset '" + dataset + "' of '" + file + "' failed (truncated or corrupt?)");
  if (mine && transpose) detail::place_c_order(box.data(), layout, out.data());
  return out;
}

}  // namespace tshard::io
