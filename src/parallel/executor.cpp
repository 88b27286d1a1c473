#include "ringtrain/parallel/executor.hpp"

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/core/log.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// MPI_Request stored as an integer handle (the header stays MPI-free).
static_assert(sizeof(MPI_Request) <= sizeof(std::uint64_t));
MPI_Request& req(std::uint64_t& h) { return *reinterpret_cast<MPI_Request*>(&h); }
std::uint64_t null_req() {
  std::uint64_t h = 0;
  req(h) = MPI_REQUEST_NULL;
  return h;
}

int tag_of(int mb, bool act) { return 2 * mb + (act ? 0 : 1); }

// Shapes as fixed-size integer records for the neighbour handshake.
std::vector<std::int64_t> pack_shape(const Shape& s) {
  std::vector<std::int64_t> v(9, -1);
  v[0] = static_cast<std::int64_t>(s.size());
  for (std::size_t i = 0; i < s.size() && i < 8; ++i) v[i + 1] = s[i];
  return v;
}
Shape unpack_shape(const std::vector<std::int64_t>& v) {
  Shape s;
  for (std::int64_t i = 0; i < v[0] && i < 8; ++i) s.push_back(v[static_cast<std::size_t>(i) + 1]);
  return s;
}

}  // namespace

ScheduleExecutor::ScheduleExecutor(const ProcessGrid& grid, ScheduleKind kind, int m, Shape in_mb, Shape out_mb,
                                   double timeout_s, Device dev)
    : grid_(grid), m_(m), timeout_s_(timeout_s), dev_(dev) {
  const int s = grid.pp_rank(), p = grid.pp_size();
  sched_ = make_schedule(kind, p, m, s);
  slots_ = peak_in_flight(sched_);
  // Handshake: each stage tells the next what it sends; the next compares.
  std::string err;
  MPI_Comm c = grid.pp().handle("pipeline shape handshake");
  std::vector<std::int64_t> mine = pack_shape(out_mb), got(9, -1);
  MPI_Sendrecv(mine.data(), 9, MPI_INT64_T, s + 1 < p ? s + 1 : MPI_PROC_NULL, 999999, got.data(), 9, MPI_INT64_T,
               s > 0 ? s - 1 : MPI_PROC_NULL, 999999, c, MPI_STATUS_IGNORE);
  if (s > 0 && unpack_shape(got) != in_mb)
    err = cat("pipeline stage ", s - 1, " sends activations of shape ", shape_str(unpack_shape(got)), " but stage ", s,
              " ", grid.tag(), " expects ", shape_str(in_mb));
  agree_or_throw(grid.world(), err, "checking the pipeline stages' shapes");

  for (int i = 0; i < m; ++i) {
    if (s > 0) act_in_.push_back(Tensor::empty(in_mb, DType::f32));
    if (s + 1 < p) grad_in_.push_back(Tensor::empty(out_mb, DType::f32));
  }
  act_req_.assign(m, null_req());
  grad_req_.assign(m, null_req());
  slot_sends_.assign(slots_, {});
  slot_staged_.assign(slots_, {});
}

ScheduleExecutor::~ScheduleExecutor() {
  for (int i = 0; i < m_; ++i) {
    for (auto* r : {&act_req_[i], &grad_req_[i]})
      if (req(*r) != MPI_REQUEST_NULL) {
        MPI_Cancel(&req(*r));
        MPI_Request_free(&req(*r));
      }
  }
  for (int k = 0; k < slots_; ++k) wait_sends(k);
}

void await_stage(std::uint64_t& request, const ProcessGrid& grid, int peer_stage, double timeout_s,
                 const std::string& what) {
  MPI_Request& r = req(request);
  int done = 0;
  auto t0 = Clock::now();
  for (long spin = 0;; ++spin) {
    MPI_Test(&r, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (spin > 200) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if ((spin & 255) == 0 && timeout_s > 0 && since(t0) > timeout_s) {
      log::error(grid.tag(), " waited ", timeout_s, " s for ", what, " from pipeline stage ", peer_stage,
                 " (world rank ", grid.world_rank_of(grid.tp_rank(), grid.dp_rank(), peer_stage),
                 "): that stage died or stalled; ending the job");
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
}

void ScheduleExecutor::wait_recv(int mb, bool act) {
  await_stage(act ? act_req_[mb] : grad_req_[mb], grid_, grid_.pp_rank() + (act ? -1 : 1), timeout_s_,
              cat("the ", act ? "activation" : "gradient", " of micro-batch ", mb));
}

void ScheduleExecutor::wait_sends(int slot) {
  for (auto& h : slot_sends_[slot]) MPI_Wait(&req(h), MPI_STATUS_IGNORE);
  slot_sends_[slot].clear();
  slot_staged_[slot].clear();
}

StepTiming ScheduleExecutor::run_step(StageOps& ops) {
  const int s = grid_.pp_rank(), p = grid_.pp_size();
  MPI_Comm c = grid_.pp().handle("pipeline step");
  auto t_step = Clock::now();
  StepTiming tm;
  for (int i = 0; i < m_; ++i) {
    if (s > 0)
      MPI_Irecv(act_in_[i].raw(), static_cast<int>(act_in_[i].nbytes()), MPI_BYTE, s - 1, tag_of(i, true), c,
                &req(act_req_[i]));
    if (s + 1 < p)
      MPI_Irecv(grad_in_[i].raw(), static_cast<int>(grad_in_[i].nbytes()), MPI_BYTE, s + 1, tag_of(i, false), c,
                &req(grad_req_[i]));
  }
  std::vector<int> slot_of(m_, -1);
  std::vector<int> free_slots;
  for (int k = slots_; k-- > 0;) free_slots.push_back(k);
  std::vector<Tensor> input(m_), output(m_), dinput(m_);
  int b_done = 0, w_done = 0;
  auto timed = [&](auto&& f) {
    auto t0 = Clock::now();
    f();
    tm.busy_s += since(t0);
  };
  auto post_send = [&](int mb, const Tensor& t, int to, bool act) {
    RT_CHECK(t.defined(), "pipeline stage ", s, ": nothing to send for micro-batch ", mb);
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    if (!t.device().is_cpu()) slot_staged_[slot_of[mb]].push_back(host);
    std::uint64_t h = null_req();
    MPI_Isend(host.raw(), static_cast<int>(host.nbytes()), MPI_BYTE, to, tag_of(mb, act), c, &req(h));
    slot_sends_[slot_of[mb]].push_back(h);
  };
  for (const Instr& in : sched_) {
    const int mb = in.mb;
    switch (in.op) {
      case Op::load_micro_batch: timed([&] { input[mb] = ops.load(mb); }); break;
      case Op::recv_act:
        wait_recv(mb, true);
        input[mb] = dev_.is_cpu() ? act_in_[mb] : act_in_[mb].to(dev_);
        break;
      case Op::forward: {
        RT_ASSERT(!free_slots.empty());
        slot_of[mb] = free_slots.back();
        free_slots.pop_back();
        wait_sends(slot_of[mb]);  // the slot's outputs may be rewritten now
        timed([&] { output[mb] = ops.forward(slot_of[mb], mb, input[mb]); });
        break;
      }
      case Op::send_act: post_send(mb, output[mb], s + 1, true); break;
      case Op::recv_grad: wait_recv(mb, false); break;
      case Op::backward_input: {
        const bool last_mb = ++b_done == m_;
        timed([&] {
          Tensor dy = s + 1 == p ? ops.loss_grad(slot_of[mb], mb, output[mb])
                                 : dev_.is_cpu() ? grad_in_[mb] : grad_in_[mb].to(dev_);
          dinput[mb] = ops.backward_input(slot_of[mb], mb, dy, last_mb);
        });
        break;
      }
      case Op::send_grad: post_send(mb, dinput[mb], s - 1, false); break;
      case Op::backward_weight: {
        const bool last_mb = ++w_done == m_;
        timed([&] { ops.backward_weight(slot_of[mb], mb, last_mb); });
        free_slots.push_back(slot_of[mb]);
        break;
      }
      case Op::reduce_grads: {  // waiting on DP, not compute
        auto t0 = Clock::now();
        ops.reduce_grads();
        tm.reduce_s += since(t0);
        break;
      }
      case Op::optimizer_step: timed([&] { ops.optimizer_step(); }); break;
    }
  }
  for (int k = 0; k < slots_; ++k) wait_sends(k);
  tm.wall_s = since(t_step);
  return tm;
}

}  // namespace ringtrain
