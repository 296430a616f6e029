// The definitions of json.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>

#include "tshard/io/json.hpp"

namespace tshard::io::detail {

TSHARD_FUNC const JsonValue* JsonValue::find(const std::string& key) const {
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i] == key) return &members[i];
  return nullptr;
}

class JsonParser {
 public:
  JsonParser(const char* text, std::size_t size, std::string what) : p_(text), n_(size), what_(std::move(what)) {}

  // The whole text as one value (surrounding whitespace allowed, nothing after it).
  JsonValue parse() {
    JsonValue v = value(0);
    skip_space();
    if (i_ != n_) fail("text follows the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 64;

  [[noreturn]] void fail(const std::string& why) const {
    throw IoError(what_ + " is not valid JSON at byte " + std::to_string(i_) + ": " + why);
  }
  void skip_space() {
    while (i_ < n_ && (p_[i_] == ' ' || p_[i_] == '\t' || p_[i_] == '\n' || p_[i_] == '\r')) ++i_;
  }
  bool take(char c) {
    skip_space();
    if (i_ < n_ && p_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!take(c)) fail(std::string("'") + c + "' expected");
  }
  bool literal(const char* word) {
    const std::size_t len = std::char_traits<char>::length(word);
    if (n_ - i_ >= len && std::char_traits<char>::compare(p_ + i_, word, len) == 0) {
      i_ += len;
      return true;
    }
    return false;
  }

  JsonValue value(int depth) {
    if (depth > kMaxDepth) fail("nested deeper than " + std::to_string(kMaxDepth) + " levels");
    skip_space();
    if (i_ >= n_) fail("the text ends where a value was expected");
    JsonValue v;
    const char c = p_[i_];
    if (c == '{') {
      ++i_;
      v.kind = JsonValue::Kind::Object;
      if (take('}')) return v;
      do {
        skip_space();
        if (i_ >= n_ || p_[i_] != '"') fail("a member name (a string) expected");
        v.keys.push_back(string());
        expect(':');
        v.members.push_back(value(depth + 1));
      } while (take(','));
      expect('}');
    } else if (c == '[') {
      ++i_;
      v.kind = JsonValue::Kind::Array;
      if (take(']')) return v;
      do v.array.push_back(value(depth + 1));
      while (take(','));
      expect(']');
    } else if (c == '"') {
      v.kind = JsonValue::Kind::String;
      v.string = string();
    } else if (literal("true")) {
      v.kind = JsonValue::Kind::Bool;
      v.boolean = true;
    } else if (literal("false")) {
      v.kind = JsonValue::Kind::Bool;
    } else if (literal("null")) {
      v.kind = JsonValue::Kind::Null;
    } else if (c == '-' || (c >= '0' && c <= '9')) {
      number(v);
    } else {
      fail(std::string("unexpected character '") + c + "'");
    }
    return v;
  }

  void number(JsonValue& v) {
    const std::size_t start = i_;
    auto digits = [&] {
      const std::size_t from = i_;
      while (i_ < n_ && p_[i_] >= '0' && p_[i_] <= '9') ++i_;
      if (i_ == from) fail("a digit expected");
    };
    if (p_[i_] == '-') ++i_;
    if (i_ < n_ && p_[i_] == '0') ++i_;
    else digits();
    bool integral = true;
    if (i_ < n_ && p_[i_] == '.') {
      ++i_;
      digits();
      integral = false;
    }
    if (i_ < n_ && (p_[i_] == 'e' || p_[i_] == 'E')) {
      ++i_;
      if (i_ < n_ && (p_[i_] == '+' || p_[i_] == '-')) ++i_;
      digits();
      integral = false;
    }
    const std::string text(p_ + start, i_ - start);
    v.kind = JsonValue::Kind::Number;
    v.number = std::strtod(text.c_str(), nullptr);
    if (integral) {  // exact where within int64
      errno = 0;
      v.integer = std::strtoll(text.c_str(), nullptr, 10);
      v.integral = errno != ERANGE;
    }
  }

  static void append_utf8(std::string& out, std::uint32_t cp) {
    if (cp < 0x80) {
      out += char(cp);
    } else if (cp < 0x800) {
      out += char(0xc0 | (cp >> 6));
      out += char(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += char(0xe0 | (cp >> 12));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    } else {
      out += char(0xf0 | (cp >> 18));
      out += char(0x80 | ((cp >> 12) & 0x3f));
      out += char(0x80 | ((cp >> 6) & 0x3f));
      out += char(0x80 | (cp & 0x3f));
    }
  }
  std::uint32_t hex4() {
    if (n_ - i_ < 4) fail("a \\u escape needs four hex digits");
    std::uint32_t cp = 0;
    for (int k = 0; k < 4; ++k) {
      const char h = p_[i_++];
      cp <<= 4;
      if (h >= '0' && h <= '9') cp |= std::uint32_t(h - '0');
      else if (h >= 'a' && h <= 'f') cp |= std::uint32_t(h - 'a' + 10);
      else if (h >= 'A' && h <= 'F') cp |= std::uint32_t(h - 'A' + 10);
      else fail("a \\u escape needs four hex digits");
    }
    return cp;
  }
  std::string string() {
    ++i_;  // the opening quote
    std::string out;
    while (true) {
      if (i_ >= n_) fail("a string is not closed");
      const char c = p_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) fail("a control character inside a string");
      if (c != '\\') {
        out += c;
        continue;
      }
      if (i_ >= n_) fail("a string is not closed");
      switch (const char e = p_[i_++]) {
        case '"': case '\\': case '/': out += e; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          std::uint32_t cp = hex4();
          if (cp >= 0xd800 && cp < 0xdc00) {  // a surrogate pair
            if (n_ - i_ < 2 || p_[i_] != '\\' || p_[i_ + 1] != 'u') fail("an unpaired surrogate");
            i_ += 2;
            const std::uint32_t low = hex4();
            if (low < 0xdc00 || low >= 0xe000) fail("an unpaired surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (low - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            fail("an unpaired surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default: fail(std::string("an unknown escape \\") + e);
      }
    }
  }

  const char* p_;
  std::size_t n_;
  std::size_t i_ = 0;
  std::string what_;
};

TSHARD_FUNC JsonValue parse_json(const char* text, std::size_t size, const std::string& what) {
  return JsonParser(text, size, what).parse();
}

TSHARD_FUNC std::string json_quote(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          static const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[(c >> 4) & 0xf];
          out += hex[c & 0xf];
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

}  // namespace tshard::io::detail
