#!/usr/bin/env bash
# Make another weight format of a GGUF on any x86 CPU: ../shared/peers/quantize-gguf.sh where the CPU has AVX-512
# VNNI and BF16 (its llama-quantize is an AVX-512 build and dies with SIGILL elsewhere), else a llama-quantize built
# here once, natively, from the same llama.cpp commit (the llama-cpp-python 0.3.36 sdist on the package registry;
# about 6 minutes on 2 cores) and kept under ~/.cache/radixlm-peers/llama-quantize.
#
# Usage: benchmarks/quantize_gguf.sh IN.gguf OUT.gguf TYPE      TYPE: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K_M, ...
# Paths are passed absolute: llama-quantize reads a second argument that starts with a digit ("1b-q4.gguf") as a
# file type number.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 IN.gguf OUT.gguf TYPE" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
in=$(realpath "$1")
out=$(realpath -m "$2")
peers="$repo/../shared/peers"
if grep -q avx512_vnni /proc/cpuinfo && grep -q avx512_bf16 /proc/cpuinfo && [ -x "$peers/quantize-gguf.sh" ]; then
  exec "$peers/quantize-gguf.sh" "$in" "$out" "$3"
fi
cache="$HOME/.cache/radixlm-peers/llama-quantize"
tool="$cache/llama-quantize"
if [ ! -x "$tool" ]; then
  python="$repo/.venv/bin/python"
  [ -x "$python" ] || python=python3
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  echo "building llama-quantize for this CPU (once; about 6 minutes) ..." >&2
  "$python" -m pip download --quiet --no-deps --no-binary :all: llama-cpp-python==0.3.36 -d "$work"
  tar xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work"
  src="$work/llama_cpp_python-0.3.36/vendor/llama.cpp"
  cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF >/dev/null
  cmake --build "$src/build" --target llama-quantize -j "$(nproc)" >/dev/null
  mkdir -p "$cache"
  cp "$src/build/bin/llama-quantize" "$tool"
fi
exec "$tool" --allow-requantize "$in" "$out" "$3"
