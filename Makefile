# The two commands: `make demo` and `make test`. Both bootstrap .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench proto clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/skewprobe demo

lint: $(STAMP)
	$(BIN)/ruff check probes targets tests benchmarks
	$(BIN)/mypy

test: $(STAMP) lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Itargets/proto=targets/proto \
		--python_out=. --pyi_out=. --grpc_python_out=. targets/proto/target.proto

clean:
	rm -rf $(VENV) build *.egg-info
