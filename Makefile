# Two commands set everything up on a fresh clone: `make run` and `make test`.
# Both create .venv on first use; nothing needs installing by hand.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# What `make run` needs (the server) and what the other targets add (tests, lint, mypy).
RUN_STAMP := $(VENV)/.installed-server
DEV_STAMP := $(VENV)/.installed-dev
PYTEST_ARGS ?=

.PHONY: venv run test slow faults soak powerloss conformance lint fmt typecheck bench bench-peer bench-scale bench-recall sweep fsck deploy-check clean

# The server, and the client distribution (client/: the project-memory CLI and the agents'
# hooks), so that `make run` is all a first try needs.
$(RUN_STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e '.[server]' -e ./client
	touch $@

# The tests also import the client distribution (client/, docs/client.md): installed beside
# the server, editable, with its `sdk` extra.
$(DEV_STAMP): pyproject.toml client/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e '.[dev]' -e './client[sdk]'
	touch $@ $(RUN_STAMP)

venv: $(DEV_STAMP)

# Before the server starts: the lines to paste into the shell an agent runs in (the token is
# the one the first start prints below, once).
run: $(RUN_STAMP)
	@bind="$${MEMORY_BIND:-127.0.0.1:8000}"; host="$${bind%:*}"; port="$${bind##*:}"; \
	case "$$host" in 0.0.0.0|""|"[::]") host=127.0.0.1;; esac; \
	printf '%s\n' "To use it from a shell (an agent's, your repository's), paste:" \
	  "  export PATH=\"$(abspath $(BIN)):\$$PATH\"" \
	  "  export PROJECT_MEMORY_URL=http://$$host:$$port" \
	  "  export PROJECT_MEMORY_TOKEN=pm_...   # the token printed below on the first start" \
	  "then, in your repository: project-memory agent install claude-code" ""
	$(BIN)/gunicorn -c gunicorn.conf.py wsgi:app

# pytest-xdist workers. Most tests of make test wait on servers, subprocesses, agents and
# the disk: on 2 cores two workers kept 1.3 cores busy, four keep 1.6 (bench/HISTORY.md,
# "make test's workers"). Each worker starts its own PostgreSQL and SeaweedFS. An idle
# worker takes tests another has not begun (--dist worksteal), so none finishes a minute
# before the others. make slow and make faults hold tests that each load the machine: two
# workers. TEST_WORKERS=0 runs make test in one process.
TEST_WORKERS ?= 4
SUITE_WORKERS ?= 2
# The test runs write bytecode whatever the shell says (PYTHONDONTWRITEBYTECODE): without it
# each worker compiles the app and rewrites the asserts of every test module again, and so
# does each of the hundreds of servers, CLIs and hooks the tests start (a third of a second
# of CPU each).
PYTEST_BYTECODE := env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest
# make test and make slow keep their temporary files (tmp_path, the roots of the servers they
# start) on tmpfs where the machine has one: on a disk, the syncfs of each group commit and
# the fsyncs of each write waited on every other writer of the disk, and made most of an
# in-process test's time. tmpfs takes the same code paths (its group commit included); what
# reaches a disk and what a power loss keeps is checked by make faults and make powerloss,
# on filesystems of their own. Only the directories of failed tests are kept: they are memory.
TEST_TMPDIR ?= $(shell test -d /dev/shm -a -w /dev/shm && echo /dev/shm || echo "$${TMPDIR:-/tmp}")
PYTEST := env TMPDIR=$(TEST_TMPDIR) $(PYTEST_BYTECODE) -o tmp_path_retention_policy=failed

test: $(DEV_STAMP)
	$(PYTEST) -q -n $(TEST_WORKERS) --dist worksteal \
		-m "not soak and not powerloss and not faults and not slow" $(PYTEST_ARGS)

# Long scenarios (tests marked slow): agents beside CPU hogs, servers soaked with slow clients
# for tens of seconds, kills and restarts under writers, and the cases of large matrices beyond
# the ones `make test` keeps. Each behaviour keeps a test in `make test`; CI runs this after it.
slow: $(DEV_STAMP)
	$(PYTEST) -q -n $(SUITE_WORKERS) --dist loadgroup \
		-m "slow and not soak and not powerloss and not faults" $(PYTEST_ARGS)

# Real faults (tests/robust: full disks on loop ext4, EIO through FUSE, clock steps, master
# kills): each takes seconds of a whole machine, so they run on their own (CI: after make test).
faults: $(DEV_STAMP)
	$(PYTEST_BYTECODE) -q -n $(SUITE_WORKERS) -m faults $(PYTEST_ARGS)

soak: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -m soak $(PYTEST_ARGS)

# Power-loss cycles (tests/powerloss/, docs/guarantees.md): the storage root on a FUSE filesystem
# that drops whatever was not fsynced. On LazyFS with LAZYFS=/path/to/lazyfs (built by hand,
# never part of this repository), else on the simulator tests/powerloss/simfs.py (Debian's
# fuse3 and libfuse3, PyPI's mfusepy). First the filesystem's semantics table, then the cycles,
# then the cycles under group commit (always on the simulator, with ext4's ordering: simfs --ext4).
POWERLOSS_CYCLES ?= 50
powerloss: $(DEV_STAMP)
	$(BIN)/python -m pytest -q -m powerloss tests/powerloss $(PYTEST_ARGS)
	$(BIN)/python -m tests.powerloss.harness --cycles $(POWERLOSS_CYCLES)
	$(BIN)/python -m tests.powerloss.harness --cycles $(POWERLOSS_CYCLES) --group-commit

# schemathesis against a real gunicorn on each backend, every phase (coverage too), 30 examples
# per operation: the long form of tests/e2e/test_schemathesis.py, which `make test` runs bounded.
conformance: $(DEV_STAMP)
	MEMORY_SCHEMATHESIS_FULL=1 $(BIN)/python -m pytest -q -n 0 tests/e2e/test_schemathesis.py $(PYTEST_ARGS)

lint: $(DEV_STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

fmt: $(DEV_STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(DEV_STAMP)
	$(BIN)/mypy app
	cd client && $(abspath $(BIN))/mypy

# Benchmarks (bench/README.md): never part of `make test`, never an assertion on time. Each
# starts its own servers on 127.0.0.1, stops them, prints one table, writes bench/results/*.json.
MLFLOW_VENV := bench/.venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed-stamp
BENCH_ARGS ?=

$(MLFLOW_STAMP): bench/requirements-peer.txt
	test -x $(MLFLOW_VENV)/bin/python || $(PYTHON) -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --disable-pip-version-check -q -r bench/requirements-peer.txt
	touch $@

bench: $(DEV_STAMP)
	$(BIN)/python -m bench.run --growth $(BENCH_ARGS)
	$(BIN)/python -m bench.pg $(BENCH_ARGS)

bench-peer: $(DEV_STAMP) $(MLFLOW_STAMP)
	$(BIN)/python -m bench.run --peer $(BENCH_ARGS)

# Retrieval quality of keyword, semantic and hybrid search per embedder on a generated labelled
# set, with the semantic ranking's latency at 10k and 100k chunks and RSS (bench/README.md,
# "Recall"); RECALL_ARGS="--remote http://127.0.0.1:11434/v1 nomic-embed-text" adds a server.
RECALL_ARGS ?=

bench-recall: $(DEV_STAMP)
	$(BIN)/python -m bench.recall $(RECALL_ARGS)

# What grows with the tree (bench/README.md, "Scale rows"), for this checkout as it stands;
# BENCH_SIZES=1000,10000,50000 for the full table, SCALE_ARGS="--reps 5" for more repetitions.
BENCH_SIZES ?= 1000,10000
SCALE_ARGS ?=

bench-scale: $(DEV_STAMP)
	$(BIN)/python -m bench.scale --checkout . --sizes $(BENCH_SIZES) \
		--out bench/results/scale-$$(git rev-parse --short HEAD).json $(SCALE_ARGS)

sweep: $(RUN_STAMP)
	$(BIN)/flask --app wsgi sweep

fsck: $(RUN_STAMP)
	$(BIN)/flask --app wsgi fsck

# The deployment recipes (deploy/, docs/deploy.md), as far as this machine can run them.
deploy-check: $(RUN_STAMP)
	bash deploy/check.sh

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache deploy/.check-tools
