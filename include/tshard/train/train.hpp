// What every training program rewrites, once: flags and --mesh, token data, checkpoints of a run,
// Hugging Face's parameter layout and model directories (config, weights, tokenizer), sampling,
// and reports (GEMM rate, step times, memory).
#pragma once
#include "tshard/train/checkpoint.hpp"
#include "tshard/train/data.hpp"
#include "tshard/train/flags.hpp"
#include "tshard/train/hf_config.hpp"
#include "tshard/train/hf_directory.hpp"
#include "tshard/train/hf_layout.hpp"
#include "tshard/train/report.hpp"
#include "tshard/train/sampling.hpp"
#include "tshard/train/tokenizer.hpp"
