"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`, for every failure path.

`APIError` is raised by handlers; `install_error_handlers` routes FastAPI's own failures (validation, unknown
routes, the body-size limit) through the same body, and `middleware.ErrorBoundary` turns bugs into a 500 with it.
On the Messages API's paths (`/v1/messages...`) the same errors take Anthropic's body (`error_response`).
Malformed JSON is a 400 (code `json_invalid`), as OpenAI and vLLM answer it; so is any other invalid body. 429
and 503 carry `Retry-After` (seconds).
"""

from __future__ import annotations

import re
from collections.abc import Container
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlm.errors import ParamError

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          408: "invalid_request_error", 413: "invalid_request_error", 422: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable_error"}
RETRY_AFTER_SECONDS = {429: 1, 503: 5}  # a full queue drains in about a request's time; a load takes longer


class APIError(Exception):
    """An HTTP error with OpenAI's body; `param` names the offending request field."""

    @classmethod
    def bad_value(cls, error: ValueError, fields: Container[str] | None = None) -> APIError:
        """A 400 for a refused value: `param` is the ParamError's field (when `fields` is given, only if it is one of
        them), else unnamed."""
        field = error.field if isinstance(error, ParamError) else None
        return cls(400, str(error), param=field if fields is None or field in fields else None)

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_ or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        retry_after = RETRY_AFTER_SECONDS.get(self.status)
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
        return JSONResponse(self.body(), status_code=self.status, headers=headers)


class BodySizeLimit:
    """ASGI middleware: 413 in OpenAI's shape for a body over `max_bytes`, declared or streamed.

    FastAPI's own `max_body_size` answers a too-large Content-Length with a plain-text 413 that replaces any
    handler's response, so the OpenAI body needs this instead.
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_bytes:
            await error_response(scope["path"], self._too_large())(scope, receive, send)
            return
        received = 0

        async def receive_with_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:  # raised inside the route's body read: FastAPI re-raises HTTPException
                raise HTTPException(413, self._too_large().message)
            return message

        await self.app(scope, receive_with_limit, send)

    def _too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than {self.max_bytes} bytes (--max-request-bytes)")


def _validation_error(errors: list[dict[str, Any]]) -> APIError:
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = errors[0].get("ctx", {}).get("error", "")
        return APIError(400, f"malformed JSON body: {detail}".rstrip(": "), code="json_invalid")
    first = errors[0]
    location = _field_path([part for part in first.get("loc", ()) if part != "body"])
    param = ".".join(location) or None
    if first.get("type") == "model_attributes_type" and not location:
        message = "the body must be a JSON object (send it with Content-Type: application/json)"
    else:
        message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
        if len(errors) > 1:
            message += f" (and {len(errors) - 1} more errors)"
    return APIError(400, message, param=param, code=first.get("type"))


# Parts of a pydantic error location that name a type, not a field: the member of a union that was tried
# ("prompt.str", "stop.list[str]"), or a dict key's own check ("metadata.<key>.[key]").
_TYPE_TAG = re.compile(r"(str|int|float|bool|none|list|dict|tuple|set)(\[.*\])?|\[key\]|(function|constrained)-.*")


def _field_path(location: list[Any]) -> list[str]:
    """The field path of an error location, up to the first part that names a type or is not a short name (a
    client's own dict key is data, not a field)."""
    path = []
    for part in location:
        if isinstance(part, str) and (_TYPE_TAG.fullmatch(part) or len(part) > 64 or not part.isidentifier()):
            break
        path.append(str(part))
    return path


# The Messages API (`/v1/messages`, `/v1/messages/count_tokens`): its errors take Anthropic's body, whose `type`
# follows the status as Anthropic's API sets it; the status codes stay those of the OpenAI paths.
ANTHROPIC_PATH = "/v1/messages"
_ANTHROPIC_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error"}


def anthropic_error_body(error: APIError) -> dict[str, Any]:
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""
    kind = _ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def error_response(path: str, error: APIError) -> JSONResponse:
    """`error` in the shape of the API at `path`: Anthropic's on the Messages API's paths, OpenAI's elsewhere."""
    if path != ANTHROPIC_PATH and not path.startswith(f"{ANTHROPIC_PATH}/"):
        return error.response()
    retry_after = RETRY_AFTER_SECONDS.get(error.status)
    headers = {"Retry-After": str(retry_after)} if retry_after is not None else None
    return JSONResponse(anthropic_error_body(error), status_code=error.status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    async def on_api_error(request: Request, error: APIError) -> JSONResponse:
        return error_response(request.url.path, error)

    async def on_validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
        return error_response(request.url.path, _validation_error(list(error.errors())))

    async def on_http_error(request: Request, error: HTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(error.status_code).phrase
        except ValueError:
            phrase = "error"
        message = error.detail if isinstance(error.detail, str) and error.detail != phrase else phrase
        cause = error.__cause__
        if error.status_code == 400 and cause is not None:  # FastAPI's JSON parse failed on more than syntax
            reason = {RecursionError: "it nests too deeply", UnicodeDecodeError: "it is not valid UTF-8"}.get(
                type(cause), str(cause)[:200])  # ValueError: an integer past Python's 4,300-digit limit, ...
            return error_response(request.url.path, APIError(400, f"the body could not be parsed as JSON: {reason}",
                                                             code="json_invalid"))
        return error_response(request.url.path, APIError(error.status_code, message))

    app.add_exception_handler(APIError, on_api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, on_http_error)  # type: ignore[arg-type]
