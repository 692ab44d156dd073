#!/usr/bin/env bash
# vLLM's CPU build as `radixlm bench peers`' peer: `--peer-script scripts/serve-vllm-peer.sh --peer-name vllm`.
# Usage: scripts/serve-vllm-peer.sh PORT   (GGUF=file.gguf: that model; default: radixlm's default model)
# vLLM reads HF directories, not GGUF blocks: the model is served from radixlm's float32 copy of the same weights
# (made once beside the GGUF's cached metadata), in bfloat16 (../shared/peers/serve-vllm-cpu.sh). Needs vLLM
# installed by ../shared/peers/install-vllm-cpu.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${RADIXLM_PYTHON:-$root/.venv/bin/python}
peers=${RADIXLM_PEERS:-$root/../shared/peers}
model=${GGUF:-SmolLM2-135M-Instruct}
dir=$("$python" -c "import sys
from radixlm.model.loader import float32_checkpoint, resolve_model_dir
print(float32_checkpoint(resolve_model_dir(sys.argv[1])))" "$model")
name=$(basename "${GGUF:-SmolLM2-135M-Instruct}" .gguf)
SERVED_NAME=$name exec "$peers/serve-vllm-cpu.sh" "$dir" "$1"
