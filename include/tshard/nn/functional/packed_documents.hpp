// document_starts(ids, end_of_document): where the documents of packed token rows start, in the
// form AttentionOptions::document_starts takes (Megatron's --reset-attention-mask): each row of
// ids [B, T] starts a document at 0 and one after each end_of_document token. The ids may lie in
// any layout (batch over data, positions over context): they are gathered, so every rank of
// their mesh calls it and gets every row's starts, which is what the attention wants on any
// mesh. Positions run on over documents (Megatron's default) unless the model restarts them:
// position_in_document(starts[b], p) is p less the start of its document (--reset-position-ids;
// it matters for learned position embeddings, not for rotary ones, which see only differences).
//
//   auto starts = ts::nn::document_starts(ids, eod);
//   auto y = block(x, {.document_starts = starts});
#pragma once
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <concepts>
#include <vector>

#include <Eigen/Core>

#include "tshard/tensor/sharded_tensor.hpp"

namespace tshard::nn {

template <ShardedTensorType Ids>
std::vector<std::vector<Eigen::Index>> document_starts(const Ids& ids, std::int64_t end_of_document) {
  static_assert(std::integral<typename Ids::Scalar>, "tshard::nn::document_starts: the ids are integer tokens");
  static_assert(Ids::rank == 2, "tshard::nn::document_starts: the ids are [batch, positions]");
  const auto all = ids.gather();
  std::vector<std::vector<Eigen::Index>> starts(std::size_t(all.dimension(0)), std::vector<Eigen::Index>{0});
  for (Eigen::Index b = 0; b < all.dimension(0); ++b)
    for (Eigen::Index t = 0; t + 1 < all.dimension(1); ++t)  // (one that ends the row starts nothing)
      if (std::int64_t(all(b, t)) == end_of_document) starts[std::size_t(b)].push_back(t + 1);
  return starts;
}

// Position p of a row counted from the start of its document (starts: that row's, from 0; a
// position before the first start counts from 0).
inline Eigen::Index position_in_document(const std::vector<Eigen::Index>& starts, Eigen::Index p) {
  const auto next = std::upper_bound(starts.begin(), starts.end(), p);
  return next == starts.begin() ? p : p - *(next - 1);
}

}  // namespace tshard::nn
