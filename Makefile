# keyedstate: everything a fresh machine needs is installed from here.
#   make demo   - the main job: a stateful streaming demo on our provider
#   make test   - all tests (Scala and Python)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SBT := ./dev/sbt
JAR_SRC := target/scala-2.13/keyedstate_2.13-0.1.0.jar
JAR := python/keyedstate/jars/keyedstate.jar
export PYTHON := $(abspath $(PY))

.PHONY: setup jar demo test test-scala test-python soak lint clean wheel

$(PY): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(PY)

setup: $(PY) jar

jar: $(PY)
	$(SBT) package
	mkdir -p $(dir $(JAR))
	cp $(JAR_SRC) $(JAR).tmp && mv $(JAR).tmp $(JAR)

demo: setup
	$(PY) -m keyedstate.tools.demo

test-scala: $(PY)
	$(SBT) test

test-python: setup
	$(PY) -m ruff check python tests bench
	$(PY) -m pytest -v tests

test: setup test-scala test-python

# Not in CI: 100 driver SIGKILLs per engine over a replayable source (about 25 minutes each,
# bounded at 50).
soak: setup
	KILL_TEST_KILLS=100 KILL_TEST_BUDGET_S=3000 $(PY) -m pytest -v tests/test_kill_restart.py

wheel: setup
	$(PY) -m pip wheel --no-deps -w dist .

clean:
	rm -rf target project/target $(VENV) dist build $(JAR)
