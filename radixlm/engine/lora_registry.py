"""LoRARegistry: the adapters an engine serves, by name and id, checked before the worker loads them.

An adapter is checked from its files against the base model's projections (`radixlm.model.lora.adapter_file`,
from the shapes the worker reported) before the worker loads its weights, so a bad adapter is one ValueError naming
the file and the field, and the requests running meanwhile never see it. At most `--max-loras` are loaded.
An adapter is unloaded only when no live request runs it; its prefixes leave the radix tree with it.

Ids: `load(name, path)` (the server, `--lora-modules`) gives each load a fresh id; an offline `LoRARequest`
brings its own (vLLM's `lora_int_id`) and is loaded on first use.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable

from radixlm.errors import ParamError
from radixlm.lora_config import LoRAConfig
from radixlm.lora_request import LoRARequest
from radixlm.model.lora.adapter_file import AdapterError, AdapterFile, read_adapter
from radixlm.worker.process import WorkerDiedError, WorkerProcess
from radixlm.worker.worker import ModelWorker


class LoRARegistry:
    """See the module docstring. `live_lora_ids()` gives the adapter ids of the engine's live requests; `forget`
    drops an adapter id's cached prefixes."""

    def __init__(self, config: LoRAConfig, worker: ModelWorker | WorkerProcess,
                 target_shapes: dict[str, tuple[int, int]] | None, live_lora_ids: Callable[[], Iterable[int]],
                 forget: Callable[[int], object]) -> None:
        self.config = config
        self.worker = worker
        self.target_shapes = target_shapes
        self._live_lora_ids = live_lora_ids
        self._forget = forget
        self.by_name: dict[str, LoRARequest] = {}
        self.adapters: dict[int, AdapterFile] = {}  # lora id -> its checked files
        self._next_id = itertools.count(1)

    @property
    def enabled(self) -> bool:
        return self.target_shapes is not None

    def load(self, name: str, path: str) -> LoRARequest:
        """Load the adapter in directory `path` under `name` with a fresh id; ValueError when LoRA is off, the name
        is taken, `--max-loras` are loaded, or the adapter is bad (naming the file and the field)."""
        lora_id = next(lora_id for lora_id in self._next_id if lora_id not in self.adapters)
        return self.add(LoRARequest(name, lora_id, path))

    def add(self, lora_request: LoRARequest) -> LoRARequest:
        """Check and load `lora_request`'s adapter under its own id and name."""
        if not self.enabled:
            raise ParamError("lora_request", "LoRA adapters are not enabled on this engine (--enable-lora)")
        if lora_request.lora_name in self.by_name:
            raise ParamError("lora_name", f"adapter {lora_request.lora_name!r} is already loaded (unload it first)")
        if len(self.adapters) >= self.config.max_loras:
            raise ParamError("lora_name", f"{len(self.adapters)} adapters are loaded, the most --max-loras allows: "
                             "unload one first")
        if lora_request.lora_int_id in self.adapters:
            raise ParamError("lora_int_id", f"adapter id {lora_request.lora_int_id} is already loaded")
        assert self.target_shapes is not None
        adapter = read_adapter(lora_request.lora_path, self.target_shapes, self.config.max_lora_rank)
        try:
            self.worker.add_lora(lora_request.lora_int_id, adapter)
        except WorkerDiedError:
            raise
        except Exception as error:  # a file changed since it was checked, or is corrupt past its header
            raise AdapterError(adapter.weights_path, "tensors", f"could not be loaded: {error}") from error
        self.adapters[lora_request.lora_int_id] = adapter
        self.by_name[lora_request.lora_name] = lora_request
        return lora_request

    def resolve(self, lora_request: LoRARequest | None) -> LoRARequest | None:
        """The loaded adapter a new request runs with: `lora_request` itself, loaded first if it is new (offline
        use); ValueError when its name or id belongs to another loaded adapter."""
        if lora_request is None:
            return None
        loaded = self.by_name.get(lora_request.lora_name)
        if loaded == lora_request:
            return loaded
        if loaded is not None:
            raise ParamError("lora_request", f"adapter {lora_request.lora_name!r} is loaded with id "
                             f"{loaded.lora_int_id} from {loaded.lora_path}, not as {lora_request}")
        return self.add(lora_request)

    def unload(self, name: str) -> LoRARequest:
        """Unload adapter `name`; ValueError if it is not loaded or a live request runs it."""
        lora_request = self.by_name.get(name)
        if lora_request is None:
            raise ParamError("lora_name", f"no adapter {name!r} is loaded")
        if lora_request.lora_int_id in set(self._live_lora_ids()):
            raise ParamError("lora_name", f"adapter {name!r} is in use by running or waiting requests")
        self.worker.remove_lora(lora_request.lora_int_id)
        del self.by_name[name]
        del self.adapters[lora_request.lora_int_id]
        self._forget(lora_request.lora_int_id)
        return lora_request

    def by_model_name(self, model: str) -> LoRARequest | None:
        """The adapter a client names in `model`, or None."""
        return self.by_name.get(model)
