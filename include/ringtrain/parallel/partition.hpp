#pragma once
// Cutting a model's top-level layers into p contiguous pipeline stages.
//   uniform  layer counts as equal as possible
//   params   balance the parameter counts
//   time     balance measured forward+backward times (torchgpipe's balance_by_time)
//   list     explicit layer counts per stage (parallel.balance = [3, 2, 2])
// Cost-based policies minimise the largest stage cost (exact, by dynamic
// programming over the cut points); every stage gets at least one layer.
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/nn/model.hpp"

namespace ringtrain {


enum class PartitionKind { uniform, params, time, list };
PartitionKind parse_partition(const std::string& s);  // Error names parallel.partition

// Layer counts per stage. Errors name the values: more stages than layers,
// a list of the wrong length / sum / with a zero entry.
std::vector<int> balance_uniform(int layers, int stages);
std::vector<int> balance_by_cost(const std::vector<double>& cost, int stages);
std::vector<int> check_balance_list(const std::vector<int>& counts, int layers, int stages);
// A schedule of `chunks` model chunks per rank over `pipeline` ranks needs at
// least pipeline x chunks top-level layers; the Error names the schedule and
// the keys (the start and --print-plan both check it).
void check_chunk_cut(int layers, int pipeline, int chunks, const std::string& schedule);
// "[3, 2, 2]" or "3,2,2" -> {3, 2, 2}; Error naming parallel.balance otherwise.
std::vector<int> parse_balance(const std::string& s);

// Per top-level layer costs: parameter counts (+1 so that layers without
// parameters still weigh something), or seconds of one forward and backward
// of each layer alone on a random micro-batch of `batch` samples (median of
// `reps`; the layers are built one at a time, never the whole model at once).
std::vector<double> layer_param_costs(const std::vector<LayerPlan>& plan);
// out_bytes (optional): each layer's output bytes at this batch (f32), the
// message a stage cut after it sends.
std::vector<double> layer_time_costs(const ModelConfig& mc, Device dev, std::int64_t batch, int reps = 3,
                                     std::vector<double>* out_bytes = nullptr);

}  // namespace ringtrain
