# privstream — `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The strict editable install links each module file, so a new or changed module reinstalls.
SOURCES := $(wildcard privstream/*.py privstream/*/*.py mechanisms/*.py operators/*.py connectors/*.py flows/*.py)

.DEFAULT_GOAL := help

help: ## Show this help
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml $(SOURCES)
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --config-settings editable_mode=strict -e '.[dev,plot]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install privstream with dev and plot extras

test: $(STAMP) ## Run the whole test suite (installs what it needs)
	$(BIN)/python -m pytest -n 2 --timeout 900

test-fast: $(STAMP) ## The unit and flow tests only (no broker, no Prometheus), about a minute
	$(BIN)/python -m pytest -n 2 --timeout 900 --ignore=tests/integration

format: $(STAMP) ## Apply ruff's fixes and formatting
	$(BIN)/ruff check --fix .
	$(BIN)/ruff format .

lint: $(STAMP) ## ruff and mypy
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy -p privstream

demo: $(STAMP) ## Run the main job: embedded Kafka broker, synthetic events, all seven LDP-IDS mechanisms over Kafka with metrics
	$(BIN)/privstream demo --out demo-out

chaos: $(STAMP) ## Long chaos round: 60 kills, outages, hostile messages, 9 cluster disturbances, audited (writes chaos-out/)
	$(BIN)/python -m tests.integration.chaos --kills 60 --users 5000 --slots 200 --cluster-kills 9 --workdir chaos-out

image: $(STAMP) ## Build the container image localhost/privstream:latest, no registry needed (deploy/build-image.sh)
	deploy/build-image.sh

bench: $(STAMP) ## Reproduction and performance benchmarks (writes bench/results/)
	$(BIN)/python bench/run.py

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis demo-out chaos-out

.PHONY: help install test test-fast format lint demo bench chaos image clean
