// The PMPI interposer behind pmpi_counter.hpp. Point-to-point messages count once per message;
// collectives count the logical bytes per rank (n*(p-1), 2n(p-1)/p for all-reduce).
#include "pmpi_counter.hpp"

#include <mpi.h>

namespace pmpi {
Counts& counts() {
  static Counts c;
  return c;
}
}  // namespace pmpi

namespace {
std::uint64_t bytes(int count, MPI_Datatype t) {
  int size = 0;
  PMPI_Type_size(t, &size);
  return std::uint64_t(count) * std::uint64_t(size);
}
int size_of(MPI_Comm c) {
  int p = 1;
  PMPI_Comm_size(c, &p);
  return p;
}
int rank_of(MPI_Comm c) {
  int r = 0;
  PMPI_Comm_rank(c, &r);
  return r;
}
void add(std::uint64_t sent, std::uint64_t received) {
  auto& c = pmpi::counts();
  c.calls += 1;
  c.bytes_sent += sent;
  c.bytes_received += received;
}
}  // namespace

extern "C" {

int MPI_Allgather(const void* sb, int sc, MPI_Datatype st, void* rb, int rc, MPI_Datatype rt, MPI_Comm comm) {
  const std::uint64_t n = bytes(sc, st) * (size_of(comm) - 1);
  add(n, n);
  return PMPI_Allgather(sb, sc, st, rb, rc, rt, comm);
}

int MPI_Allgatherv(const void* sb, int sc, MPI_Datatype st, void* rb, const int* rcs, const int* displs,
                   MPI_Datatype rt, MPI_Comm comm) {
  const int p = size_of(comm), me = rank_of(comm);
  std::uint64_t received = 0;
  for (int g = 0; g < p; ++g)
    if (g != me) received += bytes(rcs[g], rt);
  add(bytes(sc, st) * (p - 1), received);
  return PMPI_Allgatherv(sb, sc, st, rb, rcs, displs, rt, comm);
}

int MPI_Alltoallw(const void* sb, const int* scs, const int* sds, const MPI_Datatype* sts, void* rb, const int* rcs,
                  const int* rds, const MPI_Datatype* rts, MPI_Comm comm) {
  const int p = size_of(comm), me = rank_of(comm);
  std::uint64_t sent = 0, received = 0;
  for (int g = 0; g < p; ++g)
    if (g != me) {
      sent += bytes(scs[g], sts[g]);
      received += bytes(rcs[g], rts[g]);
    }
  add(sent, received);
  return PMPI_Alltoallw(sb, scs, sds, sts, rb, rcs, rds, rts, comm);
}

int MPI_Allreduce(const void* sb, void* rb, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  const int p = size_of(comm);
  const std::uint64_t n = 2 * bytes(count, t) * (p - 1) / p;
  add(n, n);
  return PMPI_Allreduce(sb, rb, count, t, op, comm);
}

int MPI_Reduce_scatter_block(const void* sb, void* rb, int rc, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  const std::uint64_t n = bytes(rc, t) * (size_of(comm) - 1);
  add(n, n);
  return PMPI_Reduce_scatter_block(sb, rb, rc, t, op, comm);
}

int MPI_Reduce_scatter(const void* sb, void* rb, const int* rcs, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
  const int p = size_of(comm), me = rank_of(comm);
  std::uint64_t sent = 0;
  for (int g = 0; g < p; ++g)
    if (g != me) sent += bytes(rcs[g], t);
  add(sent, bytes(rcs[me], t) * (p - 1));
  return PMPI_Reduce_scatter(sb, rb, rcs, t, op, comm);
}

int MPI_Alltoall(const void* sb, int sc, MPI_Datatype st, void* rb, int rc, MPI_Datatype rt, MPI_Comm comm) {
  const std::uint64_t n = bytes(sc, st) * (size_of(comm) - 1);
  add(n, n);
  return PMPI_Alltoall(sb, sc, st, rb, rc, rt, comm);
}

int MPI_Bcast(void* buf, int count, MPI_Datatype t, int root, MPI_Comm comm) {
  const int p = size_of(comm);
  const bool is_root = rank_of(comm) == root;
  add(is_root ? bytes(count, t) * (p - 1) : 0, is_root ? 0 : bytes(count, t));
  return PMPI_Bcast(buf, count, t, root, comm);
}

int MPI_Isend(const void* buf, int count, MPI_Datatype t, int dest, int tag, MPI_Comm comm, MPI_Request* req) {
  add(bytes(count, t), 0);
  pmpi::counts().calls -= 1;  // messages are counted per exchange in tshard, not per message
  return PMPI_Isend(buf, count, t, dest, tag, comm, req);
}

int MPI_Irecv(void* buf, int count, MPI_Datatype t, int src, int tag, MPI_Comm comm, MPI_Request* req) {
  add(0, bytes(count, t));
  pmpi::counts().calls -= 1;
  return PMPI_Irecv(buf, count, t, src, tag, comm, req);
}

// One call (a pair's reduce-scatter is one exchange); a message to or from this rank itself moves
// nothing.
int MPI_Sendrecv(const void* sb, int sc, MPI_Datatype st, int dest, int stag, void* rb, int rc, MPI_Datatype rt, int src,
                 int rtag, MPI_Comm comm, MPI_Status* status) {
  const int me = rank_of(comm);
  add(dest != me && dest != MPI_PROC_NULL ? bytes(sc, st) : 0, src != me && src != MPI_PROC_NULL ? bytes(rc, rt) : 0);
  return PMPI_Sendrecv(sb, sc, st, dest, stag, rb, rc, rt, src, rtag, comm, status);
}

}  // extern "C"
