// The trainer's checkpoints: where they go, when they are written, how a run
// continues from one, and how a signal stop ends.
#include <cstring>
#include <filesystem>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/signals.hpp"
#include "run_state.hpp"
#include "trainer_impl.hpp"

namespace fs = std::filesystem;

namespace ringtrain {

// At start-up: checkpoint.dir exists or can be made (an error names the key,
// once, from rank 0; before any training, so it is a bad-input error).
void Trainer::Impl::create_checkpoint_dir() {
  if (cfg.checkpoint.dir.empty()) return;
  run_on_root(world, "preparing checkpoint.dir", [&] {
    std::error_code ec;
    fs::create_directories(cfg.checkpoint.dir, ec);
    RT_CHECK(!ec && fs::is_directory(cfg.checkpoint.dir), "checkpoint.dir = '", cfg.checkpoint.dir,
             "' cannot be created: ", ec ? ec.message() : "a file of that name exists");
  });
}

// At the start of fit(): no temporary files of this run left by a kill or a full disk.
void Trainer::Impl::remove_stale_temps() {
  if (cfg.checkpoint.dir.empty() || world.rank() != 0) return;
  int n = CheckpointDir(cfg.checkpoint.dir, cfg.checkpoint.keep).remove_stale_temps(pos.run_id);
  if (n) log::info("checkpoint.dir: removed ", n, " temporary file(s) of run ", pos.run_id, " left by an interrupted write");
}

// Writes the position as it stands. Every `checkpoint.every_epochs` epochs,
// or always with `force` (the run ends: last epoch, train.max_steps, signal).
void Trainer::Impl::save_checkpoint(bool force) {
  if (cfg.checkpoint.dir.empty()) return;
  if (!force && pos.epochs_done % cfg.checkpoint.every_epochs != 0) return;
  std::string path;
  if (zero) whole = zero->gather(0);  // ZeRO-1: the whole optimizer state onto rank 0 (collective)
  run_on_root(world, "writing a checkpoint", [&] {
    CheckpointDir dir(cfg.checkpoint.dir, cfg.checkpoint.keep);
    CheckpointData d = make_checkpoint(*model, state_optimizer(), cfg, pos);
    d.tensors = run_state();
    path = dir.save(pos.run_id, pos.step, d, hooks.checkpoint_write_hook);
  });
  whole.reset();
  last_checkpoint = path;
  if (world.rank() == 0 && hooks.report) log::info("checkpoint written: ", path);
}

void Trainer::Impl::announce_stop(std::int64_t steps_in_epoch) {
  if (world.rank() != 0) return;
  const int mine = hooks.stop_signal ? hooks.stop_signal() : 0;
  const std::string what = stop_signal > 0 ? cat(StopSignals::name(stop_signal), " on rank 0")
                                           : mine ? std::string(StopSignals::name(mine)) : "a stop signal on another rank";
  log::warn("stopped by ", what, " at step ", pos.step, " (epoch ", pos.epochs_done + 1, ", step ", steps_in_epoch,
            " of ", steps_per_epoch(), ")",
            last_checkpoint.empty() ? std::string("; no checkpoint.dir, so nothing was saved")
                                    : cat("; checkpoint written: ", last_checkpoint,
                                          "; continue with --resume ", cfg.checkpoint.dir, " (or --resume auto)"));
}

// Rank 0 finds and reads the checkpoint, then broadcasts; an unusable one is
// an error on every rank. Returns false when --resume auto found nothing.
bool Trainer::Impl::load(const std::string& path, bool with_optimizer) {
  const bool automatic = path == "auto";
  std::int64_t scalars[8] = {};
  char run_id[64] = {};
  int found = 0;
  if (zero && with_optimizer) whole = zero->make_whole(0);  // ZeRO-1: rank 0 restores the whole state
  run_on_root(world, "loading a checkpoint", [&] {
    std::string where = path;
    std::function<void(const CheckpointData&)> accept;
    if (automatic) {
      RT_CHECK(!cfg.checkpoint.dir.empty(), "--resume auto needs checkpoint.dir (where to look)");
      where = cfg.checkpoint.dir;
      std::error_code ec;
      if (!fs::is_directory(where, ec) || CheckpointDir(where, 1).list().empty()) {
        log::info("--resume auto: no checkpoint in ", where, ": starting a new run");
        return;
      }
      accept = [&](const CheckpointData& d) {
        auto it = d.strings.find("fingerprint");
        RT_CHECK(it != d.strings.end() && it->second == pos.fingerprint,
                 "written by a run of another configuration or rank count");
      };
    }
    FoundCheckpoint f;
    try {
      f = find_intact_checkpoint(where, accept);
    } catch (const Error& e) {
      if (!automatic) throw;
      log::info("--resume auto: no usable checkpoint of this configuration in ", where, ": starting a new run (",
                e.what(), ")");
      return;
    }
    for (const auto& s : f.skipped) log::warn("skipped checkpoint ", s);
    RunPosition p = restore_checkpoint(f.data, *model, with_optimizer ? state_optimizer() : nullptr);
    if (with_optimizer) run_state::check_resumable(p, f.path, cfg, world.size());
    // The loss scale continues where it was (a checkpoint of an fp32 run has none: start afresh).
    bool has_amp = false;
    for (auto& [name, t] : f.data.tensors) has_amp |= name == "amp.loss_scale";
    if (scaler && with_optimizer && has_amp) {
      restore_tensor(f.data, "amp.loss_scale", scaler_state);
      scaler->load(scaler_state.data<double>());
    }
    for (auto& [d, t] : dropout_calls) {
      const std::string name = "rng/" + d->name() + ".calls";
      bool has = false;
      for (auto& [n, x] : f.data.tensors) has |= n == name;
      if (with_optimizer && has) {
        restore_tensor(f.data, name, t);
        d->set_call_count(static_cast<std::uint64_t>(t.data<std::int64_t>()[0]));
      }
    }
    found = 1;
    scalars[0] = p.epochs_done;
    scalars[1] = p.step;
    scalars[2] = p.step_in_epoch;
    scalars[3] = p.resumes;
    std::snprintf(run_id, sizeof run_id, "%s", p.run_id.c_str());
    if (hooks.report)
      log::info("loaded checkpoint ", f.path, " (run ", p.run_id, ", epoch ", p.epochs_done + (p.step_in_epoch ? 1 : 0),
                p.step_in_epoch ? cat(" step ", p.step_in_epoch, " of ", steps_per_epoch()) : std::string(" done"),
                ", global step ", p.step, ")");
  });
  broadcast(&found, 1, DType::i32, 0, world);
  if (!found) {
    whole.reset();
    return false;
  }
  broadcast(scalars, 8, DType::i64, 0, world);
  broadcast(run_id, sizeof run_id, DType::u8, 0, world);
  broadcast_state();
  if (zero && with_optimizer) zero->scatter(whole.get(), 0);  // ZeRO-1: each rank takes its slice
  whole.reset();
  if (with_optimizer) {
    pos.epochs_done = scalars[0];
    pos.step = scalars[1];
    pos.step_in_epoch = scalars[2];
    pos.resumes = scalars[3] + 1;
    pos.run_id = run_id;
    resumed = true;
  }
  return true;
}

}  // namespace ringtrain
