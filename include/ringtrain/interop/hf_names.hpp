#pragma once
// ringtrain parameter names <-> the names other frameworks give the same
// tensors, for export and import (docs/interop.md).
//
// gpt: Hugging Face GPT-2 (GPT2LMHeadModel's state_dict). Its Linear layers
// are Conv1D modules whose weight is stored [in, out], the transpose of
// ringtrain's (and nn.Linear's) [out, in]: c_attn, the attention's c_proj,
// c_fc and the MLP's c_proj are transposed; ringtrain's fused qkv is c_attn
// as is (the output columns [q | k | v], heads contiguous in each). The LM
// head is tied to wte and not stored. Files with GPT2Model's names (without
// the "transformer." prefix, as the Hub's gpt2 checkpoint) load too.
//
// Every other model: ringtrain's names are already PyTorch state_dict names
// of the same module tree ("fc1.weight", "blocks.0.attn.qkv.weight"), weights
// [out, in] as nn.Linear's.
#include <string>
#include <vector>

namespace ringtrain::interop {

struct ExternalName {
  std::string name;          // in the file
  bool transposed = false;   // stored as the transpose of ringtrain's 2-D [out, in]
};

// The external name of ringtrain parameter `param` ("blocks.0.fc1.weight",
// without "param/") of model `model`.
ExternalName external_name(const std::string& model, const std::string& param);
// Names a file may use instead of e.name on import (gpt: without "transformer.").
std::vector<std::string> import_aliases(const std::string& model, const ExternalName& e);
// Tensors of such a file that hold nothing ringtrain keeps: GPT-2's attention
// mask buffers (h.N.attn.bias, h.N.attn.masked_bias) and the tied lm_head.weight.
bool ignored_on_import(const std::string& model, const std::string& file_name);

}  // namespace ringtrain::interop
