# keyedstate: everything a fresh machine needs is installed from here.
#   make demo   - the main job: a stateful streaming demo on our provider
#   make test   - all tests (Scala and Python)
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
SBT := ./dev/sbt
JARS := python/keyedstate/jars
export PYTHON := $(abspath $(PY))

.PHONY: FORCE setup jar jars spark-jars spark-venvs connectors check-connectors storage demo test test-full test-scala test-python soak lint clean wheel

$(PY): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $(PY)

setup: $(PY) jars spark-venvs connectors storage

# Jars the Kafka tests need, from Maven Central (dev/connectors/*/pom.xml): the Kafka broker
# (tests/support/servers/kafka_broker.py) and Spark's Kafka connector (docs/exactly-once.md).
CONNECTORS := build/connectors
# The older Spark versions' connectors (tests/versions/): the releases
# keyedstate._session.KAFKA_CONNECTOR_VERSIONS gives for them, and their token providers' of the
# same minor version (the pom says why).
OLDER_SPARK_KAFKA := 4.0.4 4.1.3 4.2.0
OLDER_SPARK_KAFKA_TOKEN := 4.0.0 4.1.1 4.2.0
connectors: $(CONNECTORS)/kafka-broker/.done $(CONNECTORS)/spark-kafka/.done \
  $(foreach v,$(OLDER_SPARK_KAFKA),$(CONNECTORS)/spark-kafka-$(basename $(v))/.done)

$(CONNECTORS)/spark-kafka-%/.done: dev/connectors/spark-kafka/pom.xml
	rm -rf $(CONNECTORS)/spark-kafka-$* $(CONNECTORS)/spark-kafka-$*.tmp
	mvn -q -B -f $< dependency:copy-dependencies -Dspark.kafka.version=$(filter $*.%,$(OLDER_SPARK_KAFKA)) \
	  -Dspark.kafka.token.version=$(filter $*.%,$(OLDER_SPARK_KAFKA_TOKEN)) \
	  -DoutputDirectory=$(abspath $(CONNECTORS))/spark-kafka-$*.tmp
	mv $(CONNECTORS)/spark-kafka-$*.tmp $(CONNECTORS)/spark-kafka-$*
	touch $@

$(CONNECTORS)/%/.done: dev/connectors/%/pom.xml
	rm -rf $(CONNECTORS)/$* $(CONNECTORS)/$*.tmp
	mvn -q -B -f $< dependency:copy-dependencies \
	  -DoutputDirectory=$(abspath $(CONNECTORS))/$*.tmp
	mv $(CONNECTORS)/$*.tmp $(CONNECTORS)/$*
	touch $@

# Not in CI (about a minute): does the Kafka connector still link against pyspark's Spark?
check-connectors: connectors
	$(PY) dev/connectors/check_links.py $(CONNECTORS)/spark-kafka/spark-*.jar \
	  --classpath $$($(PY) -c 'import pyspark, os; print(os.path.dirname(pyspark.__file__))')/jars \
	  $(CONNECTORS)/spark-kafka/kafka-clients-*.jar $(CONNECTORS)/spark-kafka/commons-pool2-*.jar

# Jars the storage tests need, from Maven Central (dev/storage/*/pom.xml): Hadoop's HDFS
# minicluster (tests/support/servers/hdfs_cluster.py) and its s3a connector (tests/support/servers/s3_endpoint.py).
STORAGE := build/storage
storage: $(STORAGE)/hdfs-minicluster/.done $(STORAGE)/s3a/.done

$(STORAGE)/%/.done: dev/storage/%/pom.xml
	rm -rf $(STORAGE)/$* $(STORAGE)/$*.tmp
	mvn -q -B -f $< dependency:copy-dependencies -DoutputDirectory=$(abspath $(STORAGE))/$*.tmp
	mv $(STORAGE)/$*.tmp $(STORAGE)/$*
	touch $@

# The provider jar for the installed pyspark's Spark, into the Python package.
jar: $(PY)
	$(SBT) bundle

# The provider jars for every supported Spark (4.0 to 4.3), for a wheel that runs on each.
jars: $(PY) spark-jars
	$(SBT) "all bundle spark40/bundle spark41/bundle spark42/bundle"

# The older Spark versions' jars (build.sbt's spark40, spark41 and spark42 compile against them): the
# jars inside the pyspark each version's virtualenv installs from PyPI (below), which are what a
# Python user of that version runs; the newest patch release of each minor version. The root
# project compiles against the development virtualenv's pyspark (NEWEST_SPARK, pinned in
# pyproject.toml's test extra).
SPARK_JARS := build/spark-jars
OLDER_SPARK := 4.0.5 4.1.4 4.2.1
NEWEST_SPARK := 4.3.0
spark-jars: $(foreach v,$(OLDER_SPARK),$(SPARK_JARS)/$(basename $(v))/.done)

$(SPARK_JARS)/%/.done: build/venv-spark-%/.done
	rm -rf $(SPARK_JARS)/$* && mkdir -p $(SPARK_JARS)
	cp -r "$$(build/venv-spark-$*/bin/python -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "jars"))')" $(SPARK_JARS)/$*
	touch $@

# A virtualenv per supported Spark version holding only its pyspark from PyPI, as a Spark user's
# Python has: tests/versions/ pip-installs this checkout's wheel into each (pip resolving its
# other dependencies) and runs it there.
SPARK_RELEASES := $(OLDER_SPARK) $(NEWEST_SPARK)
spark-venvs: $(foreach v,$(SPARK_RELEASES),build/venv-spark-$(basename $(v))/.done)

# .done holds the release: a virtualenv of another release is made again (and the jars copied
# again from it); one of the same release is kept (its file, and its time, untouched).
build/venv-spark-%/.done: FORCE
	@release="$(filter $*.%,$(SPARK_RELEASES))"; \
	if [ "$$(cat $@ 2>/dev/null)" != "$$release" ]; then \
	  echo "build/venv-spark-$*: pyspark $$release"; \
	  rm -rf build/venv-spark-$* && python3 -m venv build/venv-spark-$* && \
	  build/venv-spark-$*/bin/pip install -q "pyspark==$$release" && echo "$$release" > $@; \
	fi

FORCE:

demo: setup
	$(PY) -m keyedstate.tools.demo

test-scala: $(PY)
	$(SBT) test

test-python: setup
	$(PY) -m ruff check python tests bench
	$(PY) -m pytest -v tests

# The Scala suites (compiled first) run beside the Python ones, at the lowest CPU priority: the
# Python suites leave about a fifth of the two cores idle (waiting on processes and servers),
# which the Scala suites use, and keep the rest (a Spark Connect foreachBatch worker has a fixed
# 10 s to start). Their output follows the Python suites'. Fails if either fails; an interrupt
# stops both (the Scala suites run in a process group of their own).
SCALA_LOG := build/test-scala.log
test: setup
	$(SBT) Test/compile
	@mkdir -p build; rm -f $(SCALA_LOG).rc
	@set -m; ( nice -n 19 $(SBT) test > $(SCALA_LOG) 2>&1; echo $$? > $(SCALA_LOG).rc ) & scala=$$!; set +m; \
	  trap 'kill -TERM -- -'$$scala' 2>/dev/null; exit 130' INT TERM; \
	  $(PY) -m ruff check python tests bench && $(PY) -m pytest -v tests; python_rc=$$?; wait $$scala; \
	  trap - INT TERM; \
	  echo "--- the Scala suites ($(SCALA_LOG)) ---"; cat $(SCALA_LOG); \
	  scala_rc=$$(cat $(SCALA_LOG).rc 2>/dev/null || echo 1); \
	  echo "Scala suites: exit $$scala_rc; Python suites: exit $$python_rc"; \
	  test $$scala_rc -eq 0 -a $$python_rc -eq 0

# Not in CI: `make test` with the full tier of the Python suites (tests/support/tiers.py: the
# Connect runs of tests CI runs in the classic session, the other rescale and storage scenarios,
# the storage kill tests, every kill point of the pipeline; about 20 minutes more).
test-full:
	KEYEDSTATE_TEST_FULL=1 $(MAKE) test

# Not in CI: 100 driver SIGKILLs per engine over a replayable source (about 25 minutes each,
# bounded at 50); the end-to-end pipeline (Kafka in, PostgreSQL and Kafka out) killed 20 times
# (about 12 minutes; CI kills it 4 times, `make test-full` 6, once at each kill point); the JVM suites' full search
# (KEYEDSTATE_SOAK=1: a rescale failed at every file-system call, not only at the first and last
# call of each call site; every Lincheck iteration; about 8 minutes).
soak: setup
	KEYEDSTATE_SOAK=1 $(SBT) 'testOnly io.keyedstate.offline.rescale.RescaleFailureInjectionSuite io.keyedstate.rocks.LinearizabilitySuite'
	KILL_TEST_KILLS=100 KILL_TEST_BUDGET_S=4500 KILL_TEST_CLEAN_RUN=1 $(PY) -m pytest -v tests/provider/test_kill_restart.py
	PIPELINE_KILLS=20 PIPELINE_CLEAN_RUN=1 $(PY) -m pytest -v -s tests/sinks/test_exactly_once_pipeline.py

wheel: setup
	$(PY) -m pip wheel --no-deps -w dist .

clean:
	rm -rf target project/target $(VENV) dist build $(JARS)/*.jar
