#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/parallel/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/comm/collectives.hpp"
#include "ringtrain/core/trace.hpp"
#include "ringtrain/nn/loss.hpp"
#include "ringtrain/parallel/stage.hpp"
#include "peer.hpp"

namespace ringtrain {
namespace {

// The trace's view of an action (core/trace.hpp): what it is, and which kind of time it spends.
const char* trace_name(Op op) {
  switch (op) {
    case Op::load_micro_batch: return "load";
    case Op::recv_act: return "recv activation";
    case Op::forward: return "F";
    case Op::send_act: return "send activation";
    case Op::recv_grad: return "recv gradient";
    case Op::backward: return "B";
    case Op::backward_input: return "I";
    case Op::send_grad: return "send gradient";
    case Op::backward_weight: return "W";
  }
  return "?";
}
const char* trace_category(Op op) {
  switch (op) {
    case Op::recv_act:
    case Op::recv_grad: return "wait";
    case Op::send_act:
    case Op::send_grad: return "comm";
    default: return "compute";
  }
}

}  // namespace

namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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
    : ScheduleExecutor(grid, make_schedule(kind, grid.pp_size(), std::max(mb.per_step(), 1)), mb,
                       {{std::move(in_mb), std::move(out_mb)}}, dev, rt) {}

ScheduleExecutor::ScheduleExecutor(const ProcessGrid& grid, const Schedule& table, MicroBatching mb,
                                   std::vector<std::pair<Shape, Shape>> chunk_shapes, Device dev, DeviceRuntime& rt)
    : grid_(grid), mb_(mb), dev_(dev), rt_(rt) {
  const PipelineLayout& L = grid.pipeline_layout();
  const int r = grid.pp_rank(), m = mb.per_step(), S = L.stages(), v = L.chunks;
  run_agreed(grid.world(), "setting up the pipeline schedule", [&] {
    RT_CHECK(mb.micro_batches >= 1, "configuration key 'parallel.micro_batches' must be >= 1, got ", mb.micro_batches);
    RT_CHECK(mb.accumulation >= 1, "configuration key 'train.accumulation' must be >= 1, got ", mb.accumulation);
    RT_CHECK(mb.batch > 0 && mb.batch % mb.micro_batches == 0, "data.batch_size = ", mb.batch,
             " is not divisible by parallel.micro_batches = ", mb.micro_batches);
    RT_CHECK(2 * S * m <= kMaxTransferTag, "train.accumulation x parallel.micro_batches = ", m,
             " micro-batches per step over ", S, " pipeline stages: at most ", kMaxTransferTag / 2,
             " stage micro-batches per step (MPI tags)");
    RT_CHECK(table.layout == L && table.micro_batches == m, "pipeline schedule: a table for ", table.layout.ranks,
             " ranks x ", table.layout.chunks, " chunks and ", table.micro_batches, " micro-batches, the job has ",
             L.ranks, " x ", L.chunks, " and ", m);
    RT_CHECK(static_cast<int>(chunk_shapes.size()) == v, "pipeline schedule: shapes for ", chunk_shapes.size(),
             " chunks, the rank holds ", v);
    validate(table);
  });
  table_ = lower(table);
  splits_ = table.split_backward();
  mine_ = table_.ranks[static_cast<std::size_t>(r)];
  slots_ = 1;
  const std::vector<std::vector<int>> peaks = peak_in_flight_per_chunk(table_);
  for (int c : peaks[static_cast<std::size_t>(r)]) slots_ = std::max(slots_, c);
  // Handshake: each chunk tells the next stage's rank what it sends; that rank
  // compares. Both sides walk their chunks in stage order, so messages
  // between one pair of ranks match in order.
  std::string err;
  {
    const char* what = "pipeline shape handshake";
    const WaitOn on(grid.pp(), what);
    std::vector<std::vector<std::int64_t>> mine, got;
    std::vector<MPI_Request> q;
    std::vector<int> from;
    mine.reserve(static_cast<std::size_t>(v));
    got.reserve(static_cast<std::size_t>(v));
    for (int k = 0; k < v; ++k) {
      const int g = L.stage_of(r, k);
      if (g + 1 < S && L.rank_of(g + 1) != r) {
        mine.push_back(pack_shape(chunk_shapes[static_cast<std::size_t>(k)].second));
        q.emplace_back();
        check_mpi(MPI_Isend(mine.back().data(), 9, MPI_INT64_T, L.rank_of(g + 1), kTagShapeHandshake, on.comm,
                            &q.back()),
                  what, "MPI_Isend");
      }
      if (g > 0 && L.rank_of(g - 1) != r) {
        got.emplace_back(9, -1);
        from.push_back(k);
        q.emplace_back();
        check_mpi(MPI_Irecv(got.back().data(), 9, MPI_INT64_T, L.rank_of(g - 1), kTagShapeHandshake, on.comm,
                            &q.back()),
                  what, "MPI_Irecv");
      }
    }
    if (!q.empty()) wait_bounded(q.data(), static_cast<int>(q.size()), on, what);
    for (std::size_t j = 0; j < from.size() && err.empty(); ++j) {
      const int k = from[j], g = L.stage_of(r, k);
      const Shape& want = chunk_shapes[static_cast<std::size_t>(k)].first;
      if (unpack_shape(got[j]) != want)
        err = cat("pipeline stage ", g - 1, " sends activations of shape ", shape_str(unpack_shape(got[j])),
                  " but stage ", g, " ", grid.tag(), " expects ", shape_str(want));
    }
  }
  agree_or_throw(grid.world(), err, "checking the pipeline stages' shapes");
  act_in_.resize(static_cast<std::size_t>(v));
  grad_in_.resize(static_cast<std::size_t>(v));
  // Remote neighbours: host receive buffers. Local ones (the V's turn): a copy
  // on the device, made at the turn, since the neighbour chunk reuses its
  // slot's buffers after its W while this chunk's W may still read them.
  for (int k = 0; k < v; ++k) {
    const int g = L.stage_of(r, k);
    act_in_[k].resize(static_cast<std::size_t>(m));
    grad_in_[k].resize(static_cast<std::size_t>(m));
    for (int i = 0; i < m; ++i) {
      if (g > 0 && L.rank_of(g - 1) != r) act_in_[k][i] = Tensor::empty(chunk_shapes[k].first, DType::f32);
      if (g + 1 < S && L.rank_of(g + 1) != r) grad_in_[k][i] = Tensor::empty(chunk_shapes[k].second, DType::f32);
    }
  }
  dlogits_.resize(static_cast<std::size_t>(slots_));
  for (int k = 0; k < v; ++k) out_bytes_.push_back(4.0 * static_cast<double>(shape_numel(chunk_shapes[k].second)));
}

ScheduleExecutor::~ScheduleExecutor() = default;

bool ScheduleExecutor::replace_table(const Schedule& compute) {
  RT_CHECK(compute.layout == table_.layout && compute.micro_batches == table_.micro_batches,
           "pipeline schedule: a new table must keep the layout and the micro-batches");
  validate(compute);
  // A stage built for a table without I/W runs backwards fused (Stage::set_fused_backward) and cannot defer a W.
  RT_CHECK(!compute.split_backward() || splits_,
           "pipeline schedule: a table that splits backwards cannot replace one built without I and W");
  Schedule t = lower(compute);
  int fits = 1;
  const std::vector<std::vector<int>> peaks = peak_in_flight_per_chunk(t);
  for (int c : peaks[static_cast<std::size_t>(grid_.pp_rank())]) fits &= c <= slots_;
  allreduce(&fits, &fits, 1, DType::i32, ReduceOp::min, grid_.pp());  // all ranks change, or none
  if (!fits) return false;
  mine_ = t.ranks[static_cast<std::size_t>(grid_.pp_rank())];
  table_ = std::move(t);
  return true;
}

// The step's transfers: every receive posted up front, each slot's sends (and
// the host copies they read) completed before the slot is reused.
struct ScheduleExecutor::Transfers {
  PeerLink link;
  std::vector<std::vector<PeerRequest>> act, grad;  // per chunk and micro-batch
  std::vector<std::vector<PeerRequest>> sends;      // per chunk x slot
  std::vector<std::vector<Tensor>> staged;          // per chunk x slot: host copies being sent
  int slots;

  Transfers(const ProcessGrid& g, int chunks, int m, int slots)
      : link(g), act(chunks, std::vector<PeerRequest>(m)), grad(chunks, std::vector<PeerRequest>(m)),
        sends(chunks * slots), staged(chunks * slots), slots(slots) {}
  ~Transfers() {  // an exception mid-step: nothing may stay posted on our buffers
    for (auto& c : act)
      for (auto& r : c) link.cancel(r);
    for (auto& c : grad)
      for (auto& r : c) link.cancel(r);
  }
  // Whether the slot's sends have all completed (polled, no wait).
  bool sends_done(int chunk, int slot) {
    for (auto& r : sends[static_cast<std::size_t>(chunk * slots + slot)])
      if (!link.test(r)) return false;
    return true;
  }
  void finish_sends(int chunk, int slot) {
    const std::size_t k = static_cast<std::size_t>(chunk * slots + slot);
    for (auto& r : sends[k]) link.wait(r, "an activation or gradient");
    sends[k].clear();
    staged[k].clear();
  }
  void send(int chunk, int slot, int mb, const Tensor& t, int to, int tag) {
    RT_CHECK(t.defined(), "pipeline: nothing to send for micro-batch ", mb);
    const std::size_t k = static_cast<std::size_t>(chunk * slots + slot);
    Tensor host = t.device().is_cpu() ? t : t.to(Device::cpu());
    staged[k].push_back(host);
    sends[k].push_back(link.isend(host.raw(), host.nbytes(), to, tag));
  }
};

StepOutput ScheduleExecutor::run(Stage& stage, const Loss& loss_fn, const StepInput& in, GradSync& sync) {
  const PipelineLayout& L = grid_.pipeline_layout();
  const int r = grid_.pp_rank(), m = mb_.per_step(), S = L.stages(), v = L.chunks;
  const std::int64_t rows = mb_.size();
  auto check = [&](const std::vector<Tensor>& t, const char* what) {
    RT_CHECK(static_cast<int>(t.size()) == mb_.accumulation, grid_.tag(), " step: expected ", mb_.accumulation,
             " batches of ", what, ", got ", t.size());
    for (const Tensor& x : t)
      RT_CHECK(x.defined() && x.dim(0) == mb_.batch, grid_.tag(), " step: expected ", mb_.batch, " ", what);
  };
  if (grid_.first_stage()) check(in.images, "images");
  if (grid_.last_stage()) check(in.labels, "labels");
  // Micro-batch i is loader batch i / m's (i % m)-th slice.
  auto slice = [&](const std::vector<Tensor>& t, int i) {
    const Tensor& x = t[static_cast<std::size_t>(i / mb_.micro_batches)];
    return on(x.slice_rows((i % mb_.micro_batches) * rows, (i % mb_.micro_batches + 1) * rows), dev_);
  };
  // Its first sample in the step's global batch: loader batch a's samples sit
  // at a·G + dp_rank·B there, G = dp·B (data/sampler.hpp).
  auto first_sample = [&](int i) {
    const std::int64_t a = i / mb_.micro_batches, j = i % mb_.micro_batches;
    return a * grid_.dp_size() * mb_.batch + grid_.dp_rank() * mb_.batch + j * rows;
  };
  // The output's owner speaks for the replica (context ranks: their collective loss gives each the whole sequence's).
  const bool counts = grid_.last_stage() && grid_.tp_rank() == 0 && grid_.cp_rank() == 0;
  // A collective loss (split logits): every tensor rank takes part in the loss and the count; rank 0 records them.
  const bool collective = loss_fn.collective();
  const double dloss_scale = in.loss_scale / m;

  StepOutput out;
  const auto t_step = Clock::now();
  // ZeRO-2/3 first hold the gradient buffer's pages (on a device, map its
  // chunks), which zero_grads may then write whole (split backward).
  sync.begin_step();
  stage.zero_grads();
  Transfers tr(grid_, v, m, slots_);
  for (int k = 0; k < v; ++k) {
    const int g = L.stage_of(r, k);
    for (int i = 0; i < m; ++i) {
      if (g > 0 && L.rank_of(g - 1) != r)
        tr.act[k][i] = tr.link.irecv(act_in_[k][i].raw(), act_in_[k][i].nbytes(), L.rank_of(g - 1), tag_of(g, i, true));
      if (g + 1 < S && L.rank_of(g + 1) != r)
        tr.grad[k][i] =
            tr.link.irecv(grad_in_[k][i].raw(), grad_in_[k][i].nbytes(), L.rank_of(g + 1), tag_of(g, i, false));
    }
  }
  // Per chunk and micro-batch: the slot, the chunk's input and output, the
  // gradient of its input (to send, or the previous local chunk's dy).
  using PerMb = std::vector<std::vector<Tensor>>;
  std::vector<std::vector<int>> slot_of(v, std::vector<int>(m, -1)), free_slots(v);
  for (int k = 0; k < v; ++k)  // in the order they were freed: oldest first
    for (int j = 0; j < slots_; ++j) free_slots[k].push_back(j);
  PerMb input(v, std::vector<Tensor>(m)), output = input, dinput = input;
  std::vector<int> b_done(v, 0), w_done(v, 0);
  // Per chunk: each op's summed time and count, made means at the end.
  out.timing.chunks.assign(static_cast<std::size_t>(v), ChunkTime{});
  auto& ct = out.timing.chunks;
  std::vector<ChunkTime> n(static_cast<std::size_t>(v));
  auto timed = [&](auto&& f, double* per_chunk = nullptr, double* count = nullptr) {
    const auto t0 = Clock::now();
    f();
    const double dt = since(t0);
    out.timing.busy_s += dt;
    if (per_chunk) *per_chunk += dt;
    if (count) *count += 1;
  };
  const Stage::GradReady ready = [&sync](int l) { sync.layer_ready(l); };
  auto turn = [](Tensor& keep, const Tensor& src) -> const Tensor& {
    if (!keep.defined() || keep.shape() != src.shape() || keep.dtype() != src.dtype() || keep.device() != src.device())
      keep = Tensor::empty(src.shape(), src.dtype(), src.device());
    keep.copy_from(src);
    return keep;
  };
  for (const Action& a : mine_) {
    const int i = a.mb, g = a.stage, k = L.chunk_of(g);
    const trace::Scope span(trace_category(a.op), trace_name(a.op), g, i);  // "F 1.3": stage 1, micro-batch 3
    switch (a.op) {
      case Op::load_micro_batch: timed([&] { input[k][i] = slice(in.images, i); }); break;
      case Op::recv_act:
        tr.link.wait(tr.act[k][i], cat("the activation of micro-batch ", i, " for stage ", g));
        input[k][i] = on(act_in_[k][i], dev_);
        break;
      case Op::forward: {
        if (g > 0 && L.rank_of(g - 1) == r) input[k][i] = turn(act_in_[k][i], output[L.chunk_of(g - 1)][i]);
        RT_ASSERT(!free_slots[k].empty() && input[k][i].defined());
        {  // the longest-free slot whose sends have completed, else wait for the longest-free one's
          auto& fs = free_slots[k];
          std::size_t pick = 0;
          while (pick < fs.size() && !tr.sends_done(k, fs[pick])) ++pick;
          if (pick == fs.size()) pick = 0;
          slot_of[k][i] = fs[pick];
          fs.erase(fs.begin() + static_cast<std::ptrdiff_t>(pick));
        }
        tr.finish_sends(k, slot_of[k][i]);  // the slot's outputs may be rewritten now
        timed([&] {
          const SamplePosition pos{static_cast<std::uint64_t>(in.step), first_sample(i)};
          output[k][i] = stage.forward(k, slot_of[k][i], input[k][i], Mode::train, pos);
        }, &ct[k].f, &n[k].f);
        break;
      }
      case Op::send_act: tr.send(k, slot_of[k][i], i, output[k][i], L.rank_of(g + 1), tag_of(g + 1, i, true)); break;
      case Op::recv_grad:
        tr.link.wait(tr.grad[k][i], cat("the gradient of micro-batch ", i, " for stage ", g));
        break;
      case Op::backward:
      case Op::backward_input: {
        const bool last = ++b_done[k] == m;
        const bool whole = a.op == Op::backward;
        const bool last_w = whole && ++w_done[k] == m;
        timed([&] {
          Tensor dy;
          const int slot = slot_of[k][i];
          if (g + 1 == S) {  // the loss: mean over the micro-batch, scaled to the step's mean
            const Tensor y = slice(in.labels, i);
            Tensor& d = dlogits_[static_cast<std::size_t>(slot)];
            if (!d.defined() || d.shape() != output[k][i].shape())
              d = Tensor::empty(output[k][i].shape(), DType::f32, output[k][i].device());
            const double loss = loss_fn.value_and_grad(output[k][i], y, d);
            const std::int64_t correct = collective || counts ? loss_fn.correct(output[k][i], y) : 0;
            if (counts) {  // in targets: samples, or tokens of a language model's [rows, T] labels
              out.stats.loss_sum += loss * static_cast<double>(y.numel());
              out.stats.samples += y.numel();
              out.stats.correct += correct;
            }
            if (dloss_scale != 1.0) rt_.scale(d, dloss_scale);
            dy = d;
          } else if (L.rank_of(g + 1) == r) {
            dy = turn(grad_in_[k][i], dinput[L.chunk_of(g + 1)][i]);  // the V's turn
          } else {
            dy = on(grad_in_[k][i], dev_);
          }
          const Stage::GradReady none;
          dinput[k][i] = whole ? stage.backward_whole(k, slot, dy, g > 0, last ? ready : none, last_w ? ready : none)
                               : stage.backward_input(k, slot, dy, g > 0, last ? ready : none);
        }, whole ? &ct[k].b : &ct[k].i, whole ? &n[k].b : &n[k].i);
        if (whole) free_slots[k].push_back(slot_of[k][i]);
        break;
      }
      case Op::send_grad:
        tr.send(k, slot_of[k][i], i, dinput[k][i], L.rank_of(g - 1), tag_of(g - 1, i, false));
        break;
      case Op::backward_weight: {
        const bool last = ++w_done[k] == m;
        timed([&] { stage.backward_weight(k, slot_of[k][i], last ? ready : Stage::GradReady{}); }, &ct[k].w, &n[k].w);
        free_slots[k].push_back(slot_of[k][i]);
        break;
      }
    }
  }
  for (int k = 0; k < v; ++k)
    for (int j = 0; j < slots_; ++j) tr.finish_sends(k, j);
  for (int k = 0; k < v; ++k) ct[k] = per_action(ct[k], n[k]);
  stage.commit_batch_stats();  // every forward of the step has run
  out.timing.wall_s = out.timing.schedule_s = since(t_step);
  return out;
}

ChunkTime per_action(const ChunkTime& sum, const ChunkTime& count) {
  const auto mean = [](double s, double n) { return n > 0 ? s / n : 0.0; };
  ChunkTime t{mean(sum.f, count.f), mean(sum.i, count.i), mean(sum.w, count.w), mean(sum.b, count.b)};
  if (count.i == 0) t.i = t.b;  // whole backwards only
  return t;
}

SimCosts ScheduleExecutor::gather_costs(const std::vector<ChunkTime>& mine, const LinkCost& link) const {
  return gather_costs(std::vector<std::vector<ChunkTime>>{mine}, link).front();
}

std::vector<SimCosts> ScheduleExecutor::gather_costs(const std::vector<std::vector<ChunkTime>>& steps,
                                                     const LinkCost& link) const {
  const PipelineLayout& L = grid_.pipeline_layout();
  const int v = L.chunks, p = L.ranks;
  const auto n = static_cast<int>(steps.size());
  // Per rank: n steps x v chunks x (f, i, w, b, the chunk's output bytes).
  constexpr int kFields = 5;
  const auto per_rank = static_cast<std::size_t>(kFields * v * n);
  std::vector<double> send(per_rank), all(per_rank * static_cast<std::size_t>(p));
  for (int s = 0; s < n; ++s) {
    const std::vector<ChunkTime>& mine = steps[static_cast<std::size_t>(s)];
    RT_CHECK(static_cast<int>(mine.size()) == v, "pipeline costs: ", mine.size(), " chunks measured, the rank holds ", v);
    for (int k = 0; k < v; ++k) {
      double* x = &send[static_cast<std::size_t>(kFields * (s * v + k))];
      x[0] = mine[k].f;
      x[1] = mine[k].i;
      x[2] = mine[k].w;
      x[3] = mine[k].b;
      x[4] = out_bytes_[static_cast<std::size_t>(k)];
    }
  }
  allgather(send.data(), send.size(), all.data(), DType::f64, grid_.pp());
  std::vector<SimCosts> out(static_cast<std::size_t>(n));
  for (int s = 0; s < n; ++s) {
    SimCosts& c = out[static_cast<std::size_t>(s)];
    c.link = link;
    c.stage.resize(static_cast<std::size_t>(L.stages()));
    c.boundary_bytes.resize(static_cast<std::size_t>(L.stages()));
    for (int r = 0; r < p; ++r)
      for (int k = 0; k < v; ++k) {
        const double* x =
            &all[static_cast<std::size_t>(r) * per_rank + static_cast<std::size_t>(kFields * (s * v + k))];
        const auto g = static_cast<std::size_t>(L.stage_of(r, k));
        c.stage[g] = StageCost{x[0], x[1], x[2], x[3]};
        c.boundary_bytes[g] = x[4];
      }
  }
  return out;
}

LinkCost ScheduleExecutor::measure_link(int reps) const {
  double big = 16;
  for (double b : out_bytes_) big = std::max(big, b);
  return measure_pipeline_link(grid_, big, reps);
}

LinkCost measure_pipeline_link(const ProcessGrid& grid_, double big, int reps) {
  using Clock = std::chrono::steady_clock;
  const auto since = [](Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); };
  const int p = grid_.pp_size(), r = grid_.pp_rank();
  big = std::max(big, 16.0);
  allreduce(&big, &big, 1, DType::f64, ReduceOp::max, grid_.pp());
  const std::size_t sizes[2] = {16, static_cast<std::size_t>(big)};
  std::vector<char> buf(sizes[1]);
  double one_way[2] = {0, 0};  // the slowest pair's, per size
  PeerLink link(grid_);
  for (int b = 0; b + 1 < p; ++b) {  // the pair (b, b + 1), one at a time: the others do not load the link
    if (r != b && r != b + 1) continue;
    const int peer = r == b ? b + 1 : b;
    for (int z = 0; z < 2; ++z) {
      std::vector<double> trip;
      for (int i = 0; i <= reps; ++i) {  // round trip 0 warms up
        // Each side computes (sleeps kGap) before it sends, so each receiver has
        // waited a while, napping, as a stage waits for its neighbour's compute;
        // the sleeps actually slept ride in the message and come off the trip.
        constexpr double kGap = 1e-3;
        double slept[2] = {0, 0};  // here: mine, the peer's
        const auto t0 = Clock::now();
        for (int leg = 0; leg < 2; ++leg) {
          if ((leg == 0) == (r == b)) {
            const auto s0 = Clock::now();
            std::this_thread::sleep_for(std::chrono::duration<double>(kGap));
            slept[0] += since(s0);
            std::memcpy(buf.data(), &slept[0], sizeof(double));
            PeerRequest q = link.isend(buf.data(), sizes[z], peer, kTagLinkProbe);
            link.wait(q, "the link probe");
          } else {
            PeerRequest q = link.irecv(buf.data(), sizes[z], peer, kTagLinkProbe);
            link.wait(q, "the link probe");
            std::memcpy(&slept[1], buf.data(), sizeof(double));
          }
        }
        if (i > 0 && r == b) trip.push_back(since(t0) - slept[0] - slept[1]);
      }
      if (trip.empty()) continue;
      std::nth_element(trip.begin(), trip.begin() + static_cast<std::ptrdiff_t>(trip.size() / 2), trip.end());
      one_way[z] = std::max(one_way[z], trip[trip.size() / 2] / 2);
    }
  }
  allreduce(one_way, one_way, 2, DType::f64, ReduceOp::max, grid_.pp());
  LinkCost c{one_way[0], 0};
  if (sizes[1] > sizes[0] && one_way[1] > one_way[0])
    c.bytes_per_s = static_cast<double>(sizes[1] - sizes[0]) / (one_way[1] - one_way[0]);
  return c;
}

// Forward along the chain of stages, each rank its chunks in stage order, the
// batch size (a last batch may be short) ahead of each activation.
std::pair<double, std::int64_t> ScheduleExecutor::evaluate(Stage& stage, const Loss& loss_fn, const Tensor& images,
                                                           const Tensor& labels, std::int64_t valid) {
  const PipelineLayout& L = grid_.pipeline_layout();
  const int r = grid_.pp_rank(), S = L.stages();
  PeerLink link(grid_);
  std::int64_t bn = grid_.first_stage() ? images.dim(0) : 0;
  Tensor x = images, y_out;
  for (int k = 0; k < L.chunks; ++k) {
    const int g = L.stage_of(r, k);
    if (g > 0 && L.rank_of(g - 1) != r) {
      PeerRequest q = link.irecv(&bn, sizeof bn, L.rank_of(g - 1), kTagEvalSize);
      link.wait(q, "the evaluation batch size");
      x = Tensor::empty(stage.input_shape(k, bn), DType::f32);
      q = link.irecv(x.raw(), x.nbytes(), L.rank_of(g - 1), kTagEvalActivation);
      link.wait(q, "an evaluation activation");
    } else if (g > 0) {
      x = y_out;  // the V's turn
    }
    y_out = stage.forward(k, 0, on(x, dev_), Mode::eval, SamplePosition{});
    if (g + 1 < S && L.rank_of(g + 1) != r) {
      Tensor host = on(y_out, Device::cpu());
      PeerRequest q = link.isend(&bn, sizeof bn, L.rank_of(g + 1), kTagEvalSize);
      link.wait(q, "the evaluation batch size");
      q = link.isend(host.raw(), host.nbytes(), L.rank_of(g + 1), kTagEvalActivation);
      link.wait(q, "an evaluation activation");
    }
  }
  if (!grid_.last_stage()) return {0.0, 0};
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
  if (grid_.tp_rank() != 0 || grid_.cp_rank() != 0) return {0.0, 0};
  return {loss, correct};
}

}  // namespace ringtrain
