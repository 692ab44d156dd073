#!/usr/bin/env bash
# Create .venv (if missing) and install radixlm with every dependency, pinned. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-nodeps.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
