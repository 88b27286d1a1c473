// The trainer's side of checkpoints (the logic of writing, finding and
// checking them is checkpoint_session.cpp): what the state is on every layout
// and how it is restored. ModelState names the state per parameter at every
// layout: whole on rank 0 for one file, each rank's pieces for parallel parts,
// each rank's own targets on load; checkpoint.async copies it with a Snapshot.
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "train/trainer_impl.hpp"

namespace ringtrain {

NamedTensorList Trainer::Impl::extra_state() {
  NamedTensorList s;
  if (LossScaler* sc = parts.updater->scaler()) {
    sc->save(scaler_state.data<double>());
    s.emplace_back("amp.loss_scale", scaler_state);
  }
  return s;
}

// Rank 0 gets the whole state (collective). One rank on the host without ZeRO-1
// (whose gather makes a new whole optimizer each time): its views, listed once.
bool Trainer::Impl::local_views() const {
  return world.size() == 1 && device.is_cpu() && !parts.updater->zero();
}

NamedTensorList Trainer::Impl::whole_for_checkpoint() {
  const bool local = local_views();
  if (local && whole_views.empty()) whole_views = parts.state->gather_whole(0);
  NamedTensorList all = local ? whole_views : parts.state->gather_whole(0);
  if (world.rank() == 0)
    for (auto& e : extra_state()) all.emplace_back(e.first, e.second.clone());  // small, and live
  return all;
}

// This rank's share, no communication; everything in it views live memory.
std::vector<StatePiece> Trainer::Impl::pieces_for_checkpoint() {
  std::vector<StatePiece> pieces = parts.state->pieces();
  if (world.rank() == 0)
    for (auto& [name, t] : extra_state()) pieces.push_back({name, t.flat_view(0, t.numel()), {t.shape(), {}, 0}});
  return pieces;
}

// checkpoint.async: the snapshot's blocks allocated and touched at the run's
// start where this rank's snapshot is local (parallel parts, or one rank),
// so the first checkpoint stalls no longer than the others.
void Trainer::Impl::prepare_snapshot() {
  if (ckpt.memory().on()) memory_snapshot_copy.prepare(pieces_for_checkpoint());
  if (cfg.checkpoint.dir.empty() || !cfg.checkpoint.async) return;
  if (ckpt.parallel()) snapshot.prepare(pieces_for_checkpoint());
  else if (local_views()) snapshot.prepare(whole_for_checkpoint());
}

// Every `checkpoint.every_epochs` epochs, or always with `force` (the run ends:
// last epoch, train.max_steps, signal).
void Trainer::Impl::save_checkpoint(bool force) {
  // The position was just saved (checkpoint.every_steps on train.max_steps' step): the same file again.
  if (saved_at_step == pos.step) return;
  const auto t0 = Clock::now();
  bool saved = false;
  CheckpointSession::StateSource state;
  state.whole = [&] {
    saved = true;
    NamedTensorList all = whole_for_checkpoint();
    if (world.rank() == 0 && cfg.checkpoint.async) snapshot.take(all);
    return all;
  };
  state.pieces = [&] {
    saved = true;
    std::vector<StatePiece> pieces = pieces_for_checkpoint();
    if (cfg.checkpoint.async) snapshot.take(pieces);
    return pieces;
  };
  std::string path = ckpt.save(force, state);
  if (!path.empty()) last_checkpoint = path;
  if (saved) {
    saved_at_step = pos.step;
    checkpoint_stalls_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
}

// The same share as a parallel checkpoint's part, copied at the step boundary;
// the helper thread builds its file, keeps it and sends it to the buddy.
void Trainer::Impl::memory_snapshot() {
  // The previous step's snapshot complete on every holder before this step is
  // reported (the helper had one step's time): a node lost later costs <= k steps.
  if (memory_saved_at >= 0 && memory_saved_at == pos.step - 1) {
    const auto t0 = Clock::now();
    ckpt.memory_settle();
    memory_stalls_s.back() += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  if (!ckpt.memory_due(pos.step) || memory_saved_at == pos.step) return;
  memory_saved_at = pos.step;
  const auto t0 = Clock::now();
  ckpt.memory_save([&] {
    std::vector<StatePiece> pieces = pieces_for_checkpoint();
    for (StatePiece& p : pieces)
      if (p.name == "amp.loss_scale") p.data = p.data.clone();  // rewritten by every save: private
    memory_snapshot_copy.take(pieces);
    return pieces;
  });
  memory_stalls_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
}

// Each rank reads only what it holds (its stage, its tensor shards, its
// ZeRO-1 slices) straight into its state, so any layout loads any checkpoint
// and no rank holds the whole state.
bool Trainer::Impl::load(const std::string& path, bool with_optimizer) {
  ModelState::Restoration state;
  CheckpointSession::Restore r;
  r.targets = [&](bool with_opt) {
    state = parts.state->restoration(with_opt);
    std::vector<ReadTarget> ts;
    for (auto& p : state.pieces) ts.push_back({p.name, p.data, p.place});
    // The loss scale continues where it was (a checkpoint of an fp32 run has none: start afresh).
    if (with_opt && parts.updater->scaler())
      ts.push_back({"amp.loss_scale", scaler_state, {scaler_state.shape(), {}, 0}, /*optional=*/true});
    return ts;
  };
  r.finish = [&](const std::vector<ReadTarget>& ts) {
    state.finish();
    for (const ReadTarget& t : ts)
      if (t.name == "amp.loss_scale" && t.found) parts.updater->scaler()->load(scaler_state.data<double>());
  };
  return ckpt.load(path, with_optimizer, r, steps_per_epoch());
}

}  // namespace ringtrain
