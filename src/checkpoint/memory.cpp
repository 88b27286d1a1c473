// In-memory snapshots with a buddy (memory.hpp): the helper thread's write and
// exchange, pruning, and the agreement on what a relaunch continues from.
#include "memory.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <utility>

#include "ringtrain/checkpoint/read.hpp"
#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"
#include "geometry.hpp"

namespace fs = std::filesystem;

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A snapshot file's name is the part file's name in checkpoint.dir.
const std::regex& part_name() {
  static const std::regex re(
      "ckpt-([A-Za-z0-9]+-[A-Za-z0-9]+-[A-Za-z0-9]+)-s([0-9]+)\\.part-([0-9]+)-of-([0-9]+)\\.h5");
  return re;
}

struct Held {
  std::string path, run_id;
  std::int64_t step = 0;
  int part = 0, parts = 0, holder = 0;
};

// Every snapshot file under `dir` (any node's sub-directory this host sees).
std::vector<Held> list_files(const std::string& dir) {
  std::vector<Held> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& node : fs::directory_iterator(dir, ec)) {
    if (!node.is_directory(ec)) continue;
    for (const auto& e : fs::directory_iterator(node.path(), ec)) {
      std::smatch m;
      const std::string name = e.path().filename().string();
      if (!std::regex_match(name, m, part_name())) continue;
      out.push_back({e.path().string(), m[1], std::stoll(m[2]), std::stoi(m[3]), std::stoi(m[4]), 0});
    }
  }
  std::sort(out.begin(), out.end(), [](const Held& a, const Held& b) { return a.path < b.path; });
  return out;
}

std::string default_dir(const std::string& checkpoint_dir) {
  const fs::path abs = fs::weakly_canonical(fs::absolute(checkpoint_dir));
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a: a stable name from the path
  for (unsigned char c : abs.string()) h = (h ^ c) * 1099511628211ull;
  std::string name = abs.filename().string();
  if (name.empty()) name = "root";
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "/dev/shm/ringtrain-" + name + "-" + std::string(hex, 8);
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RT_CHECK(in, "cannot open '", path, "'");
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}

}  // namespace

void MemorySnapshots::start() {
  if (started_ || !on()) return;
  started_ = true;
  const int n = world_.size(), me = world_.rank();
  // Every rank's node name: its host, or its emulated node.
  char host[64] = {};
  ::gethostname(host, sizeof host - 1);
  std::vector<char> hosts(64 * static_cast<std::size_t>(n));
  allgather(host, 64, hosts.data(), DType::u8, world_);
  std::vector<std::string> node_of(static_cast<std::size_t>(n));
  const int per = cfg_.checkpoint.memory_node_ranks;
  for (int r = 0; r < n; ++r)
    node_of[static_cast<std::size_t>(r)] = per > 0 ? cat("e", r / per) : std::string(&hosts[64 * static_cast<std::size_t>(r)]);
  // Nodes in order of their lowest rank; each node's ranks in rank order.
  std::vector<std::string> nodes;
  std::map<std::string, std::vector<int>> ranks_on;
  for (int r = 0; r < n; ++r) {
    const std::string& nd = node_of[static_cast<std::size_t>(r)];
    if (!ranks_on.count(nd)) nodes.push_back(nd);
    ranks_on[nd].push_back(r);
  }
  auto buddy_of = [&](int r) {
    if (nodes.size() < 2) return -1;
    const std::string& nd = node_of[static_cast<std::size_t>(r)];
    const auto& mine = ranks_on[nd];
    const std::size_t j = static_cast<std::size_t>(std::find(nodes.begin(), nodes.end(), nd) - nodes.begin());
    const std::size_t i = static_cast<std::size_t>(std::find(mine.begin(), mine.end(), r) - mine.begin());
    const auto& next = ranks_on[nodes[(j + 1) % nodes.size()]];
    return next[i % next.size()];  // nodes of unequal size: wrap within the next one
  };
  buddy_ = buddy_of(me);
  held_ = {me};
  for (int r = 0; r < n; ++r)
    if (r != me && buddy_of(r) == me) {
      senders_.push_back(r);
      held_.insert(r);
    }
  dir_ = cfg_.checkpoint.memory_dir.empty() ? default_dir(cfg_.checkpoint.dir) : cfg_.checkpoint.memory_dir;
  node_dir_ = (fs::path(dir_) / ("node-" + node_of[static_cast<std::size_t>(me)])).string();
  run_agreed(world_, "preparing checkpoint.memory_dir", [&] {
    std::error_code ec;
    fs::create_directories(node_dir_, ec);
    RT_CHECK(!ec && fs::is_directory(node_dir_), "checkpoint.memory_dir: cannot create '", node_dir_,
             "': ", ec ? ec.message() : "a file of that name exists");
  });
  comm_ = world_.dup("memory snapshots");
  if (me == 0)
    log::info("checkpoint.memory_every_steps = ", cfg_.checkpoint.memory_every_steps, ": snapshots under ", dir_,
              " on ", nodes.size(), per > 0 ? cat(" emulated node(s) of ", per, " rank(s) (checkpoint.memory_node_ranks)")
                                            : std::string(" node(s)"),
              nodes.size() < 2 ? "; one node, so no buddy copy: a snapshot survives a process, not the node"
                               : cat("; rank 0's buddy is rank ", buddy_));
}

void MemorySnapshots::clear() {
  if (!on()) return;
  start();
  // One rank per host (every rank there sees the same files).
  if (world_.local_rank() == 0) {  // the snapshots, and the temporary files of writes a kill cut short
    std::error_code ec;
    std::vector<fs::path> gone;
    for (const auto& node : fs::directory_iterator(dir_, ec))
      for (const auto& e : fs::directory_iterator(node.path(), ec))
        if (e.path().filename().string().rfind("ckpt-", 0) == 0) gone.push_back(e.path());
    for (const auto& p : gone) fs::remove(p, ec);
  }
  world_.barrier();
}

void MemorySnapshots::wait() { writer_.wait(); }

// Sizes first (0: the sender has nothing this time), then the bytes in
// chunks MPI's int count can name; every wait bounded.
void MemorySnapshots::exchange(const std::vector<char>& image, std::vector<std::vector<char>>& received) {
  constexpr std::size_t kChunk = std::size_t{1} << 30;
  const MPI_Comm c = comm_.handle("memory snapshot exchange");
  const WaitOn on(comm_, "memory snapshot exchange");
  std::uint64_t mine = image.size();
  std::vector<std::uint64_t> sizes(senders_.size());
  std::vector<MPI_Request> reqs;
  auto post = [&](int rc, const char* call) { check_mpi(rc, "memory snapshot exchange", call); };
  for (std::size_t i = 0; i < senders_.size(); ++i) {
    reqs.emplace_back();
    post(MPI_Irecv(&sizes[i], 1, MPI_UINT64_T, senders_[i], 1, c, &reqs.back()), "MPI_Irecv");
  }
  if (buddy_ >= 0) {
    reqs.emplace_back();
    post(MPI_Isend(&mine, 1, MPI_UINT64_T, buddy_, 1, c, &reqs.back()), "MPI_Isend");
  }
  wait_bounded(reqs.data(), static_cast<int>(reqs.size()), on, "memory snapshot sizes", OnStall::throw_error);
  reqs.clear();
  received.assign(senders_.size(), {});
  for (std::size_t i = 0; i < senders_.size(); ++i) {
    received[i].resize(sizes[i]);
    for (std::size_t at = 0; at < sizes[i]; at += kChunk) {
      reqs.emplace_back();
      post(MPI_Irecv(received[i].data() + at, static_cast<int>(std::min(kChunk, sizes[i] - at)), MPI_BYTE,
                     senders_[i], 2, c, &reqs.back()), "MPI_Irecv");
    }
  }
  if (buddy_ >= 0)
    for (std::size_t at = 0; at < image.size(); at += kChunk) {
      reqs.emplace_back();
      post(MPI_Isend(image.data() + at, static_cast<int>(std::min(kChunk, image.size() - at)), MPI_BYTE, buddy_, 2,
                     c, &reqs.back()), "MPI_Isend");
    }
  wait_bounded(reqs.data(), static_cast<int>(reqs.size()), on, "memory snapshot bytes", OnStall::throw_error);
}

// A bounded barrier on the helper's communicator.
void MemorySnapshots::written_everywhere() {
  const WaitOn on(comm_, "memory snapshot: every holder's copy written");
  MPI_Request req;
  check_mpi(MPI_Ibarrier(comm_.handle("memory snapshot barrier"), &req), "memory snapshot barrier", "MPI_Ibarrier");
  wait_bounded(&req, 1, on, "memory snapshot: every holder's copy written", OnStall::throw_error);
}

// Removes this rank's parts (its own, its senders') of run `run_id` older than `keep_from`.
void MemorySnapshots::prune(const std::string& run_id, std::int64_t keep_from) const {
  std::error_code ec;
  std::vector<fs::path> gone;
  for (const auto& e : fs::directory_iterator(node_dir_, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, part_name()) && m[1] == run_id && std::stoll(m[2]) < keep_from &&
        held_.count(std::stoi(m[3])))
      gone.push_back(e.path());
  }
  for (const auto& p : gone) fs::remove(p, ec);
}

void MemorySnapshots::save(std::int64_t step, const std::string& run_id, CheckpointData part) {
  start();
  steps_.push_back(step);
  // The two newest complete snapshots stay: the previous step's files were
  // finished before this one was taken (wait() before the copy).
  const std::int64_t keep_from = steps_.size() >= 2 ? steps_[steps_.size() - 2] : 0;
  if (steps_.size() > 2) steps_.erase(steps_.begin());
  const CheckpointDir names(cfg_.checkpoint.dir, 1);
  auto file = [names, node_dir = node_dir_, n = world_.size(), run_id, step](int rank) {
    return (fs::path(node_dir) /
            fs::path(names.part_path_for(run_id, step, rank, n)).filename()).string();
  };
  part.part_of = fs::path(names.path_for(run_id, step)).filename().string();
  writer_.submit([this, file, part = std::move(part), run_id, keep_from] {
    const int me = world_.rank();
    const auto t0 = Clock::now();
    std::vector<char> image;
    try {  // a failure costs this snapshot, with a warning, never the run: the disk checkpoints stay
      image = checkpoint_image(file(me), part);
      write_file_atomic(file(me), image, false);  // tmpfs: nothing to sync
    } catch (const std::exception& e) {
      log::warn("memory snapshot '", file(me), "' not kept: ", e.what());
      image.clear();  // the buddy learns there is nothing to keep
    }
    last_bytes_ = image.size();
    std::vector<std::vector<char>> got;
    bool exchanged = true;
    try {
      exchange(image, got);
    } catch (const std::exception& e) {
      log::warn("memory snapshot: the exchange with buddy rank ", buddy_, " failed: ", e.what());
      exchanged = false;
    }
    for (std::size_t i = 0; exchanged && i < got.size(); ++i) {
      if (got[i].empty()) continue;
      try {
        write_file_atomic(file(senders_[i]), got[i], false);
      } catch (const std::exception& e) {
        log::warn("memory snapshot: rank ", senders_[i], "'s copy not kept: ", e.what());
      }
    }
    if (exchanged) try {
      prune(run_id, keep_from);
    } catch (const std::exception& e) {
      log::warn("memory snapshot: removing old snapshots in ", node_dir_, " failed: ", e.what());
    }
    // Every rank reaches this once per snapshot, whatever failed above: when one
    // rank's helper is done, every holder has written its files of this step
    // (the trainer waits for it before reporting the next step: lost work <= k).
    try {
      written_everywhere();
    } catch (const std::exception& e) {
      log::warn("memory snapshot: waiting for every holder's copy failed: ", e.what());
    }
    helper_s_.push_back(since(t0));
  });
}

void MemorySnapshots::recover(const std::string& identity) {
  if (!on()) return;
  start();
  finish();
  const auto t0 = Clock::now();
  // 1. What this rank verifies: its host's files, dealt out among the host's ranks.
  std::vector<Held> ok;
  {
    const std::vector<Held> seen = list_files(dir_);
    const CheckpointDir names(cfg_.checkpoint.dir, 1);
    for (std::size_t i = static_cast<std::size_t>(world_.local_rank()); i < seen.size();
         i += static_cast<std::size_t>(world_.local_size())) {
      Held h = seen[i];
      try {
        const CheckpointIndex ix = ckpt_detail::index_file_as_stored(h.path);
        RT_CHECK(ix.head.part_of == fs::path(names.path_for(h.run_id, h.step)).filename().string(),
                 "it names another checkpoint ('", ix.head.part_of, "')");
        auto id = ix.head.strings.find("run_identity");
        if (id == ix.head.strings.end() || id->second != identity) continue;  // another run's: not a candidate
        verify_checkpoint(ix);  // every piece's CRC-32, finite values
        h.holder = world_.rank();
        ok.push_back(h);
      } catch (const std::exception& e) {
        log::warn("memory snapshot '", h.path, "' skipped: ", e.what());
      }
    }
  }
  // 2. Everyone's list on every rank.
  nlohmann::json list = nlohmann::json::array();
  for (const Held& h : ok) list.push_back({h.run_id, h.step, h.part, h.parts, h.holder, h.path});
  const std::vector<std::uint8_t> bytes = nlohmann::json::to_msgpack(list);
  std::vector<std::size_t> counts(static_cast<std::size_t>(world_.size()));
  std::uint64_t nb = bytes.size();
  allgather(&nb, 1, counts.data(), DType::i64, world_);
  std::size_t total = 0;
  for (auto c : counts) total += c;
  std::vector<std::uint8_t> all(total);
  allgatherv(bytes.data(), all.data(), counts, DType::u8, world_);
  // (run, step, parts) -> part -> its lowest holder and that holder's file.
  std::map<std::tuple<std::int64_t, std::string, int>, std::map<int, std::pair<int, std::string>>> snaps;
  std::size_t at = 0;
  for (std::size_t c : counts) {
    for (const auto& j : nlohmann::json::from_msgpack(all.begin() + static_cast<std::ptrdiff_t>(at),
                                                      all.begin() + static_cast<std::ptrdiff_t>(at + c))) {
      auto& parts = snaps[{j.at(1).get<std::int64_t>(), j.at(0).get<std::string>(), j.at(3).get<int>()}];
      parts.emplace(j.at(2).get<int>(), std::make_pair(j.at(4).get<int>(), j.at(5).get<std::string>()));
    }
    at += c;
  }
  // 3. The newest complete one (the same answer on every rank); the newer incomplete ones said by name.
  const std::map<int, std::pair<int, std::string>>* chosen = nullptr;
  std::int64_t step = -1;
  std::string run_id;
  int nparts = 0;
  for (auto it = snaps.rbegin(); it != snaps.rend(); ++it) {
    const auto& [key, parts] = *it;
    const int n = std::get<2>(key);
    if (static_cast<int>(parts.size()) == n) {
      chosen = &parts;
      std::tie(step, run_id, nparts) = std::tie(std::get<0>(key), std::get<1>(key), std::get<2>(key));
      break;
    }
    if (world_.rank() != 0) continue;
    std::string lost;
    for (int k = 0; k < n; ++k)
      if (!parts.count(k)) lost += cat(lost.empty() ? "" : ", ", "part ", k, " (rank ", k, "'s shard)");
    log::warn("--resume auto: the memory snapshot at step ", std::get<0>(key), " of run ", std::get<1>(key),
              " (", n, " parts) is incomplete: ", lost, " of ", n,
              " lost on its node and on its buddy's node (or corrupt): trying an older one");
  }
  // 4. A disk checkpoint of that run as new wins (rank 0 lists checkpoint.dir).
  std::int64_t disk = -1;
  if (world_.rank() == 0)
    for (const auto& e : CheckpointDir(cfg_.checkpoint.dir, 1).list())
      if (run_id.empty() || e.run_id == run_id) disk = std::max(disk, e.step);
  broadcast(&disk, 1, DType::i64, 0, world_);
  const std::string disk_str = disk >= 0 ? cat("step ", disk) : std::string("none");
  if (!chosen || disk >= step) {
    if (world_.rank() == 0)
      log::info("--resume auto: source disk (newest disk checkpoint: ", disk_str, "; newest complete memory snapshot: ",
                chosen ? cat("step ", step) : std::string("none"), ")");
    return;
  }
  // 5. Each part from its lowest holder into checkpoint.dir, then the manifest: the commit point.
  const CheckpointDir dir(cfg_.checkpoint.dir, cfg_.checkpoint.keep);
  std::size_t copied = 0;
  run_agreed(world_, "copying memory snapshots to checkpoint.dir", [&] {
    for (const auto& [k, holder] : *chosen)
      if (holder.first == world_.rank()) {
        const std::vector<char> b = read_file(holder.second);
        write_file_atomic(dir.part_path_for(run_id, step, k, nparts), b, true);
        copied += b.size();
      }
  });
  std::uint64_t all_bytes = copied;
  allreduce(&all_bytes, &all_bytes, 1, DType::i64, ReduceOp::sum, world_);
  std::string path;
  run_on_root(world_, "writing the manifest of a memory snapshot", [&] {
    CheckpointIndex head = ckpt_detail::index_file_as_stored(dir.part_path_for(run_id, step, 0, nparts));
    CheckpointData m;
    m.scalars = head.head.scalars;
    m.strings = head.head.strings;
    m.config_toml = head.head.config_toml;
    for (int k = 0; k < nparts; ++k) m.parts.push_back(fs::path(dir.part_path_for(run_id, step, k, nparts)).filename());
    path = dir.path_for(run_id, step);
    write_checkpoint(path, m);
  });
  if (world_.rank() == 0) {
    std::string from;
    for (const auto& [k, holder] : *chosen) from += cat(from.empty() ? "" : ", ", k, "<-rank ", holder.first);
    const double s = since(t0);
    log::info("--resume auto: source memory, step ", step, " of run ", run_id, " (newest disk checkpoint: ", disk_str,
              "): ", nparts, " parts (part<-holder: ", from, "), ", all_bytes, " bytes gathered into ", path, " in ", s,
              " s (", s > 0 ? static_cast<double>(all_bytes) / s / 1e9 : 0.0, " GB/s)");
  }
}

}  // namespace ringtrain
