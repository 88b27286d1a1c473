#include "session.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <unordered_map>
#include <utility>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "ringtrain/train/signals.hpp"
#include "train/run_state.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

// Rank 0's list of strings on every rank.
void share(std::vector<std::string>& v, const Communicator& world) {
  std::string joined;
  for (const auto& s : v) joined += s + '\n';
  std::uint64_t n = joined.size();
  broadcast(&n, 1, DType::i64, 0, world);
  joined.resize(n);
  if (n) broadcast(joined.data(), n, DType::u8, 0, world);
  v.clear();
  std::string line;
  for (char c : joined)
    if (c != '\n') line += c;
    else v.push_back(std::exchange(line, std::string()));
}

bool restorable(const std::string& name, bool with_optimizer) {
  return name.rfind("param/", 0) == 0 || name.rfind("buffer/", 0) == 0 ||
         (with_optimizer && name.rfind("optim/", 0) == 0);
}

std::string layout_str(std::int64_t pipeline, std::int64_t tensor, std::int64_t dp, std::int64_t ranks) {
  return cat("pipeline ", pipeline, " x tensor ", tensor, " x data ", dp, " (", ranks, " rank", ranks == 1 ? "" : "s",
             ")");
}

}  // namespace

CheckpointSession::CheckpointSession(const TrainConfig& cfg, const Communicator& world, const TrainerHooks& hooks,
                                     RunPosition& pos)
    : cfg_(cfg), world_(world), hooks_(hooks), pos_(pos) {}

void CheckpointSession::describe_run(std::int64_t params, int pipeline, int tensor, int data_parallel,
                                     std::int64_t steps_per_epoch) {
  pos_.ranks = world_.size();
  pos_.seed = static_cast<std::int64_t>(cfg_.train.seed);
  pos_.batch_size = cfg_.data.batch_size;
  pos_.accumulation = cfg_.train.accumulation;
  pos_.params = params;
  pos_.pipeline = pipeline;
  pos_.tensor = tensor;
  pos_.data_parallel = data_parallel;
  pos_.steps_per_epoch = steps_per_epoch;
  config_toml_ = cfg_.to_toml();  // the configuration is final now; every checkpoint stores it
  pos_.identity = run_state::run_identity(
      cfg_, std::int64_t{cfg_.data.batch_size} * data_parallel * cfg_.train.accumulation);
}

void CheckpointSession::create_dir() {
  if (cfg_.checkpoint.dir.empty()) return;
  run_on_root(world_, "preparing checkpoint.dir", [&] {
    std::error_code ec;
    fs::create_directories(cfg_.checkpoint.dir, ec);
    RT_CHECK(!ec && fs::is_directory(cfg_.checkpoint.dir), "checkpoint.dir = '", cfg_.checkpoint.dir,
             "' cannot be created: ", ec ? ec.message() : "a file of that name exists");
  });
}

void CheckpointSession::start_run() {
  if (pos_.run_id.empty()) {
    char id[64] = {};  // rank 0 names a fresh run, so every rank agrees
    if (world_.rank() == 0) std::snprintf(id, sizeof id, "%s", run_state::new_run_id().c_str());
    broadcast(id, sizeof id, DType::u8, 0, world_);
    pos_.run_id = id;
  }
  if (cfg_.checkpoint.dir.empty() || world_.rank() != 0) return;
  int n = CheckpointDir(cfg_.checkpoint.dir, cfg_.checkpoint.keep).remove_stale_temps(pos_.run_id);
  if (n)
    log::info("checkpoint.dir: removed ", n, " temporary file(s) or uncommitted part file(s) of run ", pos_.run_id,
              " left by an interrupted write");
}

void CheckpointSession::truncate_metrics(const std::string& metrics) const {
  if (metrics.empty()) return;
  int dropped = run_state::truncate_metrics(metrics, pos_.run_id, pos_.epochs_done);
  if (dropped)
    log::info("metrics: dropped ", dropped, " epoch record(s) of run ", pos_.run_id, " after epoch ", pos_.epochs_done,
              " from ", metrics, " (the resumed run writes them again)");
}

// One path for every checkpoint: each rank that writes builds its file's data
// and writes it (in the background with checkpoint.async); once every rank's
// file is durable, commit() makes the checkpoint current — rank 0 writes the
// manifest naming the parts (parallel), then rotates. A one-file checkpoint is
// the case where rank 0 alone writes, and the file itself is the checkpoint.
std::string CheckpointSession::save(bool force, const StateSource& state) {
  if (cfg_.checkpoint.dir.empty()) return "";
  if (!force && pos_.epochs_done % cfg_.checkpoint.every_epochs != 0) return "";
  // The previous write ends first (one snapshot at a time, and its memory is
  // free to take the next); its error ends the run here, on every rank.
  settle();
  const CheckpointDir dir(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  const std::string path = dir.path_for(pos_.run_id, pos_.step);
  std::string file;  // what this rank writes ("" nothing), and its data
  CheckpointData mine;
  Pending p;
  p.step = pos_.step;
  if (parallel()) {  // this rank's pieces, no communication; rank 0 names every part in the manifest
    file = dir.part_path_for(pos_.run_id, pos_.step, world_.rank(), world_.size());
    mine.part_of = fs::path(path).filename().string();
    for (const StatePiece& sp : state.pieces()) {
      mine.tensors.emplace_back(sp.name, sp.data);
      mine.places.push_back(sp.place);
    }
    if (world_.rank() == 0) {
      p.manifest = checkpoint_data({}, config_toml_, pos_);
      for (int r = 0; r < world_.size(); ++r)
        p.manifest.parts.push_back(fs::path(dir.part_path_for(pos_.run_id, pos_.step, r, world_.size())).filename());
    }
  } else {  // the whole named state gathered on rank 0 (collective), written there as the checkpoint itself
    NamedTensorList whole = state.whole();
    if (world_.rank() == 0) {
      file = path;
      mine = checkpoint_data(std::move(whole), config_toml_, pos_);
    }
  }
  pending_ = std::move(p);
  auto write = [file, hook = hooks_.checkpoint_write_hook, report = hooks_.report, data = std::move(mine)] {
    if (file.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    write_checkpoint(file, data, hook);
    if (report && data.part_of.empty())
      log::info("checkpoint written: ", file, " (",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s)");
  };
  if (cfg_.checkpoint.async) {
    if (!file.empty()) writer_.submit(std::move(write));
  } else {
    run_agreed(world_, "writing a checkpoint", write);
    run_agreed(world_, "committing a checkpoint", [&] { commit(false); });
  }
  last_save_ = std::chrono::steady_clock::now();
  return world_.rank() == 0 ? path : std::string();
}

void CheckpointSession::commit(bool background) {
  if (!pending_) return;
  if (world_.rank() == 0) {
    auto write = [dir = CheckpointDir(cfg_.checkpoint.dir, cfg_.checkpoint.keep), run_id = pos_.run_id,
                  step = pending_->step, data = std::move(pending_->manifest), report = hooks_.report] {
      if (data.parts.empty()) return dir.rotate(run_id);  // one file: its rename committed it
      std::string written = dir.save(run_id, step, data);
      if (report) log::info("checkpoint written: ", written, " (", data.parts.size(), " parts)");
    };
    if (background) writer_.submit(std::move(write));
    else write();
  }
  pending_.reset();
}

void CheckpointSession::after_step(bool all_ready) {
  if (pending_ && all_ready) commit(true);
}

void CheckpointSession::settle() {
  if (cfg_.checkpoint.dir.empty()) return;
  // Every rank's write durable, or the failure on every rank, naming the rank.
  run_agreed(world_, "writing a checkpoint", [&] { writer_.wait(); });
  if (pending_) run_agreed(world_, "writing a checkpoint's manifest", [&] { commit(false); });
}

void CheckpointSession::finish() {
  settle();
  memory_.finish();
}

void CheckpointSession::memory_save(const std::function<std::vector<StatePiece>()>& pieces) {
  memory_.wait();  // its memory is the next snapshot's
  CheckpointData part = checkpoint_data({}, config_toml_, pos_);  // a part that can also make the manifest
  for (StatePiece& sp : pieces()) {
    part.tensors.emplace_back(sp.name, std::move(sp.data));
    part.places.push_back(std::move(sp.place));
  }
  memory_.save(pos_.step, pos_.run_id, std::move(part));
}

// Every target's name exists with its dtype and whole shape, and
// (collectively) every parameter, buffer and optimizer tensor of the
// checkpoint is restored by some rank.
void CheckpointSession::check_names(const CheckpointIndex& ix, const std::vector<ReadTarget>& targets,
                                    bool with_optimizer) const {
  std::vector<int> claimed(ix.tensors.size(), 0);
  const std::string& file = ix.path;
  run_agreed(world_, "checking the checkpoint against this model", [&] {
    for (const ReadTarget& t : targets)
      if (const std::ptrdiff_t k = find_target(ix, t); k >= 0) claimed[static_cast<std::size_t>(k)] = 1;
  });
  if (!claimed.empty()) allreduce(claimed.data(), claimed.data(), claimed.size(), DType::i32, ReduceOp::max, world_);
  run_agreed(world_, "checking the checkpoint against this model", [&] {
    // Parameters first: a left-over parameter says more than its optimizer slots.
    for (const char* kind : {"param/", "buffer/", "optim/"})
      for (std::size_t i = 0; i < ix.tensors.size(); ++i) {
        const std::string& name = ix.tensors[i].name;
        if (claimed[i] || name.rfind(kind, 0) != 0 || !restorable(name, with_optimizer)) continue;
        RT_FAIL("checkpoint '", file, "' holds tensor '", name, "', which this ",
                kind[0] == 'o' ? "optimizer" : "model", " does not have (was it written for another model",
                kind[0] == 'o' ? " or optimizer" : "", "?)");
      }
  });
}

void CheckpointSession::log_layout_change(const RunPosition& ck) const {
  if (world_.rank() != 0) return;
  if (ck.pipeline == pos_.pipeline && ck.tensor == pos_.tensor && ck.data_parallel == pos_.data_parallel &&
      ck.ranks == pos_.ranks && ck.batch_size == pos_.batch_size && ck.accumulation == pos_.accumulation)
    return;
  log::info("checkpoint written at ", layout_str(ck.pipeline, ck.tensor, ck.data_parallel, ck.ranks),
            ", continuing at ", layout_str(pos_.pipeline, pos_.tensor, pos_.data_parallel, pos_.ranks),
            " (data.batch_size ", ck.batch_size, " -> ", pos_.batch_size, ", train.accumulation ", ck.accumulation,
            " -> ", pos_.accumulation, "): parameters and optimizer state resharded bitwise, the same data order and "
            "schedule (global batch ", pos_.batch_size * pos_.data_parallel * pos_.accumulation,
            "); sums run in another order, so losses follow up to rounding");
}

bool CheckpointSession::load(const std::string& path, bool with_optimizer, const Restore& restore,
                             std::int64_t steps_per_epoch) {
  const bool automatic = path == "auto";
  const std::string where = automatic ? cfg_.checkpoint.dir : path;
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  // A snapshot in memory newer than every disk checkpoint becomes one (memory.hpp).
  if (automatic && with_optimizer) memory_.recover(pos_.identity);
  std::vector<std::string> candidates;
  run_on_root(world_, "loading a checkpoint", [&] {
    if (automatic) {
      RT_CHECK(!cfg_.checkpoint.dir.empty(), "--resume auto needs checkpoint.dir (where to look)");
      std::error_code ec;
      if (!fs::is_directory(where, ec) || CheckpointDir(where, 1).list().empty()) {
        log::info("--resume auto: no checkpoint in ", where, ": starting a new run");
        return;
      }
    }
    candidates = checkpoint_candidates(where);
  });
  share(candidates, world_);
  if (candidates.empty()) return false;
  std::vector<ReadTarget> targets;
  run_agreed(world_, "listing what this rank restores", [&] { targets = restore.targets(with_optimizer); });

  // The newest candidate that indexes, is this run's (auto) and verifies; nothing is restored yet.
  CheckpointIndex ix;
  CheckpointReadStats verified;
  std::vector<std::string> skipped;
  bool chosen = false;
  for (const std::string& c : candidates) {
    try {
      ix = read_checkpoint_index(c, world_);
      if (automatic)
        run_agreed(world_, "matching the checkpoint to this run", [&] {
          auto id = ix.head.strings.find("run_identity");
          RT_CHECK(id != ix.head.strings.end() && id->second == pos_.identity, "written by another run (another "
                   "model, data, optimizer, seed or global batch; the layout may differ)");
        });
      // A weights-only load (eval, generate) reads no byte of the optimizer state, not even to verify it.
      verified = verify_checkpoint(ix, world_, {with_optimizer, true});
      chosen = true;
      break;
    } catch (const Error& e) {  // the same on every rank: every step above agrees on its errors
      skipped.push_back(cat(c, ": ", e.what()));
    }
  }
  if (!chosen) {
    std::string all;
    for (const auto& s : skipped) all += "\n  " + s;
    if (automatic) {
      if (world_.rank() == 0)
        log::info("--resume auto: no usable checkpoint of this run in ", where, ": starting a new run (", all, ")");
      return false;
    }
    RT_FAIL("no usable checkpoint in '", where, "':", all);
  }
  if (world_.rank() == 0)
    for (const auto& s : skipped) log::warn("skipped checkpoint ", s);

  const double found_s = since();
  RunPosition ck;
  run_agreed(world_, "reading the checkpoint", [&] { ck = checkpoint_position(ix.head); });
  check_names(ix, targets, with_optimizer);
  if (with_optimizer)
    run_agreed(world_, "checking the checkpoint against this run",
               [&] { run_state::check_resumable(ck, ix.path, cfg_, pos_.data_parallel, pos_.steps_per_epoch); });
  CheckpointReadStats read;
  run_agreed(world_, "restoring the checkpoint", [&] {
    read = read_targets(ix, targets);
    restore.finish(targets);
  });

  loaded_ = {ix.path, ck.run_id, ck.step, ck.epochs_done, ck.step_in_epoch, read.restored_bytes,
             verified.verified_bytes};
  if (world_.rank() == 0 && hooks_.report)
    log::info("loaded checkpoint ", ix.path, " (run ", ck.run_id, ", epoch ",
              ck.epochs_done + (ck.step_in_epoch ? 1 : 0),
              ck.step_in_epoch ? cat(" step ", ck.step_in_epoch, " of ", steps_per_epoch) : std::string(" done"),
              ", global step ", ck.step, "); rank 0 read ", read.restored_bytes >> 20, " MiB of its state and verified ",
              verified.verified_bytes >> 20, " MiB of the ", ix.bytes() >> 20, " MiB stored, in ", since(), " s (",
              found_s, " s to find and verify)");
  if (!with_optimizer) return true;
  log_layout_change(ck);
  pos_.epochs_done = ck.epochs_done;
  pos_.step = ck.step;
  pos_.step_in_epoch = ck.step_in_epoch;
  pos_.resumes = ck.resumes + 1;
  pos_.run_id = ck.run_id;
  resumed_ = true;
  return true;
}

void CheckpointSession::announce_stop(int agreed, std::int64_t steps_in_epoch, std::int64_t steps_per_epoch,
                                      const std::string& checkpoint) const {
  if (world_.rank() != 0) return;
  const int mine = hooks_.stop_signal ? hooks_.stop_signal() : 0;
  const std::string what = agreed > 0 ? cat(StopSignals::name(agreed), " on rank 0")
                           : mine    ? std::string(StopSignals::name(mine))
                                     : "a stop signal on another rank";
  log::warn("stopped by ", what, " at step ", pos_.step, " (epoch ", pos_.epochs_done + 1, ", step ", steps_in_epoch,
            " of ", steps_per_epoch, ")",
            checkpoint.empty() ? std::string("; no checkpoint.dir, so nothing was saved")
                               : cat("; checkpoint written: ", checkpoint, "; continue with --resume ",
                                     cfg_.checkpoint.dir, " (or --resume auto)"));
}

}  // namespace ringtrain
