// A rank's model state under checkpoint names, tensor-parallel shards whole
// and ZeRO-1 slices gathered where a whole tensor is asked for, and the flat
// replicated state that replicas broadcast and compare.
#include "ringtrain/parallel/model_state.hpp"

#include <memory>
#include <set>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/named_tensors.hpp"
#include "ringtrain/engine/engine.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "ringtrain/parallel/updater.hpp"

namespace ringtrain {
namespace {

// The parameter a "param/<name>" or "optim/<slot>/<name>" state name belongs to (nullptr: none).
const ParamInfo* param_of_name(const ParamArena& a, const std::string& name) {
  std::string pname;
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
    if (a.info(i).name == pname) return &a.info(i);
  return nullptr;
}

// The shard of the parameter or buffer a state name belongs to (nullptr: replicated or neither).
const ShardSpec* shard_of_name(const ParamArena& a, const std::vector<NamedBuffer>& buffers, const std::string& name) {
  if (name.rfind("buffer/", 0) == 0) {
    for (const auto& b : buffers)
      if (b.name == name.substr(7)) return b.shard.sharded() ? &b.shard : nullptr;
    return nullptr;
  }
  const ParamInfo* p = param_of_name(a, name);
  return p && p->shard.sharded() ? &p->shard : nullptr;
}

// An expert's weight split over the expert ranks (nn/moe.hpp at parallel.expert
// > 1) or its optimizer state: held by the expert-data ranks alone, and only
// this rank's experts, under their global names ("...experts.<e>....").
bool split_expert(const ParamArena& a, const std::string& name) {
  const ParamInfo* p = param_of_name(a, name);
  return p && !p->reduce_over.has(Dim::expert);
}

// A tied weight's copy (the last stage's LM head, ParamInfo::copy_of) and its
// optimizer state: equal to the owner's, written by the owner's stage alone.
bool tied_copy(const ParamArena& a, const std::string& name) {
  const ParamInfo* p = param_of_name(a, name);
  return p && p->copy_of >= 0;
}

Tensor on_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

// A state tensor that several ranks hold alike, and where it sits in its whole tensor.
struct Held {
  std::string name;
  Tensor t;
  PiecePlace place;
};

// Writer `j` of `n`: its byte range [total·j/n, total·(j+1)/n) of the tensors'
// concatenation, as pieces cut at element boundaries (the same cut on both sides
// of a boundary, so the writers' pieces tile every tensor).
void take_share(const std::vector<Held>& ts, int n, int j, std::vector<StatePiece>& out) {
  std::size_t total = 0;
  for (const Held& h : ts) total += h.t.nbytes();
  const std::size_t lo = total * static_cast<std::size_t>(j) / static_cast<std::size_t>(n);
  const std::size_t hi = total * static_cast<std::size_t>(j + 1) / static_cast<std::size_t>(n);
  std::size_t at = 0;
  for (const Held& h : ts) {
    const std::size_t esz = dtype_size(h.t.dtype()), count = static_cast<std::size_t>(h.t.numel());
    auto first_at = [&](std::size_t byte) { return byte <= at ? 0 : std::min(count, (byte - at + esz - 1) / esz); };
    const std::size_t b = first_at(lo), e = first_at(hi);
    at += h.t.nbytes();
    if (e <= b) continue;
    PiecePlace p = h.place;
    p.begin = static_cast<std::int64_t>(b);
    out.push_back({h.name, h.t.flat_view(static_cast<std::int64_t>(b), static_cast<std::int64_t>(e - b)), p});
  }
}

// A ZeRO slice's checkpoint name: "param/<name>" (ZeRO-3) or "optim/<slot>/<name>".
std::string slice_name(const ShardedOptimizer::StateSlice& sl, const ParamInfo& pi) {
  return sl.slot == "param" ? "param/" + pi.name : "optim/" + sl.slot + "/" + pi.name;
}

}  // namespace

ModelState::ModelState(const ProcessGrid& grid, Stage& stage, Updater& updater)
    : grid_(grid), stage_(stage), updater_(updater) {}

NamedState ModelState::named(Optimizer* whole_opt) {
  NamedState out;
  ParamArena& a = stage_.arena();
  for (std::size_t i = 0; i < a.size(); ++i) out.emplace_back("param/" + a.info(i).name, a.param(i));
  for (auto& b : stage_.buffers()) out.emplace_back("buffer/" + b.name, b.tensor);
  Optimizer* opt = updater_.zero() ? whole_opt : updater_.optimizer();
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

NamedState ModelState::replicated() {
  NamedState out;
  const ParamArena& a = stage_.arena();
  for (DType dt : a.dtypes()) out.emplace_back(cat("param.", dtype_name(dt)), a.params_flat(dt));
  for (auto& b : stage_.buffers()) out.emplace_back("buffer." + b.name, b.tensor);
  if (Optimizer* opt = updater_.optimizer())  // ZeRO-1 slices differ between replicas by design
    for (auto& [name, t] : opt->state()) out.emplace_back("optim." + name, t);
  return out;
}

NamedState ModelState::tied() {
  NamedState out;
  const ParamArena& a = stage_.arena();
  for (std::size_t i : a.tied()) out.emplace_back("param/" + a.info(i).name, a.param(i));
  return out;
}

void ModelState::broadcast() {
  // Over the group the parameters are averaged over (the mesh's data x context):
  // the ranks that hold the same replica of this stage and shard.
  const std::vector<DimSet> sets = stage_.arena().reduce_sets();
  if (sets.size() > 1) {  // expert weights (nn/moe.hpp): each parameter over its own group, at the start of a run
    // (Buffers and optimizer state are not broadcast: a fresh run's are alike, a resumed run reads its own.)
    const ParamArena& a = stage_.arena();
    for (std::size_t i = 0; i < a.size(); ++i) {
      const Communicator& g = grid_.reduce_group(a.info(i).reduce_over);
      if (g.size() == 1) continue;
      std::vector<Tensor> one{a.param(i)};  // broadcast_tensors stages device tensors; a raw pointer would not
      broadcast_tensors(one, 0, g);
    }
    return;
  }
  const Communicator& group = grid_.reduce_group(sets.empty() ? kDenseReduce : sets.front());
  if (group.size() == 1) return;
  std::vector<Tensor> ts;
  for (auto& [name, t] : replicated()) ts.push_back(t);
  broadcast_tensors(ts, 0, group);
  if (LossScaler* sc = updater_.scaler()) {
    double s[4];
    sc->save(s);
    ringtrain::broadcast(s, 4, DType::f64, 0, group);
    sc->load(s);
  }
}

NamedState ModelState::whole_stage(Optimizer* whole_opt) {
  NamedState out = named(whole_opt);
  for (auto& [name, t] : out) t = on_host(t);
  if (grid_.tp_size() == 1) return out;
  const TensorGroup g = TensorGroup::of(grid_.tp());
  const auto buffers = stage_.buffers();
  for (auto& [name, t] : out)
    if (const ShardSpec* s = shard_of_name(stage_.arena(), buffers, name)) t = ringtrain::gather_whole(t, *s, g);
  return out;
}

NamedState ModelState::gather_whole(int root) {
  if (ShardedOptimizer* zero = updater_.zero()) zero->materialize();  // ZeRO-3: the parameters whole
  // ZeRO-1: the replica's whole optimizer state on its data-parallel rank 0 first.
  std::unique_ptr<Optimizer> whole_opt = updater_.zero() ? updater_.zero()->gather(0) : nullptr;
  // Context ranks hold the replica alike: its context rank 0 speaks for it.
  const bool head = grid_.dp_rank() == 0 && grid_.cp_rank() == 0;
  // Expert parallelism: data rank 0's other expert ranks (dp ranks 1..EP-1)
  // hold the other experts; each adds its experts' weights and optimizer state.
  const int ep = grid_.ep_size();
  const bool expert_head = ep > 1 && grid_.dp_rank() > 0 && grid_.dp_rank() < ep && grid_.cp_rank() == 0;
  NamedState mine;
  if (head) mine = whole_stage(whole_opt.get());  // over tp
  if (expert_head)
    for (auto& [name, t] : whole_stage(whole_opt.get()))
      if (split_expert(stage_.arena(), name)) mine.emplace_back(name, t);
  whole_opt.reset();
  const Communicator& w = grid_.world();
  const bool sends = (head || expert_head) && grid_.tp_rank() == 0;
  if (w.rank() != root) {
    if (sends) send_named(mine, root, w);
    return {};
  }
  NamedState out;
  std::set<std::string> seen;
  for (int s = 0; s < grid_.pp_size(); ++s)
    for (int e = 0; e < ep; ++e) {  // stage s's dense state and experts, then its other experts
      const int from = grid_.world_rank_of(0, e, s);
      auto part = from == root ? mine : recv_named(from, w);
      for (auto& [name, t] : part)
        if (seen.insert(name).second) out.emplace_back(name, t);
    }
  return out;
}

std::vector<StatePiece> ModelState::pieces() {
  const ParamArena& a = stage_.arena();
  const auto buffers = stage_.buffers();
  // ZeRO-3 before its first step (or after a materialize): the slices take the whole arena's values.
  if (ShardedOptimizer* z = updater_.zero()) z->ensure_sharded();
  const ShardedOptimizer* zero = updater_.zero();
  // Tensor-parallel shards are held alike by the data-parallel group, the rest by tensor x data.
  std::vector<Held> shards, replicated, experts;
  std::vector<StatePiece> out;
  const bool sharded_params = zero && zero->params_sharded();
  for (auto& [name, t] : named()) {
    if (name == "optim/step" && !grid_.first_stage()) continue;  // every stage holds it alike
    if (sharded_params && name.rfind("param/", 0) == 0) continue;  // ZeRO-3: from the slices below
    if (tied_copy(a, name)) continue;
    const ShardSpec* s = shard_of_name(a, buffers, name);
    if (s) shards.push_back({name, t, {s->global, *s, 0}});
    else if (split_expert(a, name)) experts.push_back({name, t, {t.shape(), {}, 0}});
    else replicated.push_back({name, t, {t.shape(), {}, 0}});
  }
  if (zero) {
    // ZeRO-1: each rank holds its own slice (alike on the tensor ranks for a replicated parameter);
    // ZeRO-3 its slice of the parameters too.
    auto slices = zero->state_slices();
    if (sharded_params)
      for (auto& sl : zero->param_slices()) slices.push_back(sl);
    for (auto& sl : slices) {
      const ParamInfo& pi = a.info(sl.param);
      if ((!pi.shard.sharded() && grid_.tp_rank() != 0) || pi.copy_of >= 0) continue;
      // Expert parallelism: ZeRO shards over data x context, so the dense slices
      // are alike on every expert rank; expert rank 0's are written.
      if (pi.reduce_over == kDenseReduce && grid_.mesh().coord(Dim::expert) != 0) continue;
      PiecePlace p = pi.shard.sharded() ? PiecePlace{pi.shard.global, pi.shard, sl.begin} : PiecePlace{pi.shape, {}, sl.begin};
      out.push_back({slice_name(sl, pi), sl.data, p});
    }
    if (grid_.first_stage()) {
      Tensor step = Tensor::empty({1}, DType::i64);
      step.data<std::int64_t>()[0] = zero->steps();
      replicated.push_back({"optim/step", step, {{1}, {}, 0}});
    }
  }
  // Held alike over data x context (the mesh's replicas of this stage and shard).
  const int dp = grid_.dp_size() * grid_.cp_size(), me = grid_.dp_rank() * grid_.cp_size() + grid_.cp_rank();
  take_share(shards, dp, me, out);
  take_share(replicated, dp * grid_.tp_size(), grid_.tp_rank() * dp + me, out);
  // This rank's experts: held alike by the ranks of its expert coordinate (data x context).
  const int ep = grid_.ep_size(), xd = (grid_.dp_size() / ep) * grid_.cp_size();
  take_share(experts, xd, (grid_.dp_rank() / ep) * grid_.cp_size() + grid_.cp_rank(), out);
  return out;
}

ModelState::Restoration ModelState::restoration(bool with_optimizer) {
  Restoration r;
  auto staged = std::make_shared<std::vector<std::pair<Tensor, Tensor>>>();  // (device tensor, its host copy)
  auto add = [&](const std::string& name, Tensor t, const PiecePlace& place) {
    if (!t.numel()) return;
    if (!t.device().is_cpu()) {
      Tensor host = Tensor::empty(t.shape(), t.dtype());
      staged->emplace_back(t, host);
      t = host;
    }
    r.pieces.push_back({name, t.flat_view(0, t.numel()), place});
  };
  const ParamArena& a = stage_.arena();
  const auto buffers = stage_.buffers();
  ShardedOptimizer* zero = updater_.zero();
  const bool sharded_params = zero && zero->params_sharded();
  for (auto& [name, t] : named()) {  // with ZeRO-1: parameters and buffers only; ZeRO-3: buffers only
    if (!with_optimizer && name.rfind("optim/", 0) == 0) continue;
    if (sharded_params && name.rfind("param/", 0) == 0) continue;
    const ShardSpec* s = shard_of_name(a, buffers, name);
    add(name, t, s ? PiecePlace{s->global, *s, 0} : PiecePlace{t.shape(), {}, 0});
  }
  if (zero) {
    std::vector<ShardedOptimizer::StateSlice> slices;
    if (with_optimizer) slices = zero->state_slices();
    if (sharded_params)
      for (auto& sl : zero->param_slices()) slices.push_back(sl);
    for (auto& sl : slices) {
      const ParamInfo& pi = a.info(sl.param);
      add(slice_name(sl, pi), sl.data,
          pi.shard.sharded() ? PiecePlace{pi.shard.global, pi.shard, sl.begin} : PiecePlace{pi.shape, {}, sl.begin});
    }
    if (with_optimizer) add("optim/step", zero->step_state(), {{1}, {}, 0});
  }
  r.finish = [staged, zero, sharded_params] {
    for (auto& [dev, host] : *staged) dev.copy_from(host);
    if (sharded_params) zero->mark_sharded();  // ZeRO-3: the slices were read; they own the parameters
  };
  return r;
}

}  // namespace ringtrain
