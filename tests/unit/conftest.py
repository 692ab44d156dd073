"""Fixtures the grammar tests share: the tiny tokenizer and an xgrammar backend over it (one per test module).
A module that defines its own `tokenizer` fixture overrides this one."""

import pytest
from tiny_models import VOCAB_SIZE, build_tokenizer

from radixlm.structured.xgrammar_backend import XGrammarBackend


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def backend(tokenizer):
    return XGrammarBackend(tokenizer, VOCAB_SIZE, [tokenizer.eos_token_id])
