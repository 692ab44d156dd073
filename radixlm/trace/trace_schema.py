"""The fields of each event kind of a step trace (what `recorder.py` writes), checked one event at a time.

Required fields are those replay, what-if and the timelines read; the recorder's other fields are optional (older
traces may lack them) but checked when present. Sampling parameters go through `SamplingParams.from_dict`, then
through the trace's own cap on sequences per request, before anything is built from them. Every problem raises
FieldError naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from radixlm.config import MAX_SPECULATIVE_TOKENS, SchedulerConfig
from radixlm.engine.trace_recorder import TRACE_VERSION
from radixlm.errors import ParamError
from radixlm.lora_request import MAX_LORA_NAME_CHARS
from radixlm.request import RequestStatus
from radixlm.sampling_params import SamplingParams
from radixlm.trace.trace_fields import (
    MAX_BATCHED_TOKENS,
    MAX_BLOCK_SIZE,
    MAX_COUNT,
    MAX_LINE_CHARS,
    MAX_MODEL_LEN,
    MAX_NUM_BLOCKS,
    MAX_NUM_SEQS,
    MAX_SECONDS,
    MAX_SEQUENCES_PER_REQUEST,
    MAX_TOKEN_ID,
    FieldError,
    array,
    flag,
    identifier,
    integer,
    mapping,
    number,
    optional_number,
    optional_text,
    record,
    required,
    shown,
    text,
    token_ids,
)

EVENT_KINDS = ("config", "arrival", "queued", "abort", "step", "finish")
FINISHED_STATUSES = tuple(status.name for status in RequestStatus if status.is_finished)
STEP_SECONDS_FIELDS = ("schedule_s", "forward_s", "sample_s", "outputs_s")
# Integer scheduler settings: (lowest, highest, may be null).
_SCHEDULER_INTS = {"max_num_seqs": (1, MAX_NUM_SEQS, False), "max_num_batched_tokens": (1, MAX_BATCHED_TOKENS, False),
                   "lpm_fallback_queue_len": (0, MAX_COUNT, False), "max_queued_requests": (0, MAX_COUNT, True),
                   "max_sequences_per_request": (1, MAX_SEQUENCES_PER_REQUEST, False),
                   "max_prompts_per_request": (1, MAX_COUNT, False)}


@dataclass(frozen=True)
class TraceLimits:
    """What a trace's config allows its requests: the context a replay gives them (max_model_len, capped by the
    KV pool as the engine caps it) and the most sequences one request may have."""

    max_model_len: int
    max_sequences_per_request: int


def check_config(event: dict[str, Any]) -> TraceLimits:
    """The first line: what a replay builds its scheduler and KV manager from."""
    version = required(event, "version")
    if version != TRACE_VERSION or type(version) is not int:
        raise FieldError("version", f"must be {TRACE_VERSION} (the trace format this radixlm reads), got "
                                    f"{shown(version)}")
    if "model" in event:
        text(event["model"], "model")
    scheduler = check_scheduler(required(event, "scheduler"))
    num_blocks = integer(required(event, "num_blocks"), "num_blocks", 1, MAX_NUM_BLOCKS)
    block_size = integer(required(event, "block_size"), "block_size", 1, MAX_BLOCK_SIZE)
    if block_size & (block_size - 1):
        raise FieldError("block_size", f"must be a power of two, got {block_size}")
    flag(required(event, "enable_prefix_caching"), "enable_prefix_caching")
    if "num_host_blocks" in event:
        integer(event["num_host_blocks"], "num_host_blocks", 0, MAX_NUM_BLOCKS)
    max_model_len = integer(required(event, "max_model_len"), "max_model_len", 2, MAX_MODEL_LEN)
    token_ids(required(event, "eos_token_ids"), "eos_token_ids", 0, 4096)
    return TraceLimits(min(max_model_len, num_blocks * block_size),
                       min(scheduler.max_sequences_per_request, scheduler.max_num_seqs))


def check_scheduler(value: object) -> SchedulerConfig:
    """config.scheduler: SchedulerConfig's fields (but `trace`), typed, then validated by SchedulerConfig itself."""
    options = mapping(value, "scheduler")
    names = {spec.name for spec in fields(SchedulerConfig)} - {"trace"}
    for key, option in options.items():
        name = f"scheduler.{key}"
        if key not in names:
            raise FieldError(name, f"is not a scheduler setting (expected some of {', '.join(sorted(names))})")
        if key in _SCHEDULER_INTS:
            low, high, nullable = _SCHEDULER_INTS[key]
            if option is not None or not nullable:
                integer(option, name, low, high)
        elif key == "schedule_policy":
            text(option, name, 64)
        elif option is not None and not isinstance(option, dict):
            text(option, name)  # speculative_config: JSON text or an object, parsed by SchedulerConfig
    try:
        return SchedulerConfig(**options)
    except (TypeError, ValueError) as error:
        raise FieldError("scheduler", f"is not a valid scheduler config: {error}") from None


def check_arrival(event: dict[str, Any], limits: TraceLimits) -> SamplingParams:
    """A request's arrival; returns its sampling parameters (validated, their sequence count within the limit)."""
    _check_moment(event)
    identifier(required(event, "request_id"), "request_id")
    params = check_params(required(event, "params"), limits)
    room = limits.max_model_len - max(1, params.min_tokens)  # the scheduler refuses a prompt that leaves no room
    prompt = token_ids(required(event, "prompt_token_ids"), "prompt_token_ids", 1, MAX_MODEL_LEN)
    if len(prompt) > room:
        raise FieldError("prompt_token_ids", f"holds {len(prompt)} tokens, but the context is {limits.max_model_len} "
                                             f"(max_model_len, capped by the KV pool): no room for min_tokens "
                                             f"({params.min_tokens}) or one generated token")
    if integer(required(event, "prompt_len"), "prompt_len", 1, MAX_MODEL_LEN) != len(prompt):
        raise FieldError("prompt_len", f"is {event['prompt_len']}, but prompt_token_ids holds {len(prompt)} tokens")
    integer(required(event, "priority"), "priority", -MAX_COUNT, MAX_COUNT)
    flag(required(event, "queued"), "queued")
    if "prompt_hash" in event:
        text(event["prompt_hash"], "prompt_hash", 64)
    if "lora_id" in event or "lora_name" in event:  # a LoRA adapter's request
        integer(required(event, "lora_id"), "lora_id", 1, MAX_COUNT)
        text(required(event, "lora_name"), "lora_name", MAX_LORA_NAME_CHARS)
    _check_metadata(event)
    return params


def check_params(value: object, limits: TraceLimits) -> SamplingParams:
    """params: `SamplingParams.to_dict()` as recorded, rebuilt (and so validated) by `from_dict`; n and best_of
    must stay within the trace's max_sequences_per_request (and max_num_seqs) as the engine's admission requires."""
    values = mapping(value, "params")
    try:
        params = SamplingParams.from_dict(values)
    except ParamError as error:
        raise FieldError(f"params.{error.field}", error.message) from None
    except (TypeError, ValueError) as error:
        raise FieldError("params", f"are not valid sampling parameters: {error}") from None
    if params.num_sequences > limits.max_sequences_per_request:
        name = "params.best_of" if params.best_of is not None else "params.n"
        raise FieldError(name, f"must be at most {limits.max_sequences_per_request} (the trace's "
                               f"max_sequences_per_request and max_num_seqs), got {params.num_sequences}")
    return params


def check_request_event(event: dict[str, Any]) -> None:
    """`queued` and `abort`: a request entering the scheduler late, or aborted, before step `step`."""
    _check_moment(event)
    identifier(required(event, "request_id"), "request_id")


def check_step(event: dict[str, Any]) -> None:
    """One engine step: what it scheduled, sampled, forked, preempted and ended, and how long its parts took."""
    _check_moment(event)
    for name in STEP_SECONDS_FIELDS:
        number(required(event, name), name, 0.0, MAX_SECONDS)
    for index, chunk in enumerate(array(required(event, "chunks"), "chunks")):
        seq_id, start, num_tokens = record(chunk, f"chunks[{index}]", 3)
        identifier(seq_id, f"chunks[{index}][0]")
        integer(start, f"chunks[{index}][1]", 0, MAX_MODEL_LEN)
        integer(num_tokens, f"chunks[{index}][2]", 1, MAX_BATCHED_TOKENS + MAX_SPECULATIVE_TOKENS)
    preempted = [identifier(seq_id, f"preempted[{index}]")
                 for index, seq_id in enumerate(array(required(event, "preempted"), "preempted"))]
    if "preemption_reasons" in event:
        reasons = array(event["preemption_reasons"], "preemption_reasons")
        if len(reasons) != len(preempted):
            raise FieldError("preemption_reasons", f"must hold one reason per preempted sequence ({len(preempted)}),"
                                                   f" got {len(reasons)}")
        for index, reason in enumerate(reasons):
            text(reason, f"preemption_reasons[{index}]")
    _check_step_pairs(event)
    for seq_id, hit in mapping(required(event, "cache_hits"), "cache_hits").items():
        identifier(seq_id, "cache_hits key")
        integer(hit, f"cache_hits[{shown(seq_id)}]", 0, MAX_MODEL_LEN)
    for seq_id, drafts in mapping(event.get("drafts", {}), "drafts").items():
        identifier(seq_id, "drafts key")
        token_ids(drafts, f"drafts[{shown(seq_id)}]", 1, MAX_SPECULATIVE_TOKENS)
    if "forward_failed" in event:
        flag(event["forward_failed"], "forward_failed")
    for name in ("kv_used_blocks", "num_running", "num_waiting"):
        integer(required(event, name), name, 0, MAX_COUNT)
    for name in ("evicted_blocks", "offloaded_blocks", "loaded_blocks", "disk_written_blocks", "disk_read_blocks"):
        if name in event:
            integer(event[name], name, 0, MAX_COUNT)


def _check_step_pairs(event: dict[str, Any]) -> None:
    """forks [parent, child, context length], sampled [sequence, token], ended [sequence, finished status]."""
    for index, fork in enumerate(array(required(event, "forks"), "forks")):
        parent, child, context_len = record(fork, f"forks[{index}]", 3)
        identifier(parent, f"forks[{index}][0]")
        identifier(child, f"forks[{index}][1]")
        integer(context_len, f"forks[{index}][2]", 0, MAX_MODEL_LEN)
    for index, sampled in enumerate(array(required(event, "sampled"), "sampled")):
        seq_id, token = record(sampled, f"sampled[{index}]", 2)
        identifier(seq_id, f"sampled[{index}][0]")
        integer(token, f"sampled[{index}][1]", 0, MAX_TOKEN_ID)
    for index, ended in enumerate(array(required(event, "ended"), "ended")):
        seq_id, status = record(ended, f"ended[{index}]", 2)
        identifier(seq_id, f"ended[{index}][0]")
        if status not in FINISHED_STATUSES:
            raise FieldError(f"ended[{index}][1]", f"must be one of {', '.join(FINISHED_STATUSES)}, got "
                                                   f"{shown(status)}")


def check_finish(event: dict[str, Any]) -> None:
    """A user request's end: its finish reasons, error, output token count, TTFT and e2e."""
    number(required(event, "time"), "time", -MAX_SECONDS, MAX_SECONDS)
    identifier(required(event, "request_id"), "request_id")
    reasons = array(required(event, "reasons"), "reasons")
    if len(reasons) > MAX_SEQUENCES_PER_REQUEST:
        raise FieldError("reasons", f"must hold at most {MAX_SEQUENCES_PER_REQUEST} reasons, got {len(reasons)}")
    for index, reason in enumerate(reasons):
        optional_text(reason, f"reasons[{index}]")
    optional_text(required(event, "error"), "error", MAX_LINE_CHARS)  # an exception's text: any length
    integer(required(event, "output_tokens"), "output_tokens", 0, MAX_COUNT)
    for name in ("ttft", "e2e"):
        optional_number(required(event, name), name, -MAX_SECONDS, MAX_SECONDS)
    if "first_token" in event:
        optional_number(event["first_token"], "first_token", -MAX_SECONDS, MAX_SECONDS)
    _check_metadata(event)


def _check_moment(event: dict[str, Any]) -> None:
    """`time` (seconds from the start of the trace) and `step` (the index of the step it precedes or is)."""
    number(required(event, "time"), "time", -MAX_SECONDS, MAX_SECONDS)
    integer(required(event, "step"), "step", 0, MAX_COUNT)


def _check_metadata(event: dict[str, Any]) -> None:
    if event.get("metadata") is not None:
        mapping(event["metadata"], "metadata")


def event_kind(event: dict[str, Any]) -> str:
    kind = required(event, "event")
    if kind not in EVENT_KINDS:
        raise FieldError("event", f"must be one of {', '.join(EVENT_KINDS)}, got {shown(kind)}")
    return kind  # type: ignore[no-any-return]

