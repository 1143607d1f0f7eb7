# Reame: set-up, run and test targets (GNU make).
# First `make venv` builds llama-cpp-python from source (6-10 minutes on 2 cores).

PYTHON      ?= python3
VENV        := .venv
VENV_PY     := $(VENV)/bin/python
STAMP       := $(VENV)/.installed
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (auto: one per core); each file runs whole on one worker
# (its servers and browser shared by its tests), each worker's engines get their share of cores.
TEST_WORKERS ?= auto
SUDO        := $(shell [ $$(id -u) = 0 ] || echo sudo)

.DEFAULT_GOAL := help
.PHONY: help venv model browser tools run test check test-full screenshots bench clean

help: ## List the targets
	@echo "Reame make targets:"
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "Pass extra pytest options with: make test PYTEST_ARGS='-k name -x'"

venv: $(STAMP) ## Create .venv and install requirements.txt (no-op when up to date)

$(VENV_PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): requirements.txt | $(VENV_PY)
	@echo "Installing requirements into $(VENV); the first install builds llama-cpp-python from source (6-10 minutes on 2 cores)."
	deploy/llama-wheel.sh $(VENV_PY)
	$(VENV_PY) -m pip install -r requirements.txt
	@touch $@

model: | $(VENV_PY) ## Fetch and check the default model into models/
	$(VENV_PY) -m reame.models.setup_model

browser: ## Install Debian's chromium (for the UI tests) if /usr/bin/chromium is missing
	@if [ -x /usr/bin/chromium ]; then \
		echo "chromium present: /usr/bin/chromium"; \
	else \
		echo "Installing chromium with apt-get"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y chromium; \
	fi

tools: ## Install Debian's systemd, nginx and PostgreSQL (for the self-hosting tests) where missing
	@missing=""; \
	[ -x /usr/bin/systemd-analyze ] || missing="$$missing systemd"; \
	[ -x /usr/sbin/nginx ] || missing="$$missing nginx-light"; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	if [ -z "$$missing" ]; then \
		echo "systemd-analyze, nginx and PostgreSQL present"; \
	else \
		echo "Installing$$missing with apt-get"; \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

run: venv model ## Start the chat server (app.py)
	$(VENV_PY) app.py

test: venv model browser tools ## Run the test suite
	$(VENV_PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=40 $(PYTEST_ARGS)

check: venv model ## The fast lane while editing: no browser, no second model, no Debian tools, no slow test
	$(VENV_PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 \
		-m "not browser and not second_model and not tools and not slow" $(PYTEST_ARGS)

test-full: venv model browser tools ## The suite with more samples (prompts, fuzz examples, chaos)
	REAME_TEST_FULL=1 $(VENV_PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

screenshots: venv model browser ## Retake README's screenshots into docs/screenshots/ (page tests)
	REAME_SCREENSHOTS=1 $(VENV_PY) -m pytest -q tests/web/page/test_page_send.py tests/web/page/test_page_chats.py \
		tests/web/page/test_page_history.py tests/web/page/test_page_access.py tests/web/page/test_page_documents.py \
		$(PYTEST_ARGS)

bench: venv model ## Run the benchmark (python -m bench, then bench.anchor; adds requirements-bench.txt)
	$(VENV_PY) -m pip install -r requirements-bench.txt
	$(VENV_PY) -m bench
	$(VENV_PY) -m bench.anchor

clean: ## Remove .venv (keeps models/ and sessions/)
	rm -rf $(VENV)
