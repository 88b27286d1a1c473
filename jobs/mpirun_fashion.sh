#!/usr/bin/env bash
# Train on N ranks of this machine (or a host file): jobs/mpirun_fashion.sh [N] [extra ringtrain args...]
#   jobs/mpirun_fashion.sh 4 --set train.epochs=2
#   HOSTFILE=hosts jobs/mpirun_fashion.sh 8
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${1:-2}; shift || true
BIN=${BIN:-build/ringtrain}
CONFIG=${CONFIG:-jobs/fashion_cnn.toml}
[ -x "$BIN" ] || make build
[ -f data/fashion-mnist/fashion-mnist-train.h5 ] || "$BIN" prepare --dataset fashion-mnist --out data/fashion-mnist
args=(--allow-run-as-root --bind-to none)
[ "$NP" -gt "$(nproc)" ] && args+=(--oversubscribe)
[ -n "${HOSTFILE:-}" ] && args+=(--hostfile "$HOSTFILE")
exec mpirun "${args[@]}" -np "$NP" -x OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$BIN" train --config "$CONFIG" "$@"
