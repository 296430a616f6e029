// A module's state by name: state_dict(model) lists every parameter and buffer (submodules'
// first, "name." before theirs), load_state_dict(model, sd) copies a state dict's values in, and
// save / load put them in a checkpoint directory (io/checkpoint.hpp: the global tensors, so any
// mesh and rank count reads what any other wrote) or take them from a safetensors file.
//
//   ts::nn::save(mesh, "ckpt", model);        // collective: every tensor, atomically
//   ts::nn::load(mesh, "ckpt", model);        // on any mesh, any specs
#pragma once
#include <string>
#include <vector>

#include "tshard/nn/module.hpp"
#include "tshard/nn/state_dict.hpp"

namespace tshard::nn {

// The model's parameters and buffers, referring to its own tensors (not copies).
inline StateDict state_dict(const Module& model) {
  StateDict sd;
  model.for_each_state([&](const std::string& name, const std::shared_ptr<StateTensor>& t, bool) { sd.add(name, t); });
  return sd;
}

namespace detail {
// "a, b, c" (at most 8, then how many more).
inline std::string name_list(const std::vector<std::string>& names) {
  std::string s;
  for (std::size_t i = 0; i < names.size() && i < 8; ++i) s += (i ? ", " : "") + names[i];
  if (names.size() > 8) s += " and " + std::to_string(names.size() - 8) + " more";
  return s;
}
}  // namespace detail

// Copies each of the model's tensors from the entry of `sd` with its name (same shape and element
// type, any spec; collective over each tensor's mesh). strict: every name of the model is in sd
// and every name of sd in the model, else a SpecError naming the missing and the unexpected ones
// (before anything is copied).
inline void load_state_dict(Module& model, const StateDict& sd, bool strict = true) {
  const StateDict mine = state_dict(model);
  std::vector<std::string> missing, unexpected;
  for (const auto& [name, t] : mine)
    if (!sd.contains(name)) missing.push_back(name);
  for (const auto& [name, t] : sd)
    if (!mine.contains(name)) unexpected.push_back(name);
  if (strict && (!missing.empty() || !unexpected.empty()))
    throw SpecError("tshard::nn::load_state_dict: the state does not match the model: " +
                    (missing.empty() ? std::string() : "missing " + detail::name_list(missing)) +
                    (missing.empty() || unexpected.empty() ? "" : "; ") +
                    (unexpected.empty() ? std::string() : "unexpected " + detail::name_list(unexpected)));
  for (const auto& [name, t] : mine)
    if (sd.contains(name)) t->assign(sd.at(name), name);
}

// Every parameter and buffer of the model into the checkpoint directory `dir`, atomically
// (collective over the mesh's ranks; each writes its blocks). `prefix` goes before each name.
template <MeshType M>
void save(const M& mesh, const std::string& dir, const Module& model) {
  io::CheckpointWriter out(mesh.comm(), dir);
  state_dict(model).save(out);
  out.commit();
}

// Every parameter and buffer of the model from the checkpoint directory `dir`: any mesh and specs
// wrote it; a tensor missing, misshaped or failing its checksum is an IoError on every rank.
template <MeshType M>
void load(const M& mesh, const std::string& dir, Module& model) {
  const io::CheckpointReader in(mesh.comm(), dir);
  for (const auto& [name, t] : state_dict(model)) t->load(in, name);
}

}  // namespace tshard::nn
