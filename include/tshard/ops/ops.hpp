// Sharded operators: elementwise, reductions, einsum/matmul, shape ops.
#pragma once

#include "tshard/ops/einsum.hpp"
#include "tshard/ops/elementwise.hpp"
#include "tshard/ops/inplace.hpp"
#include "tshard/ops/reduce.hpp"
#include "tshard/ops/shape.hpp"
#include "tshard/ops/take.hpp"
