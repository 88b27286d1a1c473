// bfloat16 activations on the CUDA backend (issue 31, item 3): the kernels of
// float32 layers fed bf16 activations against the same kernels in float32,
// and a vit Stage in bf16 against fp32 (tests in half_kernels.hpp, which
// derives the bounds; fp16_kernels.cpp runs them for float16).
// Written and compiled without a GPU; not yet run on one (docs/gpu.md).
#include "half_kernels.hpp"
#include "half_images.hpp"  // Conv2d, BatchNorm2d, pooling (16-bit storage of convolutions)

namespace half_test {
INSTANTIATE_TEST_SUITE_P(GpuBf16, Half16, ::testing::Values(kBf16), half_name);
}  // namespace half_test
