"""CacheAwareRouter: picks the engine replica for each request, from the prompts it routed before and its load.

Pure Python (no torch), used from one thread (the server's event loop, or the offline engine's caller).

What it keeps per replica:
- `PrefixIndex`: an approximate prefix tree of the token ids routed there. A prompt is cut into blocks of
  `block_size` tokens and block i is named by a chained hash of blocks 0..i, so a set of such names is a prefix tree
  stored flat (each name stands for one path from the root), as vLLM names its cached blocks. Matching walks the
  prompt's names from the first until one is missing. Bounded: when it holds more than `max_blocks` names the least
  recently routed are dropped first (an LRU dict; a path is touched from its end back to its root, so a parent is
  always fresher than its children and leaves go first). It never asks the replica what it really cached: the
  replica's own radix cache may have evicted a prefix the index still holds, which only costs a cache miss.
- its load: requests routed there that have not finished (`route` adds, `finish` takes away).

How it decides (the shape of SGLang's cache-aware policy, sgl-router; our own rules and thresholds):
1. The best match is the replica holding the longest prefix of the prompt (ties: the less loaded, then the lower
   index).
2. It is used when it covers at least `cache_threshold` of the prompt and that replica is not much busier than the
   least loaded one: "much busier" means both `load - min_load > balance_abs_threshold` and
   `load > balance_rel_threshold * min_load` (an absolute and a relative gap, so neither 1 vs 0 nor 40 vs 30 counts).
3. Otherwise the least loaded replica (ties: the one whose prefix index is smaller, as sgl-router prefers the
   smallest tree: its cache has the most room for a new prefix; then the lower replica number).
The prompt is then recorded in the chosen replica's index at once, so the next request of the same group, arriving
before this one ran, already finds it there.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

# Prefix granularity: the engine's default KV block size. A match shorter than a block saves almost nothing.
DEFAULT_BLOCK_SIZE = 16
# A shared prefix counts when it covers half the prompt (sgl-router's default cache threshold): below that, most of
# the prompt is computed wherever it goes, so spreading the load matters more than the partial hit.
DEFAULT_CACHE_THRESHOLD = 0.5
# "Much busier": 16 more requests in flight than the least loaded replica, and 1.5x its load. On this CPU engine a
# decode step at batch 32 costs ~1.5x one at batch 8 (docs: 176 vs 258 ms), while recomputing a 1,000-token shared
# prefix costs several whole steps; so a replica should take a group's request unless it is far busier.
DEFAULT_BALANCE_ABS_THRESHOLD = 16
DEFAULT_BALANCE_REL_THRESHOLD = 1.5
# 16,384 blocks of 16 = 262,144 tokens per replica: about what a replica's KV cache holds at the default
# --kv-cache-memory on a 128 GB machine with the default model, so the index forgets about as fast as the cache.
DEFAULT_MAX_BLOCKS = 16384


@dataclass(frozen=True)
class RouterConfig:
    """The router's thresholds (see the module docstring for what each one decides)."""

    block_size: int = DEFAULT_BLOCK_SIZE
    cache_threshold: float = DEFAULT_CACHE_THRESHOLD
    balance_abs_threshold: int = DEFAULT_BALANCE_ABS_THRESHOLD
    balance_rel_threshold: float = DEFAULT_BALANCE_REL_THRESHOLD
    max_blocks: int = DEFAULT_MAX_BLOCKS

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold}")
        if self.balance_abs_threshold < 0:
            raise ValueError(f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise ValueError(f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold}")
        if self.max_blocks < 1:
            raise ValueError(f"max_blocks must be >= 1, got {self.max_blocks}")


def block_names(token_ids: Sequence[int], block_size: int, lora_id: int = 0) -> list[int]:
    """The chained hash of each full block of `token_ids` under LoRA adapter `lora_id`: name i depends on the
    adapter and blocks 0..i, so equal names mean equal prefixes computed by the same adapter (up to hash
    collisions, which only cost a routing choice, never correctness)."""
    names, parent = [], hash(("lora", lora_id)) if lora_id else 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, *token_ids[start:start + block_size]))
        names.append(parent)
    return names


class PrefixIndex:
    """One replica's approximate prefix tree: at most `max_blocks` block names, least recently routed dropped first."""

    def __init__(self, max_blocks: int) -> None:
        self.max_blocks = max_blocks
        self._names: OrderedDict[int, None] = OrderedDict()  # oldest first

    def __len__(self) -> int:
        return len(self._names)

    def match(self, names: Sequence[int]) -> int:
        """How many leading blocks of a prompt (given by its names) this index holds."""
        for i, name in enumerate(names):
            if name not in self._names:
                return i
        return len(names)

    def insert(self, names: Sequence[int]) -> None:
        """Record a routed prompt, touching its path from the leaf back to the root (so leaves are evicted first)."""
        for name in reversed(names):
            self._names[name] = None
            self._names.move_to_end(name)
        while len(self._names) > self.max_blocks:
            self._names.popitem(last=False)


@dataclass(frozen=True)
class RouteDecision:
    replica: int
    matched_tokens: int  # of the prompt, in the chosen replica's index (0 when it went by load)
    reason: str  # "cache" (longest prefix), "load" (no useful match) or "balance" (the match's replica too busy)


class CacheAwareRouter:
    """Chooses a replica per request; see the module docstring. `route` and `finish` keep the loads."""

    def __init__(self, num_replicas: int, config: RouterConfig | None = None) -> None:
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        self.config = config or RouterConfig()
        self.indexes = [PrefixIndex(self.config.max_blocks) for _ in range(num_replicas)]
        self.loads = [0] * num_replicas  # requests in flight per replica
        self.num_routed = [0] * num_replicas  # requests routed in all, per replica (for tests and logs)

    @property
    def num_replicas(self) -> int:
        return len(self.loads)

    def choose(self, token_ids: Sequence[int], lora_id: int = 0) -> RouteDecision:
        """Where a request with this prompt and LoRA adapter would go now (changes nothing)."""
        config = self.config
        names = block_names(token_ids, config.block_size, lora_id)
        matches = [index.match(names) * config.block_size for index in self.indexes]
        least_loaded = min(range(self.num_replicas), key=lambda i: (self.loads[i], len(self.indexes[i]), i))
        best = min(range(self.num_replicas), key=lambda i: (-matches[i], self.loads[i], i))
        if matches[best] == 0 or matches[best] < config.cache_threshold * len(token_ids):
            return RouteDecision(least_loaded, 0, "load")
        if self._much_busier(self.loads[best], self.loads[least_loaded]):
            return RouteDecision(least_loaded, 0, "balance")
        return RouteDecision(best, matches[best], "cache")

    def route(self, token_ids: Sequence[int], num_requests: int = 1, lora_id: int = 0) -> RouteDecision:
        """Choose a replica for `num_requests` requests sharing this prompt and LoRA adapter, record the prompt
        there and count them in its load; call `finish` once per request when it ends (or `finish(replica, n)` if
        admission failed)."""
        decision = self.choose(token_ids, lora_id)
        self.indexes[decision.replica].insert(block_names(token_ids, self.config.block_size, lora_id))
        self.loads[decision.replica] += num_requests
        self.num_routed[decision.replica] += num_requests
        return decision

    def finish(self, replica: int, num_requests: int = 1) -> None:
        """Requests routed to `replica` ended (finished, aborted, failed, or never admitted)."""
        self.loads[replica] = max(0, self.loads[replica] - num_requests)

    def _much_busier(self, load: int, min_load: int) -> bool:
        config = self.config
        return load - min_load > config.balance_abs_threshold and load > config.balance_rel_threshold * min_load
