// The nn layer: functions with their backward (layers and optimizers build on them).
#pragma once
#include "tshard/nn/activations.hpp"
#include "tshard/nn/cross_entropy.hpp"
#include "tshard/nn/layer_norm.hpp"
#include "tshard/nn/linear.hpp"
#include "tshard/nn/optim.hpp"
#include "tshard/nn/softmax.hpp"
