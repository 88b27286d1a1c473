#pragma once
// The CUDA implementation of nn/backend.hpp: cuDNN for convolution, pooling and
// batch norm, cuBLAS (GemmEx) for Linear, our kernels for element-wise ops,
// dropout and softmax cross-entropy. Registered for DeviceKind::cuda by
// register.cu when a GPU is present.
//
// Rules kept:
//  - Every kernel runs on its device's CudaContext compute stream; no
//    device-wide synchronisation. softmax_xent/count_correct return host
//    numbers, so they wait for the compute stream (once per step).
//  - Per-layer state (cuDNN descriptors, chosen algorithms, workspace sizes,
//    masked-gradient scratch) is created once per input shape and cached.
//  - Precision: f32 layers compute in strict fp32 (cuDNN FMA math, cuBLAS
//    32F) unless their spec's MathMode (train.precision) allows TF32, bf16 or
//    fp16 conversion; f16/bf16 layers use tensor cores with fp32 accumulation.
//  - bfloat16 activations (Backend::bf16_activations, train.precision = bf16):
//    the float32 Linear, LayerNorm, attention, element-wise, dropout, token
//    and broadcast kernels also take bf16 activations with float32
//    parameters (a Linear's weight: its bf16 copy) and write float32
//    parameter gradients; cuBLAS multiplies bf16 with float32 accumulation.
//    Convolution, batch norm and pooling take float32 only. float16
//    activations (Backend::fp16_activations, train.precision = fp16) alike.
//  - BackendOptions come from the environment at registration (static
//    initialisation, before any configuration is read): only the cuDNN
//    algorithm choice, which no configuration key covers.
#include <memory>

#include "ringtrain/cuda/context.hpp"
#include "ringtrain/nn/backend.hpp"

namespace ringtrain::cuda {

struct BackendOptions {
  // Convolution algorithms: false = cuDNN's heuristics (no trial runs);
  // true = cudnnFind* times every algorithm once per new input shape
  // (torch.backends.cudnn.benchmark). Either way the choice is cached per shape.
  bool cudnn_find = false;                      // RINGTRAIN_CUDNN_FIND=1
  // Only algorithms cuDNN marks deterministic (no float atomics), so a run
  // repeats bitwise; the first H100 run found bf16 `cnn` jobs ending anywhere
  // between 10% and 100% accuracy from run-to-run noise alone.
  // RINGTRAIN_CUDNN_DETERMINISTIC=0 allows the fastest regardless.
  bool cudnn_deterministic = true;
  std::size_t conv_workspace_limit = 256 << 20;  // per cuDNN call, bytes
  static BackendOptions from_env();
};

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& opt);

// The context (streams, handles) the registered CUDA backend uses on `device`;
// created on first use. Trainers use it for their own kernels and for
// DeviceCollectives so that all of a rank's GPU work shares its streams.
CudaContext& backend_context(int device);

}  // namespace ringtrain::cuda
