#pragma once
// Which code holds the host tensor bytes at their peak: every host tensor
// allocation is attributed to the functions that asked for it (from its call
// stack: the innermost ringtrain function that is not the allocator or Tensor,
// and the layer methods around it), and the live set is summed per such site
// each time live bytes reach a new peak. Benchmarks only: the observer takes a
// lock and a backtrace per allocation (slow; peak bytes are what it is for).
//   install();  ... run ...;  write(file)   -> "bytes_each,count,total_bytes,site" rows, largest first
#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ringtrain/core/allocator.hpp"

namespace memory_attribution {

struct State {
  std::mutex mu;
  std::unordered_map<const void*, std::pair<std::size_t, int>> live;  // address -> bytes, site
  std::unordered_map<std::string, int> site_of_stack;                 // raw frames -> site
  std::unordered_map<const void*, std::string> name_of_pc;
  std::vector<std::string> sites;
  std::size_t live_bytes = 0, peak_bytes = 0;
  std::map<std::pair<int, std::size_t>, int> at_peak;  // (site, bytes each) -> count
};

inline State& state() {
  static State s;
  return s;
}

// "ringtrain::LayerNorm::do_forward" for a return address ("" outside a named function).
inline const std::string& function_at(State& s, const void* pc) {
  auto it = s.name_of_pc.find(pc);
  if (it != s.name_of_pc.end()) return it->second;
  std::string name;
  Dl_info info{};
  if (dladdr(pc, &info) && info.dli_sname) {
    int status = 0;
    char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    name = status == 0 && d ? d : info.dli_sname;
    std::free(d);
    // Drop the argument list and return type: "ringtrain::Linear::do_forward".
    int depth = 0;
    for (std::size_t i = 0; i < name.size(); ++i) {
      if (name[i] == '<') ++depth;
      if (name[i] == '>') --depth;
      if (name[i] == '(' && depth == 0) {
        name.resize(i);
        break;
      }
    }
  }
  return s.name_of_pc.emplace(pc, name).first->second;
}

inline bool plumbing(const std::string& f) {
  for (const char* skip : {"memory_attribution", "ringtrain::Tensor", "ringtrain::Storage", "ringtrain::Layer::ensure", "CpuAllocator",
                           "ringtrain::allocate_host_pages", "ringtrain::(anonymous", "std::"})
    if (f.find(skip) != std::string::npos) return true;
  return f.rfind("ringtrain::", 0) != 0;
}

inline bool layer_method(const std::string& f) {
  for (const char* m : {"::do_forward", "::do_backward", "::run_backward", "::do_backward_input",
                        "::do_backward_weight"})
    if (f.size() > std::char_traits<char>::length(m) && f.ends_with(m)) return true;
  return false;
}

// The site: innermost ringtrain function past the allocator, then up to two
// enclosing layer methods ("Linear::do_forward < RowParallel::do_forward < ResidualStack::do_forward").
inline int site_of(State& s, void* const* frames, int n) {
  std::string key(reinterpret_cast<const char*>(frames), sizeof(void*) * static_cast<std::size_t>(n));
  auto it = s.site_of_stack.find(key);
  if (it != s.site_of_stack.end()) return it->second;
  std::string label;
  int parents = 0;
  std::string last;
  for (int i = 0; i < n && parents < 3; ++i) {
    const std::string& f = function_at(s, frames[i]);
    if (plumbing(f) || f == last) continue;
    if (!label.empty() && !layer_method(f)) continue;
    if (!label.empty() && f.rfind("ringtrain::Layer::", 0) == 0) continue;
    label += (label.empty() ? "" : " < ") + f.substr(11);
    last = f;
    ++parents;
  }
  if (label.empty()) label = "(outside ringtrain)";
  auto found = std::find(s.sites.begin(), s.sites.end(), label);
  const int id = found != s.sites.end() ? int(found - s.sites.begin()) : int(s.sites.size());
  if (found == s.sites.end()) s.sites.push_back(label);
  s.site_of_stack.emplace(std::move(key), id);
  return id;
}

inline void observe(const void* p, std::size_t bytes, bool allocated) {
  State& s = state();
  void* frames[32];
  const int n = allocated ? backtrace(frames, 32) : 0;
  std::lock_guard lk(s.mu);
  if (!allocated) {
    auto it = s.live.find(p);
    if (it == s.live.end()) return;  // allocated before install()
    s.live_bytes -= it->second.first;
    s.live.erase(it);
    return;
  }
  s.live[p] = {bytes, site_of(s, frames, n)};
  s.live_bytes += bytes;
  if (s.live_bytes <= s.peak_bytes) return;
  s.peak_bytes = s.live_bytes;
  s.at_peak.clear();
  for (const auto& [q, v] : s.live) ++s.at_peak[{v.second, v.first}];
}

inline void install() { ringtrain::set_host_alloc_observer(&observe); }

// One row per (site, bytes each) at the peak, largest total first; returns the peak bytes.
inline std::size_t write(const std::string& file) {
  ringtrain::set_host_alloc_observer(nullptr);
  State& s = state();
  std::lock_guard lk(s.mu);
  std::vector<std::pair<std::size_t, std::string>> rows;
  for (const auto& [k, count] : s.at_peak) {
    char head[96];
    std::snprintf(head, sizeof head, "%zu,%d,%zu,", k.second, count, k.second * std::size_t(count));
    rows.push_back({k.second * std::size_t(count), head + ("\"" + s.sites[std::size_t(k.first)] + "\"")});
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  if (FILE* f = std::fopen(file.c_str(), "w")) {
    std::fprintf(f, "bytes_each,count,total_bytes,site\n");
    for (const auto& r : rows) std::fprintf(f, "%s\n", r.second.c_str());
    std::fclose(f);
  }
  return s.peak_bytes;
}

}  // namespace memory_attribution
