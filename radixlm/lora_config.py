"""LoRAConfig: whether the engine serves LoRA adapters, which it loads at start, and how many and how large."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_LORAS_LIMIT = 1024
MAX_LORA_RANK_LIMIT = 1024


@dataclass(frozen=True)
class LoRAConfig:
    enable_lora: bool = field(default=False, metadata={"help": (
        "serve LoRA adapters (on when --lora-modules names any): loaded at start or at run time "
        "(/v1/load_lora_adapter), selected per request by `model`, mixed with the base model in one batch")})
    lora_modules: tuple[str, ...] | None = field(default=None, metadata={"help": (
        "adapters to load at start, each name=path (a PEFT adapter directory); clients select one by its name in "
        "`model`")})
    max_loras: int = field(default=8, metadata={"help": (
        "most adapters loaded at once (each holds its weights in memory); loading one more is refused")})
    max_lora_rank: int = field(default=64, metadata={"help": "largest adapter rank accepted"})

    def __post_init__(self) -> None:
        if self.lora_modules is not None and not isinstance(self.lora_modules, tuple):
            object.__setattr__(self, "lora_modules", tuple(self.lora_modules))
        for name, limit in (("max_loras", MAX_LORAS_LIMIT), ("max_lora_rank", MAX_LORA_RANK_LIMIT)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
                raise ValueError(f"{name} must be an integer in [1, {limit}], got {value!r}")
        modules = self.modules
        if len(modules) > self.max_loras:
            raise ValueError(f"lora_modules names {len(modules)} adapters, more than max_loras ({self.max_loras})")

    @property
    def enabled(self) -> bool:
        return self.enable_lora or bool(self.lora_modules)

    @property
    def modules(self) -> list[tuple[str, str]]:
        """`lora_modules` as (name, path) pairs; ValueError naming a bad or repeated entry."""
        pairs: list[tuple[str, str]] = []
        for entry in self.lora_modules or ():
            name, separator, path = str(entry).partition("=")
            if not separator or not name.strip() or not path.strip():
                raise ValueError(f"lora_modules entries must be name=path, got {entry!r}")
            if any(name == seen for seen, _ in pairs):
                raise ValueError(f"lora_modules names adapter {name!r} twice")
            pairs.append((name, path))
        return pairs
