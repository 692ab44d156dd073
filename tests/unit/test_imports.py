"""The scheduler, the KV cache manager and the trace replayer are pure Python: importing them loads no torch and
no transformers (a fresh interpreter checks `sys.modules`)."""

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["radixlm.core.scheduler", "radixlm.core.kv_cache_manager", "radixlm.trace.replay",
                                    "radixlm.sampling_params", "radixlm.pooling_params", "radixlm",
                                    "radixlm.tool_parsers", "radixlm.reasoning"])
def test_importing_loads_no_torch(module):
    code = f"import sys, {module}; print(sorted({{'torch', 'transformers'}} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]", result.stdout


def test_the_public_names_still_import():
    import radixlm

    assert radixlm.SamplingParams(n=2).n == 2 and radixlm.LLM.__name__ == "LLM"
    with pytest.raises(AttributeError):
        radixlm.Nope  # noqa: B018
