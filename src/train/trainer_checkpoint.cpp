// The trainer's side of checkpoints (the logic of writing, finding and
// checking them is checkpoint_session.cpp): what the state is on every layout
// and how it is restored. The grid model hands over its state per parameter,
// tensor shards whole and ZeRO-1 slices gathered, so one file serves every layout.
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

// Every `checkpoint.every_epochs` epochs, or always with `force` (the run ends:
// last epoch, train.max_steps, signal).
void Trainer::Impl::save_checkpoint(bool force) {
  std::string path = ckpt.save(force, [&] {
    // World rank 0 gathers every stage's whole state (collective on every rank).
    NamedTensorList all = gm->gather_whole_state(0);
    if (world.rank() == 0)
      for (auto& e : extra_state()) all.push_back(e);
    return all;
  });
  if (!path.empty()) last_checkpoint = path;
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
