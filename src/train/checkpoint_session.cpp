#include "checkpoint_session.hpp"

#include <algorithm>
#include <exception>
#include <filesystem>
#include <unordered_map>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/named_tensors.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/signals.hpp"
#include "run_state.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

// Rank 0's checkpoint to every rank: its tensors, and its scalars, strings and
// path riding along as small tensors under names no state tensor has.
void share(FoundCheckpoint& f, const Communicator& world) {
  if (world.size() == 1) return;
  auto text = [](const std::string& s) {
    Tensor t = Tensor::empty({static_cast<std::int64_t>(s.size())}, DType::u8);
    if (!s.empty()) std::copy(s.begin(), s.end(), t.data<std::uint8_t>());
    return t;
  };
  NamedTensors ts;
  if (world.rank() == 0) {
    ts = f.data.tensors;
    for (auto& [k, v] : f.data.scalars) {
      Tensor t = Tensor::empty({1}, DType::i64);
      t.data<std::int64_t>()[0] = v;
      ts.emplace_back("#scalar/" + k, t);
    }
    for (auto& [k, v] : f.data.strings) ts.emplace_back("#string/" + k, text(v));
    ts.emplace_back("#path", text(f.path));
  }
  broadcast_named(ts, 0, world);
  if (world.rank() == 0) return;
  f = FoundCheckpoint{};
  for (auto& [name, t] : ts) {
    const std::uint8_t* b = t.dtype() == DType::u8 ? t.data<std::uint8_t>() : nullptr;
    if (name.rfind("#scalar/", 0) == 0) f.data.scalars[name.substr(8)] = t.data<std::int64_t>()[0];
    else if (name.rfind("#string/", 0) == 0) f.data.strings[name.substr(8)] = std::string(b, b + t.numel());
    else if (name == "#path") f.path = std::string(b, b + t.numel());
    else f.data.tensors.emplace_back(name, t);
  }
}

// A 1-element tensor may be stored as [1] and wanted as a scalar (as restore_tensor allows).
bool same_layout(const Tensor& stored, const Tensor& want) {
  if (stored.dtype() != want.dtype()) return false;
  return stored.shape() == want.shape() ||
         (stored.numel() == want.numel() && stored.shape().size() == 1 && want.shape().size() <= 1);
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
  pos_.fingerprint = run_state::fingerprint(cfg_, world_.size());
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

std::string CheckpointSession::save(bool force, const StateSource& state) {
  if (cfg_.checkpoint.dir.empty()) return "";
  if (!force && pos_.epochs_done % cfg_.checkpoint.every_epochs != 0) return "";
  // The previous write ends first (one snapshot at a time, and its memory is
  // free to take the next); its error ends the run here, on every rank.
  settle();
  std::string path;
  if (parallel()) {
    path = save_parts(state.pieces());
  } else {
    // Gather the whole named state on world rank 0 — collective on every rank.
    NamedTensorList whole = state.whole();
    run_on_root(world_, "writing a checkpoint", [&] {
      CheckpointDir dir(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
      path = dir.path_for(pos_.run_id, pos_.step);
      auto write = [dir, run_id = pos_.run_id, step = pos_.step, hook = hooks_.checkpoint_write_hook,
                    report = hooks_.report, data = checkpoint_data(std::move(whole), config_toml_, pos_)] {
        const auto t0 = std::chrono::steady_clock::now();
        std::string written = CheckpointDir(dir).save(run_id, step, data, hook);
        if (report)
          log::info("checkpoint written: ", written, " (",
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s)");
      };
      if (cfg_.checkpoint.async) writer_.submit(std::move(write));
      else write();
    });
  }
  last_save_ = std::chrono::steady_clock::now();
  return path;
}

// Every rank writes its pieces to its own part file; the manifest that commits
// them is written by rank 0 once every part is durable: at once when writing
// synchronously, after the step that agrees on it with checkpoint.async.
std::string CheckpointSession::save_parts(const std::vector<StatePiece>& pieces) {
  const CheckpointDir dir(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  const std::string manifest = dir.path_for(pos_.run_id, pos_.step);
  Pending p;
  p.step = pos_.step;
  if (world_.rank() == 0) {
    p.manifest = checkpoint_data({}, config_toml_, pos_);
    for (int r = 0; r < world_.size(); ++r)
      p.manifest.parts.push_back(fs::path(dir.part_path_for(pos_.run_id, pos_.step, r, world_.size())).filename());
  }
  CheckpointData part;
  part.part_of = fs::path(manifest).filename().string();
  for (const StatePiece& sp : pieces) {
    part.tensors.emplace_back(sp.name, sp.data);
    part.places.push_back(sp.place);
  }
  auto write = [file = dir.part_path_for(pos_.run_id, pos_.step, world_.rank(), world_.size()),
                hook = hooks_.checkpoint_write_hook, data = std::move(part)] { write_checkpoint(file, data, hook); };
  pending_ = std::move(p);
  if (cfg_.checkpoint.async) {
    writer_.submit(std::move(write));
  } else {
    run_agreed(world_, "writing this rank's part of a checkpoint", write);
    run_agreed(world_, "writing a checkpoint's manifest", [&] { commit(false); });
  }
  return world_.rank() == 0 ? manifest : std::string();
}

void CheckpointSession::commit(bool background) {
  if (!pending_) return;
  if (world_.rank() == 0) {
    auto write = [dir = CheckpointDir(cfg_.checkpoint.dir, cfg_.checkpoint.keep), run_id = pos_.run_id,
                  step = pending_->step, data = std::move(pending_->manifest), report = hooks_.report] {
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

void CheckpointSession::finish() { settle(); }

// Every wanted name exists with its dtype and shape, and (collectively) every
// parameter, buffer and optimizer tensor of the file is wanted by some rank.
void CheckpointSession::check_names(const CheckpointData& ck, const NamedTensorList& wanted, bool with_optimizer,
                                    const std::string& file) const {
  std::unordered_map<std::string, std::size_t> index;
  for (std::size_t i = 0; i < ck.tensors.size(); ++i) index.emplace(ck.tensors[i].first, i);
  std::vector<int> claimed(ck.tensors.size(), 0);
  run_agreed(world_, "checking the checkpoint against this model", [&] {
    for (const auto& [name, want] : wanted) {
      auto it = index.find(name);
      RT_CHECK(it != index.end(), "checkpoint '", file, "' has no tensor '", name,
               "' (was it written for another model or optimizer?)");
      const Tensor& have = ck.tensors[it->second].second;
      RT_CHECK(same_layout(have, want), "checkpoint '", file, "': tensor '", name, "' is ", dtype_name(have.dtype()),
               " ", shape_str(have.shape()), ", but this model has ", dtype_name(want.dtype()), " ",
               shape_str(want.shape()), " (was it written for another model?)");
      claimed[it->second] = 1;
    }
  });
  if (!claimed.empty()) allreduce(claimed.data(), claimed.data(), claimed.size(), DType::i32, ReduceOp::max, world_);
  run_agreed(world_, "checking the checkpoint against this model", [&] {
    // Parameters first: a left-over parameter says more than its optimizer slots.
    for (const char* kind : {"param/", "buffer/", "optim/"})
      for (std::size_t i = 0; i < ck.tensors.size(); ++i) {
        const std::string& name = ck.tensors[i].first;
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
  FoundCheckpoint f;
  int found = 0;
  run_on_root(world_, "loading a checkpoint", [&] {
    std::string where = path;
    std::function<void(const CheckpointData&)> accept;
    if (automatic) {
      RT_CHECK(!cfg_.checkpoint.dir.empty(), "--resume auto needs checkpoint.dir (where to look)");
      where = cfg_.checkpoint.dir;
      std::error_code ec;
      if (!fs::is_directory(where, ec) || CheckpointDir(where, 1).list().empty()) {
        log::info("--resume auto: no checkpoint in ", where, ": starting a new run");
        return;
      }
      // The same run at any layout; a file from before run identities: the same
      // configuration, layout and rank count.
      accept = [&](const CheckpointData& d) {
        auto id = d.strings.find("run_identity");
        if (id != d.strings.end() && !id->second.empty()) {
          RT_CHECK(id->second == pos_.identity, "written by another run (another model, data, optimizer, seed or "
                   "global batch; the layout may differ)");
          return;
        }
        auto it = d.strings.find("fingerprint");
        RT_CHECK(it != d.strings.end() && it->second == pos_.fingerprint,
                 "written before run identities by a run of another configuration, layout or rank count");
      };
    }
    try {
      f = find_intact_checkpoint(where, accept);
    } catch (const Error& e) {
      if (!automatic) throw;
      log::info("--resume auto: no usable checkpoint of this run in ", where, ": starting a new run (",
                e.what(), ")");
      return;
    }
    for (const auto& s : f.skipped) log::warn("skipped checkpoint ", s);
    found = 1;
  });
  broadcast(&found, 1, DType::i32, 0, world_);
  if (!found) return false;
  share(f, world_);  // every rank takes the names it owns

  RunPosition ck;
  NamedTensorList wanted;
  run_agreed(world_, "reading the checkpoint", [&] {
    for (auto& [name, t] : f.data.tensors)
      RT_CHECK(name.find('~') == std::string::npos, "checkpoint '", f.path, "' (tensor '", name,
               "') was written by the grid path before it shared the data-parallel path's format; it cannot be "
               "loaded: start a new run");
    ck = checkpoint_position(f.data);
    wanted = restore.wanted(with_optimizer);
  });
  check_names(f.data, wanted, with_optimizer, f.path);
  if (with_optimizer)
    run_agreed(world_, "checking the checkpoint against this run",
               [&] { run_state::check_resumable(ck, f.path, cfg_, pos_.data_parallel, pos_.steps_per_epoch); });
  run_agreed(world_, "restoring the checkpoint", [&] { restore.apply(f.data, with_optimizer); });

  loaded_ = {f.path, ck.run_id, ck.step, ck.epochs_done, ck.step_in_epoch};
  if (world_.rank() == 0 && hooks_.report)
    log::info("loaded checkpoint ", f.path, " (run ", ck.run_id, ", epoch ",
              ck.epochs_done + (ck.step_in_epoch ? 1 : 0), ck.step_in_epoch ? cat(" step ", ck.step_in_epoch, " of ", steps_per_epoch) : std::string(" done"),
              ", global step ", ck.step, ")");
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
