#!/usr/bin/env bash
# One sitting of issue 32's table: radixlm bf16 against vLLM bf16 and llama-server on the same GGUF files, one server
# at a time, one client (`radixlm bench peers`): c=1, c=16, c=32 and shared-prefix cases, then 2,000-token TTFT.
# Usage: benchmarks/bf16_sitting.sh MODEL.gguf [MODEL.gguf ...]   (BF16 GGUFs: ../shared/peers/quantize-gguf.sh)
# Needs vLLM from ../shared/peers/install-vllm-cpu.sh. About 15 minutes for the default model, 30 for the 1B shape.
# RADIXLM_SETS: radixlm's flag sets, separated by ";" (default "--dtype bfloat16"; each is one more radixlm server per
# case list, e.g. "--dtype bfloat16;--quantization q8_0 --dtype bfloat16"); PEERS: "vllm llama-server" (default) or
# one of them.
set -euo pipefail
cd "$(dirname "$0")/.."
cases="random@1:8,random@16:32,random@32:64,shared-prefix@32:32"
lengths=(--input-len 192-320 --output-len 48-80)
radixlm_args=(--radixlm "${RADIXLM_SETS:---dtype bfloat16}")
for model in "$@"; do
  for peer in ${PEERS:-vllm llama-server}; do
    script=scripts/serve-vllm-peer.sh
    [ "$peer" = llama-server ] && script=../shared/peers/serve-llama-server.sh
    echo "=== $model against $peer"
    .venv/bin/radixlm bench peers --model "$model" "${radixlm_args[@]}" --cases "$cases" "${lengths[@]}" \
      --peer-script "$script" --peer-name "$peer"
  done
  echo "=== $model against vllm, 2,000-token prompts"
  .venv/bin/radixlm bench peers --model "$model" "${radixlm_args[@]}" --cases random@1:4 \
    --input-len 2000-2000 --output-len 8-8 --peer-script scripts/serve-vllm-peer.sh --peer-name vllm
done
