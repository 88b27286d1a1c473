#include "ringtrain/comm/named_tensors.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ringtrain/comm/bounded_wait.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/core/allocator.hpp"

namespace ringtrain {
namespace {

constexpr std::size_t kChunk = std::size_t{1} << 30;  // bytes per MPI call

void put(std::vector<char>& out, const void* p, std::size_t n) {
  const std::size_t at = out.size();
  out.resize(at + n);
  if (n) std::memcpy(out.data() + at, p, n);
}

std::int64_t take_i64(const std::vector<char>& in, std::size_t& at) {
  RT_CHECK(at + 8 <= in.size(), "named tensor stream truncated");
  std::int64_t v;
  std::memcpy(&v, in.data() + at, 8);
  at += 8;
  return v;
}

}  // namespace

std::vector<char> pack_named(const NamedTensors& ts) {
  std::vector<char> out;
  const std::int64_t n = static_cast<std::int64_t>(ts.size());
  put(out, &n, 8);
  for (const auto& [name, t] : ts) {
    std::vector<std::int64_t> head = {static_cast<std::int64_t>(name.size()), static_cast<std::int64_t>(t.dtype()),
                                      static_cast<std::int64_t>(t.shape().size())};
    head.insert(head.end(), t.shape().begin(), t.shape().end());
    put(out, head.data(), head.size() * 8);
    put(out, name.data(), name.size());
    const std::size_t at = out.size();
    out.resize(at + t.nbytes());
    if (t.nbytes()) copy_bytes(out.data() + at, Device::cpu(), t.raw(), t.device(), t.nbytes());
  }
  return out;
}

NamedTensors unpack_named(const std::vector<char>& in) {
  NamedTensors out;
  std::size_t at = 0;
  const std::int64_t n = take_i64(in, at);
  for (std::int64_t i = 0; i < n; ++i) {
    const std::int64_t len = take_i64(in, at), dt = take_i64(in, at), nd = take_i64(in, at);
    Shape s;
    for (std::int64_t d = 0; d < nd; ++d) s.push_back(take_i64(in, at));
    RT_CHECK(at + static_cast<std::size_t>(len) <= in.size(), "named tensor stream truncated");
    std::string name(in.data() + at, static_cast<std::size_t>(len));
    at += static_cast<std::size_t>(len);
    Tensor t = Tensor::empty(s, static_cast<DType>(dt));
    RT_CHECK(at + t.nbytes() <= in.size(), "named tensor stream truncated at '", name, "'");
    if (t.nbytes()) std::memcpy(t.raw(), in.data() + at, t.nbytes());
    at += t.nbytes();
    out.emplace_back(std::move(name), t);
  }
  return out;
}

// Tags of the length and the chunks (within the 32767 every MPI accepts: host_backend.hpp).
constexpr int kTagNamedLength = 7100, kTagNamedBytes = 7101;
static_assert(kTagNamedBytes <= kMaxMpiTag);

// Every transfer completes through wait_bounded (comm/bounded_wait.hpp): a
// one-file checkpoint whose sender or receiver stopped ends the job, named.
void send_named(const NamedTensors& ts, int to, const Communicator& comm) {
  const char* what = "sending checkpoint state";
  const WaitOn on(comm, what);
  const std::vector<char> bytes = pack_named(ts);
  std::int64_t n = static_cast<std::int64_t>(bytes.size());
  bounded::send(&n, 1, MPI_INT64_T, to, kTagNamedLength, on, what);
  for (std::size_t at = 0; at < bytes.size(); at += kChunk)
    bounded::send(bytes.data() + at, static_cast<int>(std::min(kChunk, bytes.size() - at)), MPI_BYTE, to,
                  kTagNamedBytes, on, what);
}

NamedTensors recv_named(int from, const Communicator& comm) {
  const char* what = "receiving checkpoint state";
  const WaitOn on(comm, what);
  std::int64_t n = 0;
  bounded::recv(&n, 1, MPI_INT64_T, from, kTagNamedLength, on, what);
  std::vector<char> bytes(static_cast<std::size_t>(n));
  for (std::size_t at = 0; at < bytes.size(); at += kChunk)
    bounded::recv(bytes.data() + at, static_cast<int>(std::min(kChunk, bytes.size() - at)), MPI_BYTE, from,
                  kTagNamedBytes, on, what);
  return unpack_named(bytes);
}

void broadcast_named(NamedTensors& ts, int root, const Communicator& comm) {
  if (comm.size() == 1) return;
  const char* what = "broadcasting checkpoint state";
  const WaitOn on(comm, what);
  std::vector<char> bytes;
  if (comm.rank() == root) bytes = pack_named(ts);
  std::int64_t n = static_cast<std::int64_t>(bytes.size());
  bounded::bcast(&n, 1, MPI_INT64_T, root, on, what);
  bytes.resize(static_cast<std::size_t>(n));
  for (std::size_t at = 0; at < bytes.size(); at += kChunk)
    bounded::bcast(bytes.data() + at, static_cast<int>(std::min(kChunk, bytes.size() - at)), MPI_BYTE, root, on, what);
  if (comm.rank() != root) ts = unpack_named(bytes);
}

}  // namespace ringtrain
