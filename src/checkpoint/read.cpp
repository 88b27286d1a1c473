// The sharded read (checkpoint_read.hpp, steps 2 and 3): every stored piece
// verified whole by one rank; each rank's targets filled with pread from the
// byte ranges of the pieces that overlap them.
#include "ringtrain/checkpoint/read.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <zlib.h>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/data/schema.hpp"
#include "geometry.hpp"
#include "h5.hpp"

namespace ringtrain {
namespace {

using ckpt_detail::PartGeometry;
using ckpt_detail::piece_where;

// The files of one read, opened on first use and closed at the end.
class Files {
 public:
  explicit Files(const CheckpointIndex& ix) : ix_(ix), fds_(ix.files.size(), -1) {}
  ~Files() {
    for (int fd : fds_)
      if (fd >= 0) ::close(fd);
  }
  Files(const Files&) = delete;
  Files& operator=(const Files&) = delete;

  // n bytes at `offset` of file k into dst; `what` names the piece in errors.
  void read(int k, std::int64_t offset, void* dst, std::size_t n, const std::string& what) {
    int& fd = fds_[static_cast<std::size_t>(k)];
    const std::string& path = ix_.files[static_cast<std::size_t>(k)];
    if (fd < 0) {
      fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      RT_CHECK(fd >= 0, what, ": cannot open '", path, "': ", std::strerror(errno));
    }
    char* p = static_cast<char*>(dst);
    while (n > 0) {
      const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      RT_CHECK(r > 0, what, ": ", r < 0 ? cat("reading '", path, "' failed: ", std::strerror(errno))
                                        : cat("'", path, "' ends before the tensor's data (truncated?)"));
      p += r;
      n -= static_cast<std::size_t>(r);
      offset += r;
    }
  }

 private:
  const CheckpointIndex& ix_;
  std::vector<int> fds_;
};

// A piece that pread cannot reach (checkpoint_h5.hpp's DatasetInfo::offset): whole, through HDF5.
Tensor read_through_hdf5(const CheckpointIndex& ix, const StoredPiece& p, const std::string& what) {
  using namespace ckpt_h5;
  std::lock_guard lock(data::hdf5_mutex());
  H5 file = open_checkpoint(ix.files[static_cast<std::size_t>(p.file)]);
  H5 ds(H5Dopen2(file, ("tensors/" + p.name).c_str(), H5P_DEFAULT), H5Dclose);
  RT_CHECK(ds.id >= 0, what, ": cannot open it");
  Tensor t = Tensor::empty({p.numel}, p.dtype);
  if (p.numel)
    RT_CHECK(H5Dread(ds, h5_type(p.dtype), H5S_ALL, H5S_ALL, H5P_DEFAULT, t.raw()) >= 0, what,
             ": cannot read it (truncated file?)");
  return t;
}

bool starts(const std::string& name, const char* prefix) { return name.rfind(prefix, 0) == 0; }

bool checked_for_finite(const StoredPiece& p) {
  return ckpt_detail::is_float(p.dtype) &&
         (starts(p.name, "param/") || starts(p.name, "buffer/") || starts(p.name, "optim/"));
}

// A weights-only load (eval, generate) reads only the model's tensors.
bool in_scope(const StoredPiece& p, const VerifyScope& scope) {
  return scope.optimizer || starts(p.name, "param/") || starts(p.name, "buffer/");
}

// The CRC-32 and the first non-finite element (-1: none) of n bytes of dtype dt.
struct Scan {
  std::uint32_t crc = 0;
  std::int64_t bad = -1;
};
// In blocks of 256 KiB: the finiteness scan reads what the CRC just brought into cache.
Scan scan(const char* data, std::size_t n, DType dt, bool finite) {
  constexpr std::size_t kBlock = std::size_t{1} << 18;
  const std::size_t esz = dtype_size(dt);
  Scan r;
  for (std::size_t at = 0; at < n; at += kBlock) {
    const std::size_t m = std::min(kBlock, n - at);
    r.crc = crc32(data + at, m, r.crc);
    if (finite && r.bad < 0) {
      const std::int64_t i = ckpt_detail::first_non_finite(data + at, static_cast<std::int64_t>(m / esz), dt);
      if (i >= 0) r.bad = static_cast<std::int64_t>(at / esz) + i;
    }
  }
  return r;
}

// Checks piece p's bytes as they pass, in order: its CRC-32, then no NaN or Inf in float state.
class PieceCheck {
 public:
  PieceCheck(const CheckpointIndex& ix, const StoredPiece& p, bool check_finite)
      : ix_(ix), p_(p), esz_(dtype_size(p.dtype)), finite_(check_finite && checked_for_finite(p)) {}
  void add(const char* data, std::size_t n) { merge(scan(data, n, p_.dtype, finite_), n); }
  // n bytes at `data` in memory at once: from 4 MiB on, their second half scanned by a second
  // thread (zlib's crc32_combine joins the halves), so a large tensor's check takes half as long
  // where a core is free.
  void add_whole(const char* data, std::size_t n) {
    constexpr std::size_t kSplit = std::size_t{4} << 20;  // 2 ms of CRC: a thread costs ~0.05
    if (n < kSplit) return add(data, n);
    const std::size_t half = n / 2 / esz_ * esz_;
    Scan second;
    std::thread helper([&] { second = scan(data + half, n - half, p_.dtype, finite_); });
    Scan first;
    try {
      first = scan(data, half, p_.dtype, finite_);
    } catch (...) {
      helper.join();
      throw;
    }
    helper.join();
    merge(first, half);
    merge(second, n - half);
  }
  void finish() const {
    RT_CHECK(crc_ == p_.crc, piece_where(ix_, p_), " fails its checksum (crc32 ", crc_, ", stored ", p_.crc,
             "): the file is corrupt");
    RT_CHECK(bad_ < 0, "checkpoint '", ix_.path, "': tensor '", p_.name, "' holds NaN or Inf (element ",
             PartGeometry::of(p_.place).to_whole(p_.place.begin + bad_),
             "): the run had diverged when it was written; resume from an earlier checkpoint");
  }

 private:
  // The scan of the next n bytes.
  void merge(const Scan& s, std::size_t n) {
    crc_ = seen_ ? static_cast<std::uint32_t>(::crc32_combine(crc_, s.crc, static_cast<z_off_t>(n))) : s.crc;
    if (bad_ < 0 && s.bad >= 0) bad_ = static_cast<std::int64_t>(seen_ / esz_) + s.bad;
    seen_ += n;
  }

  const CheckpointIndex& ix_;
  const StoredPiece& p_;
  std::size_t esz_, seen_ = 0;
  bool finite_;
  std::uint32_t crc_ = 0;
  std::int64_t bad_ = -1;  // the first non-finite element of the piece
};

// Reads piece p whole, in chunks of `buf`, and checks it.
void verify_piece(const CheckpointIndex& ix, const StoredPiece& p, Files& files, std::vector<char>& buf,
                  CheckpointReadStats& st, bool check_finite) {
  const std::string what = piece_where(ix, p);
  const std::size_t bytes = static_cast<std::size_t>(p.numel) * dtype_size(p.dtype);
  PieceCheck check(ix, p, check_finite);
  if (p.offset < 0) {
    const Tensor t = read_through_hdf5(ix, p, what);
    ++st.reads;
    check.add(static_cast<const char*>(t.raw()), bytes);
  } else {
    for (std::size_t at = 0; at < bytes; at += buf.size()) {
      const std::size_t n = std::min(buf.size(), bytes - at);
      files.read(p.file, p.offset + static_cast<std::int64_t>(at), buf.data(), n, what);
      ++st.reads;
      check.add(buf.data(), n);
    }
  }
  st.verified_bytes += bytes;
  check.finish();
}

// Rank `rank` of `size` verifies the pieces in scope whose middle byte falls
// in its equal share of their bytes, in file order.
CheckpointReadStats verify_share(const CheckpointIndex& ix, int rank, int size, const VerifyScope& scope) {
  CheckpointReadStats st;
  unsigned long long total = 0;
  std::size_t largest = 0;
  for (const auto& p : ix.pieces) {
    if (!in_scope(p, scope)) continue;
    total += static_cast<unsigned long long>(p.numel) * dtype_size(p.dtype);
    largest = std::max(largest, static_cast<std::size_t>(p.numel) * dtype_size(p.dtype));
  }
  // 1 MiB: large reads, few fresh pages (a page fault costs ~20 us on some VMs).
  std::vector<char> buf(std::max<std::size_t>(8, std::min<std::size_t>(largest, std::size_t{1} << 20)));
  Files files(ix);
  unsigned long long at = 0;
  for (const auto& p : ix.pieces) {
    if (!in_scope(p, scope)) continue;
    const unsigned long long b = static_cast<unsigned long long>(p.numel) * dtype_size(p.dtype);
    const unsigned long long mid = at + b / 2;
    at += b;
    const int owner = total ? static_cast<int>(std::min<unsigned long long>(size - 1, mid * size / total)) : 0;
    if (owner == rank) verify_piece(ix, p, files, buf, st, scope.finite);
  }
  return st;
}

}  // namespace

CheckpointReadStats verify_checkpoint(const CheckpointIndex& ix, const Communicator& comm, const VerifyScope& scope) {
  CheckpointReadStats st;
  run_agreed(comm, "verifying the checkpoint", [&] { st = verify_share(ix, comm.rank(), comm.size(), scope); });
  return st;
}

CheckpointReadStats verify_checkpoint(const CheckpointIndex& ix, const VerifyScope& scope) {
  return verify_share(ix, 0, 1, scope);
}

std::ptrdiff_t find_target(const CheckpointIndex& ix, const ReadTarget& t) {
  const auto it = ix.tensor_at.find(t.name);
  if (it == ix.tensor_at.end()) {
    RT_CHECK(t.optional, "checkpoint '", ix.path, "' has no tensor '", t.name,
             "' (was it written for another model or optimizer?)");
    return -1;
  }
  const StoredTensor& s = ix.tensors[it->second];
  const Shape& want = t.place.whole;
  const bool same = s.whole == want || (shape_numel(s.whole) == shape_numel(want) && s.whole.size() == 1 &&
                                        want.size() <= 1);  // a [1] tensor wanted as a scalar
  RT_CHECK(s.dtype == t.dst.dtype() && same, "checkpoint '", ix.path, "': tensor '", t.name, "' is ",
           dtype_name(s.dtype), " ", shape_str(s.whole), ", but this model has ", dtype_name(t.dst.dtype()), " ",
           shape_str(want), " (was it written for another model?)");
  return static_cast<std::ptrdiff_t>(it->second);
}

CheckpointReadStats read_targets(const CheckpointIndex& ix, std::vector<ReadTarget>& targets) {
  std::vector<std::vector<std::size_t>> pieces_of(ix.tensors.size());
  for (std::size_t i = 0; i < ix.pieces.size(); ++i) pieces_of[ix.tensor_at.at(ix.pieces[i].name)].push_back(i);

  // What to read of each piece: byte ranges (from its start) into target memory.
  struct Copy {
    std::int64_t src;
    char* dst;
    std::int64_t bytes;
  };
  std::vector<std::vector<Copy>> copies(ix.pieces.size());
  for (ReadTarget& t : targets) {
    t.found = false;
    const std::ptrdiff_t k = find_target(ix, t);
    if (k < 0) continue;
    const StoredTensor& s = ix.tensors[static_cast<std::size_t>(k)];
    RT_CHECK(t.dst.device().is_cpu(), "checkpoint '", ix.path, "': tensor '", t.name,
             "' must be read into host memory");
    const std::int64_t n = t.dst.numel(), t0 = t.place.begin;
    const PartGeometry T = PartGeometry::of(t.place);
    RT_CHECK(t0 >= 0 && t0 + n <= T.numel, "checkpoint '", ix.path, "': tensor '", t.name, "': elements ", t0, "..",
             t0 + n, " are not in this rank's part of ", T.numel);
    const std::int64_t esz = static_cast<std::int64_t>(dtype_size(s.dtype));
    char* dst = static_cast<char*>(t.dst.raw());
    std::int64_t covered = 0;
    for (std::size_t i : pieces_of[static_cast<std::size_t>(k)]) {
      const StoredPiece& p = ix.pieces[i];
      auto add = [&](std::int64_t from, std::int64_t to, std::int64_t len) {
        copies[i].push_back({from * esz, dst + to * esz, len * esz});
        covered += len;
      };
      if (ckpt_detail::same_part(p.place, t.place)) {  // the layout did not change: one range
        const std::int64_t lo = std::max(p.place.begin, t0), hi = std::min(p.place.begin + p.numel, t0 + n);
        if (lo < hi) add(lo - p.place.begin, lo - t0, hi - lo);
      } else {
        ckpt_detail::for_each_overlap(PartGeometry::of(p.place), p.place.begin, p.numel, T, t0, n, add);
      }
    }
    RT_CHECK(covered == n, "checkpoint '", ix.path, "': tensor '", t.name, "': its pieces hold ", covered, " of the ",
             n, " elements this rank restores");
    t.found = true;
  }

  // Piece by piece in file order; ranges adjacent in the file and in memory become one read.
  CheckpointReadStats st;
  Files files(ix);
  for (std::size_t i = 0; i < ix.pieces.size(); ++i) {
    auto& cs = copies[i];
    if (cs.empty()) continue;
    const StoredPiece& p = ix.pieces[i];
    const std::string what = piece_where(ix, p);
    if (p.offset < 0) {
      const Tensor whole = read_through_hdf5(ix, p, what);
      ++st.reads;
      for (const Copy& c : cs) {
        std::memcpy(c.dst, static_cast<const char*>(whole.raw()) + c.src, static_cast<std::size_t>(c.bytes));
        st.restored_bytes += static_cast<std::size_t>(c.bytes);
      }
      continue;
    }
    std::sort(cs.begin(), cs.end(), [](const Copy& a, const Copy& b) { return a.src < b.src; });
    for (std::size_t j = 0; j < cs.size();) {
      Copy c = cs[j++];
      while (j < cs.size() && cs[j].src == c.src + c.bytes && cs[j].dst == c.dst + c.bytes) c.bytes += cs[j++].bytes;
      files.read(p.file, p.offset + c.src, c.dst, static_cast<std::size_t>(c.bytes), what);
      ++st.reads;
      st.restored_bytes += static_cast<std::size_t>(c.bytes);
    }
  }
  return st;
}

MappedCheckpoint::MappedCheckpoint(const CheckpointIndex& ix)
    : ix_(ix), maps_(ix.files.size(), {nullptr, 0}), pieces_of_(ix.tensors.size()) {
  for (std::size_t i = 0; i < ix.pieces.size(); ++i) pieces_of_[ix.tensor_at.at(ix.pieces[i].name)].push_back(i);
}

MappedCheckpoint::~MappedCheckpoint() {
  for (auto& [addr, len] : maps_)
    if (addr) ::munmap(addr, len);
}

const char* MappedCheckpoint::piece_bytes(const StoredPiece& p, std::vector<char>& tmp) {
  const std::string what = piece_where(ix_, p);
  const std::size_t bytes = static_cast<std::size_t>(p.numel) * dtype_size(p.dtype);
  const char* data = nullptr;
  if (p.offset < 0) {
    const Tensor t = read_through_hdf5(ix_, p, what);
    tmp.assign(static_cast<const char*>(t.raw()), static_cast<const char*>(t.raw()) + bytes);
    data = tmp.data();
  } else {
    auto& [addr, len] = maps_[static_cast<std::size_t>(p.file)];
    const std::string& path = ix_.files[static_cast<std::size_t>(p.file)];
    if (!addr) {
      const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
      RT_CHECK(fd >= 0, what, ": cannot open '", path, "': ", std::strerror(errno));
      struct stat sb {};
      const bool sized = ::fstat(fd, &sb) == 0;
      len = sized ? static_cast<std::size_t>(sb.st_size) : 0;
      void* m = len ? ::mmap(nullptr, len, PROT_READ, MAP_SHARED, fd, 0) : MAP_FAILED;
      const int err = errno;
      ::close(fd);
      RT_CHECK(m != MAP_FAILED, what, ": cannot map '", path, "': ", len ? std::strerror(err) : "the file is empty");
      addr = m;
      ::madvise(addr, len, MADV_SEQUENTIAL);  // a hint: read ahead, drop behind
    }
    RT_CHECK(static_cast<std::size_t>(p.offset) + bytes <= len, what, ": '", path,
             "' ends before the tensor's data (truncated?)");
    data = static_cast<const char*>(addr) + p.offset;
  }
  PieceCheck check(ix_, p, true);
  check.add_whole(data, bytes);
  check.finish();
  ++st_.reads;
  st_.verified_bytes += bytes;
  return data;
}

const void* MappedCheckpoint::whole(std::size_t k, std::vector<char>& scratch) {
  const StoredTensor& s = ix_.tensors[k];
  const std::vector<std::size_t>& ps = pieces_of_[k];
  const std::size_t esz = dtype_size(s.dtype);
  const std::int64_t n = shape_numel(s.whole);
  if (ps.size() == 1) {  // a one-file checkpoint: the tensor as stored, no copy
    const StoredPiece& p = ix_.pieces[ps[0]];
    if (!p.place.shard.sharded() && p.place.begin == 0 && p.numel == n && p.offset >= 0) {
      st_.restored_bytes += static_cast<std::size_t>(n) * esz;
      return piece_bytes(p, scratch);
    }
  }
  scratch.resize(static_cast<std::size_t>(n) * esz);
  const PartGeometry W = PartGeometry::of(PiecePlace{s.whole, {}, 0});
  std::int64_t covered = 0;
  std::vector<char> tmp;
  for (std::size_t i : ps) {
    const StoredPiece& p = ix_.pieces[i];
    const char* d = piece_bytes(p, tmp);
    ckpt_detail::for_each_overlap(PartGeometry::of(p.place), p.place.begin, p.numel, W, 0, n,
                                  [&](std::int64_t from, std::int64_t to, std::int64_t len) {
                                    std::memcpy(scratch.data() + to * esz, d + from * esz, len * esz);
                                    covered += len;
                                  });
  }
  RT_CHECK(covered == n, "checkpoint '", ix_.path, "': tensor '", s.name, "': its pieces hold ", covered, " of its ",
           n, " elements");
  st_.restored_bytes += static_cast<std::size_t>(n) * esz;
  return scratch.data();
}

}  // namespace ringtrain
