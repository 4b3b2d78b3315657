# twisted-iop: set up, run and test.
#   make run    set up a virtualenv and run the Control Plane on its defaults
#   make test   set up everything the tests need (the virtualenv, both real
#               engines: llama-cpp-python and llama.cpp's llama-server, built
#               once per machine; chromium, redis, zsh) and run them
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PY := $(BIN)/python
PYTEST_ARGS ?=

.PHONY: setup llama-engine llama-server shells run run-edge run-node test lint browser redis proto mypy bench bench-full bench-inference bench-stream nginx bench-cluster bench-engine clean

$(BIN)/.installed: setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,dev]' --config-settings editable_mode=compat
	touch $@

setup: $(BIN)/.installed

# llama-cpp-python's OpenAI server and the llama vocabulary for the tests
# against a real engine (tests/edge/test_e2e_real_engine.py). The engine is built from its sdist
# once per machine (about 8 minutes on 2 cores) into a wheel cache outside
# the clone; later runs, and CI on the same machine, install it from there
# without the network. The vocabulary ships only in the sdist: it is
# extracted next to the cache, and the tests find it through IOP_LLAMA_VOCAB.
LLAMA_CPP_VERSION := 0.3.36
WHEEL_CACHE ?= $(HOME)/.cache/twisted-iop/wheels
LLAMA_SDIST := $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_CPP_VERSION).tar.gz
LLAMA_VOCAB ?= $(abspath $(WHEEL_CACHE)/..)/ggml-vocab-llama-spm.gguf
export IOP_LLAMA_VOCAB := $(LLAMA_VOCAB)

$(LLAMA_SDIST): | $(BIN)/.installed
	mkdir -p $(WHEEL_CACHE)
	$(PY) -m pip download --quiet --no-binary :all: --no-deps 'llama-cpp-python==$(LLAMA_CPP_VERSION)' -d $(WHEEL_CACHE)

$(LLAMA_VOCAB): | $(LLAMA_SDIST)
	tar -xzf $(LLAMA_SDIST) -O llama_cpp_python-$(LLAMA_CPP_VERSION)/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf > $@.partial
	mv $@.partial $@

# llama.cpp's own C++ server, built once per machine from the same sdist's
# vendored llama.cpp (about 10 minutes on 2 cores) into the cache beside the
# wheels (`make llama-server`, and `make test` depends on it); later runs,
# and CI on the same machine, use the cached binary. The tests against it
# (tests/engines/test_llama_server_*.py) and its harness
# (twisted_iop/testing/llama_server.py) find it through IOP_LLAMA_SERVER.
LLAMA_SERVER_SRC := $(abspath $(WHEEL_CACHE)/..)/llama-server-$(LLAMA_CPP_VERSION)-src
LLAMA_SERVER ?= $(abspath $(WHEEL_CACHE)/..)/llama-server-$(LLAMA_CPP_VERSION)/llama-server
export IOP_LLAMA_SERVER := $(LLAMA_SERVER)

$(LLAMA_SERVER): | $(LLAMA_SDIST)
	@echo "building llama-server (llama.cpp of llama-cpp-python $(LLAMA_CPP_VERSION)) into $(dir $@), once"
	@mkdir -p $(LLAMA_SERVER_SRC) $(dir $@)
	@tar -xzf $(LLAMA_SDIST) -C $(LLAMA_SERVER_SRC) --strip-components=1
	@cd $(LLAMA_SERVER_SRC)/vendor/llama.cpp && \
	  cmake -B build -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF \
	    -DLLAMA_CURL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
	    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF > build.log 2>&1 && \
	  cmake --build build --target llama-server -j2 >> build.log 2>&1 || \
	  { tail -20 build.log; exit 1; }
	@cp $(LLAMA_SERVER_SRC)/vendor/llama.cpp/build/bin/llama-server $@.partial
	@mv $@.partial $@

$(BIN)/.llama-engine: $(BIN)/.installed | $(LLAMA_SDIST)
	@ls $(WHEEL_CACHE)/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || { \
	  echo "building llama-cpp-python $(LLAMA_CPP_VERSION) into $(WHEEL_CACHE), once (about 8 minutes on 2 cores)"; \
	  $(PY) -m pip wheel --quiet --find-links $(WHEEL_CACHE) 'llama-cpp-python[server]==$(LLAMA_CPP_VERSION)' -w $(WHEEL_CACHE); }
	$(PY) -m pip install --quiet --no-index --find-links $(WHEEL_CACHE) 'llama-cpp-python[server]==$(LLAMA_CPP_VERSION)'
	touch $@

llama-engine: $(BIN)/.llama-engine $(LLAMA_VOCAB)

# llama-server alone (`make llama-server`); `make test` builds it too.
llama-server: $(LLAMA_SERVER) $(LLAMA_VOCAB)

run: setup
	$(BIN)/twistd -n --pidfile= iop-control-plane --config configs/control-plane.yaml

run-edge: setup
	$(BIN)/twistd -n --pidfile= iop-edge --config configs/edge.yaml

run-node: setup
	$(BIN)/twistd -n --pidfile= iop-node --config configs/node.yaml

# Headless Chromium for the console tests, from Debian's packages.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian package) for the console tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

# redis-server for the cluster tests (each test starts its own on a free
# port in a temp dir), from Debian's packages.
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (Debian package) for the cluster tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }

# bash and zsh for the tests of iopctl's shell completion scripts.
shells:
	@command -v zsh >/dev/null 2>&1 || { \
	  echo "installing zsh (Debian package) for the completion tests"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zsh >/dev/null; }

# The linter and formatter (a small rule set, see pyproject.toml).
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: setup llama-engine llama-server browser redis shells lint mypy
	$(PY) -m pytest $(PYTEST_ARGS)

proto: setup
	$(PY) -m grpc_tools.protoc -Iproto/iop --python_out=twisted_iop/wire --pyi_out=twisted_iop/wire proto/iop/control.proto

mypy: setup
	$(BIN)/mypy

# The benchmark suite (docs/performance.md): every figure next to the same
# run's reference (bare echo server, minimal Klein app), its target and
# PASS/MISS. bench: 1,000 edges (about a minute); bench-full: 1k, 10k, 20k.
bench: setup nginx
	$(PY) bench/suite.py --quick
	$(PY) bench/tls_storm.py --edges 1000
	$(PY) bench/inference_gateway.py --quick
	$(PY) bench/stream_gateway.py --quick

bench-full: setup
	$(PY) bench/suite.py
	$(PY) bench/tls_storm.py --edges 10000

# The inference gateway against its targets (under a minute).
bench-inference: setup
	$(PY) bench/inference_gateway.py --quick

# Streamed tokens through Edge + Node against nginx (a C hop) and the paced
# engine called directly, at 64, 256 and 1,024 streams (about 3 minutes);
# `$(PY) bench/stream_gateway.py --quick` runs 64 only. nginx comes from
# Debian's nginx-light, installed here when missing.
bench-stream: setup nginx
	$(PY) bench/stream_gateway.py

nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || \
		{ apt-get update -qq && apt-get install -y -qq nginx-light; }

# Tokens per second through Edge + Node against a real engine (llama-cpp-python
# on a tiny local model) called directly, at 1 and 4 streams (about 3 minutes).
bench-engine: setup llama-engine
	$(PY) bench/engine_throughput.py

# Cluster mode (docs/performance.md#cluster-mode): its own redis-server, 3
# replicas sharing 30,000 edges against one Control Plane at 10,000 (under
# 10 minutes). `$(PY) bench/cluster.py --quick` runs 1,000 (under 2 minutes).
bench-cluster: setup redis
	$(PY) bench/cluster.py

clean:
	rm -rf $(VENV) build *.egg-info
