"""Builds the C++ kernels (paged attention, small-batch and GGUF linears, KV writes, RMSNorm, rotary embedding) twice:
radixlm._C for AVX2 CPUs and radixlm._C_avx512 for AVX-512 VNNI/BF16 ones (radixlm/model/ops.py loads the one the
CPU runs); everything else about the package lives in pyproject.toml.

Build with the venv's torch visible: `pip install --no-build-isolation --no-deps -e .` (scripts/install.sh), or
`python setup.py build_ext --inplace` in a checkout. RADIXLM_NO_EXT=1 skips it (the torch attention path remains).
"""

import os
from pathlib import Path

from setuptools import setup

ext_modules = []
cmdclass = {}
if os.environ.get("RADIXLM_NO_EXT") != "1":
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    # Two builds of the same sources, so that one install runs on every x86 CPU with AVX2 (radixlm/model/ops.py
    # loads the one the CPU runs): the kernels that pick their code at build time (`#if RADIXLM_BUILD_AVX512`,
    # csrc/isa.h) get AVX-512 VNNI/BF16 code only in the second; those that pick it at run time (the GGUF and
    # bfloat16 linears) have every path in both. -mtune only orders instructions: any CPU runs the result.
    VARIANTS = {"radixlm._C": ["-march=x86-64-v3"],
                "radixlm._C_avx512": ["-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16"]}
    # -g0: no debug information (a third of the compile time); psabi: vector returns inside the kernels.
    flags = ["-O3", "-g0", "-mtune=native", "-fopenmp", "-Wno-psabi"]
    # csrc/bindings.cpp registers every op; the kernels live by kind in csrc/attention, csrc/linear, csrc/norm,
    # csrc/activation.
    sources = ["csrc/bindings.cpp",
               "csrc/attention/paged_attention.cpp", "csrc/attention/decode_cascade.cpp",
               "csrc/attention/prefill_attention.cpp",
               "csrc/attention/kv_write.cpp",
               "csrc/linear/linear.cpp", "csrc/linear/linear_int8.cpp", "csrc/linear/int8_scaling.cpp",
               "csrc/linear/linear_gguf.cpp", "csrc/linear/gguf_activations.cpp", "csrc/linear/gguf_portable.cpp",
               "csrc/linear/gguf_avx2.cpp", "csrc/linear/gguf_avx512.cpp", "csrc/linear/gguf_quantize_simd.cpp",
               "csrc/linear/gguf_pack.cpp", "csrc/linear/gguf_amx.cpp",
               "csrc/linear/amx_bf16.cpp",
               "csrc/linear/bf16_dot.cpp", "csrc/linear/bf16_packed.cpp",
               "csrc/norm/rms_norm.cpp", "csrc/norm/rotary.cpp", "csrc/activation/silu_and_mul.cpp",
               "csrc/layers/decode_layers.cpp", "csrc/layers/decode_layers_python.cpp",
               "csrc/sample/greedy_tokens.cpp"]
    # Headers shared across the folders (isa.h, kernel_checks.h) are included by name from csrc/.
    include_dirs = [str(Path(__file__).resolve().parent / "csrc")]
    ext_modules = [CppExtension(name, sources, include_dirs=include_dirs, extra_compile_args=flags + march,
                                extra_link_args=["-fopenmp"])
                   for name, march in VARIANTS.items()]

    class VariantBuildExtension(BuildExtension):
        """Each build in its own folder of object files (the builds share their sources' names)."""

        def build_extension(self, ext):
            shared = self.build_temp
            self.build_temp = os.path.join(shared, ext.name)
            try:
                super().build_extension(ext)
            finally:
                self.build_temp = shared

    cmdclass = {"build_ext": VariantBuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
