#pragma once
// Timing helpers of the CPU benchmarks that compare with PyTorch
// (bench_nn_throughput, bench_nn_gpt_vs_pytorch): process CPU time, medians,
// the measured matmul peak, and a reference script's JSON line.
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <dnnl.hpp>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace rt_bench {

// Process CPU time: on a shared, oversubscribed machine it excludes the time
// other processes hold the core, so it is far steadier than wall time (at one
// thread the two agree on an idle machine).
inline double cpu_now() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// GFLOP/s of a 2048^3 oneDNN matmul (bf16: bf16 inputs, fp32 accumulation),
// the best of a few runs by CPU time: the machine's matmul peak at this thread count.
inline double matmul_peak(bool bf16) {
  using dt = dnnl::memory::data_type;
  using tag = dnnl::memory::format_tag;
  const std::int64_t n = 2048;
  const dt t = bf16 ? dt::bf16 : dt::f32;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  dnnl::memory::desc a({n, n}, t, tag::ab), b({n, n}, t, tag::ba), c({n, n}, dt::f32, tag::ab);
  dnnl::matmul mm(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), eng));
  dnnl::memory ma(a, eng), mb(b, eng), mc(c, eng);
  std::memset(ma.get_data_handle(), 0, a.get_size());
  std::memset(mb.get_data_handle(), 0, b.get_size());
  double best = 1e30;
  for (int i = 0; i < 4; ++i) {
    const double c0 = cpu_now();
    mm.execute(strm, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    strm.wait();
    best = std::min(best, cpu_now() - c0);
  }
  return 2.0 * double(n * n * n) / best / 1e9;
}

// Runs a reference command and parses the JSON object on its last line; null
// (and its output on stderr) when it fails.
inline nlohmann::json run_json(const std::string& cmd) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return nullptr;
  std::string out;
  char buf[4096];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  const int rc = pclose(p);
  const auto pos = out.rfind('{');
  if (rc != 0 || pos == std::string::npos) {
    std::fprintf(stderr, "reference failed (rc %d): %s\n%s\n", rc, cmd.c_str(), out.c_str());
    return nullptr;
  }
  return nlohmann::json::parse(out.substr(pos));
}

}  // namespace rt_bench
