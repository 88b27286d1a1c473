#!/usr/bin/env bash
# Train on N ranks of this machine (or a host file): jobs/mpirun_fashion.sh [N] [extra ringtrain args...]
#   jobs/mpirun_fashion.sh 4 --set train.epochs=2
#   HOSTFILE=hosts jobs/mpirun_fashion.sh 8
# Builds the binary and prepares Fashion-MNIST when they are missing; launches through
# jobs/mpirun.sh (root, oversubscription, HOSTFILE, RT_MAX_STEPS: see there).
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${1:-2}; shift || true
BIN=${BIN:-build/ringtrain}
CONFIG=${CONFIG:-jobs/fashion_cnn.toml}
[ -x "$BIN" ] || make build-run
[ -f data/fashion-mnist/fashion-mnist-train.h5 ] || "$BIN" prepare --dataset fashion-mnist --out data/fashion-mnist
exec jobs/mpirun.sh -np "$NP" "$BIN" train --config "$CONFIG" "$@"
