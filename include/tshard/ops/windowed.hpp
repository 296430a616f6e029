// Windowed operators: with_halo, HaloPlan, convolve, stencils.
#pragma once
