"""One install runs on every x86 CPU with AVX2: setup.py builds the extension twice (radixlm._C for AVX2,
radixlm._C_avx512 for AVX-512 VNNI/BF16) and radixlm/model/ops.py loads the one the CPU runs.

Each check runs a child process (tests/e2e/kernel_build_run.py), since a process loads one build, on a CPU without
AVX-512, which must choose the AVX2 build by itself and dies with SIGILL at any AVX-512 instruction: this one where it
has none (an AVX2-only Zen 3), else an emulated one where QEMU's user-mode emulator is installed (Debian's qemu-user,
which .ci/run installs; QEMU's TCG has no AVX-512, and emulating the run takes about 50 s on two cores); elsewhere,
the AVX2 build forced on this CPU (RADIXLM_KERNEL_ISA=avx2, which hides the run-time AVX-512 paths too).
Greedy float32 tokens equal HF's, and the GGUF model's equal this process's (the kernel's paths are bit-identical to
each other)."""

import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from gguf_files import Q4_K_M_TYPES, write_tiny_gguf

from e2e.engine_runs import output_token_ids
from e2e.hf_reference import hf_greedy
from radixlm.engine.llm_engine import build_engine
from radixlm.model.loader import resolve_model_dir
from radixlm.model.ops import KERNEL_ISA_VARIABLE, extension_error
from radixlm.sampling_params import SamplingParams

pytestmark = pytest.mark.skipif(extension_error() is not None, reason=f"no extension: {extension_error()}")

CHILD = Path(__file__).with_name("kernel_build_run.py")
MAX_NEW = 12
QEMU = shutil.which("qemu-x86_64")
HAS_AVX512 = torch.cpu._is_avx512_supported()  # without any, this CPU is one the AVX2 build is for


def prompts() -> list[list[int]]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(3, 300, (n,), generator=generator).tolist() for n in (9, 23, 4)]


@pytest.fixture(scope="module")
def models(tiny_model_dir, tmp_path_factory):
    """(the tiny Llama's directory, the tiny Q4_K_M GGUF's metadata directory) and their expected tokens."""
    root = tmp_path_factory.mktemp("kernel-builds")
    os.environ.setdefault("RADIXLM_CACHE_DIR", str(root / "cache"))
    llama = tiny_model_dir("llama")
    gguf = resolve_model_dir(str(write_tiny_gguf(root / "q4_k_m.gguf", Q4_K_M_TYPES)))
    return llama, gguf


def runs(llama: Path, gguf: Path) -> list[dict]:
    small = dict(attention_backend="cpp", num_kv_blocks=64, block_size=4, max_num_batched_tokens=16)
    return [dict(model=str(gguf), quantization="gguf", **small), dict(model=str(llama), **small),
            dict(model=str(llama), dtype="bfloat16", **small), dict(model=str(llama), quantization="int8", **small),
            dict(model=str(gguf), quantization="gguf", dtype="bfloat16", **small)]


@functools.cache
def expected(llama: Path, gguf: Path) -> tuple[list[list[int]], list[list[int]]]:
    """HF's greedy tokens of the Llama, and this process's build's of the GGUF model."""
    params = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)
    gguf_tokens = output_token_ids(build_engine(**runs(llama, gguf)[0]), prompts(), params)
    return hf_greedy(llama, prompts(), MAX_NEW), gguf_tokens


def child(run_options: list[dict], env: dict, prefix: tuple[str, ...] = ()) -> dict:
    spec = json.dumps({"runs": run_options, "prompts": prompts(), "max_tokens": MAX_NEW})
    environment = {key: value for key, value in os.environ.items() if key != KERNEL_ISA_VARIABLE}
    done = subprocess.run([*prefix, sys.executable, str(CHILD), spec], env={**environment, **env},
                          capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def check(result: dict, llama: Path, gguf: Path) -> None:
    hf_tokens, gguf_tokens = expected(llama, gguf)
    assert result["isa"] == "avx2" and result["modules"] == ["radixlm._C"]
    assert result["gguf_paths"] == [1, 2]  # portable and AVX2: the CPU has (or shows) no AVX-512
    assert not result["avx512_bf16"] and not result["amx_bf16"]
    gguf_run, float32, *others = result["tokens"]
    assert gguf_run == gguf_tokens
    assert float32 == hf_tokens
    for tokens in others:  # bfloat16, int8, GGUF blocks in bfloat16: they run (their numbers are tested elsewhere)
        assert [len(t) for t in tokens] == [MAX_NEW] * len(prompts())


@pytest.mark.skipif(not HAS_AVX512 or QEMU is not None, reason="the run on a CPU without AVX-512 below covers it")
def test_avx2_build_runs_on_this_cpu(models):
    llama, gguf = models
    check(child(runs(llama, gguf), {KERNEL_ISA_VARIABLE: "avx2"}), llama, gguf)


@pytest.mark.skipif(HAS_AVX512 and QEMU is None,
                    reason="needs a CPU without AVX-512, or qemu-x86_64 (Debian's qemu-user) to emulate one")
def test_a_cpu_without_avx512_runs_the_avx2_build(models):
    llama, gguf = models
    emulated = (QEMU, "-cpu", "max") if HAS_AVX512 else ()
    check(child(runs(llama, gguf), {}, prefix=emulated), llama, gguf)


def test_forcing_avx2_hides_every_avx512_path():
    """RADIXLM_KERNEL_ISA=avx2 on any CPU: the AVX2 build, and no AVX-512 code chosen at run time either."""
    result = child([], {KERNEL_ISA_VARIABLE: "avx2"})
    assert result["isa"] == "avx2" and result["modules"] == ["radixlm._C"]
    assert result["gguf_paths"] == [1, 2]
    assert not result["avx512_bf16"] and not result["amx_bf16"]
