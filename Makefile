# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint format bench clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/parapipe demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf build .pytest_cache
