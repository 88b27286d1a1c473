// GridModel's state: per-parameter names for checkpoints with tensor-parallel
// shards whole and ZeRO-1 slices gathered (the file layout — "param/<name>",
// "buffer/<name>", "optim/<slot>/<name>" — is the same at every layout, so a
// run saved at tensor 2 x pipeline 2 resumes at data 4 and back), the flat
// replicated state that replicas broadcast and compare.
#include <set>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/named_tensors.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/parallel/grid_model.hpp"

namespace ringtrain {
namespace {

// The shard of the parameter or buffer a state name belongs to (nullptr: replicated or neither).
const ShardSpec* shard_of_name(const ParamArena& a, const std::vector<NamedBuffer>& buffers, const std::string& name) {
  std::string pname;
  if (name.rfind("buffer/", 0) == 0) {
    for (const auto& b : buffers)
      if (b.name == name.substr(7)) return b.shard.sharded() ? &b.shard : nullptr;
    return nullptr;
  }
  if (name.rfind("param/", 0) == 0) {
    pname = name.substr(6);
  } else if (name.rfind("optim/", 0) == 0) {
    const auto slash = name.find('/', 6);
    if (slash == std::string::npos) return nullptr;  // "optim/step"
    pname = name.substr(slash + 1);
  } else {
    return nullptr;
  }
  for (std::size_t i = 0; i < a.size(); ++i)
    if (a.info(i).name == pname) return a.info(i).shard.sharded() ? &a.info(i).shard : nullptr;
  return nullptr;
}

Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

}  // namespace

std::vector<std::pair<std::string, Tensor>> GridModel::named_state() {
  std::vector<std::pair<std::string, Tensor>> out;
  ParamArena& a = stage_->arena();
  for (std::size_t i = 0; i < a.size(); ++i) out.emplace_back("param/" + a.info(i).name, a.param(i));
  for (auto& b : stage_->buffers()) out.emplace_back("buffer/" + b.name, b.tensor);
  Optimizer* opt = zero_ ? whole_opt_.get() : opt_.get();
  if (!opt) return out;
  for (auto& [kind, t] : opt->state()) {
    if (kind == "step") {
      out.emplace_back("optim/step", t);
      continue;
    }
    // "<dtype>.<slot>" flat buffers share the arena's layout: slice per parameter.
    const std::string slot = kind.substr(kind.find('.') + 1);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const ParamInfo& pi = a.info(i);
      if (kind.rfind(std::string(dtype_name(pi.dtype)) + ".", 0) != 0) continue;
      out.emplace_back("optim/" + slot + "/" + pi.name,
                       t.flat_view(static_cast<std::int64_t>(pi.offset), shape_numel(pi.shape)).reshape(pi.shape));
    }
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> GridModel::replicated_state() {
  std::vector<std::pair<std::string, Tensor>> out;
  const ParamArena& a = stage_->arena();
  for (DType dt : a.dtypes()) out.emplace_back(cat("param.", dtype_name(dt)), a.params_flat(dt));
  for (auto& b : stage_->buffers()) out.emplace_back("buffer." + b.name, b.tensor);
  if (opt_)  // ZeRO-1 slices differ between replicas by design
    for (auto& [name, t] : opt_->state()) out.emplace_back("optim." + name, t);
  return out;
}

void GridModel::broadcast_state() {
  if (grid_.dp_size() == 1) return;
  std::vector<Tensor> ts;
  for (auto& [name, t] : replicated_state()) ts.push_back(t);
  broadcast_tensors(ts, 0, grid_.dp());
  if (scaler_) {
    double s[4];
    scaler_->save(s);
    broadcast(s, 4, DType::f64, 0, grid_.dp());
    scaler_->load(s);
  }
}

std::vector<std::pair<std::string, Tensor>> GridModel::whole_state() {
  auto out = named_state();
  for (auto& [name, t] : out) t = on_host(t);
  if (grid_.tp_size() == 1) return out;
  const TensorGroup g = TensorGroup::of(grid_.tp());
  const auto buffers = stage_->buffers();
  for (auto& [name, t] : out)
    if (const ShardSpec* s = shard_of_name(stage_->arena(), buffers, name)) t = gather_whole(t, *s, g);
  return out;
}

std::vector<std::pair<std::string, Tensor>> GridModel::gather_whole_state(int root) {
  // ZeRO-1: the replica's whole optimizer state on its data-parallel rank 0 first.
  if (zero_) whole_opt_ = zero_->gather(0);
  auto mine = grid_.dp_rank() == 0 ? whole_state() : std::vector<std::pair<std::string, Tensor>>{};  // over tp
  whole_opt_.reset();
  const Communicator& w = grid_.world();
  const bool sends = grid_.dp_rank() == 0 && grid_.tp_rank() == 0;
  if (w.rank() != root) {
    if (sends) send_named(mine, root, w);
    return {};
  }
  std::vector<std::pair<std::string, Tensor>> out;
  std::set<std::string> seen;
  for (int s = 0; s < grid_.pp_size(); ++s) {
    const int from = grid_.world_rank_of(0, 0, s);
    auto part = from == root ? mine : recv_named(from, w);
    for (auto& [name, t] : part)
      if (seen.insert(name).second) out.emplace_back(name, t);
  }
  return out;
}

std::vector<std::pair<std::string, Tensor>> GridModel::whole_names(bool with_optimizer) {
  // ZeRO-1: data-parallel rank 0 names the optimizer state (an empty whole copy, dropped at once).
  if (zero_ && with_optimizer) whole_opt_ = zero_->make_whole(0);
  std::vector<std::pair<std::string, Tensor>> out;
  const auto buffers = stage_->buffers();
  for (auto& [name, local] : named_state()) {
    if (!with_optimizer && name.rfind("optim/", 0) == 0) continue;
    const ShardSpec* s = shard_of_name(stage_->arena(), buffers, name);
    out.emplace_back(name, s ? Tensor::empty(s->global, local.dtype()) : Tensor::empty(local.shape(), local.dtype()));
  }
  whole_opt_.reset();
  return out;
}

void GridModel::restore_whole_state(const std::function<bool(const std::string&, Tensor& whole)>& fill,
                                    bool with_optimizer) {
  // ZeRO-1: data-parallel rank 0 of each stage restores the optimizer whole, then every rank takes its slice.
  if (zero_ && with_optimizer) whole_opt_ = zero_->make_whole(0);
  const auto buffers = stage_->buffers();
  for (auto& [name, local] : named_state()) {
    if (!with_optimizer && name.rfind("optim/", 0) == 0) continue;
    const ShardSpec* s = shard_of_name(stage_->arena(), buffers, name);
    Tensor whole = s ? Tensor::empty(s->global, local.dtype()) : on_host(local);
    if (!fill(name, whole)) continue;
    if (s) local.copy_from(shard_of(whole, *s));
    else if (!local.device().is_cpu()) local.copy_from(whole);
  }
  if (zero_ && with_optimizer) {
    zero_->scatter(whole_opt_.get(), 0);
    whole_opt_.reset();
  }
}

}  // namespace ringtrain
