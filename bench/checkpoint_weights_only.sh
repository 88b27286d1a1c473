#!/bin/sh
# generate and eval read no optimizer byte: they work on a checkpoint whose every optimizer
# dataset is corrupt (a resume names it), docs/checkpoints.md. Run from a scratch directory
# holding a link `jobs` to the repository's jobs/: checkpoint_weights_only.sh BUILD/ringtrain
set -u
B=$1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI="mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2"
SET="--set data.train=data --set data.test=data --set model.width=32 --set model.depth=1 --set data.seq_len=32"
(yes "the quick brown fox jumps over the lazy dog" | head -3000) > corpus.txt
$B prepare --dataset text --input corpus.txt --out data | tail -1
$MPI $B train --config jobs/text_gpt.toml $SET --max-steps 3 --checkpoint-dir ck 2>&1 | grep "checkpoint written"
$B generate --checkpoint ck --prompt "the quick" --tokens 30 --seed 1 > gen_before.txt 2>&1
/usr/bin/python3 - <<'PY'
import h5py, glob
n = 0
for f in sorted(glob.glob('ck/*.part-*.h5')):
    with h5py.File(f, 'r+') as h:
        names = []
        h['tensors'].visititems(lambda k, o: names.append(k) if isinstance(o, h5py.Dataset) and k.startswith('optim/') and o.size > 1 else None)
        for k in names:
            a = h['tensors'][k][...]; a.flat[0] += 1; h['tensors'][k][...] = a; n += 1
print("corrupted the first element of", n, "optimizer datasets (crc32 attributes left as they were)")
PY
$B generate --checkpoint ck --prompt "the quick" --tokens 30 --seed 1 > gen_after.txt 2>&1
cmp gen_before.txt gen_after.txt && echo "generate: the same text as before the corruption"
$B eval --config jobs/text_gpt.toml $SET --checkpoint ck --data data 2>&1 | tail -1
$MPI $B train --config jobs/text_gpt.toml $SET --max-steps 4 --checkpoint-dir ck --resume ck 2>&1 | grep -o "tensor 'optim[^']*' in part file '[^']*' fails its checksum" | head -1
