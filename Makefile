# The two commands: `make demo` and `make test`. Both bootstrap .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-unit test-integration test-e2e lint bench proto clean

# Tests run on this many pytest-xdist workers: the end-to-end tests mostly wait on real
# windows, so two workers halve the suite's time on two cores (`PYTEST_WORKERS=0`: serial).
PYTEST_WORKERS ?= 2

# pip's and the build's output goes to a log, shown only when the install fails.
PIP := $(BIN)/pip --quiet --disable-pip-version-check
INSTALL_LOG := $(VENV)/install.log

$(STAMP): pyproject.toml
	@echo "installing skewprobe and its dev tools into $(VENV) (log: $(INSTALL_LOG))"
	@$(PYTHON) -m venv $(VENV)
	@{ $(PIP) install --upgrade pip && $(PIP) install -e '.[dev]'; } >$(INSTALL_LOG) 2>&1 \
		|| { cat $(INSTALL_LOG); echo "install failed (log: $(INSTALL_LOG))" >&2; exit 1; }
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/skewprobe demo

lint: $(STAMP)
	$(BIN)/ruff check probes targets tests benchmarks scripts
	$(BIN)/mypy
	$(BIN)/mypy scripts/import_graph.py

test: $(STAMP) lint
	$(BIN)/pytest -q -n $(PYTEST_WORKERS)

# One tier at a time: unit (no sockets), integration (real servers on loopback), e2e (fleets,
# Prometheus, HAProxy, Chromium).
test-unit test-integration test-e2e: test-%: $(STAMP)
	$(BIN)/pytest -q -n $(PYTEST_WORKERS) tests/$*

bench: $(STAMP)
	$(BIN)/python benchmarks/run_all.py

# -I. keeps the proto's path (targets/proto/target.proto), so the generated code imports
# `from targets.proto import target_pb2`; the stub is marked for ruff (generated style).
proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I. \
		--python_out=. --pyi_out=. --grpc_python_out=. targets/proto/target.proto
	sed -i '1i # ruff: noqa' targets/proto/target_pb2.pyi

clean:
	rm -rf $(VENV) .venv-lowest build *.egg-info
