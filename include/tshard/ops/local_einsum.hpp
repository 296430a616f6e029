// The local part of an einsum: the product of two aligned blocks as GEMMs that read the
// operands where they lie. Each operand's valid block is seen as a matrix over its two label
// groups ([M K], [K N], output [M N]) with BLAS's transpose flag and leading dimension; batch
// labels become a loop of GEMMs on strided blocks. An operand is copied into GEMM order only
// where no flag can express its layout (label groups not adjacent, or padding inside a merged
// group), and describe_local_product says so.
#pragma once
#include <algorithm>
#include <array>
#include <memory>
#include <string>

#include "tshard/core/kernel_instances.hpp"
#include "tshard/comm/buffer_pool.hpp"
#include "tshard/core/shard.hpp"
#include "tshard/ops/einsum_labels.hpp"
#include "tshard/ops/gemm.hpp"
#include "tshard/ops/reduce_kernel.hpp"

namespace tshard::detail {

// Copies between the valid block of a padded buffer (layout l) and a contiguous buffer holding
// the same elements with the dims in `order`: Pack reads the block, !Pack writes it.
template <bool Pack, class T>
void permuted_copy(const ShardLayout& l, const std::array<int, kMaxRank>& order, int rank, const T* from, T* to) {
  if (l.valid_size() == 0) return;
  Extents stride{}, ext{};
  Index s = 1;
  for (int d = 0; d < rank; ++d) {
    stride[d] = s;
    s *= l.padded[d];
  }
  // Dims that stay adjacent in `order`, the lower one held whole, merge into one: longer runs.
  Extents from_stride{};
  int n = 0;
  for (int k = 0; k < rank; ++k) {
    const int d = order[k];
    if (n > 0 && d == order[k - 1] + 1 && l.valid[d - 1] == l.padded[d - 1]) {
      ext[n - 1] *= l.valid[d];
      continue;
    }
    ext[n] = l.valid[d];
    from_stride[n++] = stride[d];
  }
  // The contiguous buffer's strides; `from_stride` are the padded buffer's, Pack or not.
  Extents packed_stride{};
  for (Index k = 0, p = 1; k < n; p *= ext[k++]) packed_stride[k] = p;
  // Where the padded buffer's contiguous dim is not the run's (a transpose: attention's batch
  // label b first), a walk along the run reads or writes one element per cache line and comes
  // back to each line once per element of that dim, from L2 or memory when the dims between hold
  // more than L1. So that pair of dims goes in square tiles that stay in L1.
  int across = 0;
  for (int k = 1; k < n; ++k)
    if (from_stride[k] == 1 && from_stride[0] != 1) across = k;
  const auto padded_at = [&](Index x, Index y) { return x * from_stride[0] + y * from_stride[across]; };
  const auto packed_at = [&](Index x, Index y) { return x + y * packed_stride[across]; };
  constexpr Index tile = 16;
  Extents i{};
  for (;;) {
    Index base = 0, run = 0;
    for (int k = 1; k < n; ++k)
      if (k != across) base += i[k] * from_stride[k], run += i[k] * packed_stride[k];
    if (across > 0) {
      for (Index x0 = 0; x0 < ext[0]; x0 += tile)
        for (Index y0 = 0; y0 < ext[across]; y0 += tile)
          for (Index x = x0, xe = std::min(ext[0], x0 + tile); x < xe; ++x)
            for (Index y = y0, ye = std::min(ext[across], y0 + tile); y < ye; ++y) {
              if constexpr (Pack)
                to[run + packed_at(x, y)] = from[base + padded_at(x, y)];
              else
                to[base + padded_at(x, y)] = from[run + packed_at(x, y)];
            }
    } else if (from_stride[0] == 1) {
      if constexpr (Pack)
        std::copy(from + base, from + base + ext[0], to + run);
      else
        std::copy(from + run, from + run + ext[0], to + base);
    } else {
      for (Index x = 0; x < ext[0]; ++x) {
        if constexpr (Pack)
          to[run + x] = from[base + x * from_stride[0]];
        else
          to[base + x * from_stride[0]] = from[run + x];
      }
    }
    int k = 1;
    for (; k < n; ++k) {
      if (k == across) continue;
      if (++i[k] < ext[k]) break;
      i[k] = 0;
    }
    if (k >= n) return;
  }
}

// The labels of one product in the groups a GEMM sees: M (left free), K (contracted), N (right
// free), batch (in both operands and the output). M, K and batch in the left operand's order,
// N in the right's.
struct LabelGroups {
  std::array<char, kMaxRank> m{}, k{}, n{}, batch{};
  int nm = 0, nk = 0, nn = 0, nbatch = 0;
};

inline LabelGroups group_labels(const EinsumLabels& e) {
  LabelGroups g;
  for (int i = 0; i < e.na; ++i) {
    const char c = e.a[i];
    const bool in_b = e.in_b(c) >= 0, in_o = e.in_o(c) >= 0;
    if (in_b && in_o) g.batch[g.nbatch++] = c;
    else if (in_b) g.k[g.nk++] = c;
    else g.m[g.nm++] = c;
  }
  for (int i = 0; i < e.nb; ++i)
    if (e.in_a(e.b[i]) < 0) g.n[g.nn++] = e.b[i];
  return g;
}

// How a GEMM sees one operand: a rows x cols matrix (rows over the first group) stored in place
// (or, transposed, as cols x rows) with leading dimension ld, and a stride per batch label.
struct OperandView {
  bool in_place = false;  // false: packed into [first second batch] order before the GEMMs
  bool trans = false;
  Index rows = 1, cols = 1, ld = 1;
  std::array<Index, kMaxRank> batch_stride{};
  std::array<int, kMaxRank> pack_order{};  // dims in [first second batch] order, for packing
};

// Extent and stride of a label group merged into one matrix dim; false where its labels are
// not adjacent and in order, or padding lies inside the merged range.
inline bool merged_group(const std::array<char, kMaxRank>& labels, const ShardLayout& l, const Extents& stride,
                         const std::array<char, kMaxRank>& group, int count, Index& extent, Index& group_stride) {
  extent = 1;
  group_stride = 0;
  bool mergeable = true;
  int prev = -1;
  for (int i = 0; i < count; ++i) {
    const int d = EinsumLabels::find(labels, l.rank, group[i]);
    if (i > 0 && (d != prev + 1 || l.valid[prev] != l.padded[prev])) mergeable = false;
    if (i == 0) group_stride = stride[d];
    extent *= l.valid[d];
    prev = d;
  }
  return mergeable;
}

inline OperandView view_operand(const std::array<char, kMaxRank>& labels, const ShardLayout& l,
                                const std::array<char, kMaxRank>& first, int nfirst,
                                const std::array<char, kMaxRank>& second, int nsecond,
                                const std::array<char, kMaxRank>& batch, int nbatch) {
  OperandView v;
  Extents stride{};
  for (Index d = 0, s = 1; d < l.rank; ++d) {
    stride[d] = s;
    s *= l.padded[d];
  }
  int k = 0;
  for (int i = 0; i < nfirst; ++i) v.pack_order[k++] = EinsumLabels::find(labels, l.rank, first[i]);
  for (int i = 0; i < nsecond; ++i) v.pack_order[k++] = EinsumLabels::find(labels, l.rank, second[i]);
  for (int i = 0; i < nbatch; ++i) v.pack_order[k++] = EinsumLabels::find(labels, l.rank, batch[i]);
  Index s1 = 0, s2 = 0;
  const bool m1 = merged_group(labels, l, stride, first, nfirst, v.rows, s1);
  const bool m2 = merged_group(labels, l, stride, second, nsecond, v.cols, s2);
  for (int i = 0; i < nbatch; ++i) v.batch_stride[i] = stride[v.pack_order[nfirst + nsecond + i]];
  if (m1 && m2) {
    const Index r = std::max<Index>(v.rows, 1), c = std::max<Index>(v.cols, 1);
    if ((v.rows <= 1 || s1 == 1) && (v.cols <= 1 || s2 >= r)) {
      v.in_place = true;
      v.ld = v.cols <= 1 ? r : s2;
    } else if ((v.cols <= 1 || s2 == 1) && (v.rows <= 1 || s1 >= c)) {
      v.in_place = v.trans = true;
      v.ld = v.rows <= 1 ? c : s1;
    }
  }
  if (!v.in_place) {  // the packed copy is [first second batch], contiguous
    v.ld = std::max<Index>(v.rows, 1);
    Index s = v.rows * v.cols;
    for (int i = 0; i < nbatch; ++i) {
      v.batch_stride[i] = s;
      s *= l.valid[v.pack_order[nfirst + nsecond + i]];
    }
  }
  return v;
}

// The whole local product of one einsum on this rank's blocks.
struct LocalProduct {
  LabelGroups g;
  OperandView a, b, c;
  std::array<Index, kMaxRank> batch_extent{};
  Index batches = 1;
};

inline LocalProduct plan_local_product(const EinsumLabels& e, const ShardLayout& la, const ShardLayout& lb,
                                       const ShardLayout& lc) {
  LocalProduct p;
  p.g = group_labels(e);
  const LabelGroups& g = p.g;
  p.a = view_operand(e.a, la, g.m, g.nm, g.k, g.nk, g.batch, g.nbatch);
  p.b = view_operand(e.b, lb, g.k, g.nk, g.n, g.nn, g.batch, g.nbatch);
  p.c = view_operand(e.o, lc, g.m, g.nm, g.n, g.nn, g.batch, g.nbatch);
  for (int i = 0; i < g.nbatch; ++i) {
    p.batch_extent[i] = la.valid[p.a.pack_order[g.nm + g.nk + i]];
    p.batches *= p.batch_extent[i];
  }
  return p;
}

// Labels summed in one operand alone (in neither the other operand nor the output) are summed
// first; `kept` is the operand's block without them (contiguous).
inline bool lone_labels(const EinsumLabels& e, bool left, const ShardLayout& l, std::array<bool, kMaxRank>& lone,
                        std::array<char, kMaxRank>& labels, int& n, ShardLayout& kept) {
  const auto& own = left ? e.a : e.b;
  const int count = left ? e.na : e.nb;
  bool any = false;
  for (int i = 0; i < count; ++i) {
    lone[i] = (left ? e.in_b(own[i]) : e.in_a(own[i])) < 0 && e.in_o(own[i]) < 0;
    any |= lone[i];
  }
  if (!any) return false;
  kept = ShardLayout{};
  n = 0;
  for (int i = 0; i < count; ++i)
    if (!lone[i]) {
      labels[n] = own[i];
      kept.padded[n] = kept.valid[n] = l.valid[i];
      kept.offset[n] = l.offset[i];
      ++n;
    }
  kept.rank = n;
  return true;
}

// The labels and layouts the GEMMs see once lone labels are summed away.
struct SummedOperands {
  EinsumLabels e;
  ShardLayout la, lb;
  bool sum_a = false, sum_b = false;
  std::array<bool, kMaxRank> lone_a{}, lone_b{};
};

inline SummedOperands summed_operands(const EinsumLabels& e, const ShardLayout& la, const ShardLayout& lb) {
  SummedOperands s{e, la, lb};
  s.sum_a = lone_labels(e, true, la, s.lone_a, s.e.a, s.e.na, s.la);
  s.sum_b = lone_labels(e, false, lb, s.lone_b, s.e.b, s.e.nb, s.lb);
  return s;
}

// What the local product does on this rank, for explain_einsum: which operand the GEMM reads
// transposed, and which are copied because no flag expresses their layout.
inline std::string describe_local_product(const EinsumLabels& e, const ShardLayout& la, const ShardLayout& lb,
                                          const ShardLayout& lc) {
  const SummedOperands s = summed_operands(e, la, lb);
  const LocalProduct p = plan_local_product(s.e, s.la, s.lb, lc);
  std::string out = std::to_string(p.batches) + (p.batches == 1 ? " GEMM" : " GEMMs") + " (" + local_gemm_backend() + ")";
  auto operand = [&](const char* name, const OperandView& v, bool summed) {
    out += std::string(", ") + name + (summed ? " summed over its lone indices (a copy)" : "") +
           (!v.in_place ? " copied into GEMM order" : v.trans ? " transposed in place" : " in place");
  };
  operand("a", p.a, s.sum_a);
  operand("b", p.b, s.sum_b);
  operand("output", p.c, false);
  return out;
}

// out's valid block (layout lc) = the product of a's and b's valid blocks.
template <class T>
void local_einsum(const EinsumLabels& e_in, const T* a, const ShardLayout& la_in, const T* b, const ShardLayout& lb_in,
                  T* c, const ShardLayout& lc) {
  if (lc.valid_size() == 0) return;
  const SummedOperands s = summed_operands(e_in, la_in, lb_in);
  std::shared_ptr<T> a_sum, b_sum;
  if (s.sum_a) {
    a_sum = pooled_array<T>(static_cast<std::size_t>(std::max<Index>(s.la.padded_size(), 1)));
    reduce_kernel<T>(ReduceOp::Sum, a, la_in, s.lone_a, a_sum.get(), s.la.padded, s.la.rank);
    a = a_sum.get();
  }
  if (s.sum_b) {
    b_sum = pooled_array<T>(static_cast<std::size_t>(std::max<Index>(s.lb.padded_size(), 1)));
    reduce_kernel<T>(ReduceOp::Sum, b, lb_in, s.lone_b, b_sum.get(), s.lb.padded, s.lb.rank);
    b = b_sum.get();
  }
  const LocalProduct p = plan_local_product(s.e, s.la, s.lb, lc);
  const Index M = p.a.rows, K = p.a.cols, N = p.b.cols;
  // Operands no flag can express are packed into [first second batch] order.
  auto scratch = [](const ShardLayout& l) { return pooled_array<T>(static_cast<std::size_t>(std::max<Index>(l.valid_size(), 1))); };
  auto packed = [&](const OperandView& v, const ShardLayout& l, int rank, const T* x, std::shared_ptr<T>& buf) {
    if (v.in_place) return x;
    buf = scratch(l);
    permuted_copy<true>(l, v.pack_order, rank, x, buf.get());
    return static_cast<const T*>(buf.get());
  };
  std::shared_ptr<T> pa, pb, pc;
  const T* A = packed(p.a, s.la, s.e.na, a, pa);
  const T* B = packed(p.b, s.lb, s.e.nb, b, pb);
  if (!p.c.in_place) pc = scratch(lc);
  T* C = p.c.in_place ? c : pc.get();
  std::array<Index, kMaxRank> at{};
  for (Index t = 0; t < p.batches; ++t) {
    Index oa = 0, ob = 0, oc = 0;
    for (int i = 0; i < p.g.nbatch; ++i) {
      oa += at[i] * p.a.batch_stride[i];
      ob += at[i] * p.b.batch_stride[i];
      oc += at[i] * p.c.batch_stride[i];
    }
    if (!p.c.trans)
      gemm<T>(p.a.trans, p.b.trans, M, N, K, A + oa, p.a.ld, B + ob, p.b.ld, C + oc, p.c.ld);
    else  // the output is stored N x M: C^T = op(B)^T op(A)^T
      gemm<T>(!p.b.trans, !p.a.trans, N, M, K, B + ob, p.b.ld, A + oa, p.a.ld, C + oc, p.c.ld);
    for (int i = 0; i < p.g.nbatch && ++at[i] == p.batch_extent[i]; ++i) at[i] = 0;
  }
  if (!p.c.in_place) permuted_copy<false>(lc, p.c.pack_order, s.e.no, pc.get(), c);
}

}  // namespace tshard::detail

// Compiled once where the program links tshard::kernels (core/kernel_instances.hpp).
namespace tshard::detail {
#define TSHARD_INSTANCE(T) TSHARD_KERNEL_INSTANCE(void local_einsum<T>(const EinsumLabels&, const T*, \
    const ShardLayout&, const T*, const ShardLayout&, T*, const ShardLayout&))
TSHARD_FOR_EACH_REAL(TSHARD_INSTANCE)
#undef TSHARD_INSTANCE
}  // namespace tshard::detail
