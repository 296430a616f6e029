// The windowed operators: halos, stencils and convolutions, one header each (conv2d and pooling,
// with their gradients, are ts::nn's: nn/functional/conv.hpp, nn/functional/pooling.hpp).
#pragma once
#include "tshard/ops/halo.hpp"
#include "tshard/ops/stencil.hpp"
