#!/usr/bin/env bash
# Run ringtrain's GPU tests and benchmarks on a bare GPU host (no MPI, HDF5,
# oneDNN installed; no network) — see tests/gpu/README.md.
#
#   tests/gpu/run_on_gpu_host.sh bundle [--build DIR] [--with-cuda-libs] [--with-data] [--archive]
#       (here, after building DIR, default build-cuda) copies the binaries
#       (ringtrain, test_gpu_*, bench_gpu_*, plus test_comm_* as a non-GPU MPI
#       smoke test), the CUDA module libringtrain_cuda.so (beside the ringtrain
#       libraries, where ringtrain loads it) and every shared library they and Open MPI's plugins load
#       into .gpu-bundle/ (libcuda and the NVIDIA driver libraries excluded: the
#       host has its own driver; glibc excluded: the host's is used). Open MPI
#       is relocated: mpirun/orted, the plugin dir (openmpi3), help files and
#       PMIx go under .gpu-bundle/ompi and OPAL_PREFIX points there.
#       --with-cuda-libs also bundles cudart/cuBLAS(Lt)/cuDNN 9 (all engine
#       libraries, which cuDNN dlopens) and NVRTC from the toolkit, for hosts
#       without a CUDA 13 toolkit. --with-data copies Debian's Fashion-MNIST IDX
#       files to .gpu-data/ (for 'job'). --archive writes .gpu-bundle/bundle.tar.xz.
#   tests/gpu/run_on_gpu_host.sh check
#       ldd every bundled ELF with only the bundle on LD_LIBRARY_PATH and list
#       what is missing (libcuda is expected to be missing on a machine without a GPU).
#   tests/gpu/run_on_gpu_host.sh run [--np 2] [--tests-only|--bench-only] [--filter REGEX]
#       (on the GPU host, from the repository root) runs every GPU test (mpi_*
#       at 1..np ranks sharing the GPUs) and the GPU benchmarks; logs and CSV/JSON
#       go to .gpu-bundle/results/. Exit status: number of failed tests.
#   tests/gpu/run_on_gpu_host.sh job [--idx DIR] [--np 1] [--precisions fp32,bf16] [-- ARGS...]
#       (on the GPU host) prepares Fashion-MNIST from the IDX .gz files in DIR
#       (default .gpu-data/, copied there by 'bundle --with-data') and runs the
#       README's main job (jobs/fashion_cnn.toml) with --device cuda in each
#       precision; logs and metrics go to .gpu-bundle/results/job-*.
#   tests/gpu/run_on_gpu_host.sh all
#       (on the GPU host) the whole check in one command: 'run' (every test at
#       1..2 ranks, every benchmark) and then 'job' at 1 rank (fp32, bf16) and
#       2 ranks (fp32) when .gpu-data/ holds the IDX files.
#   tests/gpu/run_on_gpu_host.sh mpi-smoke
#       runs 2 ranks of test_comm_* from the bundle's own mpirun (OPAL_PREFIX),
#       to check the relocated Open MPI without a GPU.
#
# The 8-minute GPU check (docs/gpu.md, "The GPU check"): two commands.
#   tests/gpu/run_on_gpu_host.sh carry [--build DIR]
#       (here) builds ringtrain, every test_gpu_*, bench_gpu_train_step and bench_gpu_attention in DIR
#       (default build) at -j 2, bundles them and writes .gpu-carry/bundle.tar.xz
#       (git-ignored, under the device tool's 64 MiB), then prints the call.
#   tests/gpu/run_on_gpu_host.sh gpu-check [--budget 480] [--out DIR] [--tests-only] [--np 2] [--models cnn,resnet,vit]
#                                         [--test-timeout 60] [--only REGEX] [--precisions fp32,tf32,bf16,fp16]
#       (on the GPU host) unpacks .gpu-carry/bundle.tar.xz and runs every GPU
#       test (mpi_* at 1..np ranks), then bench_gpu_attention and bench_gpu_train_step (unless --tests-only), within
#       --budget seconds of wall time in all, each test within --test-timeout
#       seconds (a hang costs a minute, not the budget), only the test binaries
#       whose names match --only when given; raw logs (logs.tar.gz), JSON, gpu.csv and
#       summary.txt (status and seconds per run) go to DIR (default $OUT, else
#       .gpu-bundle/results) for docs/data/gpu/. Exit status: failed tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
B="${RINGTRAIN_BUNDLE:-$ROOT/.gpu-bundle}"
MPI_LIBDIR=/usr/lib/x86_64-linux-gnu/openmpi/lib
PMIX_DIR=/usr/lib/x86_64-linux-gnu/pmix2
CUDA_LIB=/usr/local/cuda/lib64

# Libraries never bundled: the driver (the host's must match its kernel module)
# and glibc (the host's loader must load it).
is_excluded() {
  case "$(basename "$1")" in
    libcuda.so*|libnvidia-*|libnvcuvid*|libcudadebugger*) return 0 ;;
    ld-linux*|libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|libanl.so*|libnsl.so*) return 0 ;;
  esac
  return 1
}
is_cuda_toolkit() {
  case "$(basename "$1")" in
    libcudart.so*|libcublas*.so*|libcudnn*.so*|libnvrtc*.so*|libnvJitLink*.so*|libcufft*|libcurand*|libcusparse*|libcusolver*) return 0 ;;
  esac
  return 1
}

copy_deps() {  # copy_deps ELF... : resolved dependencies into $B/lib
  local f dep
  for f in "$@"; do
    ldd "$f" 2>/dev/null | awk '/=> \//{print $3}' | while read -r dep; do
      is_excluded "$dep" && continue
      if is_cuda_toolkit "$dep" && [[ "$WITH_CUDA" != 1 ]]; then continue; fi
      [[ -e "$B/lib/$(basename "$dep")" ]] || cp -L "$dep" "$B/lib/"
    done
  done
}

cmd_bundle() {
  local build="$ROOT/build-cuda" archive=0
  WITH_CUDA=0
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --build) build="$(cd "$2" && pwd)"; shift 2 ;;
      --with-cuda-libs) WITH_CUDA=1; shift ;;
      --archive) archive=1; shift ;;
      --with-data) mkdir -p "$ROOT/.gpu-data"; cp /usr/share/datasets/fashion-mnist/*.gz "$ROOT/.gpu-data/"; shift ;;
      *) echo "bundle: unknown option $1" >&2; exit 2 ;;
    esac
  done
  [[ -d "$build" ]] || { echo "bundle: build dir $build not found (build with CUDA first)" >&2; exit 1; }
  rm -rf "$B"
  mkdir -p "$B/bin" "$B/lib" "$B/ompi/bin" "$B/ompi/share" "$B/results"
  local bins=()
  [[ -x "$build/ringtrain" ]] && bins+=("$build/ringtrain")
  # test_comm_mpi_allreduce: the relocated Open MPI's smoke test (mpi-smoke).
  while IFS= read -r f; do bins+=("$f"); done < <(find -L "$build/tests" "$build/bench" -maxdepth 1 -type f -perm -u+x \
      \( -name 'test_gpu_*' -o -name 'bench_gpu_*' -o -name 'test_comm_mpi_allreduce' \) 2>/dev/null | sort)
  [[ ${#bins[@]} -gt 0 ]] || { echo "bundle: no binaries in $build (build the test_gpu_* targets)" >&2; exit 1; }
  cp "${bins[@]}" "$B/bin/"
  echo "bundle: ${#bins[@]} binaries"
  # Relocated Open MPI: same layout below OPAL_PREFIX as below /usr.
  local rel_lib="$B/ompi/lib/x86_64-linux-gnu/openmpi/lib"
  mkdir -p "$rel_lib" "$B/ompi/lib/x86_64-linux-gnu/pmix2"
  cp -rL "$MPI_LIBDIR/openmpi3" "$rel_lib/"
  cp -rL /usr/share/openmpi "$B/ompi/share/"
  cp -rL "$PMIX_DIR/lib" "$PMIX_DIR/share" "$B/ompi/lib/x86_64-linux-gnu/pmix2/" 2>/dev/null || true
  cp -L "$(readlink -f /usr/bin/orterun)" "$B/ompi/bin/orterun"
  ln -sf orterun "$B/ompi/bin/mpirun"
  ln -sf orterun "$B/ompi/bin/mpiexec"
  cp -L /usr/bin/orted "$B/ompi/bin/orted"
  # The CUDA module: ringtrain dlopens it from beside libringtrain_core.so (docs/gpu.md), so it
  # must lie in lib/ even where no bundled binary links it.
  [[ -f "$build/libringtrain_cuda.so" ]] || { echo "bundle: no $build/libringtrain_cuda.so (build with CUDA)" >&2; exit 1; }
  cp -L "$build/libringtrain_cuda.so" "$B/lib/"
  copy_deps "$B"/bin/* "$B"/lib/libringtrain_cuda.so "$B"/ompi/bin/orterun "$B"/ompi/bin/orted "$rel_lib"/openmpi3/*.so
  # Open MPI opens its own libraries by name from libdir as well.
  for l in "$MPI_LIBDIR"/lib*.so; do cp -L "$l" "$rel_lib/" 2>/dev/null || true; done
  if [[ "$WITH_CUDA" == 1 ]]; then
    # cuDNN 9 dlopens its engine libraries; NVRTC for runtime-compiled engines.
    cp -L "$CUDA_LIB"/libcudnn*.so.9 "$CUDA_LIB"/libnvrtc*.so.* "$B/lib/" 2>/dev/null || true
    copy_deps "$B"/lib/libcudnn*.so.9
  fi
  # The PyTorch reference for the benchmarks (runs with the host's python3).
  mkdir -p "$B/reference" && cp "$ROOT"/bench/reference/*.py "$B/reference/" 2>/dev/null || true
  cp "$ROOT/tests/gpu/run_on_gpu_host.sh" "$B/"
  echo "bundle: $(ls "$B/lib" | wc -l) libraries, $(du -sh "$B" | cut -f1) in $B"
  if [[ "$archive" == 1 ]]; then
    # -9e, one thread: the 64 MiB dictionary spans the binaries, whose CUDA
    # fatbins repeat (184 MB -> 29 MB, small enough to travel with the data).
    XZ_OPT="-9e -T1" tar -C "$B" -cJf "$B/../gpu-bundle.tar.xz" --exclude=results . &&
      mv "$B/../gpu-bundle.tar.xz" "$B/bundle.tar.xz"
    echo "bundle: archive $(du -sh "$B/bundle.tar.xz" | cut -f1) at $B/bundle.tar.xz"
  fi
  cmd_check || true
}

bundle_env() {
  if [[ ! -d "$B/bin" && -f "$B/bundle.tar.xz" ]]; then tar -C "$B" -xJf "$B/bundle.tar.xz"; fi
  [[ -d "$B/bin" ]] || { echo "no bundle at $B: run '$0 bundle' on the build machine first" >&2; exit 1; }
  export LD_LIBRARY_PATH="$B/lib:$B/ompi/lib/x86_64-linux-gnu/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OPAL_PREFIX="$B/ompi"
  export PMIX_INSTALL_PREFIX="$B/ompi/lib/x86_64-linux-gnu/pmix2" PMIX_PREFIX="$B/ompi/lib/x86_64-linux-gnu/pmix2"
  export PATH="$B/ompi/bin:$PATH"
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  # Single node, possibly a container: shared memory without CMA, no IB/UCX probing.
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
  # PMIx finds no compression plugin in the relocated tree: harmless, silence it.
  export PMIX_MCA_pcompress_base_silence_warning=1
  export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_osc=^ucx OMPI_MCA_mca_base_component_show_load_errors=0
  export RINGTRAIN_SOURCE_DIR="$ROOT"
  find_cuda_libs
}

# Without --with-cuda-libs the host must provide cudart/cuBLAS/cuDNN 9 of CUDA
# 13: from the loader's cache, the toolkit, or the pip wheels (nvidia-*) that
# a PyTorch install brings. Add the first directory that has each one.
find_cuda_libs() {
  local lib d found
  for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libcudnn.so.9 libnvrtc.so.13; do
    [[ -e "$B/lib/$lib" ]] && continue
    ldconfig -p 2>/dev/null | grep -q "$lib " && continue
    found=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import site,glob; print(" ".join(d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib") + glob.glob(p + "/nvidia/cu13/lib")))' 2>/dev/null); do
      if [[ -e "$d/$lib" ]]; then found="$d"; break; fi
    done
    if [[ -n "$found" ]]; then
      case ":$LD_LIBRARY_PATH:" in *":$found:"*) ;; *) export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$found" ;; esac
    else
      echo "warning: $lib not found on this host (bundle with --with-cuda-libs)" >&2
    fi
  done
}

cmd_check() {
  # ldd with a bare environment and only the bundle on LD_LIBRARY_PATH. A
  # library still found outside the bundle (through a RUNPATH such as the
  # toolkit's lib64) would be missing on the GPU host, so it is reported too.
  local missing=0 outside=0 f out ext
  for f in "$B"/bin/* "$B"/ompi/bin/orterun "$B"/ompi/bin/orted "$B"/lib/*.so* \
           "$B"/ompi/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*.so; do
    [[ -f "$f" ]] || continue
    out=$(env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH="$B/lib:$B/ompi/lib/x86_64-linux-gnu/openmpi/lib" ldd "$f" 2>&1 || true)
    if echo "$out" | grep -q "not found"; then
      echo "$(basename "$f"): $(echo "$out" | grep "not found" | awk '{print $1}' | tr '\n' ' ')"
      if echo "$out" | grep "not found" | grep -qv "libcuda.so"; then missing=1; fi
    fi
    ext=$(echo "$out" | awk '/=> \//{print $3}' | grep -v "^$B/" | while read -r l; do
            is_excluded "$l" || echo "$(basename "$l")"; done | sort -u | tr '\n' ' ')
    if [[ -n "$ext" ]]; then outside=1; echo "$(basename "$f"): outside the bundle: $ext"; fi
  done
  if [[ "$missing" == 0 && "$outside" == 0 ]]; then
    echo "check: self-contained (only glibc and the driver, libcuda.so, come from the host)"
  elif [[ "$missing" == 0 ]]; then
    echo "check: everything resolves, but the libraries listed above come from outside the bundle"
    echo "       (CUDA toolkit libraries are bundled only with --with-cuda-libs)"
  else
    echo "check: libraries besides libcuda are missing (see above)"
  fi
  return "$missing"
}

cmd_mpi_smoke() {
  bundle_env
  local t
  t=$(ls "$B"/bin/test_comm_mpi_* 2>/dev/null | head -1 || true)
  [[ -n "$t" ]] || { echo "mpi-smoke: no test_comm_mpi_* binary bundled" >&2; exit 1; }
  echo "mpi-smoke: $(command -v mpirun) -np 2 $(basename "$t")"
  env -i HOME="$HOME" PATH="$PATH" LD_LIBRARY_PATH="$LD_LIBRARY_PATH" OPAL_PREFIX="$OPAL_PREFIX" \
      PMIX_INSTALL_PREFIX="$PMIX_INSTALL_PREFIX" PMIX_PREFIX="$PMIX_PREFIX" PMIX_MCA_pcompress_base_silence_warning=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none \
      RINGTRAIN_SOURCE_DIR="$ROOT" \
      "$B/ompi/bin/mpirun" -np 2 --oversubscribe "$t" --gtest_brief=1
}

cmd_run() {
  local np=2 tests=1 bench=1 filter=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --np) np="$2"; shift 2 ;;
      --tests-only) bench=0; shift ;;
      --bench-only) tests=0; shift ;;
      --filter) filter="$2"; shift 2 ;;
      *) echo "run: unknown option $1" >&2; exit 2 ;;
    esac
  done
  bundle_env
  local R="$B/results" failed=0 passed=0 skipped=0 t name n rc
  mkdir -p "$R"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$R/gpu.csv"
  if [[ "$tests" == 1 ]]; then
    for t in "$B"/bin/test_gpu_*; do
      name=$(basename "$t")
      [[ -z "$filter" || "$name" =~ $filter ]] || continue
      if [[ "$name" == test_gpu_mpi_* ]]; then
        for ((n = 1; n <= np; n++)); do
          echo "== $name at $n ranks"
          set +e
          timeout "${RT_GPU_TIMEOUT:-300}" mpirun -np "$n" --oversubscribe "$t" --rt-gpu > "$R/$name.np$n.log" 2>&1; rc=$?
          set -e
          report "$name np$n" "$rc" "$R/$name.np$n.log"
        done
      else
        echo "== $name"
        set +e
        timeout "${RT_GPU_TIMEOUT:-300}" "$t" --rt-gpu > "$R/$name.log" 2>&1; rc=$?
        set -e
        report "$name" "$rc" "$R/$name.log"
      fi
    done
    echo "tests: $passed passed, $failed failed, $skipped skipped (logs in $R)"
  fi
  if [[ "$bench" == 1 ]]; then
    for t in "$B"/bin/bench_gpu_*; do
      [[ -x "$t" ]] || continue
      name=$(basename "$t")
      [[ -z "$filter" || "$name" =~ $filter ]] || continue
      echo "== $name"
      set +e
      case "$name" in
        *allreduce*) timeout 600 mpirun -np 2 --oversubscribe "$t" --out "$R/$name.json" 2>&1 | tee "$R/$name.log" ;;
        *train_step*) timeout 600 "$t" --reference "$B/reference" --out "$R/$name.json" 2>&1 | tee "$R/$name.log" ;;
        *) timeout 600 "$t" --out "$R/$name.json" 2>&1 | tee "$R/$name.log" ;;
      esac
      set -e
    done
  fi
  return "$failed"
}

cmd_job() {
  local idx="$ROOT/.gpu-data" np=1 precisions="fp32,bf16" extra=() prec rc
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --idx) idx="$2"; shift 2 ;;
      --np) np="$2"; shift 2 ;;
      --precisions) precisions="$2"; shift 2 ;;
      --) shift; extra=("$@"); break ;;
      *) echo "job: unknown option $1" >&2; exit 2 ;;
    esac
  done
  bundle_env
  local R="$B/results" data="$ROOT/data/fashion-mnist"
  mkdir -p "$R"
  [[ -f "$data/fashion-mnist-train.h5" ]] || \
    mpirun -np 1 "$B/bin/ringtrain" prepare --dataset fashion-mnist --input "$idx" --out "$data"
  IFS=, read -ra precs <<< "$precisions"
  for prec in "${precs[@]}"; do
    echo "== main job, --device cuda, $prec, $np rank(s)"
    set +e
    (cd "$ROOT" && timeout 900 mpirun -np "$np" --bind-to none "$B/bin/ringtrain" train --config jobs/fashion_cnn.toml \
        --device cuda --set train.precision="$prec" --set checkpoint.dir="$R/job-$prec-np$np" \
        --set log.metrics="$R/job-$prec-np$np.jsonl" "${extra[@]}") 2>&1 | tee "$R/job-$prec-np$np.log"
    rc=${PIPESTATUS[0]}
    set -e
    echo "   rc $rc"
  done
}

# The targets the GPU check needs: the binary, every GPU test and the step and attention benchmarks.
gpu_targets() {
  local f
  echo ringtrain bench_gpu_train_step bench_gpu_attention
  for f in "$ROOT"/tests/gpu/*.cpp; do echo "test_gpu_$(basename "$f" .cpp)"; done
}

cmd_carry() {
  local build="$ROOT/build"
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --build) build="$2"; shift 2 ;;
      *) echo "carry: unknown option $1" >&2; exit 2 ;;
    esac
  done
  [[ -f "$build/CMakeCache.txt" ]] || { echo "carry: configure $build first (cmake -S . -B $build)" >&2; exit 1; }
  grep -q "RINGTRAIN_HAVE_CUDA:INTERNAL=ON\|RINGTRAIN_HAVE_CUDA:BOOL=ON" "$build/CMakeCache.txt" ||
    [[ -n "$(find "$build" -maxdepth 1 -name 'libringtrain_cuda.so*' -print -quit)" ]] ||
    echo "carry: warning: $build may lack the CUDA module (nvcc found at configure time?)" >&2
  # shellcheck disable=SC2046
  cmake --build "$build" -j "${JOBS:-2}" --target $(gpu_targets)
  # Only what the check runs travels: older test_gpu_* or bench binaries in the
  # build folder are left out by bundling from a folder of links.
  local pick="$ROOT/.gpu-carry/pick" t
  rm -rf "$ROOT/.gpu-carry" && mkdir -p "$pick/tests" "$pick/bench"
  ln -s "$build/ringtrain" "$pick/ringtrain"
  ln -s "$build"/libringtrain_cuda.so "$pick/libringtrain_cuda.so"
  for t in $(gpu_targets); do
    [[ "$t" == test_gpu_* ]] && ln -s "$build/tests/$t" "$pick/tests/$t"
    [[ "$t" == bench_gpu_* ]] && ln -s "$build/bench/$t" "$pick/bench/$t"
  done
  cmd_bundle --build "$pick" --archive
  mv "$B/bundle.tar.xz" "$ROOT/.gpu-carry/bundle.tar.xz"
  rm -rf "$pick"
  { git -C "$ROOT" rev-parse --short HEAD; git -C "$ROOT" status --porcelain | wc -l | sed 's/$/ uncommitted changes/'; } \
    > "$ROOT/.gpu-carry/built-from.txt" 2>/dev/null || true
  local mib=$(( $(stat -c %s "$ROOT/.gpu-carry/bundle.tar.xz") / 1048576 ))
  echo "carry: .gpu-carry/bundle.tar.xz, $mib MiB (the device tool carries at most 64 MiB)"
  [[ "$mib" -lt 64 ]] || { echo "carry: too large to carry" >&2; exit 1; }
  echo "carry: now run, with the device tool: carry [\".gpu-carry\"], timeout_s 600,"
  echo "       command: tests/gpu/run_on_gpu_host.sh gpu-check --budget 480"
}

cmd_gpu_check() {
  local budget=480 out="${OUT:-}" bench=1 np_max=2 models="cnn resnet vit" test_timeout=60 only="" precisions=""
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --budget) budget="$2"; shift 2 ;;
      --tests-only) bench=0; shift ;;
      --np) np_max="$2"; shift 2 ;;
      --models) models="${2//,/ }"; shift 2 ;;
      --out) out="$2"; shift 2 ;;
      --test-timeout) test_timeout="$2"; shift 2 ;;
      --only) only="$2"; shift 2 ;;
      --precisions) precisions="$2"; shift 2 ;;
      *) echo "gpu-check: unknown option $1" >&2; exit 2 ;;
    esac
  done
  local t0=$SECONDS
  if [[ -f "$ROOT/.gpu-carry/bundle.tar.xz" ]]; then
    rm -rf "$B" && mkdir -p "$B" && tar -C "$B" -xJf "$ROOT/.gpu-carry/bundle.tar.xz"
  fi
  bundle_env
  local R="${out:-$B/results}" S name n rc left t1 failed=0 passed=0 skipped=0 t
  mkdir -p "$R"
  S="$R/summary.txt"
  : > "$S"
  echo "gpu-check: bundle built from $(tr '\n' ' ' < "$ROOT/.gpu-carry/built-from.txt" 2>/dev/null || echo '?')," \
       "budget ${budget} s, unpacked in $((SECONDS - t0)) s" | tee -a "$S"
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$R/gpu.csv"
  # runs NAME LOG CMD...: one timed run within what is left of the budget.
  one() {
    local name="$1" log="$2"; shift 2
    left=$((budget - (SECONDS - t0)))
    if [[ "$left" -lt 15 ]]; then
      echo "$name: NOT RUN (budget spent)" | tee -a "$S"; failed=$((failed + 1)); return
    fi
    t1=$SECONDS
    set +e
    local lim="${RT_GPU_TIMEOUT:-$limit}"
    timeout -k 5 "$((left < lim ? left : lim))" "$@" > "$log" 2>&1; rc=$?
    set -e
    case "$rc" in
      0) passed=$((passed + 1)); echo "$name: passed ($((SECONDS - t1)) s)" | tee -a "$S" ;;
      77) skipped=$((skipped + 1)); echo "$name: SKIPPED ($(grep -m1 SKIPPED "$log"))" | tee -a "$S" ;;
      124|137) failed=$((failed + 1)); echo "$name: TIMED OUT after $((SECONDS - t1)) s" | tee -a "$S" ;;
      *) failed=$((failed + 1)); echo "$name: FAILED rc $rc ($((SECONDS - t1)) s)" | tee -a "$S"; tail -15 "$log" ;;
    esac
  }
  local limit="$test_timeout"
  for t in "$B"/bin/test_gpu_*; do
    name=$(basename "$t")
    [[ -z "$only" || "$name" =~ $only ]] || continue
    if [[ "$name" == test_gpu_mpi_* ]]; then
      for ((n = 1; n <= np_max; n++)); do
        one "$name np$n" "$R/$name.np$n.log" mpirun -np "$n" --oversubscribe "$t" --rt-gpu
      done
    else
      one "$name" "$R/$name.log" "$t" --rt-gpu
    fi
  done
  echo "tests: $passed passed, $failed failed, $skipped skipped" | tee -a "$S"
  # The step benchmark gets what is left, one model per process so that one
  # failure keeps the others' figures (PyTorch beside it where the host has it).
  # The attention core (gpt's tiled kernel vs cuBLAS dense and PyTorch SDPA): seconds.
  if [[ "$bench" == 1 && -x "$B/bin/bench_gpu_attention" ]]; then
    RT_GPU_TIMEOUT=90 one "bench_gpu_attention" "$R/bench_gpu_attention.log" "$B/bin/bench_gpu_attention" \
      --reference "$B/reference" --iters 10 --out "$R/bench_gpu_attention.json"
  fi
  t="$B/bin/bench_gpu_train_step"
  local m share
  for m in $([[ "$bench" == 1 ]] && echo "$models"); do
    share=2; [[ "$m" == vit ]] && share=1
    RT_GPU_TIMEOUT=$(( (budget - (SECONDS - t0)) / share )) one "bench_gpu_train_step $m" \
      "$R/bench_gpu_train_step.$m.log" "$t" --models "$m" --reference "$B/reference" --iters 20 \
      --out "$R/bench_gpu_train_step.$m.json" ${precisions:+--precisions "$precisions"}
  done
  echo "gpu-check: $((SECONDS - t0)) s of ${budget}; raw outputs in $R (copy them to docs/data/gpu/)" | tee -a "$S"
  # One archive of the logs: the device tool brings back only a few files.
  (cd "$R" && tar -czf logs.tar.gz ./*.log && rm -f ./*.log) || true
  return "$failed"
}

report() {  # report NAME RC LOG
  case "$2" in
    0) passed=$((passed + 1)); echo "   passed" ;;
    77) skipped=$((skipped + 1)); echo "   $(grep -m1 SKIPPED "$3" || echo SKIPPED)" ;;
    *) failed=$((failed + 1)); echo "   FAILED (rc $2), last lines of $3:"; tail -20 "$3" ;;
  esac
}

case "${1:-}" in
  bundle) shift; cmd_bundle "$@" ;;
  check) shift; cmd_check ;;
  run) shift; cmd_run "$@" ;;
  job) shift; cmd_job "$@" ;;
  all)
    shift
    set +e
    cmd_run "$@"; failed=$?
    if compgen -G "$ROOT/.gpu-data/*idx3-ubyte.gz" >/dev/null; then
      cmd_job --precisions fp32,bf16
      cmd_job --np 2 --precisions fp32
    fi
    exit "$failed" ;;
  mpi-smoke) shift; cmd_mpi_smoke ;;
  carry) shift; cmd_carry "$@" ;;
  gpu-check) shift; cmd_gpu_check "$@" ;;
  *) sed -n '2,46p' "$0"; exit 2 ;;
esac
