// The definitions of sampling.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "tshard/train/sampling.hpp"

namespace tshard::train {

TSHARD_FUNC std::int32_t pick_token(const std::vector<double>& logits, const Sampling& s, std::uint64_t draw) {
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

TSHARD_FUNC std::string printable(const std::vector<std::int32_t>& bytes) {
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

TSHARD_FUNC std::string printable_text(const std::string& text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x80 || (c >= 32 && c < 127 && c != '\\')) out += ch;
    else out += printable({std::int32_t(c)});
  }
  return out;
}

TSHARD_FUNC void print_ids(const char* label, const std::vector<std::int32_t>& ids) {
  std::printf("%s:", label);
  for (auto t : ids) std::printf(" %d", t);
  std::printf("\n");
}

TSHARD_FUNC void print_generation(const std::vector<std::int32_t>& sample, const Tokenizer* tokenizer,
                                  bool bytes, double seconds, const char* how) {
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
