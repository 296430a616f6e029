// The whole public API of tshard; include this one header.
#pragma once

#include "tshard/version.hpp"

#include "tshard/core/cpu_capability.hpp"
#include "tshard/core/error.hpp"
#include "tshard/core/spec.hpp"

#include "tshard/comm/buffer_pool.hpp"
#include "tshard/comm/clock.hpp"
#include "tshard/comm/environment.hpp"
#include "tshard/comm/host_collectives.hpp"
#include "tshard/comm/failure.hpp"
#include "tshard/comm/mesh.hpp"
#include "tshard/comm/stats.hpp"

#include "tshard/tensor/factories.hpp"
#include "tshard/tensor/send_receive.hpp"
#include "tshard/tensor/sharded_tensor.hpp"

#include "tshard/reshard/reshard.hpp"

#include "tshard/ops/inner_product.hpp"
#include "tshard/ops/ops.hpp"
#include "tshard/ops/windowed.hpp"

#include "tshard/solvers/krylov.hpp"

#include "tshard/ad/ad.hpp"

#include "tshard/nn/nn.hpp"
#include "tshard/optim/optim.hpp"
#include "tshard/parallel/parallel.hpp"

#include "tshard/debug/trace.hpp"
#include "tshard/debug/visualize.hpp"

#include "tshard/io/checkpoint.hpp"
#include "tshard/io/npy.hpp"
#include "tshard/io/safetensors.hpp"
#if defined(TSHARD_WITH_HDF5)  // the component tshard::hdf5
#include "tshard/io/hdf5.hpp"
#endif
