// The column- and row-parallel layers over one Linear or Conv2d, and the
// channel-split BatchNorm (see nn/tensor_parallel.hpp). The local math is an
// ordinary layer on the shard; this file adds the communication, the
// operations after the reduction and the shard bookkeeping.
#include <future>
#include <memory>

#include "init.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"

namespace ringtrain {
namespace {

std::int64_t& split_size(LinearSpec& s, int dim) { return dim == 0 ? s.out_features : s.in_features; }
std::int64_t& split_size(Conv2dSpec& s, int dim) { return dim == 0 ? s.out_channels : s.in_channels; }
const char* unit(const LinearSpec&, int dim) { return dim == 0 ? "output features" : "input features"; }
const char* unit(const Conv2dSpec&, int dim) { return dim == 0 ? "filters" : "input channels"; }
const char* type_of(const LinearSpec&, int dim) { return dim == 0 ? "ColumnParallelLinear" : "RowParallelLinear"; }
const char* type_of(const Conv2dSpec&, int dim) { return dim == 0 ? "ColumnParallelConv2d" : "RowParallelConv2d"; }
std::unique_ptr<WeightLayer> layer_of(const std::string& name, const LinearSpec& s, Init init) {
  return std::make_unique<Linear>(name, s, init);
}
std::unique_ptr<WeightLayer> layer_of(const std::string& name, const Conv2dSpec& s, Init init) {
  return std::make_unique<Conv2d>(name, s, init);
}

// This rank's part of the whole layer `s` along dim (0: outputs, 1: inputs).
template <class Spec>
std::unique_ptr<WeightLayer> part_of(const std::string& name, Spec s, Init init, int dim, const TensorGroup& g,
                                     int blocks) {
  std::int64_t& n = split_size(s, dim);
  RT_CHECK(blocks > 0 && n % (std::int64_t(g.size) * blocks) == 0, type_of(s, dim), " '", name, "': ", n, " ",
           unit(s, dim), " are not divisible by the tensor size ", g.size,
           blocks > 1 ? cat(" in each of ", blocks, " blocks") : std::string());
  n /= g.size;
  return layer_of(name, s, init);
}

// A row layer's local part adds no bias, ReLU or pooling: they run once, after the reduction.
LinearSpec without_after(LinearSpec s) {
  s.bias = s.fuse_relu = false;
  return s;
}
Conv2dSpec without_after(Conv2dSpec s) {
  s.bias = s.fuse_relu = s.fuse_pool = false;
  return s;
}

template <class Spec>
LayerPtr split_of(std::string name, const Spec& s, Init init, TensorSplit split, const TensorGroup& g, int blocks) {
  if (split == TensorSplit::none || g.size == 1) return layer_of(name, s, init);
  if (split == TensorSplit::column) return std::make_unique<ColumnParallel>(std::move(name), s, init, g, blocks);
  RT_CHECK(blocks == 1, "split_layer '", name, "': blocks are a column-parallel split");
  return std::make_unique<RowParallel>(std::move(name), s, init, g);
}

}  // namespace

LayerPtr split_layer(std::string name, const LinearSpec& spec, Init init, TensorSplit split, const TensorGroup& g,
                     int blocks) {
  return split_of(std::move(name), spec, init, split, g, blocks);
}
LayerPtr split_layer(std::string name, const Conv2dSpec& spec, Init init, TensorSplit split, const TensorGroup& g,
                     int blocks) {
  return split_of(std::move(name), spec, init, split, g, blocks);
}

// ---- TensorParallelLayer ----------------------------------------------------------
TensorParallelLayer::TensorParallelLayer(std::string name, const char* type, std::unique_ptr<WeightLayer> local,
                                         int dim, TensorGroup g, int blocks)
    : Layer(std::move(name)), type_(type), local_(std::move(local)), dim_(dim), blocks_(blocks), g_(std::move(g)) {
  whole_ = local_->weight_shape();
  whole_[static_cast<std::size_t>(dim_)] *= g_.size;
}

void TensorParallelLayer::register_params(ParamArena& arena, int li, const std::string& prefix) {
  local_->register_params(arena, li, prefix);
  params_ = local_->params();
  arena.set_shard(params_[0], make_shard(whole_, dim_, g_.size, g_.rank, blocks_));
  // A bias goes with the weight's rows (a row layer's local part has none).
  if (local_->has_bias()) arena.set_shard(params_[1], make_shard({whole_[0]}, 0, g_.size, g_.rank, blocks_));
}

void TensorParallelLayer::bind(const BindContext& ctx) { local_->bind(ctx); }

// The whole weight's fans, as WeightLayer::init uses them for the unsplit layer.
void TensorParallelLayer::init(const ParamArena& arena, std::uint64_t seed) {
  const double n = double(shape_numel(whole_));
  detail::init_shard(arena, params_[0], local_->init_kind(), n / double(whole_[0]), n / double(whole_[1]), seed);
  if (local_->has_bias()) detail::fill_param(arena, params_[1], 0.0);
}

// ---- ColumnParallel ---------------------------------------------------------------
ColumnParallel::ColumnParallel(std::string name, const LinearSpec& s, Init init, TensorGroup g, int blocks)
    : TensorParallelLayer(name, type_of(s, 0), part_of(name, s, init, 0, g, blocks), 0, g, blocks) {}
ColumnParallel::ColumnParallel(std::string name, const Conv2dSpec& s, Init init, TensorGroup g, int blocks)
    : TensorParallelLayer(name, type_of(s, 0), part_of(name, s, init, 0, g, blocks), 0, g, blocks) {}

Shape ColumnParallel::gathered(const Shape& in) const { return g_.sequence ? seq_whole_shape(in, g_) : in; }

CtxPtr ColumnParallel::make_ctx() const {
  auto c = std::make_unique<SavedCtx<Saved>>();
  c->s.local = local_->make_ctx();
  return c;
}

Tensor ColumnParallel::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  if (!g_.sequence) return local_->forward(x, *s.local, call);
  s.xs = x;  // the backward gathers it again (Megatron): the whole input is not kept per layer
  s.xg = g_.workspace(TpBuffer::gathered_input, gathered(x.shape()), x.dtype(), x.device());
  seq_all_gather(x, s.xg, g_);  // g-bar
  return local_->forward(s.xg, *s.local, call);
}

// f's backward all-reduces dx (the input was replicated). As Megatron's async
// dgrad all-reduce, it runs on the group's helper thread (TensorGroup::helper,
// one persistent thread, not one per backward) while this one computes the
// weight gradient, which does not depend on it: the same sums, the wait hidden
// behind the GEMM. On a GPU the all-reduce runs inline: the device collectives
// own the stream work of the calling thread (no second thread on the context).
Tensor ColumnParallel::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  Ctx& lc = *s.local;
  if (g_.sequence) seq_all_gather(s.xs, s.xg, g_);  // the input the local layer kept (other layers reused the buffer)
  // The whole-token dx lives until its reduce-scatter below: one buffer for every layer, not one per layer.
  if (g_.sequence && need_dx)
    local_->write_input_grad_into(lc, g_.workspace(TpBuffer::column_dx, s.xg.shape(), s.xg.dtype(), s.xg.device()));
  Tensor dx = local_->backward_input(dy, lc, need_dx, accumulate);
  // Sequence parallelism: g-bar's backward reduce-scatters dx to this rank's tokens instead.
  Tensor dxs;
  if (g_.sequence && need_dx && g_.size > 1)
    dxs = g_.workspace(TpBuffer::dx_shard, c.in_shape, dx.dtype(), dx.device());
  if (!need_dx || g_.size == 1 || !dx.device().is_cpu()) {
    if (need_dx && g_.size > 1) {
      if (g_.sequence) seq_reduce_scatter(dx, dxs, g_);
      else tp_all_reduce(dx, g_);
    }
    local_->backward_weight(lc);
    return dxs.defined() ? dxs : dx;
  }
  TaskThread* helper = g_.helper.get();
  if (!helper) {  // a group built by hand, not by TensorGroup::of
    if (!own_helper_) own_helper_ = std::make_shared<TaskThread>();
    helper = own_helper_.get();
  }
  std::future<void> reduce = helper->submit([&] {
    if (g_.sequence) seq_reduce_scatter(dx, dxs, g_);
    else tp_all_reduce(dx, g_);
  });
  try {
    local_->backward_weight(lc);
  } catch (...) {
    reduce.wait();
    throw;
  }
  reduce.get();
  return g_.sequence ? dxs : dx;
}

// ---- RowParallel --------------------------------------------------------------------
RowParallel::RowParallel(std::string name, const LinearSpec& s, Init init, TensorGroup g)
    : RowParallel(name, type_of(s, 1), part_of(name, without_after(s), init, 1, g, 1), g,
                  After{s.bias, s.fuse_relu, false, false, {}}) {}
RowParallel::RowParallel(std::string name, const Conv2dSpec& s, Init init, TensorGroup g)
    : RowParallel(name, type_of(s, 1), part_of(name, without_after(s), init, 1, g, 1), g,
                  After{s.bias, s.fuse_relu, s.fuse_pool, true, s.pool}) {}
RowParallel::RowParallel(std::string name, const char* type, std::unique_ptr<WeightLayer> local, TensorGroup g,
                         After after)
    : TensorParallelLayer(std::move(name), type, std::move(local), 1, std::move(g), 1), after_(after) {}

void RowParallel::register_params(ParamArena& arena, int li, const std::string& prefix) {
  TensorParallelLayer::register_params(arena, li, prefix);
  if (after_.bias) b_ = add_param(arena, prefix, "bias", {whole_[0]}, local_->weight_dtype(), false, li);  // replicated
}

void RowParallel::bind(const BindContext& ctx) {
  TensorParallelLayer::bind(ctx);
  be_ = &ctx.backend;
  if (after_.bias) {
    b = ctx.arena.param(b_);
    db = ctx.arena.grad(b_);
  }
  if (after_.relu) relu_ = ctx.backend.eltwise(Eltwise::relu, local_->weight_dtype());
  if (after_.pool) pool_ = ctx.backend.pool2d(after_.pool_spec);
}

void RowParallel::init(const ParamArena& arena, std::uint64_t seed) {
  TensorParallelLayer::init(arena, seed);
  if (after_.bias) detail::fill_param(arena, b_, 0.0);
}

Shape RowParallel::output_shape(const Shape& in) const {
  Shape o = local_->output_shape(in);
  if (g_.sequence) {
    RT_CHECK(!after_.pool, type_, " '", name_, "': sequence parallelism splits tokens, not pooled images");
    return seq_shard_shape(o, g_);
  }
  if (!after_.pool) return o;
  const Shape p = pool2d_output(o, after_.pool_spec);
  RT_CHECK(p[2] > 0 && p[3] > 0, type_, " '", name_, "': its output ", shape_str(o),
           " is smaller than the fused pooling");
  return p;
}

std::int64_t RowParallel::inner(const Tensor& z) const { return after_.images ? z.dim(2) * z.dim(3) : 1; }

CtxPtr RowParallel::make_ctx() const {
  auto c = std::make_unique<SavedCtx<Saved>>();
  c->s.local = local_->make_ctx();
  return c;
}

Tensor RowParallel::do_forward(const Tensor& x, Ctx& c, const Call& call) const {
  Saved& s = saved<Saved>(c);
  Tensor& z_ = s.z;
  // Sequence parallelism: the whole-token partial products live until g's reduce-scatter below (local_'s
  // backward does not read its output): one buffer for every layer, not one per layer.
  if (g_.sequence)
    local_->write_output_into(*s.local, g_.workspace(TpBuffer::row_partial, local_->output_shape(x.shape()),
                                                     x.dtype(), x.device()));
  Tensor partial = local_->forward(x, *s.local, call);
  if (partial.dtype() == DType::bf16) {
    // bfloat16: the (bf16) partial products summed in float32 (g, or g's
    // reduce-scatter), the bias added to that sum, and rounded once, as the
    // 1-rank Linear rounds its float32 accumulator plus bias once.
    Tensor sum = tp_sum_f32(partial, g_, g_.sequence);
    if (after_.bias) be_->add_broadcast(sum, b, inner(sum), sum);
    ensure(z_, sum.shape(), DType::bf16, sum.device());
    be_->cast(sum, z_);
  } else {
    if (g_.sequence) {  // g: sum the partial products, each rank keeping its tokens
      ensure(z_, seq_shard_shape(partial.shape(), g_), partial.dtype(), partial.device());
      seq_reduce_scatter(partial, z_, g_);
    } else {
      z_ = partial;  // summed in place: local_'s backward does not read its output, so z_ need not be a copy
      tp_all_reduce(partial, z_, g_);  // g: sum the partial products
    }
    if (after_.bias) be_->add_broadcast(z_, b, inner(z_), z_);
  }
  if (after_.relu) relu_->forward(z_, z_);  // commutes with the rounding: on the bf16 sum
  if (!after_.pool) return z_;
  ensure(s.y, output_shape(x.shape()), z_.dtype(), z_.device());
  pool_->forward(z_, s.y, call.train(), state_in(s.pool, *pool_));
  return s.y;
}

Tensor RowParallel::do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const {
  Saved& s = saved<Saved>(c);
  const Tensor& z_ = s.z;
  Tensor& dz_ = s.dz;
  Tensor& dbp_ = s.dbp;
  Tensor db_ = db;
  Tensor dz = dy;
  if (after_.pool) {
    ensure(dz_, z_.shape(), z_.dtype(), z_.device());
    pool_->backward(z_, s.y, dy, dz_, state_in(s.pool, *pool_));
    dz = dz_;
  }
  if (after_.relu) {  // z_ holds the ReLU's output
    ensure(dz_, z_.shape(), z_.dtype(), z_.device());
    relu_->backward(z_, z_, dz, dz_);
    dz = dz_;
  }
  if (!g_.sequence) {
    // Every tensor rank computes the same db: the reduced output is replicated.
    if (after_.bias) be_->sum_broadcast(dz, inner(z_), db_, accumulate);
    return local_->backward(dz, *s.local, need_dx, accumulate);  // g's backward is the identity
  }
  // Sequence parallelism: db sums this rank's tokens only (summed over the
  // group, as Megatron does); g's backward all-gathers dz.
  if (after_.bias) {
    ensure(dbp_, db.shape(), db.dtype(), db.device());
    be_->sum_broadcast(dz, inner(z_), dbp_, false);
    tp_sum_partial(dbp_, {db}, accumulate, g_, *be_);
  }
  Tensor dzg = g_.workspace(TpBuffer::gathered_grad, seq_whole_shape(dz.shape(), g_), dz.dtype(), dz.device());
  seq_all_gather(dz, dzg, g_);
  return local_->backward(dzg, *s.local, need_dx, accumulate);
}

// ---- ChannelParallelBatchNorm2d -------------------------------------------------------
namespace {
BatchNormSpec local_bn(BatchNormSpec s, const TensorGroup& g, const std::string& name) {
  RT_CHECK(s.channels % g.size == 0, "ChannelParallelBatchNorm2d '", name, "': ", s.channels,
           " channels are not divisible by the tensor size ", g.size);
  s.channels /= g.size;
  return s;
}
}  // namespace

ChannelParallelBatchNorm2d::ChannelParallelBatchNorm2d(std::string name, BatchNormSpec whole, TensorGroup g)
    : BatchNorm2d(name, local_bn(whole, g, name)), channels_(whole.channels), g_(std::move(g)) {}

void ChannelParallelBatchNorm2d::register_params(ParamArena& arena, int li, const std::string& prefix) {
  BatchNorm2d::register_params(arena, li, prefix);
  for (std::size_t i : params_) arena.set_shard(i, make_shard({channels_}, 0, g_.size, g_.rank));  // gamma, beta
}

std::vector<NamedBuffer> ChannelParallelBatchNorm2d::buffers() const {
  auto out = BatchNorm2d::buffers();
  for (auto& b : out) b.shard = make_shard({channels_}, 0, g_.size, g_.rank);
  return out;
}

}  // namespace ringtrain
