# Front for the two commands in README.md. Everything real lives in CMake.
BUILD ?= build
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo

.PHONY: run test build deps configure clean hello soak

deps:
	@scripts/install-deps.sh

configure: deps
	@if [ ! -f $(BUILD)/build.ninja ]; then cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS); fi

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job (hetero_train, its default settings) in a local multi-process simulation of a
# heterogeneous cluster: 2 data instances and 1 dnn instance.
run: build
	$(BUILD)/troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge -- $(BUILD)/apps/hetero_train/hetero_train

hello: build
	$(BUILD)/troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge -- $(BUILD)/apps/hello/hello

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 300

# The whole fault matrix with random moments (docs/faults.md): one line per run, then a table of
# cases x outcomes; exits non-zero when a run failed. SOAK_SEED empty: a random seed, printed.
SOAK_CASES ?= 200
SOAK_MINUTES ?= 90
SOAK_SEED ?=
soak: build
	$(BUILD)/tests/faults/fault_soak --cases $(SOAK_CASES) --minutes $(SOAK_MINUTES) $(if $(SOAK_SEED),--seed $(SOAK_SEED))

clean:
	rm -rf $(BUILD)
