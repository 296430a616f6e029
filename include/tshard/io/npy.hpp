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
#include <string>
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/file.hpp"
#include "tshard/io/blocks.hpp"
#include "tshard/io/npy_format.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::io {
namespace detail {

using tshard::detail::Extents;
using tshard::detail::Index;

// Reads the header on the first rank, and every rank parses the same bytes: a bad header is the
// same IoError everywhere.
inline NpyHeader read_npy_header(tshard::detail::ParallelFile& file, const std::string& path) {
  const MPI_Offset size = file.size();
  const std::vector<char> head = file.read_everywhere(0, Index(std::min<MPI_Offset>(size, 1 << 20)));
  NpyHeader h = parse_npy_header(head.data(), head.size(), path);
  if (h.data_offset + h.data_bytes() > std::int64_t(size))
    throw IoError("tshard::io: '" + path + "' is truncated: its shape needs " + std::to_string(h.data_bytes()) +
                  " bytes of data, the file holds " + std::to_string(std::int64_t(size) - h.data_offset));
  return h;
}

}  // namespace detail

// Writes the global tensor (a partial is resolved first) as a .npy file, each rank its block.
template <ShardedTensorType X>
void save_npy(const std::string& path, const X& x_in) {
  using T = typename X::Scalar;
  static_assert(X::rank >= 1, "tshard: save_npy writes tensors of rank 1 or more");
  tshard::detail::OperatorScope scope("io::save_npy");
  const auto& x = tshard::detail::resolved(x_in, "io::save_npy");
  auto& mesh = *x.mesh().state();
  const auto& layout = x.layout();
  std::vector<std::int64_t> shape(X::rank);
  for (int d = 0; d < X::rank; ++d) shape[std::size_t(d)] = x.extents()[d];
  const std::string preamble = detail::npy_preamble(detail::npy_descr<T>(), true, shape);
  tshard::detail::Index bytes = tshard::detail::Index(sizeof(T));
  for (auto d : shape) bytes *= d;
  tshard::detail::ParallelFile file(mesh.comm(), path, tshard::detail::ParallelFile::Mode::Write, "tshard::io::save_npy");
  file.set_size(MPI_Offset(preamble.size()) + bytes);
  if (mesh.rank() == 0) file.write_at(0, preamble.data(), tshard::detail::Index(preamble.size()));
  const tshard::detail::FileBox box{X::rank, x.extents(), layout.offset, layout.valid, layout.padded, true};
  file.write_box(MPI_Offset(preamble.size()), box, x.data(), detail::first_replica(mesh, X::spec_desc, layout));
  file.agree_or_throw("writing");
}

// Reads a .npy file (Fortran or C order) as a tensor with the given spec on `mesh`.
template <class T, class SpecT, MeshType M>
ShardedTensor<T, M, SpecT> load_npy(const M& mesh, const std::string& path) {
  using Out = ShardedTensor<T, M, SpecT>;
  static_assert(Out::rank >= 1, "tshard: load_npy reads tensors of rank 1 or more");
  tshard::detail::OperatorScope scope("io::load_npy");
  const MPI_Comm comm = mesh.comm();
  tshard::detail::ParallelFile file(comm, path, tshard::detail::ParallelFile::Mode::Read, "tshard::io::load_npy");
  const detail::NpyHeader h = detail::read_npy_header(file, path);
  if (detail::little_endian_descr(h.descr) != detail::npy_descr<T>())
    throw IoError("tshard::io::load_npy: '" + path + "' holds dtype '" + h.descr + "', not the '" + detail::npy_descr<T>() +
                  "' asked for");
  if (int(h.shape.size()) != Out::rank)
    throw IoError("tshard::io::load_npy: '" + path + "' holds an array of rank " + std::to_string(h.shape.size()) +
                  ", not the rank " + std::to_string(Out::rank) + " asked for");
  std::array<Eigen::Index, Out::rank> shape{};
  for (int d = 0; d < Out::rank; ++d) shape[std::size_t(d)] = Eigen::Index(h.shape[std::size_t(d)]);
  Out out(mesh, shape);
  const auto& layout = out.layout();
  const tshard::detail::FileBox box{Out::rank, out.extents(), layout.offset, layout.valid, layout.padded, h.fortran_order};
  const bool mine = layout.valid_size() > 0;
  if (h.fortran_order) {
    file.read_box(MPI_Offset(h.data_offset), box, out.data(), mine);
  } else {
    tshard::detail::Scratch<T> c_order(static_cast<std::size_t>(std::max<tshard::detail::Index>(layout.valid_size(), 1)));
    file.read_box(MPI_Offset(h.data_offset), box, c_order.data(), mine);
    if (mine) detail::place_c_order(c_order.data(), layout, out.data());
  }
  file.agree_or_throw("reading");
  return out;
}

}  // namespace tshard::io
