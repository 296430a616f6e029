// Picking the next token from a language model's last logits, as generation loops do: greedy at
// temperature 0, else a draw from the softmax of the top-k logits at that temperature. The draw
// depends only on (seed, draw index), and the logits are the same bitwise on every rank (gathered),
// so every rank picks the same token.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tshard/comm/host_collectives.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/tensor/factories.hpp"
#include "tshard/train/tokenizer.hpp"

namespace tshard::train {

struct Sampling {
  double temperature = 0;  // 0: greedy
  int top_k = 0;           // 0: every token
  std::uint64_t seed = 1;
  std::vector<std::int32_t> stop = {};  // ids that end a generation once made (EOS, as HF's generate)
};

// A uniform draw in (0, 1) from (seed, i).
inline double uniform_draw(std::uint64_t seed, std::uint64_t i) {
  return (double(tshard::detail::splitmix64(seed ^ tshard::detail::splitmix64(i)) >> 11) + 0.5) * 0x1p-53;
}

// The next token from `logits` (one value per vocabulary entry); `draw` numbers the draws of a
// generation. Ties go to the lower id.
std::int32_t pick_token(const std::vector<double>& logits, const Sampling& s, std::uint64_t draw);

// `n` tokens after `sequence` (the prompt's ids): next_logits(sequence so far, i) returns the
// last position's logits where they are computed (empty elsewhere), mesh rank `root` picks the
// token (pick_token, draw i) and every rank gets it. Returns the new tokens (a stop id ends them,
// included).
template <MeshType M, class NextLogits>
std::vector<std::int32_t> generate(const M& mesh, std::vector<std::int32_t> sequence, int n, const Sampling& s, int root,
                                   NextLogits&& next_logits) {
  const std::size_t prompt = sequence.size();
  for (int i = 0; i < n; ++i) {
    const std::vector<double> logits = next_logits(std::as_const(sequence), i);
    const std::int32_t next = mesh.rank() == root ? pick_token(logits, s, std::uint64_t(i)) : 0;
    sequence.push_back(broadcast(mesh, next, root));
    if (std::find(s.stop.begin(), s.stop.end(), sequence.back()) != s.stop.end()) break;
  }
  return {sequence.begin() + std::ptrdiff_t(prompt), sequence.end()};
}

// Bytes as one printable line: \n, \\ and other non-printing bytes escaped.
std::string printable(const std::vector<std::int32_t>& bytes);

// Text as one printable line: \n, \\ and other control bytes escaped, UTF-8 kept.
std::string printable_text(const std::string& text);

// "<label>: <id> <id> ..." on one line.
void print_ids(const char* label, const std::vector<std::int32_t>& ids);


// What a generation made, on the rank that prints: with a tokenizer "tokens: <ids>" and "sample:
// <their text>", else "sample: <text>" for bytes or "tokens: <ids>" (text escaped to one line);
// then "sampling: N tokens in S s, R tokens/s (<how>)".
void print_generation(const std::vector<std::int32_t>& sample, const Tokenizer* tokenizer, bool bytes, double seconds,
                      const char* how);

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/sampling-inl.hpp"
#endif
