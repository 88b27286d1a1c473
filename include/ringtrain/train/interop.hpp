#pragma once
// Weights in and out of ringtrain (docs/interop.md).
//
// Import (model.init_from): each rank fills the parameters it holds — its
// pipeline stage, tensor-parallel shards (blocks of a fused q|k|v included),
// ZeRO-3 slices — from a safetensors file (or a directory of shards, or an
// llm.c model file: interop/llmc.hpp), reading with pread only the byte
// ranges of those elements (a transposed GPT-2 Conv1D weight: the stretches
// of each stored row that its elements occupy), converting BF16/F16 to the
// float32 parameters. Names and layouts follow interop/hf_names.hpp. Every
// shape is checked against the model first, naming the first tensor that
// differs. The embedding tables may differ in rows: a file's extra rows of
// wte (a padded vocabulary) or wpe (more positions) are not read, and rows
// the file lacks are zero (a model whose vocabulary is padded).
//
// Export (ringtrain export): a checkpoint's parameters, read through the
// sharded checkpoint reader (checkpoint/read.hpp), written as safetensors
// under the external names (one file, or shards above a size, each rank
// writing its own), with GPT-2's settings in each file's __metadata__ (and,
// for a directory, a Hugging Face config.json beside it).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "ringtrain/checkpoint/read.hpp"
#include "ringtrain/train/config.hpp"

namespace ringtrain {

// The safetensors file that `path` names: the file, or <dir>/model.safetensors.
std::string safetensors_file(const std::string& path);

// What an imported file says about the model's function (Hugging Face's
// config.json keys, in the file's __metadata__ or a config.json beside it):
// activation_function (gelu_new | gelu_pytorch_tanh | gelu_fast -> "tanh",
// gelu -> "erf") and layer_norm_epsilon; an llm.c model file: tanh, 1e-5 and
// its heads. Empty / 0: the file does not say.
struct ImportedSettings {
  std::string gelu;
  double layernorm_eps = 0;
  std::int64_t heads = 0;  // attention heads where the file says (llm.c's header)
  std::string source;      // where they were found, for the log
};
ImportedSettings imported_settings(const std::string& path);
// Sets cfg.model.gelu and cfg.model.layernorm_eps from cfg.model.init_from's
// file where it says; returns a description of what it set ("" if nothing).
std::string apply_imported_settings(TrainConfig& cfg);

struct ImportStats {
  std::size_t bytes = 0;  // read from the file
  std::size_t reads = 0;  // pread calls
};
// Fills the targets named "param/<name>" (float32 host memory) from the
// safetensors file at `path` for model `model`; other targets are left alone.
// Errors name the file, the file's tensor and ringtrain's parameter.
// check_unused: also refuse file tensors that no target took (only when the
// targets cover the whole model: one pipeline stage).
ImportStats import_safetensors(const std::string& path, const std::string& model, std::vector<ReadTarget>& targets,
                               bool check_unused);

struct ExportOptions {
  std::string format = "safetensors";
  DType dtype = DType::f32;      // f32 | bf16
  std::int64_t shard_bytes = 0;  // > 0: files of at most this many bytes (a larger tensor alone) and
                                 // model.safetensors.index.json; 0: one file
};
// Collective: writes the parameters of the checkpoint at `checkpoint` (a
// file, or the newest intact one in a directory; read and verified by the
// sharded reader) to `out`: a file if it ends in .safetensors, else a
// directory with model.safetensors (or model-0000k-of-0000N.safetensors and
// model.safetensors.index.json, rank r writing files r, r + size, ...) and
// config.json. Returns the file written (or the index).
std::string export_checkpoint(const std::string& checkpoint, const std::string& out, const ExportOptions& opt,
                              const Communicator& comm);

}  // namespace ringtrain
