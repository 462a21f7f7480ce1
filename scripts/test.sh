#!/usr/bin/env bash
# Install what the tests need (Debian data packages, all components, data packages, test tools) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/os_packages.sh
python -m pip install --quiet --upgrade pip
python -m pip install --quiet ./common "./client[glove]" ./shuffler "./curator[analyst]" ".[test]"
python -m pytest -ra "$@"
