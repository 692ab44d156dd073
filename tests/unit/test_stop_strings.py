"""Stop strings on token-by-token text: final text, stop reason, and streamed deltas that add up to it."""

import pytest
from tiny_models import build_tokenizer

from radixlm.engine.stop_strings import find_stop, held_back_length
from radixlm.engine.text_stream import TextStream
from radixlm.sampling_params import SamplingParams

FOX = "the quick brown fox jumps over the lazy dog"
UNICODE = "héllo wörld ünïcode, 你好世界, emoji 🙂 and numbers"

# name: (generated text, stop strings, include_stop_str_in_output, expected text, expected stop string)
CASES = {
    "stop at start": (FOX, ["the"], False, "", "the"),
    "stop at start, included": (FOX, ["the"], True, "the", "the"),
    "spanning 3 tokens": (FOX, ["ick b"], False, "the qu", "ick b"),  # tokens 'i', 'ck', ' b'
    "spanning tokens, included": (FOX, ["ck br"], True, "the quick br", "ck br"),
    "overlapping: the first to complete wins": (FOX, ["brown fox", "own f", "fox jumps"], False, "the quick br",
                                                "own f"),
    "overlapping: same end, the longer wins": (FOX, ["own", "brown"], False, "the quick ", "brown"),
    "a stop's prefix appears before the stop": (FOX, ["the l"], False, "the quick brown fox jumps over ", "the l"),
    "unicode inside multi-byte characters": (UNICODE, ["好世"], False, "héllo wörld ünïcode, 你", "好世"),
    "unicode emoji, included": (UNICODE, ["🙂"], True, "héllo wörld ünïcode, 你好世界, emoji 🙂", "🙂"),
    "no match: the held-back end is flushed at the finish": (FOX[:22], ["jumps"], False, FOX[:22], None),
    "no stop strings": (UNICODE, [], False, UNICODE, None),
}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def stream_text(tokenizer, text, stops, include):
    """Feed the text's tokens one by one as the engine does; returns (final text, stop, deltas, emitted so far
    just before the finish)."""
    token_ids = tokenizer.encode(text)
    stream = TextStream(tokenizer, tokenizer.encode("hello"), SamplingParams(stop=stops,
                                                                             include_stop_str_in_output=include))
    deltas = []
    stop = None
    for count, token_id in enumerate(token_ids, 1):
        stop = stream.add_token(token_id, count)
        if stop is not None:
            break
        deltas.append(stream.take_delta(finished=False))
        assert FOX.startswith("".join(deltas)) or UNICODE.startswith("".join(deltas))
    emitted_before_finish = "".join(deltas)
    deltas.append(stream.take_delta(finished=True))
    return stream.text, stop, deltas, emitted_before_finish


@pytest.mark.parametrize("case", CASES)
def test_stop_string_table(tokenizer, case):
    text, stops, include, expected_text, expected_stop = CASES[case]
    final_text, stop, deltas, _ = stream_text(tokenizer, text, stops, include)
    assert (final_text, stop) == (expected_text, expected_stop)
    assert "".join(deltas) == final_text
    assert all("\ufffd" not in delta for delta in deltas), "a delta split a multi-byte character"


def test_spanning_case_really_spans_three_tokens(tokenizer):
    pieces = [tokenizer.decode([t]) for t in tokenizer.encode(FOX)]
    assert pieces[3:6] == ["i", "ck", " b"]


def test_streaming_never_emits_what_a_stop_string_could_still_claim(tokenizer):
    _, _, _, emitted = stream_text(tokenizer, FOX[:22], ["jumps"], False)
    assert emitted == "the quick brown fox "  # "ju" waits: it may become "jumps"
    _, _, _, emitted = stream_text(tokenizer, FOX[:22], ["jumps"], True)
    assert emitted == FOX[:22]  # an included stop string is never taken back, so nothing waits


def test_stop_strings_wait_for_min_tokens(tokenizer):
    stream = TextStream(tokenizer, [5], SamplingParams(stop=["the", "fox"], min_tokens=3, max_tokens=10))
    stops = [stream.add_token(t, n) for n, t in enumerate(tokenizer.encode(FOX)[:14], 1)]
    assert stops.index("fox") == 13 and stops.count(None) == 13  # "the" in tokens 1..3 was not checked


@pytest.mark.parametrize(("text", "new", "stops", "expected"), [
    ("abcabc", 1, ["abc"], (3, "abc")),  # only matches that end in the new text count
    ("xabcd", 3, ["abcd", "bc"], (2, "bc")),
    ("ab", 2, ["abc"], None),
])
def test_find_stop(text, new, stops, expected):
    match = find_stop(text, new, stops)
    assert (match.start, match.stop) == expected if expected else match is None


@pytest.mark.parametrize(("text", "stops", "expected"), [
    ("hello wor", ["world"], 3), ("hello", ["world"], 0), ("abab", ["abac", "b"], 2), ("xaba", ["abac"], 3),
    ("", ["x"], 0),
])
def test_held_back_length(text, stops, expected):
    assert held_back_length(text, stops) == expected


def test_a_sequence_ending_inside_a_character_shows_what_a_full_decode_shows(tokenizer):
    token_ids = tokenizer.encode("ab 你好")[:-1]  # the last byte of 好 is missing
    stream = TextStream(tokenizer, [5], SamplingParams())
    deltas = []
    for count, token_id in enumerate(token_ids, 1):
        stream.add_token(token_id, count)
        deltas.append(stream.take_delta(finished=False))
    assert "".join(deltas) == "ab 你"  # the unfinished character waits
    deltas.append(stream.take_delta(finished=True))
    assert "".join(deltas) == stream.text == tokenizer.decode(token_ids)
    assert stream.text.endswith("\ufffd")


def test_stop_strings_need_detokenized_text():
    with pytest.raises(ValueError, match="stop needs detokenize=True"):
        SamplingParams(stop=["x"], detokenize=False)
