#pragma once
// Internal to the CPU backend: the oneDNN engine/stream every kernel shares and
// small helpers around oneDNN memory. Not a public header.
//
// Rules: public tensors are plain (nchw / oihw / nc); a kernel may run its
// primitives in oneDNN's preferred blocked formats, with the reorders created
// once per input shape and cached with the primitives.
#include <dnnl.hpp>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "ringtrain/nn/backend.hpp"

namespace ringtrain {

std::unique_ptr<Backend> make_cpu_backend();

namespace cpu {

struct Dnnl {
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream strm{eng};
  // float32 scratch that kernels use only within one call (CPU kernels run one
  // at a time): bf16 attention's scores and probabilities, shared by every layer.
  std::vector<float> scratch[2];
  // The tiled attention's per-thread tiles and rows (attention_tiled.cpp), one
  // buffer for every layer and micro-batch: they live within one call, and
  // keeping the pages saves each call their faults. Not a Tensor: the backend
  // outlives the host allocator at exit.
  std::vector<float> attention_tiles;
};
using DnnlPtr = std::shared_ptr<Dnnl>;

using dt = dnnl::memory::data_type;
using tag = dnnl::memory::format_tag;

inline dnnl::memory::desc plain_md(const dnnl::memory::dims& d, tag t, dt type = dt::f32) { return {d, type, t}; }
// The oneDNN type of a float32 or bfloat16 tensor (anything else: an error naming `what`).
dt dnnl_type(const Tensor& t, const char* what);
inline dnnl::memory::dims dims4(const Shape& s) { return {s[0], s[1], s[2], s[3]}; }

// One primitive argument seen from the caller (plain layout, caller's pointer)
// and from the primitive (its preferred layout). When they differ, a buffer of
// the preferred layout and the reorder between the two are kept here.
class Arg {
 public:
  Arg() = default;
  // input: the reorder goes plain -> inner; output: inner -> plain, and
  // `accumulating` outputs get a second reorder that adds into the plain data.
  // external_inner: the preferred-layout buffer is the caller's (set_inner before each use).
  Arg(const dnnl::memory::desc& plain, const dnnl::memory::desc& want, const dnnl::engine& eng, bool input,
      bool force_copy = false, bool external_inner = false);
  // Inputs: point at the caller's data, reorder if needed; returns what the primitive reads.
  dnnl::memory& in(const void* p, dnnl::stream& s);
  // Outputs: point at the caller's data; returns what the primitive writes.
  dnnl::memory& out(void* p);
  // Outputs: after the primitive ran, move into the caller's layout (adding if accumulate).
  void finish(dnnl::stream& s, bool accumulate);
  dnnl::memory& inner() { return separate_ ? inner_ : user_; }
  bool separate() const { return separate_; }
  // Puts the preferred-layout buffer at p (a micro-batch's kept copy, see
  // kept() below) instead of the one allocated here; only when separate().
  void set_inner(void* p) { inner_.set_data_handle(p); }

 private:
  dnnl::memory user_, inner_;
  dnnl::reorder to_, to_add_;
  bool separate_ = false;
};

// One oneDNN matmul C = alpha A B (+ C when accumulating) (+ bias) (ReLU) on
// caller pointers: A [..., m, k], B [..., k, n], C [..., m, n], any dims and
// strides oneDNN takes (transposes and per-head views are strides), A and B
// float32 or bfloat16 (then oneDNN accumulates in float32), C either.
struct MatmulShape {
  dnnl::memory::dims a, a_strides, b, b_strides, c, c_strides;
  dt a_type = dt::f32, b_type = dt::f32, c_type = dt::f32;
  float alpha = 1;
  bool accumulate = false, bias = false, relu = false;
};
class Matmul {
 public:
  Matmul(const MatmulShape& s, const dnnl::engine& eng);
  void run(dnnl::stream& strm, const void* a, const void* b, void* c, const void* bias = nullptr);
  std::string impl() const { return impl_; }

 private:
  dnnl::matmul prim_;
  dnnl::memory a_, b_, c_, bias_;
  std::string impl_;
};
// A row-major [m, k] matrix (ld: elements between rows; trans: stored [k, m]).
void set_matrix(dnnl::memory::dims& dims, dnnl::memory::dims& strides, std::int64_t m, std::int64_t k,
                std::int64_t ld, bool trans);
// f32 <-> bf16 (or a copy of equal types) of n elements, through a cached oneDNN reorder.
class Caster {
 public:
  explicit Caster(DnnlPtr d) : d_(std::move(d)) {}
  void run(const void* src, dt st, void* dst, dt dtt, std::int64_t n);

 private:
  DnnlPtr d_;
  std::map<std::tuple<std::int64_t, int, int>, dnnl::reorder> cache_;
};
// Element-wise conversions (round to nearest even; NaN stays NaN).
void bf16_to_f32(const bfloat16* src, float* dst, std::int64_t n);
void f32_to_bf16(const float* src, bfloat16* dst, std::int64_t n);
// Which oneDNN ISA runs bf16 math: "AMX", "AVX512-BF16" or "emulated (...)".
std::string bf16_isa();
// The CPU has bfloat16 instructions (AVX512-BF16 or AMX): bf16 products run natively.
bool native_bf16();

dnnl::memory make_scratch(const dnnl::primitive_desc_base& pd, const dnnl::engine& eng);
// Kept buffers (backend.hpp kept_buffer) are bound to a oneDNN memory with set_data_handle before each use.
inline void* kept(Tensor& t, std::size_t bytes) { return kept_buffer(t, bytes, Device::cpu()); }

// dst[i] = y[i] > 0 ? dy[i] : 0 (ReLU backward from the ReLU's output).
void relu_mask(const float* y, const float* dy, float* dst, std::int64_t n);
void relu_mask(const bfloat16* y, const bfloat16* dy, bfloat16* dst, std::int64_t n);
// out[i] = a[i] + b[i]; out[i] += a[i] (n elements; out may alias the inputs).
void add(const float* a, const float* b, float* out, std::int64_t n);
void add_into(float* out, const float* a, std::int64_t n);

std::unique_ptr<Conv2dKernel> make_conv2d(const Conv2dSpec& s, DnnlPtr d);
std::unique_ptr<LinearKernel> make_linear(const LinearSpec& s, DnnlPtr d);
std::unique_ptr<BatchNormKernel> make_batchnorm(const BatchNormSpec& s, DnnlPtr d);
std::unique_ptr<Pool2dKernel> make_pool2d(const Pool2dSpec& s, DnnlPtr d);
std::unique_ptr<EltwiseKernel> make_eltwise(Eltwise op, DnnlPtr d);
std::unique_ptr<LayerNormKernel> make_layernorm(const LayerNormSpec& s, DnnlPtr d);
std::unique_ptr<AttentionKernel> make_attention(const AttentionSpec& s, DnnlPtr d);
std::unique_ptr<AttentionKernel> make_tiled_attention(const AttentionSpec& s, DnnlPtr d);
// Token ops (transformer.cpp); Backend's contracts.
void patchify(const Tensor& x, std::int64_t p, Tensor& out);
void unpatchify(const Tensor& dout, std::int64_t p, Tensor& dx);
void add_broadcast(const Tensor& x, const Tensor& b, std::int64_t inner, Tensor& out);
void sum_broadcast(const Tensor& dy, std::int64_t inner, Tensor& db, bool accumulate);
void token_mean(const Tensor& x, Tensor& y);
void token_mean_backward(const Tensor& dy, Tensor& dx);
// embedding.cpp
void embedding_forward(const Tensor& ids, std::int64_t vocab, std::int64_t first, const Tensor& weight,
                       const Tensor& pos, Tensor& rows, Tensor& y);
void embedding_backward(const Tensor& dy, const Tensor& rows, Tensor& dweight, Tensor& dpos);
// vocab_parallel.cpp
void vocab_row_max(const Tensor& logits, const Tensor& labels, int part, Tensor& maxes, Tensor& best);
void vocab_xent_sums(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes, Tensor& sums);
double vocab_xent_finish(const Tensor& logits, const Tensor& labels, int part, const Tensor& maxes,
                         const Tensor& sums, Tensor& dlogits);
void vocab_count_hits(const Tensor& maxes, const Tensor& best, const Tensor& labels, int part, std::int64_t first,
                      Tensor& hits);
// ring_blocks.cpp (context parallelism's ring attention)
void ring_block_forward(const Tensor& qkv, const Tensor& kv, const RingBlockSpec& b, bool first, Tensor& acc,
                        Tensor& m, Tensor& l, Tensor& work, const std::function<void()>& poll);
void ring_block_finish(const Tensor& acc, const Tensor& m, const Tensor& l, std::int64_t heads, Tensor& out,
                       Tensor& lse);
void attention_rowdot(const Tensor& out, const Tensor& dout, std::int64_t heads, Tensor& D);
void ring_block_backward(const Tensor& qkv, const Tensor& kv, const Tensor& dout, const Tensor& lse, const Tensor& D,
                         const RingBlockSpec& b, Tensor& dqkv, Tensor& dkv, Tensor& work,
                         const std::function<void()>& poll);
// moe_ops.cpp: the mixture-of-experts layer's loops (Backend::moe_route ... batched_gemm)
void moe_route(Tensor& probs, const Tensor& bias, int k, Tensor& expert, Tensor& gate, Tensor& psum);
void moe_gather_rows(const Tensor& src, const Tensor& idx, Tensor& dst);
void moe_combine(const Tensor& rows, const Tensor& row, const Tensor& gate, int k, const Tensor& tokens, Tensor& y,
                 bool accumulate);
void moe_combine_backward(const Tensor& dy, const Tensor& rows, const Tensor& row, const Tensor& gate, int k,
                          Tensor& dgate, Tensor& drows);
void moe_router_backward(const Tensor& probs, const Tensor& expert, const Tensor& gate, const Tensor& dgate,
                         const Tensor& f, double aux_g, Tensor& dlogit);
void batched_gemm(const Backend::BatchedGemm& g);

}  // namespace cpu
}  // namespace ringtrain
