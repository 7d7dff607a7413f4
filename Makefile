# The two commands: `make run` starts the assistant, `make test` runs the whole suite.
# Both set up .venv on first use (pinned versions from constraints.txt, embedded models).
PY := .venv/bin/python
export HF_HUB_OFFLINE ?= 1
export TORCHINDUCTOR_CACHE_DIR ?= $(HOME)/.cache/parley/inductor

.PHONY: run test setup setup-test models clean

setup:
	@scripts/setup.sh run

setup-test:
	@scripts/setup.sh test

run: setup
	@$(PY) -m cli.main serve $(ARGS)

test: setup-test
	@$(PY) -m pytest -q --durations=25 $(PYTEST_ARGS)

models: setup
	@$(PY) -m cli.main models

clean:
	rm -rf .venv .pytest_cache
