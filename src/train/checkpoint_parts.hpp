#pragma once
// Assembling a parallel checkpoint (checkpoint.hpp): the whole tensors from
// the part files a manifest names.
#include <string>

#include "ringtrain/train/checkpoint.hpp"

namespace ringtrain {

// Reads every part of `manifest` (read from `path`) and adds the whole tensors
// to it, checking that each part belongs to it and that the pieces cover every
// tensor exactly; the errors name the manifest, the part and the tensor.
void assemble_parts(const std::string& path, CheckpointData& manifest);

}  // namespace ringtrain
