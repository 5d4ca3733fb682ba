# Two commands set everything up on a fresh clone: `make run` and `make test`.
# Both create .venv on first use; nothing needs installing by hand.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
PYTEST_ARGS ?=

.PHONY: venv run test soak lint fmt typecheck bench bench-peer sweep fsck clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

run: $(STAMP)
	$(BIN)/gunicorn -c gunicorn.conf.py wsgi:app

test: $(STAMP)
	$(BIN)/python -m pytest -q -m "not soak" $(PYTEST_ARGS)

soak: $(STAMP)
	$(BIN)/python -m pytest -q -m soak $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

typecheck: $(STAMP)
	$(BIN)/mypy app/storage

sweep: $(STAMP)
	$(BIN)/flask --app wsgi sweep

fsck: $(STAMP)
	$(BIN)/flask --app wsgi fsck

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
