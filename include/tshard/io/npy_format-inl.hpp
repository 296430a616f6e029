// The definitions of npy_format.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "tshard/io/npy_format.hpp"

namespace tshard::io::detail {

TSHARD_FUNC std::int64_t NpyHeader::data_bytes() const {
  std::int64_t n = itemsize;
  for (auto d : shape) n *= d;
  return n;
}

TSHARD_FUNC std::string npy_preamble(const std::string& descr, bool fortran_order,
                                     const std::vector<std::int64_t>& shape) {
  std::string dims = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) dims += std::to_string(shape[i]) + (i + 1 < shape.size() ? ", " : "");
  dims += shape.size() == 1 ? ",)" : ")";  // Python's one-tuple: (3,)
  const std::string dict = "{'descr': '" + descr + "', 'fortran_order': " + (fortran_order ? "True" : "False") +
                           ", 'shape': " + dims + ", }";
  const bool v2 = dict.size() + 11 > 65535;
  const std::size_t prefix = v2 ? 12 : 10;
  std::size_t total = prefix + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  const std::size_t header_len = total - prefix;
  std::string out = "\x93NUMPY";
  out += char(v2 ? 2 : 1);
  out += char(0);
  for (std::size_t b = 0; b < (v2 ? 4u : 2u); ++b) out += char((header_len >> (8 * b)) & 0xff);
  out += dict;
  out.append(header_len - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

class NpyParser {
 public:
  NpyParser(const char* data, std::size_t size, const std::string& path) : p_(data), n_(size), path_(path) {}

  NpyHeader parse() {
    NpyHeader h;
    if (n_ < 10) fail("it is too short to be a .npy file (" + std::to_string(n_) + " bytes)");
    if (std::memcmp(p_, "\x93NUMPY", 6) != 0) fail("it is not a .npy file (no \\x93NUMPY magic)");
    const unsigned major = static_cast<unsigned char>(p_[6]);
    std::size_t len = 0, prefix = 0;
    if (major == 1) {
      len = std::size_t(static_cast<unsigned char>(p_[8])) | std::size_t(static_cast<unsigned char>(p_[9])) << 8;
      prefix = 10;
    } else if (major == 2 || major == 3) {
      if (n_ < 12) fail("its header is truncated");
      for (int b = 0; b < 4; ++b) len |= std::size_t(static_cast<unsigned char>(p_[8 + b])) << (8 * b);
      prefix = 12;
    } else {
      fail(".npy format version " + std::to_string(major) + " is not supported (1, 2 or 3)");
    }
    if (len > n_ - prefix) fail("its header is truncated (" + std::to_string(len) + " bytes announced)");
    h.data_offset = std::int64_t(prefix + len);
    at_ = prefix;
    end_ = prefix + len;
    bool descr = false, order = false, shape = false;
    skip_space();
    expect('{');
    for (;;) {
      skip_space();
      if (peek() == '}') break;
      const std::string key = string_literal();
      skip_space();
      expect(':');
      skip_space();
      if (key == "descr") {
        h.descr = string_literal();
        descr = true;
      } else if (key == "fortran_order") {
        h.fortran_order = boolean();
        order = true;
      } else if (key == "shape") {
        h.shape = tuple();
        shape = true;
      } else {
        fail("its header has an unknown key '" + key + "'");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip_space();
      if (peek() != '}') fail("its header dictionary is malformed near byte " + std::to_string(at_));
    }
    if (!descr || !order || !shape) fail("its header lacks one of 'descr', 'fortran_order' and 'shape'");
    h.itemsize = itemsize(h.descr);
    std::int64_t bytes = h.itemsize;
    for (auto d : h.shape) {
      if (d != 0 && bytes > std::numeric_limits<std::int64_t>::max() / d) fail("its shape is too large");
      bytes *= d;
    }
    return h;
  }

 private:
  [[noreturn]] void fail(const std::string& why) const { throw IoError("tshard::io: '" + path_ + "': " + why); }
  char peek() const {
    if (at_ >= end_) fail("its header ends too early");
    return p_[at_];
  }
  void skip_space() {
    while (at_ < end_ && (p_[at_] == ' ' || p_[at_] == '\t' || p_[at_] == '\n' || p_[at_] == '\r')) ++at_;
  }
  void expect(char c) {
    if (peek() != c) fail(std::string("its header has '") + printable(peek()) + "' where '" + c + "' belongs (byte " +
                          std::to_string(at_) + ")");
    ++at_;
  }
  static std::string printable(char c) {
    return (c >= 32 && c < 127) ? std::string(1, c) : "\\x" + std::to_string(static_cast<unsigned char>(c));
  }
  std::string string_literal() {
    const char q = peek();
    if (q != '\'' && q != '"') fail("its header has no string where one belongs (byte " + std::to_string(at_) + ")");
    ++at_;
    std::string s;
    while (peek() != q) {
      if (s.size() > 64) fail("its header has an overlong string");
      s += p_[at_++];
    }
    ++at_;
    return s;
  }
  bool boolean() {
    if (end_ - at_ >= 4 && std::memcmp(p_ + at_, "True", 4) == 0) {
      at_ += 4;
      return true;
    }
    if (end_ - at_ >= 5 && std::memcmp(p_ + at_, "False", 5) == 0) {
      at_ += 5;
      return false;
    }
    fail("its 'fortran_order' is neither True nor False");
  }
  std::vector<std::int64_t> tuple() {
    expect('(');
    std::vector<std::int64_t> dims;
    for (;;) {
      skip_space();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') fail("its shape holds something other than non-negative integers");
      std::int64_t v = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (v > (std::numeric_limits<std::int64_t>::max() - 9) / 10) fail("its shape has a dimension too large");
        v = v * 10 + (p_[at_++] - '0');
      }
      if (peek() == 'L') ++at_;  // Python 2's long suffix
      dims.push_back(v);
      if (dims.size() > 32) fail("its shape has more than 32 dimensions");
      skip_space();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      skip_space();
      if (peek() != ')') fail("its shape tuple is malformed");
    }
    ++at_;
    return dims;
  }
  std::int64_t itemsize(const std::string& d) const {
    if (d.size() < 3) fail("its dtype '" + d + "' is not one tshard reads");
    if (d[0] == '>') fail("its dtype '" + d + "' is big-endian; tshard reads little-endian data");
    if (d[0] != '<' && d[0] != '=' && d[0] != '|') fail("its dtype '" + d + "' has no byte order");
    const std::string kind = d.substr(1);
    if (kind == "f4" || kind == "i4") return 4;
    if (kind == "f8" || kind == "i8" || kind == "c8") return 8;
    if (kind == "c16") return 16;
    fail("its dtype '" + d + "' is not one tshard reads (f4, f8, c8, c16, i4, i8)");
  }

  const char* p_;
  std::size_t n_;
  std::string path_;
  std::size_t at_ = 0, end_ = 0;
};

TSHARD_FUNC NpyHeader parse_npy_header(const char* data, std::size_t size, const std::string& path) {
  return NpyParser(data, size, path).parse();
}

TSHARD_FUNC std::string little_endian_descr(std::string d) {
  if (!d.empty() && (d[0] == '=' || d[0] == '|')) d[0] = '<';
  return d;
}

}  // namespace tshard::io::detail
