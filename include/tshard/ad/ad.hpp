// Reverse-mode gradients over the sharded operators: the rules, custom VJPs and the drivers.
#pragma once
#include "tshard/ad/checkpoint.hpp"
#include "tshard/ad/cotangent.hpp"
#include "tshard/ad/custom_vjp.hpp"
#include "tshard/ad/grad.hpp"
#include "tshard/ad/rules/einsum.hpp"
#include "tshard/ad/rules/elementwise.hpp"
#include "tshard/ad/rules/reduce.hpp"
#include "tshard/ad/rules/shape.hpp"
#include "tshard/ad/rules/windowed.hpp"
#include "tshard/ad/scalar.hpp"
#include "tshard/ad/vjp.hpp"
