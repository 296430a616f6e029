// Parallel file access through MPI-IO: every rank reads and writes its own box of a global
// array stored in a file, collectively, at the right offsets; nobody gathers. Counted in the
// stats ("file_write", "file_read": this rank's bytes). Opening and closing are collective and
// agreed on: a file that will not open on one rank is an IoError on every rank.
#pragma once
#include "tshard/comm/mpi.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tshard/comm/collectives.hpp"
#include "tshard/comm/failure.hpp"
#include "tshard/comm/stats.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/shard.hpp"

namespace tshard::detail {

// The text of an MPI error code.
std::string mpi_error_string(int code);

// Where a box lies: its start and extent in a global array of `global` (in file order `fortran`
// or C) and in the rank's column-major buffer of `buffer` extents (the box at its origin).
struct FileBox {
  int rank = 0;
  Extents global{}, start{}, count{}, buffer{};
  bool fortran = true;
  Index elements() const { return volume(count, rank); }
};

// The element type of a file box: tshard's element types, and the raw 16-bit words of dtypes
// converted after reading (bfloat16, float16).
template <class T>
MPI_Datatype file_datatype() {
  if constexpr (std::is_same_v<T, std::uint16_t>) return MPI_UINT16_T;
  else return mpi_datatype<T>();
}

// The file view and memory datatypes of a box: subarrays in the file's order and in the
// rank's column-major buffer (a C-order box is moved as `count` contiguous elements).
template <class T>
struct BoxTypes {
  MPI_Datatype etype = file_datatype<T>(), file = etype, memory = etype;
  int count = 0;
  std::uint64_t bytes = 0;
  BoxTypes(const FileBox& box, bool take_part) {
    const Index n = take_part ? box.elements() : 0;
    bytes = std::uint64_t(n) * sizeof(T);
    if (n == 0) return;
    int sizes[kMaxRank], sub[kMaxRank], starts[kMaxRank], bsizes[kMaxRank], zero[kMaxRank] = {};
    for (int d = 0; d < box.rank; ++d) {
      sizes[d] = int(box.global[d]);
      sub[d] = int(box.count[d]);
      starts[d] = int(box.start[d]);
      bsizes[d] = int(box.buffer[d]);
    }
    MPI_Type_create_subarray(box.rank, sizes, sub, starts, box.fortran ? MPI_ORDER_FORTRAN : MPI_ORDER_C, etype, &file);
    MPI_Type_commit(&file);
    if (box.fortran) {
      MPI_Type_create_subarray(box.rank, bsizes, sub, zero, MPI_ORDER_FORTRAN, etype, &memory);
      MPI_Type_commit(&memory);
      count = 1;
    } else {
      count = int(n);
    }
  }
  ~BoxTypes() {
    if (file != etype) MPI_Type_free(&file);
    if (memory != etype) MPI_Type_free(&memory);
  }
  BoxTypes(const BoxTypes&) = delete;
  BoxTypes& operator=(const BoxTypes&) = delete;
};

class ParallelFile {
 public:
  enum class Mode { Read, Write };

  // Collective over comm. Write creates the file or truncates it.
  ParallelFile(MPI_Comm comm, const std::string& path, Mode mode, const std::string& op);
  ~ParallelFile();
  ParallelFile(const ParallelFile&) = delete;
  ParallelFile& operator=(const ParallelFile&) = delete;

  const std::string& path() const { return path_; }

  // Collective; the same on every rank.
  MPI_Offset size();
  void set_size(MPI_Offset s);

  // Rank-local: bytes at an offset (a header). Reads return the bytes actually there.
  void write_at(MPI_Offset at, const void* data, Index bytes);
  std::vector<char> read_at(MPI_Offset at, Index bytes);

  // Collective: the bytes at an offset, read by the first rank of comm and broadcast, so every
  // rank parses the same header and fails alike.
  std::vector<char> read_everywhere(MPI_Offset at, Index max_bytes);

  // Collective: every rank writes (or reads) its box of the array stored from byte `at`; a rank
  // with `take_part` false (a replica, or an empty block) moves nothing.
  template <class T>
  void write_box(MPI_Offset at, const FileBox& box, const T* buffer, bool take_part) {
    transfer<T>(at, box, const_cast<T*>(buffer), take_part, true);
  }
  template <class T>
  void read_box(MPI_Offset at, const FileBox& box, T* buffer, bool take_part) {
    transfer<T>(at, box, buffer, take_part, false);
  }

  // Collective: starts reading this rank's box (MPI_File_iread_all); finish_read() completes it.
  // One read in flight at a time; the buffer must live until then.
  template <class T>
  void start_read_box(MPI_Offset at, const FileBox& box, T* buffer, bool take_part) {
    finish_read();
    auto types = std::make_shared<BoxTypes<T>>(box, take_part);
    int rc = MPI_File_set_view(file_, at, types->etype, types->file, "native", MPI_INFO_NULL);
    if (rc == MPI_SUCCESS) rc = MPI_File_iread_all(file_, buffer, types->count, types->memory, &pending_);
    local_ok_ &= rc == MPI_SUCCESS;
    reading_ = rc == MPI_SUCCESS;
    pending_bytes_ = types->bytes;
    pending_types_ = types;
  }
  void finish_read();

  // Collective: an IoError on every rank where any rank's I/O failed so far.
  void agree_or_throw(const std::string& what);

 private:
  template <class T>
  void transfer(MPI_Offset at, const FileBox& box, T* buffer, bool take_part, bool write) {
    const BoxTypes<T> types(box, take_part);
    int rc = MPI_File_set_view(file_, at, types.etype, types.file, "native", MPI_INFO_NULL);
    {
      CollectiveTimer t(write ? "file_write" : "file_read", write ? types.bytes : 0, write ? 0 : types.bytes);
      if (rc == MPI_SUCCESS)
        rc = write ? MPI_File_write_all(file_, buffer, types.count, types.memory, MPI_STATUS_IGNORE)
                   : MPI_File_read_all(file_, buffer, types.count, types.memory, MPI_STATUS_IGNORE);
    }
    local_ok_ &= rc == MPI_SUCCESS;
    MPI_File_set_view(file_, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
  }

  void check(int rc, const char* what);

  MPI_Comm comm_;
  std::string path_, op_;
  MPI_File file_ = MPI_FILE_NULL;
  bool local_ok_ = true;
  bool reading_ = false;
  MPI_Request pending_ = MPI_REQUEST_NULL;
  std::shared_ptr<void> pending_types_;  // the datatypes of the read in flight
  std::uint64_t pending_bytes_ = 0;
};

}  // namespace tshard::detail

#if TSHARD_HEADER_BODIES
#include "tshard/comm/file-inl.hpp"
#endif
