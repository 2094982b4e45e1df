# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint format bench bench-report clean proto

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/parapipe demo

# On two workers (pytest-xdist: the suite is mostly one-core work: solver runs, simulations, one-thread
# sessions), then the tests that measure CPU time on throttled or contended cores, alone.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist worksteal --durations=25 -m "not exclusive"
	$(BIN)/python -m pytest -q --durations=5 -m exclusive

# The pure tests only: no agent processes, sshd, systemd, network namespaces, downloaded or exported models.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not agent and not ssh and not systemd and not netns and not corpus and not zoo"

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports

# Every benchmark (an hour or more on 2 cores, machine otherwise idle), then docs/benchmarks.md from their output.
bench: $(STAMP)
	$(BIN)/python bench/report.py --run graph costmodel planner agent tune

# docs/benchmarks.md again from the results already in bench/ (minutes).
bench-report: $(STAMP)
	$(BIN)/python bench/report.py

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# agents/proto/*_pb2*.py again from the .proto files, by the generator whose gencode every protobuf of the
# declared range loads (agents/proto/generate.py says which); it is installed outside the repository.
PROTO_VENV ?= $(HOME)/.cache/parapipe-protoc
proto:
	@test -x $(PROTO_VENV)/bin/python || $(PYTHON) -m venv $(PROTO_VENV)
	$(PROTO_VENV)/bin/python -m pip install --quiet --disable-pip-version-check "grpcio-tools==$$(sed -n 's/^GRPCIO_TOOLS = "\(.*\)".*/\1/p' agents/proto/generate.py)"
	$(PROTO_VENV)/bin/python agents/proto/generate.py

clean:
	rm -rf build .pytest_cache
