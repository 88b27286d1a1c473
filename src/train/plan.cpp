#include "ringtrain/train/plan.hpp"

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.hpp"
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

std::vector<RunPlan::SchedulePrediction> predict_schedules(int p, int m, int v) {
  std::vector<RunPlan::SchedulePrediction> out;
  double base = 0;
  for (ScheduleKind k : {ScheduleKind::one_f_one_b, ScheduleKind::afab, ScheduleKind::zb_h1, ScheduleKind::interleaved,
                         ScheduleKind::zb_v}) {
    if (k == ScheduleKind::interleaved && m % p != 0) continue;
    const Schedule s = make_schedule(k, p, m, v);
    const int c = s.layout.chunks;
    SimCosts costs;
    costs.stage.assign(static_cast<std::size_t>(s.layout.stages()), StageCost{1.0 / c, 1.0 / c, 1.0 / c});
    const SimResult r = simulate(s, costs);
    if (k == ScheduleKind::one_f_one_b) base = r.makespan;
    int peak = 0;
    for (int x : r.peak) peak = std::max(peak, x);
    out.push_back({schedule_name(k), c, r.makespan / base, r.mean_bubble(), double(peak) / c});
  }
  return out;
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
               (cfg.model.name == "vit" || (cfg.model.name == "layers" && has_transformer(cfg.model.layers)));
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
    if (kind != ScheduleKind::automatic)  // auto: chosen at start from the model's layer times
      step_schedule(kind, cfg.parallel.schedule, p.pipeline, m, cfg.parallel.virtual_stages);
    p.schedules = predict_schedules(p.pipeline, m, cfg.parallel.virtual_stages);
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
                   {"bubble", x.bubble}, {"peak_activations", x.peak_activations}});
    j["schedules_unit_time"] = s;
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
