"""The one way tests run an engine: to completion, checking invariants after every step and that no KV block
leaked at the end, collecting every sequence's final state and deltas."""

from __future__ import annotations

from dataclasses import dataclass, field

from radixlm.engine.llm_engine import LLMEngine
from radixlm.outputs import CompletionOutput, RequestOutput
from radixlm.sampling_params import SamplingParams


@dataclass
class Finished:
    """One user request at the end: its last output, each sequence's last state and its streamed deltas."""

    output: RequestOutput | None = None
    sequences: dict[int, CompletionOutput] = field(default_factory=dict)
    streamed_text: dict[int, str] = field(default_factory=dict)
    streamed_token_ids: dict[int, list[int]] = field(default_factory=dict)

    def token_ids(self, index: int = 0) -> list[int]:
        return self.sequences[index].token_ids


def run(engine: LLMEngine, requests: list[tuple[str, list[int] | str, SamplingParams]]) -> dict[str, Finished]:
    """Submit all requests, step until done (invariants after every step), check no block leaked."""
    for request_id, prompt, params in requests:
        engine.add_request(request_id, prompt, params)
    return drain(engine)


def drain(engine: LLMEngine) -> dict[str, Finished]:
    results: dict[str, Finished] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            result = results.setdefault(output.request_id, Finished())
            assert result.output is None or not result.output.finished, "output after the request finished"
            result.output = output
            for sequence in output.outputs:
                result.sequences[sequence.index] = sequence
                result.streamed_text[sequence.index] = result.streamed_text.get(sequence.index, "") + \
                    sequence.delta_text
                result.streamed_token_ids.setdefault(sequence.index, []).extend(sequence.delta_token_ids)
        engine.check_invariants()
    assert_all_blocks_released(engine)
    for result in results.values():
        assert result.output is not None and result.output.finished
    return results


def final_outputs(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[CompletionOutput]:
    """`run` with one `params` for every prompt; returns each prompt's first sequence at the end, in prompt order."""
    results = run(engine, [(f"req-{index}", prompt, params) for index, prompt in enumerate(prompts)])
    return [results[f"req-{index}"].sequences[0] for index in range(len(prompts))]


def output_token_ids(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    """`final_outputs`' token ids."""
    return [output.token_ids for output in final_outputs(engine, prompts, params)]


def assert_all_blocks_released(engine: LLMEngine) -> None:
    """With no live request, only the radix tree holds blocks; after evicting it, every block is free."""
    manager = engine.scheduler.kv_cache_manager
    tree_blocks = set(manager.radix_cache.block_refs()) if manager.radix_cache else set()
    assert manager.block_pool.num_used_blocks == len(tree_blocks), "blocks leaked after all requests finished"
    manager.reset_prefix_cache()
    assert manager.num_free_blocks == manager.num_blocks, "blocks leaked after evicting the prefix cache"
