#!/usr/bin/env bash
# Issue 44's goal "export of the GPT-2 124M shape <= 2x the time of writing the same bytes with dd":
# a checkpoint of gpt at GPT-2 small's shape (768 wide, 12 blocks, 12 heads, 1,024 positions,
# vocabulary 50,257, tanh GELU; 1 step at lr 0), then `ringtrain export` (one F32 model.safetensors,
# fsync'd) against `dd conv=fsync` writing as many bytes to the same file system, alternated REPS
# times; the best of each and their ratio (bound: 2.0).
# Usage: bench/interop_export_vs_dd.sh [BIN] [REPS] [DIR]   (output: docs/data/interop_export_vs_dd.txt)
set -euo pipefail
BIN=${1:-build/ringtrain}; REPS=${2:-3}; DIR=${3:-/tmp}
WORK=$(mktemp -d "$DIR/rt-export.XXXXXX"); trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# $0 $BIN $REPS $DIR   ($(date -u +%FT%TZ), $(nproc) cores:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
/usr/bin/python3 -c "import numpy as np; np.save('$WORK/t.npy', np.random.default_rng(0).integers(0, 50257, 40000, dtype=np.int32))"
"$BIN" prepare --dataset tokens --input "$WORK/t.npy" --vocab 50257 --out "$WORK/data" >/dev/null
"$BIN" train --model gpt --set model.width=768 --set model.depth=12 --set model.heads=12 --set model.gelu=tanh \
    --set data.seq_len=1024 --batch-size 1 --threads 2 --train-data "$WORK/data" --test-data "$WORK/data" \
    --optimizer sgd --lr 0 --set optimizer.momentum=0 --max-steps 1 --no-eval --log-format plain \
    --checkpoint-dir "$WORK/run" 2>&1 | grep -E "^ringtrain:"
: >"$WORK/times"
for r in $(seq "$REPS"); do
    rm -rf "$WORK/hf" "$WORK/dd.bin"; sync
    t0=$(date +%s.%N); "$BIN" export --checkpoint "$WORK/run" --out "$WORK/hf" >/dev/null; t1=$(date +%s.%N)
    bytes=$(stat -c %s "$WORK/hf/model.safetensors")
    rm -f "$WORK/hf/model.safetensors"; sync
    t2=$(date +%s.%N)
    dd if=/dev/zero of="$WORK/dd.bin" bs=1M count=$(( (bytes + 1048575) / 1048576 )) conv=fsync status=none
    t3=$(date +%s.%N)
    t4=$(date +%s.%N); "$BIN" export --help >/dev/null; t5=$(date +%s.%N)   # start-up alone (MPI_Init, libraries)
    echo "$r $t0 $t1 $t2 $t3 $bytes $t4 $t5" >>"$WORK/times"
done
/usr/bin/python3 - "$WORK/times" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1])]
ex, dd, up = [], [], []
for r, t0, t1, t2, t3, b, t4, t5 in rows:
    ex.append(float(t1) - float(t0)); dd.append(float(t3) - float(t2)); up.append(float(t5) - float(t4)); b = int(b)
    print(f"rep {r}: export {ex[-1]:.3f} s, dd {dd[-1]:.3f} s ({b} bytes); ringtrain's start-up alone {up[-1]:.3f} s")
e, d = min(ex), min(dd)
print(f"start-up (export --help) best {min(up):.3f} s; export less start-up {e - min(up):.3f} s: {(e - min(up)) / d:.2f} x dd")
print(f"best: export {e:.3f} s ({b / e / 1e6:.0f} MB/s), dd {d:.3f} s ({b / d / 1e6:.0f} MB/s): ratio {e / d:.2f} (bound 2.0)")
PY
