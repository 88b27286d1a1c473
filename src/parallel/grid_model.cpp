// GridModel: building a rank's part of the model and running its step (the
// schedule's operations, the step's one small all-reduce) and its evaluation.
// The update is grid_update.cpp, the checkpoint state grid_model_state.cpp.
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

GridModel::GridModel(const ProcessGrid& grid, const ModelConfig& mc, const GridConfig& pc, const OptimizerConfig& oc,
                     Device dev, DeviceRuntime* runtime)
    : grid_(grid), pc_(pc), dev_(dev), rt_(runtime ? *runtime : device_runtime(dev.kind)) {
  DeviceRuntime& rt = rt_;
  const int p = grid.pp_size();
  run_agreed(grid.world(), "setting up the process grid", [&] {
    RT_CHECK(pc.micro_batches >= 1, "configuration key 'parallel.micro_batches' must be >= 1, got ", pc.micro_batches);
    RT_CHECK(pc.accumulation >= 1, "configuration key 'train.accumulation' must be >= 1, got ", pc.accumulation);
    RT_CHECK(pc.batch > 0 && pc.batch % pc.micro_batches == 0, "data.batch_size = ", pc.batch,
             " is not divisible by parallel.micro_batches = ", pc.micro_batches);
  });
  steps_m_ = pc.accumulation * pc.micro_batches;
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
  exec_ = std::make_unique<ScheduleExecutor>(grid, pc.schedule, steps_m_, in_mb, out_mb, pc.timeout_s, dev);
  stage_ = std::make_unique<Stage>(mc_tp, dev, first, end, exec_->slots());
  // BatchNorm: per-micro-batch normalisation, running statistics over the whole step (stage.hpp).
  if (steps_m_ > 1) stage_->set_deferred_batch_stats(true);
  // Only zero-bubble schedules defer the weight gradients; the others run each
  // layer's backward whole (its gradients go to the engine at once).
  stage_->set_fused_backward(pc.schedule != ScheduleKind::zb_h1);
  dlogits_.resize(exec_->slots());
  step_vec_ = Tensor::zeros({4}, DType::f32);
  if (pc.loss_scaling) scaler_ = std::make_unique<LossScaler>();

  // The update's sums (clipping, fp16's finiteness) run over the ranks that
  // together hold each gradient once: the stages and shards of this replica,
  // or with ZeRO-1 (each replica a slice) the whole world.
  owners_ = pc.shard_optimizer ? grid.world().dup("owners")
                               : grid.world().split(grid.dp_rank(), grid.world().rank(), "model-parallel");
  if (pc.shard_optimizer) {
    run_agreed(grid.world(), "setting up parallel.shard_optimizer", [&] {
      RT_CHECK(dev.is_cpu(), "parallel.shard_optimizer needs train.device = cpu: its reduce-scatter and all-gather "
               "are host-only (this run chose ", dev.str(), ")");
    });
    zero_ = std::make_unique<ShardedOptimizer>(stage_->arena(), oc, grid.dp().dup("zero"), pc.zero_collectives,
                                               [&rt](ParamArena& a, const OptimizerConfig& c) {
                                                 return rt.make_optimizer(a, c);
                                               });
  } else {
    opt_ = rt.make_optimizer(stage_->arena(), oc);
  }
  if (grid.dp_size() > 1 && !pc.shard_optimizer) {
    EngineOptions eo = pc.engine;
    eo.device_ops = rt.fusion_ops(dev);
    if (pc.deterministic) {
      eo.fusion_threshold = 0;  // each bucket is its own all-reduce: composition never varies
      make_layer_buckets();
    }
    engine_ = std::make_unique<Engine>(grid.dp(), eo);
  } else if (grid.dp_size() > 1 && grid.pp_size() * grid.tp_size() == 1) {
    // ZeRO-1 reduce-scatters the gradients itself; the engine still carries the step's loss.
    engine_ = std::make_unique<Engine>(grid.dp(), pc.engine);
  }
}

// A layer's parameters are a contiguous run of the arena (model.hpp): when they
// share one dtype their gradients are one span (alignment padding inside stays
// zero), and so are those of consecutive such layers. Buckets gather layers
// from the last one back until they hold bucket_bytes.
void GridModel::make_layer_buckets() {
  const ParamArena& a = stage_->arena();
  bucket_of_layer_.assign(static_cast<std::size_t>(stage_->num_layers()), -1);
  std::size_t lo = 0, hi = 0, bytes = 0;
  DType dt = DType::f32;
  Bucket cur;
  auto close = [&] {
    if (cur.layers == 0) return;
    cur.grads = a.grads_flat(dt).flat_view(static_cast<std::int64_t>(lo), static_cast<std::int64_t>(hi - lo));
    cur.name = cat("bucket.", stage_->first_layer(), ".", buckets_.size());
    buckets_.push_back(cur);
    cur = Bucket{};
    bytes = 0;
  };
  for (int l = stage_->num_layers(); l-- > 0;) {
    const auto& ps = stage_->layer(l).params();
    if (ps.empty()) continue;
    const ParamInfo &first = a.info(ps.front()), &last = a.info(ps.back());
    bool one_span = true;
    for (std::size_t k = 0; k < ps.size(); ++k)
      one_span = one_span && a.info(ps[k]).dtype == first.dtype && (k == 0 || ps[k] == ps[k - 1] + 1);
    if (!one_span) {  // per parameter, still unfused
      close();
      continue;
    }
    const std::size_t end = last.offset + static_cast<std::size_t>(shape_numel(last.shape));
    if (cur.layers > 0 && (first.dtype != dt || end != lo)) close();  // not adjacent: a new span
    if (cur.layers == 0) {
      hi = end;
      dt = first.dtype;
    }
    lo = first.offset;
    bytes += (end - first.offset) * dtype_size(first.dtype);
    bucket_of_layer_[static_cast<std::size_t>(l)] = static_cast<int>(buckets_.size());
    ++cur.layers;
    if (bytes >= static_cast<std::size_t>(pc_.bucket_bytes)) close();
  }
  close();
}

GridModel::~GridModel() = default;

// Micro-batch mb of the step: loader batch mb / m, its (mb % m)-th slice.
Tensor GridModel::load(int mb) {
  const Tensor& x = images_[static_cast<std::size_t>(mb / pc_.micro_batches)];
  Tensor t = rows(x, (mb % pc_.micro_batches) * mb_size_, mb_size_);
  return t.device() == dev_ ? t : t.to(dev_);
}

Tensor GridModel::forward(int slot, int mb, const Tensor& x) {
  // The micro-batch's first sample in the step's global batch (the samples of
  // loader batch a sit at a·G + dp_rank·B in it, G = dp·B; data/sampler.hpp).
  const std::int64_t a = mb / pc_.micro_batches, j = mb % pc_.micro_batches;
  const std::int64_t g = static_cast<std::int64_t>(grid_.dp_size()) * pc_.batch;
  stage_->set_position(static_cast<std::uint64_t>(step_), a * g + grid_.dp_rank() * pc_.batch + j * mb_size_);
  return stage_->forward(slot, x, Mode::train);
}

Tensor GridModel::loss_grad(int slot, int mb, const Tensor& out) {
  const Tensor& yl = labels_[static_cast<std::size_t>(mb / pc_.micro_batches)];
  Tensor y = rows(yl, (mb % pc_.micro_batches) * mb_size_, mb_size_);
  if (y.device() != dev_) y = y.to(dev_);
  Tensor& d = dlogits_[slot];
  if (!d.defined() || d.shape() != out.shape()) d = Tensor::empty(out.shape(), DType::f32, out.device());
  loss_sum_ += softmax_cross_entropy(out, y, 0.0, d);
  correct_ += count_correct(out, y);
  seen_ += out.dim(0);
  // The step's loss is the mean of its micro-batch means; fp16 scales it up so
  // that small gradients survive the down-converted backward.
  const double k = (scaler_ ? scaler_->scale() : 1.0) / steps_m_;
  if (k != 1.0) rt_.scale(d, k);
  return d;
}

void GridModel::submit(int local_layer) {
  if (!engine_ || zero_ || pc_.skip_allreduce) return;
  const int b = bucket_of_layer_.empty() ? -1 : bucket_of_layer_[static_cast<std::size_t>(local_layer)];
  if (b >= 0) {  // comm.deterministic: the bucket goes once all its layers are ready
    Bucket& k = buckets_[static_cast<std::size_t>(b)];
    if (--k.pending == 0) handles_.push_back(engine_->allreduce_async(k.name, k.grads));
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

// Pure data parallelism: the step's loss vector rides with the gradients.
void GridModel::reduce_grads() {
  if (engine_ && grid_.pp_size() * grid_.tp_size() == 1) {
    step_vec_.data<float>()[0] = static_cast<float>(loss_sum_ / steps_m_);  // every backward has run
    handles_.push_back(engine_->allreduce_async("step", step_vec_));
  }
  for (auto& h : handles_) engine_->wait(h);
  handles_.clear();
  if (zero_ && !pc_.skip_allreduce) zero_->reduce_scatter_grads();
}

void GridModel::optimizer_step() { skipped_ = !update(lr_); }

GridStepResult GridModel::train_step(const std::vector<Tensor>& images, const std::vector<Tensor>& labels,
                                     std::int64_t step, double lr, StepFlags flags) {
  const std::size_t k = static_cast<std::size_t>(pc_.accumulation);
  auto check = [&](const std::vector<Tensor>& v, const char* what) {
    RT_CHECK(v.size() == k, grid_.tag(), " step: expected ", k, " batches of ", what, ", got ", v.size());
    for (const Tensor& t : v)
      RT_CHECK(t.defined() && t.dim(0) == pc_.batch, grid_.tag(), " step: expected ", pc_.batch, " ", what);
  };
  if (grid_.first_stage()) check(images, "images");
  if (grid_.last_stage()) check(labels, "labels");
  images_ = images;
  labels_ = labels;
  step_ = step;
  lr_ = lr;
  loss_sum_ = 0;
  correct_ = seen_ = 0;
  stage_->zero_grads();
  for (Bucket& k : buckets_) k.pending = k.layers;
  // The loss vector: the last stages' tensor rank 0 speak for their replica;
  // averaged over the world it is rescaled below. Filled before the schedule's
  // ReduceGrads, which may send it with the gradients.
  const bool speaks = grid_.last_stage() && grid_.tp_rank() == 0;
  float* v = step_vec_.data<float>();
  v[1] = flags.stop ? 1.0f : 0.0f;
  v[2] = flags.save ? 1.0f : 0.0f;
  v[3] = flags.checkpoint_ready ? 1.0f : 0.0f;
  GridStepResult r;
  r.timing = exec_->run_step(*this);
  stage_->commit_batch_stats();  // every forward of the step has run
  if (grid_.pp_size() * grid_.tp_size() > 1 || !engine_) {
    v[0] = speaks ? static_cast<float>(loss_sum_ / steps_m_) : 0.0f;
    if (grid_.world().size() > 1) allreduce(v, v, 4, DType::f32, ReduceOp::avg, grid_.world());
  }
  // Averaged over the world, the replicas' losses sum to v[0]·world / dp.
  r.loss = static_cast<double>(v[0]) * grid_.world().size() / grid_.dp_size();
  r.correct = speaks ? correct_ : 0;
  r.seen = speaks ? seen_ : 0;
  r.stop = v[1] > 0;
  r.save = v[2] > 0;
  r.checkpoint_ready = v[3] > 1.0f - 0.5f / static_cast<float>(grid_.world().size());  // the mean of ones is one
  r.skipped = skipped_;
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
  if (x.device() != dev_) x = x.to(dev_);
  Tensor out = stage_->forward(0, x, Mode::eval);
  if (s + 1 < p) {
    Tensor host = out.device().is_cpu() ? out : out.to(Device::cpu());
    MPI_Isend(&bn, 1, MPI_INT64_T, s + 1, kTag, c, r);
    await_stage(h, grid_, s + 1, pc_.timeout_s, "the evaluation batch size to be received");
    MPI_Isend(host.raw(), static_cast<int>(host.nbytes()), MPI_BYTE, s + 1, kTag + 1, c, r);
    await_stage(h, grid_, s + 1, pc_.timeout_s, "an evaluation activation to be received");
    return {0.0, 0};
  }
  if (valid <= 0 || grid_.tp_rank() != 0) return {0.0, 0};  // tensor ranks hold the same logits: count once
  Tensor y = labels.device() == dev_ ? labels : labels.to(dev_);
  Tensor o = valid < bn ? out.slice_rows(0, valid) : out;
  if (valid < bn) y = y.slice_rows(0, valid);
  return {softmax_cross_entropy_loss(o, y) * static_cast<double>(valid), count_correct(o, y)};
}

}  // namespace ringtrain
