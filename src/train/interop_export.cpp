// ringtrain export: a checkpoint's parameters as safetensors (train/interop.hpp).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>
#include <omp.h>

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

constexpr std::size_t kBlock = std::size_t{4} << 20;  // bytes per converted block written

using safetensors::Blocks;
using safetensors::QueuedWriter;

// oneDNN's CPU engine and a stream on it, for the transposes of one export,
// on this thread alone: a block takes microseconds, and OpenMP's workers
// spinning between blocks cost more CPU than they save (and the writer thread
// needs the other core). The caller's thread count comes back after.
struct Cpu {
  int threads = omp_get_max_threads();
  dnnl::engine eng{dnnl::engine::kind::cpu, 0};
  dnnl::stream s{eng};
  Cpu() { omp_set_num_threads(1); }
  ~Cpu() { omp_set_num_threads(threads); }
  Cpu(const Cpu&) = delete;
  Cpu& operator=(const Cpu&) = delete;
};

// Output rows [c0, c1) of the [C, R] transpose of the [R, C] float32 matrix a,
// as dt, into b: one oneDNN reorder (vectorised: it reads the [R, c1 - c0]
// block by its strides and writes it column-major, converting to bf16 on the
// way) instead of an element-by-element loop.
void transpose_rows(const dnnl::engine& eng, dnnl::stream& s, const float* a, std::int64_t R, std::int64_t C,
                    std::int64_t c0, std::int64_t c1, void* b, DType dt) {
  using dnnl::memory;
  const memory::dims dims = {R, c1 - c0};
  const memory::desc src(dims, memory::data_type::f32, memory::dims{C, 1});
  const memory::desc dst(dims, dt == DType::bf16 ? memory::data_type::bf16 : memory::data_type::f32,
                         memory::dims{1, R});
  memory from(src, eng, const_cast<float*>(a + c0)), to(dst, eng, b);
  dnnl::reorder(from, to).execute(s, from, to);
  s.wait();
}

// Queues the float32 tensor x of `shape` for writing at `off` as dtype dt (the
// [R, C] matrix as [C, R] when `transpose`): unchanged bytes straight from x
// in one write, converted ones in blocks of kBlock, each one pwrite. Returns
// the ticket after which x is no longer read.
std::uint64_t put(QueuedWriter& q, Blocks& blocks, Cpu& cpu, std::int64_t off, const float* x, const Shape& shape,
                  bool transpose, DType dt) {
  const std::int64_t n = shape_numel(shape);
  const auto osz = static_cast<std::int64_t>(dtype_size(dt));
  if (!transpose && dt == DType::f32) return q.write(off, x, static_cast<std::size_t>(n) * 4);
  std::uint64_t last = 0;
  if (!transpose) {
    const std::int64_t per = static_cast<std::int64_t>(kBlock) / osz;
    for (std::int64_t i0 = 0; i0 < n; i0 += per) {
      const std::int64_t i1 = std::min(n, i0 + per);
      auto* b = reinterpret_cast<bfloat16*>(blocks.next(static_cast<std::size_t>((i1 - i0) * osz), q));
      for (std::int64_t i = i0; i < i1; ++i) b[i - i0] = to_bf16(x[i]);  // round to nearest even
      blocks.written(last = q.write(off + i0 * osz, b, static_cast<std::size_t>((i1 - i0) * osz)));
    }
    return last;
  }
  const std::int64_t R = shape[0], C = shape[1];
  const std::int64_t rows = std::max<std::int64_t>(1, static_cast<std::int64_t>(kBlock) / (R * osz));
  for (std::int64_t c0 = 0; c0 < C; c0 += rows) {
    const std::int64_t c1 = std::min(C, c0 + rows);
    char* b = blocks.next(static_cast<std::size_t>((c1 - c0) * R * osz), q);
    transpose_rows(cpu.eng, cpu.s, x, R, C, c0, c1, b, dt);
    blocks.written(last = q.write(off + c0 * R * osz, b, static_cast<std::size_t>((c1 - c0) * R * osz)));
  }
  return last;
}

// A piece that fails its checksum or holds NaN/Inf, found while exporting:
// every rank raises it together, and the next older checkpoint is tried.
class Unusable : public Error {
 public:
  using Error::Error;
};

// The float32 parameter `name` of the mapped checkpoint, whole and verified (Unusable otherwise);
// the pointer lives until the next call with the same scratch.
const float* whole_param(MappedCheckpoint& src, const CheckpointIndex& ix, const std::string& name,
                         std::vector<char>& scratch, std::string& bad) {
  const auto it = ix.tensor_at.find(name);
  RT_CHECK(it != ix.tensor_at.end(), "export: checkpoint '", ix.path, "' has no tensor '", name, "'");
  const StoredTensor& s = ix.tensors[it->second];
  RT_CHECK(s.dtype == DType::f32, "export: checkpoint '", ix.path, "': parameter '", s.name, "' is ",
           dtype_name(s.dtype), ", not float32");
  try {
    return static_cast<const float*>(src.whole(it->second, scratch));
  } catch (const Error& e) {
    bad = e.what();
    throw;
  }
}

// After a collective write: an unusable piece on any rank becomes Unusable on every rank.
void agree_usable(const Communicator& comm, const std::string& bad) {
  try {
    agree_or_throw(comm, bad, "export: reading the checkpoint");
  } catch (const Error& e) {
    throw Unusable(e.what());
  }
}

// llm.c's model file: rank 0 reads (and verifies) each parameter once as it writes it.
std::string export_llmc(const CheckpointIndex& ix, const std::string& found, const TrainConfig& cfg,
                        const std::string& out, const ExportOptions& opt, const Communicator& comm) {
  std::string bad;
  run_on_root(comm, "export", [&] {
    const std::string why = cat("export --format llmc: checkpoint '", found, "'");
    RT_CHECK(cfg.model.name == "gpt", why, " is of model '", cfg.model.name, "'; llm.c's file holds a gpt (GPT-2)");
    RT_CHECK(cfg.model.experts == 0, why, " has model.experts = ", cfg.model.experts,
             "; llm.c's file holds a dense GPT-2 (export --format safetensors writes every expert)");
    RT_CHECK(cfg.model.gelu == "tanh" && cfg.model.layernorm_eps == 1e-5 && cfg.model.mlp_ratio == 4.0, why,
             " has model.gelu = ", cfg.model.gelu, ", model.layernorm_eps = ", cfg.model.layernorm_eps,
             ", model.mlp_ratio = ", cfg.model.mlp_ratio, "; llm.c computes GPT-2's tanh, 1e-5 and 4");
    auto shape_of = [&](const char* name) {
      const auto it = ix.tensor_at.find(cat("param/", name));
      RT_CHECK(it != ix.tensor_at.end(), why, " has no ", name);
      return ix.tensors[it->second].whole;
    };
    const Shape wte = shape_of("wte.weight"), wpe = shape_of("wte.pos_embed");
    llmc::ModelHeader h;
    h.version = opt.dtype == DType::bf16 ? 5 : 3;
    h.vocab = wte[0];
    h.padded_vocab = (h.vocab + 127) / 128 * 128;  // llm.c's padding
    h.max_seq_len = wpe[0];
    h.layers = cfg.model.depth;
    h.heads = cfg.model.heads;
    h.channels = cfg.model.width;
    if (!fs::path(out).parent_path().empty()) fs::create_directories(fs::path(out).parent_path());
    MappedCheckpoint src(ix);
    std::vector<char> scratch[2];  // alternate: write_model reads call k's data during call k + 1
    int calls = 0;
    try {
      llmc::write_model(out, h, [&](const std::string& name) -> const float* {
        RT_CHECK(ix.tensor_at.count("param/" + name), why, " has no parameter '", name, "'");
        return whole_param(src, ix, "param/" + name, scratch[calls++ % 2], bad);
      });
    } catch (const Error&) {
      if (bad.empty()) throw;  // a corrupt piece: agreed below
    }
  });
  agree_usable(comm, bad);
  return out;
}

// The safetensors files of a verified-as-read checkpoint (see export_checkpoint).
std::string export_safetensors(const CheckpointIndex& ix, const std::string& found, const TrainConfig& cfg,
                               const std::string& out, const ExportOptions& opt, const Communicator& comm) {
  const std::string& model = cfg.model.name;
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

  // Rank r writes files r, r + size, ...: it reads (and verifies) only those files' parameters, once.
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
  std::string bad;
  run_agreed(comm, "export", [&] {
    MappedCheckpoint src(ix);
    std::vector<char> scratch;
    for (int k = comm.rank(); k < files && bad.empty(); k += comm.size()) {
      std::vector<std::size_t> mine;
      std::vector<safetensors::Entry> entries;
      std::vector<bool> transpose;
      for (std::size_t i = 0; i < params.size(); ++i) {
        if (file_of[i] != k) continue;
        const interop::ExternalName ext = interop::external_name(model, params[i]->name.substr(6));
        const Shape& w = params[i]->whole;
        RT_CHECK(!ext.transposed || w.size() == 2, "export: parameter '", params[i]->name, "' of shape ",
                 shape_str(w), " is written transposed, so must be a matrix");
        mine.push_back(i);
        transpose.push_back(ext.transposed);
        entries.push_back({ext.name, opt.dtype, ext.transposed ? Shape{w[1], w[0]} : w, nullptr});
      }
      const std::string path = (dir / name_of(k)).string();
      const safetensors::Layout l = safetensors::layout(path, entries, meta);
      safetensors::FileWriter f(path);  // removes its temporary file unless committed
      {
        Blocks blocks;  // outlives the writer thread, which may still read it
        Cpu cpu;
        QueuedWriter q(f);
        q.write(0, l.head.data(), l.head.size());
        std::uint64_t scratch_busy = 0;  // the last write reading `scratch`
        for (std::size_t j = 0; j < mine.size(); ++j) {
          q.wait(scratch_busy);
          const float* x;
          try {
            x = whole_param(src, ix, params[mine[j]]->name, scratch, bad);
          } catch (const Error&) {
            if (bad.empty()) throw;
            return;  // a corrupt piece: agreed below
          }
          const std::uint64_t t = put(q, blocks, cpu, l.offsets[j], x, params[mine[j]]->whole, transpose[j], opt.dtype);
          if (reinterpret_cast<const char*>(x) == scratch.data()) scratch_busy = t;
        }
        q.wait_all();
      }
      f.commit();
    }
  });
  agree_usable(comm, bad);

  // Rank 0, once every file is written: the index and Hugging Face's GPT2Config.
  run_on_root(comm, "export", [&] {
    if (files > 1) {
      const nlohmann::json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      write_json(dir / "model.safetensors.index.json", index);
    }
    if (one_file) return;
    nlohmann::json config = {{"ringtrain_model", model}, {"activation_function", activation},
                             {"layer_norm_epsilon", cfg.model.layernorm_eps}};
    if (model == "gpt" && cfg.model.experts > 0)  // no Hugging Face class holds ringtrain's MoE gpt: its own names
      config.update({{"ringtrain_experts", cfg.model.experts}, {"ringtrain_top_k", cfg.model.top_k},
                     {"ringtrain_moe_every", cfg.model.moe_every}});
    else if (model == "gpt" && wte.size() == 2 && wpe.size() == 2)
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
  // The newest candidate that indexes and whose parameters verify. Each stored
  // parameter byte is read once: checked (CRC-32, finite) as it is written, by
  // the rank writing it; a corrupt one (on any rank) sends every rank to the
  // next candidate, whose files replace the partial ones.
  std::vector<std::string> candidates;
  run_agreed(comm, "export", [&] { candidates = checkpoint_candidates(checkpoint); });
  std::string skipped;
  for (const std::string& c : candidates) {
    CheckpointIndex ix;
    try {
      ix = read_checkpoint_index(c, comm);
    } catch (const Error& e) {  // raised on every rank alike
      skipped += cat("\n  ", c, ": ", e.what());
      continue;
    }
    TrainConfig cfg;
    run_agreed(comm, "export", [&] { cfg = config_of(ix.head); });
    try {
      return opt.format == "llmc" ? export_llmc(ix, c, cfg, out, opt, comm)
                                  : export_safetensors(ix, c, cfg, out, opt, comm);
    } catch (const Unusable& e) {
      skipped += cat("\n  ", c, ": ", e.what());
    }
  }
  RT_FAIL("export: no usable checkpoint in '", checkpoint, "':", skipped);
}

}  // namespace ringtrain
