#include "ringtrain/core/tensor.hpp"

#include <algorithm>
#include <sstream>

#include "ringtrain/core/allocator.hpp"

namespace ringtrain {

std::int64_t shape_numel(const Shape& s) {
  std::int64_t n = 1;
  for (auto d : s) {
    RT_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

Storage::Storage(std::size_t bytes, Device dev) : bytes_(bytes), dev_(dev), owned_(true) {
  data_ = allocator_for(dev.kind).allocate(bytes, dev);
}
Storage::Storage(void* data, std::size_t bytes, Device dev) : data_(data), bytes_(bytes), dev_(dev) {}
Storage::Storage(const HostPages& pages)
    : data_(pages.data), bytes_(pages.bytes), dev_(Device::cpu()), pages_(pages) {}
Storage::Storage(std::shared_ptr<ChunkedMemory> mem, Device dev)
    : data_(mem->data()), bytes_(mem->bytes()), dev_(dev), chunked_(std::move(mem)) {}
Storage::~Storage() {
  if (chunked_) return;  // freed with the last reference to chunked_
  if (pages_.data) free_host_pages(pages_);
  else if (owned_ && data_) allocator_for(dev_.kind).deallocate(data_, bytes_, dev_);
}

Tensor Tensor::empty(const Shape& shape, DType dt, Device dev) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dt;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), dev);
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dt, Device dev) {
  Tensor t = empty(shape, dt, dev);
  t.zero_();
  return t;
}

Tensor Tensor::paged(std::int64_t n, DType dt) {
  Tensor t;
  t.shape_ = {n};
  t.numel_ = shape_numel(t.shape_);
  t.dtype_ = dt;
  if (t.nbytes() == 0) t.storage_ = std::make_shared<Storage>(0, Device::cpu());
  else t.storage_ = std::make_shared<Storage>(allocate_host_pages(t.nbytes()));
  return t;
}

Tensor Tensor::paged(std::int64_t n, DType dt, Device dev) {
  // The host's allocator has no chunked memory but in tests (a stricter
  // stand-in for a device's: tests/train/mpi_zero_chunked.cpp).
  const std::size_t bytes = static_cast<std::size_t>(std::max<std::int64_t>(n, 0)) * dtype_size(dt);
  std::shared_ptr<ChunkedMemory> mem = bytes ? allocator_for(dev.kind).allocate_chunked(bytes, dev) : nullptr;
  if (!mem) return dev.is_cpu() ? paged(n, dt) : zeros({n}, dt, dev);
  Tensor t;
  t.shape_ = {n};
  t.numel_ = n;
  t.dtype_ = dt;
  t.storage_ = std::make_shared<Storage>(std::move(mem), dev);
  return t;
}

std::size_t Tensor::bytes_to_storage_end() const {
  return storage_ ? storage_->bytes() - offset_ * dtype_size(dtype_) : 0;
}

Tensor Tensor::wrap(void* data, const Shape& shape, DType dt, Device dev) {
  Tensor t;
  t.shape_ = shape;
  t.numel_ = shape_numel(shape);
  t.dtype_ = dt;
  t.storage_ = std::make_shared<Storage>(data, t.nbytes(), dev);
  return t;
}

std::int64_t Tensor::dim(int i) const {
  int n = ndim();
  int k = i < 0 ? i + n : i;
  RT_CHECK(k >= 0 && k < n, "dimension ", i, " out of range for shape ", shape_str(shape_));
  return shape_[k];
}

void* Tensor::raw() const {
  if (!storage_) return nullptr;
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

void Tensor::fail_access(DType asked) const {
  RT_CHECK(asked == dtype_, "tensor ", shape_str(shape_), " of dtype ", dtype_name(dtype_), " accessed as ",
           dtype_name(asked));
  RT_FAIL("Tensor::data(): tensor ", shape_str(shape_), " (", dtype_name(dtype_), ") lives on ", device().str(),
          ", and host code cannot dereference it (copy it with .to(Device::cpu()), or pass device_data() to a kernel)");
}

Tensor Tensor::reshape(const Shape& shape) const {
  RT_CHECK(shape_numel(shape) == numel_, "cannot reshape ", shape_str(shape_), " (", numel_,
           " elements) to ", shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  return t;
}

Tensor Tensor::slice_rows(std::int64_t begin, std::int64_t end) const {
  RT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "row slice [", begin,
           ", ", end, ") out of range for shape ", shape_str(shape_));
  std::int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  Tensor t = *this;
  t.shape_[0] = end - begin;
  t.numel_ = row * (end - begin);
  t.offset_ = offset_ + static_cast<std::size_t>(begin * row);
  return t;
}

Tensor Tensor::flat_view(std::int64_t offset, std::int64_t n) const {
  RT_CHECK(offset >= 0 && n >= 0 && offset + n <= numel_, "flat view [", offset, ", ", offset + n,
           ") out of range for ", numel_, " elements");
  Tensor t = *this;
  t.shape_ = {n};
  t.numel_ = n;
  t.offset_ = offset_ + static_cast<std::size_t>(offset);
  return t;
}

Tensor Tensor::view_bytes(std::size_t byte_offset, const Shape& shape, DType dt) const {
  const std::size_t at = offset_ * dtype_size(dtype_) + byte_offset, esz = dtype_size(dt);
  const std::int64_t n = shape_numel(shape);
  RT_CHECK(at % esz == 0 && byte_offset + static_cast<std::size_t>(n) * esz <= nbytes(), "byte view at ",
           byte_offset, " of ", n, " ", dtype_name(dt), " elements: misaligned or beyond ", nbytes(), " bytes");
  Tensor t = *this;
  t.shape_ = shape;
  t.numel_ = n;
  t.dtype_ = dt;
  t.offset_ = at / esz;
  return t;
}

Tensor Tensor::clone() const { return to(device()); }

Tensor Tensor::to(Device dev) const {
  Tensor t = empty(shape_, dtype_, dev);
  t.copy_from(*this);
  return t;
}

void Tensor::copy_from(const Tensor& src) {
  RT_CHECK(src.numel_ == numel_ && src.dtype_ == dtype_, "copy_from: source ", shape_str(src.shape_),
           " ", dtype_name(src.dtype_), " does not match destination ", shape_str(shape_), " ",
           dtype_name(dtype_));
  copy_bytes(raw(), device(), src.raw(), src.device(), nbytes());
}

void Tensor::zero_() {
  if (numel_) allocator_for(device().kind).zero(raw(), nbytes(), device());
}

void Tensor::fill_(double value) {
  RT_CHECK(device().is_cpu(), "fill_ on ", device().str(), " is not supported; fill on the CPU and copy");
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    T* p = static_cast<T*>(raw());
    T v;
    if constexpr (std::is_same_v<T, float16>) v = to_f16(static_cast<float>(value));
    else if constexpr (std::is_same_v<T, bfloat16>) v = to_bf16(static_cast<float>(value));
    else v = static_cast<T>(value);
    for (std::int64_t i = 0; i < numel_; ++i) p[i] = v;
  });
}

}  // namespace ringtrain
