"""OpenAI's logprob `bytes`: a token's own bytes, so that tokens holding parts of a UTF-8 character add up to it
(their decoded text alone is U+FFFD and cannot say which byte each is)."""

from radixlm.server.openai_logprobs import OpenAILogprobs


def test_every_token_has_its_own_bytes_and_partial_characters_add_up(tokenizer):
    logprobs = OpenAILogprobs(tokenizer)
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        assert bytes(logprobs.token_bytes(token_id, text)).decode("utf-8", "replace") == text
    ids = tokenizer.encode("日🎉", add_special_tokens=False)
    parts = [logprobs.token_bytes(i, tokenizer.decode([i])) for i in ids]
    assert any(tokenizer.decode([i]) == "\ufffd" for i in ids)  # some token holds part of a character
    assert bytes(b for part in parts for b in part).decode() == "日🎉"


def test_special_tokens_give_the_bytes_of_their_text(tokenizer):
    logprobs = OpenAILogprobs(tokenizer)
    eos = tokenizer.eos_token_id
    assert logprobs.token_bytes(eos, tokenizer.decode([eos])) == list(tokenizer.decode([eos]).encode())
