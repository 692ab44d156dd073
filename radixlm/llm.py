"""LLM: the offline API. `LLM(model=...).generate(prompts, params)` runs everything to completion."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tqdm import tqdm

from radixlm.config import EngineConfig
from radixlm.engine.llm_engine import LLMEngine, build_engine
from radixlm.lora_request import LoRARequest
from radixlm.outputs import CompletionOutput, RequestOutput
from radixlm.pooling_params import PoolingParams
from radixlm.sampling_params import SamplingParams

Prompt = str | Sequence[int]
Message = dict[str, Any]


class LLM:
    """Offline batch generation. Keyword arguments are engine options (see `radixlm.config`);
    `data_parallel_size=N` runs N engine replicas (`radixlm.data_parallel.offline`)."""

    def __init__(self, model: str | None = None, **engine_options: Any) -> None:
        if model is not None:
            engine_options["model"] = model
        # Validated first: a bad option is a ValueError naming it, before any replica starts.
        num_replicas = EngineConfig.from_kwargs(**engine_options).parallel.data_parallel_size
        if num_replicas > 1:  # replicas behind a cache-aware router, each stepping in its own thread
            from radixlm.data_parallel.offline import DataParallelLLMEngine

            self.engine: LLMEngine | DataParallelLLMEngine = DataParallelLLMEngine(engine_options, num_replicas)
        else:
            self.engine = build_engine(**engine_options)
        self._next_id = 0

    def close(self) -> None:
        """Stop the engine's worker processes (if any run in processes); the LLM cannot generate afterwards."""
        self.engine.close()

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, metadata: Mapping[str, Any] | None = None,
                 on_finish: Callable[[RequestOutput], object] | None = None,
                 lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None) -> list[RequestOutput]:
        """Generate for text prompts or token-id lists; outputs come back in the order of `prompts`, each with
        all its `n` completions (by index). `metadata` and `on_finish` apply to every prompt (see
        `LLMEngine.add_request`); a request that failed alone has `error` set and finish_reason "error".
        `lora_request`: the LoRA adapter of every prompt, or one per prompt (None: the base model); an adapter new
        to the engine is loaded first (the engine needs `enable_lora=True`)."""
        prompt_list = _as_prompt_list(prompts)
        if sampling_params is None or isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params or SamplingParams()] * len(prompt_list)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompt_list):
                raise ValueError(f"got {len(params_list)} sampling_params for {len(prompt_list)} prompts")
        for spec in {params.structured_outputs for params in params_list} - {None}:
            self.engine.structured.submit(spec).result()  # a bad grammar raises ValueError before anything runs
        request_ids = [str(self._next_id + i) for i in range(len(prompt_list))]
        self._next_id += len(prompt_list)
        if lora_request is None or isinstance(lora_request, LoRARequest):
            self.engine.add_requests(zip(request_ids, prompt_list, params_list, strict=True), metadata=metadata,
                                     on_finish=on_finish, lora_request=lora_request)
        else:
            loras = list(lora_request)
            if len(loras) != len(prompt_list):
                raise ValueError(f"got {len(loras)} lora_request for {len(prompt_list)} prompts")
            self.engine.add_requests(zip(request_ids, prompt_list, params_list, strict=True), metadata=metadata,
                                     on_finish=on_finish, lora_request=loras)
        return self._run(request_ids, use_tqdm)

    def embed(self, prompts: Prompt | Sequence[Prompt], pooling_params: PoolingParams | None = None,
              use_tqdm: bool = True) -> list[list[float]]:
        """vLLM's `LLM.embed`: one vector per prompt (text or token ids), in the order of `prompts`: the model's
        final hidden states (after the final norm) pooled by `pooling_params.pooling_type` (default: the engine's
        `pooling` option, "last" or "mean"), L2-normalized. The prompts are batched through the scheduler with
        everything else. Raises RuntimeError naming the first prompt that failed."""
        prompt_list = _as_prompt_list(prompts)
        params = pooling_params or PoolingParams()
        request_ids = [str(self._next_id + i) for i in range(len(prompt_list))]
        self._next_id += len(prompt_list)
        self.engine.add_requests([(request_id, prompt, params)
                                  for request_id, prompt in zip(request_ids, prompt_list, strict=True)])
        outputs = self._run(request_ids, use_tqdm, desc="embedding")
        for index, output in enumerate(outputs):
            if output.error is not None or output.embedding is None:
                raise RuntimeError(f"embedding prompt {index} failed: {output.error or 'no vector came back'}")
        return [output.embedding for output in outputs]  # type: ignore[misc]

    def chat(self, messages: list[Message] | list[list[Message]],
             sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True, add_generation_prompt: bool = True) -> list[RequestOutput]:
        """Apply the tokenizer's chat template to one conversation or a list of them, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else messages
        prompts = [self.apply_chat_template(conv, add_generation_prompt) for conv in conversations]  # type: ignore
        return self.generate(prompts, sampling_params, use_tqdm)

    def apply_chat_template(self, messages: list[Message], add_generation_prompt: bool = True) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                  add_generation_prompt=add_generation_prompt)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _run(self, request_ids: list[str], use_tqdm: bool, desc: str = "generating") -> list[RequestOutput]:
        """Step until done; each final output holds every sequence (a step's output only holds those that
        changed, so the latest state of each index is kept along the way)."""
        latest: dict[str, dict[int, CompletionOutput]] = {request_id: {} for request_id in request_ids}
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(request_ids), desc=desc, unit="req", disable=not use_tqdm) as progress:
            while self.engine.has_unfinished_requests():
                for output in self.engine.step():
                    sequences = latest.get(output.request_id)
                    if sequences is None:
                        continue
                    sequences.update((completion.index, completion) for completion in output.outputs)
                    if output.finished:
                        output.outputs = [sequences[index] for index in sorted(sequences)]
                        finished[output.request_id] = output
                        progress.update()
        return [finished[request_id] for request_id in request_ids]


def _as_prompt_list(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if prompts and all(isinstance(t, int) for t in prompts):  # one token-id list
        return [prompts]  # type: ignore[list-item]
    return list(prompts)  # type: ignore[arg-type]
