#include "run_options.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/nn/backend.hpp"

namespace ringtrain {

std::unique_ptr<data::Loader> open_train_loader(const TrainConfig& cfg, const Communicator& comm) {
  data::LoaderOptions lo;
  run_agreed(comm, "opening the training data", [&] {
    try {
      lo.files = data::find_split_files(cfg.data.train, "train");
    } catch (const Error& e) {
      RT_FAIL("data.train = '", cfg.data.train, "': ", e.what());
    }
  });
  lo.batch_size = cfg.data.batch_size;
  lo.seed = cfg.train.seed;
  lo.tail = cfg.data.drop_last ? data::TailPolicy::drop_last : data::TailPolicy::pad;
  lo.prefetch_depth = cfg.data.prefetch;
  lo.mpio = cfg.data.mpi_io;
  lo.seq_len = cfg.data.seq_len;
  if (cfg.data.augment) lo.augment = data::Augment{2, true};
  // Errors name the key (the loader names the file); raised on every rank alike.
  try {
    return std::make_unique<data::Loader>(lo, comm);
  } catch (const CollectiveError& e) {
    throw CollectiveError(cat("data.train = '", cfg.data.train, "': ", e.what()));
  } catch (const Error& e) {
    throw Error(cat("data.train = '", cfg.data.train, "': ", e.what()));
  }
}

ModelConfig model_config(const TrainConfig& cfg, const data::FileInfo& info) {
  ModelConfig mc;
  mc.name = cfg.model.name;
  mc.in_channels = info.channels;
  mc.height = info.height;
  mc.width = info.width;
  mc.classes = info.num_classes;
  if (info.tokens()) mc.seq_len = cfg.data.seq_len;
  mc.depth = cfg.model.depth;
  mc.base_width = cfg.model.width;
  mc.dropout = cfg.model.dropout;
  mc.heads = cfg.model.heads;
  mc.mlp_ratio = cfg.model.mlp_ratio;
  mc.patch = cfg.model.patch;
  mc.gelu = cfg.model.gelu;
  mc.layernorm_eps = cfg.model.layernorm_eps;
  mc.experts = cfg.model.experts;
  mc.top_k = cfg.model.top_k;
  mc.moe_every = cfg.model.moe_every;
  mc.aux_loss_coeff = cfg.model.aux_loss_coeff;
  mc.capacity_factor = cfg.model.capacity_factor;
  mc.moe_bias_update_rate = cfg.model.moe_bias_update_rate;
  mc.layers = cfg.model.layers;
  mc.sequence = cfg.parallel.sequence;
  mc.context.mode = parse_context_mode(cfg.parallel.context_mode);
  mc.seed = cfg.train.seed;
  return mc;
}

double matmul_peak_flops(Device dev) {
  if (!dev.is_cpu()) return 0;
  const std::int64_t n = 512;
  auto k = backend_for(dev).linear(LinearSpec{n, n, false, false});
  Tensor x = Tensor::empty({n, n}), w = Tensor::empty({n, n}), y = Tensor::empty({n, n});
  x.fill_(1e-3);
  w.fill_(1e-3);
  k->forward(x, w, Tensor(), y);  // warm-up (kernel creation, caches)
  double best = 1e300;
  for (int r = 0; r < 5; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    k->forward(x, w, Tensor(), y);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

OptimizerConfig optimizer_config(const TrainConfig& cfg) {
  OptimizerConfig oc;
  oc.name = cfg.optimizer.name;
  oc.momentum = cfg.optimizer.momentum;
  oc.nesterov = cfg.optimizer.nesterov;
  oc.weight_decay = cfg.optimizer.weight_decay;
  oc.beta1 = cfg.optimizer.beta1;
  oc.beta2 = cfg.optimizer.beta2;
  oc.eps = cfg.optimizer.eps;
  oc.trust_coefficient = cfg.optimizer.trust_coefficient;
  return oc;
}

ScheduleConfig schedule_config(const TrainConfig& cfg, std::int64_t global_batch) {
  ScheduleConfig sc;
  sc.name = cfg.schedule.name;
  sc.lr = cfg.optimizer.lr;
  sc.linear_scaling = cfg.schedule.scale_lr;
  sc.global_batch = global_batch;
  sc.warmup = cfg.schedule.warmup_epochs;
  sc.step_size = cfg.schedule.step_epochs;
  sc.gamma = cfg.schedule.gamma;
  sc.min_lr = cfg.schedule.min_lr;
  return sc;
}

static_assert(TrainConfig::Comm{}.tree_threshold == kDefaultTreeThreshold &&
                  TrainConfig::Comm{}.segment_bytes == static_cast<std::int64_t>(kDefaultSegmentBytes),
              "the comm.* defaults are the collectives' built-in ones");

CollectiveOptions collective_options(const TrainConfig& cfg) {
  CollectiveOptions o;
  o.algorithm = parse_algorithm(cfg.comm.algorithm);
  o.tree_threshold = cfg.comm.tree_threshold;
  o.segment_bytes = static_cast<std::size_t>(cfg.comm.segment_bytes);
  return o;
}

EngineOptions engine_options(const TrainConfig& cfg) {
  EngineOptions eo;
  eo.fusion_threshold = static_cast<std::size_t>(cfg.comm.fusion_threshold);
  eo.cycle_time_ms = cfg.comm.cycle_time_ms;
  eo.cache_capacity = static_cast<std::size_t>(cfg.comm.cache_capacity);
  eo.fp16_allreduce = cfg.comm.fp16_allreduce;
  eo.timeline = cfg.comm.timeline;
  eo.timeline_all_ranks = cfg.comm.timeline_all_ranks;
  eo.stall_warning_s = cfg.comm.stall_warning_s;
  eo.stall_shutdown_s = cfg.comm.stall_shutdown_s;
  eo.collective = collective_options(cfg);
  eo.autotune = {cfg.comm.autotune, cfg.comm.autotune_samples, cfg.comm.autotune_steps, cfg.comm.autotune_log};
  return eo;
}

void record_evaluation(const TrainConfig& cfg, int epoch, const EvalResult& ev, double eval_s, double run_s,
                       bool speak, EpochMetrics& m, TrainResult& res) {
  m.evaluated = true;
  m.test_loss = ev.loss;
  m.test_accuracy = ev.accuracy;
  m.eval_s = eval_s;
  res.best_test_accuracy = std::max(res.best_test_accuracy, ev.accuracy);
  if (cfg.train.target_accuracy > 0 && res.target_epoch < 0 && ev.accuracy >= cfg.train.target_accuracy) {
    res.target_epoch = epoch + 1;
    res.target_time_s = run_s;
    if (speak)
      log::info("reached test accuracy ", 100 * ev.accuracy, "% >= target ", 100 * cfg.train.target_accuracy,
                "% at epoch ", epoch + 1, " after ", run_s, " s");
  }
}

void derive_batch(TrainConfig& cfg, int data_parallel) {
  const std::int64_t g = cfg.data.global_batch, dp = data_parallel;
  if (g <= 0) return;
  const std::int64_t m = cfg.pipeline_micro_batches();
  for (std::int64_t a = cfg.train.accumulation; a * dp <= g; ++a) {
    if (g % (dp * a) != 0 || (g / (dp * a)) % m != 0) continue;
    RT_CHECK(g / (dp * a) <= (1 << 24), "data.global_batch = ", g, " over data-parallel size ", dp,
             " gives data.batch_size = ", g / (dp * a), ", above the limit 16777216: raise train.accumulation");
    cfg.data.batch_size = static_cast<int>(g / (dp * a));
    cfg.train.accumulation = static_cast<int>(a);
    return;
  }
  RT_FAIL("data.global_batch = ", g, " has no exact split at this layout: data-parallel size ", dp,
          " (ranks / (parallel.pipeline ", cfg.parallel.pipeline, " x parallel.tensor ", cfg.parallel.tensor,
          cfg.parallel.context > 1 ? cat(" x parallel.context ", cfg.parallel.context) : std::string(), ")) x train.accumulation (>= ", cfg.train.accumulation, ") x data.batch_size (a multiple of ",
          cfg.parallel.micro_batches > 0 ? "parallel.micro_batches = " : "parallel.pipeline = ", m,
          ") must equal it; choose a data.global_batch that is a multiple of ", dp * m * cfg.train.accumulation,
          ", or another layout");
}

std::string thread_oversubscription(int threads, int local_ranks, int allowed_cpus, int online_cpus) {
  if (threads <= 1) return "";
  const std::string fix = "; OpenMP's threads would wait for cores (a parallel region can take milliseconds): ";
  if (allowed_cpus > 0 && threads > allowed_cpus)
    return cat("train.threads = ", threads, " on a rank bound to ", allowed_cpus, " CPU(s)", fix,
               "bind each rank to ", threads, " cores (mpirun --map-by slot:PE=", threads,
               ") or lower train.threads to ", allowed_cpus);
  if (online_cpus > 0 && static_cast<long>(threads) * local_ranks > online_cpus)
    return cat("train.threads = ", threads, " x ", local_ranks, " ranks on this node = ",
               static_cast<long>(threads) * local_ranks, " compute threads on ", online_cpus, " CPUs", fix,
               "lower train.threads to ", std::max(1, online_cpus / std::max(1, local_ranks)),
               " or run fewer ranks per node");
  return "";
}

void warn_thread_oversubscription(int threads, const Communicator& world) {
  if (world.local_rank() != 0) return;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  const int allowed = sched_getaffinity(0, sizeof mask, &mask) == 0 ? CPU_COUNT(&mask) : 0;
  const std::string why =
      thread_oversubscription(threads, world.local_size(), allowed, static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN)));
  if (!why.empty()) log::warn(why);
}

int compute_threads(const TrainConfig& cfg) {
  if (cfg.train.threads > 0) return cfg.train.threads;
  if (const char* v = std::getenv("OMP_NUM_THREADS")) return std::max(1, std::atoi(v));
  return 1;
}

}  // namespace ringtrain
