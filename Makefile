# make demo  — install what is missing, build, make the default model, run it in customconv_demo
# make test  — install what is missing, build, run everything under ctest
#
# Variables: PYTHON (interpreter with torch), BUILD_DIR, CMAKE_ARGS (extra configure
# arguments, e.g. -DCUSTOMCONV_CUDA=OFF or -DCUSTOMCONV_CUDA_ARCHS=90), CTEST_ARGS, JOBS.

PYTHON        ?= python3
BUILD_DIR     ?= build
TORCH_VERSION ?= 2.11.0
CUTLASS_VERSION ?= 4.2.0.0
JOBS          ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_ARGS    ?=
CTEST_ARGS    ?=
GENERATOR     := $(if $(shell command -v ninja 2>/dev/null),-G Ninja,)
PY_ENV         = PYTHONPATH=$(CURDIR)/python_stub CUSTOMCONV_LIBRARY=$(CURDIR)/$(BUILD_DIR)/libcustomconv.so
HAS_GPU        = $(shell $(PYTHON) -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null)

.PHONY: all deps configure build test demo install clean

all: build

# Installs only what is missing; an installed torch is never replaced.
deps:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install "torch==$(TORCH_VERSION)"
	@$(PYTHON) -c "import pytest, numpy, expecttest" 2>/dev/null || $(PYTHON) -m pip install pytest numpy expecttest
	@$(PYTHON) -c "import scikit_build_core" 2>/dev/null || $(PYTHON) -m pip install scikit-build-core
	@# CUTLASS's headers (the conv2d implicit-GEMM engine), where a CUDA compiler is found; only the headers are needed.
	@{ command -v nvcc >/dev/null || test -x /usr/local/cuda/bin/nvcc; } && \
	  { $(PYTHON) -c "import cutlass_library" 2>/dev/null || $(PYTHON) -m pip install --no-deps "nvidia-cutlass==$(CUTLASS_VERSION)"; } || true
	@# torchvision of the installed torch's release (torch 2.M pairs with torchvision 0.(M+15)), so pip keeps that torch.
	@$(PYTHON) -c "import torchvision" 2>/dev/null || $(PYTHON) -m pip install \
	  "torchvision==0.$$($(PYTHON) -c 'import torch; print(int(torch.__version__.split(".")[1]) + 15)').*"
	@# ccache: the pip test's wheel build reuses the main build's objects through it.
	@command -v cmake >/dev/null && command -v ninja >/dev/null && command -v ccache >/dev/null && \
	  test -f /usr/include/gtest/gtest.h || \
	  { command -v apt-get >/dev/null && (apt-get update -qq && apt-get install -y -qq cmake ninja-build libgtest-dev ccache) || \
	    echo "warning: install cmake, ninja, ccache and GoogleTest (libgtest-dev) with your package manager"; }

configure: deps
	cmake -S . -B $(BUILD_DIR) $(GENERATOR) -DCUSTOMCONV_PYTHON=$(PYTHON) $(CMAKE_ARGS)

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS) $(CTEST_ARGS)

demo: build
	$(PY_ENV) $(PYTHON) cpp_demo/make_model.py --out $(BUILD_DIR)/demo
	$(BUILD_DIR)/customconv_demo --threads 4 --iters 100
	@if [ "$(HAS_GPU)" = "1" ]; then \
	  $(BUILD_DIR)/customconv_demo --device cuda --threads 4 --iters 100; \
	else echo "(no GPU here: the CUDA run of the demo is skipped)"; fi

install: build
	cmake --install $(BUILD_DIR) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD_DIR)
