// The definitions of flags.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cstdio>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tshard/core/simulated_timing.hpp"
#include "tshard/train/flags.hpp"

namespace tshard::train {

TSHARD_FUNC Flags& Flags::custom(const std::string& name, std::function<void(const std::string&)> f,
                                 std::string placeholder) {
  options_.push_back({name, true, std::move(f), std::move(placeholder)});
  return *this;
}

TSHARD_FUNC Flags& Flags::choice(const std::string& name, std::string& target,
                                 std::vector<std::string> allowed) {
  std::string alternatives;
  for (const auto& a : allowed) alternatives += (alternatives.empty() ? "" : "|") + a;
  custom(name, [this, name, &target, allowed](const std::string& v) {
    for (const auto& a : allowed)
      if (a == v) {
        target = v;
        return;
      }
    std::string list;
    for (std::size_t i = 0; i < allowed.size(); ++i) list += (i ? (i + 1 == allowed.size() ? " or " : ", ") : "") + allowed[i];
    fail(name + " takes " + list + ", not '" + v + "'");
  }, alternatives);
  options_.back().default_value = target;
  return *this;
}

TSHARD_FUNC void Flags::parse() {
  for (const auto& a : args_)
    if (a == "--help" || a == "-h") throw HelpRequested(usage());
  for (std::size_t i = 0; i < args_.size(); ++i) {
    const std::string& a = args_[i];
    const Option* o = find(a);
    if (!o) fail("unknown option " + a);
    if (o->takes_value) {
      if (i + 1 >= args_.size()) fail(a + " needs a value");
      o->apply(args_[++i]);
    } else {
      o->apply("");
    }
    given_.push_back(a);
  }
  // (Timing mode computes no real values: there is nothing to compare.)
  if (simulated_timing_mode() && std::find(given_.begin(), given_.end(), "--check") != given_.end())
    fail("--check compares this run's values with its one-rank run's, and in the simulation's timing mode "
         "(simulate.sh --timing) values are meaningless: check without --timing");
}

TSHARD_FUNC std::string Flags::usage() const {
  std::string text = "usage: " + program_ + " [options]\n";
  for (const auto& o : options_) {
    std::string line = "  " + o.name + (o.takes_value ? " " + o.placeholder : "");
    if (!o.default_value.empty()) line += std::string(line.size() < 34 ? 34 - line.size() : 1, ' ') + "(default " + o.default_value + ")";
    text += line + "\n";
  }
  return text + "  --help, -h                      this list\n";
}

TSHARD_FUNC int Flags::report(const std::exception& e, int code) {
  const bool help = dynamic_cast<const HelpRequested*>(&e) != nullptr;
  if (Environment::world_size() == 1 || Environment::world_rank() == 0) std::fprintf(help ? stdout : stderr, help ? "%s" : "%s\n", e.what());
  return help ? 0 : code;
}

TSHARD_FUNC const Flags::Option* Flags::find(const std::string& name) const {
  for (const auto& o : options_)
    if (o.name == name) return &o;
  return nullptr;
}

}  // namespace tshard::train
