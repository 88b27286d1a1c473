#!/bin/sh
# Your own data, end to end: a .npz -> ringtrain prepare -> prepare --check -> train.
# Also the h5py route (write_h5.py) and a folder of PNG images (--dataset images).
#   examples/own_data/run.sh            (from the repository root, after `make build`)
set -eu
RT=${RT:-build/ringtrain}
OUT=${OUT:-runs/own_data}
NP=${NP:-2}
MPIRUN="mpirun --allow-run-as-root --oversubscribe --bind-to none -np $NP"
mkdir -p "$OUT"
/usr/bin/python3 examples/own_data/make_npz.py "$OUT/mydata.npz" 20000 5000
$MPIRUN $RT prepare --dataset npz --input "$OUT/mydata.npz" --out "$OUT/prepared"
$RT prepare --check "$OUT/prepared"
# The same data written by h5py directly, checked against the schema:
/usr/bin/python3 examples/own_data/write_h5.py "$OUT/mydata.npz" "$OUT/h5py" mydata
$RT prepare --check "$OUT/h5py"
OMP_NUM_THREADS=1 $MPIRUN $RT train --config jobs/layers_lenet5.toml \
  --set data.train="$OUT/prepared" --set data.test="$OUT/prepared" --set train.epochs=2 --set checkpoint.dir=
