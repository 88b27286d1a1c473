#include "ringtrain/parallel/partition.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <numeric>
#include <sstream>

#include "ringtrain/core/error.hpp"
#include "ringtrain/nn/backend.hpp"
#include "ringtrain/nn/language.hpp"
#include "ringtrain/nn/model.hpp"

namespace ringtrain {

PartitionKind parse_partition(const std::string& s) {
  if (s == "uniform") return PartitionKind::uniform;
  if (s == "params") return PartitionKind::params;
  if (s == "time") return PartitionKind::time;
  if (s == "list") return PartitionKind::list;
  RT_FAIL("configuration key 'parallel.partition': '", s, "' is not one of uniform, params, time, list");
}

namespace {
void check_stages(int layers, int stages) {
  RT_CHECK(stages >= 1, "parallel.pipeline must be >= 1, got ", stages);
  RT_CHECK(stages <= layers, "parallel.pipeline = ", stages, " stages, but the model has only ", layers,
           " top-level layers (residual blocks stay whole)");
}
}  // namespace

std::vector<int> balance_uniform(int layers, int stages) {
  check_stages(layers, stages);
  std::vector<int> out(stages, layers / stages);
  for (int i = 0; i < layers % stages; ++i) ++out[i];
  return out;
}

std::vector<int> balance_by_cost(const std::vector<double>& cost, int stages) {
  const int n = static_cast<int>(cost.size());
  check_stages(n, stages);
  std::vector<double> pre(n + 1, 0);
  for (int i = 0; i < n; ++i) pre[i + 1] = pre[i] + cost[i];
  const double inf = std::numeric_limits<double>::infinity();
  // best[k][i]: smallest max-stage cost putting the first i layers in k stages.
  std::vector<std::vector<double>> best(stages + 1, std::vector<double>(n + 1, inf));
  std::vector<std::vector<int>> cut(stages + 1, std::vector<int>(n + 1, 0));
  best[0][0] = 0;
  for (int k = 1; k <= stages; ++k)
    for (int i = k; i <= n; ++i)
      for (int j = k - 1; j < i; ++j) {
        double v = std::max(best[k - 1][j], pre[i] - pre[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<int> out(stages);
  for (int k = stages, i = n; k > 0; --k) {
    out[k - 1] = i - cut[k][i];
    i = cut[k][i];
  }
  return out;
}

std::vector<int> check_balance_list(const std::vector<int>& counts, int layers, int stages) {
  check_stages(layers, stages);
  std::ostringstream os;
  for (std::size_t i = 0; i < counts.size(); ++i) os << (i ? ", " : "") << counts[i];
  RT_CHECK(static_cast<int>(counts.size()) == stages, "parallel.balance = [", os.str(), "] has ", counts.size(),
           " entries for parallel.pipeline = ", stages, " stages");
  for (int c : counts) RT_CHECK(c >= 1, "parallel.balance = [", os.str(), "]: every stage needs at least one layer");
  RT_CHECK(std::accumulate(counts.begin(), counts.end(), 0) == layers, "parallel.balance = [", os.str(), "] sums to ",
           std::accumulate(counts.begin(), counts.end(), 0), ", but the model has ", layers, " top-level layers");
  return counts;
}

void check_chunk_cut(int layers, int pipeline, int chunks, const std::string& schedule) {
  // One chunk per rank: the partition names parallel.pipeline itself.
  RT_CHECK(chunks == 1 || layers >= pipeline * chunks, "parallel.schedule = ", schedule, " cuts the model into ",
           pipeline * chunks, " chunks (parallel.pipeline = ", pipeline, " x ", chunks, " per rank), but the model has "
           "only ", layers, " top-level layers");
}

std::vector<int> parse_balance(const std::string& s) {
  std::vector<int> out;
  std::string t;
  for (char c : s)
    if (c != '[' && c != ']' && c != ' ') t += c;
  std::stringstream ss(t);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      std::size_t pos = 0;
      out.push_back(std::stoi(item, &pos));
      RT_CHECK(pos == item.size(), "");
    } catch (...) {
      RT_FAIL("configuration key 'parallel.balance': '", s, "' is not a list of layer counts like [3, 2, 2]");
    }
  }
  return out;
}

std::vector<double> layer_param_costs(const std::vector<LayerPlan>& plan) {
  std::vector<double> out;
  for (const LayerPlan& l : plan) out.push_back(1.0 + static_cast<double>(l.numel));
  return out;
}

// One layer at a time, each in an arena of its own that is freed before the
// next: the probe never holds more than one layer's parameters and activations.
std::vector<double> layer_time_costs(const ModelConfig& mc, Device dev, std::int64_t batch, int reps,
                                     std::vector<double>* out_bytes) {
  using Clock = std::chrono::steady_clock;
  std::vector<LayerPtr> layers = build_model_layers(mc, dev);
  // The earlier layers' parameters, registered (never allocated) by a second
  // list: a tied LM head timed alone holds a copy of its embedding's weight.
  std::vector<LayerPtr> shadow = build_model_layers(mc, dev);
  ParamArena before;
  Shape s = model_input_shape(mc, batch);
  std::vector<double> out;
  for (std::size_t i = 0; i < layers.size(); ++i) {
    Layer& l = *layers[i];
    split_tied_layers(layers, static_cast<int>(i), static_cast<int>(i) + 1, before);
    ParamArena a;
    a.set_index_base(before.next_model_index());  // model index of the layer's first parameter
    l.register_params(a, static_cast<int>(i), "");
    shadow[i]->register_params(before, static_cast<int>(i), "");
    a.finalize(dev);
    l.bind(BindContext{backend_for(dev), dev, a, mc.seed, mc.math});
    l.init(a, mc.seed);
    Tensor x = Tensor::empty(s, DType::f32, dev);
    {
      Tensor h = Tensor::empty(s, DType::f32);
      const bool ids = mc.seq_len > 0 && i == 0;  // a language model's token ids
      for (std::int64_t k = 0; k < h.numel(); ++k)
        h.data<float>()[k] = ids ? float((k * 7919) % mc.classes) : float((k * 7919) % 255) / 255.f - 0.5f;
      x.copy_from(h);
    }
    std::vector<double> t;
    for (int r = 0; r < reps + 1; ++r) {  // the first round warms caches and kernel plans
      auto t0 = Clock::now();
      Tensor y = l.forward(x, Mode::train);
      Tensor g = Tensor::empty(y.shape(), DType::f32, y.device());
      g.fill_(1.0 / static_cast<double>(g.numel()));
      l.backward(g, i > 0, false);
      backend_for(dev).synchronize();
      if (r > 0) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    s = l.output_shape(s);
    if (out_bytes) out_bytes->push_back(4.0 * static_cast<double>(shape_numel(s)));
    layers[i].reset();  // frees its activations; the arena goes with this scope
    std::sort(t.begin(), t.end());
    out.push_back(t[t.size() / 2]);
  }
  return out;
}

}  // namespace ringtrain
