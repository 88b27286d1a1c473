// ZeRO stage 1: slicing the flat arena over the data-parallel group, the
// slice's own arena and optimizer, the step's collectives, and the
// gather/scatter of the state for checkpoints. See sharded_optimizer.hpp.
#include "ringtrain/optim/sharded_optimizer.hpp"

#include <algorithm>
#include <climits>
#include <cmath>

#include "cpu_loops.hpp"
#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/shm.hpp"
#include "ringtrain/core/page_ledger.hpp"
#include "ringtrain/optim/grad_utils.hpp"

namespace ringtrain {

namespace {

// Slice boundaries of one dtype's flat buffer of n elements: near-equal, aligned
// to `align` elements, never inside padding (moved to the next parameter's start).
std::vector<std::size_t> boundaries(const ParamArena& a, DType dt, std::size_t n, int ranks) {
  const std::size_t align = std::max<std::size_t>(1, 64 / dtype_size(dt));
  const std::size_t units = (n + align - 1) / align;
  const std::size_t per = (units + static_cast<std::size_t>(ranks) - 1) / static_cast<std::size_t>(ranks) * align;
  std::vector<std::size_t> b(static_cast<std::size_t>(ranks) + 1);
  for (int r = 0; r <= ranks; ++r) {
    std::size_t x = std::min(n, static_cast<std::size_t>(r) * per);
    bool inside = x == n;
    std::size_t next = n;
    for (const ParamInfo& p : a.infos()) {
      if (p.dtype != dt) continue;
      const std::size_t end = p.offset + static_cast<std::size_t>(shape_numel(p.shape));
      if (p.offset <= x && x < end) inside = true;
      if (p.offset >= x) next = std::min(next, p.offset);
    }
    b[static_cast<std::size_t>(r)] = inside ? x : next;
  }
  return b;
}

// MPI_Gatherv/Scatterv of state elements of `esz` bytes (checkpoints only; not on the step's path).
struct ElemType {
  MPI_Datatype t = MPI_DATATYPE_NULL;
  explicit ElemType(std::size_t esz) {
    MPI_Type_contiguous(static_cast<int>(esz), MPI_BYTE, &t);
    MPI_Type_commit(&t);
  }
  ~ElemType() { MPI_Type_free(&t); }
};

std::vector<int> as_int(const std::vector<std::size_t>& v, const char* what) {
  std::vector<int> out;
  for (std::size_t x : v) {
    RT_CHECK(x <= static_cast<std::size_t>(INT_MAX), "parallel.zero: ", what, " of ", x,
             " elements exceeds what one MPI call moves (", INT_MAX, ")");
    out.push_back(static_cast<int>(x));
  }
  return out;
}

Tensor find(const Optimizer::NamedTensors& s, const std::string& name) {
  for (const auto& [n, t] : s)
    if (n == name) return t;
  return Tensor();
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(ParamArena& full, const OptimizerConfig& cfg, Communicator group,
                                   CollectiveOptions copt, Factory make, GradScale scale)
    : full_(full), cfg_(cfg), group_(std::move(group)), copt_(copt), host_copt_(copt), make_(std::move(make)),
      scale_(std::move(scale)) {
  RT_CHECK(full_.finalized(), "parallel.zero: needs a finalised parameter arena");
  copt_.device = full_.device();
  host_copt_.device = Device::cpu();
  if (!make_) make_ = [](ParamArena& a, const OptimizerConfig& c) { return make_optimizer(a, c); };
  if (!scale_) scale_ = [](ParamArena& a, double f) { ringtrain::unscale_grads(a, f); };
  const int ranks = group_.size(), me = group_.rank();
  std::vector<std::pair<std::size_t, std::size_t>> mine;  // [lo, hi) per slice
  for (DType dt : full_.dtypes()) {
    const std::size_t n = static_cast<std::size_t>(full_.params_flat(dt).numel());
    std::vector<std::size_t> b = boundaries(full_, dt, n, ranks);
    Slice s{dt, {}, {}};
    for (int r = 0; r < ranks; ++r) {
      s.offsets.push_back(b[static_cast<std::size_t>(r)]);
      s.counts.push_back(b[static_cast<std::size_t>(r) + 1] - b[static_cast<std::size_t>(r)]);
    }
    as_int(s.offsets, "a slice offset");
    mine.emplace_back(b[static_cast<std::size_t>(me)], b[static_cast<std::size_t>(me) + 1]);
    slices_.push_back(std::move(s));
  }
  // The shard: this rank's piece of every parameter its slices touch, in the
  // full arena's order; the last piece of a dtype reaches to the slice's end
  // (trailing padding: zero, and an update keeps zeros zero).
  for (std::size_t d = 0; d < slices_.size(); ++d) {
    const auto [lo, hi] = mine[d];
    std::size_t last = SIZE_MAX;
    for (std::size_t i = 0; i < full_.size(); ++i) {
      const ParamInfo& p = full_.info(i);
      const std::size_t end = p.offset + static_cast<std::size_t>(shape_numel(p.shape));
      if (p.dtype == slices_[d].dtype && p.offset < hi && end > lo) last = i;
    }
    for (std::size_t i = 0; i <= last && last != SIZE_MAX; ++i) {
      const ParamInfo& p = full_.info(i);
      const std::size_t end = p.offset + static_cast<std::size_t>(shape_numel(p.shape));
      if (p.dtype != slices_[d].dtype || p.offset >= hi || end <= lo) continue;
      const std::size_t b = std::max(p.offset, lo), e = i == last ? hi : std::min(end, hi);
      shard_.add(p.name, {static_cast<std::int64_t>(e - b)}, p.dtype, p.decay, p.layer);
      full_index_.push_back(i);
    }
  }
  shard_.finalize(full_.device());
  // The layout invariant the zero-copy collectives rely on.
  for (std::size_t j = 0; j < shard_.size(); ++j) {
    const ParamInfo& p = full_.info(full_index_[j]);
    const std::size_t d = static_cast<std::size_t>(
        std::find_if(slices_.begin(), slices_.end(), [&](const Slice& s) { return s.dtype == p.dtype; }) - slices_.begin());
    RT_CHECK(shard_.info(j).offset == std::max(p.offset, mine[d].first) - mine[d].first,
             "parallel.zero: internal error: the slice of '", p.name, "' is misaligned");
  }
  for (std::size_t d = 0; d < slices_.size(); ++d) {
    Tensor f = shard_flat(slices_[d].dtype, false);
    RT_CHECK(static_cast<std::size_t>(f.defined() ? f.numel() : 0) == mine[d].second - mine[d].first,
             "parallel.zero: internal error: the ", dtype_name(slices_[d].dtype), " slice has the wrong size");
  }
  inner_ = make_(shard_, cfg_);
  inner_->set_sums_hook([this](std::vector<double>& sums, int per) { combine_piece_sums(sums, per); });
  // The state buffers' names, as an unsharded optimizer lists them (a rank whose
  // slice of some dtype is empty lacks that dtype's buffers).
  ParamArena probe;
  for (DType dt : full_.dtypes()) probe.add(cat("probe.", dtype_name(dt)), {1}, dt);
  probe.finalize(full_.device());
  for (const auto& [name, t] : make_(probe, cfg_)->state())
    if (name != "step") state_names_.push_back(name);
}

ShardedOptimizer::~ShardedOptimizer() = default;

const ShardedOptimizer::Slice& ShardedOptimizer::slice(DType dt) const {
  for (const Slice& s : slices_)
    if (s.dtype == dt) return s;
  RT_FAIL("parallel.zero: no parameters of dtype ", dtype_name(dt));
}

const std::vector<std::size_t>& ShardedOptimizer::counts(DType dt) const { return slice(dt).counts; }

Tensor ShardedOptimizer::shard_flat(DType dt, bool grads) const {
  for (DType have : shard_.dtypes())
    if (have == dt) return grads ? shard_.grads_flat(dt) : shard_.params_flat(dt);
  return Tensor();
}

void ShardedOptimizer::combine_piece_sums(std::vector<double>& sums, int per) const {
  const std::size_t k = static_cast<std::size_t>(per);
  std::vector<double> all(k * full_.size(), 0.0);
  for (std::size_t j = 0; j < full_index_.size(); ++j)
    for (std::size_t q = 0; q < k; ++q) all[k * full_index_[j] + q] = sums[k * j + q];
  allreduce(all.data(), all.data(), all.size(), DType::f64, ReduceOp::sum, group_, host_copt_);
  for (std::size_t j = 0; j < full_index_.size(); ++j)
    for (std::size_t q = 0; q < k; ++q) sums[k * j + q] = all[k * full_index_[j] + q];
}

// Averaged as the fusion engine averages: a sum, then one multiplication by
// (compute type)(1/ranks). On one node the engine's all-reduce is shm, and
// shm_reduce_scatter sums each element exactly as it does, so sharding changes
// no bit of the averaged gradients. Elsewhere our ring reduce-scatter (or MPI's
// with comm.algorithm = mpi): the same sum in another order.
void ShardedOptimizer::reduce_scatter_grads() {
  for (const Slice& s : slices_)
    reduce_scatter_range(s.dtype, 0, static_cast<std::size_t>(full_.grads_flat(s.dtype).numel()));
  average_grads();
}

void ShardedOptimizer::reduce_scatter_range(DType dt, std::size_t lo, std::size_t hi) {
  if (pre_reduce_) pre_reduce_(dt, lo, hi);
  const Slice& s = slice(dt);
  const std::size_t me = static_cast<std::size_t>(group_.rank()), es = dtype_size(dt);
  std::vector<std::size_t> counts(s.counts.size());  // each rank's part of [lo, hi)
  for (std::size_t r = 0; r < counts.size(); ++r) {
    const std::size_t b = std::max(lo, s.offsets[r]), e = std::min(hi, s.offsets[r] + s.counts[r]);
    counts[r] = e > b ? e - b : 0;
  }
  Tensor mine = shard_flat(dt, true);
  void* out = counts[me] ? static_cast<char*>(mine.raw()) + (std::max(lo, s.offsets[me]) - s.offsets[me]) * es
                         : nullptr;
  const char* in = static_cast<const char*>(full_.grads_flat(dt).raw()) + lo * es;
  const Algorithm a = choose_algorithm(0, group_.size(), copt_, group_.node_count(), group_.max_local_size());
  if (a == Algorithm::shm && copt_.device.is_cpu()) shm_reduce_scatter(in, out, counts, dt, ReduceOp::sum, group_, copt_);
  else reduce_scatter(in, out, counts, dt, ReduceOp::sum, group_, copt_);
}

void ShardedOptimizer::average_grads() {
  // grads *= 1/ranks in the compute type (g * factor, as the engine's scale); the finiteness verdict is unused.
  if (group_.size() > 1) scale_(shard_, 1.0 / group_.size());
}

void ShardedOptimizer::step(double lr) {
  if (shard_params_) {  // ZeRO-3: the slice holds the parameters; the next use gathers them
    ensure_sharded();
    inner_->step(lr);
    ++params_version_;
    return;
  }
  const int me = group_.rank();
  for (const Slice& s : slices_) {
    Tensor mine = shard_flat(s.dtype, false);
    if (mine.defined())
      mine.copy_from(full_.params_flat(s.dtype).flat_view(static_cast<std::int64_t>(s.offsets[me]),
                                                         static_cast<std::int64_t>(s.counts[me])));
  }
  inner_->step(lr);
  for (const Slice& s : slices_) {
    Tensor mine = shard_flat(s.dtype, false);
    allgatherv(mine.defined() ? mine.raw() : nullptr, full_.params_flat(s.dtype).raw(), s.counts, s.dtype, group_,
               copt_);
  }
}

void ShardedOptimizer::shard_params() {
  shard_params_ = true;
  whole_ = true;
}

void ShardedOptimizer::gather_range(DType dt, std::size_t lo, std::size_t hi) {
  const Slice& s = slice(dt);
  const std::size_t me = static_cast<std::size_t>(group_.rank()), es = dtype_size(dt);
  std::vector<std::size_t> counts(s.counts.size());  // each rank's part of [lo, hi), in rank order
  for (std::size_t r = 0; r < counts.size(); ++r) {
    const std::size_t b = std::max(lo, s.offsets[r]), e = std::min(hi, s.offsets[r] + s.counts[r]);
    counts[r] = e > b ? e - b : 0;
  }
  Tensor mine = shard_flat(dt, false);
  const void* in = counts[me] ? static_cast<const char*>(mine.raw()) + (std::max(lo, s.offsets[me]) - s.offsets[me]) * es
                              : nullptr;
  allgatherv(in, static_cast<char*>(full_.params_flat(dt).raw()) + lo * es, counts, dt, group_, copt_);
}

void ShardedOptimizer::materialize() {
  if (!shard_params_ || whole_) return;
  for (const Slice& s : slices_) {
    PageLedger(full_.params_flat(s.dtype)).take_back_all();  // device chunks given back: mapped again first
    gather_range(s.dtype, 0, static_cast<std::size_t>(full_.params_flat(s.dtype).numel()));
  }
  whole_ = true;
}

void ShardedOptimizer::ensure_sharded() {
  if (!shard_params_ || !whole_) return;
  const int me = group_.rank();
  for (const Slice& s : slices_) {
    Tensor mine = shard_flat(s.dtype, false);
    if (mine.defined())
      mine.copy_from(full_.params_flat(s.dtype).flat_view(static_cast<std::int64_t>(s.offsets[me]),
                                                         static_cast<std::int64_t>(s.counts[me])));
    release_params(s.dtype);
  }
  whole_ = false;
  ++params_version_;
}

void ShardedOptimizer::mark_sharded() {
  if (!shard_params_) return;
  whole_ = false;
  for (const Slice& s : slices_) release_params(s.dtype);
  ++params_version_;
}

void ShardedOptimizer::release_params(DType dt) { PageLedger(full_.params_flat(dt)).drop_all(); }

std::size_t ShardedOptimizer::state_bytes() const {
  std::size_t n = 0;
  for (const auto& [name, t] : inner_->state()) n += t.nbytes();
  return n;
}

std::pair<std::size_t, std::size_t> ShardedOptimizer::state_bytes_summary() const {
  std::int64_t most = static_cast<std::int64_t>(state_bytes());
  std::int64_t buffers = most - static_cast<std::int64_t>(sizeof(std::int64_t));  // without the step counter
  allreduce(&most, &most, 1, DType::i64, ReduceOp::max, group_, host_copt_);
  allreduce(&buffers, &buffers, 1, DType::i64, ReduceOp::sum, group_, host_copt_);
  return {static_cast<std::size_t>(most), static_cast<std::size_t>(buffers) + sizeof(std::int64_t)};
}

std::unique_ptr<Optimizer> ShardedOptimizer::make_whole(int root) const {
  return group_.rank() == root ? make_(full_, cfg_) : nullptr;
}

namespace {

// The host bytes of `t` (itself on the host, else a copy when `fill`, else an empty host tensor of its shape).
Tensor host_side(const Tensor& t, bool fill) {
  if (!t.defined() || t.device().is_cpu()) return t;
  return fill ? t.to(Device::cpu()) : Tensor::empty(t.shape(), t.dtype());
}

}  // namespace

void ShardedOptimizer::gatherv(const Tensor& src, const Tensor& dst, const Slice& s, std::size_t esz,
                               int root) const {
  ElemType et(esz);
  const Tensor hs = host_side(src, true), hd = host_side(dst, false);
  const std::vector<int> counts = as_int(s.counts, "a slice"), displs = as_int(s.offsets, "a slice offset");
  const char* what = "gathering the sharded optimizer state";
  MPI_Request req;
  check_mpi(MPI_Igatherv(hs.defined() ? hs.raw() : nullptr, counts[static_cast<std::size_t>(group_.rank())], et.t,
                         hd.defined() ? hd.raw() : nullptr, counts.data(), displs.data(), et.t, root,
                         group_.handle(what), &req),
            what, "MPI_Igatherv");
  wait_bounded(&req, 1, WaitOn(group_, what), what);
  if (hd.defined() && hd.raw() != dst.raw()) Tensor(dst).copy_from(hd);
}

void ShardedOptimizer::scatterv(const Tensor& src, const Tensor& dst, const Slice& s, std::size_t esz,
                                int root) const {
  ElemType et(esz);
  const Tensor hs = host_side(src, true), hd = host_side(dst, false);
  const std::vector<int> counts = as_int(s.counts, "a slice"), displs = as_int(s.offsets, "a slice offset");
  const char* what = "scattering the sharded optimizer state";
  MPI_Request req;
  check_mpi(MPI_Iscatterv(hs.defined() ? hs.raw() : nullptr, counts.data(), displs.data(), et.t,
                          hd.defined() ? hd.raw() : nullptr, counts[static_cast<std::size_t>(group_.rank())], et.t,
                          root, group_.handle(what), &req),
            what, "MPI_Iscatterv");
  wait_bounded(&req, 1, WaitOn(group_, what), what);
  if (hd.defined() && hd.raw() != dst.raw()) Tensor(dst).copy_from(hd);
}

std::unique_ptr<Optimizer> ShardedOptimizer::gather(int root) const {
  std::unique_ptr<Optimizer> whole = make_whole(root);
  const Optimizer::NamedTensors mine = inner_->state();
  const Optimizer::NamedTensors all = whole ? whole->state() : Optimizer::NamedTensors{};
  for (const std::string& name : state_names_) {
    const DType dt = parse_dtype(name.substr(0, name.find('.')));
    const Slice& s = slice(dt);
    const Tensor src = find(mine, name), dst = find(all, name);
    RT_CHECK(!whole || dst.defined(), "parallel.zero: the whole optimizer has no state '", name, "'");
    gatherv(src, dst, s, dtype_size(optim_detail::state_dtype(dt)), root);
  }
  if (whole) find(all, "step").data<std::int64_t>()[0] = inner_->steps();
  return whole;
}

void ShardedOptimizer::add_slices(const std::string& slot, DType dt, const Tensor& t, std::vector<StateSlice>& out) const {
  const std::size_t lo = slice(dt).offsets[static_cast<std::size_t>(group_.rank())];
  for (std::size_t j = 0; j < shard_.size(); ++j) {
    const ParamInfo& p = full_.info(full_index_[j]);
    if (p.dtype != dt) continue;
    // Shard piece j starts at full element max(p.offset, lo); the dtype's last piece may run into padding.
    const std::size_t start = std::max(p.offset, lo);
    const std::int64_t n = std::min<std::int64_t>(shard_.info(j).shape[0],
                                                  static_cast<std::int64_t>(p.offset) + shape_numel(p.shape) -
                                                      static_cast<std::int64_t>(start));
    out.push_back({slot, full_index_[j], static_cast<std::int64_t>(start - p.offset),
                   t.flat_view(static_cast<std::int64_t>(shard_.info(j).offset), n)});
  }
}

std::vector<ShardedOptimizer::StateSlice> ShardedOptimizer::state_slices() const {
  std::vector<StateSlice> out;
  for (const auto& [kind, t] : inner_->state()) {
    if (kind == "step") continue;
    add_slices(kind.substr(kind.find('.') + 1), parse_dtype(kind.substr(0, kind.find('.'))), t, out);
  }
  return out;
}

std::vector<ShardedOptimizer::StateSlice> ShardedOptimizer::param_slices() const {
  std::vector<StateSlice> out;
  for (DType dt : shard_.dtypes()) add_slices("param", dt, shard_.params_flat(dt), out);
  return out;
}

Tensor ShardedOptimizer::step_state() const { return find(inner_->state(), "step"); }

void ShardedOptimizer::scatter(const Optimizer* whole, int root) {
  RT_CHECK(group_.rank() != root || whole, "parallel.zero: scatter needs the whole state on the root");
  const Optimizer::NamedTensors mine = inner_->state();
  const Optimizer::NamedTensors all = group_.rank() == root ? whole->state() : Optimizer::NamedTensors{};
  for (const std::string& name : state_names_) {
    const DType dt = parse_dtype(name.substr(0, name.find('.')));
    const Slice& s = slice(dt);
    scatterv(find(all, name), find(mine, name), s, dtype_size(optim_detail::state_dtype(dt)), root);
  }
  std::int64_t step = group_.rank() == root ? whole->steps() : 0;
  bounded::bcast(&step, 1, MPI_INT64_T, root, WaitOn(group_, "scattering the sharded optimizer state"),
                 "scattering the sharded optimizer state");
  find(mine, "step").data<std::int64_t>()[0] = step;
}

}  // namespace ringtrain
