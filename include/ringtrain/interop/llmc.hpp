#pragma once
// llm.c's GPT-2 model file (Karpathy's llm.c, train_gpt2.c / train_gpt2.py):
//
//   int32[256] header: [0] 20240326, [1] version (3: float32, 5: bfloat16),
//                      [2] maxT, [3] V, [4] L, [5] NH, [6] C, [7] Vp
//   then 16 tensors, each layer's stacked over L, weights [out, in] (nn.Linear):
//   wte [Vp, C] (rows V.. zero: the padded vocabulary), wpe [maxT, C],
//   ln1w, ln1b [L, C], qkvw [L, 3C, C], qkvb [L, 3C], attprojw [L, C, C],
//   attprojb [L, C], ln2w, ln2b [L, C], fcw [L, 4C, C], fcb [L, 4C],
//   fcprojw [L, C, 4C], fcprojb [L, C], lnfw, lnfb [C].
//
// ModelFile presents them split per layer under ringtrain's gpt names
// ("blocks.3.attn.qkv.weight", same [out, in] layout), as byte ranges of the
// file, so a rank reads only its parameters' bytes.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "ringtrain/interop/safetensors.hpp"

namespace ringtrain::llmc {

constexpr std::int32_t kModelMagic = 20240326;
constexpr int kHeaderInts = 256;

struct ModelHeader {
  int version = 3;  // 3: float32, 5: bfloat16
  std::int64_t max_seq_len = 0, vocab = 0, layers = 0, heads = 0, channels = 0, padded_vocab = 0;
  DType dtype() const { return version == 5 ? DType::bf16 : DType::f32; }
};

// Whether the file at `path` starts with the model file's magic and a known version.
bool is_model_file(const std::string& path);

class ModelFile {
 public:
  // Opens and validates: magic, version 3 or 5, positive sizes, C divisible by
  // NH, V <= Vp, and the file exactly as long as the header says (errors name
  // the file and the field).
  explicit ModelFile(const std::string& path);
  ~ModelFile();
  ModelFile(const ModelFile&) = delete;
  ModelFile& operator=(const ModelFile&) = delete;

  const std::string& path() const { return path_; }
  const ModelHeader& header() const { return h_; }
  // Per layer, under ringtrain's gpt names; begin/end are bytes after the header.
  const std::vector<safetensors::TensorInfo>& tensors() const { return tensors_; }
  const safetensors::TensorInfo* find(const std::string& name) const;
  void read(const safetensors::TensorInfo& t, std::int64_t offset, void* dst, std::size_t bytes) const;

 private:
  std::string path_;
  int fd_ = -1;
  ModelHeader h_;
  std::vector<safetensors::TensorInfo> tensors_;
  std::map<std::string, std::size_t> by_name_;
};

// The per-layer tensors of a model of header h, in file order, under ringtrain's gpt names.
std::vector<safetensors::TensorInfo> model_tensors(const ModelHeader& h);

// Writes a model file of header h (version 3 or 5): param(name) gives the
// float32 data of ringtrain gpt parameter `name` in its own shape (wte.weight
// [V, C]: written with Vp - V zero rows after it; wte.pos_embed [maxT, C]),
// which must stay valid through the next call (the writes run on a second
// thread: the data of call k is written while call k + 1 reads its own).
void write_model(const std::string& path, const ModelHeader& h,
                 const std::function<const float*(const std::string& name)>& param);

}  // namespace ringtrain::llmc
