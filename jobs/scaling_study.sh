#!/usr/bin/env bash
# Scaling study + calibrated cost model, one command:
#   jobs/scaling_study.sh                 (about 10 minutes on 2 cores; root for the emulated hosts)
# 1. all-reduce sweeps (bench_comm_allreduce_sweep, ring and tree) per link class: shared memory
#    (2 ranks here), veth between emulated hosts (2 nodes), tc-shaped veth (2 nodes, RATE) -> fit
#    α, β per class and γ; the same sweeps at 3-4 nodes are kept out of the fit for validation;
# 2. training runs: strong (global batch GLOBAL_BATCH split) and weak (BATCH per rank) scaling of
#    `cnn` at 1, 2, 4 ranks here (4 oversubscribed), weak scaling on 2 and 4 emulated hosts as Slurm
#    jobs (salloc -N k mpirun), resnet and vit at 1-2 ranks for their compute time and overlap;
# 3. jobs/scaling_report.py: CSV, PNG and a text report with the fitted parameters, the validation
#    table and the 1,024-rank predictions (jobs/costmodel.py predicts other layouts).
# Environment: OUT (runs/scaling), STEPS (cnn steps per point, 60), RESNET_STEPS (8), BATCH (64),
#   GLOBAL_BATCH (128), RATE (tc rate of the shaped links, 2gbit), HOSTS=0 to skip the emulated hosts,
#   SWEEP (sweep arguments), SLOW_RATE (100mbit), SLOW_SWEEP, SLOW_STEPS (20), BIN, BENCH,
#   PHASES (default "local hosts slow": run a subset again; the other phases' results in OUT are kept),
#   LOCAL_RANKS (1 2 4), MODES (weak strong), EXTRA_MODELS (resnet vit: weak, 1-2 ranks here),
#   SHM_SWEEP_RANKS (2 4), HOST_CLASSES (net tbf), HOST_SWEEP (2 3 4 hosts), HOST_TRAIN (2 3 4 hosts),
#   REPORT_ARGS (your cluster for the predictions: --ranks 1024 --ranks-per-node 4 --gbit 25 --latency-us 15).
# The short sweep CI runs (tests/slurm/scaling_short.sh) sets these to 2 training points.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-runs/scaling}; mkdir -p "$OUT"/{sweeps,train,data}; OUT=$(cd "$OUT" && pwd)
BIN=${BIN:-$ROOT/build/ringtrain}; BENCH=${BENCH:-$ROOT/build/bench/bench_comm_allreduce_sweep}
STEPS=${STEPS:-60}; RESNET_STEPS=${RESNET_STEPS:-8}; BATCH=${BATCH:-64}; GLOBAL_BATCH=${GLOBAL_BATCH:-128}
RATE=${RATE:-2gbit}; HOSTS=${HOSTS:-1}; SLOW_RATE=${SLOW_RATE:-100mbit}; PHASES=${PHASES:-local hosts slow}
LOCAL_RANKS=${LOCAL_RANKS:-1 2 4}; MODES=${MODES:-weak strong}; EXTRA_MODELS=${EXTRA_MODELS-resnet vit}
SHM_SWEEP_RANKS=${SHM_SWEEP_RANKS:-2 4}; HOST_CLASSES=${HOST_CLASSES:-net tbf}
export HOST_SWEEP=${HOST_SWEEP:-2 3 4} HOST_TRAIN=${HOST_TRAIN:-2 3 4}
NODES=$(printf '%s\n' $HOST_SWEEP $HOST_TRAIN | sort -n | tail -1)
export SWEEP=${SWEEP:--b 4K -e 16M -f 4 -w 3 -n 15 -c 0 --algos ring,tree --stat min}
# Link-bound sizes only (>= 1 MiB at 100 Mbit/s: 80+ ms per message, far above the 256 KB tbf burst),
# median: the tbf queue varies.
export SLOW_SWEEP=${SLOW_SWEEP:--b 1M -e 16M -f 4 -w 1 -n 5 -c 0 --algos ring,tree --stat median}
export SLOW_STEPS=${SLOW_STEPS:-20}
has() { [[ " $PHASES " == *" $1 "* ]]; }
for f in "$BIN" "$BENCH"; do [ -x "$f" ] || { echo "scaling_study: '$f' missing: run make build" >&2; exit 2; }; done
[ -f data/fashion-mnist/fashion-mnist-train.h5 ] || "$BIN" prepare --dataset fashion-mnist --out data/fashion-mnist
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
LOCAL="mpirun --oversubscribe --bind-to none"
[ -f "$OUT/runs.csv" ] || echo "where,mode,model,ranks,nodes,batch_per_rank,metrics" > "$OUT/runs.csv"

# train WHERE MODE MODEL RANKS NODES BATCH STEPS LAUNCH...: one training point, metrics to train/.
# Each point trains exactly one epoch of a synthetic Fashion-MNIST-shaped set (1x28x28, 10 classes)
# of STEPS x global batch samples: the trainer writes its time split once per whole epoch.
train() {
    local where=$1 mode=$2 model=$3 np=$4 nodes=$5 b=$6 steps=$7; shift 7
    local m="$OUT/train/$where-$mode-$model-$np.jsonl" n=$((steps * b * np))
    local d="$OUT/data/synthetic-$n"
    [ -d "$d" ] || "$BIN" prepare --dataset synthetic --samples "$n" --test-samples 64 --channels 1 \
        --height 28 --width 28 --classes 10 --out "$d" > /dev/null
    rm -f "$m"
    echo "== train $where $mode $model: $np ranks on $nodes node(s), batch $b/rank, $steps steps"
    "$@" -np "$np" -x OMP_NUM_THREADS=1 "$BIN" train --config jobs/fashion_cnn.toml --set model.name="$model" \
        --set data.train="$d" --set data.test="$d" --set data.batch_size="$b" --set train.epochs=1 \
        --set checkpoint.dir= --set log.metrics="$m" --set log.format=plain --no-eval \
        > "$OUT/train/$where-$mode-$model-$np.log" 2>&1
    grep -v "^$where,$mode,$model,$np," "$OUT/runs.csv" > "$OUT/runs.csv.tmp" || true  # a re-run replaces its row
    echo "$where,$mode,$model,$np,$nodes,$b,$m" >> "$OUT/runs.csv.tmp"
    mv "$OUT/runs.csv.tmp" "$OUT/runs.csv"
}
export -f train; export OUT BIN BENCH BATCH STEPS

if has local; then
    echo "== sweep: shared memory, 2 ranks (fit) and more (validation; 4 oversubscribes 2 cores)"
    for np in $SHM_SWEEP_RANKS; do
        $LOCAL -np "$np" "$BENCH" $SWEEP --csv "$OUT/sweeps/shm-1n${np}r.csv" > "$OUT/sweeps/shm-1n${np}r.txt"
    done
    for np in $LOCAL_RANKS; do
        if [[ " $MODES " == *" weak "* ]]; then train local weak cnn "$np" 1 "$BATCH" "$STEPS" $LOCAL; fi
        if [[ " $MODES " == *" strong "* ]]; then
            train local strong cnn "$np" 1 $((GLOBAL_BATCH / np)) "$STEPS" $LOCAL
        fi
    done
    for model in $EXTRA_MODELS; do
        for np in 1 2; do train local weak "$model" "$np" 1 "$BATCH" "$RESNET_STEPS" $LOCAL; done
    done
fi

if [ "$HOSTS" = 1 ]; then
    why=$(tests/slurm/cluster.sh check) || { echo "scaling_study: no emulated hosts: $why" >&2; HOSTS=0; }
fi
if [ "$HOSTS" = 1 ]; then
    # Its own cluster instance unless the caller names one (the CI test does).
    export RT_SLURM_NAME=${RT_SLURM_NAME:-rtscale} RT_SLURM_SUBNET=${RT_SLURM_SUBNET:-10.77.29}
    export RT_SLURM_PORT=${RT_SLURM_PORT:-18000}
    # Each emulated host on its own core, as a node has its own cores (3-4 hosts share the 2 cores).
    export RT_SLURM_PIN=${RT_SLURM_PIN:-1}
    if has hosts; then
        for cls in $HOST_CLASSES; do
            rate=
            if [ "$cls" = tbf ]; then rate=$RATE; echo "$RATE" > "$OUT/tbf_rate.txt"; fi
            RT_SLURM_RATE=$rate tests/slurm/cluster.sh run "$NODES" -- jobs/scaling_hosts.sh "$cls"
        done
    fi
    if has slow; then
        RT_SLURM_RATE=$SLOW_RATE tests/slurm/cluster.sh run "$NODES" -- jobs/scaling_hosts.sh slow
        echo "$SLOW_RATE" > "$OUT/slow_rate.txt"
    fi
fi
/usr/bin/python3 jobs/scaling_report.py "$OUT" ${REPORT_ARGS:-}
