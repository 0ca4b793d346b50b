# Every target sets itself up on a fresh machine: virtualenv, packages, Delta jars (cached after the first run).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export ONCEFLOW_HOME ?= $(CURDIR)/.onceflow
# Tests run three at a time on the Connect pass (a file to a worker; the workers share one warm Spark Connect
# server, `conftest.py`), two at a time on the classic pass (each worker holds a local Spark driver, and each run it
# launches starts another: three of them on two cores ran slower): much of a test's time is spent waiting on a
# Dagster run or a server. Files go out in collection order, the longest first. WORKERS= runs them one at a time.
WORKERS ?= -n 3 --dist loadfile --no-loadscope-reorder
CLASSIC_WORKERS ?= $(subst -n 3,-n 2,$(WORKERS))

.PHONY: setup demo demo-cluster test test-cluster test-chaos chaos dev bench lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

setup: $(STAMP)
	command -v mvn >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq maven) || echo "no mvn: the tests' Kafka broker cannot be resolved (fails under CI=true)"
	$(BIN)/onceflow setup

# SOURCE=kafka: the events come from a Kafka topic on a KRaft broker the demo starts.
demo: setup
	$(BIN)/onceflow demo --source $${SOURCE:-pubsub}

# The demo on the cluster-gcs profile: a two-worker standalone cluster, the lake on the GCS emulator, Dagster on PostgreSQL.
demo-cluster: setup
	$(BIN)/onceflow demo --profile cluster-gcs

test: setup
	$(BIN)/ruff check .
	command -v chromium >/dev/null || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) || echo "no chromium: tests/test_ui.py skips (fails under CI=true)"
	$(BIN)/pytest -m "not cluster and not chaos" $(WORKERS)
	ONCEFLOW_TEST_ENGINE=classic $(BIN)/pytest -m "engine_paths and not cluster and not chaos" $(CLASSIC_WORKERS)

# The cluster-gcs profile (DESIGN 11): the end-to-end path on a Spark standalone cluster (a master and two workers
# on 127.0.0.1) on both engine paths and the daemon on PostgreSQL. CI runs it after
# `make test`; `CHAOS_PROFILE=cluster-gcs make chaos` runs the chaos harness on the whole profile.
test-cluster: setup
	$(BIN)/pytest -m cluster

# The chaos harness's short run (5 overlapping faults, local profile) on each engine path, one after the other, then
# on Spark Connect with `events` on Kafka: each starts a whole stack of its own. CI runs it after `make test` and
# `make test-cluster`.
test-chaos: setup
	$(BIN)/pytest -m chaos
	ONCEFLOW_TEST_ENGINE=classic $(BIN)/pytest -m chaos
	CHAOS_SOURCE=kafka $(BIN)/pytest -m chaos

# CHAOS_ITERATIONS faults (30) under a continuous workload, on each of CHAOS_ENGINES (both engine paths), on the
# CHAOS_PROFILE deployment profile (local, or cluster-gcs); CHAOS_SEED replays a run.
chaos: setup
	for engine in $${CHAOS_ENGINES:-connect classic}; do $(BIN)/python -m tests.chaos.harness --engine $$engine --profile $${CHAOS_PROFILE:-local} --source $${CHAOS_SOURCE:-pubsub} --iterations $${CHAOS_ITERATIONS:-30} $${CHAOS_SEED:+--seed $$CHAOS_SEED} || exit 1; done

# A warm Spark engine on ONCEFLOW_SPARK_MASTER; DEV_ARGS="--master spark://host:7077" (or --cluster, --no-engine).
dev: setup
	DAGSTER_HOME=$(ONCEFLOW_HOME)/dagster $(BIN)/onceflow dev $(DEV_ARGS)

# The demo first: sensor tick -> commit needs Dagster's daemon and run launcher; the bench reports the demo's figures.
# Then the contenders again as clients of a Spark Connect server, the engine `make dev` and the demo run.
bench: setup
	$(BIN)/onceflow demo --source pubsub
	$(BIN)/python -m bench.run
	$(BIN)/python -m bench.run --engine connect --only exactly_once --only at_least_once --only exactly_once_dagster \
		--only streaming_dedup --only floor --results bench/results/connect

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .onceflow
