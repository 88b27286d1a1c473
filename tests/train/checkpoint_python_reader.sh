#!/usr/bin/env bash
# CTest train/checkpoint_python_reader: tests/support/checkpoint_tensors.py, a reader of the
# checkpoint format written with h5py and numpy alone, assembles a parallel checkpoint's parts
# (tensor 2: q|k|v shards in blocks; ZeRO-1 over 2: optimizer slices cutting parameters) into the
# bytes of the one file that rank 0 gathers and writes (checkpoint.parallel = false) in a run of
# the same settings. Usage: checkpoint_python_reader.sh RINGTRAIN_BIN
set -euo pipefail
BIN=$1
SUPPORT=$(cd "$(dirname "$0")/../support" && pwd)
/usr/bin/python3 -c "import h5py, numpy" 2>/dev/null || { echo "SKIPPED: Debian's python3-h5py is missing"; exit 77; }
WORK=$(mktemp -d /tmp/rt-ckpt-reader.XXXXXX); trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
"$BIN" prepare --dataset synthetic --out "$WORK/data" --samples 256 --test-samples 64 --channels 1 \
    --height 28 --width 28 >/dev/null
run() {  # run DIR PARALLEL EXTRA...
    local dir=$1 parallel=$2; shift 2
    mpirun -np 2 --oversubscribe --bind-to none "$BIN" train --set model.name=vit --set model.width=32 \
        --set model.depth=2 --set model.heads=4 --set model.patch=7 --set data.train="$WORK/data" --set data.test="$WORK/data" \
        --set data.global_batch=16 --set train.epochs=1 --set train.max_steps=3 --set optimizer.name=adamw \
        --set checkpoint.dir="$dir" --set checkpoint.parallel="$parallel" --set log.format=plain --no-eval "$@" \
        >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
}
newest() { ls -t "$1"/*.h5 | grep -v '\.part-' | head -1; }
fail=0
for layout in "tensor2:--set parallel.tensor=2 --set comm.deterministic=true" "zero2:--set parallel.zero=2"; do
    name=${layout%%:*}; read -r -a extra <<< "${layout#*:}"
    run "$WORK/$name-parts" true "${extra[@]}"
    run "$WORK/$name-one" false "${extra[@]}"
    parts=$(newest "$WORK/$name-parts"); one=$(newest "$WORK/$name-one")
    n=$(ls "$WORK/$name-parts"/*.part-* | wc -l)
    [ "$n" -ge 2 ] || { echo "FAIL: $name: no part files ($n)"; fail=1; continue; }
    if out=$(/usr/bin/python3 "$SUPPORT/checkpoint_tensors.py" "$parts" "$one"); then
        echo "PASS: $name: $(basename "$parts") and its parts read by h5py: $out as rank 0's one file"
    else
        echo "FAIL: $name: $out"; fail=1
    fi
done
exit $fail
