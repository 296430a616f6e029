// Optimizers: pure update rules (AdamW, SGD), the optimizer that applies them to sharded
// parameters (its data-parallel sum and ZeRO sharding from parallel/), parameter groups.
#pragma once
#include "tshard/optim/adamw.hpp"
#include "tshard/optim/optimizer.hpp"
#include "tshard/optim/param_groups.hpp"
#include "tshard/optim/sgd.hpp"
#include "tshard/optim/schedule.hpp"
