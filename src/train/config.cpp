#include "ringtrain/train/config.hpp"

#include <toml++/toml.h>

#include <charconv>
#include <cmath>
#include <algorithm>
#include <functional>
#include <limits>
#include <sstream>
#include <variant>

#include "config_layers.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/trace.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/parallel/schedule.hpp"

namespace ringtrain {
namespace {

constexpr double kHuge = 1e300;  // "no upper bound" in range checks

using FieldPtr = std::variant<std::string*, int*, std::int64_t*, std::uint64_t*, double*, bool*>;

struct Field {
  const char* key;
  std::function<FieldPtr(TrainConfig&)> get;
  const char* help;
};

#define RT_FIELD(sec, name, help) \
  Field{#sec "." #name, [](TrainConfig& c) -> FieldPtr { return &c.sec.name; }, help}

const std::vector<Field>& fields() {
  static const std::vector<Field> f = {
      RT_FIELD(model, name, "mlp | cnn | resnet | vit | gpt (a language model on token data) | layers (the [[model.layers]] list), or a model the program registered (register_model)"),
      RT_FIELD(model, depth, "resnet depth (6n+2); vit, gpt: transformer blocks"),
      RT_FIELD(model, width, "resnet channels of the first stage; vit, gpt: embedding width"),
      RT_FIELD(model, dropout, "dropout before the classifier (0 = none); vit: in every block"),
      RT_FIELD(model, heads, "vit, gpt: attention heads (divides model.width)"),
      RT_FIELD(model, mlp_ratio, "vit, gpt: MLP hidden units per embedding unit"),
      RT_FIELD(model, patch, "vit: patch side in pixels (divides the image size)"),
      RT_FIELD(model, gelu, "vit, gpt: the MLP's GELU, erf (exact, PyTorch's default) | tanh (the tanh approximation of GPT-2 and llm.c); set from model.init_from's file where it says which"),
      RT_FIELD(model, layernorm_eps, "vit, gpt: every LayerNorm's epsilon; set from model.init_from's file where it says"),
      RT_FIELD(model, experts, "gpt: a mixture of experts replaces the MLP of every model.moe_every-th block: this many expert MLPs of the dense MLP's shape and a router (0 = dense; docs/moe.md)"),
      RT_FIELD(model, top_k, "gpt, model.experts > 0: experts per token; their router probabilities, renormalised over the k, weigh their outputs"),
      RT_FIELD(model, moe_every, "gpt, model.experts > 0: blocks n-1, 2n-1, ... have experts, the others a dense MLP (1 = every block)"),
      RT_FIELD(model, aux_loss_coeff, "gpt, model.experts > 0: weight of the load-balancing loss E x sum_i f_i P_i (Switch Transformer) added to the training objective of each MoE block (0 = off); its value is logged per layer (moe.*)"),
      RT_FIELD(model, capacity_factor, "gpt, model.experts > 0: each expert takes at most ceil(factor x tokens x top_k / experts) of a micro-batch's assignments, later tokens are dropped (their residual passes); 0 = dropless"),
      RT_FIELD(model, moe_bias_update_rate, "gpt, model.experts > 0: auxiliary-loss-free load balancing (DeepSeek-V3): a per-expert bias added to the router's probabilities to choose the top-k experts only (the gates stay unbiased), moved by this much toward the mean load after each optimizer step (b_e += rate x sign(mean load - load_e), loads summed over the step's tokens on every data/expert-parallel rank); the bias is kept in checkpoints (0 = off; DeepSeek used 0.001; docs/moe.md)"),
      RT_FIELD(model, init_from, "start from these weights instead of a random initialisation: a safetensors file, a directory holding model.safetensors or shards listed by model.safetensors.index.json (Hugging Face names), or an llm.c GPT-2 model file (docs/interop.md); each rank reads only the byte ranges of the parameters it holds, and every shape is checked against the model. A --resume checkpoint takes precedence"),
      RT_FIELD(data, train, "training set: HDF5 file, or shard directory/pattern"),
      RT_FIELD(data, test, "test set: HDF5 file, or shard directory/pattern"),
      RT_FIELD(data, batch_size, "samples per rank per micro-batch"),
      RT_FIELD(data, global_batch, "samples per optimizer step over all ranks (0 = data.batch_size x data-parallel size x train.accumulation); when set, data.batch_size and train.accumulation are derived from it at every layout: the smallest accumulation >= train.accumulation that splits it exactly"),
      RT_FIELD(data, drop_last, "drop the epoch's last partial global batch"),
      RT_FIELD(data, augment, "random crop (pad 2) and horizontal flip"),
      RT_FIELD(data, prefetch, "batches prepared ahead by the loader thread"),
      RT_FIELD(data, mpi_io, "parallel HDF5 collective reads"),
      RT_FIELD(data, seq_len, "token data (prepare --dataset text|tokens): tokens per sample, the model's context length; a sample is a window of seq_len + 1 tokens (inputs and next-token targets)"),
      RT_FIELD(train, epochs, "epochs to train"),
      RT_FIELD(train, seed, "seed for initialisation, shuffling, dropout"),
      RT_FIELD(train, threads, "compute threads per rank (0 = OMP_NUM_THREADS or 1); more than the node's CPUs over its ranks, or than a rank's binding, is warned at start (OpenMP regions would wait for cores)"),
      RT_FIELD(train, accumulation, "micro-batches per optimizer step"),
      RT_FIELD(train, device, "auto | cpu | cuda"),
      RT_FIELD(train, precision, "fp32 | tf32 | bf16 | fp16: down-conversion allowed in conv/linear (fp32 master weights); fp16 adds dynamic loss scaling"),
      RT_FIELD(train, max_steps, "stop after this many optimizer steps (0 = no limit)"),
      RT_FIELD(train, recompute, "none | attention | block: activation recomputation; attention: the attention probabilities are recomputed in the backward from the kept q, k, v; block: only each block's (top-level layer's) input is kept, its forward reruns before its backward (bitwise the same training, less memory, about one more forward)"),
      RT_FIELD(train, verify_every, "verify bitwise-identical parameters every N steps (0 = off)"),
      RT_FIELD(train, target_accuracy, "report when test accuracy first reaches this (0..1)"),
      RT_FIELD(optimizer, name, "sgd | adam | adamw | lars | lamb. The defaults shown are the cnn's; model.name = gpt or vit takes its family's recipe for each optimizer.* and schedule.* key the file and command line leave out (unless optimizer.name names another optimizer; gpt: adamw, lr min(6e-4 x 768 / model.width, 1e-2), betas 0.9/0.95, decay 0.1 on matrices, clip 1, warm-up 0.1 epoch, cosine to lr/10; vit: adamw, lr min(1e-3 x 384 / model.width, 1e-2), decay 0.05, clip 1, warm-up 0.5 epoch, cosine to lr/100; `--print-config` shows them)"),
      RT_FIELD(optimizer, lr, "base learning rate"),
      RT_FIELD(optimizer, momentum, "SGD/LARS momentum"),
      RT_FIELD(optimizer, nesterov, "Nesterov momentum (SGD)"),
      RT_FIELD(optimizer, weight_decay, "weight decay (not applied to biases and norms)"),
      RT_FIELD(optimizer, beta1, "Adam/LAMB beta1"),
      RT_FIELD(optimizer, beta2, "Adam/LAMB beta2"),
      RT_FIELD(optimizer, eps, "Adam/LAMB epsilon"),
      RT_FIELD(optimizer, trust_coefficient, "LARS trust coefficient"),
      RT_FIELD(optimizer, clip_norm, "clip the global gradient norm (0 = off)"),
      RT_FIELD(schedule, name, "constant | step | cosine"),
      RT_FIELD(schedule, warmup_epochs, "linear warm-up length in epochs"),
      RT_FIELD(schedule, step_epochs, "step schedule: decay every N epochs"),
      RT_FIELD(schedule, gamma, "step schedule: decay factor"),
      RT_FIELD(schedule, min_lr, "cosine: final learning rate"),
      RT_FIELD(schedule, scale_lr, "linear scaling rule: lr x global batch / 256"),
      RT_FIELD(comm, algorithm, "all-reduce algorithm: auto | ring | tree | mpi | shm | hierarchical"),
      RT_FIELD(comm, tree_threshold, "bytes: the gradient collectives (fusion engine, ZeRO-1) take the tree up to here and the ring above where comm.algorithm = auto chooses between them (one rank per node; hierarchical's cross-node step)"),
      RT_FIELD(comm, segment_bytes, "bytes per pipelined segment of the gradient collectives' ring and tree steps (>= 64)"),
      RT_FIELD(comm, fusion_threshold, "fusion buffer bytes (0 disables fusion)"),
      RT_FIELD(comm, cycle_time_ms, "fusion engine cycle time in ms"),
      RT_FIELD(comm, cache_capacity, "tensor names the fusion engine's response cache holds, least recently used evicted (0 = off)"),
      RT_FIELD(comm, fp16_allreduce, "compress gradients to fp16 on the wire"),
      RT_FIELD(comm, timeline, "Chrome-trace timeline file (empty = off)"),
      RT_FIELD(comm, timeline_all_ranks, "every rank writes its own timeline (timeline.json -> timeline.0.json, timeline.1.json, ...), not only rank 0"),
      RT_FIELD(comm, stall_warning_s, "warn when a tensor waits for other ranks this long"),
      RT_FIELD(comm, stall_shutdown_s, "fail the job when a tensor waits this long for other ranks (0 = never)"),
      RT_FIELD(comm, collective_timeout_s, "end the job when a collective (or a pipeline stage's receive) waits this long for a rank that never comes (0 = never)"),
      RT_FIELD(comm, flight_recorder, "operations (collectives and bounded point-to-point transfers) each rank keeps in its flight recorder and writes to comm.flight_recorder_dir when a wait times out or the process gets a fatal signal; `ringtrain diagnose DIR` names the first collective the ranks disagree on (0 = off)"),
      RT_FIELD(comm, flight_recorder_dir, "directory of the flight records, one rankK.jsonl per world rank K (empty = <checkpoint.dir>/flight_recorder; nothing is written when both are empty)"),
      RT_FIELD(comm, deterministic, "static gradient buckets: bitwise-reproducible at any rank count"),
      RT_FIELD(comm, bucket_bytes, "gradient bucket size with comm.deterministic, and of ZeRO-2's reduce-scatters and ZeRO-3's parameter gathers (parallel.zero = 2, 3)"),
      RT_FIELD(comm, straggler_factor, "warn naming a rank whose compute takes more than this many times its peers' median (the ranks of its pipeline stage) in 3 consecutive log.interval intervals (0 = off; the epoch record names the slowest rank either way)"),
      RT_FIELD(comm, autotune, "the fusion engine searches fusion_threshold, cycle_time_ms and the all-reduce algorithm per size during the first steps (about autotune_samples x autotune_steps steps), seeded by a cost model of the job's own steps, and keeps the fastest; the same choice on every rank"),
      RT_FIELD(comm, autotune_samples, "comm.autotune: settings measured at most (>= 3)"),
      RT_FIELD(comm, autotune_steps, "comm.autotune: steps per measured setting (>= 2; the first after a change is not counted)"),
      RT_FIELD(comm, autotune_log, "comm.autotune: CSV written by rank 0 with each candidate, its predicted and measured step time and the choice (empty = none)"),
      RT_FIELD(parallel, pipeline, "pipeline stages (data-parallel size = ranks / (pipeline x tensor))"),
      RT_FIELD(parallel, tensor, "tensor-parallel size: the model splits its layers over this many neighbouring ranks"),
      RT_FIELD(parallel, context, "context parallelism (model 'gpt'): each sequence's tokens are split over this many ranks, rank r holding chunks r and 2P-1-r of 2P (head-tail: the causal mask's work balances); the attention crosses the split as parallel.context_mode says; a sequence not divisible by 2P is padded and the padding masked. Data-parallel size = ranks / (pipeline x tensor x context). CPU and CUDA; float32 activations (train.precision = bf16: the projections multiply in bf16, the attention core stays float32; not fp16); with parallel.tensor > 1 and parallel.sequence, each tensor rank takes 1/tensor of its context rank's tokens (docs/context_parallel.md)"),
      RT_FIELD(parallel, context_mode, "parallel.context > 1: ring = ring attention, K/V blocks travel the ring with bounded point-to-point transfers overlapped with the attention (any head count); alltoall = DeepSpeed-Ulysses, q/k/v exchanged by an all-to-all so each rank attends over the whole sequence for heads / context of the heads, the output exchanged back (4 all-to-alls per layer and pass, 2/P of the ring's bytes; parallel.context must divide model.heads / parallel.tensor) (docs/context_parallel.md)"),
      RT_FIELD(parallel, expert, "expert parallelism: the experts of model.experts are split over this many data-parallel ranks (it divides the data-parallel size and model.experts); tokens reach their experts by all-to-all, expert gradients are averaged over the ranks holding the same experts (docs/moe.md). Checkpoints store each expert under its global index, so any expert size (1 included) resumes them. Composes with parallel.pipeline, parallel.tensor (the experts replicated over the tensor ranks; with parallel.sequence each tensor rank routes its own token shard, the routing totals and the router and expert gradients summed over the tensor ranks) and parallel.zero (ZeRO then shards over the ranks holding the same experts). CPU only; not with model.init_from yet"),
      RT_FIELD(parallel, micro_batches, "micro-batches per step and replica (0 = pipeline); divides data.batch_size"),
      RT_FIELD(parallel, schedule, "afab | 1f1b | zb-h1 | interleaved | zb-v | auto | FILE.csv: the pipeline schedule (docs/parallel_layouts.md); auto picks, at start, the one the schedule simulator predicts fastest for the model's measured layer times among those holding no more activations than 1f1b; interleaved cuts the model into parallel.pipeline x parallel.virtual_stages chunks, chunk c on rank c mod pipeline (Megatron's virtual stages); zb-v into 2 x pipeline chunks in a V (rank 0 holds the first and the last); FILE.csv runs a table of actions per rank (`ringtrain train --print-schedule` writes one) after validating it"),
      RT_FIELD(parallel, virtual_stages, "parallel.schedule = interleaved: model chunks per pipeline rank (>= 2)"),
      RT_FIELD(parallel, replan_steps, "parallel.schedule = zb-h1 | zb-v: compare tables over the run's first steps, in alternate steps (N each): the unit-cost table (F, I, W per stage) against the same order with every backward whole; then the table the schedule simulator plays fastest with those costs and the measured link (the zero-bubble greedy over them or the unit-cost table, each with the backwards that are faster whole fused), where it is at least 1% faster than the unit-cost table, against the faster of the two; then run the table of the fastest median step (docs/parallel_layouts.md); 0 = keep the unit-cost table, as --print-schedule shows it"),
      RT_FIELD(parallel, link_latency_us, "the pipeline message time the schedule simulator charges (parallel.schedule = auto, --print-plan, the epoch line's prediction): latency in microseconds, plus bytes / parallel.link_gbytes_per_s; < 0 = measured by a ping-pong between neighbouring stages at start (--print-plan, one process: messages free)"),
      RT_FIELD(parallel, link_gbytes_per_s, "with parallel.link_latency_us >= 0: the pipeline link's bandwidth in GB/s (0 = a message's bytes cost nothing)"),
      RT_FIELD(parallel, partition, "uniform | params | time | list: how layers are cut into stages"),
      RT_FIELD(parallel, balance, "partition = list: layers per stage, e.g. [3, 2, 2]"),
      RT_FIELD(parallel, zero, "ZeRO stage over the data-parallel ranks: 0 = off, 1 = optimizer state sharded (reduce-scatter after the backward, slice update, all-gather), 2 = gradients sharded too (bucket reduce-scatters overlap the backward; the full gradient is released as they finish), 3 = parameters sharded too (each bucket of layers is all-gathered before its forward and again before its backward, the next one prefetched, and released after use)"),
      RT_FIELD(parallel, zero_release, "parallel.zero = 2 or 3: give the pages of the full gradient buffer back to the system once every bucket on them is reduced (a rank holds its gradient slice + the buckets in flight; whole transparent huge pages where the kernel has them, so the next backward takes one page fault per 2 MiB; a buffer of at most one such page stays). false: the full buffer stays resident (ZeRO-1's gradient memory)"),
      RT_FIELD(parallel, sequence, "sequence parallelism (Korthikanti et al. 2022) at parallel.tensor > 1: the transformer blocks of vit, gpt and [[model.layers]] transformer entries run LayerNorm, dropout, the residual stream and any MoE layer (each tensor rank routing its own tokens) on 1/tensor of the tokens, each tensor all-reduce becoming a reduce-scatter plus an all-gather; the tokens per sample must be divisible by parallel.tensor. No effect on other models"),
      RT_FIELD(checkpoint, dir, "checkpoint directory (empty = no checkpoints)"),
      RT_FIELD(checkpoint, every_epochs, "write a checkpoint every N epochs"),
      RT_FIELD(checkpoint, every_steps, "also write one every N optimizer steps, at the exact position inside an epoch (0 = off)"),
      RT_FIELD(checkpoint, every_s, "also write one after the step during which this many seconds passed since the last (rank 0's clock, agreed in the step's all-reduce; 0 = off)"),
      RT_FIELD(checkpoint, keep, "keep the last K checkpoints of this run (other runs' files are never touched)"),
      RT_FIELD(checkpoint, async, "true: training stops only to copy the state to host memory; a background thread writes the file (atomically, checksummed). A save while the previous write is in flight waits for it. The run's end and a stop wait until the file is durable. false: write before the next step"),
      RT_FIELD(checkpoint, parallel, "true, at more than one rank: every rank writes its share of the state (its tensor shards, ZeRO-1 slices and an equal part of what ranks hold alike) to its own part file, and rank 0 commits them with a manifest once all are durable; needs a checkpoint.dir that every rank sees (a shared file system). It loads at any layout like one file. false: rank 0 gathers the whole state and writes one file"),
      RT_FIELD(checkpoint, memory_every_steps, "every N optimizer steps each rank also keeps what its checkpoint part holds (same file format) in host memory that outlives the process (a file under checkpoint.memory_dir) and sends the same bytes to a buddy rank on the next node, which keeps them likewise; the step waits only for the copy to host memory, and the step after it for the snapshot to be complete on every holder, so a lost node costs at most N steps. --resume auto then continues from the newest step whose every part survives on some node, unless a disk checkpoint is as new (docs/checkpoints.md). Needs checkpoint.dir (0 = off)"),
      RT_FIELD(checkpoint, memory_dir, "where checkpoint.memory_every_steps keeps the snapshots on each node, one sub-directory per node (empty = /dev/shm/ringtrain-<name of checkpoint.dir>-<hash of its absolute path>, so runs with different checkpoint.dir never collide)"),
      RT_FIELD(checkpoint, memory_node_ranks, "for tests on one machine: every N consecutive ranks count as one node for checkpoint.memory_every_steps (its own sub-directory of checkpoint.memory_dir, buddies on the next such node); 0 = the real nodes (MPI's shared-memory split, by host name)"),
      RT_FIELD(log, format, "auto | bar | plain | json (step and epoch records as JSON lines on stderr)"),
      RT_FIELD(log, metrics, "JSON-lines metrics file (empty = <checkpoint.dir>/metrics.jsonl)"),
      RT_FIELD(log, interval, "steps between plain (or json) log lines and straggler checks"),
      RT_FIELD(log, trace_steps, "optimizer steps to trace, FIRST-LAST or one step (counted from 1 over the run, e.g. \"100-105\"): every rank's compute, communication, waits and data reading in those steps go into one Chrome-trace file (log.trace) that chrome://tracing or ui.perfetto.dev opens; empty = no trace, and no cost"),
      RT_FIELD(log, trace, "the trace file of log.trace_steps (empty = <checkpoint.dir>/trace.json, or trace.json in the working directory without a checkpoint.dir)"),
  };
  return f;
}
#undef RT_FIELD

// Edit distance (insertions, deletions, substitutions, adjacent swaps), for suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i)
    for (std::size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

std::string after_dot(const std::string& k) { return k.substr(k.find('.') + 1); }

}  // namespace

std::vector<std::string> closest_keys(const std::string& key, const std::vector<std::string>& keys) {
  // A key in the wrong section ("lr", "train.lr") matches by its name; a typo
  // by edit distance over the whole key, up to a third of its length (at most 3).
  std::vector<std::string> out;
  const std::string name = after_dot(key);
  for (const auto& k : keys)
    if (after_dot(k) == name) out.push_back(k);
  if (!out.empty()) return out;
  std::size_t best = std::min<std::size_t>(3, std::max<std::size_t>(1, key.size() / 3)) + 1;
  for (const auto& k : keys) {
    const std::size_t d = std::min(edit_distance(key, k), edit_distance(name, after_dot(k)) + (key == name ? 0 : 1));
    if (d < best) {
      best = d;
      out = {k};
    } else if (d == best) {
      out.push_back(k);
    }
  }
  if (out.size() > 3) out.resize(3);
  return out;
}

namespace {

const Field& find_field(const std::string& key) {
  // Keys that were replaced: the error names the new key, not the whole list.
  RT_CHECK(key != "parallel.shard_optimizer", "configuration key parallel.shard_optimizer was replaced by "
           "parallel.zero = 1 (ZeRO-1; parallel.zero = 2 shards the gradients too, 0 = off)");
  for (const auto& f : fields())
    if (key == f.key) return f;
  std::vector<std::string> keys;
  for (const auto& f : fields()) keys.emplace_back(f.key);
  const std::vector<std::string> near = closest_keys(key, keys);
  std::string known, hint;
  for (const auto& k : keys) known += (known.empty() ? "" : ", ") + k;
  for (const auto& k : near) hint += (hint.empty() ? "" : " or ") + ("'" + k + "'");
  if (!hint.empty()) RT_FAIL("unknown configuration key '", key, "': did you mean ", hint, "? (`ringtrain train --list-keys` lists every key)");
  RT_FAIL("unknown configuration key '", key, "' (known keys: ", known, ")");
}

template <typename T>
T parse_number(const std::string& key, const std::string& v) {
  T out{};
  const char* b = v.data();
  const char* e = v.data() + v.size();
  std::from_chars_result r;
  if constexpr (std::is_floating_point_v<T>) {
    try {
      std::size_t pos = 0;
      out = static_cast<T>(std::stod(v, &pos));
      RT_CHECK(pos == v.size() && std::isfinite(out), "");
      return out;
    } catch (...) {
      RT_FAIL("configuration key '", key, "': '", v, "' is not a finite number");
    }
  } else {
    r = std::from_chars(b, e, out);
    RT_CHECK(r.ec != std::errc::result_out_of_range, "configuration key '", key, "': ", v, " is out of range (",
             std::numeric_limits<T>::min(), " .. ", std::numeric_limits<T>::max(), ")");
    RT_CHECK(r.ec == std::errc() && r.ptr == e, "configuration key '", key, "': '", v,
             "' is not an integer", std::is_unsigned_v<T> ? " >= 0" : "");
  }
  return out;
}

void assign_text(const Field& f, TrainConfig& c, const std::string& v) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, std::string>) *p = v;
        else if constexpr (std::is_same_v<T, bool>) {
          if (v == "true" || v == "1" || v == "yes" || v == "on") *p = true;
          else if (v == "false" || v == "0" || v == "no" || v == "off") *p = false;
          else RT_FAIL("configuration key '", f.key, "': '", v, "' is not a boolean (true/false)");
        } else *p = parse_number<T>(f.key, v);
      },
      f.get(c));
}

void assign_toml(const Field& f, TrainConfig& c, const toml::node& n, const std::string& file) {
  std::visit(
      [&](auto* p) {
        using T = std::remove_pointer_t<decltype(p)>;
        auto bad = [&](const char* want) {
          RT_FAIL(file, ": key '", f.key, "' must be ", want, " (line ", n.source().begin.line, ")");
        };
        if constexpr (std::is_same_v<T, std::string>) {
          if (const toml::array* a = n.as_array()) {  // lists (parallel.balance) are kept as their text
            std::ostringstream os;
            os << *a;
            *p = os.str();
            return;
          }
          if (!n.is_string()) bad("a string");
          *p = *n.value<std::string>();
        } else if constexpr (std::is_same_v<T, bool>) {
          if (!n.is_boolean()) bad("true or false");
          *p = *n.value<bool>();
        } else if constexpr (std::is_floating_point_v<T>) {
          if (!n.is_number()) bad("a number");
          double v = *n.value<double>();
          if (!std::isfinite(v)) bad("a finite number (not inf or nan)");
          *p = v;
        } else {
          if (!n.is_integer()) bad("an integer");
          // toml++ holds integers as int64: anything beyond the field's type would wrap.
          std::int64_t v = n.as_integer()->get();
          if (std::is_unsigned_v<T> && v < 0) bad("an integer >= 0");
          if constexpr (sizeof(T) < sizeof(std::int64_t))
            if (v < static_cast<std::int64_t>(std::numeric_limits<T>::min()) ||
                v > static_cast<std::int64_t>(std::numeric_limits<T>::max()))
              bad(cat("an integer in ", std::numeric_limits<T>::min(), " .. ", std::numeric_limits<T>::max(), ", not ", v)
                      .c_str());
          *p = static_cast<T>(v);
        }
      },
      f.get(c));
}

}  // namespace

void TrainConfig::load_toml(const std::string& path) {
  toml::table tbl;
  try {
    tbl = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    if (e.source().begin.line == 0 && !e.source().path)
      RT_FAIL("cannot read config file '", path, "': ", e.description());
    RT_FAIL("config file '", path, "' line ", e.source().begin.line, ": ", e.description());
  }
  for (auto& [section, node] : tbl) {
    auto* sub = node.as_table();
    RT_CHECK(sub != nullptr, path, ": top-level key '", section.str(), "' must be a [section]");
    for (auto& [key, value] : *sub) {
      std::string full = std::string(section.str()) + "." + std::string(key.str());
      if (full == "model.layers") {
        model.layers = parse_layers_toml(value, path);
        continue;
      }
      try {
        assign_toml(find_field(full), *this, value, path);
      } catch (const Error& e) {
        std::string m = e.what();
        if (m.find(path) == std::string::npos) RT_FAIL(path, ": ", m);
        throw;
      }
    }
  }
}

void TrainConfig::set(const std::string& assignment) {
  auto eq = assignment.find('=');
  RT_CHECK(eq != std::string::npos && eq > 0, "override '", assignment, "' must look like section.key=value");
  RT_CHECK(assignment.substr(0, eq) != "model.layers", "configuration key 'model.layers' is a list of tables: give "
           "it as [[model.layers]] in the TOML file, not with --set");
  assign_text(find_field(assignment.substr(0, eq)), *this, assignment.substr(eq + 1));
}

MeshShape TrainConfig::mesh_shape() const {
  MeshShape s;
  s[Dim::pipeline] = parallel.pipeline;
  s[Dim::expert] = parallel.expert;
  s[Dim::context] = parallel.context;
  s[Dim::tensor] = parallel.tensor;
  return s;
}

void TrainConfig::validate() const {
  auto one_of = [](const std::string& key, const std::string& v, std::initializer_list<const char*> ok) {
    std::string list;
    for (auto* o : ok) {
      if (v == o) return;
      list += std::string(list.empty() ? "" : ", ") + o;
    }
    RT_FAIL("configuration key '", key, "': '", v, "' is not one of ", list);
  };
  // Every numeric key: finite, and within its range (the message names the key and the value).
  auto range = [](const char* key, double v, double lo, double hi, bool lo_open = false, bool hi_open = false) {
    bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    RT_CHECK(ok, "configuration key '", key, "' must be in ", lo_open ? "(" : "[", lo, ", ",
             hi == kHuge ? std::string("inf") : cat(hi), hi_open ? ")" : "]", ", got ", v);
  };
  RT_CHECK(is_known_model(model.name), "configuration key 'model.name': '", model.name, "' is not one of ",
           known_model_list(), registered_model_names().empty() ? " (a program of its own adds models with "
                                                                  "ringtrain::register_model)" : "");
  RT_CHECK(model.name != "layers" || !model.layers.empty(), "configuration key 'model.name' = layers needs a "
           "[[model.layers]] list in the TOML file (docs/own_model_toml.md)");
  RT_CHECK(model.name == "layers" || model.layers.empty(), "configuration key 'model.layers' is given, but "
           "model.name = '", model.name, "' does not use it: set model.name = \"layers\"");
  check_layer_descs(model.layers);
  range("model.depth", model.depth, 1, kHuge);
  RT_CHECK(model.name != "resnet" || (model.depth >= 8 && (model.depth - 2) % 6 == 0),
           "configuration key 'model.depth': resnet depth must be 6n+2 >= 8, got ", model.depth);
  range("model.width", model.width, 1, 65536);
  range("model.dropout", model.dropout, 0, 1, false, true);
  if (model.name == "vit" || model.name == "gpt") {  // the image size is checked against model.patch when the model is built
    range("model.heads", model.heads, 1, 65536);
    RT_CHECK(model.width % model.heads == 0, "configuration key 'model.heads': ", model.heads,
             " heads do not divide model.width = ", model.width);
    range("model.mlp_ratio", model.mlp_ratio, 0, 1024, true);
    range("model.patch", model.patch, 1, 65536);
    one_of("model.gelu", model.gelu, {"erf", "tanh"});
    range("model.layernorm_eps", model.layernorm_eps, 0, 1, true);
  }
  range("model.experts", model.experts, 0, 1 << 16);
  range("model.moe_every", model.moe_every, 1, 1 << 16);
  range("model.aux_loss_coeff", model.aux_loss_coeff, 0, kHuge);
  range("model.capacity_factor", model.capacity_factor, 0, kHuge);
  range("model.moe_bias_update_rate", model.moe_bias_update_rate, 0, kHuge);
  range("parallel.expert", parallel.expert, 1, 1 << 16);
  if (model.experts > 0) {
    RT_CHECK(model.name == "gpt", "configuration key 'model.experts' = ", model.experts, " is for model.name = gpt "
             "(a [[model.layers]] transformer entry takes key 'experts'), not '", model.name, "'");
    range("model.top_k", model.top_k, 1, model.experts);
    RT_CHECK(model.experts % parallel.expert == 0, "configuration key 'model.experts' = ", model.experts,
             " is not divisible by parallel.expert = ", parallel.expert);
  }
  if (parallel.expert > 1) {  // what expert parallelism does not compose with yet: named, on every rank alike
    RT_CHECK(model.experts > 0 || model.name == "layers", "parallel.expert = ", parallel.expert,
             " needs experts to split: set model.experts");
    RT_CHECK(model.init_from.empty(), "parallel.expert = ", parallel.expert, " with model.init_from is not supported yet");
    RT_CHECK(train.verify_every == 0, "parallel.expert = ", parallel.expert, " with train.verify_every = ",
             train.verify_every, " is not supported (expert weights differ between the ranks of an expert group)");
    // On CUDA the GPU validation gate decides (src/train/gpu_gate.cpp: "expert parallelism").
  }
  range("data.batch_size", data.batch_size, 1, 1 << 24);
  range("data.global_batch", static_cast<double>(data.global_batch), 0, 1LL << 40);
  range("data.prefetch", data.prefetch, 1, 1024);
  range("data.seq_len", data.seq_len, 1, 1 << 24);
  range("train.epochs", train.epochs, 1, 1e6);
  range("train.threads", train.threads, 0, 4096);
  range("train.accumulation", train.accumulation, 1, 1 << 16);
  range("train.max_steps", train.max_steps, 0, kHuge);
  range("train.verify_every", train.verify_every, 0, kHuge);
  range("train.target_accuracy", train.target_accuracy, 0, 1);
  one_of("train.device", train.device, {"auto", "cpu", "cuda"});
  one_of("train.precision", train.precision, {"fp32", "tf32", "bf16", "fp16"});
  one_of("train.recompute", train.recompute, {"none", "attention", "block"});
  one_of("optimizer.name", optimizer.name, {"sgd", "adam", "adamw", "lars", "lamb"});
  range("optimizer.lr", optimizer.lr, 0, kHuge);  // 0: the weights stay (evaluate imported weights through train)
  range("optimizer.momentum", optimizer.momentum, 0, 1, false, true);
  range("optimizer.weight_decay", optimizer.weight_decay, 0, kHuge);
  range("optimizer.beta1", optimizer.beta1, 0, 1, false, true);
  range("optimizer.beta2", optimizer.beta2, 0, 1, false, true);
  range("optimizer.eps", optimizer.eps, 0, kHuge, true);
  range("optimizer.trust_coefficient", optimizer.trust_coefficient, 0, kHuge, true);
  range("optimizer.clip_norm", optimizer.clip_norm, 0, kHuge);
  one_of("schedule.name", schedule.name, {"constant", "step", "cosine"});
  range("schedule.warmup_epochs", schedule.warmup_epochs, 0, 1e6);
  range("schedule.step_epochs", schedule.step_epochs, 0, 1e6, true);
  range("schedule.gamma", schedule.gamma, 0, kHuge, true);
  range("schedule.min_lr", schedule.min_lr, 0, kHuge);
  one_of("comm.algorithm", comm.algorithm, {"auto", "automatic", "ring", "tree", "mpi", "shm", "hierarchical"});
  range("comm.tree_threshold", static_cast<double>(comm.tree_threshold), 0, 1LL << 40);
  range("comm.segment_bytes", static_cast<double>(comm.segment_bytes), 64, 1LL << 30);
  range("comm.fusion_threshold", static_cast<double>(comm.fusion_threshold), 0, 1LL << 40);
  range("comm.cycle_time_ms", comm.cycle_time_ms, 0, 60000, true);
  range("comm.cache_capacity", static_cast<double>(comm.cache_capacity), 0, 1 << 24);
  range("comm.stall_warning_s", comm.stall_warning_s, 0, 1e7);
  range("comm.stall_shutdown_s", comm.stall_shutdown_s, 0, 1e7);
  range("comm.collective_timeout_s", comm.collective_timeout_s, 0, 1e7);
  range("comm.flight_recorder", static_cast<double>(comm.flight_recorder), 0, 1 << 24);
  range("comm.bucket_bytes", static_cast<double>(comm.bucket_bytes), 1, 1LL << 40);
  range("comm.autotune_samples", comm.autotune_samples, 3, 1000);
  range("comm.autotune_steps", comm.autotune_steps, 2, 1000);
  RT_CHECK(!comm.autotune || (!comm.deterministic && parallel.zero == 0), "comm.autotune = true tunes the fusion "
           "engine, which comm.deterministic = true and parallel.zero > 0 do not use: set comm.autotune = false");
  RT_CHECK(comm.straggler_factor == 0 || (comm.straggler_factor > 1 && comm.straggler_factor <= 1e6),
           "configuration key 'comm.straggler_factor' must be 0 (off) or in (1, 1e6], got ", comm.straggler_factor);
  range("checkpoint.every_epochs", checkpoint.every_epochs, 1, kHuge);
  range("checkpoint.every_steps", checkpoint.every_steps, 0, kHuge);
  range("checkpoint.every_s", checkpoint.every_s, 0, 1e9);
  range("checkpoint.keep", checkpoint.keep, 1, kHuge);
  range("checkpoint.memory_every_steps", checkpoint.memory_every_steps, 0, kHuge);
  range("checkpoint.memory_node_ranks", checkpoint.memory_node_ranks, 0, kHuge);
  RT_CHECK(checkpoint.memory_every_steps == 0 || !checkpoint.dir.empty(), "checkpoint.memory_every_steps = ",
           checkpoint.memory_every_steps, " needs checkpoint.dir (where a resume from memory puts the recovered parts)");
  one_of("log.format", log.format, {"auto", "bar", "plain", "json"});
  RT_CHECK(parallel.pipeline >= 1, "configuration key 'parallel.pipeline' must be >= 1, got ", parallel.pipeline);
  RT_CHECK(parallel.tensor >= 1, "configuration key 'parallel.tensor' must be >= 1, got ", parallel.tensor);
  check_context();
  RT_CHECK(parallel.micro_batches >= 0, "configuration key 'parallel.micro_batches' must be >= 1 (0 = pipeline), got ",
           parallel.micro_batches);
  const int m = pipeline_micro_batches();
  // With data.global_batch the batch is derived later, divisible by m (derive_batch).
  RT_CHECK(data.global_batch > 0 || data.batch_size % m == 0, "data.batch_size = ", data.batch_size, " is not divisible by ",
           "parallel.micro_batches = ", m);
  parse_schedule(parallel.schedule);  // names the key and the choices
  range("parallel.virtual_stages", parallel.virtual_stages, 2, 64);
  range("parallel.replan_steps", parallel.replan_steps, 0, 1000000);
  range("parallel.link_gbytes_per_s", parallel.link_gbytes_per_s, 0, kHuge);
  RT_CHECK(parallel.link_latency_us < 1e9, "configuration key 'parallel.link_latency_us' must be < 1e9, got ",
           parallel.link_latency_us);
  one_of("parallel.partition", parallel.partition, {"uniform", "params", "time", "list"});
  RT_CHECK(parallel.partition != "list" || !parallel.balance.empty(),
           "configuration key 'parallel.partition' = list needs parallel.balance (layers per stage, e.g. [3, 2, 2])");
  range("log.interval", log.interval, 1, kHuge);
  (void)trace::parse_window(log.trace_steps);  // "FIRST-LAST" or one step
  range("parallel.zero", parallel.zero, 0, 3);
  if (parallel.zero > 0) {
    RT_CHECK(!comm.fp16_allreduce, "parallel.zero = ", parallel.zero, " reduce-scatters full-precision gradients: "
             "comm.fp16_allreduce = true is not supported with it");
    RT_CHECK(!comm.deterministic, "parallel.zero = ", parallel.zero, " replaces the gradient buckets of "
             "comm.deterministic by its own reduce-scatters: set comm.deterministic = false");
  }
}

namespace {

// The shortest text that reads back as the same double (0.05, not
// 0.050000000000000003), always a TOML float: 300 -> 300.0.
std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::general);  // 0.0005, 1e-08
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::string TrainConfig::to_toml() const {
  TrainConfig copy = *this;
  std::ostringstream os;
  std::string section;
  for (const auto& f : fields()) {
    std::string key = f.key;
    auto dot = key.find('.');
    if (key.substr(0, dot) != section) {
      if (section == "model") os << layers_to_toml(copy.model.layers);  // after [model]'s keys
      section = key.substr(0, dot);
      os << (os.tellp() > 0 ? "\n" : "") << '[' << section << "]\n";
    }
    os << key.substr(dot + 1) << " = ";
    std::visit(
        [&](auto* p) {
          using T = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<T, std::string>) os << toml::value<std::string>(*p);
          else if constexpr (std::is_same_v<T, bool>) os << (*p ? "true" : "false");
          else if constexpr (std::is_floating_point_v<T>) os << toml_float(*p);
          else os << *p;
        },
        f.get(copy));
    os << "\n";
  }
  return os.str();
}

std::vector<std::string> TrainConfig::keys() {
  std::vector<std::string> out;
  for (const auto& f : fields()) {
    out.push_back(std::string(f.key) + "  — " + f.help);
    if (std::string(f.key) == "model.patch")
      out.push_back("model.layers  — model.name = layers: [[model.layers]] entries, one per top-level layer: type = "
                    "conv | linear | batchnorm | layernorm | relu | gelu | maxpool | avgpool | dropout | flatten | "
                    "residual | attention | transformer | patch_embed | token_mean (docs/own_model_toml.md)");
  }
  return out;
}

}  // namespace ringtrain
