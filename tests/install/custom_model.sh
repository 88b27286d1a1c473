#!/usr/bin/env bash
# A model of the user's own, through the installed package (label install):
#  1. cmake --install into a temporary prefix; examples/custom_model (its own
#     "tinynet" registered with ringtrain::register_model, the CLI from
#     ringtrain::main) configures with find_package(ringtrain), builds out of tree;
#  2. the program's own `prepare` makes a small synthetic set;
#  3. it trains 12 steps at 1 rank (log.format = json: every step's loss at
#     full precision), then at 2 ranks as data 2, pipeline 2 and tensor 2 with
#     the same global batch: every step's loss follows the 1-rank run within 1e-5;
#  4. `eval` of the 1-rank run's checkpoint rebuilds the registered model;
#  5. the stock `ringtrain` binary refuses model.name = tinynet, naming the built-in models;
#  6. the program also builds with pkg-config.
# Usage: custom_model.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
SRC="$1" BUILD="$2"
T=$(mktemp -d /tmp/rt-custom.XXXXXX)
trap 'rm -rf "$T"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
fail() { echo "FAIL: $*" >&2; exit 1; }
TOL=1e-5 STEPS=12

# 1. Install and build the example against the installed package.
cmake --install "$BUILD" --prefix "$T/prefix" > "$T/install.log"
cmake -S "$SRC/examples/custom_model" -B "$T/example" -DCMAKE_PREFIX_PATH="$T/prefix" -DCMAKE_BUILD_TYPE=Release \
  > "$T/configure.log" 2>&1 || { cat "$T/configure.log"; fail "find_package(ringtrain) failed"; }
cmake --build "$T/example" -j 2 > "$T/build.log" 2>&1 || { tail -30 "$T/build.log"; fail "building custom_model failed"; }
E="$T/example/custom_model"

# 2. Data, by the program's own command line.
"$E" prepare --dataset synthetic --channels 3 --height 12 --width 12 --samples 512 --test-samples 64 \
  --out "$T/data" > "$T/prepare.log" || { cat "$T/prepare.log"; fail "custom_model prepare failed"; }

# 3. Training: global batch 16 everywhere (data 2: 8 per rank).
C="$SRC/examples/custom_model/tinynet.toml"
common=(train --config "$C" --train-data "$T/data" --test-data "$T/data" --set train.max_steps=$STEPS
        --log-format json --set log.interval=1 --no-eval)
# "step loss" per line from the json records of the root rank.
losses() { sed -n 's/^\(\[[^]]*\] \)\{0,1\}\({"epoch".*"event":"step".*\)$/\2/p' "$1" |
           sed 's/.*"loss":\([^,}]*\).*"step":\([0-9]*\),.*/\2 \1/'; }
"$E" "${common[@]}" --checkpoint-dir "$T/ck" > "$T/np1.log" 2>&1 || { cat "$T/np1.log"; fail "1-rank run failed"; }
losses "$T/np1.log" > "$T/np1.txt"
[[ $(wc -l < "$T/np1.txt") == "$STEPS" ]] || { cat "$T/np1.log"; fail "the 1-rank run logged $(wc -l < "$T/np1.txt") steps, not $STEPS"; }
grep -q "tinynet" "$T/np1.log" || fail "the run does not name the model tinynet"

bad=0
for layout in "data2:--set data.batch_size=8" "pipeline2:--set parallel.pipeline=2" "tensor2:--set parallel.tensor=2"; do
  name=${layout%%:*} set=${layout#*:}
  # shellcheck disable=SC2086  # $set is two words on purpose
  mpirun -np 2 --bind-to none "$E" "${common[@]}" $set > "$T/$name.log" 2>&1 ||
    { cat "$T/$name.log"; fail "$name: the 2-rank run failed"; }
  losses "$T/$name.log" > "$T/$name.txt"
  if ! awk -v tol=$TOL -v steps=$STEPS -v name="$name" '
      NR == FNR { ref[$1] = $2; next }
      { n++; d = $2 - ref[$1]; if (d < 0) d = -d; if (d > max) max = d
        if (!($1 in ref) || d > tol) { printf "%s step %s: 1 rank %s, 2 ranks %s (|d| = %.3g)\n", name, $1, ref[$1], $2, d; bad = 1 } }
      END { if (n != steps) { print name ": " n " steps logged, expected " steps; bad = 1 }
            printf "%s: %d steps, max |loss - 1-rank loss| = %.3g (bound %g)\n", name, n, max, tol; exit bad }' \
      "$T/np1.txt" "$T/$name.txt"; then
    bad=1
  fi
done
[[ $bad == 0 ]] || fail "a layout did not follow the 1-rank run within $TOL"
first=$(head -1 "$T/np1.txt" | cut -d' ' -f2) last=$(tail -1 "$T/np1.txt" | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the loss did not fall: $first -> $last"
echo "tinynet: loss $first -> $last over $STEPS steps at 1 rank"

# 4. eval rebuilds the registered model from the configuration and loads the checkpoint.
"$E" eval --config "$C" --checkpoint "$T/ck" --data "$T/data" --set data.train="$T/data" > "$T/eval.log" 2>&1 ||
  { cat "$T/eval.log"; fail "custom_model eval failed"; }
grep -q "^eval .* accuracy" "$T/eval.log" || { cat "$T/eval.log"; fail "eval printed no result"; }

# 5. The model is the program's own: the stock binary does not know it.
set +e
"$T/prefix/bin/ringtrain" train --print-config --set model.name=tinynet > "$T/stock.log" 2>&1
st=$?
set -e
[[ $st == 2 ]] && grep -q "'tinynet' is not one of mlp, cnn, resnet, vit" "$T/stock.log" ||
  { cat "$T/stock.log"; fail "the stock ringtrain should refuse model.name = tinynet with status 2 (got $st)"; }
# 6. The same program builds with pkg-config, and its --help lists its model.
g++ -std=c++20 -O1 "$SRC/examples/custom_model/custom_model.cpp" -o "$T/custom_model_pc" \
  $(PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig" pkg-config --cflags --libs ringtrain) 2> "$T/pc.log" ||
  { tail -20 "$T/pc.log"; fail "building custom_model with pkg-config failed"; }
"$T/custom_model_pc" train --help | grep -q -- "--model .*tinynet" || fail "custom_model --help does not list tinynet"
echo "custom_model: OK"
