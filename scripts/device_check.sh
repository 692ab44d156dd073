#!/usr/bin/env bash
# The checks that need a CUDA device (tests/e2e/test_device.py), for a session lent a GPU machine: that machine has
# its own CUDA torch and no package index, so the pinned pure-Python dependencies it lacks travel as wheels in .whl/
# (ignored by git), made here first with:
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_17_x86_64 -d .whl transformers==5.23.0 huggingface_hub==2.4.0 tokenizers==0.23.3 \
#     gguf==0.19.0 httpx2==2.16.2 httpcore2==2.16.2 truststore
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 RADIXLM_NO_EXT=1
python3 -c "import torch, transformers; print(torch.__version__, transformers.__version__, torch.cuda.get_device_name())"
timeout 400 python3 -m pytest -q -p no:cacheprovider -rs tests/e2e/test_device.py 2>&1 | tee "${OUT:-/tmp}/device.log"
