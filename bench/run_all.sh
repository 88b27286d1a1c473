#!/usr/bin/env bash
# Runs every CPU benchmark with the settings quoted in README.md. Results (CSV/JSON)
# go to runs/bench/. Usage: bench/run_all.sh [build-dir]
set -uo pipefail
cd "$(dirname "$0")/.."
B=${1:-build}
OUT=runs/bench
mkdir -p "$OUT"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN="mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1"
export OMP_NUM_THREADS=1  # one compute thread per rank: 2 ranks on 2 cores, and the same for PyTorch
run() { echo; echo "== $*"; "$@"; }
run $MPIRUN -np 2 "$B/bench/bench_comm_allreduce_sweep" -b 8 -e 256M -f 4 -c 1 --csv "$OUT/allreduce_np2.csv"
run tests/hosts/run_mpi.sh --rate 1gbit 2,2 -- "$B/bench/bench_comm_allreduce_sweep" -b 1M -e 16M -f 4 -n 5 -w 2 \
  --algos ring,hierarchical,mpi --csv "$OUT/allreduce_2hosts.csv"
run "$B/bench/bench_gb_comm_reduce" --benchmark_min_time=0.2
run env OMP_NUM_THREADS=1 "$B/bench/bench_nn_throughput" --json "$OUT/nn_throughput.json"
run bench/gpt_vs_pytorch.sh "$OUT/gpt_vs_pytorch" "$B"
run "$B/bench/bench_data_loader_throughput" --json "$OUT/loader.json"
run $MPIRUN -np 2 "$B/bench/bench_engine_fusion"
run $MPIRUN -np 2 "$B/bench/bench_train_ddp_throughput" --model cnn --json "$OUT/ddp_cnn.json"
run $MPIRUN -np 2 "$B/bench/bench_train_ddp_throughput" --model resnet --steps 20 --warmup 3 --no-torch --no-single \
  --json "$OUT/ddp_resnet.json"
# Pipeline parallelism: bubble sweep (sleep stages; p = 2, 4, 8) and resnet pipeline vs DP at 2 ranks.
run bench/parallel_bubble.sh "$B" 10
run $MPIRUN -np 2 "$B/bench/bench_parallel_throughput" --csv "$OUT/pipeline_throughput.csv"
# Layouts: per-step split (compute / tensor comm / bubble / DP exposed) of vit at data, pipeline, tensor = 2.
run $MPIRUN -np 2 "$B/bench/bench_parallel_layouts" --csv "$OUT/parallel_layouts.csv"
# Checkpoint stall: checkpoint.async (host snapshot) vs a synchronous write vs memcpy of the state (vit 25 M, resnet).
run "$B/bench/bench_train_checkpoint_stall" --models resnet,vit --every 8 --checkpoints 4
