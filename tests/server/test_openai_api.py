"""The OpenAI API through the official client against a real server on the tiny random-weight Llama."""

from __future__ import annotations

import json
import math

import openai
import pytest

from radixlm.llm import LLM
from radixlm.sampling_params import SamplingParams

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "the quick brown fox"}]
GREEDY = dict(temperature=0, max_tokens=12)


def stream_chat(client, **kwargs):
    """Concatenate a chat stream per choice index; returns ({index: text}, {index: finish_reason}, chunks)."""
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    texts, reasons = {}, {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                reasons[choice.index] = choice.finish_reason
    return texts, reasons, chunks


def test_models_lists_the_served_model(client, tiny_model_dir):
    models = client.models.list().data
    assert [m.id for m in models] == [str(tiny_model_dir("llama"))]
    # models.retrieve (a name holding "/" too), and an unknown one: 404 in OpenAI's shape
    assert client.models.retrieve(models[0].id).id == models[0].id
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("no-such-model")
    assert error.value.body["code"] == "model_not_found"


def test_chat_equals_offline_engine_and_stream(client, model, tiny_model_dir):
    response = client.chat.completions.create(model=model, messages=MESSAGES, **GREEDY)
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    llm = LLM(str(tiny_model_dir("llama")), num_kv_blocks=64, block_size=4)
    offline = llm.chat(MESSAGES, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)[0]
    assert choice.message.content == offline.outputs[0].text
    assert response.usage.prompt_tokens == len(offline.prompt_token_ids)
    assert response.usage.completion_tokens == len(offline.outputs[0].token_ids)
    texts, reasons, chunks = stream_chat(client, model=model, messages=MESSAGES, **GREEDY)
    assert texts == {0: choice.message.content} and reasons == {0: choice.finish_reason}
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.id == chunks[0].id and c.object == "chat.completion.chunk" for c in chunks)


def test_completions_equal_stream(client, model):
    response = client.completions.create(model=model, prompt="a paged KV cache", **GREEDY)
    text = response.choices[0].text
    assert response.object == "text_completion" and len(text) > 0
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="a paged KV cache", stream=True, **GREEDY) if c.choices)
    assert streamed == text


def tokenize(server, prompt: str) -> list[int]:
    return server.http.post("/tokenize", json={"prompt": prompt}).json()["tokens"]


def test_prompt_forms_and_choice_order(tiny_server, client, model):
    tokens = tokenize(tiny_server, "radix trees share")
    single = {p: client.completions.create(model=model, prompt=p, **GREEDY).choices[0].text
              for p in ("the lazy dog", "radix trees share")}
    by_ids = client.completions.create(model=model, prompt=tokens, **GREEDY).choices[0].text
    assert by_ids == single["radix trees share"]
    many = client.completions.create(model=model, prompt=["the lazy dog", "radix trees share"], n=2, **GREEDY)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert [c.text for c in many.choices] == [single["the lazy dog"]] * 2 + [single["radix trees share"]] * 2
    id_lists = client.completions.create(model=model, prompt=[tokens, tokens], **GREEDY)
    assert [c.text for c in id_lists.choices] == [single["radix trees share"]] * 2


def test_n3_stream_interleaves_and_matches(client, model):
    kwargs = dict(model=model, messages=MESSAGES, n=3, temperature=1.0, seed=11, max_tokens=10)
    response = client.chat.completions.create(**kwargs)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert response.usage.completion_tokens >= 3
    texts, reasons, chunks = stream_chat(client, **kwargs)
    assert texts == {c.index: c.message.content for c in response.choices}
    assert set(reasons) == {0, 1, 2}
    assert [c.choices[0].index for c in chunks[:3]] == [0, 1, 2]  # every choice opens with its role
    assert len({c.message.content for c in response.choices}) > 1, "n samples should differ at temperature 1"


def test_seeded_sampling_is_reproducible(client, model):
    def sample(seed):
        return client.completions.create(model=model, prompt="the quick", temperature=1.0, seed=seed,
                                         max_tokens=16).choices[0].text

    assert sample(5) == sample(5)
    assert len({sample(seed) for seed in (1, 2, 3)}) > 1


def test_chat_logprobs(client, model):
    response = client.chat.completions.create(model=model, messages=MESSAGES, logprobs=True, top_logprobs=3,
                                              **GREEDY)
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens
    for entry in content:
        assert len(entry.top_logprobs) == 3
        values = [t.logprob for t in entry.top_logprobs]
        assert values == sorted(values, reverse=True) and all(v <= 0 for v in values)
        assert entry.token == entry.top_logprobs[0].token  # greedy picks the most likely token
        assert math.isclose(entry.logprob, values[0], abs_tol=1e-4)
    assert "".join(e.token for e in content) == response.choices[0].message.content


def test_completion_logprobs_with_echo(tiny_server, client, model):
    prompt = "the quick brown"
    num_prompt_tokens = len(tokenize(tiny_server, prompt))
    response = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=2, **GREEDY)
    choice = response.choices[0]
    assert choice.text.startswith(prompt)
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == num_prompt_tokens + response.usage.completion_tokens
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(isinstance(v, float) and v <= 0 for v in logprobs.token_logprobs[1:])
    # top 2 plus the chosen token, keyed by text as OpenAI does (byte tokens decoding to the same text merge)
    assert all(1 <= len(top) <= 3 and max(top.values()) <= 0 for top in logprobs.top_logprobs[1:])
    assert all(chosen <= max(top.values()) + 1e-5
               for chosen, top in zip(logprobs.token_logprobs[1:], logprobs.top_logprobs[1:], strict=True))
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)
    plain = client.completions.create(model=model, prompt=prompt, **GREEDY).choices[0].text
    assert choice.text == prompt + plain
    again = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=2, **GREEDY).choices[0]
    assert again.logprobs.token_logprobs == pytest.approx(logprobs.token_logprobs, abs=1e-4), \
        "a prompt in the prefix cache must still get its prompt logprobs"


def test_prompt_scoring_with_echo_and_max_tokens_0(tiny_server, client, model):
    """lm-eval's and OpenAI's legacy prompt scoring: the prompt's logprobs, nothing generated (was a 400)."""
    prompt = "the quick brown"
    num_prompt_tokens = len(tokenize(tiny_server, prompt))
    scored = client.completions.create(model=model, prompt=[prompt, "fox"], echo=True, logprobs=1, max_tokens=0)
    full = client.completions.create(model=model, prompt=prompt, echo=True, logprobs=1, **GREEDY).choices[0]
    choice = scored.choices[0]
    assert choice.text == prompt and choice.finish_reason == "length"
    assert len(choice.logprobs.tokens) == num_prompt_tokens and choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.token_logprobs == pytest.approx(full.logprobs.token_logprobs[:num_prompt_tokens],
                                                           abs=1e-4)
    assert scored.choices[1].text == "fox" and scored.usage.completion_tokens == 0
    chunks = list(client.completions.create(model=model, prompt=prompt, echo=True, logprobs=1, max_tokens=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == prompt
    assert chunks[-1].usage.completion_tokens == 0
    no_echo = tiny_server.http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 0})
    assert no_echo.status_code == 400 and no_echo.json()["error"]["param"] == "max_tokens"


def test_stop_strings(client, model):
    full = client.completions.create(model=model, prompt="the lazy", temperature=0, max_tokens=24,
                                     extra_body={"ignore_eos": True}).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 2]
    cut = full[:full.index(stop)]
    stopped = client.completions.create(model=model, prompt="the lazy", temperature=0, max_tokens=24,
                                        stop=[stop], extra_body={"ignore_eos": True}).choices[0]
    assert (stopped.text, stopped.finish_reason) == (cut, "stop")
    included = client.completions.create(model=model, prompt="the lazy", temperature=0, max_tokens=24, stop=stop,
                                         extra_body={"ignore_eos": True, "include_stop_str_in_output": True}
                                         ).choices[0]
    assert included.text == cut + stop


def test_include_usage_and_cached_tokens(client, model):
    long_messages = [{"role": "user", "content": "continuous batching mixes prefill chunks with decode steps " * 4}]
    first = client.chat.completions.create(model=model, messages=long_messages, **GREEDY)
    chunks = list(client.chat.completions.create(model=model, messages=long_messages, stream=True,
                                                 stream_options={"include_usage": True}, **GREEDY))
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and last.usage.prompt_tokens == first.usage.prompt_tokens
    assert last.usage.completion_tokens == first.usage.completion_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert last.usage.prompt_tokens_details.cached_tokens >= last.usage.prompt_tokens - 4  # the repeat hits the cache


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(client, model):
    """vLLM's stream_options.continuous_usage_stats (was accepted and ignored)."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    fields = dict(model=model, stream=True, stream_options=options, max_tokens=6, temperature=0,
                  extra_body={"ignore_eos": True})
    for chunks in (list(client.chat.completions.create(messages=MESSAGES, **fields)),
                   list(client.completions.create(prompt="the quick brown", **fields))):
        assert all(c.usage is not None for c in chunks)
        completion_tokens = [c.usage.completion_tokens for c in chunks]
        assert completion_tokens == sorted(completion_tokens) and completion_tokens[-1] == 6
        assert len({c.usage.prompt_tokens for c in chunks}) == 1 and chunks[0].usage.prompt_tokens > 0
    plain = list(client.completions.create(prompt="the quick brown", **(fields | {"stream_options": {
        "continuous_usage_stats": True}})))
    assert all(c.usage is None for c in plain)  # as vLLM: only together with include_usage


def test_timings_when_asked(tiny_server):
    """llama.cpp's `timings` (with `timings_per_token`, as its clients ask): counts that match the usage, times
    that are finite; absent otherwise."""
    body = {"messages": MESSAGES, "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    plain = tiny_server.http.post("/v1/chat/completions", json=body).json()
    assert "timings" not in plain
    for path, extra in (("/v1/chat/completions", {}), ("/v1/completions", {"prompt": ["a b", "c d e"]})):
        fields = body | {"timings_per_token": True} | extra
        if extra:
            del fields["messages"]
        response = tiny_server.http.post(path, json=fields).json()
        timings, usage = response["timings"], response["usage"]
        assert timings["prompt_n"] + timings["cache_n"] == usage["prompt_tokens"]
        assert timings["predicted_n"] == usage["completion_tokens"]
        assert all(value >= 0 and math.isfinite(value) for value in timings.values())
        assert timings["predicted_ms"] > 0 and timings["predicted_per_second"] > 0
    with tiny_server.http.stream("POST", "/v1/chat/completions",
                                 json=body | {"stream": True, "timings_per_token": True}) as stream:
        chunks = [json.loads(line[6:]) for line in stream.iter_lines() if line.startswith("data: {")]
    assert all("timings" in chunk for chunk in chunks)
    assert chunks[-1]["timings"]["predicted_n"] == 5


def test_metrics_counters_move(tiny_server, client, model):
    before = tiny_server.metrics()
    response = client.completions.create(model=model, prompt="import torch", temperature=0, max_tokens=5,
                                         extra_body={"ignore_eos": True})
    after = tiny_server.metrics()

    def delta(name):
        return after.get(name, 0.0) - before.get(name, 0.0)

    assert delta("radixlm:prompt_tokens_total{}") == response.usage.prompt_tokens
    assert delta("radixlm:generation_tokens_total{}") == 5
    assert delta("radixlm:request_finished_total{finished_reason=length}") == 1
    for histogram in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds"):
        assert delta(f"radixlm:{histogram}_count{{}}") == 1
    assert delta("radixlm:inter_token_latency_seconds_count{}") == 4
    assert after["radixlm:num_requests_running{}"] == 0 and after["radixlm:kv_cache_usage_perc{}"] == 0
    assert "radixlm:num_preemptions_total{}" in after and "radixlm:num_requests_waiting{}" in after
    again = client.completions.create(model=model, prompt="import torch", temperature=0, max_tokens=5)
    last = tiny_server.metrics()
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1
    assert 0 < last["radixlm:prefix_cache_hit_rate{}"] <= 1
    assert "radixlm:prefix_cache_evicted_blocks_total{}" in last


def test_tokenize_detokenize_and_chat_parts(tiny_server, client, model):
    tokens = tiny_server.http.post("/tokenize", json={"prompt": "héllo wörld"}).json()
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == 512
    text = tiny_server.http.post("/detokenize", json={"tokens": tokens["tokens"]}).json()["prompt"]
    assert text == "héllo wörld"
    parts = [{"role": "user", "content": [{"type": "text", "text": "the quick brown fox"}]}]
    as_parts = client.chat.completions.create(model=model, messages=parts, **GREEDY).choices[0].message.content
    plain = client.chat.completions.create(model=model, messages=[MESSAGES[1]], **GREEDY).choices[0].message.content
    assert as_parts == plain


def test_unknown_fields_are_ignored(client, model):
    response = client.chat.completions.create(model=model, messages=MESSAGES, user="u1", **GREEDY,
                                              extra_body={"some_future_field": {"x": 1}, "store": False})
    assert response.choices[0].message.content


def test_sampling_fields_reach_the_engine(tiny_server, client, model):
    token = tokenize(tiny_server, "fox")[-1]
    forced_text = tiny_server.http.post("/detokenize", json={"tokens": [token] * 4}).json()["prompt"]
    forced = client.completions.create(model=model, prompt="the", max_tokens=4, temperature=0,
                                       logit_bias={str(token): 100}, extra_body={"ignore_eos": True})
    assert forced.choices[0].text == forced_text
    stopped = client.completions.create(model=model, prompt="the", max_tokens=4, temperature=0,
                                        logit_bias={str(token): 100}, extra_body={"stop_token_ids": [token]})
    assert (stopped.choices[0].finish_reason, stopped.usage.completion_tokens) == ("stop", 1)
    capped = client.chat.completions.create(model=model, messages=MESSAGES, max_completion_tokens=3, max_tokens=9,
                                            extra_body={"ignore_eos": True})
    assert capped.usage.completion_tokens == 3
    greedy = client.completions.create(model=model, prompt="the lazy", max_tokens=8, temperature=0).choices[0].text
    top_1 = client.completions.create(model=model, prompt="the lazy", max_tokens=8, temperature=1.5,
                                      extra_body={"top_k": 1}).choices[0].text
    assert top_1 == greedy
