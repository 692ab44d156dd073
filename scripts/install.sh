#!/usr/bin/env bash
# Create .venv (if missing) and install radixlm with every dependency, pinned, building its C++ extension.
# Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-dev.txt
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r requirements-nodeps.txt
# No build isolation: the C++ attention extension (csrc/, setup.py) compiles against the venv's torch with the
# system compiler. RADIXLM_NO_EXT=1 skips it; the engine then uses its torch attention path.
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
