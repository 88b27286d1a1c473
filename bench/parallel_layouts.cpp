// Where a step's time goes under each way of splitting one model over the
// world's w ranks, side by side in one run: data parallel (w replicas),
// pipeline (w stages, m micro-batches) and tensor parallel (w shards of every
// block), same model, same global batch, same synthetic data.
//
// Per step and rank (ScheduleExecutor's StepTiming plus the TensorGroup's
// TpStats, which tp_all_reduce & co. add to):
//   tensor comm = time inside the tensor-parallel collectives (part of busy);
//                 includes waiting for the slower tensor rank, so it is also
//                 shown on the rank with the least (nearer the transfer alone)
//   compute     = busy - tensor comm
//   bubble      = executor wall - busy - dp wait  (waiting for pipeline neighbours)
//   dp exposed  = waiting in the gradient synchronisation for the data-parallel all-reduces
//   other       = step - executor wall  (loss all-reduce, zeroing gradients)
// Components are means over ranks, the step the slowest rank's; every figure
// is the median over the timed steps. Layouts run interleaved step by step,
// so load from other processes hits them alike.
//
// The tensor all-reduces are also predicted: an all-reduce sweep on the same
// tensor communicator, through tp_all_reduce itself, fitted to the ring's
// alpha-beta form t(n) = 2(T-1)(alpha + n beta / T) (relative least squares;
// gamma, the reduction cost, is folded into beta), times the calls of a step:
// per transformer block 2 forward + 2 backward all-reduces of B*S*D floats
// (B micro-batch samples, S tokens, D width).
//   mpirun -np 2 -x OMP_NUM_THREADS=1 bench_parallel_layouts [--batch 256 --m 4 --steps 20 --csv f]
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/nn/rng.hpp"
#include "ringtrain/nn/tensor_parallel.hpp"
#include "ringtrain/parallel/parts.hpp"

using namespace ringtrain;

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
// CPU seconds of the calling thread: what a step costs whatever the scheduler does to its wall time.
double thread_cpu() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

std::string first_line_with(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string l; std::getline(in, l);)
    if (l.rfind(key, 0) == 0) {
      auto c = l.find(':');
      return c == std::string::npos ? l : l.substr(l.find_first_not_of(" \t", c + 1));
    }
  return "?";
}

std::string loadavg() {
  std::ifstream in("/proc/loadavg");
  std::string a;
  in >> a;
  return a;
}

struct Layout {
  std::string name;
  int pp = 1, tp = 1, m = 1;
  std::unique_ptr<ProcessGrid> grid;
  ModelParts model;
  std::shared_ptr<TpStats> stats = std::make_shared<TpStats>();
  Tensor x, y;
  // per timed step: step (this rank), executor wall, busy, tensor comm, dp wait, tensor calls, thread CPU
  std::vector<double> step, wall, busy, tpc, dp, calls, cpu;
};

// Medians over steps of the per-step split (components averaged over ranks).
struct Split {
  double step = 0, compute = 0, tp = 0, bubble = 0, dp = 0, other = 0, calls = 0, bubble_frac = 0;
  double tp_min = 0;  // tensor comm on the rank with the least: closer to the transfer alone (the other waits)
  double cpu = 0;     // the training thread's CPU time (spinning waits included)
};

Split summarise(Layout& L, const Communicator& world) {
  const std::size_t n = L.step.size();
  std::vector<double> step = L.step, tp_min = L.tpc, sum;
  allreduce(step.data(), step.data(), n, DType::f64, ReduceOp::max, world);
  allreduce(tp_min.data(), tp_min.data(), n, DType::f64, ReduceOp::min, world);
  for (auto* v : {&L.wall, &L.busy, &L.tpc, &L.dp, &L.calls, &L.cpu}) sum.insert(sum.end(), v->begin(), v->end());
  allreduce(sum.data(), sum.data(), sum.size(), DType::f64, ReduceOp::sum, world);
  const double w = world.size();
  std::vector<double> comp(n), tp(n), bub(n), dp(n), oth(n), calls(n), frac(n), cpu(n);
  for (std::size_t i = 0; i < n; ++i) {
    const double wall = sum[i] / w, busy = sum[n + i] / w;
    tp[i] = sum[2 * n + i] / w;
    dp[i] = sum[3 * n + i] / w;
    calls[i] = sum[4 * n + i] / w;
    cpu[i] = sum[5 * n + i] / w;
    comp[i] = busy - tp[i];
    bub[i] = std::max(0.0, wall - busy - dp[i]);
    oth[i] = std::max(0.0, step[i] - wall);
    frac[i] = wall > 0 ? bub[i] / wall : 0;
  }
  return {median(step), median(comp), median(tp),    median(bub),  median(dp),
          median(oth),  median(calls), median(frac), median(tp_min), median(cpu)};
}

// Per size, the slowest rank's tp_all_reduce time: the minimum over iterations
// (the uncontended cost, what alpha and beta mean on a shared machine) or the
// median. Sizes are interleaved iteration by iteration, so that a loaded spell
// hits all of them alike.
std::vector<std::pair<double, double>> sweep(const TensorGroup& g, const std::vector<std::int64_t>& bytes, int iters,
                                             bool use_min) {
  const std::size_t k = bytes.size();
  std::vector<Tensor> bufs;
  for (std::int64_t b : bytes) {
    bufs.push_back(Tensor::empty({b / 4}));
    bufs.back().fill_(0.0f);  // zeros stay zeros however often they are summed
    for (int i = 0; i < 3; ++i) tp_all_reduce(bufs.back(), g);
  }
  std::vector<double> ts(k * iters);
  for (int i = 0; i < iters; ++i)
    for (std::size_t j = 0; j < k; ++j) {
      g.comm.barrier();
      auto t0 = Clock::now();
      tp_all_reduce(bufs[j], g);
      ts[j * iters + i] = since(t0);
    }
  allreduce(ts.data(), ts.data(), ts.size(), DType::f64, ReduceOp::max, g.comm);
  std::vector<std::pair<double, double>> out;
  for (std::size_t j = 0; j < k; ++j) {
    std::vector<double> v(ts.begin() + j * iters, ts.begin() + (j + 1) * iters);
    out.emplace_back(static_cast<double>(bytes[j]), use_min ? *std::min_element(v.begin(), v.end()) : median(v));
  }
  return out;
}

// t = a + b n by least squares on relative errors (sizes span three decades).
std::pair<double, double> fit_line(const std::vector<std::pair<double, double>>& pts) {
  double s = 0, sn = 0, snn = 0, st = 0, snt = 0;
  for (auto [n, t] : pts) {
    const double w = 1.0 / (t * t);
    s += w, sn += w * n, snn += w * n * n, st += w * t, snt += w * n * t;
  }
  const double det = s * snn - sn * sn;
  return {(st * snn - sn * snt) / det, (s * snt - sn * st) / det};
}

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator world = Communicator::world();
  CLI::App app("per-step time split of data / pipeline / tensor parallelism on vit (mpirun -np 2)");
  std::int64_t batch = 256, width = 64, heads = 4, patch = 7;
  int depth = 4, m = 4, steps = 20, warmup = 2, iters = 50;
  double mlp_ratio = 2.0;
  std::string schedule = "1f1b", partition = "params", stat = "min", csv;
  app.add_option("--batch", batch, "global batch per step");
  app.add_option("--width", width, "vit embedding width D");
  app.add_option("--depth", depth, "transformer blocks");
  app.add_option("--heads", heads, "attention heads (the tensor size must divide them)");
  app.add_option("--patch", patch, "patch side (28x28 images: S = (28/patch)^2 tokens)");
  app.add_option("--mlp-ratio", mlp_ratio, "MLP hidden units per width unit");
  app.add_option("--m", m, "micro-batches of the pipeline layout");
  app.add_option("--schedule", schedule, "pipeline schedule: afab, 1f1b, zb-h1");
  app.add_option("--partition", partition, "pipeline partition: uniform, params, time");
  app.add_option("--steps", steps, "timed steps per layout");
  app.add_option("--warmup", warmup, "untimed steps per layout first");
  app.add_option("--sweep-iters", iters, "iterations per size of the tensor all-reduce sweep");
  app.add_option("--stat", stat, "sweep statistic over iterations: min (uncontended) or median")
      ->check(CLI::IsMember({"min", "median"}));
  app.add_option("--csv", csv, "write the per-layout results here");
  CLI11_PARSE(app, argc, argv);
  omp_set_num_threads(1);
  const int w = world.size();
  if (w < 2 || batch % w != 0 || batch % m != 0) {  // the same on every rank: all leave together
    if (world.rank() == 0)
      std::fprintf(stderr, "bench_parallel_layouts: needs >= 2 ranks and --batch divisible by the rank count and by"
                   " --m; got %d ranks, batch %lld, m %d\n", w, static_cast<long long>(batch), m);
    return 2;
  }
  const std::string load0 = loadavg();

  ModelConfig mc;
  mc.name = "vit";
  mc.in_channels = 1;
  mc.height = mc.width = 28;
  mc.base_width = width;
  mc.depth = depth;
  mc.heads = heads;
  mc.patch = patch;
  mc.mlp_ratio = mlp_ratio;
  OptimizerConfig oc;
  oc.momentum = 0.9;

  std::vector<Layout> layouts(3);
  layouts[0].name = cat("data ", w);
  layouts[1].name = cat("pipeline ", w, " (", schedule, ", m ", m, ")");
  layouts[1].pp = w;
  layouts[1].m = m;
  layouts[2].name = cat("tensor ", w);
  layouts[2].tp = w;
  try {  // configuration errors (heads, partition, ...) are raised alike on every rank
    for (Layout& L : layouts) {
      L.grid = std::make_unique<ProcessGrid>(ProcessGrid::make(world, {L.pp, L.tp}));
      GridConfig pc;
      pc.micro_batches = L.m;
      pc.schedule = parse_schedule(schedule);
      pc.partition = parse_partition(partition);
      pc.batch = batch / L.grid->dp_size();
      ModelConfig lm = mc;
      lm.tensor.stats = L.stats;
      L.model = build_parts(*L.grid, lm, pc, oc);
      // Every layout sees the same global batch: replica r takes samples [r*b, (r+1)*b).
      L.x = Tensor::empty({pc.batch, 1, 28, 28});
      L.y = Tensor::empty({pc.batch}, DType::i64);
      const std::int64_t off = L.grid->dp_rank() * pc.batch;
      for (std::int64_t i = 0; i < L.x.numel(); ++i)
        L.x.data<float>()[i] = counter_uniform(3, 0, static_cast<std::uint64_t>(off * 784 + i)) - 0.5f;
      for (std::int64_t i = 0; i < pc.batch; ++i) L.y.data<std::int64_t>()[i] = (off + i) % 10;
    }
  } catch (const Error& e) {
    if (world.rank() == 0) std::fprintf(stderr, "bench_parallel_layouts: %s\n", e.what());
    return 2;
  }

  // Untimed steps, then the tensor all-reduce sweep, then the timed steps, interleaved.
  for (int s = 0; s < warmup; ++s)
    for (Layout& L : layouts) train_step(*L.grid, L.model, L.x, L.y, 0.01);
  const std::int64_t S = (28 / patch) * (28 / patch);
  const std::int64_t msg = (batch / layouts[2].m) * S * width * 4;  // bytes of one tensor all-reduce
  std::vector<std::int64_t> sizes = {4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20};
  if (std::find(sizes.begin(), sizes.end(), msg) == sizes.end()) sizes.push_back(msg);
  std::sort(sizes.begin(), sizes.end());
  const TensorGroup tg = TensorGroup::of(layouts[2].grid->tp());
  const auto pts = sweep(tg, sizes, iters, stat == "min");
  const auto [a, b] = fit_line(pts);
  const int T = tg.size;
  const double alpha = a / (2.0 * (T - 1)), beta = b * T / (2.0 * (T - 1));
  auto ring = [&](double n, int p) { return 2.0 * (p - 1) * (alpha + n * beta / p); };

  for (int s = 0; s < steps; ++s)
    for (Layout& L : layouts) {
      world.barrier();
      L.stats->reset();
      const double c0 = thread_cpu();
      auto t0 = Clock::now();
      StepResult r = train_step(*L.grid, L.model, L.x, L.y, 0.01);
      L.step.push_back(since(t0));
      L.cpu.push_back(thread_cpu() - c0);
      L.wall.push_back(r.timing.wall_s);
      L.busy.push_back(r.timing.busy_s);
      L.tpc.push_back(L.stats->seconds);
      L.dp.push_back(r.timing.reduce_s);
      L.calls.push_back(static_cast<double>(L.stats->calls));
    }
  std::vector<Split> res;
  for (Layout& L : layouts) res.push_back(summarise(L, world));
  std::string balance;
  for (int v : layouts[1].model.balance) balance += cat(balance.empty() ? "" : ",", v);
  const double params = static_cast<double>(layouts[0].model.stage->arena().numel());
  if (world.rank() != 0) return 0;

  std::printf("vit: width %lld, depth %d, heads %lld, mlp ratio %.1f, patch %lld (S = %lld tokens), 28x28x1 synthetic,"
              " %.0f parameters; global batch %lld; %d ranks, 1 compute thread each\n",
              (long long)width, depth, (long long)heads, mlp_ratio, (long long)patch, (long long)S, params,
              (long long)batch, w);
  std::printf("CPU: %s, %ld logical CPUs; load average %s at start, %s at end (other processes share the cores)\n",
              first_line_with("/proc/cpuinfo", "model name").c_str(), sysconf(_SC_NPROCESSORS_ONLN), load0.c_str(),
              loadavg().c_str());
  std::printf("medians over %d steps (after %d untimed), ms per step; components averaged over ranks;"
              " cpu = the training thread's CPU time per step\n(spinning waits included; the part of a step that"
              " does not depend on the scheduler); MB sent = bytes each rank sends per step (by the algorithms, not"
              " measured)\n\n", steps, warmup);
  // Bytes each rank sends per step (what the algorithms move, not measured): a ring
  // all-reduce sends 2(p-1)/p of the message; a stage boundary carries the
  // global batch's activations forward and their gradients back.
  // At p = 2 each rank sends one direction, a middle stage both.
  const double pp_bytes = double(batch) * S * width * 4 * (w > 2 ? 2 : 1);
  const double sent[3] = {2.0 * (w - 1) / w * 4 * params, pp_bytes,
                          4.0 * depth * layouts[2].m * msg * 2.0 * (T - 1) / T};
  const double calls_pred = 4.0 * depth * layouts[2].m;
  double bound[3];
  for (int i = 0; i < 3; ++i) {
    const Layout& L = layouts[i];
    bound[i] = res[i].compute / (1.0 - double(L.pp - 1) / (L.m + L.pp - 1)) + (L.tp > 1 ? calls_pred * ring(msg, T) : 0);
  }
  std::printf("%-26s %8s %8s %8s %8s %8s %8s %8s %8s %9s %6s %9s\n", "layout", "step", "bound", "compute", "tp comm",
              "bubble", "dp expos", "other", "cpu", "images/s", "vs DP", "MB sent");
  for (std::size_t i = 0; i < layouts.size(); ++i) {
    const Split& r = res[i];
    std::printf("%-26s %8.1f %8.1f %8.1f %8.2f %8.1f %8.2f %8.2f %8.1f %9.0f %6.2f %9.2f\n", layouts[i].name.c_str(),
                1e3 * r.step, 1e3 * bound[i], 1e3 * r.compute, 1e3 * r.tp, 1e3 * r.bubble, 1e3 * r.dp, 1e3 * r.other,
                1e3 * r.cpu, batch / r.step,
                res[0].step / r.step, sent[i] / 1e6);
  }

  const Split& t = res[2];
  double at_msg = 0;
  for (auto [n, s] : pts)
    if (n == msg) at_msg = s;
  std::printf("\ntensor all-reduce sweep on the tensor communicator (T = %d, tp_all_reduce, automatic algorithm),"
              " %s of %d, slowest rank:\n  %10s %12s %12s\n", T, stat.c_str(), iters, "bytes", "measured us", "fit us");
  for (auto [n, s] : pts) std::printf("  %10.0f %12.1f %12.1f\n", n, 1e6 * s, 1e6 * ring(n, T));
  std::printf("fit t(n) = 2(T-1)(alpha + n beta/T): alpha = %.2f us, beta = %.3f ns/B (%.2f GB/s; gamma folded in)\n",
              1e6 * alpha, 1e9 * beta, beta > 0 ? 1e-9 / beta : 0.0);
  std::printf("per block: 2 forward + 2 backward all-reduces of B*S*D = %lld*%lld*%lld floats = %lld B;"
              " alpha-beta: 4 x %.1f us = %.1f us\n",
              (long long)(batch / layouts[2].m), (long long)S, (long long)width, (long long)msg, 1e6 * ring(msg, T),
              4e6 * ring(msg, T));
  std::printf("per step (%d blocks, m %d): %.0f all-reduces predicted, %.0f counted; tensor comm predicted %.2f ms"
              " (alpha-beta), %.2f ms (sweep at %lld B); measured %.2f ms mean over ranks (%.2f x alpha-beta), %.2f ms on"
              " the rank with the least\n",
              depth, layouts[2].m, calls_pred, t.calls, 1e3 * calls_pred * ring(msg, T), 1e3 * calls_pred * at_msg,
              (long long)msg, 1e3 * t.tp, t.tp / (calls_pred * ring(msg, T)), 1e3 * t.tp_min);
  std::printf("data parallel: gradients %.0f B; one all-reduce of them costs %.2f ms by alpha-beta (upper bound on"
              " exposed if none overlaps), exposed %.2f ms\n",
              4 * params, 1e3 * ring(4 * params, w), 1e3 * res[0].dp);
  std::printf("pipeline: stages of %s layers; bubble %.3f of the step vs (p-1)/(m+p-1) = %.3f (equal stages)\n",
              balance.c_str(), res[1].bubble_frac, double(w - 1) / (layouts[1].m + w - 1));
  std::printf("bound = compute / (1 - (p-1)/(m+p-1)) + alpha-beta tensor comm: the step if the pipeline idled only as"
              " the formula says and the tensor all-reduces took their alpha-beta time (the DP all-reduce overlaps)\n");

  if (!csv.empty()) {
    std::ofstream o(csv);
    o << "layout,pipeline,tensor,data,micro_batches,step_s,bound_s,compute_s,tp_comm_s,bubble_s,dp_exposed_s,other_s,cpu_s,"
         "images_per_s,bytes_sent_per_rank,tp_calls,tp_pred_s,tp_comm_min_rank_s,alpha_s,beta_s_per_byte,load_start,load_end\n";
    for (std::size_t i = 0; i < layouts.size(); ++i) {
      const Layout& L = layouts[i];
      const Split& r = res[i];
      o << '"' << L.name << "\"," << L.pp << ',' << L.tp << ',' << L.grid->dp_size() << ',' << L.m << ',' << r.step
        << ',' << bound[i] << ',' << r.compute << ',' << r.tp << ',' << r.bubble << ',' << r.dp << ',' << r.other << ',' << r.cpu << ','
        << batch / r.step << ',' << sent[i] << ',' << r.calls << ',' << (L.tp > 1 ? 4.0 * depth * L.m * ring(msg, T) : 0.0) << ','
        << r.tp_min << ',' << alpha << ',' << beta << ',' << load0 << ',' << loadavg() << "\n";
    }
  }
  return 0;
}
