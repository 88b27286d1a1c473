#pragma once
// TrainConfig: everything a run needs, read from a TOML file and overridden by
// command-line flags (`--set section.key=value` or the named shortcuts). Every
// key is declared once in config.cpp's field table, which drives parsing,
// validation, `--set`, printing and the copy stored in checkpoints, so an
// unknown or mistyped key is an error naming it — never silently ignored.
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/nn/layers_model.hpp"
#include "ringtrain/nn/mesh_dims.hpp"

namespace ringtrain {

struct TrainConfig {
  struct Model {
    std::string name = "cnn";      // mlp | cnn | resnet | vit | layers
    int depth = 20;                // resnet: 6n+2
    int width = 16;                // resnet: channels of the first stage; vit: embedding width
    double dropout = 0.0;
    int heads = 4;                 // vit: attention heads (divides width)
    double mlp_ratio = 4.0;        // vit: MLP hidden units = width * mlp_ratio
    int patch = 4;                 // vit: patch side (divides the image height and width)
    std::string gelu = "erf";      // vit, gpt: erf | tanh (GPT-2's approximation)
    double layernorm_eps = 1e-5;   // vit, gpt
    int experts = 0;               // gpt: mixture of experts per MoE block (0 = dense; nn/moe.hpp)
    int top_k = 2;                 // gpt: experts per token
    int moe_every = 1;             // gpt: every n-th block's MLP has experts
    double aux_loss_coeff = 0.01;  // gpt: load-balancing loss coefficient
    double capacity_factor = 0;    // gpt: expert capacity (0 = dropless)
    double moe_bias_update_rate = 0;  // gpt: aux-loss-free balancing bias step (0 = off)
    std::string init_from;         // weights to start from: safetensors file/directory or llm.c model file (docs/interop.md)
    std::vector<LayerDesc> layers; // name = layers: the [[model.layers]] list (TOML file only)
  } model;
  struct Data {
    std::string train = "data/fashion-mnist";  // file, or a shard pattern/dir
    std::string test = "data/fashion-mnist";
    int batch_size = 64;           // per rank
    std::int64_t global_batch = 0; // > 0: batch_size and accumulation derived from it and the layout
    bool drop_last = true;
    bool augment = false;          // random crop (pad 2) + horizontal flip
    int prefetch = 4;              // batches queued ahead
    bool mpi_io = false;           // parallel HDF5 collective reads
    int seq_len = 128;             // token data: tokens per sample (context length)
  } data;
  struct Train {
    int epochs = 10;
    std::uint64_t seed = 42;
    int threads = 0;               // 0: OMP_NUM_THREADS or 1 per rank
    int accumulation = 1;          // micro-batches per optimizer step
    std::string device = "auto";   // auto | cpu | cuda
    std::string precision = "fp32";  // fp32 | tf32 | bf16 | fp16 (MathMode; fp16 adds loss scaling)
    int max_steps = 0;             // stop after this many optimizer steps (0: no limit)
    int verify_every = 0;          // check parameters are bitwise identical every N steps (0: off)
    std::string recompute = "none";  // none | attention | block: activations recomputed in the backward
    double target_accuracy = 0.0;  // log when the test accuracy first reaches this
  } train;
  struct Optimizer {
    std::string name = "sgd";      // sgd | adam | adamw | lars | lamb
    double lr = 0.05;
    double momentum = 0.9;
    bool nesterov = false;
    double weight_decay = 5e-4;
    double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
    double trust_coefficient = 0.001;  // LARS
    double clip_norm = 0.0;            // global gradient-norm clipping (0: off)
  } optimizer;
  struct Schedule {
    std::string name = "cosine";   // constant | step | cosine
    double warmup_epochs = 0.0;
    double step_epochs = 30;       // step: decay every N epochs
    double gamma = 0.1;
    double min_lr = 0.0;
    bool scale_lr = false;         // linear scaling rule: lr × global batch / 256
  } schedule;
  struct Comm {
    std::string algorithm = "auto";     // auto | ring | tree | mpi | shm | hierarchical
    std::int64_t tree_threshold = 128 << 10;  // bytes: tree up to here under auto (= kDefaultTreeThreshold)
    std::int64_t segment_bytes = 512 << 10;   // ring/tree pipelining segment (= kDefaultSegmentBytes)
    std::int64_t fusion_threshold = 64 << 20;  // bytes; 0 disables fusion
    double cycle_time_ms = 1.0;
    std::int64_t cache_capacity = 1024; // fusion engine's response cache, tensor names (0 = off)
    bool fp16_allreduce = false;
    std::string timeline;               // Chrome trace file ("" = off)
    bool timeline_all_ranks = false;    // every rank writes <stem>.<rank><ext>, not only rank 0
    // A stalled job ends by itself: a tensor that some ranks never submit fails
    // the job after stall_shutdown_s, and a collective that a rank never reaches
    // (process stopped, hung or dead) after collective_timeout_s; both name the rank.
    double stall_warning_s = 60.0;
    double stall_shutdown_s = 300.0;
    double collective_timeout_s = 300.0;
    // Each rank's last operations, written on a stall or a fatal signal for
    // `ringtrain diagnose` (comm/flight_recorder.hpp).
    std::int64_t flight_recorder = 1024;  // operations kept (0 = off)
    std::string flight_recorder_dir;      // "" = <checkpoint.dir>/flight_recorder (none without checkpoint.dir)
    // Static gradient buckets (contiguous arena spans, DDP-style) instead of the
    // engine's timing-dependent fusion: bitwise-reproducible runs at any rank count.
    bool deterministic = false;
    std::int64_t bucket_bytes = 1 << 20;
    // A rank whose compute is this many times its peers' median in 3 consecutive
    // log.interval intervals is named in a warning (0 = off; train/straggler.hpp).
    double straggler_factor = 1.5;
    // The fusion engine searches its own settings during the first steps (engine/autotune.hpp).
    bool autotune = false;
    int autotune_samples = 20;
    int autotune_steps = 3;
    std::string autotune_log;  // CSV of the candidates, rank 0 ("" = none)
  } comm;
  struct Parallel {                // process grid (parallel/grid.hpp); DP size = world / (pipeline · tensor)
    int pipeline = 1;              // pipeline stages
    int tensor = 1;                // tensor-parallel ranks per group (mlp, vit)
    int context = 1;               // context-parallel ranks per group (gpt: ring attention)
    std::string context_mode = "ring";  // ring | alltoall (Ulysses: heads exchanged by all-to-all)
    int expert = 1;                // expert-parallel ranks, carved from the data-parallel ones (docs/moe.md)
    int micro_batches = 0;         // per step and replica (0 = pipeline); must divide data.batch_size
    std::string schedule = "1f1b"; // afab | 1f1b | zb-h1 | interleaved | zb-v | FILE.csv
    int virtual_stages = 2;        // interleaved: model chunks per pipeline rank
    int replan_steps = 10;         // zb-h1 / zb-v: compare tables in alternate steps, N each; run the fastest (0 = unit-cost table)
    double link_latency_us = -1;   // pipeline message latency for the simulator (< 0: measured at start)
    double link_gbytes_per_s = 0;  // with a given latency: its bandwidth (0 = bytes free)
    std::string partition = "uniform";  // uniform | params | time | list
    std::string balance;           // partition = list: layers per stage, "[3, 2, 2]"
    int zero = 0;                  // ZeRO stage over the data-parallel group: 0 off, 1 optimizer state, 2 + gradients
    bool zero_release = true;      // ZeRO-2: reduced buckets' pages of the full gradient buffer go back to the system
    bool sequence = true;          // tensor > 1: transformer blocks also split their tokens (sequence parallelism)
  } parallel;
  struct Checkpoint {
    std::string dir;               // "" = no checkpoints
    int every_epochs = 1;
    int every_steps = 0;           // also every N optimizer steps, mid-epoch too (0 = off)
    double every_s = 0;            // also when this many seconds passed since the last one (0 = off)
    int keep = 3;
    bool async = true;             // snapshot to host memory, write in a background thread
    bool parallel = true;          // every rank writes its share (part files + a manifest)
    int memory_every_steps = 0;    // in-memory snapshot (own /dev/shm + a buddy node's) every N steps (0 = off)
    std::string memory_dir;        // "" = /dev/shm/ringtrain-<checkpoint.dir's name>-<hash of its path>
    int memory_node_ranks = 0;     // testing: every N consecutive ranks form one emulated node (0 = real nodes)
  } checkpoint;
  struct Log {
    std::string format = "auto";   // auto (bar on a terminal, plain otherwise) | bar | plain | json (JSON lines)
    std::string metrics = "";      // JSON-lines file ("" = <checkpoint.dir>/metrics.jsonl or none)
    int interval = 50;             // plain log line every N steps
    std::string trace_steps = "";  // "FIRST-LAST": a Chrome trace of these steps on every rank ("" = none)
    std::string trace = "";        // its file ("" = <checkpoint.dir>/trace.json, else ./trace.json)
  } log;

  // Loads a TOML file on top of the defaults; throws Error naming the file and key.
  void load_toml(const std::string& path);
  // Applies "section.key=value"; throws Error naming the key on unknown key or bad value.
  void set(const std::string& assignment);
  // Cross-field checks (positive batch, known names, ...); throws Error naming the key.
  void validate() const;
  void check_context() const;  // parallel.context and what it combines with (config_context.cpp)
  // Pipeline micro-batches per batch: parallel.micro_batches, else parallel.pipeline.
  // The size of every mesh dimension, from its key (kDims): the one place keys become dimensions.
  MeshShape mesh_shape() const;
  int pipeline_micro_batches() const { return parallel.micro_batches > 0 ? parallel.micro_batches : parallel.pipeline; }
  // The whole configuration as TOML text (stored in checkpoints, printed by --print-config).
  // Floats in their shortest round-trip form (0.05).
  std::string to_toml() const;
  // Keys, for help text.
  static std::vector<std::string> keys();
};

// The keys of `keys` a mistyped `key` most likely meant (same name in another
// section, else the nearest by edit distance; empty when none is near), for
// the "did you mean" of an unknown key.
std::vector<std::string> closest_keys(const std::string& key, const std::vector<std::string>& keys);

// Refuses, with an Error naming the variable and the key, an environment that
// contradicts `cfg`: a variable that used to override a key and is no longer
// read, or one still read that disagrees with a key (docs/environment.md).
// The command line checks it on every rank with the configuration.
void check_environment(const TrainConfig& cfg);

}  // namespace ringtrain
