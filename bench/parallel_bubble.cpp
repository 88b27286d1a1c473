// Pipeline bubble: for each schedule and m, the measured bubble fraction
// (idle / step span per stage, the span running from a common start to the
// last stage's end; median over steps, mean over stages) next to the
// analytic one, and the peak activation memory per stage (micro-batches whose
// activations a stage held at once, counted as the executor ran).
//
// Stage compute is a timed SLEEP, not arithmetic: the ranks of this machine
// share 2 cores, so real layers on p > 2 stages would measure the CPU
// scheduler, not the schedule. F, B and W each sleep --unit-ms (B+W together
// in afab/1f1b, as the textbook backward of 2 units). The executor, its
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
#include <thread>

#include <CLI/CLI.hpp>

#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/comm/communicator.hpp"
#include "ringtrain/parallel/executor.hpp"

using namespace ringtrain;

namespace {

class SleepOps final : public StageOps {
 public:
  // fold_w: W runs before the gradient is sent (afab, 1f1b), so the sent
  // gradient carries the time after W; with zb-h1 it is already on its way.
  SleepOps(int slots, double unit_s, bool fold_w) : unit_(unit_s), fold_w_(fold_w) {
    for (int i = 0; i < slots; ++i) {
      out_.push_back(Tensor::zeros({1, 64}));
      dx_.push_back(Tensor::zeros({1, 64}));
    }
    in_ = Tensor::zeros({1, 64});
    dy_ = Tensor::zeros({1, 64});
  }
  void reset() { clock_ = busy_ = 0; }
  double clock() const { return clock_; }
  double busy() const { return busy_; }
  Tensor load(int) override { return in_; }
  Tensor forward(int slot, int, const Tensor& x) override {
    live_ = live_ + 1;
    peak_ = std::max(peak_, live_);
    clock_ = std::max(clock_, static_cast<double>(x.data<float>()[0]));
    nap();
    out_[slot].data<float>()[0] = static_cast<float>(clock_);
    return out_[slot];
  }
  Tensor loss_grad(int, int, const Tensor&) override { return dy_; }
  Tensor backward_input(int slot, int, const Tensor& dy, bool) override {
    clock_ = std::max(clock_, static_cast<double>(dy.data<float>()[0]));
    nap();
    dx_[slot].data<float>()[0] = static_cast<float>(clock_);
    return dx_[slot];
  }
  void backward_weight(int slot, int, bool) override {
    nap();
    if (fold_w_) dx_[slot].data<float>()[0] = static_cast<float>(clock_);
    --live_;
  }
  int peak() const { return peak_; }

 private:
  // Sleeps one unit; the virtual clock advances by exactly one unit.
  void nap() {
    std::this_thread::sleep_for(std::chrono::duration<double>(unit_));
    clock_ += unit_;
    busy_ += unit_;
  }
  double unit_, clock_ = 0, busy_ = 0;
  bool fold_w_;
  int live_ = 0, peak_ = 0;
  std::vector<Tensor> out_, dx_;
  Tensor in_, dy_;
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

  const int p = world.size();
  ProcessGrid grid = ProcessGrid::make(world, {p, 1});
  if (world.rank() == 0) {
    std::printf("pipeline bubble, p = %d stages, F = B = W = %.1f ms sleeps; bubble = idle / step time per stage\n", p,
                unit_ms);
    std::printf("%-6s %4s %10s %10s %10s %8s %14s %10s\n", "sched", "m", "wall", "replay", "analytic", "repl/an",
                "peak act (s0)", "max stage");
  }
  std::ofstream out;
  if (world.rank() == 0 && !csv.empty()) {
    const bool fresh = !std::ifstream(csv).good();
    out.open(csv, std::ios::app);
    if (fresh) out << "schedule,p,m,unit_ms,wall_bubble,virtual_bubble,analytic_bubble,peak_act_stage0,peak_act_max,step_ms\n";
  }
  for (ScheduleKind k : {ScheduleKind::afab, ScheduleKind::one_f_one_b, ScheduleKind::zb_h1})
    for (int m : ms) {
      ScheduleExecutor ex(grid, k, m, {1, 64}, {1, 64});
      SleepOps ops(ex.slots(), unit_ms * 1e-3, k != ScheduleKind::zb_h1);
      std::vector<double> bub, wall, vbub;
      for (int s = 0; s <= steps; ++s) {
        world.barrier();
        ops.reset();
        StepTiming t = ex.run_step(ops);
        double vspan = ops.clock();
        allreduce(&vspan, &vspan, 1, DType::f64, ReduceOp::max, world);
        // The step lasts until the last stage is done (the flush): every
        // stage's idle is measured against that common span.
        double span = t.wall_s;
        allreduce(&span, &span, 1, DType::f64, ReduceOp::max, world);
        if (s == 0) continue;
        bub.push_back(1.0 - t.busy_s / span);
        vbub.push_back(1.0 - ops.busy() / vspan);
        wall.push_back(span);
      }
      std::sort(bub.begin(), bub.end());
      std::sort(wall.begin(), wall.end());
      std::sort(vbub.begin(), vbub.end());
      double v[3] = {bub[bub.size() / 2], wall[wall.size() / 2], vbub[vbub.size() / 2]};
      double peak0 = ops.peak(), peakmax = ops.peak();
      allreduce(v, v, 3, DType::f64, ReduceOp::sum, world);
      allreduce(&peakmax, &peakmax, 1, DType::f64, ReduceOp::max, world);
      broadcast(&peak0, 1, DType::f64, 0, world);
      const double meas = v[0] / p, virt = v[2] / p, an = analytic_bubble(k, p, m);
      if (world.rank() == 0) {
        std::printf("%-6s %4d %10.3f %10.3f %10.3f %8.2f %14.0f %10.0f\n", schedule_name(k), m, meas, virt, an,
                    an > 0 ? virt / an : 0.0, peak0, peakmax);
        if (out) out << schedule_name(k) << "," << p << "," << m << "," << unit_ms << "," << meas << "," << virt << ","
                     << an << "," << peak0 << "," << peakmax << "," << 1e3 * v[1] / p << "\n";
      }
    }
  return 0;
}
