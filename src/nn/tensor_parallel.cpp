// The tensor-parallel all-reduce (Megatron's f backward and g forward) and
// the shard bookkeeping (see nn/tensor_parallel.hpp); the layers built on
// them are in parallel_layers.cpp.
#include "ringtrain/nn/tensor_parallel.hpp"

#include <array>
#include <chrono>
#include <cstring>
#include <mutex>

#include "init.hpp"
#include "ringtrain/comm/collectives.hpp"

namespace ringtrain {
namespace {

void need_host(const Tensor& t, const char* what) {
  RT_CHECK(t.device().is_cpu(), what, ": shards are copied in host memory, got a tensor on ", t.device().str());
}

// Copies rows of `inner` elements between a whole and a shard tensor; to_shard picks the direction.
void shard_copy(const ShardSpec& s, const Tensor& whole, const Tensor& local, bool to_shard) {
  RT_CHECK(s.sharded(), "shard copy: the parameter is not sharded");
  RT_CHECK(whole.shape() == s.global, "shard copy: whole tensor ", shape_str(whole.shape()), " is not ",
           shape_str(s.global));
  need_host(whole, "shard copy");
  need_host(local, "shard copy");
  const std::size_t es = dtype_size(whole.dtype());
  std::int64_t outer = 1, inner = 1;
  for (int d = 0; d < s.dim; ++d) outer *= s.global[d];
  for (std::size_t d = s.dim + 1; d < s.global.size(); ++d) inner *= s.global[d];
  const std::int64_t G = s.global[s.dim], L = G / s.parts, Gb = G / s.blocks, Lb = L / s.blocks;
  RT_CHECK(local.numel() == outer * L * inner, "shard copy: local tensor ", shape_str(local.shape()),
           " does not hold part ", s.index, " of ", s.parts, " of ", shape_str(s.global));
  auto* w = static_cast<char*>(whole.raw());
  auto* l = static_cast<char*>(local.raw());
  const std::size_t run = std::size_t(Lb * inner) * es;
  for (std::int64_t o = 0; o < outer; ++o)
    for (int b = 0; b < s.blocks; ++b) {
      char* wp = w + std::size_t((o * G + b * Gb + s.index * Lb) * inner) * es;
      char* lp = l + std::size_t((o * L + b * Lb) * inner) * es;
      if (to_shard)
        std::memcpy(lp, wp, run);
      else
        std::memcpy(wp, lp, run);
    }
}

void copy_rows(Device dev, void* dst, std::size_t dst_pitch, const void* src, std::size_t src_pitch,
               std::size_t width, std::size_t rows) {
  if (!dev.is_cpu()) return backend_for(dev).copy_rows(dev, dst, dst_pitch, src, src_pitch, width, rows);
  for (std::size_t i = 0; i < rows; ++i)
    std::memcpy(static_cast<char*>(dst) + i * dst_pitch, static_cast<const char*>(src) + i * src_pitch, width);
}

// Adds the scope's time and payload to g.stats (when set) on exit.
class TpTimer {
 public:
  TpTimer(const TensorGroup& g, std::size_t bytes) : s_(g.stats.get()), bytes_(bytes) {
    if (s_) t0_ = std::chrono::steady_clock::now();
  }
  ~TpTimer() {
    if (!s_) return;
    s_->seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
    s_->calls += 1;
    s_->bytes += static_cast<double>(bytes_);
  }

 private:
  TpStats* s_;
  std::size_t bytes_;
  std::chrono::steady_clock::time_point t0_;
};

// Sequence shards: [B][S][inner] whole, [B][S/T][inner] per rank. Copies the
// runs of one sample's S/T tokens between a whole tensor and the rank-major
// layout [T][B][S/T][inner] of the collectives (or one rank's part of it):
// per rank, B rows of a fixed pitch on each side, one Backend::copy_rows (a
// strided copy on the device's stream, memcpy on the host).
struct SeqRuns {
  std::int64_t B, n, T;  // samples, elements per sample per rank, ranks
  std::size_t es;
  Device dev;
  SeqRuns(const Tensor& whole, const TensorGroup& g)
      : B(whole.dim(0)), T(g.size), es(dtype_size(whole.dtype())), dev(whole.device()) {
    n = B > 0 ? whole.numel() / B / T : 0;
  }
  // ranks [r0, r1) between whole and packed (packed holds those ranks' blocks).
  void copy(char* whole, char* packed, int r0, int r1, bool to_packed) const {
    const std::size_t run = std::size_t(n) * es, pitch = std::size_t(T) * run;
    for (int r = r0; r < r1; ++r) {
      char* w = whole + std::size_t(r) * run;
      char* p = packed + std::size_t(std::int64_t(r - r0) * B) * run;
      if (to_packed) copy_rows(dev, p, run, w, pitch, run, std::size_t(B));
      else copy_rows(dev, w, pitch, p, run, run, std::size_t(B));
    }
  }
};

// The options of a collective on t's buffers: device buffers go through the
// device collectives (comm/collectives.hpp), which order themselves after the
// kernels that wrote them and return with the result complete.
// The device's kernels are waited for here as well: a tensor group's
// collectives are few per layer, and the wait keeps every producer (the
// packing above, the layer's GEMMs) ordered without reasoning per call.
CollectiveOptions on(const Tensor& t) {
  CollectiveOptions o;
  o.device = t.device();
  if (!o.device.is_cpu()) backend_for(o.device).synchronize();
  return o;
}

void check_seq(const Tensor& whole, const Tensor& shard, const TensorGroup& g, const char* what) {
  RT_CHECK(whole.device() == shard.device(), what, ": the whole tensor is on ", whole.device().str(),
           ", its token shard on ", shard.device().str());
  RT_CHECK(whole.dtype() == shard.dtype() && whole.ndim() >= 2 && shard.shape() == seq_shard_shape(whole.shape(), g),
           what, ": ", shape_str(whole.shape()), " and its token shard ", shape_str(shard.shape()), " over ", g.size,
           " ranks");
}

// The group's packing scratch, as many bytes as `t` (call under pack_mutex).
Tensor scratch_for(const Tensor& t, const TensorGroup& g) {
  return g.workspace(TpBuffer::pack_scratch, {std::int64_t(t.nbytes())}, DType::u8, t.device());
}

// dst = src as dst's type (float32 <-> bfloat16, same numel). Host tensors
// convert in plain loops (core/dtype.hpp's rounding, as the backend's cast):
// a column layer sums its dx on a helper thread beside the backend's kernels,
// so these do not share the backend's conversion primitives or stream.
void convert(const Tensor& src, Tensor& dst) {
  RT_CHECK(src.numel() == dst.numel(), "tensor-parallel sum: ", shape_str(src.shape()), " into ",
           shape_str(dst.shape()));
  if (!src.device().is_cpu()) return backend_for(src.device()).cast(src, dst);
  const std::int64_t n = src.numel();
  if (src.dtype() == dst.dtype()) {
    std::memcpy(dst.raw(), src.raw(), src.nbytes());
  } else if (src.dtype() == DType::bf16 && dst.dtype() == DType::f32) {
    const bfloat16* s = src.data<bfloat16>();
    float* d = dst.data<float>();
    for (std::int64_t i = 0; i < n; ++i) d[i] = to_f32(s[i]);
  } else if (src.dtype() == DType::f32 && dst.dtype() == DType::bf16) {
    const float* s = src.data<float>();
    bfloat16* d = dst.data<bfloat16>();
    for (std::int64_t i = 0; i < n; ++i) d[i] = to_bf16(s[i]);
  } else {
    RT_FAIL("tensor-parallel sum: no conversion from ", dtype_name(src.dtype()), " to ", dtype_name(dst.dtype()));
  }
}

}  // namespace

// ---- sequence parallelism -----------------------------------------------------
Shape seq_shard_shape(const Shape& whole, const TensorGroup& g) {
  RT_CHECK(whole.size() >= 2 && whole[1] % g.size == 0, "parallel.sequence = true: the sequence length ",
           whole.size() >= 2 ? whole[1] : 0, " (tokens per sample) is not divisible by parallel.tensor = ", g.size,
           " (each tensor rank keeps 1/", g.size, " of the tokens; set parallel.sequence = false)");
  Shape s = whole;
  s[1] /= g.size;
  return s;
}

Shape seq_whole_shape(const Shape& shard, const TensorGroup& g) {
  RT_CHECK(shard.size() >= 2, "sequence parallelism: expects tokens [N, T, ...], got ", shape_str(shard));
  Shape s = shard;
  s[1] *= g.size;
  return s;
}

void seq_all_gather(const Tensor& shard, Tensor& whole, const TensorGroup& g) {
  check_seq(whole, shard, g, "sequence all-gather");
  TpTimer timer(g, shard.nbytes());
  const SeqRuns runs(whole, g);
  if (g.size == 1 || runs.B == 1) {  // rank-major is the whole layout: gather in place
    if (g.size == 1) whole.copy_from(shard);
    else allgather(shard.raw(), std::size_t(shard.numel()), whole.raw(), shard.dtype(), g.comm, on(shard));
    return;
  }
  std::lock_guard<std::mutex> lock(g.workspaces->pack_mutex());
  Tensor tmp = scratch_for(whole, g);
  allgather(shard.raw(), std::size_t(shard.numel()), tmp.raw(), shard.dtype(), g.comm, on(shard));
  runs.copy(static_cast<char*>(whole.raw()), static_cast<char*>(tmp.raw()), 0, g.size, false);
}

void seq_reduce_scatter(const Tensor& whole, Tensor& shard, const TensorGroup& g) {
  check_seq(whole, shard, g, "sequence reduce-scatter");
  if (whole.dtype() == DType::bf16 && g.size > 1) {  // summed in float32, rounded once (tp_sum_f32)
    convert(tp_sum_f32(whole, g, true), shard);
    return;
  }
  TpTimer timer(g, shard.nbytes());
  const SeqRuns runs(whole, g);
  const std::vector<std::size_t> counts(std::size_t(g.size), std::size_t(shard.numel()));
  if (g.size == 1 || runs.B == 1) {
    if (g.size == 1) shard.copy_from(whole);
    else reduce_scatter(whole.raw(), shard.raw(), counts, whole.dtype(), ReduceOp::sum, g.comm, on(whole));
    return;
  }
  std::lock_guard<std::mutex> lock(g.workspaces->pack_mutex());
  Tensor tmp = scratch_for(whole, g);
  runs.copy(static_cast<char*>(whole.raw()), static_cast<char*>(tmp.raw()), 0, g.size, true);
  reduce_scatter(tmp.raw(), shard.raw(), counts, whole.dtype(), ReduceOp::sum, g.comm, on(whole));
}

const char* workspace_name(TpBuffer w) {
  static const char* const names[] = {"gathered_input", "gathered_grad", "dx_shard", "sum_whole",
                                      "sum_shard",      "row_partial",   "column_dx", "pack_scratch"};
  return w < TpBuffer::count ? names[static_cast<int>(w)] : "?";
}

Tensor TpWorkspaces::get(TpBuffer w, const Shape& shape, DType dt, Device dev) {
  RT_CHECK(w < TpBuffer::count, "tensor-parallel workspace ", static_cast<int>(w), " does not exist");
  Tensor& t = slots_[static_cast<std::size_t>(w)];
  const std::size_t bytes = std::size_t(shape_numel(shape)) * dtype_size(dt);
  if (!t.defined() || t.nbytes() < bytes || t.device() != dev) t = Tensor::empty({std::int64_t(bytes)}, DType::u8, dev);
  return t.view_bytes(0, shape, dt);
}

std::size_t TpWorkspaces::bytes() const {
  std::size_t n = 0;
  for (const Tensor& t : slots_) n += t.defined() ? t.nbytes() : 0;
  return n;
}

void seq_slice(const Tensor& whole, Tensor& shard, const TensorGroup& g) {
  check_seq(whole, shard, g, "sequence slice");
  SeqRuns(whole, g).copy(static_cast<char*>(whole.raw()), static_cast<char*>(shard.raw()), g.rank, g.rank + 1, true);
}

void tp_sum_partial(Tensor& partial, const std::vector<Tensor>& grads, bool accumulate, const TensorGroup& g,
                    Backend& be) {
  tp_all_reduce(partial, g);
  std::int64_t at = 0;
  for (const Tensor& gr : grads) {
    Tensor part = partial.flat_view(at, gr.numel()).reshape(gr.shape());
    Tensor dst = gr;
    if (accumulate) be.add(dst, part, dst);
    else dst.copy_from(part);
    at += gr.numel();
  }
  RT_CHECK(at == partial.numel(), "tp_sum_partial: ", partial.numel(), " partial elements for ", at, " of gradients");
}

// ---- operators ----------------------------------------------------------------
void tp_all_reduce(Tensor& t, const TensorGroup& g) { tp_all_reduce(t, t, g); }

void tp_all_reduce(const Tensor& in, Tensor& out, const TensorGroup& g) {
  RT_CHECK(in.numel() == out.numel() && in.dtype() == out.dtype() && in.device() == out.device(),
           "tensor-parallel all-reduce: ", shape_str(in.shape()), " into ", shape_str(out.shape()));
  if (g.size == 1) {
    if (in.raw() != out.raw()) out.copy_from(in);
    return;
  }
  if (in.dtype() == DType::bf16) {  // summed in float32, rounded once (tp_sum_f32)
    convert(tp_sum_f32(in, g, false), out);
    return;
  }
  TpTimer timer(g, in.nbytes());
  allreduce(in.raw(), out.raw(), std::size_t(in.numel()), in.dtype(), ReduceOp::sum, g.comm, on(in));
}

Tensor tp_sum_f32(const Tensor& in, const TensorGroup& g, bool scatter_tokens) {
  Tensor whole = g.workspace(TpBuffer::sum_whole, in.shape(), DType::f32, in.device());
  convert(in, whole);
  if (!scatter_tokens) {
    tp_all_reduce(whole, g);
    return whole;
  }
  Tensor shard = g.workspace(TpBuffer::sum_shard, seq_shard_shape(in.shape(), g), DType::f32, in.device());
  seq_reduce_scatter(whole, shard, g);
  return shard;
}

ShardSpec make_shard(const Shape& global, int dim, int parts, int index, int blocks) {
  ShardSpec s;
  s.dim = dim;
  s.parts = parts;
  s.index = index;
  s.blocks = blocks;
  s.global = global;
  return s;
}

Tensor shard_of(const Tensor& whole, const ShardSpec& s) {
  Shape ls = s.global;
  ls[s.dim] /= s.parts;
  Tensor local = Tensor::empty(ls, whole.dtype());
  shard_copy(s, whole, local, true);
  return local;
}

void place_shard(const Tensor& local, const ShardSpec& s, Tensor& whole) { shard_copy(s, whole, local, false); }

Tensor gather_whole(const Tensor& local, const ShardSpec& s, const TensorGroup& g) {
  RT_CHECK(s.parts == g.size && s.index == g.rank, "gather_whole: shard ", s.index, " of ", s.parts,
           " does not match tensor rank ", g.rank, " of ", g.size);
  need_host(local, "gather_whole");
  Tensor whole = Tensor::empty(s.global, local.dtype());
  Tensor parts = Tensor::empty({g.size * local.numel()}, local.dtype());
  if (g.size == 1)
    parts.copy_from(local.reshape({local.numel()}));
  else
    allgather(local.raw(), std::size_t(local.numel()), parts.raw(), local.dtype(), g.comm);
  for (int r = 0; r < g.size; ++r) {
    ShardSpec sr = s;
    sr.index = r;
    place_shard(parts.flat_view(r * local.numel(), local.numel()), sr, whole);
  }
  return whole;
}

void check_tensor_divides(std::int64_t value, const char* key, const TensorGroup& g, const char* model) {
  RT_CHECK(value % g.size == 0, "model '", model, "': ", key, " = ", value, " is not divisible by parallel.tensor = ",
           g.size);
}

void detail::init_shard(const ParamArena& arena, std::size_t index, Init kind, double fan_in, double fan_out,
                        std::uint64_t seed) {
  const ShardSpec& s = arena.info(index).shard;
  std::vector<float> all = detail::init_values(std::size_t(shape_numel(s.global)), arena.model_index(index), kind, fan_in, fan_out, seed);
  Tensor p = arena.param(index);
  p.copy_from(shard_of(Tensor::wrap(all.data(), s.global, DType::f32), s));
}

}  // namespace ringtrain
