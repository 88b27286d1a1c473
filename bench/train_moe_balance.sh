#!/usr/bin/env bash
# Load balance of gpt's top-2 mixture of 8 experts (docs/moe.md) under four routers:
# no balancing, the aux loss (0.01), the aux-loss-free bias (model.moe_bias_update_rate:
# DeepSeek-V3's 0.001, and 0.01 for a run this short) and both. The corpus and model are bench/train_moe_vs_dense.sh's
# (the first BYTES of the fortune files, bytes, 10% held out; width 128, depth 4).
# The first epoch is the warm-up; the last epoch's max/mean tokens per expert (mean over
# its micro-batches, per MoE layer; 1 = uniform) is printed beside the goal of <= 1.10, and the same
# ratio of the epoch's tokens per expert summed over its micro-batches (DeepSeek-V3's global view).
#   bench/train_moe_balance.sh [BUILD_DIR] [EPOCHS] [BYTES] [ONLY]   (raw output: docs/data/moe_balance.txt)
# ONLY: a regex of the run names to do (none aux bias aux+bias bias0.01 aux+bias0.01 aux0.1 aux1
# bias0.003 aux+bias0.003; default all).
# aux0.1 and aux1: the aux loss at 10x and 100x the usual coefficient (can the router reach 1.10 at all?).
set -euo pipefail
BIN=${1:-build}/ringtrain
EPOCHS=${2:-2}
BYTES=${3:-300000}
GOAL=1.10
ONLY=${4:-}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cat $(ls -d /usr/share/games/fortunes/* | grep -v -e '\.dat$' -e '\.u8$' | sort) > "$WORK/all.txt"
head -c "$BYTES" "$WORK/all.txt" > "$WORK/fortunes.txt"
"$BIN" prepare --dataset text --input "$WORK/fortunes.txt" --out "$WORK/bytes"
COMMON=(--set model.name=gpt --set model.width=128 --set model.heads=4 --set model.depth=4 --set data.seq_len=128
        --set train.threads=1 --set data.train="$WORK/bytes" --set data.test="$WORK/bytes" --batch-size 16
        --epochs "$EPOCHS" --lr 3e-3 --set schedule.name=constant --set schedule.warmup_epochs=0 --log-format plain
        --set model.mlp_ratio=2 --set model.experts=8 --set model.top_k=2)
run() {
  local name=$1; shift
  if [ -n "$ONLY" ] && ! [[ $name =~ ^($ONLY)$ ]]; then return 0; fi
  echo "== $name: $*"
  "$BIN" train "${COMMON[@]}" "$@" 2>&1 | grep -E "^ringtrain:|^epoch [0-9]+/[0-9]+:" | tee "$WORK/log" || true
  # The last epoch's per-layer max/mean (per micro-batch, and of the epoch's summed loads), their worst, the goal beside.
  tail -n 1 "$WORK/log" | grep -oE "max/mean [0-9.]+ \(epoch [0-9.]+\)" | tr -d '()' | awk -v n="$name" -v g="$GOAL" -v e="$EPOCHS" '
    { v = $2; x = $4; if (v > w) w = v; if (x > wx) wx = x; s = s " " v; sx = sx " " x }
    END { printf "balance %-10s epoch %d of %d (after warm-up): max/mean per layer%s | worst %.2f (goal <= %.2f: %s)\n",
                 n, e, e, s, w, g, (w <= g ? "met" : "not met")
          printf "balance %-10s epoch %d of %d, the epoch'"'"'s summed loads: max/mean per layer%s | worst %.2f (goal <= %.2f: %s)\n",
                 n, e, e, sx, wx, g, (wx <= g ? "met" : "not met") }'
}
run none --set model.aux_loss_coeff=0 --set model.moe_bias_update_rate=0
run aux --set model.aux_loss_coeff=0.01 --set model.moe_bias_update_rate=0
run bias --set model.aux_loss_coeff=0 --set model.moe_bias_update_rate=0.001
run aux+bias --set model.aux_loss_coeff=0.01 --set model.moe_bias_update_rate=0.001
run bias0.01 --set model.aux_loss_coeff=0 --set model.moe_bias_update_rate=0.01
run aux+bias0.01 --set model.aux_loss_coeff=0.01 --set model.moe_bias_update_rate=0.01
run bias0.003 --set model.aux_loss_coeff=0 --set model.moe_bias_update_rate=0.003
run aux+bias0.003 --set model.aux_loss_coeff=0.01 --set model.moe_bias_update_rate=0.003
run aux0.1 --set model.aux_loss_coeff=0.1 --set model.moe_bias_update_rate=0
run aux1 --set model.aux_loss_coeff=1 --set model.moe_bias_update_rate=0
