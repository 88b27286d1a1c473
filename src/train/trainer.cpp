#include "ringtrain/train/trainer.hpp"

#include <omp.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/engine/engine.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/loss_scale.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/schedule.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/device_runtime.hpp"
#include "ringtrain/train/signals.hpp"
#include "ringtrain/train/state.hpp"
#include "pipeline_trainer.hpp"
#include "run_options.hpp"
#include "run_state.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One device kind for the whole job: "auto" takes CUDA only if every rank has
// a GPU; "cuda" without one is an error on every rank. Each rank then binds to
// its GPU by node-local rank before any other CUDA work.
Device choose_device(const TrainConfig& cfg, const Communicator& world) {
  int have = has_device_runtime(DeviceKind::cuda) ? 1 : 0;
  allreduce(&have, &have, 1, DType::i32, ReduceOp::min, world);
  run_agreed(world, "choosing the device", [&] {
    RT_CHECK(cfg.train.device != "cuda" || has_device_runtime(DeviceKind::cuda),
             "train.device = cuda, but rank ", world.rank(), " has no CUDA device "
             "(was ringtrain built with CUDA, and does this node have a GPU?)");
  });
  if (cfg.train.device == "cpu" || !have) return Device::cpu();
  Device d;
  run_agreed(world, "selecting this rank's GPU", [&] { d = device_runtime(DeviceKind::cuda).select(world); });
  return d;
}

// Sums doubles over ranks (metrics at epoch ends; not on the step's hot path).
void sum_over_ranks(std::vector<double>& v, const Communicator& comm) {
  allreduce(v.data(), v.data(), v.size(), DType::f64, ReduceOp::sum, comm);
}

}  // namespace

Trainer::Impl::Impl(TrainConfig c, Communicator w, TrainerHooks h)
    : cfg(std::move(c)), world(std::move(w)), hooks(std::move(h)) {
  cfg.validate();
  ckpt.create_dir();
  // The trainer's own collectives (metrics, agreement, broadcasts) time out like the engine's.
  if (!std::getenv("RINGTRAIN_COLLECTIVE_TIMEOUT") && world.size() > 1)
    host_context(world.handle(), world.local_size()).timeout_s = cfg.comm.collective_timeout_s;
  device = choose_device(cfg, world);
  rt = &device_runtime(device.kind);
  math = parse_math_mode(cfg.train.precision);
  if (math == MathMode::fp16) {
    scaler = std::make_unique<LossScaler>();
    scaler_state = Tensor::zeros({4}, DType::f64);
  }
  omp_set_num_threads(compute_threads(cfg));
  flush_denormals();
  open_loader();
  // The test split is checked now, not after an epoch of training.
  run_agreed(world, "checking the data files",
             [&] { run_state::check_data_files(cfg, loader->info(), hooks.evaluate); });
  build_model();
  build_optimizer();
  build_engine();
  ckpt.describe_run(model->num_params(), 1, 1, world.size());
  broadcast_state();
}

void Trainer::Impl::open_loader() {
  loader = open_train_loader(cfg, world);
  RT_CHECK(loader->steps_per_epoch() >= cfg.train.accumulation, "data.train '", cfg.data.train, "' gives ",
           loader->steps_per_epoch(), " micro-batches per epoch, fewer than train.accumulation = ",
           cfg.train.accumulation);
}

void Trainer::Impl::build_model() {
  ModelConfig mc = model_config(cfg, loader->info());
  mc.math = math;
  model = ringtrain::build_model(mc, device);
  for (int i = 0; i < model->num_layers(); ++i)
    if (auto* d = dynamic_cast<Dropout*>(&model->layer(i))) dropout_calls.emplace_back(d, Tensor::zeros({1}, DType::i64));
  loss_buf = Tensor::zeros({3}, DType::f32);  // loss, stop flag, checkpoint.every_s flag
}

void Trainer::Impl::build_optimizer() {
  OptimizerConfig oc = optimizer_config(cfg);
  if (cfg.parallel.shard_optimizer) build_sharded_optimizer(oc);
  else optimizer = rt->make_optimizer(model->arena(), oc);

  ScheduleConfig sc = schedule_config(cfg, global_batch());
  schedule = std::make_unique<LrSchedule>(sc, steps_per_epoch(), total_steps());
}

void Trainer::Impl::build_engine() {
  EngineOptions eo = engine_options(cfg);
  eo.device_ops = rt->fusion_ops(device);
  if (cfg.comm.deterministic && !zero) {
    make_buckets();
    eo.fusion_threshold = 0;  // each bucket is its own all-reduce: composition never varies
  }
  engine = std::make_unique<Engine>(world, eo);
}

// Buckets: walk parameters from the last (first ready in backward) to the
// first, closing a bucket once it holds bucket_bytes. Parameters of one dtype
// are contiguous in the arena, so each bucket is one zero-copy span.
void Trainer::Impl::make_buckets() {
  const ParamArena& a = model->arena();
  RT_CHECK(a.dtypes().size() == 1, "comm.deterministic needs parameters of a single dtype");
  bucket_of.assign(a.size(), -1);
  std::size_t lo = 0, hi = 0, bytes = 0;
  Bucket cur;
  auto close = [&] {
    cur.grads = a.grads_flat(a.dtypes()[0]).flat_view(static_cast<std::int64_t>(lo), static_cast<std::int64_t>(hi - lo));
    buckets.push_back(cur);
    cur = Bucket{};
    bytes = 0;
  };
  for (std::size_t i = a.size(); i-- > 0;) {
    const ParamInfo& p = a.info(i);
    std::size_t end = p.offset + static_cast<std::size_t>(shape_numel(p.shape));
    if (cur.params == 0) hi = end;
    lo = p.offset;
    bytes += static_cast<std::size_t>(shape_numel(p.shape)) * dtype_size(p.dtype);
    bucket_of[i] = static_cast<int>(buckets.size());
    ++cur.params;
    if (bytes >= static_cast<std::size_t>(cfg.comm.bucket_bytes)) close();
  }
  if (cur.params) close();
}

// The backward hook: hands gradients to the engine as soon as they exist.
void Trainer::Impl::on_grads_ready(std::span<const std::size_t> params) {
  if (buckets.empty()) {
    for (std::size_t p : params)
      handles.push_back(engine->allreduce_async(model->arena().info(p).name, model->arena().grad(p)));
    return;
  }
  for (std::size_t p : params) {
    Bucket& b = buckets[static_cast<std::size_t>(bucket_of[p])];
    if (--b.pending == 0) handles.push_back(engine->allreduce_async(cat("bucket.", bucket_of[p]), b.grads));
  }
}

NamedTensorList Trainer::Impl::run_state() {
  NamedTensorList s = model_state(*model, state_optimizer());
  for (auto& [d, t] : dropout_calls) {
    t.data<std::int64_t>()[0] = static_cast<std::int64_t>(d->call_count());
    s.emplace_back("rng/" + d->name() + ".calls", t);
  }
  if (scaler) {
    scaler->save(scaler_state.data<double>());
    s.emplace_back("amp.loss_scale", scaler_state);
  }
  return s;
}

// Every rank continues from rank 0's parameters, buffers and optimizer state
// (flat buffers: a few large broadcasts).
void Trainer::Impl::broadcast_state() {
  std::vector<Tensor> ts;
  for (auto& [name, t] : flat_state(*model, optimizer.get())) ts.push_back(t);
  if (scaler) {
    scaler->save(scaler_state.data<double>());
    ts.push_back(scaler_state);
  }
  for (auto& [d, t] : dropout_calls) {
    t.data<std::int64_t>()[0] = static_cast<std::int64_t>(d->call_count());
    ts.push_back(t);
  }
  broadcast_tensors(ts, 0, world);
  if (scaler) scaler->load(scaler_state.data<double>());
  for (auto& [d, t] : dropout_calls) d->set_call_count(static_cast<std::uint64_t>(t.data<std::int64_t>()[0]));
}

std::int64_t Trainer::Impl::global_batch() const {
  return static_cast<std::int64_t>(cfg.data.batch_size) * world.size() * cfg.train.accumulation;
}
std::int64_t Trainer::Impl::steps_per_epoch() const { return loader->steps_per_epoch() / cfg.train.accumulation; }
// The schedule spans the configured epochs; train.max_steps only stops early
// (so a run cut short follows the same learning rates as the full one).
std::int64_t Trainer::Impl::total_steps() const { return steps_per_epoch() * cfg.train.epochs; }

// One optimizer step:
//   for each micro-batch: forward, loss, backward — the last backward hands each
//   layer's gradients to the engine as soon as they exist (overlap);
//   wait for the averaged gradients; (fp16: unscale, skip the step on inf/NaN);
//   optimizer step with the scheduled lr (apply_update, zero.cpp).
// ZeRO-1 (parallel.shard_optimizer): no all-reduce during backward; one
// reduce-scatter per dtype after it, the update of this rank's slice, an all-gather.
// Returns the loss averaged over ranks and micro-batches.
double Trainer::Impl::train_step(EpochStats& st) {
  const int k = cfg.train.accumulation;
  double local_loss = 0;
  model->zero_grad();
  for (int micro = 0; micro < k; ++micro) {
    std::optional<data::Batch> batch = loader->next();
    RT_CHECK(batch.has_value(), "training data ended inside an optimizer step");
    auto t0 = Clock::now();
    Tensor x = device.is_cpu() ? batch->images : batch->images.to(device);
    Tensor y = device.is_cpu() ? batch->labels : batch->labels.to(device);

    Tensor logits = model->forward(x, Mode::train);
    if (!dlogits.defined() || dlogits.shape() != logits.shape())
      dlogits = Tensor::empty(logits.shape(), DType::f32, device);
    local_loss += softmax_cross_entropy(logits, y, 0.0, dlogits);
    st.correct += count_correct(logits, y);
    st.seen += batch->valid;
    // The step's loss is the mean over its k micro-batches; fp16 scales it up
    // so that small gradients survive the down-converted backward.
    const double gscale = (scaler ? scaler->scale() : 1.0) / k;
    if (gscale != 1.0) rt->scale(dlogits, gscale);

    const bool last = micro == k - 1;
    for (auto& b : buckets) b.pending = b.params;
    model->backward(dlogits, [&](int, std::span<const std::size_t> params) {
      // Accumulation: no communication until the last micro-batch.
      // ZeRO-1 reduce-scatters once after backward instead (below).
      if (last && !hooks.skip_allreduce && !zero) on_grads_ready(params);
    });
    st.compute_s += since(t0);
  }
  float* lb = loss_buf.data<float>();
  lb[0] = static_cast<float>(local_loss / k);  // rides along, fused with the gradients
  lb[1] = hooks.stop_signal && hooks.stop_signal() ? 1.0f : 0.0f;
  lb[2] = ckpt.time_due() ? 1.0f : 0.0f;
  handles.push_back(engine->allreduce_async("loss", loss_buf));

  auto tw = Clock::now();
  for (auto& h : handles) engine->wait(h);
  handles.clear();
  if (zero && !hooks.skip_allreduce) zero->reduce_scatter_grads();
  st.comm_s += since(tw);

  auto to = Clock::now();
  if (!apply_update(schedule->lr_at(pos.step))) ++st.skipped;
  ++pos.step;  // the schedule advances either way (as PyTorch's scheduler.step())
  st.compute_s += since(to);
  if (lb[1] > 0 && !stop_signal) {
    // Every rank sees the same average: all stop after this step. -1: the signal reached another rank.
    int mine = hooks.stop_signal ? hooks.stop_signal() : 0;
    stop_signal = mine ? mine : -1;
    if (mine && world.rank() != 0)
      log::warn("rank ", world.rank(), " received ", StopSignals::name(mine), ": every rank stops after step ", pos.step);
  }
  return lb[0];
}

EvalResult Trainer::Impl::evaluate(const std::string& path) {
  data::LoaderOptions lo;
  std::int64_t n = 0;
  run_agreed(world, "opening the test data", [&] {
    try {
      lo.files = data::find_split_files(path, "test");
      for (auto& f : lo.files) n += data::read_file_info(f).count;
    } catch (const Error& e) {
      RT_FAIL("data.test = '", path, "': ", e.what());
    }
  });
  // Every sample exactly once: no shuffle, padded tail excluded through Batch::valid.
  lo.batch_size = std::max<std::int64_t>(1, std::min<std::int64_t>(256, n / world.size()));
  lo.shuffle = false;
  lo.tail = data::TailPolicy::pad;
  lo.seed = cfg.train.seed;
  data::Loader test(lo, world);
  double loss_sum = 0;
  std::int64_t correct = 0, count = 0;
  while (auto b = test.next()) {
    Tensor x = device.is_cpu() ? b->images : b->images.to(device);
    Tensor y = device.is_cpu() ? b->labels : b->labels.to(device);
    Tensor logits = model->forward(x, Mode::eval);
    if (b->valid < logits.dim(0)) {
      logits = logits.slice_rows(0, b->valid);
      y = y.slice_rows(0, b->valid);
    }
    if (b->valid == 0) continue;
    loss_sum += softmax_cross_entropy_loss(logits, y) * b->valid;
    correct += count_correct(logits, y);
    count += b->valid;
  }
  std::vector<double> v = {loss_sum, static_cast<double>(correct), static_cast<double>(count)};
  sum_over_ranks(v, world);
  RT_CHECK(v[2] == static_cast<double>(n), "evaluation saw ", v[2], " samples of ", n);
  return {v[0] / v[2], v[1] / v[2], static_cast<std::int64_t>(v[2])};
}

// Reporter on rank 0; the metrics file gets this run's id and resume count on every record.
void Trainer::Impl::start_reporting() {
  std::string metrics = cfg.log.metrics;
  if (metrics.empty() && !cfg.checkpoint.dir.empty()) metrics = cfg.checkpoint.dir + "/metrics.jsonl";
  if (!hooks.report) metrics.clear();
  run_on_root(world, "opening log.metrics", [&] {
    if (ckpt.resumed()) ckpt.truncate_metrics(metrics);
    reporter = std::make_unique<Reporter>(hooks.report, cfg.log.format, cfg.log.interval, metrics, cfg.train.epochs,
                                          steps_per_epoch());
  });
  if (!reporter) reporter = std::make_unique<Reporter>(false, cfg.log.format, cfg.log.interval, "", cfg.train.epochs,
                                                       steps_per_epoch());
  reporter->set_run(pos.run_id, pos.resumes);
  if (world.rank() == 0 && hooks.report) {
    log::info("ringtrain: ", cfg.model.name, " (", model->num_params(), " parameters) on ", world.size(),
              " rank(s), ", device.str(), ", ", cfg.train.precision, ", batch ", cfg.data.batch_size, "/rank (global ",
              global_batch(), "), ", steps_per_epoch(), " steps/epoch, all-reduce ", cfg.comm.algorithm, ", run ",
              pos.run_id, ckpt.resumed() ? cat(" (resume ", pos.resumes, " at epoch ", pos.epochs_done + 1, " step ",
                                        pos.step_in_epoch, ")") : std::string());
    nlohmann::json head = {{"event", ckpt.resumed() ? "resume" : "start"}, {"model", cfg.model.name},
                           {"params", model->num_params()}, {"ranks", world.size()}, {"device", device.str()},
                           {"precision", cfg.train.precision}, {"global_batch", global_batch()},
                           {"steps_per_epoch", steps_per_epoch()}, {"epochs_done", pos.epochs_done},
                           {"step", pos.step}, {"config", cfg.to_toml()}};
    reporter->json_line(head);
  }
}

TrainResult Trainer::Impl::fit() {
  TrainResult res;
  ckpt.start_run();  // a fresh run's id; stale temporary files of this run removed
  start_reporting();
  auto run_t0 = Clock::now();
  auto limit_hit = [&] { return cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps; };
  for (int epoch = static_cast<int>(pos.epochs_done); epoch < cfg.train.epochs; ++epoch) {
    if (limit_hit()) break;
    bool finished = false;
    EpochMetrics m = train_epoch(epoch, finished);
    if (!finished) {
      // Stopped inside the epoch (train.max_steps or a signal): save the exact position.
      save_checkpoint(true);
      if (stop_signal) ckpt.announce_stop(stop_signal, pos.step_in_epoch, steps_per_epoch(), last_checkpoint);
      break;
    }
    pos.epochs_done = epoch + 1;
    pos.step_in_epoch = 0;
    // A signal carried by the epoch's last step: stop now, before evaluating.
    const bool stopping = stop_signal != 0 && pos.epochs_done < cfg.train.epochs;
    // Save before evaluating: a problem in the test data must not cost the epoch.
    save_checkpoint(stopping || limit_hit() || pos.epochs_done == cfg.train.epochs || save_due);
    if (stopping) {
      reporter->epoch_end(m);
      res.last = m;
      ckpt.announce_stop(stop_signal, 0, steps_per_epoch(), last_checkpoint);
      break;
    }
    if (hooks.evaluate) {
      auto te = Clock::now();
      EvalResult ev = evaluate(cfg.data.test);
      record_evaluation(cfg, epoch, ev, since(te), since(run_t0), world.rank() == 0, m, res);
    }
    reporter->epoch_end(m);
    res.last = m;
  }
  engine->synchronize();
  res.steps = pos.step;
  // A signal that came after the last step changes nothing: the run finished.
  res.stopped_by_signal = pos.epochs_done == cfg.train.epochs ? 0 : stop_signal;
  res.checkpoint = last_checkpoint;
  return res;
}

// Trains epoch `epoch` from pos.step_in_epoch (non-zero after a mid-epoch
// resume); `finished` says whether it reached the epoch's end.
EpochMetrics Trainer::Impl::train_epoch(int epoch, bool& finished) {
  reporter->epoch_start(epoch);
  loader->set_epoch(epoch);
  if (pos.step_in_epoch > 0) loader->skip(pos.step_in_epoch * cfg.train.accumulation);
  double wait0 = loader->wait_seconds();
  EpochStats st;
  auto t0 = Clock::now();
  const std::int64_t spe = steps_per_epoch();
  finished = true;
  for (std::int64_t s = pos.step_in_epoch; s < spe; ++s) {
    if ((cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps) || stop_signal) {
      finished = false;
      break;
    }
    double loss = train_step(st);
    RT_CHECK(std::isfinite(loss), "training diverged: loss is ", loss, " at step ", pos.step,
             " (lower optimizer.lr, or enable warm-up with schedule.warmup_epochs)");
    pos.step_in_epoch = s + 1;
    st.loss_sum += loss;
    ++st.steps;
    if (hooks.on_step) hooks.on_step(pos.step, loss);
    if (cfg.train.verify_every > 0 && pos.step % cfg.train.verify_every == 0) verify_identical_state();
    // checkpoint.every_steps / every_s (agreed in the step's all-reduce); an epoch's end saves below.
    save_due = ckpt.due_after_step(pos.step) || loss_buf.data<float>()[2] > 0;
    if (pos.step_in_epoch < spe && save_due) save_checkpoint(true);
    reporter->step(s + 1, loss, static_cast<double>(global_batch()) * st.steps / since(t0));
  }
  // The epoch's last step may itself carry the stop: the epoch is complete then.
  if (pos.step_in_epoch == spe) finished = true;
  EpochMetrics m;
  m.epoch = epoch;
  m.step = pos.step;
  m.lr = schedule->lr_at(std::max<std::int64_t>(0, pos.step - 1));
  m.time_s = since(t0);
  m.compute_s = st.compute_s;
  m.comm_exposed_s = st.comm_s;
  m.data_wait_s = loader->wait_seconds() - wait0;
  m.skipped_steps = st.skipped;
  m.loss_scale = scaler ? scaler->scale() : 0.0;
  std::vector<double> v = {static_cast<double>(st.correct), static_cast<double>(st.seen)};
  sum_over_ranks(v, world);
  m.train_loss = st.steps ? st.loss_sum / st.steps : 0;
  m.train_accuracy = v[1] > 0 ? v[0] / v[1] : 0;
  m.images_per_s = m.time_s > 0 ? static_cast<double>(global_batch()) * st.steps / m.time_s : 0;
  return m;
}

void Trainer::Impl::verify_identical_state() {
  std::vector<Tensor> ts;
  std::vector<std::string> names;
  for (auto& [name, t] : flat_state(*model, optimizer.get())) {
    names.push_back(name);
    ts.push_back(t);
  }
  verify_identical(ts, world, names);
}

Trainer::Trainer(TrainConfig cfg, Communicator world, TrainerHooks hooks) {
  if (cfg.parallel.pipeline > 1 || cfg.parallel.tensor > 1) {
    cfg_ = cfg;
    pipe_ = std::make_unique<PipelineTrainer>(cfg, world, hooks);
  } else {
    impl_ = std::make_unique<Impl>(std::move(cfg), std::move(world), std::move(hooks));
  }
}
Trainer::~Trainer() = default;

bool Trainer::resume(const std::string& path) { return pipe_ ? pipe_->load(path, true) : impl_->load(path, true); }
std::string Trainer::save_checkpoint() {
  RT_CHECK(!config().checkpoint.dir.empty(), "Trainer::save_checkpoint: checkpoint.dir is not set");
  if (pipe_) return pipe_->save_checkpoint();
  impl_->ckpt.start_run();
  impl_->save_checkpoint(true);
  return impl_->last_checkpoint;
}
LoadedCheckpoint Trainer::load_weights(const std::string& path) {
  if (pipe_) {
    pipe_->load(path, false);
    return pipe_->loaded();
  }
  impl_->load(path, false);
  return impl_->ckpt.loaded();
}
std::size_t Trainer::optimizer_state_bytes() const {
  RT_CHECK(impl_, "Trainer::optimizer_state_bytes(): not available with parallel.pipeline/tensor > 1 yet");
  if (impl_->zero) return impl_->zero->state_bytes();
  std::size_t n = 0;
  for (const auto& [name, t] : impl_->optimizer->state()) n += t.nbytes();
  return n;
}
TrainResult Trainer::fit() { return pipe_ ? pipe_->fit() : impl_->fit(); }
EvalResult Trainer::evaluate(const std::string& path) { return pipe_ ? pipe_->evaluate(path) : impl_->evaluate(path); }
const std::string& Trainer::run_id() const { return impl_ ? impl_->pos.run_id : pipe_->run_id(); }
Model& Trainer::model() {
  RT_CHECK(impl_, "Trainer::model(): with parallel.pipeline > 1 the model is split across the pipeline stages");
  return *impl_->model;
}
const TrainConfig& Trainer::config() const { return impl_ ? impl_->cfg : cfg_; }

}  // namespace ringtrain
