"""What the server and the metrics read of an engine: `EngineInfo` once it is loaded, `scheduler_stats` between
steps (on the engine thread)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from radixlm.engine.llm_engine import LLMEngine
from radixlm.metrics import SchedulerStats
from radixlm.structured.manager import StructuredOutputs


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs from a loaded engine; the tokenizer is the event loop's own copy."""

    tokenizer: PreTrainedTokenizerBase
    max_model_len: int
    vocab_size: int
    schedule_policy: str
    prompts_per_request_limit: tuple[int, str]  # (most prompts in one request, the flag that sets it)
    structured: StructuredOutputs  # thread-safe: the server compiles grammars through it before admission
    hidden_size: int = 0  # the length of an embedding


def scheduler_stats(engine: LLMEngine) -> SchedulerStats:
    """Read by the engine thread between steps. KV usage counts the blocks live requests hold; blocks that only
    the radix tree holds are evictable, so they count as cached rather than used (as vLLM and SGLang report).
    When no request is live, `num_used_blocks` counts the blocks neither free nor the tree's: leaked ones."""
    scheduler = engine.scheduler
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    held = len({block_id for request in scheduler.running for block_id in request.block_table})
    num_used_blocks = held
    tree, step = manager.radix_cache, engine.last_scheduler_output
    spec = engine.drafter.stats if engine.drafter is not None else None
    if not scheduler.requests:  # idle: every used block should be the tree's; any other one leaked
        tree_blocks = tree.block_refs() if tree is not None else {}
        num_used_blocks = pool.num_used_blocks - len(tree_blocks)
    return SchedulerStats(num_running=scheduler.num_running, num_waiting=scheduler.num_waiting,
                          kv_cache_usage=held / pool.num_blocks,
                          prefix_cache_usage=(pool.num_used_blocks - held) / pool.num_blocks,
                          num_preemptions=scheduler.num_preemptions,
                          kv_cache_capacity_tokens=pool.num_blocks * manager.block_size,
                          prefix_cache_hit_rate=manager.stats.hit_rate,
                          num_evicted_blocks=manager.num_evicted_blocks, num_used_blocks=num_used_blocks,
                          num_tree_nodes=tree.num_nodes if tree else 0, num_tree_tokens=tree.num_tokens if tree else 0,
                          num_step_tokens=step.num_scheduled_tokens if step else 0,
                          num_step_chunks=len(step.chunks) if step else 0, step_seconds=engine.last_step_seconds,
                          num_steps=engine.num_steps, num_spec_drafts=spec.num_drafts if spec else 0,
                          num_spec_draft_tokens=spec.num_draft_tokens if spec else 0,
                          num_spec_accepted_tokens=spec.num_accepted_tokens if spec else 0,
                          num_spec_accepted_tokens_per_pos=tuple(spec.num_accepted_tokens_per_pos) if spec else ())
