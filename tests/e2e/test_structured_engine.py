"""Constrained decoding through the engine on a tiny random model: outputs match their grammar even from a model
that knows nothing, unconstrained neighbours are unchanged token for token, preemption changes nothing."""

import json
import re
import threading

import pytest

from e2e.engine_runs import assert_all_blocks_released
from radixlm import LLM, SamplingParams
from radixlm.core.scheduler import QueueFullError

REGEXES = [r"[a-c]{3}-\d{2}", r"(yes|no|maybe)", r"\d{1,3}(\.\d{1,2})?", r"[A-Z][a-z]{2,5}( [a-z]{2,4}){0,2}"]
EBNF = """root ::= expr
expr ::= term (("+" | "-") term)*
term ::= [0-9]+ | "(" expr ")"
"""
SCHEMA = {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                             "tag": {"enum": ["a", "b"]}}, "required": ["id", "tag"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def model_dir(tiny_model_dir):
    return str(tiny_model_dir("llama"))


def make_llm(model_dir, **options):
    return LLM(model=model_dir, num_kv_blocks=options.pop("num_kv_blocks", 256), block_size=4, **options)


def constrained(spec, seed=None, max_tokens=48):
    return SamplingParams(temperature=0.0 if seed is None else 0.9, seed=seed, max_tokens=max_tokens,
                          structured_outputs=spec)


def ebnf_ok(text):
    tokens = re.findall(r"\d+|[()+-]", text)
    if "".join(tokens) != text:
        return False
    depth, expect_term = 0, True
    for token in tokens:
        if expect_term and token.isdigit():
            expect_term = False
        elif expect_term and token == "(":
            depth += 1
        elif not expect_term and token in "+-":
            expect_term = True
        elif not expect_term and token == ")" and depth > 0:
            depth -= 1
        else:
            return False
    return depth == 0 and not expect_term


def test_outputs_match_their_grammar(model_dir):
    llm = make_llm(model_dir)
    specs = [{"regex": r} for r in REGEXES] + [{"choice": ["red", "green", "blue"]}, {"grammar": EBNF},
                                               {"json": SCHEMA}, {"json_object": True}]
    params = [constrained(spec, seed) for spec in specs for seed in (None, 1, 2)]
    outputs = llm.generate(["the quick brown"] * len(params), params, use_tqdm=False)
    for spec_params, output in zip(params, outputs, strict=True):
        completion = output.outputs[0]
        spec = spec_params.structured_outputs
        if completion.finish_reason == "length":
            assert spec.kind in ("json_object", "ebnf"), f"{spec} should terminate within 48 tokens"
            continue
        text = completion.text
        if spec.kind == "regex":
            assert re.fullmatch(spec.text, text), (spec.text, text)
        elif spec.kind == "choice":
            assert text in ("red", "green", "blue")
        elif spec.kind == "ebnf":
            assert ebnf_ok(text), text
        else:
            value = json.loads(text)
            if spec.kind == "json_schema":
                assert set(value) == {"id", "tag"} and 0 <= value["id"] <= 99 and value["tag"] in "ab"
    assert_all_blocks_released(llm.engine)


def test_unconstrained_requests_are_unchanged_in_a_mixed_batch(model_dir):
    prompts = ["the quick", "hello world", "radix trees", "paged cache"]
    plain = [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
             SamplingParams(temperature=0.8, seed=5, max_tokens=24, ignore_eos=True)]
    alone = make_llm(model_dir).generate(prompts[:2], plain, use_tqdm=False)
    mixed_params = [plain[0], constrained({"json": SCHEMA}), plain[1], constrained({"regex": REGEXES[0]})]
    mixed = make_llm(model_dir).generate([prompts[0], prompts[2], prompts[1], prompts[3]], mixed_params,
                                         use_tqdm=False)
    assert mixed[0].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert mixed[2].outputs[0].token_ids == alone[1].outputs[0].token_ids
    assert re.fullmatch(REGEXES[0], mixed[3].outputs[0].text)


def test_preemption_does_not_change_constrained_outputs(model_dir):
    prompts = [f"the quick brown fox {i}" for i in range(6)]
    params = [constrained({"regex": r"[a-z]{20,30}"}, seed=i, max_tokens=40) for i in range(6)]
    roomy = make_llm(model_dir).generate(prompts, params, use_tqdm=False)
    tight_llm = make_llm(model_dir, num_kv_blocks=20, max_num_batched_tokens=32)
    tight = tight_llm.generate(prompts, params, use_tqdm=False)
    assert tight_llm.engine.scheduler.num_preemptions > 0
    assert [o.outputs[0].token_ids for o in tight] == [o.outputs[0].token_ids for o in roomy]
    assert all(re.fullmatch(r"[a-z]{20,30}", o.outputs[0].text) for o in tight)


def test_every_sequence_of_n_follows_the_grammar(model_dir):
    params = SamplingParams(n=3, temperature=1.0, seed=3, max_tokens=16,
                            structured_outputs={"choice": ["one", "two", "three", "four"]})
    [output] = make_llm(model_dir).generate("hello", params, use_tqdm=False)
    assert len(output.outputs) == 3
    assert all(c.text in ("one", "two", "three", "four") and c.finish_reason == "stop" for c in output.outputs)


def test_bad_grammar_is_a_value_error_before_anything_runs(model_dir):
    llm = make_llm(model_dir)
    with pytest.raises(ValueError, match="invalid regex grammar"):
        llm.generate(["hi", "there"], [SamplingParams(max_tokens=4),
                                       SamplingParams(structured_outputs={"regex": "(("})], use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_a_grammar_still_compiling_does_not_stall_the_batch(model_dir):
    engine = make_llm(model_dir).engine
    backend = engine.structured.backend
    compile_fast = backend.compile
    gate = threading.Event()

    def compile_slowly(spec):
        gate.wait(timeout=30)
        return compile_fast(spec)

    backend.compile = compile_slowly
    engine.add_request("plain", "hello", SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    engine.add_request("json", "hello", SamplingParams(temperature=0.0, max_tokens=40,
                                                       structured_outputs={"json": SCHEMA}))
    engine.add_request("bad", "x", SamplingParams(max_tokens=4, structured_outputs={"regex": "(("}))
    outputs: dict[str, list] = {}
    for _ in range(6):  # the plain request runs to the end while both grammars are still compiling
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    assert set(outputs) == {"plain"} and outputs["plain"][-1].outputs[0].finish_reason == "length"
    gate.set()
    while engine.has_unfinished_requests():
        for output in engine.step():
            outputs.setdefault(output.request_id, []).append(output)
    assert json.loads(outputs["json"][-1].outputs[0].text)["tag"] in ("a", "b")
    assert outputs["bad"][-1].outputs[0].finish_reason == "error"  # the request's own failure: it alone ends
    assert "invalid regex grammar" in outputs["bad"][-1].error
    assert_all_blocks_released(engine)


def test_requests_waiting_for_a_grammar_count_against_the_queue_limit(model_dir):
    engine = make_llm(model_dir, max_queued_requests=1).engine
    backend = engine.structured.backend
    compile_fast, gate = backend.compile, threading.Event()
    backend.compile = lambda spec: (gate.wait(timeout=30), compile_fast(spec))[1]
    engine.add_request("json", "hello", SamplingParams(temperature=0.0, max_tokens=40,
                                                       structured_outputs={"json": SCHEMA}))
    with pytest.raises(QueueFullError):
        engine.add_request("plain", "hello", SamplingParams(max_tokens=4))
    gate.set()
    outputs = {}
    while engine.has_unfinished_requests():  # once compiled, it is queued without tripping the limit again
        for output in engine.step():
            outputs[output.request_id] = output
    assert json.loads(outputs["json"].outputs[0].text)["tag"] in ("a", "b")
