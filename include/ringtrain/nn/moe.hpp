#pragma once
// Mixture of experts (issue 43): a routed MLP that replaces a transformer
// block's fc1 -> GELU -> fc2 (Switch Transformer, Fedus et al. 2021; Mixtral's
// top-2; Megatron-Core's MoELayer).
//
//   logits = x Wr^T (fp32, no bias) -> p = softmax -> the top-k experts per token,
//   gates = p[topk] / sum p[topk] (renormalised);  y = sum_j gate_j * expert_j(x)
//   expert e: fc2(gelu(fc1(x))), the dense MLP's shape (parameters
//   "<name>.experts.<e>.fc1.weight" ...), router "<name>.router.weight".
//   aux = E * sum_i f_i * P_i (f_i: share of the n*k assignments routed to expert i,
//   P_i: mean router probability of i over the n tokens of the micro-batch);
//   the training objective gets coeff * aux (its gradient reaches the router's
//   logits in this layer's backward, scaled like the main loss: MoeShared::grad_scale).
//
// Expert parallelism (ExpertGroup of size EP > 1): rank r of the group holds
// experts [r E/EP, (r+1) E/EP) only. Tokens go to their experts' ranks with the
// all-to-all-v of comm/alltoall.hpp: per-expert counts first, then the rows
// grouped by destination rank and, within it, by local expert; the expert
// outputs come back the same way (the combine). The backward runs the same two
// exchanges with gradients. The row exchanges travel while the layer computes
// what needs none of them (this rank's own tokens' rows first; MoeSpec::overlap,
// src/nn/moe_dispatch.hpp, docs/moe.md). Each rank's tokens and losses are its own; the
// expert weight gradients are sums over every rank's tokens, so they are
// scaled by 1/EP and averaged over the expert-data group (the data ranks
// holding the same experts): the mean over all data-parallel ranks, as for
// dense weights.
//
// Capacity (capacity_factor > 0): each expert takes at most
// ceil(cf * n * k / E) of a micro-batch's assignments, in token order; the rest
// are dropped (their gate contributes nothing; the residual carries the token).
// Under sequence parallelism n, the order and the aux loss are the whole
// micro-batch's, not the tensor rank's shard's (sum_grads_over below).
// 0: dropless. Float32 only; host tensors, or device tensors (src/nn/moe_device.cpp: written
// for CUDA, behind the GPU gate, without overlap or sequence parallelism).
//
// Auxiliary-loss-free balancing (bias_update_rate u > 0; DeepSeek-V3, Wang et
// al. 2024): the top-k are chosen by p_e + b_e, the gates stay p[topk] renormalised
// (b takes no gradient). After each optimizer step every layer's loads (the
// step's train forwards, before capacity drops) are summed over the ranks that
// split the tokens, and b_e += u * sign(mean load - load_e): every such rank
// holds the same b. b is a buffer ("<name>.expert_bias"): checkpoints keep it.
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/layer.hpp"
#include "ringtrain/nn/tensor_group.hpp"

namespace ringtrain {
namespace detail {
class ExpertGemm;
class RowExchange;
struct MoeDeviceSaved;  // src/nn/moe_device.cpp
}

// What the MoE layers of one model record for the logs, per layer, summed over
// the forwards (not replays) since the last take(); and the scale of the aux
// gradient (the executor's loss scale / micro-batches per step), set before each
// step by whoever runs it (train_step), 1 for a layer used on its own.
struct MoeLayerStats {
  std::string name;
  double forwards = 0;
  double aux = 0;              // sum of the aux loss (without the coefficient)
  double max_over_mean = 0;    // sum of per-forward max/mean tokens per expert (this rank's tokens)
  double dropped = 0;          // assignments dropped by the capacity
  double assignments = 0;      // n * k
  std::vector<double> load;    // tokens per expert, summed over the forwards (the epoch's balance)
};
class MoeMlp;
class MoeShared {
 public:
  double grad_scale = 1.0;
  // This rank's layers' all-to-alls (counts and rows, forward and backward)
  // since construction (the trainer and benchmarks read and reset them):
  // alltoall_wait_s, the seconds spent inside the exchanges' calls (the counts'
  // blocking all-to-all; the rows' start, progress and waits): the exposed
  // time, what the layer could not hide behind its own compute (waiting for a
  // slower peer included); alltoall_counts_s, the counts' part of it (where
  // the ranks' skew entering the layer lands); alltoall_span_s, from each
  // exchange's start until its received rows are here (equal to the wait when
  // blocking); alltoall_bytes, the bytes sent to other ranks.
  double alltoall_wait_s = 0, alltoall_counts_s = 0, alltoall_span_s = 0, alltoall_bytes = 0;
  void record(const std::string& layer, double aux, double max_over_mean, double dropped, double assignments,
              const std::vector<double>& load);
  std::vector<MoeLayerStats> take();  // and reset
  // Layers with a bias update register here (bind); after each optimizer step
  // update_bias sums their loads since the last call over `group` (the ranks that
  // split the step's tokens: data x expert x context; none: this rank alone) in
  // one all-reduce, and moves each bias unless `apply` is false (a skipped step).
  void add_balanced(MoeMlp* layer);
  void remove_balanced(MoeMlp* layer);  // a layer going away (e.g. one built to plan a pipeline)
  bool balanced() const { return !balanced_.empty(); }
  void update_bias(const Communicator* group, bool apply = true);
 private:
  std::vector<MoeMlp*> balanced_;
  std::mutex mu_;
  std::vector<MoeLayerStats> stats_;
};

// The ranks that split the experts (parallel.expert); size 1: every expert here.
struct ExpertGroup {
  Communicator comm;  // unused when size == 1
  int size = 1, rank = 0;
  std::shared_ptr<MoeShared> shared = std::make_shared<MoeShared>();
};

// How the local experts' GEMMs run (src/nn/moe_gemm.hpp): one oneDNN matmul
// per expert on its rows (dnnl_loop, the default: the fastest of the three in
// bench/nn_moe_layer.cpp, docs/moe.md), one OpenBLAS sgemm per expert, or one
// oneDNN matmul batched over the experts with their rows padded to the busiest
// expert's (oneDNN 2.6 has no grouped GEMM of unequal sizes; the padding costs
// max/mean - 1 of the work).
enum class ExpertGemmMode { dnnl_grouped, blas_loop, dnnl_loop };
const char* expert_gemm_name(ExpertGemmMode m);

struct MoeSpec {
  std::int64_t dim = 0, hidden = 0;
  int experts = 0, top_k = 2;
  double aux_loss_coeff = 0.01;
  double capacity_factor = 0;  // 0: dropless
  double bias_update_rate = 0;  // aux-loss-free balancing step u; 0: off (no bias)
  Eltwise gelu = Eltwise::gelu;
  ExpertGemmMode gemm = ExpertGemmMode::dnnl_loop;
  // At parallel.expert > 1, overlap the row exchanges with expert compute
  // (src/nn/moe_dispatch.hpp, docs/moe.md): the rows of this rank's own tokens
  // go through the experts while the other ranks' travel, the combine's and the
  // backward's second exchange travel behind the local combine, the weight
  // gradients and the router's backward. false: blocking exchanges, then the
  // compute (the reference bench/nn_moe_layer.cpp measures against). The
  // results are the same either way up to the GEMMs' row split (docs/moe.md).
  // dnnl_grouped computes whole padded blocks, so only its exchanges overlap.
  bool overlap = true;
  // Tests: run the device path (src/nn/moe_device.cpp: Backend ops, padded
  // blocks, blocking exchanges) on host tensors too, to check it against the
  // host path without a GPU (tests/nn/mpi_moe_device_path.cpp).
  bool device_path = false;
};

class MoeMlp : public Layer {
 public:
  MoeMlp(std::string name, const MoeSpec& s, ExpertGroup g = {});
  ~MoeMlp() override;
  const char* type() const override { return "MoeMlp"; }
  CtxPtr make_ctx() const override;
  void register_params(ParamArena& arena, int layer_index, const std::string& prefix) override;
  void bind(const BindContext& ctx) override;
  void init(const ParamArena& arena, std::uint64_t seed) override;
  Shape output_shape(const Shape& in) const override;
  // Active FLOPs: the router and k experts per token.
  double forward_flops(const Shape& in) const override;
  int local_experts() const { return spec_.experts / group_.size; }
  int first_expert() const { return group_.rank * local_experts(); }
  const MoeSpec& spec() const { return spec_; }
  // Sequence parallelism (before bind): this rank routes its token shard only
  // (tokens [r T/g.size, (r+1) T/g.size) of every sample). The routing totals
  // (counts, probability sums, the capacity's token order) are summed over g in
  // the forward, so the aux loss, its gradient, drops, loads and metrics are
  // the whole micro-batch's; the router's and experts' weight gradients are
  // partial sums, summed over g in the backward (tp_sum_partial, as
  // LayerNorm::sum_grads_over).
  void sum_grads_over(const TensorGroup& g) { seq_ = g; }
  std::vector<NamedBuffer> buffers() const override;  // "<name>.expert_bias" when bias_update_rate > 0
  // The selection bias b [E] (float32, host; empty when bias_update_rate = 0).
  const Tensor& expert_bias() const { return bias_; }
  // Tokens routed to each expert (before capacity) by the train forwards since the last call; resets.
  std::vector<double> take_load();
  // b_e += u * sign(mean(load) - load_e), load summed over every rank splitting the tokens.
  void update_bias(const std::vector<double>& load);

 protected:
  Tensor do_forward(const Tensor& x, Ctx& c, const Call& call) const override;
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override;

 public:
  // One micro-batch's routing and the expert-side buffers (the layer's Saved).
  struct Saved {
    Tensor x, y, dx;
    std::vector<float> probs;        // [n, E]
    std::vector<int> expert;         // [n, k] the top-k experts, best first
    std::vector<float> gate;         // [n, k]
    std::vector<std::int64_t> row;   // [n, k] the assignment's row in the send buffer, -1: dropped
    std::vector<float> f;            // [E] routed share (aux)
    double aux = 0;
    double tokens = 0;               // the micro-batch's (every tensor rank's under sequence parallelism)
    // Dispatch: counts[j * L + l] rows for rank j's local expert l, sent / received.
    std::vector<std::size_t> send_counts, recv_counts;
    std::vector<float> send, recv, out_recv, out_send;  // rows of D: dispatched in, results back
    // Expert side: local expert l's rows are [l * stride, l * stride + rows[l]) of
    // xe (input), h (fc1 output), a (GELU output) and oe (fc2 output); the rest
    // of each block is padding (zero in xe and, in the backward, in doe).
    std::vector<std::int64_t> perm;   // expert-side row slot[i] = received row perm[i]
    std::vector<std::int64_t> slot;
    std::vector<std::int64_t> rows;   // rows per local expert
    std::vector<std::int64_t> own;    // of them, this rank's own tokens' (the first of each block)
    std::int64_t stride = 0;
    Tensor xe, h, a;
    std::shared_ptr<detail::ExpertGemm> gemm;  // src/nn/moe_gemm.hpp: its oneDNN primitives
    // Scratch of the forward and backward, kept so that a step allocates nothing once shapes settle.
    std::vector<float> oe, dgate, dout_send, dout_recv, doe, dxe, dx_recv, dx_send, dlogit;
    Tensor da, dh;
    std::shared_ptr<detail::MoeDeviceSaved> dev;  // the device path's tensors (src/nn/moe_device.cpp)
  };

 private:
  std::vector<std::size_t> layer_params() const;  // router, then each local expert's four
  float* grad_ptr(std::size_t p) const;           // p's gradient, or its place in partial_ (sequence parallelism)
  // The expert MLP's forward (backward: its per-row part, da, dh, dxe) on rows
  // [first[l], first[l] + count[l]) of each local expert's block; between its
  // GEMMs, ex (if any) is given MPI progress (moe.cpp).
  void expert_forward(Saved& s, const std::vector<std::int64_t>& first, const std::vector<std::int64_t>& count,
                      detail::RowExchange* ex) const;
  void gelu_rows(Saved& s, const std::vector<std::int64_t>& first, const std::vector<std::int64_t>& count, bool whole,
                 bool forward) const;
  void expert_backward_rows(Saved& s, const std::vector<std::int64_t>& first, const std::vector<std::int64_t>& count,
                            detail::RowExchange* ex) const;
  // From s.expert and the probability sums psum [E]: the routing totals, the
  // aux loss, the capacity's drops, the metrics and loads, s.row and the
  // dispatch layout (send/recv counts, expert_layout). Host bookkeeping of
  // n k indices, shared by the host and the device paths.
  void plan_dispatch(Saved& s, const Tensor& x, const double* psum, const Call& call) const;
  // The device path (src/nn/moe_device.cpp): the same steps through Backend
  // ops on the device, exchanges blocking and staged through host copies.
  Tensor device_forward(const Tensor& x, Saved& s, const Call& call) const;
  Tensor device_backward(const Tensor& dy, Saved& s, bool need_dx, bool accumulate) const;
  void device_exchange(Saved& s, const Tensor& in, Tensor& out, std::vector<float>& host_in,
                       std::vector<float>& host_out, bool forward_dir) const;
  MoeSpec spec_;
  ExpertGroup group_;
  std::string full_name_;  // "blocks.0.moe": how the metrics name the layer
  std::size_t router_ = 0;
  std::vector<std::size_t> w1_, b1_, w2_, b2_;  // local experts
  std::int64_t wstride_ = 0;  // elements from one local expert's fc1 (fc2) weight to the next's
  Backend* be_ = nullptr;
  std::unique_ptr<EltwiseKernel> gelu_;
  const ParamArena* arena_ = nullptr;
  Tensor bias_;
  TensorGroup seq_;  // size 1: this rank's tokens are the whole micro-batch
  // Sequence parallelism: the layer's gradients [grad_lo_, grad_lo_ + partial_.numel()) of the
  // arena's float32 gradients, computed into partial_ and summed over seq_ (used within a call).
  std::int64_t grad_lo_ = 0;
  mutable Tensor partial_;
  mutable std::mutex load_mu_;  // forwards of different micro-batches may run on different threads
  mutable std::vector<double> load_;
};

// The MLP branch of a transformer block with experts: MoeMlp "moe".
LayerPtr moe_mlp(const MoeSpec& s, const ExpertGroup& g);

}  // namespace ringtrain
