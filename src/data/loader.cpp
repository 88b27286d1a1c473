// Loader: open (collective, agreed errors), prefetch thread, bounded queue of
// reusable batch slots. See loader.hpp for the rules.
#include "ringtrain/data/loader.hpp"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/data/prepare.hpp"
#include "store.hpp"
#include "transform.hpp"

namespace ringtrain::data {
namespace {

void check_consistent(const std::vector<FileInfo>& in) {
  const FileInfo& a = in.front();
  std::int64_t next = 0;
  for (std::size_t s = 0; s < in.size(); ++s) {
    const FileInfo& f = in[s];
    RT_CHECK(f.channels == a.channels && f.height == a.height && f.width == a.width, f.path, ": images are ",
             f.channels, "x", f.height, "x", f.width, " but ", a.path, " has ", a.channels, "x", a.height, "x",
             a.width);
    RT_CHECK(f.num_classes == a.num_classes && f.name == a.name && f.split == a.split, f.path,
             ": belongs to another data set or split than ", a.path);
    RT_CHECK(f.num_shards == std::int64_t(in.size()) && f.shard_index == std::int64_t(s), f.path, ": is shard ",
             f.shard_index, " of ", f.num_shards, " but was given as file ", s, " of ", in.size(),
             " (pass every shard, in order)");
    RT_CHECK(f.first_index == next && f.total_count == a.total_count, f.path, ": first_index ", f.first_index,
             " does not follow the previous shard (expected ", next, ")");
    next += f.count;
  }
  RT_CHECK(next == a.total_count, a.path, ": the shards hold ", next, " samples, total_count says ", a.total_count);
}

}  // namespace

struct Loader::Impl {
  LoaderOptions opt;
  Communicator comm;
  std::vector<FileInfo> infos;
  FileInfo info;
  std::unique_ptr<Sampler> sampler;  // the prefetch thread's, once started
  std::unique_ptr<SampleStore> store;
  std::vector<std::int32_t> tokens;  // token files: the split's stream
  Transform tf;
  std::int64_t b = 0, sample_floats = 0, sample_labels = 1;

  struct Slot {
    float* images = nullptr;
    std::int64_t* labels = nullptr;
    Tensor images_t, labels_t;
    std::vector<std::int64_t> ids;
    std::int64_t epoch = 0, step = 0, valid = 0;
  };
  struct Entry {
    int slot = -1;  // -1: end of `epoch`, or an error
    std::int64_t epoch = 0;
    std::exception_ptr error;
  };
  std::vector<Slot> slots;
  std::vector<std::uint8_t> staging;

  std::mutex mu;
  std::condition_variable cv;
  std::deque<Entry> ready;
  std::vector<int> free_slots;
  int held = -1;
  bool stop_flag = false;
  bool producing = false;  // the prefetch thread is running (it ends only on stop, error, or an MPI-IO epoch end)
  std::thread thread;
  LoaderState pos;  // of the next entry the consumer receives
  double wait_total = 0, wait_epoch = 0;
  std::int64_t wait_epoch_id = -1;

  ~Impl();
  void start();
  void halt();
  void produce(LoaderState from);
  bool fill(int slot, std::int64_t epoch, std::int64_t step);
};

Loader::Impl::~Impl() {
  halt();
  for (auto& s : slots) {
    std::size_t ib = std::size_t(b * sample_floats) * sizeof(float);
    std::size_t lb = std::size_t(b * sample_labels) * sizeof(std::int64_t);
    if (opt.host_memory.deallocate) {
      opt.host_memory.deallocate(s.images, ib);
      opt.host_memory.deallocate(s.labels, lb);
    } else {
      allocator_for(DeviceKind::cpu).deallocate(s.images, ib, Device::cpu());
      allocator_for(DeviceKind::cpu).deallocate(s.labels, lb, Device::cpu());
    }
  }
}

Loader::Loader(LoaderOptions opt, const Communicator& comm) : impl_(std::make_unique<Impl>()) {
  Impl& I = *impl_;
  I.opt = std::move(opt);
  I.comm = comm;
  const LoaderOptions& o = I.opt;
  const int p = comm.valid() ? comm.size() : 1, rank = comm.valid() ? comm.rank() : 0;
  bool cache = false;
  // Phase 1, independent: metadata, options, sampler. Agreed before any collective I/O.
  run_agreed(comm, "data loader open", [&] {
    RT_CHECK(!o.files.empty(), "data loader: no files given");
    RT_CHECK(!o.mpio || o.files.size() == 1, o.files.front(),
             ": MPI-IO collective reads need the single-file layout (", o.files.size(), " shards given)");
    RT_CHECK(o.batch_size >= 1, "data loader: batch size ", o.batch_size, " must be >= 1");
    RT_CHECK(o.prefetch_depth >= 1, "data loader: prefetch_depth ", o.prefetch_depth, " must be >= 1");
    RT_CHECK(o.augment.crop_padding >= 0, "data loader: crop padding ", o.augment.crop_padding, " must be >= 0");
    RT_CHECK(bool(o.host_memory.allocate) == bool(o.host_memory.deallocate),
             "data loader: host_memory needs both allocate and deallocate");
    for (const auto& f : o.files) I.infos.push_back(read_file_info(f));
    check_consistent(I.infos);
    I.info = I.infos.front();
    I.info.count = I.info.total_count;
    std::vector<std::int64_t> counts;
    for (const auto& f : I.infos) counts.push_back(f.count);
    SamplerConfig sc{o.batch_size, p, rank, o.seed, o.shuffle, o.shuffle_mode, o.tail};
    if (I.info.tokens()) {  // one stream of windows over every shard
      RT_CHECK(o.seq_len >= 1, o.files.front(), ": a token file needs the sequence length (data.seq_len)");
      RT_CHECK(!o.mpio, o.files.front(), ": MPI-IO reads are for image files; token files are read whole");
      I.info.count = token_windows(I.info.total_count, o.seq_len);
      RT_CHECK(I.info.count >= 1, o.files.front(), ": data.seq_len = ", o.seq_len, " is longer than the data (",
               I.info.total_count, " tokens; a sample takes seq_len + 1)");
      counts = {I.info.count};
      sc.mode = ShuffleMode::global;
    }
    try {
      I.sampler = std::make_unique<Sampler>(sc, counts);
    } catch (const Error& e) {
      RT_FAIL(o.files.front(), (o.files.size() > 1 ? " (and its shards)" : ""), ": ", e.what());
    }
    std::int64_t need = SampleStore::bytes_for(I.infos, I.sampler->shards());
    if (I.info.tokens()) return;
    cache = o.cache == CachePolicy::always ||
            (o.cache == CachePolicy::auto_ && !o.mpio && need < o.cache_limit_bytes);
  });
  // Phase 2: open the rank's files (collectively under MPI-IO), read labels, fill the cache.
  run_agreed(comm, "data loader open", [&] {
    if (I.info.tokens()) I.tokens = read_split_tokens(I.infos);
    else I.store = std::make_unique<SampleStore>(I.infos, I.sampler->shards(), cache, o.mpio, comm);
  });
  I.b = o.batch_size;
  I.sample_floats = I.info.tokens() ? o.seq_len : I.info.sample_bytes();
  I.sample_labels = I.info.tokens() ? o.seq_len : 1;
  I.tf = Transform(I.info.channels, I.info.height, I.info.width, I.info.mean, I.info.std, o.normalize, o.augment,
                   o.seed);
  if (!I.info.tokens()) I.staging.resize(std::size_t(I.b * I.sample_floats));
  const Shape shape = I.info.tokens() ? Shape{I.b, o.seq_len} : Shape{I.b, I.info.channels, I.info.height, I.info.width};
  const Shape lshape = I.info.tokens() ? Shape{I.b, o.seq_len} : Shape{I.b};
  I.slots.resize(std::size_t(o.prefetch_depth) + 1);  // depth ready + one held by the consumer
  for (std::size_t i = 0; i < I.slots.size(); ++i) {
    auto& s = I.slots[i];
    std::size_t ib = std::size_t(I.b * I.sample_floats) * sizeof(float);
    std::size_t lb = std::size_t(I.b * I.sample_labels) * sizeof(std::int64_t);
    auto alloc = [&](std::size_t n) {
      return o.host_memory.allocate ? o.host_memory.allocate(n)
                                    : allocator_for(DeviceKind::cpu).allocate(n, Device::cpu());
    };
    s.images = static_cast<float*>(alloc(ib));
    s.labels = static_cast<std::int64_t*>(alloc(lb));
    s.images_t = Tensor::wrap(s.images, shape, DType::f32);
    s.labels_t = Tensor::wrap(s.labels, lshape, DType::i64);
    s.ids.reserve(std::size_t(I.b));
    I.free_slots.push_back(int(i));
  }
  // Start filling now so the first batch is ready when the training loop asks. Not under
  // MPI-IO: a later set_epoch() would have to drain the whole started epoch collectively.
  if (!o.mpio) I.start();
}

Loader::~Loader() = default;

bool Loader::Impl::fill(int si, std::int64_t epoch, std::int64_t step) {
  Slot dummy;
  Slot& s = si >= 0 ? slots[std::size_t(si)] : dummy;
  std::vector<std::int64_t>& ids = si >= 0 ? s.ids : dummy.ids;
  s.valid = sampler->batch(epoch, step, ids);
  if (!tokens.empty()) {  // window id: inputs tokens[id*T, id*T+T), targets one later
    if (si < 0) return false;
    s.epoch = epoch, s.step = step;
    const std::int64_t T = sample_floats;
    for (std::int64_t i = 0; i < b; ++i) {
      const std::int32_t* w = tokens.data() + ids[std::size_t(i)] * T;
      for (std::int64_t j = 0; j < T; ++j) {
        s.images[i * T + j] = float(w[j]);
        s.labels[i * T + j] = w[j + 1];
      }
    }
    return true;
  }
  store->read(ids.data(), b, staging.data());
  if (si < 0) return false;  // MPI-IO drain: the collective read happened, nothing to keep
  s.epoch = epoch, s.step = step;
  for (std::int64_t i = 0; i < b; ++i) {
    tf.apply(staging.data() + i * sample_floats, s.images + i * sample_floats, epoch, ids[std::size_t(i)]);
    s.labels[i] = store->label(ids[std::size_t(i)]);
  }
  return true;
}

void Loader::Impl::produce(LoaderState at) {
  const std::int64_t steps = sampler->steps_per_epoch();
  struct Done {  // marks the thread finished on every exit path
    Impl& I;
    ~Done() {
      std::lock_guard lk(I.mu);
      I.producing = false;
      I.cv.notify_all();
    }
  } done{*this};
  try {
    for (;;) {
      if (at.step >= steps) {
        std::lock_guard lk(mu);
        ready.push_back({-1, at.epoch, nullptr});
        cv.notify_all();
        if (opt.mpio || stop_flag) return;  // MPI-IO: never start an epoch the consumer did not ask for
        ++at.epoch, at.step = 0;
        continue;
      }
      int si = -1;
      {
        std::unique_lock lk(mu);
        cv.wait(lk, [&] { return stop_flag || !free_slots.empty(); });
        if (stop_flag && !opt.mpio) return;
        if (!stop_flag) {
          si = free_slots.back();
          free_slots.pop_back();
        }
      }
      if (si < 0) {  // MPI-IO stop: finish the epoch's collective reads so no rank waits forever
        for (; at.step < steps; ++at.step) fill(-1, at.epoch, at.step);
        return;
      }
      fill(si, at.epoch, at.step);
      std::lock_guard lk(mu);
      ready.push_back({si, at.epoch, nullptr});
      cv.notify_all();
      ++at.step;
    }
  } catch (...) {
    std::lock_guard lk(mu);
    ready.push_back({-1, at.epoch, std::current_exception()});
    cv.notify_all();
  }
}

void Loader::Impl::start() {
  std::lock_guard lk(mu);
  stop_flag = false;
  producing = true;
  thread = std::thread([this, at = pos] {
    // The lowest priority: preparing the next batch must not take the core from
    // the rank's compute. On a shared core the woken thread delayed a first
    // pipeline stage's step by 0.7 ms (median, up to 5 ms) while later stages
    // waited for it; at nice 19 it runs in the stage's waits (0.02 ms).
    // Linux sets one thread's nice through its thread id.
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
    produce(at);
  });
}

void Loader::Impl::halt() {
  {
    std::lock_guard lk(mu);
    stop_flag = true;
  }
  cv.notify_all();
  if (thread.joinable()) thread.join();
  std::lock_guard lk(mu);
  stop_flag = false;
  ready.clear();
  free_slots.clear();
  held = -1;
  for (std::size_t i = 0; i < slots.size(); ++i) free_slots.push_back(int(i));
}

std::optional<Batch> Loader::next() {
  Impl& I = *impl_;
  std::unique_lock lk(I.mu);
  if (I.held >= 0) {
    I.free_slots.push_back(I.held);
    I.held = -1;
    I.cv.notify_all();
  }
  auto t0 = std::chrono::steady_clock::now();
  while (I.ready.empty()) {
    if (!I.producing) {  // first call, after a seek, or an MPI-IO epoch ended: (re)start the thread
      lk.unlock();
      if (I.thread.joinable()) I.thread.join();
      I.start();
      lk.lock();
      continue;
    }
    I.cv.wait(lk, [&] { return !I.ready.empty() || !I.producing; });
  }
  double w = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  Impl::Entry e = I.ready.front();
  I.ready.pop_front();
  if (e.epoch != I.wait_epoch_id) I.wait_epoch = 0, I.wait_epoch_id = e.epoch;
  I.wait_total += w, I.wait_epoch += w;
  if (e.error) {
    lk.unlock();
    I.halt();
    std::rethrow_exception(e.error);
  }
  if (e.slot < 0) {
    I.pos = {e.epoch + 1, 0};
    return std::nullopt;
  }
  auto& s = I.slots[std::size_t(e.slot)];
  I.held = e.slot;
  I.pos = {s.epoch, s.step + 1};
  return Batch{s.images_t, s.labels_t, s.epoch, s.step, s.valid, &s.ids};
}

void Loader::seek(LoaderState s) {
  Impl& I = *impl_;
  RT_CHECK(s.epoch >= 0 && s.step >= 0 && s.step <= I.sampler->steps_per_epoch(), "data loader: cannot seek to epoch ",
           s.epoch, " step ", s.step, " (", I.sampler->steps_per_epoch(), " steps per epoch)");
  {
    std::lock_guard lk(I.mu);
    if (s.epoch == I.pos.epoch && s.step == I.pos.step) return;  // already queued there
  }
  I.halt();
  I.pos = s;
}

void Loader::set_epoch(std::int64_t epoch) { seek({epoch, 0}); }
void Loader::skip(std::int64_t steps) {
  RT_CHECK(steps >= 0, "data loader: cannot skip ", steps, " steps");
  LoaderState s = state();
  seek({s.epoch, s.step + steps});
}
LoaderState Loader::state() const {
  std::lock_guard lk(impl_->mu);
  return impl_->pos;
}
void Loader::stop() { impl_->halt(); }
std::int64_t Loader::steps_per_epoch() const { return impl_->sampler->steps_per_epoch(); }
std::int64_t Loader::num_samples() const { return impl_->info.count; }
std::int64_t Loader::batch_size() const { return impl_->b; }
const FileInfo& Loader::info() const { return impl_->info; }
bool Loader::cached() const { return !impl_->store || impl_->store->cached(); }
double Loader::wait_seconds() const {
  std::lock_guard lk(impl_->mu);
  return impl_->wait_total;
}
double Loader::epoch_wait_seconds() const {
  std::lock_guard lk(impl_->mu);
  return impl_->wait_epoch;
}

}  // namespace ringtrain::data
