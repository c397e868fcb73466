# privstream — `make help` lists the targets.
# The virtual environment is made by scripts/venv.sh with Python 3.11 or 3.12 (pyproject's
# requires-python): PYTHON=/path/to/python picks one, else the first supported of python3.12,
# python3.11, python3. A .venv that an earlier install left half made, or that another Python
# made, is rebuilt. `make demo` and `make demo-ldp` install the runtime and the `demo` extra;
# `make test` (and the other development targets) the `dev` extra, which includes `demo`: one
# stamp each.
PYTHON ?=
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO_STAMP := $(VENV)/.installed-demo
DEV_STAMP  := $(VENV)/.installed-dev
PIP_INSTALL = $(BIN)/python -m pip install --quiet --config-settings editable_mode=strict -e
# The strict editable install links each module file, so a new or changed module reinstalls.
SOURCES := $(wildcard privstream/*.py privstream/*/*.py mechanisms/*.py operators/*.py connectors/*.py flows/*.py)

export PYTHON

.DEFAULT_GOAL := help

# A .venv whose Python is gone, unsupported or without pip is stale whatever its stamps say.
ifneq ($(shell sh scripts/venv.sh --check $(VENV) && echo ok),ok)
.PHONY: $(DEMO_STAMP) $(DEV_STAMP)
endif

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

$(DEMO_STAMP): pyproject.toml $(SOURCES)
	@sh scripts/venv.sh $(VENV)
	$(PIP_INSTALL) '.[demo]'
	touch $@

# dev includes demo, so this stamp makes the demo's too.
$(DEV_STAMP): pyproject.toml $(SOURCES)
	@sh scripts/venv.sh $(VENV)
	$(PIP_INSTALL) '.[dev]'
	touch $(DEMO_STAMP) $@

install: $(DEV_STAMP) ## Create .venv and install privstream with the dev extra (demo included)

test: $(DEV_STAMP) ## Run the whole test suite (installs what it needs)
	$(BIN)/python -m pytest -n 2 --timeout 900

test-fast: $(DEV_STAMP) ## Unit and flow tests (no broker, Prometheus, container or slow tests): 2 to 4 minutes on two cores
	$(BIN)/python -m pytest -n 2 --timeout 900 --ignore=tests/integration --ignore=tests/deploy -m 'not slow'

format: $(DEV_STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

lint: $(DEV_STAMP) ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p privstream

demo: $(DEMO_STAMP) ## Run the main job: embedded Kafka broker, synthetic events, all seven LDP-IDS mechanisms over Kafka with metrics
	$(BIN)/privstream demo --out demo-out

demo-ldp: $(DEMO_STAMP) ## Real local DP: the seven LDP-IDS mechanisms as the ldp-reports server stage, round clock, HTTP gateway, 2,000 simulated devices over HTTP (about a minute; writes demo-ldp-out/)
	$(BIN)/privstream demo-ldp --out demo-ldp-out

demo-shuffle: $(DEMO_STAMP) ## The shuffle model: SaO2's ldp-shuffled server stage, privstream shuffler and 4,000 devices of the device library over the embedded broker (about 30 s; writes demo-shuffle-out/)
	$(BIN)/privstream demo-shuffle --out demo-shuffle-out

chaos: $(DEV_STAMP) ## Long chaos round: 60 kills, outages, hostile messages, 9 cluster disturbances, audited (writes chaos-out/)
	$(BIN)/python -m tests.integration.chaos --kills 60 --users 5000 --slots 200 --cluster-kills 9 --workdir chaos-out

image: $(DEV_STAMP) ## Build the container image localhost/privstream:latest, no registry needed (deploy/build-image.sh)
	deploy/build-image.sh

bench: $(DEV_STAMP) ## Reproduction and performance benchmarks (writes bench/results/)
	$(BIN)/python bench/run.py

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis demo-out demo-ldp-out demo-shuffle-out chaos-out

.PHONY: help install test test-fast format lint demo demo-ldp demo-shuffle bench chaos image clean
