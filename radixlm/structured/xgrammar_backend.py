"""XGrammarBackend: the grammar backend on xgrammar (the library SGLang and vLLM default to)."""

from __future__ import annotations

import json
import threading
from typing import Any

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase

from radixlm.structured.grammar_spec import GrammarSpec


def build_tokenizer_info(tokenizer: PreTrainedTokenizerBase, vocab_size: int,
                         stop_token_ids: list[int]) -> xgr.TokenizerInfo:
    """Tokenizer info with every added/special token except the stop tokens blanked out.

    xgrammar would otherwise let tokens such as `<|im_start|>` appear inside JSON strings; an empty token is never
    allowed. `vocab_size` is the model's, which may exceed the tokenizer's (the extra rows are never allowed).
    """
    detected = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
    encoded_vocab = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    special_ids = set(tokenizer.added_tokens_decoder) | set(tokenizer.all_special_ids)
    for token_id in special_ids - set(stop_token_ids):
        if token_id < len(encoded_vocab):
            encoded_vocab[token_id] = ""
    return xgr.TokenizerInfo(encoded_vocab, vocab_type=detected.vocab_type, vocab_size=vocab_size,
                             stop_token_ids=stop_token_ids, add_prefix_space=detected.add_prefix_space)


HEAP_OVERHEAD = 1.2


class XGrammarMatcher:
    def __init__(self, matcher: xgr.GrammarMatcher) -> None:
        self._matcher = matcher

    def accept_token(self, token_id: int) -> bool:
        return self._matcher.accept_token(token_id)

    def fill_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        self._matcher.fill_next_token_bitmask(bitmask, row)

    def is_terminated(self) -> bool:
        return self._matcher.is_terminated()

    def rollback(self, num_tokens: int) -> None:
        self._matcher.rollback(num_tokens)


class XGrammarBackend:
    """Compiles with one xgrammar compiler per compiling thread (the compile cache runs two), over one tokenizer
    info. The compilers' own cache is off: `GrammarCompileCache` is the one cache of compiled grammars, so that its
    byte budget counts everything they hold."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int, stop_token_ids: list[int]) -> None:
        self.vocab_size = vocab_size
        self._tokenizer_info = build_tokenizer_info(tokenizer, vocab_size, stop_token_ids)
        self._per_thread = threading.local()

    @property
    def _compiler(self) -> xgr.GrammarCompiler:
        compiler = getattr(self._per_thread, "compiler", None)
        if compiler is None:
            compiler = xgr.GrammarCompiler(self._tokenizer_info, max_threads=1, cache_enabled=False)
            self._per_thread.compiler = compiler
        return compiler

    def compile(self, spec: GrammarSpec) -> xgr.CompiledGrammar:
        try:
            # No free whitespace between JSON tokens: a weak model can otherwise emit blanks until max_tokens.
            if spec.kind == "json_object":
                return self._compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
            if spec.kind == "json_schema":
                return self._compiler.compile_json_schema(spec.text, any_whitespace=False, strict_mode=True)
            if spec.kind == "regex":
                return self._compiler.compile_regex(spec.text)
            if spec.kind == "structural_tag":
                return self._compiler.compile_structural_tag(json.dumps(_tight_json(json.loads(spec.text))))
            if spec.kind == "choice":
                return self._compiler.compile_grammar(spec.as_ebnf_choice())
            return self._compiler.compile_grammar(spec.text)
        except (RuntimeError, ValueError, TypeError) as error:
            raise ValueError(f"invalid {spec.kind} grammar: {_first_line(error)}") from None

    def memory_size(self, compiled: xgr.CompiledGrammar) -> int:
        # xgrammar counts its containers' contents; the heap holds ~17% more (measured: RSS grew 1.17 MiB per MiB it
        # reported over 8 schemas of 1,500 patterned strings kept at once), so the budget counts that too.
        return int(compiled.memory_size_bytes * HEAP_OVERHEAD)

    def new_matcher(self, compiled: xgr.CompiledGrammar) -> XGrammarMatcher:
        return XGrammarMatcher(xgr.GrammarMatcher(compiled))

    def allocate_bitmask(self, num_rows: int) -> torch.Tensor:
        return xgr.allocate_token_bitmask(num_rows, self.vocab_size)

    def apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor, rows: list[int]) -> None:
        xgr.apply_token_bitmask_inplace(logits, bitmask, indices=rows)


def _tight_json(value: Any) -> Any:
    """A structural tag with every JSON-schema part as its grammar without free whitespace, as `compile` builds
    plain JSON schemas (the structural tag's own JSON format allows runs of blanks)."""
    if isinstance(value, list):
        return [_tight_json(item) for item in value]
    if not isinstance(value, dict):
        return value
    if value.get("type") == "json_schema" and value.get("style", "json") == "json":
        grammar = xgr.Grammar.from_json_schema(json.dumps(value["json_schema"]), any_whitespace=False,
                                               strict_mode=True)
        return {"type": "grammar", "grammar": str(grammar)}
    return {key: _tight_json(item) for key, item in value.items()}


def _first_line(error: Exception) -> str:
    """xgrammar prefixes messages with a timestamp and source location: keep the readable part."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    marker = text.find(": ", text.find(".cc:"))
    return text[marker + 2:] if ".cc:" in text and marker != -1 else text
