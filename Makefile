# `make demo` and `make test` work on a fresh machine with Python 3.10+, Java 17 and javac:
# each creates the virtualenv it needs. Real Flink is downloaded once into
# $(CKPT_FLINK_CACHE) (default ~/.cache/ckpt-flink), never into the repository.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_CHECKPOINT := $(firstword $(wildcard fixtures/flink23-hashmap-p2/*/chk-*))

.PHONY: setup demo test fixtures clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

demo: setup
	$(BIN)/ckpt inspect $(DEMO_CHECKPOINT)

test: setup
	$(BIN)/python -m pytest -q -rs

fixtures: setup
	$(BIN)/python fixtures/generate.py

clean:
	rm -rf $(VENV) .pytest_cache
