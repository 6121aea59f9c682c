# rigfleet: every target builds its own virtual environment first.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv lint test demo bench clean haproxy

$(BIN)/.installed: pyproject.toml sandbox/pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]' -e ./sandbox
	touch $@

venv: $(BIN)/.installed

lint: venv
	$(BIN)/ruff check rigfleet sandbox tests bench deploy.py inventory.py config.py
	$(BIN)/mypy

# Every tier: unit, plan, upstream and the sandbox end-to-end tier (the last needs root). The
# sandbox tier mostly waits on boots, apt and Docker: its modules run as two shards at once, each
# on its own sandbox instance (RIGFLEET_TEST_SHARD, tests/conftest.py), and the other tiers run
# alongside, each process with its own pytest temp dir; logs are printed one after the other.
PYTEST := $(BIN)/pytest -q -p no:cacheprovider --durations=15
# The two sandbox instances the shards use (another pair lets a second run share the machine).
SANDBOX_SHARD_INSTANCES ?= 0 1
test: lint haproxy
	@side=$$(mktemp -d); set -- $(SANDBOX_SHARD_INSTANCES); \
	$(PYTEST) --basetemp=$$side/tmp -m "not sandbox" tests > $$side/log 2>&1 & pid=$$!; \
	RIGFLEET_SANDBOX_INSTANCE=$$2 RIGFLEET_TEST_SHARD=1/2 $(PYTEST) --basetemp=$$side/s1 -m sandbox tests \
	  > $$side/s1.log 2>&1 & s1=$$!; \
	RIGFLEET_SANDBOX_INSTANCE=$$1 RIGFLEET_TEST_SHARD=0/2 $(PYTEST) --basetemp=$$side/s0 -m sandbox tests; \
	shard0=$$?; \
	wait $$s1; shard1=$$?; \
	wait $$pid; others=$$?; \
	echo "== sandbox tier, shard 1 of 2 (ran alongside shard 0, on sandbox instance $$2): exit $$shard1"; \
	cat $$side/s1.log; \
	echo "== unit, plan and upstream tiers (ran alongside the sandbox tier): exit $$others"; \
	cat $$side/log; rm -rf $$side; \
	echo "== sandbox tier: shard 0 exit $$shard0, shard 1 exit $$shard1"; \
	test $$shard0 -eq 0 && test $$shard1 -eq 0 && test $$others -eq 0

demo: venv
	$(BIN)/python -m rigfleet_sandbox.demo

bench: venv
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache

# HAProxy from the distribution: tests/unit/test_gateway_haproxy.py runs the generated gateway
# configuration for real on loopback (skipped where it is missing)
haproxy:
	@command -v haproxy >/dev/null || apt-get install -y --no-install-recommends haproxy
