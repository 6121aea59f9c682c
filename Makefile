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

# Every tier: unit, plan, upstream and the sandbox end-to-end tier (the last needs root), whose
# modules two xdist workers share, each with its own sandbox instance (tests/conftest.py). The
# sandbox tier mostly waits on boots, apt and Docker, so the other tiers run alongside it, each
# with its own pytest temp dir; their log is printed after the sandbox tier's.
PYTEST := $(BIN)/pytest -q -p no:cacheprovider --durations=15
test: lint
	@side=$$(mktemp -d); \
	$(PYTEST) --basetemp=$$side/tmp -m "not sandbox" tests > $$side/log 2>&1 & pid=$$!; \
	$(PYTEST) -m sandbox -n 2 --dist loadfile tests; sandbox=$$?; \
	wait $$pid; others=$$?; \
	echo "== unit, plan and upstream tiers (ran alongside the sandbox tier): exit $$others"; \
	cat $$side/log; rm -rf $$side; \
	echo "== sandbox tier: exit $$sandbox"; \
	test $$sandbox -eq 0 && test $$others -eq 0

demo: venv
	$(BIN)/python -m rigfleet_sandbox.demo

bench: venv
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache
