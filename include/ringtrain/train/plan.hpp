#pragma once
// RunPlan: what a configuration resolves to at a given rank count, before
// anything runs (`ringtrain train --print-plan --ranks N`). It applies the
// trainer's own rules (ProcessGrid::data_parallel_size, derive_batch), so a
// plan exists exactly when the trainer accepts the layout and batch split.
// It reads no data: checks that need the data set (its image size for the
// model, its length for train.accumulation) are the trainer's alone.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ringtrain/train/config.hpp"

namespace ringtrain {

struct RunPlan {
  int ranks = 1;
  int data = 1, pipeline = 1, tensor = 1;  // the process grid (data = ranks / (pipeline x tensor))
  bool sequence = false;                   // sequence parallelism: parallel.sequence at tensor > 1, transformer blocks
  std::string schedule;                    // parallel.schedule (used when pipeline > 1)
  int zero = 0;                            // ZeRO stage (parallel.zero)
  int batch_per_rank = 0;                  // data.batch_size after derive_batch: samples a replica reads per batch
  int accumulation = 1;                    // train.accumulation after derive_batch: batches per optimizer step
  int micro_batches = 1;                   // pipeline micro-batches per batch
  int micro_batch_size = 0;                // batch_per_rank / micro_batches
  std::int64_t global_batch = 0;           // batch_per_rank x data x accumulation: samples per optimizer step
  // The GPU validation gate (train/gpu_gate.hpp): what this job would need on
  // CUDA that has not run on a GPU (refused there), and the 16-bit storage it
  // would leave for float32 ("" when none).
  std::vector<std::pair<std::string, std::string>> gpu_refused;  // feature, setting
  // Pipeline > 1: every schedule that can run this p and m, played by the
  // simulator with unit costs (a stage's F = I = W = 1, a chunk's 1/v; free
  // messages): step time relative to 1F1B's, bubble, and the most activations
  // a rank holds, in micro-batches of a whole stage.
  struct SchedulePrediction {
    std::string name;
    int chunks = 1;
    double step_vs_1f1b = 1, bubble = 0, peak_activations = 0;
    double busiest_vs_1f1b = 0;  // the busiest rank's compute over 1f1b's step: the table's ideal
  };
  std::vector<SchedulePrediction> schedules;
  // parallel.schedule = auto: the simulator's comparison as the start makes it
  // (predict_schedules: the layers' times measured here on the CPU, messages
  // at the given link, parallel.link_latency_us, else free; the sender's
  // waits), and its pick. Empty when the data cannot be read.
  struct TimedPrediction {
    std::string name, skipped;
    double step_ms = 0, bubble = 0, peak_activations = 0;
    double busiest_rank_ms = 0;  // no table of this cut runs faster (simulator.hpp busiest_rank_s)
    bool fits = true;
  };
  std::vector<TimedPrediction> auto_schedules;
  std::string auto_pick;
  std::string gpu_storage_fallback;

  // Pretty-printed JSON, one key per line (docs/parallel_layouts.md, "Print the plan").
  std::string json() const;
};

// The plan of `cfg` (validated here too) at `ranks` ranks; an Error naming the
// key when the configuration cannot run there (the trainer raises the same one),
// the GPU validation gate's refusal included for train.device = cuda.
RunPlan plan_run(TrainConfig cfg, int ranks);

}  // namespace ringtrain
