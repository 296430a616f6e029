// The definitions of module.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tshard/nn/module.hpp"

namespace tshard::nn {

TSHARD_FUNC Module::Module(Module&& o) noexcept
    : hooks_(std::move(o.hooks_)),
      deferred_(o.deferred_),
      streams_parameters_(o.streams_parameters_),
      parameters_(std::move(o.parameters_)),
      buffers_(std::move(o.buffers_)),
      spare_(std::move(o.spare_)),
      children_(std::move(o.children_)),
      training_(o.training_),
      micro_batch_(o.micro_batch_),
      parent_(o.parent_) {
  // Member submodules move next and find this module as their parent; others stay put.
  for (auto& c : children_) c.module->parent_ = this;
  if (parent_)
    for (auto& c : parent_->children_)
      if (c.module == &o) c.module = this;
  o.parent_ = nullptr;
}

TSHARD_FUNC std::vector<std::string> Module::parameter_names() const {
  std::vector<std::string> out;
  for_each_slot([&](const std::string& n, detail::ParameterSlot&, const Module&) { out.push_back(n); });
  return out;
}

TSHARD_FUNC std::vector<std::pair<std::string, std::vector<Eigen::Index>>> Module::parameter_shapes() const {
  std::vector<std::pair<std::string, std::vector<Eigen::Index>>> out;
  for_each_slot([&](const std::string& n, detail::ParameterSlot& s, const Module&) { out.emplace_back(n, s.shape()); });
  return out;
}

TSHARD_FUNC std::vector<std::string> Module::buffer_names() const {
  std::vector<std::string> out;
  for_each_buffer([&](const std::string& n, const std::shared_ptr<StateTensor>&) { out.push_back(n); });
  return out;
}

TSHARD_FUNC std::shared_ptr<detail::ParameterSlot> Module::parameter_slot(const std::string& name) const {
  std::shared_ptr<detail::ParameterSlot> found;
  for_each_module([&](const Module& m, const std::string& prefix) {
    for (const auto& p : m.parameters_)
      if (prefix + p.name == name) found = p.slot;
  });
  if (!found) throw SpecError("tshard::nn::Module: no parameter named \"" + name + "\"");
  return found;
}

TSHARD_FUNC void Module::zero_grad() {
  for_each_slot([](const std::string&, detail::ParameterSlot& s, const Module&) { s.zero_grad(); });
}

TSHARD_FUNC void Module::train(bool on) {
  for_each_module([on](Module& m, const std::string&) { m.training_ = on; });
}

TSHARD_FUNC void Module::set_micro_batch(const MicroBatch& mb) {
  for_each_module([&mb](Module& m, const std::string&) { m.micro_batch_ = mb; });
}

TSHARD_FUNC ParameterLeaves Module::track_parameters() {
  ParameterLeaves leaves;
  for_each_module_children_first([&](Module& m) {
    for (auto& p : m.parameters_) leaves.push_back(p.slot->track());
  });
  return leaves;
}

TSHARD_FUNC void Module::untrack_parameters() {
  for_each_slot([](const std::string&, detail::ParameterSlot& s, const Module&) { s.untrack(); });
}

TSHARD_FUNC void Module::GradientCollector::advance(std::uint64_t order) {
  if (!planned_) plan();
  while (next_ < entries_.size() && entries_[next_].threshold >= order) fire(entries_[next_++]);
  if (progress_) (*progress_)();  // (reductions started by layers before this one travel on)
}

TSHARD_FUNC void Module::GradientCollector::finish() {
  if (!planned_) plan();
  while (next_ < entries_.size()) fire(entries_[next_++]);
}

TSHARD_FUNC void Module::GradientCollector::plan() {
  planned_ = true;
  std::size_t i = 0;
  // Post-order: children before parents. A module is final when the oldest node reading any
  // parameter of its subtree has run.
  std::vector<std::uint64_t> subtree;  // per entry, the threshold of its subtree
  root_->for_each_module_children_first([&](Module& m) {
    Entry e{std::numeric_limits<std::uint64_t>::max(), &m, i, m.parameters_.size()};
    if (i + e.count > leaves_.size())
      throw SpecError("tshard::nn::Module: a parameter was registered between a forward and its backward");
    for (std::size_t k = i; k < i + e.count; ++k) e.threshold = std::min(e.threshold, leaves_[k]->first_consumer);
    i += e.count;
    // Its submodules are the entries just before it that are not yet claimed by a parent.
    for (std::size_t c = 0; c < m.children_.size(); ++c) {
      e.threshold = std::min(e.threshold, subtree.back());
      subtree.pop_back();
    }
    entries_.push_back(e);
    subtree.push_back(e.threshold);
  });
  for (const auto& e : entries_)
    if (!progress_ && e.module->hooks_.progress) progress_ = &e.module->hooks_.progress;
  // Descending thresholds; a stable sort keeps children before their parent on ties.
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.threshold > b.threshold; });
}

TSHARD_FUNC void Module::GradientCollector::fire(const Entry& e) {
  std::size_t k = e.first;
  for (auto& p : e.module->parameters_) p.slot->collect(*leaves_[k++], e.module->deferred_);
  e.module->gradients_ready();
}

TSHARD_FUNC void Module::defer_gradient_sums(std::uint32_t axes) {
  for_each_module([axes](Module& m, const std::string&) { m.deferred_ = axes; });
}

TSHARD_FUNC void Module::check_name(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    throw SpecError("tshard::nn::Module: \"" + name + "\" is not a name: non-empty, without '.'");
  for (const auto& p : parameters_)
    if (p.name == name) throw SpecError("tshard::nn::Module: the name \"" + name + "\" is registered twice");
  for (const auto& b : buffers_)
    if (b.name == name) throw SpecError("tshard::nn::Module: the name \"" + name + "\" is registered twice");
  for (const auto& c : children_)
    if (c.name == name) throw SpecError("tshard::nn::Module: the name \"" + name + "\" is registered twice");
}

TSHARD_FUNC void Module::add_parameter(const std::string& name,
                                       std::shared_ptr<detail::ParameterSlot> slot) {
  check_name(name);
  for (const auto& p : parameters_)
    if (p.slot->identity() == slot->identity())
      throw SpecError("tshard::nn::Module: the tensor registered as \"" + name + "\" is already registered as \"" +
                      p.name + "\"");
  parameters_.push_back({name, std::move(slot)});
}

TSHARD_FUNC void Module::add_module(const std::string& name, Module& child) {
  check_name(name);
  for (const auto& c : children_)
    if (c.module == &child)
      throw SpecError("tshard::nn::Module::register_module: the module registered as \"" + name +
                      "\" is already registered as \"" + c.name + "\"");
  if (static_cast<Module*>(&child) == this)
    throw SpecError("tshard::nn::Module::register_module: a module cannot be its own submodule (\"" + name + "\")");
  children_.push_back({name, &child});
  static_cast<Module&>(child).parent_ = this;
}

}  // namespace tshard::nn
