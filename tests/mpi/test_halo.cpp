// Windowed operators: halo exchange, convolution, stencils (issue 4).
#include "test_support.hpp"
