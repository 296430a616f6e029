// Elementwise operators: + - * / between sharded tensors and with scalars, comparisons giving
// masks, where(), unary functions and map. Operands of different rank align at their last dim
// and size-1 dims broadcast, as in numpy. Output specs follow the elementwise rule
// (docs/architecture.md) at compile time; operands are aligned by implicit reshards (counted,
// forbiddable); kernels run on padded local blocks and are instantiated per element type, never
// per spec.
#pragma once
#include "tshard/ops/elementwise/arithmetic.hpp"
#include "tshard/ops/elementwise/compare.hpp"
#include "tshard/ops/elementwise/map.hpp"
#include "tshard/ops/elementwise/update.hpp"
