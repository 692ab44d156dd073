"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`), as vLLM and SGLang serve it.

`bodies` (the request models), `translate` (a Messages body -> a chat request, and its errors back), `blocks`
(parsed deltas -> content blocks), `events` (the named SSE stream), `replies` (the `message` and its usage),
`handler` (the endpoints). Errors on these paths take Anthropic's body (`errors.error_response`).
"""

from __future__ import annotations

from radixlm.server.anthropic_messages.handler import AnthropicMessages

__all__ = ["AnthropicMessages"]
