// The definitions of bpe.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <limits>
#include <queue>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "tshard/train/bpe.hpp"

namespace tshard::train {

TSHARD_FUNC BpeModel::BpeModel(std::unordered_map<std::string, std::int32_t> vocab,
                               const std::vector<std::pair<std::string, std::string>>& merges,
                               BpeOptions options, const std::string& what) : vocab_(std::move(vocab)), options_(std::move(options)) {
  for (const auto& [token, id] : vocab_) {
    if (std::size_t(id) >= tokens_.size()) tokens_.resize(std::size_t(id) + 1);
    tokens_[std::size_t(id)] = token;
  }
  merges_.reserve(merges.size());
  for (std::size_t r = 0; r < merges.size(); ++r) {
    const auto& [a, b] = merges[r];
    const auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    if (ia == vocab_.end() || ib == vocab_.end() || ic == vocab_.end())
      throw IoError(what + ": merge " + std::to_string(r) + " (\"" + a + "\" \"" + b + "\") names a token the vocabulary lacks");
    merges_.insert_or_assign(pair_key(ia->second, ib->second), Merge{std::int32_t(r), ic->second});  // (a pair twice: the last rank, as HF)
  }
  if (options_.unk_token && !vocab_.count(*options_.unk_token))
    throw IoError(what + ": the unknown token \"" + *options_.unk_token + "\" is not in the vocabulary");
}

TSHARD_FUNC std::optional<std::int32_t> BpeModel::token_to_id(const std::string& token) const {
  const auto it = vocab_.find(token);
  return it == vocab_.end() ? std::nullopt : std::optional<std::int32_t>(it->second);
}

TSHARD_FUNC const std::string* BpeModel::id_to_token(std::int32_t id) const {
  return id >= 0 && std::size_t(id) < tokens_.size() && !tokens_[std::size_t(id)].empty() ? &tokens_[std::size_t(id)] : nullptr;
}

TSHARD_FUNC void BpeModel::encode_word(std::string_view word, std::vector<std::int32_t>& out) const {
  std::string key(word);
  if (const auto it = cache_.find(key); it != cache_.end()) return out.insert(out.end(), it->second.begin(), it->second.end()), void();
  std::vector<std::int32_t> ids = merge(word);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cache_.size() < kCacheCapacity) cache_.emplace(std::move(key), std::move(ids));
}

TSHARD_FUNC std::vector<std::int32_t> BpeModel::merge(std::string_view word) const {
  std::vector<std::int32_t> symbols;
  if (options_.ignore_merges)
    if (const auto it = vocab_.find(std::string(word)); it != vocab_.end()) return {it->second};
  bool last_unknown = false;
  for (std::size_t i = 0; i < word.size();) {
    const std::size_t n = std::min(detail::utf8_length(static_cast<unsigned char>(word[i])), word.size() - i);
    const auto it = vocab_.find(std::string(word.substr(i, n)));
    if (it != vocab_.end()) {
      symbols.push_back(it->second), last_unknown = false;
    } else if (options_.byte_fallback && all_bytes_known(word.substr(i, n))) {
      for (std::size_t k = 0; k < n; ++k) symbols.push_back(vocab_.at(byte_token(static_cast<unsigned char>(word[i + k]))));
      last_unknown = false;
    } else if (options_.unk_token) {
      if (!(options_.fuse_unk && last_unknown)) symbols.push_back(vocab_.at(*options_.unk_token));
      last_unknown = true;
    }
    i += n;
  }
  // The lowest-ranked pair, leftmost among equals, merges first (HF orders its queue so): a heap
  // of candidate pairs over linked symbols, each checked when popped, so a long word (a run of
  // spaces, base64) costs O(n log n), not O(n^2).
  const std::size_t n = symbols.size();
  if (n < 2) return symbols;
  if (n <= 24) {  // a short word (most): scanning its pairs is cheaper than a heap
    while (symbols.size() > 1) {
      std::size_t best = 0;
      Merge best_merge{std::numeric_limits<std::int32_t>::max(), -1};
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
        const auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
        if (it != merges_.end() && it->second.rank < best_merge.rank) best = i, best_merge = it->second;
      }
      if (best_merge.id < 0) break;
      symbols[best] = best_merge.id;
      symbols.erase(symbols.begin() + std::ptrdiff_t(best) + 1);
    }
    return symbols;
  }
  std::vector<std::size_t> next(n), previous(n);
  std::vector<bool> alive(n, true);
  for (std::size_t i = 0; i < n; ++i) next[i] = i + 1, previous[i] = i - 1;  // (n and size_t(-1): none)
  using Candidate = std::tuple<std::int32_t, std::size_t, std::int32_t, std::int32_t>;  // rank, left position, left id, right id
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto offer = [&](std::size_t left) {
    if (left >= n || next[left] >= n) return;
    const auto it = merges_.find(pair_key(symbols[left], symbols[next[left]]));
    if (it != merges_.end()) heap.emplace(it->second.rank, left, symbols[left], symbols[next[left]]);
  };
  for (std::size_t i = 0; i + 1 < n; ++i) offer(i);
  while (!heap.empty()) {
    const auto [rank, left, a, b] = heap.top();
    heap.pop();
    const std::size_t right = next[left];
    if (!alive[left] || right >= n || symbols[left] != a || symbols[right] != b) continue;  // changed since offered
    symbols[left] = merges_.at(pair_key(a, b)).id;
    alive[right] = false;
    next[left] = next[right];
    if (next[right] < n) previous[next[right]] = left;
    if (previous[left] < n) offer(previous[left]);
    offer(left);
  }
  std::vector<std::int32_t> merged;
  for (std::size_t i = 0; i < n; i = next[i]) merged.push_back(symbols[i]);
  return merged;
}

TSHARD_FUNC std::string BpeModel::byte_token(unsigned char b) {
  static const char* hex = "0123456789ABCDEF";
  return std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">";
}

TSHARD_FUNC bool BpeModel::all_bytes_known(std::string_view c) const {
  for (unsigned char b : c)
    if (!vocab_.count(byte_token(b))) return false;
  return true;
}

}  // namespace tshard::train
