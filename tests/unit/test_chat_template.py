"""--chat-template (shipped name, file, inline Jinja), chat_template_kwargs, and tool messages as templates get them;
the shipped smollm2_tools template renders exactly SmolLM2's own template when there are no tools."""

import pytest
from tiny_models import build_tokenizer

from radixlm.server.chat_options import ChatOptions
from radixlm.server.chat_template import chat_prompt_ids, check_template_kwargs, load_chat_template, shipped_templates
from radixlm.server.errors import APIError
from radixlm.server.request_bodies import ChatMessage

# SmolLM2-Instruct's own chat template, as its tokenizer_config.json ships it.
SMOLLM2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>"
           "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
           "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def render(tokenizer, messages, **kwargs) -> str:
    ids = chat_prompt_ids(tokenizer, [ChatMessage(**m) for m in messages], True, **kwargs)
    return tokenizer.decode(ids)


def test_template_sources(tmp_path):
    assert "smollm2_tools" in shipped_templates()
    assert "<tool_call>" in load_chat_template("smollm2_tools")
    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0].content }}")
    assert load_chat_template(str(path)) == "{{ messages[0].content }}"
    assert load_chat_template("{% if x %}{% endif %}") == "{% if x %}{% endif %}"
    with pytest.raises(ValueError, match="chat_template"):
        ChatOptions(chat_template="no-such-file.jinja")
    with pytest.raises(ValueError, match="tool_call_parser"):
        ChatOptions(tool_call_parser="nope")
    with pytest.raises(ValueError, match="tool-call-parser"):
        ChatOptions(enable_auto_tool_choice=True)


@pytest.mark.parametrize("messages", [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "bye"}]])
def test_shipped_template_matches_smollm2_without_tools(tokenizer, messages):
    shipped = load_chat_template("smollm2_tools")
    assert render(tokenizer, messages, chat_template=shipped) == render(tokenizer, messages, chat_template=SMOLLM2)


def test_kwargs_and_tools_reach_the_template(tokenizer):
    template = "{{ mood }}|{{ tools[0].function.name }}|{{ messages[1].tool_calls[0].function.arguments.city }}"
    messages = [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}}]}]
    tools = [{"type": "function", "function": {"name": "w"}}]
    text = render(tokenizer, messages, tools=tools, chat_template=template, template_kwargs={"mood": "calm"})
    assert text == "calm|w|Oslo"


def test_template_kwargs_are_checked():
    assert check_template_kwargs({"enable_thinking": False}) == {"enable_thinking": False}
    for bad in ({"tokenize": True}, {"1x": 1}, {f"k{i}": i for i in range(17)}, [1]):
        with pytest.raises(ValueError, match="chat_template_kwargs"):
            check_template_kwargs(bad)


def test_a_failing_template_is_a_400(tokenizer):
    with pytest.raises(APIError) as error:
        render(tokenizer, [{"role": "user", "content": "x"}], chat_template="{{ raise_exception('no') }}")
    assert error.value.status == 400
