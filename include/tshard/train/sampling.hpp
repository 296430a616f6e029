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
inline std::int32_t pick_token(const std::vector<double>& logits, const Sampling& s, std::uint64_t draw) {
  std::vector<std::pair<double, std::int32_t>> z;
  for (std::size_t i = 0; i < logits.size(); ++i) z.emplace_back(logits[i], std::int32_t(i));
  std::stable_sort(z.begin(), z.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (s.temperature == 0) return z[0].second;
  const std::size_t k = s.top_k > 0 ? std::min<std::size_t>(std::size_t(s.top_k), z.size()) : z.size();
  double total = 0;
  std::vector<double> p(k);
  for (std::size_t i = 0; i < k; ++i) total += p[i] = std::exp((z[i].first - z[0].first) / s.temperature);
  double u = uniform_draw(s.seed * 31 + 7, draw) * total;
  for (std::size_t i = 0; i < k; ++i)
    if ((u -= p[i]) <= 0) return z[i].second;
  return z[k - 1].second;
}

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
inline std::string printable(const std::vector<std::int32_t>& bytes) {
  std::string out;
  for (auto b : bytes) {
    const unsigned char c = static_cast<unsigned char>(b);
    if (c == '\n') out += "\\n";
    else if (c == '\\') out += "\\\\";
    else if (c >= 32 && c < 127) out += char(c);
    else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

// Text as one printable line: \n, \\ and other control bytes escaped, UTF-8 kept.
inline std::string printable_text(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80 || (c >= 32 && c < 127 && c != '\\')) out += ch;
    else out += printable({std::int32_t(c)});
  }
  return out;
}

// "<label>: <id> <id> ..." on one line.
inline void print_ids(const char* label, const std::vector<std::int32_t>& ids) {
  std::printf("%s:", label);
  for (auto t : ids) std::printf(" %d", t);
  std::printf("\n");
}


// What a generation made, on the rank that prints: with a tokenizer "tokens: <ids>" and "sample:
// <their text>", else "sample: <text>" for bytes or "tokens: <ids>" (text escaped to one line);
// then "sampling: N tokens in S s, R tokens/s (<how>)".
inline void print_generation(const std::vector<std::int32_t>& sample, const Tokenizer* tokenizer, bool bytes, double seconds,
                             const char* how) {
  if (tokenizer) {
    print_ids("tokens", sample);
    std::printf("sample: %s\n", printable_text(tokenizer->decode(sample)).c_str());
  } else if (bytes) {
    std::printf("sample: %s\n", printable(sample).c_str());
  } else {
    print_ids("tokens", sample);
  }
  std::printf("sampling: %zu tokens in %.3f s, %.1f tokens/s (%s)\n", sample.size(), seconds,
              double(sample.size()) / std::max(seconds, 1e-9), how);
}

}  // namespace tshard::train
