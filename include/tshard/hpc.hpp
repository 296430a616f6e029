// The part of tshard a grid code uses: meshes, sharded tensors, reshards, operators, stencils and
// halos, host scalars and the Krylov solvers, with the operators' gradients (ad/: an operator
// records its rule) but without the model code (nn/, optim/, parallel/, train/) or the file
// formats, so a solver compiles in less of tshard.hpp's time.
#pragma once

#include "tshard/version.hpp"

#include "tshard/core/cpu_capability.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/spec.hpp"

#include "tshard/comm/clock.hpp"
#include "tshard/comm/environment.hpp"
#include "tshard/comm/failure.hpp"
#include "tshard/comm/host_collectives.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/comm/stats.hpp"

#include "tshard/tensor/factories.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

#include "tshard/reshard/reshard.hpp"

#include "tshard/ops/inner_product.hpp"
#include "tshard/ops/ops.hpp"
#include "tshard/ops/windowed.hpp"

#include "tshard/ad/ad.hpp"

#include "tshard/solvers/krylov.hpp"
