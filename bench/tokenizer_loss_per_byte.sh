#!/usr/bin/env bash
# The subword tokenizer's effect (issue 44 item 4): validation loss per byte of the same gpt
# trained the same number of steps on the same corpus (Debian's fortunes), byte-level against
# sentencepiece. Loss per byte = the test split's mean loss per token x its tokens / its bytes
# (byte-level: 1 token = 1 byte). Same hyperparameters for both (AdamW 3e-3 constant, no warm-up:
# the recipe's warm-up is in epochs, whose length differs between the two token streams).
# Usage: bench/tokenizer_loss_per_byte.sh [BIN] [STEPS] [VOCAB]   (output: docs/data/interop_tokenizer.txt)
set -euo pipefail
BIN=${1:-build/ringtrain}; STEPS=${2:-150}; VOCAB=${3:-2048}
WORK=$(mktemp -d /tmp/rt-tok.XXXXXX); trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
CORPUS=/usr/share/games/fortunes
echo "# $0 $BIN $STEPS $VOCAB   ($(date -u +%FT%TZ), $(nproc) cores: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2))"
"$BIN" prepare --dataset text --input "$CORPUS" --out "$WORK/bytes"
"$BIN" prepare --dataset text --input "$CORPUS" --out "$WORK/spm" --tokenizer sentencepiece --vocab-size "$VOCAB"
for tok in bytes spm; do
    MODEL=(--set model.name=gpt --set model.width=128 --set model.heads=4 --set model.depth=4 --set data.seq_len=128
           --set train.threads=2 --set data.train="$WORK/$tok" --set data.test="$WORK/$tok")
    "$BIN" train "${MODEL[@]}" --batch-size 16 --max-steps "$STEPS" --lr 3e-3 --set schedule.name=constant \
        --set schedule.warmup_epochs=0 --log-format plain --no-eval --checkpoint-dir "$WORK/run-$tok" \
        >"$WORK/$tok.log" 2>&1 || { cat "$WORK/$tok.log"; exit 1; }
    # The whole test split, in windows of seq_len + 1 tokens.
    "$BIN" eval "${MODEL[@]}" --checkpoint "$WORK/run-$tok" >>"$WORK/$tok.log" 2>&1 || { cat "$WORK/$tok.log"; exit 1; }
    grep -E "^ringtrain:|^eval|^done" "$WORK/$tok.log" | sed "s/^/$tok: /"
    /usr/bin/python3 - "$WORK/$tok" "$WORK/$tok.log" "$tok" <<'PY'
import sys, glob, re, h5py
d, log, tok = sys.argv[1:]
f = glob.glob(f"{d}/*-test.h5")[0]
with h5py.File(f, "r") as h:
    n_tok = h["tokens"].shape[0]
    vocab = int(h.attrs["vocab"])
if tok == "bytes":
    n_bytes = n_tok
else:
    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=glob.glob(f"{d}/*.model")[0])
    with h5py.File(f, "r") as h:
        n_bytes = len(sp.decode(h["tokens"][:].tolist()).encode("utf-8"))
loss = float(re.findall(r"^eval .*: loss ([0-9.]+)", open(log).read(), re.M)[-1])
print(f"{tok}: vocab {vocab}, validation {n_tok} tokens = {n_bytes} bytes ({n_bytes / n_tok:.3f} bytes/token); "
      f"loss {loss:.4f} nat/token = {loss * n_tok / n_bytes:.4f} nat/byte = {loss * n_tok / n_bytes / 0.693147:.4f} bits/byte")
PY
done
