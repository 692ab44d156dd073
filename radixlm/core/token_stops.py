"""Where a request's tokens must end: token-level stops after each new token, and how many draft tokens a step may
verify without passing them."""

from __future__ import annotations

from radixlm.request import Request, RequestStatus


def check_token_stop(request: Request, max_model_len: int) -> tuple[RequestStatus, int | None] | None:
    """The token-level stop that the last appended token triggers: the context limit (always), then, once
    min_tokens are out, eos, a stop token id or max_tokens."""
    if request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH, None
    params = request.sampling_params
    if request.num_output_tokens < params.min_tokens:
        return None
    token_id = request.last_token_id
    if not params.ignore_eos and token_id in request.eos_token_ids:
        return RequestStatus.FINISHED_STOPPED, None
    if token_id in params.stop_token_ids:
        return RequestStatus.FINISHED_STOPPED, token_id
    if params.max_tokens is not None and request.num_output_tokens >= params.max_tokens:
        return RequestStatus.FINISHED_LENGTH, None
    return None


def drafts_within_limits(request: Request, max_model_len: int) -> list[int]:
    """The request's draft tokens that may be verified now: only at its last token, and no more than can be
    kept (the context and max_tokens leave room for the drafts and one token after them)."""
    if not request.draft_token_ids or request.num_uncomputed_tokens != 1:
        return []
    room = max_model_len - request.num_tokens
    max_tokens = request.sampling_params.max_tokens
    if max_tokens is not None:
        room = min(room, max_tokens - request.num_output_tokens - 1)
    return request.draft_token_ids[:max(0, room)]
