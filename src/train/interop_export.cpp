// ringtrain export: a checkpoint's parameters as safetensors (train/interop.hpp).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ringtrain/comm/agree.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/core/log.hpp"
#include "ringtrain/interop/hf_names.hpp"
#include "ringtrain/interop/llmc.hpp"
#include "ringtrain/interop/safetensors.hpp"
#include "ringtrain/checkpoint/checkpoint.hpp"
#include "ringtrain/train/interop.hpp"

namespace ringtrain {
namespace {

namespace fs = std::filesystem;

void write_json(const fs::path& p, const nlohmann::json& j) {
  std::ofstream f(p);
  f << j.dump(2) << "\n";
  RT_CHECK(f.good(), "export: cannot write '", p.string(), "'");
}

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
  // In 32 x 32 tiles: both sides stay in cache (the row-by-row loop was a fifth of GPT-2 124M's export).
  constexpr std::int64_t T = 32;
  for (std::int64_t r0 = 0; r0 < R; r0 += T)
    for (std::int64_t c0 = 0; c0 < C; c0 += T)
      for (std::int64_t r = r0; r < std::min(r0 + T, R); ++r)
        for (std::int64_t c = c0; c < std::min(c0 + T, C); ++c) b[c * R + r] = a[r * C + c];
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

// llm.c's model file: rank 0 reads every parameter whole and writes it.
std::string export_llmc(const CheckpointIndex& ix, const std::string& found, const TrainConfig& cfg,
                        const std::string& out, const ExportOptions& opt, const Communicator& comm) {
  run_on_root(comm, "export", [&] {
    const std::string why = cat("export --format llmc: checkpoint '", found, "'");
    RT_CHECK(cfg.model.name == "gpt", why, " is of model '", cfg.model.name, "'; llm.c's file holds a gpt (GPT-2)");
    RT_CHECK(cfg.model.gelu == "tanh" && cfg.model.layernorm_eps == 1e-5 && cfg.model.mlp_ratio == 4.0, why,
             " has model.gelu = ", cfg.model.gelu, ", model.layernorm_eps = ", cfg.model.layernorm_eps,
             ", model.mlp_ratio = ", cfg.model.mlp_ratio, "; llm.c computes GPT-2's tanh, 1e-5 and 4");
    std::vector<ReadTarget> targets;
    for (const StoredTensor& s : ix.tensors)
      if (s.name.rfind("param/", 0) == 0) targets.push_back({s.name, Tensor::empty(s.whole, s.dtype), {s.whole, {}, 0}});
    read_targets(ix, targets);
    std::map<std::string, const ReadTarget*> by_name;
    for (const ReadTarget& t : targets) by_name[t.name.substr(6)] = &t;
    const ReadTarget* wte = by_name.count("wte.weight") ? by_name["wte.weight"] : nullptr;
    const ReadTarget* wpe = by_name.count("wte.pos_embed") ? by_name["wte.pos_embed"] : nullptr;
    RT_CHECK(wte && wpe, why, " has no wte.weight or wte.pos_embed");
    llmc::ModelHeader h;
    h.version = opt.dtype == DType::bf16 ? 5 : 3;
    h.vocab = wte->place.whole[0];
    h.padded_vocab = (h.vocab + 127) / 128 * 128;  // llm.c's padding
    h.max_seq_len = wpe->place.whole[0];
    h.layers = cfg.model.depth;
    h.heads = cfg.model.heads;
    h.channels = cfg.model.width;
    if (!fs::path(out).parent_path().empty()) fs::create_directories(fs::path(out).parent_path());
    llmc::write_model(out, h, [&](const std::string& name) -> const float* {
      const auto it = by_name.find(name);
      RT_CHECK(it != by_name.end(), why, " has no parameter '", name, "'");
      return it->second->dst.data<float>();
    });
  });
  return out;
}

}  // namespace

std::string export_checkpoint(const std::string& checkpoint, const std::string& out, const ExportOptions& opt,
                              const Communicator& comm) {
  run_agreed(comm, "export", [&] {
    RT_CHECK(opt.format == "safetensors" || opt.format == "llmc", "export --format '", opt.format,
             "' is not supported (safetensors, llmc)");
    RT_CHECK(opt.dtype == DType::f32 || opt.dtype == DType::bf16, "export: dtype ", dtype_name(opt.dtype),
             " is not supported (float32, bfloat16)");
    RT_CHECK(opt.shard_bytes >= 0, "export --shard-size must be >= 0");
  });
  // The newest candidate that indexes and verifies (every piece checked by one rank).
  std::vector<std::string> candidates;
  run_agreed(comm, "export", [&] { candidates = checkpoint_candidates(checkpoint); });
  CheckpointIndex ix;
  std::string found, skipped;
  for (const std::string& c : candidates) {
    try {
      ix = read_checkpoint_index(c, comm);
      verify_checkpoint(ix, comm, {/*optimizer=*/false, true});  // parameters only: no optimizer byte read
      found = c;
      break;
    } catch (const Error& e) {  // raised on every rank alike
      skipped += cat("\n  ", c, ": ", e.what());
    }
  }
  RT_CHECK(!found.empty(), "export: no usable checkpoint in '", checkpoint, "':", skipped);
  TrainConfig cfg;
  run_agreed(comm, "export", [&] { cfg = config_of(ix.head); });
  const std::string& model = cfg.model.name;
  if (opt.format == "llmc") return export_llmc(ix, found, cfg, out, opt, comm);

  // Parameters in stored order, cut into files of at most shard_bytes (a larger tensor alone).
  std::vector<const StoredTensor*> params;
  for (const StoredTensor& t : ix.tensors)
    if (t.name.rfind("param/", 0) == 0) params.push_back(&t);
  const std::int64_t esz = static_cast<std::int64_t>(dtype_size(opt.dtype));
  std::vector<int> file_of(params.size(), 0);
  std::int64_t in_file = 0, total = 0;
  int files = 1;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::int64_t b = shape_numel(params[i]->whole) * esz;
    if (opt.shard_bytes > 0 && in_file > 0 && in_file + b > opt.shard_bytes) {
      ++files;
      in_file = 0;
    }
    file_of[i] = files - 1;
    in_file += b;
    total += b;
  }
  const bool one_file = fs::path(out).extension() == ".safetensors";
  const fs::path dir = one_file ? fs::path(out).parent_path() : fs::path(out);
  auto name_of = [&](int k) {
    if (one_file) return fs::path(out).filename().string();
    if (files == 1) return std::string("model.safetensors");
    char b[64];
    std::snprintf(b, sizeof b, "model-%05d-of-%05d.safetensors", k + 1, files);
    return std::string(b);
  };
  run_agreed(comm, "export", [&] {
    RT_CHECK(!params.empty(), "export: checkpoint '", found, "' holds no parameters");
    RT_CHECK(files == 1 || !one_file, "export: ", total, " bytes at --shard-size ", opt.shard_bytes, " make ", files,
             " files: --out must be a directory, not '", out, "'");
    if (!dir.empty()) fs::create_directories(dir);
  });

  // Rank r writes files r, r + size, ...: it reads only those files' parameters.
  const std::string activation = cfg.model.gelu == "tanh" ? "gelu_new" : "gelu";
  const std::map<std::string, std::string> meta = {{"format", "pt"},
                                                   {"ringtrain_model", model},
                                                   {"ringtrain_checkpoint", found},
                                                   {"activation_function", activation},
                                                   {"layer_norm_epsilon", cat(cfg.model.layernorm_eps)}};
  nlohmann::json weight_map = nlohmann::json::object();
  Shape wte, wpe;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string param = params[i]->name.substr(6);
    weight_map[interop::external_name(model, param).name] = name_of(file_of[i]);
    if (param == "wte.weight") wte = params[i]->whole;
    if (param == "wte.pos_embed") wpe = params[i]->whole;
  }
  run_agreed(comm, "export", [&] {
    for (int k = comm.rank(); k < files; k += comm.size()) {
      std::vector<ReadTarget> targets;
      for (std::size_t i = 0; i < params.size(); ++i)
        if (file_of[i] == k) {
          const StoredTensor& s = *params[i];
          RT_CHECK(s.dtype == DType::f32, "export: checkpoint '", found, "': parameter '", s.name, "' is ",
                   dtype_name(s.dtype), ", not float32");
          targets.push_back({s.name, Tensor::empty(s.whole, s.dtype), {s.whole, {}, 0}});
        }
      read_targets(ix, targets);
      std::vector<Tensor> keep;
      std::vector<safetensors::Entry> entries;
      keep.reserve(targets.size());
      for (const ReadTarget& t : targets) {
        const interop::ExternalName ext = interop::external_name(model, t.name.substr(6));
        Tensor x = t.dst.reshape(t.place.whole);
        if (ext.transposed) x = transposed(x);
        keep.push_back(as_dtype(x, opt.dtype));
        entries.push_back({ext.name, opt.dtype, keep.back().shape(), keep.back().raw()});
      }
      safetensors::write((dir / name_of(k)).string(), entries, meta);
    }
  });

  // Rank 0, once every file is written: the index and Hugging Face's GPT2Config.
  run_on_root(comm, "export", [&] {
    if (files > 1) {
      const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      write_json(dir / "model.safetensors.index.json", index);
    }
    if (one_file) return;
    nlohmann::json config = {{"ringtrain_model", model}, {"activation_function", activation},
                             {"layer_norm_epsilon", cfg.model.layernorm_eps}};
    if (model == "gpt" && wte.size() == 2 && wpe.size() == 2)
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
    write_json(dir / "config.json", config);
  });
  return files > 1 ? (dir / "model.safetensors.index.json").string() : (dir / name_of(0)).string();
}

}  // namespace ringtrain
