// model.init_from: a safetensors file into each rank's parameters, by byte
// ranges (train/interop.hpp).
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>
#include <memory>
#include <set>
#include <tuple>

#include "checkpoint/geometry.hpp"
#include "ringtrain/core/error.hpp"
#include "ringtrain/interop/hf_names.hpp"
#include "ringtrain/interop/llmc.hpp"
#include "ringtrain/interop/safetensors.hpp"
#include "ringtrain/train/interop.hpp"

namespace ringtrain {
namespace {

namespace fs = std::filesystem;
using ckpt_detail::PartGeometry;
using Reader = safetensors::Reader;
using TensorInfo = safetensors::TensorInfo;

constexpr std::int64_t kChunk = 1 << 18;  // elements per read: 1 MiB of float32

void convert_to_f32(const char* src, DType dt, float* dst, std::int64_t n) {
  switch (dt) {
    case DType::f32: std::memcpy(dst, src, static_cast<std::size_t>(n) * 4); return;
    case DType::bf16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = ringtrain::to_f32(reinterpret_cast<const bfloat16*>(src)[i]);
      return;
    case DType::f16:
      for (std::int64_t i = 0; i < n; ++i) dst[i] = ringtrain::to_f32(reinterpret_cast<const float16*>(src)[i]);
      return;
    default: RT_FAIL("internal error: convert_to_f32 of ", dtype_name(dt));
  }
}

// One target's reads from one file tensor.
// Reads `bytes` bytes of a tensor from `offset` into its data.
using ReadBytes = std::function<void(std::int64_t offset, void* dst, std::size_t bytes)>;

struct TensorRead {
  ReadBytes read;
  const TensorInfo& info;
  ImportStats& st;
  std::vector<char> buf;

  // Elements [first, first + n) of the stored tensor, as float32, into dst.
  void elements(std::int64_t first, std::int64_t n, float* dst) {
    const std::int64_t esz = static_cast<std::int64_t>(dtype_size(info.dtype));
    for (std::int64_t done = 0; done < n;) {
      const std::int64_t k = std::min(kChunk, n - done);
      const std::size_t bytes = static_cast<std::size_t>(k * esz);
      if (info.dtype == DType::f32) {
        read((first + done) * esz, dst + done, bytes);
      } else {
        buf.resize(bytes);
        read((first + done) * esz, buf.data(), bytes);
        convert_to_f32(buf.data(), info.dtype, dst + done, k);
      }
      st.bytes += bytes;
      ++st.reads;
      done += k;
    }
  }
};

// The tensors of one safetensors file, of a directory's shards listed by
// model.safetensors.index.json ("weight_map": tensor -> file; each file's
// header is validated, and the map must agree with the files both ways), or
// of an llm.c model file (under ringtrain's own gpt names, not transposed).
class WeightFiles {
 public:
  explicit WeightFiles(const std::string& path) {
    if (!fs::is_directory(path) && llmc::is_model_file(path)) {
      llmc_ = std::make_unique<llmc::ModelFile>(path);
      name_ = path;
      return;
    }
    const std::string index = sharded_index(path);
    if (index.empty()) {
      files_.push_back(std::make_unique<Reader>(safetensors_file(path)));
      for (const TensorInfo& t : files_[0]->tensors()) where_[t.name] = 0;
      name_ = files_[0]->path();
      return;
    }
    name_ = index;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(std::ifstream(index));
    } catch (const nlohmann::json::exception& e) {
      RT_FAIL("model.init_from: '", index, "' is not valid JSON: ", e.what());
    }
    RT_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "model.init_from: '", index,
             "' has no weight_map object");
    std::map<std::string, std::size_t> file_at;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      RT_CHECK(it->is_string(), "model.init_from: '", index, "': weight_map entry '", it.key(), "' is not a file name");
      const std::string f = it->get<std::string>();
      RT_CHECK(f.find('/') == std::string::npos, "model.init_from: '", index, "': tensor '", it.key(), "' maps to '",
               f, "', not a file beside the index");
      auto [at, fresh] = file_at.emplace(f, files_.size());
      if (fresh) files_.push_back(std::make_unique<Reader>((fs::path(index).parent_path() / f).string()));
      RT_CHECK(files_[at->second]->find(it.key()), "model.init_from: '", index, "' maps tensor '", it.key(), "' to '",
               f, "', which does not hold it");
      where_[it.key()] = at->second;
    }
    for (const auto& r : files_)
      for (const TensorInfo& t : r->tensors())
        RT_CHECK(where_.count(t.name) && files_[where_[t.name]].get() == r.get(), "model.init_from: '", r->path(),
                 "' holds tensor '", t.name, "', which '", index, "' maps elsewhere or not at all");
  }

  // The index file, or "" for one file.
  static std::string sharded_index(const std::string& path) {
    const fs::path i = fs::path(path) / "model.safetensors.index.json";
    return fs::is_directory(path) && fs::exists(i) ? i.string() : "";
  }
  const std::string& name() const { return name_; }
  const char* kind() const { return llmc_ ? "llm.c model file" : "safetensors file"; }
  bool ringtrain_names() const { return llmc_ != nullptr; }
  const llmc::ModelFile* llmc() const { return llmc_.get(); }
  // The tensor and how to read it, or {nullptr, {}}.
  std::pair<const TensorInfo*, ReadBytes> find(const std::string& tensor) const {
    if (llmc_) {
      const TensorInfo* t = llmc_->find(tensor);
      if (!t) return {nullptr, {}};
      const llmc::ModelFile* f = llmc_.get();
      return {t, [f, t](std::int64_t o, void* d, std::size_t n) { f->read(*t, o, d, n); }};
    }
    const auto it = where_.find(tensor);
    if (it == where_.end()) return {nullptr, {}};
    const Reader* r = files_[it->second].get();
    const TensorInfo* t = r->find(tensor);
    return {t, [r, t](std::int64_t o, void* d, std::size_t n) { r->read(*t, o, d, n); }};
  }
  template <typename F>
  void for_each(F&& f) const {
    if (llmc_)
      for (const TensorInfo& t : llmc_->tensors()) f(t);
    for (const auto& r : files_)
      for (const TensorInfo& t : r->tensors()) f(t);
  }

 private:
  std::string name_;
  std::unique_ptr<llmc::ModelFile> llmc_;
  std::vector<std::unique_ptr<Reader>> files_;
  std::map<std::string, std::size_t> where_;
};

// Rows of the embedding tables may differ between the file and the model (docs above).
bool rows_may_differ(const std::string& param) { return param == "wte.weight" || param == "wte.pos_embed"; }

// The target in ringtrain's layout, [rows, cols] of whole shape W, stored alike
// (same cols; rows beyond the file's are zero).
void read_same_layout(TensorRead& r, const ReadTarget& t, float* dst) {
  const PartGeometry G = PartGeometry::of(t.place);
  const std::int64_t n = t.dst.numel(), t0 = t.place.begin, stored = r.info.numel();
  const std::int64_t run = G.run > 0 ? G.run : std::max<std::int64_t>(1, n);
  for (std::int64_t l = 0; l < n;) {
    const std::int64_t in_run = run - (t0 + l) % run, len = std::min(in_run, n - l);
    const std::int64_t w = G.to_whole(t0 + l);
    const std::int64_t have = std::clamp<std::int64_t>(stored - w, 0, len);
    if (have > 0) r.elements(w, have, dst + l);
    std::fill(dst + l + have, dst + l + len, 0.0f);
    l += len;
  }
}

// The target is [R, C] in ringtrain ([out, in]); the file holds [C, R]: element (r, c) at c R + r.
// The target's elements are bucketed by stored row c (a counting sort, r ascending in each),
// and each stretch of consecutive r is one read.
void read_transposed(TensorRead& r, const ReadTarget& t, float* dst) {
  const PartGeometry G = PartGeometry::of(t.place);
  const std::int64_t R = t.place.whole[0], C = t.place.whole[1];
  const std::int64_t n = t.dst.numel(), t0 = t.place.begin;
  std::vector<std::int64_t> start(static_cast<std::size_t>(C) + 1, 0);
  for (std::int64_t l = 0; l < n; ++l) ++start[static_cast<std::size_t>(G.to_whole(t0 + l) % C) + 1];
  for (std::int64_t c = 0; c < C; ++c) start[c + 1] += start[c];
  std::vector<std::int64_t> at(start.begin(), start.end() - 1), row(n), local(n);
  for (std::int64_t l = 0; l < n; ++l) {
    const std::int64_t w = G.to_whole(t0 + l);
    const std::int64_t k = at[static_cast<std::size_t>(w % C)]++;
    row[k] = w / C;
    local[k] = l;
  }
  std::vector<float> stretch;
  for (std::int64_t c = 0; c < C; ++c)
    for (std::int64_t i = start[c]; i < start[c + 1];) {
      std::int64_t j = i + 1;
      while (j < start[c + 1] && row[j] == row[j - 1] + 1) ++j;
      stretch.resize(static_cast<std::size_t>(j - i));
      r.elements(c * R + row[i], j - i, stretch.data());
      for (std::int64_t k = i; k < j; ++k) dst[local[k]] = stretch[static_cast<std::size_t>(k - i)];
      i = j;
    }
}

std::string gelu_of(const std::string& activation) {
  if (activation == "gelu_new" || activation == "gelu_pytorch_tanh" || activation == "gelu_fast") return "tanh";
  if (activation == "gelu") return "erf";
  return "";
}

}  // namespace

std::string safetensors_file(const std::string& path) {
  RT_CHECK(fs::exists(path), "model.init_from = '", path, "': no such file or directory");
  if (!fs::is_directory(path)) return path;
  const fs::path f = fs::path(path) / "model.safetensors";
  RT_CHECK(fs::exists(f), "model.init_from = '", path,
           "': the directory holds neither model.safetensors nor model.safetensors.index.json");
  return f.string();
}

ImportedSettings imported_settings(const std::string& path) {
  ImportedSettings s;
  if (!fs::is_directory(path) && llmc::is_model_file(path)) {  // llm.c computes GPT-2's function
    const llmc::ModelFile f(path);
    s.gelu = "tanh";
    s.layernorm_eps = 1e-5;
    s.heads = f.header().heads;
    s.source = cat("llm.c model file '", path, "'");
    return s;
  }
  const std::string index = WeightFiles::sharded_index(path);
  const std::string file = index.empty() ? safetensors_file(path) : index;
  std::map<std::string, std::string> m;
  if (index.empty()) m = Reader(file).metadata();
  s.source = cat("the __metadata__ of '", file, "'");
  const fs::path cj = fs::path(file).parent_path() / "config.json";
  if (!m.count("activation_function") && !m.count("layer_norm_epsilon") && fs::exists(cj)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(std::ifstream(cj));
    } catch (const nlohmann::json::exception& e) {
      RT_FAIL("model.init_from: '", cj.string(), "' is not valid JSON: ", e.what());
    }
    if (j.contains("activation_function") && j["activation_function"].is_string())
      m["activation_function"] = j["activation_function"].get<std::string>();
    if (j.contains("layer_norm_epsilon") && j["layer_norm_epsilon"].is_number())
      m["layer_norm_epsilon"] = j["layer_norm_epsilon"].dump();
    s.source = cat("'", cj.string(), "'");
  }
  if (auto it = m.find("activation_function"); it != m.end()) {
    s.gelu = gelu_of(it->second);
    RT_CHECK(!s.gelu.empty(), "model.init_from: ", s.source, " says activation_function = \"", it->second,
             "\", which ringtrain does not compute (gelu, gelu_new, gelu_pytorch_tanh, gelu_fast)");
  }
  if (auto it = m.find("layer_norm_epsilon"); it != m.end()) {
    try {
      s.layernorm_eps = std::stod(it->second);
    } catch (const std::exception&) {
      RT_FAIL("model.init_from: ", s.source, " says layer_norm_epsilon = \"", it->second, "\", not a number");
    }
  }
  return s;
}

std::string apply_imported_settings(TrainConfig& cfg) {
  if (cfg.model.init_from.empty()) return "";
  const ImportedSettings s = imported_settings(cfg.model.init_from);
  // Heads do not show in any shape: a file that says how many must agree.
  RT_CHECK(s.heads == 0 || s.heads == cfg.model.heads, "model.heads = ", cfg.model.heads, ", but model.init_from's ",
           s.source, " has ", s.heads, " heads");
  std::string said;
  if (!s.gelu.empty() && s.gelu != cfg.model.gelu) {
    cfg.model.gelu = s.gelu;
    said += cat("model.gelu = ", s.gelu);
  }
  if (s.layernorm_eps > 0 && s.layernorm_eps != cfg.model.layernorm_eps) {
    cfg.model.layernorm_eps = s.layernorm_eps;
    said += cat(said.empty() ? "" : ", ", "model.layernorm_eps = ", s.layernorm_eps);
  }
  return said.empty() ? "" : cat(said, " (from ", s.source, ")");
}

ImportStats import_safetensors(const std::string& path, const std::string& model, std::vector<ReadTarget>& targets,
                               bool check_unused) {
  const WeightFiles files(path);
  const std::string& file = files.name();
  ImportStats st;
  std::set<std::string> used;
  // Every name and shape first: nothing is overwritten when the file does not fit the model.
  struct Plan {
    ReadTarget* t;
    ReadBytes read;
    const TensorInfo* info;
    bool transposed;
  };
  std::vector<Plan> plans;
  for (ReadTarget& t : targets) {
    if (t.name.rfind("param/", 0) != 0) continue;
    const std::string param = t.name.substr(6);
    const interop::ExternalName ext =
        files.ringtrain_names() ? interop::ExternalName{param} : interop::external_name(model, param);
    auto [info, read] = files.find(ext.name);
    for (const std::string& alias : interop::import_aliases(model, ext))
      if (!info && !files.ringtrain_names()) std::tie(info, read) = files.find(alias);
    const std::string ours = cat(" (ringtrain's '", param, "' of model '", model, "')");
    RT_CHECK(info, "model.init_from: ", files.kind(), " '", file, "' has no tensor '", ext.name, "'", ours);
    const Shape& W = t.place.whole;
    RT_CHECK(!ext.transposed || W.size() == 2, "internal error: transposed import of a ", W.size(), "-d tensor");
    const Shape want = ext.transposed ? Shape{W[1], W[0]} : W;
    bool fits = info->shape == want;
    if (!fits && rows_may_differ(param))
      fits = info->shape.size() == 2 && want.size() == 2 && info->shape[1] == want[1];
    RT_CHECK(fits, "model.init_from: ", files.kind(), " '", file, "': tensor '", info->name, "' is ",
             shape_str(info->shape), ", but the model needs ", shape_str(want), ours,
             ext.transposed ? ", stored transposed as a GPT-2 Conv1D weight" : "");
    RT_CHECK(info->dtype == DType::f32 || info->dtype == DType::bf16 || info->dtype == DType::f16,
             "model.init_from: ", files.kind(), " '", file, "': tensor '", info->name, "' is ", dtype_name(info->dtype),
             ", not a float type (F32, BF16, F16)", ours);
    RT_CHECK(t.dst.dtype() == DType::f32 && t.dst.device().is_cpu() && t.dst.numel() > 0,
             "internal error: model.init_from reads into float32 host memory");
    plans.push_back({&t, read, info, ext.transposed});
    used.insert(info->name);
  }
  if (check_unused)
    files.for_each([&](const TensorInfo& info) {
      RT_CHECK(used.count(info.name) || interop::ignored_on_import(model, info.name), "model.init_from: ",
               files.kind(), " '", file, "' holds tensor '", info.name, "', which model '", model, "' has no parameter for "
               "(a file of another model, or of another depth?)");
    });
  for (const Plan& p : plans) {
    TensorRead rd{p.read, *p.info, st, {}};
    float* dst = p.t->dst.data<float>();
    if (p.transposed) read_transposed(rd, *p.t, dst);
    else read_same_layout(rd, *p.t, dst);
    p.t->found = true;
  }
  return st;
}

}  // namespace ringtrain
