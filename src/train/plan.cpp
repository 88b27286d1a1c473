#include "ringtrain/train/plan.hpp"

#include <nlohmann/json.hpp>

#include "ringtrain/core/error.hpp"
#include "ringtrain/parallel/grid.hpp"
#include "run_options.hpp"

namespace ringtrain {
namespace {

bool has_transformer(const std::vector<LayerDesc>& list) {
  for (const auto& d : list)
    if (d.type == "transformer" || has_transformer(d.layers)) return true;
  return false;
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
  p.data = ProcessGrid::data_parallel_size(ranks, {cfg.parallel.pipeline, cfg.parallel.tensor});
  derive_batch(cfg, p.data);
  p.schedule = cfg.parallel.schedule;
  p.zero = cfg.parallel.zero;
  p.batch_per_rank = cfg.data.batch_size;
  p.accumulation = cfg.train.accumulation;
  p.micro_batches = cfg.pipeline_micro_batches();
  p.micro_batch_size = p.batch_per_rank / p.micro_batches;
  p.global_batch = std::int64_t{p.batch_per_rank} * p.data * p.accumulation;
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
  return j.dump(2);
}

}  // namespace ringtrain
