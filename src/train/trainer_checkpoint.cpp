// The trainer's side of checkpoints (the logic of writing, finding and
// checking them is checkpoint_session.cpp): what the state is on every layout
// and how it is restored. The grid model hands over its state per parameter,
// tensor shards whole and ZeRO-1 slices gathered, so one file serves every layout.
#include <algorithm>

#include "ringtrain/train/checkpoint.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {

NamedTensorList Trainer::Impl::extra_state() {
  NamedTensorList s;
  if (LossScaler* sc = gm->scaler()) {
    sc->save(scaler_state.data<double>());
    s.emplace_back("amp.loss_scale", scaler_state);
  }
  return s;
}

// checkpoint.async: the gathered tensors become a private host snapshot. A
// tensor received from another rank, gathered from shards or copied off the
// GPU is one already; a view of this rank's live host memory (its parameters,
// buffers, optimizer state) is copied, so its bytes are copied exactly once.
void Trainer::Impl::snapshot(NamedTensorList& state) {
  std::vector<std::pair<const char*, const char*>> live;
  for (auto& [name, t] : gm->replicated_state())
    if (t.device().is_cpu() && t.nbytes()) {
      const char* p = static_cast<const char*>(t.raw());
      live.emplace_back(p, p + t.nbytes());
    }
  for (std::size_t i = 0; i < state.size(); ++i) {
    auto& [name, t] = state[i];
    const char* p = static_cast<const char*>(t.raw());
    const bool shared = !t.device().is_cpu() || std::any_of(live.begin(), live.end(), [&](const auto& r) {
      return p >= r.first && p < r.second;
    });
    if (!shared) continue;
    // The last snapshot's buffer (its write is over: CheckpointSession::save waited before
    // gathering): fresh pages would cost more than the copy itself. The buffers are owned
    // here and by the write job, so a trainer ending mid-write never frees them under it.
    // (The copy is the whole stall: 45 ms for vit's 303 MB, docs/failures.md.)
    if (i < snapshot_pool.size() && snapshot_pool[i].first == name && snapshot_pool[i].second.dtype() == t.dtype() &&
        snapshot_pool[i].second.shape() == t.shape()) {
      snapshot_pool[i].second.copy_from(t);
      t = snapshot_pool[i].second;
    } else {
      t = t.device().is_cpu() ? t.clone() : t.to(Device::cpu());
    }
  }
  snapshot_pool.clear();
  for (auto& [name, t] : state) snapshot_pool.emplace_back(name, t);
}

// Every `checkpoint.every_epochs` epochs, or always with `force` (the run ends:
// last epoch, train.max_steps, signal).
void Trainer::Impl::save_checkpoint(bool force) {
  // The position was just saved (checkpoint.every_steps on train.max_steps' step): the same file again.
  if (saved_at_step == pos.step) return;
  const auto t0 = Clock::now();
  bool saved = false;
  std::string path = ckpt.save(force, [&] {
    // World rank 0 gathers every stage's whole state (collective on every rank).
    saved = true;
    NamedTensorList all = gm->gather_whole_state(0);
    if (world.rank() == 0) {
      for (auto& e : extra_state()) all.emplace_back(e.first, e.second.clone());  // small, and live
      if (cfg.checkpoint.async) snapshot(all);
    }
    return all;
  });
  if (!path.empty()) last_checkpoint = path;
  if (saved) {
    saved_at_step = pos.step;
    checkpoint_stalls_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
}

// Every rank receives the checkpoint; each checks and takes the names it owns
// (its stage, its part of a tensor shard, its ZeRO-1 slice), so any layout
// loads any checkpoint.
bool Trainer::Impl::load(const std::string& path, bool with_optimizer) {
  CheckpointSession::Restore r;
  r.wanted = [&](bool with_opt) { return gm->whole_names(with_opt); };
  r.apply = [&](const CheckpointData& ck, bool with_opt) {
    gm->restore_whole_state([&](const std::string& name, Tensor& whole) {
      restore_tensor(ck, name, whole);
      return true;
    }, with_opt);
    if (!with_opt) return;
    // The loss scale continues where it was (a checkpoint of an fp32 run has none: start afresh).
    for (auto& [name, t] : ck.tensors)
      if (name == "amp.loss_scale" && gm->scaler()) {
        restore_tensor(ck, name, scaler_state);
        gm->scaler()->load(scaler_state.data<double>());
      }
  };
  return ckpt.load(path, with_optimizer, r, steps_per_epoch());
}

}  // namespace ringtrain
