"""Prometheus metrics of one serving engine, kept in their own CollectorRegistry (no module-global state).

Names follow vLLM's (`radixlm:` prefix instead of `vllm:`). The engine thread records them after every step
(`observe_outputs`, `observe_scheduler`); prometheus_client's metrics are thread-safe, so `/metrics` renders them
from the event loop with `render()`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Metric,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from radixlm.outputs import RequestOutput

if TYPE_CHECKING:
    from radixlm.structured.compile_cache import GrammarCacheStats

CONTENT_TYPE = CONTENT_TYPE_LATEST
RECENT_SAMPLES = 2400  # engine-loop samples kept for the dashboard (minutes at a few steps a second)
_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                    20.0, 40.0, 80.0)
_REQUEST_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                    240.0, 480.0)


@dataclass(frozen=True)
class SchedulerStats:
    """A snapshot of the scheduler taken by the engine thread between steps."""

    num_running: int
    num_waiting: int
    kv_cache_usage: float  # fraction of KV blocks held by live requests, 0..1
    prefix_cache_usage: float  # fraction held only by the prefix cache (evictable), 0..1
    num_preemptions: int  # cumulative
    kv_cache_capacity_tokens: int = 0  # tokens the KV cache holds (its blocks x block size)
    prefix_cache_hit_rate: float = 0.0  # cached / looked-up prompt tokens since start, 0..1
    num_evicted_blocks: int = 0  # cumulative
    num_used_blocks: int = 0  # KV blocks held by live requests: 0 when none is live, or blocks leaked
    num_tree_nodes: int = 0  # radix tree size
    num_tree_tokens: int = 0
    num_step_tokens: int = 0  # tokens computed by the last step, and its chunks and seconds
    num_step_chunks: int = 0
    step_seconds: float = 0.0
    num_steps: int = 0  # steps run so far (the dashboard shows each once)
    num_spec_drafts: int = 0  # speculative decoding, cumulative: drafts verified, their tokens, those accepted
    num_spec_draft_tokens: int = 0
    num_spec_accepted_tokens: int = 0
    num_spec_accepted_tokens_per_pos: tuple[int, ...] = ()


class EngineMetrics:
    """TTFT / ITL / e2e / queue-time histograms, queue and KV gauges, token and request counters."""

    def __init__(self, model_name: str, replica: int | None = None) -> None:
        """`replica` (data parallelism) adds a `replica` label to every metric and leaves the process metrics to
        the merged view (`merged_render`)."""
        self.registry = CollectorRegistry(auto_describe=True)
        if replica is None:
            ProcessCollector(registry=self.registry)  # process_resident_memory_bytes and friends, as vLLM exposes
        labels = ["model_name"] if replica is None else ["model_name", "replica"]
        values = [model_name] if replica is None else [model_name, str(replica)]
        kw = {"labelnames": labels, "registry": self.registry}

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, buckets=buckets, **kw).labels(*values)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, **kw).labels(*values)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, **kw).labels(*values)

        self.ttft = histogram("radixlm:time_to_first_token_seconds", "Time to first token.", _LATENCY_BUCKETS)
        self.inter_token_latency = histogram("radixlm:inter_token_latency_seconds",
                                             "Time between consecutive output steps of a request.", _LATENCY_BUCKETS)
        self.e2e_latency = histogram("radixlm:e2e_request_latency_seconds", "Arrival to finish.", _REQUEST_BUCKETS)
        self.queue_time = histogram("radixlm:request_queue_time_seconds", "Arrival to first scheduled.",
                                    _REQUEST_BUCKETS)
        self.num_running = gauge("radixlm:num_requests_running", "Requests in the running batch.")
        self.num_waiting = gauge("radixlm:num_requests_waiting", "Requests waiting to be scheduled.")
        self.kv_cache_usage = gauge("radixlm:kv_cache_usage_perc",
                                    "Fraction of KV cache blocks held by live requests (0..1).")
        self.kv_cache_used_blocks = gauge("radixlm:kv_cache_used_blocks",
                                          "KV cache blocks held by live requests (0 once none is live).")
        self.kv_cache_capacity = gauge("radixlm:kv_cache_capacity_tokens",
                                       "Tokens the KV cache holds: its blocks x block size (--kv-cache-dtype int8 "
                                       "holds about 1.9x bfloat16's).")
        self.prefix_cache_usage = gauge("radixlm:prefix_cache_usage_perc",
                                        "Fraction of KV cache blocks held only by the prefix cache (evictable).")
        self.prompt_tokens = counter("radixlm:prompt_tokens", "Prompt tokens of the requests that started.")
        self.generation_tokens = counter("radixlm:generation_tokens", "Generated tokens.")
        self.cached_tokens = counter("radixlm:prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache.")
        self.preemptions = counter("radixlm:num_preemptions", "Requests preempted (recompute).")
        self.prefix_cache_hit_rate = gauge("radixlm:prefix_cache_hit_rate",
                                           "Prompt tokens found in the prefix cache / prompt tokens looked up.")
        self.evicted_blocks = counter("radixlm:prefix_cache_evicted_blocks", "KV blocks evicted from the radix tree.")
        self.requests_finished = Counter("radixlm:request_finished", "Finished requests by reason "
                                         "(stop, length, abort, error).", labelnames=[*labels, "finished_reason"],
                                         registry=self.registry)
        self.spec_drafts = counter("radixlm:spec_decode_num_drafts", "Draft sequences verified.")
        self.spec_draft_tokens = counter("radixlm:spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_accepted_tokens = counter("radixlm:spec_decode_num_accepted_tokens", "Draft tokens accepted.")
        self.spec_accepted_per_pos = Counter("radixlm:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted, by position in the draft (0 = first).",
                                             labelnames=[*labels, "position"], registry=self.registry)
        self.lora_requests = Counter("radixlm:lora_requests", "Requests admitted per LoRA adapter (by the name "
                                     "clients use; a series leaves when its adapter is unloaded).",
                                     labelnames=[*labels, "lora_name"], registry=self.registry)
        self.loras_loaded = gauge("radixlm:lora_adapters_loaded", "LoRA adapters loaded (at most --max-loras).")
        self._lora_series: set[str] = set()  # the adapter names `lora_requests` has a series for
        self._spec_seen = SchedulerStats(0, 0, 0.0, 0.0, 0)
        self._label_names = labels
        self._label_values = values
        self.recent: deque[dict[str, float]] = deque(maxlen=RECENT_SAMPLES)  # for the dashboard
        self._num_generated = 0
        self._last_token_time: dict[str, float] = {}
        self._num_preemptions_seen = 0
        self._num_evicted_seen = 0

    def observe_outputs(self, outputs: Iterable[RequestOutput], now: float) -> None:
        """Record one step's outputs (engine thread). `now` is the step's time.monotonic()."""
        for output in outputs:
            num_new_tokens = sum(len(c.delta_token_ids) for c in output.outputs)
            last_time = self._last_token_time.get(output.request_id)
            if last_time is None:  # first output of this request: it was prefilled (or aborted while waiting)
                self.prompt_tokens.inc(len(output.prompt_token_ids))
                self.cached_tokens.inc(output.num_cached_tokens)
                if output.metrics.queue_time is not None:
                    self.queue_time.observe(output.metrics.queue_time)
                if output.metrics.ttft is not None:
                    self.ttft.observe(output.metrics.ttft)
            elif num_new_tokens:
                self.inter_token_latency.observe(now - last_time)
            self.generation_tokens.inc(num_new_tokens)
            self._num_generated += num_new_tokens
            if output.finished:
                self._last_token_time.pop(output.request_id, None)
                self.observe_finished(_finish_reason(output))
                if output.metrics.e2e is not None:
                    self.e2e_latency.observe(output.metrics.e2e)
            else:
                self._last_token_time[output.request_id] = now

    def observe_loras(self, admitted: str | None, num_requests: int, loaded: Iterable[str]) -> None:
        """Count `num_requests` admitted running adapter `admitted` (None: none); keep series of `loaded` only."""
        names = set(loaded)
        self.loras_loaded.set(len(names))
        if admitted is not None:
            self.lora_requests.labels(*self._label_values, admitted).inc(num_requests)
            self._lora_series.add(admitted)
        for gone in self._lora_series - names:
            self.lora_requests.remove(*self._label_values, gone)
        self._lora_series &= names

    def observe_finished(self, reason: str) -> None:
        self.requests_finished.labels(*self._label_values, reason).inc()

    def observe_scheduler(self, stats: SchedulerStats) -> None:
        self.recent.append({"time": time.time(), **asdict(stats), "num_generated": self._num_generated})
        self.num_running.set(stats.num_running)
        self.num_waiting.set(stats.num_waiting)
        self.kv_cache_usage.set(stats.kv_cache_usage)
        self.kv_cache_used_blocks.set(stats.num_used_blocks)
        self.kv_cache_capacity.set(stats.kv_cache_capacity_tokens)
        self.prefix_cache_usage.set(stats.prefix_cache_usage)
        if stats.num_preemptions > self._num_preemptions_seen:
            self.preemptions.inc(stats.num_preemptions - self._num_preemptions_seen)
        self._num_preemptions_seen = stats.num_preemptions
        self.prefix_cache_hit_rate.set(stats.prefix_cache_hit_rate)
        if stats.num_evicted_blocks > self._num_evicted_seen:
            self.evicted_blocks.inc(stats.num_evicted_blocks - self._num_evicted_seen)
        self._num_evicted_seen = stats.num_evicted_blocks
        self._observe_spec(stats)

    def _observe_spec(self, stats: SchedulerStats) -> None:
        seen = self._spec_seen
        self.spec_drafts.inc(stats.num_spec_drafts - seen.num_spec_drafts)
        self.spec_draft_tokens.inc(stats.num_spec_draft_tokens - seen.num_spec_draft_tokens)
        self.spec_accepted_tokens.inc(stats.num_spec_accepted_tokens - seen.num_spec_accepted_tokens)
        before = seen.num_spec_accepted_tokens_per_pos
        for position, count in enumerate(stats.num_spec_accepted_tokens_per_pos):
            delta = count - (before[position] if position < len(before) else 0)
            if delta or not before:
                self.spec_accepted_per_pos.labels(*self._label_values, str(position)).inc(delta)
        self._spec_seen = stats

    def watch(self, samples: Callable[[], list[ScrapeSample]]) -> None:
        """Expose what `samples()` reads each time `/metrics` is rendered (state the engine keeps elsewhere)."""
        read_on_scrape(self.registry, dict(zip(self._label_names, self._label_values, strict=True)), samples)

    def watch_grammar_cache(self, stats: Callable[[], GrammarCacheStats]) -> None:
        """Expose the grammar compile cache, read when `/metrics` is rendered (it changes off the step loop)."""
        def samples() -> list[ScrapeSample]:
            held = stats()
            return [ScrapeSample("gauge", "radixlm:grammar_cache_bytes",
                                 "Bytes of compiled grammars the compile cache holds.", held.num_bytes),
                    ScrapeSample("gauge", "radixlm:grammar_cache_budget_bytes",
                                 "The compile cache's budget (--grammar-cache-bytes).", held.budget_bytes),
                    ScrapeSample("gauge", "radixlm:grammar_cache_entries",
                                 "Grammars cached (compiled, failed or compiling).", held.num_entries),
                    ScrapeSample("counter", "radixlm:grammar_cache_evictions",
                                 "Compiled grammars evicted to fit the budget.", held.num_evictions)]

        self.watch(samples)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


@dataclass(frozen=True)
class ScrapeSample:
    kind: str  # "gauge" or "counter"
    name: str
    doc: str
    value: float


class _ReadOnScrape:
    """A collector whose samples are read when the registry is rendered (state kept elsewhere, e.g. a cache)."""

    def __init__(self, labels: dict[str, str], samples: Callable[[], list[ScrapeSample]]) -> None:
        self._labels = labels
        self._samples = samples

    def collect(self) -> Iterator[Metric]:
        for sample in self._samples():
            kind = GaugeMetricFamily if sample.kind == "gauge" else CounterMetricFamily
            family = kind(sample.name, sample.doc, labels=list(self._labels))
            family.add_metric(list(self._labels.values()), sample.value)
            yield family


def read_on_scrape(registry: CollectorRegistry, labels: dict[str, str],
                   samples: Callable[[], list[ScrapeSample]]) -> None:
    """Register metrics that `samples()` reads each time `/metrics` is rendered, with these labels."""
    registry.register(_ReadOnScrape(labels, samples))  # type: ignore[arg-type]


class _MergedFamilies:
    """A collector yielding each metric family of several registries once, with the samples of all of them."""

    def __init__(self, registries: list[CollectorRegistry]) -> None:
        self._registries = registries

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for registry in self._registries:
            for family in registry.collect():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    copy = Metric(family.name, family.documentation, family.type, family.unit)
                    copy.samples = list(family.samples)
                    merged[family.name] = copy
        yield from merged.values()


class MergedMetrics:
    """The metrics of several engine replicas (`EngineMetrics(model, replica=i)`) as one exposition: each family
    once, with every replica's samples (told apart by their `replica` label), and this process's metrics once.
    `recent` (the dashboard's samples) is replica 0's."""

    def __init__(self, replicas: list[EngineMetrics]) -> None:
        self.replicas = replicas
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(_MergedFamilies([m.registry for m in replicas]))  # type: ignore[arg-type]

    @property
    def recent(self) -> deque[dict[str, float]]:
        return self.replicas[0].recent

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _finish_reason(output: RequestOutput) -> str:
    """One reason per request: error or abort if any sequence ended so, else the reason of the last one to finish."""
    if output.error is not None:
        return "error"
    reasons = [c.finish_reason for c in output.outputs if c.finish_reason]
    return "abort" if "abort" in reasons else (reasons[-1] if reasons else "stop")
