"""POST /v1/responses, GET and DELETE /v1/responses/{id}: OpenAI's Responses API over the chat path.

A Responses body is translated into a ChatCompletionRequest (`translate.py`, `input_items.py`) and started by
`ChatCompletions.start`, so templating, tools, structured outputs and admission are chat's own. The generated text
is read by chat's `SequenceParser` and assembled into output items and stream events (`events.py`); finished
responses are kept in a bounded per-app store (`store.py`) for `previous_response_id` and GET.
"""

from radixlm.server.openai_responses.handler import OpenAIResponses
from radixlm.server.openai_responses.store import ResponseStore

__all__ = ["OpenAIResponses", "ResponseStore"]
