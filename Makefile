# Grove's short commands over CMake (the real build). Everything installs what it is missing first.
#   make quickstart   deps + build + the main job
#   make test         deps + build + every test (ctest)
#   make install PREFIX=/opt/grove
#   make device-bundle  build/device-bundle: what a GPU machine needs to run tools/device/run.sh
#   make fuzz [FUZZ_SECONDS=480] [FUZZ_RUNS=N]  every parser's fuzz target for FUZZ_SECONDS each,
#                     or until N executions (tools/fuzz.sh)
BUILD ?= build
PREFIX ?= /usr/local
JOBS ?= 2
export CCACHE_DIR ?= $(HOME)/.cache/grove-ccache
# compiler-cache hits across clones in other folders (CI's fresh clones): paths below the checkout
# are hashed relative to it, and the build folder's path is left out of the hash
export CCACHE_BASEDIR ?= $(CURDIR)
export CCACHE_NOHASHDIR ?= 1
# the translation units that include torch compile against a precompiled header; without these
# ccache compiles every one of them again ("could not use precompiled header")
export CCACHE_SLOPPINESS ?= pch_defines,time_macros

FUZZ_SECONDS ?= 480

.PHONY: all deps configure build test quickstart install device-bundle fuzz-build fuzz clean

all: build

deps:
	@bash .ci/deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

configure: deps $(BUILD)/build.ninja

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# the fuzz targets are built too: ctest runs each for a short smoke on its committed inputs.
# JOBS tests run at once, each with its share of the cores as OpenMP threads: more threads than
# cores spin against each other (the Sft and LoRA tests: 96 s with 2 threads each, 73 s with 1)
TEST_THREADS ?= $(shell echo $$(( $$(nproc) / $(JOBS) > 1 ? $$(nproc) / $(JOBS) : 1 )))
test: build fuzz-build
	cd $(BUILD) && OMP_NUM_THREADS=$(TEST_THREADS) ctest --output-on-failure -j $(JOBS)

fuzz-build:
	@bash .ci/deps.sh fuzz
	JOBS=$(JOBS) bash tools/fuzz.sh build

fuzz: fuzz-build
	bash tools/fuzz.sh run $(FUZZ_SECONDS)

quickstart: build
	GROVE=$(BUILD)/bin/grove bash examples/arithmetic/quickstart.sh

device-bundle: build
	bash tools/device/make_bundle.sh $(BUILD)

install: build
	cmake --install $(BUILD) --prefix $(PREFIX)

clean:
	rm -rf $(BUILD)
