import dataclasses
import json
import math

import pytest

from radixlm.sampling_params import SamplingParams

BAD_VALUES = [
    ("n", 0), ("n", 1.5), ("best_of", 0), ("max_tokens", 0), ("max_tokens", -5), ("min_tokens", -1),
    ("temperature", -1.0), ("temperature", math.inf), ("temperature", math.nan), ("temperature", "hot"),
    ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("top_k", 2.5), ("min_p", -0.1), ("min_p", 1.1),
    ("repetition_penalty", 0.0), ("repetition_penalty", -1.0), ("frequency_penalty", 2.5),
    ("frequency_penalty", -3.0), ("presence_penalty", 2.01), ("logprobs", 21), ("logprobs", -1),
    ("prompt_logprobs", 100), ("seed", 1.5), ("stop", [""]), ("stop", [3]), ("stop_token_ids", [-1]),
    ("stop_token_ids", ["a"]), ("logit_bias", {5: 200.0}), ("logit_bias", {"x": 1.0}), ("logit_bias", {-3: 1.0}),
    ("ignore_eos", "yes"), ("max_tokens", True),
    ("stop", ["x"] * 65), ("stop", ["x" * 1025]), ("stop_token_ids", list(range(4097))),
    ("logit_bias", dict.fromkeys(range(4097), 1.0)), ("logit_bias", {"9" * 5000: 1.0}),
    ("logit_bias", [1, 2]), ("logit_bias", "abc"), ("logit_bias", {True: 1.0}), ("logit_bias", {"\u0663": 1.0}),
    ("logit_bias", {"5_0": 1.0}), ("logit_bias", {"+5": 1.0}), ("logit_bias", {" 5 ": 1.0}),
    ("structured_outputs", 5), ("structured_outputs", {"regex": "a+", "choice": ["b"]}),
    ("structured_outputs", {"json": "{oops"}), ("structured_outputs", {"xml": "<a/>"}),
    # sizes a client controls are capped here too, not only by the engine (issue 34: a trace's n of 10^9)
    ("n", 10**9), ("best_of", 4097), ("max_tokens", 2**31), ("min_tokens", 10**40),
]


@pytest.mark.parametrize(("field", "value"), BAD_VALUES)
def test_bad_value_raises_value_error_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_cross_field_checks_name_both_fields():
    with pytest.raises(ValueError, match=r"min_tokens must be <= max_tokens \(4\)"):
        SamplingParams(max_tokens=4, min_tokens=5)
    with pytest.raises(ValueError, match=r"best_of must be >= n \(3\)"):
        SamplingParams(n=3, best_of=2)


def test_error_message_states_the_allowed_range():
    with pytest.raises(ValueError, match=r"top_p must be a finite number in \(0.0, 1.0\], got 0.0"):
        SamplingParams(top_p=0.0)


def test_defaults_follow_vllm():
    params = SamplingParams()
    assert (params.n, params.max_tokens, params.temperature, params.top_p, params.top_k) == (1, 16, 1.0, 1.0, 0)
    assert params.stop == () and params.stop_token_ids == () and params.logit_bias is None
    assert not params.is_greedy and SamplingParams(temperature=0).is_greedy


def test_normalisation_makes_params_immutable_and_hashable():
    params = SamplingParams(stop="END", stop_token_ids=[7, 8], logit_bias={"5": 1, 3: -2.5}, top_k=-1)
    assert params.stop == ("END",)
    assert params.stop_token_ids == (7, 8)
    assert params.logit_bias == ((3, -2.5), (5, 1))
    assert params.logit_bias_dict == {3: -2.5, 5: 1}
    assert params.top_k == 0
    assert hash(params) == hash(SamplingParams(stop=["END"], stop_token_ids=(7, 8), logit_bias={3: -2.5, 5: 1}))
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.temperature = 0.5  # type: ignore[misc]


def test_replace_validates_again():
    assert SamplingParams().replace(temperature=0.0).is_greedy
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams().replace(temperature=-1)


@pytest.mark.parametrize("params", [
    SamplingParams(),
    SamplingParams(n=3, best_of=4, temperature=0.5, top_p=0.9, top_k=20, min_p=0.05, seed=-7, stop=["a", "bc"],
                   stop_token_ids=[3, 4], logit_bias={5: -1.5, 2: 3}, logprobs=2, prompt_logprobs=0, min_tokens=2,
                   max_tokens=None, ignore_eos=True, repetition_penalty=1.1, frequency_penalty=0.5,
                   presence_penalty=-0.5, include_stop_str_in_output=True, skip_special_tokens=False),
    SamplingParams(structured_outputs={"json": {"type": "object"}}),
    SamplingParams(structured_outputs={"choice": ["x", "y"]}, detokenize=True),
])
def test_to_dict_drops_defaults_and_round_trips_exactly(params):
    values = params.to_dict()
    assert json.loads(json.dumps(values)) == values  # JSON-ready
    assert all(value != getattr(SamplingParams(), name) for name, value in values.items())
    assert SamplingParams.from_dict(json.loads(json.dumps(values))) == params


def test_from_dict_names_an_unknown_key():
    with pytest.raises(ValueError, match="temprature"):
        SamplingParams.from_dict({"temprature": 0.5})


@pytest.mark.parametrize("spec", [{"kind": "regex", "text": 5}, {"kind": "regex", "text": "a" * 20_000},
                                  {"kind": "json_schema", "text": "x" * 300_000}])
def test_from_dict_checks_a_grammar_spec_like_the_helpers_do(spec):
    """`to_dict` writes a grammar as its spec (kind, text): read back from a hand-edited trace, it gets the limits
    `GrammarSpec.from_*` apply to a client's grammar."""
    with pytest.raises(ValueError, match=r"grammar text must be a string|characters long"):
        SamplingParams.from_dict({"structured_outputs": spec})
