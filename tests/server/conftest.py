"""Fixtures: one in-process server per test module (see inprocess.py), reached like a `radixlm serve`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from tiny_models import build_tiny_model

from server.harness import LONG_CONTEXT
from server.inprocess import InProcessServer, ThreadedServer


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir) -> Iterator[InProcessServer]:
    """One in-process server per test module on the tiny random-weight Llama."""
    server = InProcessServer(tiny_model_dir("llama"), {"num_kv_blocks": 256, "block_size": 4})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def live_tiny_server(tiny_model_dir) -> Iterator[ThreadedServer]:
    """`tiny_server` behind a real loopback socket (uvicorn in a thread), for clients that need a URL."""
    server = ThreadedServer(tiny_model_dir("llama"), engine_options={"num_kv_blocks": 256, "block_size": 4})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(tiny_server):
    """The official openai client on this module's tiny server."""
    return tiny_server.client()


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="session")
def long_model_dir(tmp_path_factory):
    """The tiny Llama with a 4096-token context: a long generation outlasts a disconnect or a shutdown."""
    return build_tiny_model("llama", tmp_path_factory.mktemp("long-llama"), max_position_embeddings=LONG_CONTEXT)
