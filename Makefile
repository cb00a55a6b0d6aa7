# Front for the two commands in README.md. Everything real lives in CMake.
BUILD ?= build
JOBS ?= $(shell nproc)
# Optimised, with line tables (-g1): a crash's backtrace names each function, file and line, and a
# build compiles about a fifth faster than with full debug information (-g).
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG" \
	"-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG"

.PHONY: run test build deps deps-run configure configure-run clean hello soak test-sanitize image \
	test-image test-slurm conformance wheel test-wheel compare scaling run-pytorch run-pytorch-stream bench-pytorch run-images

deps:
	@scripts/install-deps.sh

# What `make run` needs: the C++ build's packages, not the Python package's (PyTorch is 700 MB).
deps-run:
	@scripts/install-deps.sh --no-python

# CUDA code: AUTO builds it where nvcc and an NVIDIA GPU are found, ON wherever nvcc is (CI does,
# so that it compiles), OFF never. Read by the first configure of a build folder; later ones keep it
# (cmake -DTROUPE_CUDA=ON -B build changes it).
TROUPE_CUDA ?= AUTO

# Configures once; again when the Python package's packages arrived after a configure without them
# (a `make run` first, then `make test`), so that the Python module is built and its tests run.
CONFIGURE = if [ ! -f $(BUILD)/build.ninja ]; then cmake -S . -B $(BUILD) -G Ninja $(CMAKE_FLAGS) -DTROUPE_CUDA=$(TROUPE_CUDA); \
	elif grep -q '^TROUPE_PYTHON_MISSING:INTERNAL=ON' $(BUILD)/CMakeCache.txt && \
	  [ -d /usr/lib/cmake/pybind11 ] && ls /usr/include/python3*/Python.h >/dev/null 2>&1; then \
	  cmake -U '*Python3*' -U '*pybind11*' -S . -B $(BUILD); fi

configure: deps
	@$(CONFIGURE)

configure-run: deps-run
	@$(CONFIGURE)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# The main job's two programs only: a newcomer's first `make run` builds what it runs.
RUN_TARGETS = troupe hetero_train

# The main job (hetero_train, its default settings) in a local multi-process simulation of a
# heterogeneous cluster: 2 data instances and 1 dnn instance. The model and report.json stay in
# troupe-out/hetero_train-<time>/ (printed at the end). Fashion-MNIST arrives as the `train`
# channel, as on SageMaker.
run: configure-run
	cmake --build $(BUILD) -j $(JOBS) --target $(RUN_TARGETS)
	$(BUILD)/troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge \
	  --channel train=/usr/share/datasets/fashion-mnist -- $(BUILD)/apps/hetero_train/hetero_train

# Your data on the data group (docs/data.md): a JPEG ImageFolder made once from Fashion-MNIST
# (images of many sizes, coloured, some PNG and grey; apps/hetero_train/make_images.cpp), as the
# `train` and `test` channels of `make run`'s cluster, decoded and transformed by the augmenters.
IMAGES ?= $(BUILD)/images-data
IMAGES_TRANSFORM ?= RandomResizedCrop(32,scale=(0.5,1.0)),RandomHorizontalFlip(),ColorJitter(0.4,0.4,0.4),Normalize(imagenet)
run-images: configure-run
	cmake --build $(BUILD) -j $(JOBS) --target $(RUN_TARGETS) make_images
	test -d $(IMAGES)/train || $(BUILD)/apps/hetero_train/make_images $(IMAGES)
	$(BUILD)/troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge \
	  --channel train=$(IMAGES)/train --channel test=$(IMAGES)/test \
	  -- $(BUILD)/apps/hetero_train/hetero_train --transform '$(IMAGES_TRANSFORM)'

# troupe.data.DataLoader, the drop-in example (examples/pytorch/train_images.py, docs/pytorch.md):
# a small CNN on `make run-images`' ImageFolder, torchvision's transforms translated to troupe's C++
# pipeline on the data instances; `diff train_images_plain.py train_images.py` is the change. The same command
# on every instance, the package from the build's python/ folder.
run-pytorch: build
	cmake --build $(BUILD) -j $(JOBS) --target make_images
	test -d $(IMAGES)/train || $(BUILD)/apps/hetero_train/make_images $(IMAGES)
	PYTHONPATH=$(abspath $(BUILD))/python $(BUILD)/troupe sim --group data_group=2:ml.c5.xlarge \
	  --group dnn_group=1:ml.p3.2xlarge -- /usr/bin/python3 examples/pytorch/train_images.py \
	  $(abspath $(IMAGES))

# The seeds' PyTorch example (examples/pytorch/train.py): PyTorch's MNIST CNN fed batches that
# troupe's Fashion-MNIST augmenters make on the data group (troupe.data.AugmentedBatches).
run-pytorch-stream: build
	PYTHONPATH=$(abspath $(BUILD))/python $(BUILD)/troupe sim --group data_group=2:ml.c5.xlarge \
	  --group dnn_group=1:ml.p3.2xlarge -- /usr/bin/python3 examples/pytorch/train.py

# The example fed by troupe's data group against the same script with a DataLoader on the dnn
# instance's own CPUs, and troupe.data's per-batch cost against hetero_train's C++ trainer
# (apps/bench/pytorch, docs/pytorch.md). BENCH_PYTORCH_ROUNDS runs of each.
BENCH_PYTORCH_ROUNDS ?= 1
bench-pytorch: build
	/usr/bin/python3 apps/bench/pytorch/bench_pytorch.py --build $(BUILD) --rounds $(BENCH_PYTORCH_ROUNDS)

# The seeds' table, measured (apps/bench/compare): the same job on the dnn instance alone and on
# `make run`'s cluster, each instance with its type's share of this machine's CPUs, with the
# advisor's predictions. COMPARE_ROUNDS runs of each.
COMPARE_ROUNDS ?= 1
compare: build
	$(BUILD)/apps/bench/compare/bench_compare --rounds $(COMPARE_ROUNDS)

# Data-group scaling (docs/hetero_train.md, "Scaling the data group"): hetero_train with 0..8
# data instances, the dnn instance on one CPU and every data instance on the other with
# SCALING_SHARE of it (0.125: 8 of them fill it)
# (bench_pipeline's sweep), the advisor predicting each count from another count's run; then the
# plots (scripts/plot_scaling.py, matplotlib) in SCALING_OUT.
SCALING_OUT ?= troupe-out/scaling
SCALING_ROUNDS ?= 1
SCALING_SHARE ?= 0.125
scaling: build
	@scripts/install-deps.sh --plots
	mkdir -p $(SCALING_OUT)
	$(BUILD)/apps/bench/pipeline/bench_pipeline --sweep-data-instances 0,1,2,3,4,5,6,7,8 \
	  --data-cpu-share $(SCALING_SHARE) --predict-from 1 --augment heavy --sweep-blur 0 --augmenters-per-node 1 \
	  --rounds $(SCALING_ROUNDS) --json-out $(SCALING_OUT)/sweep.json
	/usr/bin/python3 scripts/plot_scaling.py $(SCALING_OUT)/sweep.json $(SCALING_OUT)

hello: configure-run
	cmake --build $(BUILD) -j $(JOBS) --target troupe hello
	$(BUILD)/troupe sim --group data_group=2:ml.c5.xlarge --group dnn_group=1:ml.p3.2xlarge -- $(BUILD)/apps/hello/hello

test: build
	cd $(BUILD) && ctest --output-on-failure -j 2 --timeout 300

# torch as the judge, the whole matrix (tests/conformance, docs/pytorch.md "torch as the judge"):
# every case under Debian's torch and under a torch 2.x from PyPI (a venv scripts/torch2-venv.sh
# makes once), in every shape; the report (case, shape, torch, verdict) in
# $(BUILD)/conformance/report.md, each run's output beside it. `make test` runs the quick half.
TORCH2_VENV ?= $(BUILD)/torch2-venv
conformance: build
	scripts/torch2-venv.sh $(TORCH2_VENV)
	/usr/bin/python3 tests/conformance/run.py --build $(BUILD) --python debian=/usr/bin/python3 \
	  --python pypi=$(abspath $(TORCH2_VENV))/bin/python --report $(BUILD)/conformance

# ASan + UBSan (README, "Sanitizers"): the runtime, the actors, the integration and fault tests,
# built in their own folder without CUDA and without what those tests do not need (benches, other
# apps), then run. Any finding stops the process that made it (halt_on_error) and fails its test.
# UBSan stays recoverable only so that tests/sanitize/ubsan.supp can silence third-party headers
# (a non-recoverable check aborts even when suppressed). Leaks are checked where LSan can run: in
# the test binaries; troupe's own processes end with _exit(), which LSan never sees. Line tables
# only (-g1): a report's frames still name each function, file and line, with less for CI's two
# cores to compile and link than full debug information (node.cpp: 27 s, not 46 s with -g). The
# build type is None, not Debug: Debug appends its own -g, which would override -g1. Unoptimised
# (-O0: node.cpp took 31 CPU-seconds to compile, not 68 at -O1), but for the actors, whose loops
# (the CPU trainer's, the augmenters') are the tests' CPU time: -O1 (TROUPE_ACTORS_FLAGS).
ASAN_BUILD ?= build-asan
SANITIZE := -fsanitize=address,undefined -fno-omit-frame-pointer
# g++ 12's flow warnings misfire on sanitized code (52 in KJ's headers alone): not in this build.
SANITIZE_WARNINGS := -Wno-maybe-uninitialized -Wno-stringop-overflow
SANITIZE_TARGETS ?= runtime_test coalescing_stream_test actors_tests cluster_test train_test \
	faults_test security_test
SANITIZE_TESTS ?= ^(runtime:|net:|actors[.]|cluster:|train:|faults:|security:)
SANITIZE_EXCLUDE ?=
# exitcode=86: a finding is never mistaken for an exit code a test expects (1 is JOB_FAILED), and
# the harness fails a test whose processes printed a report, whatever their exit codes.
SANITIZE_ENV := ASAN_OPTIONS=halt_on_error=1:detect_leaks=1:check_initialization_order=1:exitcode=86 \
	UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:exitcode=86:suppressions=$(CURDIR)/tests/sanitize/ubsan.supp
test-sanitize: deps
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=None -DTROUPE_NO_CUDA=ON \
	  "-DCMAKE_C_FLAGS=-O0 -g1 $(SANITIZE)" \
	  "-DCMAKE_CXX_FLAGS=-O0 -g1 $(SANITIZE) $(SANITIZE_WARNINGS)" -DTROUPE_ACTORS_FLAGS=-O1 \
	  "-DCMAKE_EXE_LINKER_FLAGS=$(SANITIZE)" > /dev/null
	cmake --build $(ASAN_BUILD) -j $(JOBS) --target $(SANITIZE_TARGETS)
	cd $(ASAN_BUILD) && $(SANITIZE_ENV) \
	  ctest -R '$(SANITIZE_TESTS)' $(if $(SANITIZE_EXCLUDE),-E '$(SANITIZE_EXCLUDE)') \
	    --output-on-failure -j 2 --timeout 600

# The whole fault matrix with random moments (docs/faults.md): one line per run, then a table of
# cases x outcomes; exits non-zero when a run failed. SOAK_SEED empty: a random seed, printed.
SOAK_CASES ?= 200
SOAK_MINUTES ?= 90
SOAK_SEED ?=
soak: build
	$(BUILD)/tests/faults/fault_soak --cases $(SOAK_CASES) --minutes $(SOAK_MINUTES) $(if $(SOAK_SEED),--seed $(SOAK_SEED))

# The SageMaker image (deploy/sagemaker/Dockerfile) as troupe-train:latest, with podman or docker
# (podman installed from Debian when neither is there). IMAGE_CUDA=off: CPU only, no CUDA stage.
# IMAGE_TORCH=off: without torch and troupe's Python package (the Dockerfile's runtime stage).
# Debian base images are made offline (debootstrap) when no image registry answers. docs/sagemaker.md.
IMAGE ?= troupe-train:latest
IMAGE_CUDA ?= on
IMAGE_TORCH ?= on
image:
	IMAGE=$(IMAGE) IMAGE_CUDA=$(IMAGE_CUDA) IMAGE_TORCH=$(IMAGE_TORCH) scripts/image.sh

# troupe's Python package as a wheel in dist/ (scripts/wheel.sh: its own CPU-only Release build in
# build-wheel/, the native libraries it needs copied in by auditwheel, the manylinux tag that is
# true of it), and that wheel in a fresh venv running the drop-in example under its own `troupe
# sim` (tests/wheel/wheel_test.sh). docs/pytorch.md, "Installing troupe from its wheel".
wheel: deps
	JOBS=$(JOBS) scripts/wheel.sh
# Each wheel in its Python's fresh venv: Debian's python3 with Debian's torch, the others
# (scripts/wheel-pythons.sh) with PyPI's torch and torchvision, pinned as make conformance's.
test-wheel: wheel
	tests/wheel/wheel_test.sh
	for py in $$(scripts/wheel-pythons.sh | tail -n +2); do \
	  TORCH_FROM=pypi PYTHON=$$py tests/wheel/wheel_test.sh || exit 1; done

# That image run as SageMaker runs it: three containers algo-1..3, /opt/ml roots, `train`
# (tests/image/image_test.py). IMAGE_TEST_SEED picks the fault moments (printed when random).
IMAGE_TEST_SEED ?=
test-image: deps
	python3 tests/image/image_test.py --image $(IMAGE) $(if $(IMAGE_TEST_SEED),--seed $(IMAGE_TEST_SEED))

# troupe under a real Slurm on this machine (tests/slurm/run.sh, docs/deploy.md): a private cluster
# of two slurmd, deploy/slurm/troupe-hetjob.sbatch running hetero_train as a het job: a normal run,
# a data node's process killed with kill -9 (troupe-node starts it again), scancel. Builds nothing:
# it runs $(BUILD)'s binaries. As root; installs Slurm, munge and MariaDB (for sacct) from Debian
# when missing; where this machine cannot run Slurm, prints one SKIP line and exits 77 (troupe's
# skip status: make then reports an error, .ci/run a skip).
test-slurm:
	tests/slurm/run.sh $(BUILD)

clean:
	rm -rf $(BUILD)
