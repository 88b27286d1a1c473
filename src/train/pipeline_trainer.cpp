#include "pipeline_trainer.hpp"

#include "run_options.hpp"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/data/schema.hpp"
#include "ringtrain/optim/schedule.hpp"
#include "ringtrain/parallel/grid_model.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "checkpoint_session.hpp"
#include "run_state.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
}  // namespace

struct PipelineTrainer::Impl {
  TrainConfig cfg;
  Communicator world;
  TrainerHooks hooks;
  ProcessGrid grid;
  std::unique_ptr<data::Loader> loader;
  std::unique_ptr<GridModel> pm;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<Reporter> reporter;
  RunPosition pos;                 // where the run stands (step_in_epoch: exact resume)
  CheckpointSession ckpt{cfg, world, hooks, pos};  // the checkpoint logic both trainers share
  std::string last_checkpoint;     // rank 0
  int stop_signal = 0;
  bool save_due = false;           // the last step asked for a checkpoint (checkpoint.every_steps / every_s)             // agreed stop request: the signal, or -1 when it reached another rank
  std::int64_t num_params = 0;

  Impl(const TrainConfig& c, const Communicator& w, const TrainerHooks& h) : cfg(c), world(w), hooks(h) {
    cfg.validate();
    grid = ProcessGrid::make(world, {cfg.parallel.pipeline, cfg.parallel.tensor});
    log::set_prefix(cat("[rank ", world.rank(), " ", grid.tag().substr(1), " "));
    // Errors name the keys this job set, not always parallel.pipeline.
    std::string layout;
    if (cfg.parallel.pipeline > 1) layout = cat("parallel.pipeline = ", cfg.parallel.pipeline);
    if (cfg.parallel.tensor > 1)
      layout += cat(layout.empty() ? "" : " with ", "parallel.tensor = ", cfg.parallel.tensor);
    RT_CHECK(cfg.train.device != "cuda", "train.device = cuda is not supported with ", layout,
             " yet: the model-parallel trainer runs on the CPU (set train.device = cpu)");
    if (cfg.train.device == "auto" && world.rank() == 0)
      log::info("train.device = auto: ", layout, " runs on the CPU for now");
    RT_CHECK(cfg.train.accumulation == 1, "train.accumulation = ", cfg.train.accumulation, " is not supported with ",
             layout, " yet: use parallel.micro_batches for more micro-batches per step");
    RT_CHECK(cfg.train.precision == "fp32", "train.precision = ", cfg.train.precision, " is not supported with ",
             layout, " yet (fp32 only)");
    omp_set_num_threads(compute_threads(cfg));
    flush_denormals();
    loader = open_train_loader(cfg, grid.dp());
    // The test split is checked now, not after an epoch of training.
    run_agreed(world, "checking the data files",
               [&] { run_state::check_data_files(cfg, loader->info(), hooks.evaluate); });
    ModelConfig mc = model_config(cfg, loader->info());
    GridConfig pc;
    pc.micro_batches = micro_batches();
    pc.schedule = parse_schedule(cfg.parallel.schedule);
    pc.partition = parse_partition(cfg.parallel.partition);
    if (pc.partition == PartitionKind::list) pc.balance = parse_balance(cfg.parallel.balance);
    pc.batch = cfg.data.batch_size;
    pc.clip_norm = cfg.optimizer.clip_norm;
    pc.timeout_s = cfg.comm.collective_timeout_s;
    pc.engine = engine_options(cfg);
    pc.deterministic = cfg.comm.deterministic;
    OptimizerConfig oc = optimizer_config(cfg);
    for (const LayerPlan& l : plan_model_layers(mc)) num_params += l.numel;  // the whole model, never built here
    pm = std::make_unique<GridModel>(grid, mc, pc, oc);
    ckpt.describe_run(num_params, grid.pp_size(), grid.tp_size(), grid.dp_size());
    ckpt.create_dir();

    ScheduleConfig sc = schedule_config(cfg, global_batch());
    schedule = std::make_unique<LrSchedule>(sc, steps_per_epoch(), steps_per_epoch() * cfg.train.epochs);
  }

  // parallel.micro_batches, or one per stage when unset (0).
  int micro_batches() const { return cfg.parallel.micro_batches > 0 ? cfg.parallel.micro_batches : cfg.parallel.pipeline; }
  std::int64_t global_batch() const { return static_cast<std::int64_t>(cfg.data.batch_size) * grid.dp_size(); }
  std::int64_t steps_per_epoch() const { return loader->steps_per_epoch(); }

  EvalResult evaluate(const std::string& path) {
    data::LoaderOptions lo;
    std::int64_t n = 0;
    run_agreed(world, "opening the test data", [&] {
      lo.files = data::find_split_files(path, "test");
      for (auto& f : lo.files) n += data::read_file_info(f).count;
    });
    lo.batch_size = std::max<std::int64_t>(1, std::min<std::int64_t>(256, n / grid.dp_size()));
    lo.shuffle = false;
    lo.tail = data::TailPolicy::pad;
    lo.seed = cfg.train.seed;
    data::Loader test(lo, grid.dp());
    double loss_sum = 0;
    std::int64_t correct = 0, count = 0;
    while (auto b = test.next()) {
      auto [l, c] = pm->eval_batch(b->images, b->labels, b->valid);
      loss_sum += l;
      correct += c;
      if (grid.last_stage()) count += b->valid;
    }
    std::vector<double> v = {loss_sum, static_cast<double>(correct), static_cast<double>(count)};
    if (grid.tp_rank() > 0) v = {0, 0, 0};  // tensor ranks hold the same logits: count them once
    allreduce(v.data(), v.data(), v.size(), DType::f64, ReduceOp::sum, world);
    RT_CHECK(v[2] == static_cast<double>(n), "evaluation saw ", v[2], " samples of ", n);
    return {v[0] / v[2], v[1] / v[2], static_cast<std::int64_t>(v[2])};
  }

  TrainResult fit() {
    TrainResult res;
    std::string metrics = cfg.log.metrics;
    if (metrics.empty() && !cfg.checkpoint.dir.empty()) metrics = cfg.checkpoint.dir + "/metrics.jsonl";
    ckpt.start_run();
    run_on_root(world, "opening log.metrics", [&] {
      if (hooks.report && ckpt.resumed()) ckpt.truncate_metrics(metrics);
    });
    reporter = std::make_unique<Reporter>(world.rank() == 0 && hooks.report, cfg.log.format, cfg.log.interval,
                                          hooks.report ? metrics : "", cfg.train.epochs, steps_per_epoch());
    reporter->set_run(pos.run_id, pos.resumes);
    if (world.rank() == 0 && hooks.report) {
      std::string bal;
      for (int b : pm->balance()) bal += cat(bal.empty() ? "" : ", ", b);
      log::info("ringtrain: ", cfg.model.name, " (", num_params, " parameters) on ", world.size(), " rank(s) = ",
                grid.dp_size(), " DP x ", grid.pp_size(), " PP stages (layers [", bal, "]), schedule ",
                cfg.parallel.schedule, ", batch ", cfg.data.batch_size, "/replica in ",
                cfg.data.batch_size / micro_batches(),
                "-sample micro-batches (global ", global_batch(), "), ", steps_per_epoch(), " steps/epoch, run ",
                pos.run_id, ckpt.resumed() ? cat(" (resume ", pos.resumes, " at epoch ", pos.epochs_done + 1, " step ",
                                                 pos.step_in_epoch, ")") : std::string());
      nlohmann::json head = {{"event", ckpt.resumed() ? "resume" : "start"}, {"model", cfg.model.name},
                             {"params", num_params}, {"ranks", world.size()}, {"pipeline", grid.pp_size()},
                             {"tensor", grid.tp_size()}, {"data_parallel", grid.dp_size()},
                             {"schedule", cfg.parallel.schedule}, {"global_batch", global_batch()},
                             {"steps_per_epoch", steps_per_epoch()}, {"epochs_done", pos.epochs_done},
                             {"step", pos.step}, {"config", cfg.to_toml()}};
      reporter->json_line(head);
    }
    auto run_t0 = Clock::now();
    for (int epoch = static_cast<int>(pos.epochs_done); epoch < cfg.train.epochs; ++epoch) {
      if (cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps) break;
      reporter->epoch_start(epoch);
      loader->set_epoch(epoch);
      if (pos.step_in_epoch > 0) loader->skip(pos.step_in_epoch);
      const double wait0 = loader->wait_seconds();
      double loss_sum = 0, compute = 0, bubble = 0;
      std::int64_t steps = 0, correct = 0, seen = 0;
      auto t0 = Clock::now();
      for (std::int64_t s = pos.step_in_epoch; s < steps_per_epoch(); ++s) {
        if (cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps) break;
        if (stop_signal) break;  // agreed in the previous step
        std::optional<data::Batch> b = loader->next();
        RT_CHECK(b.has_value(), grid.tag(), " training data ended inside an epoch");
        const int mine = hooks.stop_signal ? hooks.stop_signal() : 0;
        GridStepResult r = pm->train_step(b->images, b->labels, schedule->lr_at(pos.step), mine != 0, ckpt.time_due());
        if (r.stop) stop_signal = mine ? mine : -1;  // every rank stops after this step
        RT_CHECK(std::isfinite(r.loss), "training diverged: loss is ", r.loss, " at step ", pos.step);
        ++pos.step;
        ++steps;
        pos.step_in_epoch = s + 1;
        loss_sum += r.loss;
        correct += r.correct;
        seen += r.seen;
        compute += r.timing.busy_s;
        bubble += r.timing.bubble();
        if (cfg.train.verify_every > 0 && pos.step % cfg.train.verify_every == 0) verify_replicas();
        // checkpoint.every_steps / every_s (agreed in the step's all-reduce); an epoch's end saves below.
        save_due = ckpt.due_after_step(pos.step) || r.save;
        if (pos.step_in_epoch < steps_per_epoch() && save_due) save_checkpoint(true);
        if (hooks.on_step) hooks.on_step(pos.step, r.loss);
        reporter->step(s + 1, r.loss, static_cast<double>(global_batch()) * (s + 1) / since(t0));
      }
      if (pos.step_in_epoch < steps_per_epoch()) {
        // Stopped inside the epoch (train.max_steps or a signal): save the exact position.
        save_checkpoint(true);
        if (stop_signal) res.stopped_by_signal = announce_stop();
        break;
      }
      pos.step_in_epoch = 0;
      EpochMetrics m;
      m.epoch = epoch;
      m.step = pos.step;
      m.lr = schedule->lr_at(std::max<std::int64_t>(0, pos.step - 1));
      m.time_s = since(t0);
      m.compute_s = compute;
      m.comm_exposed_s = m.time_s - compute;  // bubble and communication together
      m.data_wait_s = loader->wait_seconds() - wait0;
      m.train_loss = steps ? loss_sum / steps : 0;
      m.train_accuracy = seen ? double(correct) / double(seen) : 0;
      m.images_per_s = m.time_s > 0 ? double(global_batch()) * steps / m.time_s : 0;
      if (world.rank() == 0 && steps) log::debug("pipeline bubble (stage 0, mean over steps): ", bubble / steps);
      pos.epochs_done = epoch + 1;
      // A signal during the epoch's last step: stop now, before evaluating.
      const bool stopping = stop_requested() && pos.epochs_done < cfg.train.epochs;
      const bool limit = cfg.train.max_steps > 0 && pos.step >= cfg.train.max_steps;
      // Save before evaluating: a problem in the test data must not cost the epoch.
      save_checkpoint(stopping || limit || pos.epochs_done == cfg.train.epochs || save_due);
      if (stopping) {
        reporter->epoch_end(m);
        res.stopped_by_signal = announce_stop();
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
    res.steps = pos.step;
    res.checkpoint = last_checkpoint;
    return res;
  }

  // A stop signal (SIGUSR1/SIGTERM/SIGINT, signals.hpp) on any rank, agreed by all
  // ranks at this step boundary (one small all-reduce per step, only when signals are watched).
  // A stop agreed in a step's all-reduce (a signal after the epoch's last step
  // is seen in the next epoch's first step, which then stops at once).
  bool stop_requested() const { return stop_signal != 0; }

  // train.verify_every: the replicas of this rank's stage and tensor shard
  // (its data-parallel group) hold bitwise-identical parameters, buffers and
  // optimizer state; the job ends naming the tensor otherwise.
  void verify_replicas() {
    std::vector<Tensor> ts;
    std::vector<std::string> names;
    for (auto& [name, t] : pm->named_state()) {
      names.push_back(name);
      ts.push_back(t);
    }
    verify_identical(ts, grid.dp(), names);
  }

  int announce_stop() {
    ckpt.announce_stop(stop_signal, pos.step_in_epoch, steps_per_epoch(), last_checkpoint);
    return stop_signal;
  }

  // Every `checkpoint.every_epochs` epochs, or always with `force` (the run ends or stops).
  void save_checkpoint(bool force) {
    // World rank 0 gathers every stage's whole state (shards gathered over the tensor group).
    std::string path = ckpt.save(force, [&] { return pm->gather_whole_state(0); });
    if (!path.empty()) last_checkpoint = path;
  }

  // Every rank receives the checkpoint; each checks and takes the names its stage owns
  // (its part of a tensor-parallel shard), so any layout loads any checkpoint.
  bool load(const std::string& path, bool with_optimizer) {
    CheckpointSession::Restore r;
    r.wanted = [&](bool with_opt) {
      NamedTensorList w;
      pm->restore_whole_state([&](const std::string& name, Tensor& whole) {
        if (with_opt || name.rfind("optim/", 0) != 0) w.emplace_back(name, whole);
        return false;  // only the names, dtypes and whole shapes
      });
      return w;
    };
    r.apply = [&](const CheckpointData& ck, bool with_opt) {
      pm->restore_whole_state([&](const std::string& name, Tensor& whole) {
        if (!with_opt && name.rfind("optim/", 0) == 0) return false;
        restore_tensor(ck, name, whole);
        return true;
      });
    };
    return ckpt.load(path, with_optimizer, r, steps_per_epoch());
  }

  std::string save_now() {
    ckpt.start_run();
    save_checkpoint(true);
    return last_checkpoint;
  }
};

PipelineTrainer::PipelineTrainer(const TrainConfig& cfg, const Communicator& world, const TrainerHooks& hooks)
    : impl_(std::make_unique<Impl>(cfg, world, hooks)) {}
PipelineTrainer::~PipelineTrainer() { log::set_prefix(""); }
TrainResult PipelineTrainer::fit() { return impl_->fit(); }
EvalResult PipelineTrainer::evaluate(const std::string& path) { return impl_->evaluate(path); }
bool PipelineTrainer::load(const std::string& path, bool with_optimizer) { return impl_->load(path, with_optimizer); }
const LoadedCheckpoint& PipelineTrainer::loaded() const { return impl_->ckpt.loaded(); }
std::string PipelineTrainer::save_checkpoint() { return impl_->save_now(); }
const std::string& PipelineTrainer::run_id() const { return impl_->pos.run_id; }

}  // namespace ringtrain
