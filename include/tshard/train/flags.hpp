// Command-line flags as every training program reads them: `--name value` options and `--name`
// switches bound to variables, `--mesh axis=size,...` for any mesh type, and the same errors
// everywhere: "<program>: unknown option --x", "<program>: --steps needs a value". Every rank
// parses the same line, so every rank throws the same UsageError; report() prints it once.
// `--help` (or `-h`) anywhere lists every flag with its current value as the default (a
// HelpRequested, which report() prints to standard output, returning 0).
//
//   ts::train::Flags flags("train_llama", argc, argv);
//   flags.value("--steps", o.steps).value("--lr", o.lr).flag("--double", o.use_double)
//        .mesh<M>("--mesh", o.mesh).parse();
#pragma once
#include <algorithm>
#include <array>
#include <charconv>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "tshard/comm/environment.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/kernel_instances.hpp"

namespace tshard::train {

// A bad command line: the message says what and names the program.
struct UsageError : Error {
  using Error::Error;
};
// --help: its message is the usage text (not an error: report() returns 0 for it).
struct HelpRequested : UsageError {
  using UsageError::UsageError;
};

// A mesh's sizes as --mesh gives them: axes it does not name are 1, except the first, which
// takes the ranks left over (every rank on it without --mesh).
template <MeshType M>
struct MeshSizes {
  std::array<int, M::axes> sizes = [] {
    std::array<int, M::axes> s{};
    s.fill(1);
    s[0] = 0;  // (the ranks left over)
    return s;
  }();
  bool given = false;
  // The sizes for `ranks` ranks, or a UsageError "<program>: --mesh data=2,model=1 does not
  // match 3 ranks".
  std::array<int, M::axes> resolve(const std::string& program, int ranks) const {
    std::array<int, M::axes> out = sizes;
    int fixed = 1;
    for (int a = 1; a < M::axes; ++a) fixed *= out[std::size_t(a)];
    if (out[0] == 0) out[0] = ranks % fixed == 0 ? ranks / fixed : 0;
    int product = 1;
    for (int s : out) product *= s;
    if (product != ranks) {
      std::string text;
      for (int a = 0; a < M::axes; ++a)
        text += (a ? "," : "") + std::string(M::axis_names[std::size_t(a)]) + "=" + std::to_string(sizes[std::size_t(a)]);
      throw UsageError(program + ": --mesh " + text + " does not match " + std::to_string(ranks) + " ranks");
    }
    return out;
  }
  // The mesh on MPI_COMM_WORLD.
  M make(const std::string& program) const {
    const auto s = resolve(program, Environment::world_size());
    int sizes_c[M::axes];
    std::copy(s.begin(), s.end(), sizes_c);
    return M(sizes_c);
  }
};

class Flags {
 public:
  Flags(std::string program, int argc, char** argv) : program_(std::move(program)), args_(argv + 1, argv + argc) {}

  // `name value`: an integer, a real or a string. A number must be all of the value ("2x", "" and
  // "1e400" are refused with the flag's name, not read as 2, 0 and inf).
  template <class V>
  Flags& value(const std::string& name, V& target) {
    options_.push_back({name, true, [this, name, &target](const std::string& v) { assign(target, v, name); },
                        placeholder<V>(), shown(target)});
    return *this;
  }
  // `name`: sets target to `to`.
  template <class V>
  Flags& flag(const std::string& name, V& target, V to) {
    options_.push_back({name, false, [&target, to](const std::string&) { target = to; }});
    return *this;
  }
  Flags& flag(const std::string& name, bool& target) { return flag(name, target, true); }
  // `name value` handled by the caller (which may throw fail(...)).
  Flags& custom(const std::string& name, std::function<void(const std::string&)> f, std::string placeholder = "VALUE");
  // `name value` where the value is one of `allowed`: else "<name> takes a or b, not 'c'".
  Flags& choice(const std::string& name, std::string& target, std::vector<std::string> allowed);
  // `--mesh axis=size,...` over the axes of M; `order` lists the axes in the error text (as
  // "(data, model or stage)"), M's order where empty.
  template <MeshType M>
  Flags& mesh(const std::string& name, MeshSizes<M>& target, std::vector<std::string> order = {}) {
    if (order.empty())
      for (auto a : M::axis_names) order.emplace_back(a);
    std::string axes;
    for (const auto& a : order) axes += (axes.empty() ? "" : ",") + a + "=N";
    custom(name, [this, &target, order](const std::string& v) { parse_mesh(v, target, order); }, axes);
    options_.back().default_value = "every rank on " + std::string(M::axis_names[0]);
    return *this;
  }

  // Reads the command line; a UsageError on the first flag that does not parse, a HelpRequested
  // where it asks for --help.
  void parse();

  [[noreturn]] void fail(const std::string& what) const { throw UsageError(program_ + ": " + what); }
  // Whether the command line gave the flag `name` (after parse()).
  bool given(const std::string& name) const { return std::find(given_.begin(), given_.end(), name) != given_.end(); }
  const std::string& program() const { return program_; }

  // "usage: <program> [options]" and a line per flag, in the order they were bound.
  std::string usage() const;

  // Prints an error every rank threw alike once (world rank 0) and returns `code` (2 for a
  // UsageError, as command-line tools do); --help's text goes to standard output, returning 0.
  static int report(const std::exception& e, int code = 2);

 private:
  struct Option {
    std::string name;
    bool takes_value;
    std::function<void(const std::string&)> apply;
    std::string placeholder;    // in the usage text: N, X, TEXT, a|b, data=N,model=N
    std::string default_value;  // the bound variable's value when bound (empty: none shown)
  };
  template <class V>
  static std::string placeholder() {
    if constexpr (std::is_same_v<V, std::string>) return "TEXT";
    else if constexpr (std::is_floating_point_v<V>) return "X";
    else return "N";
  }
  template <class V>
  static std::string shown(const V& v) {
    if constexpr (std::is_same_v<V, std::string>) return v;
    else if constexpr (std::is_floating_point_v<V>) {
      char buffer[32];
      std::snprintf(buffer, sizeof buffer, "%g", double(v));
      return buffer;
    } else return std::to_string(v);
  }
  const Option* find(const std::string& name) const;
  template <class V>
  void assign(V& target, const std::string& v, const std::string& name) const {
    if constexpr (std::is_same_v<V, std::string>) {
      target = v;
    } else if constexpr (std::is_floating_point_v<V>) {
      char* end = nullptr;
      const double x = v.empty() ? 0.0 : std::strtod(v.c_str(), &end);
      if (v.empty() || end != v.c_str() + v.size() || !std::isfinite(x) || std::isspace(static_cast<unsigned char>(v[0])))
        fail(name + " takes a number, not '" + v + "'");
      target = V(x);
    } else {
      V x{};
      const char* first = v.c_str() + (v.size() > 1 && v[0] == '+' ? 1 : 0);
      const auto [end, error] = std::from_chars(first, v.c_str() + v.size(), x);
      if (v.empty() || error != std::errc() || end != v.c_str() + v.size())
        fail(name + " takes " + (std::is_signed_v<V> ? "an integer" : "a non-negative integer") +
             (error == std::errc::result_out_of_range ? " in range" : "") + ", not '" + v + "'");
      target = x;
    }
  }
  template <MeshType M>
  void parse_mesh(const std::string& s, MeshSizes<M>& m, const std::vector<std::string>& order) {
    m.given = true;
    m.sizes.fill(1);
    std::vector<int> named;  // the axes given so far
    std::size_t at = 0;
    while (at < s.size()) {
      const std::size_t comma = s.find(',', at);
      const std::string item = s.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
      const std::size_t eq = item.find('=');
      if (eq == std::string::npos) fail("--mesh takes axis=size items, e.g. data=2,model=2, not '" + item + "'");
      const std::string axis = item.substr(0, eq), digits = item.substr(eq + 1);
      const bool number = !digits.empty() && digits.size() < 10 &&
                          std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
      const int size = number ? std::atoi(digits.c_str()) : 0;
      if (size < 1) fail("--mesh: the size of " + axis + " must be a positive integer, not '" + digits + "'");
      int index = -1;
      for (int a = 0; a < M::axes; ++a)
        if (M::axis_names[std::size_t(a)] == axis) index = a;
      if (index < 0) {
        std::string list;
        for (std::size_t i = 0; i < order.size(); ++i) list += (i ? (i + 1 == order.size() ? " or " : ", ") : "") + order[i];
        fail("--mesh: unknown axis '" + axis + "' (" + list + ")");
      }
      if (std::find(named.begin(), named.end(), index) != named.end()) fail("--mesh names " + axis + " twice");
      named.push_back(index);
      m.sizes[std::size_t(index)] = size;
      if (comma == std::string::npos) break;
      at = comma + 1;
    }
  }

  std::string program_;
  std::vector<std::string> args_, given_;
  std::vector<Option> options_;
};

}  // namespace tshard::train

#if TSHARD_HEADER_BODIES
#include "tshard/train/flags-inl.hpp"
#endif
