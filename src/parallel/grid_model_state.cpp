// GridModel's checkpoint state with tensor-parallel shards whole: the file
// layout ("param/<name>", "buffer/<name>", "optim/<slot>/<name>") is the same at any
// parallel.tensor, so a run saved at tensor 2 resumes at tensor 1 and back.
#include <cmath>
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

}  // namespace

std::vector<std::pair<std::string, Tensor>> GridModel::whole_state() {
  auto out = named_state();
  if (grid_.tp_size() == 1) return out;
  const TensorGroup g = TensorGroup::of(grid_.tp());
  const auto buffers = stage_->buffers();
  for (auto& [name, t] : out)
    if (const ShardSpec* s = shard_of_name(stage_->arena(), buffers, name)) t = gather_whole(t, *s, g);
  return out;
}

std::vector<std::pair<std::string, Tensor>> GridModel::gather_whole_state(int root) {
  auto mine = whole_state();  // collective over the tensor group
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

void GridModel::restore_whole_state(const std::function<bool(const std::string&, Tensor& whole)>& fill) {
  const auto buffers = stage_->buffers();
  for (auto& [name, local] : named_state()) {
    const ShardSpec* s = shard_of_name(stage_->arena(), buffers, name);
    if (!s) {
      fill(name, local);
      continue;
    }
    Tensor whole = Tensor::empty(s->global, local.dtype());
    if (fill(name, whole)) local.copy_from(shard_of(whole, *s));
  }
}

double GridModel::clip_grads(double max_norm) {
  double sq = tensor_grad_sq_norm(stage_->arena(), grid_.tp_rank());
  if (grid_.tp_size() > 1) allreduce(&sq, &sq, 1, DType::f64, ReduceOp::sum, grid_.tp());
  if (grid_.pp_size() > 1) allreduce(&sq, &sq, 1, DType::f64, ReduceOp::sum, grid_.pp());
  const double norm = std::sqrt(sq), scale = max_norm / (norm + 1e-6);
  if (scale < 1)
    for (DType dt : stage_->arena().dtypes()) {
      Tensor g = stage_->arena().grads_flat(dt);
      float* p = g.data<float>();
      for (std::int64_t k = 0; k < g.numel(); ++k) p[k] = static_cast<float>(p[k] * scale);
    }
  return norm;
}

}  // namespace ringtrain
