// Text between ranks: the first rank's text on every rank, and every rank's text gathered in
// rank order (manifests, error messages, traces). Sent as int64 words through the counted
// collectives.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tshard/comm/collectives.hpp"

namespace tshard::detail {

inline std::string broadcast_text(MPI_Comm comm, std::string text) {
  std::int64_t n = std::int64_t(text.size());
  broadcast(comm, &n, 1, 0);
  if (n == 0) return {};  // (and no memcpy from an empty vector's null data: UBSan)
  std::vector<std::int64_t> words(static_cast<std::size_t>((n + 7) / 8));
  if (comm_rank(comm) == 0) std::memcpy(words.data(), text.data(), text.size());
  broadcast(comm, words.data(), Index(words.size()), 0);
  return std::string(reinterpret_cast<const char*>(words.data()), static_cast<std::size_t>(n));
}

// Every rank's text, concatenated in rank order, on every rank.
inline std::string gather_text(MPI_Comm comm, const std::string& mine) {
  const int p = comm_size(comm);
  std::vector<std::int64_t> words(static_cast<std::size_t>((mine.size() + 7) / 8) + 1, 0);
  words[0] = std::int64_t(mine.size());
  std::memcpy(words.data() + 1, mine.data(), mine.size());
  const std::int64_t n = std::int64_t(words.size());
  std::vector<std::int64_t> counts64(static_cast<std::size_t>(p));
  all_gather(comm, &n, 1, counts64.data());
  std::vector<int> counts(counts64.begin(), counts64.end()), displs(static_cast<std::size_t>(p), 0);
  for (int r = 1; r < p; ++r) displs[std::size_t(r)] = displs[std::size_t(r - 1)] + counts[std::size_t(r - 1)];
  std::vector<std::int64_t> all(static_cast<std::size_t>(displs.back() + counts.back()));
  all_gather_counts(comm, words.data(), all.data(), counts, displs);
  std::string out;
  for (int r = 0; r < p; ++r) {
    const std::int64_t* w = all.data() + displs[std::size_t(r)];
    out.append(reinterpret_cast<const char*>(w + 1), static_cast<std::size_t>(w[0]));
  }
  return out;
}

}  // namespace tshard::detail
