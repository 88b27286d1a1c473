// broadcast_tensors and verify_identical: the synchronous start-up/debug
// helpers. Both first agree on the tensor list's layout (count, dtypes,
// shapes) through a checksum min/max all-reduce so that a mismatch is an
// Error on every rank instead of a hang or silent corruption.
#include <cstring>
#include <sstream>
#include <vector>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/engine/engine.hpp"

namespace ringtrain {
namespace {

struct Fnv {
  std::uint64_t h = 1469598103934665603ull;
  void add(const void* p, std::size_t n) {
    auto* b = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  }
  template <typename T>
  void add(T v) { add(&v, sizeof v); }
};

// A 64-bit checksum of the bytes, 8 bytes at a time (FNV-1a is bytewise and
// slow on megabytes; this mixes words with a multiply-xorshift).
std::uint64_t content_hash(const void* p, std::size_t n) {
  auto* b = static_cast<const unsigned char*>(p);
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    std::uint64_t w;
    std::memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  }
  for (; i < n; ++i) h = (h ^ b[i]) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 29);
}

std::uint64_t layout_hash(const Tensor& t) {
  Fnv f;
  f.add(static_cast<int>(t.dtype()));
  for (auto d : t.shape()) f.add(d);
  f.add(static_cast<std::uint64_t>(t.ndim()));
  return f.h;
}

// min and max of each value across ranks, as (min[i], max[i]).
void minmax(std::vector<std::uint64_t>& v, std::vector<std::uint64_t>& mx, const WaitOn& c, const char* what) {
  mx = v;
  bounded::allreduce(v.data(), (int)v.size(), MPI_UINT64_T, MPI_MIN, c, what);
  bounded::allreduce(mx.data(), (int)mx.size(), MPI_UINT64_T, MPI_MAX, c, what);
}

std::string label(std::size_t i, const std::vector<std::string>& names) {
  return i < names.size() ? cat("'", names[i], "' (#", i, ")") : cat("#", i);
}

// Which ranks hold which value of `mine` (gathered), as "ranks 0,2: 1a2b; rank 1: 3c4d".
std::string who_holds(std::uint64_t mine, const WaitOn& c, int size, bool hex) {
  std::vector<std::uint64_t> all(size);
  bounded::allgather(&mine, 1, MPI_UINT64_T, all.data(), c, "gathering the ranks' tensor layouts");
  std::vector<std::pair<std::uint64_t, std::vector<int>>> groups;
  for (int r = 0; r < size; ++r) {
    auto it = groups.begin();
    while (it != groups.end() && it->first != all[r]) ++it;
    if (it == groups.end()) groups.push_back({all[r], {r}});
    else it->second.push_back(r);
  }
  std::string s;
  for (auto& [val, ranks] : groups) {
    s += s.empty() ? "" : "; ";
    s += ranks.size() == 1 ? "rank " : "ranks ";
    for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i) s += ',';
    s += std::to_string(ranks[i]);
  }
    std::ostringstream os;
    if (hex) os << std::hex;
    os << val;
    s += ": " + os.str();
  }
  return s;
}

// Checks that every rank passes the same number of tensors with the same
// dtypes and shapes; throws on every rank otherwise.
void check_layout(const std::vector<Tensor>& ts, const Communicator& comm, const char* what,
                  const std::vector<std::string>& names) {
  const WaitOn c(comm, what);
  std::vector<std::uint64_t> mn{ts.size()}, mx;
  minmax(mn, mx, c, what);
  if (mn[0] != mx[0])
    RT_FAIL(what, ": ranks pass different numbers of tensors (", who_holds(ts.size(), c, comm.size(), false), ")");
  std::vector<std::uint64_t> h(ts.size());
  for (std::size_t i = 0; i < ts.size(); ++i) {
    RT_CHECK(ts[i].defined(), what, ": tensor ", label(i, names), " is undefined");
    h[i] = layout_hash(ts[i]);
  }
  minmax(h, mx, c, what);
  for (std::size_t i = 0; i < ts.size(); ++i)
    if (h[i] != mx[i])
      RT_FAIL(what, ": tensor ", label(i, names), " has a different dtype or shape on different ranks (this rank: ",
              dtype_name(ts[i].dtype()), shape_str(ts[i].shape()), "; layout hash by rank: ",
              who_holds(layout_hash(ts[i]), c, comm.size(), true), ")");
}

}  // namespace

void broadcast_tensors(std::vector<Tensor>& tensors, int root, const Communicator& comm, const CollectiveOptions& opt) {
  RT_CHECK(root >= 0 && root < comm.size(), "broadcast_tensors: root ", root, " is not a rank of communicator '",
           comm.name(), "' (size ", comm.size(), ")");
  check_layout(tensors, comm, "broadcast_tensors", {});
  for (auto& t : tensors) {
    CollectiveOptions o = opt;
    o.device = t.device();
    broadcast(t.raw(), static_cast<std::size_t>(t.numel()), t.dtype(), root, comm, o);
  }
}

void verify_identical(const std::vector<Tensor>& tensors, const Communicator& comm,
                      const std::vector<std::string>& names) {
  check_layout(tensors, comm, "verify_identical", names);
  std::vector<std::uint64_t> h(tensors.size()), mx;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    Tensor host = tensors[i].device().is_cpu() ? tensors[i] : tensors[i].to(Device::cpu());
    h[i] = content_hash(host.raw(), host.nbytes());
  }
  std::vector<std::uint64_t> mine = h;
  const WaitOn on(comm, "verify_identical");
  minmax(h, mx, on, "verify_identical");
  for (std::size_t i = 0; i < tensors.size(); ++i)
    if (h[i] != mx[i])
      RT_FAIL("verify_identical: tensor ", label(i, names), " ", dtype_name(tensors[i].dtype()),
              shape_str(tensors[i].shape()), " differs across ranks (checksum by rank: ",
              who_holds(mine[i], on, comm.size(), true), ")");
}

}  // namespace ringtrain
