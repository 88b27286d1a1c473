#include "pipeline_trainer.hpp"

#include "run_options.hpp"

#include <mpi.h>
#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/data/loader.hpp"
#include "ringtrain/data/schema.hpp"
#include "ringtrain/optim/schedule.hpp"
#include "ringtrain/parallel/pipeline.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/signals.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }
using Named = std::vector<std::pair<std::string, Tensor>>;

// The checkpoint writer stores flat dataset names: '/' travels as '~'.
std::string file_name(std::string n) {
  for (char& ch : n)
    if (ch == '/') ch = '~';
  return n;
}

// Stage -> world rank 0: names, shapes, dtypes and bytes of host tensors.
void send_named(const Named& ts, int to, MPI_Comm c) {
  std::int64_t n = static_cast<std::int64_t>(ts.size());
  MPI_Send(&n, 1, MPI_INT64_T, to, 7100, c);
  for (auto& [name, t] : ts) {
    std::vector<std::int64_t> head = {static_cast<std::int64_t>(name.size()), static_cast<std::int64_t>(t.dtype()),
                                      static_cast<std::int64_t>(t.shape().size())};
    head.insert(head.end(), t.shape().begin(), t.shape().end());
    std::int64_t hn = static_cast<std::int64_t>(head.size());
    MPI_Send(&hn, 1, MPI_INT64_T, to, 7101, c);
    MPI_Send(head.data(), static_cast<int>(hn), MPI_INT64_T, to, 7102, c);
    MPI_Send(name.data(), static_cast<int>(name.size()), MPI_CHAR, to, 7103, c);
    MPI_Send(t.raw(), static_cast<int>(t.nbytes()), MPI_BYTE, to, 7104, c);
  }
}

Named recv_named(int from, MPI_Comm c) {
  Named out;
  std::int64_t n = 0;
  MPI_Recv(&n, 1, MPI_INT64_T, from, 7100, c, MPI_STATUS_IGNORE);
  for (std::int64_t i = 0; i < n; ++i) {
    std::int64_t hn = 0;
    MPI_Recv(&hn, 1, MPI_INT64_T, from, 7101, c, MPI_STATUS_IGNORE);
    std::vector<std::int64_t> head(static_cast<std::size_t>(hn));
    MPI_Recv(head.data(), static_cast<int>(hn), MPI_INT64_T, from, 7102, c, MPI_STATUS_IGNORE);
    std::string name(static_cast<std::size_t>(head[0]), '\0');
    MPI_Recv(name.data(), static_cast<int>(head[0]), MPI_CHAR, from, 7103, c, MPI_STATUS_IGNORE);
    Shape s(head.begin() + 3, head.end());
    Tensor t = Tensor::empty(s, static_cast<DType>(head[1]));
    MPI_Recv(t.raw(), static_cast<int>(t.nbytes()), MPI_BYTE, from, 7104, c, MPI_STATUS_IGNORE);
    out.emplace_back(std::move(name), t);
  }
  return out;
}

}  // namespace

struct PipelineTrainer::Impl {
  TrainConfig cfg;
  Communicator world;
  TrainerHooks hooks;
  ProcessGrid grid;
  std::unique_ptr<data::Loader> loader;
  std::unique_ptr<PipelineModel> pm;
  std::unique_ptr<LrSchedule> schedule;
  std::unique_ptr<Reporter> reporter;
  std::int64_t epochs_done = 0, step = 0;
  std::int64_t step_in_epoch = 0;  // steps of the current epoch already taken (exact resume)
  int stop_signal = 0;             // agreed stop request: the signal, or -1 when it reached another rank
  std::int64_t num_params = 0;

  Impl(const TrainConfig& c, const Communicator& w, const TrainerHooks& h) : cfg(c), world(w), hooks(h) {
    cfg.validate();
    grid = ProcessGrid::make(world, {cfg.parallel.pipeline, cfg.parallel.tensor});
    log::set_prefix(cat("[rank ", world.rank(), " ", grid.tag().substr(1), " "));
    RT_CHECK(cfg.train.device != "cuda", "parallel.pipeline > 1 runs on the CPU for now (set train.device = cpu)");
    RT_CHECK(cfg.train.accumulation == 1, "parallel.pipeline > 1: use parallel.micro_batches, not train.accumulation");
    RT_CHECK(cfg.train.precision == "fp32", "parallel.pipeline > 1 supports train.precision = fp32 only for now");
    omp_set_num_threads(compute_threads(cfg));
    loader = open_train_loader(cfg, grid.dp());
    ModelConfig mc = model_config(cfg, loader->info());
    PipelineConfig pc;
    pc.micro_batches = cfg.parallel.micro_batches > 0 ? cfg.parallel.micro_batches : cfg.parallel.pipeline;
    pc.schedule = parse_schedule(cfg.parallel.schedule);
    pc.partition = parse_partition(cfg.parallel.partition);
    if (pc.partition == PartitionKind::list) pc.balance = parse_balance(cfg.parallel.balance);
    pc.batch = cfg.data.batch_size;
    pc.clip_norm = cfg.optimizer.clip_norm;
    pc.engine = engine_options(cfg);
    pc.deterministic = cfg.comm.deterministic;
    OptimizerConfig oc = optimizer_config(cfg);
    num_params = build_model(mc)->num_params();
    pm = std::make_unique<PipelineModel>(grid, mc, pc, oc);

    ScheduleConfig sc = schedule_config(cfg, global_batch());
    schedule = std::make_unique<LrSchedule>(sc, steps_per_epoch(), steps_per_epoch() * cfg.train.epochs);
  }

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
    reporter = std::make_unique<Reporter>(world.rank() == 0 && hooks.report, cfg.log.format, cfg.log.interval,
                                          hooks.report ? metrics : "", cfg.train.epochs, steps_per_epoch());
    if (world.rank() == 0 && hooks.report) {
      std::string bal;
      for (int b : pm->balance()) bal += cat(bal.empty() ? "" : ", ", b);
      log::info("ringtrain: ", cfg.model.name, " (", num_params, " parameters) on ", world.size(), " rank(s) = ",
                grid.dp_size(), " DP x ", grid.pp_size(), " PP stages (layers [", bal, "]), schedule ",
                cfg.parallel.schedule, ", ", pm->balance().size() ? "" : "", "batch ", cfg.data.batch_size,
                "/replica in ", cfg.data.batch_size / std::max(1, cfg.parallel.micro_batches > 0 ? cfg.parallel.micro_batches : cfg.parallel.pipeline),
                "-sample micro-batches (global ", global_batch(), "), ", steps_per_epoch(), " steps/epoch");
      nlohmann::json head = {{"event", "start"}, {"model", cfg.model.name}, {"params", num_params},
                             {"ranks", world.size()}, {"pipeline", grid.pp_size()}, {"data_parallel", grid.dp_size()},
                             {"schedule", cfg.parallel.schedule}, {"global_batch", global_batch()},
                             {"steps_per_epoch", steps_per_epoch()}, {"config", cfg.to_toml()}};
      reporter->json_line(head.dump());
    }
    auto run_t0 = Clock::now();
    for (int epoch = static_cast<int>(epochs_done); epoch < cfg.train.epochs; ++epoch) {
      if (cfg.train.max_steps > 0 && step >= cfg.train.max_steps) break;
      reporter->epoch_start(epoch);
      loader->set_epoch(epoch);
      if (step_in_epoch > 0) loader->skip(step_in_epoch);
      const double wait0 = loader->wait_seconds();
      double loss_sum = 0, compute = 0, bubble = 0;
      std::int64_t steps = 0, correct = 0, seen = 0;
      auto t0 = Clock::now();
      for (std::int64_t s = step_in_epoch; s < steps_per_epoch(); ++s) {
        if (cfg.train.max_steps > 0 && step >= cfg.train.max_steps) break;
        if (stop_requested()) break;
        std::optional<data::Batch> b = loader->next();
        RT_CHECK(b.has_value(), grid.tag(), " training data ended inside an epoch");
        PipeStepResult r = pm->train_step(b->images, b->labels, schedule->lr_at(step));
        RT_CHECK(std::isfinite(r.loss), "training diverged: loss is ", r.loss, " at step ", step);
        ++step;
        ++steps;
        step_in_epoch = s + 1;
        loss_sum += r.loss;
        correct += r.correct;
        seen += r.seen;
        compute += r.timing.busy_s;
        bubble += r.timing.bubble();
        if (hooks.on_step) hooks.on_step(step, r.loss);
        reporter->step(s + 1, r.loss, static_cast<double>(global_batch()) * (s + 1) / since(t0));
      }
      if (step_in_epoch < steps_per_epoch()) {
        // Stopped inside the epoch (train.max_steps or a signal): save the exact position.
        save_checkpoint(true);
        if (stop_signal) res.stopped_by_signal = announce_stop();
        break;
      }
      step_in_epoch = 0;
      EpochMetrics m;
      m.epoch = epoch;
      m.step = step;
      m.lr = schedule->lr_at(std::max<std::int64_t>(0, step - 1));
      m.time_s = since(t0);
      m.compute_s = compute;
      m.comm_exposed_s = m.time_s - compute;  // bubble and communication together
      m.data_wait_s = loader->wait_seconds() - wait0;
      m.train_loss = steps ? loss_sum / steps : 0;
      m.train_accuracy = seen ? double(correct) / double(seen) : 0;
      m.images_per_s = m.time_s > 0 ? double(global_batch()) * steps / m.time_s : 0;
      if (world.rank() == 0 && steps) log::debug("pipeline bubble (stage 0, mean over steps): ", bubble / steps);
      epochs_done = epoch + 1;
      // A signal during the epoch's last step: save whatever checkpoint.every_epochs says, and stop.
      const bool stopping = stop_requested() && epochs_done < cfg.train.epochs;
      save_checkpoint(stopping);  // before evaluating: a problem in the test data must not cost the epoch
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
    res.steps = step;
    return res;
  }

  // A stop signal (SIGUSR1/SIGTERM/SIGINT, signals.hpp) on any rank, agreed by all
  // ranks at this step boundary (one small all-reduce per step, only when signals are watched).
  bool stop_requested() {
    if (!hooks.stop_signal) return false;
    if (stop_signal) return true;
    int mine = hooks.stop_signal(), any = mine ? 1 : 0;
    allreduce(&any, &any, 1, DType::i32, ReduceOp::max, world);
    if (any) stop_signal = mine ? mine : -1;
    return any != 0;
  }

  int announce_stop() {
    if (world.rank() == 0)
      log::warn("stopped by ", stop_signal > 0 ? StopSignals::name(stop_signal) : "a stop signal on another rank",
                " at step ", step, " (epoch ", epochs_done + 1, ", step ", step_in_epoch, " of ", steps_per_epoch(), ")",
                cfg.checkpoint.dir.empty() ? std::string("; no checkpoint.dir, so nothing was saved")
                                           : cat("; continue with --resume ", cfg.checkpoint.dir));
    return stop_signal;
  }

  // World rank 0 gathers every stage's state (from DP rank 0) and writes.
  // `force`: a stop inside or at the end of an epoch saves whatever checkpoint.every_epochs says.
  void save_checkpoint(bool force = false) {
    if (cfg.checkpoint.dir.empty()) return;
    const int done = static_cast<int>(epochs_done);
    if (!force && done % cfg.checkpoint.every_epochs != 0 && done != cfg.train.epochs) return;
    MPI_Comm c = world.handle("gathering a pipeline checkpoint");
    Named mine = pm->whole_state();  // collective over the tensor group: sharded parameters gathered whole
    if (grid.dp_rank() == 0 && grid.tp_rank() == 0 && grid.pp_rank() > 0) send_named(mine, 0, c);
    std::string path;
    run_on_root(world, "writing a checkpoint", [&] {
      CheckpointData d;
      Named all = mine;
      for (int s = 1; s < grid.pp_size(); ++s) {
        Named part = recv_named(grid.world_rank_of(0, 0, s), c);
        all.insert(all.end(), part.begin(), part.end());
      }
      std::set<std::string> seen;  // "optim/step" comes from every stage (all equal): keep one
      for (auto& [name, t] : all)
        if (seen.insert(name).second) d.tensors.emplace_back(file_name(name), t);
      d.scalars = {{"epochs_done", epochs_done}, {"step", step}, {"step_in_epoch", step_in_epoch}, {"ranks", world.size()},
                   {"seed", static_cast<std::int64_t>(cfg.train.seed)}, {"pipeline", grid.pp_size()}};
      d.config_toml = cfg.to_toml();
      // Run id in CheckpointDir's three-part form; the layout does not depend on p or DP.
      const std::string run_id = cat("pipeline-", cfg.model.name, "-seed", cfg.train.seed);
      path = CheckpointDir(cfg.checkpoint.dir, cfg.checkpoint.keep).save(run_id, step, d);
    });
    if (world.rank() == 0) log::info("checkpoint written: ", path);
  }

  // Every rank reads the file and takes the names its stage owns.
  void load(const std::string& path, bool with_optimizer) {
    run_agreed(world, "loading a checkpoint", [&] {
      std::string file = path;
      if (std::filesystem::is_directory(path)) {
        file = CheckpointDir(path, 1).latest();
        RT_CHECK(!file.empty(), "no checkpoint (ckpt-*.h5) in directory '", path, "'");
      }
      CheckpointData ck = read_checkpoint(file);
      pm->restore_whole_state([&](const std::string& name, Tensor& whole) {
        if (!with_optimizer && name.rfind("optim/", 0) == 0) return false;
        restore_tensor(ck, file_name(name), whole);
        return true;
      });
      if (with_optimizer) {
        epochs_done = ck.scalars.at("epochs_done");
        step = ck.scalars.at("step");
        step_in_epoch = ck.scalars.count("step_in_epoch") ? ck.scalars.at("step_in_epoch") : 0;
      }
      if (world.rank() == 0) log::info("loaded checkpoint ", file, " (epoch ", epochs_done, ", step ", step, ")");
    });
  }
};

PipelineTrainer::PipelineTrainer(const TrainConfig& cfg, const Communicator& world, const TrainerHooks& hooks)
    : impl_(std::make_unique<Impl>(cfg, world, hooks)) {}
PipelineTrainer::~PipelineTrainer() { log::set_prefix(""); }
TrainResult PipelineTrainer::fit() { return impl_->fit(); }
EvalResult PipelineTrainer::evaluate(const std::string& path) { return impl_->evaluate(path); }
void PipelineTrainer::load(const std::string& path, bool with_optimizer) { impl_->load(path, with_optimizer); }

}  // namespace ringtrain
