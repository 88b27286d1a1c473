#include "ringtrain/parallel/grid_model.hpp"

#include <mpi.h>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/nn/loss.hpp"

namespace ringtrain {
namespace {

Tensor rows(const Tensor& t, std::int64_t first, std::int64_t n) {
  Shape s = t.shape();
  const std::int64_t per = s[0] > 0 ? t.numel() / s[0] : 0;
  s[0] = n;
  return t.flat_view(first * per, n * per).reshape(s);
}

}  // namespace

GridModel::GridModel(const ProcessGrid& grid, const ModelConfig& mc, const GridConfig& pc,
                             const OptimizerConfig& oc, Device dev)
    : grid_(grid), pc_(pc) {
  const int p = grid.pp_size();
  run_agreed(grid.world(), "setting up the pipeline", [&] {
    RT_CHECK(dev.is_cpu(), "the pipeline/tensor grid runs on the CPU for now (train.device = cpu)");
    RT_CHECK(pc.micro_batches >= 1, "configuration key 'parallel.micro_batches' must be >= 1, got ", pc.micro_batches);
    RT_CHECK(pc.batch > 0 && pc.batch % pc.micro_batches == 0, "data.batch_size = ", pc.batch,
             " is not divisible by parallel.micro_batches = ", pc.micro_batches);
  });
  mb_size_ = pc.batch / pc.micro_batches;
  ModelConfig mc_tp = mc;  // parallel.tensor: the model splits its layers over grid.tp()
  mc_tp.tensor = TensorGroup::of(grid.tp(), mc.tensor.stats);  // stats: the caller's counter, if any
  // Nothing of the whole model is allocated: the partition works from what each
  // layer registers (or times layers one by one), the stage builds its own layers.
  const std::vector<LayerPlan> plan = plan_model_layers(mc_tp, dev);
  run_agreed(grid.world(), "partitioning the model into stages", [&] {
    const int n = static_cast<int>(plan.size());
    switch (pc.partition) {
      case PartitionKind::uniform: balance_ = balance_uniform(n, p); break;
      case PartitionKind::params: balance_ = balance_by_cost(layer_param_costs(plan), p); break;
      case PartitionKind::list: balance_ = check_balance_list(pc.balance, n, p); break;
      case PartitionKind::time: balance_ = balance_by_cost(layer_time_costs(mc_tp, dev, mb_size_), p); break;
    }
  });
  // Timings differ per rank: every rank takes world rank 0's cut.
  broadcast(balance_.data(), balance_.size(), DType::i32, 0, grid.world());
  int first = 0;
  for (int s = 0; s < grid.pp_rank(); ++s) first += balance_[s];
  const int end = first + balance_[grid.pp_rank()];
  // The executor knows the slots the schedule needs: the stage is built after it.
  const auto [in_mb, out_mb] = Stage::boundary_shapes(mc_tp, dev, first, end, mb_size_);
  exec_ = std::make_unique<PipelineExecutor>(grid, pc.schedule, pc.micro_batches, in_mb, out_mb, pc.timeout_s);
  stage_ = std::make_unique<Stage>(mc_tp, dev, first, end, exec_->slots());
  // BatchNorm: per-micro-batch normalisation, running statistics over the whole step (stage.hpp).
  if (pc.micro_batches > 1) stage_->set_deferred_batch_stats(true);
  opt_ = make_optimizer(stage_->arena(), oc);
  dlogits_.resize(exec_->slots());
  if (grid.dp_size() > 1) {
    EngineOptions eo = pc.engine;
    if (pc.deterministic) {
      eo.fusion_threshold = 0;  // each bucket is its own all-reduce: composition never varies
      make_layer_buckets();
    }
    engine_ = std::make_unique<Engine>(grid.dp(), eo);
  }
}

// A layer's parameters are a contiguous run of the arena (model.hpp): when they
// share one dtype their gradients are one span (alignment padding inside stays zero).
void GridModel::make_layer_buckets() {
  const ParamArena& a = stage_->arena();
  layer_bucket_.assign(static_cast<std::size_t>(stage_->num_layers()), Tensor());
  for (int l = 0; l < stage_->num_layers(); ++l) {
    const auto& ps = stage_->layer(l).params();
    if (ps.empty()) continue;
    const ParamInfo &lo = a.info(ps.front()), &hi = a.info(ps.back());
    bool one_span = true;
    for (std::size_t k = 0; k < ps.size(); ++k)
      one_span = one_span && a.info(ps[k]).dtype == lo.dtype && (k == 0 || ps[k] == ps[k - 1] + 1);
    if (!one_span) continue;  // per parameter, still unfused
    const std::size_t end = hi.offset + static_cast<std::size_t>(shape_numel(hi.shape));
    layer_bucket_[static_cast<std::size_t>(l)] = a.grads_flat(lo.dtype).flat_view(
        static_cast<std::int64_t>(lo.offset), static_cast<std::int64_t>(end - lo.offset));
  }
}

GridModel::~GridModel() = default;

Tensor GridModel::load(int mb) { return rows(images_, mb * mb_size_, mb_size_); }

Tensor GridModel::forward(int slot, int, const Tensor& x) { return stage_->forward(slot, x, Mode::train); }

Tensor GridModel::loss_grad(int slot, int mb, const Tensor& out) {
  Tensor y = rows(labels_, mb * mb_size_, mb_size_);
  Tensor& d = dlogits_[slot];
  if (!d.defined() || d.shape() != out.shape()) d = Tensor::empty(out.shape(), DType::f32, out.device());
  loss_sum_ += softmax_cross_entropy(out, y, 0.0, d);
  correct_ += count_correct(out, y);
  // The batch's loss is the mean of the micro-batch means.
  const float k = 1.0f / static_cast<float>(pc_.micro_batches);
  float* g = d.data<float>();
  for (std::int64_t i = 0; i < d.numel(); ++i) g[i] *= k;
  return d;
}

void GridModel::submit(int local_layer) {
  if (!engine_) return;
  if (!layer_bucket_.empty() && layer_bucket_[static_cast<std::size_t>(local_layer)].defined()) {
    handles_.push_back(engine_->allreduce_async(cat("layer.", stage_->first_layer() + local_layer),
                                                layer_bucket_[static_cast<std::size_t>(local_layer)]));
    return;
  }
  for (std::size_t p : stage_->layer(local_layer).params())
    handles_.push_back(engine_->allreduce_async(stage_->arena().info(p).name, stage_->arena().grad(p)));
}

Tensor GridModel::backward_input(int slot, int, const Tensor& dy, bool last_mb) {
  Stage::GradReady ready;
  if (last_mb && engine_) ready = [this](int l) { submit(l); };
  return stage_->backward_input(slot, dy, !grid_.first_stage(), ready);
}

void GridModel::backward_weight(int slot, int, bool last_mb) {
  Stage::GradReady ready;
  if (last_mb && engine_) ready = [this](int l) { submit(l); };
  stage_->backward_weight(slot, ready);
}

void GridModel::reduce_grads() {
  for (auto& h : handles_) engine_->wait(h);
  handles_.clear();
}

void GridModel::optimizer_step() {
  if (pc_.clip_norm > 0) clip_grads(pc_.clip_norm);
  opt_->step(lr_);
}

GridStepResult GridModel::train_step(const Tensor& images, const Tensor& labels, double lr, bool stop,
                                         bool save) {
  if (grid_.first_stage())
    RT_CHECK(images.defined() && images.dim(0) == pc_.batch, grid_.tag(), " pipeline step: expected ", pc_.batch,
             " images");
  if (grid_.last_stage())
    RT_CHECK(labels.defined() && labels.dim(0) == pc_.batch, grid_.tag(), " pipeline step: expected ", pc_.batch,
             " labels");
  images_ = images;
  labels_ = labels;
  lr_ = lr;
  loss_sum_ = 0;
  correct_ = 0;
  stage_->zero_grads();
  GridStepResult r;
  r.timing = exec_->run_step(*this);
  stage_->commit_batch_stats();  // every forward of the step has run
  // Loss and accuracy from the last stages to everyone, and the stop flag
  // from anyone: one small all-reduce.
  double v[5] = {0, 0, 0, stop ? 1.0 : 0.0, save ? 1.0 : 0.0};
  if (grid_.last_stage() && grid_.tp_rank() == 0) {  // tensor ranks hold the same logits: count once
    v[0] = loss_sum_ / pc_.micro_batches;
    v[1] = static_cast<double>(correct_);
    v[2] = static_cast<double>(pc_.batch);
  }
  allreduce(v, v, 5, DType::f64, ReduceOp::sum, grid_.world());
  r.loss = v[0] / grid_.dp_size();
  r.correct = static_cast<std::int64_t>(v[1]);
  r.seen = static_cast<std::int64_t>(v[2]);
  r.stop = v[3] > 0;
  r.save = v[4] > 0;
  return r;
}

// Forward along the chain. Every transfer is non-blocking and bounded by the
// stage timeout (await_stage), so a stage that died or stalled during
// evaluation ends the job naming it instead of hanging its neighbours.
std::pair<double, std::int64_t> GridModel::eval_batch(const Tensor& images, const Tensor& labels,
                                                          std::int64_t valid) {
  const int s = grid_.pp_rank(), p = grid_.pp_size();
  MPI_Comm c = grid_.pp().handle("pipeline evaluation");
  constexpr int kTag = 1 << 20;
  // The batch size (last batches may be short) travels ahead of the activation.
  std::int64_t bn = grid_.first_stage() ? images.dim(0) : 0;
  std::uint64_t h = 0;
  auto* r = reinterpret_cast<MPI_Request*>(&h);
  Tensor x = images;
  if (s > 0) {
    MPI_Irecv(&bn, 1, MPI_INT64_T, s - 1, kTag, c, r);
    await_stage(h, grid_, s - 1, pc_.timeout_s, "the evaluation batch size");
    x = Tensor::empty(stage_->input_shape(bn), DType::f32);
    MPI_Irecv(x.raw(), static_cast<int>(x.nbytes()), MPI_BYTE, s - 1, kTag + 1, c, r);
    await_stage(h, grid_, s - 1, pc_.timeout_s, "an evaluation activation");
  }
  Tensor out = stage_->forward(0, x, Mode::eval);
  if (s + 1 < p) {
    MPI_Isend(&bn, 1, MPI_INT64_T, s + 1, kTag, c, r);
    await_stage(h, grid_, s + 1, pc_.timeout_s, "the evaluation batch size to be received");
    MPI_Isend(out.raw(), static_cast<int>(out.nbytes()), MPI_BYTE, s + 1, kTag + 1, c, r);
    await_stage(h, grid_, s + 1, pc_.timeout_s, "an evaluation activation to be received");
    return {0.0, 0};
  }
  if (valid <= 0) return {0.0, 0};
  Tensor o = valid < bn ? out.slice_rows(0, valid) : out, y = valid < bn ? labels.slice_rows(0, valid) : labels;
  return {softmax_cross_entropy_loss(o, y) * static_cast<double>(valid), count_correct(o, y)};
}

std::vector<std::pair<std::string, Tensor>> GridModel::named_state() {
  std::vector<std::pair<std::string, Tensor>> out;
  ParamArena& a = stage_->arena();
  for (std::size_t i = 0; i < a.size(); ++i) out.emplace_back("param/" + a.info(i).name, a.param(i));
  for (auto& b : stage_->buffers()) out.emplace_back("buffer/" + b.name, b.tensor);
  for (auto& [kind, t] : opt_->state()) {
    if (kind == "step") {
      out.emplace_back("optim/step", t);
      continue;
    }
    // "<dtype>.<slot>" flat buffers share the arena's layout: slice per parameter.
    const std::string slot = kind.substr(kind.find('.') + 1);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const ParamInfo& pi = a.info(i);
      if (kind.rfind(std::string(dtype_name(pi.dtype)) + ".", 0) != 0) continue;
      out.emplace_back("optim/" + slot + "/" + pi.name,
                       t.flat_view(static_cast<std::int64_t>(pi.offset), shape_numel(pi.shape)).reshape(pi.shape));
    }
  }
  return out;
}

}  // namespace ringtrain
