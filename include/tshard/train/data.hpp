// Where a language model's tokens come from, as a [rows, seq] tensor of ids for any rows of a
// step's batch (a pipeline's micro-batch reads its own rows), each rank computing or reading only
// its block:
//  - ReverseTask: a synthetic task that depends only on the seed (a random first half, then its
//    reverse), so a loss curve depends neither on the mesh nor on the micro-batching;
//  - TokenWindows: a token sequence (a text's bytes, a tokenizer's ids) cut into consecutive
//    windows of seq + 1 tokens, the last tenth held out; batch s takes training windows s*B ..
//    s*B + B - 1, cycled.
//  - TokenFile: an int32 .npy [N, seq + 1] of token rows; batch s takes rows s*B .. s*B + B - 1,
//    cycled over the file's whole batches; each rank reads only its block, and the rows that
//    follow are read in the background while the step computes.
// `shift` 0 gives the inputs, 1 the next-token labels.
#pragma once
#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "tshard/comm/failure.hpp"
#include "tshard/comm/text.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/core/spec_algebra.hpp"
#include "tshard/io/npy.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/train/flags.hpp"
#include "tshard/train/tokenizer.hpp"

namespace tshard::train {

using Index = Eigen::Index;

struct ReverseTask {
  std::uint64_t seed = 1;
  Index vocab = 64, seq = 16, batch = 8;

  // Token t (0 .. seq) of sequence b of step `step`.
  std::int32_t token(long step, Index b, Index t) const {
    const Index len = seq + 1, half = (len + 1) / 2;
    const Index src = t < half ? t : len - 1 - t;
    const std::uint64_t index =
        (std::uint64_t(step) * std::uint64_t(batch) + std::uint64_t(b)) * std::uint64_t(len) + std::uint64_t(src);
    return std::int32_t(tshard::detail::random_bits(seed * 7919 + 17, index) % std::uint64_t(vocab));
  }
  // Rows [first, first + rows) of step `step`'s batch, shifted by `shift` tokens.
  template <class Rows, MeshType M>
  ShardedTensor<std::int32_t, M, Rows> ids(const M& mesh, long step, Index first, Index rows, Index shift) const {
    return from_function<std::int32_t, Rows>(mesh, {rows, seq},
                                             [&](const auto& i) { return token(step, first + i[0], i[1] + shift); });
  }
};

class TokenWindows {
 public:
  // `tokens` cut into windows of seq + 1; the last tenth (rounded down) held out. At least ten
  // windows are needed (an IoError otherwise, naming `what`).
  TokenWindows(std::vector<std::int32_t> tokens, Index seq, const std::string& what = "the tokens");
  // A file's bytes as tokens (vocab 256), read by every rank; a UsageError on every rank where it
  // cannot be read or is too short (the flag that named it was wrong).
  static TokenWindows bytes_of(const std::string& program, const std::string& path, Index seq);

  // A text file encoded by a tokenizer, whole and once (nothing inserted: no BOS), as windows of
  // seq + 1 ids: read and encoded on world rank 0, the ids broadcast. A UsageError as bytes_of's,
  // an IoError (the text is not UTF-8, say) on every rank alike.
  static TokenWindows encoded(const std::string& program, const std::string& path, Index seq, const Tokenizer& tokenizer);

  // The file's tokens: the tokenizer's where there is one, else its bytes.
  static TokenWindows text_of(const std::string& program, const std::string& path, Index seq, const Tokenizer* tokenizer);

  Index seq() const { return seq_; }
  Index training_windows() const { return train_ / (seq_ + 1); }
  Index held_out_windows() const { return held_ / (seq_ + 1); }
  const std::vector<std::int32_t>& tokens() const { return tokens_; }

  // Rows [first, first + rows) of step `step`'s batch of `batch` training windows, shifted.
  template <class Rows, MeshType M>
  ShardedTensor<std::int32_t, M, Rows> batch_ids(const M& mesh, long step, Index batch, Index first, Index rows,
                                                 Index shift) const {
    const Index len = seq_ + 1, windows = training_windows();
    return from_function<std::int32_t, Rows>(mesh, {rows, seq_}, [&](const auto& i) {
      const Index start = ((step * batch + first + i[0]) % windows) * len;
      return tokens_[std::size_t(start + i[1] + shift)];
    });
  }
  // Held-out windows [first, first + rows), shifted.
  template <class Rows, MeshType M>
  ShardedTensor<std::int32_t, M, Rows> held_out_ids(const M& mesh, Index first, Index rows, Index shift) const {
    const Index len = seq_ + 1;
    return from_function<std::int32_t, Rows>(mesh, {rows, seq_}, [&](const auto& i) {
      return tokens_[std::size_t(train_ + (first + i[0]) * len + i[1] + shift)];
    });
  }

 private:
  std::vector<std::int32_t> tokens_;
  Index seq_;
  Index train_ = 0, held_ = 0;
};

// A prompt's ids: the tokenizer's (with what its post-processor adds, a BOS say), or its bytes
// modulo `vocab` where there is no tokenizer.
std::vector<std::int32_t> prompt_ids(const std::string& prompt, const Tokenizer* tokenizer, Index vocab);

class TokenFile {
 public:
  // `flag` names the file in errors ("train_llama: --data 'f.npy' must hold ..."); the file must
  // hold at least `least_rows` rows of seq + 1 tokens (an IoError on every rank otherwise).
  TokenFile(MPI_Comm comm, const std::string& path, Index seq, Index least_rows, const std::string& flag);
  Index rows() const { return file_.rows(); }

  // Rows [first, first + count), shifted; then rows [next, next + next_count) start to be read
  // (none where next_count is 0). A block is read once for its ids and its labels.
  // The block is read with Rows' row split and whole rows: a label's token may lie past a
  // position split's boundary (over "context", say).
  template <class Rows, MeshType M>
  ShardedTensor<std::int32_t, M, Rows> ids(const M& mesh, Index first, Index count, Index shift, Index next = 0,
                                           Index next_count = 0) {
    using WholeRows = Spec<tshard::detail::dim_at_t<Rows, 0>, R>;
    using Block = ShardedTensor<std::int32_t, M, WholeRows>;
    if (!block_ || block_first_ != first || block_count_ != count) {
      block_ = std::make_shared<Block>(file_.template read<WholeRows>(mesh, first, count));
      block_first_ = first, block_count_ = count;
      if (next_count > 0) file_.template prefetch<WholeRows>(mesh, next, next_count);
    }
    const Block& block = *static_cast<const Block*>(block_.get());
    const auto offset = block.local_offset();
    const auto padded = block.padded_shape();
    const std::int32_t* tokens = block.data();
    return from_function<std::int32_t, Rows>(mesh, {count, seq_}, [&](const auto& i) {
      return tokens[(i[0] - offset[0]) + padded[0] * (i[1] + shift)];
    });
  }
  // Rows [row_offset, row_offset + count) of batch `step` of `batch` rows; the rows that follow
  // (the next micro-batch, or the next batch's first) are read in the background.
  template <class Rows, MeshType M>
  ShardedTensor<std::int32_t, M, Rows> batch_ids(const M& mesh, long step, Index batch, Index row_offset, Index count,
                                                 Index shift) {
    const Index batches = rows() / batch;
    auto at = [&](long s, Index r) { return (s % batches) * batch + r; };
    const bool last = row_offset + count >= batch;
    return ids<Rows>(mesh, at(step, row_offset), count, shift, last ? at(step + 1, 0) : at(step, row_offset + count), count);
  }

 private:
  io::NpyRows<std::int32_t> file_;
  Index seq_;
  std::shared_ptr<void> block_;  // the last block read (a ShardedTensor of the reader's spec)
  Index block_first_ = -1, block_count_ = -1;
};

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/data-inl.hpp"
#endif
