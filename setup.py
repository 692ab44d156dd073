"""Builds radixlm._C, the C++ kernels (paged attention, small-batch and GGUF linears, KV writes, RMSNorm, rotary
embedding); everything else about the package lives in pyproject.toml.

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

    # -march=native: the extension is built on the machine that runs it, so use its ISA (AVX2 + FMA at least;
    # this box also has AVX-512). The .so is therefore not portable to older CPUs: rebuild there. (The GGUF
    # linear's AVX2 and AVX-512 kernels are chosen at run time and build without it: csrc/isa.h.)
    flags = ["-O3", "-march=native", "-fopenmp"]
    # csrc/bindings.cpp registers every op; the kernels live by kind in csrc/attention, csrc/linear, csrc/norm,
    # csrc/activation.
    sources = ["csrc/bindings.cpp",
               "csrc/attention/paged_attention.cpp", "csrc/attention/prefill_attention.cpp",
               "csrc/attention/kv_write.cpp",
               "csrc/linear/linear.cpp", "csrc/linear/linear_int8.cpp", "csrc/linear/int8_scaling.cpp",
               "csrc/linear/linear_gguf.cpp", "csrc/linear/gguf_portable.cpp", "csrc/linear/gguf_avx2.cpp",
               "csrc/linear/gguf_avx512.cpp", "csrc/linear/amx_bf16.cpp", "csrc/linear/bf16_dot.cpp",
               "csrc/linear/bf16_packed.cpp",
               "csrc/norm/rms_norm.cpp", "csrc/norm/rotary.cpp", "csrc/activation/silu_and_mul.cpp"]
    # Headers shared across the folders (isa.h, kernel_checks.h) are included by name from csrc/.
    include_dirs = [str(Path(__file__).resolve().parent / "csrc")]
    ext_modules = [CppExtension("radixlm._C", sources, include_dirs=include_dirs, extra_compile_args=flags,
                                extra_link_args=["-fopenmp"])]
    cmdclass = {"build_ext": BuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
