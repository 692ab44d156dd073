"""`radixlm bench step`: where a decode step's time goes, next to the memory bounds of its two big parts.

For each context length and prefix mode, `max(batch_sizes)` requests are brought to decode; each batch size is then
measured (largest first, aborting requests down to it) over a few decode steps. Columns, in ms per step:
attention (the registered attention function, whatever backend), linears (every linear layer), other (the rest of
the model forward: norms, rotary, activations, copies, Python), prep (the runner outside the forward: input batch,
logits), sampler, scheduler (schedule + update), engine (the rest of `engine.step`: detokenizing, outputs).

Bounds: attention's is the K/V bytes the decode rows read (every request's whole context, shared blocks counted
per request) over the read bandwidth of the KV cache itself; the linears' is their weight bytes over the read
bandwidth of those weights. Both bandwidths are measured by streaming reductions over those very tensors with the
engine's threads, one after each timed step, and every figure is a median over the steps: this machine's memory
speed drifts (reads of the same cache a minute apart differed 1.6x), and a yardstick taken at another moment, or a
best-of read against mean step times, would move the ratios by that much. (A fresh buffer's bandwidth, which varied
2-3x from one allocation to the next, is printed once for reference.)

Contexts are prefilled through the first decoder layer only, and its K/V are copied into the other layers: a decode
step's cost depends on shapes, not on the values, and this makes the full grid's prefill about 30x cheaper.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass

import torch

from radixlm.bench.step_probe import StepProbe, read_seconds, step_parts, weight_bytes, weight_tensors
from radixlm.config import SchedulerConfig
from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.model.decode_stack import STACK_PARTS
from radixlm.model.kv_cache import kv_bytes_per_token
from radixlm.sampling_params import SamplingParams

QUESTION_LEN = 32  # with a shared prefix, each request's own tokens after it
WARMUP_STEPS = 2


@dataclass(frozen=True)
class StepGrid:
    batch_sizes: tuple[int, ...] = (1, 8, 32, 64)
    context_lens: tuple[int, ...] = (256, 1024)
    shared_prefix: tuple[bool, ...] = (False, True)
    num_steps: int = 5

    def __post_init__(self) -> None:
        if self.batch_sizes and min(self.batch_sizes) < 1:  # none: no decode rows
            raise ValueError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if not self.context_lens or min(self.context_lens) <= QUESTION_LEN:
            raise ValueError(f"context lengths must be > {QUESTION_LEN}, got {self.context_lens}")
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")


QUICK_GRID = StepGrid(batch_sizes=(1, 8), context_lens=(256,), num_steps=3)


@dataclass(frozen=True)
class StepRow:
    batch_size: int
    context_len: int
    shared_prefix: bool
    ms: dict[str, float]  # per decode step
    attention_bound_ms: float
    linears_bound_ms: float


def read_bandwidth(num_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Bytes per second that a float32 reduction reads from memory (best of `repeats`; far larger than caches)."""
    data = torch.ones(num_bytes // 4)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return num_bytes / best


STACK_PREFIX = "stack:"  # StepRow.ms keys of the decode stack's parts in the plain step


def bench_step(engine_options: dict, grid: StepGrid, seed: int = 0) -> list[StepRow]:
    if engine_options.get("num_threads"):
        torch.set_num_threads(int(engine_options["num_threads"]))  # the engine sets it too: measure alike
    bandwidth = read_bandwidth()
    print(f"read bandwidth of a fresh buffer {bandwidth / 1e9:.1f} GB/s (reference only), torch threads "
          f"{torch.get_num_threads()}")
    rows = []
    for context_len in grid.context_lens:
        for shared in grid.shared_prefix:
            rows += _bench_setting(engine_options, grid, context_len, shared, seed)
            print_rows(rows[-len(grid.batch_sizes):])
            print_stack_rows(rows[-len(grid.batch_sizes):])
    print("\nall settings:")
    print_rows(rows)
    print_stack_rows(rows)
    return rows


def _bench_setting(engine_options: dict, grid: StepGrid, context_len: int, shared: bool,
                   seed: int) -> list[StepRow]:
    max_batch = max(grid.batch_sizes)
    options = {"max_num_seqs": max_batch, "enable_prefix_caching": shared, **engine_options}
    if "num_kv_blocks" not in engine_options and "kv_cache_memory" not in engine_options:
        block_size = int(options.get("block_size", 16))  # type: ignore[call-overload]
        budget = int(options.get("max_num_batched_tokens", SchedulerConfig.max_num_batched_tokens))
        tokens = (context_len + _prefill_decode_steps(budget, max_batch, context_len) + WARMUP_STEPS
                  + grid.num_steps * len(grid.batch_sizes) + 2)
        options["num_kv_blocks"] = max_batch * math.ceil(tokens / block_size) + 4
    engine = build_engine(**options)
    _prefill(engine, max_batch, context_len, shared, seed)
    rows = []
    for batch_size in sorted(grid.batch_sizes, reverse=True):
        _abort_down_to(engine, batch_size)
        for _ in range(WARMUP_STEPS):
            engine.step()
        kv_bytes = _kv_bytes_per_step(engine)
        plain_steps, steps, bandwidths = [], [], []
        # Alternated, as the machine's speed drifts. The plain step follows a step, as in serving: right after a
        # bandwidth read (which leaves the caches full of the weights' or the KV cache's last bytes) a 1B file's
        # batch-1 step took 2 ms longer.
        for _ in range(grid.num_steps):
            probe = StepProbe(engine)
            try:
                probe.step()
            finally:
                probe.close()
            steps.append(dict(probe.totals))
            plain_steps.append(_plain_step(engine))
            bandwidths.append(_part_bandwidths(engine))
        ms = {part: 1e3 * statistics.median(step.get(part, 0.0) for step in steps) for part in steps[0]}
        ms["plain"] = 1e3 * statistics.median(seconds for seconds, _ in plain_steps)
        for part in plain_steps[0][1]:
            ms[STACK_PREFIX + part] = 1e3 * statistics.median(parts.get(part, 0.0) for _, parts in plain_steps)
        linears_bandwidth = statistics.median(b[0] for b in bandwidths)
        kv_bandwidth = statistics.median(b[1] for b in bandwidths)
        print(f"batch {batch_size}: read bandwidth of the linear weights {linears_bandwidth / 1e9:.1f} GB/s, of "
              f"the KV cache {kv_bandwidth / 1e9:.1f} GB/s (medians, one read after each timed step)")
        rows.append(StepRow(batch_size, context_len, shared, ms, 1e3 * kv_bytes / kv_bandwidth,
                            1e3 * weight_bytes(engine.runner.model) / linears_bandwidth))
    return sorted(rows, key=lambda r: r.batch_size)


def _plain_step(engine: LLMEngine) -> tuple[float, dict[str, float]]:
    """One engine step's wall time with no probe installed: the step as served, without the cost of the probe's own
    wrappers and timers (milliseconds of a batch-1 step, where the issue's bound is checked); and, where the decode
    stack ran it, the seconds of each part of its layers (`DecodeStack.time_parts`: a few clock reads a layer)."""
    stack = engine.runner.decode_stack
    if stack is not None:
        stack.time_parts(True)
    try:
        start = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - start
        parts = stack.part_seconds.tolist() if stack is not None and stack.part_seconds is not None else []
    finally:
        if stack is not None:
            stack.time_parts(False)
    return seconds, dict(zip(STACK_PARTS, parts, strict=True)) if any(parts) else {}


def _prefill_decode_steps(budget: int, num_requests: int, context_len: int) -> int:
    """Tokens a request may decode while the others are still prefilling (one per step of the prefill), which its
    blocks must hold: without them the cache runs short, requests are preempted and recomputed, and the prefill
    never settles (at 64 x 1,024 tokens it ran for minutes and left one request with an 8,000-token context)."""
    return math.ceil(num_requests * context_len / budget) + 1


def _part_bandwidths(engine: LLMEngine) -> tuple[float, float]:
    """Bytes per second of one streaming read over the linear layers' weights, and of one over the KV cache."""
    cache = engine.runner.kv_cache
    caches = [*cache.key_caches, *cache.value_caches, *cache.key_scales, *cache.value_scales]
    return tensors_bandwidth(weight_tensors(engine.runner.model)), tensors_bandwidth(caches)


def tensors_bandwidth(tensors: list[torch.Tensor]) -> float:
    """Bytes per second of one streaming read over `tensors`; with no bytes to read (every linear reads a packed copy
    a reduction cannot: fbgemm's int8 weights on a CPU without the int8 kernel), a fresh buffer's."""
    num_bytes = sum(t.numel() * t.element_size() for t in tensors)
    return num_bytes / read_seconds(tensors, repeats=1) if num_bytes > 0 else read_bandwidth(repeats=1)


def _prefill(engine: LLMEngine, num_requests: int, context_len: int, shared: bool, seed: int) -> None:
    """Bring `num_requests` requests of `context_len` tokens to decode, computing K/V through layer 0 only."""
    generator = torch.Generator().manual_seed(seed)
    vocab = engine.runner.shape.vocab_size
    low, high = min(100, vocab // 4), max(vocab - 100, vocab // 2)
    prefix = torch.randint(low, high, (context_len - QUESTION_LEN,), generator=generator).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1_000_000, ignore_eos=True)
    for index in range(num_requests):
        own_len = QUESTION_LEN if shared else context_len
        own = torch.randint(low, high, (own_len,), generator=generator).tolist()
        engine.add_request(f"step-{index}", (prefix + own) if shared else own, params)
    decoder = engine.runner.model.get_decoder()
    layers = decoder.layers
    decoder.layers = layers[:1]
    try:
        while any(r.num_uncomputed_tokens != 1 or not r.num_output_tokens
                  for r in engine.scheduler.requests.values()):
            engine.step()
    finally:
        decoder.layers = layers
    budget = engine.config.scheduler.max_num_batched_tokens
    longest = context_len + _prefill_decode_steps(budget, num_requests, context_len)
    lens = [r.num_computed_tokens for r in engine.scheduler.requests.values()]
    if len(lens) != num_requests or not all(context_len <= n <= longest for n in lens):
        raise RuntimeError(f"prefill did not settle: {len(lens)} requests with contexts {min(lens)}-{max(lens)}, "
                           f"expected {num_requests} of {context_len}-{longest}")
    cache = engine.runner.kv_cache
    for caches in (cache.key_caches, cache.value_caches, cache.key_scales, cache.value_scales):
        for layer_cache in caches[1:]:
            layer_cache.copy_(caches[0])


def _abort_down_to(engine: LLMEngine, batch_size: int) -> None:
    live = sorted(engine.scheduler.requests, key=lambda rid: int(rid.rpartition("-")[2]))
    for request_id in live[batch_size:]:
        engine.abort_request(request_id)


def _kv_bytes_per_step(engine: LLMEngine) -> int:
    shape = engine.runner.shape
    dtype = engine.runner.kv_cache.dtype
    per_token = kv_bytes_per_token(shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype)
    return per_token * sum(r.num_computed_tokens + 1 for r in engine.scheduler.requests.values())


def print_rows(rows: list[StepRow]) -> None:
    """Milliseconds per decode step: the plain step (no probe) against the sum of the two bounds (every weight and
    every K/V byte the step reads, each over its own measured bandwidth), then the probed step by part, attention and
    linears with their bounds and their ratio to them."""
    print("| batch | context | prefix | plain step ms (bound, ratio) | step ms | attention (bound, ratio) "
          "| linears (bound, ratio) | other | prep | sampler | scheduler | engine |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        part = step_parts(row.ms)
        bound_ms = row.attention_bound_ms + row.linears_bound_ms
        plain_ms = row.ms.get("plain", 0.0)
        print(f"| {row.batch_size} | {row.context_len} | {'shared' if row.shared_prefix else 'none'} "
              f"| {plain_ms:.1f} ({bound_ms:.1f}, {_ratio(plain_ms, bound_ms)}) "
              f"| {row.ms.get('step', 0.0):.1f} | {part['attention']:.1f} ({row.attention_bound_ms:.1f}, "
              f"{_ratio(part['attention'], row.attention_bound_ms)}) | {part['linears']:.1f} "
              f"({row.linears_bound_ms:.1f}, {_ratio(part['linears'], row.linears_bound_ms)}) | {part['other']:.1f} "
              f"| {part['prep']:.1f} | {part['sampler']:.1f} | {part['scheduler']:.1f} | {part['engine']:.1f} |")


def print_stack_rows(rows: list[StepRow]) -> None:
    """The plain step's decoder layers as the decode stack ran them (C++, so the probe above saw the Python layers
    instead), ms a step: the layers in all, their attention against its bound, their linears, and the step's time
    outside the layers (embedding, final norm, LM head, sampler, engine)."""
    rows = [row for row in rows if STACK_PREFIX + "attention" in row.ms]
    if not rows:
        return
    print("\nthe plain step's decoder layers in the decode stack (ms a step):\n"
          "| batch | context | prefix | layers | attention (bound, ratio) | linears | q/k/v | o_proj | gate_up | down "
          "| norms, rotary, activation | outside the layers |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        part = {name: row.ms[STACK_PREFIX + name] for name in STACK_PARTS}
        layers = sum(part.values())
        linears = part["qkv"] + part["o_proj"] + part["gate_up"] + part["down"]
        print(f"| {row.batch_size} | {row.context_len} | {'shared' if row.shared_prefix else 'none'} | {layers:.1f} "
              f"| {part['attention']:.1f} ({row.attention_bound_ms:.1f}, "
              f"{_ratio(part['attention'], row.attention_bound_ms)}) | {linears:.1f} | {part['qkv']:.1f} "
              f"| {part['o_proj']:.1f} | {part['gate_up']:.1f} | {part['down']:.1f} "
              f"| {part['norms'] + part['rotary'] + part['activation']:.1f} | {row.ms['plain'] - layers:.1f} |")


def _ratio(ms: float, bound_ms: float) -> str:
    return f"{ms / bound_ms:.2f}x" if bound_ms > 0 else "-"
