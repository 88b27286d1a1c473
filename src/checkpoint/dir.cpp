// Where checkpoints live: a directory's files by run and step, rotation, the
// stale files of an interrupted write, and the candidates a resume tries.
#include <algorithm>
#include <cstdio>
#include <regex>
#include <utility>

#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/core/error.hpp"

namespace fs = std::filesystem;

namespace ringtrain {

std::vector<std::string> checkpoint_files(const std::string& path) {
  std::vector<std::string> out = {path};
  const fs::path p(path);
  const std::string stem = p.stem().string() + ".part-";
  std::error_code ec;
  const fs::path dir = p.has_parent_path() ? p.parent_path() : fs::path(".");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().rfind(stem, 0) == 0 && e.path().extension() == ".h5") out.push_back(e.path().string());
  std::sort(out.begin() + 1, out.end());
  return out;
}

// ---- directory ----------------------------------------------------------------

CheckpointDir::CheckpointDir(std::string dir, int keep) : dir_(std::move(dir)), keep_(keep) {}

std::vector<CheckpointDir::Entry> CheckpointDir::list() const {
  std::vector<Entry> out;
  std::error_code ec;
  if (!fs::is_directory(dir_, ec)) return out;
  static const std::regex current("ckpt-([A-Za-z0-9]+-[A-Za-z0-9]+-[A-Za-z0-9]+)-s([0-9]+)\\.h5");
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::smatch m;
    std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, current)) continue;
    Entry en;
    en.path = e.path().string();
    en.run_id = m[1];
    en.step = std::stoll(m[2]);
    en.mtime = fs::last_write_time(e.path(), ec);
    out.push_back(en);
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.mtime != b.mtime ? a.mtime > b.mtime : a.step > b.step;
  });
  return out;
}

std::string CheckpointDir::path_for(const std::string& run_id, std::int64_t step) const {
  RT_CHECK(!run_id.empty(), "CheckpointDir::save needs a run id");
  char name[128];
  std::snprintf(name, sizeof name, "ckpt-%s-s%09lld.h5", run_id.c_str(), static_cast<long long>(step));
  return (fs::path(dir_) / name).string();
}

std::string CheckpointDir::part_path_for(const std::string& run_id, std::int64_t step, int rank, int ranks) const {
  std::string m = path_for(run_id, step);
  char tail[64];
  std::snprintf(tail, sizeof tail, ".part-%05d-of-%05d.h5", rank, ranks);
  return m.substr(0, m.size() - 3) + tail;
}

std::string CheckpointDir::save(const std::string& run_id, std::int64_t step, const CheckpointData& data,
                                const CheckpointWriteHook& hook) const {
  const std::string path = path_for(run_id, step);
  write_checkpoint(path, data, hook);
  rotate(run_id);
  return path;
}

void CheckpointDir::rotate(const std::string& run_id) const {
  // Within this run only, by step (the newest `keep` survive).
  std::vector<Entry> mine;
  for (auto& e : list())
    if (e.run_id == run_id) mine.push_back(e);
  std::sort(mine.begin(), mine.end(), [](const Entry& a, const Entry& b) { return a.step > b.step; });
  for (std::size_t i = static_cast<std::size_t>(keep_); i < mine.size(); ++i) {
    // A parallel checkpoint's parts go with their manifest (the manifest first: never a manifest without parts).
    std::error_code ec;
    for (const auto& f : checkpoint_files(mine[i].path)) fs::remove(f, ec);
  }
}

std::string CheckpointDir::latest() const {
  auto all = list();
  return all.empty() ? std::string() : all.front().path;
}

int CheckpointDir::remove_stale_temps(const std::string& run_id) const {
  int n = 0;
  std::error_code ec;
  if (run_id.empty() || !fs::is_directory(dir_, ec)) return 0;
  const std::string prefix = "ckpt-" + run_id + "-";
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir_, ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0) continue;
    const auto part = name.find(".part-");
    if (name.find(".h5.tmp.") != std::string::npos ||
        (part != std::string::npos && !fs::exists(fs::path(dir_) / (name.substr(0, part) + ".h5"), ec)))
      stale.push_back(e.path());
  }
  for (const auto& p : stale) n += fs::remove(p, ec);
  return n;
}

std::vector<std::string> checkpoint_candidates(const std::string& path) {
  std::vector<std::string> candidates;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (auto& e : CheckpointDir(path, 1).list()) candidates.push_back(e.path);
    RT_CHECK(!candidates.empty(), "no checkpoint (ckpt-<run id>-s<step>.h5) in directory '", path, "'");
  } else {
    RT_CHECK(fs::exists(path, ec), "checkpoint '", path, "' does not exist");
    candidates.push_back(path);
  }
  return candidates;
}

}  // namespace ringtrain
