# Thin front for CMake. `make deps` installs every Debian package the project
# needs (the one list, below); `make test` builds and runs the whole suite.
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=
NP ?= 2
CONFIG ?= jobs/fashion_cnn.toml

DEBIAN_PACKAGES := \
  build-essential cmake pkg-config ccache \
  openmpi-bin libopenmpi-dev \
  libhdf5-openmpi-dev hdf5-tools zlib1g-dev \
  libdnnl-dev libopenblas-dev \
  libgtest-dev googletest libbenchmark-dev \
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev \
  dataset-fashion-mnist \
  python3-torch python3-h5py python3-numpy python3-matplotlib \
  munge slurmctld slurmd slurm-client iproute2 util-linux libsimgrid-dev

MPIRUN := mpirun --allow-run-as-root --oversubscribe

.PHONY: deps build test test-gpu bench run prepare clean cluster-up cluster-down

deps:
	@missing=$$(dpkg-query -W -f='$${Package} $${Status}\n' $(DEBIAN_PACKAGES) 2>/dev/null | \
	  awk '$$NF=="installed"{print $$1}' | sort | comm -13 - $$(printf '%s\n' $(DEBIAN_PACKAGES) | sort > /tmp/.rt-pkgs && echo /tmp/.rt-pkgs)); \
	if [ -n "$$missing" ]; then \
	  echo "make deps: installing $$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "make deps: all $(words $(DEBIAN_PACKAGES)) Debian packages present"; fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) \
	  $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

# On a GPU host (see tests/gpu/run_on_gpu_host.sh for hosts without MPI/HDF5/oneDNN).
test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

bench: build
	bench/run_all.sh $(BUILD)

FASHION := data/fashion-mnist/fashion-mnist-train.h5

prepare: build
	@[ -f $(FASHION) ] || $(BUILD)/ringtrain prepare --dataset fashion-mnist --out data/fashion-mnist

run: prepare
	OMP_NUM_THREADS=1 $(MPIRUN) -np $(NP) --bind-to none $(BUILD)/ringtrain train --config $(CONFIG) $(ARGS)

# A Slurm cluster on this machine (root): NODES emulated nodes in network namespaces.
#   make cluster-up NODES=2 ; . /run/ringtrain-slurm/rtslm/env.sh ; sbatch jobs/sbatch_fashion.sh ... ; make cluster-down
NODES ?= 2
cluster-up: deps
	tests/slurm/cluster.sh up $(NODES)

cluster-down:
	tests/slurm/cluster.sh down

clean:
	rm -rf $(BUILD)
