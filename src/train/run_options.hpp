#pragma once
// The one translation of a TrainConfig into the options of the pieces a run is
// made of (loader, model, optimizer, schedule, engine), shared by the
// data-parallel trainer and the grid (pipeline/tensor) trainer so that both
// read every key the same way.
#include <cstdint>
#include <memory>

#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/core/cpu.hpp"  // flush_denormals
#include "ringtrain/data/loader.hpp"
#include "ringtrain/engine/engine.hpp"
#include "ringtrain/nn/model.hpp"
#include "ringtrain/optim/optimizer.hpp"
#include "ringtrain/optim/schedule.hpp"
#include "ringtrain/train/config.hpp"
#include "ringtrain/train/report.hpp"
#include "ringtrain/train/trainer.hpp"

namespace ringtrain {

// The training split over `comm`'s ranks; errors name data.train, on every rank alike.
std::unique_ptr<data::Loader> open_train_loader(const TrainConfig& cfg, const Communicator& comm);
ModelConfig model_config(const TrainConfig& cfg, const data::FileInfo& info);
OptimizerConfig optimizer_config(const TrainConfig& cfg);
ScheduleConfig schedule_config(const TrainConfig& cfg, std::int64_t global_batch);
// comm.algorithm, comm.tree_threshold and comm.segment_bytes.
CollectiveOptions collective_options(const TrainConfig& cfg);
// The comm.* keys, without device_ops (the caller adds its device's).
EngineOptions engine_options(const TrainConfig& cfg);
// FLOP/s of one float32 matmul (512^3, the backend's Linear kernel, the best of
// 5) on this rank's compute threads: the peak model FLOP/s are compared with (MFU). CPU only (0 elsewhere).
double matmul_peak_flops(Device dev);
// Records an epoch's evaluation in its metrics and the run's result (best
// accuracy, first epoch at train.target_accuracy, announced by `speak`).
void record_evaluation(const TrainConfig& cfg, int epoch, const EvalResult& ev, double eval_s, double run_s,
                       bool speak, EpochMetrics& m, TrainResult& res);
// data.global_batch = G > 0: sets data.batch_size = G / (data_parallel x A)
// and train.accumulation = A for the smallest A >= the configured
// train.accumulation such that the split is exact and the per-rank batch is
// divisible by the pipeline's micro-batches (parallel.micro_batches, else
// parallel.pipeline). Fewer, larger micro-batches are preferred: they are
// faster, and the optimizer step sees the same G samples either way. No exact
// split is an error naming the keys (on every rank alike: the inputs are).
void derive_batch(TrainConfig& cfg, int data_parallel);
// train.threads, else OMP_NUM_THREADS, else 1.
int compute_threads(const TrainConfig& cfg);
// Why `threads` compute threads per rank oversubscribe the CPUs, or "": where
// the `local_ranks` ranks of this node want more threads than its
// `online_cpus`, or one rank more than the `allowed_cpus` of its affinity mask
// (mpirun's binding). An OpenMP parallel region then waits for its threads to
// be scheduled: 2 ranks x 2 threads on 2 cores took 0.2-7.5 ms for a 64-float
// loss that one thread computes in 0.02-0.3 ms. One thread never warns (ranks
// beyond the cores are mpirun's --oversubscribe, asked for).
std::string thread_oversubscription(int threads, int local_ranks, int allowed_cpus, int online_cpus);
// Logs it (a warning, on each node's first rank) for this process's affinity and node.
void warn_thread_oversubscription(int threads, const Communicator& world);

}  // namespace ringtrain
