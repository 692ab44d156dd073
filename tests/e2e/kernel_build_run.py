"""Run by tests/e2e/test_kernel_builds.py in a child process, since a process loads one build of the extension, fixed
at its first use: `python kernel_build_run.py SPEC` with SPEC a JSON object {"runs": [engine options, ...],
"prompts": [[token ids], ...], "max_tokens": n}. Prints one JSON object: the build this process chose, the GGUF
linear's paths on this CPU, whether the AVX-512 BF16 and AMX kernels run, and each run's greedy tokens for every
prompt (none for an empty list of runs)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for e2e.engine_runs

from e2e.engine_runs import output_token_ids
from radixlm.engine.llm_engine import build_engine
from radixlm.model.ops import direct_kernel, extension_error, kernel_isa
from radixlm.sampling_params import SamplingParams


def main(spec: dict) -> None:
    error = extension_error()
    if error is not None:
        raise SystemExit(f"the extension did not load: {error}")
    params = SamplingParams(temperature=0.0, max_tokens=spec["max_tokens"], ignore_eos=True)
    tokens = [output_token_ids(build_engine(**options), spec["prompts"], params) for options in spec["runs"]]
    print(json.dumps({"isa": kernel_isa(), "modules": sorted(m for m in sys.modules if m.startswith("radixlm._C")),
                      "gguf_paths": list(direct_kernel("gguf_linear_paths")()),
                      "avx512_bf16": bool(direct_kernel("avx512_bf16_available")()),
                      "amx_bf16": bool(direct_kernel("amx_bf16_available")()), "tokens": tokens}))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
