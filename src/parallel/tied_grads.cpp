// A weight tied across pipeline stages (a language model's token embedding on
// the first stage, the LM head's copy of it on the last: nn/language.hpp): the
// two gradients are summed between the stages, over grid.ends() (our
// all-reduce; at 2 ranks both get the same bits, a + b), so that both copies
// take the same update and stay bitwise equal.
//
// When: the sum must give both ends the same bits after the data-parallel
// synchronisation too.
//  - All-reduce (the engine) or none: after it. Each end then holds its
//    replicas' average and both add the same two averages: the same bits at
//    any data-parallel size and algorithm, however differently the two stages'
//    buffers were fused or chunked. avg(g1) + avg(g2) = avg(g1 + g2), Megatron's
//    order (finish_grad_sync, then the embedding group's all-reduce), and the
//    engine keeps reducing every layer during the backward.
//  - ZeRO-1/2: the reduce-scatter leaves each rank a slice of the stage's flat
//    buffer, cut differently on the two stages, so the sum comes before it: the
//    layers holding the tied weight reach the inner part only at finish(),
//    after the sum. (Not when their gradient is ready: the head's is complete
//    early in the last stage's backward, the embedding's at the very end of
//    the first stage's, which needs the last stage's input gradients to get
//    there; a stage waiting inside its backward would never send them.) Both
//    ends then reduce the same values; at up to 2 replicas (or with shm) each
//    element is summed in the same order on both stages, and beyond that the
//    Updater gives the copy its owner's values after the step
//    (Updater::resync_tied). ZeRO-2 on the last stage starts its
//    reduce-scatters at the end of the backward (its first bucket holds the head).
// Whatever part of the weight the stage holds (the whole weight, or its tensor
// rank's shard when it is split) is summed with the other end's same part: the
// ends share their tensor coordinate.
#include <algorithm>

#include <string>
#include <vector>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/parallel/grad_sync.hpp"
#include "ringtrain/parallel/stage.hpp"

namespace ringtrain {
namespace {

class TiedGradSync final : public GradSync {
 public:
  TiedGradSync(const ProcessGrid& grid, Stage& stage, std::unique_ptr<GradSync> inner, std::vector<std::size_t> tied,
               bool before)
      : ends_(grid.ends()), stage_(stage), inner_(std::move(inner)), tied_(std::move(tied)), before_(before),
        held_back_(static_cast<std::size_t>(stage.num_layers()), 0) {
    if (before_)  // the local layers (numbered over the rank's chunks) that hold a tied parameter
      for (int l = 0; l < stage.num_layers(); ++l)
        for (std::size_t p : stage.layer(l).params())
          if (std::find(tied_.begin(), tied_.end(), p) != tied_.end()) held_back_[static_cast<std::size_t>(l)] = 1;
  }
  const char* kind() const override { return inner_->kind(); }
  void begin_step() override {
    held_.clear();
    inner_->begin_step();
  }
  void layer_ready(int l) override {
    if (held_back_[static_cast<std::size_t>(l)]) held_.push_back(l);
    else inner_->layer_ready(l);
  }
  void finish() override {
    if (!before_) inner_->finish();
    const ParamArena& a = stage_.arena();
    for (std::size_t p : tied_) {
      Tensor g = a.grad(p);
      CollectiveOptions o;
      o.device = g.device();
      allreduce(g.raw(), g.raw(), static_cast<std::size_t>(g.numel()), g.dtype(), ReduceOp::sum, ends_, o);
    }
    if (!before_) return;
    for (int l : held_) inner_->layer_ready(l);  // in the order the backward made them
    held_.clear();
    inner_->finish();
  }
  const Engine* engine() const override { return inner_->engine(); }
  bool shards_grads() const override { return inner_->shards_grads(); }
  std::size_t grad_bytes_in_flight() const override { return inner_->grad_bytes_in_flight(); }
  ParamAccess* param_access() override { return inner_->param_access(); }
  std::size_t param_bytes_in_flight() const override { return inner_->param_bytes_in_flight(); }

 private:
  Communicator ends_;
  Stage& stage_;
  std::unique_ptr<GradSync> inner_;
  std::vector<std::size_t> tied_;
  const bool before_;            // sum before the inner part sees the tied layers (ZeRO), else after it
  std::vector<char> held_back_;  // per local layer: it holds a tied parameter (before_ only)
  std::vector<int> held_;        // this step's held-back layers, as they became ready
};

}  // namespace

void check_tied_stages(const ProcessGrid& grid, Stage& stage) {
  const ParamArena& a = stage.arena();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const ParamInfo& p = a.info(i);
    RT_CHECK(p.copy_of < 0 || grid.last_stage(), "pipeline stage ", grid.pp_rank(), " of ", grid.pp_size(),
             " (layers [", stage.first_layer(), ", ", stage.end_layer(), ")) holds a tied LM head's copy of ", p.name,
             ": the head must be on the last stage (its embedding's gradient is summed with the last stage's): "
             "change parallel.balance");
    RT_CHECK(!p.copied || grid.first_stage(), "pipeline stage ", grid.pp_rank(), " of ", grid.pp_size(),
             " (layers [", stage.first_layer(), ", ", stage.end_layer(), ")) holds ", p.name, ", tied to an LM head "
             "on a later stage: the embedding must be on the first stage (its gradient is summed with the last "
             "stage's): change parallel.balance");
  }
}

std::unique_ptr<GradSync> with_tied_grads(const ProcessGrid& grid, Stage& stage, std::unique_ptr<GradSync> inner) {
  std::vector<std::size_t> tied = stage.arena().tied();
  if (tied.empty()) return inner;
  const bool before = inner->shards_grads() || std::string(inner->kind()) == "sharded";  // ZeRO-1/2
  return std::make_unique<TiedGradSync>(grid, stage, std::move(inner), std::move(tied), before);
}

}  // namespace ringtrain
