# The two set-up commands of the README:
#   make demo   install, bring the whole platform up on this machine and run the demo scenario
#   make test   install and run the whole test suite (what CI runs)
# Everything installs into .venv from PyPI; nothing needs Docker or anything installed by hand.

VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXTRAS ?= dev,torch,tensorflow,analytics
PYTEST_ARGS ?=

.PHONY: install demo up test protos check-protos clean

$(VENV)/.installed-$(EXTRAS): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --disable-pip-version-check -U pip
	$(PIP) install -q --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

demo: install
	$(VENV)/bin/microco up --demo

up: install
	$(VENV)/bin/microco up

test: install
	$(PY) protos/generate.py --check
	$(PY) -m pytest $(PYTEST_ARGS)

protos: install
	$(PY) protos/generate.py

check-protos: install
	$(PY) protos/generate.py --check

clean:
	rm -rf $(VENV) .pytest_cache test-artifacts
