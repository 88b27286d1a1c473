#pragma once
// Our CUDA kernels, for what cuDNN/cuBLAS do not provide. Every function
// enqueues on `stream` and returns at once (no host synchronisation); sizes
// and dtypes are checked on the host and a bad combination is an Error naming
// the function. Pointers are device pointers unless stated otherwise.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/dtype.hpp"

namespace ringtrain::cuda {

// ---- reductions (collectives) ------------------------------------------------
// dst[i] = reduce_one_div<op>(a[i], b[i], divisor) (comm/reduce_math.hpp) for
// f32,f64,f16,bf16,i32,i64; avg combines as sum; dst may alias a or b.
void reduce(void* dst, const void* a, const void* b, std::size_t n, DType dt, ReduceOp op, int divisor,
            cudaStream_t stream);
// x[i] /= divisor in the element type's arithmetic (integer division for i32/i64).
void divide(void* x, std::size_t n, DType dt, int divisor, cudaStream_t stream);

// ---- casts and fills ---------------------------------------------------------
// Between f32, f64, f16 and bf16 (round to nearest even); also i32/i64 -> f32.
void cast(void* dst, DType dst_dt, const void* src, DType src_dt, std::size_t n, cudaStream_t stream);
void fill(void* x, std::size_t n, DType dt, double value, cudaStream_t stream);
// x[i] *= factor (floating dtypes).
void scale(void* x, std::size_t n, DType dt, double factor, cudaStream_t stream);

// ---- elementwise layers ------------------------------------------------------
// dst = alpha * a + beta * b (floating dtypes; dst may alias a or b).
void axpby(void* dst, const void* a, const void* b, float alpha, float beta, std::size_t n, DType dt,
           cudaStream_t stream);
void relu_forward(void* y, const void* x, std::size_t n, DType dt, cudaStream_t stream);
void relu_backward(void* dx, const void* dy, const void* y, std::size_t n, DType dt, cudaStream_t stream);
// approx_tanh: the tanh approximation (GPT-2), else the exact erf form.
void gelu_forward(void* y, const void* x, std::size_t n, DType dt, bool approx_tanh, cudaStream_t stream);
void gelu_backward(void* dx, const void* dy, const void* x, std::size_t n, DType dt, bool approx_tanh, cudaStream_t stream);
// Inverted dropout: mask[i] = dropout_keep(seed, offset, first + i, p) (nn/rng.hpp,
// the CPU backend's rule, so masks match across devices), y = x * mask / (1-p).
void dropout_forward(void* y, std::uint8_t* mask, const void* x, std::size_t n, DType dt, float p,
                     std::uint64_t seed, std::uint64_t offset, std::uint64_t first, cudaStream_t stream);
void dropout_backward(void* dx, const void* dy, const std::uint8_t* mask, std::size_t n, DType dt, float p,
                      cudaStream_t stream);

// ---- per-channel bias (NCHW) ---------------------------------------------------
// Mixed precision: y/dy of dtype dt, the bias (gradient) b_dt/db_dt = dt, or
// float32 beside bf16/f16 activations (Backend::bf16_activations).
// y[n,c,i] = y[n,c,i] + b[c] (then max(.,0) when relu), i < inner (= H*W).
void bias_add(void* y, const void* b, std::int64_t outer, std::int64_t channels, std::int64_t inner, bool relu,
              DType dt, DType b_dt, cudaStream_t stream);
// db[c] (+)= sum over n, i of dy[n,c,i]: one block per channel, summed in float
// in a fixed order (deterministic, identical on every rank).
void bias_grad(void* db, const void* dy, std::int64_t outer, std::int64_t channels, std::int64_t inner,
               bool accumulate, DType dt, DType db_dt, cudaStream_t stream);

// ---- transformer (kernels/transformer.cu) -------------------------------------
// LayerNorm over the last dimension of [rows, d]; mean/rstd: float [rows]
// device arrays kept for the backward. Statistics and sums in float. x, y,
// dy, dx have dtype dt; gamma, beta and their gradients param_dt (= dt, or
// float32 beside bf16/f16 activations).
void layernorm_forward(const void* x, const void* gamma, const void* beta, void* y, float* mean, float* rstd,
                       std::int64_t rows, std::int64_t d, float eps, DType dt, DType param_dt, cudaStream_t stream);
// dx (may be null), dgamma and dbeta (overwritten, or added to when accumulate).
// scratch: layernorm_scratch_bytes(rows, d) device bytes.
std::size_t layernorm_scratch_bytes(std::int64_t rows, std::int64_t d);
void layernorm_backward(const void* x, const void* gamma, const void* dy, const float* mean, const float* rstd,
                        void* dx, void* dgamma, void* dbeta, std::int64_t rows, std::int64_t d, bool accumulate,
                        DType dt, DType param_dt, void* scratch, cudaStream_t stream);
// out[c] (+)= sum over r of in[r, c] ([rows, cols]), in a fixed order
// (deterministic); out has dtype out_dt (= dt, or float32 for bf16/f16 input).
void column_sum(const void* in, void* out, std::int64_t rows, std::int64_t cols, bool accumulate, DType dt,
                DType out_dt, cudaStream_t stream);
// p = softmax of each row of the scores [rows, cols], the row maximum
// subtracted first; p (dtype dt) may alias scores when scores_dt == dt. For
// bf16/f16 probabilities the scores may be float32 (attention keeps S in
// float and P in the activation type). Backward: ds := p * (dp - sum(dp * p))
// per row, p and ds of dtype dt, dp of dp_dt (= dt, or float32); ds may alias dp.
void softmax_rows(const void* scores, DType scores_dt, void* p, DType dt, std::int64_t rows, std::int64_t cols,
                  cudaStream_t stream);
void softmax_rows_backward(const void* p, const void* dp, DType dp_dt, void* ds, DType dt, std::int64_t rows,
                           std::int64_t cols, cudaStream_t stream);
// img [n, c, h, w] <-> tokens [n, (h/p)(w/p), c*p*p] (Backend::patchify's layout);
// to_tokens copies img into tokens, else tokens into img.
void patch_copy(void* img, void* tokens, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w,
                std::int64_t p, bool to_tokens, DType dt, cudaStream_t stream);
// y [n, d] = mean over t of x [n, t, d]; backward dx[n, t, :] = dy[n, :] / t.
void token_mean(const void* x, void* y, std::int64_t n, std::int64_t t, std::int64_t d, DType dt,
                cudaStream_t stream);
void token_mean_backward(const void* dy, void* dx, std::int64_t n, std::int64_t t, std::int64_t d, DType dt,
                         cudaStream_t stream);

// ---- tiled attention (kernels/attention.cu) --------------------------------------
// FlashAttention-2's schedule, causal or not: qkv [n, t, 3*h*hd] (per token
// every head's q, then k, then v), out [n, t, h*hd], lse float32 [n, h, t]
// (each row's log-sum-exp, for the backward); dtype dt of f32, bf16, f16;
// hd <= 256. Scores, softmax and sums in float32; P and dS rounded to dt
// before their products. The backward overwrites dqkv from qkv, the
// forward's out and lse, and dout, writing every element from one block (no
// atomics: deterministic); scratch: flash_attention_scratch_bytes() device bytes.
void flash_attention_forward(const void* qkv, void* out, float* lse, std::int64_t n, std::int64_t t, std::int64_t h,
                             std::int64_t hd, float scale, bool causal, DType dt, cudaStream_t stream);
std::size_t flash_attention_scratch_bytes(std::int64_t n, std::int64_t t, std::int64_t h);
void flash_attention_backward(const void* qkv, const void* out, const void* dout, const float* lse, void* dqkv,
                              void* scratch, std::int64_t n, std::int64_t t, std::int64_t h, std::int64_t hd,
                              float scale, bool causal, DType dt, cudaStream_t stream);

// ---- token embedding (kernels/embedding.cu) -------------------------------------
// rows[i] = ids[i] - first where that is in [0, local), else -1; *bad = the
// smallest i whose id is no integer in [0, vocab) (untouched when none: set it
// to ULLONG_MAX first).
void embedding_rows(const float* ids, std::int32_t* rows, unsigned long long* bad, std::size_t n, std::int64_t vocab,
                    std::int64_t first, std::int64_t local, cudaStream_t stream);
// y[i, :] (dtype dt) = w[rows[i], :] (zeros for -1) + pos[i % t, :] when pos
// is not null: float32 sum, rounded once.
void embedding_lookup(const std::int32_t* rows, const float* w, const float* pos, void* y, std::size_t tokens,
                      std::int64_t t, std::int64_t d, DType dt, cudaStream_t stream);
// dpos[p, :] += dy[s * t + p, :] over samples s in order (dpos may be null);
// dweight[r, :] += dy[i, :] over tokens i with rows[i] = r, in token order (a
// stable radix sort by row; no atomics): the CPU's sums, bitwise.
std::size_t embedding_backward_scratch_bytes(std::size_t tokens);
void embedding_backward(const void* dy, DType dt, const std::int32_t* rows, float* dweight, float* dpos,
                        std::size_t tokens, std::int64_t t, std::int64_t d, void* scratch, std::size_t scratch_bytes,
                        cudaStream_t stream);

// ---- non-finite detection ----------------------------------------------------
// Sets *flag = 1 if any element of x is inf or NaN (never clears it).
void check_finite(const void* x, std::size_t n, DType dt, int* flag, cudaStream_t stream);
// Loss scaling: x *= inv_scale (accumulating in float32/float64); sets *flag = 1
// if any result is inf or NaN (never clears it).
void unscale_and_check(void* x, std::size_t n, DType dt, float inv_scale, int* flag, cudaStream_t stream);
// *out (device double) = sum of x[i]^2 (+ *out when accumulate), summed in
// double in a fixed order (the same bits for the same input on any GPU).
// scratch: sum_squares_scratch_bytes() of device memory.
std::size_t sum_squares_scratch_bytes();
void sum_squares(const void* x, std::size_t n, DType dt, double* out, bool accumulate, void* scratch,
                 cudaStream_t stream);

// ---- softmax cross-entropy ---------------------------------------------------
// Mean over the batch of -sum_c q_c log softmax(z)_c with q = (1-eps) onehot(y) + eps/C.
struct XentArgs {
  const void* logits = nullptr;  // [rows, classes], f32/f16/bf16
  DType logits_dtype = DType::f32;
  const void* labels = nullptr;  // [rows], i32 or i64, each in [0, classes)
  DType labels_dtype = DType::i32;
  int rows = 0, classes = 0;
  float smoothing = 0.0f;
  void* dlogits = nullptr;             // optional: (softmax - q) * grad_scale / rows, logits' dtype
  const float* grad_scale = nullptr;   // optional device scalar (the loss scale); 1 when null
  float* loss = nullptr;               // device scalar: the mean loss (written, not accumulated)
  int* correct = nullptr;              // optional device scalar: rows whose argmax == label
  int* bad_label = nullptr;            // optional device flag: set to 1 on an out-of-range label
};
// `scratch` holds at least xent_scratch_bytes(rows) device bytes (per-row
// losses, so the mean is summed in a fixed order: deterministic).
std::size_t xent_scratch_bytes(int rows);
void softmax_xent(const XentArgs& a, void* scratch, cudaStream_t stream);

// ---- vocabulary-parallel cross-entropy and accuracy (kernels/vocab_parallel.cu) ----
// Backend::vocab_row_max / vocab_xent_sums / vocab_xent_finish /
// vocab_count_hits on the device: one block per row (maxima, sums, the
// gradient), one block for the loss and the hits, sums in double in a fixed
// order (no atomics but the first bad label's): the same bits on every run.
struct VocabSlice {
  const float* logits = nullptr;         // [rows, local]: columns [first, first + local)
  const std::int64_t* labels = nullptr;  // [rows] (may be null for vocab_row_max: not checked)
  std::int64_t rows = 0, local = 0, first = 0;
  int part = 0, parts = 1;  // first = part * local; the vocabulary is parts * local
};
// maxes [rows, parts] := 0, column part := the row's max; best (may be null)
// := its first maximum's index; *bad := the smallest row whose label is not in
// [0, parts * local) (untouched when none: set it to ULLONG_MAX first).
void vocab_row_max(const VocabSlice& a, float* maxes, std::int64_t* best, unsigned long long* bad,
                   cudaStream_t stream);
// sums [2, rows] := sum_j exp(double(x) - m_r), and x at the label where it is local (else 0).
void vocab_xent_sums(const VocabSlice& a, const float* maxes, double* sums, cudaStream_t stream);
// *loss := mean_r (log z_r + m_r - target_r) (row_loss: rows doubles of
// scratch); dlogits (may be null) := (softmax - onehot) / rows.
void vocab_xent_finish(const VocabSlice& a, const float* maxes, const double* sums, float* dlogits,
                       double* row_loss, double* loss, cudaStream_t stream);
// *hits := rows whose first whole-row maximum is this part's best[r] and the label.
void vocab_count_hits(const VocabSlice& a, const float* maxes, const std::int64_t* best, double* hits,
                      cudaStream_t stream);

// ---- ring attention blocks (kernels/ring_attention.cu; context parallelism) ----
// Backend::ring_block_forward / ring_block_finish / attention_rowdot /
// ring_block_backward on the device (float32): attention.cu's tiles and
// online softmax, with the causal mask by the global positions of the two
// chunks on each side (RingBlockSpec, nn/backend.hpp). No atomics: every
// output element is written by one block.
struct RingBlockArgs {
  const float* qkv = nullptr;  // [n, L, 3d]: this rank's queries (d = heads * hd)
  const float* kv = nullptr;   // [n, L, 2d]: one rank's keys, then values
  std::int64_t n = 0, L = 0, heads = 1, hd = 0, chunk = 0;  // L = 2 chunk
  float scale = 1;
  int qc[2] = {0, 0}, kc[2] = {0, 0};  // the chunks of the queries' rank and of the keys' rank
};
// acc [n, L, d], m, l [n, heads, L]: the running state, reset first when `first`.
void ring_block_forward(const RingBlockArgs& a, bool first, float* acc, float* m, float* l, cudaStream_t stream);
// out = acc / l (out may be acc), lse = m + log l.
void ring_block_finish(const float* acc, const float* m, const float* l, std::int64_t n, std::int64_t L,
                       std::int64_t heads, std::int64_t hd, float* out, float* lse, cudaStream_t stream);
// D [n, heads, L] = the rows' dot of out and dout ([n, L, heads * hd]).
void attention_rowdot(const float* out, const float* dout, std::int64_t n, std::int64_t L, std::int64_t heads,
                      std::int64_t hd, float* D, cudaStream_t stream);
// dqkv's q columns += the block's dQ; dkv [n, L, 2d] := the block's dK, dV.
void ring_block_backward(const RingBlockArgs& a, const float* dout, const float* lse, const float* D, float* dqkv,
                         float* dkv, cudaStream_t stream);
// ---- mixture of experts (kernels/moe.cu) ----
// The MoE layer's loops (Backend::moe_route ...; src/backend/cpu/moe_ops.cpp
// is the CPU's): float32, index lists int64 (-1: none), experts int32. Sums in
// the CPU's order and type; no atomics.
struct MoeRoute {
  float* probs = nullptr;        // [n, E]: logits in, softmax out
  const float* bias = nullptr;   // [E] selection bias, or null
  int* expert = nullptr;         // [n, k] top-k of p + bias, best first, ties to the lower index
  float* gate = nullptr;         // [n, k] p / sum of the token's top-k p
  double* psum = nullptr;        // [E] column sums of p in token order
  std::int64_t n = 0;
  int E = 0, k = 0;
};
void moe_route(const MoeRoute& a, cudaStream_t stream);
// dst row i := src row idx[i] (zeros where idx[i] < 0); rows of D floats.
void moe_gather_rows(const float* src, const std::int64_t* idx, float* dst, std::int64_t rows, std::int64_t D,
                     cudaStream_t stream);
struct MoeCombine {
  const float* rows = nullptr;          // [*, D] the experts' outputs (or gradients)
  const std::int64_t* row = nullptr;    // [n, k] each assignment's row, -1: dropped
  const float* gate = nullptr;          // [n, k], or null: gates of 1
  const std::int64_t* tokens = nullptr; // the tokens to combine, or null: 0 .. count - 1
  float* y = nullptr;                   // [n, D]
  std::int64_t D = 0;
  int k = 0;
  bool accumulate = false;
};
// y[t] (+)= sum_j gate * rows[row] in j order, for `count` tokens.
void moe_combine(const MoeCombine& a, std::int64_t count, cudaStream_t stream);
// dgate [n k] := dy[t] . rows[row] (0 where dropped), drows[row] := gate dy[t].
void moe_combine_backward(const MoeCombine& a, std::int64_t n, const float* dy, float* dgate, float* drows,
                          cudaStream_t stream);
struct MoeRouterBackward {
  const float* probs = nullptr;   // [n, E]
  const int* expert = nullptr;    // [n, k]
  const float* gate = nullptr;    // [n, k]
  const float* dgate = nullptr;   // [n, k]
  const float* f = nullptr;       // [E] routed shares
  double aux_g = 0;
  float* dlogit = nullptr;        // [n, E]
  std::int64_t n = 0;
  int E = 0, k = 0;
};
void moe_router_backward(const MoeRouterBackward& a, cudaStream_t stream);

// ---- fusion buffer pack / unpack --------------------------------------------
struct CopyEntry {
  const void* src;
  void* dst;
  std::size_t bytes;
};
// Copies every entry of a device-resident table in one launch. `table` is a
// device array of `entries` CopyEntry; `total_bytes` = sum of the sizes.
void batched_copy(const CopyEntry* table, int entries, std::size_t total_bytes, cudaStream_t stream);

}  // namespace ringtrain::cuda
