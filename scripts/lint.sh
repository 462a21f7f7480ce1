#!/usr/bin/env bash
# The code-health gate (run by scripts/test.sh before the tests, so by CI): ruff lint, ruff format, mypy.
# Settings: [tool.ruff] and [tool.mypy] in pyproject.toml; tools: the `lint` extra. Fix with
# `ruff check --fix . && ruff format .`; any finding fails.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m ruff check --no-fix .
python -m ruff format --check .
python -m mypy
