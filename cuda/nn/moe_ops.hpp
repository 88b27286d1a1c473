#pragma once
// Internal to the CUDA backend: its mixture-of-experts ops (nn/moe.cpp,
// kernels/moe.cu), which CudaBackend's overrides call. Not a public header.
#include "nn/common.hpp"

namespace ringtrain::cuda::nnimpl {

void moe_route(Shared& sh, Tensor& probs, const Tensor& bias, int k, Tensor& expert, Tensor& gate, Tensor& psum);
void moe_gather_rows(Shared& sh, const Tensor& src, const Tensor& idx, Tensor& dst);
void moe_combine(Shared& sh, const Tensor& rows, const Tensor& row, const Tensor& gate, int k, const Tensor& tokens,
                 Tensor& y, bool accumulate);
void moe_combine_backward(Shared& sh, const Tensor& dy, const Tensor& rows, const Tensor& row, const Tensor& gate,
                          int k, Tensor& dgate, Tensor& drows);
void moe_router_backward(Shared& sh, const Tensor& probs, const Tensor& expert, const Tensor& gate,
                         const Tensor& dgate, const Tensor& f, double aux_g, Tensor& dlogit);
void batched_gemm(Shared& sh, Device dev, const Backend::BatchedGemm& g);

}  // namespace ringtrain::cuda::nnimpl
