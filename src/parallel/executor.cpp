#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/parallel/executor.hpp"

#include <chrono>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "peer.hpp"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

Tensor on(const Tensor& t, Device dev) { return t.device() == dev ? t : t.to(dev); }

}  // namespace

ScheduleExecutor::ScheduleExecutor(const ProcessGrid& grid, ScheduleKind kind, MicroBatching mb, Shape in_mb,
                                   Shape out_mb, Device dev, DeviceRuntime& rt)
    : grid_(grid), mb_(mb), dev_(dev), rt_(rt) {
  const int s = grid.pp_rank(), p = grid.pp_size(), m = mb.per_step();
  run_agreed(grid.world(), "setting up the pipeline schedule", [&] {
    RT_CHECK(mb.micro_batches >= 1, "configuration key 'parallel.micro_batches' must be >= 1, got ", mb.micro_batches);
    RT_CHECK(mb.accumulation >= 1, "configuration key 'train.accumulation' must be >= 1, got ", mb.accumulation);
    RT_CHECK(mb.batch > 0 && mb.batch % mb.micro_batches == 0, "data.batch_size = ", mb.batch,
             " is not divisible by parallel.micro_batches = ", mb.micro_batches);
    RT_CHECK(tag_of(m - 1, false) <= kMaxTransferTag, "train.accumulation x parallel.micro_batches = ", m,
             " micro-batches per step: at most ", kMaxTransferTag / 2, " (MPI tags)");
  });
  sched_ = make_schedule(kind, p, m, s);
  slots_ = peak_in_flight(sched_);
  // Handshake: each stage tells the next what it sends; the next compares.
  std::string err;
  std::vector<std::int64_t> mine = pack_shape(out_mb), got(9, -1);
  {
    const char* what = "pipeline shape handshake";
    const WaitOn on(grid.pp(), what);
    MPI_Request q[2];
    check_mpi(MPI_Isend(mine.data(), 9, MPI_INT64_T, s + 1 < p ? s + 1 : MPI_PROC_NULL, kTagShapeHandshake, on.comm,
                        &q[0]),
              what, "MPI_Isend");
    check_mpi(MPI_Irecv(got.data(), 9, MPI_INT64_T, s > 0 ? s - 1 : MPI_PROC_NULL, kTagShapeHandshake, on.comm, &q[1]),
              what, "MPI_Irecv");
    wait_bounded(q, 2, on, what);
  }
  if (s > 0 && unpack_shape(got) != in_mb)
    err = cat("pipeline stage ", s - 1, " sends activations of shape ", shape_str(unpack_shape(got)), " but stage ", s,
              " ", grid.tag(), " expects ", shape_str(in_mb));
  agree_or_throw(grid.world(), err, "checking the pipeline stages' shapes");
  for (int i = 0; i < m; ++i) {
    if (s > 0) act_in_.push_back(Tensor::empty(in_mb, DType::f32));
    if (s + 1 < p) grad_in_.push_back(Tensor::empty(out_mb, DType::f32));
  }
  dlogits_.resize(static_cast<std::size_t>(slots_));
}

ScheduleExecutor::~ScheduleExecutor() = default;

// The step's transfers: every receive posted up front, each slot's sends (and
// the host copies they read) completed before the slot is reused.
struct ScheduleExecutor::Transfers {
  PeerLink link;
  std::vector<PeerRequest> act, grad;
  std::vector<std::vector<PeerRequest>> sends;  // per slot
  std::vector<std::vector<Tensor>> staged;      // per slot: host copies being sent

  Transfers(const ProcessGrid& g, int m, int slots) : link(g), act(m), grad(m), sends(slots), staged(slots) {}
  ~Transfers() {  // an exception mid-step: nothing may stay posted on our buffers
    for (auto& r : act) link.cancel(r);
    for (auto& r : grad) link.cancel(r);
  }
  void finish_sends(int slot) {
    for (auto& r : sends[slot]) link.wait(r, "an activation or gradient");
    sends[slot].clear();
    staged[slot].clear();
  }
  void send(int slot, int mb, const Tensor& t, int to, bool act) {
    RT_CHECK(t.defined(), "pipeline: nothing to send for micro-batch ", mb);
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    staged[slot].push_back(host);
    sends[slot].push_back(link.isend(host.raw(), host.nbytes(), to, tag_of(mb, act)));
  }
};

StepOutput ScheduleExecutor::run(Stage& stage, const Loss& loss_fn, const StepInput& in, GradSync& sync) {
  const int s = grid_.pp_rank(), p = grid_.pp_size(), m = mb_.per_step();
  const std::int64_t rows = mb_.size();
  auto check = [&](const std::vector<Tensor>& v, const char* what) {
    RT_CHECK(static_cast<int>(v.size()) == mb_.accumulation, grid_.tag(), " step: expected ", mb_.accumulation,
             " batches of ", what, ", got ", v.size());
    for (const Tensor& t : v)
      RT_CHECK(t.defined() && t.dim(0) == mb_.batch, grid_.tag(), " step: expected ", mb_.batch, " ", what);
  };
  if (grid_.first_stage()) check(in.images, "images");
  if (grid_.last_stage()) check(in.labels, "labels");
  // Micro-batch i is loader batch i / m's (i % m)-th slice.
  auto slice = [&](const std::vector<Tensor>& v, int i) {
    const Tensor& t = v[static_cast<std::size_t>(i / mb_.micro_batches)];
    return on(t.slice_rows((i % mb_.micro_batches) * rows, (i % mb_.micro_batches + 1) * rows), dev_);
  };
  // Its first sample in the step's global batch: loader batch a's samples sit
  // at a·G + dp_rank·B there, G = dp·B (data/sampler.hpp).
  auto first_sample = [&](int i) {
    const std::int64_t a = i / mb_.micro_batches, j = i % mb_.micro_batches;
    return a * grid_.dp_size() * mb_.batch + grid_.dp_rank() * mb_.batch + j * rows;
  };
  const bool counts = grid_.last_stage() && grid_.tp_rank() == 0;  // the output's owner speaks for the replica
  // A collective loss (split logits): every tensor rank takes part in the loss and the count; rank 0 records them.
  const bool collective = loss_fn.collective();
  const double dloss_scale = in.loss_scale / m;

  StepOutput out;
  const auto t_step = Clock::now();
  stage.zero_grads();
  sync.begin_step();
  Transfers tr(grid_, m, slots_);
  for (int i = 0; i < m; ++i) {
    if (s > 0) tr.act[i] = tr.link.irecv(act_in_[i].raw(), act_in_[i].nbytes(), s - 1, tag_of(i, true));
    if (s + 1 < p) tr.grad[i] = tr.link.irecv(grad_in_[i].raw(), grad_in_[i].nbytes(), s + 1, tag_of(i, false));
  }
  std::vector<int> slot_of(m, -1), free_slots;
  for (int k = slots_; k-- > 0;) free_slots.push_back(k);
  std::vector<Tensor> input(m), output(m), dinput(m);
  int b_done = 0, w_done = 0;
  auto timed = [&](auto&& f) {
    const auto t0 = Clock::now();
    f();
    out.timing.busy_s += since(t0);
  };
  const Stage::GradReady ready = [&sync](int l) { sync.layer_ready(l); };
  for (const Instr& ins : sched_) {
    const int i = ins.mb;
    switch (ins.op) {
      case Op::load_micro_batch: timed([&] { input[i] = slice(in.images, i); }); break;
      case Op::recv_act:
        tr.link.wait(tr.act[i], cat("the activation of micro-batch ", i));
        input[i] = on(act_in_[i], dev_);
        break;
      case Op::forward: {
        RT_ASSERT(!free_slots.empty());
        slot_of[i] = free_slots.back();
        free_slots.pop_back();
        tr.finish_sends(slot_of[i]);  // the slot's outputs may be rewritten now
        timed([&] {
          output[i] = stage.forward(slot_of[i], input[i], Mode::train,
                                    {static_cast<std::uint64_t>(in.step), first_sample(i)});
        });
        break;
      }
      case Op::send_act: tr.send(slot_of[i], i, output[i], s + 1, true); break;
      case Op::recv_grad: tr.link.wait(tr.grad[i], cat("the gradient of micro-batch ", i)); break;
      case Op::backward_input: {
        const bool last = ++b_done == m;
        timed([&] {
          Tensor dy;
          if (s + 1 == p) {  // the loss: mean over the micro-batch, scaled to the step's mean
            const Tensor y = slice(in.labels, i);
            Tensor& d = dlogits_[static_cast<std::size_t>(slot_of[i])];
            if (!d.defined() || d.shape() != output[i].shape())
              d = Tensor::empty(output[i].shape(), DType::f32, output[i].device());
            const double loss = loss_fn.value_and_grad(output[i], y, d);
            const std::int64_t correct = collective || counts ? loss_fn.correct(output[i], y) : 0;
            if (counts) {  // in targets: samples, or tokens of a language model's [rows, T] labels
              out.stats.loss_sum += loss * static_cast<double>(y.numel());
              out.stats.samples += y.numel();
              out.stats.correct += correct;
            }
            if (dloss_scale != 1.0) rt_.scale(d, dloss_scale);
            dy = d;
          } else {
            dy = on(grad_in_[i], dev_);
          }
          dinput[i] = stage.backward_input(slot_of[i], dy, s > 0, last ? ready : Stage::GradReady{});
        });
        break;
      }
      case Op::send_grad: tr.send(slot_of[i], i, dinput[i], s - 1, false); break;
      case Op::backward_weight: {
        const bool last = ++w_done == m;
        timed([&] { stage.backward_weight(slot_of[i], last ? ready : Stage::GradReady{}); });
        free_slots.push_back(slot_of[i]);
        break;
      }
    }
  }
  for (int k = 0; k < slots_; ++k) tr.finish_sends(k);
  stage.commit_batch_stats();  // every forward of the step has run
  out.timing.wall_s = since(t_step);
  return out;
}

// Forward along the chain, the batch size (a last batch may be short) ahead of the activation.
std::pair<double, std::int64_t> ScheduleExecutor::evaluate(Stage& stage, const Loss& loss_fn, const Tensor& images,
                                                           const Tensor& labels, std::int64_t valid) {
  const int s = grid_.pp_rank(), p = grid_.pp_size();
  PeerLink link(grid_);
  std::int64_t bn = grid_.first_stage() ? images.dim(0) : 0;
  Tensor x = images;
  if (s > 0) {
    PeerRequest r = link.irecv(&bn, sizeof bn, s - 1, kTagEvalSize);
    link.wait(r, "the evaluation batch size");
    x = Tensor::empty(stage.input_shape(bn), DType::f32);
    r = link.irecv(x.raw(), x.nbytes(), s - 1, kTagEvalActivation);
    link.wait(r, "an evaluation activation");
  }
  Tensor y_out = stage.forward(0, on(x, dev_), Mode::eval);
  if (s + 1 < p) {
    Tensor host = on(y_out, Device::cpu());
    PeerRequest r = link.isend(&bn, sizeof bn, s + 1, kTagEvalSize);
    link.wait(r, "the evaluation batch size");
    r = link.isend(host.raw(), host.nbytes(), s + 1, kTagEvalActivation);
    link.wait(r, "an evaluation activation");
    return {0.0, 0};
  }
  // Tensor ranks hold the same output, or (a collective loss) compute the loss together: counted once.
  const bool collective = loss_fn.collective();
  if (valid <= 0 || (grid_.tp_rank() != 0 && !collective)) return {0.0, 0};
  Tensor y = on(labels, dev_);
  Tensor o = valid < bn ? y_out.slice_rows(0, valid) : y_out;
  if (valid < bn) y = y.slice_rows(0, valid);
  // Summed over the targets: samples, or every token of a language model's [valid, T] labels.
  Tensor none;
  const double loss = loss_fn.value_and_grad(o, y, none) * static_cast<double>(y.numel());
  const std::int64_t correct = loss_fn.correct(o, y);
  if (grid_.tp_rank() != 0) return {0.0, 0};
  return {loss, correct};
}

}  // namespace ringtrain
