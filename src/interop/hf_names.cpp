// Parameter names of other frameworks (interop/hf_names.hpp).
#include "ringtrain/interop/hf_names.hpp"

#include <regex>

namespace ringtrain::interop {
namespace {

// ringtrain's gpt block children -> GPT-2's module path, and whether the weight is a Conv1D's.
struct BlockPart {
  const char* ours;
  const char* theirs;
  bool conv1d;
};
constexpr BlockPart kGptBlock[] = {
    {"norm1", "ln_1", false},     {"attn.qkv", "attn.c_attn", true}, {"attn.proj", "attn.c_proj", true},
    {"norm2", "ln_2", false},     {"fc1", "mlp.c_fc", true},        {"fc2", "mlp.c_proj", true},
};

ExternalName gpt_name(const std::string& p) {
  if (p == "wte.weight") return {"transformer.wte.weight"};
  if (p == "wte.pos_embed") return {"transformer.wpe.weight"};
  if (p == "norm.weight" || p == "norm.bias") return {"transformer.ln_f." + p.substr(5)};
  static const std::regex block(R"(blocks\.(\d+)\.(.+)\.(weight|bias))");
  std::smatch m;
  if (std::regex_match(p, m, block))
    for (const BlockPart& b : kGptBlock)
      if (m[2] == b.ours)
        return {"transformer.h." + m[1].str() + "." + b.theirs + "." + m[3].str(), b.conv1d && m[3] == "weight"};
  return {p};  // not a GPT-2 tensor: kept under its own name
}

}  // namespace

ExternalName external_name(const std::string& model, const std::string& param) {
  if (model == "gpt") return gpt_name(param);
  return {param};
}

std::vector<std::string> import_aliases(const std::string& model, const ExternalName& e) {
  const std::string prefix = "transformer.";
  if (model == "gpt" && e.name.rfind(prefix, 0) == 0) return {e.name.substr(prefix.size())};
  return {};
}

bool ignored_on_import(const std::string& model, const std::string& n) {
  if (model != "gpt") return false;
  static const std::regex mask(R"((transformer\.)?h\.\d+\.attn\.(bias|masked_bias))");
  return n == "lm_head.weight" || std::regex_match(n, mask);
}

}  // namespace ringtrain::interop
