#!/usr/bin/env bash
# The tiled attention kernels of cuda/kernels/attention.cu, ring attention's (ring_attention.cu), the
# vocabulary-parallel loss's (vocab_parallel.cu) and the mixture of experts'
# (moe.cu, last: linked against the build's CPU backend) run on the CPU, no
# GPU needed: a development check of their indexing, masking, barriers and
# online softmax against a double-precision reference (attention_emu.cpp).
# emu.hpp runs each block's 128 threads as std::threads with a block barrier
# (__syncthreads), warp barriers (__syncwarp) and a warp shuffle through a
# shared array; shared memory starts as NaN, so a read before a write shows,
# and UBSan stops at a misaligned float4 load.
# It checks the algorithm, not nvcc or the hardware (tests/gpu/attention.cpp
# and mpi_vocab_parallel.cpp do that on a GPU).  Usage: tests/gpu/emulate/run.sh   (about 10 s)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$root/cuda/kernels/attention.cu" "$work/kernels.inc" <<'PY'
import sys
src = open(sys.argv[1]).read()
body = src[src.index('namespace ringtrain::cuda {'):src.index('// Launches kernel')]
body = body.replace('extern __shared__ float sm[];', 'float* sm = emu::ctx->smem;')
body = body.replace('namespace {', 'namespace {\nusing ringtrain::to_acc; using ringtrain::from_acc; using ringtrain::acc_t; '
                    'using emu::threadIdx; using emu::blockIdx; using emu::__syncthreads; using emu::__syncwarp; '
                    'using emu::__shfl_xor_sync; using emu::min;', 1)
open(sys.argv[2], 'w').write(body + '}  // namespace\n}  // namespace ringtrain::cuda\n')
PY
g++ -std=c++20 -O2 -pthread -fsanitize=alignment,bounds -fno-sanitize-recover=all -I"$root/include" -I"$work" -I"$here" "$here/attention_emu.cpp" -o "$work/attention_emu"
"$work/attention_emu"
# The vocabulary-parallel loss's kernels (cuda/kernels/vocab_parallel.cu) and
# their argument struct (ringtrain/cuda/kernels.hpp), against the CPU
# backend's loops and the unsplit loss (vocab_emu.cpp).
python3 - "$root/cuda/kernels/vocab_parallel.cu" "$root/cuda/ringtrain/cuda/kernels.hpp" "$work/vocab_kernels.inc" <<'PY'
import sys
src, hdr = open(sys.argv[1]).read(), open(sys.argv[2]).read()
struct = hdr[hdr.index('struct VocabSlice {'):]
struct = struct[:struct.index('};') + 2]
body = src[src.index('namespace ringtrain::cuda {'):src.index('// ---- launchers (not emulated) ----')]
body = body.replace('namespace ringtrain::cuda {', 'namespace ringtrain::cuda {\n' + struct, 1)
body = body.replace('namespace {', 'namespace {\nusing emu::threadIdx; using emu::blockIdx; using emu::__syncthreads; '
                    'using emu::atomicMin;', 1)
open(sys.argv[3], 'w').write(body + '}  // namespace ringtrain::cuda\n')
PY
g++ -std=c++20 -O2 -pthread -fsanitize=alignment,bounds -fno-sanitize-recover=all -I"$work" -I"$here" "$here/vocab_emu.cpp" -o "$work/vocab_emu"
"$work/vocab_emu"
# Ring attention's block kernels (cuda/kernels/ring_attention.cu, context
# parallelism) and their argument struct, against the CPU backend's loops
# (backend/cpu/ring_blocks.cpp, restated) and the whole softmax in double (ring_emu.cpp).
python3 - "$root/cuda/kernels/ring_attention.cu" "$root/cuda/ringtrain/cuda/kernels.hpp" "$work/ring_kernels.inc" <<'PY'
import sys
src, hdr = open(sys.argv[1]).read(), open(sys.argv[2]).read()
struct = hdr[hdr.index('struct RingBlockArgs {'):]
struct = struct[:struct.index('\n};') + 3]
body = src[src.index('namespace ringtrain::cuda {'):src.index('// ---- launchers (not emulated) ----')]
body = body.replace('namespace ringtrain::cuda {', 'namespace ringtrain::cuda {\n' + struct, 1)
body = body.replace('extern __shared__ float sm[];', 'float* sm = emu::ctx->smem;')
body = body.replace('namespace {', 'namespace {\nusing emu::threadIdx; using emu::blockIdx; using emu::__syncthreads; '
                    'using emu::__syncwarp; using emu::__shfl_xor_sync;', 1)
open(sys.argv[3], 'w').write(body + '}  // namespace ringtrain::cuda\n')
PY
g++ -std=c++20 -O2 -pthread -fsanitize=alignment,bounds -fno-sanitize-recover=all -I"$work" -I"$here" "$here/ring_emu.cpp" -o "$work/ring_emu"
"$work/ring_emu"
# The mixture-of-experts kernels (cuda/kernels/moe.cu) and their argument
# structs (ringtrain/cuda/kernels.hpp) against the CPU backend itself
# (src/backend/cpu/moe_ops.cpp), linked from the build in RINGTRAIN_BUILD
# (default build/; skipped with a note when its libringtrain_nn.so is missing).
build=${RINGTRAIN_BUILD:-$root/build}
if [ -f "$build/libringtrain_nn.so" ]; then
  python3 - "$root/cuda/kernels/moe.cu" "$root/cuda/ringtrain/cuda/kernels.hpp" "$work/moe_kernels.inc" <<'PY'
import re, sys
src, hdr = open(sys.argv[1]).read(), open(sys.argv[2]).read()
sec = hdr[hdr.index('// ---- mixture of experts (kernels/moe.cu) ----'):]
sec = sec[:sec.index('// ---- fusion buffer')]
structs = '\n'.join(re.findall(r'struct Moe\w+ \{.*?\n\};', sec, re.S))
body = src[src.index('namespace ringtrain::cuda {'):src.index('// ---- launchers (not emulated) ----')]
body = body.replace('namespace ringtrain::cuda {', 'namespace ringtrain::cuda {\n' + structs, 1)
body = body.replace('namespace {', 'namespace {\nusing emu::threadIdx; using emu::blockIdx; using emu::__syncthreads; '
                    'using std::exp;', 1)
open(sys.argv[3], 'w').write(body + '}  // namespace ringtrain::cuda\n')
PY
  libs=$(cd "$build" && ls libringtrain_*.so | sed 's/^lib\(.*\)\.so$/-l\1/' | grep -v cuda | tr '\n' ' ')
  g++ -std=c++20 -O2 -pthread -fsanitize=alignment,bounds -fno-sanitize-recover=all -I"$root/include" -I"$work" \
    -I"$here" "$here/moe_emu.cpp" -o "$work/moe_emu" -L"$build" -Wl,-rpath,"$build" $libs
  "$work/moe_emu"
else
  echo "moe kernels: skipped (no $build/libringtrain_nn.so: build ringtrain_nn first)"
fi
