# The two commands: `make run` and `make test`. Both create .venv and install on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
NODE_MODULES := tests/node/node_modules/.package-lock.json

.PHONY: run test test-fast check lint types java chromium fuse nats-jetstream-client bench soak crash-matrix

# (re)installed when the project or its compiled hot path changes: the install builds gateway/wire/_framing.pyx
$(STAMP): pyproject.toml setup.py gateway/wire/_framing.pyx
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $(STAMP)

$(NODE_MODULES): tests/node/package.json tests/node/package-lock.json
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error

java:
	@java -version 2>&1 | grep -Eq 'version "(1[7-9]|[2-9][0-9])' || \
	  { echo "jetlake needs Java 17+ for Spark: install it, e.g. apt-get install openjdk-17-jre-headless"; exit 1; }

# The dashboard test drives Debian's chromium through Playwright (which cannot fetch its own browser
# everywhere); installed once with apt where it is missing.
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; } || \
	  { echo "the dashboard test needs Chromium: install it, e.g. apt-get install chromium"; exit 1; }

# The power-cut test (tests/test_power_loss.py) mounts a FUSE file system (mfusepy over Debian's
# libfuse 3, loaded when the test module is collected); fuse3 brings the library and fusermount3,
# installed once with apt where missing.
fuse:
	@command -v fusermount3 >/dev/null 2>&1 || \
	  { DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -q fuse3; } || \
	  { echo "the power-cut test needs FUSE 3: install it, e.g. apt-get install fuse3"; exit 1; }

# The next-generation Python clients (nats-core, nats-jetstream; tests/test_nats_jetstream_client.py)
# need Python 3.13 and run from their own venv, filled from tests/nats_jetstream/requirements.txt.
# Python 3.13 is python3.13 on PATH or pyenv's (`pyenv install 3.13`); PYTHON313=<path> names another.
NATS_JS_VENV := .venv-nats-jetstream
NATS_JS_STAMP := $(NATS_JS_VENV)/.installed-stamp
PYTHON313 ?= $(firstword $(foreach p,python3.13 $(wildcard $(shell pyenv root 2>/dev/null)/versions/3.13*/bin/python3.13),\
  $(shell $(p) -c 'import sys; print(sys.version_info[:2] == (3, 13) and "$(p)" or "")' 2>/dev/null)))

$(NATS_JS_STAMP): tests/nats_jetstream/requirements.txt
	@test -n "$(PYTHON313)" || \
	  { echo "the nats-core/nats-jetstream client tests need Python 3.13: found no python3.13 on PATH nor in pyenv; install it (e.g. pyenv install 3.13) or set PYTHON313=/path/to/python3.13"; exit 1; }
	rm -rf $(NATS_JS_VENV)
	$(PYTHON313) -m venv $(NATS_JS_VENV)
	$(NATS_JS_VENV)/bin/pip install -q -r tests/nats_jetstream/requirements.txt
	touch $@

nats-jetstream-client: $(NATS_JS_STAMP)

run: $(STAMP) java
	$(VENV)/bin/jetlake serve

# Every test. Most of them wait (on servers, timers, JVMs), so they run in two processes
# (pytest-xdist; a module stays in one process, with its fixtures); those marked `alone` assert
# wall-clock bounds or sync the disk hard (crash trials, checkpoints, faulty stores),
# and run after, by themselves. Then the wire tests and the consume and publish
# differential tests again with the gateway on the Python implementation of its hot path
# (JETLAKE_NO_EXTENSIONS; the first run fails if the compiled one is not in use).
PARALLEL := -n 2 --dist loadfile
test: $(STAMP) java chromium fuse $(NODE_MODULES) $(NATS_JS_STAMP)
	$(PY) -m pytest $(PARALLEL) -m "not alone"
	$(PY) -m pytest -m alone
	JETLAKE_NO_EXTENSIONS=1 $(PY) -m pytest $(PARALLEL) tests/test_protocol.py tests/test_consumers_pull.py \
	  tests/test_consumers_push.py tests/test_consumers_acks.py tests/test_publish_semantics.py

# The inner loop: the unit and the quick differential tests, without the slow, Spark, Node,
# nats-jetstream and waiting ones (pyproject.toml's markers); see the README for its time. CI runs
# everything (check).
test-fast: $(STAMP) chromium fuse
	$(PY) -m pytest -m "not slow and not spark and not node and not nats_jetstream and not waits"

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

types: $(STAMP)
	$(VENV)/bin/mypy gateway storage_delta spark_jobs tests bench

# The quality gate CI runs: lint, types, then every test.
check: lint types test

BENCH_NODE_MODULES := bench/node/node_modules/.package-lock.json

$(BENCH_NODE_MODULES): bench/node/package.json bench/node/package-lock.json
	cd bench/node && npm ci --no-audit --no-fund --loglevel=error

# Every workload against the real nats-server -js and jetlake in one run; appends to bench/RESULTS.md.
# BENCH_ARGS=--quick for a smoke run with small sizes.
bench: $(STAMP) $(BENCH_NODE_MODULES)
	$(PY) -m bench.run $(BENCH_ARGS)

# The bounded soak of tests/test_soak.py for longer than CI's 150 s (SOAK_S seconds); prints its figures.
SOAK_S ?= 900
soak: $(STAMP)
	JETLAKE_SOAK_S=$(SOAK_S) $(PY) -m pytest tests/test_soak.py -s -q

# The kill -9 crash matrix of tests/test_crash_matrix.py with CRASH_TRIALS trials (CI runs 6); prints
# each trial's figures and the totals (see bench/RESULTS.md for a 100-trial run).
CRASH_TRIALS ?= 100
crash-matrix: $(STAMP)
	JETLAKE_CRASH_TRIALS=$(CRASH_TRIALS) $(PY) -m pytest tests/test_crash_matrix.py -s -q
