#include "ringtrain/nn/parameters.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace ringtrain {

std::size_t ParamArena::add(std::string name, Shape shape, DType dt, bool decay, int layer) {
  RT_CHECK(!finalized_, "parameter '", name, "' added after the arena was finalised");
  for (const auto& p : infos_) RT_CHECK(p.name != name, "parameter '", name, "' registered twice");
  Flat& f = flat(dt);
  std::size_t align = std::max<std::size_t>(1, 64 / dtype_size(dt));
  f.elems = (f.elems + align - 1) / align * align;
  ParamInfo info;
  info.name = std::move(name);
  info.shape = std::move(shape);
  info.dtype = dt;
  info.offset = f.elems;
  info.decay = decay;
  info.layer = layer;
  f.elems += static_cast<std::size_t>(shape_numel(info.shape));
  infos_.push_back(std::move(info));
  return infos_.size() - 1;
}

ParamArena::Flat& ParamArena::flat(DType dt) {
  for (auto& f : flats_)
    if (f.dtype == dt) return f;
  Flat f;
  f.dtype = dt;
  flats_.push_back(f);
  return flats_.back();
}

const ParamArena::Flat& ParamArena::flat(DType dt) const {
  for (const auto& f : flats_)
    if (f.dtype == dt) return f;
  RT_FAIL("the parameter arena holds no ", dtype_name(dt), " parameters");
}

void ParamArena::set_copy_of(std::size_t i, std::size_t owner) {
  RT_CHECK(!finalized_, "parameter '", info(i).name, "' is marked as a tied copy after the arena was finalised");
  infos_.at(i).copy_of = static_cast<std::int64_t>(owner);
}

void ParamArena::set_copied(std::size_t i) { infos_.at(i).copied = true; }

std::vector<std::size_t> ParamArena::tied() const {
  std::vector<std::size_t> out;
  for (std::size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].copied || infos_[i].copy_of >= 0) out.push_back(i);
  std::sort(out.begin(), out.end(), [&](std::size_t x, std::size_t y) { return infos_[x].name < infos_[y].name; });
  return out;
}

std::size_t ParamArena::model_index(std::size_t i) const {
  const ParamInfo& p = infos_.at(i);
  if (p.copy_of >= 0) return static_cast<std::size_t>(p.copy_of);
  auto run = bases_.begin();  // the run holding i: the last starting at or before it
  for (auto r = bases_.begin(); r != bases_.end() && r->first <= i; ++r) run = r;
  std::size_t copies = 0;  // in the run before i (a tied head's copy takes no index of the model's)
  for (std::size_t k = run->first; k < i; ++k) copies += infos_[k].copy_of >= 0;
  return run->second + (i - run->first) - copies;
}

std::size_t ParamArena::next_model_index() const {
  const auto& run = bases_.back();
  std::size_t copies = 0;
  for (std::size_t k = run.first; k < infos_.size(); ++k) copies += infos_[k].copy_of >= 0;
  return run.second + (infos_.size() - run.first) - copies;
}

void ParamArena::set_index_base(std::size_t base) {
  RT_CHECK(!finalized_, "the parameter arena's index base is set after finalize()");
  if (bases_.back().first == infos_.size()) bases_.back().second = base;
  else bases_.emplace_back(infos_.size(), base);
}


void ParamArena::finalize(Device dev, bool chunked) {
  RT_CHECK(!finalized_, "parameter arena finalised twice");
  device_ = dev;
  for (auto& f : flats_) {
    // On the host, zeros in whole pages that cost memory only once written
    // (under ZeRO-3 most of the full-size buffers never are at once) and that
    // ZeRO-2/3 hand back piece by piece (PageLedger).
    const auto n = static_cast<std::int64_t>(f.elems);
    // On a device, chunked memory for ZeRO-2/3 (mapped only while held), else the allocator's.
    const bool paged = dev.is_cpu() || chunked;
    f.params = paged ? Tensor::paged(n, f.dtype, dev) : Tensor::zeros({n}, f.dtype, dev);
    f.grads = paged ? Tensor::paged(n, f.dtype, dev) : Tensor::zeros({n}, f.dtype, dev);
  }
  finalized_ = true;
}

void ParamArena::set_shard(std::size_t i, ShardSpec s) {
  ParamInfo& p = infos_.at(i);
  RT_CHECK(s.dim >= 0 && s.dim < int(p.shape.size()) && s.global.size() == p.shape.size() && s.parts >= 1 &&
               s.index >= 0 && s.index < s.parts && s.blocks >= 1,
           "parameter '", p.name, "': invalid shard (dim ", s.dim, ", part ", s.index, " of ", s.parts, ")");
  for (std::size_t d = 0; d < p.shape.size(); ++d) {
    const std::int64_t want = int(d) == s.dim ? s.global[d] / s.parts : s.global[d];
    RT_CHECK(p.shape[d] == want && (int(d) != s.dim || s.global[d] % (std::int64_t(s.parts) * s.blocks) == 0),
             "parameter '", p.name, "': local shape ", shape_str(p.shape), " is not part of ", shape_str(s.global),
             " split ", s.parts, " ways along dim ", s.dim);
  }
  p.shard = std::move(s);
}

std::size_t ParamArena::index_of(const std::string& name) const {
  for (std::size_t i = 0; i < infos_.size(); ++i)
    if (infos_[i].name == name) return i;
  RT_FAIL("no parameter named '", name, "'");
}

Tensor ParamArena::param(std::size_t i) const {
  RT_CHECK(finalized_, "parameter view requested before the arena was finalised");
  mark_updated();
  const auto& p = infos_.at(i);
  return flat(p.dtype).params.flat_view(static_cast<std::int64_t>(p.offset), shape_numel(p.shape)).reshape(p.shape);
}

Tensor ParamArena::grad(std::size_t i) const {
  RT_CHECK(finalized_, "gradient view requested before the arena was finalised");
  const auto& p = infos_.at(i);
  return flat(p.dtype).grads.flat_view(static_cast<std::int64_t>(p.offset), shape_numel(p.shape)).reshape(p.shape);
}

Tensor ParamArena::params_flat(DType dt) const {
  mark_updated();
  return flat(dt).params;
}
Tensor ParamArena::grads_flat(DType dt) const { return flat(dt).grads; }

std::vector<DType> ParamArena::dtypes() const {
  std::vector<DType> out;
  for (const auto& f : flats_) out.push_back(f.dtype);
  return out;
}

std::int64_t ParamArena::numel() const {
  std::int64_t n = 0;
  for (const auto& p : infos_) n += shape_numel(p.shape);
  return n;
}

void ParamArena::zero_grads() {
  for (auto& f : flats_) f.grads.zero_();
}

void ParamArena::set_reduce_over(std::size_t i, DimSet dims) {
  RT_CHECK(!finalized_, "parameter ", info(i).name, ": its reduce dimensions are set before the arena is finalised");
  infos_.at(i).reduce_over = dims;
}

std::vector<DimSet> ParamArena::reduce_sets() const {
  std::vector<DimSet> out;
  for (const ParamInfo& p : infos_)
    if (std::find(out.begin(), out.end(), p.reduce_over) == out.end()) out.push_back(p.reduce_over);
  std::sort(out.begin(), out.end());
  return out;
}

std::string DimSet::str() const {
  std::string s;
  for (int i = 0; i < kMeshDims; ++i)
    if (has(static_cast<Dim>(i))) s += std::string(s.empty() ? "" : " x ") + dim_name(static_cast<Dim>(i));
  return s.empty() ? "none" : s;
}

}  // namespace ringtrain
