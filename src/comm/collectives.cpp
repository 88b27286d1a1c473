// The public collectives: argument checks, optional cross-rank validation,
// algorithm choice, then the algorithm over the host backend's primitives (or
// MPI's own collective for algorithm `mpi`).
#include "ringtrain/comm/collectives.hpp"

#include <cctype>
#include <cstdlib>
#include <numeric>
#include <span>

#include "mpi_collectives.hpp"
#include "ringtrain/comm/algorithms.hpp"
#include "ringtrain/comm/flight_recorder.hpp"
#include "ringtrain/comm/host_backend.hpp"
#include "ringtrain/comm/shm.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
  }
  return "?";
}

ReduceOp parse_op(const std::string& s) {
  if (s == "sum") return ReduceOp::sum;
  if (s == "avg" || s == "average" || s == "mean") return ReduceOp::avg;
  if (s == "min") return ReduceOp::min;
  if (s == "max") return ReduceOp::max;
  RT_FAIL("unknown reduction op '", s, "' (expected sum, avg, min or max)");
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::automatic: return "auto";
    case Algorithm::ring: return "ring";
    case Algorithm::tree: return "tree";
    case Algorithm::mpi: return "mpi";
    case Algorithm::shm: return "shm";
    case Algorithm::hierarchical: return "hierarchical";
  }
  return "?";
}

Algorithm parse_algorithm(const std::string& s) {
  if (s == "auto" || s == "automatic") return Algorithm::automatic;
  if (s == "ring") return Algorithm::ring;
  if (s == "tree") return Algorithm::tree;
  if (s == "mpi") return Algorithm::mpi;
  if (s == "shm") return Algorithm::shm;
  if (s == "hierarchical") return Algorithm::hierarchical;
  RT_FAIL("unknown collective algorithm '", s, "' (expected auto, ring, tree, mpi, shm or hierarchical)");
}

std::size_t parse_byte_size(const std::string& s, const char* what) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  RT_CHECK(!s.empty() && std::isdigit(static_cast<unsigned char>(s[0])) && errno == 0, what,
           ": expected a byte count like 4096, 64K, 1M or 2G, got '", s, "'");
  std::string suffix(end);
  unsigned long long mul = 1;
  if (suffix == "K" || suffix == "k" || suffix == "KiB") mul = 1ull << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") mul = 1ull << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") mul = 1ull << 30;
  else RT_CHECK(suffix.empty() || suffix == "B", what, ": unknown size suffix in '", s, "' (use K, M or G)");
  return static_cast<std::size_t>(v * mul);
}

long long effective_tree_threshold(const CollectiveOptions& opt) {
  return opt.tree_threshold >= 0 ? opt.tree_threshold : kDefaultTreeThreshold;
}

std::size_t effective_segment_bytes(const CollectiveOptions& opt) {
  const std::size_t s = opt.segment_bytes ? opt.segment_bytes : kDefaultSegmentBytes;
  RT_CHECK(s >= 64, "collective segment size must be at least 64 bytes, got ", s);
  return s;
}

Algorithm choose_algorithm(std::size_t bytes, int ranks, const CollectiveOptions& opt, int nodes, int max_local) {
  if (opt.algorithm != Algorithm::automatic) return opt.algorithm;
  if (ranks <= 1) return Algorithm::ring;  // a local copy either way
  if (max_local > 1) return nodes == 1 ? Algorithm::shm : Algorithm::hierarchical;
  return static_cast<long long>(bytes) <= effective_tree_threshold(opt) ? Algorithm::tree : Algorithm::ring;
}

namespace {

// One collective call: the communicator's facts and the problems found locally.
struct Call {
  const char* what;
  MPI_Comm comm;
  int rank, size;
  const std::string& comm_name;
  double timeout_s;
  HostCommContext& ctx;
  std::string error;  // first local argument error, "" if none

  Call(const char* w, const Communicator& c, const CollectiveOptions& opt)
      : what(w), comm(c.handle(w)), rank(c.rank()), size(c.size()), comm_name(c.name()), timeout_s(c.timeout_s()),
        ctx(host_context(comm, c.local_size())) {
    RT_CHECK(opt.device.is_cpu(), what, ": buffers on ", opt.device.str(),
             " need the device collectives of the CUDA backend; these are host collectives");
  }
  WaitOn wait_on() const { return WaitOn(comm, timeout_s, comm_name); }
  void fail_if(bool bad, const std::string& msg) {
    if (bad && error.empty()) error = cat(what, ": ", msg);
  }
  void check_dtype_op(DType dtype, const ReduceOp* op) {
    fail_if(static_cast<unsigned>(dtype) > static_cast<unsigned>(DType::u8),
            cat("invalid dtype value ", static_cast<int>(dtype)));
    if (op) fail_if(static_cast<unsigned>(*op) > static_cast<unsigned>(ReduceOp::max),
                    cat("invalid op value ", static_cast<int>(*op)));
  }
  void check_buffer(const void* p, std::size_t count, const char* name) {
    fail_if(p == nullptr && count > 0, cat(name, " buffer is null with count ", count));
  }
  // send and recv either have the in-place layout or do not overlap at all.
  void check_alias(const void* s, std::size_t sbytes, const void* r, std::size_t rbytes, bool in_place) {
    auto* a = static_cast<const char*>(s);
    auto* b = static_cast<const char*>(r);
    bool overlap = a && b && sbytes && rbytes && a < b + rbytes && b < a + sbytes;
    fail_if(overlap && !in_place,
            "send and recv buffers overlap without being the in-place layout (send must equal recv, or be disjoint)");
  }
};

struct Field {
  const char* name;
  long long value;
  enum Kind { number, dtype, op, algorithm } kind = number;
};

std::string show(const Field& f, long long v) {
  switch (f.kind) {
    case Field::dtype: return dtype_name(static_cast<DType>(v));
    case Field::op: return op_name(static_cast<ReduceOp>(v));
    case Field::algorithm: return algorithm_name(static_cast<Algorithm>(v));
    default: return std::to_string(v);
  }
}

// Local errors first: alone, or (validate) on every rank together with a check
// that all ranks agree on `fields`.
void settle(Call& c, bool validate, std::span<const Field> fields) {
  if (!validate) {
    if (!c.error.empty()) throw Error(c.error);
    return;
  }
  std::size_t k = fields.size();
  std::vector<long long> v(2 * k + 1);
  for (std::size_t i = 0; i < k; ++i) {
    v[i] = fields[i].value;
    v[k + i] = -fields[i].value;
  }
  v[2 * k] = c.error.empty() ? c.size : c.rank;
  bounded::allreduce(v.data(), static_cast<int>(v.size()), MPI_LONG_LONG, MPI_MIN, c.wait_on(), c.what);
  if (!c.error.empty()) throw Error(c.error);
  RT_CHECK(v[2 * k] >= c.size, c.what, ": rank ", v[2 * k], " of communicator '", c.comm_name,
           "' passed invalid arguments (its error says which)");
  for (std::size_t i = 0; i < k; ++i) {
    long long lo = v[i], hi = -v[k + i];
    RT_CHECK(lo == hi, c.what, ": ", fields[i].name, " differs between ranks of communicator '", c.comm_name,
             "' (this rank: ", show(fields[i], fields[i].value), ", min ", show(fields[i], lo), ", max ",
             show(fields[i], hi), ")");
  }
}

std::size_t segment_of(const Call& c, const CollectiveOptions& opt) {
  std::size_t s = opt.segment_bytes ? opt.segment_bytes : kDefaultSegmentBytes;
  RT_CHECK(s >= 64, c.what, ": segment size must be at least 64 bytes, got ", s);
  return s;
}
Algorithm algorithm_of(const Call& c, std::size_t bytes, const CollectiveOptions& opt) {
  if (opt.algorithm != Algorithm::automatic) return opt.algorithm;
  if (c.size <= 1) return Algorithm::ring;
  return static_cast<long long>(bytes) <= effective_tree_threshold(opt) ? Algorithm::tree : Algorithm::ring;
}

Primitives::Config config(const Call& c, DType dtype, ReduceOp op, const CollectiveOptions& opt) {
  Primitives::Config cfg;
  cfg.dtype = dtype;
  cfg.op = op;
  cfg.segment_bytes = segment_of(c, opt);
  return cfg;
}

// Runs `algo(P)` over the host backend on the call's communicator.
template <typename F>
void run(const Call& c, int tag, const Primitives::Config& cfg, F&& algo) {
  MpiTransport t(c.comm, tag, c.what, c.comm_name.c_str(), c.timeout_s, c.ctx.spin_s);
  CpuReducer red;
  Primitives P(t, red, c.ctx.workspace, cfg);
  algo(P);
}

std::vector<std::size_t> prefix(const std::vector<std::size_t>& counts) {
  std::vector<std::size_t> off(counts.size() + 1, 0);
  std::partial_sum(counts.begin(), counts.end(), off.begin() + 1);
  return off;
}

}  // namespace

void allreduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, const Communicator& comm,
               const CollectiveOptions& opt) {
  if (!opt.device.is_cpu()) return device_collectives(opt.device, "allreduce").allreduce(send, recv, count, dtype, op, comm, opt);
  Call c("allreduce", comm, opt);
  flight_recorder::Op rec(c.comm, c.comm_name, c.what, count * dtype_size(dtype));
  c.check_dtype_op(dtype, &op);
  c.check_buffer(send, count, "send");
  c.check_buffer(recv, count, "recv");
  std::size_t bytes = count * dtype_size(dtype);
  c.check_alias(send, bytes, recv, bytes, send == recv);
  Algorithm algo = algorithm_of(c, bytes, opt);
  // Node-aware choice (comm/shm.hpp): shared memory whenever ranks share a node.
  if (opt.algorithm == Algorithm::automatic && c.size > 1 && comm.max_local_size() > 1)
    algo = comm.node_count() == 1 ? Algorithm::shm : Algorithm::hierarchical;
  c.fail_if(algo == Algorithm::shm && comm.node_count() > 1,
            cat("algorithm shm needs every rank of communicator '", c.comm_name, "' on one node, but it spans ",
                comm.node_count(), " nodes (use hierarchical or auto)"));
  auto cfg = config(c, dtype, op, opt);
  const Field fields[] = {{"count", static_cast<long long>(count)},
                          {"dtype", static_cast<long long>(dtype), Field::dtype},
                          {"op", static_cast<long long>(op), Field::op},
                          {"algorithm", static_cast<long long>(algo), Field::algorithm},
                          {"segment bytes", static_cast<long long>(cfg.segment_bytes)}};
  settle(c, opt.validate, fields);
  if (count == 0) return;
  if (c.size == 1) {
    CpuReducer().copy(recv, send, bytes);  // avg over one rank divides by 1
    return;
  }
  int divisor = op == ReduceOp::avg ? c.size : 1;
  switch (algo) {
    case Algorithm::mpi: mpi_impl::allreduce(send, recv, count, dtype, op, c.wait_on(), c.what); break;
    case Algorithm::shm: shm_allreduce(send, recv, count, dtype, op, comm, opt); break;
    case Algorithm::hierarchical: hierarchical_allreduce(send, recv, count, dtype, op, comm, opt); break;
    case Algorithm::tree:
      run(c, kTagTree, cfg, [&](Primitives& P) { tree_allreduce(P, send, recv, count, divisor); });
      break;
    default: run(c, kTagRing, cfg, [&](Primitives& P) { ring_allreduce(P, send, recv, count, divisor); });
  }
}

void broadcast(void* buf, std::size_t count, DType dtype, int root, const Communicator& comm,
               const CollectiveOptions& opt) {
  if (!opt.device.is_cpu()) return device_collectives(opt.device, "broadcast").broadcast(buf, count, dtype, root, comm, opt);
  Call c("broadcast", comm, opt);
  flight_recorder::Op rec(c.comm, c.comm_name, c.what, count * dtype_size(dtype));
  c.check_dtype_op(dtype, nullptr);
  c.check_buffer(buf, count, "data");
  c.fail_if(root < 0 || root >= c.size, cat("root ", root, " is not a rank of communicator '", c.comm_name,
                                            "' (size ", c.size, ")"));
  std::size_t bytes = count * dtype_size(dtype);
  Algorithm algo = algorithm_of(c, bytes, opt);
  auto cfg = config(c, dtype, ReduceOp::sum, opt);
  const Field fields[] = {{"count", static_cast<long long>(count)},
                          {"dtype", static_cast<long long>(dtype), Field::dtype},
                          {"root", root},
                          {"algorithm", static_cast<long long>(algo), Field::algorithm},
                          {"segment bytes", static_cast<long long>(cfg.segment_bytes)}};
  settle(c, opt.validate, fields);
  if (count == 0 || c.size == 1) return;
  if (algo == Algorithm::mpi) return mpi_impl::broadcast(buf, count, dtype, root, c.wait_on(), c.what);
  run(c, kTagBroadcast, cfg, [&](Primitives& P) {
    if (algo == Algorithm::tree) binomial_broadcast(P, buf, count, root);
    else chain_broadcast(P, buf, count, root);
  });
}

namespace {

void gather_impl(const char* what, const void* send, void* recv, const std::vector<std::size_t>& counts,
                 DType dtype, const Communicator& comm, const CollectiveOptions& opt) {
  Call c(what, comm, opt);
  flight_recorder::Op rec(c.comm, c.comm_name, c.what,
                          std::accumulate(counts.begin(), counts.end(), std::size_t{0}) * dtype_size(dtype));
  c.check_dtype_op(dtype, nullptr);
  bool sized = static_cast<int>(counts.size()) == c.size;
  c.fail_if(!sized, cat("counts has ", counts.size(), " entries for ", c.size, " ranks"));
  std::vector<Field> fields{{"dtype", static_cast<long long>(dtype), Field::dtype},
                            {"algorithm", static_cast<long long>(opt.algorithm), Field::algorithm}};
  std::size_t es = dtype_size(dtype);
  std::vector<std::size_t> off;
  if (sized) {
    off = prefix(counts);
    c.check_buffer(send, counts[c.rank], "send");
    c.check_buffer(recv, off.back(), "recv");
    c.check_alias(send, counts[c.rank] * es, recv, off.back() * es,
                  send == static_cast<const char*>(recv) + off[c.rank] * es);
    for (int i = 0; i < c.size; ++i) fields.push_back({"counts[i]", static_cast<long long>(counts[i])});
  }
  settle(c, opt.validate, fields);
  if (off.back() == 0) return;
  char* mine = static_cast<char*>(recv) + off[c.rank] * es;
  if (opt.algorithm == Algorithm::mpi && c.size > 1)
    return mpi_impl::allgatherv(send, recv, counts, dtype, c.wait_on(), c.what);
  CpuReducer().copy(mine, send, counts[c.rank] * es);
  if (c.size == 1) return;
  // All-gather has nothing to combine, so the ring (bandwidth-optimal) serves every size.
  run(c, kTagAllgather, config(c, dtype, ReduceOp::sum, opt), [&](Primitives& P) { ring_allgatherv(P, recv, counts); });
}

}  // namespace

void allgatherv(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                const Communicator& comm, const CollectiveOptions& opt) {
  if (!opt.device.is_cpu())
    return device_collectives(opt.device, "allgatherv").allgatherv(send, recv, counts, dtype, comm, opt);
  gather_impl("allgatherv", send, recv, counts, dtype, comm, opt);
}

void allgather(const void* send, std::size_t count, void* recv, DType dtype, const Communicator& comm,
               const CollectiveOptions& opt) {
  comm.handle("allgather");  // a closed communicator fails here, naming allgather
  int p = comm.size();
  if (!opt.device.is_cpu())
    return device_collectives(opt.device, "allgather")
        .allgatherv(send, recv, std::vector<std::size_t>(p, count), dtype, comm, opt);
  gather_impl("allgather", send, recv, std::vector<std::size_t>(p, count), dtype, comm, opt);
}

void reduce_scatter(const void* send, void* recv, const std::vector<std::size_t>& counts, DType dtype,
                    ReduceOp op, const Communicator& comm, const CollectiveOptions& opt) {
  if (!opt.device.is_cpu())
    return device_collectives(opt.device, "reduce_scatter").reduce_scatter(send, recv, counts, dtype, op, comm, opt);
  Call c("reduce_scatter", comm, opt);
  flight_recorder::Op rec(c.comm, c.comm_name, c.what,
                          std::accumulate(counts.begin(), counts.end(), std::size_t{0}) * dtype_size(dtype));
  c.check_dtype_op(dtype, &op);
  bool sized = static_cast<int>(counts.size()) == c.size;
  c.fail_if(!sized, cat("counts has ", counts.size(), " entries for ", c.size, " ranks"));
  std::vector<Field> fields{{"dtype", static_cast<long long>(dtype), Field::dtype},
                            {"op", static_cast<long long>(op), Field::op},
                            {"algorithm", static_cast<long long>(opt.algorithm), Field::algorithm}};
  std::size_t es = dtype_size(dtype);
  std::vector<std::size_t> off;
  if (sized) {
    off = prefix(counts);
    c.check_buffer(send, off.back(), "send");
    c.check_buffer(recv, counts[c.rank], "recv");
    c.check_alias(send, off.back() * es, recv, counts[c.rank] * es,
                  recv == static_cast<const char*>(send) + off[c.rank] * es);
    for (int i = 0; i < c.size; ++i) fields.push_back({"counts[i]", static_cast<long long>(counts[i])});
  }
  settle(c, opt.validate, fields);
  if (off.back() == 0) return;
  int divisor = op == ReduceOp::avg ? c.size : 1;
  if (c.size == 1) return CpuReducer().copy(recv, send, counts[0] * es);
  if (opt.algorithm == Algorithm::mpi) return mpi_impl::reduce_scatter(send, recv, counts, dtype, op, c.wait_on(), c.what);
  run(c, kTagReduceScatter, config(c, dtype, op, opt),
      [&](Primitives& P) { ring_reduce_scatter(P, send, recv, counts, divisor); });
}

}  // namespace ringtrain
