"""The cache-aware router on its own (no model): groups stay together, load spreads, thresholds hold, the prefix
index stays bounded."""

import random

import pytest

from radixlm.data_parallel.router import CacheAwareRouter, PrefixIndex, RouterConfig, block_names

PREFIX_LEN = 1000
QUESTION_LEN = 32
GROUPS = 4
QUESTIONS = 8


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(49152) for _ in range(n)]


def _shared_prefix_prompts(seed: int = 0) -> list[tuple[int, list[int]]]:
    """(group, prompt) in the order `radixlm bench serve` sends them: a group's questions one after another."""
    rng = random.Random(seed)
    prompts = []
    for group in range(GROUPS):
        prefix = _tokens(rng, PREFIX_LEN)
        prompts += [(group, prefix + _tokens(rng, QUESTION_LEN)) for _ in range(QUESTIONS)]
    return prompts


def _computed_prefill_tokens(routed: list[tuple[int, list[int]]]) -> int:
    """Prefill tokens a set of replicas would compute with perfect radix caches: a prompt computes what its
    replica has not seen yet (its longest common prefix with any earlier prompt there)."""
    seen: dict[int, list[list[int]]] = {}
    total = 0
    for replica, prompt in routed:
        best = 0
        for earlier in seen.get(replica, []):
            common = 0
            while common < min(len(prompt), len(earlier)) and prompt[common] == earlier[common]:
                common += 1
            best = max(best, common)
        total += len(prompt) - best
        seen.setdefault(replica, []).append(prompt)
    return total


@pytest.mark.parametrize("shuffle", [False, True])
def test_shared_prefix_groups_stay_together_when_all_arrive_at_once(shuffle):
    prompts = _shared_prefix_prompts()
    if shuffle:
        random.Random(1).shuffle(prompts)
    router = CacheAwareRouter(2)
    routed = [(router.route(prompt).replica, group, prompt) for group, prompt in prompts]  # nothing finishes
    replicas_of_group = {g: {r for r, group, _ in routed if group == g} for g in range(GROUPS)}
    assert all(len(replicas) == 1 for replicas in replicas_of_group.values()), replicas_of_group
    assert sorted(router.num_routed) == [16, 16]  # two groups each
    one_replica = _computed_prefill_tokens([(0, p) for _, p in prompts])
    two_replicas = _computed_prefill_tokens([(r, p) for r, _, p in routed])
    assert two_replicas <= 1.2 * one_replica


def test_random_prompts_spread_evenly():
    rng = random.Random(0)
    router = CacheAwareRouter(2)
    for _ in range(64):
        router.route(_tokens(rng, rng.randint(64, 512)))
    assert min(router.num_routed) >= 0.4 * 64, router.num_routed


def test_random_prompts_spread_when_requests_finish_between_arrivals():
    rng = random.Random(2)
    router = CacheAwareRouter(2)
    in_flight: list[int] = []
    for _ in range(200):
        in_flight.append(router.route(_tokens(rng, rng.randint(16, 300))).replica)
        if len(in_flight) > rng.randint(0, 6):  # some finish, in arrival order
            router.finish(in_flight.pop(0))
    assert min(router.num_routed) >= 0.4 * 200, router.num_routed


def test_a_much_busier_match_goes_to_the_least_loaded_replica():
    config = RouterConfig(balance_abs_threshold=4, balance_rel_threshold=1.5)
    router = CacheAwareRouter(2, config)
    prompt = list(range(256))
    assert router.route(prompt).replica == 0
    for _ in range(4):  # a load gap of 5 with 0 on the other side: imbalanced, but only from the 6th on
        assert router.route(prompt).reason == "cache"
    decision = router.route(prompt)
    assert (decision.replica, decision.reason) == (1, "balance")
    for _ in range(5):  # back within the thresholds: the match wins again
        router.finish(0)
    assert router.choose(prompt).replica == 0


def test_relative_threshold_keeps_a_match_on_a_loaded_but_not_much_busier_replica():
    router = CacheAwareRouter(2, RouterConfig(balance_abs_threshold=4, balance_rel_threshold=1.5))
    prompt = list(range(256))
    router.route(prompt)
    router.loads = [40, 30]  # 10 more in flight, but only 1.33x: not much busier
    assert router.choose(prompt).reason == "cache"


def test_a_short_match_does_not_count():
    router = CacheAwareRouter(2)
    header = list(range(32))  # say a chat template's first blocks
    router.route(header + list(range(1000, 1200)))
    decision = router.choose(header + list(range(2000, 2200)))  # 32 of 232 tokens match: below the threshold
    assert (decision.replica, decision.reason) == (1, "load")


def test_least_loaded_prefers_the_smaller_index_then_the_lower_number():
    router = CacheAwareRouter(3)
    router.route(list(range(100, 164)))  # replica 0 now holds 4 blocks, load 1
    router.finish(0)
    assert router.choose(list(range(5000, 5064))).replica == 1  # loads tie: 1 and 2 hold nothing; 1 first


def test_prefix_index_is_bounded_and_evicts_the_oldest_first():
    index = PrefixIndex(max_blocks=8)
    old = block_names(list(range(64)), 16)  # 4 blocks
    new = block_names(list(range(1000, 1096)), 16)  # 6 blocks
    index.insert(old)
    index.insert(new)
    assert len(index) == 8
    assert index.match(new) == 6
    assert index.match(old) == 2  # its leaves went first: its first two blocks are still there


def test_block_names_name_prefixes():
    a = block_names([1, 2, 3, 4, 5, 6, 7], 2)
    b = block_names([1, 2, 3, 9, 5, 6], 2)
    assert len(a) == 3 and a[0] == b[0] and a[1] != b[1] and a[2] != b[2]
    assert block_names([1], 2) == []


@pytest.mark.parametrize("field,value", [("block_size", 0), ("cache_threshold", 1.5), ("balance_abs_threshold", -1),
                                         ("balance_rel_threshold", 0.5), ("max_blocks", 0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        RouterConfig(**{field: value})


def test_router_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, radixlm.data_parallel.router; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_prefixes_are_named_by_adapter_and_groups_follow_them():
    """The same prompt under another LoRA adapter is another prefix: its group goes where that adapter's prompts
    went, not where the base model's did."""
    from radixlm.data_parallel.router import CacheAwareRouter, block_names

    prompt = list(range(64))
    assert block_names(prompt, 16, lora_id=3) != block_names(prompt, 16) == block_names(prompt, 16, lora_id=0)
    router = CacheAwareRouter(2)
    base = router.route(prompt).replica
    adapted = router.route(prompt, lora_id=3).replica
    assert adapted != base  # no match for adapter 3 anywhere: the less loaded replica
    assert router.route(prompt, lora_id=3).replica == adapted and router.route(prompt).replica == base
