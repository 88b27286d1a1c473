#pragma once
// Tensor: shape, dtype, device, and a shared storage with an element offset.
// Always contiguous (row-major); views share storage. Owning tensors allocate
// through the device's Allocator; non-owning views wrap memory owned elsewhere
// (the parameter arena, a fusion buffer, a loader's batch).
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/core/allocator.hpp"
#include "ringtrain/core/device.hpp"
#include "ringtrain/core/dtype.hpp"
#include "ringtrain/core/error.hpp"

namespace ringtrain {

using Shape = std::vector<std::int64_t>;
std::int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);  // "[64, 1, 28, 28]"

class Storage {
 public:
  Storage(std::size_t bytes, Device dev);                   // owning
  Storage(void* data, std::size_t bytes, Device dev);       // non-owning
  explicit Storage(const HostPages& pages);                 // owning host pages
  Storage(std::shared_ptr<ChunkedMemory> mem, Device dev);  // owning chunked memory (ZeRO-2/3 on a device)
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }
  Device device() const { return dev_; }
  // 0: neither from allocate_host_pages nor chunked memory.
  std::size_t page_chunk() const { return chunked_ ? chunked_->chunk() : pages_.chunk; }
  ChunkedMemory* chunked() const { return chunked_.get(); }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
  Device dev_;
  bool owned_ = false;
  HostPages pages_;
  std::shared_ptr<ChunkedMemory> chunked_;
};

class Tensor {
 public:
  Tensor() = default;
  // Uninitialised owning tensor.
  static Tensor empty(const Shape& shape, DType dt = DType::f32, Device dev = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dt = DType::f32, Device dev = Device::cpu());
  // n zeros of host memory in whole pages whose pages can be given back
  // (PageLedger): the arena's flat parameter and gradient buffers.
  static Tensor paged(std::int64_t n, DType dt);
  // The same on `dev`: chunked memory where its allocator has it (ZeRO-2/3 on a
  // device), else plain zeros (nothing can be given back).
  static Tensor paged(std::int64_t n, DType dt, Device dev);
  // Non-owning view of external memory (must outlive every view of it).
  static Tensor wrap(void* data, const Shape& shape, DType dt, Device dev = Device::cpu());

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  std::int64_t dim(int i) const;  // negative i counts from the end
  int ndim() const { return static_cast<int>(shape_.size()); }
  std::int64_t numel() const { return numel_; }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel_) * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device::cpu(); }
  // The storage's page chunk (Tensor::paged; 0 otherwise) and its bytes from raw() on.
  std::size_t page_chunk() const { return storage_ ? storage_->page_chunk() : 0; }
  std::size_t bytes_to_storage_end() const;
  ChunkedMemory* chunked_memory() const { return storage_ ? storage_->chunked() : nullptr; }

  void* raw() const;
  // Typed host pointer: host code dereferences it, so a tensor on a device is
  // an error here (naming the shape and device), not a crash in a host loop.
  template <typename T>
  T* data() const {
    if (dtype_of<T>::value != dtype_ || (storage_ && !storage_->device().is_cpu()))
      fail_access(dtype_of<T>::value);
    return static_cast<T*>(raw());
  }
  // Typed pointer on any device, for kernels and copies that take device memory.
  template <typename T>
  T* device_data() const {
    if (dtype_of<T>::value != dtype_) fail_access(dtype_of<T>::value);
    return static_cast<T*>(raw());
  }

  // Same storage, new shape with the same element count.
  Tensor reshape(const Shape& shape) const;
  // Rows [begin, end) of dimension 0, sharing storage.
  Tensor slice_rows(std::int64_t begin, std::int64_t end) const;
  // Elements [offset, offset + n) as a flat view.
  Tensor flat_view(std::int64_t offset, std::int64_t n) const;
  // The bytes from `byte_offset` on as a tensor of `shape` and `dt`, sharing
  // (and keeping alive) this tensor's storage; the offset must be a multiple of dt's size.
  Tensor view_bytes(std::size_t byte_offset, const Shape& shape, DType dt) const;

  Tensor clone() const;              // deep copy on the same device
  Tensor to(Device dev) const;       // deep copy onto dev (self if already there? no: always a copy)
  void copy_from(const Tensor& src); // same numel and dtype; any devices
  void zero_();
  void fill_(double value);          // CPU only for now

 private:
  [[noreturn]] void fail_access(DType asked) const;

  std::shared_ptr<Storage> storage_;
  std::size_t offset_ = 0;  // in elements
  Shape shape_;
  std::int64_t numel_ = 0;
  DType dtype_ = DType::f32;
};

}  // namespace ringtrain
