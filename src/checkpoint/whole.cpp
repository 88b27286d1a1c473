// Whole tensors, for tools and tests: the sharded reader (read.hpp) with one
// target per stored tensor, its whole shape, replicated. There is no second
// reader: a one-file checkpoint, a manifest's parts and a part file read
// alone all go through the index, the verification and read_targets.
#include <utility>

#include "geometry.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/checkpoint/read.hpp"
#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {
namespace {

// NaN is data here: a tool may read a diverged checkpoint (find_intact_checkpoint refuses it).
constexpr VerifyScope kChecksumsOnly{true, false};

// Reads every target, adding it to `out` under its name.
void read_into(const CheckpointIndex& ix, std::vector<ReadTarget> targets, CheckpointData& out) {
  read_targets(ix, targets);
  for (auto& t : targets) out.tensors.emplace_back(std::move(t.name), std::move(t.dst));
}

CheckpointData whole_tensors(const CheckpointIndex& ix) {
  CheckpointData out = ix.head;
  out.parts.clear();  // whole tensors now: written back, it is one file
  std::vector<ReadTarget> targets;
  for (const StoredTensor& t : ix.tensors) targets.push_back({t.name, Tensor::empty(t.whole, t.dtype), {t.whole, {}, 0}});
  read_into(ix, std::move(targets), out);
  return out;
}

}  // namespace

CheckpointData read_checkpoint(const std::string& path) {
  const CheckpointIndex ix = read_checkpoint_index(path);
  verify_checkpoint(ix, kChecksumsOnly);
  return whole_tensors(ix);
}

CheckpointData read_checkpoint_file(const std::string& path) {
  const CheckpointIndex ix = ckpt_detail::index_file_as_stored(path);
  verify_checkpoint(ix, kChecksumsOnly);
  CheckpointData out = ix.head;
  const bool part = !out.part_of.empty();
  std::vector<ReadTarget> targets;
  for (const StoredPiece& p : ix.pieces) {
    targets.push_back({p.name, Tensor::empty(part ? Shape{p.numel} : p.place.whole, p.dtype), p.place});
    if (part) out.places.push_back(p.place);
  }
  read_into(ix, std::move(targets), out);
  return out;
}

void restore_tensor(const CheckpointData& ckpt, const std::string& name, Tensor dst) {
  for (const auto& [n, t] : ckpt.tensors) {
    if (n != name) continue;
    const bool same_shape = t.shape() == dst.shape() || (t.numel() == dst.numel() && t.shape().size() == 1 &&
                                                         dst.shape().size() <= 1);
    RT_CHECK(t.dtype() == dst.dtype() && same_shape, "checkpoint tensor '", name, "' is ", dtype_name(t.dtype()),
             " ", shape_str(t.shape()), ", but the model expects ", dtype_name(dst.dtype()), " ",
             shape_str(dst.shape()), " (was it written for another model?)");
    copy_bytes(dst.raw(), dst.device(), t.raw(), t.device(), t.nbytes());
    return;
  }
  RT_FAIL("checkpoint has no tensor '", name, "' (was it written for another model or optimizer?)");
}

namespace {

// The newest candidate under `path` for which `use` succeeds; the reasons of the newer ones in `skipped`.
FoundCheckpoint first_usable(const std::string& path, const std::function<CheckpointData(const std::string&)>& use) {
  FoundCheckpoint f;
  for (const auto& c : checkpoint_candidates(path)) {
    try {
      f.data = use(c);
      f.path = c;
      return f;
    } catch (const Error& e) {
      f.skipped.push_back(cat(c, ": ", e.what()));
    }
  }
  std::string all;
  for (auto& s : f.skipped) all += "\n  " + s;
  RT_FAIL("no usable checkpoint in '", path, "':", all);
}

}  // namespace

FoundCheckpoint find_intact_checkpoint(const std::string& path,
                                       const std::function<void(const CheckpointData&)>& accept) {
  return first_usable(path, [&](const std::string& c) {
    const CheckpointIndex ix = read_checkpoint_index(c);
    verify_checkpoint(ix);  // checksums, and no NaN or Inf in the state
    CheckpointData d = whole_tensors(ix);
    if (accept) accept(d);
    return d;
  });
}

FoundCheckpoint find_checkpoint_head(const std::string& path) {
  return first_usable(path, [](const std::string& c) { return read_checkpoint_index(c).head; });
}

}  // namespace ringtrain
