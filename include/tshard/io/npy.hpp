// .npy interchange with numpy, in parallel: each rank writes and reads only its own block with
// MPI-IO at the right offsets; no rank gathers the tensor.
//
//   ts::io::save_npy("x.npy", x);                                    // numpy: a[i, j] == x(i, j)
//   auto y = ts::io::load_npy<float, ts::Spec<ts::R, ts::S<"x">>>(mesh, "x.npy");
//
// Files are written in Fortran order (our column-major data as is, 'fortran_order': True).
// C-order files (numpy's default) are read too, on any spec: each rank reads its box and
// reorders it locally. Element types: float, double, complex<float/double>, int32, int64.
// A missing, truncated or malformed file, another dtype or another rank is an IoError on
// every rank naming the file and what is wrong.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/collectives.hpp"
#include "tshard/comm/file.hpp"
#include "tshard/io/blocks.hpp"
#include "tshard/io/npy_format.hpp"
#include "tshard/reshard/reshard.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::io {
namespace detail {

using tshard::detail::Extents;
using tshard::detail::Index;

// Reads the header on the first rank, and every rank parses the same bytes: a bad header is the
// same IoError everywhere.
NpyHeader read_npy_header(tshard::detail::ParallelFile& file, const std::string& path);

}  // namespace detail

namespace detail {

// save_npy and load_npy on descriptors, per element type.
template <class T>
void save_npy_block(const std::string& path, const tshard::detail::BlockView<T>& x) {
  const int rank = x.spec.rank;
  std::vector<std::int64_t> shape(static_cast<std::size_t>(rank));
  for (int d = 0; d < rank; ++d) shape[std::size_t(d)] = x.shape[d];
  const std::string preamble = npy_preamble(npy_descr<T>(), true, shape);
  tshard::detail::Index bytes = tshard::detail::Index(sizeof(T));
  for (auto d : shape) bytes *= d;
  tshard::detail::ParallelFile file(x.mesh.comm(), path, tshard::detail::ParallelFile::Mode::Write, "tshard::io::save_npy");
  file.set_size(MPI_Offset(preamble.size()) + bytes);
  if (x.mesh.rank() == 0) file.write_at(0, preamble.data(), tshard::detail::Index(preamble.size()));
  const tshard::detail::FileBox box{rank, x.shape, x.layout.offset, x.layout.valid, x.layout.padded, true};
  file.write_box(MPI_Offset(preamble.size()), box, x.data, first_replica(x.mesh, x.spec, x.layout));
  file.agree_or_throw("writing");
}

template <class T>
tshard::detail::LoadedBlock<T> load_npy_block(tshard::detail::MeshState& mesh, const tshard::detail::SpecDesc& spec,
                                              const std::string& path) {
  const int rank = spec.rank;
  tshard::detail::ParallelFile file(mesh.comm(), path, tshard::detail::ParallelFile::Mode::Read, "tshard::io::load_npy");
  const NpyHeader h = read_npy_header(file, path);
  if (little_endian_descr(h.descr) != npy_descr<T>())
    throw IoError("tshard::io::load_npy: '" + path + "' holds dtype '" + h.descr + "', not the '" + npy_descr<T>() +
                  "' asked for");
  if (int(h.shape.size()) != rank)
    throw IoError("tshard::io::load_npy: '" + path + "' holds an array of rank " + std::to_string(h.shape.size()) +
                  ", not the rank " + std::to_string(rank) + " asked for");
  tshard::detail::LoadedBlock<T> out;
  for (int d = 0; d < rank; ++d) out.shape[d] = Eigen::Index(h.shape[std::size_t(d)]);
  const auto layout = tshard::detail::shard_layout(spec, out.shape, mesh.shape(), mesh.coords());
  out.data = tshard::detail::pooled_array<T>(static_cast<std::size_t>(layout.padded_size()));
  const tshard::detail::FileBox box{rank, out.shape, layout.offset, layout.valid, layout.padded, h.fortran_order};
  const bool mine = layout.valid_size() > 0;
  if (h.fortran_order) {
    file.read_box(MPI_Offset(h.data_offset), box, out.data.get(), mine);
  } else {
    tshard::detail::Scratch<T> c_order(static_cast<std::size_t>(std::max<tshard::detail::Index>(layout.valid_size(), 1)));
    file.read_box(MPI_Offset(h.data_offset), box, c_order.data(), mine);
    if (mine) place_c_order(c_order.data(), layout, out.data.get());
  }
  file.agree_or_throw("reading");
  return out;
}

}  // namespace detail

// Writes the global tensor (a partial is resolved first) as a .npy file, each rank its block.
template <ShardedTensorType X>
void save_npy(const std::string& path, const X& x_in) {
  static_assert(X::rank >= 1, "tshard: save_npy writes tensors of rank 1 or more");
  tshard::detail::OperatorScope scope("io::save_npy");
  const auto& resolved = tshard::detail::resolved(x_in, "io::save_npy");
  const tshard::detail::Readable values(resolved, "io::save_npy");  // a released ZeRO-3 parameter: gathered back
  detail::save_npy_block(path, tshard::detail::block_view(*values));
}

// Reads a .npy file (Fortran or C order) as a tensor with the given spec on `mesh`.
template <class T, class SpecT, MeshType M>
ShardedTensor<T, M, SpecT> load_npy(const M& mesh, const std::string& path) {
  using Out = ShardedTensor<T, M, SpecT>;
  static_assert(Out::rank >= 1, "tshard: load_npy reads tensors of rank 1 or more");
  tshard::detail::OperatorScope scope("io::load_npy");
  return tshard::detail::adopt_block<Out>(mesh, detail::load_npy_block<T>(*tshard::detail::state_of(mesh), Out::spec_desc, path));
}

// Rows of a .npy file read again and again (the batches of a token file), each rank only its
// block of each slice, with the next slice read in the background while a step computes:
//
//   ts::io::NpyRows<std::int32_t> data(mesh.comm(), "tokens.npy");   // [N, ...]
//   auto batch = data.read<ts::Spec<ts::S<"data">, ts::R>>(mesh, first, rows);
//   data.prefetch<ts::Spec<ts::S<"data">, ts::R>>(mesh, first + rows, rows);   // optional
//
// The file stays open; read() of what was prefetched only waits for it.
template <class T>
class NpyRows {
 public:
  NpyRows(MPI_Comm comm, const std::string& path)
      : path_(path), file_(std::make_unique<tshard::detail::ParallelFile>(comm, path, tshard::detail::ParallelFile::Mode::Read,
                                                                          "tshard::io::NpyRows")),
        header_(detail::read_npy_header(*file_, path)) {
    if (detail::little_endian_descr(header_.descr) != detail::npy_descr<T>())
      throw IoError("tshard::io::NpyRows: '" + path + "' holds dtype '" + header_.descr + "', not '" + detail::npy_descr<T>() + "'");
    if (header_.shape.empty()) throw IoError("tshard::io::NpyRows: '" + path + "' holds a scalar, not rows");
  }
  Eigen::Index rows() const { return Eigen::Index(header_.shape[0]); }
  const std::vector<std::int64_t>& shape() const { return header_.shape; }

  // Rows [first, first + count) as a tensor of the given spec (collective over mesh).
  template <class SpecT, MeshType M>
  ShardedTensor<T, M, SpecT> read(const M& mesh, Eigen::Index first, Eigen::Index count) {
    if (pending_ && pending_first_ == first && pending_count_ == count && pending_desc_ == ShardedTensor<T, M, SpecT>::spec_desc) {
      file_->finish_read();
      file_->agree_or_throw("reading rows of");
      auto* t = static_cast<ShardedTensor<T, M, SpecT>*>(pending_.get());
      ShardedTensor<T, M, SpecT> out = std::move(*t);
      if (!header_.fortran_order) reorder(out);
      pending_.reset();
      return out;
    }
    file_->finish_read();
    pending_.reset();
    prefetch<SpecT>(mesh, first, count);
    return read<SpecT>(mesh, first, count);
  }

  // Starts reading rows [first, first + count) in the background (collective over mesh).
  template <class SpecT, MeshType M>
  void prefetch(const M& mesh, Eigen::Index first, Eigen::Index count) {
    using Out = ShardedTensor<T, M, SpecT>;
    static_assert(Out::rank >= 1, "tshard: NpyRows reads tensors of rank 1 or more");
    if (int(header_.shape.size()) != Out::rank)
      throw IoError("tshard::io::NpyRows: '" + path_ + "' holds rank " + std::to_string(header_.shape.size()) + ", not " +
                    std::to_string(Out::rank));
    if (first < 0 || count < 0 || first + count > rows())
      throw IoError("tshard::io::NpyRows: rows [" + std::to_string(first) + ", " + std::to_string(first + count) + ") of '" +
                    path_ + "', which has " + std::to_string(rows()));
    file_->finish_read();
    std::array<Eigen::Index, Out::rank> shape{};
    shape[0] = count;
    tshard::detail::Extents global{};
    for (int d = 0; d < Out::rank; ++d) {
      global[d] = Eigen::Index(header_.shape[std::size_t(d)]);
      if (d > 0) shape[std::size_t(d)] = global[d];
    }
    auto out = std::make_shared<Out>(mesh, shape);
    const auto& layout = tshard::detail::layout_of(*out);
    tshard::detail::FileBox box{Out::rank, global, layout.offset, layout.valid, layout.padded, header_.fortran_order};
    box.start[0] += first;
    const bool mine = layout.valid_size() > 0;
    T* into = out->data();
    if (!header_.fortran_order) {  // read in C order into scratch, reordered on read()
      c_order_ = tshard::detail::pooled_array<T>(static_cast<std::size_t>(std::max<tshard::detail::Index>(layout.valid_size(), 1)));
      into = c_order_.get();
    }
    file_->start_read_box(MPI_Offset(header_.data_offset), box, into, mine);
    pending_ = out;
    pending_first_ = first;
    pending_count_ = count;
    pending_desc_ = Out::spec_desc;
  }

 private:
  template <class X>
  void reorder(X& out) {
    if (tshard::detail::layout_of(out).valid_size() > 0)
      detail::place_c_order(c_order_.get(), tshard::detail::layout_of(out), out.data());
  }

  std::string path_;
  std::unique_ptr<tshard::detail::ParallelFile> file_;
  detail::NpyHeader header_;
  std::shared_ptr<void> pending_;
  Eigen::Index pending_first_ = -1, pending_count_ = -1;
  tshard::detail::SpecDesc pending_desc_{};
  std::shared_ptr<T> c_order_;
};

}  // namespace tshard::io

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::io::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void save_npy_block<T>(const std::string&, \
    const tshard::detail::BlockView<T>&))
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(tshard::detail::LoadedBlock<T> load_npy_block<T>(tshard::detail::MeshState&, \
    const tshard::detail::SpecDesc&, const std::string&))
TSHARD_FOR_EACH_FLOAT(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::io::detail

#if TSHARD_HEADER_BODIES
#include "tshard/io/npy-inl.hpp"
#endif
