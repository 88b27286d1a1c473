#include "ringtrain/train/trainer.hpp"

#include <omp.h>
#include <xmmintrin.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
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
#include "ringtrain/train/state.hpp"
#include "pipeline_trainer.hpp"

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

int choose_threads(const TrainConfig& cfg) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  if (const char* v = std::getenv("OMP_NUM_THREADS")) return std::max(1, std::atoi(v));
  return 1;
}

// Sums doubles over ranks (metrics at epoch ends; not on the step's hot path).
void sum_over_ranks(std::vector<double>& v, const Communicator& comm) {
  allreduce(v.data(), v.data(), v.size(), DType::f64, ReduceOp::sum, comm);
}

}  // namespace

struct Trainer::Impl {
  TrainConfig cfg;
  Communicator world;
  TrainerHooks hooks;
  Device device;
  DeviceRuntime* rt = nullptr;  // the device's optimizer, fusion ops and gradient operations
  MathMode math = MathMode::fp32;
  std::unique_ptr<LossScaler> scaler;  // train.precision = fp16 only
  Tensor scaler_state;                 // f64 [4] on the host: checkpointed and broadcast
  std::unique_ptr<data::Loader> loader;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<Engine> engine;
  std::unique_ptr<Reporter> reporter;
  Tensor loss_buf;              // [1] f32 on the host: the step's loss, averaged beside the gradients
  Tensor dlogits;               // reused across steps
  std::vector<Handle> handles;  // this step's outstanding all-reduces
  // comm.deterministic: static buckets of consecutive parameters, in backward order.
  struct Bucket {
    Tensor grads;                // flat view of the arena's gradients
    std::size_t params = 0;      // parameters in it
    std::size_t pending = 0;     // not yet ready this step
  };
  std::vector<Bucket> buckets;
  std::vector<int> bucket_of;    // parameter index -> bucket
  RunPosition pos;              // epochs done and optimizer steps taken

  // Per-epoch counters of this rank.
  struct EpochStats {
    double loss_sum = 0, compute_s = 0, comm_s = 0;
    std::int64_t steps = 0, correct = 0, seen = 0, skipped = 0;
  };

  Impl(TrainConfig c, Communicator w, TrainerHooks h) : cfg(std::move(c)), world(std::move(w)), hooks(std::move(h)) {
    cfg.validate();
    device = choose_device(cfg, world);
    rt = &device_runtime(device.kind);
    math = parse_math_mode(cfg.train.precision);
    if (math == MathMode::fp16) {
      scaler = std::make_unique<LossScaler>();
      scaler_state = Tensor::zeros({4}, DType::f64);
    }
    omp_set_num_threads(choose_threads(cfg));
    // Flush denormals to zero (FTZ+DAZ) on the compute thread, as DL frameworks
    // do: tiny gradients late in training otherwise cost ~100 cycles per
    // operation in microcode assists (measured ~15% of a `cnn` step here).
    _mm_setcsr(_mm_getcsr() | 0x8040);
    open_loader();
    build_model();
    build_optimizer();
    build_engine();
    pos.ranks = world.size();
    pos.seed = static_cast<std::int64_t>(cfg.train.seed);
    broadcast_state();
  }

  void open_loader() {
    data::LoaderOptions lo;
    run_agreed(world, "opening the training data", [&] { lo.files = data::find_split_files(cfg.data.train, "train"); });
    lo.batch_size = cfg.data.batch_size;
    lo.seed = cfg.train.seed;
    lo.tail = cfg.data.drop_last ? data::TailPolicy::drop_last : data::TailPolicy::pad;
    lo.prefetch_depth = cfg.data.prefetch;
    lo.mpio = cfg.data.mpi_io;
    if (cfg.data.augment) lo.augment = data::Augment{2, true};
    loader = std::make_unique<data::Loader>(lo, world);
    RT_CHECK(loader->steps_per_epoch() >= cfg.train.accumulation, "data.train '", cfg.data.train, "' gives ",
             loader->steps_per_epoch(), " micro-batches per epoch, fewer than train.accumulation = ",
             cfg.train.accumulation);
  }

  void build_model() {
    const auto& info = loader->info();
    ModelConfig mc;
    mc.name = cfg.model.name;
    mc.in_channels = info.channels;
    mc.height = info.height;
    mc.width = info.width;
    mc.classes = info.num_classes;
    mc.depth = cfg.model.depth;
    mc.base_width = cfg.model.width;
    mc.dropout = cfg.model.dropout;
    mc.heads = cfg.model.heads;
    mc.mlp_ratio = cfg.model.mlp_ratio;
    mc.patch = cfg.model.patch;
    mc.seed = cfg.train.seed;
    mc.math = math;
    model = ringtrain::build_model(mc, device);
    loss_buf = Tensor::zeros({1}, DType::f32);
  }

  void build_optimizer() {
    OptimizerConfig oc;
    oc.name = cfg.optimizer.name;
    oc.momentum = cfg.optimizer.momentum;
    oc.nesterov = cfg.optimizer.nesterov;
    oc.weight_decay = cfg.optimizer.weight_decay;
    oc.beta1 = cfg.optimizer.beta1;
    oc.beta2 = cfg.optimizer.beta2;
    oc.eps = cfg.optimizer.eps;
    oc.trust_coefficient = cfg.optimizer.trust_coefficient;
    optimizer = rt->make_optimizer(model->arena(), oc);

    ScheduleConfig sc;
    sc.name = cfg.schedule.name;
    sc.lr = cfg.optimizer.lr;
    sc.linear_scaling = cfg.schedule.scale_lr;
    sc.global_batch = global_batch();
    sc.warmup = cfg.schedule.warmup_epochs;
    sc.step_size = cfg.schedule.step_epochs;
    sc.gamma = cfg.schedule.gamma;
    sc.min_lr = cfg.schedule.min_lr;
    schedule = std::make_unique<LrSchedule>(sc, steps_per_epoch(), total_steps());
  }

  void build_engine() {
    EngineOptions eo;
    eo.fusion_threshold = static_cast<std::size_t>(cfg.comm.fusion_threshold);
    eo.cycle_time_ms = cfg.comm.cycle_time_ms;
    eo.fp16_allreduce = cfg.comm.fp16_allreduce;
    eo.timeline = cfg.comm.timeline;
    eo.stall_warning_s = cfg.comm.stall_warning_s;
    eo.stall_shutdown_s = cfg.comm.stall_shutdown_s;
    eo.collective.algorithm = parse_algorithm(cfg.comm.algorithm);
    eo.device_ops = rt->fusion_ops(device);
    eo = EngineOptions::from_env(eo);
    if (cfg.comm.deterministic) {
      make_buckets();
      eo.fusion_threshold = 0;  // each bucket is its own all-reduce: composition never varies
    }
    engine = std::make_unique<Engine>(world, eo);
  }

  // Buckets: walk parameters from the last (first ready in backward) to the
  // first, closing a bucket once it holds bucket_bytes. Parameters of one dtype
  // are contiguous in the arena, so each bucket is one zero-copy span.
  void make_buckets() {
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
  void on_grads_ready(std::span<const std::size_t> params) {
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

  // Everything a checkpoint holds: model_state plus the loss scaler's state.
  NamedTensorList run_state() {
    NamedTensorList s = model_state(*model, optimizer.get());
    if (scaler) {
      scaler->save(scaler_state.data<double>());
      s.emplace_back("amp.loss_scale", scaler_state);
    }
    return s;
  }

  // Every rank continues from rank 0's parameters, buffers and optimizer state.
  void broadcast_state() {
    std::vector<Tensor> ts;
    for (auto& [name, t] : run_state()) ts.push_back(t);
    broadcast_tensors(ts, 0, world);
    if (scaler) scaler->load(scaler_state.data<double>());
  }

  std::int64_t global_batch() const {
    return static_cast<std::int64_t>(cfg.data.batch_size) * world.size() * cfg.train.accumulation;
  }
  std::int64_t steps_per_epoch() const { return loader->steps_per_epoch() / cfg.train.accumulation; }
  // The schedule spans the configured epochs; train.max_steps only stops early
  // (so a run cut short follows the same learning rates as the full one).
  std::int64_t total_steps() const { return steps_per_epoch() * cfg.train.epochs; }

  // One optimizer step:
  //   for each micro-batch: forward, loss, backward — the last backward hands each
  //   layer's gradients to the engine as soon as they exist (overlap);
  //   wait for the averaged gradients; (fp16: unscale, skip the step on inf/NaN);
  //   optimizer step with the scheduled lr.
  // Returns the loss averaged over ranks and micro-batches.
  double train_step(EpochStats& st) {
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
        if (last && !hooks.skip_allreduce) on_grads_ready(params);
      });
      st.compute_s += since(t0);
    }
    loss_buf.fill_(local_loss / k);  // rides along, fused with the gradients
    handles.push_back(engine->allreduce_async("loss", loss_buf));

    auto tw = Clock::now();
    for (auto& h : handles) engine->wait(h);
    handles.clear();
    st.comm_s += since(tw);

    auto to = Clock::now();
    // The gradients are identical on every rank here, so every rank takes the same decision.
    bool take = !scaler || scaler->update(rt->unscale_grads(model->arena(), scaler->inv_scale()));
    if (take) {
      if (cfg.optimizer.clip_norm > 0) rt->clip_grad_norm(model->arena(), cfg.optimizer.clip_norm);
      optimizer->step(schedule->lr_at(pos.step));
    } else {
      ++st.skipped;
    }
    ++pos.step;  // the schedule advances either way (as PyTorch's scheduler.step())
    st.compute_s += since(to);
    return loss_buf.data<float>()[0];
  }

  EvalResult evaluate(const std::string& path) {
    data::LoaderOptions lo;
    std::int64_t n = 0;
    run_agreed(world, "opening the test data", [&] {
      lo.files = data::find_split_files(path, "test");
      for (auto& f : lo.files) n += data::read_file_info(f).count;
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

  TrainResult fit() {
    TrainResult res;
    std::string metrics = cfg.log.metrics;
    if (metrics.empty() && !cfg.checkpoint.dir.empty()) metrics = cfg.checkpoint.dir + "/metrics.jsonl";
    reporter = std::make_unique<Reporter>(world.rank() == 0 && hooks.report, cfg.log.format, cfg.log.interval,
                                          hooks.report ? metrics : "", cfg.train.epochs, steps_per_epoch());
    if (world.rank() == 0 && hooks.report) {
      log::info("ringtrain: ", cfg.model.name, " (", model->num_params(), " parameters) on ", world.size(),
                " rank(s), ", device.str(), ", ", cfg.train.precision, ", batch ", cfg.data.batch_size, "/rank (global ", global_batch(),
                "), ", steps_per_epoch(), " steps/epoch, all-reduce ", cfg.comm.algorithm);
      nlohmann::json head = {{"event", "start"}, {"model", cfg.model.name}, {"params", model->num_params()},
                             {"ranks", world.size()}, {"device", device.str()}, {"precision", cfg.train.precision}, {"global_batch", global_batch()},
                             {"steps_per_epoch", steps_per_epoch()}, {"config", cfg.to_toml()}};
      reporter->json_line(head.dump());
    }
    auto run_t0 = Clock::now();
    for (int epoch = static_cast<int>(pos.epochs_done); epoch < cfg.train.epochs; ++epoch) {
      if (cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps) break;
      EpochMetrics m = train_epoch(epoch);
      if (hooks.evaluate) {
        auto te = Clock::now();
        EvalResult ev = evaluate(cfg.data.test);
        m.evaluated = true;
        m.test_loss = ev.loss;
        m.test_accuracy = ev.accuracy;
        m.eval_s = since(te);
        res.best_test_accuracy = std::max(res.best_test_accuracy, ev.accuracy);
        if (cfg.train.target_accuracy > 0 && res.target_epoch < 0 && ev.accuracy >= cfg.train.target_accuracy) {
          res.target_epoch = epoch + 1;
          res.target_time_s = since(run_t0);
          if (world.rank() == 0)
            log::info("reached test accuracy ", 100 * ev.accuracy, "% >= target ", 100 * cfg.train.target_accuracy,
                      "% at epoch ", epoch + 1, " after ", res.target_time_s, " s");
        }
      }
      reporter->epoch_end(m);
      pos.epochs_done = epoch + 1;
      save_checkpoint();
      res.last = m;
    }
    engine->synchronize();
    res.steps = pos.step;
    return res;
  }

  EpochMetrics train_epoch(int epoch) {
    reporter->epoch_start(epoch);
    loader->set_epoch(epoch);
    double wait0 = loader->wait_seconds();
    EpochStats st;
    auto t0 = Clock::now();
    const std::int64_t spe = steps_per_epoch();
    for (std::int64_t s = 0; s < spe; ++s) {
      if (cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps) break;
      double loss = train_step(st);
      RT_CHECK(std::isfinite(loss), "training diverged: loss is ", loss, " at step ", pos.step,
               " (lower optimizer.lr, or enable warm-up with schedule.warmup_epochs)");
      st.loss_sum += loss;
      ++st.steps;
      if (hooks.on_step) hooks.on_step(pos.step, loss);
      if (cfg.train.verify_every > 0 && pos.step % cfg.train.verify_every == 0) verify_identical_state();
      reporter->step(s + 1, loss, static_cast<double>(global_batch()) * (s + 1) / since(t0));
    }
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

  void verify_identical_state() {
    std::vector<Tensor> ts;
    std::vector<std::string> names;
    for (auto& [name, t] : run_state()) {
      names.push_back(name);
      ts.push_back(t);
    }
    verify_identical(ts, world, names);
  }

  void save_checkpoint() {
    if (cfg.checkpoint.dir.empty()) return;
    int done = static_cast<int>(pos.epochs_done);
    if (done % cfg.checkpoint.every_epochs != 0 && done != cfg.train.epochs) return;
    std::string path;
    run_on_root(world, "writing a checkpoint", [&] {
      CheckpointDir dir(cfg.checkpoint.dir, cfg.checkpoint.keep);
      CheckpointData d = make_checkpoint(*model, optimizer.get(), cfg, pos);
      d.tensors = run_state();
      path = dir.save(done, d);
    });
    if (world.rank() == 0) log::info("checkpoint written: ", path);
  }

  // Rank 0 reads the checkpoint and broadcasts; an unreadable file is an error on every rank.
  void load(const std::string& path, bool with_optimizer) {
    std::int64_t scalars[4] = {0, 0, 0, 0};
    run_on_root(world, "loading a checkpoint", [&] {
      std::string file = path;
      if (std::filesystem::is_directory(path)) {
        file = CheckpointDir(path, 1).latest();
        RT_CHECK(!file.empty(), "no checkpoint (ckpt-*.h5) in directory '", path, "'");
      }
      CheckpointData ck = read_checkpoint(file);
      RunPosition p = restore_checkpoint(ck, *model, with_optimizer ? optimizer.get() : nullptr);
      // The loss scale continues where it was (a checkpoint of an fp32 run has none: start afresh).
      bool has_amp = false;
      for (auto& [name, t] : ck.tensors) has_amp |= name == "amp.loss_scale";
      if (scaler && with_optimizer && has_amp) {
        restore_tensor(ck, "amp.loss_scale", scaler_state);
        scaler->load(scaler_state.data<double>());
      }
      scalars[0] = p.epochs_done;
      scalars[1] = p.step;
      scalars[2] = p.ranks;
      log::info("loaded checkpoint ", file, " (epoch ", p.epochs_done, ", step ", p.step, ")");
    });
    broadcast(scalars, 4, DType::i64, 0, world);
    broadcast_state();
    if (with_optimizer) {
      RT_CHECK(scalars[2] == world.size(), "checkpoint '", path, "' was written by ", scalars[2],
               " ranks; resuming bit-exactly needs the same rank count (", world.size(),
               " now); use `eval`, or start a new run from its weights");
      pos.epochs_done = scalars[0];
      pos.step = scalars[1];
    }
  }
};

Trainer::Trainer(TrainConfig cfg, Communicator world, TrainerHooks hooks) {
  if (cfg.parallel.pipeline > 1 || cfg.parallel.tensor > 1) {
    cfg_ = cfg;
    pipe_ = std::make_unique<PipelineTrainer>(cfg, world, hooks);
  } else {
    impl_ = std::make_unique<Impl>(std::move(cfg), std::move(world), std::move(hooks));
  }
}
Trainer::~Trainer() = default;

void Trainer::resume(const std::string& path) { pipe_ ? pipe_->load(path, true) : impl_->load(path, true); }
void Trainer::load_weights(const std::string& path) { pipe_ ? pipe_->load(path, false) : impl_->load(path, false); }
TrainResult Trainer::fit() { return pipe_ ? pipe_->fit() : impl_->fit(); }
EvalResult Trainer::evaluate(const std::string& path) { return pipe_ ? pipe_->evaluate(path) : impl_->evaluate(path); }
Model& Trainer::model() {
  RT_CHECK(impl_, "Trainer::model(): with parallel.pipeline > 1 the model is split across the pipeline stages");
  return *impl_->model;
}
const TrainConfig& Trainer::config() const { return impl_ ? impl_->cfg : cfg_; }

}  // namespace ringtrain
