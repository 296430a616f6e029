// The nn layer: functions with their backward, layers owning their parameters, optimizers with
// weight-update sharding.
#pragma once
#include "tshard/ad/ad.hpp"
#include "tshard/nn/activations.hpp"
#include "tshard/nn/attention.hpp"
#include "tshard/nn/batch_norm.hpp"
#include "tshard/nn/conv.hpp"
#include "tshard/nn/cross_entropy.hpp"
#include "tshard/nn/denormals.hpp"
#include "tshard/nn/embedding.hpp"
#include "tshard/nn/layer_norm.hpp"
#include "tshard/nn/linear.hpp"
#include "tshard/nn/micro_batch.hpp"
#include "tshard/nn/module.hpp"
#include "tshard/nn/optim.hpp"
#include "tshard/nn/pipeline.hpp"
#include "tshard/nn/softmax.hpp"
#include "tshard/nn/transformer.hpp"
