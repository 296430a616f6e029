// Sharded operators: elementwise, reductions, einsum/matmul, shape ops.
#pragma once
