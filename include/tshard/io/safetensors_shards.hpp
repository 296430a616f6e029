// A model's tensors as Hugging Face's save_pretrained writes them: one model.safetensors, or,
// past a size, shards model-00001-of-0000N.safetensors of at most that size each (a tensor larger
// than it alone in its shard) with model.safetensors.index.json naming each tensor's shard.
// SafetensorsReader reads either back.
#pragma once
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "tshard/comm/text.hpp"
#include "tshard/core/kernel_instances.hpp"
#include "tshard/io/checkpoint.hpp"
#include "tshard/io/json.hpp"
#include "tshard/io/safetensors.hpp"

namespace tshard::io {

// Writes `tensors` into directory `dir` (made where missing); collective over comm. Ranks may list
// different tensors (pipeline stages): the shards follow the order of save_safetensors' union.
// Returns the files written (the weight files, then the index where there is one).
std::vector<std::string> save_safetensors_shards(
    MPI_Comm comm, const std::string& dir, const std::vector<NamedTensor>& tensors,
    std::int64_t max_shard_bytes = 5'000'000'000,
    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace tshard::io

#if TSHARD_HEADER_BODIES
#include "tshard/io/safetensors_shards-inl.hpp"
#endif
