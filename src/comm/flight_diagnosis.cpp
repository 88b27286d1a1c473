// `ringtrain diagnose DIR`: reads the ranks' flight records (flight_recorder.cpp
// writes them) and names, per communicator, the first collective on which the
// ranks disagree. Communicators are matched across ranks by name and member
// list (two tensor groups are both called 'tp'); collectives by their number
// on the communicator, which every member counts alike.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain::flight_recorder {
namespace {

struct Rec {
  long long seq = 0, bytes = 0, start = 0, end = 0;
  int peer = -1, comm = -1;
  std::string op, state;
};

struct Dump {
  int rank = 0, size = 1;
  long long time = 0, capacity = 0, recorded = 0;
  std::string reason;
  std::map<int, std::string> comm_key;  // this rank's comm index -> group key
  std::vector<Rec> ops;
};

struct Group {
  std::string name;
  std::vector<int> members;
  std::map<int, std::vector<Rec>> ops;  // world rank -> its collectives here, by number
};

std::string ranks_str(const std::vector<int>& v) {
  if (v.empty()) return "none";
  std::ostringstream s;
  s << (v.size() == 1 ? "world rank " : "world ranks ");
  for (std::size_t i = 0; i < v.size();) {
    std::size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    if (i) s << ", ";
    s << v[i];
    if (j >= i + 2)
      s << "-" << v[j];
    else if (j == i + 1)
      s << ", " << v[j];
    i = j + 1;
  }
  return s.str();
}

std::string describe(const Rec& r, long long dumped_at) {
  std::ostringstream s;
  s << r.op << " (" << r.bytes << " bytes)";
  if (r.state == "started")
    s << ", not finished: waiting " << (dumped_at - r.start) / 1000000 / 1e3 << " s when it dumped";
  else
    s << ", " << r.state;
  return s.str();
}

Dump read_dump(const std::filesystem::path& file) {
  std::ifstream in(file);
  Dump d;
  std::string line;
  bool head = true;
  std::map<int, std::string> names;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const std::exception& e) {
      RT_FAIL("diagnose: ", file.string(), ": not a flight record line (", e.what(), "): ", line.substr(0, 80));
    }
    if (head) {
      RT_CHECK(j.contains("world_rank"), "diagnose: ", file.string(), ": the first line is not a record header");
      d.rank = j["world_rank"];
      d.size = j["world_size"];
      d.reason = j["reason"];
      d.time = j["time_ns"];
      d.capacity = j["capacity"];
      d.recorded = j["recorded"];
      head = false;
    } else if (j.contains("members")) {
      std::string key = j["name"].get<std::string>() + "|";
      for (int m : j["members"]) key += std::to_string(m) + ",";
      d.comm_key[j["comm"].get<int>()] = key;
    } else {
      Rec r;
      r.seq = j["seq"];
      r.comm = j["comm"];
      r.op = j["op"];
      r.bytes = j["bytes"];
      r.peer = j["peer"];
      r.start = j["start_ns"];
      r.end = j["end_ns"];
      r.state = j["state"];
      d.ops.push_back(std::move(r));
    }
  }
  RT_CHECK(!head, "diagnose: ", file.string(), " is empty");
  return d;
}

struct Finding {
  long long when = 0;  // start of the disputed collective, for ordering
  std::string text;
};

// The first collective of `g` on which the dumped members disagree, or which a
// member without a record never finished; "" when none.
Finding examine(const Group& g, const std::map<int, Dump>& dumps, const std::vector<int>& silent) {
  std::vector<int> seen;  // members with visible collectives here
  long long lo = 1, hi = 0;
  for (const auto& [rank, ops] : g.ops) {
    if (ops.empty()) continue;
    seen.push_back(rank);
    lo = std::max(lo, ops.front().seq);  // older ones fell out of some rank's ring
    hi = std::max(hi, ops.back().seq);
  }
  std::vector<int> absent;
  for (int m : g.members)
    if (std::find(silent.begin(), silent.end(), m) != silent.end()) absent.push_back(m);
  if (seen.empty()) return {};
  const std::string where = "communicator '" + g.name + "' (" + ranks_str(g.members) + ")";
  auto at = [&](int rank, long long s) -> const Rec* {
    const auto& v = g.ops.at(rank);
    auto it = std::lower_bound(v.begin(), v.end(), s, [](const Rec& r, long long x) { return r.seq < x; });
    return it != v.end() && it->seq == s ? &*it : nullptr;
  };
  for (long long s = lo; s <= hi; ++s) {
    std::map<std::string, std::vector<int>> by;  // "op (bytes)" -> ranks
    std::vector<int> missing;
    long long when = 0;
    for (int rank : seen)
      if (const Rec* r = at(rank, s)) {
        // alltoallv's bytes (what this rank sends) differ between ranks by design.
        by[r->op == "alltoallv" ? r->op : r->op + " (" + std::to_string(r->bytes) + " bytes)"].push_back(rank);
        when = when ? std::min(when, r->start) : r->start;
      } else {
        missing.push_back(rank);
      }
    const bool unfinished = std::any_of(seen.begin(), seen.end(), [&](int rank) {
      const Rec* r = at(rank, s);
      return r && r->state != "done";
    });
    if (by.size() <= 1 && missing.empty() && !(unfinished && !absent.empty())) continue;
    std::ostringstream o;
    auto major = std::max_element(by.begin(), by.end(),
                                  [](const auto& a, const auto& b) { return a.second.size() < b.second.size(); });
    o << where << ", collective #" << s << ":\n";
    if (!missing.empty()) {
      o << "  " << ranks_str(missing) << " never entered it";
      if (major != by.end()) o << " (" << ranks_str(major->second) << " entered " << major->first << ")";
      o << "\n";
    }
    for (const auto& [sig, ranks] : by)
      if (by.size() > 1 && sig != major->first)
        o << "  " << ranks_str(ranks) << " entered " << sig << " instead of " << major->first << "\n";
    if (!absent.empty())
      o << "  " << ranks_str(absent) << " wrote no record (stopped, hung, dead, or blocked outside ringtrain's "
        << "waits): " << (by.size() <= 1 && missing.empty() ? "it never finished this collective\n" : "unknown\n");
    for (int rank : seen) {
      const Dump& d = dumps.at(rank);
      o << "    world rank " << rank << ": ";
      if (const Rec* r = at(rank, s))
        o << "#" << s << " " << describe(*r, d.time);
      else {
        const auto& v = g.ops.at(rank);
        o << "last here #" << v.back().seq << " " << describe(v.back(), d.time);
      }
      o << "\n";
    }
    return {when, o.str()};
  }
  return {};
}

}  // namespace

std::string diagnose(const std::string& dir) {
  std::map<int, Dump> dumps;
  std::error_code ec;
  RT_CHECK(std::filesystem::is_directory(dir, ec), "diagnose: '", dir, "' is not a directory");
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string f = e.path().filename().string();
    if (f.rfind("rank", 0) != 0 || e.path().extension() != ".jsonl") continue;
    Dump d = read_dump(e.path());
    dumps[d.rank] = std::move(d);
  }
  RT_CHECK(!dumps.empty(), "diagnose: no flight record (rank<N>.jsonl) in '", dir,
           "': was comm.flight_recorder on, and did the job stall or crash?");
  int size = 0;
  for (const auto& [r, d] : dumps) size = std::max(size, d.size);
  std::vector<int> have, silent;
  for (int r = 0; r < size; ++r) (dumps.count(r) ? have : silent).push_back(r);

  std::map<std::string, Group> groups;
  for (const auto& [rank, d] : dumps) {
    for (const auto& [idx, key] : d.comm_key) {
      Group& g = groups[key];
      if (g.name.empty()) {
        g.name = key.substr(0, key.find('|'));
        std::stringstream ms(key.substr(key.find('|') + 1));
        for (std::string m; std::getline(ms, m, ',');) g.members.push_back(std::stoi(m));
      }
      g.ops[rank];
    }
    for (const Rec& r : d.ops)
      if (r.seq > 0 && d.comm_key.count(r.comm)) groups[d.comm_key.at(r.comm)].ops[rank].push_back(r);
  }
  for (auto& [k, g] : groups)
    for (auto& [r, v] : g.ops) std::sort(v.begin(), v.end(), [](const Rec& a, const Rec& b) { return a.seq < b.seq; });

  std::ostringstream o;
  o << "Flight records in " << dir << ": " << ranks_str(have) << " of " << size << ".\n";
  long long first = 0;
  for (const auto& [r, d] : dumps) first = first ? std::min(first, d.time) : d.time;
  for (const auto& [r, d] : dumps)
    o << "  world rank " << r << " wrote it " << (d.time - first) / 1000000 / 1e3 << " s after the first, on: " << d.reason
      << "\n";
  if (!silent.empty())
    o << ranks_str(silent) << " wrote none (stopped, hung, dead, or blocked outside ringtrain's waits).\n";
  std::vector<Finding> found;
  for (const auto& [k, g] : groups)
    if (Finding f = examine(g, dumps, silent); !f.text.empty()) found.push_back(f);
  std::sort(found.begin(), found.end(), [](const Finding& a, const Finding& b) { return a.when < b.when; });
  if (found.empty())
    o << "\nNo disagreement: the ranks that wrote records entered every recorded collective alike (a rank "
         "stopped inside one looks like the others); the reasons above name the ranks that did not respond.\n";
  for (std::size_t i = 0; i < found.size(); ++i) o << (i == 0 ? "\nFirst disagreement: " : "\nAlso: ") << found[i].text;
  // What each rank was still waiting for (point-to-point included).
  o << "\nUnfinished when dumped:\n";
  for (const auto& [r, d] : dumps) {
    for (const Rec& e : d.ops) {
      if (e.state != "started") continue;
      const std::string key = d.comm_key.count(e.comm) ? d.comm_key.at(e.comm) : "?|";
      o << "  world rank " << r << ": " << e.op << " on '" << key.substr(0, key.find('|')) << "'";
      if (e.seq > 0) o << " #" << e.seq;
      if (e.peer >= 0) o << " with its rank " << e.peer;
      o << ", " << e.bytes << " bytes, for " << (d.time - e.start) / 1000000 / 1e3 << " s\n";
    }
  }
  return o.str();
}

}  // namespace ringtrain::flight_recorder
