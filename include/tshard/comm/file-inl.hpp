// The definitions of file.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include "tshard/comm/mpi.hpp"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "tshard/comm/file.hpp"

namespace tshard::detail {

TSHARD_FUNC std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int n = 0;
  MPI_Error_string(code, text, &n);
  return std::string(text, std::size_t(n));
}

TSHARD_FUNC ParallelFile::ParallelFile(MPI_Comm comm, const std::string& path, Mode mode, const std::string& op)
    : comm_(comm), path_(path), op_(op) {
  MPI_Info info = MPI_INFO_NULL;
  const int amode = mode == Mode::Read ? MPI_MODE_RDONLY : (MPI_MODE_CREATE | MPI_MODE_WRONLY);
  const int rc = MPI_File_open(comm, path.c_str(), amode, info, &file_);
  const bool ok = rc == MPI_SUCCESS;
  if (!agree(ok, comm)) {
    if (ok) MPI_File_close(&file_);
    throw IoError(op + ": cannot open '" + path + "' for " + (mode == Mode::Read ? "reading" : "writing") + ": " +
                  (ok ? std::string("failed on another rank") : mpi_error_string(rc)));
  }
  MPI_File_set_errhandler(file_, MPI_ERRORS_RETURN);
}

TSHARD_FUNC ParallelFile::~ParallelFile() {
  finish_read();
  if (file_ != MPI_FILE_NULL) MPI_File_close(&file_);
}

TSHARD_FUNC MPI_Offset ParallelFile::size() {
  MPI_Offset s = 0;
  MPI_File_get_size(file_, &s);
  return s;
}

TSHARD_FUNC void ParallelFile::set_size(MPI_Offset s) { check(MPI_File_set_size(file_, s), "set its size"); }

TSHARD_FUNC void ParallelFile::write_at(MPI_Offset at, const void* data, Index bytes) {
  CollectiveTimer t("file_write", std::uint64_t(bytes), 0);
  local_ok_ &= MPI_File_write_at(file_, at, data, int(bytes), MPI_BYTE, MPI_STATUS_IGNORE) == MPI_SUCCESS;
}

TSHARD_FUNC std::vector<char> ParallelFile::read_at(MPI_Offset at, Index bytes) {
  std::vector<char> out(static_cast<std::size_t>(bytes));
  MPI_Status status;
  CollectiveTimer t("file_read", 0, std::uint64_t(bytes));
  if (MPI_File_read_at(file_, at, out.data(), int(bytes), MPI_BYTE, &status) != MPI_SUCCESS) local_ok_ = false;
  int got = 0;
  MPI_Get_count(&status, MPI_BYTE, &got);
  out.resize(static_cast<std::size_t>(std::max(got, 0)));
  return out;
}

TSHARD_FUNC std::vector<char> ParallelFile::read_everywhere(MPI_Offset at, Index max_bytes) {
  std::vector<char> bytes;
  std::int64_t n = 0;
  if (comm_rank(comm_) == 0) {
    bytes = read_at(at, max_bytes);
    n = std::int64_t(bytes.size());
  }
  agree_or_throw("reading");
  broadcast(comm_, &n, 1, 0);
  bytes.resize(static_cast<std::size_t>(n));
  CollectiveTimer t("broadcast", comm_rank(comm_) == 0 ? std::uint64_t(n) * std::uint64_t(comm_size(comm_) - 1) : 0,
                    comm_rank(comm_) == 0 ? 0 : std::uint64_t(n));
  MPI_Bcast(bytes.data(), int(n), MPI_BYTE, 0, comm_);
  return bytes;
}

TSHARD_FUNC void ParallelFile::finish_read() {
  if (!reading_) return;
  {
    CollectiveTimer t("file_read", 0, pending_bytes_);
    local_ok_ &= MPI_Wait(&pending_, MPI_STATUS_IGNORE) == MPI_SUCCESS;
  }
  reading_ = false;
  MPI_File_set_view(file_, 0, MPI_BYTE, MPI_BYTE, "native", MPI_INFO_NULL);
  pending_types_.reset();
}

TSHARD_FUNC void ParallelFile::agree_or_throw(const std::string& what) {
  const bool ok = local_ok_;
  if (!agree(ok, comm_))
    throw IoError(op_ + ": " + what + " '" + path_ + "' failed" + (ok ? " on another rank" : ""));
}

TSHARD_FUNC void ParallelFile::check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) local_ok_ = false;
  agree_or_throw(what);
}

}  // namespace tshard::detail
