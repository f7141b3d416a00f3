# Two entry points for a fresh machine: `make serve` and `make test`.
# Both create .venv (python3 -m venv + pip) on first use and refresh it when pyproject.toml changes.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HOST   ?= 127.0.0.1
PORT   ?= 8000

.PHONY: serve test bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

serve: $(STAMP)
	$(VENV)/bin/respgate serve --host $(HOST) --port $(PORT)

test: $(STAMP)
	$(PY) -m pytest $(PYTEST_ARGS)

bench: $(STAMP)
	$(PY) -c "import matplotlib" 2>/dev/null || $(PY) -m pip install -q -e '.[test,bench]'
	$(PY) -m benchmarks.ws_overhead

clean:
	rm -rf $(VENV) .pytest_cache
