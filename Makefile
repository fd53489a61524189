# `make demo` and `make test` work on a fresh machine with Python 3.11+, Java 17 and javac:
# each creates the virtualenv it needs. Real Flink is downloaded once into
# $(CKPT_FLINK_CACHE) (default ~/.cache/ckpt-flink), never into the repository; so is Azurite,
# Microsoft's Azure Storage emulator (npm; Node from Debian), into $(CKPT_TOOLS_CACHE)/azurite.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_FIXTURE := fixtures/flink23-hashmap-p2
DEMO_CHECKPOINT := $(firstword $(wildcard $(DEMO_FIXTURE)/*/chk-*))
DEMO_OUT := /tmp/ckpt-demo/job/$(notdir $(DEMO_CHECKPOINT))
DEMO_INPUTS := --plan $(DEMO_FIXTURE)/plan.json --schema fixtures/countjob.schema.toml

CKPT_TOOLS_CACHE ?= $(HOME)/.cache/ckpt-tools
AZURITE := $(CKPT_TOOLS_CACHE)/azurite/node_modules/.bin/azurite-blob
export CKPT_TOOLS_CACHE

.PHONY: setup browser azurite demo test conformance compat bench bench-peer bench-scale fixtures clean

# ckpt's own modules are compiled to bytecode here (compileall redoes only what changed): the package
# is installed editable, and where PYTHONDONTWRITEBYTECODE is set every run of ckpt would compile
# them again (0.05 to 0.1 s of its start-up).
setup: $(VENV)/.installed
	$(BIN)/python -m compileall -q ckpt_tool

$(VENV)/.installed: pyproject.toml setup.py ckpt_tool/framing/_framing.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

browser:
	@command -v chromium >/dev/null || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null)

# The Azure tests run Azurite (tests/emulators.py starts it on 127.0.0.1; the GCS emulator is a
# test dependency from PyPI).
azurite: $(AZURITE)

$(AZURITE):
	@command -v npm >/dev/null || (apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null)
	npm install --no-audit --no-fund --prefix $(CKPT_TOOLS_CACHE)/azurite azurite@3

# The bundled checkpoint (Flink 2.3, parallelism 2) is inspected, rescaled to 3, and restored by
# real Flink 2.3 at parallelism 3, which counts every record exactly once.
demo: setup
	$(BIN)/ckpt inspect $(DEMO_CHECKPOINT) $(DEMO_INPUTS) --engine local
	rm -rf /tmp/ckpt-demo
	$(BIN)/ckpt rescale $(DEMO_CHECKPOINT) $(DEMO_OUT) --parallelism 3 $(DEMO_INPUTS)
	$(BIN)/python fixtures/flink_env.py restore $(DEMO_OUT) --version 2.3.0 --parallelism 3

# Lint, format check and type check first (seconds), then every test, on TEST_WORKERS processes
# (pytest-xdist; 2, the CI machine's cores: most of the time goes to real Flink's JVMs and to
# single-threaded Python, so two workers take about 25 minutes where one takes 35). The HTML report
# tests look at pages in Debian's Chromium, installed here when missing.
TEST_WORKERS ?= 2
test: setup browser azurite
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS)

# Every job shape Flink's own rescale tests rescale, on Flink 2.3 and 1.20 (a table; see tests/conformance.py).
conformance: setup
	$(BIN)/python tests/conformance.py

# Every Flink version's fixture: read, round trip, rescale restore, repair restore (a table).
compat: setup
	$(BIN)/python tests/compat_matrix.py

# Rescale against the I/O floor (cp -r) on generated checkpoints; see bench/run.py.
bench: setup
	$(BIN)/python bench/run.py

# ckpt side by side with Flink 2.3's own rescale, FLIP-547 off and on (four paths); see bench/peer.py.
bench-peer: setup
	$(BIN)/python bench/peer.py

# The same in-flight bytes at parallelism 16 to 4,096, dense and sparse channels; see bench/scale.py.
bench-scale: setup
	$(BIN)/python bench/scale.py

fixtures: setup
	$(BIN)/python fixtures/generate.py

clean:
	rm -rf $(VENV) .pytest_cache
