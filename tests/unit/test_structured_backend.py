"""The xgrammar backend: special tokens masked inside grammar text, a model vocab larger than the tokenizer's,
readable compile errors, one compile per spec off the calling thread, rollback."""

import json
import threading

import pytest
import torch
from tiny_models import VOCAB_SIZE

from radixlm.structured.compile_cache import GrammarCompileCache
from radixlm.structured.grammar_spec import GrammarSpec


def allowed_ids(backend, matcher):
    bitmask = backend.allocate_bitmask(1)
    matcher.fill_bitmask(bitmask, 0)
    logits = torch.zeros(1, VOCAB_SIZE)
    backend.apply_bitmask(logits, bitmask, [0])
    return set(torch.nonzero(logits[0] == 0).flatten().tolist())


def feed(matcher, tokenizer, text):
    for token_id in tokenizer.encode(text, add_special_tokens=False):
        assert matcher.accept_token(token_id), (text, token_id)


def test_special_tokens_never_appear_inside_json_text(backend, tokenizer):
    matcher = backend.new_matcher(backend.compile(GrammarSpec.json_object()))
    feed(matcher, tokenizer, '{"a": "')
    allowed = allowed_ids(backend, matcher)
    assert tokenizer.convert_tokens_to_ids("<|im_start|>") not in allowed
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") not in allowed
    assert tokenizer.eos_token_id not in allowed  # stop tokens only once the value is complete
    assert len(allowed) > 50


def test_model_vocab_larger_than_the_tokenizer_is_masked(backend, tokenizer):
    assert len(tokenizer) < VOCAB_SIZE
    matcher = backend.new_matcher(backend.compile(GrammarSpec.json_object()))
    feed(matcher, tokenizer, '{"a": "')
    assert max(allowed_ids(backend, matcher)) < len(tokenizer)


def test_grammar_termination_and_rollback(backend, tokenizer):
    matcher = backend.new_matcher(backend.compile(GrammarSpec.from_choice(['yes "sir"', "no"])))
    feed(matcher, tokenizer, "n")
    assert not matcher.accept_token(tokenizer.encode("x", add_special_tokens=False)[0])
    feed(matcher, tokenizer, "o")
    assert allowed_ids(backend, matcher) == {tokenizer.eos_token_id}
    assert matcher.accept_token(tokenizer.eos_token_id) and matcher.is_terminated()
    matcher.rollback(2)
    assert not matcher.is_terminated()
    feed(matcher, tokenizer, 'o')


@pytest.mark.parametrize(("spec", "message"), [
    (lambda: GrammarSpec.from_json_schema("{not json"), "json_schema is not valid JSON"),
    (lambda: GrammarSpec.from_choice([]), "choice must be a non-empty list"),
    (lambda: GrammarSpec.from_regex(""), "regex must be a non-empty string"),
    (lambda: GrammarSpec("yaml", "x"), "structured output kind"),
])
def test_bad_specs_raise_value_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        spec()


@pytest.mark.parametrize(("spec", "message"), [
    (GrammarSpec.from_regex("a(b"), r"invalid regex grammar: .*parenthesis"),
    (GrammarSpec.from_ebnf("root ::= ( "), r"invalid ebnf grammar: .*EBNF parser error"),
    (GrammarSpec.from_json_schema({"type": "no-such-type"}), r"invalid json_schema grammar"),
])
def test_compile_errors_are_value_errors_naming_the_problem(backend, spec, message):
    with pytest.raises(ValueError, match=message):
        backend.compile(spec)


def test_compile_cache_compiles_each_spec_once_on_a_worker_thread(backend):
    threads = []

    class Recording:
        vocab_size = backend.vocab_size

        def compile(self, spec):
            threads.append(threading.current_thread().name)
            return backend.compile(spec)

        def memory_size(self, compiled):
            return backend.memory_size(compiled)

    cache = GrammarCompileCache(Recording(), max_bytes=2**30)
    spec = GrammarSpec.from_json_schema({"type": "object", "properties": {"x": {"type": "integer"}}})
    same = GrammarSpec.from_json_schema('{"type": "object",\n "properties": {"x": {"type": "integer"}}}')  # spacing
    reordered = GrammarSpec.from_json_schema('{"properties": {"x": {"type": "integer"}}, "type": "object"}')
    assert reordered != spec  # key order is kept: properties are generated in it
    assert cache.submit(spec) is cache.submit(same)
    assert cache.compile(spec) is not None
    assert len(threads) == 1 and threads[0].startswith("radixlm-grammar")
    with pytest.raises(ValueError, match="invalid regex"):
        cache.compile(GrammarSpec.from_regex("(("))
    cache.shutdown()


def test_a_queued_compile_that_no_client_waits_for_leaves_the_queue():
    started, finish = threading.Event(), threading.Event()
    compiled = []

    class Blocking:
        vocab_size = 8

        def compile(self, spec):
            started.set()
            finish.wait(10)
            compiled.append(spec.text)
            return spec.text

        def memory_size(self, compiled):
            return 1

    cache = GrammarCompileCache(Blocking(), max_bytes=2**30)
    running, queued, shared = (GrammarSpec.from_regex(text) for text in ("a", "b", "c"))
    first = cache.submit(running, client=True)
    assert started.wait(10)  # the one compile thread is busy with "a"
    gone = cache.submit(queued, client=True)
    kept = cache.submit(shared, client=True)
    cache.submit(shared, client=True)  # two clients wait for "c"
    cache.release(queued)  # its only client left: cancelled before it started
    cache.release(shared)  # one of two left: still queued
    cache.release(running)  # already compiling: runs to the end
    assert gone.cancelled() and not kept.cancelled() and not first.cancelled()
    finish.set()
    assert first.result(10) == "a" and kept.result(10) == "c"
    assert compiled == ["a", "c"]
    assert cache.submit(queued).result(10) == "b"  # asked again: compiled anew
    cache.shutdown()


@pytest.mark.parametrize(("spec", "message"), [
    (lambda: GrammarSpec.from_json_schema("[" * 100_000 + "]" * 100_000), "json_schema is nested too deeply"),
    (lambda: GrammarSpec.from_json_schema('{"items":' * 101 + "{}" + "}" * 101), "nested deeper than 100"),
    (lambda: GrammarSpec.from_json_schema({"type": "string", "pattern": "a" * 16_385}), "16385 characters"),
    (lambda: GrammarSpec.from_json_schema({"properties": {"k" * 16_385: {}}}), "16385 characters"),
    (lambda: GrammarSpec.from_json_schema(" " * 300_000 + "{}"), "json_schema is 300002 characters"),
    (lambda: GrammarSpec.from_regex("a" * 16_385), "regex is 16385 characters"),
    (lambda: GrammarSpec.from_ebnf('root ::= "' + "a" * 16_385 + '"'), "ebnf is 16396 characters"),
    (lambda: GrammarSpec.from_choice(["a"] * 4097), "choice has 4097 entries"),
    (lambda: GrammarSpec.from_choice(["a" * 16_385]), "a choice is 16385 characters"),
    (lambda: GrammarSpec.from_choice(["a" * 16_000] * 20), "choice is 320080 characters"),
    (lambda: GrammarSpec.from_structural_tag({"type": "structural_tag", "format": {"deep": _nested(120)}}),
     "structural_tag is nested deeper"),
])
def test_grammar_sizes_past_the_limits_are_value_errors(spec, message):
    """Compile time grows with the square of a string's length and fast with nesting: both are capped."""
    with pytest.raises(ValueError, match=message):
        spec()


def _nested(depth):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_grammars_at_the_limits_are_accepted():
    assert GrammarSpec.from_regex("a" * 16_384).text == "a" * 16_384
    assert len(json.loads(GrammarSpec.from_choice(["a"] * 4096).text)) == 4096
    GrammarSpec.from_json_schema('{"items":' * 99 + "{}" + "}" * 99)
