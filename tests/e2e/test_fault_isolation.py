"""Fault isolation: an exception that belongs to one request ends that request alone (finish_reason "error", its
blocks freed); one in the forward ends the requests of that batch; the other requests finish with the tokens they
get without any fault. Only a broken invariant or a forward that keeps failing stops the engine."""

import pytest

from e2e.engine_runs import drain, run
from radixlm.engine.llm_engine import MAX_FORWARD_FAILURES, build_engine
from radixlm.llm import LLM
from radixlm.sample.sampler import Sampler
from radixlm.sampling_params import SamplingParams

ENGINE = dict(num_kv_blocks=128, block_size=4)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.8, seed=5, max_tokens=8, ignore_eos=True)
REQUESTS = [("a", list(range(10, 25)), GREEDY), ("b", list(range(30, 37)), SEEDED),
            ("c", list(range(40, 61)), SamplingParams(n=2, temperature=0.7, seed=9, max_tokens=6, ignore_eos=True)),
            ("victim", list(range(70, 82)), GREEDY)]


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return str(tiny_model_dir("llama"))


@pytest.fixture(scope="module")
def baseline(model):
    finished = run(build_engine(model=model, **ENGINE), REQUESTS)
    return {rid: [f.token_ids(i) for i in sorted(f.sequences)] for rid, f in finished.items()}


def tokens_of(finished, request_id):
    return [finished[request_id].token_ids(i) for i in sorted(finished[request_id].sequences)]


def assert_others_unchanged(finished, baseline, failed=("victim",)):
    for request_id in baseline:
        if request_id not in failed:
            assert tokens_of(finished, request_id) == baseline[request_id], request_id
            assert finished[request_id].output.error is None


def assert_failed(finished, request_id, phase):
    output = finished[request_id].output
    assert output.finished and {c.finish_reason for c in output.outputs} == {"error"}
    assert phase in output.error, output.error


def test_a_sampling_row_that_raises_fails_its_request_alone(model, baseline, monkeypatch):
    adjust = Sampler._adjust_logits

    def adjust_or_fail(self, logits, batch, requests, *args):
        if any(r.request_id == "victim" and r.num_output_tokens >= 3 for r in requests):
            raise FloatingPointError("injected: the victim's row")
        return adjust(self, logits, batch, requests, *args)

    monkeypatch.setattr(Sampler, "_adjust_logits", adjust_or_fail)
    finished = run(build_engine(model=model, **ENGINE), REQUESTS)  # invariants after every step, no block leaked
    assert_failed(finished, "victim", "sampling failed: FloatingPointError: injected")
    assert finished["victim"].token_ids() == baseline["victim"][0][:3]  # what it had before the fault
    assert_others_unchanged(finished, baseline)


def test_a_forward_that_raises_fails_its_batch_and_the_engine_goes_on(model, baseline):
    engine = build_engine(model=model, max_num_seqs=2, **ENGINE)  # a and b run first, c and victim wait
    execute, calls = engine.runner.execute, []

    def fail_third(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("injected: the forward")
        return execute(*args, **kwargs)

    engine.runner.execute = fail_third
    finished = run(engine, REQUESTS)
    for request_id in ("a", "b"):
        assert_failed(finished, request_id, "the forward pass failed: RuntimeError: injected")
    assert_others_unchanged(finished, baseline, failed=("a", "b"))
    assert run(engine, REQUESTS[:1])["a"].token_ids() == baseline["a"][0]  # and it still serves


def test_a_failing_detokenizer_fails_its_request_alone(model, baseline):
    engine = build_engine(model=model, **ENGINE)
    for request_id, prompt, params in REQUESTS:
        engine.add_request(request_id, prompt, params)
    text = engine.output_processor.parents["victim"].first.text
    add_token = text.add_token
    text.add_token = lambda token_id, n: add_token(token_id, n) if n < 4 else 1 / 0
    finished = drain(engine)
    assert_failed(finished, "victim", "detokenizing or stop checks failed: ZeroDivisionError")
    assert_others_unchanged(finished, baseline)


def test_a_failing_grammar_fails_its_request_alone(model, baseline):
    engine = build_engine(model=model, **ENGINE)
    accept = engine.grammars.accept

    def accept_or_fail(request_id, token_ids):
        request = engine.scheduler.requests.get(request_id)
        if request_id.startswith("victim") and request is not None and request.num_output_tokens == 2:
            raise RuntimeError("injected: the matcher")
        return accept(request_id, token_ids)

    engine.grammars.accept = accept_or_fail
    finished = run(engine, REQUESTS)
    assert_failed(finished, "victim", "the grammar failed: RuntimeError: injected")
    assert_others_unchanged(finished, baseline)


def test_the_offline_api_returns_the_error_with_the_output(model, monkeypatch):
    adjust = Sampler._adjust_logits
    monkeypatch.setattr(Sampler, "_adjust_logits", lambda self, logits, batch, requests, *args: (
        (_ for _ in ()).throw(ValueError("injected")) if any(r.sampling_params.top_k == 7 for r in requests)
        else adjust(self, logits, batch, requests, *args)))
    llm = LLM(model=model, **ENGINE)
    good, bad = llm.generate([[5, 6, 7], [8, 9]], [GREEDY, SamplingParams(top_k=7, max_tokens=4)], use_tqdm=False)
    assert good.error is None and len(good.outputs[0].token_ids) == 8
    assert bad.outputs[0].finish_reason == "error" and "sampling failed: ValueError: injected" in bad.error


def test_a_forward_that_keeps_failing_or_a_broken_invariant_stops_the_engine(model):
    engine = build_engine(model=model, **ENGINE)
    engine.runner.execute = lambda *args, **kwargs: 1 / 0
    for attempt in range(MAX_FORWARD_FAILURES - 1):
        engine.add_request(f"r{attempt}", [1, 2, 3], GREEDY)
        outputs = engine.step()
        assert outputs[0].error is not None and not engine.has_unfinished_requests()
    engine.add_request("last", [1, 2, 3], GREEDY)
    with pytest.raises(RuntimeError, match=f"{MAX_FORWARD_FAILURES} forward passes failed in a row"):
        engine.step()

    engine = build_engine(model=model, **ENGINE)
    engine.runner.execute = lambda *args, **kwargs: 1 / 0
    engine.scheduler.check_invariants = lambda: (_ for _ in ()).throw(AssertionError("injected: broken"))
    engine.add_request("r", [1, 2, 3], GREEDY)
    with pytest.raises(AssertionError, match="injected: broken"):
        engine.step()


def test_on_finish_runs_once_in_every_terminal_state_and_a_raising_one_harms_nothing(model, baseline, monkeypatch):
    adjust = Sampler._adjust_logits
    monkeypatch.setattr(Sampler, "_adjust_logits", lambda self, logits, batch, requests, *args: (
        (_ for _ in ()).throw(ValueError("injected")) if any(r.request_id == "victim" for r in requests)
        else adjust(self, logits, batch, requests, *args)))
    engine = build_engine(model=model, **ENGINE)
    calls = []

    def record(output):
        calls.append((output.request_id, output.metadata, [c.finish_reason for c in output.outputs]))
        raise RuntimeError("a callback that raises")

    for request_id, prompt, params in REQUESTS:
        engine.add_request(request_id, prompt, params, metadata={"user": request_id}, on_finish=record)
    engine.add_request("aborted", [3, 4, 5], GREEDY, metadata={"user": "x"}, on_finish=record)
    engine.step()
    engine.abort_request("aborted")
    finished = drain(engine)
    assert sorted(c[0] for c in calls) == sorted([*(r[0] for r in REQUESTS), "aborted"])  # once each
    reasons = {request_id: reasons for request_id, _, reasons in calls}
    assert reasons["aborted"] == ["abort"] and reasons["victim"] == ["error"] and reasons["a"] == ["length"]
    assert all(metadata == {"user": request_id} or request_id == "aborted" for request_id, metadata, _ in calls)
    assert finished["a"].output.metadata == {"user": "a"}
    assert_others_unchanged(finished, baseline)


def test_a_request_whose_sequences_all_fail_to_sample_ends_once(model, baseline, monkeypatch):
    adjust = Sampler._adjust_logits
    monkeypatch.setattr(Sampler, "_adjust_logits", lambda self, logits, batch, requests, *args: (
        (_ for _ in ()).throw(ValueError("injected")) if any(r.request_id.startswith("c") for r in requests)
        else adjust(self, logits, batch, requests, *args)))
    finished = run(build_engine(model=model, **ENGINE), REQUESTS)  # c has n=2: both rows fail in one step
    assert_failed(finished, "c", "sampling failed: ValueError: injected")
    assert_others_unchanged(finished, baseline, failed=("c",))
