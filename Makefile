# rigfleet: every target builds its own virtual environment first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv lint test demo bench clean

$(BIN)/.installed: pyproject.toml sandbox/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./sandbox
	touch $@

venv: $(BIN)/.installed

lint: venv
	$(BIN)/ruff check rigfleet sandbox tests bench deploy.py inventory.py
	$(BIN)/mypy

# Every tier: unit, plan and the sandbox end-to-end tier (the last needs root).
test: lint
	$(BIN)/pytest -q -p no:cacheprovider tests

demo: venv
	$(BIN)/python -m rigfleet_sandbox.demo

bench: venv
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
