#!/usr/bin/env bash
# Install what the tests need (Debian data packages and Java, all components with the Spark extra, data packages,
# test tools) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
# Java for the Spark tests (any `java` 17+ will do); promtool (Debian's prometheus) for the alert rules' unit tests;
# the PostgreSQL server for the storage tests of both services (lac.common.pgcluster runs a private one)
bash scripts/os_packages.sh openjdk-17-jre-headless:java prometheus:promtool postgresql
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "./common[tracing]" "./client[glove]" "./shuffler[postgresql]" "./analyst[notebook]" \
  "./curator[spark,channel,postgresql]" ".[test,docs,lint]"
bash scripts/lint.sh  # the code-health gate: ruff lint + format, mypy (any finding fails)
python -m pytest -ra "$@"
