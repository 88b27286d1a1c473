// llm.c's GPT-2 model file (interop/llmc.hpp).
#include "ringtrain/interop/llmc.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "ringtrain/core/error.hpp"

namespace ringtrain::llmc {
namespace {

using safetensors::TensorInfo;

// llm.c's 16 tensors in file order: ringtrain's name (per layer: "blocks.{}." + suffix), and shape.
struct Stacked {
  const char* name;  // whole-model tensors: the full name; per-layer: the suffix
  bool per_layer;
  int rows, cols;    // in units: 'V' Vp, 'T' maxT, 'C', '3' 3C, '4' 4C, '1' one (a vector)
};
constexpr Stacked kOrder[] = {
    {"wte.weight", false, 'V', 'C'},     {"wte.pos_embed", false, 'T', 'C'}, {"norm1.weight", true, '1', 'C'},
    {"norm1.bias", true, '1', 'C'},      {"attn.qkv.weight", true, '3', 'C'}, {"attn.qkv.bias", true, '1', '3'},
    {"attn.proj.weight", true, 'C', 'C'}, {"attn.proj.bias", true, '1', 'C'}, {"norm2.weight", true, '1', 'C'},
    {"norm2.bias", true, '1', 'C'},      {"fc1.weight", true, '4', 'C'},      {"fc1.bias", true, '1', '4'},
    {"fc2.weight", true, 'C', '4'},      {"fc2.bias", true, '1', 'C'},        {"norm.weight", false, '1', 'C'},
    {"norm.bias", false, '1', 'C'},
};

std::int64_t size_of(char u, const ModelHeader& h) {
  switch (u) {
    case 'V': return h.padded_vocab;
    case 'T': return h.max_seq_len;
    case 'C': return h.channels;
    case '3': return 3 * h.channels;
    case '4': return 4 * h.channels;
    default: return 1;
  }
}

void pread_all(int fd, const std::string& path, std::int64_t offset, void* dst, std::size_t n, const std::string& what) {
  char* p = static_cast<char*>(dst);
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    RT_CHECK(r > 0, "llm.c model file '", path, "': ", what, ": ",
             r < 0 ? cat("read failed: ", std::strerror(errno)) : std::string("the file ends early (truncated?)"));
    p += r;
    n -= static_cast<std::size_t>(r);
    offset += r;
  }
}

}  // namespace

std::vector<TensorInfo> model_tensors(const ModelHeader& h) {
  std::vector<TensorInfo> out;
  const std::int64_t esz = static_cast<std::int64_t>(dtype_size(h.dtype()));
  std::int64_t at = 0;
  for (const Stacked& s : kOrder) {
    const std::int64_t rows = size_of(static_cast<char>(s.rows), h), cols = size_of(static_cast<char>(s.cols), h);
    const Shape shape = s.rows == '1' ? Shape{cols} : Shape{rows, cols};
    for (std::int64_t l = 0; l < (s.per_layer ? h.layers : 1); ++l) {
      TensorInfo t;
      t.name = s.per_layer ? cat("blocks.", l, ".", s.name) : std::string(s.name);
      t.dtype = h.dtype();
      t.shape = shape;
      t.begin = at;
      t.end = at + shape_numel(shape) * esz;
      at = t.end;
      out.push_back(std::move(t));
    }
  }
  return out;
}

bool is_model_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::int32_t h[2] = {0, 0};
  return f.read(reinterpret_cast<char*>(h), sizeof h) && h[0] == kModelMagic && (h[1] == 3 || h[1] == 5);
}

ModelFile::ModelFile(const std::string& path) : path_(path) {
  const std::string file = cat("llm.c model file '", path, "'");
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RT_CHECK(fd_ >= 0, file, ": cannot open it: ", std::strerror(errno));
  try {
    std::int32_t h[kHeaderInts];
    struct stat st {};
    RT_CHECK(::fstat(fd_, &st) == 0 && st.st_size >= static_cast<off_t>(sizeof h), file,
             " is shorter than its 1024-byte header");
    pread_all(fd_, path, 0, h, sizeof h, "the header");
    RT_CHECK(h[0] == kModelMagic, file, ": magic ", h[0], ", not ", kModelMagic, " (not an llm.c GPT-2 model file)");
    RT_CHECK(h[1] == 3 || h[1] == 5, file, ": version ", h[1], " is not 3 (float32) or 5 (bfloat16)");
    h_.version = h[1];
    h_.max_seq_len = h[2];
    h_.vocab = h[3];
    h_.layers = h[4];
    h_.heads = h[5];
    h_.channels = h[6];
    h_.padded_vocab = h[7];
    const char* names[] = {"maxT", "V", "L", "NH", "C", "Vp"};
    for (int i = 0; i < 6; ++i) RT_CHECK(h[2 + i] > 0, file, ": header field ", names[i], " = ", h[2 + i], " must be > 0");
    RT_CHECK(h_.channels % h_.heads == 0, file, ": C = ", h_.channels, " is not divisible by NH = ", h_.heads);
    RT_CHECK(h_.vocab <= h_.padded_vocab, file, ": V = ", h_.vocab, " exceeds the padded Vp = ", h_.padded_vocab);
    tensors_ = model_tensors(h_);
    const std::int64_t want = static_cast<std::int64_t>(sizeof h) + tensors_.back().end;
    RT_CHECK(st.st_size == want, file, " is ", st.st_size, " bytes, but its header (", h_.dtype() == DType::bf16 ?
             "bfloat16" : "float32", ", L = ", h_.layers, ", C = ", h_.channels, ", Vp = ", h_.padded_vocab, ", maxT = ",
             h_.max_seq_len, ") needs ", want, st.st_size < want ? " (truncated?)" : "");
    for (std::size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
  } catch (...) {
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

ModelFile::~ModelFile() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorInfo* ModelFile::find(const std::string& name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

void ModelFile::read(const TensorInfo& t, std::int64_t offset, void* dst, std::size_t bytes) const {
  RT_CHECK(offset >= 0 && offset + static_cast<std::int64_t>(bytes) <= t.end - t.begin, "llm.c model file '", path_,
           "': tensor '", t.name, "': bytes out of range");
  pread_all(fd_, path_, kHeaderInts * 4 + t.begin + offset, dst, bytes, cat("tensor '", t.name, "'"));
}

void write_model(const std::string& path, const ModelHeader& h,
                 const std::function<const float*(const std::string& name)>& param) {
  RT_CHECK(h.version == 3 || h.version == 5, "llm.c model file '", path, "': version ", h.version,
           " is not 3 (float32) or 5 (bfloat16)");
  std::int32_t head[kHeaderInts] = {};
  const std::int64_t fields[] = {kModelMagic, h.version, h.max_seq_len, h.vocab, h.layers, h.heads, h.channels,
                                 h.padded_vocab};
  for (int i = 0; i < 8; ++i) head[i] = static_cast<std::int32_t>(fields[i]);
  safetensors::FileWriter f(path);
  const std::int64_t esz = h.version == 5 ? 2 : 4, base = sizeof head;
  constexpr std::int64_t kBlock = std::int64_t{1} << 21;  // elements per converted (bf16) block
  const std::vector<TensorInfo> tensors = model_tensors(h);
  // wte's Vp - V zero rows, the largest run of zeros.
  const std::vector<char> zeros(static_cast<std::size_t>((h.padded_vocab - h.vocab) * h.channels * esz), 0);
  {
    safetensors::Blocks blocks;  // outlive the writer thread, which may still read them
    safetensors::QueuedWriter q(f);
    q.write(0, head, sizeof head);
    std::uint64_t source_read[2] = {0, 0};  // by tensor parity: the last write reading its param() memory
    for (std::size_t k = 0; k < tensors.size(); ++k) {
      const TensorInfo& t = tensors[k];
      // wte: the model's V rows, then Vp - V zero rows.
      const std::int64_t have = t.name == "wte.weight" ? h.vocab * h.channels : t.numel();
      q.wait(source_read[k % 2]);  // param() may reuse the memory it gave two calls ago
      const float* src = param(t.name);
      RT_CHECK(src, "llm.c model file '", path, "': no parameter '", t.name, "' to write");
      const std::int64_t at = base + t.begin;
      if (esz == 4) {
        source_read[k % 2] = q.write(at, src, static_cast<std::size_t>(have) * 4);
      } else {
        for (std::int64_t i0 = 0; i0 < have; i0 += kBlock) {
          const std::int64_t i1 = std::min(have, i0 + kBlock);
          auto* b = reinterpret_cast<bfloat16*>(blocks.next(static_cast<std::size_t>(i1 - i0) * 2, q));
          for (std::int64_t i = i0; i < i1; ++i) b[i - i0] = to_bf16(src[i]);
          blocks.written(q.write(at + i0 * 2, b, static_cast<std::size_t>(i1 - i0) * 2));
        }
      }
      if (have < t.numel())
        q.write(at + have * esz, zeros.data(), static_cast<std::size_t>((t.numel() - have) * esz));
    }
    q.wait_all();
  }
  f.commit();
}

}  // namespace ringtrain::llmc
