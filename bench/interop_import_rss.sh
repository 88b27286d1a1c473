#!/usr/bin/env bash
# Issue 44's goal "at tensor 2 x pipeline 2, each rank reading only its part: peak RSS while
# importing <= training peak + 5%". gpt at GPT-2 small's shape (768 x 12, 12 heads, 1,024
# positions, vocabulary 50,257: 124M parameters, a 498 MB F32 safetensors file) on 4 ranks at
# tensor 2 x pipeline 2, 2 steps of batch 2 (2 micro-batches) (SGD without momentum: the smallest training peak,
# so the strictest bound), every rank under /usr/bin/time -v: the largest rank's peak RSS
# starting from the imported file (model.init_from) against the same run from a random start.
# Usage: bench/interop_import_rss.sh [BIN] [DIR]   (output: docs/data/interop_import_rss.txt)
set -euo pipefail
BIN=${1:-build/ringtrain}; DIR=${2:-/tmp}
WORK=$(mktemp -d "$DIR/rt-import.XXXXXX"); trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# $0 $BIN $DIR   ($(date -u +%FT%TZ), $(nproc) cores:$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
/usr/bin/python3 -c "import numpy as np; np.save('$WORK/t.npy', np.random.default_rng(0).integers(0, 50257, 40000, dtype=np.int32))"
"$BIN" prepare --dataset tokens --input "$WORK/t.npy" --vocab 50257 --out "$WORK/data" >/dev/null
ARGS=(train --model gpt --set model.width=768 --set model.depth=12 --set model.heads=12 --set model.gelu=tanh
      --set data.seq_len=1024 --batch-size 1 --threads 1 --train-data "$WORK/data" --test-data "$WORK/data"
      --optimizer sgd --lr 0 --set optimizer.momentum=0 --no-eval --log-format plain)
"$BIN" "${ARGS[@]}" --max-steps 1 --checkpoint-dir "$WORK/run" 2>&1 | grep -E "^ringtrain:"
"$BIN" export --checkpoint "$WORK/run" --out "$WORK/gpt2.safetensors"
MPI=(mpirun -np 4 --bind-to none --oversubscribe -x OMP_NUM_THREADS=1)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
for what in random imported; do
    extra=(); [ "$what" = imported ] && extra=(--init-from "$WORK/gpt2.safetensors")
    "${MPI[@]}" bash -c '/usr/bin/time -v -o "$0.$OMPI_COMM_WORLD_RANK" "$@"' "$WORK/$what.time" "$BIN" "${ARGS[@]}" \
        --set parallel.tensor=2 --set parallel.pipeline=2 --batch-size 2 --max-steps 2 "${extra[@]}" >"$WORK/$what.log" 2>&1 ||
        { cat "$WORK/$what.log"; exit 1; }
    grep -E "init_from|done:|^ringtrain:" "$WORK/$what.log" | sed "s/^/$what: /" || true
done
/usr/bin/python3 - "$WORK" <<'PY'
import glob, re, sys
w = sys.argv[1]
def peaks(what):
    return sorted(float(re.search(r"Maximum resident set size \(kbytes\): (\d+)", open(t).read()).group(1)) / 1024
                  for t in glob.glob(f"{w}/{what}.time.*"))
r, i = peaks("random"), peaks("imported")
print("peak RSS per rank, MB: random start", " ".join(f"{x:.0f}" for x in r), "| imported", " ".join(f"{x:.0f}" for x in i))
print(f"largest rank: imported {max(i):.0f} MB / random start {max(r):.0f} MB = {max(i) / max(r):.3f} (bound 1.05)")
PY
