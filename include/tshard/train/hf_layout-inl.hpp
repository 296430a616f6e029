// The definitions of hf_layout.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tshard/train/hf_layout.hpp"

namespace tshard::train {

TSHARD_FUNC std::vector<std::pair<std::string, HfParameter*>> hf_parameters(nn::Module& model, bool written) {
  std::vector<std::pair<std::string, HfParameter*>> out;
  model.for_each_module([&](nn::Module& m, const std::string& prefix) {
    auto* p = dynamic_cast<HfParameter*>(&m);
    if (p && !(written && !p->tied_to.empty())) out.emplace_back(p->tied_to.empty() ? prefix + "weight" : p->tied_to, p);
  });
  return out;
}

TSHARD_FUNC void load_hf_weights(MPI_Comm comm, const std::string& path, nn::Module& model) {
  io::SafetensorsReader in(comm, path);
  for (const auto& [name, p] : hf_parameters(model)) p->load(in, name);
}

TSHARD_FUNC void save_hf_weights(MPI_Comm comm, const std::string& path, nn::Module& model) {
  std::vector<io::NamedTensor> tensors;
  std::vector<std::shared_ptr<void>> keep;
  for (const auto& [name, p] : hf_parameters(model, true)) keep.push_back(p->add_to(tensors, name));
  io::save_safetensors(comm, path, tensors, {{"format", "pt"}});
}

}  // namespace tshard::train
