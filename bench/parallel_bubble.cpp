// Pipeline bubble: for each schedule and m, the measured bubble fraction
// (idle / step span per stage, the span running from a common start to the
// last stage's end; median over steps, mean over stages) next to the
// analytic one, the step time against 1F1B's and against the schedule
// simulator's two predictions (parallel/simulator.hpp: the table played with
// the per-chunk F, I, W times the executor measured in this run; messages
// free, and messages at the link measured by the executor's ping-pong before
// the point: ScheduleExecutor::measure_link), with the error of each,
// and the peak activation memory per rank (in micro-batches of a
// whole stage: a chunk of an interleaved or V layout counts 1/v, counted as
// the executor ran).
//
// Stage compute is a timed SLEEP, not arithmetic: the ranks of this machine
// share 2 cores, so real layers on p > 2 stages would measure the CPU
// scheduler, not the schedule. F, B (input gradient) and W each sleep
// --unit-ms per stage (B+W together in afab/1f1b, as the textbook backward of
// 2 units); with v chunks per rank each chunk sleeps unit/v. The executor, its
// messages (a small tensor per micro-batch) and its slot handling are the real
// ones. Two measurements per point:
//  - wall: idle / span of real time (includes message latency and the
//    wake-up delays of a loaded machine);
//  - replay (a virtual clock, NOT a measurement of time): a clock carried in
//    each message (the sender's time) and advanced by exactly one unit per F,
//    B or W, so idle is only what the dependencies of the messages the
//    executor really exchanged force (independent of machine load; an
//    executor that ran ops out of order or waited on the wrong message would
//    show here). It replays the executed schedule on ideal hardware.
// Run with mpirun -np p; rows are appended to --csv.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <thread>

#include <CLI/CLI.hpp>
#include <omp.h>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/nn/model_registry.hpp"
#include "ringtrain/parallel/parts.hpp"
#include "ringtrain/parallel/simulator.hpp"

using namespace ringtrain;

namespace {

// What every copy of the sleeping layers of this rank shares: the virtual
// clock (in units of one op), the ops run, and the micro-batches whose
// activations are held (forward done, weight backward not).
struct SleepState {
  double unit_s = 0;  // per chunk: --unit-ms / v
  double clock = 0;
  double busy = 0;
  double step = 1;  // virtual units per op: 1/v
  int live = 0, peak = 0;
  void reset() { clock = 0, busy = 0; }
  // Sleeps one op; the virtual clock advances by exactly 1/v unit.
  void nap() {
    std::this_thread::sleep_for(std::chrono::duration<double>(unit_s));
    clock += step;
    busy += step;
  }
};
std::shared_ptr<SleepState> g_state = std::make_shared<SleepState>();

// A stage's one layer: F, B and W each one nap; the clock rides in element 0
// of the activations and gradients it sends (a loss gradient is at most 1 and
// arrives after the stage's own F, so it never moves the clock).
class SleepLayer final : public Layer {
 public:
  explicit SleepLayer(std::string name) : Layer(std::move(name)), st_(g_state) {}
  const char* type() const override { return "Sleep"; }
  Shape output_shape(const Shape& in) const override { return {in[0], 64}; }
  bool splits_backward() const override { return true; }
  CtxPtr make_ctx() const override { return ctx_of<Saved>(); }

 protected:
  struct Saved {
    Tensor out, dx;
  };
  Tensor do_forward(const Tensor& x, Ctx& c, const Call&) const override {
    Saved& s = saved<Saved>(c);
    st_->live += 1;
    st_->peak = std::max(st_->peak, st_->live);
    st_->clock = std::max(st_->clock, static_cast<double>(x.data<float>()[0]));
    st_->nap();
    ensure(s.out, {x.dim(0), 64}, DType::f32, Device::cpu()).data<float>()[0] = static_cast<float>(st_->clock);
    return s.out;
  }
  // afab / 1f1b: B and W together, the gradient sent after both.
  Tensor do_backward(const Tensor& dy, Ctx& c, bool need_dx, bool accumulate) const override {
    Tensor dx = do_backward_input(dy, c, need_dx, accumulate);
    do_backward_weight(c);
    dx.data<float>()[0] = static_cast<float>(st_->clock);
    return dx;
  }
  Tensor do_backward_input(const Tensor& dy, Ctx& c, bool, bool) const override {
    st_->clock = std::max(st_->clock, static_cast<double>(dy.data<float>()[0]));
    st_->nap();
    Tensor& dx = saved<Saved>(c).dx;
    ensure(dx, c.in_shape, DType::f32, Device::cpu()).data<float>()[0] = static_cast<float>(st_->clock);
    return dx;
  }
  void do_backward_weight(Ctx&) const override {
    st_->nap();
    --st_->live;
  }

 private:
  std::shared_ptr<SleepState> st_;  // the run's clock, shared by every layer (not micro-batch state)
};

}  // namespace

int main(int argc, char** argv) {
  MpiRuntime mpi(&argc, &argv);
  Communicator world = Communicator::world();
  CLI::App app("pipeline bubble benchmark (run with mpirun -np p)");
  double unit_ms = 4;
  int steps = 5;
  std::vector<int> ms = {1, 2, 4, 8, 16, 32};
  std::string csv;
  app.add_option("--unit-ms", unit_ms, "sleep of one F, B or W in ms");
  app.add_option("--steps", steps, "measured steps per point (after one warm-up)");
  app.add_option("--m", ms, "micro-batch counts");
  app.add_option("--csv", csv, "append rows to this CSV file");
  CLI11_PARSE(app, argc, argv);
  // One compute thread per rank, as the jobs run (train.threads): with
  // OpenMP's default of one per core, p ranks on the 2 cores oversubscribe
  // them and the last stage's loss on a 64-float tensor took 0.2-7.5 ms
  // (waiting for a second thread to be scheduled) instead of 0.02-0.3 ms.
  omp_set_num_threads(1);

  const int p = world.size();
  int layers = p;  // p x v sleep layers: the model of the schedule being measured
  register_model("sleep", [&layers](const ModelConfig&) {
    std::vector<LayerPtr> out;
    for (int i = 0; i < layers; ++i) out.push_back(std::make_unique<SleepLayer>(cat("sleep", i)));
    return out;
  });
  ModelConfig mc;
  mc.name = "sleep";
  mc.height = 1;
  mc.width = 64;
  mc.classes = 64;
  if (world.rank() == 0) {
    std::printf("pipeline bubble, p = %d ranks, F = B = W = %.1f ms sleeps per stage (unit/v per chunk); bubble = idle / "
                "step time per rank; pred = the simulator's step from the measured per-chunk costs, messages free "
                "(free) or at the measured link (p2p, one way = latency + bytes/bandwidth); err = meas/pred - 1\n",
                p, unit_ms);
    std::printf("%-11s %4s %8s %8s %8s %7s %9s %9s %9s %8s %8s %9s %8s %9s\n", "sched", "m", "wall", "replay", "analytic",
                "repl/an", "step ms", "free ms", "p2p ms", "err free", "err p2p", "p2p us", "x 1f1b", "peak act");
  }
  std::ofstream out;
  if (world.rank() == 0 && !csv.empty()) {
    const bool fresh = !std::ifstream(csv).good();
    out.open(csv, std::ios::app);
    if (fresh)
      out << "schedule,p,m,unit_ms,wall_bubble,virtual_bubble,analytic_bubble,peak_act_stage0,peak_act_max,step_ms,"
             "predicted_ms,vs_1f1b,predicted_p2p_ms,p2p_latency_us,p2p_bytes_per_s\n";
  }
  for (int m : ms) {
    double base_ms = 0;
    for (ScheduleKind k : {ScheduleKind::one_f_one_b, ScheduleKind::afab, ScheduleKind::zb_h1, ScheduleKind::interleaved,
                           ScheduleKind::zb_v}) {
      if (k == ScheduleKind::interleaved && m % p != 0) continue;
      const PipelineLayout L = layout_for(k, p, 2);
      layers = L.stages();
      ProcessGrid grid = ProcessGrid::make(world, {p, 1, 1, L.chunks, L.placement});
      GridConfig gc;
      gc.micro_batches = m;
      gc.batch = m;  // one sample per micro-batch
      gc.schedule = k;
      ModelParts parts = build_parts(grid, mc, gc, OptimizerConfig{});
      StepInput in;
      in.images = {Tensor::zeros({m, 1, 1, 64})};
      in.labels = {Tensor::zeros({m}, DType::i32)};
      *g_state = SleepState{unit_ms * 1e-3 / L.chunks};
      g_state->step = 1.0 / L.chunks;
      const LinkCost link = parts.executor->measure_link();
      std::vector<double> bub, wall, vbub;
      std::vector<ChunkTime> cost(static_cast<std::size_t>(L.chunks));  // measured, mean over the steps
      for (int s = 0; s <= steps; ++s) {
        world.barrier();
        g_state->reset();
        // The schedule alone (no synchronisation or update: nothing to update).
        StepTiming t = parts.executor->run(*parts.stage, *parts.loss, in, *parts.grad_sync).timing;
        double vspan = g_state->clock;
        allreduce(&vspan, &vspan, 1, DType::f64, ReduceOp::max, world);
        // The step lasts until the last stage is done (the flush): every
        // stage's idle is measured against that common span.
        double span = t.wall_s;
        allreduce(&span, &span, 1, DType::f64, ReduceOp::max, world);
        if (s == 0) continue;
        for (int c = 0; c < L.chunks; ++c) {
          cost[c].add(t.chunks[c], 1.0 / steps);
        }
        bub.push_back(1.0 - t.busy_s / span);
        vbub.push_back(1.0 - g_state->busy / vspan);
        wall.push_back(span);
      }
      std::sort(bub.begin(), bub.end());
      std::sort(wall.begin(), wall.end());
      std::sort(vbub.begin(), vbub.end());
      double v[3] = {bub[bub.size() / 2], wall[wall.size() / 2], vbub[vbub.size() / 2]};
      double peak0 = double(g_state->peak) / L.chunks, peakmax = peak0;
      allreduce(v, v, 3, DType::f64, ReduceOp::sum, world);
      allreduce(&peakmax, &peakmax, 1, DType::f64, ReduceOp::max, world);
      broadcast(&peak0, 1, DType::f64, 0, world);
      // The predictions play the table with the per-chunk costs this run measured (a sleep
      // lasts longer than asked on a loaded machine), messages free and at the measured link.
      const double pred = 1e3 * simulate(parts.executor->table(), parts.executor->gather_costs(cost)).makespan;
      const SimCosts with_link = parts.executor->gather_costs(cost, link);
      const double pred_p2p = 1e3 * simulate(parts.executor->table(), with_link).makespan;
      const double msg_us = 1e6 * with_link.message_s(0);
      const double meas = v[0] / p, virt = v[2] / p, step_ms = 1e3 * v[1] / p;
      const double an = analytic_bubble(k, p, m, 1, 1, 1, L.chunks);
      if (k == ScheduleKind::one_f_one_b) base_ms = step_ms;
      if (world.rank() == 0) {
        std::printf("%-11s %4d %8.3f %8.3f %8.3f %7.2f %9.1f %9.1f %9.1f %+8.3f %+8.3f %9.0f %8.3f %9.1f\n",
                    schedule_name(k), m, meas, virt, an, an > 0 ? virt / an : 0.0, step_ms, pred, pred_p2p,
                    step_ms / pred - 1, step_ms / pred_p2p - 1, msg_us, base_ms / step_ms, peakmax);
        if (out) out << schedule_name(k) << "," << p << "," << m << "," << unit_ms << "," << meas << "," << virt << ","
                     << an << "," << peak0 << "," << peakmax << "," << step_ms << "," << pred << ","
                     << base_ms / step_ms << "," << pred_p2p << "," << 1e6 * link.latency_s << ","
                     << link.bytes_per_s << "\n";
      }
    }
  }
  return 0;
}
