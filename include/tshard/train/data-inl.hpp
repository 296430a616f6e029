// The definitions of data.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <cstdint>
#include <fstream>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "tshard/train/data.hpp"

namespace tshard::train {

TSHARD_FUNC TokenWindows::TokenWindows(std::vector<std::int32_t> tokens, Index seq, const std::string& what)
    : tokens_(std::move(tokens)), seq_(seq) {
  const Index n = Index(tokens_.size());
  held_ = n / 10;
  train_ = n - held_;
  if (n < 10 * (seq + 1))
    throw IoError(what + " holds fewer than " + std::to_string(10 * (seq + 1)) + " tokens (10 windows of seq + 1)");
}

TSHARD_FUNC TokenWindows TokenWindows::bytes_of(const std::string& program, const std::string& path, Index seq) {
  std::ifstream f(path, std::ios::binary);
  std::vector<std::int32_t> tokens;
  for (std::istreambuf_iterator<char> it(f), end; it != end; ++it) tokens.push_back(std::int32_t(static_cast<unsigned char>(*it)));
  const bool ok = agree(bool(f.good() || f.eof()) && Index(tokens.size()) >= 10 * (seq + 1));
  if (!ok)
    throw UsageError(program + ": --text '" + path + "' cannot be read or holds fewer than " + std::to_string(10 * (seq + 1)) +
                  " bytes (10 windows of seq + 1)");
  return TokenWindows(std::move(tokens), seq);
}

TSHARD_FUNC TokenWindows TokenWindows::encoded(const std::string& program, const std::string& path, Index seq,
                                               const Tokenizer& tokenizer) {
  std::vector<std::int32_t> tokens;
  std::string error;
  std::int64_t n = 0;
  if (tshard::detail::comm_rank(MPI_COMM_WORLD) == 0) {
    std::ifstream f(path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    try {
      if (f.good() || f.eof()) tokens = tokenizer.encode(text, false);
    } catch (const IoError& e) {
      error = e.what();
    }
    n = std::int64_t(tokens.size());
  }
  if (!(error = tshard::detail::broadcast_text(MPI_COMM_WORLD, error)).empty()) throw IoError(error);
  tshard::detail::broadcast(MPI_COMM_WORLD, &n, 1, 0);
  tokens.resize(std::size_t(n));
  if (n > 0) tshard::detail::broadcast(MPI_COMM_WORLD, tokens.data(), Index(n), 0);
  if (Index(tokens.size()) < 10 * (seq + 1))
    throw UsageError(program + ": --text '" + path + "' cannot be read or holds fewer than " + std::to_string(10 * (seq + 1)) +
                     " tokens (10 windows of seq + 1)");
  return TokenWindows(std::move(tokens), seq);
}

TSHARD_FUNC TokenWindows TokenWindows::text_of(const std::string& program, const std::string& path, Index seq,
                                               const Tokenizer* tokenizer) {
  return tokenizer ? encoded(program, path, seq, *tokenizer) : bytes_of(program, path, seq);
}

TSHARD_FUNC std::vector<std::int32_t> prompt_ids(const std::string& prompt, const Tokenizer* tokenizer,
                                                 Index vocab) {
  if (tokenizer) return tokenizer->encode(prompt);
  std::vector<std::int32_t> ids;
  for (const unsigned char ch : prompt) ids.push_back(std::int32_t(ch % vocab));
  return ids;
}

TSHARD_FUNC TokenFile::TokenFile(MPI_Comm comm, const std::string& path, Index seq, Index least_rows,
                                 const std::string& flag)
    : file_(comm, path), seq_(seq) {
  if (file_.shape().size() != 2 || file_.shape()[1] != seq + 1 || file_.rows() < least_rows)
    throw IoError(flag + " '" + path + "' must hold int32 [N >= " + std::to_string(least_rows) + ", seq + 1 = " +
                  std::to_string(seq + 1) + "] tokens");
}

}  // namespace tshard::train
