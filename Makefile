# The two set-up commands of the README:
#   make demo   install, bring the whole platform up on this machine and run the demo scenario
#   make test   install and run the whole test suite (what CI runs)
# Everything installs into .venv from PyPI; nothing needs Docker or anything installed by hand.
# Extra arguments for `microco up`: make demo ARGS="--console-port 18083"

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# spark: the store's Spark connector is tested in CI (it once broke unseen while its test skipped)
EXTRAS ?= dev,torch,tensorflow,analytics,spark
PYTEST_ARGS ?=
# The suite runs in parallel workers, two more than the cores (at least four): most tests wait on
# real servers and processes rather than compute. On 2 cores, 2 workers used 1.2-1.4 cores and took
# 780-933 s; 3 workers took 738 s (2026-12-02, `time make test`); on another 2-core machine (AMD
# EPYC, idle, the same commit) 3 workers took 788 s and 4 workers 704 s, all passing.
PYTEST_WORKERS ?= $(shell python3 -c "import os; print(max(4, (os.cpu_count() or 2) + 2))")
ARGS ?=

.PHONY: install browser demo up test lint protos check-protos clean

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	@echo "[make] installing microco with [$(EXTRAS)] into $(VENV) (the first time takes minutes: PyTorch, TensorFlow, ...)"
	@test -x $(PY) || { echo "[make] creating $(VENV)"; python3 -m venv $(VENV); }
	$(PIP) install -q --disable-pip-version-check -U pip
	$(PIP) install --disable-pip-version-check --progress-bar on -e '.[$(EXTRAS)]'
	@echo "[make] installed; the microco command is $(VENV)/bin/microco (put $(VENV)/bin on your PATH)"
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

# The console's end-to-end test drives a real headless chromium (Debian's package; nothing is
# downloaded by the test tools). Installed when running as root with apt, else the test says why it skips.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium not found: the browser test will be skipped (apt-get install chromium)"; fi; }

demo: install
	$(VENV)/bin/microco up --demo $(ARGS)

up: install
	$(VENV)/bin/microco up $(ARGS)

# Bytecode is written (an environment's PYTHONDONTWRITEBYTECODE is dropped for the run): every
# service and job process the suite starts then loads microco compiled instead of compiling it
# again (~0.3 CPU-s a process), and pytest keeps its rewritten test modules (collection in each
# worker: 33 -> 21 CPU-s). __pycache__ is ignored by git.
test: install browser
	$(PY) protos/generate.py --check
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder --durations=30 $(PYTEST_ARGS)

# Lint and types: ruff's rules and formatting, mypy over every package (strict on microco.common).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

protos: install
	$(PY) protos/generate.py

check-protos: install
	$(PY) protos/generate.py --check

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
