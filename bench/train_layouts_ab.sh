#!/usr/bin/env bash
# Throughput of two builds of the CLI, interleaved: cnn on 2 ranks at data 2,
# tensor 2 and pipeline 2 (Fashion-MNIST, jobs/fashion_cnn.toml, 300 steps,
# one thread per rank). Prints CSV: round,build,layout,images_per_s (the run's
# last cumulative images/s). Ratios are the ones that matter: the machine is
# shared and noisy, so compare medians of the same layout over the rounds.
#   bench/train_layouts_ab.sh BEFORE/ringtrain AFTER/ringtrain [ROUNDS] > CSV
# Data: data/fashion-mnist (`make prepare`).
set -euo pipefail
BEFORE=${1:?usage: bench/train_layouts_ab.sh BEFORE AFTER [ROUNDS]}
AFTER=${2:?usage: bench/train_layouts_ab.sh BEFORE AFTER [ROUNDS]}
ROUNDS=${3:-3}
STEPS=${STEPS:-300}
DATA=${DATA:-data/fashion-mnist}
MPI=(mpirun --bind-to none --oversubscribe -x OMP_NUM_THREADS=1 -np 2)
[[ $(id -u) == 0 ]] && MPI+=(--allow-run-as-root)
speed() {  # BIN SETS...
  local bin=$1 dir; shift
  dir=$(mktemp -d "${TMPDIR:-/tmp}/ringtrain-ab-XXXXXX")
  OMP_NUM_THREADS=1 "${MPI[@]}" "$bin" train --config jobs/fashion_cnn.toml --no-eval \
    --set train.max_steps=$STEPS --set checkpoint.dir=$dir --set data.train=$DATA --set data.test=$DATA \
    --set log.format=json --set log.interval=$STEPS "$@" 2>&1 | grep -o '"images_per_s":[0-9.]*' | tail -1 | cut -d: -f2
  rm -rf "$dir"
}
echo "round,build,layout,images_per_s"
for i in $(seq 1 "$ROUNDS"); do
  for b in before after; do
    bin=$BEFORE; [[ $b == after ]] && bin=$AFTER
    echo "$i,$b,data2,$(speed "$bin")"
    echo "$i,$b,tensor2,$(speed "$bin" --set parallel.tensor=2)"
    echo "$i,$b,pipeline2,$(speed "$bin" --set parallel.pipeline=2)"
  done
done
