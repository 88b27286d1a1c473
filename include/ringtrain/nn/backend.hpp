#pragma once
// Backend: the per-device implementation of the layer math. Layers check
// shapes once (Caffe style) and then call a kernel object that the backend of
// their device created for them; the kernel owns whatever per-layer state the
// device needs (oneDNN primitives cached per input shape, cuDNN descriptors,
// workspaces) and is opaque to the layer.
//
// Rules kept by every backend:
//  - Tensors passed in are contiguous, plain row-major (NCHW for images), on the
//    backend's device, with the dtype the kernel was created for. Outputs are
//    preallocated by the caller with the right shape; kernels never allocate
//    outputs, only their own cached scratch (once per shape).
//  - Input gradients (dx) are overwritten. Parameter gradients (dw, db, ...)
//    are overwritten when `accumulate` is false and added to when it is true,
//    so gradient accumulation over micro-batches works by not zeroing.
//  - What a kernel keeps between a forward and the matching backward (saved
//    batch statistics, pooling indices, attention probabilities) is a
//    KernelState the caller owns (a layer's context, nn/layer.hpp), made by
//    the kernel's make_state() and passed to both calls: one kernel serves
//    several micro-batches in flight, each with its own state. Calls come as
//    forward, backward pairs with the same input shape and the same state, or
//    forward only (eval). A forward finding its state empty allocates it; what
//    the kernel caches per shape (primitives, workspaces used within one call)
//    is not state and stays in the kernel.
//  - Registration: register_backend() is the one place a device kind is wired
//    in. The CPU backend (src/backend/cpu) is built in; the CUDA backend
//    registers itself from cuda/ at static-initialisation time.
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>

#include "ringtrain/core/device.hpp"
#include "ringtrain/core/tensor.hpp"

namespace ringtrain {

// ---- layer specifications (device-neutral) --------------------------------
enum class PoolKind { max, avg };

// Down-conversion a float32 Conv2d/Linear may use *inside* its computation
// (storage, parameters and outputs stay float32 — the master weights), as
// oneDNN's fpmath_mode and cuBLAS's COMPUTE_32F_FAST_* define it: a backend may
// convert to a type at least as accurate as the one named, or not at all.
//   fp32  strict (the default)      tf32  TensorFloat-32 allowed
//   bf16  bfloat16 allowed          fp16  float16 allowed (pair with loss scaling)
// CUDA: cuBLAS FAST_TF32/FAST_16BF/FAST_16F; cuDNN conv TF32 (tf32, bf16) or
// fp16 conversion (fp16). CPU: oneDNN convolutions get the fpmath mode (used
// where the CPU has the instructions). bf16 additionally stores activations
// in bfloat16 where the backend and every layer of a stage take them
// (Backend::bf16_activations, Layer::takes_bf16); fp16 in float16 likewise
// (Backend::fp16_activations: the CUDA backend, not the CPU).
enum class MathMode { fp32, tf32, bf16, fp16 };
// "fp32" | "tf32" | "bf16" | "fp16"; throws Error naming the value otherwise.
MathMode parse_math_mode(const std::string& s);
const char* math_mode_name(MathMode m);
struct Pool2dSpec {
  PoolKind kind = PoolKind::max;
  std::int64_t kernel_h = 2, kernel_w = 2;
  std::int64_t stride_h = 2, stride_w = 2;
  std::int64_t pad_h = 0, pad_w = 0;  // avg pooling counts padding (PyTorch default)
  DType dtype = DType::f32;
};

struct Conv2dSpec {
  std::int64_t in_channels = 0, out_channels = 0;
  std::int64_t kernel_h = 3, kernel_w = 3;
  std::int64_t stride_h = 1, stride_w = 1;
  std::int64_t pad_h = 0, pad_w = 0;
  std::int64_t dilation_h = 1, dilation_w = 1;  // 1 = dense (PyTorch convention)
  bool bias = true;
  bool fuse_relu = false;  // y = relu(conv(x)); backward then needs y
  // y = pool(relu?(conv(x))): the pooling runs inside the kernel, so that the
  // large pre-pool activation never leaves the device's preferred layout. The
  // kernel keeps that activation (and pooling indices) for its backward.
  bool fuse_pool = false;
  Pool2dSpec pool;
  DType dtype = DType::f32;
  MathMode math = MathMode::fp32;
  // A k x k convolution with "same" padding (k/2) and the given stride.
  static Conv2dSpec square(std::int64_t in, std::int64_t out, std::int64_t k, std::int64_t stride, bool bias) {
    Conv2dSpec s;
    s.in_channels = in;
    s.out_channels = out;
    s.kernel_h = s.kernel_w = k;
    s.stride_h = s.stride_w = stride;
    s.pad_h = s.pad_w = k / 2;
    s.bias = bias;
    return s;
  }
};

struct LinearSpec {
  std::int64_t in_features = 0, out_features = 0;
  bool bias = true;
  bool fuse_relu = false;
  DType dtype = DType::f32;
  MathMode math = MathMode::fp32;
};

struct BatchNormSpec {
  std::int64_t channels = 0;
  double eps = 1e-5;
  double momentum = 0.1;  // running = (1 - momentum) * running + momentum * batch (PyTorch)
  DType dtype = DType::f32;
};

struct LayerNormSpec {
  std::int64_t features = 0;  // the normalised (last) dimension
  double eps = 1e-5;          // PyTorch's default
  DType dtype = DType::f32;
};

// The core of multi-head self-attention, without its projections: for every
// sample n and head h, O = softmax(scale * Q K^T) V, the row maximum
// subtracted before exp (safe softmax). A tensor-parallel layer passes its
// local head count.
struct AttentionSpec {
  std::int64_t heads = 1, head_dim = 0;
  double scale = 0;  // 0: 1 / sqrt(head_dim)
  DType dtype = DType::f32;
  MathMode math = MathMode::fp32;
  bool causal = false;  // token i attends to tokens j <= i only (language models): scores j > i are -inf
};

// ---- ring attention blocks (context parallelism, nn/ring_attention.cpp) ----
// One (query block, key block) pair of ring attention: the queries of this
// rank from qkv [n, L, 3d] (d = heads * head_dim), the keys and values of one
// rank's block from kv [n, L, 2d] (per token all heads' k, then v). Local
// token i of a block sits at global position chunks[i / c] * c + i % c (two
// chunks of c tokens, L = 2c, positions ascending); key j is visible to query
// i when its position is not later (causal over the whole sequence).
struct RingBlockSpec {
  std::int64_t heads = 1, head_dim = 0, chunk = 0;  // chunk: c
  float scale = 1;
  int q_chunks[2] = {0, 0}, k_chunks[2] = {0, 0};  // the two chunks of the queries' and of the keys' rank
};

// gelu: the exact erf form (PyTorch's default); gelu_tanh: the tanh approximation
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's and llm.c's (approximate="tanh").
enum class Eltwise { relu, gelu, gelu_tanh };

// ---- kernels ----------------------------------------------------------------
// A kernel's forward-to-backward state (see the rules above): each backend
// derives its own per kernel type; the caller only holds it.
class KernelState {
 public:
  virtual ~KernelState() = default;
};
using KernelStatePtr = std::unique_ptr<KernelState>;
// st as the backend's S (an Error naming the kernel when it is another kernel's).
template <class S>
S& state_as(KernelState& st, const char* kernel) {
  auto* s = dynamic_cast<S*>(&st);
  RT_CHECK(s, kernel, ": called with another kernel's state");
  return *s;
}

class Kernel {
 public:
  virtual ~Kernel() = default;
  // A fresh (empty) state for one micro-batch; kernels without state return the base.
  virtual KernelStatePtr make_state() const { return std::make_unique<KernelState>(); }
};
// The kernel state in `slot`, made by k when missing.
inline KernelState& state_in(KernelStatePtr& slot, const Kernel& k) {
  if (!slot) slot = k.make_state();
  return *slot;
}
// A buffer of `bytes` on `dev` that a kernel keeps from a forward for its
// backward, held in a Tensor of its state: allocated when missing or of
// another size. For the backward it must be there (the forward made it).
inline void* kept_buffer(Tensor& t, std::size_t bytes, Device dev) {
  if (!t.defined() || t.nbytes() != bytes || t.device() != dev)
    t = Tensor::empty({static_cast<std::int64_t>(bytes)}, DType::u8, dev);
  return t.raw();
}
inline void* kept_for_backward(Tensor& t, std::size_t bytes, const char* kernel) {
  RT_CHECK(t.defined() && t.nbytes() == bytes, kernel, ": backward without the state of its forward");
  return t.raw();
}

// Output shapes follow PyTorch: out = (in + 2 pad - dil (k - 1) - 1) / stride + 1.
class Conv2dKernel : public Kernel {
 public:
  // x [N,Cin,H,W], w [Cout,Cin,kh,kw], b [Cout] or undefined, y [N,Cout,OH,OW].
  virtual void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, KernelState& st) = 0;
  // y is forward's output (used to mask dy when fuse_relu); dx undefined = not needed;
  // dw (and db) undefined = not needed where Backend::splits_weight_grad().
  // With fuse_pool, y and dy have the pooled shape.
  virtual void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db, bool accumulate, KernelState& st) = 0;
};

class LinearKernel : public Kernel {
 public:
  // x [N,in], w [out,in], b [out] or undefined, y [N,out]: y = x w^T + b.
  virtual void forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) = 0;
  virtual void backward(const Tensor& x, const Tensor& w, const Tensor& y, const Tensor& dy, Tensor& dx,
                        Tensor& dw, Tensor& db, bool accumulate) = 0;
};

class BatchNormKernel : public Kernel {
 public:
  // Train: normalise with batch statistics (biased variance), update running
  // stats with the unbiased variance (PyTorch). Eval: use running stats.
  virtual void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& running_mean,
                       Tensor& running_var, bool train, Tensor& y, KernelState& st) = 0;
  // After a forward in either mode (eval: gradients through the fixed running stats).
  virtual void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                        Tensor& dbeta, bool accumulate, KernelState& st) = 0;
};

class Pool2dKernel : public Kernel {
 public:
  virtual void forward(const Tensor& x, Tensor& y, bool train, KernelState& st) = 0;
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx, KernelState& st) = 0;
};

class EltwiseKernel : public Kernel {
 public:
  virtual void forward(const Tensor& x, Tensor& y) = 0;
  // x and y are forward's input and output (either may be used).
  virtual void backward(const Tensor& x, const Tensor& y, const Tensor& dy, Tensor& dx) = 0;
};

// Rows are all leading dimensions flattened: x, y [rows, features].
class LayerNormKernel : public Kernel {
 public:
  // y = (x - mean) / sqrt(var + eps) * gamma + beta per row (biased variance);
  // keeps each row's mean and 1/std for the backward.
  virtual void forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& y, KernelState& st) = 0;
  virtual void backward(const Tensor& x, const Tensor& gamma, const Tensor& dy, Tensor& dx, Tensor& dgamma,
                        Tensor& dbeta, bool accumulate, KernelState& st) = 0;
};

class AttentionKernel : public Kernel {
 public:
  // qkv [N, T, 3*H*hd]: per token all heads' q, then k, then v (one Linear's
  // output; PyTorch's qkv.reshape(N, T, 3, H, hd)). out [N, T, H*hd], head h in
  // columns [h*hd, (h+1)*hd). Keeps what backward needs: the probabilities
  // [N, H, T, T] (a dense kernel), or the row log-sum-exp [N, H, T] and out
  // itself (a tiled one, the CPU's causal kernel: out must then hold the
  // forward's values when backward runs).
  virtual void forward(const Tensor& qkv, Tensor& out, KernelState& st) = 0;
  // dqkv is overwritten (same layout as qkv).
  virtual void backward(const Tensor& qkv, const Tensor& dout, Tensor& dqkv, KernelState& st) = 0;
};

// ---- the backend ------------------------------------------------------------
class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::string name() const = 0;  // "cpu (oneDNN 2.6 + OpenBLAS)"

  virtual std::unique_ptr<Conv2dKernel> conv2d(const Conv2dSpec& s) = 0;
  // Whether conv2d() honours Conv2dSpec::fuse_pool; model builders fall back
  // to a separate Pool2d layer when it does not (same parameters and math).
  virtual bool conv_fuses_pool() const { return false; }
  // Whether Conv2d/Linear kernels accept an undefined dw (and db): then the
  // layers split their backward into input and weight halves (zero-bubble).
  virtual bool splits_weight_grad() const { return false; }
  virtual std::unique_ptr<LinearKernel> linear(const LinearSpec& s) = 0;
  virtual std::unique_ptr<BatchNormKernel> batchnorm(const BatchNormSpec& s) = 0;
  virtual std::unique_ptr<Pool2dKernel> pool2d(const Pool2dSpec& s) = 0;
  virtual std::unique_ptr<EltwiseKernel> eltwise(Eltwise op, DType dt) = 0;

  virtual std::unique_ptr<LayerNormKernel> layernorm(const LayerNormSpec& s) = 0;
  virtual std::unique_ptr<AttentionKernel> attention(const AttentionSpec& s) = 0;

  // ---- token ops (vision transformer) ----
  // x [N, C, H, W] -> out [N, (H/p)*(W/p), C*p*p]: patches in row-major order,
  // features ordered (c, i, j) like a Conv2d weight [D, C, p, p]. unpatchify
  // is its adjoint (dx overwritten).
  virtual void patchify(const Tensor& x, std::int64_t patch, Tensor& out) = 0;
  virtual void unpatchify(const Tensor& dout, std::int64_t patch, Tensor& dx) = 0;
  // out[i] = x[i] + b[(i / inner) mod b.numel()]: b broadcast over the leading dimensions and
  // over `inner` trailing elements per entry. A bias over rows [N, C] or a position embedding
  // [T, D] over the batch has inner = 1; a per-channel bias of NCHW images has inner = H*W.
  // out may alias x.
  virtual void add_broadcast(const Tensor& x, const Tensor& b, std::int64_t inner, Tensor& out) = 0;
  // db[j] (+)= the sum of every dy[i] that add_broadcast adds b[j] to: its adjoint (the bias gradient).
  virtual void sum_broadcast(const Tensor& dy, std::int64_t inner, Tensor& db, bool accumulate) = 0;
  // y [N, D] = mean over t of x [N, T, D]; backward: dx[n, t, :] = dy[n, :] / T.
  virtual void token_mean(const Tensor& x, Tensor& y) = 0;
  virtual void token_mean_backward(const Tensor& dy, Tensor& dx) = 0;

  // ---- token embedding (language models; TokenEmbedding) ----
  // ids [N, T]: float32 token ids in [0, vocab), checked: the first bad one is
  // an Error "input i = v is not a token id in [0, vocab)" (TokenEmbedding adds
  // its name). rows (i32, N*T) receives id - first where that is a row of
  // weight [R, D] (this rank's vocabulary shard), else -1; y [N, T, D]
  // (float32 or the 16-bit activation type) = weight[row] (zeros for -1), plus
  // pos[t] when pos [>= T, D] is defined, summed in float32 and rounded once.
  virtual void embedding_forward(const Tensor& ids, std::int64_t vocab, std::int64_t first, const Tensor& weight,
                                 const Tensor& pos, Tensor& rows, Tensor& y) {
    RT_FAIL("the ", name(), " backend has no token embedding");
  }
  // Its adjoint, accumulating in float32: dweight[row] += dy[i] for rows >= 0,
  // and dpos[t] += dy[i] for every token when dpos is defined; each sum in token
  // order (deterministic, the same on every device).
  virtual void embedding_backward(const Tensor& dy, const Tensor& rows, Tensor& dweight, Tensor& dpos) {
    RT_FAIL("the ", name(), " backend has no token embedding");
  }

  // out = a + b (same shape; out may alias a or b).
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // y += alpha * x (same numel): plain SGD steps, gradient accumulation.
  virtual void axpy(double alpha, const Tensor& x, Tensor& y) = 0;
  // Inverted dropout: keep element i iff dropout_keep(seed, stream, first + i, p)
  // (nn/rng.hpp, identical on every device); y = keep ? x / (1 - p) : 0.
  // mask (u8, x's shape) records keep for the backward.
  virtual void dropout_forward(const Tensor& x, double p, std::uint64_t seed, std::uint64_t stream,
                               std::uint64_t first, Tensor& mask, Tensor& y) = 0;
  virtual void dropout_backward(const Tensor& dy, const Tensor& mask, double p, Tensor& dx) = 0;
  // Softmax cross-entropy, mean over the batch. logits [N,K] float, labels [N]
  // i32 or i64 in [0,K). With smoothing s the target is (1-s) onehot + s/K.
  // Writes dlogits [N,K] (d mean-loss / d logits) when defined; returns the loss.
  virtual double softmax_xent(const Tensor& logits, const Tensor& labels, double smoothing, Tensor& dlogits) = 0;
  // Number of rows whose argmax (first maximum) equals the label.
  virtual std::int64_t count_correct(const Tensor& logits, const Tensor& labels) = 0;

  // ---- vocabulary-parallel cross-entropy and accuracy (nn/lm_loss.cpp) ----
  // logits f32 [rows, L] are the columns [part L, (part + 1) L) of a
  // vocabulary of parts L split over a tensor group; labels i64 [rows]. The
  // caller sums maxes, sums and hits over the group between the calls.
  // maxes f32 [rows, parts] := 0, column `part` := the row's maximum of these
  // logits; best (i64 [rows], when defined) := the index of its first maximum;
  // labels (when defined) are checked: the first outside [0, parts L) is an
  // Error "label y of row r is not in [0, V)".
  virtual void vocab_row_max(const Tensor& logits, const Tensor& labels, int part, Tensor& maxes, Tensor& best) {
    RT_FAIL("the ", name(), " backend has no vocabulary-parallel cross-entropy");
  }
  // With maxes summed (m_r: the largest of row r): sums f64 [2, rows] := per
  // row the sum of exp(x - m_r) over these columns (in double), and the
  // label's logit where it is one of them (else 0).
  virtual void vocab_xent_sums(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                               Tensor& sums) {
    RT_FAIL("the ", name(), " backend has no vocabulary-parallel cross-entropy");
  }
  // With sums summed (z_r, target_r): returns the mean over the rows of
  // log z_r + m_r - target_r; dlogits (f32, the logits' shape, when defined)
  // := (softmax - onehot) / rows on these columns.
  virtual double vocab_xent_finish(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                                   const Tensor& sums, Tensor& dlogits) {
    RT_FAIL("the ", name(), " backend has no vocabulary-parallel cross-entropy");
  }
  // With maxes summed: hits f64 [1] := the number of rows whose whole-row
  // first maximum (in the lowest part holding the largest of maxes' row) is
  // in this part, at best[r], and is the label (first = part * L).
  virtual void vocab_count_hits(const Tensor& maxes, const Tensor& best, const Tensor& labels, int part,
                                std::int64_t first, Tensor& hits) {
    RT_FAIL("the ", name(), " backend has no vocabulary-parallel accuracy");
  }
  // ---- ring attention blocks (context parallelism; RingBlockSpec above) ----
  // All float32. `work` is the op's scratch (grown as needed; a device may not
  // use it); `poll` (may be empty) is called now and then by the calling thread
  // while the arithmetic runs: the CPU ring tests its transfers there.
  // Merges one key block into this rank's running state, FlashAttention-2's
  // online softmax: acc [n, L, d] (the unnormalised output), m and l
  // [n * heads * L] (row maximum and sum of exp over the keys so far), all
  // reset first (0, -inf, 0) when `first`. Rows that see no key of the block
  // keep their state.
  virtual void ring_block_forward(const Tensor& qkv, const Tensor& kv, const RingBlockSpec& b, bool first, Tensor& acc,
                                  Tensor& m, Tensor& l, Tensor& work, const std::function<void()>& poll) {
    RT_FAIL("the ", name(), " backend has no ring attention");
  }
  // After the last block: out = acc / l (out may be acc), lse = m + log l.
  virtual void ring_block_finish(const Tensor& acc, const Tensor& m, const Tensor& l, std::int64_t heads, Tensor& out,
                                 Tensor& lse) {
    RT_FAIL("the ", name(), " backend has no ring attention");
  }
  // D [n * heads * L] = per (sample, head, token) the sum over the head's
  // columns of out * dout (both [n, L, d]): the backward's row dot.
  virtual void attention_rowdot(const Tensor& out, const Tensor& dout, std::int64_t heads, Tensor& D) {
    RT_FAIL("the ", name(), " backend has no ring attention");
  }
  // One block's backward from the forward's lse and D: dQ added into dqkv's q
  // columns ([n, L, 3d]; its k and v columns untouched), dkv [n, L, 2d] := the
  // block's dK and dV.
  virtual void ring_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& dout, const Tensor& lse,
                                   const Tensor& D, const RingBlockSpec& b, Tensor& dqkv, Tensor& dkv, Tensor& work,
                                   const std::function<void()>& poll) {
    RT_FAIL("the ", name(), " backend has no ring attention");
  }
  // ---- mixture of experts (nn/moe.cpp; docs/moe.md) ----
  // The MoE layer's loops, on the backend's device. Index tensors: expert i32
  // [n, k]; row and idx i64 (-1: none). Float32 throughout.
  // Router: probs [n, E] holds the logits and receives the softmax (in double,
  // the row maximum subtracted); expert := the top-k of p + bias (bias [E]
  // undefined: p alone), best first, ties to the lower index; gate := p of
  // each / the sum of the token's top-k p (in double); psum f64 [E] := the
  // column sums of p, in token order.
  virtual void moe_route(Tensor& probs, const Tensor& bias, int k, Tensor& expert, Tensor& gate, Tensor& psum) {
    RT_FAIL("the ", name(), " backend has no mixture-of-experts router");
  }
  // dst [m, D] row i := src [*, D] row idx[i] (zeros where idx[i] < 0).
  virtual void moe_gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst) {
    RT_FAIL("the ", name(), " backend has no mixture-of-experts row gather");
  }
  // The gated combine: for each token t of `tokens` (i64 list; undefined: all
  // of y [n, D]) y[t] := (y[t] when accumulate, else 0) + sum over j in order
  // of gate[t k + j] * rows[row[t k + j]] (row < 0 skipped; gate undefined: 1).
  virtual void moe_combine(const Tensor& rows, const Tensor& row, const Tensor& gate, int k, const Tensor& tokens,
                           Tensor& y, bool accumulate) {
    RT_FAIL("the ", name(), " backend has no mixture-of-experts combine");
  }
  // Its backward for assignment a = t k + j with row[a] >= 0: dgate[a] := dy[t] .
  // rows[row[a]] (in double), drows[row[a]] := gate[a] dy[t]; dgate 0 elsewhere.
  virtual void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& row, const Tensor& gate, int k,
                                    Tensor& dgate, Tensor& drows) {
    RT_FAIL("the ", name(), " backend has no mixture-of-experts combine");
  }
  // The router's backward: dlogit [n, E] := p (dp - p . dp) with dp = aux_g f
  // (f [E], the routed shares) plus, at each chosen expert, (dgate - sum_j
  // gate_j dgate_j) / sum_j p_j over the token's top-k (in double).
  virtual void moe_router_backward(const Tensor& probs, const Tensor& expert, const Tensor& gate, const Tensor& dgate,
                                   const Tensor& f, double aux_g, Tensor& dlogit) {
    RT_FAIL("the ", name(), " backend has no mixture-of-experts router");
  }
  // C_b = alpha op(A_b) op(B_b) + beta C_b for b < batch: row-major float32
  // on the backend's device, X_b = x + b * sx (the experts' blocks at one stride).
  struct BatchedGemm {
    bool ta = false, tb = false;
    std::int64_t m = 0, n = 0, k = 0;
    float alpha = 1;
    const float* a = nullptr;
    std::int64_t lda = 0, sa = 0;
    const float* b = nullptr;
    std::int64_t ldb = 0, sb = 0;
    float beta = 0;
    float* c = nullptr;
    std::int64_t ldc = 0, sc = 0;
    std::int64_t batch = 1;
  };
  virtual void batched_gemm(Device dev, const BatchedGemm& g) {
    RT_FAIL("the ", name(), " backend has no batched float32 GEMM");
  }
  // ---- end mixture of experts ----
  // ---- bfloat16 activations (train.precision = bf16) ----
  // Whether every kernel above takes bfloat16 activations: x, y, dx, dy (and
  // attention's qkv, out) bfloat16, a Linear's weight a bfloat16 copy of its
  // float32 master, every other parameter float32, and every parameter
  // gradient written in float32 (matmuls accumulate in float32). Where this
  // holds, a Stage whose layers all take bf16 runs them in bf16 (stage.hpp).
  virtual bool bf16_activations() const { return false; }
  // The same for float16 activations (train.precision = fp16, with dynamic
  // loss scaling: the stage casts the scaled float32 loss gradient to float16).
  // Layers ask Layer::takes_bf16 for either 16-bit type, so a backend that
  // says yes takes float16 wherever it takes bfloat16 (bf16_images included).
  // The CPU says no: its fp16 runs keep float32 storage.
  virtual bool fp16_activations() const { return false; }
  // Whether the convolution, batch-norm and pooling kernels take them too
  // (Conv2d, BatchNorm2d and Pool2d ask; a stage with one that does not runs float32).
  virtual bool bf16_images() const { return false; }
  // The ISA that bf16 math runs on, for the log: "AMX", "AVX512-BF16", or
  // "emulated (...)"; "" when the backend does not say.
  virtual std::string bf16_isa() const { return ""; }
  // dst = src converted (float32 <-> bfloat16, float32 <-> float16 where the
  // backend takes fp16 activations, or a copy of one type); same numel.
  virtual void cast(const Tensor& src, Tensor& dst) {
    RT_FAIL("the ", name(), " backend has no float32 <-> bfloat16 cast");
  }

  // `rows` runs of `width` bytes, dst + i * dst_pitch <- src + i * src_pitch,
  // both in the memory of `dev` (this backend's device), ordered with the
  // backend's kernels: the sequence collectives' rank-major packing.
  virtual void copy_rows(Device dev, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
                         std::size_t width, std::size_t rows) {
    RT_CHECK(dev.is_cpu(), "the ", name(), " backend has no strided copy for ", dev.str());
    for (std::size_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch, width);
  }

  // Waits until all work issued so far is complete. CPU kernels finish before
  // they return (no-op); asynchronous devices block here, so that a consumer
  // of gradients reported by a stage's grad-ready hook (e.g. a host-staged
  // all-reduce) may call it, or use its own event, before reading them.
  virtual void synchronize() {}
};

// The one registration point per device kind. Throws Error naming the kind
// when nothing is registered (e.g. cuda in a CPU-only build).
void register_backend(DeviceKind kind, std::unique_ptr<Backend> b);
bool has_backend(DeviceKind kind);
Backend& backend_for(DeviceKind kind);
inline Backend& backend_for(Device d) { return backend_for(d.kind); }

}  // namespace ringtrain
