#include "ringtrain/train/plan.hpp"

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.hpp"
#include "ringtrain/data/schema.hpp"
#include "ringtrain/parallel/partition.hpp"
#include "ringtrain/parallel/grid.hpp"
#include "ringtrain/parallel/simulator.hpp"
#include "ringtrain/train/gpu_gate.hpp"
#include "run_options.hpp"

namespace ringtrain {
namespace {

bool has_transformer(const std::vector<LayerDesc>& list) {
  for (const auto& d : list)
    if (d.type == "transformer" || has_transformer(d.layers)) return true;
  return false;
}

// The simulator's comparison (predict_schedules, the one parallel.schedule =
// auto uses), on unit stages; messages free (no time scale to charge them in).
std::vector<RunPlan::SchedulePrediction> unit_predictions(int p, int m, int v) {
  PlanInput in;
  in.ranks = p;
  in.micro_batches = m;
  in.virtual_stages = v;
  std::vector<RunPlan::SchedulePrediction> out;
  const std::vector<SchedulePrediction> all = predict_schedules(in);
  const double base = all.front().step;  // 1f1b, listed first
  for (const SchedulePrediction& x : all)
    if (x.skipped.empty()) out.push_back({schedule_name(x.kind), x.chunks, x.step / base, x.bubble, x.peak, x.busiest / base});
  return out;
}

// parallel.schedule = auto: what the start would compare, from the layers
// timed here (one process, the CPU) and the given link (parallel.link_*; a
// measured one needs the job's ranks: free here). Empty when the training
// data cannot be read (the start reports that).
std::vector<RunPlan::TimedPrediction> auto_predictions(const TrainConfig& cfg, int p, int m, std::string* pick) {
  std::vector<RunPlan::TimedPrediction> out;
  PlanInput in;
  try {
    const data::FileInfo info = data::read_file_info(data::find_split_files(cfg.data.train, "train").front());
    in.layer_costs = layer_time_costs(model_config(cfg, info), Device::cpu(),
                                      std::max(1, cfg.data.batch_size / cfg.pipeline_micro_batches()), 3,
                                      &in.layer_out_bytes);
  } catch (const Error&) {
    return out;
  }
  if (cfg.parallel.link_latency_us >= 0)
    in.link = {1e-6 * cfg.parallel.link_latency_us, 1e9 * cfg.parallel.link_gbytes_per_s};
  in.ranks = p;
  in.micro_batches = m;
  in.virtual_stages = cfg.parallel.virtual_stages;
  in.uniform_cut = cfg.parallel.partition == "uniform";
  *pick = schedule_name(pick_schedule(in));
  for (const SchedulePrediction& x : predict_schedules(in))
    out.push_back({schedule_name(x.kind), x.skipped, 1e3 * x.step, x.bubble, x.peak, 1e3 * x.busiest, x.fits});
  return out;
}

// The model's top-level layers for this job's data, or -1 when the training
// data cannot be read (the start reports that).
int top_level_layers(const TrainConfig& cfg) {
  try {
    const data::FileInfo info = data::read_file_info(data::find_split_files(cfg.data.train, "train").front());
    return static_cast<int>(plan_model_layers(model_config(cfg, info)).size());
  } catch (const Error&) {
    return -1;
  }
}

}  // namespace

RunPlan plan_run(TrainConfig cfg, int ranks) {
  RT_CHECK(ranks >= 1, "--ranks must be >= 1, got ", ranks);
  cfg.validate();
  RunPlan p;
  p.ranks = ranks;
  p.pipeline = cfg.parallel.pipeline;
  p.tensor = cfg.parallel.tensor;
  // What the model builder does (layers_model.cpp): only transformer blocks split their tokens.
  p.sequence = cfg.parallel.sequence && p.tensor > 1 &&
               (cfg.model.name == "vit" || cfg.model.name == "gpt" ||
               (cfg.model.name == "layers" && has_transformer(cfg.model.layers)));
  // The trainer's two rules, in its order: the grid, then the batch split.
  p.data = ProcessGrid::data_parallel_size(ranks, cfg.mesh_shape());
  derive_batch(cfg, p.data);
  p.schedule = cfg.parallel.schedule;
  p.zero = cfg.parallel.zero;
  p.batch_per_rank = cfg.data.batch_size;
  p.accumulation = cfg.train.accumulation;
  p.micro_batches = cfg.pipeline_micro_batches();
  p.micro_batch_size = p.batch_per_rank / p.micro_batches;
  p.global_batch = std::int64_t{p.batch_per_rank} * p.data * p.accumulation;
  if (p.pipeline > 1) {
    // The chosen schedule must run this m (its refusal names the keys), then all are compared.
    const int m = p.micro_batches * p.accumulation;
    const ScheduleKind kind = parse_schedule(cfg.parallel.schedule);
    if (kind != ScheduleKind::automatic) {  // auto: chosen at start from the model's layer times
      const Schedule table = step_schedule(kind, cfg.parallel.schedule, p.pipeline, m, cfg.parallel.virtual_stages);
      // The cut the start would refuse (parallel/parts.cpp), refused here too.
      if (const int n = top_level_layers(cfg); n >= 0) {
        const int chunks = table.layout.chunks;
        check_chunk_cut(n, p.pipeline, chunks, cfg.parallel.schedule);
        if (cfg.parallel.partition == "list")
          check_balance_list(parse_balance(cfg.parallel.balance), n, p.pipeline * chunks);
      }
    }
    p.schedules = unit_predictions(p.pipeline, m, cfg.parallel.virtual_stages);
    if (kind == ScheduleKind::automatic) p.auto_schedules = auto_predictions(cfg, p.pipeline, m, &p.auto_pick);
  }
  if (cfg.train.device == "cuda") check_gpu_gate(cfg);
  for (const GpuNeed& n : gpu_unverified(cfg)) p.gpu_refused.emplace_back(n.feature, n.setting);
  if (!gpu_storage16_allowed(cfg)) p.gpu_storage_fallback = gpu_storage16_feature(cfg);
  return p;
}

std::string RunPlan::json() const {
  nlohmann::ordered_json j;
  j["ranks"] = ranks;
  j["layout"] = {{"data", data},         {"pipeline", pipeline}, {"tensor", tensor},
                 {"sequence", sequence}, {"schedule", schedule}, {"zero", zero}};
  j["batch_per_rank"] = batch_per_rank;
  j["accumulation"] = accumulation;
  j["micro_batches"] = micro_batches;
  j["micro_batch_size"] = micro_batch_size;
  j["global_batch"] = global_batch;
  if (!schedules.empty()) {
    nlohmann::ordered_json s = nlohmann::ordered_json::array();
    for (const auto& x : schedules)
      s.push_back({{"schedule", x.name}, {"chunks_per_rank", x.chunks}, {"step_vs_1f1b", x.step_vs_1f1b},
                   {"bubble", x.bubble}, {"peak_activations", x.peak_activations},
                   {"busiest_rank_vs_1f1b", x.busiest_vs_1f1b}});
    j["schedules_unit_time"] = s;
  }
  if (!auto_pick.empty()) {
    nlohmann::ordered_json s = nlohmann::ordered_json::array();
    for (const auto& x : auto_schedules) {
      nlohmann::ordered_json e = {{"schedule", x.name}};
      if (!x.skipped.empty()) e["left_out"] = x.skipped;
      else e.update({{"step_ms", x.step_ms}, {"bubble", x.bubble}, {"peak_activations", x.peak_activations},
                     {"busiest_rank_ms", x.busiest_rank_ms}, {"fits", x.fits}});
      s.push_back(e);
    }
    j["schedule_auto"] = {{"pick", auto_pick}, {"predicted", s}};
  }
  // The gate's whole list, then what it says about this job on CUDA.
  nlohmann::ordered_json gate, verified = nlohmann::ordered_json::array(), refused = nlohmann::ordered_json::array();
  for (const GpuVerified& v : gpu_verified())
    verified.push_back({{"feature", v.feature}, {"date", v.date}, {"card", v.card}, {"evidence", v.evidence}});
  for (const auto& [feature, setting] : gpu_refused) refused.push_back({{"feature", feature}, {"setting", setting}});
  gate["verified"] = verified;
  gate["on_cuda"] = gpu_refused.empty() ? "allowed" : "refused";
  gate["refused"] = refused;
  gate["storage_fallback"] = gpu_storage_fallback;
  j["gpu_gate"] = gate;
  return j.dump(2);
}

}  // namespace ringtrain
