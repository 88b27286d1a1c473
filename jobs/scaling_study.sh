#!/usr/bin/env bash
# Strong and weak scaling of `ringtrain train` over rank counts, as CSV + plot.
#   jobs/scaling_study.sh [ranks...]        default: 1 2 4
# strong: the global batch is fixed (GLOBAL_BATCH, default 128) and split over ranks;
# weak:   the per-rank batch is fixed (BATCH, default 64).
# Each point trains STEPS optimizer steps on Fashion-MNIST and reads images/s
# from the metrics file. Output: runs/scaling/scaling.csv and scaling.png.
set -euo pipefail
cd "$(dirname "$0")/.."
RANKS=(${@:-1 2 4})
BIN=${BIN:-build/ringtrain}
STEPS=${STEPS:-200}
GLOBAL_BATCH=${GLOBAL_BATCH:-128}
BATCH=${BATCH:-64}
MODEL=${MODEL:-cnn}
OUT=runs/scaling
LAUNCH=${LAUNCH:-mpirun --allow-run-as-root --oversubscribe --bind-to none}
mkdir -p "$OUT"
[ -f data/fashion-mnist/fashion-mnist-train.h5 ] || "$BIN" prepare --dataset fashion-mnist --out data/fashion-mnist
echo "mode,ranks,batch_per_rank,global_batch,images_per_s" > "$OUT/scaling.csv"
for mode in strong weak; do
  for np in "${RANKS[@]}"; do
    if [ "$mode" = strong ]; then b=$((GLOBAL_BATCH / np)); else b=$BATCH; fi
    m="$OUT/$mode-$np.jsonl"; rm -f "$m"
    echo "== $mode scaling: $np ranks × batch $b"
    $LAUNCH -np "$np" -x OMP_NUM_THREADS=1 "$BIN" train --config jobs/fashion_cnn.toml \
      --set model.name=$MODEL --set data.batch_size=$b --set train.max_steps=$STEPS \
      --set train.epochs=1000 --set checkpoint.dir= --set log.metrics="$m" --set log.format=plain \
      --no-eval >/dev/null
    ips=$(/usr/bin/python3 -c "import json,sys; print([json.loads(l) for l in open('$m') if '\"epoch\"' in l][-1]['images_per_s'])")
    echo "$mode,$np,$b,$((b * np)),$ips" | tee -a "$OUT/scaling.csv"
  done
done
/usr/bin/python3 jobs/plot_scaling.py "$OUT/scaling.csv" "$OUT/scaling.png"
