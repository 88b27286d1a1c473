#!/usr/bin/env bash
# The installed package, as a user meets it (label install):
#  1. cmake --install into a temporary prefix, then MOVE the tree elsewhere;
#  2. no installed file points into the build tree (readelf -d RUNPATH/RPATH,
#     grep of the CMake package files and the pkg-config file); the moved
#     bin/ringtrain finds the CUDA module beside its libraries (when built);
#  3. examples/train_api configures with find_package(ringtrain) against the
#     moved tree, builds out of tree, and trains at 1 and 2 ranks: the 2-rank
#     losses (global batch 32 as 2 x 16) follow the 1-rank run within 1e-4;
#  4. the same program compiles with `pkg-config --cflags --libs ringtrain`;
#  5. the uninstall script removes every file of the install manifest.
# Usage: install_consumer.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC="$1" BUILD="$2"
T=$(mktemp -d /tmp/rt-install.XXXXXX)
trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "FAIL: $*" >&2; exit 1; }

# 1. Install, with a manifest of our own (the build's install_manifest.txt stays the user's).
cmake --install "$BUILD" --prefix "$T/first" > "$T/install.log"
find "$T/first" -type f | sed "s|^$T/first|P|" | sort > "$T/files.txt"
echo "installed $(wc -l < "$T/files.txt") files:"; grep -vE "^P/include/" "$T/files.txt"
echo "  + $(grep -c '^P/include/' "$T/files.txt") headers under P/include/ringtrain"
mv "$T/first" "$T/moved"
P="$T/moved"
[[ -x "$P/bin/ringtrain" && -f "$P/lib/cmake/ringtrain/ringtrainConfig.cmake" && -f "$P/lib/pkgconfig/ringtrain.pc" ]] ||
  fail "bin/ringtrain, lib/cmake/ringtrain/ringtrainConfig.cmake or lib/pkgconfig/ringtrain.pc missing"

# 2. Nothing refers to the build tree or to where it was first installed.
for f in "$P/bin/ringtrain" "$P"/lib/libringtrain_*.so; do
  if readelf -d "$f" | grep -E "RPATH|RUNPATH" | grep -qE "$BUILD|$T/first"; then
    fail "$f keeps a RUNPATH into the build tree: $(readelf -d "$f" | grep -E 'RPATH|RUNPATH')"
  fi
done
if grep -rlE "$BUILD|$T/first|$SRC/(include|src|cuda)" "$P/lib/cmake" "$P/lib/pkgconfig"; then
  fail "the package files above name the build or source tree"
fi
"$P/bin/ringtrain" --help > /dev/null || fail "the moved bin/ringtrain does not run"
# The CUDA module is looked for beside the moved lib/libringtrain_core.so: with it (built with
# CUDA) a CUDA job gets past loading it (and fails later only for want of a GPU); without it the
# error names that path.
out=$("$P/bin/ringtrain" train --model mlp --device cuda --max-steps 1 --checkpoint-dir "$T/ck" 2>&1 || true)
if [[ -f "$P/lib/libringtrain_cuda.so" ]]; then
  ! grep -q "cannot load the CUDA backend module" <<< "$out" || fail "the moved install does not load its module: $out"
else
  grep -qF "$P/lib/libringtrain_cuda.so: no such file" <<< "$out" || fail "no module, but the error does not name it: $out"
fi
echo "CUDA module: $(ls "$P/lib/libringtrain_cuda.so" 2>/dev/null || echo none) -> $(grep -m1 error <<< "$out")"

# 3. The example, out of tree, against the moved package.
cmake -S "$SRC/examples/train_api" -B "$T/example" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_BUILD_TYPE=Release \
  > "$T/example-configure.log" || { cat "$T/example-configure.log"; fail "find_package(ringtrain) failed"; }
cmake --build "$T/example" -j 2 > "$T/example-build.log" || { tail -30 "$T/example-build.log"; fail "build failed"; }
mpirun -np 1 --bind-to none "$T/example/train_api" "$T/data" 12 > "$T/np1.txt"
mpirun -np 2 --bind-to none "$T/example/train_api" "$T/data" 12 > "$T/np2.txt"
grep -q "done: 12 steps on 2 rank(s)" "$T/np2.txt" || { cat "$T/np2.txt"; fail "the 2-rank run did not finish"; }
paste <(grep '^step' "$T/np1.txt") <(grep '^step' "$T/np2.txt") | awk '
  { d = $4 - $8; if (d < 0) d = -d; if (d > 1e-4) { print "step " $2 ": 1 rank " $4 ", 2 ranks " $8; bad = 1 } n++ }
  END { if (n != 12) { print "expected 12 steps, got " n; bad = 1 } exit bad }' ||
  fail "2 ranks did not follow the 1-rank run"
first=$(grep '^step 1 ' "$T/np1.txt" | awk '{print $4}'); last=$(grep '^step 12 ' "$T/np1.txt" | awk '{print $4}')
echo "train_api: loss $first -> $last over 12 steps; 2 ranks within 1e-4 of 1 rank at every step"

# 4. pkg-config.
PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --exists ringtrain || fail "pkg-config does not find ringtrain.pc"
g++ -std=c++20 -O1 "$SRC/examples/train_api/train_api.cpp" -o "$T/train_api_pc" \
  $(PKG_CONFIG_PATH="$P/lib/pkgconfig" pkg-config --cflags --libs ringtrain) 2> "$T/pc.log" ||
  { tail -20 "$T/pc.log"; fail "building with pkg-config failed"; }
mpirun -np 1 --bind-to none "$T/train_api_pc" "$T/data" 2 | grep -q "done: 2 steps" || fail "the pkg-config build does not run"

# 5. Uninstall from a manifest.
sed "s|^P|$P|" "$T/files.txt" > "$T/manifest.txt"
cmake -DMANIFEST="$T/manifest.txt" -P "$SRC/cmake/RingtrainUninstall.cmake"
left=$(find "$P" -type f | wc -l)
[[ "$left" == 0 ]] || fail "$left files left after uninstall"
echo "install_consumer: OK"
