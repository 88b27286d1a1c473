// safetensors reader and writer (interop/safetensors.hpp).
#include "ringtrain/interop/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>

#include "ringtrain/core/error.hpp"

namespace ringtrain::safetensors {
namespace {

using json = nlohmann::json;

const std::pair<const char*, DType> kCodes[] = {{"F32", DType::f32}, {"F64", DType::f64}, {"F16", DType::f16},
                                                {"BF16", DType::bf16}, {"I32", DType::i32}, {"I64", DType::i64},
                                                {"U8", DType::u8}};

void pread_all(int fd, const std::string& path, std::int64_t offset, void* dst, std::size_t n,
               const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    RT_CHECK(r > 0, "safetensors file '", path, "': ", what, ": ",
             r < 0 ? cat("read failed: ", std::strerror(errno)) : std::string("the file ends early (truncated?)"));
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
}

std::int64_t nonneg_int(const json& v, const std::string& where) {
  RT_CHECK(v.is_number_integer() && v.get<std::int64_t>() >= 0, where, " must be a non-negative integer, got ",
           v.dump());
  return v.get<std::int64_t>();
}

}  // namespace

const char* dtype_code(DType dt) {
  for (const auto& [code, d] : kCodes)
    if (d == dt) return code;
  RT_FAIL("safetensors: dtype ", dtype_name(dt), " has no code");
}

DType dtype_of_code(const std::string& code, const std::string& what) {
  for (const auto& [c, d] : kCodes)
    if (code == c) return d;
  RT_FAIL(what, ": dtype \"", code, "\" is not supported (F32, BF16, F16, F64, I32, I64, U8)");
}

Reader::Reader(const std::string& path) : path_(path) {
  const std::string file = cat("safetensors file '", path, "'");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RT_CHECK(fd_ >= 0, file, ": cannot open it: ", std::strerror(errno));
  try {
    struct stat st {};
    RT_CHECK(::fstat(fd_, &st) == 0, file, ": cannot stat it: ", std::strerror(errno));
    const auto size = static_cast<std::uint64_t>(st.st_size);
    RT_CHECK(size >= 8, file, " is ", size, " bytes: too short for the 8-byte header length");
    unsigned char len8[8];
    pread_all(fd_, path, 0, len8, 8, "the header length");
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | len8[i];  // little-endian whatever the host
    RT_CHECK(n <= kMaxHeaderBytes, file, ": header of ", n, " bytes exceeds the format's limit of ", kMaxHeaderBytes,
             " (not a safetensors file?)");
    RT_CHECK(8 + n <= size, file, ": header of ", n, " bytes runs past the end of the ", size,
             "-byte file (truncated?)");
    std::string text(n, '\0');
    pread_all(fd_, path, 8, text.data(), n, "the header");
    data_start_ = static_cast<std::int64_t>(8 + n);
    const std::int64_t data_bytes = static_cast<std::int64_t>(size - 8 - n);

    // nlohmann keeps the last of duplicate keys silently: the parser callback sees each top-level key.
    std::set<std::string> seen;
    std::string duplicate;
    json h;
    try {
      h = json::parse(text, [&](int depth, json::parse_event_t ev, json& v) {
        if (ev == json::parse_event_t::key && depth == 1 && !seen.insert(v.get<std::string>()).second &&
            duplicate.empty())
          duplicate = v.get<std::string>();
        return true;
      });
    } catch (const json::exception& e) {
      RT_FAIL(file, ": the header is not valid JSON: ", e.what());
    }
    RT_CHECK(duplicate.empty(), file, ": tensor '", duplicate, "' appears twice in the header");
    RT_CHECK(h.is_object(), file, ": the header must be a JSON object");
    for (auto it = h.begin(); it != h.end(); ++it) {
      const std::string& name = it.key();
      if (name == "__metadata__") {
        RT_CHECK(it->is_object(), file, ": __metadata__ must be an object of strings");
        for (auto m = it->begin(); m != it->end(); ++m) {
          RT_CHECK(m->is_string(), file, ": __metadata__ entry '", m.key(), "' must be a string");
          metadata_[m.key()] = m->get<std::string>();
        }
        continue;
      }
      const std::string what = cat(file, ": tensor '", name, "'");
      const json& e = *it;
      RT_CHECK(e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"), what,
               " must have dtype, shape and data_offsets");
      RT_CHECK(e["dtype"].is_string(), what, ": dtype must be a string");
      TensorInfo t;
      t.name = name;
      t.dtype = dtype_of_code(e["dtype"].get<std::string>(), what);
      RT_CHECK(e["shape"].is_array(), what, ": shape must be a list");
      for (const json& d : e["shape"]) t.shape.push_back(nonneg_int(d, what + ": a shape dimension"));
      const json& off = e["data_offsets"];
      RT_CHECK(off.is_array() && off.size() == 2, what, ": data_offsets must be [begin, end]");
      t.begin = nonneg_int(off[0], what + ": data_offsets[0]");
      t.end = nonneg_int(off[1], what + ": data_offsets[1]");
      RT_CHECK(t.begin <= t.end, what, ": data_offsets [", t.begin, ", ", t.end, ") end before they begin");
      const std::int64_t want = t.numel() * static_cast<std::int64_t>(dtype_size(t.dtype));
      RT_CHECK(t.end - t.begin == want, what, ": data_offsets [", t.begin, ", ", t.end, ") hold ", t.end - t.begin,
               " bytes, but ", e["dtype"].get<std::string>(), " ", shape_str(t.shape), " needs ", want);
      tensors_.push_back(std::move(t));
    }
    // The data section is tiled exactly: sorted by begin, each starts where the previous ended.
    std::vector<const TensorInfo*> order;
    for (const auto& t : tensors_) order.push_back(&t);
    std::sort(order.begin(), order.end(), [](auto* a, auto* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    std::int64_t at = 0;
    const TensorInfo* prev = nullptr;
    for (const TensorInfo* t : order) {
      RT_CHECK(t->begin >= at, file, ": tensor '", t->name, "' (bytes [", t->begin, ", ", t->end,
               ")) overlaps tensor '", prev ? prev->name : "", "' (ending at ", at, ")");
      RT_CHECK(t->begin == at, file, ": tensor '", t->name, "' begins at byte ", t->begin, " of the data, but ",
               prev ? cat("tensor '", prev->name, "' ends at ", at) : std::string("the data begins at 0"),
               ": the offsets must be contiguous");
      at = t->end;
      prev = t;
    }
    RT_CHECK(at <= data_bytes, file, ": tensor '", prev ? prev->name : "", "' ends at byte ", at,
             " of the data, but the file holds ", data_bytes, " bytes of data (truncated?)");
    RT_CHECK(at == data_bytes, file, ": ", data_bytes - at, " bytes after the last tensor",
             prev ? cat(" ('", prev->name, "')") : std::string(), " belong to no tensor");
    // Header order is JSON-object order (sorted by name): keep the data order instead.
    std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    for (std::size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

Reader::~Reader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* Reader::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& Reader::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  RT_CHECK(t, "safetensors file '", path_, "' has no tensor '", name, "'");
  return *t;
}

void Reader::read(const TensorInfo& t, std::int64_t offset, void* dst, std::size_t bytes) const {
  RT_CHECK(offset >= 0 && offset + static_cast<std::int64_t>(bytes) <= t.end - t.begin, "safetensors file '", path_,
           "': tensor '", t.name, "': bytes [", offset, ", ", offset + static_cast<std::int64_t>(bytes),
           ") are outside its ", t.end - t.begin);
  pread_all(fd_, path_, data_start_ + t.begin + offset, dst, bytes, cat("tensor '", t.name, "'"));
}

Tensor Reader::read(const TensorInfo& t) const {
  Tensor out = Tensor::empty(t.shape, t.dtype);
  if (t.end > t.begin) read(t, 0, out.raw(), static_cast<std::size_t>(t.end - t.begin));
  return out;
}

Layout layout(const std::string& path, const std::vector<Entry>& entries,
              const std::map<std::string, std::string>& metadata) {
  json h = json::object();
  if (!metadata.empty()) h["__metadata__"] = metadata;
  std::int64_t at = 0;
  std::vector<std::int64_t> begins;
  for (const Entry& e : entries) {
    RT_CHECK(e.name != "__metadata__" && !h.contains(e.name), "safetensors file '", path, "': tensor '", e.name,
             "' is given twice (or is named __metadata__)");
    const std::int64_t bytes = shape_numel(e.shape) * static_cast<std::int64_t>(dtype_size(e.dtype));
    h[e.name] = {{"dtype", dtype_code(e.dtype)}, {"shape", e.shape}, {"data_offsets", {at, at + bytes}}};
    begins.push_back(at);
    at += bytes;
  }
  std::string text = h.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  RT_CHECK(text.size() <= kMaxHeaderBytes, "safetensors file '", path, "': the header would be ", text.size(),
           " bytes, over the format's limit of ", kMaxHeaderBytes);
  Layout out;
  out.head.resize(8);
  for (int i = 0; i < 8; ++i) out.head[i] = static_cast<char>(std::uint64_t(text.size()) >> (8 * i));
  out.head += text;
  const auto data_start = static_cast<std::int64_t>(out.head.size());
  for (std::int64_t b : begins) out.offsets.push_back(data_start + b);
  out.bytes = data_start + at;
  return out;
}

FileWriter::FileWriter(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RT_CHECK(fd_ >= 0, "file '", path_, "': cannot create '", tmp_, "': ", std::strerror(errno));
}

FileWriter::~FileWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void FileWriter::write(std::int64_t offset, const void* data, std::size_t n) {
  RT_CHECK(fd_ >= 0, "file '", path_, "': written after commit");
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t r = ::pwrite(fd_, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    RT_CHECK(r > 0, "file '", path_, "': write failed: ", r < 0 ? std::strerror(errno) : "no progress");
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
}

void FileWriter::commit() {
  RT_CHECK(fd_ >= 0, "file '", path_, "': committed twice");
  const bool synced = ::fsync(fd_) == 0;
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (!synced) ::unlink(tmp_.c_str());
  RT_CHECK(synced, "file '", path_, "': fsync failed: ", std::strerror(err));
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp_.c_str());
    RT_FAIL("file '", path_, "': cannot rename '", tmp_, "' into place: ", std::strerror(e));
  }
}

QueuedWriter::QueuedWriter(FileWriter& f) : f_(f), thread_([this] { run(); }) {}

QueuedWriter::~QueuedWriter() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::uint64_t QueuedWriter::write(std::int64_t offset, const void* data, std::size_t n) {
  std::lock_guard lock(mu_);
  queue_.push_back({offset, data, n});
  cv_.notify_all();
  return ++queued_;
}

void QueuedWriter::wait(std::uint64_t ticket) {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return done_ >= ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void QueuedWriter::wait_all() {
  std::uint64_t last;
  {
    std::lock_guard lock(mu_);
    last = queued_;
  }
  wait(last);
}

void QueuedWriter::run() {
  std::unique_lock lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;
    const Job j = queue_.front();
    queue_.pop_front();
    const bool failed = static_cast<bool>(error_);
    lock.unlock();
    std::exception_ptr err;
    try {
      if (!failed) f_.write(j.off, j.data, j.n);  // after an error the rest is dropped
    } catch (...) {
      err = std::current_exception();
    }
    lock.lock();
    if (err && !error_) error_ = err;
    ++done_;
    cv_.notify_all();
  }
}

char* Blocks::next(std::size_t bytes, QueuedWriter& q) {
  i_ = (i_ + 1) % 3;
  q.wait(ticket_[i_]);
  buf_[i_].resize(bytes);
  return buf_[i_].data();
}

void write(const std::string& path, const std::vector<Entry>& entries,
           const std::map<std::string, std::string>& metadata) {
  const Layout l = layout(path, entries, metadata);
  FileWriter f(path);
  f.write(0, l.head.data(), l.head.size());
  for (std::size_t i = 0; i < entries.size(); ++i)
    f.write(l.offsets[i], entries[i].data,
            static_cast<std::size_t>(shape_numel(entries[i].shape)) * dtype_size(entries[i].dtype));
  f.commit();
}

}  // namespace ringtrain::safetensors
