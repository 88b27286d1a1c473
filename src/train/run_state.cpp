#include "run_state.hpp"

#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "ringtrain/core/error.hpp"

namespace ringtrain::run_state {

std::string new_run_id() {
  std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  std::random_device rd;
  char tail[16];
  std::snprintf(tail, sizeof tail, "-%06x", static_cast<unsigned>(rd()) & 0xffffffu);
  return std::string(buf) + tail;
}

namespace {

// The configuration without what does not change the parameters a run produces.
TrainConfig trajectory_keys(const TrainConfig& cfg) {
  TrainConfig c = cfg;
  const TrainConfig d;
  c.data.test = d.data.test;
  c.data.prefetch = d.data.prefetch;
  c.data.mpi_io = d.data.mpi_io;
  c.data.global_batch = d.data.global_batch;  // the derived batch and accumulation are hashed instead
  c.train.threads = d.train.threads;
  c.train.max_steps = d.train.max_steps;
  c.train.verify_every = d.train.verify_every;
  c.train.recompute = d.train.recompute;  // bitwise the same trajectory
  c.train.target_accuracy = d.train.target_accuracy;
  c.comm.cycle_time_ms = d.comm.cycle_time_ms;
  c.comm.straggler_factor = d.comm.straggler_factor;  // reporting only
  c.comm.timeline = d.comm.timeline;
  c.comm.stall_warning_s = d.comm.stall_warning_s;
  c.comm.stall_shutdown_s = d.comm.stall_shutdown_s;
  c.comm.collective_timeout_s = d.comm.collective_timeout_s;
  c.checkpoint = d.checkpoint;
  c.log = d.log;
  // ZeRO changes where the gradients and optimizer state live, not the update: a run may resume at any stage.
  c.parallel.zero = d.parallel.zero;
  c.parallel.zero_release = d.parallel.zero_release;
  return c;
}

std::string hash(const std::string& text) {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

std::string run_identity(const TrainConfig& cfg, std::int64_t global_batch) {
  TrainConfig c = trajectory_keys(cfg);
  const TrainConfig d;
  c.parallel = d.parallel;
  c.data.batch_size = d.data.batch_size;
  c.train.accumulation = d.train.accumulation;
  return hash(c.to_toml() + cat("\nglobal batch = ", global_batch, "\n"));
}

void check_resumable(const RunPosition& ck, const std::string& file, const TrainConfig& cfg,
                     std::int64_t data_parallel, std::int64_t steps_per_epoch) {
  std::string diff;
  auto differs = [&](const std::string& what, std::int64_t was, std::int64_t now) {
    if (was != now) diff += cat(diff.empty() ? "" : ", ", what, " ", was, " -> ", now);
  };
  // The layout (pipeline, tensor, rank count) and the split of the global batch
  // into per-rank batches and accumulation may change; the global batch may not.
  const std::int64_t was = ck.batch_size * ck.data_parallel * ck.accumulation,
                     now = std::int64_t{cfg.data.batch_size} * data_parallel * cfg.train.accumulation;
  if (was != now) {
    differs("data.batch_size", ck.batch_size, cfg.data.batch_size);
    differs("data-parallel size", ck.data_parallel, data_parallel);
    differs("train.accumulation", ck.accumulation, cfg.train.accumulation);
    diff += cat(" (global batch ", was, " -> ", now, ")");
  }
  differs("train.seed", ck.seed, static_cast<std::int64_t>(cfg.train.seed));
  if (steps_per_epoch != ck.steps_per_epoch)
    diff += cat(diff.empty() ? "" : ", ", "optimizer steps per epoch ", ck.steps_per_epoch, " -> ", steps_per_epoch,
                " (data.drop_last = false pads the last micro-batch, and another split of the global batch pads "
                "another number of them: set data.drop_last = true, or keep the checkpoint's train.accumulation)");
  RT_CHECK(diff.empty(), "checkpoint '", file, "' cannot continue this run: ", diff,
           " (the data order, the steps per epoch and the learning-rate schedule depend on them; the layout may "
           "change as long as data.batch_size x data-parallel size x train.accumulation stays the same: "
           "data.global_batch keeps it at any layout). "
           "Resume with the checkpoint's values, or start a new run (`eval --checkpoint` still reads it)");
}

int truncate_metrics(const std::string& path, const std::string& run_id, std::int64_t epochs_done) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return 0;
  std::ifstream in(path);
  std::vector<std::string> keep;
  int dropped = 0;
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.value("run", "") == run_id && j.value("event", "") == "epoch" &&
        j.value("epoch", std::int64_t{0}) > epochs_done) {
      ++dropped;
      continue;
    }
    keep.push_back(line);
  }
  in.close();
  if (!dropped) return 0;
  // Rewrite atomically: a crash leaves the old file or the new one.
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    for (auto& l : keep) out << l << '\n';
    RT_CHECK(out.good(), "log.metrics: cannot rewrite '", path, "' (disk full?)");
  }
  std::filesystem::rename(tmp, path);
  return dropped;
}

namespace {

void check_normalisation(const data::FileInfo& f, const char* key, const std::string& value) {
  for (std::size_t c = 0; c < f.mean.size(); ++c)
    RT_CHECK(std::isfinite(f.mean[c]), key, " = '", value, "': file '", f.path, "' has a non-finite mean ", f.mean[c],
             " for channel ", c, " (re-run `ringtrain prepare`)");
  for (std::size_t c = 0; c < f.std.size(); ++c)
    RT_CHECK(std::isfinite(f.std[c]) && f.std[c] > 0, key, " = '", value, "': file '", f.path,
             "' has standard deviation ", f.std[c], " for channel ", c,
             " (must be finite and > 0; re-run `ringtrain prepare`)");
}

}  // namespace

void check_data_files(const TrainConfig& cfg, const data::FileInfo& train, bool with_test) {
  for (const auto& f : data::find_split_files(cfg.data.train, "train"))
    check_normalisation(data::read_file_info(f), "data.train", cfg.data.train);
  if (!with_test) return;
  std::vector<std::string> files;
  try {
    files = data::find_split_files(cfg.data.test, "test");
  } catch (const Error& e) {
    RT_FAIL("data.test = '", cfg.data.test, "': ", e.what());
  }
  for (const auto& path : files) {
    data::FileInfo f;
    try {
      f = data::read_file_info(path);
    } catch (const Error& e) {
      RT_FAIL("data.test = '", cfg.data.test, "': ", e.what());
    }
    RT_CHECK(f.channels == train.channels && f.height == train.height && f.width == train.width, "data.test = '",
             cfg.data.test, "': file '", path, "' holds ", f.channels, "x", f.height, "x", f.width,
             " images, but the model is built for the training split's ", train.channels, "x", train.height, "x",
             train.width, " (data.train = '", cfg.data.train, "')");
    RT_CHECK(f.num_classes == train.num_classes, "data.test = '", cfg.data.test, "': file '", path, "' has ",
             f.num_classes, " classes, but the training split (data.train = '", cfg.data.train, "') has ",
             train.num_classes);
    check_normalisation(f, "data.test", cfg.data.test);
  }
}

}  // namespace ringtrain::run_state
