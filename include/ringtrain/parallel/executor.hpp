#pragma once
// ScheduleExecutor: interprets one stage's schedule (schedule.hpp) for one
// optimizer step, over the grid's pipeline communicator: every layout runs it (a
// single stage, data or tensor parallelism, is the schedule F, B, W per micro-batch).
//
// Rules:
//  - Transfers: activation/gradient shapes are known ahead (from the model),
//    so receive buffers (one per micro-batch and direction) are allocated once
//    and every receive of a step is posted when the step starts; sends are
//    non-blocking from the slot's own output, completed before that slot is
//    reused and at the end of the step. A list can therefore only wait in
//    RecvAct/RecvGrad, which the schedule tests prove cannot deadlock.
//  - Tags: (micro-batch, direction) on the pipeline communicator, a split of
//    the world that nothing else uses (the fusion engine duplicates its own).
//  - Construction is collective over the pipeline group: neighbours exchange
//    the shape they will send / expect; a mismatch is an Error on every rank
//    of the world naming both stages and shapes.
//  - A neighbour that died or stalled: a receive that waits longer than
//    timeout_s (comm.collective_timeout_s; 0 = never) ends the job
//    (MPI_Abort) with a message naming this stage and the one it waits for.
//  - Activation slots: a micro-batch takes a free slot at its forward and
//    frees it after its weight backward; slots() = peak_in_flight(schedule).
//  - Devices: transfers go through host memory. A stage on a GPU sends a host
//    copy of its output (kept until the send completes) and moves what it
//    receives to its device before use.
//  - Timing: busy seconds per step (compute ops), the seconds ReduceGrads
//    waits for the data-parallel all-reduces, and the step's wall time, for
//    the bubble (idle / total; bubble() counts the ReduceGrads wait as idle).
#include <functional>
#include <string>
#include <vector>

#include "ringtrain/core/tensor.hpp"
#include "ringtrain/parallel/grid.hpp"
#include "ringtrain/parallel/schedule.hpp"

namespace ringtrain {

// What a stage computes; the executor moves the tensors between stages.
class StageOps {
 public:
  virtual ~StageOps() = default;
  virtual Tensor load(int mb) = 0;                                   // first stage: the input
  virtual Tensor forward(int slot, int mb, const Tensor& x) = 0;     // the stage's output
  virtual Tensor loss_grad(int slot, int mb, const Tensor& out) = 0; // last stage: d loss / d output
  // Returns the input gradient (ignored on the first stage).
  virtual Tensor backward_input(int slot, int mb, const Tensor& dy, bool last_mb) = 0;
  virtual void backward_weight(int slot, int mb, bool last_mb) = 0;
  virtual void reduce_grads() {}
  virtual void optimizer_step() {}
};

struct StepTiming {
  double wall_s = 0;  // the step, start to end
  double busy_s = 0;  // in load/forward/loss/backward ops
  double reduce_s = 0;  // waiting in ReduceGrads for the data-parallel all-reduces (exposed communication)
  double bubble() const { return wall_s > 0 ? 1.0 - busy_s / wall_s : 0; }
  // Idle, waiting for other pipeline stages (the rest of the step).
  double wait_s() const { return wall_s > busy_s + reduce_s ? wall_s - busy_s - reduce_s : 0; }
};

// Waits for one point-to-point request with a stage of this pipeline. Polls
// with short sleeps once the wait gets long (a waiting stage leaves the cores
// to the others); past timeout_s (0 = never) the job ends with MPI_Abort after
// logging "<tag> waited T s for <what> from pipeline stage S (world rank R):
// that stage died or stalled". `request` holds an MPI_Request.
void await_stage(std::uint64_t& request, const ProcessGrid& grid, int peer_stage, double timeout_s,
                 const std::string& what);

class ScheduleExecutor {
 public:
  // in_mb / out_mb: this stage's input and output shapes for one micro-batch.
  ScheduleExecutor(const ProcessGrid& grid, ScheduleKind kind, int micro_batches, Shape in_mb, Shape out_mb,
                   double timeout_s = 300, Device dev = Device::cpu());
  ~ScheduleExecutor();
  ScheduleExecutor(const ScheduleExecutor&) = delete;
  ScheduleExecutor& operator=(const ScheduleExecutor&) = delete;

  int slots() const { return slots_; }
  const std::vector<Instr>& schedule() const { return sched_; }
  StepTiming run_step(StageOps& ops);

 private:
  void wait_recv(int mb, bool act);
  void wait_sends(int slot);

  const ProcessGrid& grid_;
  std::vector<Instr> sched_;
  int m_, slots_;
  std::vector<Tensor> act_in_, grad_in_;     // per micro-batch receive buffers
  std::vector<std::uint64_t> act_req_, grad_req_;  // MPI_Request handles (as integers)
  std::vector<std::vector<std::uint64_t>> slot_sends_;
  std::vector<std::vector<Tensor>> slot_staged_;  // host copies being sent, per slot
  double timeout_s_ = 300;
  Device dev_;
};

}  // namespace ringtrain
