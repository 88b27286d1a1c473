#!/usr/bin/env bash
# A C++-only project uses the installed package (label install):
#  1. `make install PREFIX=tmpdir`;
#  2. tests/install/cxx_only (project(cxx_only CXX), find_package(ringtrain)) configures against it
#     and builds out of tree, although FindHDF5 compiles a C test program;
#  3. the program runs: the C++ API's plan of a configuration built in code, then ringtrain's own
#     command line writes and checks an HDF5 data set (so HDF5 and MPI are linked and work).
# Usage: cxx_only.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC="$1" BUILD="$2"
T=$(mktemp -d /tmp/rt-cxx-only.XXXXXX)
trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fail() { echo "FAIL: $*" >&2; exit 1; }

make -C "$SRC" install PREFIX="$T/prefix" BUILD="$BUILD" JOBS=2 > "$T/install.log" 2>&1 ||
  { tail -20 "$T/install.log"; fail "make install failed"; }
cmake -S "$SRC/tests/install/cxx_only" -B "$T/app" -DCMAKE_PREFIX_PATH="$T/prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$T/configure.log" 2>&1 || { cat "$T/configure.log"; fail "a CXX-only project cannot find_package(ringtrain)"; }
grep -q "^project(cxx_only CXX)" "$SRC/tests/install/cxx_only/CMakeLists.txt" || fail "the consumer must enable only CXX"
cmake --build "$T/app" -j 2 > "$T/build.log" 2>&1 || { tail -30 "$T/build.log"; fail "building the CXX-only consumer failed"; }

plan=$("$T/app/cxx_only" plan)
echo "$plan"
# 6 ranks at pipeline 2: data 3; 96 = 3 x 1 x 32, 32 divisible by the 2 micro-batches.
for want in '"data": 3' '"pipeline": 2' '"batch_per_rank": 32' '"accumulation": 1' '"micro_batch_size": 16' \
            '"global_batch": 96'; do
  grep -qF "$want" <<< "$plan" || fail "the plan lacks $want"
done
"$T/app/cxx_only" prepare --dataset synthetic --channels 1 --height 8 --width 8 --samples 64 --test-samples 16 \
  --out "$T/data" > "$T/prepare.log" 2>&1 || { cat "$T/prepare.log"; fail "prepare through the consumer failed"; }
"$T/app/cxx_only" prepare --check "$T/data" > "$T/check.log" 2>&1 || { cat "$T/check.log"; fail "prepare --check failed"; }
grep -q "64" "$T/check.log" || { cat "$T/check.log"; fail "prepare --check does not report the 64 samples"; }
echo "cxx_only: OK (find_package from project(... CXX), built, planned, wrote and checked HDF5)"
