#!/usr/bin/env bash
# CTest interop/sentencepiece (issue 44 item 4): `prepare --dataset text --tokenizer sentencepiece`.
#  1. The token files against the SentencePiece library's own Python bindings (Debian's
#     python3-sentencepiece, not through ringtrain): each split's text, cut where ringtrain cuts
#     it, encodes to exactly the stored ids, and the ids decode to exactly that text (lossless).
#  2. The model travels: train copies it into checkpoint.dir; generate encodes the prompt and
#     decodes with it, from the run directory alone (the data's copy removed).
#  3. Bad input names the option: no --vocab-size, one below the byte pieces, an unknown tokenizer.
# Usage: sentencepiece.sh RINGTRAIN_BIN
set -euo pipefail
BIN=$1
HERE=$(cd "$(dirname "$0")" && pwd)
/usr/bin/python3 -c "import sentencepiece, h5py" 2>/dev/null ||
    { echo "SKIPPED: Debian's python3-sentencepiece or python3-h5py missing"; exit 77; }
WORK=$(mktemp -d /tmp/rt-spm.XXXXXX); trap 'rm -rf "$WORK"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
TEXT=$HERE/../../docs/interop.md
fail=0
"$BIN" prepare --dataset text --tokenizer sentencepiece --vocab-size 512 --input "$TEXT" --out "$WORK/data" >"$WORK/out"
cat "$WORK/out"
/usr/bin/python3 - "$TEXT" "$WORK/data" <<'PY' || fail=1
import sys, h5py, sentencepiece as spm
text, d = open(sys.argv[1], "rb").read(), sys.argv[2]
sp = spm.SentencePieceProcessor(model_file=f"{d}/interop.model")
cut = int(len(text) * (1 - 0.1))           # --val-fraction 0.1 of the bytes, as tokens.cpp cuts
while cut > 0 and (text[cut] & 0xC0) == 0x80:
    cut -= 1
ok = True
for split, part in (("train", text[:cut]), ("test", text[cut:])):
    with h5py.File(f"{d}/interop-{split}.h5", "r") as f:
        ids, vocab, tok = f["tokens"][:].tolist(), int(f.attrs["vocab"]), f.attrs["tokenizer"]
    ref = sp.encode(part.decode("utf-8"))
    back = sp.decode(ids).encode("utf-8")
    good = ids == ref and back == part and vocab == sp.get_piece_size() and tok in ("sentencepiece", b"sentencepiece")
    ok &= good
    print(f"{'PASS' if good else 'FAIL'}: {split}: {len(ids)} ids, equal to the Python bindings' {ids == ref}, "
          f"decode to the {len(part)} bytes {back == part}, vocab {vocab} = {sp.get_piece_size()}, tokenizer {tok}")
sys.exit(0 if ok else 1)
PY
MODEL=(--model gpt --set model.width=32 --set model.depth=1 --set data.seq_len=32 --batch-size 4
       --train-data "$WORK/data" --test-data "$WORK/data" --log-format plain --no-eval)
"$BIN" train "${MODEL[@]}" --max-steps 3 --checkpoint-dir "$WORK/run" >"$WORK/out" 2>&1 || { cat "$WORK/out"; exit 1; }
if cmp -s "$WORK/data/interop.model" "$WORK/run/tokenizer.model"; then echo "PASS: the model is in checkpoint.dir"
else echo "FAIL: checkpoint.dir has no copy of the tokenizer model"; fail=1; fi
rm "$WORK/data/interop.model"
PROMPT="Weights in and out"
"$BIN" generate --checkpoint "$WORK/run" --prompt "$PROMPT" --tokens 16 --seed 3 >"$WORK/gen" 2>&1 || { cat "$WORK/gen"; exit 1; }
# Lossless tokenizer: the decoded text starts with the prompt itself, then more text (not ids).
if /usr/bin/python3 -c "import sys; t = open('$WORK/gen', 'rb').read(); sys.exit(0 if t.startswith(b'$PROMPT') and len(t) > len(b'$PROMPT') + 2 and not t[len(b'$PROMPT'):].strip().replace(b' ', b'').isdigit() else 1)"; then
    echo "PASS: generate from the run directory alone: $(head -c 120 "$WORK/gen" | tr '\n' ' ')"
else
    echo "FAIL: generate did not decode text beginning with the prompt:"; cat "$WORK/gen"; fail=1
fi
refused() {  # refused WHAT PATTERN ARGS...: prepare ARGS fails with an error matching PATTERN
    local what=$1 pat=$2; shift 2
    if "$BIN" prepare --dataset text --input "$TEXT" --out "$WORK/bad" "$@" >"$WORK/out" 2>&1; then
        echo "FAIL: $what accepted"; fail=1
    elif grep -q -- "$pat" "$WORK/out"; then echo "PASS: $what: $(grep -m1 -- "$pat" "$WORK/out")"
    else echo "FAIL: $what: the error does not say '$pat':"; cat "$WORK/out"; fail=1; fi
}
refused "no --vocab-size" "--vocab-size" --tokenizer sentencepiece
refused "vocabulary below the byte pieces" "--vocab-size 100" --tokenizer sentencepiece --vocab-size 100
refused "unknown tokenizer" "--tokenizer 'wordpiece'" --tokenizer wordpiece
exit $fail
