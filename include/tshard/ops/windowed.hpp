// The windowed operators: halos, stencils, convolutions and conv2d, one header each.
#pragma once
#include "tshard/ops/conv2d.hpp"
#include "tshard/ops/halo.hpp"
#include "tshard/ops/stencil.hpp"
