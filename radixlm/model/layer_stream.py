"""Which decoder layers of a model being loaded have all their tensors: a loader reports each tensor it puts in
place, and a layer whose last tensor arrives is handed on at once (to `ServingFormat.finish_layer`), so a loader that
reads the checkpoint layer by layer never holds more than one layer in float."""

from __future__ import annotations

import re
from collections.abc import Callable

from torch import nn

LAYER_PREFIX = re.compile(r"^(.*\.layers\.\d+)\.")


class LayerTracker:
    def __init__(self, model: nn.Module, finish: Callable[[nn.Module], None] | None) -> None:
        """`model` built on the meta device; `finish(layer)` is called once per decoder layer when its last
        parameter or buffer is loaded (None: nothing is called)."""
        self._model = model
        self._finish = finish
        self._pending: dict[str, set[str]] = {}
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            match = LAYER_PREFIX.match(name)
            if match and tensor.is_meta:
                self._pending.setdefault(match.group(1), set()).add(name)

    def loaded(self, name: str) -> None:
        """The tensor `name` (a parameter or buffer of the model as built) is in place."""
        match = LAYER_PREFIX.match(name)
        if match is None or match.group(1) not in self._pending:
            return
        prefix = match.group(1)
        self._pending[prefix].discard(name)
        if not self._pending[prefix]:
            del self._pending[prefix]
            if self._finish is not None:
                self._finish(self._model.get_submodule(prefix))

    def unfinished(self) -> dict[str, set[str]]:
        """Layers still waiting for tensors, with the names they wait for."""
        return dict(self._pending)
