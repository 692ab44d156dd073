import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from tiny_models import build_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """`tiny_model_dir(arch)` -> directory of a saved random-weight model of that architecture (built once)."""
    built: dict[str, Path] = {}

    def get(arch: str) -> Path:
        if arch not in built:
            built[arch] = build_tiny_model(arch, tmp_path_factory.mktemp(f"tiny-{arch}"))
        return built[arch]

    return get


@pytest.fixture(scope="session")
def default_tool_server(tmp_path_factory):
    """One server of the default model for every test that calls it through a client SDK or with tools: its tool
    chat template, the hermes tool-call parser with automatic tool choice, up to 32 running requests, served as
    "m". Started once for the session (each start of the default model costs about ten seconds)."""
    from server.harness import start_server

    from radixlm.config import DEFAULT_MODEL
    from radixlm.model.loader import resolve_model_dir

    server = start_server(resolve_model_dir(DEFAULT_MODEL), tmp_path_factory.mktemp("tool-server"), "--chat-template",
                          "smollm2_tools", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                          "--max-num-seqs", "32", "--served-model-name", "m", "--kv-cache-memory", "1GiB")
    yield server
    server.stop()
