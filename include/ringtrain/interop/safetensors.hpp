#pragma once
// safetensors (Hugging Face's weight format), read and written without Python:
//
//   [8 bytes: N, little-endian u64] [N bytes: JSON header] [data]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end)} (offsets into the data section) and may hold a
// "__metadata__" object of strings. The reader enforces the format's rules
// before any tensor is used, naming the tensor that breaks one: N <= 100 MB
// and within the file, a JSON object without duplicate names, known dtypes,
// non-negative shapes, end - begin equal to the shape's bytes, and offsets
// that tile the data section exactly (contiguous from 0 to the file's end:
// no gap, no overlap, no trailing bytes). Tensors are read by byte range
// (pread), so a rank reads only the elements it holds.
//
// The writer pads the header with spaces to a multiple of 8 (as the
// reference implementation does, so that data is aligned) and writes the
// file under a temporary name, renaming it into place once complete.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/tensor.hpp"

namespace ringtrain::safetensors {

constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the format's limit

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  std::int64_t begin = 0, end = 0;  // byte offsets in the data section
  std::int64_t numel() const { return shape_numel(shape); }
};

// "F32", "BF16", ... <-> DType (F32, F64, F16, BF16, I32, I64, U8).
const char* dtype_code(DType dt);
DType dtype_of_code(const std::string& code, const std::string& what);

class Reader {
 public:
  // Opens and validates `path`; an Error names the file and the first tensor
  // (or header field) that breaks a rule.
  explicit Reader(const std::string& path);
  ~Reader();
  Reader(const Reader&) = delete;
  Reader& operator=(const Reader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in header order
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(const std::string& name) const;  // nullptr if absent
  const TensorInfo& at(const std::string& name) const;    // Error naming the tensor if absent

  // `bytes` bytes of tensor t starting `offset` bytes into its data.
  void read(const TensorInfo& t, std::int64_t offset, void* dst, std::size_t bytes) const;
  // The whole tensor in its stored dtype and shape.
  Tensor read(const TensorInfo& t) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::int64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::size_t> by_name_;
  std::map<std::string, std::string> metadata_;
};

// One tensor to write: `data` holds numel(shape) elements of `dtype`.
struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;
};

// Where a file holding `entries` (in this order; names unique; their data
// unused) puts things: `head` is the 8-byte length and the JSON header (padded
// to a multiple of 8), offsets[i] the file offset of entry i's data.
struct Layout {
  std::string head;
  std::vector<std::int64_t> offsets;
  std::int64_t bytes = 0;  // of the whole file
};
Layout layout(const std::string& path, const std::vector<Entry>& entries,
              const std::map<std::string, std::string>& metadata = {});

// A file written at known offsets with pwrite (large blocks, in any order),
// as "<path>.tmp" until commit() fsyncs it and renames it into place; a
// writer destroyed before commit() removes the temporary file.
class FileWriter {
 public:
  explicit FileWriter(std::string path);
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  void write(std::int64_t offset, const void* data, std::size_t n);
  void commit();

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// pwrite on a second thread, so that reading, checking and converting the next
// data overlaps writing this (the kernel's copy into the page cache is as long
// as dd's whole run). Each write returns a ticket; wait(t) returns once that
// write is done, so its memory can be reused; an error in the thread is
// rethrown by wait(). Destruction finishes the queued writes (their memory must
// outlive the writer).
class QueuedWriter {
 public:
  explicit QueuedWriter(FileWriter& f);
  ~QueuedWriter();
  QueuedWriter(const QueuedWriter&) = delete;
  QueuedWriter& operator=(const QueuedWriter&) = delete;
  std::uint64_t write(std::int64_t offset, const void* data, std::size_t n);
  void wait(std::uint64_t ticket);
  void wait_all();

 private:
  struct Job {
    std::int64_t off;
    const void* data;
    std::size_t n;
  };
  void run();

  FileWriter& f_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::uint64_t queued_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the rest exists
};

// Buffers for converted data, reused round-robin once their writes are done:
// next() waits for the write of the buffer it hands out, written() records the
// ticket of the write that reads it.
class Blocks {
 public:
  char* next(std::size_t bytes, QueuedWriter& q);
  void written(std::uint64_t ticket) { ticket_[i_] = ticket; }

 private:
  std::vector<char> buf_[3];
  std::uint64_t ticket_[3] = {0, 0, 0};
  int i_ = 0;
};

// Writes `entries` and `metadata` to `path` atomically.
void write(const std::string& path, const std::vector<Entry>& entries,
           const std::map<std::string, std::string>& metadata = {});

}  // namespace ringtrain::safetensors
