// Engine: the public object, the background thread's loop and the execution
// of ready tensors (pack -> all-reduce -> scale -> unpack). Negotiation lives
// in controller.cpp, batching and buffers in fusion_buffer.cpp.
#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/engine/engine.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "autotune_session.hpp"
#include "controller.hpp"
#include "fusion_buffer.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/comm/liveness.hpp"
#include "ringtrain/core/log.hpp"
#include "tensor_queue.hpp"
#include "ringtrain/core/trace.hpp"
#include "timeline.hpp"

namespace ringtrain {

using engine::Clock;
using engine::OpPtr;

void check_engine_settings_agree(const Communicator& comm, const EngineOptions& o);  // options.cpp

const std::string& Handle::name() const {
  RT_CHECK(op_ != nullptr, "Handle::name(): empty handle");
  return op_->name;
}

struct Engine::Impl {
  Impl(const Communicator& c, EngineOptions o);
  ~Impl();

  OpPtr submit(std::string name, Tensor in, Tensor out, ReduceOp op);
  void wait(const OpPtr& op);
  void synchronize();
  void shutdown();

  void loop();
  void run_cycle(std::unordered_map<std::string, OpPtr>& pending);
  void execute(const std::vector<OpPtr>& ready);
  void execute_batch(const engine::Batch& b);
  void complete(const OpPtr& op, const std::string& error);
  // Ends the current inter-cycle sleep early: the caller is about to block,
  // so everything it will submit before that is already queued.
  void wake() {
    {
      std::lock_guard lk(sleep_mu);
      flush = true;
    }
    sleep_cv.notify_all();
  }
  FusionOps& ops_for(DeviceKind k) { return k == DeviceKind::cpu ? *cpu_ops : *opts.device_ops; }
  template <typename F>
  void with_stats(F&& f) {
    std::lock_guard lk(stats_mu);
    f(stats);
  }

  EngineOptions opts;
  Communicator comm;  // private duplicate
  int rank = 0, size = 1;
  std::shared_ptr<FusionOps> cpu_ops = cpu_fusion_ops();
  engine::TensorQueue queue;
  std::unique_ptr<engine::Controller> controller;
  engine::FusionBufferManager buffers;
  std::vector<CopySpan> spans;  // reused: one batch's pack/unpack copies (engine thread only)
  std::unique_ptr<engine::Timeline> timeline;
  std::unique_ptr<engine::AutotuneSession> autotune;  // comm.autotune (engine thread after start-up)
  std::string timeline_error;
  Clock::time_point origin = Clock::now();

  mutable std::mutex done_mu;
  std::condition_variable done_cv;
  std::size_t outstanding = 0;
  std::vector<OpPtr> failures;  // failed, for synchronize()

  mutable std::mutex stats_mu;
  EngineStats stats;

  std::mutex sleep_mu;
  std::condition_variable sleep_cv;
  std::atomic<bool> stop_requested{false}, running{true};
  std::atomic<bool> flush{false};  // a caller blocks in wait(): start the next cycle now
  std::atomic<bool> idle{false};   // the engine thread is in its idle back-off
  std::atomic<int> waiters{0};     // callers blocked in wait()/synchronize()
  static constexpr std::chrono::microseconds kWaiterPause{100};
  std::thread thread;
};

Engine::Impl::Impl(const Communicator& c, EngineOptions o) : opts(std::move(o)) {
  RT_CHECK(opts.cycle_time_ms >= 0, "EngineOptions: cycle_time_ms must be >= 0, got ", opts.cycle_time_ms);
  RT_CHECK(opts.stall_warning_s >= 0 && opts.stall_shutdown_s >= 0,
           "EngineOptions: stall limits must be >= 0 (0 = off), got stall_warning_s = ", opts.stall_warning_s,
           ", stall_shutdown_s = ", opts.stall_shutdown_s);
  comm = c.dup("engine");
  rank = comm.rank();
  size = comm.size();
  check_engine_settings_agree(comm, opts);
  controller = std::make_unique<engine::Controller>(comm, opts.cache_capacity, opts.stall_warning_s,
                                                    opts.stall_shutdown_s);
  if (!opts.timeline.empty() && (rank == 0 || opts.timeline_all_ranks)) {
    std::string path = opts.timeline;
    if (opts.timeline_all_ranks) {
      auto slash = path.find_last_of('/');
      auto dot = path.find_last_of('.');
      if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) dot = path.size();
      path = path.substr(0, dot) + "." + std::to_string(rank) + path.substr(dot);
    }
    try {
      timeline = std::make_unique<engine::Timeline>(path, rank, origin);
    } catch (const Error& e) {
      timeline_error = e.what();
    }
  }
  // Only some ranks open a timeline: agree on the outcome, so that a bad path
  // is an Error on every rank instead of a peer waiting for this engine forever.
  int bad = timeline_error.empty() ? size : rank;
  bounded::allreduce(&bad, 1, MPI_INT, MPI_MIN, WaitOn(comm, "Engine start-up"), "Engine start-up");
  RT_CHECK(bad == size, "Engine: rank ", bad, " could not open its timeline (EngineOptions::timeline = '", opts.timeline,
           "')", timeline_error.empty() ? "" : ": ", timeline_error);
  if (opts.autotune.enabled) autotune = std::make_unique<engine::AutotuneSession>(comm, opts);
  thread = std::thread([this] { loop(); });
}

Engine::Impl::~Impl() {
  shutdown();
  comm.close();
}

void Engine::Impl::shutdown() {
  stop_requested = true;
  sleep_cv.notify_all();
  if (thread.joinable()) thread.join();
  if (timeline) timeline->close();
}

OpPtr Engine::Impl::submit(std::string name, Tensor in, Tensor out, ReduceOp rop) {
  RT_CHECK(!name.empty(), "allreduce_async: the tensor name must not be empty");
  RT_CHECK(in.defined(), "allreduce_async('", name, "'): the tensor is undefined");
  RT_CHECK(out.defined(), "allreduce_async('", name, "'): the output tensor is undefined");
  RT_CHECK(in.dtype() == out.dtype() && in.numel() == out.numel(), "allreduce_async('", name,
           "'): output ", dtype_name(out.dtype()), shape_str(out.shape()), " does not match input ",
           dtype_name(in.dtype()), shape_str(in.shape()));
  RT_CHECK(in.device().kind == out.device().kind, "allreduce_async('", name, "'): input on ", in.device().str(),
           " but output on ", out.device().str());
  RT_CHECK(in.device().is_cpu() || opts.device_ops, "allreduce_async('", name, "'): the tensor is on ",
           in.device().str(), " but the engine has no FusionOps for it (set EngineOptions::device_ops)");
  auto op = std::make_shared<detail::Op>();
  op->owner = this;
  op->name = name;
  op->input = std::move(in);
  op->output = std::move(out);
  op->sig = {op->input.dtype(), rop, op->input.device().kind, op->input.shape()};
  op->submitted = Clock::now();
  RT_CHECK(running.load() && !queue.closed(), "allreduce_async('", name, "'): the engine is shut down");
  {
    std::lock_guard lk(done_mu);
    ++outstanding;
  }
  try {
    queue.push(op);
  } catch (...) {
    std::lock_guard lk(done_mu);
    --outstanding;
    throw;
  }
  if (idle.load()) wake();  // end a long idle pause: work is here
  return op;
}

void Engine::Impl::complete(const OpPtr& op, const std::string& error) {
  queue.finish(op->name);  // first, so a waiter may resubmit the name at once
  {
    std::lock_guard lk(done_mu);
    op->error = error;
    op->done = true;
    --outstanding;
    if (!error.empty()) failures.push_back(op);
  }
  if (!error.empty()) with_stats([](EngineStats& s) { ++s.errors; });
  done_cv.notify_all();
}

void Engine::Impl::wait(const OpPtr& op) {
  RT_CHECK(op != nullptr, "Engine::wait: empty handle");
  RT_CHECK(op->owner == this, "Engine::wait('", op->name, "'): the handle belongs to another Engine");
  double blocked = 0;
  if (!op->done) {
    ++waiters;
    wake();
    auto t0 = Clock::now();
    {
      std::unique_lock lk(done_mu);
      done_cv.wait(lk, [&] { return op->done.load(); });
    }
    blocked = std::chrono::duration<double>(Clock::now() - t0).count();
    --waiters;
  }
  with_stats([&](EngineStats& s) {
    ++s.waits;
    s.wait_seconds += blocked;
  });
  op->observed = true;
  std::string err;
  {
    std::lock_guard lk(done_mu);
    err = op->error;
  }
  if (!err.empty()) throw Error(err);
}

void Engine::Impl::synchronize() {
  auto t0 = Clock::now();
  ++waiters;
  wake();
  std::vector<OpPtr> failed;
  {
    std::unique_lock lk(done_mu);
    done_cv.wait(lk, [&] { return outstanding == 0; });
    failed.swap(failures);
  }
  --waiters;
  with_stats([&](EngineStats& s) {
    ++s.waits;
    s.wait_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  });
  std::string msg;
  int n = 0;
  for (auto& op : failed)
    if (!op->observed.exchange(true)) msg += (n++ ? "\n" : "") + op->error;
  if (n) throw Error(cat("synchronize: ", n, " all-reduce(s) failed:\n", msg));
}

// ---- the background thread ---------------------------------------------------

void Engine::Impl::loop() {
  trace::name_thread("engine");
  std::unordered_map<std::string, OpPtr> pending;
  int idle_cycles = 0;
  std::string reason = "the engine was shut down";
  try {
    for (;;) {
      auto start = Clock::now();
      liveness::serve();  // this thread cycles while the user computes: the process answers for itself
      for (auto& op : queue.drain()) {
        op->picked_up = start;
        if (timeline) timeline->span(op->name, "QUEUE", op->submitted, start);
        pending.emplace(op->name, op);
      }
      auto r = controller->cycle(pending, stop_requested.load());
      with_stats([&](EngineStats& s) {
        ++s.cycles;
        s.negotiations += r.negotiated;
        s.cache_hits += r.cache_hits;
        s.cache_misses += r.cache_misses;
        s.negotiate_seconds += r.seconds;
        s.stall_warnings += r.warnings.size();
      });
      for (auto& w : r.warnings) {
        if (rank == 0) log::warn(w);
        if (opts.on_stall_warning) opts.on_stall_warning(w);
      }
      for (auto& [op, msg] : r.failed) {
        pending.erase(op->name);
        complete(op, msg);
      }
      if (timeline)
        for (auto& op : r.ready) timeline->span(op->name, "NEGOTIATE", op->picked_up, Clock::now());
      execute(r.ready);
      for (auto& op : r.ready) pending.erase(op->name);
      if (r.shutdown) {
        reason = r.shutdown_reason;
        if (rank == 0 && !r.shutdown_requested) log::error(reason);
        break;
      }
      std::unique_lock lk(sleep_mu);
      // The next cycle starts one cycle time after this one's bit-vector
      // all-reduce completed: that moment is shared by all ranks, so their
      // cycles stay in phase and nobody polls for a peer that sleeps.
      // Idle back-off: while no rank has anything pending (all ranks see the
      // same AND, so they back off alike) the pause doubles every 4 cycles
      // after 8, up to 32 cycle times; a submission ends it at once.
      // A caller blocked in wait() submits nothing more until it returns, so
      // there is nothing left to batch on this rank: cycle quickly (short
      // pause) until it is served, at the pace of the slowest peer.
      // Read every cycle: comm.autotune changes it.
      const auto cycle = std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(opts.cycle_time_ms));
      idle_cycles = r.all_idle ? std::min(idle_cycles + 1, 64) : 0;
      const int factor = idle_cycles < 8 ? 1 : std::min(32, 2 << ((idle_cycles - 8) / 4));
      idle.store(factor > 1);  // before the predicate's queue check: no lost wake-up
      const auto pause = waiters.load() > 0 ? std::min<Clock::duration>(cycle, kWaiterPause) : cycle * factor;
      sleep_cv.wait_until(lk, r.synced_at + pause, [&] {
        return stop_requested.load() || flush.exchange(false) || (factor > 1 && queue.has_incoming());
      });
    }
  } catch (const std::exception& e) {
    // Peers would block in this engine's next collective: a rank never dies alone.
    log::error("fusion engine on rank ", rank, " failed: ", e.what(), "; aborting the job");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  running = false;
  auto left = queue.close(reason);
  for (auto& op : left) pending.emplace(op->name, op);
  for (auto& [name, op] : pending)
    complete(op, cat("allreduce '", name, "' did not complete: ", reason));
}

void Engine::Impl::execute(const std::vector<OpPtr>& ready) {
  if (ready.empty()) return;
  for (auto& b : engine::plan_batches(ready, opts.fusion_threshold, opts.fp16_allreduce)) execute_batch(b);
}

void Engine::Impl::execute_batch(const engine::Batch& b) {
  FusionOps& fo = ops_for(b.device);
  const Device dev = b.ops.front()->input.device();
  const bool avg = b.ops.front()->sig.op == ReduceOp::avg;
  const ReduceOp wire_op = avg ? ReduceOp::sum : b.op;
  const double factor = avg ? 1.0 / size : 1.0;
  CollectiveOptions copt = opts.collective;
  copt.device = dev;
  if (autotune) copt.algorithm = autotune->algorithm_for(b.bytes());

  auto t0 = Clock::now();
  fo.wait_for_producers(dev);
  const bool direct = b.ops.size() == 1 && !b.compressed;  // reduce in the tensor's own memory
  void* buf = nullptr;
  if (direct) {
    auto& op = b.ops.front();
    buf = op->output.raw();
  } else {
    buf = buffers.get(dev, b.bytes(), opts.fusion_threshold);
    spans.clear();
    std::size_t off = 0;
    for (auto& op : b.ops) {
      auto n = static_cast<std::size_t>(op->input.numel());
      char* dst = static_cast<char*>(buf) + off * dtype_size(b.wire);
      if (b.compressed) fo.compress_f16(dst, op->input.raw(), n, op->input.dtype(), dev);
      else spans.push_back({dst, op->input.raw(), n * dtype_size(b.wire)});
      off += n;
    }
    if (!spans.empty()) fo.pack_many(spans, dev);
    fo.synchronize(dev);
  }
  auto t1 = Clock::now();
  const void* send = direct ? b.ops.front()->input.raw() : buf;
  allreduce(send, buf, b.count, b.wire, wire_op, comm, copt);
  auto t2 = Clock::now();
  if (direct) {
    if (avg) fo.scale(buf, b.count, b.wire, factor, dev);
  } else {
    if (avg && !b.compressed) fo.scale(buf, b.count, b.wire, factor, dev);  // once, over the whole buffer
    spans.clear();
    std::size_t off = 0;
    for (auto& op : b.ops) {
      auto n = static_cast<std::size_t>(op->input.numel());
      const char* src = static_cast<const char*>(buf) + off * dtype_size(b.wire);
      if (b.compressed) fo.decompress_f16(op->output.raw(), src, n, op->output.dtype(), factor, dev);
      else spans.push_back({op->output.raw(), src, n * dtype_size(b.wire)});
      off += n;
    }
    if (!spans.empty()) fo.unpack_many(spans, dev);
  }
  fo.synchronize(dev);
  auto t3 = Clock::now();

  if (trace::on()) {  // the step window's trace: one span per fused all-reduce, on this thread
    trace::span("comm", cat("all-reduce ", b.ops.size(), b.ops.size() == 1 ? " tensor" : " tensors"), t0, t3,
                cat("\"bytes\": ", b.bytes(), ", \"dtype\": \"", dtype_name(b.wire), "\", \"first\": \"",
                    b.ops.front()->name, "\""));
  }
  if (timeline) {
    std::string args = cat("\"fused\": ", b.ops.size(), ", \"bytes\": ", b.bytes(), ", \"dtype\": \"",
                           dtype_name(b.wire), "\"");
    for (auto& op : b.ops) {
      if (!direct) timeline->span(op->name, "MEMCPY_IN_FUSION_BUFFER", t0, t1);
      timeline->span(op->name, "ALLREDUCE", t1, t2, args);
      timeline->span(op->name, "MEMCPY_OUT_FUSION_BUFFER", t2, t3);
    }
  }
  with_stats([&](EngineStats& s) {
    ++s.allreduces;
    s.fused_allreduces += b.ops.size() > 1;
    s.tensors_reduced += b.ops.size();
    s.bytes_reduced += b.bytes();
    s.allreduce_seconds += std::chrono::duration<double>(t2 - t1).count();
    s.memcpy_seconds += std::chrono::duration<double>((t1 - t0) + (t3 - t2)).count();
  });
  // Before completing: the step's last completion lets the caller go on, and
  // the session must see the batch (and may change the options) first.
  if (autotune) autotune->after_batch(b);
  for (auto& op : b.ops) complete(op, "");
}

// ---- Engine ------------------------------------------------------------------

Engine::Engine(const Communicator& comm, EngineOptions opts) : impl_(std::make_unique<Impl>(comm, std::move(opts))) {}
Engine::~Engine() = default;

Handle Engine::allreduce_async(std::string name, Tensor tensor, ReduceOp op) {
  Tensor out = tensor;
  return Handle(impl_->submit(std::move(name), std::move(tensor), std::move(out), op));
}
Handle Engine::allreduce_async(std::string name, Tensor input, Tensor output, ReduceOp op) {
  return Handle(impl_->submit(std::move(name), std::move(input), std::move(output), op));
}
void Engine::wait(const Handle& h) {
  RT_CHECK(h.valid(), "Engine::wait: empty handle");
  impl_->wait(h.op_);
}
bool Engine::poll(const Handle& h) const {
  RT_CHECK(h.valid(), "Engine::poll: empty handle");
  return h.op_->done.load();
}
void Engine::synchronize() { impl_->synchronize(); }
void Engine::shutdown() { impl_->shutdown(); }
bool Engine::running() const { return impl_->running.load(); }
EngineStats Engine::stats() const {
  std::lock_guard lk(impl_->stats_mu);
  return impl_->stats;
}
void Engine::reset_stats() {
  std::lock_guard lk(impl_->stats_mu);
  impl_->stats = EngineStats{};
}
const EngineOptions& Engine::options() const { return impl_->opts; }
AutotuneResult Engine::autotune_result() const {
  return impl_->autotune ? impl_->autotune->result() : AutotuneResult{};
}
int Engine::rank() const { return impl_->rank; }
int Engine::size() const { return impl_->size; }

}  // namespace ringtrain
