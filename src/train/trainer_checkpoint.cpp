// The data-parallel trainer's side of checkpoints (the logic both trainers
// share is checkpoint_session.cpp): what its state is, and how it is restored.
#include "ringtrain/train/checkpoint.hpp"
#include "trainer_impl.hpp"

namespace ringtrain {

// Every `checkpoint.every_epochs` epochs, or always with `force` (the run ends:
// last epoch, train.max_steps, signal).
void Trainer::Impl::save_checkpoint(bool force) {
  std::string path = ckpt.save(force, [&] {
    // Gather the whole named state on world rank 0 — collective on every rank.
    // A replicated optimizer: rank 0's own state is the whole; ZeRO-1 gathers its slices first.
    if (zero) whole = zero->gather(0);
    return world.rank() == 0 ? run_state() : NamedTensorList{};
  });
  whole.reset();
  if (!path.empty()) last_checkpoint = path;
}

// Every rank receives the checkpoint and restores the same bytes (no broadcast afterwards).
bool Trainer::Impl::load(const std::string& path, bool with_optimizer) {
  // ZeRO-1: rank 0 restores the optimizer state whole, then every rank takes its slice.
  if (zero && with_optimizer) whole = zero->make_whole(0);
  CheckpointSession::Restore r;
  r.wanted = [&](bool with_opt) { return model_state(*model, with_opt ? state_optimizer() : nullptr); };
  r.apply = [&](const CheckpointData& ck, bool with_opt) {
    for (auto& [name, t] : model_state(*model, with_opt ? state_optimizer() : nullptr)) restore_tensor(ck, name, t);
    if (!with_opt) return;
    auto has = [&](const std::string& name) {
      for (auto& [n, x] : ck.tensors)
        if (n == name) return true;
      return false;
    };
    // The loss scale continues where it was (a checkpoint of an fp32 run has none: start afresh).
    if (scaler && has("amp.loss_scale")) {
      restore_tensor(ck, "amp.loss_scale", scaler_state);
      scaler->load(scaler_state.data<double>());
    }
    for (auto& [d, t] : dropout_calls) {
      const std::string name = "rng/" + d->name() + ".calls";
      if (!has(name)) continue;
      restore_tensor(ck, name, t);
      d->set_call_count(static_cast<std::uint64_t>(t.data<std::int64_t>()[0]));
    }
  };
  const bool found = ckpt.load(path, with_optimizer, r, steps_per_epoch());
  if (found && zero && with_optimizer) zero->scatter(whole.get(), 0);
  whole.reset();
  return found;
}

}  // namespace ringtrain
