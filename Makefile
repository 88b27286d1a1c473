# Thin front for CMake. The Debian packages live in two lists, each in one
# place: RUN_PACKAGES build and run ringtrain (`make run`), TEST_PACKAGES add
# what the tests and benchmarks need (`make test`: GoogleTest, Google
# Benchmark, PyTorch and h5py for the references, Slurm and munge for the
# cluster tests, SimGrid for the SMPI study).
BUILD ?= build
JOBS  ?= $(shell nproc)
CMAKE_FLAGS ?=
NP ?= 2
CONFIG ?= jobs/fashion_cnn.toml

RUN_PACKAGES := \
  build-essential cmake pkg-config ccache \
  openmpi-bin libopenmpi-dev \
  libhdf5-openmpi-dev hdf5-tools zlib1g-dev \
  libzip-dev libpng-dev libjpeg62-turbo-dev libsentencepiece-dev \
  libdnnl-dev libopenblas-dev \
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev \
  dataset-fashion-mnist fortunes

TEST_PACKAGES := \
  libgtest-dev googletest libbenchmark-dev \
  python3-torch python3-sentencepiece python3-h5py python3-numpy python3-matplotlib python3-pil \
  munge slurmctld slurmd slurm-client iproute2 util-linux libsimgrid-dev

MPIRUN := mpirun --allow-run-as-root --oversubscribe

.PHONY: deps deps-run build build-run install uninstall test test-gpu bench run prepare prepare-text clean cluster-up cluster-down docs figures

# install-packages LIST: apt-get installs whichever of LIST is missing.
define install-packages
	@missing=$$(for p in $(1); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "make: installing" $$missing; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	else echo "make: all $(words $(1)) Debian packages present"; fi
endef

deps-run:
	$(call install-packages,$(RUN_PACKAGES))

deps: deps-run
	$(call install-packages,$(TEST_PACKAGES))

# Configured every time (seconds when cached), so that a build first made by
# `make run` picks up the tests once `make test` has installed GoogleTest.
CONFIGURE = cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) \
	  $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)

build: deps
	$(CONFIGURE) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

build-run: deps-run
	$(CONFIGURE) >/dev/null
	cmake --build $(BUILD) -j $(JOBS) --target ringtrain

test: build
	@start=$$(date +%s); status=0; \
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS) || status=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s"; exit $$status

# On a GPU host (see tests/gpu/run_on_gpu_host.sh for hosts without MPI/HDF5/oneDNN).
test-gpu: build
	cd $(BUILD) && ctest --output-on-failure -L gpu

bench: build
	bench/run_all.sh $(BUILD)

# docs/configuration.md from the binary (`ctest -R docs/configuration` fails when it is stale).
docs: build-run
	docs/gen_configuration.sh $(BUILD)/ringtrain

# The PNG plots of docs/ from the data checked in under docs/data/ (Debian's python3 + matplotlib);
# MEASURE=1 first measures that data again on this machine (docs/figures.sh: minutes, see there).
figures:
	docs/figures.sh $(BUILD)

FASHION := data/fashion-mnist/fashion-mnist-train.h5

prepare: build-run
	@[ -f $(FASHION) ] || $(BUILD)/ringtrain prepare --dataset fashion-mnist --out data/fashion-mnist

# The language-model corpus: Debian's fortunes (about 2.5 MB of English), byte tokens, 10% for validation.
FORTUNES := data/fortunes/fortunes-train.h5

prepare-text: build-run
	@[ -f $(FORTUNES) ] || $(BUILD)/ringtrain prepare --dataset text --input /usr/share/games/fortunes --out data/fortunes

run: prepare
	OMP_NUM_THREADS=1 $(MPIRUN) -np $(NP) --bind-to none $(BUILD)/ringtrain train --config $(CONFIG) $(ARGS)

# A Slurm cluster on this machine (root): NODES emulated nodes in network namespaces.
#   make cluster-up NODES=2 ; . /run/ringtrain-slurm/rtslm/env.sh ; sbatch jobs/sbatch_fashion.sh ... ; make cluster-down
NODES ?= 2
cluster-up: deps
	tests/slurm/cluster.sh up $(NODES)

cluster-down:
	tests/slurm/cluster.sh down

# make install PREFIX=DIR (default /usr/local): bin/ringtrain, the libraries,
# include/ringtrain, lib/cmake/ringtrain (find_package) and lib/pkgconfig.
PREFIX ?= /usr/local
install: build-run
	cmake --install $(BUILD) --prefix $(PREFIX)

uninstall:
	cmake --build $(BUILD) --target uninstall

clean:
	rm -rf $(BUILD)
