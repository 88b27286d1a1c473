#include "ringtrain/train/trainer.hpp"
#include "ringtrain/train/trace_file.hpp"

#include <omp.h>

#include <chrono>
#include <csignal>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/engine/engine.hpp"
#include "ringtrain/parallel/device_runtime.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/loss_scale.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/schedule.hpp"
#include "ringtrain/parallel/simulator.hpp"
#include "ringtrain/core/device_module.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/gpu_gate.hpp"
#include "ringtrain/train/interop.hpp"
#include "ringtrain/train/signals.hpp"
#include "ringtrain/train/state.hpp"
#include "run_options.hpp"
#include "run_state.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// One device kind for the whole job: "auto" takes CUDA only if every rank has
// a GPU and the GPU validation gate lets the job run there (train/gpu_gate.hpp);
// "cuda" without one is an error on every rank. Each rank then binds to
// its GPU by node-local rank before any other CUDA work. The CUDA module is
// loaded only for "cuda", or for "auto" where an NVIDIA driver is present: a
// CPU rank never maps the GPU libraries (core/device_module.hpp).
Device choose_device(const TrainConfig& cfg, const Communicator& world, const std::vector<std::string>& trial) {
  // The gate reads only the configuration, so every rank decides alike without a message.
  const std::string gated = cfg.train.device == "auto" ? gpu_gate_refusal(cfg, trial) : "";
  if (!gated.empty() && device_driver_present(DeviceKind::cuda)) {
    if (world.rank() == 0) log::warn("train.device = auto: training on the CPU: ", gated);
  } else if (cfg.train.device == "cuda") {
    run_agreed(world, "loading the CUDA backend", [] {
      try {
        load_device_module(DeviceKind::cuda);
      } catch (const Error& e) {  // a build or install without the module: name the key that asked for it
        RT_FAIL("train.device = cuda: ", e.what());
      }
    });
  } else if (cfg.train.device == "auto" && device_driver_present(DeviceKind::cuda)) {
    try {
      load_device_module(DeviceKind::cuda);
    } catch (const Error& e) {
      log::warn("train.device = auto: an NVIDIA driver is present but ", e.what(), "; training on the CPU");
    }
  }
  int have = has_device_runtime(DeviceKind::cuda) ? 1 : 0;
  allreduce(&have, &have, 1, DType::i32, ReduceOp::min, world);
  run_agreed(world, "choosing the device", [&] {
    RT_CHECK(cfg.train.device != "cuda" || has_device_runtime(DeviceKind::cuda),
             "train.device = cuda, but rank ", world.rank(), " has no CUDA device "
             "(was ringtrain built with CUDA, and does this node have a GPU?)");
  });
  if (cfg.train.device == "cpu" || !have || !gated.empty()) return Device::cpu();
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
  // What an imported file says about the model's function (GPT-2: tanh GELU) becomes configuration.
  std::string imported;
  run_agreed(world, "reading model.init_from", [&] { imported = apply_imported_settings(cfg); });
  if (!imported.empty() && world.rank() == 0 && hooks.report) log::info("model.init_from sets ", imported);
  cfg.validate();
  trace_window = trace::parse_window(cfg.log.trace_steps);
  if (cfg.train.device == "cuda") check_gpu_gate(cfg, hooks.gpu_trial);  // before any rank waits: alike on every rank
  if (!hooks.gpu_trial.empty() && world.rank() == 0)
    log::warn("GPU trial (tests only): running features the GPU validation gate does not list yet");
  // Recording starts before the grid's communicators are made (the first configuration of a process holds).
  flight_recorder::configure(!cfg.comm.flight_recorder_dir.empty() ? cfg.comm.flight_recorder_dir
                             : cfg.checkpoint.dir.empty()          ? std::string()
                                                                   : cfg.checkpoint.dir + "/flight_recorder",
                             static_cast<std::size_t>(cfg.comm.flight_recorder));
  // Every communicator of the run, the trainer's own included, waits at most comm.collective_timeout_s.
  GridShape shape{cfg.mesh_shape()};
  run_agreed(world, "reading parallel.schedule", [&] {  // how many model chunks a pipeline rank holds, and where
    const PipelineLayout pl = schedule_layout(parse_schedule(cfg.parallel.schedule), cfg.parallel.schedule,
                                              cfg.parallel.pipeline, cfg.parallel.virtual_stages);
    shape.chunks = pl.chunks;
    shape.placement = pl.placement;
  });
  grid = std::make_unique<ProcessGrid>(ProcessGrid::make(world, shape, cfg.comm.collective_timeout_s));
  world = grid->world();
  ckpt.create_dir();
  derive_batch(cfg, grid->dp_size());  // data.global_batch: this layout's batch and accumulation
  for (int i = 0; i < kMeshDims; ++i)  // the model-parallel dimensions in use ("" at data parallelism alone)
    if (dim_at(i) != Dim::data && !kDims[i].carved_from_data && grid->mesh().size(dim_at(i)) > 1)
      layout += cat(layout.empty() ? "" : " with ", kDims[i].key, " = ", grid->mesh().size(dim_at(i)));
  if (!layout.empty()) log::set_prefix(cat("[rank ", world.rank(), " ", grid->tag().substr(1), " "));
  device = choose_device(cfg, world, hooks.gpu_trial);
  rt = &device_runtime(device.kind);
  omp_set_num_threads(compute_threads(cfg));
  warn_thread_oversubscription(compute_threads(cfg), world);
  flush_denormals();
  open_loader();
  // The test split is checked now, not after an epoch of training.
  run_agreed(world, "checking the data files",
             [&] { run_state::check_data_files(cfg, loader->info(), hooks.evaluate); });
  build_model();
  if (!cfg.model.init_from.empty()) init_from_file();
  ckpt.describe_run(num_params, grid->pp_size(), grid->tp_size(), grid->dp_size(), steps_per_epoch());
  parts.state->broadcast();  // one source of truth: each replica starts from data-parallel rank 0's
  schedule = std::make_unique<LrSchedule>(schedule_config(cfg, global_batch()), steps_per_epoch(), total_steps());
}

void Trainer::Impl::init_from_file() {
  ModelState::Restoration state = parts.state->restoration(false);
  std::vector<ReadTarget> ts;
  for (auto& p : state.pieces) ts.push_back({p.name, p.data, p.place});
  ImportStats st;
  const auto t0 = Clock::now();
  run_agreed(world, "model.init_from", [&] {
    // Unused file tensors are found where this rank sees every parameter: one stage, no ZeRO-3 slices.
    st = import_safetensors(cfg.model.init_from, cfg.model.name, ts, grid->pp_size() == 1 && cfg.parallel.zero < 3);
  });
  state.finish();
  if (world.rank() == 0 && hooks.report)
    log::info("model.init_from '", cfg.model.init_from, "': rank 0 read ", st.bytes, " bytes in ", st.reads,
              " reads (", since(t0), " s)");
}

// Every stage of a replica opens the loader over the data-parallel group, so
// all of them see the same batches; the first uses the images, the last the labels.
void Trainer::Impl::open_loader() {
  loader = open_train_loader(cfg, dp());
  RT_CHECK(loader->steps_per_epoch() >= cfg.train.accumulation, "data.train '", cfg.data.train, "' gives ",
           loader->steps_per_epoch(), " micro-batches per epoch, fewer than train.accumulation = ",
           cfg.train.accumulation);
}

void Trainer::Impl::build_model() {
  ModelConfig mc = model_config(cfg, loader->info());
  mc.math = parse_math_mode(cfg.train.precision);
  for (const LayerPlan& l : plan_model_layers(mc)) num_params += l.numel;  // the whole model, never built here
  if (mc.seq_len > 0 && device.is_cpu()) {  // language models report MFU against every rank's measured peak
    flops_per_sample = model_flops_per_sample(mc);
    std::vector<double> peak = {matmul_peak_flops(device)};
    sum_over_ranks(peak, world);
    matmul_peak = peak[0];
  }
  if (!device.is_cpu() && hooks.gpu_float32_storage) {
    mc.storage16 = false;
  } else if (!device.is_cpu() && !gpu_storage16_allowed(cfg, hooks.gpu_trial)) {
    // A default never refuses a common job: 16-bit arithmetic on float32 activations has run on a GPU.
    mc.storage16 = false;
    if (world.rank() == 0)
      log::info("train.precision = ", cfg.train.precision, " on CUDA: activations stay float32 (", cfg.train.precision,
                " arithmetic); ", gpu_storage16_feature(cfg),
                " has not run on a GPU yet (the GPU validation gate, docs/gpu.md)");
  }
  GridConfig pc;
  pc.micro_batches = cfg.pipeline_micro_batches();
  pc.accumulation = cfg.train.accumulation;
  pc.schedule = parse_schedule(cfg.parallel.schedule);
  if (pc.schedule == ScheduleKind::file) pc.schedule_file = cfg.parallel.schedule;
  pc.virtual_stages = cfg.parallel.virtual_stages;
  pc.partition = parse_partition(cfg.parallel.partition);
  if (pc.partition == PartitionKind::list) pc.balance = parse_balance(cfg.parallel.balance);
  pc.batch = cfg.data.batch_size;
  pc.engine = engine_options(cfg);
  pc.deterministic = cfg.comm.deterministic;
  pc.bucket_bytes = cfg.comm.bucket_bytes;
  pc.update.clip_norm = cfg.optimizer.clip_norm;
  pc.update.loss_scaling = mc.math == MathMode::fp16;
  pc.update.zero = cfg.parallel.zero;
  pc.zero_release = cfg.parallel.zero_release;
  pc.update.zero_collectives = collective_options(cfg);
  pc.skip_allreduce = hooks.skip_allreduce;
  pc.recompute = parse_recompute(cfg.train.recompute);
  if (cfg.parallel.link_latency_us >= 0)  // given: neither auto nor the epoch's prediction measures it
    pipeline_link = {1e-6 * cfg.parallel.link_latency_us, 1e9 * cfg.parallel.link_gbytes_per_s};
  if (pc.schedule == ScheduleKind::automatic) choose_schedule(mc, pc);
  schedule_kind = pc.schedule;
  parts = build_parts(*grid, mc, pc, optimizer_config(cfg), device, rt);
  if (parts.updater->scaler()) scaler_state = Tensor::zeros({4}, DType::f64);
  const ShardedOptimizer* zero = parts.updater->zero();
  if (zero && world.rank() == 0 && hooks.report) {
    const auto [per_rank, unsharded] = zero->state_bytes_summary();
    log::info("ZeRO-", cfg.parallel.zero, ": optimizer '", cfg.optimizer.name, "' state ", per_rank, " bytes per rank (largest slice) over ",
              grid->dp_size(), " data-parallel rank(s); unsharded ", unsharded, " bytes");
  } else if (zero) {
    zero->state_bytes_summary();  // collective
  }
}

std::int64_t Trainer::Impl::global_batch() const {
  return static_cast<std::int64_t>(cfg.data.batch_size) * grid->dp_size() * cfg.train.accumulation;
}
std::int64_t Trainer::Impl::steps_per_epoch() const { return loader->steps_per_epoch() / cfg.train.accumulation; }
// The schedule spans the configured epochs; train.max_steps only stops early
// (so a run cut short follows the same learning rates as the full one).
std::int64_t Trainer::Impl::total_steps() const { return steps_per_epoch() * cfg.train.epochs; }

// One optimizer step on every layout: read train.accumulation batches, then
// the step of parallel/parts.hpp (schedule, gradient synchronisation, update,
// statistics). The stop flag, a due checkpoint and the durability of a
// checkpoint's parts ride in the statistics' one small all-reduce.
double Trainer::Impl::train_step(EpochStats& st) {
  std::vector<Tensor> images, labels;
  for (int micro = 0; micro < cfg.train.accumulation; ++micro) {
    trace::Scope read("data", "read batch", micro);
    std::optional<data::Batch> b = loader->next();
    RT_CHECK(b.has_value(), "training data ended inside an optimizer step");
    // A batch views the loader's buffer until the next next(): keep copies of all but the last.
    const bool last = micro + 1 == cfg.train.accumulation;
    images.push_back(last ? b->images : b->images.clone());
    labels.push_back(last ? b->labels : b->labels.clone());
  }
  auto t0 = Clock::now();  // reading the batches is data wait, counted by the loader
  const int mine = hooks.stop_signal ? hooks.stop_signal() : 0;
  if (hooks.in_step) hooks.in_step(pos.step);
  const StepInput in{std::move(images), std::move(labels), pos.step, schedule->lr_at(pos.step),
                     parts.updater->loss_scale()};
  const StepResult r = ringtrain::train_step(*grid, parts, in, {mine != 0, ckpt.time_due(), ckpt.part_ready()});
  st.compute_s += since(t0) - r.timing.reduce_s - r.timing.wait_s();
  st.comm_s += r.timing.reduce_s;
  st.pipeline_wait_s += r.timing.wait_s();
  if (pos.step > 0 && grid->pp_size() > 1) {
    st.chunks.resize(r.timing.chunks.size());
    for (std::size_t k = 0; k < st.chunks.size(); ++k) st.chunks[k].add(r.timing.chunks[k]);
    st.schedule_s += r.timing.schedule_s;
    if (st.step_chunks.size() < EpochStats::kStepsKept) {
      st.step_chunks.push_back(r.timing.chunks);
      st.step_s.push_back(r.timing.schedule_s);
    } else {
      const auto k = static_cast<std::size_t>(st.timed) % EpochStats::kStepsKept;
      st.step_chunks[k] = r.timing.chunks;
      st.step_s[k] = r.timing.schedule_s;
    }
    ++st.timed;
    if (replan_phase < 2 && cfg.parallel.replan_steps > 0) replan_step(st, r.timing.schedule_s, r.timing.chunks);
  }
  st.correct += r.stats.correct;
  st.seen += r.stats.samples;
  st.skipped += r.stats.skipped ? 1 : 0;
  ++pos.step;  // the schedule advances either way (as PyTorch's scheduler.step())
  save_due = r.save();
  ckpt.after_step(r.checkpoint_ready());  // every rank's part of a checkpoint durable: rank 0 commits it
  if (r.stop() && !stop_signal) {
    // Every rank sees the same flag: all stop after this step. -1: the signal reached another rank.
    stop_signal = mine ? mine : -1;
    if (mine && world.rank() != 0)
      log::warn("rank ", world.rank(), " received ", StopSignals::name(mine), ": every rank stops after step ", pos.step);
  }
  return r.loss();
}

EvalResult Trainer::Impl::evaluate(const std::string& path) {
  data::LoaderOptions lo;
  std::int64_t n = 0, per = 1;  // samples, and targets per sample (a language model's tokens)
  run_agreed(world, "opening the test data", [&] {
    try {
      lo.files = data::find_split_files(path, "test");
      for (auto& f : lo.files) n += data::read_file_info(f).count;
      if (data::read_file_info(lo.files.front()).tokens()) {
        n = data::token_windows(n, cfg.data.seq_len);
        per = cfg.data.seq_len;
        RT_CHECK(n >= 1, lo.files.front(), ": data.seq_len = ", cfg.data.seq_len, " is longer than the data");
      }
    } catch (const Error& e) {
      RT_FAIL("data.test = '", path, "': ", e.what());
    }
  });
  lo.seq_len = cfg.data.seq_len;
  // Every sample exactly once: no shuffle, padded tail excluded through Batch::valid.
  lo.batch_size = std::max<std::int64_t>(1, std::min<std::int64_t>(256, n / grid->dp_size()));
  lo.shuffle = false;
  lo.tail = data::TailPolicy::pad;
  lo.seed = cfg.train.seed;
  data::Loader test(lo, dp());
  double loss_sum = 0;
  std::int64_t correct = 0, count = 0;
  const bool counts = grid->last_stage() && grid->tp_rank() == 0 && grid->cp_rank() == 0;  // the logits' owner speaks for the replica
  while (auto b = test.next()) {
    auto [l, c] = parts.executor->evaluate(*parts.stage, *parts.loss, b->images, b->labels, b->valid);
    loss_sum += l;
    correct += c;
    if (counts) count += b->valid * per;
  }
  std::vector<double> v = {loss_sum, static_cast<double>(correct), static_cast<double>(count)};
  sum_over_ranks(v, world);
  RT_CHECK(v[2] == static_cast<double>(n * per), "evaluation saw ", v[2] / per, " samples of ", n);
  return {v[0] / v[2], v[1] / v[2], static_cast<std::int64_t>(v[2] / per)};
}

void Trainer::Impl::finish_trace() {
  std::string path = cfg.log.trace;
  if (path.empty()) path = cfg.checkpoint.dir.empty() ? "trace.json" : cfg.checkpoint.dir + "/trace.json";
  const std::size_t spans = write_trace(path, world, cat(cfg.model.name, ", steps ", cfg.log.trace_steps));
  if (world.rank() == 0 && hooks.report)
    log::info("trace of steps ", cfg.log.trace_steps, ": ", spans, " spans of ", world.size(), " ranks in ", path,
              " (open it in chrome://tracing or ui.perfetto.dev)");
}

TrainResult Trainer::Impl::fit() {
  TrainResult res;
  ckpt.start_run();  // a fresh run's id; stale temporary files of this run removed
  ckpt.memory_start();
  prepare_snapshot();
  start_reporting();
  auto run_t0 = Clock::now();
  auto limit_hit = [&] { return cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps; };
  for (int epoch = static_cast<int>(pos.epochs_done); epoch < cfg.train.epochs; ++epoch) {
    if (limit_hit()) break;
    bool finished = false;
    EpochMetrics m = train_epoch(epoch, finished);
    if (!finished) {
      // Stopped inside the epoch (train.max_steps or a signal): save the exact position; the
      // partial epoch's metrics are the run's last.
      res.last = m;
      save_checkpoint(true);
      ckpt.finish();  // exit 75 only once the file is durable
      if (stop_signal) ckpt.announce_stop(stop_signal, pos.step_in_epoch, steps_per_epoch(), last_checkpoint);
      break;
    }
    pos.epochs_done = epoch + 1;
    pos.step_in_epoch = 0;
    memory_snapshot();
    // A signal carried by the epoch's last step: stop now, before evaluating.
    const bool stopping = stop_signal != 0 && pos.epochs_done < cfg.train.epochs;
    // Save before evaluating: a problem in the test data must not cost the epoch.
    save_checkpoint(stopping || limit_hit() || pos.epochs_done == cfg.train.epochs || save_due);
    if (stopping) {
      ckpt.finish();
      reporter->epoch_end(m);
      res.last = m;
      ckpt.announce_stop(stop_signal, 0, steps_per_epoch(), last_checkpoint);
      break;
    }
    if (hooks.evaluate) {
      ckpt.commit_parts();  // the epoch stays saved if its evaluation fails
      auto te = Clock::now();
      EvalResult ev = evaluate(cfg.data.test);
      record_evaluation(cfg, epoch, ev, since(te), since(run_t0), world.rank() == 0, m, res);
    }
    reporter->epoch_end(m);
    res.last = m;
  }
  ckpt.finish();  // the last checkpoint is durable before fit() returns
  if (trace::on()) finish_trace();  // the run ended inside the window
  res.steps = pos.step;
  // A signal that came after the last step changes nothing: the run finished.
  res.stopped_by_signal = pos.epochs_done == cfg.train.epochs ? 0 : stop_signal;
  res.checkpoint = last_checkpoint;
  res.checkpoint_stalls_s = checkpoint_stalls_s;
  res.memory_stalls_s = memory_stalls_s;
  res.memory_bytes = ckpt.memory().last_bytes();
  res.memory_helper_s = ckpt.memory().helper_s();
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
  if (!stragglers)
    stragglers = std::make_unique<StragglerMonitor>(cfg.comm.straggler_factor, cfg.log.interval, grid->pp_rank());
  finished = true;
  for (std::int64_t s = pos.step_in_epoch; s < spe; ++s) {
    if ((cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps) || stop_signal) {
      finished = false;
      break;
    }
    const EpochStats before = st;
    const std::int64_t step_no = pos.step + 1;
    if (trace_window.contains(step_no) && !trace::on()) trace::start();
    const auto t_step = trace::Clock::now();
    double loss = train_step(st);
    stragglers->after_step(pos.step, st.compute_s - before.compute_s,
                           st.comm_s + st.pipeline_wait_s - before.comm_s - before.pipeline_wait_s, world, *reporter);
    RT_CHECK(std::isfinite(loss), "training diverged: loss is ", loss, " at step ", pos.step,
             " (lower optimizer.lr, or enable warm-up with schedule.warmup_epochs)");
    pos.step_in_epoch = s + 1;
    st.loss_sum += loss;
    ++st.steps;
    if (hooks.on_step) hooks.on_step(pos.step, loss);
    if (cfg.train.verify_every > 0 && pos.step % cfg.train.verify_every == 0) verify_replicas();
    // checkpoint.every_steps / every_s (agreed in the step's all-reduce); an epoch's end saves below.
    save_due = ckpt.due_after_step(pos.step) || save_due;
    if (pos.step_in_epoch < spe && save_due) save_checkpoint(true);
    if (pos.step_in_epoch < spe) memory_snapshot();  // an epoch's last step: after its end, below
    if (trace::on()) {
      trace::span("step", cat("step ", step_no), t_step, trace::Clock::now());
      if (step_no >= trace_window.last) finish_trace();
    }
    const double rate = static_cast<double>(global_batch()) * st.steps / since(t0);
    StepLive live;
    live.mfu = matmul_peak > 0 ? rate * flops_per_sample / matmul_peak : 0;
    live.peak_bytes = stragglers->last_peak_bytes();
    live.slowest_rank = stragglers->last_slowest().rank;
    live.slowest_slowdown = stragglers->last_slowest().slowdown;
    reporter->step(s + 1, loss, rate, live);
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
  m.pipeline_wait_s = st.pipeline_wait_s;
  predict_schedule(st, m);
  m.data_wait_s = loader->wait_seconds() - wait0;
  m.skipped_steps = st.skipped;
  m.loss_scale = parts.updater->scaler() ? parts.updater->loss_scale() : 0.0;
  const SlowestRank slow = stragglers->epoch(st.compute_s, st.comm_s + st.pipeline_wait_s, world);
  m.slowest_rank = slow.rank;
  m.slowest_slowdown = slow.slowdown;
  m.slowest_wait_fraction = slow.wait_fraction;
  m.straggler = slow.rank >= 0 && cfg.comm.straggler_factor > 0 && slow.slowdown > cfg.comm.straggler_factor;
  m.train_loss = st.steps ? st.loss_sum / st.steps : 0;
  m.train_accuracy = st.seen > 0 ? static_cast<double>(st.correct) / static_cast<double>(st.seen) : 0;
  m.images_per_s = m.time_s > 0 ? static_cast<double>(global_batch()) * st.steps / m.time_s : 0;
  m.tokens_per_sample = loader->info().tokens() ? cfg.data.seq_len : 0;
  m.model_flops_per_s = m.images_per_s * flops_per_sample;
  m.matmul_peak_flops = matmul_peak;
  m.moe = moe_epoch_stats();
  if (parts.moe && grid->ep_size() > 1) {  // exposed (time inside the exchanges' calls) and span, busiest rank each
    double a[2] = {parts.moe->alltoall_wait_s, parts.moe->alltoall_span_s};
    parts.moe->alltoall_wait_s = parts.moe->alltoall_span_s = 0;
    allreduce(a, a, 2, DType::f64, ReduceOp::max, world);
    m.moe_alltoall_s = a[0];
    m.moe_alltoall_span_s = a[1];
  }
  return m;
}

// The MoE layers' records of this epoch (nn/moe.hpp), summed over every rank
// (each records its own micro-batches) for gpt's list of MoE blocks, which
// every rank knows whatever stage it holds.
std::vector<MoeEpochStats> Trainer::Impl::moe_epoch_stats() {
  if (cfg.model.experts == 0 || cfg.model.name != "gpt") return {};
  std::vector<std::string> names;
  for (int i = 0; i < cfg.model.depth; ++i)
    if ((i + 1) % cfg.model.moe_every == 0) names.push_back(cat("blocks.", i, ".moe"));
  // Per layer: forwards, aux, max/mean, dropped, assignments, then E loads.
  const std::size_t E = static_cast<std::size_t>(cfg.model.experts), W = 5 + E;
  std::vector<double> v(W * names.size(), 0.0);
  for (const MoeLayerStats& s : parts.moe ? parts.moe->take() : std::vector<MoeLayerStats>{})
    for (std::size_t i = 0; i < names.size(); ++i)
      if (names[i] == s.name) {
        const double x[5] = {s.forwards, s.aux, s.max_over_mean, s.dropped, s.assignments};
        for (int k = 0; k < 5; ++k) v[W * i + k] += x[k];
        for (std::size_t e = 0; e < std::min(E, s.load.size()); ++e) v[W * i + 5 + e] += s.load[e];
      }
  sum_over_ranks(v, world);
  std::vector<MoeEpochStats> out;
  for (std::size_t i = 0; i < names.size(); ++i) {
    const double* x = &v[W * i];
    if (x[0] == 0) continue;
    // Ranks that see the same tokens (a tensor group) add the same loads: the ratio is unchanged.
    double mx = 0, sum = 0;
    for (std::size_t e = 0; e < E; ++e) mx = std::max(mx, x[5 + e]), sum += x[5 + e];
    out.push_back({names[i], x[1] / x[0], x[2] / x[0], sum > 0 ? mx * double(E) / sum : 0,
                   x[4] > 0 ? x[3] / x[4] : 0});
  }
  return out;
}

// train.verify_every: the replicas of this rank's stage and tensor shard (its
// data-parallel group) hold bitwise-identical parameters, buffers and
// optimizer state, and so do the first and last pipeline stages' copies of a
// tied weight; the job ends naming the tensor otherwise.
void Trainer::Impl::verify_replicas() {
  if (ShardedOptimizer* zero = parts.updater->zero()) zero->materialize();  // ZeRO-3: the parameters whole
  auto verify = [](const NamedState& state, const Communicator& comm) {
    std::vector<Tensor> ts;
    std::vector<std::string> names;
    for (auto& [name, t] : state) {
      names.push_back(name);
      ts.push_back(t);
    }
    verify_identical(ts, comm, names);
  };
  verify(parts.state->replicated(), dp());
  if (grid->pp_size() > 1) verify(parts.state->tied(), grid->ends());
}

Trainer::Trainer(TrainConfig cfg, Communicator world, TrainerHooks hooks)
    : impl_(std::make_unique<Impl>(std::move(cfg), std::move(world), std::move(hooks))) {}
Trainer::~Trainer() { log::set_prefix(""); }

bool Trainer::resume(const std::string& path) { return impl_->load(path, true); }
std::string Trainer::save_checkpoint() {
  RT_CHECK(!config().checkpoint.dir.empty(), "Trainer::save_checkpoint: checkpoint.dir is not set");
  impl_->ckpt.start_run();
  impl_->save_checkpoint(true);
  impl_->ckpt.finish();
  return impl_->last_checkpoint;
}
LoadedCheckpoint Trainer::load_weights(const std::string& path) {
  impl_->load(path, false);
  return impl_->ckpt.loaded();
}
const LoadedCheckpoint& Trainer::loaded() const { return impl_->ckpt.loaded(); }
TrainResult Trainer::fit() { return impl_->fit(); }
EvalResult Trainer::evaluate(const std::string& path) { return impl_->evaluate(path); }
const std::string& Trainer::run_id() const { return impl_->pos.run_id; }
ParamArena& Trainer::parameters() {
  if (ShardedOptimizer* zero = impl_->parts.updater->zero()) zero->materialize();  // ZeRO-3
  return impl_->parts.stage->arena();
}
TrainerMemory Trainer::memory() const {
  const GridMemory g = ringtrain::memory(impl_->parts);
  TrainerMemory m;
  m.params = g.params;
  m.grads = g.grads;
  m.grads_in_flight = g.grads_in_flight;
  m.params_in_flight = g.params_in_flight;
  m.optimizer = g.optimizer;
  m.param_count = g.param_count;
  m.model_param_count = impl_->num_params;
  return m;
}
const TrainConfig& Trainer::config() const { return impl_->cfg; }

}  // namespace ringtrain
