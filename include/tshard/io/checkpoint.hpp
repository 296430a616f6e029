// Checkpoints: a directory of .npy files (one per tensor, the global tensor, so a checkpoint
// saved on N ranks with some specs loads on M ranks with others) and a manifest with each
// tensor's checksum and the run's metadata (step, seed, ...).
//
//   ts::io::CheckpointWriter ck(mesh.comm(), "ckpt");
//   ck.add("w1", w1);  ck.set("step", "100");
//   ck.commit();                                   // atomic: all or nothing
//   ts::io::CheckpointReader in(mesh.comm(), "ckpt");
//   auto w = in.load<float, ts::Spec<ts::S<"x">, ts::R>>(mesh, "w1");   // checksum verified
//
// Atomic: everything is written into DIR.tmp; commit() fsyncs every file and the directory,
// then swaps DIR.tmp in for DIR by renames. A run killed during a save (even kill -9) leaves the
// previous DIR loadable; killed between the two renames, the reader takes DIR.old. The directory
// operations are done by the first rank: the checkpoint directory must be on a filesystem every
// rank sees (as MPI-IO needs anyway).
//
// Verifiable: a checksum of each tensor's global values (independent of the layout) is stored
// and checked on load. A missing or incomplete checkpoint, a missing tensor or a mismatch is an
// IoError on every rank.
#pragma once
#include <fcntl.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/failure.hpp"
#include "tshard/comm/text.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/io/blocks.hpp"
#include "tshard/io/npy.hpp"
#include "tshard/tensor/factories.hpp"

namespace tshard::io {

namespace detail {
// checksum on descriptors, per element type.
template <class T>
std::uint64_t checksum_block(const tshard::detail::BlockView<T>& x) {
  const int rank = x.spec.rank;
  std::uint64_t local = 0;
  if (first_replica(x.mesh, x.spec, x.layout)) {
    tshard::detail::for_each_local<tshard::detail::kMaxRank>(x.layout, [&](const auto& g, tshard::detail::Index at) {
      std::uint64_t index = 0, stride = 1;
      for (int d = 0; d < rank; ++d) {
        index += std::uint64_t(g[d]) * stride;
        stride *= std::uint64_t(x.shape[d]);
      }
      std::uint64_t words[2] = {0, 0};
      std::memcpy(words, &x.data[at], sizeof(T));
      local += tshard::detail::splitmix64(index * 0x9E3779B97F4A7C15ull ^ words[0]) ^ tshard::detail::splitmix64(words[1] + index);
    });
  }
  // Wrapping sums: gathered, then added here (an MPI_SUM of signed words could overflow).
  const int p = tshard::detail::comm_size(x.mesh.comm());
  std::vector<std::int64_t> all(static_cast<std::size_t>(p));
  std::int64_t mine = 0;
  std::memcpy(&mine, &local, sizeof mine);
  tshard::detail::all_gather(x.mesh.comm(), &mine, 1, all.data());
  std::uint64_t sum = 0;
  for (auto v : all) {
    std::uint64_t u = 0;
    std::memcpy(&u, &v, sizeof u);
    sum += u;
  }
  return sum;
}
}  // namespace detail

// A checksum of x's global values that does not depend on its layout or mesh: the sum over
// elements of a hash of (global index, bits), each element counted once (first replicas).
// Collective over x's mesh.
template <ShardedTensorType X>
std::uint64_t checksum(const X& x_in) {
  const auto& resolved = tshard::detail::resolved(x_in, "io::checksum");
  const tshard::detail::Readable values(resolved, "io::checksum");  // a released ZeRO-3 parameter: gathered back
  return detail::checksum_block(tshard::detail::block_view(*values));
}

namespace detail {

// The file of a tensor: its name with '/', '\\' and ' ' as '_', and ".npy".
std::string file_name(const std::string& tensor);

// Flushes a file or directory to disk (POSIX fsync).
bool sync_path(const std::filesystem::path& p, bool directory);

// Runs f on the first rank; where it failed, every rank throws an IoError with its message.
template <class F>
void on_first_rank(MPI_Comm comm, const std::string& what, F&& f) {
  std::string error;
  if (tshard::detail::comm_rank(comm) == 0) {
    try {
      f();
    } catch (const std::exception& e) {
      error = e.what();
      if (error.empty()) error = "failed";
    }
  }
  error = tshard::detail::broadcast_text(comm, error);
  if (!error.empty()) throw IoError("tshard::io: " + what + ": " + error);
}

// On the first rank: a file can be created in `folder` (made if missing), and is removed again.
void probe_folder(const std::filesystem::path& folder, const std::string& stem);
// p's parent folder, or "." where p has none.
std::filesystem::path parent_or_here(const std::filesystem::path& p);
}  // namespace detail

// Collective over comm: that a checkpoint or file can be written at `path` (its parent folder
// made, a file written there and removed), so that a run learns of an unwritable --save before
// it trains rather than after; else an IoError naming the path on every rank.
void require_writable(MPI_Comm comm, const std::string& path);

// Each of `paths` that is not empty (the outputs a command line asked for).
void require_writable(MPI_Comm comm, std::initializer_list<std::string> paths);

// Collective over comm: that files can be written into the folder `dir` (a Hugging Face
// directory, say): it is a folder, or nothing yet; an existing file of that name is an IoError
// before the run, not after it. A missing `dir` is not made (its parent folders are, as
// require_writable makes them). Empty: nothing asked for, nothing checked.
void require_writable_directory(MPI_Comm comm, const std::string& dir);

class CheckpointWriter {
 public:
  // Collective over comm: starts a checkpoint into DIR.tmp (removing a stale one).
  CheckpointWriter(MPI_Comm comm, std::string dir);

  // Writes the global tensor (collective over its mesh, which must span comm's ranks).
  template <ShardedTensorType X>
  void add(const std::string& name, const X& x) {
    const auto& resolved = tshard::detail::resolved(x, "io::CheckpointWriter::add");
    const tshard::detail::Readable values(resolved, "io::CheckpointWriter::add");  // gathered back once, if released
    add_block(name, tshard::detail::block_view(*values));
  }
  // The same on a block as descriptor code sees it (a state dict's entry: compiled per element type).
  template <class T>
  void add_block(const std::string& name, const tshard::detail::BlockView<T>& x) {
    if (tensors_.count(name) || !files_.insert(detail::file_name(name)).second)
      throw SpecError("tshard::io::CheckpointWriter: the tensor '" + name + "' was added twice, or under a name that differs only in '/', '\\' or ' '");
    write_block(name, x);
  }

 private:
  template <class T>
  void write_block(const std::string& name, const tshard::detail::BlockView<T>& x) {
    {
      tshard::detail::OperatorScope scope("io::save_npy");
      detail::save_npy_block((tmp_ / detail::file_name(name)).string(), x);
    }
    tensors_[name] = detail::checksum_block(x);
  }

 public:
  // Metadata: the step, the seed, the data position... (no newlines).
  void set(const std::string& key, const std::string& value) { meta_[key] = value; }

  // Collective: makes the checkpoint DIR, atomically.
  void commit();

 private:
  MPI_Comm comm_;
  std::string dir_;
  std::filesystem::path tmp_;
  std::map<std::string, std::uint64_t> tensors_;
  std::map<std::string, std::string> meta_;
  std::set<std::string> files_;
};

class CheckpointReader {
 public:
  // Collective over comm: reads the manifest (on the first rank, shared with all).
  CheckpointReader(MPI_Comm comm, std::string dir);

  const std::string& directory() const { return at_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  std::string get(const std::string& key) const;

  // The tensor `name` with any spec on any mesh (collective over it); its checksum is checked.
  template <class T, class SpecT, MeshType M>
  ShardedTensor<T, M, SpecT> load(const M& mesh, const std::string& name) const {
    static_assert(SpecT::rank >= 1, "tshard: load_npy reads tensors of rank 1 or more");
    tshard::detail::OperatorScope scope("io::load_npy");
    return tshard::detail::adopt_block<ShardedTensor<T, M, SpecT>>(
        mesh, load_block<T>(*tshard::detail::state_of(mesh), ShardedTensor<T, M, SpecT>::spec_desc, name));
  }
  // The same on descriptors: this rank's block of the tensor `name` laid out as `spec`.
  template <class T>
  tshard::detail::LoadedBlock<T> load_block(tshard::detail::MeshState& mesh, const tshard::detail::SpecDesc& spec,
                                            const std::string& name) const {
    auto it = tensors_.find(name);
    if (it == tensors_.end()) throw IoError("tshard::io: the checkpoint '" + dir_ + "' has no tensor '" + name + "'");
    auto block = detail::load_npy_block<T>(mesh, spec, at_ + "/" + detail::file_name(name));
    const auto layout = tshard::detail::shard_layout(spec, block.shape, mesh.shape(), mesh.coords());
    verify(name, it->second, tshard::detail::BlockView<T>{mesh, spec, block.shape, layout, block.data.get()});
    return block;
  }

 private:
  template <class T>
  void verify(const std::string& name, std::uint64_t sum, const tshard::detail::BlockView<T>& x) const {
    if (detail::checksum_block(x) != sum)
      throw IoError("tshard::io: the tensor '" + name + "' of the checkpoint '" + dir_ + "' does not match its checksum");
  }
  void parse(const std::string& text);

  MPI_Comm comm_;
  std::string dir_, at_;
  std::map<std::string, std::uint64_t> tensors_;
  std::map<std::string, std::string> meta_;
};

}  // namespace tshard::io

#if TSHARD_HEADER_BODIES
#include "tshard/io/checkpoint-inl.hpp"
#endif
