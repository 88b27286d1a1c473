#!/usr/bin/env bash
# train.device = cuda where the CUDA module cannot be loaded: every rank fails
# with an error that names the module path tried and the loader's reason, and
# the job exits with ringtrain's error status (no crash, no hang). The real
# binary runs at 2 ranks on copies of the ringtrain libraries in a temp folder
# (LD_LIBRARY_PATH puts the copies first, so the module is looked for there):
#  1. no module beside the libraries: "no such file";
#  2. a module that needs a CUDA library which is not there: dlerror's text
#     (a stub libringtrain_cuda.so that needs libcudnn.so.99).
# Usage: cuda_module_errors.sh RINGTRAIN LIBDIR CC MPIEXEC
set -euo pipefail
RT="$1" LIBDIR="$2" CC="$3" MPIEXEC="$4"
T=$(mktemp -d /tmp/rt-cudamod.XXXXXX)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
mkdir -p "$T/lib" "$T/fake"
cp "$LIBDIR"/libringtrain_*.so "$T/lib/"
rm -f "$T/lib/libringtrain_cuda.so"

# Runs a 2-rank CUDA job on the copies; checks the status and that the output has every expected text.
expect_error() {
  local out="$T/out.txt" rc=0
  LD_LIBRARY_PATH="$T/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$MPIEXEC" -np 2 --bind-to none -x LD_LIBRARY_PATH \
    "$RT" train --model mlp --train-data "$T/none.h5" --device cuda --max-steps 1 --checkpoint-dir "$T/ck" \
    > "$out" 2>&1 || rc=$?
  cat "$out"
  [[ $rc != 0 && $rc -lt 128 ]] || fail "exit status $rc (expected ringtrain's error status)"
  ! grep -qiE "signal|segmentation|core dumped|terminate called" "$out" || fail "the job crashed"
  for want in "loading the CUDA backend failed" "$@"; do
    grep -qF -- "$want" "$out" || fail "the error does not say: $want"
  done
}

expect_error "$T/lib/libringtrain_cuda.so: no such file"
echo "missing module: OK"

echo 'int rt_cuda_module_stub;' > "$T/stub.c"
"$CC" -shared -fPIC -Wl,-soname,libcudnn.so.99 -o "$T/fake/libcudnn.so" "$T/stub.c"
"$CC" -shared -fPIC -o "$T/lib/libringtrain_cuda.so" "$T/stub.c" -L"$T/fake" -Wl,--no-as-needed -lcudnn
rm -rf "$T/fake"
expect_error "$T/lib/libringtrain_cuda.so: libcudnn.so.99: cannot open shared object file"
echo "module without its CUDA library: OK"
