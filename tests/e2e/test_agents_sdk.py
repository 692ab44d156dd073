"""The OpenAI Agents SDK runs agents to completion against `radixlm serve` on the default model, through both of
its OpenAI models: `OpenAIResponsesModel` (POST /v1/responses) and `OpenAIChatCompletionsModel` (POST
/v1/chat/completions), with one function tool. A forced tool choice always calls the tool with valid arguments (the
grammar sees to it); after the call, the SDK resets the choice and the model answers the tool's result in text.
Under "auto" SmolLM2-135M never picks the tool: the run just ends with its text."""

from __future__ import annotations

import asyncio

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

pytestmark = pytest.mark.slow

MODEL_KINDS = ("responses", "chat_completions")


@pytest.fixture(scope="module")
def server(default_tool_server):
    return default_tool_server


def run_agent(server, kind: str, question: str, streamed: bool = False, **agent_options):
    """Run one agent to its final output (`Runner.run`, or `Runner.run_streamed` read to its end); returns (the
    run's result, the tool's calls)."""
    set_tracing_disabled(True)
    calls: list[str] = []

    @function_tool
    def get_time(city: str) -> str:
        """The local time in a city."""
        calls.append(city)
        return "07:30"

    async def run():
        client = AsyncOpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
        model_class = OpenAIResponsesModel if kind == "responses" else OpenAIChatCompletionsModel
        agent = Agent(name="clock", instructions="Answer in a few words.", tools=[get_time],
                      model=model_class(model="m", openai_client=client), **agent_options)
        try:
            if not streamed:
                return await Runner.run(agent, question, max_turns=3)
            result = Runner.run_streamed(agent, question, max_turns=3)
            async for _ in result.stream_events():
                pass
            return result
        finally:
            await client.close()

    return asyncio.run(run()), calls


def settings(tool_choice: str):
    """Greedy, one call per turn (with parallel calls allowed the small model repeats its call)."""
    return ModelSettings(tool_choice=tool_choice, temperature=0, max_tokens=96, parallel_tool_calls=False)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_required_tool_choice_stops_on_the_tool(server, kind):
    result, calls = run_agent(server, kind, "What time is it in Oslo?", model_settings=settings("required"),
                              tool_use_behavior="stop_on_first_tool")
    assert result.final_output == "07:30" and len(calls) == 1 and isinstance(calls[0], str)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_named_tool_choice_then_the_answer_in_text(server, kind):
    """The SDK resets tool_choice after the call (reset_tool_choice), so the second turn is "auto" and answers
    with the function_call_output in its input."""
    result, calls = run_agent(server, kind, "What time is it in Oslo?", model_settings=settings("get_time"))
    assert len(calls) == 1 and isinstance(result.final_output, str) and result.final_output
    kinds = [item.type for item in result.new_items]
    assert kinds[:2] == ["tool_call_item", "tool_call_output_item"] and kinds[-1] == "message_output_item"


@pytest.mark.parametrize(("kind", "streamed"), [(kind, False) for kind in MODEL_KINDS] + [("responses", True)])
def test_auto_tool_choice_ends_with_text(server, kind, streamed):
    result, calls = run_agent(server, kind, "Say hello.", streamed, model_settings=settings("auto"))
    assert not calls and isinstance(result.final_output, str) and result.final_output
