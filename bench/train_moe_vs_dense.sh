#!/usr/bin/env bash
# gpt with a top-2 mixture of 8 experts against its dense counterpart at equal
# training FLOPs per token (docs/moe.md): the dense MLP has hidden 4h, each expert
# 2h, so a token's two experts compute what the dense MLP does (plus the router,
# 8h per token). Same data (the bytes of the first BYTES of /usr/share/games/fortunes,
# 10% held out for validation), epochs, batch and optimizer; the epoch lines give the
# validation loss of each and, for the MoE (once with the aux loss, once without),
# each layer's aux loss and max/mean tokens per expert over the epoch.
#   bench/train_moe_vs_dense.sh [BUILD_DIR] [EPOCHS] [BYTES]   (raw output: docs/data/moe_vs_dense.txt)
set -euo pipefail
BIN=${1:-build}/ringtrain
EPOCHS=${2:-1}
BYTES=${3:-600000}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# The fortune files (not their .dat/.u8 indexes), in name order, cut at BYTES.
cat $(ls -d /usr/share/games/fortunes/* | grep -v -e '\.dat$' -e '\.u8$' | sort) > "$WORK/all.txt"
head -c "$BYTES" "$WORK/all.txt" > "$WORK/fortunes.txt"
"$BIN" prepare --dataset text --input "$WORK/fortunes.txt" --out "$WORK/bytes"
COMMON=(--set model.name=gpt --set model.width=128 --set model.heads=4 --set model.depth=4 --set data.seq_len=128
        --set train.threads=1 --set data.train="$WORK/bytes" --set data.test="$WORK/bytes" --batch-size 16
        --epochs "$EPOCHS" --lr 3e-3 --set schedule.name=constant --set schedule.warmup_epochs=0 --log-format plain)
run() {
  local name=$1; shift
  echo "== $name: $*"
  "$BIN" train "${COMMON[@]}" "$@" 2>&1 | grep -E "^ringtrain:|^epoch [0-9]+/[0-9]+:" || true
}
run dense --set model.mlp_ratio=4
run moe8_top2_aux --set model.mlp_ratio=2 --set model.experts=8 --set model.top_k=2 --set model.aux_loss_coeff=0.01
run moe8_top2_noaux --set model.mlp_ratio=2 --set model.experts=8 --set model.top_k=2 --set model.aux_loss_coeff=0
