"""Timers around the parts of an engine's step, for `radixlm bench step`.

Each linear layer's `forward` is wrapped on its instance, and forward hooks time the model's forward; the attention
function registered with transformers is wrapped under its own name (so whatever backend the engine selected is what
gets timed); the runner, the sampler and the scheduler calls are wrapped on their instances. Work on this CPU is
synchronous, so wall-clock timers are honest.

Why linears are wrapped rather than hooked: a module with hooks takes nn.Module's slow call path. Measured at batch 1
on the default int8 model, with the probe kinds alternated step by step in one engine, hooks on the 121 linears made
the step 0.5 ms longer and put about 0.2 ms of that hook dispatch inside the linears' timed windows (8% of their
bound); wrapped, the step grew 0.07 ms and the linears' windows hold their forward alone.
"""

from __future__ import annotations

import inspect
import math
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from radixlm.engine.llm_engine import LLMEngine
from radixlm.model.bf16_linear import Bf16Linear, DotPackedLinear
from radixlm.model.gguf_linear import GGUFLinear
from radixlm.model.prepacked_linear import PrepackedLinear
from radixlm.model.quantize import Int8Linear
from radixlm.model.widened_linear import WidenedLinear

LINEAR_TYPES = (nn.Linear, Int8Linear, GGUFLinear, PrepackedLinear, Bf16Linear, DotPackedLinear, WidenedLinear)
PARTS = ("step", "execute", "forward", "attention", "linears", "sampler", "scheduler")


def step_parts(ms: dict[str, float]) -> dict[str, float]:
    """The printed parts of a step from a probe's nested totals (ms): attention, linears, other (the forward's rest),
    prep (the runner outside the forward), sampler, scheduler, engine (the step's rest)."""
    attention, linears = ms.get("attention", 0.0), ms.get("linears", 0.0)
    return {"attention": attention, "linears": linears,
            "other": ms.get("forward", 0.0) - attention - linears,
            "prep": ms.get("execute", 0.0) - ms.get("forward", 0.0),
            "sampler": ms.get("sampler", 0.0), "scheduler": ms.get("scheduler", 0.0),
            "engine": ms.get("step", 0.0) - ms.get("execute", 0.0) - ms.get("sampler", 0.0) - ms.get("scheduler", 0.0)}


def linear_modules(model: nn.Module) -> list[nn.Module]:
    return [module for module in model.modules() if isinstance(module, LINEAR_TYPES)]


def weight_tensors(model: nn.Module) -> list[torch.Tensor]:
    """The weight tensors the linear layers read at small batch. An `Int8Linear` without the small-batch kernel reads
    fbgemm's packed copy and a `PrepackedLinear` oneDNN's, neither of which a reduction can read: their bytes are left
    out here (the bandwidth is measured over the other weights) and counted in `weight_bytes`."""
    tensors = []
    for module in linear_modules(model):
        if isinstance(module, Int8Linear):
            if module._small_batch is not None:
                tensors.append(module._small_batch.weight)
        elif isinstance(module, GGUFLinear):
            tensors.extend(part.tiles if part.tiles is not None else part.rows for part in module.parts)
        elif isinstance(module, DotPackedLinear):
            tensors.append(module.packed)
        elif not isinstance(module, PrepackedLinear):
            tensors.append(module.weight)
    return tensors


def read_seconds(tensors: list[torch.Tensor], repeats: int = 5) -> float:
    """Best time of one streaming read over all of `tensors`: a max-reduction over their bytes (as int32, or as bytes
    when their size is not a multiple of 4), by the faster of two readers each repeat. Timing the very bytes a part
    of the step reads makes a fair bound on this machine, where the read bandwidth of two buffers measured seconds
    apart differed 2-3x. The readers: a loop of `amax` (the fastest on large tensors: 72 GB/s over 50 MB caches where
    `max` read at 61), and one `torch._foreach_max` call per view dtype, which keeps per-call overhead out of the read
    of many small tensors (the loop took 2.9-3.3 ms over the 121 int8 weights of the default model, against 2.5-2.7
    for one read of a contiguous copy)."""
    groups: dict[torch.dtype, list[torch.Tensor]] = {}
    for flat in (t.detach().reshape(-1) for t in tensors):
        view = flat.view(torch.int32) if flat.numel() * flat.element_size() % 4 == 0 else flat.view(torch.uint8)
        groups.setdefault(view.dtype, []).append(view)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        for views in groups.values():
            for view in views:
                view.amax()
        middle = time.perf_counter()
        for views in groups.values():
            torch._foreach_max(views)
        best = min(best, middle - start, time.perf_counter() - middle)
    return best


def weight_bytes(model: nn.Module) -> int:
    """Bytes of weights the linear layers read per forward (int8 values and scales for `Int8Linear`, the blocks
    for `GGUFLinear`)."""
    total = 0
    for module in linear_modules(model):
        if isinstance(module, (Int8Linear, GGUFLinear, PrepackedLinear, DotPackedLinear)):
            total += module.weight_bytes
        else:
            total += module.weight.numel() * module.weight.element_size()
    return total


class StepProbe:
    """Install with `StepProbe(engine)`, run `probe.step()`, read `probe.totals` (seconds per part), `close()`."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        self.totals: dict[str, float] = defaultdict(float)
        self._handles: list[Any] = []
        self._restore: list[Callable[[], None]] = []
        model = engine.runner.model
        # The parts are timed around the Python layers: a probed step runs them, not the decode stack's one call
        # (radixlm.model.decode_stack), which the plain step (`bench step`, no probe) runs where serving does.
        stack = engine.runner.decode_stack
        engine.runner.decode_stack = None
        self._restore.append(lambda: setattr(engine.runner, "decode_stack", stack))
        for module in linear_modules(model):
            self._wrap_attribute(module, "forward", "linears")
            for entry in ("forward_add", "forward_gated"):  # a projection with its neighbour's work in its writes
                if hasattr(module, entry):
                    self._wrap_attribute(module, entry, "linears")
        self._time_module(model, "forward")
        self._wrap_attention(model.config._attn_implementation)
        self._wrap_attribute(engine.runner, "execute", "execute")
        self._wrap_attribute(engine.worker, "sampler", "sampler")
        self._wrap_attribute(engine.scheduler, "schedule", "scheduler")
        self._wrap_attribute(engine.scheduler, "update_from_output", "scheduler")

    def step(self) -> None:
        start = time.perf_counter()
        self.engine.step()
        self.totals["step"] += time.perf_counter() - start

    def reset(self) -> None:
        self.totals.clear()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        for restore in reversed(self._restore):
            restore()
        self._handles, self._restore = [], []

    def _timed(self, fn: Callable[..., Any], part: str) -> Callable[..., Any]:
        totals = self.totals

        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[part] += time.perf_counter() - start

        return timed

    def _time_module(self, module: nn.Module, part: str) -> None:
        starts: list[float] = []
        totals = self.totals

        def before(*_: Any) -> None:
            starts.append(time.perf_counter())

        def after(*_: Any) -> None:
            totals[part] += time.perf_counter() - starts.pop()

        self._handles += [module.register_forward_pre_hook(before), module.register_forward_hook(after)]

    def _wrap_attention(self, name: str) -> None:
        original = ALL_ATTENTION_FUNCTIONS[name]
        AttentionInterface.register(name, self._timed(original, "attention"))
        self._restore.append(lambda: AttentionInterface.register(name, original))

    def _wrap_attribute(self, owner: object, attribute: str, part: str) -> None:
        had_own = attribute in vars(owner)
        original = getattr(owner, attribute)
        timed = self._timed(original, part)
        # An object that is called (the sampler) keeps its other attributes: the worker asks the sampler more than
        # its call, and a plain function in its place made each step sample row by row.
        setattr(owner, attribute, timed if inspect.isroutine(original) else _TimedObject(original, timed))

        def restore() -> None:
            if had_own:
                setattr(owner, attribute, original)
            else:
                delattr(owner, attribute)

        self._restore.append(restore)


class _TimedObject:
    """A called object's stand-in: its call is timed, and every other attribute is the object's own."""

    def __init__(self, wrapped: object, timed_call: Callable[..., Any]) -> None:
        self._wrapped = wrapped
        self._timed_call = timed_call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._timed_call(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapped, name)
