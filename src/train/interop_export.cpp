// ringtrain export: a checkpoint's parameters as safetensors (train/interop.hpp).
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/interop/hf_names.hpp"
#include "ringtrain/interop/safetensors.hpp"
#include "ringtrain/train/checkpoint.hpp"
#include "ringtrain/train/interop.hpp"

namespace ringtrain {
namespace {

namespace fs = std::filesystem;

TrainConfig config_of(const CheckpointData& d) {
  const fs::path tmp = fs::temp_directory_path() / cat("rt-export-", ::getpid(), ".toml");
  std::ofstream(tmp) << d.config_toml;
  TrainConfig cfg;
  try {
    cfg.load_toml(tmp.string());
  } catch (...) {
    fs::remove(tmp);
    throw;
  }
  fs::remove(tmp);
  return cfg;
}

// The 2-D [R, C] float32 tensor x as [C, R].
Tensor transposed(const Tensor& x) {
  const std::int64_t R = x.dim(0), C = x.dim(1);
  Tensor y = Tensor::empty({C, R});
  const float* a = x.data<float>();
  float* b = y.data<float>();
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c) b[c * R + r] = a[r * C + c];
  return y;
}

Tensor as_dtype(const Tensor& x, DType dt) {
  if (dt == DType::f32) return x;
  Tensor y = Tensor::empty(x.shape(), DType::bf16);
  const float* a = x.data<float>();
  bfloat16* b = y.data<bfloat16>();
  for (std::int64_t i = 0; i < x.numel(); ++i) b[i] = to_bf16(a[i]);  // round to nearest even
  return y;
}

}  // namespace

std::string export_checkpoint(const std::string& checkpoint, const std::string& out, const ExportOptions& opt) {
  RT_CHECK(opt.format == "safetensors", "export --format '", opt.format, "' is not supported (safetensors)");
  RT_CHECK(opt.dtype == DType::f32 || opt.dtype == DType::bf16, "export: dtype ", dtype_name(opt.dtype),
           " is not supported (float32, bfloat16)");
  const FoundCheckpoint found = find_intact_checkpoint(checkpoint);
  const TrainConfig cfg = config_of(found.data);
  const std::string& model = cfg.model.name;

  // The sharded reader, every parameter whole: one process holds them all.
  const CheckpointIndex ix = read_checkpoint_index(found.path);
  verify_checkpoint(ix);
  std::vector<ReadTarget> targets;
  for (const StoredTensor& s : ix.tensors)
    if (s.name.rfind("param/", 0) == 0) {
      RT_CHECK(s.dtype == DType::f32, "export: checkpoint '", found.path, "': parameter '", s.name, "' is ",
               dtype_name(s.dtype), ", not float32");
      targets.push_back({s.name, Tensor::empty(s.whole, s.dtype), {s.whole, {}, 0}});
    }
  RT_CHECK(!targets.empty(), "export: checkpoint '", found.path, "' holds no parameters");
  read_targets(ix, targets);

  std::vector<Tensor> keep;
  std::vector<safetensors::Entry> entries;
  Shape wte, wpe;
  for (const ReadTarget& t : targets) {
    const std::string param = t.name.substr(6);
    const interop::ExternalName ext = interop::external_name(model, param);
    Tensor x = t.dst.reshape(t.place.whole);
    if (ext.transposed) x = transposed(x);
    keep.push_back(as_dtype(x, opt.dtype));
    entries.push_back({ext.name, opt.dtype, keep.back().shape(), keep.back().raw()});
    if (param == "wte.weight") wte = t.place.whole;
    if (param == "wte.pos_embed") wpe = t.place.whole;
  }

  // Hugging Face's GPT2Config, so that transformers (and ringtrain's import) know the function.
  const std::string activation = cfg.model.gelu == "tanh" ? "gelu_new" : "gelu";
  nlohmann::json config = {{"ringtrain_model", model}, {"activation_function", activation},
                           {"layer_norm_epsilon", cfg.model.layernorm_eps}};
  if (model == "gpt" && wte.size() == 2 && wpe.size() == 2) {
    config.update({{"model_type", "gpt2"},
                   {"architectures", {"GPT2LMHeadModel"}},
                   {"vocab_size", wte[0]},
                   {"n_positions", wpe[0]},
                   {"n_ctx", wpe[0]},
                   {"n_embd", cfg.model.width},
                   {"n_layer", cfg.model.depth},
                   {"n_head", cfg.model.heads},
                   {"n_inner", std::llround(cfg.model.width * cfg.model.mlp_ratio)},
                   {"tie_word_embeddings", true}});
  }
  std::map<std::string, std::string> meta = {{"format", "pt"},
                                             {"ringtrain_model", model},
                                             {"ringtrain_checkpoint", found.path},
                                             {"activation_function", activation},
                                             {"layer_norm_epsilon", config["layer_norm_epsilon"].dump()}};
  const bool one_file = fs::path(out).extension() == ".safetensors";
  const fs::path file = one_file ? fs::path(out) : fs::path(out) / "model.safetensors";
  if (!one_file) fs::create_directories(out);
  else if (file.has_parent_path()) fs::create_directories(file.parent_path());
  safetensors::write(file.string(), entries, meta);
  if (!one_file) {
    std::ofstream f(fs::path(out) / "config.json");
    f << config.dump(2) << "\n";
    RT_CHECK(f.good(), "export: cannot write '", (fs::path(out) / "config.json").string(), "'");
  }
  return file.string();
}

}  // namespace ringtrain
